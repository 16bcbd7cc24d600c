"""Features from the basic NVML columns (never GPM) and mergeable per-job partial aggregates.

Window features are ratios where possible (power / limit, clock / max clock) so that a model
trained on one GPU model transfers to others with different limits and clocks.

Job aggregates are *partial*: for each (job_id, host) they hold sums, duration-weighted sums and
sums of squares, minima, maxima and counts. Two partials merge by summing sums and taking min of
mins / max of maxes, so any split of the data (files, row groups, hosts, days, workers) gives the
same result as one pass. ``finalize`` turns merged partials into one row per job (means, standard
deviations, energy, GPU-hours, hosts). All work is numpy / Arrow compute, no Python loop per row.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

FloatArray = npt.NDArray[np.float64]

#: Model inputs, in order. Derived only from BASIC_COLUMNS.
FEATURES: tuple[str, ...] = (
    "power_frac",  # power_avg / limit: compute-bound work sits at the limit
    "power_max_frac",  # peak 1 s power / limit
    "power_peak_ratio",  # peak / mean power: bursty vs steady
    "clock_frac",  # SM clock / max: the limit pulls it down for compute-bound work
    "throttle_power_frac",
    "throttle_thermal_frac",
    "util_gpu_pct",
    "util_mem_pct",  # memory-controller busy share: high for streaming kernels
    "mem_per_gpu_util",  # util_mem / util_gpu
    "power_per_util",  # power_frac per unit of util_gpu: busy but cool vs busy and hot
    "clock_drop_power",  # (1 - clock_frac) x power-throttle share
    "temp_c",
    "fb_used_frac",
)

#: Columns of the telemetry that window_features reads.
INPUT_COLUMNS: tuple[str, ...] = (
    "power_avg_w",
    "power_max_w",
    "power_limit_w",
    "sm_clock_mhz",
    "sm_clock_max_mhz",
    "throttle_power_frac",
    "throttle_thermal_frac",
    "util_gpu_pct",
    "util_mem_pct",
    "temp_c",
    "fb_used_mib",
    "fb_total_mib",
)

KEYS: tuple[str, ...] = ("job_id", "host")


def column_f64(table: pa.Table, name: str) -> FloatArray:
    """A numeric column as float64 with NaN for nulls (and for a column the table lacks)."""
    if name not in table.column_names:
        return np.full(table.num_rows, np.nan)
    col = table.column(name)
    col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    return np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.float64)


def _div(a: FloatArray, b: FloatArray) -> FloatArray:
    with np.errstate(divide="ignore", invalid="ignore"):
        out = a / b
    out[~np.isfinite(out)] = np.nan
    return out


def window_features(table: pa.Table) -> dict[str, FloatArray]:
    """Per-window features (NaN where an input is null or a ratio is undefined)."""
    c = {n: column_f64(table, n) for n in INPUT_COLUMNS}
    power_frac = _div(c["power_avg_w"], c["power_limit_w"])
    clock_frac = _div(c["sm_clock_mhz"], c["sm_clock_max_mhz"])
    util_gpu = c["util_gpu_pct"]
    return {
        "power_frac": power_frac,
        "power_max_frac": _div(c["power_max_w"], c["power_limit_w"]),
        "power_peak_ratio": _div(c["power_max_w"], c["power_avg_w"]),
        "clock_frac": clock_frac,
        "throttle_power_frac": c["throttle_power_frac"],
        "throttle_thermal_frac": c["throttle_thermal_frac"],
        "util_gpu_pct": util_gpu,
        "util_mem_pct": c["util_mem_pct"],
        "mem_per_gpu_util": _div(c["util_mem_pct"], np.maximum(util_gpu, 1.0)),
        "power_per_util": _div(power_frac, np.maximum(util_gpu, 1.0) / 100.0),
        "clock_drop_power": (1.0 - clock_frac) * c["throttle_power_frac"],
        "temp_c": c["temp_c"],
        "fb_used_frac": _div(c["fb_used_mib"], c["fb_total_mib"]),
    }


def feature_matrix(feats: Mapping[str, FloatArray]) -> npt.NDArray[np.float32]:
    """The model's input matrix (rows = windows, columns = FEATURES) as float32."""
    return np.column_stack([np.asarray(feats[f], dtype=np.float32) for f in FEATURES])


def durations_s(table: pa.Table) -> FloatArray:
    """Window lengths in seconds from ts_start/ts_end (timestamp[ms])."""
    start = pc.cast(table.column("ts_start"), pa.int64()).to_numpy()
    end = pc.cast(table.column("ts_end"), pa.int64()).to_numpy()
    return np.asarray((end - start) / 1000.0, dtype=np.float64)


