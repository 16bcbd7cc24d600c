"""Benchmark ``wattclass simulate`` on a month of a 1,000-GPU cluster (issue 12: at most 2 minutes;
issue 15: at most 5 minutes and 8 GB).

Runs the what-if over every telemetry file of ``--data-root`` (or ``--from``/``--to``) with the
example policy and prints one JSON document: wall seconds, peak RSS, rows and files scanned, jobs, the
totals, the machine and its load average before and after (the figure is only comparable with
the load it was taken under; ``cpu_s``, the process's CPU time, depends less on it).

  python bench/simulate_fleet.py --data-root /work/bench-data/fleet-1k-30d
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

from wattclass.policy import load_policy
from wattclass.savings.simulate import simulate, telemetry_paths

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-root", type=Path, required=True)
    ap.add_argument("--policy", type=Path, default=REPO / "deploy" / "policy.example.toml")
    ap.add_argument("--from", dest="date_from")
    ap.add_argument("--to", dest="date_to")
    args = ap.parse_args(argv)
    files = telemetry_paths(args.data_root, args.date_from, args.date_to)
    rows = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    load0 = os.getloadavg()
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    res = simulate(args.data_root, load_policy(args.policy), args.date_from, args.date_to)
    wall = time.perf_counter() - t0
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu_s = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    doc = {
        "wall_s": round(wall, 1), "cpu_s": round(cpu_s, 1),
        # the process's peak (Linux reports KiB): issue 15's 8 GB target
        "peak_rss_mib": round(ru1.ru_maxrss / 1024, 1), "files": len(files), "rows": rows,
        "jobs": res.totals["jobs"],
        "rows_per_s": round(rows / wall),
        "totals": {k: round(v, 2) if isinstance(v, float) else v for k, v in res.totals.items()},
        "machine": f"{platform.node()} {platform.machine()} {os.cpu_count()} CPUs, "
                   f"Python {platform.python_version()}",
        "load_avg_before": [round(x, 2) for x in load0],
        "load_avg_after": [round(x, 2) for x in os.getloadavg()],
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
    }
    json.dump(doc, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
