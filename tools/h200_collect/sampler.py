"""1 Hz NVML + GPM sampling in a background thread, and the device's static facts."""

from __future__ import annotations

import math
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from h200_collect.config import (
    FIELD_MEMORY_TEMP,
    FIELD_POWER_AVERAGE,
    FIELD_POWER_INSTANT,
    GPM_IDS,
    SCOPE_MEMORY,
)


def _safe(f: Callable[..., Any], *a: Any) -> Any:
    try:
        return f(*a)
    except Exception as e:
        return f"ERR {type(e).__name__}: {e}"


#: NVML's nvmlValueType_t -> the member of the value union that holds it (nvml.h).
_FIELD_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def _field_int(v: Any) -> int | None:
    """A field value read as an integer (None where the GPU did not answer it, or gave no finite
    number). Decoded by its valueType, as the daemon does (wattclass/gpu/nvml.py ``field_value``):
    the H200 gives unsigned ints, but a driver that gives a double (or a signed or 64-bit int)
    must not have its union's bytes read as another type, which would record a plausible-looking
    garbage integer."""
    if v.nvmlReturn != 0:
        return None
    member = _FIELD_MEMBERS.get(int(v.valueType))
    if member is None:
        return None
    x = getattr(v.value, member, None)  # usVal: not in every pynvml
    if x is None:
        return None
    if member == "dVal":
        return round(x) if math.isfinite(x) else None
    return int(x)


def read_caps(N: Any, h: Any) -> dict[str, Any]:
    """Static device facts, exactly as h200_probe.py records them."""
    caps: dict[str, Any] = {
        "name": _safe(N.nvmlDeviceGetName, h),
        "driver": _safe(N.nvmlSystemGetDriverVersion),
        "nvml": _safe(N.nvmlSystemGetNVMLVersion),
        "power_mw": _safe(N.nvmlDeviceGetPowerUsage, h),
        "energy_mj": _safe(N.nvmlDeviceGetTotalEnergyConsumption, h),
        "limit_mw": _safe(N.nvmlDeviceGetPowerManagementLimit, h),
        "default_limit_mw": _safe(N.nvmlDeviceGetPowerManagementDefaultLimit, h),
        "enforced_limit_mw": _safe(N.nvmlDeviceGetEnforcedPowerLimit, h),
        "limit_constraints_mw": _safe(N.nvmlDeviceGetPowerManagementLimitConstraints, h),
        "mig_mode": _safe(N.nvmlDeviceGetMigMode, h),
        "clocks_max_sm": _safe(N.nvmlDeviceGetMaxClockInfo, h, N.NVML_CLOCK_SM),
        "clocks_max_mem": _safe(N.nvmlDeviceGetMaxClockInfo, h, N.NVML_CLOCK_MEM),
        "supported_sm_clocks_sample": None,
        "persistence": _safe(N.nvmlDeviceGetPersistenceMode, h),
        "compute_mode": _safe(N.nvmlDeviceGetComputeMode, h),
        "uuid": _safe(N.nvmlDeviceGetUUID, h),
        "serial": _safe(N.nvmlDeviceGetSerial, h),
        "pci": str(_safe(N.nvmlDeviceGetPciInfo, h)),
    }
    try:
        caps["gpm_supported"] = int(N.nvmlGpmQueryDeviceSupport(h).isSupportedDevice)
    except Exception as e:
        caps["gpm_supported"] = f"ERR {e}"
    mem = _safe(N.nvmlDeviceGetMemoryInfo, h)
    caps["fb_total_mib"] = mem.total / 2**20 if hasattr(mem, "total") else None
    try:
        fv = N.nvmlDeviceGetFieldValues(h, [N.NVML_FI_DEV_POWER_INSTANT, N.NVML_FI_DEV_POWER_AVERAGE])
        caps["field_power"] = [(f.nvmlReturn, f.value.uiVal) for f in fv]
    except Exception as e:
        caps["field_power"] = f"ERR {e}"
    return {k: (v if isinstance(v, (int, float, str, type(None), list, dict)) else str(v))
            for k, v in caps.items()}


