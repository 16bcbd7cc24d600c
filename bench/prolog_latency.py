"""Prolog wall time: wattclass's Prolog vs an empty one (target: at most +150 ms).

Two real one-node Slurm 22.05 clusters run side by side (tests/slurm_cluster.py): one whose
Prolog is ``/bin/true``, one with the wattclass Prolog/Epilog wrappers on a filestate backend
(the full path: Python start, GPU map, job files, squeue --json for admin_comment, state
record, cap). Each Prolog is wrapped in a timer script (the same wrapper for both, so its own
cost cancels out). Jobs are memory-labelled 2-GPU jobs, submitted alternately to the two
clusters and waited for one at a time. ``--queue N`` first parks N held jobs in each cluster:
squeue --json returns every job, so its cost grows with the queue.

    python bench/prolog_latency.py [--jobs 40] [--queue 0] [--json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from slurm_cluster import SlurmCluster, WattclassRig

from wattclass.labeltable import TableEntry, write_label_table
from wattclass.policy import parse_policy


def timed(path: Path, inner: str, times: Path) -> Path:
    path.write_text("#!/bin/sh\n"
                    "t0=$(/bin/date +%s%N)\n"
                    f"{inner}\n"
                    "t1=$(/bin/date +%s%N)\n"
                    f'echo "$SLURM_JOB_ID $((t1 - t0))" >> {times}\n'
                    "exit 0\n")
    path.chmod(0o755)
    return path


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=40)
    ap.add_argument("--queue", type=int, default=0, help="held jobs parked in each cluster first")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    # GPU state, job files and cap records on tmpfs, as /run/wattclass is on a real node.
    run_root = Path(tempfile.mkdtemp(prefix="wattclass-bench-run-", dir="/dev/shm"))
    rig = WattclassRig(Path(tempfile.mkdtemp(prefix="wattclass-bench-wc-")), sys.executable, run_root)
    pol = parse_policy({"mode": "enforce", "caps": {"memory": "60%"}})
    write_label_table(rig.table, [TableEntry("user_name", "root", "mem-train", None, "memory", 0.95, 3,
                                             "rule")], pol.table_dict(set()))
    rig.cluster.prolog = timed(rig.root / "hooks" / "timed.sh", str(rig.root / "hooks" / "prolog.sh"),
                               rig.root / "times.txt")
    empty_root = Path(tempfile.mkdtemp(prefix="wattclass-bench-empty-"))
    empty_root.chmod(0o755)
    empty = SlurmCluster(empty_root, prolog=timed(empty_root / "timed.sh", "/bin/true",
                                                  empty_root / "times.txt"))
    clusters = {"empty": empty, "wattclass": rig.cluster}
    try:
        for c in clusters.values():
            c.start()
            for _ in range(a.queue):
                c.sbatch("-H", "-o", "/dev/null", "-J", "parked")
        for i in range(a.jobs):
            for name in (("empty", "wattclass") if i % 2 == 0 else ("wattclass", "empty")):
                c = clusters[name]
                c.wait_job(c.sbatch("-o", "/dev/null", "-J", "mem-train", "--gres=gpu:2"), timeout=60)
        ms = {}
        for name, root in (("empty", empty_root), ("wattclass", rig.root)):
            rows = (root / "times.txt").read_text().split("\n")
            ms[name] = [int(r.split()[1]) / 1e6 for r in rows if r.strip()]
        capped = rig.log.read_text().count("capped GPU")
        if capped < 2 * a.jobs:
            raise RuntimeError(f"only {capped} GPU caps logged for {a.jobs} jobs: measured the wrong path")
    finally:
        for c in clusters.values():
            c.stop()
        shutil.rmtree(rig.root, ignore_errors=True)
        shutil.rmtree(run_root, ignore_errors=True)
        shutil.rmtree(empty_root, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in ms.items()}
    out = {"jobs": a.jobs, "queued_jobs": a.queue,
           "median_ms": {k: round(v, 1) for k, v in med.items()},
           "p95_ms": {k: round(pct(v, 0.95), 1) for k, v in ms.items()},
           "added_median_ms": round(med["wattclass"] - med["empty"], 1), "target_ms": 150}
    out["pass"] = out["added_median_ms"] <= 150
    if a.json:
        print(json.dumps(out, indent=2))
    else:
        print(f"Prolog wall time, median (p95): empty {out['median_ms']['empty']} "
              f"({out['p95_ms']['empty']}) ms, wattclass {out['median_ms']['wattclass']} "
              f"({out['p95_ms']['wattclass']}) ms; added {out['added_median_ms']} ms "
              f"(target <= 150) {'PASS' if out['pass'] else 'FAIL'} [{a.jobs} jobs, {a.queue} queued]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
