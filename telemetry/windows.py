# long: one per-GPU state machine (windows, segments, energy points, clock steps), invariants span it
"""Turn 1 s polls of one GPU into telemetry v1 window rows.

Why intervals: each poll after the first closes the interval ``(t_prev, t]``; its readings are
the poll's. An interval belongs to the window *and the job* seen at its *start* poll
(``floor(t_prev / period)``, the job seen at ``t_prev``), so the window ``[kP, (k+1)P)`` is closed
by the first poll at or after ``(k+1)P`` -- at that very poll, with no waiting.

Why sparse energy: reading the cumulative energy counter is the one expensive NVML call
(milliseconds of CPU against microseconds for every other field: docs/benchmarks.md, "Per NVML
call"), so it is read only at *energy points* (``needs_energy``): the first poll, the poll that
closes every ``energy_every_windows``-th window (the daemon's default: every third), the poll
after a gap or GPU error, and shutdown; never at a job change (issue 15: with short jobs those
reads were a third of the daemon's CPU).

The counter delta between two energy points (a *span*) goes whole to the span's segment when it
has one (one window, one job); otherwise (a job change inside a window, held windows, a gap) it
is split in proportion to each interval's integrated power ``p * (b - a)``: ``p`` is the 1 s
average power read at the poll ending the interval (``GpuSample.power_avg_w``; ~3 J mean error
per 1 s interval on the H200 recordings), else the trapezoid of the instantaneous readings at
both ends (~27 J), and the whole span goes by time if an interval has no power at all. The last
share takes the remainder, so windows still telescope exactly to the counter; only the split
between a span's segments is an estimate (docs/benchmarks.md, "Energy split at job changes").
Windows closed before their span's energy point are held (``_Closed``) and come out with it, up
to ``energy_every_windows - 1`` windows late; a window holding an ``exact_key`` job (the
daemon's composite keys of shared and MIG GPUs, whose per-job split needs the window's own
activity) always closes at an energy point. A backend that returns the counter on every poll
makes every poll an energy point (exact per interval).

* A job change inside a window gives one row per job stretch (segment; a job seen again after
  another gets a second one, so a GPU's rows never overlap). GPM snapshots are taken at a
  window's first poll, at each job change and at its close: a segment ending at a change gets
  the span up to it, the window's last one the rest. A span under ``MIN_GPM_SPAN_S`` (a stop
  milliseconds after a GPM point) or without a snapshot at its start (a window begun inside a
  gap) gets no GPM metrics (null), not a ratio over no time or the next job's activity.
* NaN or infinite readings are missing ones (``telemetry.readings``): every number in a row is
  finite or null (one NaN used to crash the daemon's stop: H200 run of 2026-11-30).
* A gap longer than ``split_gap_s`` (missed polls, a GPU that stopped answering) ends in an
  energy point: the polled intervals before it get their integrated power (scaled down if more
  than the delta), the gap, with no reading, the rest, by time over the windows it covers (the
  windows after its first carry the job only if it was seen on both sides). A gap longer than
  ``max_gap_s`` restarts the baseline (its energy is unobserved, logged).
* The counter going backwards is a wrap (near 2**64) or a driver reload (the interval's
  energy is unknown; counted as 0 and logged).
* The wall clock stepped forward by more than ``split_gap_s`` against the monotonic one (NTP,
  a suspend: ``GpuSample.mono_s``, where the backend has it) is a gap past ``max_gap_s``: the
  windows end at the last poll before it and the time the clock skipped gets no rows (split by
  time over it, the next poll's counter delta made windows of a running job that never ran, at
  a 60th of its power for a 60 s step: review finding).
* The wall clock stepped back by more than ``split_gap_s`` (NTP at boot, an admin's ``date``)
  ends the GPU's windows at the last poll before the step (that poll's span settled by a
  counter read at the first poll after it) and drops the polls until the clock passes that
  poll again; the first one after restarts the baseline. Windows never overlap, and the energy
  of the stretch the clock repeats is unobserved (logged): counted into the first window after
  it, it made that window draw the whole stretch's energy (a 60 s step: 700 W rows from a GPU
  at 100 W; review finding).

Row bounds: a window that follows a closed one (or starts exactly on the grid) begins at the
grid time ``kP``; the first window after start-up or an outage begins at its first poll; a job
segment begins/ends at the poll where the job changed; ``ts_end`` is ``(k+1)P`` or the last
poll of a flushed partial window. ``power_avg_w`` is the segment's energy over the time it covers.
Rows are plain dicts keyed by TELEMETRY_V1 column names, ``ts_start``/``ts_end`` in epoch seconds
(the WAL stores them as they are; the sink converts to Arrow).
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from wattclass.gpu.base import (
    POWER_REASONS,
    THERMAL_REASONS,
    GpmMetrics,
    GpuInfo,
    GpuSample,
)
from wattclass.schema import GPM_COLUMNS
from wattclass.telemetry.readings import MIN_GPM_SPAN_S, NonFinite, interval_power_w, proportional

log = logging.getLogger(__name__)

Row = dict[str, Any]
Job = tuple[str, str | None] | None
GpmFn = Callable[[object, object], GpmMetrics]

_WRAP = 2**64
_MEANS = ("util_gpu_pct", "util_mem_pct", "sm_clock_mhz", "mem_clock_mhz")
#: Per-poll readings whose spread inside a window is written as ``<column>`` (population std).
#: Why: within-window dynamics (a power-capped GEMM's clock hunts; a streaming kernel's power is
#: steady) separate compute- from memory-bound work where means do not (issue 13).
_SPREADS = {"power_std_w": "power_w", "sm_clock_std_mhz": "sm_clock_mhz", "util_mem_std_pct": "util_mem_pct"}


@dataclass
class _Segment:
    """Accumulates one job's share of one window."""

    job: Job
    a_first: float
    b_last: float
    energy_mj: float = 0.0
    energy_known: bool = True
    n_polls: int = 0
    sums: dict[str, list[float]] = field(default_factory=lambda: {k: [0.0, 0] for k in _MEANS})
    #: per spread column: [sum, sum of squares, count] of the polls' readings
    moments: dict[str, list[float]] = field(default_factory=lambda: {k: [0.0, 0.0, 0] for k in _SPREADS})
    power_max_w: float | None = None
    power_limit_w: float | None = None
    temp_c: float | None = None
    fb_used_mib: float | None = None
    reasons_n: int = 0
    thr_power_n: int = 0
    thr_thermal_n: int = 0
    # GPM over this segment alone, set when the job changed inside the window (the snapshot at
    # the change poll ends it); None: the window's GPM span (start snapshot -> close) applies.
    gpm: GpmMetrics | None = None

    def add_reading(self, s: GpuSample) -> None:
        self.n_polls += 1
        for k in _MEANS:
            v = getattr(s, k)
            if v is not None:
                acc = self.sums[k]
                acc[0] += v
                acc[1] += 1
        for col, attr in _SPREADS.items():
            v = getattr(s, attr)
            if v is not None:
                m = self.moments[col]
                m[0] += v
                m[1] += v * v
                m[2] += 1
        self.power_max_w = _max(self.power_max_w, s.power_w)
        self.temp_c = _max(self.temp_c, s.temp_c)
        self.fb_used_mib = _max(self.fb_used_mib, s.fb_used_mib)
        if s.power_limit_w is not None:
            self.power_limit_w = s.power_limit_w
        if s.clock_event_reasons is not None:
            self.reasons_n += 1
            self.thr_power_n += bool(s.clock_event_reasons & POWER_REASONS)
            self.thr_thermal_n += bool(s.clock_event_reasons & THERMAL_REASONS)


