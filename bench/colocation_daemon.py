"""The telemetry daemon itself on the H200 co-location recording: per-job energy of each pair.

Why: ``colocation_analyse.py`` applies the model (``telemetry.sharing``) to aggregates it computes
itself; this plays the raw recording (``bench/colocation_collect.py`` output) through the real
daemon (window builder, splitter, per-process samples mapped to jobs, idle estimate, WAL,
Parquet), one job per workload process, and prints each pair's share of the first workload as
the daemon attributed it, next to the references of ``colocation_analyse.py``. CPU only.

    python bench/colocation_daemon.py docs/measurements/h200-colocation-2026-11-30
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from colocation_analyse import RAMP_S, analyse

from wattclass.gpu.base import GpuBackend, GpuInfo, GpuProcess, GpuSample, ProcessUtil
from wattclass.telemetry.daemon import Daemon, DaemonConfig


class RecordingBackend(GpuBackend):
    """One GPU played from ``samples.jsonl`` on a virtual clock; a worker process is a job (its
    name) only while its scenario runs, as a Slurm job would be."""

    name = "recording"

    def __init__(self, folder: Path) -> None:
        self.samples = [json.loads(x) for x in (folder / "samples.jsonl").read_text().splitlines() if x]
        self.runs = [json.loads(x) for x in (folder / "runs.jsonl").read_text().splitlines() if x]
        self.meta = json.loads((folder / "meta.json").read_text())
        self.ts = [s["ts_e"] for s in self.samples]
        self.t = self.ts[0]
        self.i = 0

    def gpus(self) -> list[GpuInfo]:
        return [GpuInfo(0, self.meta["uuid"], self.meta["device"], "0", 143771.0, 1980.0, 700.0, 200.0,
                        700.0, False)]

    def _at(self) -> dict[str, Any]:
        self.i = max(0, bisect.bisect_right(self.ts, self.t) - 1)
        return self.samples[self.i]

    def sample(self, index: int) -> GpuSample:
        s = self._at()
        return GpuSample(s["ts_e"], None, s["power_mw"] / 1e3, 700.0, s["util_gpu"], s["util_mem"],
                         s["sm_clock_mhz"], None, None, s["temp_c"], None)

    def energy_mj(self, index: int) -> int | None:
        return int(self._at()["energy_mj"])

    def _jobs_now(self, ts: float) -> dict[int, str]:
        for r in self.runs:
            if r["start"] <= ts <= r["end"]:
                return {pid: f"{w}" for pid, w in zip(r["pids"], r["workers"], strict=True)}
        return {}

    def processes(self, index: int) -> list[GpuProcess]:
        s = self._at()
        jobs = self._jobs_now(s["ts_e"])
        return [GpuProcess(pid, jobs[pid], "u", mib) for pid, mib in s.get("procs", []) if pid in jobs]

    def process_utilization(self, index: int, since_us: int) -> list[ProcessUtil]:
        out = []
        for s in self.samples[: self.i + 1]:
            for pid, ts_us, sm, mem in s.get("putil", []):
                if ts_us > since_us:
                    out.append(ProcessUtil(pid, ts_us, float(sm), float(mem)))
        return out

    def now(self) -> float:
        return self.t

    def sleep_until(self, t: float, stop: threading.Event) -> None:
        self.t = max(self.t, t)

    def exhausted(self) -> bool:
        return self.t > self.ts[-1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    args = ap.parse_args()
    be = RecordingBackend(args.folder)
    first = be.samples[max(0, bisect.bisect_right(be.ts, math.ceil(be.ts[0])) - 1)]  # the first poll's
    with tempfile.TemporaryDirectory() as tmp:
        d = Daemon(be, DaemonConfig(data_root=Path(tmp), host="h200", period_s=10.0, poll_s=1.0,
                                    proc_root=Path(tmp) / "noproc"))
        d.run()
        t = pd.concat([pd.read_parquet(f) for f in sorted((Path(tmp) / "telemetry").rglob("*.parquet"))])
    counter_j = (be.samples[-1]["energy_mj"] - first["energy_mj"]) / 1e3
    print(f"daemon rows {len(t)}, energy {t.energy_j.sum():.3f} J vs counter delta {counter_j:.3f} J "
          f"over the polls, shared windows {int((t.shared_jobs > 1).sum())}")
    ref = {p["pair"]: p for p in analyse(args.folder)["pairs"]}
    t["mid"] = t.ts_start + (t.ts_end - t.ts_start) / 2
    print("| pair (a+b) | daemon share of a | analysis (wattclass) | Shapley t | solo t |")
    print("|---|---|---|---|---|")
    for r in be.runs:
        if len(r["workers"]) != 2:
            continue
        lo = pd.Timestamp(r["start"] + RAMP_S, unit="s", tz="UTC")
        hi = pd.Timestamp(r["end"], unit="s", tz="UTC")
        w = t[(t.mid >= lo) & (t.mid <= hi) & (t.shared_jobs == 2)]
        a, b = r["workers"]
        ea, eb = w[w.job_id == a].energy_j.sum(), w[w.job_id == b].energy_j.sum()
        p = ref["+".join(r["kinds"])]
        print(f"| {'+'.join(r['kinds'])} | {100 * ea / (ea + eb):.0f} ({len(w) // 2} windows) | "
              f"{100 * p['methods']['wattclass']:.0f} | {100 * p['refs']['shapley_time']:.0f} | "
              f"{100 * p['refs']['solo_time']:.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
