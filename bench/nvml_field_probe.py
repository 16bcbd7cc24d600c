"""Probe: which non-GPM NVML fields an H200 answers, and whether they tell memory- from compute-bound work.

Issue 13's round 8 bounded what the recorded NVML fields can tell without GPM (util, util_mem,
power, clocks, framebuffer, temperature, clock events): no feature set reached 0.95 on kinds of
work never seen. Two fields were never recorded: the HBM temperature (``NVML_FI_DEV_MEMORY_TEMP``)
and power by scope (``NVML_FI_DEV_POWER_INSTANT`` / ``_AVERAGE`` with scope GPU, MODULE or MEMORY).
A memory-scope power would measure the mechanism itself (HBM traffic costs DRAM power). This
script asks the driver for each field, read-only, at 5 Hz through phases of known kind (idle, a
bf16 GEMM, an HBM copy, a random gather, an fp32 FMA chain) on one GPU, and prints per phase each
field's return code and mean. GPM's DRAM bandwidth is read beside as the phases' truth.

  PYTHONPATH=. python3 bench/nvml_field_probe.py --gpu 0 --out probe.json   (from the repository
  root, on a GPU machine; needs torch; field values decoded as the daemon decodes them)

Nothing is set on the GPU (no limits, clocks or modes).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

#: (name, field id, scope id): the fields asked for, with their scopes where they take one.
FIELDS: tuple[tuple[str, int, int], ...] = (
    ("memory_temp_c", 82, 0),
    ("power_instant_gpu_mw", 186, 0),
    ("power_instant_module_mw", 186, 1),
    ("power_instant_memory_mw", 186, 2),
    ("power_average_gpu_mw", 185, 0),
    ("power_average_module_mw", 185, 1),
    ("power_average_memory_mw", 185, 2),
    ("energy_mj", 191, 0),
)
PHASE_S = 10.0
POLL_S = 0.2


class Sampler(threading.Thread):
    """Polls the fields (and GPM DRAM bandwidth, utilisation, temperature) every POLL_S."""

    def __init__(self, handle: Any) -> None:
        super().__init__(daemon=True)
        self.h = handle
        self.phase = "start"
        self.rows: list[dict[str, Any]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        import pynvml as n

        from wattclass.gpu.nvml import field_value

        ids = [(fid, scope) for _, fid, scope in FIELDS]
        gpm_prev = None
        while not self.stop.is_set():
            row: dict[str, Any] = {"t": time.time(), "phase": self.phase}
            try:
                vals = n.nvmlDeviceGetFieldValues(self.h, ids)
                for (name, _, _), v in zip(FIELDS, vals, strict=True):
                    row[name + "_ret"] = int(v.nvmlReturn)
                    row[name] = field_value(n, v)  # the daemon's decoding: None if not answered
            except n.NVMLError as exc:
                row["fields_error"] = str(exc)
            u = n.nvmlDeviceGetUtilizationRates(self.h)
            row.update(util_gpu=u.gpu, util_mem=u.memory,
                       temp_c=n.nvmlDeviceGetTemperature(self.h, n.NVML_TEMPERATURE_GPU),
                       power_mw=n.nvmlDeviceGetPowerUsage(self.h))
            try:
                s = n.nvmlGpmSampleAlloc()
                n.nvmlGpmSampleGet(self.h, s)
                if gpm_prev is not None:
                    mg = n.c_nvmlGpmMetricsGet_t()
                    mg.version = n.NVML_GPM_METRICS_GET_VERSION
                    mg.numMetrics = 1
                    mg.sample1, mg.sample2 = gpm_prev, s
                    mg.metrics[0].metricId = n.NVML_GPM_METRIC_DRAM_BW_UTIL
                    n.nvmlGpmMetricsGet(mg)
                    row["gpm_dram_bw_util"] = mg.metrics[0].value
                    n.nvmlGpmSampleFree(gpm_prev)
                gpm_prev = s
            except (n.NVMLError, AttributeError) as exc:
                row["gpm_error"] = str(exc)[:80]
            self.rows.append(row)
            time.sleep(POLL_S)


def _phases(dev: str) -> list[tuple[str, Callable[[], None] | None]]:
    import torch

    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    big = torch.empty(2 << 30, device=dev, dtype=torch.uint8)  # 2 GiB
    dst = torch.empty_like(big)
    table = torch.randn(1 << 27, device=dev)  # 512 MiB of floats
    idx = torch.randint(0, table.numel(), (1 << 25,), device=dev)
    x = torch.randn(1 << 20, device=dev)

    def gemm() -> None:
        a @ a

    def copy() -> None:
        dst.copy_(big)

    def gather() -> None:
        table.index_select(0, idx)

    def fma() -> None:
        y = x
        for _ in range(64):
            y = y * 1.0001 + 0.5
    return [("idle", None), ("bf16_gemm", gemm), ("hbm_copy", copy), ("idle2", None),
            ("random_gather", gather), ("fp32_fma_chain", fma), ("idle3", None)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    import pynvml as n
    import torch

    n.nvmlInit()
    h = n.nvmlDeviceGetHandleByIndex(a.gpu)
    dev = f"cuda:{a.gpu}"
    phases = _phases(dev)
    s = Sampler(h)
    s.start()
    for name, work in phases:
        s.phase = name
        t_end = time.monotonic() + PHASE_S
        while time.monotonic() < t_end:
            if work is None:
                time.sleep(0.05)
            else:
                work()
                torch.cuda.synchronize(dev)
    s.stop.set()
    s.join()
    summary: dict[str, Any] = {}
    keys = [f[0] for f in FIELDS] + ["util_gpu", "util_mem", "temp_c", "power_mw", "gpm_dram_bw_util"]
    for name, _ in phases:
        rows = [r for r in s.rows if r["phase"] == name][5:]  # the first second settles
        ph: dict[str, Any] = {"n": len(rows)}
        for k in keys:
            vals = [r[k] for r in rows if r.get(k) is not None]
            ph[k] = {"mean": round(statistics.fmean(vals), 2), "std": round(statistics.pstdev(vals), 2)} \
                if vals else None
        for f in FIELDS:
            rets = sorted({r.get(f[0] + "_ret") for r in rows} - {None})
            ph[f[0] + "_ret"] = rets
        summary[name] = ph
    out = {"probe": "nvml non-GPM fields by phase", "gpu": n.nvmlDeviceGetName(h),
           "driver": n.nvmlSystemGetDriverVersion(), "host": platform.node(),
           "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "phase_s": PHASE_S,
           "poll_s": POLL_S, "summary": summary, "rows": s.rows}
    with open(a.out, "w") as fh:
        json.dump(out, fh)
    json.dump(summary, sys.stdout, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
