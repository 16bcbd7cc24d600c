"""Does the HBM's own power tell memory- from compute-bound jobs of unseen kinds of work? (issue 13 r13)

Why: round 8 bounded every non-GPM field the recordings held (84 job statistics, bench/nvml_signals.py):
leave one family out, no classifier reached 0.95. The HBM's average power (NVML POWER_AVERAGE at
scope MEMORY) was never recorded; it measures the mechanism itself (DRAM traffic costs DRAM power).
This script is the analysis registered before any such run existed
(docs/measurements/issue13-preregistration-round13-2026-12-01.md); nothing in it may change after
the data is seen, except to fix a crash (which the result then says).

Method, as registered:
- Jobs: every run of the recordings (default ``wattclass/data/h200/mempower``), GPM truth by the
  job rule over the replayed windows (as bench/eval_ceiling.py and training get it); compute (1)
  and memory (0) jobs only, idle and mixed counted and left out.
- Features per job from its 1 Hz samples, selected by the replay convention of nvml_signals
  (``part_runs``/``job_selection``): set A = round 8's 84 statistics as they are; the six HBM
  features (``HBM_FEATURES``): ``hbm_power_share`` = mean HBM power / mean board power (over the
  polls with both), ``hbm_power_frac`` = mean HBM power / enforced power limit, the 10 % and 90 %
  quantiles of the per-poll share, ``hbm_temp_minus_gpu_c`` = mean (HBM - GPU temperature) and
  ``hbm_temp_slope_c_per_s`` (least squares over the job). B = A + the six; P = the four power
  features alone; T = the threshold rule: memory-bound when ``hbm_power_share`` is above a cut
  fitted on the other families (the cut that maximises their accuracy).
- Folds: one per family (runs.csv ``family``), every run of a family on the test side at once.
  LightGBM with round 8's fixed parameters (ceiling_signals.LGBM_PARAMS), seeds 0, 1, 2.
- A job whose GPU did not answer the HBM power in any of its polls cannot have B, P or T: it is
  counted, named, and refused from them; A is then scored on the same jobs as B (and once more on
  all jobs, beside it), so the comparison the decision reads is on one set of jobs.
- Decision: carry the HBM power into the product if B's mean accuracy is at least ``MIN_GAIN``
  above A's and B calls no more compute-bound jobs memory-bound than A (seed 0).

    python bench/eval_mem_power.py [--raw FOLDER [FOLDER ...]]        # prints one JSON document
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from benchstamp import emit
from ceiling_signals import LGBM_PARAMS, SEEDS, check_family_disjoint, lgbm_loso
from eval_ceiling import aligned_signals
from nvml_signals import FEATURE_NAMES, _limit, _read_caps, job_selection, part_runs, signal_fingerprints

F64 = npt.NDArray[np.float64]

REGISTRATION = "docs/measurements/issue13-preregistration-round13-2026-12-01.md"
#: The recording folder the registration names (under wattclass/data/h200).
DEFAULT_FOLDER = "mempower"
#: The new collector columns (int64, null where the GPU did not answer): HBM 1 s average power
#: in mW and HBM temperature in degrees C.
HBM_POWER_COLUMN = "power_mem_avg_mw"
HBM_TEMP_COLUMN = "mem_temp_c"
#: Sample columns the HBM features read.
HBM_SAMPLE_COLUMNS: tuple[str, ...] = ("ts", "power_mw", "temp_c", HBM_POWER_COLUMN, HBM_TEMP_COLUMN)
HBM_POWER_FEATURES: tuple[str, ...] = ("hbm_power_share", "hbm_power_frac", "hbm_power_share_q10",
                                       "hbm_power_share_q90")
HBM_FEATURES: tuple[str, ...] = (*HBM_POWER_FEATURES, "hbm_temp_minus_gpu_c", "hbm_temp_slope_c_per_s")
#: The registered gain of B over A (mean accuracy over SEEDS) that carries the field into the product.
MIN_GAIN = 0.05
#: lgbm_loso's error counts, reported at seed 0.
ERROR_KEYS: tuple[str, ...] = ("compute_called_memory", "compute_jobs", "memory_called_compute",
                               "memory_jobs")


def job_hbm_features(s: dict[str, F64], limit_mw: float) -> F64:
    """HBM_FEATURES of one job from its samples (``s``: HBM_SAMPLE_COLUMNS, time order, NaN = null).
    A poll without HBM or board power does not enter the power features; a job with no poll that
    has both gets NaN there (the caller refuses it)."""
    nan = float("nan")
    hbm, board, ts = s[HBM_POWER_COLUMN], s["power_mw"], s["ts"]
    both = np.isfinite(hbm) & np.isfinite(board) & (board > 0)
    if both.any():
        share_poll = hbm[both] / board[both]
        q10, q90 = (float(v) for v in np.quantile(share_poll, [0.1, 0.9]))
        power = [float(hbm[both].mean() / board[both].mean()), float(hbm[np.isfinite(hbm)].mean() / limit_mw),
                 q10, q90]
    else:
        power = [nan] * len(HBM_POWER_FEATURES)
    mem_t, gpu_t = s[HBM_TEMP_COLUMN], s["temp_c"]
    tt = np.isfinite(mem_t) & np.isfinite(gpu_t)
    diff = float((mem_t[tt] - gpu_t[tt]).mean()) if tt.any() else nan
    ok = np.isfinite(mem_t) & np.isfinite(ts)
    slope = float(np.polyfit(ts[ok] - ts[ok][0], mem_t[ok], 1)[0]) \
        if ok.sum() >= 3 and np.ptp(ts[ok]) > 0 else nan
    return np.asarray([*power, diff, slope], dtype=np.float64)


def hbm_features(sources: Sequence[Path]) -> tuple[list[str], F64]:
    """(job keys, HBM_FEATURES per job) of every run in ``sources``: the jobs, keys and samples of
    nvml_signals.signal_fingerprints. A folder recorded without the new columns is an error naming
    the samples file and the column (nvml_signals.part_runs)."""
    keys: list[str] = []
    rows: list[F64] = []
    for pr in part_runs(sources, HBM_SAMPLE_COLUMNS):
        limit = _limit(_read_caps(pr.caps_path), pr.caps_path, "enforced_limit_mw", "limit_mw")
        for key, start, end in pr.runs:
            sel = job_selection(pr.samples["ts"], start, end)
            keys.append(key)
            rows.append(job_hbm_features({c: v[sel] for c, v in pr.samples.items()}, limit))
    return keys, np.vstack(rows) if rows else np.zeros((0, len(HBM_FEATURES)))


def fit_cut(share: F64, y: npt.NDArray[np.int64]) -> float:
    """The cut on ``share`` (memory-bound above it) that maximises accuracy on these jobs (``y``:
    1 compute, 0 memory). Candidates: below all, between each two neighbouring values, above all;
    among equally good cuts the middle one, so a gap between the classes is cut in its middle."""
    v = np.unique(share)
    cuts = np.concatenate([[v[0] - 1.0], (v[:-1] + v[1:]) / 2.0, [v[-1] + 1.0]])
    acc = np.array([((share > c) == (y == 0)).mean() for c in cuts])
    best = np.flatnonzero(acc == acc.max())
    return float(cuts[best[len(best) // 2]])


def threshold_lofo(share: F64, y: npt.NDArray[np.int64], family: npt.NDArray[np.object_]) -> dict[str, Any]:
    """Set T: per held-out family, the cut fitted on all other families (``fit_cut``) applied to it;
    pooled accuracy, both error kinds and per-family results (worst first, as lgbm_loso)."""
    check_family_disjoint(family, family)
    pred = np.full(len(y), -1, dtype=np.int64)
    cuts: dict[str, float] = {}
    for f in sorted(set(family.tolist())):
        te = family == f
        if (~te).sum() == 0:
            raise ValueError(f"family {f!r} is the only family: nothing to fit a cut on")
        cut = fit_cut(share[~te], y[~te])
        cuts[str(f)] = round(cut, 4)
        pred[te] = np.where(share[te] > cut, 0, 1)
    ok = pred == y
    fams = {str(f): {"jobs": int((family == f).sum()), "right": int(ok[family == f].sum()),
                     "cut": cuts[str(f)]} for f in cuts}
    return {
        "feature": "hbm_power_share", "jobs": len(y), "accuracy": round(float(ok.mean()), 4),
        "compute_called_memory": int(((y == 1) & (pred == 0)).sum()), "compute_jobs": int((y == 1).sum()),
        "memory_called_compute": int(((y == 0) & (pred == 1)).sum()), "memory_jobs": int((y == 0).sum()),
        "cut_on_all_jobs": round(fit_cut(share, y), 4),
        "per_family": dict(sorted(fams.items(), key=lambda kv: kv[1]["right"] - kv[1]["jobs"]))}


def lgbm_set(X: F64, y: npt.NDArray[np.int64], family: npt.NDArray[np.object_],
             names: Sequence[str]) -> dict[str, Any]:
    """One feature set, leave one family out (fold = family), at every seed of SEEDS: accuracy mean
    [min, max]; the error kinds and per-family results of seed 0 (the registered figures)."""
    runs = [lgbm_loso(X, y, family, family, names, seed=s) for s in SEEDS]
    acc = [float(r["accuracy"]) for r in runs]
    r0 = runs[0]
    return {
        "features": len(names), "jobs": len(y),
        "accuracy_mean": round(float(np.mean(acc)), 4), "accuracy_min": min(acc), "accuracy_max": max(acc),
        "accuracy_by_seed": dict(zip([str(s) for s in SEEDS], acc, strict=True)),
        **{k: r0[k] for k in ERROR_KEYS},
        "compute_called_memory_by_seed": [int(r["compute_called_memory"]) for r in runs],
        "per_family_seed0": r0["per_family"]}


def job_truth(sources: Sequence[Path]) -> tuple[npt.NDArray[np.object_], npt.NDArray[np.int8],
                                               dict[str, str]]:
    """(job keys, GPM truth codes, job key -> family): the jobs replayed through the daemon with the
    job rule over all their windows, as bench/eval_ceiling.py and training get them."""
    from wattclass.classifier.training import job_families, training_set

    keys, truth = training_set(sources, max_windows_per_job=0).job_truth()
    return keys, truth, job_families(sources)


def hbm_field_report(keys: Sequence[str], hbm: F64) -> dict[str, Any]:
    """Which compute/memory jobs lack the HBM fields: no HBM power (refused from B, P and T) or no
    HBM temperature (kept; its two features are missing values to LightGBM)."""
    no_power = ~np.isfinite(hbm[:, HBM_FEATURES.index("hbm_power_share")])
    no_temp = ~np.isfinite(hbm[:, HBM_FEATURES.index("hbm_temp_minus_gpu_c")])
    return {"jobs_lacking_hbm_power_refused_from_B_P_T": int(no_power.sum()),
            "jobs_lacking_hbm_power": [str(k) for k, m in zip(keys, no_power, strict=True) if m],
            "jobs_lacking_hbm_temperature_kept": int(no_temp.sum()),
            "jobs_lacking_hbm_temperature": [str(k) for k, m in zip(keys, no_temp, strict=True) if m]}


def evaluate(sources: Sequence[Path]) -> dict[str, Any]:
    """The registered analysis of round 13 over the raw recording folders ``sources``."""
    from wattclass.classifier import rules

    hkeys, hfp = hbm_features(sources)  # first: a folder without the new columns fails before the replay
    keys, truth, families = job_truth(sources)
    fp_a = aligned_signals(keys, *signal_fingerprints(sources))
    fp_h = aligned_signals(keys, hkeys, hfp)
    cm = (truth == rules.J_COMPUTE) | (truth == rules.J_MEMORY)
    y_all = (truth[cm] == rules.J_COMPUTE).astype(np.int64)
    fam_all = np.array([families.get(str(k), "?") for k in keys[cm]], dtype=object)
    a_all, h_all = fp_a[cm], fp_h[cm]
    field = hbm_field_report([str(k) for k in keys[cm]], h_all)
    has = np.isfinite(h_all[:, HBM_FEATURES.index("hbm_power_share")])
    y, fam = y_all[has], fam_all[has]
    if len(set(fam.tolist())) < 2:
        raise SystemExit(f"{int(has.sum())} compute/memory jobs with the HBM power in "
                         f"{len(set(fam.tolist()))} families: need two families to hold one out")
    a, h = a_all[has], h_all[has]
    power_cols = [HBM_FEATURES.index(c) for c in HBM_POWER_FEATURES]
    sets: dict[str, Any] = {
        "A": lgbm_set(a, y, fam, FEATURE_NAMES),
        "B": lgbm_set(np.hstack([a, h]), y, fam, [*FEATURE_NAMES, *HBM_FEATURES]),
        "P": lgbm_set(h[:, power_cols], y, fam, HBM_POWER_FEATURES),
        "T": threshold_lofo(h[:, HBM_FEATURES.index("hbm_power_share")], y, fam),
    }
    out: dict[str, Any] = {
        "registration": REGISTRATION,
        "sources": [str(s) for s in sources],
        "jobs_recorded": len(hkeys),
        "jobs_with_truth": len(keys),  # a run with no replayed window has no GPM truth
        "truth_counts": {lab: int((truth == i).sum()) for i, lab in enumerate(rules.JOB_LABELS)},
        "left_out": {"idle": int((truth == rules.J_IDLE).sum()),
                     "mixed": int((truth == rules.J_MIXED).sum())},
        "compute_memory_jobs": int(cm.sum()),
        "hbm_field": field,
        "jobs_evaluated": len(y),
        "families_evaluated": len(set(fam.tolist())),
        "seeds": list(SEEDS),
        "lgbm_params": LGBM_PARAMS,
        "sets": sets,
    }
    if not has.all():
        out["A_on_all_compute_memory_jobs"] = lgbm_set(a_all, y_all, fam_all, FEATURE_NAMES)
    out["decision"] = decision(sets["A"], sets["B"])
    return out


def decision(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """The registered rule: B's mean accuracy at least MIN_GAIN above A's, and B (seed 0) calls no
    more compute-bound jobs memory-bound than A."""
    gain = round(b["accuracy_mean"] - a["accuracy_mean"], 4)
    return {"B_minus_A_mean_accuracy": gain, "min_gain": MIN_GAIN,
            "compute_called_memory_A": a["compute_called_memory"],
            "compute_called_memory_B": b["compute_called_memory"],
            "carry_into_product": bool(gain >= MIN_GAIN
                                       and b["compute_called_memory"] <= a["compute_called_memory"])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--raw", type=Path, nargs="+", default=None, metavar="FOLDER",
                    help="raw probe recordings with the HBM columns "
                         f"(default: wattclass/data/h200/{DEFAULT_FOLDER})")
    a = ap.parse_args()
    from wattclass.classifier.training import h200_data_dir

    sources = a.raw or [h200_data_dir() / DEFAULT_FOLDER]
    for s in sources:
        if not any(Path(s).glob("*_runs.csv")):
            raise SystemExit(f"--raw {s}: not a probe recording with runs (no <part>_runs.csv)")
    try:
        out = evaluate(sources)
    except ValueError as exc:
        raise SystemExit(f"eval_mem_power: {exc}") from exc
    return emit(out)


if __name__ == "__main__":
    raise SystemExit(main())