def _max(a: float | None, b: float | None) -> float | None:
    if b is None:
        return a
    return b if a is None or b > a else a


@dataclass
class _GpuState:
    info: GpuInfo
    prev: GpuSample | None = None
    window: int | None = None
    # The open window's job segments in time order; a job seen again after another gets a new
    # one (one per job made its row span the other job's time: review finding).
    segments: list[_Segment] = field(default_factory=list)
    gpm_start: object | None = None
    gpm_ts: float = 0.0  # the poll that took gpm_start
    prev_job: Job = None
    continuous: bool = False  # the last window closed at a boundary poll: the next one is whole
    window_a: float = 0.0  # start of the open window's first interval
    window_whole: bool = False
    anchor_mj: int | None = None  # counter at the last energy point (None: unknown)
    # Intervals since the last energy point, waiting for the next one: (segment, seconds,
    # integrated power in W*s or None where the interval has no power reading).
    pending: list[tuple[_Segment, float, float | None]] = field(default_factory=list)
    # Windows closed since the last energy point (energy_every_windows > 1), oldest first.
    held: list[_Closed] = field(default_factory=list)
    # After the clock stepped back: polls up to this time are dropped (module docstring).
    resume_after: float | None = None


@dataclass
class _Closed:
    """A closed window whose rows wait for the energy point that settles its last span."""

    segments: list[_Segment]
    w0: float
    w1: float
    whole: bool
    window_a: float
    gpm: GpmMetrics


