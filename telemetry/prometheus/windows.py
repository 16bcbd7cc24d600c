"""dcgm-exporter samples -> telemetry v1 window rows, through the daemon's own WindowBuilder.

Each GPU's series (one per field, split further wherever the job label changed) are merged into
one timeline keyed by scrape time: every scrape is a poll that carries the energy counter, the
gauges, the job(s) seen at that scrape and a "GPM mark"; a scrape of a GPU several jobs share
(dcgm-exporter repeats its series per job) has one ``shared:`` key whose rows are split equally.
The builder then does exactly what it does for the daemon: an interval belongs to the job seen at
its start; window and job energy are counter deltas; gaps are split by time or, past
``max_gap_s``, not attributed.

Counter resets (a driver reload, a GPU reset) follow Prometheus's counter convention: a value
below the previous one means the counter restarted at 0, so the interval's energy is the new value.
PROF ratios are averaged per sample over a window's scrapes, as the replay backend averages its
recorded per-second GPM values, so both paths see the same means on the same recording.

Import boundaries: the scrape at or just before ``start`` is the baseline (not attributed), so the
interval that crosses ``start`` belongs to this import and consecutive imports with shared bounds
(``--start`` of one = ``--end`` of the other) neither lose nor double-count energy.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from wattclass.gpu.base import GpmMetrics, GpuInfo, GpuSample
from wattclass.telemetry.prometheus import mapping
from wattclass.telemetry.prometheus.client import Series
from wattclass.telemetry.splitter import SHARED_PREFIX, split_equally
from wattclass.telemetry.windows import Job, Row, WindowBuilder

log = logging.getLogger(__name__)


@dataclass
class GpuTimeline:
    """All samples of one GPU, merged over series; values keyed by scrape time."""

    key: mapping.GpuKey
    labels: dict[str, str] = field(default_factory=dict)  # identity labels of the first series seen
    fields: dict[str, dict[float, float]] = field(default_factory=dict)
    #: scrape time -> the jobs seen there (job id -> user): dcgm-exporter gives a GPU that several
    #: jobs share one copy of each series per job, differing only in the job label
    jobs: dict[float, dict[str, str | None]] = field(default_factory=dict)
    #: series of MIG instances (``GPU_I_ID``) left out: the import cannot split a MIG GPU per instance
    mig_series: int = 0
    #: clock-event reasons samples that are no 64-bit mask (NaN, infinite, negative), taken as missing
    bad_reasons: int = 0


def merge(series_chunks: Iterable[list[Series]], job_label: str, user_label: str | None
          ) -> dict[mapping.GpuKey, GpuTimeline]:
    """Group the series of all chunks by GPU; skip series without a UUID (not a GPU's) and count
    those of MIG instances (``GpuTimeline.mig_series``), which are left out."""
    gpus: dict[mapping.GpuKey, GpuTimeline] = {}
    for chunk in series_chunks:
        for s in chunk:
            key = mapping.gpu_key(s.labels)
            if key is None:
                continue
            tl = gpus.get(key)
            if tl is None:
                tl = gpus[key] = GpuTimeline(key, dict(s.labels))
            if s.labels.get(mapping.MIG_INSTANCE_LABEL):
                # a MIG instance's series carries its GPU's UUID: merged, the instances overwrote
                # each other's samples and jobs, and one job got the whole GPU's windows
                tl.mig_series += 1
                continue
            vals = tl.fields.setdefault(s.labels.get("__name__", ""), {})
            vals.update(zip(s.t, s.v, strict=True))
            job = s.labels.get(job_label)
            if job:
                user = (s.labels.get(user_label) if user_label else None) or None
                for t in s.t:
                    _note_job(tl.jobs.setdefault(t, {}), job, user)
    return gpus


@dataclass(frozen=True)
class _Mark:
    """A GPM mark: the index of the scrape it was taken at."""

    i: int


class _Prof:
    """Per-field running sums over the timeline's scrapes, so a window's mean is two lookups."""

    def __init__(self, tl: GpuTimeline, times: list[float]) -> None:
        self.cum: dict[str, tuple[list[float], list[int]]] = {}
        for name, (col, scale) in mapping.PROF.items():
            vals = tl.fields.get(name)
            if not vals:
                continue
            s, n, sums, counts = 0.0, 0, [0.0], [0]
            for t in times:
                v = vals.get(t)
                if v is not None and math.isfinite(v):  # not NaN, nor an infinity that spoils the sums
                    s += v * scale
                    n += 1
                sums.append(s)
                counts.append(n)
            self.cum[col] = (sums, counts)

    def metrics(self, first: object, second: object) -> GpmMetrics:
        if not isinstance(first, _Mark) or not isinstance(second, _Mark) or second.i <= first.i:
            return GpmMetrics()
        out: dict[str, float | None] = {}
        for col, (sums, counts) in self.cum.items():
            n = counts[second.i + 1] - counts[first.i + 1]
            out[col] = (sums[second.i + 1] - sums[first.i + 1]) / n if n else None
        return GpmMetrics(**out)


def _energy(tl: GpuTimeline, times: list[float]) -> list[int | None]:
    """The energy counter per scrape, made monotonic across resets (Prometheus's convention)."""
    vals = tl.fields.get(mapping.ENERGY, {})
    out: list[int | None] = []
    offset, prev = 0.0, None
    for t in times:
        v = vals.get(t)
        if v is None or not math.isfinite(v):  # NaN or inf: a scrape without a reading, not a crash
            out.append(None)
            continue
        if prev is not None and v < prev:
            log.warning("GPU %s on %s: energy counter went back %.0f -> %.0f mJ at %.0f (reset); "
                        "counting the new value as that interval's energy",
                        tl.key.uuid, tl.key.host, prev, v, t)
            offset += prev
        prev = v
        out.append(round(v + offset))
    return out


def _constant(tl: GpuTimeline, name: str) -> float | None:
    """A GPU constant (``mapping.INFO``) from its series: the largest finite, positive sample
    (a NaN or 0 is a scrape DCGM could not read), else None."""
    for dcgm, (col, scale) in mapping.INFO.items():
        if col == name:
            vals = [v * scale for v in tl.fields.get(dcgm, {}).values() if math.isfinite(v) and v > 0]
            if vals:
                return float(max(vals))
    return None


def _gauge(tl: GpuTimeline, t: float, name: str) -> float | None:
    """The field ``name`` at scrape ``t`` from the first of its DCGM names (``mapping.GAUGES``)
    with a finite sample there, else the first non-finite one (NaN: the daemon's and ``_reasons``'
    missing-value counts see it), else None. Why not the first present: a NaN enforced limit
    hid the management limit the exporter also gave."""
    odd: float | None = None
    for dcgm, (col, scale) in mapping.GAUGES.items():
        if col == name:
            v = tl.fields.get(dcgm, {}).get(t)
            if v is not None and math.isfinite(v):
                return float(v * scale)
            if v is not None and odd is None:
                odd = float(v * scale)
    return odd


#: The clock-event reasons are an NVML bitmask of 64 bits.
_MASK_END = 2**64


def _reasons(tl: GpuTimeline, t: float) -> int | None:
    """The clock-event reasons bitmask at scrape ``t``: a whole number 0 .. 2**64 - 1, else
    missing (None), as a non-finite gauge is missing.

    Why: the gauge is a float in Prometheus; a NaN or infinite sample (a field DCGM could not
    read, a recording rule) failed the whole import with a traceback (``int(nan)``), and a
    negative one, a Python int with every bit set, counted its window as power- and
    thermal-throttled."""
    v = _gauge(tl, t, "clock_event_reasons")
    if v is None or not math.isfinite(v) or not 0 <= v < _MASK_END or v != int(v):
        if v is not None:
            tl.bad_reasons += 1
        return None
    return int(v)


def scrape_interval(times: list[float]) -> float:
    """The typical scrape interval (median spacing), 1 s when it cannot be told."""
    d = [b - a for a, b in itertools.pairwise(times) if b > a]
    return float(statistics.median(d)) if d else 1.0


def gpu_rows(tl: GpuTimeline, start: float, period_s: float, max_gap_s: float = 600.0) -> list[Row]:
    """The window rows of one GPU's timeline, from the scrape at/before ``start`` on."""
    base = mapping.ENERGY if tl.fields.get(mapping.ENERGY) else "DCGM_FI_DEV_POWER_USAGE"
    times = sorted(tl.fields.get(base, {}))
    if not times:
        times = sorted({t for vals in tl.fields.values() for t in vals})
    k = bisect.bisect_right(times, start) - 1
    times = times[max(k, 0):]
    if len(times) < 2:
        return []
    poll = scrape_interval(times)
    lab = tl.labels
    prof = _Prof(tl, times)
    info = GpuInfo(
        gpu_index=int(lab.get(mapping.INDEX_LABEL, "0") or 0), uuid=tl.key.uuid,
        model=lab.get(mapping.MODEL_LABEL, ""), pci_bus_id=lab.get(mapping.PCI_LABEL, ""),
        fb_total_mib=None, sm_clock_max_mhz=_constant(tl, "sm_clock_max_mhz"), power_limit_default_w=None,
        power_limit_min_w=None, power_limit_max_w=None, gpm_supported=bool(prof.cum),
    )
    builder = WindowBuilder(tl.key.host, period_s, poll, max_gap_s=max_gap_s)
    energy = _energy(tl, times)
    rows: list[Row] = []
    users: dict[str, str | None] = {}
    for i, t in enumerate(times):
        g: dict[str, Any] = {c: _gauge(tl, t, c) for c in (
            "power_w", "power_limit_w", "util_gpu_pct", "util_mem_pct", "sm_clock_mhz", "mem_clock_mhz",
            "temp_c", "fb_used_mib")}
        sample = GpuSample(ts=t, energy_mj=energy[i], clock_event_reasons=_reasons(tl, t), **g)
        job = _job_at(tl, t, users)
        mark = _Mark(i) if info.gpm_supported and builder.needs_gpm(info, sample, job) else None
        rows += builder.add(info, sample, job, mark, prof.metrics)
    rows += builder.flush(info, _Mark(len(times) - 1) if info.gpm_supported else None, prof.metrics)
    if tl.bad_reasons:
        log.warning("GPU %s on %s: %d clock-event reasons sample(s) that are no bitmask (NaN, infinite or "
                    "negative) taken as missing", tl.key.uuid, tl.key.host, tl.bad_reasons)
    out = [part for r in rows for part in split_equally(r, users)]
    for r in out:
        r.pop("n_polls", None)
    return out


def _job_at(tl: GpuTimeline, t: float, users: dict[str, str | None]) -> Job:
    """The builder's job at scrape ``t``: the one job seen there, or for several (a shared GPU)
    one ``shared:`` key of them all, in a fixed order, which ``split_equally`` splits later
    (``users`` collects each job's user for it). Why: with the last series' job taken, one job
    of a shared GPU got all its windows and energy and the other none."""
    seen = tl.jobs.get(t)
    if not seen:
        return None
    if len(seen) == 1:
        ((job, user),) = seen.items()
        return job, user
    for job, user in seen.items():
        _note_job(users, job, user)
    return SHARED_PREFIX + ",".join(sorted(seen)), None


def _note_job(users: dict[str, str | None], job: str, user: str | None) -> None:
    """Record ``job`` with its ``user``: a copy of its series without the user label keeps a
    user another copy gave (None only where no copy names one)."""
    if user is not None or job not in users:
        users[job] = user


def missing_fields(tl: GpuTimeline) -> list[str]:
    """The fields wattclass reads that this GPU's exporter did not export."""
    have = {n for n, v in tl.fields.items() if v}
    out = [mapping.ENERGY] if mapping.ENERGY not in have else []
    out += [f for f in mapping.RULE_FIELDS if f not in have]
    out += [group[0] for group in mapping.MODEL_FIELDS if not have.intersection(group)]
    return out
