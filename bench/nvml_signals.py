"""Every non-GPM NVML signal of a job as one normalised fingerprint (issue 13 round 8).

Why: bench/eval_ceiling.py bounds any classifier on the model's 15 job-level inputs at about 0.91
(opposite-label "twins" closer than a re-run). That says nothing about what else NVML offers
without GPM. This module turns each job's raw 1 Hz probe samples into a broad, fixed set of
per-job statistics of *every* non-GPM field, so the same twin/matching bound can be taken over
everything a daemon on a GPU without GPM could compute from its 1 s polls.

The feature set (fixed before the bound was looked at; nothing here is fitted to the truth):

Fields read (``SAMPLE_COLUMNS``; never a ``gpm_*`` column, which is the truth side): util_gpu,
util_mem, power_mw, power_instant_mw, energy_mj, sm_clock_mhz, mem_clock_mhz, pstate,
clock_event_reasons, temp_c, fb_used_mib, n_procs, ts. Left out: ``nvml_basic_us`` /
``nvml_gpm_us`` (the probe's own call latencies, measured in the same poll loop as the GPM
calls: not a GPU signal, and GPM-contaminated), ``job`` (the label of the run).

Normalised per-sample series (limits from the part's caps.json: no absolute watts, clocks,
temperatures or MiB that differ between GPU models): ``util_gpu`` and ``util_mem`` (/100),
``power`` (power_mw / enforced limit), ``power_inst`` (power_instant_mw / limit), ``power_energy``
(d energy_mj / dt / limit: the counter's average between polls), ``sm_clock`` (/ max SM clock),
``mem_clock`` (/ max memory clock), ``fb_used`` (/ total framebuffer; a caps file without
``fb_total_mib`` borrows it from another part of the same GPU model).

Per series (``SERIES_STATS``): mean, std, 10/50/90 % quantiles, mean absolute 1 s step (the
dynamics), lag-1 autocorrelation (slow phases vs noise).

Cross-signal (``CROSS_FEATURES``): sub-second power ripple (power_inst - power: mean and std, over
the limit); job-level ratios power per util_gpu, power per util_mem, util_mem per util_gpu,
SM-clock drop per power; Pearson correlations over the job's samples of util_gpu~power,
util_mem~power, sm_clock~power, util_gpu~util_mem, sm_clock~util_mem, and lagged by one poll
power(t)~util_gpu(t-1), power(t)~util_mem(t-1).

Clock-event reasons and states (``EVENT_FEATURES``): the share of samples with each NVML clock
event bit set (GPU idle 0x1, SW power cap 0x4, HW slowdown 0x8, SW thermal 0x20, HW thermal 0x40,
HW power brake 0x80), with any bit but idle, the share of polls where the bitmask changed; the
share of samples in P0 and the mean P-state; the mean process count.

Thermal (``THERMAL_FEATURES``): temperature slope over the job (least squares, K/s), that slope per
mean power fraction (heating per unit of load), and the std of the temperature about its trend.
Footprint growth: (last - first) fb_used / total.

A statistic a job's samples cannot give (a constant series' correlation, a 1-sample std) is NaN;
the quantile scaling of eval_ceiling maps it to 0.5. Samples of a job: the replay convention
(wattclass/gpu/replay.py), ``start <= ts <= end + 0.5`` of its runs.csv row; job keys follow
classifier/training.py (``<recording folder>:<job_id>``, ids from 5001 over all parts' rows when
runs.csv has no ``job_id``).
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
import pyarrow.parquet as pq

F64 = npt.NDArray[np.float64]

#: The only sample columns read: a ``gpm_*`` column can never reach a fingerprint.
SAMPLE_COLUMNS: tuple[str, ...] = (
    "ts", "util_gpu", "util_mem", "power_mw", "power_instant_mw", "energy_mj", "sm_clock_mhz",
    "mem_clock_mhz", "pstate", "clock_event_reasons", "temp_c", "fb_used_mib", "n_procs",
)
SERIES: tuple[str, ...] = ("util_gpu", "util_mem", "power", "power_inst", "power_energy", "sm_clock",
                           "mem_clock", "fb_used")
SERIES_STATS: tuple[str, ...] = ("mean", "std", "q10", "q50", "q90", "step", "acf1")
CROSS_FEATURES: tuple[str, ...] = (
    "ripple_mean", "ripple_std", "power_per_util_gpu", "power_per_util_mem", "util_mem_per_util_gpu",
    "clock_drop_per_power", "corr_util_gpu_power", "corr_util_mem_power", "corr_sm_clock_power",
    "corr_util_gpu_util_mem", "corr_sm_clock_util_mem", "corr_power_util_gpu_lag1",
    "corr_power_util_mem_lag1",
)
#: NVML clock event reason bits (nvmlClocksEventReason*).
EVENT_BITS: tuple[tuple[str, int], ...] = (
    ("idle", 0x1), ("sw_power_cap", 0x4), ("hw_slowdown", 0x8), ("sw_thermal", 0x20),
    ("hw_thermal", 0x40), ("hw_power_brake", 0x80),
)
EVENT_FEATURES: tuple[str, ...] = (
    *(f"event_{name}_share" for name, _ in EVENT_BITS), "event_any_but_idle_share", "event_change_share",
    "pstate_p0_share", "pstate_mean", "n_procs_mean",
)
THERMAL_FEATURES: tuple[str, ...] = ("temp_slope_k_per_s", "temp_slope_per_power", "temp_resid_std_k",
                                     "fb_growth_ratio")
FEATURE_NAMES: tuple[str, ...] = (
    *(f"{s}_{st}" for s in SERIES for st in SERIES_STATS), *CROSS_FEATURES, *EVENT_FEATURES,
    *THERMAL_FEATURES,
)
#: Each feature's source field group, for the ablation (eval_ceiling --fingerprint nvml-all).
GROUPS: dict[str, tuple[str, ...]] = {
    "util_gpu": ("util_gpu_",),
    "util_mem": ("util_mem_",),
    "power": ("power_", "ripple_"),
    "clocks": ("sm_clock_", "mem_clock_", "clock_drop_"),
    "fb_used": ("fb_",),
    "correlations": ("corr_",),
    "events_states": ("event_", "pstate_", "n_procs_"),
    "thermal": ("temp_",),
}
#: A job holds its GPU until ``end`` + this (wattclass/gpu/replay.py JOB_GRACE_S).
JOB_GRACE_S = 0.5
FIRST_JOB_ID = 5001


def feature_group(name: str) -> str:
    """The GROUPS key a feature belongs to (the longest matching prefix wins)."""
    best, best_len = "", -1
    for group, prefixes in GROUPS.items():
        for p in prefixes:
            if name.startswith(p) and len(p) > best_len:
                best, best_len = group, len(p)
    if not best:
        raise ValueError(f"feature {name!r}: in no group")
    return best


def _corr(a: F64, b: F64) -> float:
    ok = np.isfinite(a) & np.isfinite(b)
    if ok.sum() < 3:
        return float("nan")
    x, y = a[ok], b[ok]
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])


def _ratio(a: float, b: float) -> float:
    return a / b if np.isfinite(a) and np.isfinite(b) and b > 1e-6 else float("nan")


def _series_stats(x: F64) -> list[float]:
    x = x[np.isfinite(x)]
    if len(x) == 0:
        return [float("nan")] * len(SERIES_STATS)
    std = float(x.std()) if len(x) > 1 else float("nan")
    step = float(np.abs(np.diff(x)).mean()) if len(x) > 1 else float("nan")
    return [float(x.mean()), std, *(float(v) for v in np.quantile(x, [0.1, 0.5, 0.9])), step,
            _corr(x[:-1], x[1:])]


def job_features(s: dict[str, F64], limit_mw: float, max_sm_mhz: float, max_mem_mhz: float,
                 fb_total_mib: float) -> F64:
    """FEATURE_NAMES of one job from its samples (``s``: SAMPLE_COLUMNS as float arrays, time order)."""
    ts = s["ts"]
    series: dict[str, F64] = {
        "util_gpu": s["util_gpu"] / 100.0,
        "util_mem": s["util_mem"] / 100.0,
        "power": s["power_mw"] / limit_mw,
        "power_inst": s["power_instant_mw"] / limit_mw,
        "sm_clock": s["sm_clock_mhz"] / max_sm_mhz,
        "mem_clock": s["mem_clock_mhz"] / max_mem_mhz,
        "fb_used": s["fb_used_mib"] / fb_total_mib if fb_total_mib > 0 else np.full(len(ts), np.nan),
    }
    with np.errstate(invalid="ignore", divide="ignore"):
        dt = np.diff(ts)
        pe = np.where(dt > 0, np.diff(s["energy_mj"]) / np.where(dt > 0, dt, 1.0), np.nan) / limit_mw
    series["power_energy"] = pe
    out: list[float] = []
    for name in SERIES:
        out.extend(_series_stats(series[name]))
    m = {k: float(np.nanmean(v)) if np.isfinite(v).any() else float("nan") for k, v in series.items()}
    ripple = series["power_inst"] - series["power"]
    rip = ripple[np.isfinite(ripple)]
    p, ug, um, sc = series["power"], series["util_gpu"], series["util_mem"], series["sm_clock"]
    out += [
        float(rip.mean()) if len(rip) else float("nan"),
        float(rip.std()) if len(rip) > 1 else float("nan"),
        _ratio(m["power"], m["util_gpu"]), _ratio(m["power"], m["util_mem"]),
        _ratio(m["util_mem"], m["util_gpu"]), _ratio(1.0 - m["sm_clock"], m["power"]),
        _corr(ug, p), _corr(um, p), _corr(sc, p), _corr(ug, um), _corr(sc, um),
        _corr(p[1:], ug[:-1]), _corr(p[1:], um[:-1]),
    ]
    reasons = s["clock_event_reasons"]
    ok = np.isfinite(reasons)
    r = reasons[ok].astype(np.int64)
    n = max(len(r), 1)
    out += [float(((r & bit) != 0).sum() / n) if len(r) else float("nan") for _, bit in EVENT_BITS]
    out.append(float(((r & ~0x1) != 0).sum() / n) if len(r) else float("nan"))
    out.append(float((np.diff(r) != 0).mean()) if len(r) > 1 else float("nan"))
    ps = s["pstate"][np.isfinite(s["pstate"])]
    out += [float((ps == 0).mean()) if len(ps) else float("nan"),
            float(ps.mean()) if len(ps) else float("nan")]
    npr = s["n_procs"][np.isfinite(s["n_procs"])]
    out.append(float(npr.mean()) if len(npr) else float("nan"))
    temp = s["temp_c"]
    tok = np.isfinite(temp) & np.isfinite(ts)
    if tok.sum() >= 3 and np.ptp(ts[tok]) > 0:
        slope, icpt = np.polyfit(ts[tok] - ts[tok][0], temp[tok], 1)
        resid = temp[tok] - (slope * (ts[tok] - ts[tok][0]) + icpt)
        out += [float(slope), _ratio(float(slope), m["power"]) if m["power"] > 0 else float("nan"),
                float(resid.std())]
    else:
        out += [float("nan")] * 3
    fb = series["fb_used"][np.isfinite(series["fb_used"])]
    out.append(float(fb[-1] - fb[0]) if len(fb) > 1 else float("nan"))
    if len(out) != len(FEATURE_NAMES):
        raise AssertionError(f"nvml_signals: {len(out)} values for {len(FEATURE_NAMES)} features")
    return np.asarray(out, dtype=np.float64)


def _parts(folder: Path) -> Iterator[tuple[str, Path, Path, Path]]:
    """(part, caps, samples, runs) of a probe recording folder, parts sorted by name."""
    for caps in sorted(folder.glob("*_caps.json")):
        part = caps.name[: -len("_caps.json")]
        yield part, caps, folder / f"{part}_samples_1hz.parquet", folder / f"{part}_runs.csv"


def _read_caps(path: Path) -> dict[str, object]:
    try:
        caps = json.loads(path.read_text())
    except ValueError as exc:
        raise ValueError(f"{path}: not JSON: {exc}") from exc
    if not isinstance(caps, dict):
        raise ValueError(f"{path}: not a JSON object")
    return caps


def _limit(caps: dict[str, object], path: Path, *keys: str) -> float:
    for k in keys:
        v = caps.get(k)
        if isinstance(v, (int, float)) and v > 0:
            return float(v)
    raise ValueError(f"{path}: no positive {' / '.join(keys)}")


class PartRuns(NamedTuple):
    """One part of a probe recording folder with its runs: what every per-job statistic reads."""

    folder: Path
    part: str
    caps_path: Path
    #: The requested sample columns as float arrays (nulls -> NaN), in time order.
    samples: dict[str, F64]
    #: (job key, start, end) of each runs.csv row, keyed as classifier/training.py keys its jobs.
    runs: list[tuple[str, float, float]]


def part_runs(sources: Sequence[Path], columns: Sequence[str]) -> Iterator[PartRuns]:
    """Every part with a runs.csv of the raw probe recording folders ``sources``, its ``columns``
    read. Shared by every per-job statistic of the raw samples (this module's fingerprints,
    bench/eval_mem_power.py's HBM features) so all select the same jobs and keys; a samples file
    without one of ``columns`` is an error naming the file and the column (an older recording
    lacks a field a newer collector added)."""
    for src in sources:
        src = Path(src)
        index = 0
        for part, caps_path, samples_path, runs_path in _parts(src):
            if not runs_path.exists():
                continue
            if not samples_path.exists():
                raise ValueError(f"{samples_path}: missing (part {part} has caps and runs)")
            have = set(pq.read_schema(samples_path).names)
            lacking = [c for c in columns if c not in have]
            if lacking:
                raise ValueError(f"{samples_path}: no column {', '.join(map(repr, lacking))} (recorded by an "
                                 "older collector?)")
            t = pq.read_table(samples_path, columns=list(columns))
            cols = {c: np.asarray(t.column(c).to_numpy(zero_copy_only=False), dtype=np.float64)
                    for c in columns}
            order = np.argsort(cols["ts"], kind="stable")
            runs: list[tuple[str, float, float]] = []
            with runs_path.open(newline="") as fh:
                for i, row in enumerate(csv.DictReader(fh)):
                    job_id = row.get("job_id") or str(FIRST_JOB_ID + index)
                    index += 1
                    try:
                        start, end = float(row["start"]), float(row["end"])
                    except (KeyError, ValueError) as exc:
                        raise ValueError(f"{runs_path} row {i}: bad start/end: {exc}") from exc
                    runs.append((f"{src.name}:{job_id}", start, end))
            yield PartRuns(src, part, caps_path, {c: v[order] for c, v in cols.items()}, runs)


def job_selection(ts: F64, start: float, end: float) -> npt.NDArray[np.bool_]:
    """A job's samples by the replay convention (wattclass/gpu/replay.py): it holds its GPU from
    ``start`` until ``end`` + JOB_GRACE_S."""
    return np.asarray((ts >= start) & (ts <= end + JOB_GRACE_S), dtype=np.bool_)


def signal_fingerprints(sources: Sequence[Path]) -> tuple[list[str], F64]:
    """(job keys, FEATURE_NAMES per job) of every run in the raw probe recording folders ``sources``,
    keyed as classifier/training.py keys its jobs."""
    # Keyed by (folder, part): two recording folders may each have a part of one name (``part1``).
    caps_all = {(Path(src), p): _read_caps(c) for src in sources for p, c, _, _ in _parts(Path(src))}
    fb_by_model: dict[str, float] = {}
    for caps in caps_all.values():
        fb = caps.get("fb_total_mib")
        if isinstance(fb, (int, float)) and fb > 0:
            fb_by_model.setdefault(str(caps.get("name")), float(fb))
    keys: list[str] = []
    rows: list[F64] = []
    for pr in part_runs(sources, SAMPLE_COLUMNS):
        caps = caps_all[(pr.folder, pr.part)]
        limit = _limit(caps, pr.caps_path, "enforced_limit_mw", "limit_mw")
        max_sm = _limit(caps, pr.caps_path, "clocks_max_sm")
        max_mem = _limit(caps, pr.caps_path, "clocks_max_mem")
        fb_raw = caps.get("fb_total_mib")
        fb_total = float(fb_raw) if isinstance(fb_raw, (int, float)) and fb_raw > 0 else \
            fb_by_model.get(str(caps.get("name")), float("nan"))
        for key, start, end in pr.runs:
            sel = job_selection(pr.samples["ts"], start, end)
            keys.append(key)
            rows.append(job_features({c: v[sel] for c, v in pr.samples.items()}, limit, max_sm, max_mem,
                                     fb_total) if sel.any() else np.full(len(FEATURE_NAMES), np.nan))
    return keys, np.vstack(rows) if rows else np.zeros((0, len(FEATURE_NAMES)))
