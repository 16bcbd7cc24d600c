"""Benchmark ``wattclass job JOBID``: time to summarise one job in a large store.

Target (issue 11): at most 1 s for one job in a store of 30 days of 1,000 GPUs. Picks ``--jobs``
job ids at random (seeded) from the store's job records (``<root>/jobs/date=*/jobs.parquet``,
the fleet generator's layout), times ``summarise`` in this process (the work the command does,
without Python's start-up, which is printed once separately for the CLI), and prints one JSON
document with the median, p90 and max, the files each lookup opened, and the machine's load.

  python bench/job_lookup.py --data-root /work/bench-data/fleet-1k-30d --jobs 20
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.dataset as ds

from wattclass.report.job import summarise


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-root", type=Path, required=True)
    ap.add_argument("--jobs", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cli", action="store_true", help="also time one `wattclass job` process end to end")
    args = ap.parse_args()
    files = sorted((args.data_root / "jobs").glob("date=*/jobs.parquet"))
    if not files:
        print(f"{args.data_root}: no jobs/date=*/jobs.parquet", file=sys.stderr)
        return 3
    ids = ds.dataset([str(f) for f in files]).to_table(columns=["job_id"]).column("job_id").to_pylist()
    rng = random.Random(args.seed)
    pick = rng.sample(ids, min(args.jobs, len(ids)))
    times, files_read, gpus = [], [], []
    for j in pick:
        t0 = time.perf_counter()
        s = summarise(args.data_root, j)
        times.append(time.perf_counter() - t0)
        files_read.append(s.files_read)
        gpus.append(s.n_gpus)
    out = {
        "bench": "job_lookup",
        "data_root": str(args.data_root),
        "store_days": len(files),
        "jobs_in_store": len(ids),
        "jobs_timed": len(pick),
        "seconds": {"median": statistics.median(times), "p90": sorted(times)[int(0.9 * (len(times) - 1))],
                    "max": max(times)},
        "files_read": {"median": statistics.median(files_read), "max": max(files_read)},
        "gpus_per_job": {"median": statistics.median(gpus), "max": max(gpus)},
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "loadavg_start_1m": os.getloadavg()[0]},
    }
    if args.cli:
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "wattclass.cli", "job", pick[0], "--data-root",
                        str(args.data_root)], check=True, capture_output=True)
        out["cli_wall_s_one_job"] = time.perf_counter() - t0
    out["machine"]["loadavg_end_1m"] = os.getloadavg()[0]
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
