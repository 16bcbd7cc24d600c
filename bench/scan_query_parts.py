"""Benchmark: the nightly scan's DuckDB query against the anchors' queries, in one process.

Where the feature stage's time goes beyond the labels anchor's (issue 15), without Python start-up,
imports or the per-job table: the same DuckDB connection (``--threads``) runs, in turn and
``--rounds`` times:

- ``anchor_labels``: the labels anchor (bench/fleet_duckdb_anchor.py ``labels``: the 11 per-job
  aggregates the labels need, job windows only);
- ``anchor_labels_rule_columns``: the same query that also reads the five columns the input rules
  and the shared-GPU count read (``RULE_COLUMNS``), each into one trivial aggregate: what reading
  them costs, with none of the rules' work (the files must have those columns, as every file of
  today's daemon and of ``wattclass fleet generate`` has);
- ``anchor_labels_rules``: the labels + rules anchor (``labels-rules``: every row, a reject code per
  row, groups per job, file and code);
- ``pass_without_sample`` and ``pass_with_sample``: the stage's one pass (classifier/scan.py,
  ``Scanner._pass_sql``, as the nightly runs it) without and with the retraining sample.

Each query's result is fetched as Arrow; its wall and CPU seconds (this process, all threads) are
printed per round with the 1-minute load average before it, then per query the median over the
rounds and the median of its per-round ratios to ``anchor_labels`` of the same round (the rounds
interleave the queries, so a ratio compares runs seconds apart).

``--operators``: each query also runs under DuckDB's profiler (JSON), and each round's record gets
the seconds its operators took by kind (the Parquet read, the projections that compute each row's
expressions, the group-by, the rest; summed over threads, so comparable to CPU seconds), with
the rows and bytes the read returned: where one query's excess over another goes. The profiler
costs time of its own: compare these figures with each other, not with a round's wall time.

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

#: The columns the stage reads beyond the labels anchor's: the input rules' (gpu_uuid, the two
#: power columns; classifier/rowsql.py ``_reject_sql``) and the shared-GPU count's.
RULE_COLUMNS = ("gpu_uuid", "power_avg_w", "power_max_w", "shared_jobs", "share_basis")


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _with_rule_columns(labels_sql: str) -> str:
    """The labels anchor's query, also reading RULE_COLUMNS (one count each: no work beyond the read)."""
    reads = "".join(f", count({c}) AS read_{c}" for c in RULE_COLUMNS)
    head, sep, tail = labels_sql.partition(" FROM (SELECT *")
    if not sep:
        raise AssertionError("the labels anchor's query changed shape: update _with_rule_columns")
    return head + reads + sep + tail


def _operator_seconds(profile: dict[str, Any]) -> dict[str, Any]:
    """Seconds by operator kind in a DuckDB JSON profile, with the rows and bytes the reads returned."""
    kinds: dict[str, float] = {}
    rows_read = 0

    def walk(node: dict[str, Any]) -> None:
        nonlocal rows_read
        name = str(node.get("operator_name") or node.get("name") or "")
        kind = name if name in ("READ_PARQUET", "TABLE_SCAN", "PROJECTION", "HASH_GROUP_BY") else "other"
        took = node.get("operator_timing", node.get("timing", 0.0))
        kinds[kind] = kinds.get(kind, 0.0) + float(took or 0.0)
        if name in ("READ_PARQUET", "TABLE_SCAN"):
            rows_read += int(node.get("operator_cardinality", node.get("intermediate_rows", 0)) or 0)
        for child in node.get("children", []):
            walk(child)

    for top in profile.get("operator", profile.get("children", [])):
        walk(top)
    return {"operator_s": {k: round(v, 3) for k, v in sorted(kinds.items())}, "rows_read": rows_read,
            "bytes_read": int(profile.get("io", {}).get("total_bytes_read", 0))}


def _profiled(con: Any, sql: str, path: Path) -> dict[str, Any]:
    """Run ``sql`` on ``con`` under DuckDB's JSON profiler; its ``_operator_seconds``."""
    import json

    con.execute("PRAGMA enable_profiling = 'json'")
    con.execute(f"PRAGMA profiling_output = '{path}'")
    try:
        con.sql(sql).to_arrow_table()
    finally:
        con.execute("PRAGMA disable_profiling")
    return _operator_seconds(json.loads(path.read_text()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-root", type=Path, required=True)
    ap.add_argument("--date", required=True, help="YYYY-MM-DD")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--operators", action="store_true",
                    help="also run each query under DuckDB's profiler: seconds by operator kind")
    a = ap.parse_args()
    import tempfile

    from wattclass.classifier.engine import SAMPLE_PER_JOB
    from wattclass.classifier.reader import telemetry_files
    from wattclass.classifier.scan import Scanner
    from wattclass.schema import TELEMETRY_V1, column_names

    files = telemetry_files([a.data_root], date=a.date)
    scanner = Scanner(a.threads)
    # what Scanner._run sets for a night whose files share one schema (the fast path)
    scanner._absent = frozenset(TELEMETRY_V1.names) - set(column_names(files[0]) or ())
    glob = str(a.data_root / "telemetry" / f"date={a.date}" / "host=*" / "*.parquet")
    labels = build_query(glob, "labels")
    queries = {
        "anchor_labels": labels,
        "anchor_labels_rule_columns": _with_rule_columns(labels),
        "anchor_labels_rules": build_query(glob, "labels-rules"),
        "pass_without_sample": scanner._pass_sql(files, (), dedup=False),
        "pass_with_sample": scanner._pass_sql(files, (), dedup=False, sample=(SAMPLE_PER_JOB, 0)),
    }
    rounds: list[dict[str, Any]] = []
    raw: dict[tuple[int, str], dict[str, float]] = {}  # unrounded, for the ratios
    for r in range(max(1, a.rounds)):
        for name, sql in queries.items():
            load = os.getloadavg()[0]
            c0, t0 = _cpu_s(), time.perf_counter()
            rows = scanner.con.sql(sql).to_arrow_table().num_rows
            raw[r + 1, name] = {"wall_s": time.perf_counter() - t0, "cpu_s": _cpu_s() - c0}
            took = {k: round(v, 3) for k, v in raw[r + 1, name].items()}
            rec: dict[str, Any] = {"round": r + 1, "query": name, **took, "rows": rows,
                                   "load_1m": round(load, 2)}
            if a.operators:
                with tempfile.TemporaryDirectory() as tmp:
                    rec.update(_profiled(scanner.con, sql, Path(tmp) / "profile.json"))
            rounds.append(rec)
    scanner.close()
    median: dict[str, dict[str, float | None]] = {}
    for name in queries:
        mine = [(r, x) for (r, q), x in raw.items() if q == name]
        median[name] = {k: round(statistics.median(x[k] for _, x in mine), 3) for k in ("wall_s", "cpu_s")}
        for k in ("wall_s", "cpu_s"):
            ratios = [x[k] / raw[r, "anchor_labels"][k] for r, x in mine if raw[r, "anchor_labels"][k] > 0]
            median[name][f"{k}_vs_anchor_labels"] = round(statistics.median(ratios), 3) if ratios else None
    return emit({"benchmark": "nightly scan query vs the anchors' queries, one process",
                 "data_root": str(a.data_root), "date": a.date, "files": len(files), "threads": a.threads,
                 "rule_columns": list(RULE_COLUMNS), "rounds": rounds, "median": median})


if __name__ == "__main__":
    sys.exit(main())