def _agg_spec(count_columns: Iterable[str]) -> dict[str, str]:
    spec: dict[str, str] = {
        "user": "min",
        "n_windows": "sum",
        "dur_s": "sum",
        "energy_j": "sum",
        "ts_start": "min",
        "ts_end": "max",
    }
    for f in FEATURES:
        spec[f"{f}__w"] = "sum"
        spec[f"{f}__s"] = "sum"
        spec[f"{f}__q"] = "sum"
        spec[f"{f}__min"] = "min"
        spec[f"{f}__max"] = "max"
    for c in count_columns:
        spec[c] = "sum"
    return spec


def batch_partials(
    table: pa.Table,
    feats: Mapping[str, FloatArray],
    counts: Mapping[str, npt.ArrayLike] | None = None,
) -> pa.Table:
    """Partial aggregates of one batch of windows, per (job_id, host); rows without job dropped.

    ``counts`` are extra per-window numbers summed per job (rule window counts, model soft counts).
    """
    counts = counts or {}
    job = table.column("job_id")
    keep = pc.is_valid(job)
    dur = durations_s(table)
    energy = column_f64(table, "energy_j")
    user = table.column("user") if "user" in table.column_names else pa.nulls(table.num_rows, pa.string())
    cols: dict[str, pa.Array | pa.ChunkedArray | npt.NDArray[np.generic]] = {
        "job_id": job,
        "host": table.column("host"),
        "user": user,
        "n_windows": np.ones(table.num_rows, dtype=np.int64),
        "dur_s": dur,
        "energy_j": np.nan_to_num(energy),
        "ts_start": table.column("ts_start"),
        "ts_end": table.column("ts_end"),
    }
    for f in FEATURES:
        x = np.asarray(feats[f], dtype=np.float64)
        valid = ~np.isnan(x)
        w = np.where(valid, dur, 0.0)
        x0 = np.where(valid, x, 0.0)
        wx = w * x0
        cols[f"{f}__w"] = w
        cols[f"{f}__s"] = wx
        cols[f"{f}__q"] = wx * x0
        xa = pa.array(x, from_pandas=True)  # NaN -> null: Arrow's min/max skip nulls, not NaN
        cols[f"{f}__min"] = xa
        cols[f"{f}__max"] = xa
    for name, values in counts.items():
        cols[name] = np.asarray(values, dtype=np.float64)
    t = pa.table(cols).filter(keep)
    return _group(t, _agg_spec(counts.keys()))


def _group(t: pa.Table, spec: Mapping[str, str]) -> pa.Table:
    names = set(t.column_names)
    cols = [c for c in spec if c in names]
    out = t.group_by(list(KEYS), use_threads=False).aggregate([(c, spec[c]) for c in cols])
    back = {f"{c}_{a}": c for c, a in spec.items()}
    return out.rename_columns([back.get(n, n) for n in out.column_names])


def merge_partials(parts: Iterable[pa.Table]) -> pa.Table | None:
    """Merge partial aggregates (from any split of the data) into one partial; None if none."""
    parts = [p for p in parts if p.num_rows]
    if not parts:
        return None
    t = pa.concat_tables(parts, promote_options="default")
    counts = [c for c in t.column_names if c not in KEYS and c not in _agg_spec(())]
    return _group(t, _agg_spec(counts))


def finalize(partials: pa.Table) -> pd.DataFrame:
    """One row per job: totals, time span, hosts, and per feature mean/std/min/max.

    Per-host partials of multi-node jobs are combined here (jobs per day are few, so pandas is fine).
    """
    df = partials.to_pandas()
    count_cols = [c for c in df.columns if c not in KEYS and c not in _agg_spec(())]
    spec = _agg_spec(count_cols)
    agg: dict[str, str] = {c: ("first" if a == "min" and c == "user" else a) for c, a in spec.items()}
    g = df.groupby("job_id", sort=True)
    jobs = g.agg(agg)
    jobs["hosts"] = g["host"].agg(lambda s: ",".join(sorted(set(s))))
    jobs["gpu_hours"] = jobs["dur_s"] / 3600.0
    for f in FEATURES:
        w = jobs[f"{f}__w"].to_numpy()
        with np.errstate(divide="ignore", invalid="ignore"):
            mean = jobs[f"{f}__s"].to_numpy() / w
            var = jobs[f"{f}__q"].to_numpy() / w - mean * mean
        jobs[f"{f}_mean"] = np.where(w > 0, mean, np.nan)
        jobs[f"{f}_std"] = np.where(w > 0, np.sqrt(np.maximum(var, 0.0)), np.nan)
        jobs[f"{f}_min"] = jobs.pop(f"{f}__min")
        jobs[f"{f}_max"] = jobs.pop(f"{f}__max")
        jobs = jobs.drop(columns=[f"{f}__w", f"{f}__s", f"{f}__q"])
    return jobs.reset_index()
