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

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

if TYPE_CHECKING:  # pandas only for the per-job table (finalize); the scan must not load it
    import pandas as pd

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
    # Within-window dynamics from the 1 s polls (null in telemetry written before they existed):
    "power_std_frac",  # std of 1 s power / limit: a capped GEMM's power hunts, streaming is steady
    "clock_std_frac",  # std of the SM clock / max clock
    "util_mem_std_pct",  # std of the memory-controller busy share
    "mem_util_per_power",  # util_mem share per power_frac: memory-controller work per watt drawn
)
# Not features, on purpose (issue 13): temp_c (absolute, differs between GPU models and cooling)
# and fb_used_frac (memory *capacity* says nothing about bandwidth- vs compute-boundness).

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
    "power_std_w",
    "sm_clock_std_mhz",
    "util_mem_std_pct",
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
        "power_std_frac": _div(c["power_std_w"], c["power_limit_w"]),
        "clock_std_frac": _div(c["sm_clock_std_mhz"], c["sm_clock_max_mhz"]),
        "util_mem_std_pct": c["util_mem_std_pct"],
        "mem_util_per_power": _div(c["util_mem_pct"] / 100.0, np.maximum(power_frac, 0.05)),
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
    The group-by is numpy on integer-coded keys (one sort per batch, ``bincount`` for sums,
    ``reduceat`` for minima and maxima): at fleet scale this runs on batches of a few hundred
    thousand windows, where it is several times cheaper than a generic hash aggregate with
    some 70 aggregates. The result has the columns and types of ``merge_partials``' output.
    """
    counts = counts or {}
    job = _one_chunk(table.column("job_id"))
    host = _one_chunk(table.column("host"))
    keep = np.asarray(pc.is_valid(job).to_numpy(zero_copy_only=False), dtype=bool)
    all_kept = bool(keep.all())
    rows = None if all_kept else np.flatnonzero(keep)

    def sel(x: npt.NDArray[Any]) -> npt.NDArray[Any]:
        return x if rows is None else x[rows]

    jenc = pc.dictionary_encode(job)
    henc = pc.dictionary_encode(host)
    jcode = sel(np.asarray(jenc.indices.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64))
    hcode = sel(np.asarray(henc.indices.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64))
    n_hosts = max(1, len(henc.dictionary))
    key = jcode * n_hosts + hcode
    order = np.argsort(key, kind="stable")
    skey = key[order]
    starts = np.flatnonzero(np.r_[True, skey[1:] != skey[:-1]]) if len(skey) else np.zeros(0, np.int64)
    gkey = skey[starts]
    inv = np.empty(len(key), dtype=np.int64)
    inv[order] = np.cumsum(np.r_[0, (skey[1:] != skey[:-1]).astype(np.int64)]) if len(skey) else 0
    n = len(starts)

    def gsum(x: npt.NDArray[Any]) -> FloatArray:
        return np.asarray(np.bincount(inv, weights=x, minlength=n), dtype=np.float64)

    def gmin(x: npt.NDArray[Any]) -> npt.NDArray[Any]:
        return np.fmin.reduceat(x[order], starts) if n else x[:0]

    def gmax(x: npt.NDArray[Any]) -> npt.NDArray[Any]:
        return np.fmax.reduceat(x[order], starts) if n else x[:0]

    dur = sel(durations_s(table))
    energy = sel(np.nan_to_num(column_f64(table, "energy_j")))
    ts = {c: sel(pc.cast(table.column(c), pa.int64()).to_numpy()) for c in ("ts_start", "ts_end")}
    out: dict[str, pa.Array] = {
        "job_id": pa.array(jenc.dictionary.take(pa.array(gkey // n_hosts))),
        "host": pa.array(henc.dictionary.take(pa.array(gkey % n_hosts))),
        "user": _group_min_string(table, sel, order, starts, n),
        "n_windows": pa.array(np.diff(np.r_[starts, len(key)]).astype(np.int64)),
        "dur_s": pa.array(gsum(dur)),
        "energy_j": pa.array(gsum(energy)),
        "ts_start": pa.array(gmin(ts["ts_start"])).cast(pa.timestamp("ms", tz="UTC")),
        "ts_end": pa.array(gmax(ts["ts_end"])).cast(pa.timestamp("ms", tz="UTC")),
    }
    for f in FEATURES:
        x = sel(np.asarray(feats[f], dtype=np.float64))
        valid = ~np.isnan(x)
        w = np.where(valid, dur, 0.0)
        x0 = np.where(valid, x, 0.0)
        wx = w * x0
        out[f"{f}__w"] = pa.array(gsum(w))
        out[f"{f}__s"] = pa.array(gsum(wx))
        out[f"{f}__q"] = pa.array(gsum(wx * x0))
        # fmin/fmax skip NaN; an all-NaN group stays NaN -> null, as Arrow's min/max give
        out[f"{f}__min"] = pa.array(gmin(x), from_pandas=True)
        out[f"{f}__max"] = pa.array(gmax(x), from_pandas=True)
    for name, values in counts.items():
        out[name] = pa.array(gsum(sel(np.asarray(values, dtype=np.float64))))
    return pa.table(out)


def _one_chunk(col: pa.ChunkedArray | pa.Array) -> pa.Array:
    if isinstance(col, pa.ChunkedArray):
        return col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    return col


def _group_min_string(
    table: pa.Table, sel: Callable[[npt.NDArray[Any]], npt.NDArray[Any]],
    order: npt.NDArray[np.int64], starts: npt.NDArray[np.int64], n: int,
) -> pa.Array:
    """Per group, the smallest non-null ``user`` (null if none), like Arrow's ``min``."""
    if "user" not in table.column_names or n == 0:
        return pa.nulls(n, pa.string())
    enc = pc.dictionary_encode(_one_chunk(table.column("user")).cast(pa.string()))
    dictionary = enc.dictionary
    if len(dictionary) == 0:
        return pa.nulls(n, pa.string())
    sort_idx = np.asarray(pc.sort_indices(dictionary).to_numpy(), dtype=np.int64)
    rank_of = np.empty(len(sort_idx), dtype=np.int64)
    rank_of[sort_idx] = np.arange(len(sort_idx))
    codes = enc.indices
    idx = np.asarray(codes.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
    none = np.int64(len(sort_idx))
    rank = np.where(np.asarray(codes.is_valid().to_numpy(zero_copy_only=False), dtype=bool),
                    rank_of[idx], none)
    best = np.minimum.reduceat(sel(rank)[order], starts)
    valid = best < none
    taken = dictionary.take(pa.array(sort_idx[np.where(valid, best, 0)]))
    return taken if valid.all() else pc.if_else(pa.array(valid), taken, pa.scalar(None, pa.string()))


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
    out: pd.DataFrame = jobs.reset_index()
    return out
