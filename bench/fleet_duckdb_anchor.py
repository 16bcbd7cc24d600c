"""Anchor for the nightly feature stage: DuckDB's own group-by of per-job aggregates.

The issue asks wattclass's feature stage to be within 2x of a good general-purpose engine on
the same files, on the same machine. This script is that engine's figure: DuckDB scans one day of
telemetry (``<root>/telemetry/date=D/host=*/*.parquet``) and computes, per job_id, the window
count, summed energy and duration, and mean/min/max/std of the basic NVML columns (power as a
fraction of the limit, SM clock as a fraction of its max, frame buffer as a fraction of total)
and of the GPM columns. The query runs in a child process so that its wall time and peak RSS
are its own (``resource.getrusage(RUSAGE_CHILDREN)``), with DuckDB limited to the machine
(``--threads``, ``--memory-limit``). Prints one JSON document.

  python bench/fleet_duckdb_anchor.py --data-root /work/fleet10k --date 2026-03-01
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: (output name, SQL expression) of the per-window values aggregated per job.
VALUES: tuple[tuple[str, str], ...] = (
    ("power_avg_w", "power_avg_w"),
    ("power_max_w", "power_max_w"),
    ("power_avg_frac", "power_avg_w / power_limit_w"),
    ("power_max_frac", "power_max_w / power_limit_w"),
    ("power_limit_w", "power_limit_w"),
    ("util_gpu_pct", "util_gpu_pct"),
    ("util_mem_pct", "util_mem_pct"),
    ("sm_clock_frac", "sm_clock_mhz / sm_clock_max_mhz"),
    ("mem_clock_mhz", "mem_clock_mhz"),
    ("throttle_power_frac", "throttle_power_frac"),
    ("throttle_thermal_frac", "throttle_thermal_frac"),
    ("temp_c", "temp_c"),
    ("fb_used_frac", "fb_used_mib / fb_total_mib"),
    ("sm_util_pct", "sm_util_pct"),
    ("sm_occupancy_pct", "sm_occupancy_pct"),
    ("tensor_util_pct", "tensor_util_pct"),
    ("dram_bw_util_pct", "dram_bw_util_pct"),
    ("fp64_util_pct", "fp64_util_pct"),
    ("fp32_util_pct", "fp32_util_pct"),
    ("fp16_util_pct", "fp16_util_pct"),
    ("int_util_pct", "int_util_pct"),
    ("pcie_tx_mibs", "pcie_tx_mibs"),
    ("pcie_rx_mibs", "pcie_rx_mibs"),
)


#: The per-job aggregates the labels need (issue 15's "same per-job aggregates"): what the nightly's
#: DuckDB scan computes, without its retraining sample and model pass.
LABEL_AGGREGATES = (
    "count(*) AS n_windows", "sum(energy_j) AS energy_j",
    "sum(epoch_ms(ts_end) - epoch_ms(ts_start)) / 1000.0 AS duration_s", "min(ts_start) AS first_ts",
    "max(ts_end) AS last_ts", 'min("user") AS "user"', "string_agg(DISTINCT host, ',') AS hosts",
    "count(*) FILTER (WHERE c >= 0) AS n_gpm", "count(*) FILTER (WHERE c = 0) AS r_idle",
    "count(*) FILTER (WHERE c = 1) AS r_compute", "count(*) FILTER (WHERE c = 2) AS r_memory",
)
#: The GPM rule (classifier/rules.py; the integer pipe counts since issue 13 round 7), plainly: the
#: baseline a hand-written query would be. It leaves out what the product's rule adds on top
#: (NaN read as not measured, PIPE_GAP: classifier/rowsql.py), which on this data changes no row.
_PIPES = "tensor_util_pct, fp64_util_pct, fp32_util_pct, fp16_util_pct, int_util_pct"
_RULE = (f"CASE WHEN sm_util_pct IS NULL OR dram_bw_util_pct IS NULL OR greatest({_PIPES}) IS NULL "
         f"THEN -1 WHEN sm_util_pct < 10 THEN 0 WHEN greatest({_PIPES}) >= dram_bw_util_pct "
         "THEN 1 ELSE 2 END")


#: Issue 9's row rules (classifier/validity.py), plainly: 0 valid, else the first rule broken.
_REJECT = ("CASE WHEN ts_start IS NULL OR ts_end IS NULL OR gpu_uuid IS NULL THEN 1 "
           "WHEN ts_end <= ts_start THEN 2 "
           "WHEN energy_j IS NOT NULL AND (isnan(energy_j) OR isinf(energy_j) OR energy_j < 0) THEN 3 "
           "WHEN coalesce(CASE WHEN isnan(power_avg_w) THEN 0 ELSE power_avg_w END, 0) > 3000 "
           "OR coalesce(CASE WHEN isnan(power_max_w) THEN 0 ELSE power_max_w END, 0) > 3000 "
           # over the row's length, at least 10 s (classifier/validity.py ENERGY_SPAN_FLOOR_S)
           "OR coalesce(energy_j / greatest((epoch_ms(ts_end) - epoch_ms(ts_start)) / 1000.0, 10.0), 0) "
           "> 3000 THEN 4 "
           "ELSE 0 END")


def build_query(glob: str, which: str = "classic") -> str:
    """The per-job aggregate query over the Parquet files matching ``glob``.

    ``classic``: mean/min/max/std of 23 telemetry values per job (the anchor of issue 6);
    ``labels``: exactly the per-job aggregates the labels need (``LABEL_AGGREGATES``);
    ``labels-rules``: ``labels`` plus the work issue 9's input rules require of any engine: every
    row is read (windows without a job count too), with the columns the rules test (gpu_uuid,
    power_avg_w, power_max_w); each row gets its reject code, and the groups are per (job, file,
    reject code), so that rejected rows are counted per reason, left out of the label aggregates,
    and each file's window-start range is known for the duplicate check.
    """
    if which == "labels":
        return (f"SELECT job_id, {', '.join(LABEL_AGGREGATES)} FROM (SELECT *, {_RULE} AS c FROM "
                f"read_parquet('{glob}', hive_partitioning = false)) "
                "WHERE job_id IS NOT NULL GROUP BY job_id")
    if which == "labels-rules":
        return (f"SELECT job_id, filename, b, {', '.join(LABEL_AGGREGATES)}, min(ts_start) AS file_t0, "
                f"max(ts_start) AS file_t1 FROM (SELECT *, {_RULE} AS c, {_REJECT} AS b FROM "
                f"read_parquet('{glob}', hive_partitioning = false, filename = true)) "
                "GROUP BY job_id, filename, b")
    aggs = [
        "count(*) AS n_windows",
        "sum(energy_j) AS energy_j",
        "sum(epoch_ms(ts_end) - epoch_ms(ts_start)) / 1000.0 AS duration_s",
        "min(ts_start) AS first_ts",
        "max(ts_end) AS last_ts",
    ]
    for name, expr in VALUES:
        aggs += [
            f"avg({expr}) AS {name}_mean",
            f"min({expr}) AS {name}_min",
            f"max({expr}) AS {name}_max",
            f"stddev_samp({expr}) AS {name}_std",
        ]
    cols = ", ".join(aggs)
    return (
        f"SELECT job_id, {cols} FROM read_parquet('{glob}', hive_partitioning = false) "
        "WHERE job_id IS NOT NULL GROUP BY job_id"
    )


def _child(glob: str, out: str, threads: int, memory_limit: str, tmp: str, which: str) -> None:
    import duckdb

    con = duckdb.connect()
    con.execute(f"SET threads = {int(threads)}")
    con.execute(f"SET memory_limit = '{memory_limit}'")
    con.execute(f"SET temp_directory = '{tmp}'")
    con.execute("SET preserve_insertion_order = false")
    t0 = time.perf_counter()
    con.execute(f"COPY ({build_query(glob, which)}) TO '{out}' (FORMAT parquet)")
    wall = time.perf_counter() - t0
    where = " WHERE job_id IS NOT NULL AND b = 0" if which == "labels-rules" else ""
    jobs, windows = con.execute(f"SELECT count(DISTINCT job_id), sum(n_windows) FROM read_parquet('{out}')"
                                f"{where}").fetchone()
    json.dump(
        {
            "query_wall_s": round(wall, 3),
            "jobs": jobs,
            "job_windows": int(windows),
            "duckdb": duckdb.__version__,
        },
        sys.stdout,
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-root", type=Path, required=True)
    ap.add_argument("--date", required=True, help="YYYY-MM-DD")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--memory-limit", default="8GB")
    ap.add_argument("--aggregates", choices=("classic", "labels", "labels-rules"), default="classic",
                    help="classic: 97 aggregates of 23 values; labels: what the labels need; "
                    "labels-rules: labels plus the work of issue 9's input rules (build_query)")
    ap.add_argument("--_child", nargs=5, metavar=("GLOB", "OUT", "THREADS", "MEM", "SET"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._child:
        glob, out, threads, mem, which = args._child
        _child(glob, out, int(threads), mem, str(Path(out).parent), which)
        return 0
    day = args.data_root / "telemetry" / f"date={args.date}"
    files = sorted(day.glob("host=*/*.parquet"))
    if not files:
        print(f"no telemetry files under {day}", file=sys.stderr)
        return 3
    glob = str(day / "host=*" / "*.parquet")
    with tempfile.TemporaryDirectory(prefix="duckdb-anchor-") as tmp:
        out = str(Path(tmp) / "features.parquet")
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, __file__, "--data-root", str(args.data_root), "--date", args.date,
             "--_child", glob, out, str(args.threads), args.memory_limit, args.aggregates],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            print(proc.stderr, file=sys.stderr)
            return 1
        child = json.loads(proc.stdout)
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    result = {
        "benchmark": "duckdb per-job aggregates (nightly feature-stage anchor)",
        "data_root": str(args.data_root),
        "date": args.date,
        "files": len(files),
        "bytes_on_disk": sum(f.stat().st_size for f in files),
        "aggregates": args.aggregates,
        "aggregates_per_job": (5 + 4 * len(VALUES) if args.aggregates == "classic"
                               else len(LABEL_AGGREGATES) + 2 * (args.aggregates == "labels-rules")),
        "threads": args.threads,
        "memory_limit": args.memory_limit,
        **child,
        "process_wall_s": round(wall, 3),
        "peak_rss_mib": round(peak_kib / 1024, 1),
        "machine": {"cpus": _cpus(), "python": platform.python_version(), "platform": platform.platform()},
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0))


if __name__ == "__main__":
    sys.exit(main())
