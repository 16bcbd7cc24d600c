"""Benchmark: what a slow Slurm records query costs the nightly (issue 15).

At a large site the day's job records come from slurmdbd (``sacct``, slurmrestd or pyslurm) and
take seconds. The nightly used to read them before its scan; it now reads them beside it
(classifier/nightly.py ``_Beside``), and the scan checks its groups after its query. This script
runs ``run_nightly`` over one fleet day with the day's jobs file as the Slurm client, answering
each records query after ``--delay-s`` seconds (a stand-in for sacct's latency; the file's own
read is included), for each delay in turn, and prints the night's wall time per delay. Run it
with the code under test first on ``PYTHONPATH`` (a worktree of an older commit gives the
"before" figures).

  python bench/nightly_records_latency.py --data-root /work/bench-data/fleet-1k-30d \\
      --date 2026-11-29 --delay-s 0 3 --runs 2
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as wattclass.cli sets it

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchstamp import emit


def _night(data_root: Path, date: str, delay_s: float) -> dict[str, Any]:
    """One nightly over a scratch root linking the fleet day's telemetry and jobs (the fleet folder
    is not written), the records query answered after ``delay_s``."""
    import pandas as pd

    from wattclass.classifier.nightly import NightlyOptions, run_nightly
    from wattclass.slurm.client import JobsFileClient

    class SlowClient(JobsFileClient):
        def jobs_frame(self, start: Any, end: Any) -> pd.DataFrame:
            time.sleep(delay_s)
            return super().jobs_frame(start, end)

    with tempfile.TemporaryDirectory(prefix="records-latency-") as tmp:
        root = Path(tmp)
        for sub in ("telemetry", "jobs"):
            (root / sub).symlink_to((data_root / sub).resolve())
        client = SlowClient(data_root / "jobs" / f"date={date}" / "jobs.parquet")
        opts = NightlyOptions(data_root=root, date=date, table_out=root / "table.lua", retrain=False,
                              workers=2)
        t0 = time.perf_counter()
        s = run_nightly(opts, client)
        wall = time.perf_counter() - t0
        shutil.rmtree(root / "classifier", ignore_errors=True)
    return {"delay_s": delay_s, "wall_s": round(wall, 2), "feature_seconds": s.get("feature_seconds"),
            "jobs": s.get("jobs"), "jobs_without_record": s["job_records"]["jobs_without_record"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-root", type=Path, required=True, help="a fleet day's root (telemetry/, jobs/)")
    ap.add_argument("--date", required=True, help="YYYY-MM-DD")
    ap.add_argument("--delay-s", type=float, nargs="+", default=[0.0, 3.0], help="records latencies to try")
    ap.add_argument("--runs", type=int, default=2, help="nights per delay, in turn")
    a = ap.parse_args()
    if not (a.data_root / "jobs" / f"date={a.date}" / "jobs.parquet").is_file():
        raise SystemExit(f"{a.data_root}: no jobs/date={a.date}/jobs.parquet "
                         "(wattclass fleet generate writes it)")
    import wattclass

    nights = [_night(a.data_root, a.date, d) for _ in range(a.runs) for d in a.delay_s]
    return emit({"benchmark": "nightly wall time against the Slurm records' latency (retraining off)",
                 "code": str(Path(wattclass.__file__).resolve().parent), "data_root": str(a.data_root),
                 "date": a.date, "nights": nights})


if __name__ == "__main__":
    sys.exit(main())
