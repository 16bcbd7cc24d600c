"""Evaluate the no-GPM model: grouped cross-validation on real H200 jobs, GPM columns removed.

Labels come from the GPM rule (the truth); the model's inputs are built from the telemetry with
every GPM column dropped (checked below). Folds are grouped by job -- no job has windows on both
sides -- and stratified by job label; the CV is repeated with several fold assignments and the
mean and worst are reported. Targets: >= 95% job-level accuracy, ECE <= 0.05.

    python bench/eval_classifier.py                         # bundled real H200 data
    python bench/eval_classifier.py --telemetry A.parquet B.parquet DATA_ROOT --truth jobs.csv
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--telemetry", type=Path, nargs="*", default=None, help="v1 Parquet files / data roots")
    ap.add_argument("--truth", type=Path, default=None, help="jobs CSV with job_id,truth (checks the rule)")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=5, help="fold assignments (seeds) to average over")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    from wattclass.classifier import features as F
    from wattclass.classifier.model import cross_validate
    from wattclass.classifier.reader import iter_tables, telemetry_files
    from wattclass.classifier.training import bundled_training_sources, training_set
    from wattclass.schema import GPM_COLUMNS, conform

    sources = a.telemetry or bundled_training_sources()
    # The model's inputs never read GPM: features from GPM-less copies equal the originals.
    for f in telemetry_files(sources)[:20]:
        for _, t in iter_tables([f]):
            nogpm = conform(t.drop_columns([c for c in GPM_COLUMNS if c in t.column_names]))
            same = np.array_equal(F.feature_matrix(F.window_features(t)),
                                  F.feature_matrix(F.window_features(nogpm)), equal_nan=True)
            assert same, f"{f}: features depend on GPM columns"
    ts = training_set(sources)
    keys, _ = ts.job_truth()
    runs = [cross_validate(ts, a.folds, seed) for seed in range(a.repeats)]
    acc = np.array([r["accuracy"] for r in runs])
    ece = np.array([r["ece"] for r in runs])
    ece_raw = np.array([r["ece_raw"] for r in runs])
    confusion = np.sum([np.array(r["confusion"]) for r in runs], axis=0)
    wrong: dict[str, int] = {}
    for r in runs:
        for k, t, p in zip(r["jobs"]["key"], r["jobs"]["truth"], r["jobs"]["pred"], strict=True):
            if t != p:
                wrong[f"{k} ({t} -> {p})"] = wrong.get(f"{k} ({t} -> {p})", 0) + 1
    out = {
        "sources": [str(s) for s in sources], "jobs": len(keys), "windows": len(ts),
        "folds": runs[0]["n_folds"], "repeats": a.repeats,
        "accuracy_mean": float(acc.mean()), "accuracy_min": float(acc.min()),
        "ece_mean": float(ece.mean()), "ece_max": float(ece.max()),
        "ece_uncalibrated_mean": float(ece_raw.mean()),
        "window_accuracy_mean": float(np.mean([r["window_accuracy"] for r in runs])),
        "confusion_summed": confusion.tolist(), "labels": runs[0]["labels"], "misclassified": wrong,
    }
    if a.truth is not None:
        truth = pd.read_csv(a.truth, dtype={"job_id": str}).set_index("job_id")["truth"]
        r0 = runs[0]["jobs"]
        rule = pd.Series(r0["truth"], index=[k.split(":", 1)[1] for k in r0["key"]])
        common = rule.index.intersection(truth.index)
        out["rule_vs_truth_csv"] = f"{int((rule[common] == truth[common]).sum())}/{len(common)}"
    if a.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"data: {out['jobs']} real jobs, {out['windows']} windows from {', '.join(out['sources'])}")
    print("model inputs: basic NVML columns only (GPM columns removed; checked); labels: GPM rule")
    print(f"grouped {out['folds']}-fold CV by job, {a.repeats} fold assignments:")
    print(f"  job-level accuracy  mean {acc.mean():.3f}  worst {acc.min():.3f}  (target >= 0.95: "
          f"{'met' if acc.mean() >= 0.95 else 'NOT met'})")
    print(f"  ECE (calibrated, cross-fitted)  mean {ece.mean():.3f}  worst {ece.max():.3f}  (target <= 0.05: "
          f"{'met' if ece.mean() <= 0.05 else 'NOT met'}); uncalibrated {ece_raw.mean():.3f}")
    print(f"  window-level accuracy  mean {out['window_accuracy_mean']:.3f}")
    labels = out["labels"]
    print("  confusion (rows = rule truth, columns = model), summed over repeats:")
    print("    " + " " * 8 + "".join(f"{lab:>9}" for lab in labels))
    for lab, row in zip(labels, confusion, strict=True):
        print(f"    {lab:<8}" + "".join(f"{v:>9}" for v in row))
    if wrong:
        print("  misclassified (times over repeats): " + "; ".join(f"{k} x{v}" for k, v in wrong.items()))
    if "rule_vs_truth_csv" in out:
        print(f"  GPM rule agrees with --truth CSV on {out['rule_vs_truth_csv']} jobs")
    if out["jobs"] < 60:
        print(f"  caveat: {out['jobs']} jobs is a small sample; one job is "
              f"{100 / out['jobs']:.1f} points of accuracy")
    return 0


if __name__ == "__main__":
    sys.exit(main())
