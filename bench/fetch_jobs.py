"""Fetching a night's job records: ``sacct --json`` (command client) vs ``pyslurm.db`` (issue 10).

Starts a real one-node cluster with accounting (MariaDB + slurmdbd, tests/slurm_cluster.py) on
the Slurm under test (``WATTCLASS_TEST_SLURM``; pyslurm needs 25.11), submits ``--jobs`` tiny
jobs as job arrays and lets them finish (after ``--max-wait-s`` the rest are cancelled, so every
record is final; it says how many ran), then fetches every record of the window ``--repeat`` times with each
backend, alternating, each fetch in a fresh Python process so its peak memory is its own:
wall time and peak RSS (the Python process, plus the sacct child for the command client).
Run it with an interpreter that has pyslurm (else only sacct is measured).

    WATTCLASS_TEST_SLURM=/opt/slurm-25.11 python bench/fetch_jobs.py [--jobs 10000] [--json]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from slurm_cluster import SlurmCluster


def worker(backend: str, start: int, end: int) -> None:
    """One fetch in this process; prints seconds, records, peak RSS (MiB) self and children."""
    t0 = time.perf_counter()
    lo, hi = dt.datetime.fromtimestamp(start, dt.UTC), dt.datetime.fromtimestamp(end, dt.UTC)
    if backend == "sacct":
        from wattclass.slurm.commands import CommandSlurmClient

        recs = CommandSlurmClient(timeout=600).jobs(lo, hi)
    else:
        from wattclass.slurm.pyslurm_client import PySlurmClient

        recs = PySlurmClient().jobs(lo, hi)
    secs = time.perf_counter() - t0
    me = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(json.dumps({"seconds": secs, "records": len(recs), "rss_mib": me, "child_rss_mib": kids,
                      "gpus": sum(r.gpus or 0 for r in recs)}))


def has_pyslurm() -> bool:
    from wattclass.slurm.commands import installed_pyslurm_version

    return installed_pyslurm_version() is not None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=10000)
    ap.add_argument("--array-size", type=int, default=1000)
    ap.add_argument("--max-wait-s", type=float, default=600)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--worker", nargs=3, metavar=("BACKEND", "START", "END"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a.worker[0], int(a.worker[1]), int(a.worker[2]))
        return 0

    root = Path(tempfile.mkdtemp(prefix="wattclass-bench-fetch-"))
    root.chmod(0o755)
    c = SlurmCluster(root, accounting=True, cpus=64,
                     extra_conf=[f"MaxArraySize={a.array_size + 1}", "MaxJobCount=50000", "MinJobAge=2"])
    t_start = int(time.time()) - 5
    out: dict[str, object] = {"slurm": c.install.version}
    try:
        c.start(timeout=60)
        t0 = time.monotonic()
        submitted = 0
        while submitted < a.jobs and time.monotonic() - t0 < a.max_wait_s / 2:
            n = min(a.array_size, a.jobs - submitted)
            c.sbatch("-o", "/dev/null", "-J", f"tiny-{submitted}", f"--array=0-{n - 1}", "--gres=gpu:1")
            submitted += n
        while time.monotonic() - t0 < a.max_wait_s:
            left = c.run(["squeue", "-h", "-r", "-o", "%i"], timeout=120).split()
            if not left:
                break
            time.sleep(5)
        out["submitted"] = submitted
        out["run_seconds"] = round(time.monotonic() - t0, 1)
        left = c.run(["squeue", "-h", "-r", "-o", "%i"], timeout=120).split()
        out["finished"] = submitted - len(left)
        if left:  # out of time: the rest are cancelled, so every record is in a final state
            c.run(["scancel", "--user=root"], timeout=120)
            while c.run(["squeue", "-h", "-r", "-o", "%i"], timeout=120).split():
                time.sleep(2)
        time.sleep(5)  # slurmdbd writes asynchronously
        t_end = int(time.time()) + 5
        backends = ["sacct", "pyslurm"] if has_pyslurm() else ["sacct"]
        runs: dict[str, list[dict[str, float]]] = {b: [] for b in backends}
        env = dict(c.env)
        for i in range(a.repeat):
            for b in (backends if i % 2 == 0 else backends[::-1]):
                p = subprocess.run([sys.executable, __file__, "--worker", b, str(t_start), str(t_end)],
                                   env=env, capture_output=True, text=True, timeout=900, check=True)
                runs[b].append(json.loads(p.stdout))
        for b, rs in runs.items():
            out[b] = {"records": rs[0]["records"], "gpus": rs[0]["gpus"],
                      "median_s": round(statistics.median(r["seconds"] for r in rs), 2),
                      "runs_s": [round(r["seconds"], 2) for r in rs],
                      "peak_rss_mib": round(max(r["rss_mib"] for r in rs), 1),
                      "peak_child_rss_mib": round(max(r["child_rss_mib"] for r in rs), 1)}
        if len({out[b]["records"] for b in backends}) != 1:  # type: ignore[index]
            raise RuntimeError(f"backends disagree on the record count: {out}")
    finally:
        c.stop()
        shutil.rmtree(root, ignore_errors=True)
    out["load_avg_1m"] = round(os.getloadavg()[0], 2)
    if a.json:
        print(json.dumps(out, indent=2))
    else:
        for b in ("sacct", "pyslurm"):
            r = out.get(b)
            if isinstance(r, dict):
                print(f"{b}: {r['records']} records in {r['median_s']} s (median of {a.repeat}), "
                      f"peak RSS {r['peak_rss_mib']} MiB + child {r['peak_child_rss_mib']} MiB")
        print(f"[{out['submitted']} jobs submitted, {out['finished']} ran to completion in "
              f"{out['run_seconds']} s (the rest cancelled while pending); Slurm {out['slurm']}; "
              f"load {out['load_avg_1m']}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