class Sampler:
    """1 Hz NVML (+GPM over the preceding second) poller in a background thread, as in the probe."""

    def __init__(self, N: Any, h: Any, use_gpm: bool) -> None:
        self.N, self.h, self.use_gpm = N, h, use_gpm
        self.job = "startup"
        self.rows: list[dict[str, Any]] = []
        self.gpm_errors = 0
        self._stop = threading.Event()
        self._th = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> None:
        self._th.start()

    def stop(self) -> None:
        self._stop.set()
        self._th.join()

    def _loop(self) -> None:
        N, h = self.N, self.h
        prev = N.nvmlGpmSampleAlloc() if self.use_gpm else None
        cur = N.nvmlGpmSampleAlloc() if self.use_gpm else None
        if self.use_gpm:
            N.nvmlGpmSampleGet(h, prev)
        nxt = time.time() + 1.0
        while not self._stop.is_set():
            time.sleep(max(0.0, nxt - time.time()))
            nxt += 1.0
            try:
                prev, cur = self._poll(prev, cur)
            except Exception:
                traceback.print_exc()

    def _poll(self, prev: Any, cur: Any) -> tuple[Any, Any]:
        N, h = self.N, self.h
        t0 = time.perf_counter()
        r: dict[str, Any] = {"ts": time.time(), "job": self.job}
        r["power_mw"] = N.nvmlDeviceGetPowerUsage(h)
        r["energy_mj"] = N.nvmlDeviceGetTotalEnergyConsumption(h)
        try:
            fv = N.nvmlDeviceGetFieldValues(h, [FIELD_POWER_INSTANT, (FIELD_POWER_AVERAGE, SCOPE_MEMORY),
                                                FIELD_MEMORY_TEMP])
            for key, v in zip(("power_instant_mw", "power_mem_avg_mw", "mem_temp_c"), fv, strict=True):
                r[key] = _field_int(v)
        except Exception:
            r["power_instant_mw"] = r["power_mem_avg_mw"] = r["mem_temp_c"] = None
        u = N.nvmlDeviceGetUtilizationRates(h)
        r["util_gpu"], r["util_mem"] = u.gpu, u.memory
        r["sm_clock_mhz"] = N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_SM)
        r["mem_clock_mhz"] = N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_MEM)
        r["temp_c"] = N.nvmlDeviceGetTemperature(h, N.NVML_TEMPERATURE_GPU)
        r["fb_used_mib"] = N.nvmlDeviceGetMemoryInfo(h).used / 2**20
        r["pstate"] = N.nvmlDeviceGetPerformanceState(h)
        try:
            r["clock_event_reasons"] = N.nvmlDeviceGetCurrentClocksEventReasons(h)
        except Exception:
            r["clock_event_reasons"] = None
        try:
            r["n_procs"] = len(N.nvmlDeviceGetComputeRunningProcesses(h))
        except Exception:
            r["n_procs"] = None
        t1 = time.perf_counter()
        if self.use_gpm:
            N.nvmlGpmSampleGet(h, cur)
            mg = N.c_nvmlGpmMetricsGet_t()
            mg.version = N.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = len(GPM_IDS)
            mg.sample1, mg.sample2 = prev, cur
            for i, mid in enumerate(GPM_IDS.values()):
                mg.metrics[i].metricId = mid
            try:
                N.nvmlGpmMetricsGet(mg)
                for i, k in enumerate(GPM_IDS):
                    r[k] = mg.metrics[i].value if mg.metrics[i].nvmlReturn == 0 else None
            except Exception as e:
                self.gpm_errors += 1
                if self.gpm_errors <= 3:
                    print(f"GPM error: {e}", flush=True)
            prev, cur = cur, prev
        t2 = time.perf_counter()
        r["nvml_basic_us"] = (t1 - t0) * 1e6
        r["nvml_gpm_us"] = (t2 - t1) * 1e6
        self.rows.append(r)
        return prev, cur

