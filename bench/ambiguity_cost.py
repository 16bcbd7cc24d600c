"""Benchmark: what the ambiguity check (issue 13 round 6) costs the labels, worst case.

The check needs each model-labelled job's fingerprint: the engine sums 15 inputs and their
window weights per (job, host) beside the model's window counts, and the labels compare each
job with the model's reference jobs. Only windows the model labels pay (GPUs without GPM, or
``--source model``); this measures that worst case: every window of the day through the model.

Same files, same shipped model, once as it is and once with its check removed
(``WindowModel.set_ambiguity(None)``), alternating ``--rounds`` times in one process, one DuckDB
thread; CPU seconds of the process (``time.process_time``), median per variant, and the jobs
whose confidence the check lowered.

    python bench/ambiguity_cost.py --data-root /work/bench-data/fleet-1k-30d --date 2026-11-29 [--hosts 16]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

from benchstamp import emit


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-root", type=Path, required=True)
    ap.add_argument("--date", required=True)
    ap.add_argument("--hosts", type=int, default=16, help="the first N hosts' files (0: all)")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    from wattclass.classifier.engine import label_files_local
    from wattclass.classifier.model import default_model_dir, load_model
    from wattclass.classifier.reader import telemetry_files

    files = telemetry_files([a.data_root], date=a.date)
    if a.hosts:
        hosts = sorted({f.parent.name for f in files})[: a.hosts]
        files = [f for f in files if f.parent.name in hosts]
    if not files:
        print(f"no telemetry files for {a.date} under {a.data_root}", file=sys.stderr)
        return 1
    shipped = load_model(default_model_dir())
    if shipped.ambiguity is None:
        print("the shipped model has no ambiguity check: nothing to compare", file=sys.stderr)
        return 1
    plain = copy.deepcopy(shipped)
    plain.set_ambiguity(None)
    cpu: dict[str, list[float]] = {"with_check": [], "without_check": []}
    labels = {}
    for _ in range(a.rounds):
        for name, model in (("with_check", shipped), ("without_check", plain)):
            t0 = time.process_time()
            res = label_files_local(files, model, "model", workers=1)
            cpu[name].append(time.process_time() - t0)
            labels[name] = res.labels.set_index("job_id")
    w, p = labels["with_check"], labels["without_check"]
    lowered = int((w["confidence"] < p.loc[w.index, "confidence"] - 1e-9).sum())
    med = {k: statistics.median(v) for k, v in cpu.items()}
    return emit({
        "benchmark": "ambiguity check cost, every window through the model (--source model), 1 DuckDB thread",
        "data_root": str(a.data_root), "date": a.date, "files": len(files),
        "windows": int(w["n_windows"].sum()),
        "jobs": len(w), "model": shipped.version, "rounds": a.rounds,
        "cpu_s": {k: [round(x, 3) for x in v] for k, v in cpu.items()},
        "cpu_s_median": {k: round(v, 3) for k, v in med.items()},
        "check_cost_ratio": round(med["with_check"] / med["without_check"], 3),
        "jobs_lowered": lowered,
        "labels_equal": bool((w["label"] == p.loc[w.index, "label"]).all()),
    })


if __name__ == "__main__":
    raise SystemExit(main())
