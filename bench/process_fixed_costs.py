"""Benchmark: two fixed costs of every wattclass process, each with and without its fix (issue 15).

1. ``blas``: CPU seconds of ``import numpy, scipy.linalg`` in a fresh interpreter, with the
   environment's ``OPENBLAS_NUM_THREADS`` unset (OpenBLAS starts a thread pool per library, whose
   threads spin at start-up) and set to 1 (what ``import wattclass`` sets unless told otherwise).
   The child imports no wattclass, so the variable is what the variant says.
2. ``exit``: wall and CPU seconds of a fresh interpreter's exit after importing what a nightly
   imports (pandas, pyarrow, DuckDB, SciPy's special functions and optimiser, LightGBM's core),
   with Python's own shutdown collection and with ``gc.freeze()`` at exit
   (``wattclass.cli.skip_collection_at_exit``).

Each variant runs ``--rounds`` times, alternating; medians are printed with each run and the
1-minute load average before it.

  python bench/process_fixed_costs.py --rounds 7
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Any

from benchstamp import emit

_BLAS = ("import resource, json; import numpy, scipy.linalg; r = resource.getrusage(resource.RUSAGE_SELF); "
         "print(json.dumps({'cpu_s': r.ru_utime + r.ru_stime}))")
# The child prints the time and its CPU when its work is done; the parent adds what the exit took.
_EXIT = ("import os, sys, time, resource, json\n"
         "os.environ['OPENBLAS_NUM_THREADS'] = '1'\n"
         "import numpy, pandas, pyarrow, duckdb, scipy.special\n"
         "from wattclass.classifier import lgbload; lgbload.core()\n"
         "if sys.argv[1] == 'freeze':\n"
         "    from wattclass.cli import skip_collection_at_exit; skip_collection_at_exit()\n"
         "r = resource.getrusage(resource.RUSAGE_SELF)\n"
         "print(json.dumps({'t': time.time(), 'cpu_s': r.ru_utime + r.ru_stime}), flush=True)\n")


def _run(code: str, env: dict[str, str], *args: str) -> dict[str, Any]:
    import resource
    import time

    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True,
                         check=True).stdout
    t_end = time.time()
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    child = json.loads(out.strip().splitlines()[-1])
    total_cpu = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
    return {"child": child, "total_cpu_s": total_cpu, "t_end": t_end}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    base = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    runs: list[dict[str, Any]] = []
    for r in range(max(1, a.rounds)):
        for variant, env in (("blas_pool", base), ("blas_one_thread", {**base, "OPENBLAS_NUM_THREADS": "1"})):
            load = os.getloadavg()[0]
            res = _run(_BLAS, env)
            runs.append({"round": r + 1, "variant": variant, "import_cpu_s": round(res["total_cpu_s"], 3),
                         "load_1m": round(load, 2)})
        for variant in ("exit_collect", "exit_freeze"):
            load = os.getloadavg()[0]
            res = _run(_EXIT, base, "freeze" if variant == "exit_freeze" else "plain")
            runs.append({"round": r + 1, "variant": variant,
                         "exit_wall_s": round(res["t_end"] - res["child"]["t"], 3),
                         "exit_cpu_s": round(res["total_cpu_s"] - res["child"]["cpu_s"], 3),
                         "load_1m": round(load, 2)})
    median: dict[str, dict[str, float]] = {}
    for v in ("blas_pool", "blas_one_thread", "exit_collect", "exit_freeze"):
        rows = [x for x in runs if x["variant"] == v]
        keys = [k for k in rows[0] if k.endswith("_s")]
        median[v] = {k: round(statistics.median(x[k] for x in rows), 3) for k in keys}
    return emit({"benchmark": "fixed costs of a wattclass process: BLAS thread pools, interpreter exit",
                 "rounds": runs, "median": median})


if __name__ == "__main__":
    sys.exit(main())
