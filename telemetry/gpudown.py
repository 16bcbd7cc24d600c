"""Which GPUs are failing, when each is tried again, and what the log says about them.

Why a retry schedule, not every poll: a GPU off the bus can make each NVML call wait for the
driver's timeout (seconds), and trying it at every poll delayed every other GPU's poll by that
much for the whole outage (review finding). A GPU whose failure took that long is tried after 1,
2, 4... polls, at least every ``RETRY_MAX_S``. A failure that came at once (``QUICK_FAILURE_S``)
costs the others nothing and is tried again at the next poll, so the GPU's windows resume at the
first poll it answers (a replayed GPU before its first recorded sample fails this way, and the
recordings the model is trained from must replay to the same windows). A failing GPU is logged
when it fails, every ``RELOG_S`` while it stays down, and when it answers again.
"""

from __future__ import annotations

import logging

from wattclass.gpu.base import GpuInfo

log = logging.getLogger("wattclass.telemetry.daemon")

RELOG_S = 300.0
#: A failing GPU is tried again at least this often (s); more often at first.
RETRY_MAX_S = 10.0
#: A failed poll of a GPU that took less than this (s, on the backend's clock) is tried again at
#: the next poll: the other GPUs did not wait for it.
QUICK_FAILURE_S = 0.1


class DownGpus:
    """The failing GPUs of one daemon (one poll loop owns it); times are the backend's clock."""

    def __init__(self, poll_s: float) -> None:
        self.poll_s = poll_s
        self.since: dict[int, float] = {}  # GPU index -> when it started failing
        self._retry: dict[int, tuple[float, int]] = {}  # GPU index -> (next try, failures so far)
        self._logged: dict[int, float] = {}  # GPU index -> when last logged

    def __contains__(self, index: int) -> bool:
        return index in self.since

    def due(self, index: int, now: float) -> bool:
        """Whether GPU ``index`` is polled now (always, unless it is failing and not yet due)."""
        retry = self._retry.get(index)
        # a next try further ahead than the longest wait: the clock stepped back, try now
        return retry is None or now >= retry[0] or now < retry[0] - RETRY_MAX_S

    def failed(self, info: GpuInfo, exc: Exception, now: float, took_s: float = 0.0) -> None:
        """GPU ``info``'s poll failed with ``exc`` at ``now`` after ``took_s`` seconds."""
        i = info.gpu_index
        _, fails = self._retry.get(i, (0.0, 0))
        quick = took_s < QUICK_FAILURE_S
        if quick:
            self._retry[i] = (now, fails)  # due at the next poll; only slow failures back off
        else:
            wait_s = min(self.poll_s * 2 ** min(fails, 20), RETRY_MAX_S)
            self._retry[i] = (now + wait_s - self.poll_s / 2, fails + 1)  # half a poll early: that poll
        since = self.since.get(i)
        if since is None:
            self.since[i] = self._logged[i] = now
            when = ("at every poll while it fails at once" if quick else
                    f"after 1, 2, 4... polls (at least every {RETRY_MAX_S:g} s) while it fails slowly")
            log.error("GPU %d (%s) failed: %s; retrying %s, other GPUs go on", i, info.uuid, exc, when)
        elif now - self._logged.get(i, since) >= RELOG_S:
            self._logged[i] = now
            log.error("GPU %d (%s) still failing after %.0f s: %s", i, info.uuid, now - since, exc)

    def answered(self, info: GpuInfo, now: float) -> None:
        """GPU ``info`` answered: if it was failing, say so and forget it."""
        since = self.since.pop(info.gpu_index, None)
        self._retry.pop(info.gpu_index, None)
        self._logged.pop(info.gpu_index, None)
        if since is not None:
            log.warning("GPU %d (%s) answers again after %.0f s", info.gpu_index, info.uuid, now - since)
