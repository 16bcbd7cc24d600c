"""Do longer jobs separate the twins? (issue 13 round 9)

Why: rounds 6-9 found compute-bound and memory-bound jobs whose NVML fingerprints sit closer together
than two runs of one job ("twins", bench/eval_ceiling.py), and round 8 left one question open: the
recorded jobs last 8-12 s, so every statistic rests on 8-12 one-second samples, and longer jobs
might pull twins apart that only the noise of short runs joins. ``bench/device_long_twins.sh``
re-ran four twin pairs of the recordings for 40 s each, every run on both GPUs at once
(wattclass/data/h200/long-twins). This script compares, in the fingerprint spaces of
bench/eval_ceiling.py (model inputs, and every non-GPM NVML statistic), fixed before the runs:

- the re-run distance of a 40 s run (GPU 0 against GPU 1, same workload and parameters) against the
  re-run distances of the short recordings (every pair of jobs with one configuration);
- each pair's twin distance at 40 s (compute run against memory run, the four GPU combinations)
  against the same pair's distance in the short recordings;
- whether the GPM truth of a workload is the same at 40 s as in its short run.

A pair *separates* with length when its 40 s twin distance exceeds the 40 s re-run distances of
both its workloads; it stays a twin when it does not. Nothing is fitted; the scaling (each input as
its quantile over all jobs) is eval_ceiling's.

    python bench/eval_long_twins.py [--json]
"""

from __future__ import annotations

import argparse
import sys
from itertools import combinations
from pathlib import Path
from typing import Any

import numpy as np
from benchstamp import emit

#: The four pairs re-run (compute job, memory job), by run name: the closest disjoint twin pairs of
#: round 9's ceiling run that the sweep plans can replay (docs/measurements/
#: cpu2-eval-ceiling-issue13-round9-2026-11-30.json, "examples").
PAIRS: tuple[tuple[str, str], ...] = (
    ("transpose_permute_s42_002", "transcendental_s42_009"),
    ("rng_fill_s42_035", "grid_sample_s53_030"),
    ("complex_gemm_s54_017", "norm_softmax_s54_018"),
    ("pooling_s55_029", "conv_transpose_s43_002"),
)
SHORT_FOLDERS = ("raw", "collected", "sweep", "sweep-heldout", "ridge", "ridge2", "fresh", "fresh3",
                 "fresh4", "latency", "fresh5", "fresh6")
LONG_FOLDER = "long-twins"


def run_names(sources: list[Path]) -> dict[str, str]:
    """Job key -> run name (runs.csv ``job``), as training.job_families keys jobs."""
    from wattclass.classifier.training import _runs_rows

    return {key: row["job"] for key, row in _runs_rows(sources)}


def pair_report(d: np.ndarray, keys: list[str], names: dict[str, str], truth: np.ndarray,
                short_rep: np.ndarray) -> dict[str, Any]:
    """Distances of one fingerprint space (``d``: all jobs x all jobs)."""
    from wattclass.classifier import rules

    idx = {k: i for i, k in enumerate(keys)}
    long_of: dict[str, list[int]] = {}
    short_of: dict[str, list[int]] = {}
    for k in keys:
        name = names.get(k)
        if name is None:
            continue
        (long_of if k.startswith(LONG_FOLDER + ":") else short_of).setdefault(name, []).append(idx[k])
    rep_long = {n: float(d[a, b]) for n, ix in long_of.items() for a, b in combinations(ix, 2)}
    lab = rules.JOB_LABELS
    pairs = []
    for c, m in PAIRS:
        lc, lm, sc, sm = long_of.get(c, []), long_of.get(m, []), short_of.get(c, []), short_of.get(m, [])
        if not (lc and lm and sc and sm):
            raise SystemExit(f"pair {c} ~ {m}: missing runs "
                             f"(long {len(lc)}/{len(lm)}, short {len(sc)}/{len(sm)})")
        twin_long = [float(d[a, b]) for a in lc for b in lm]
        floor = max(rep_long.get(c, np.nan), rep_long.get(m, np.nan))
        pairs.append({
            "compute": c, "memory": m,
            "truth_short": [lab[truth[i]] for i in sc] + [lab[truth[i]] for i in sm],
            "truth_long": [lab[truth[i]] for i in lc] + [lab[truth[i]] for i in lm],
            "twin_distance_short": round(float(min(d[a, b] for a in sc for b in sm)), 3),
            "twin_distance_long_min": round(min(twin_long), 3),
            "twin_distance_long_mean": round(float(np.mean(twin_long)), 3),
            "rerun_distance_long": {n: round(rep_long.get(n, np.nan), 3) for n in (c, m)},
            "separates": bool(min(twin_long) > floor),
            "long_twin_over_long_rerun": round(min(twin_long) / floor, 2) if floor > 0 else None,
        })
    rl = np.array(list(rep_long.values()))
    return {
        "short_rerun_pairs": len(short_rep),
        "short_rerun_quantiles": {str(q): round(float(np.quantile(short_rep, q)), 3)
                                  for q in (0.1, 0.25, 0.5)},
        "long_rerun_distances": {n: round(v, 3) for n, v in rep_long.items()},
        "long_rerun_median": round(float(np.median(rl)), 3),
        "pairs_separating": sum(p["separates"] for p in pairs),
        "pairs": pairs,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from eval_ceiling import aligned_signals, scaled
    from nvml_signals import signal_fingerprints

    from wattclass.classifier.ambiguity import distances, training_fingerprints
    from wattclass.classifier.training import h200_data_dir, training_set, workload_configs

    sources = [h200_data_dir() / n for n in (*SHORT_FOLDERS, LONG_FOLDER)]
    ts = training_set(sources, max_windows_per_job=0)
    keys_arr, truth, fp_model = training_fingerprints(ts)
    keys = [str(k) for k in keys_arr]
    names = run_names(sources)
    configs = workload_configs(sources)
    spaces = {"model_inputs": fp_model, "nvml_all": aligned_signals(keys_arr, *signal_fingerprints(sources))}
    out: dict[str, Any] = {"sources": [str(s) for s in sources], "jobs": len(keys), "pairs": len(PAIRS)}
    for space, fp in spaces.items():
        z = scaled(fp)
        d = distances(z, z)
        by_cfg: dict[str, list[int]] = {}
        for i, k in enumerate(keys):
            if not k.startswith(LONG_FOLDER + ":") and configs.get(k):
                by_cfg.setdefault(configs[k], []).append(i)
        short_rep = np.array([d[a, b] for ix in by_cfg.values() for a, b in combinations(ix, 2)])
        out[space] = pair_report(d, keys, names, truth, short_rep)
    if a.json:
        emit(out)
    else:
        for space in spaces:
            r = out[space]
            print(f"{space}: short re-runs {r['short_rerun_pairs']} pairs, "
                  f"quantiles {r['short_rerun_quantiles']}; 40 s re-runs median {r['long_rerun_median']}; "
                  f"pairs separating {r['pairs_separating']}/{len(PAIRS)}")
            for p in r["pairs"]:
                print(f"  {p['compute']} ~ {p['memory']}: truth short {p['truth_short']} "
                      f"long {p['truth_long']}; "
                      f"twin short {p['twin_distance_short']} long min {p['twin_distance_long_min']} "
                      f"mean {p['twin_distance_long_mean']}; 40 s re-runs {p['rerun_distance_long']}; "
                      f"separates {p['separates']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
