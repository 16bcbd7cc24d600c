"""Benchmark: the nightly run over one fleet day, against DuckDB's group-by, in one run.

Measurements on the same files, one after the other, each in its own process tree whose wall
time, CPU time and peak memory (RSS of the whole tree, summed over its processes, sampled every
0.1 s; and the largest single process from getrusage) are its own, with the machine's 1-minute
load average as each began and ended:

1. anchors, bench/fleet_duckdb_anchor.py: ``duckdb`` (classic: 97 per-job aggregates),
   ``duckdb-labels`` (exactly the 11 per-job aggregates the labels need) and ``duckdb-rules``
   (labels plus the work issue 9's input rules require: every row, the rule columns, a reject
   code per row, groups per job, file and reject code);
2. ``features``: wattclass's feature stage alone (``classifier.engine.label_files_local``, the
   code nightly runs: scan with the input rules, rule codes, model on GPM-less windows, retraining
   sample, per-job partial aggregates, merge, job labels), with ``--workers`` DuckDB threads;
   with ``--job-records``, job windows are also checked against the day's jobs file (the
   records nightly joins: classifier/jobcheck.py), as ``wattclass nightly`` does;
3. ``classify``: ``wattclass classify`` end to end;
4. ``nightly``: ``wattclass nightly`` end to end (features, Slurm-record join from the day's
   jobs file, label store, retraining with its promotion gate, label table), on a scratch data
   root whose telemetry/ and jobs/ link to the fleet day's, so the fleet folder is not written.
   As on any night after a data root's first, the bundled base training set is cached there
   beforehand, unmeasured (``--cold-cache``: not, as on the first night).

Prints one JSON document: the figures, windows/s, the wall-time ratios of each stage to each
anchor (issue 15: feature stage <= 1.2x, classify and nightly <= 2x), nightly wall (target
< 600 s) and peak RSS (target < 8 GiB).

  python bench/fleet_nightly.py --data-root /work/fleet10k --date 2026-03-01
  python bench/fleet_nightly.py --data-root /tmp/fleet-small --date 2026-03-01 --skip duckdb
"""

from __future__ import annotations

import os

# The feature-stage child measures what the command runs: the same BLAS setting as wattclass.cli.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import contextlib
import json
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchstamp import emit

HERE = Path(__file__).resolve().parent
STAGES = ("duckdb", "duckdb-labels", "duckdb-rules", "features", "classify", "nightly")
ANCHORS = (("duckdb", "classic"), ("duckdb-labels", "labels"), ("duckdb-rules", "labels-rules"))


def _tree_rss(pid: int) -> int:
    """Bytes resident in process ``pid`` and all its descendants (0 once it is gone)."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total


def measure(cmd: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``cmd``; its wall time, stdout, and peak RSS (tree sum and largest process)."""
    load0 = os.getloadavg()[0]
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    before = ru0.ru_maxrss
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})
    peak = [0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], _tree_rss(proc.pid))
            stop.wait(0.1)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    out, err = proc.communicate()
    wall = time.perf_counter() - t0
    stop.set()
    th.join()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err[-4000:]}")
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    largest = ru1.ru_maxrss
    # CPU seconds of the whole tree (user + system): on a shared machine the wall time depends on
    # the other load, the CPU time much less.
    cpu = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "peak_rss_tree_mib": round(peak[0] / 2**20, 1),
            "peak_rss_largest_process_mib": round(largest / 1024, 1) if largest > before else None,
            # the 1-minute load average of the machine (2 cores shared) as the stage began and ended
            "load_1m": [round(load0, 2), round(os.getloadavg()[0], 2)], "stdout": out}


def _job_records(root: Path, date: str) -> Any:
    """The day's jobs file as the scan's job-record table (None without one), as nightly reads it."""
    from wattclass.classifier.jobcheck import index_records, job_records_table
    from wattclass.classifier.store import utc_day_bounds
    from wattclass.slurm.client import JobsFileClient

    path = root / "jobs" / f"date={date}" / "jobs.parquet"
    if not path.is_file():
        return None
    start, end = utc_day_bounds(date)
    return job_records_table(index_records(JobsFileClient(path).jobs_frame(start, end)))


