"""How long one fleet-day takes to generate, how big it is, and how much memory it needs.

Runs ``wattclass fleet generate`` as a child process and samples the resident memory of the
whole process tree (parent + worker processes) every 0.2 s, because the generator's memory
bound is a per-worker one and getrusage only reports the largest single process. Prints JSON.

  python bench/fleet_generate.py --gpus 10000 --date 2026-03-01 --out /work/fleet10k --workers 2
  python bench/fleet_generate.py --gpus 64 --hours 2 --out /tmp/fl --cleanup   # CI-sized
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import psutil


def _tree_rss(proc: psutil.Process) -> int:
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, required=True)
    ap.add_argument("--date", default="2026-03-01")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--hours", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cleanup", action="store_true", help="delete the generated data afterwards")
    args = ap.parse_args()
    cmd = [sys.executable, "-m", "wattclass.cli", "-q", "fleet", "generate", "--gpus", str(args.gpus),
           "--date", args.date, "--out", str(args.out), "--workers", str(args.workers),
           "--hours", str(args.hours), "--seed", str(args.seed), "--overwrite", "--json"]  # fmt: skip
    t0 = time.perf_counter()
    popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ps = psutil.Process(popen.pid)
    peak = 0
    while popen.poll() is None:
        with contextlib.suppress(psutil.Error):
            peak = max(peak, _tree_rss(ps))
        time.sleep(0.2)
    out, err = popen.communicate()
    wall = time.perf_counter() - t0
    if popen.returncode != 0:
        print(err, file=sys.stderr)
        return popen.returncode
    res = json.loads(out)
    result = {
        "benchmark": "fleet generate (one day)",
        "gpus": args.gpus,
        "hours": args.hours,
        "workers": args.workers,
        "rows": res["rows"],
        "jobs": res["jobs"],
        "multi_node_jobs": res["multi_node_jobs"],
        "files": res["files"],
        "bytes_on_disk": res["bytes"],
        "bytes_per_window": round(res["bytes"] / res["rows"], 2),
        "wall_s": round(wall, 2),
        "windows_per_s": round(res["rows"] / wall),
        "peak_rss_tree_mib": round(peak / 2**20, 1),
        "peak_rss_largest_process_mib": round(
            resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1
        ),
        "machine": {"cpus": len(os.sched_getaffinity(0)), "platform": platform.platform()},
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "telemetry_dir": res["telemetry_dir"],
    }
    if args.cleanup:
        shutil.rmtree(args.out)
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
