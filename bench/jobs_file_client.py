"""Benchmark: reading a day's jobs file into job records (``JobsFileClient``), as the nightly does.

Times ``JobsFileClient(path)`` and ``jobs_frame`` (what the nightly's Slurm join calls) in this
process, ``--repeat`` times after one untimed warm-up (pandas imported), and prints one JSON
document with the median and the fastest of each, and the record count. Run it on two versions
of wattclass one after the other to compare them (issue 15: the records were built row by row).

  python bench/jobs_file_client.py --jobs-file /work/bench-data/fleet-1k-30d/jobs/date=2026-11-29/jobs.parquet
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
import time
from pathlib import Path

from benchstamp import emit


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs-file", type=Path, required=True)
    ap.add_argument("--repeat", type=int, default=7)
    a = ap.parse_args()
    from wattclass.slurm.client import JobsFileClient

    ever = (dt.datetime(1970, 1, 2, tzinfo=dt.UTC), dt.datetime(2100, 1, 1, tzinfo=dt.UTC))
    JobsFileClient(a.jobs_file).jobs_frame(*ever)  # warm-up: imports, page cache
    read_s, frame_s = [], []
    n = 0
    for _ in range(max(1, a.repeat)):
        t0 = time.perf_counter()
        client = JobsFileClient(a.jobs_file)
        t1 = time.perf_counter()
        n = len(client.jobs_frame(*ever))
        read_s.append(t1 - t0)
        frame_s.append(time.perf_counter() - t1)
    return emit({"benchmark": "jobs file -> job records (JobsFileClient)", "jobs_file": str(a.jobs_file),
                 "records": n, "repeat": len(read_s),
                 "read_median_s": round(statistics.median(read_s), 4), "read_min_s": round(min(read_s), 4),
                 "frame_median_s": round(statistics.median(frame_s), 4),
                 "frame_min_s": round(min(frame_s), 4)})


if __name__ == "__main__":
    sys.exit(main())
