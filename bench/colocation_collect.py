"""Co-location measurement on one GPU: known workloads alone and in pairs, raw NVML samples.

Why: energy attribution on a shared GPU (docs/shared-gpus.md) splits a GPU's counter delta among
the jobs on it from per-process SM utilisation, memory used and a static share. Power is not
additive, so the split has no ground truth; it is compared with two references computed from
runs of the same workloads alone and together: the solo-energy-proportional split and the
Shapley split. This script only records; ``bench/colocation_analyse.py`` computes everything on
a CPU afterwards.

Each workload is its own process (a worker, identified by its pid as NVML sees it), started once
and kept warm: it imports torch, allocates, warms up, then waits on stdin for ``run DUR T0``
(busy-wait to T0, work for DUR seconds, report its progress as (time, iterations) points). A
sampler thread in this process polls NVML every ``--poll`` seconds: the energy counter, power,
device utilisation, GPM SM/DRAM activity, the compute process list with memory used, and the
per-process utilisation samples (``nvmlDeviceGetProcessesUtilizationInfo``, falling back to
``nvmlDeviceGetProcessUtilization``) since the last poll.

Read-only towards the GPU's settings: never changes power limits, clocks, MIG or persistence.

Output in ``--out``: ``samples.jsonl`` (one line per poll), ``runs.jsonl`` (one line per
scenario: the pids, workloads, start/end and each worker's progress points), ``meta.json``.

``--fake`` checks the script on a machine without a GPU: a fake NVML and tiny CPU workloads.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

# Workers by name -> workload kind. Two of the heavy kinds so a pair of the same kind can run.
WORKERS = {"gemm_a": "gemm", "gemm_b": "gemm", "copy_a": "copy", "copy_b": "copy",
           "decode": "decode", "idle": "idle"}
SOLOS = [("gemm_a",), ("copy_a",), ("decode",), ("idle",)]
PAIRS = [("gemm_a", "copy_a"), ("gemm_a", "gemm_b"), ("copy_a", "copy_b"), ("gemm_a", "idle"),
         ("decode", "gemm_a"), ("decode", "copy_a"), ("copy_a", "idle")]


# ----------------------------------------------------------------------------- worker side

def _worker(kind: str, fake: bool) -> None:
    """One workload process: build, warm up, then serve ``run`` commands from stdin."""
    import torch

    dev = "cpu" if fake else "cuda"
    small = fake

    def sync() -> None:
        if not fake:
            torch.cuda.synchronize()

    if kind == "gemm":  # tensor-core bound: bf16 8192^3 matmuls
        n = 256 if small else 8192
        a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        c = torch.empty(n, n, device=dev, dtype=torch.bfloat16)

        def step() -> None:
            for _ in range(8):
                torch.matmul(a, b, out=c)
    elif kind == "copy":  # HBM bound: a 4 GB device-to-device copy
        n = 2**20 if small else 2**30  # float32 elements: 4 GiB
        src = torch.ones(n, device=dev, dtype=torch.float32)
        dst = torch.empty_like(src)

        def step() -> None:
            for _ in range(4):
                dst.copy_(src)
    elif kind == "decode":  # decode-like: batch-1 GEMVs over 1 GiB of weights, launch bound
        d = 256 if small else 8192
        ws = [torch.randn(d, d, device=dev, dtype=torch.bfloat16) for _ in range(8)]
        x = torch.randn(1, d, device=dev, dtype=torch.bfloat16)

        def step() -> None:
            y = x
            for w in ws:
                y = torch.nn.functional.gelu(y @ w)
    elif kind == "idle":  # idle-ish: holds 2 GiB, a tiny kernel every 50 ms
        hold = torch.ones(2**19 if small else 2**29, device=dev)
        tiny = torch.zeros(1024, device=dev)

        def step() -> None:
            tiny.add_(1.0)
            time.sleep(0.05)
        _ = hold
    else:
        raise SystemExit(f"unknown workload kind {kind!r}")

    t_end = time.time() + (0.2 if small else 1.5)  # warm-up: kernels compiled, clocks up
    while time.time() < t_end:
        step()
    sync()
    print(json.dumps({"ready": kind, "pid": os.getpid()}), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd or cmd[0] == "quit":
            break
        dur, t0 = float(cmd[1]), float(cmd[2])
        while time.time() < t0:
            time.sleep(0.001)
        points = [(time.time(), 0)]
        it = 0
        last = points[0][0]
        while True:
            step()
            it += 1
            now = time.time()
            if now - last >= 0.1 or now >= t0 + dur:
                sync()
                now = time.time()
                points.append((now, it))
                last = now
                if now >= t0 + dur:
                    break
        print(json.dumps({"done": kind, "points": points}), flush=True)


# ----------------------------------------------------------------------------- NVML side

class FakeNvml:
    """Just enough NVML for ``--fake``: a counter rising with the number of busy workers."""

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            super().__init__(value)
            self.value = value

    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1

    def __init__(self) -> None:
        self.t0 = time.time()
        self.e_mj = 0.0
        self.t_last = self.t0
        self.busy: set[int] = set()

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetHandleByIndex(self, i: int) -> int: return i
    def nvmlDeviceGetName(self, h: int) -> str: return "Fake GPU"
    def nvmlDeviceGetUUID(self, h: int) -> str: return "GPU-fake"
    def nvmlSystemGetDriverVersion(self) -> str: return "0.0"

    def _power(self) -> float:
        return 80.0 + 300.0 * min(len(self.busy), 2) ** 0.6

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:
        now = time.time()
        self.e_mj += self._power() * (now - self.t_last) * 1e3
        self.t_last = now
        return int(self.e_mj)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int: return int(self._power() * 1e3)
    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return type("U", (), {"gpu": 50 * len(self.busy), "memory": 10})()
    def nvmlDeviceGetClockInfo(self, h: int, k: int) -> int: return 1980
    def nvmlDeviceGetTemperature(self, h: int, k: int) -> int: return 40

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        return [type("P", (), {"pid": p, "usedGpuMemory": 2**30})() for p in sorted(self.busy)]

    def nvmlDeviceGetProcessesUtilizationInfo(self, h: int, ts: int) -> list[Any]:
        now = int(time.time() * 1e6)
        return [type("S", (), {"pid": p, "timeStamp": now, "smUtil": 50, "memUtil": 20})()
                for p in sorted(self.busy)]


def _sampler(nv: Any, h: Any, poll_s: float, stop: threading.Event, out: Any, meta: dict[str, Any]
             ) -> None:
    """Poll every ``poll_s`` until ``stop``; each poll one JSON line (flushed)."""
    last_ts = 0
    api = None
    gpm_prev = None
    gpm_bufs: list[Any] = []
    if hasattr(nv, "nvmlGpmSampleAlloc"):
        try:
            if nv.nvmlGpmQueryDeviceSupport(h).isSupportedDevice:
                gpm_bufs = [nv.nvmlGpmSampleAlloc() for _ in range(2)]
        except Exception as exc:
            meta["gpm_error"] = str(exc)
    k = 0
    t_next = time.time()
    while not stop.is_set():
        t_next += poll_s
        rec: dict[str, Any] = {"ts": time.time()}
        rec["energy_mj"] = nv.nvmlDeviceGetTotalEnergyConsumption(h)
        rec["ts_e"] = time.time()
        rec["power_mw"] = nv.nvmlDeviceGetPowerUsage(h)
        u = nv.nvmlDeviceGetUtilizationRates(h)
        rec["util_gpu"], rec["util_mem"] = u.gpu, u.memory
        rec["sm_clock_mhz"] = nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)
        rec["temp_c"] = nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)
        try:
            procs = nv.nvmlDeviceGetComputeRunningProcesses(h)
            rec["procs"] = [[int(p.pid), (p.usedGpuMemory or 0) / 2**20] for p in procs]
        except Exception as exc:
            rec["procs_error"] = str(exc)
        samples: list[Any] = []
        for name in ("nvmlDeviceGetProcessesUtilizationInfo", "nvmlDeviceGetProcessUtilization"):
            if api not in (None, name) or not hasattr(nv, name):
                continue
            try:
                samples = getattr(nv, name)(h, last_ts)
                api = name
                break
            except Exception as exc:
                code = getattr(exc, "value", None)
                if code == 6:  # NVML_ERROR_NOT_FOUND: nothing since last_ts
                    api = name
                    break
                rec.setdefault("putil_error", {})[name] = str(exc)
        rec["putil"] = [[int(s.pid), int(s.timeStamp), int(s.smUtil), int(s.memUtil)] for s in samples]
        if samples:
            last_ts = max(last_ts, max(int(s.timeStamp) for s in samples))
        if gpm_bufs:
            buf = gpm_bufs[k % 2]
            k += 1
            try:
                nv.nvmlGpmSampleGet(h, buf)
                if gpm_prev is not None:
                    rec["gpm"] = _gpm(nv, gpm_prev, buf)
                gpm_prev = buf
            except Exception as exc:
                rec["gpm_error"] = str(exc)
        meta["putil_api"] = api
        out.write(json.dumps(rec) + "\n")
        out.flush()
        stop.wait(max(0.0, t_next - time.time()))


def _gpm(nv: Any, first: Any, second: Any) -> dict[str, float | None]:
    ids = {"sm_util_pct": 2, "sm_occupancy_pct": 3, "tensor_util_pct": 5, "dram_bw_util_pct": 10}
    mg = nv.c_nvmlGpmMetricsGet_t()
    mg.version = nv.NVML_GPM_METRICS_GET_VERSION
    mg.numMetrics = len(ids)
    mg.sample1, mg.sample2 = first, second
    for i, mid in enumerate(ids.values()):
        mg.metrics[i].metricId = mid
    nv.nvmlGpmMetricsGet(mg)
    return {k: (float(mg.metrics[i].value) if mg.metrics[i].nvmlReturn == 0 else None)
            for i, k in enumerate(ids)}


# ----------------------------------------------------------------------------- driver

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/out")))
    ap.add_argument("--dur", type=float, default=10.0, help="seconds per scenario")
    ap.add_argument("--gap", type=float, default=1.5, help="seconds between scenarios")
    ap.add_argument("--poll", type=float, default=0.5, help="sampler period, seconds")
    ap.add_argument("--fake", action="store_true", help="CPU check: fake NVML, tiny workloads")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        _worker(args.worker, args.fake)
        return 0

    args.out.mkdir(parents=True, exist_ok=True)
    if args.fake:
        nv: Any = FakeNvml()
    else:
        import pynvml as nv
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    meta: dict[str, Any] = {
        "device": str(nv.nvmlDeviceGetName(h)), "uuid": str(nv.nvmlDeviceGetUUID(h)),
        "driver": str(nv.nvmlSystemGetDriverVersion()), "date_utc": time.strftime(
            "%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "dur_s": args.dur, "poll_s": args.poll,
        "host_cpus": os.cpu_count(), "load_avg": os.getloadavg(),
    }
    t_start = time.time()
    procs: dict[str, subprocess.Popen[str]] = {}
    for name, kind in WORKERS.items():
        cmd = [sys.executable, __file__, "--worker", kind] + (["--fake"] if args.fake else [])
        procs[name] = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                       bufsize=1)
    pids: dict[str, int] = {}
    for name, p in procs.items():
        assert p.stdout is not None
        line = p.stdout.readline()
        if not line:
            raise SystemExit(f"worker {name} died during start-up (rc {p.wait()})")
        pids[name] = int(json.loads(line)["pid"])
    meta["startup_s"] = time.time() - t_start
    meta["pids"] = pids
    print(f"workers ready in {meta['startup_s']:.1f} s: {pids}", flush=True)

    stop = threading.Event()
    samples = open(args.out / "samples.jsonl", "w", encoding="utf-8")  # noqa: SIM115
    th = threading.Thread(target=_sampler, args=(nv, h, args.poll, stop, samples, meta), daemon=True)
    th.start()
    runs = open(args.out / "runs.jsonl", "w", encoding="utf-8")  # noqa: SIM115
    scenarios: list[tuple[str, ...]] = [(), *SOLOS, *PAIRS, ("gemm_a",)]  # last: drift check
    try:
        time.sleep(args.gap)
        for sc in scenarios:
            t0 = time.time() + 0.3
            if args.fake:
                nv.busy = {pids[w] for w in sc}
            for w in sc:
                assert procs[w].stdin is not None
                procs[w].stdin.write(f"run {args.dur} {t0}\n")
            progress = {}
            if sc:
                for w in sc:
                    assert procs[w].stdout is not None
                    progress[w] = json.loads(procs[w].stdout.readline())["points"]
            else:
                time.sleep(t0 + args.dur - time.time())
            t1 = time.time()
            if args.fake:
                nv.busy = set()
            rec = {"scenario": "+".join(WORKERS[w] for w in sc) or "gpu_idle", "workers": list(sc),
                   "pids": [pids[w] for w in sc], "kinds": [WORKERS[w] for w in sc],
                   "start": t0, "end": t1, "progress": progress}
            runs.write(json.dumps(rec) + "\n")
            runs.flush()
            print(f"{rec['scenario']:<14} {t1 - t0:5.1f} s", flush=True)
            time.sleep(args.gap)
    finally:
        stop.set()
        th.join(5)
        for p in procs.values():
            if p.stdin is not None:
                p.stdin.write("quit\n")
                p.stdin.close()
        for p in procs.values():
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        meta["total_s"] = time.time() - t_start
        (args.out / "meta.json").write_text(json.dumps(meta, indent=1))
        samples.close()
        runs.close()
        nv.nvmlShutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
