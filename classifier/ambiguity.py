"""The ambiguity check: an 'unsure' where training jobs of both labels sit next to a job (issue 13 round 6).

Why: without GPM, the model's errors on never-seen kinds of work sit where compute-bound and
memory-bound jobs give NVML readings as close as two runs of one workload (bench/eval_ceiling.py:
"twins"). No input here tells such jobs apart, so the model cannot be right there; it can know it is
there. The check compares a job's NVML *fingerprint* with those of the model's own training jobs:
where its neighbourhood holds both compute-bound and memory-bound jobs, the job's confidence is
lowered to the share of its neighbours that carry the label the model gave (never raised, the label
never changed), so the policy, which does nothing below ``min_confidence``, leaves it alone.

Fingerprint: per job, the length-weighted mean of each model input (classifier/features.py
FEATURES), each mapped to its quantile among the training jobs (``grids``: a fixed set of each
input's quantiles), so every input counts alike whatever its unit or tail. Distance: Euclidean
between fingerprints. Neighbourhood (``mode``): ``radius``, the training jobs closer than
``radius`` (fitted as a quantile of the distances between training jobs that ran the same workload
with the same parameters: how far two runs of one job land apart), or ``knn``, the ``k`` nearest
compute- or memory-bound training jobs. Everything is known at prediction time; nothing about the
job's truth is used.

model.json ``ambiguity`` holds the parameters, the grids and the reference (training jobs'
fingerprints in quantile space, with their labels), all rounded (``DIGITS``) so a rebuild from the
same recordings writes the same bytes whatever the BLAS.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from wattclass.classifier import rules
from wattclass.classifier.features import FEATURES
from wattclass.errors import DataError

F64 = npt.NDArray[np.float64]

#: model.json ``ambiguity.format``: the newest this wattclass reads.
AMBIGUITY_FORMAT = 1
MODES = ("radius", "knn")
#: How a neighbourhood's purity lowers the confidence: ``cap`` min(confidence, purity); ``scale``
#: confidence x purity.
LOWERINGS = ("cap", "scale")
#: What ``wattclass model train`` adds unless told otherwise (``--ambiguity none``): round 6's
#: candidate, which passed its registered shipping rule on the fresh5 test set (by one acted wrong
#: call fewer, ECE 0.209 -> 0.206; docs/measurements/issue13-preregistration-round6-2026-11-30.md).
DEFAULT_SPEC = "radius:0.15:cap"
#: Decimals of every number stored (fingerprints and grids in quantile or input units).
DIGITS = 4
#: Points of each input's quantile grid (the 0, 1/(n-1), ..., 1 quantiles of the training jobs).
GRID_POINTS = 101
#: Jobs whose distances to the reference are computed at once (``purity``).
PURITY_BLOCK_JOBS = 512
#: Weight of a window of unknown length in the fingerprint (the daemon's default period, s).
UNKNOWN_WINDOW_S = 10.0
#: The labelling engine's per-(job, host) sums that make a job's fingerprint (``window_sums``):
#: each input times its window's weight, and the weight, where the input is present. Sums merge
#: over any split of the files.
FP_SUM_COLUMNS: tuple[str, ...] = tuple(f"fp_{f}_wx" for f in FEATURES)
FP_WEIGHT_COLUMNS: tuple[str, ...] = tuple(f"fp_{f}_w" for f in FEATURES)


def fingerprint_weights(dur_s: npt.ArrayLike | None, n: int) -> F64:
    """A window's weight in its job's fingerprint: its length in seconds (unknown: UNKNOWN_WINDOW_S)."""
    if dur_s is None:
        return np.full(n, UNKNOWN_WINDOW_S)
    d = np.asarray(dur_s, dtype=np.float64)
    return np.asarray(np.where(np.isfinite(d), np.clip(d, 0.0, None), UNKNOWN_WINDOW_S) + 1e-6,
                      dtype=np.float64)


def window_sums(X: npt.ArrayLike, dur_s: npt.ArrayLike | None) -> tuple[F64, F64]:
    """Per window and input: (value x weight, weight), zero where the input is missing. Summed over a
    job's windows (in any split: the engine's partial aggregates) they give its fingerprint."""
    x = np.asarray(X, dtype=np.float64)
    w = fingerprint_weights(dur_s, len(x))[:, None]
    ok = np.isfinite(x)
    return np.where(ok, x * w, 0.0), np.where(ok, w, 0.0)


def fingerprint_from_sums(num: npt.ArrayLike, den: npt.ArrayLike) -> F64:
    """Fingerprint (NaN where a job has no value of an input) from summed ``window_sums``."""
    n, d = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(np.where(d > 0, n / np.where(d > 0, d, 1.0), np.nan), dtype=np.float64)


def job_fingerprints(X: npt.ArrayLike, group: npt.NDArray[np.object_], dur_s: npt.ArrayLike | None,
                     ) -> tuple[npt.NDArray[np.object_], F64]:
    """(job keys in ``np.unique`` order, their fingerprints: length-weighted mean of each input)."""
    keys, inv = np.unique(group, return_inverse=True)
    num, den = window_sums(X, dur_s)
    sn = np.zeros((len(keys), num.shape[1]))
    sd = np.zeros((len(keys), num.shape[1]))
    np.add.at(sn, inv, num)
    np.add.at(sd, inv, den)
    return keys, fingerprint_from_sums(sn, sd)


def training_fingerprints(ts: Any) -> tuple[npt.NDArray[np.object_], npt.NDArray[np.int8], F64]:
    """(job keys, GPM truth codes, fingerprints) of a ``TrainingSet``'s jobs, in one order: what the
    check is fitted on (``model train``) and what the evaluations compare (bench/eval_*.py)."""
    keys, truth = ts.job_truth()
    fkeys, fp = job_fingerprints(ts.X, ts.group, ts.dur)
    if len(fkeys) != len(keys) or not (fkeys == keys).all():
        raise DataError("ambiguity: the fingerprints' jobs differ from the training jobs (internal error)")
    return keys, truth, fp


def quantile_grids(fp: npt.ArrayLike, points: int = GRID_POINTS) -> list[list[float]]:
    """Per input: its quantiles over the jobs that have it (rounded; empty where none has it)."""
    f = np.asarray(fp, dtype=np.float64)
    q = np.linspace(0.0, 1.0, points)
    out = []
    for j in range(f.shape[1]):
        col = f[np.isfinite(f[:, j]), j]
        out.append([] if len(col) == 0 else [round(float(v), DIGITS) for v in np.quantile(col, q)])
    return out


def to_quantiles(fp: npt.ArrayLike, grids: Sequence[Sequence[float]]) -> F64:
    """Each input as its quantile (0..1) by its grid: linear between grid points, the middle of a run
    of equal grid points (ties share their mean rank), clamped at the ends; missing -> 0.5."""
    f = np.asarray(fp, dtype=np.float64)
    z = np.full(f.shape, 0.5)
    for j, grid in enumerate(grids):
        g = np.asarray(grid, dtype=np.float64)
        ok = np.isfinite(f[:, j])
        if len(g) < 2 or not ok.any():
            continue
        x = f[ok, j]
        t = np.linspace(0.0, 1.0, len(g))
        lo = np.searchsorted(g, x, side="left")
        hi = np.searchsorted(g, x, side="right")
        tie = hi > lo  # x equals grid points lo..hi-1: their mean rank
        mid = (t[np.clip(lo, 0, len(g) - 1)] + t[np.clip(hi - 1, 0, len(g) - 1)]) / 2.0
        i = np.clip(lo, 1, len(g) - 1)
        span = g[i] - g[i - 1]
        with np.errstate(invalid="ignore", divide="ignore"):
            frac = np.clip(np.where(span > 0, (x - g[i - 1]) / np.where(span > 0, span, 1.0), 0.5), 0.0, 1.0)
        lin = t[i - 1] + frac * (t[i] - t[i - 1])
        z[ok, j] = np.where(tie, mid, lin)
    return z


def distances(a: F64, b: F64) -> F64:
    """Euclidean distances between the rows of ``a`` and of ``b`` (no BLAS: the same bits anywhere)."""
    return np.asarray(np.sqrt(((a[:, None, :] - b[None, :, :]) ** 2).sum(axis=2)), dtype=np.float64)


def repeat_distances(z: F64, configs: Sequence[str | None]) -> F64:
    """Distances between jobs of one workload configuration (None: unknown, never paired)."""
    cfg = np.asarray([c if c is not None else f"\0{i}" for i, c in enumerate(configs)], dtype=object)
    out = []
    for c in np.unique(cfg):
        idx = np.flatnonzero(cfg == c)
        if len(idx) > 1:
            d = distances(z[idx], z[idx])
            out.append(d[np.triu_indices(len(idx), 1)])
    return np.concatenate(out) if out else np.zeros(0)


def check_value(mode: str, value: float) -> None:
    """DataError unless ``value`` suits ``mode``: radius's quantile in (0, 1], knn's k a whole
    number >= 1. ``model train --ambiguity`` checks it before the training, not after it."""
    if mode == "radius" and not 0.0 < value <= 1.0:  # NaN too
        raise DataError(f"ambiguity radius quantile must be in (0, 1], got {value:g}")
    if mode == "knn" and not (math.isfinite(value) and value >= 1 and int(value) == value):
        raise DataError(f"ambiguity knn: k must be a positive integer, got {value:g}")


def fit_ambiguity(fp: npt.ArrayLike, truth: npt.ArrayLike, mode: str, value: float, lowering: str = "cap",
                  configs: Sequence[str | None] | None = None) -> dict[str, Any]:
    """The model.json ``ambiguity`` entry from the training jobs' fingerprints and truth codes.

    ``mode`` ``radius``: ``value`` is the quantile of the same-workload repeat distances (needs
    ``configs``, each job's workload and parameters, None where unknown) taken as the radius;
    ``knn``: ``value`` is k. Only compute- and memory-bound jobs are kept as the reference."""
    if mode not in MODES:
        raise DataError(f"ambiguity mode {mode!r}: unknown (known: {', '.join(MODES)})")
    if lowering not in LOWERINGS:
        raise DataError(f"ambiguity lowering {lowering!r}: unknown (known: {', '.join(LOWERINGS)})")
    f = np.asarray(fp, dtype=np.float64)
    t = np.asarray(truth, dtype=np.int64)
    grids = quantile_grids(f)
    z = np.round(to_quantiles(f, grids), DIGITS)
    entry: dict[str, Any] = {"format": AMBIGUITY_FORMAT, "mode": mode, "lowering": lowering,
                             "features": list(FEATURES), "grids": grids}
    check_value(mode, value)
    if mode == "radius":
        if configs is None:
            raise DataError("ambiguity radius: needs the training jobs' workload configurations (runs.csv)")
        rep = repeat_distances(z, configs)
        if len(rep) == 0:
            raise DataError("ambiguity radius: no two training jobs ran the same workload with the same "
                            "parameters, so there is no repeat distance to take the radius from")
        entry["radius_quantile"] = float(value)
        entry["radius"] = round(float(np.quantile(rep, value)), DIGITS)
        entry["repeat_pairs"] = len(rep)
    else:
        entry["k"] = int(value)
    keep = (t == rules.J_COMPUTE) | (t == rules.J_MEMORY)
    entry["reference"] = [[round(float(v), DIGITS) for v in row] for row in z[keep]]
    entry["reference_labels"] = [rules.JOB_LABELS[int(c)] for c in t[keep]]
    return entry


def _need(amb: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in amb:
        raise DataError(f"{where}: ambiguity entry lacks {key!r}")
    v = amb[key]
    if not isinstance(v, kind) or isinstance(v, bool):
        raise DataError(f"{where}: ambiguity {key!r} has the wrong type ({type(v).__name__})")
    return v


def _numbers(x: object) -> bool:
    """A list of finite numbers (JSON ints or floats, not booleans)."""
    return isinstance(x, list) and all(
        isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in x)


def check_ambiguity(amb: object, where: str) -> None:
    """Refuse a model.json ``ambiguity`` entry this wattclass cannot apply, naming the key."""
    if not isinstance(amb, Mapping):
        raise DataError(f"{where}: 'ambiguity' must be an object")
    fmt = _need(amb, "format", int, where)
    if fmt > AMBIGUITY_FORMAT:
        raise DataError(f"{where}: ambiguity format {fmt} is newer than this wattclass reads "
                        f"({AMBIGUITY_FORMAT}); upgrade wattclass")
    mode = _need(amb, "mode", str, where)
    if mode not in MODES:
        raise DataError(f"{where}: ambiguity 'mode' {mode[:40]!r} unknown (known: {', '.join(MODES)})")
    low = _need(amb, "lowering", str, where)
    if low not in LOWERINGS:
        raise DataError(f"{where}: ambiguity 'lowering' {low[:40]!r} unknown (known: {', '.join(LOWERINGS)})")
    if list(_need(amb, "features", list, where)) != list(FEATURES):
        raise DataError(f"{where}: ambiguity 'features' differ from this wattclass's FEATURES")
    grids = _need(amb, "grids", list, where)
    if len(grids) != len(FEATURES) or not all(_numbers(g) for g in grids) or any(
            np.any(np.diff(np.asarray(g, dtype=np.float64)) < 0) for g in grids):
        raise DataError(f"{where}: ambiguity 'grids' must be {len(FEATURES)} non-decreasing lists of numbers")
    if mode == "radius":
        r = _need(amb, "radius", (int, float), where)
        if not 0 < r < math.inf:
            raise DataError(f"{where}: ambiguity 'radius' must be a finite number > 0, got {r}")
    else:
        k = _need(amb, "k", int, where)
        if k < 1:
            raise DataError(f"{where}: ambiguity 'k' must be >= 1, got {k}")
    ref = _need(amb, "reference", list, where)
    labels = _need(amb, "reference_labels", list, where)
    if len(ref) != len(labels) or not ref:
        raise DataError(f"{where}: ambiguity 'reference' and 'reference_labels' must be non-empty and "
                        "of one length")
    if any(not _numbers(r) or len(r) != len(FEATURES) for r in ref):
        raise DataError(f"{where}: ambiguity 'reference' rows must have {len(FEATURES)} numbers")
    bad = sorted({str(x)[:20] for x in labels} - {"compute", "memory"})
    if bad:
        raise DataError(f"{where}: ambiguity 'reference_labels' must be compute or memory, got {bad}")


def purity(amb: Mapping[str, Any], fp: npt.ArrayLike, labels: npt.ArrayLike) -> F64:
    """Per job: the share of its compute/memory neighbours that carry its label, where the
    neighbourhood holds both; NaN where it does not (or the label is neither compute nor memory)."""
    z = to_quantiles(fp, amb["grids"])
    lab = np.asarray(labels, dtype=np.int64)
    ref = np.asarray(amb["reference"], dtype=np.float64)
    is_mem = np.asarray([x == "memory" for x in amb["reference_labels"]], dtype=bool)
    out = np.full(len(z), np.nan)
    if len(z) == 0:
        return out
    n_mem = np.zeros(len(z))
    n_cmp = np.zeros(len(z))
    # in blocks of jobs: the distances of a fleet's night (10,000 jobs x the reference x the
    # inputs) would take hundreds of MB at once
    for lo in range(0, len(z), PURITY_BLOCK_JOBS):
        d = distances(z[lo:lo + PURITY_BLOCK_JOBS], ref)
        if amb["mode"] == "radius":
            near = d <= float(amb["radius"])
        else:
            k = min(int(amb["k"]), ref.shape[0])
            nn = np.argsort(d, axis=1, kind="stable")[:, :k]
            near = np.zeros(d.shape, dtype=bool)
            np.put_along_axis(near, nn, True, axis=1)
        n_mem[lo:lo + len(d)] = (near & is_mem).sum(axis=1)
        n_cmp[lo:lo + len(d)] = (near & ~is_mem).sum(axis=1)
    both = (n_mem > 0) & (n_cmp > 0)
    own = np.where(lab == rules.J_MEMORY, n_mem, n_cmp)
    known = np.isfinite(np.asarray(fp, dtype=np.float64)).any(axis=1)  # a job without a fingerprint
    active = both & known & ((lab == rules.J_MEMORY) | (lab == rules.J_COMPUTE))
    out[active] = own[active] / (n_mem + n_cmp)[active]
    return out


def lower_confidence(amb: Mapping[str, Any] | None, conf: npt.ArrayLike, fp: npt.ArrayLike,
                     labels: npt.ArrayLike) -> F64:
    """Job confidences after the check (``amb`` None: unchanged); never higher than given."""
    c = np.asarray(conf, dtype=np.float64)
    if not amb:
        return c
    p = purity(amb, fp, labels)
    hit = np.isfinite(p)
    low = np.minimum(c, p) if amb["lowering"] == "cap" else c * p
    return np.asarray(np.where(hit, np.minimum(c, low), c), dtype=np.float64)
