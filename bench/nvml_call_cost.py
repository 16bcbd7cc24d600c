"""Probe: the CPU each per-poll NVML call costs at 1 Hz, with the calls in a new random order
every second (issue 15, the daemon's cheap poll).

Why shuffled: ``daemon_lifecycle.py --nvml-probe`` times the calls in one fixed order, and its
first call (the FieldValues with the 1 s average power) came out at 95 us of CPU against 18 us
for the same call without the average, which is the daemon's single largest cheap cost, if it is
the field's and not the cost of being the first call after a second of idleness. Here every call
takes every place in turn, so the report can tell the two apart (``by_position``), and it times
candidate replacements beside the calls the daemon makes: nvmlDeviceGetPowerUsage (the 1 s
average on Ampere and later) for the average field, MemoryInfo v2 for v1. It also times the
daemon's own ``NvmlBackend.sample`` (all its cheap calls and its Python) as one unit, in its own
random place.

  PYTHONPATH=. python3 bench/nvml_call_cost.py --seconds 240 > cost.json   (on a GPU machine,
  from the repository root; a load on the GPU is the caller's: ``bench/gpu_load.py``)

Read-only: nothing is set on the GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import sys
import time
from typing import Any

#: The daemon's calls under the names this probe reports them by, from ``daemon_lifecycle``'s
#: probe (the same calls, named there as its earlier reports named them).
_DAEMON_CALLS = {
    "FieldValues[instant,limit,average]": "FieldValues[power_instant,limit,average]",
    "FieldValues[instant,limit]": "FieldValues[power_instant,limit] (before issue 15's split)",
    "UtilizationRates": "UtilizationRates",
    "ClockInfo[SM]": "ClockInfo[SM]",
    "ClockInfo[MEM]": "ClockInfo[MEM]",
    "CurrentClocksEventReasons": "CurrentClocksEventReasons",
    "Temperature": "Temperature",
    "MemoryInfo": "MemoryInfo",
}


def calls(nv: Any) -> dict[str, Any]:
    """The cheap poll's NVML calls as ``wattclass.gpu.nvml`` makes them, and the candidates."""
    from daemon_lifecycle import _probe_calls  # type: ignore[import-not-found]  # bench/ beside

    daemon = _probe_calls(nv)
    out: dict[str, Any] = {name: daemon[theirs] for name, theirs in _DAEMON_CALLS.items()}
    avg = [getattr(nv, "NVML_FI_DEV_POWER_AVERAGE", 185)]
    out["FieldValues[average]"] = lambda h: nv.nvmlDeviceGetFieldValues(h, avg)
    out["PowerUsage"] = nv.nvmlDeviceGetPowerUsage
    if hasattr(nv, "nvmlMemory_v2"):
        out["MemoryInfo[v2]"] = lambda h: nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=int, default=240)
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    import pynvml as nv
    from benchstamp import emit  # type: ignore[import-not-found]  # bench/ beside this file

    from wattclass.gpu.nvml import NvmlBackend

    rng = random.Random(a.seed)
    backend = NvmlBackend()
    nv.nvmlInit()  # counted: NVML refcounts its init, the backend holds its own
    h = nv.nvmlDeviceGetHandleByIndex(a.gpu)
    fns = calls(nv)
    fns["NvmlBackend.sample (the daemon's cheap poll, whole)"] = lambda _h: backend.sample(a.gpu)
    rec: dict[str, list[tuple[int, float, float]]] = {k: [] for k in fns}
    names = list(fns)
    t = time.time() + 1.0
    for _ in range(a.seconds):
        time.sleep(max(0.0, t - time.time()))
        t += 1.0
        rng.shuffle(names)
        for pos, name in enumerate(names):
            c0, w0 = time.thread_time_ns(), time.perf_counter_ns()
            with contextlib.suppress(nv.NVMLError):
                fns[name](h)
            rec[name].append((pos, (time.thread_time_ns() - c0) / 1e3, (time.perf_counter_ns() - w0) / 1e3))
    nv.nvmlShutdown()

    def stats(xs: list[float]) -> dict[str, float]:
        if not xs:
            return {}
        return {"n": len(xs), "mean": round(statistics.fmean(xs), 1),
                "median": round(statistics.median(xs), 1),
                "p90": round(sorted(xs)[int(0.9 * (len(xs) - 1))], 1)}

    report: dict[str, Any] = {
        "probe": "NVML per-call CPU (us) at 1 Hz, order shuffled every second",
        "seconds": a.seconds, "gpu": a.gpu,
        "gpu_name": str(backend.gpus()[a.gpu].model) if backend.gpus() else None,
        "calls": {}, "by_position": {},
    }
    for name, xs in rec.items():
        report["calls"][name] = {"cpu_us": stats([c for _, c, _ in xs]),
                                 "wall_us": stats([w for _, _, w in xs]),
                                 "cpu_us_when_first": stats([c for p, c, _ in xs if p == 0]),
                                 "cpu_us_when_not_first": stats([c for p, c, _ in xs if p > 0])}
    for pos in range(len(names)):
        report["by_position"][str(pos)] = stats([c for xs in rec.values() for p, c, _ in xs if p == pos])
    return emit(report)


if __name__ == "__main__":
    sys.exit(main())