def features_child(root: Path, date: str, workers: int, job_records: bool = False) -> None:
    """Run the feature stage alone as nightly runs it (same engine call, sample and model pass),
    print JSON (child process). The model is given as a loader, as ``wattclass classify`` gives
    it: LightGBM loads only if a window needs the model (nightly loads it anyway, to retrain)."""
    from wattclass.classifier.engine import SAMPLE_PER_JOB, label_files_local
    from wattclass.classifier.model import default_model_dir, load_model
    from wattclass.classifier.reader import telemetry_files
    from wattclass.cli import skip_collection_at_exit

    skip_collection_at_exit()  # the child ends as wattclass's commands do (wattclass.cli)
    files = telemetry_files([root], date=date)
    t0 = time.perf_counter()
    kw: dict[str, Any] = {"jobs": _job_records(root, date)} if job_records else {}
    res = label_files_local(files, lambda: load_model(default_model_dir()), "auto",
                            sample_per_job=SAMPLE_PER_JOB, sample_prefix=date, workers=workers, **kw)
    wall = time.perf_counter() - t0
    json.dump({"stage_wall_s": round(wall, 2), "files": res.n_files, "windows": res.n_windows,
               "model_loaded": "lightgbm" in sys.modules, "report": res.report.summary(),
               "jobs": len(res.labels), "sample_windows": len(res.sample),
               "by_label": res.labels["label"].value_counts().to_dict()}, sys.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-root", type=Path, required=True)
    ap.add_argument("--date", required=True, help="YYYY-MM-DD")
    ap.add_argument("--workers", type=int, default=2, help="wattclass scan threads (default 2, as DuckDB's)")
    ap.add_argument("--threads", type=int, default=2, help="DuckDB threads (default 2)")
    ap.add_argument("--skip", action="append", default=[], choices=STAGES, help="leave a stage out")
    ap.add_argument("--cold-cache", action="store_true",
                    help="nightly as on a data root's first night: the bundled base training set not "
                    "cached yet (default: cached, as on every later night)")
    ap.add_argument("--job-records", action="store_true",
                    help="features: check job windows against the day's jobs file, as nightly does")
    ap.add_argument("--_features", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a._features:
        features_child(a.data_root, a.date, a.workers, a.job_records)
        return 0
    py = sys.executable
    out: dict[str, Any] = {"benchmark": "nightly feature stage and end-to-end vs DuckDB group-by",
                           "data_root": str(a.data_root), "date": a.date, "workers": a.workers}
    for stage, which in ANCHORS:
        if stage in a.skip:
            continue
        m = measure([py, str(HERE / "fleet_duckdb_anchor.py"), "--data-root", str(a.data_root),
                     "--date", a.date, "--threads", str(a.threads), "--aggregates", which])
        d = json.loads(m.pop("stdout"))
        out[stage] = {**m, "query_wall_s": d["query_wall_s"], "jobs": d["jobs"],
                      "job_windows": d["job_windows"], "aggregates_per_job": d["aggregates_per_job"],
                      "files": d["files"], "bytes_on_disk": d["bytes_on_disk"], "version": d["duckdb"]}
    if "features" not in a.skip:
        checked = ["--job-records"] if a.job_records else []
        m = measure([py, __file__, "--data-root", str(a.data_root), "--date", a.date,
                     "--workers", str(a.workers), "--_features", *checked])
        child = json.loads(m.pop("stdout"))
        out["features"] = {**m, **child}
    if "classify" not in a.skip:
        with tempfile.TemporaryDirectory(prefix="fleet-classify-") as tmp:
            m = measure([py, "-m", "wattclass.cli", "-q", "classify", "--telemetry", str(a.data_root),
                         "--date", a.date, "--out", str(Path(tmp) / "labels.parquet"), "--json"])
        s = json.loads(m.pop("stdout"))
        out["classify"] = {**m, "jobs": s.get("jobs"), "windows": s.get("windows")}
    if "nightly" not in a.skip:
        with tempfile.TemporaryDirectory(prefix="fleet-nightly-") as tmp:
            root = Path(tmp)
            for sub in ("telemetry", "jobs"):
                if (a.data_root / sub).is_dir():
                    (root / sub).symlink_to((a.data_root / sub).resolve())
            if not a.cold_cache:
                # A night after the first: the bundled base training set is cached in the data
                # root by an earlier night (classifier/training.py, cached_training_set).
                subprocess.run([py, "-c", "import sys; from pathlib import Path; "
                                "from wattclass.classifier.nightly import MAX_WINDOWS_PER_JOB; "
                                "from wattclass.classifier.training import bundled_training_sources, "
                                "cached_training_set; cached_training_set(bundled_training_sources(), "
                                "MAX_WINDOWS_PER_JOB, Path(sys.argv[1]))",
                                str(root / "classifier" / "cache")], check=True)
            m = measure([py, "-m", "wattclass.cli", "nightly", "--data-root", str(root), "--date", a.date,
                         "--workers", str(a.workers), "--json"])
        s = json.loads(m.pop("stdout"))
        out["nightly"] = {**m, "base_training_cache": "cold" if a.cold_cache else "warm",
                          "command_seconds": s.get("seconds"),
                          "feature_seconds": s.get("feature_seconds"),
                          "status": s.get("status"), "jobs": s.get("jobs"), "windows": s.get("windows"),
                          "retrain": s.get("retrain"), "table_entries": (s.get("table") or {}).get("entries")}
    scanned = (out.get("features") or out.get("nightly") or {}).get("windows")  # rows both engines read
    for k in ("duckdb", "duckdb-labels", "duckdb-rules", "features"):
        if k in out and scanned:
            wall = out[k]["query_wall_s"] if k.startswith("duckdb") else out[k]["stage_wall_s"]
            out[k]["windows_per_s"] = round(scanned / max(wall, 1e-9))
    # Issue 15: feature stage <= 1.2x, classify and nightly end to end <= 2x the DuckDB group-by;
    # against both anchors (the classic 97 aggregates, and just the aggregates the labels need).
    ratios: dict[str, float] = {}
    for anchor in ("duckdb", "duckdb-labels", "duckdb-rules"):
        for stage in ("features", "classify", "nightly"):
            if anchor in out and stage in out:
                ratios[f"{stage}_vs_{anchor}"] = round(out[stage]["wall_s"] / out[anchor]["wall_s"], 2)
    out["wall_ratios"] = ratios
    if "nightly" in out:
        out["target_nightly_under_600s"] = out["nightly"]["wall_s"] < 600
        out["target_peak_under_8gib"] = out["nightly"]["peak_rss_tree_mib"] < 8192
    return emit(out)


if __name__ == "__main__":
    sys.exit(main())