class WindowBuilder:
    """Window state of every GPU of one host. Not thread-safe (one poll loop owns it)."""

    def __init__(
        self,
        host: str,
        period_s: float = 10.0,
        poll_s: float = 1.0,
        split_gap_s: float | None = None,
        max_gap_s: float = 600.0,
        energy_every_windows: int = 1,
        exact_key: Callable[[Job], bool] | None = None,
    ) -> None:
        """``energy_every_windows``: read the counter at every N-th window close (windows wait
        for it); ``exact_key(job)``: True for job keys whose windows always close at a counter
        reading (see the module docstring)."""
        if period_s <= 0 or poll_s <= 0:
            raise ValueError("period and poll interval must be positive")
        if energy_every_windows < 1:
            raise ValueError(f"energy_every_windows must be >= 1, not {energy_every_windows}")
        self.energy_every = int(energy_every_windows)
        self.exact_key = exact_key
        self.host = host
        self.period = float(period_s)
        self.poll = float(poll_s)
        self.split_gap = split_gap_s if split_gap_s is not None else 2.5 * poll_s
        self.max_gap = max_gap_s
        self._gpus: dict[int, _GpuState] = {}
        self.nonfinite = NonFinite()  # non-finite readings are missing ones (telemetry.readings)

    def _state(self, info: GpuInfo) -> _GpuState:
        st = self._gpus.get(info.gpu_index)
        if st is None:
            st = self._gpus[info.gpu_index] = _GpuState(info)
        return st

    def _win(self, t: float) -> int:
        return math.floor(t / self.period)

    def needs_gpm(self, info: GpuInfo, sample: GpuSample, job: Job = None) -> bool:
        """Whether this poll is a GPM point: the first poll, one that closes a window, or one
        that sees another job than the poll before (so each job's segment gets its own GPM,
        not the whole window's: a boundary segment must not borrow its neighbour's activity)."""
        st = self._state(info)
        if self._held_back(st, sample):
            return False
        if st.prev is None:
            return True
        if sample.ts <= st.prev.ts:
            return False
        return self._win(sample.ts) > self._win(st.prev.ts) or job != st.prev_job

    def needs_energy(self, info: GpuInfo, sample: GpuSample, job: Job) -> bool:
        """Whether this poll must carry the energy counter (is an energy point).

        True for the first poll, a poll after a gap or a step back of the clock, and a poll that
        closes a window when that makes ``energy_every_windows`` closed windows since the last
        energy point (or the window holds an ``exact_key`` job). A job change alone is not an
        energy point: the span's energy is split by integrated power (module docstring). Ask
        with the cheap sample (``energy_mj`` None) and the job seen at this poll, before reading
        the counter.
        """
        st = self._state(info)
        prev = st.prev
        if self._held_back(st, sample):
            return False
        if prev is None:
            return True
        if sample.ts <= prev.ts:
            return self._stepped_back(prev, sample)
        if sample.ts - prev.ts > self.split_gap:
            return True
        closes = self._win(sample.ts) - self._win(prev.ts)
        if closes <= 0:
            return False
        if len(st.held) + closes >= self.energy_every:
            return True
        ex = self.exact_key
        return ex is not None and (ex(st.prev_job) or any(ex(seg.job) for seg in st.segments))

    # long: where a poll meets the window, job and energy-point state, whose invariants span it all
    def add(self, info: GpuInfo, sample: GpuSample, job: Job, gpm: object | None,
            gpm_fn: GpmFn) -> list[Row]:
        """Feed one poll; returns the rows of windows this poll closed.

        A sample with ``energy_mj`` set is an energy point; one without is a cheap poll, unless
        ``needs_energy`` says it had to carry the counter (then the energy is unknown, null).
        """
        sample = self.nonfinite.sample(info, sample)
        st = self._state(info)
        prev = st.prev
        e = sample.energy_mj
        if prev is None:
            if self._held_back(st, sample):
                return []
            st.resume_after = None
            st.prev = sample
            st.prev_job = job
            st.gpm_start, st.gpm_ts = gpm, sample.ts
            st.anchor_mj = e
            st.pending = []
            return []
        if self._stepped_back(prev, sample):
            return self._step_back(info, st, sample, gpm_fn)
        if sample.ts <= prev.ts:  # the same reading again (replay between samples, a small step)
            if e is not None and st.pending:  # ... with the counter: it settles the open span
                self._settle(info, st, e, [])
            return self._release(st)
        point = e is not None or self.needs_energy(info, sample, job)
        a, b = prev.ts, sample.ts
        rate = interval_power_w(prev, sample)
        st.prev = sample
        job_before, st.prev_job = st.prev_job, job
        jumped = self._stepped_forward(prev, sample)
        if b - a > self.max_gap or jumped:
            # The polls before the gap get their measured share of the span (``_settle``); the
            # gap's energy is unobserved.
            gap_mj, known = self._settle(info, st, e, [b - a]) if point else ([0.0], False)
            what = "the clock stepped forward (or the node was suspended) by" if jumped else "no poll for"
            log.warning("GPU %d (%s): %s %.0f s; %s J in that gap not attributed", info.gpu_index,
                        info.uuid, what, b - a, f"{gap_mj[0] / 1e3:.1f}" if known else "?")
            if not point:  # no counter after the gap: the span before it stays unknown
                for before, _, _ in st.pending:
                    before.energy_known = False
                st.pending = []
            self._close(st, gpm_end=None, gpm_fn=gpm_fn)
            st.continuous = False
            st.gpm_start, st.gpm_ts = gpm, b
            return self._release(st)
        pieces: list[tuple[float, float]] = []
        if b - a > self.split_gap and self._win(b) > self._win(a):
            cuts = [a] + [k * self.period for k in range(self._win(a) + 1, self._win(b) + 1)] + [b]
            pieces = [(lo, hi) for lo, hi in itertools.pairwise(cuts) if hi > lo]
        else:
            pieces.append((a, b))
        single = len(pieces) == 1
        shares: list[float] | None = None
        known = True
        if point and not single:  # a gap across windows: settle the span before windows close
            shares, known = self._settle(info, st, e, [hi - lo for lo, hi in pieces])
        for n, (lo, hi) in enumerate(pieces):
            last = n == len(pieces) - 1
            w = self._win(lo)
            if st.window is not None and w != st.window:
                self._close(st, gpm_end=None, gpm_fn=gpm_fn)
                st.continuous = True
            if st.window is None:
                st.window_a = lo
                st.window_whole = st.continuous or lo == w * self.period
            st.window = w
            # An interval belongs to the job seen at its start; inside a gap only the polls at
            # its ends saw a job: pieces after the first keep it only if both ends saw it.
            pjob = job_before if n == 0 or job == job_before else None
            key = pjob[0] if pjob else None
            seg = st.segments[-1] if st.segments else None
            if seg is None or (seg.job[0] if seg.job else None) != key:
                seg = _Segment(pjob, lo, hi)
                st.segments.append(seg)
            seg.b_last = hi
            if shares is not None:
                seg.energy_mj += shares[n]
                seg.energy_known &= known
            else:
                st.pending.append((seg, hi - lo, rate * (hi - lo) if rate is not None else None))
                if point:  # the span since the last energy point ends here: settle it
                    self._settle(info, st, e, [])
            if last:
                seg.add_reading(sample)
            if self._win(hi) > w:
                self._close(st, gpm_end=gpm if last else None, gpm_fn=gpm_fn)
                st.continuous = True
        if gpm is not None and job != job_before:
            # The job changed at this poll and the window is still open: the segments that end
            # here take the GPM between the last GPM point and this one (none if the window
            # began in a gap, where nothing was measured: not the next job's activity).
            ended = None
            for seg in st.segments:
                if seg.gpm is None:
                    ended = ended or self._gpm(st, st.gpm_start, gpm, gpm_fn, b - st.gpm_ts)
                    seg.gpm = ended
        if gpm is not None:
            st.gpm_start, st.gpm_ts = gpm, b
        return self._release(st)

    def _stepped_forward(self, prev: GpuSample, sample: GpuSample) -> bool:
        """Whether the wall clock ran ahead of the monotonic one between two polls by more than a
        late poll's jitter: a step forward (NTP) or a suspend, time nothing ran in."""
        if prev.mono_s is None or sample.mono_s is None:
            return False
        return (sample.ts - prev.ts) - (sample.mono_s - prev.mono_s) > self.split_gap

    def _stepped_back(self, prev: GpuSample, sample: GpuSample) -> bool:
        """Whether the clock stepped back between two polls (more than a late poll's jitter)."""
        return prev.ts - sample.ts > self.split_gap

    @staticmethod
    def _held_back(st: _GpuState, sample: GpuSample) -> bool:
        """Whether this poll falls in the stretch a step back of the clock repeats (dropped)."""
        return st.prev is None and st.resume_after is not None and sample.ts <= st.resume_after

    def _step_back(self, info: GpuInfo, st: _GpuState, sample: GpuSample, gpm_fn: GpmFn) -> list[Row]:
        """The clock stepped back: settle the span up to the last poll with this poll's counter
        reading (unknown without one), close the windows there and drop the polls until the
        clock passes it again (module docstring).

        The counter ran on between the last poll and this one, for a time the stepped clock
        cannot tell: that stretch is settled as a gap of one poll interval (the polled
        intervals get their integrated power, the stretch the rest), and its share dropped."""
        assert st.prev is not None
        last = st.prev.ts
        if sample.energy_mj is not None and st.pending:
            self._settle(info, st, sample.energy_mj, [self.poll])
        log.warning("GPU %d (%s): the clock stepped back %.1f s; its windows end at the poll before, "
                    "polls until the clock passes %.3f again are dropped and their energy is not "
                    "attributed", info.gpu_index, info.uuid, last - sample.ts, last)
        rows = self.flush(info, None, gpm_fn)
        st.resume_after = last
        return rows

    def _gpm(self, st: _GpuState, first: object | None, second: object, gpm_fn: GpmFn,
             span_s: float) -> GpmMetrics:
        """GPM metrics between two snapshots, finite or null; null for a span too short to mean
        anything (``MIN_GPM_SPAN_S``) or without a first snapshot."""
        if first is None or span_s < MIN_GPM_SPAN_S:
            return GpmMetrics()
        try:
            return self.nonfinite.gpm(st.info, gpm_fn(first, second))
        except Exception as exc:  # a GPM failure must not lose the window's energy
            log.warning("GPU %d: GPM metrics failed: %s", st.info.gpu_index, exc)
            return GpmMetrics()

    def _settle(self, info: GpuInfo, st: _GpuState, e: int | None, extra: list[float]
                ) -> tuple[list[float], bool]:
        """Hand the counter delta since the last energy point to the intervals it spans.

        The span is ``st.pending`` (intervals already in segments) plus ``extra``: the lengths
        of a gap's pieces (whose segments the caller fills in); the shares of ``extra`` are
        returned with whether the delta is known. A span in one segment gets the whole delta.
        Otherwise, without a gap, the shares follow each interval's integrated power; with a
        gap, the polled intervals get their integrated power (scaled down if that exceeds the
        delta) and the gap, the one stretch nothing was read in, the rest, by time over its
        pieces. If any polled interval has no power, the whole span goes by time. The last
        share takes the remainder, so the shares always add up to the delta. ``e`` becomes the
        new anchor.
        """
        delta, known = self._delta(info, st.anchor_mj, e)
        pending, st.pending, st.anchor_mj = st.pending, [], e
        if not known:
            for seg, _, _ in pending:
                seg.energy_known = False
            return [0.0] * len(extra), False
        if not extra and pending:
            first = pending[0][0]
            if all(seg is first for seg, _, _ in pending):
                first.energy_mj += delta
                return [], True
        est_mj = [w * 1e3 for _, _, w in pending if w is not None]
        if len(est_mj) != len(pending) or (not extra and sum(est_mj) <= 0):
            parts = proportional(delta, [d for _, d, _ in pending] + extra)  # no power: by time
        elif not extra:
            parts = proportional(delta, est_mj)
        else:
            polled = sum(est_mj)
            if polled >= delta:
                parts = proportional(delta, est_mj) + [0.0] * len(extra)
            else:
                parts = est_mj + proportional(delta - polled, extra)
        if parts:
            parts[-1] = delta - sum(parts[:-1])
        for (seg, _, _), part in zip(pending, parts, strict=False):
            seg.energy_mj += part
        return parts[len(pending):], True

    def _delta(self, info: GpuInfo, e0: int | None, e1: int | None) -> tuple[float, bool]:
        if e0 is None or e1 is None:
            return 0.0, False
        d = e1 - e0
        if d < 0:
            if e0 > _WRAP // 2:
                return float(d + _WRAP), True
            log.warning("GPU %d (%s): energy counter went back %d -> %d mJ (driver reload?); "
                        "energy of that poll interval unknown", info.gpu_index, info.uuid, e0, e1)
            return 0.0, True
        return float(d), True

    def flush(self, info: GpuInfo, gpm: object | None, gpm_fn: GpmFn) -> list[Row]:
        """Close the GPU's open (partial) window now, e.g. at shutdown; forget the baseline."""
        st = self._state(info)
        for seg, _, _ in st.pending:  # no counter reading after the last energy point: unknown
            seg.energy_known = False
        st.pending = []
        self._close(st, gpm_end=gpm, gpm_fn=gpm_fn)
        rows = self._release(st)
        st.continuous = False
        st.prev = None
        st.gpm_start = None
        return rows

    def unsettled(self, info: GpuInfo) -> bool:
        """Whether polls since the last energy point wait for a counter reading (before flush)."""
        return bool(self._state(info).pending)

    def has_open(self, info: GpuInfo) -> bool:
        """Whether the GPU has an open window to flush."""
        st = self._gpus.get(info.gpu_index)
        return st is not None and bool(st.segments or st.held)

    def flush_all(self, gpm_for: Callable[[GpuInfo], object | None], gpm_fn_for: Callable[[GpuInfo], GpmFn]
                  ) -> list[Row]:
        rows: list[Row] = []
        for st in list(self._gpus.values()):
            if st.segments or st.held:
                rows += self.flush(st.info, gpm_for(st.info), gpm_fn_for(st.info))
        return rows

    def _close(self, st: _GpuState, gpm_end: object | None, gpm_fn: GpmFn) -> None:
        """Close the open window: its rows wait in ``st.held`` until its energy is settled."""
        if st.window is None or not st.segments:
            st.segments = []
            st.window = None
            return
        gpm = GpmMetrics()
        if gpm_end is not None and st.prev is not None:  # the window's GPM span ends at its last poll
            gpm = self._gpm(st, st.gpm_start, gpm_end, gpm_fn, st.prev.ts - st.gpm_ts)
        w0 = st.window * self.period
        st.held.append(_Closed(list(st.segments), w0, w0 + self.period, st.window_whole,
                               st.window_a, gpm))
        st.segments = []
        st.window = None
        st.gpm_start = None

    def _release(self, st: _GpuState) -> list[Row]:
        """The rows of closed windows, once no interval of theirs waits for the counter."""
        if st.pending or not st.held:
            return []
        rows = [self._row(st.info, seg, c.w0 if c.whole and seg.a_first == c.window_a else seg.a_first,
                          c.w1, seg.gpm if seg.gpm is not None else c.gpm)
                for c in st.held for seg in c.segments]
        st.held = []
        return rows

    def _row(self, info: GpuInfo, seg: _Segment, ts_start: float, w1: float, gpm: GpmMetrics) -> Row:
        ts_end = min(seg.b_last, w1)
        covered = seg.b_last - seg.a_first
        energy_j = seg.energy_mj / 1e3 if seg.energy_known else None
        row: Row = {
            "ts_start": ts_start,
            "ts_end": ts_end,
            "host": self.host,
            "gpu_index": info.gpu_index,
            "gpu_uuid": info.uuid,
            "gpu_model": info.model,
            "job_id": seg.job[0] if seg.job else None,
            "user": seg.job[1] if seg.job else None,
            "energy_j": energy_j,
            "power_avg_w": energy_j / covered if energy_j is not None and covered > 0 else None,
            "power_max_w": seg.power_max_w,
            "power_limit_w": seg.power_limit_w,
            "sm_clock_max_mhz": info.sm_clock_max_mhz,
            "throttle_power_frac": seg.thr_power_n / seg.reasons_n if seg.reasons_n else None,
            "throttle_thermal_frac": seg.thr_thermal_n / seg.reasons_n if seg.reasons_n else None,
            "temp_c": seg.temp_c,
            "fb_used_mib": seg.fb_used_mib,
            "fb_total_mib": info.fb_total_mib,
            "n_polls": seg.n_polls,
        }
        for k in _MEANS:
            s, n = seg.sums[k]
            row[k] = s / n if n else None
        for col, (s1, s2, n) in ((c, seg.moments[c]) for c in _SPREADS):
            row[col] = math.sqrt(max(s2 / n - (s1 / n) ** 2, 0.0)) if n >= 2 else None
        for c in GPM_COLUMNS:
            row[c] = getattr(gpm, c)
        return row
