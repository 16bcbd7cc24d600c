"""Benchmark: the nightly scan's DuckDB query against the labels anchor's, in one process.

Where the feature stage's time goes beyond the anchor's (issue 15), without Python start-up,
imports or the per-job table: the same DuckDB connection (``--threads``) runs, in turn and
``--rounds`` times, the labels anchor's query (bench/fleet_duckdb_anchor.py, ``labels``), the
stage's one pass without the retraining sample and the pass with it (classifier/scan.py,
``Scanner._pass_sql``, as the nightly runs it). Each query's result is fetched as Arrow; its
wall and CPU seconds (this process, all threads) are printed per round, with the 1-minute load
average before each, and the median of each query over the rounds.

  python bench/scan_query_parts.py --data-root /work/bench-data/fleet-1k-30d --date 2026-11-29
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchstamp import emit
from fleet_duckdb_anchor import build_query


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-root", type=Path, required=True)
    ap.add_argument("--date", required=True, help="YYYY-MM-DD")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=4)
    a = ap.parse_args()
    from wattclass.classifier.engine import SAMPLE_PER_JOB
    from wattclass.classifier.reader import telemetry_files
    from wattclass.classifier.scan import Scanner, _names
    from wattclass.schema import TELEMETRY_V1

    files = telemetry_files([a.data_root], date=a.date)
    scanner = Scanner(a.threads)
    # what Scanner._run sets for a night whose files share one schema (the fast path)
    scanner._absent = frozenset(TELEMETRY_V1.names) - set(_names(files[0]) or ())
    glob = str(a.data_root / "telemetry" / f"date={a.date}" / "host=*" / "*.parquet")
    queries = {
        "anchor_labels": build_query(glob, "labels"),
        "pass_without_sample": scanner._pass_sql(files, (), dedup=False),
        "pass_with_sample": scanner._pass_sql(files, (), dedup=False, sample=(SAMPLE_PER_JOB, 0)),
    }
    rounds: list[dict[str, Any]] = []
    for r in range(max(1, a.rounds)):
        for name, sql in queries.items():
            load = os.getloadavg()[0]
            c0, t0 = _cpu_s(), time.perf_counter()
            rows = scanner.con.sql(sql).to_arrow_table().num_rows
            rounds.append({"round": r + 1, "query": name, "wall_s": round(time.perf_counter() - t0, 3),
                           "cpu_s": round(_cpu_s() - c0, 3), "rows": rows, "load_1m": round(load, 2)})
    scanner.close()
    median = {name: {k: round(statistics.median(x[k] for x in rounds if x["query"] == name), 3)
                     for k in ("wall_s", "cpu_s")} for name in queries}
    return emit({"benchmark": "nightly scan query vs labels anchor query, one process",
                 "data_root": str(a.data_root), "date": a.date, "files": len(files), "threads": a.threads,
                 "rounds": rounds, "median": median})


if __name__ == "__main__":
    sys.exit(main())
