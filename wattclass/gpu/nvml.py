"""Real GPUs through pynvml (the ``nvidia-ml-py`` distribution).

Why this call set: the daemon polls every GPU every second, so each poll uses as few NVML calls
as possible:

* the energy counter only in ``energy_mj`` (``nvmlDeviceGetTotalEnergyConsumption``), which
  the daemon calls only at (every second) window close, after gaps and at the first poll, never
  at a job change (telemetry.windows, "sparse energy"): on the H200 VM
  (driver 580) that one read costs milliseconds, alone or inside FieldValues, while every
  other call below costs microseconds (docs/benchmarks.md, "Per NVML call");
* one batched ``nvmlDeviceGetFieldValues`` for the instantaneous power, the enforced power
  limit and the 1 s average power (the daemon splits an energy span between job segments with
  it), *without* the energy field (per-GPU fallback to PowerUsage / EnforcedPowerLimit when a
  field id is rejected by an older driver, decided once per GPU);
* utilization, SM and memory clocks, clock-event reasons, temperature, memory info (each a few
  microseconds, so every poll: ``fb_used_mib`` is a per-window maximum and needs every poll);
* GPM (Hopper+) only once per window, in ``gpm_snapshot``; metrics from a pair of snapshots;
* the process list only when the attribution layer asks (no Prolog job file, or a shared GPU);
* per-process utilisation (``nvmlDeviceGetProcessesUtilizationInfo``, falling back to
  ``nvmlDeviceGetProcessUtilization`` on older drivers) only for GPUs several jobs share;
* MIG: the instances of each GPU once (``mig_instances``, cached: MIG layouts change only with
  the GPU idle and the daemon restarted), GPM per instance with ``nvmlGpmMigSampleGet``.

All NVML errors go through one decorator (``nvml_errors``): nvmlInit failing becomes one
``GpuInitError``; GPU_IS_LOST / TIMEOUT / UNKNOWN become ``GpuLostError`` for that GPU only;
NOT_SUPPORTED for a single field becomes ``None`` (``_opt``), never a crash. A GPU already lost
when the backend opens is left out (logged), so the other GPUs of the node still work.
The daemon only reads; ``set_power_limit_w`` exists for the Prolog.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from collections.abc import Callable
from typing import Any, TypeVar

from wattclass.errors import (
    GpuError,
    GpuInitError,
    GpuLostError,
    GpuNotSupportedError,
    GpuPermissionError,
)
from wattclass.gpu.base import (
    GpmMetrics,
    GpuBackend,
    GpuInfo,
    GpuProcess,
    GpuSample,
    MigInstance,
    ProcessUtil,
)

F = TypeVar("F", bound=Callable[..., Any])

log = logging.getLogger(__name__)

#: GPM metric ids (nvml.h NVML_GPM_METRIC_*) in GpmMetrics field order; the ones the H200
#: probe that recorded wattclass/data/h200 confirmed.
GPM_METRIC_IDS: tuple[tuple[str, int], ...] = (
    ("sm_util_pct", 2),
    ("sm_occupancy_pct", 3),
    ("tensor_util_pct", 5),
    ("dram_bw_util_pct", 10),
    ("fp64_util_pct", 11),
    ("fp32_util_pct", 12),
    ("fp16_util_pct", 13),
    ("int_util_pct", 4),
    ("pcie_tx_mibs", 20),
    ("pcie_rx_mibs", 21),
)

# NVML return codes (nvml.h) so this module does not need pynvml at import time.
_NOT_SUPPORTED = 3
_NO_PERMISSION = 4
_NOT_FOUND = 6
_TIMEOUT = 10
_FUNCTION_NOT_FOUND = 13
_GPU_IS_LOST = 15
_NO_DATA = 20
_UNKNOWN = 999
_LOST_CODES = frozenset({_GPU_IS_LOST, _TIMEOUT, _UNKNOWN})
_UNSUPPORTED_CODES = frozenset({_NOT_SUPPORTED, _FUNCTION_NOT_FOUND, _NO_DATA})

#: nvml.h NVML_FI_DEV_POWER_AVERAGE, for pynvml versions that predate the constant.
_FI_POWER_AVERAGE = 185

#: How many GPM sample buffers each GPU rotates through: the daemon holds at most two
#: (window start, window end) plus the one being filled.
_GPM_RING = 3


def _code(exc: BaseException) -> int | None:
    return getattr(exc, "value", None)


def translate(exc: BaseException, where: str) -> GpuError:
    """Map an NVMLError to the project's error classes (message names the GPU and call)."""
    code = _code(exc)
    msg = f"{where}: NVML error {code}: {exc}"
    if code in _LOST_CODES:
        return GpuLostError(msg)
    if code in _UNSUPPORTED_CODES:
        return GpuNotSupportedError(msg)
    if code == _NO_PERMISSION:
        return GpuPermissionError(msg)
    return GpuError(msg)


def nvml_errors(method: F) -> F:
    """Decorator for backend methods whose first argument is a GPU index (or none).

    Translates any NVMLError into GpuLostError / GpuNotSupportedError / GpuPermissionError /
    GpuError, naming the GPU and the method, so callers only ever see wattclass.errors.
    """

    @functools.wraps(method)
    def wrapper(self: NvmlBackend, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except self._nv.NVMLError as exc:
            where = f"GPU {args[0]} {method.__name__}" if args else f"NVML {method.__name__}"
            raise translate(exc, where) from exc

    return wrapper  # type: ignore[return-value]


class NvmlBackend(GpuBackend):
    """All NVIDIA GPUs of this node through NVML."""

    name = "nvml"

    def __init__(self, nvml_module: Any = None) -> None:
        """Initialise NVML; ``nvml_module`` replaces pynvml (hardware-boundary tests only)."""
        if nvml_module is None:
            try:
                import pynvml

                nvml_module = pynvml
            except ImportError as exc:  # pragma: no cover - dependency missing
                raise GpuInitError(
                    "pynvml is not installed (pip install nvidia-ml-py); cannot read GPUs"
                ) from exc
        self._nv = nvml_module
        try:
            self._nv.nvmlInit()
        except self._nv.NVMLError as exc:
            raise GpuInitError(
                f"NVML cannot start ({exc}); is the NVIDIA driver loaded and "
                "libnvidia-ml.so.1 on the library path?"
            ) from exc
        except OSError as exc:
            raise GpuInitError(f"NVML cannot start: {exc}") from exc
        self._open = True
        self._handles: dict[int, Any] = {}  # by NVML index; a GPU lost at start-up has none
        self._infos: dict[int, GpuInfo] = {}
        self._field_ok: dict[int, bool] = {}
        self._gpm_ring: dict[Any, list[Any]] = {}
        self._gpm_next: dict[Any, int] = {}
        self._putil_api: str | None = None
        self._mig: dict[int, list[MigInstance]] = {}
        try:
            self._discover()
        except BaseException:
            self.close()
            raise

    # -- discovery -------------------------------------------------------------------------
    @nvml_errors
    def _discover(self) -> None:
        """Open every GPU that answers. One that is lost (fallen off the bus, Xid 79: NVML says
        GPU_IS_LOST, or TIMEOUT / UNKNOWN) is left out with an ERROR: it made the whole backend
        fail, so a node with one dead GPU had no telemetry, Prolog or Epilog for the others
        (review finding). Its index stays unused; the others keep theirs."""
        for i in range(self._nv.nvmlDeviceGetCount()):
            try:
                self._discover_one(i)
            except self._nv.NVMLError as exc:
                if _code(exc) not in _LOST_CODES:
                    raise
                log.error("GPU %d: left out, it does not answer (%s); the other GPUs go on", i,
                          translate(exc, f"GPU {i}"))

    def _discover_one(self, i: int) -> None:
        """Open GPU ``i``: its handle and static facts."""
        nv = self._nv
        h = nv.nvmlDeviceGetHandleByIndex(i)
        mem = self._opt(nv.nvmlDeviceGetMemoryInfo, h)
        cons = self._opt(nv.nvmlDeviceGetPowerManagementLimitConstraints, h)
        default = self._opt(nv.nvmlDeviceGetPowerManagementDefaultLimit, h)
        gpm = False
        if hasattr(nv, "nvmlGpmQueryDeviceSupport"):
            sup = self._opt(nv.nvmlGpmQueryDeviceSupport, h)
            gpm = bool(sup is not None and sup.isSupportedDevice)
        pci = self._opt(nv.nvmlDeviceGetPciInfo, h)
        bus = getattr(pci, "busId", b"") if pci is not None else b""
        clk = self._opt(nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_SM)
        info = GpuInfo(
            gpu_index=i,
            uuid=_s(nv.nvmlDeviceGetUUID(h)),
            model=_s(nv.nvmlDeviceGetName(h)),
            pci_bus_id=_s(bus),
            fb_total_mib=mem.total / 2**20 if mem is not None else None,
            sm_clock_max_mhz=float(clk) if clk is not None else None,
            power_limit_default_w=default / 1e3 if default is not None else None,
            power_limit_min_w=cons[0] / 1e3 if cons is not None else None,
            power_limit_max_w=cons[1] / 1e3 if cons is not None else None,
            gpm_supported=gpm,
            minor_number=self._opt(nv.nvmlDeviceGetMinorNumber, h),
        )
        self._handles[i], self._infos[i] = h, info

    def _opt(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Call ``fn``; None where the GPU does not support it (NOT_SUPPORTED etc.)."""
        try:
            return fn(*args)
        except self._nv.NVMLError as exc:
            if _code(exc) in _UNSUPPORTED_CODES:
                return None
            raise

    def gpus(self) -> list[GpuInfo]:
        return list(self._infos.values())

    def _handle(self, index: int) -> Any:
        try:
            return self._handles[index]
        except KeyError:
            raise GpuLostError(f"GPU {index}: not opened (lost at start-up, or no such GPU)") from None

    def _info(self, index: int) -> GpuInfo:
        self._handle(index)
        return self._infos[index]

    # -- polling -------------------------------------------------------------------------------
    def _power(self, index: int, h: Any) -> tuple[float | None, float | None, float | None]:
        """Instant power, enforced limit and 1 s average power (W): one FieldValues call, no
        energy field. The average is None where the field fails (and on the fallback path:
        PowerUsage is an average only from Ampere on, so it is not taken for one)."""
        nv = self._nv
        if self._field_ok.get(index, True):
            ids = [nv.NVML_FI_DEV_POWER_INSTANT, nv.NVML_FI_DEV_POWER_CURRENT_LIMIT,
                   getattr(nv, "NVML_FI_DEV_POWER_AVERAGE", _FI_POWER_AVERAGE)]
            try:
                vals = nv.nvmlDeviceGetFieldValues(h, ids)
            except nv.NVMLError as exc:
                if _code(exc) not in _UNSUPPORTED_CODES and _code(exc) != 2:  # 2 = INVALID_ARGUMENT
                    raise
                self._field_ok[index] = False
            else:
                power, limit, avg = (field_value(nv, v) for v in vals)
                avg_w = avg / 1e3 if avg is not None else None
                # A NaN reading of a working field is no reading this poll, not a missing field.
                if power is not None or vals[0].nvmlReturn == 0:
                    power_w = power / 1e3 if power is not None else None
                    if limit is None:
                        lim = self._opt(nv.nvmlDeviceGetEnforcedPowerLimit, h)
                        return power_w, lim / 1e3 if lim is not None else None, avg_w
                    return power_w, limit / 1e3, avg_w
                # Instant power field missing on this driver: use the getters from now on.
                self._field_ok[index] = False
        p = self._opt(nv.nvmlDeviceGetPowerUsage, h)
        lim = self._opt(nv.nvmlDeviceGetEnforcedPowerLimit, h)
        return (p / 1e3 if p is not None else None, lim / 1e3 if lim is not None else None, None)

    @nvml_errors
    def energy_mj(self, index: int) -> int | None:
        e = self._opt(self._nv.nvmlDeviceGetTotalEnergyConsumption, self._handle(index))
        return int(e) if e is not None else None

    @nvml_errors
    def sample(self, index: int) -> GpuSample:
        """The cheap fields; ``energy_mj`` is None here (read it with ``energy_mj``)."""
        nv = self._nv
        h = self._handle(index)
        import time

        ts, mono_s = time.time(), time.monotonic()
        power, limit, avg = self._power(index, h)
        util = self._opt(nv.nvmlDeviceGetUtilizationRates, h)
        sm = self._opt(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)
        mem_clk = self._opt(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM)
        reasons = self._opt(nv.nvmlDeviceGetCurrentClocksEventReasons, h)
        temp = self._opt(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
        mem = self._opt(nv.nvmlDeviceGetMemoryInfo, h)
        return GpuSample(
            ts=ts,
            energy_mj=None,
            power_w=power,
            power_limit_w=limit,
            util_gpu_pct=float(util.gpu) if util is not None else None,
            util_mem_pct=float(util.memory) if util is not None else None,
            sm_clock_mhz=float(sm) if sm is not None else None,
            mem_clock_mhz=float(mem_clk) if mem_clk is not None else None,
            clock_event_reasons=int(reasons) if reasons is not None else None,
            temp_c=float(temp) if temp is not None else None,
            fb_used_mib=mem.used / 2**20 if mem is not None else None,
            power_avg_w=avg,
            mono_s=mono_s,
        )

    # -- GPM -------------------------------------------------------------------------------------
    @nvml_errors
    def gpm_snapshot(self, index: int) -> object | None:
        if not self._info(index).gpm_supported:
            return None
        buf = self._gpm_buffer(index)
        self._nv.nvmlGpmSampleGet(self._handle(index), buf)
        sample: object = buf
        return sample

    def _gpm_buffer(self, key: Any) -> Any:
        """The next buffer of ``key``'s ring (a GPU index, or (index, instance id) for MIG)."""
        ring = self._gpm_ring.get(key)
        if ring is None:
            ring = [self._nv.nvmlGpmSampleAlloc() for _ in range(_GPM_RING)]
            self._gpm_ring[key] = ring
            self._gpm_next[key] = 0
        i = self._gpm_next[key]
        self._gpm_next[key] = (i + 1) % _GPM_RING
        return ring[i]

    @nvml_errors
    def gpm_mig_snapshot(self, index: int, gpu_instance_id: int) -> object | None:
        """A GPM sample of one MIG instance (``nvmlGpmMigSampleGet`` on the parent's handle)."""
        if not self._info(index).gpm_supported or not hasattr(self._nv, "nvmlGpmMigSampleGet"):
            return None
        buf = self._gpm_buffer((index, gpu_instance_id))
        self._nv.nvmlGpmMigSampleGet(self._handle(index), gpu_instance_id, buf)
        sample: object = buf
        return sample

    @nvml_errors
    def mig_instances(self, index: int) -> list[MigInstance]:
        """Instances of GPU ``index`` with their slices; [] with MIG off (cached per GPU)."""
        if index in self._mig:
            return list(self._mig[index])
        nv = self._nv
        h = self._handle(index)
        out: list[MigInstance] = []
        mode = self._opt(nv.nvmlDeviceGetMigMode, h) if hasattr(nv, "nvmlDeviceGetMigMode") else None
        if mode is not None and int(mode[0]) == 1:  # (current, pending); 1 = NVML_DEVICE_MIG_ENABLE
            parent = self._opt(nv.nvmlDeviceGetAttributes, h)
            total = int(parent.gpuInstanceSliceCount) if parent is not None else 7
            for k in range(int(nv.nvmlDeviceGetMaxMigDeviceCount(h))):
                try:
                    mh = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, k)
                except nv.NVMLError as exc:
                    if _code(exc) == _NOT_FOUND:  # no instance in this slot
                        continue
                    raise
                attrs = nv.nvmlDeviceGetAttributes(mh)
                out.append(MigInstance(
                    uuid=_s(nv.nvmlDeviceGetUUID(mh)), parent_index=index,
                    parent_uuid=self._info(index).uuid,
                    gpu_instance_id=int(nv.nvmlDeviceGetGpuInstanceId(mh)),
                    slices=int(attrs.gpuInstanceSliceCount), total_slices=total))
        self._mig[index] = out
        return list(out)

    @nvml_errors
    def gpm_metrics(self, index: int, first: object, second: object) -> GpmMetrics:
        nv = self._nv
        mg = nv.c_nvmlGpmMetricsGet_t()
        mg.version = nv.NVML_GPM_METRICS_GET_VERSION
        mg.numMetrics = len(GPM_METRIC_IDS)
        mg.sample1, mg.sample2 = first, second
        for i, (_, mid) in enumerate(GPM_METRIC_IDS):
            mg.metrics[i].metricId = mid
        nv.nvmlGpmMetricsGet(mg)
        vals = {
            name: (_finite(float(mg.metrics[i].value)) if mg.metrics[i].nvmlReturn == 0 else None)
            for i, (name, _) in enumerate(GPM_METRIC_IDS)
        }
        return GpmMetrics(**vals)

    # -- processes and limits ------------------------------------------------------------------
    @nvml_errors
    def processes(self, index: int) -> list[GpuProcess]:
        procs = self._opt(self._nv.nvmlDeviceGetComputeRunningProcesses, self._handle(index))
        out = []
        for p in procs or []:
            used = getattr(p, "usedGpuMemory", None)
            out.append(GpuProcess(pid=int(p.pid), used_mib=used / 2**20 if used is not None else None))
        return out

    @nvml_errors
    def process_utilization(self, index: int, since_us: int) -> list[ProcessUtil]:
        """Samples newer than ``since_us``: the v1 struct API where the driver has it, else the old
        call (decided once); NOT_FOUND means no new sample and is []."""
        nv = self._nv
        h = self._handle(index)
        names = ("nvmlDeviceGetProcessesUtilizationInfo", "nvmlDeviceGetProcessUtilization")
        for name in names if self._putil_api is None else (self._putil_api,):
            fn = getattr(nv, name, None)
            if fn is None:
                continue
            try:
                samples = fn(h, int(since_us))
            except nv.NVMLError as exc:
                if _code(exc) == _NOT_FOUND:
                    self._putil_api = name
                    return []
                if _code(exc) in _UNSUPPORTED_CODES and self._putil_api is None:
                    continue  # try the older call
                raise
            self._putil_api = name
            return [ProcessUtil(int(x.pid), int(x.timeStamp), float(x.smUtil), float(x.memUtil))
                    for x in samples]
        return []

    @nvml_errors
    def power_limit_w(self, index: int) -> float | None:
        lim = self._opt(self._nv.nvmlDeviceGetPowerManagementLimit, self._handle(index))
        return lim / 1e3 if lim is not None else None

    @nvml_errors
    def set_power_limit_w(self, index: int, watts: float) -> None:
        """Set the limit (root only). Used by the Prolog/Epilog, never by the telemetry daemon."""
        self._nv.nvmlDeviceSetPowerManagementLimit(self._handle(index), round(watts * 1000))

    def close(self) -> None:
        if not getattr(self, "_open", False):
            return
        self._open = False
        for ring in self._gpm_ring.values():
            for buf in ring:
                with contextlib.suppress(self._nv.NVMLError):  # best effort at shutdown
                    self._nv.nvmlGpmSampleFree(buf)
        self._gpm_ring.clear()
        with contextlib.suppress(self._nv.NVMLError):
            self._nv.nvmlShutdown()


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _finite(v: float) -> float | None:
    """A double NVML computed (a field, a GPM ratio) can be NaN or infinite: that is no reading."""
    return v if math.isfinite(v) else None


def field_value(nv: Any, fv: Any) -> float | None:
    """Decode one nvmlFieldValue_t; None when the field failed (e.g. NOT_SUPPORTED) or is not
    a finite number."""
    if fv.nvmlReturn != 0:
        return None
    t = fv.valueType
    v = fv.value
    if t == nv.NVML_VALUE_TYPE_DOUBLE:
        return _finite(float(v.dVal))
    if t == nv.NVML_VALUE_TYPE_UNSIGNED_INT:
        return float(v.uiVal)
    if t in (nv.NVML_VALUE_TYPE_UNSIGNED_LONG, nv.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG):
        return float(v.ullVal)
    if t == nv.NVML_VALUE_TYPE_SIGNED_LONG_LONG:
        return float(v.sllVal)
    if t == nv.NVML_VALUE_TYPE_SIGNED_INT:
        return float(v.siVal)
    if t == nv.NVML_VALUE_TYPE_UNSIGNED_SHORT:
        return float(v.usVal)
    return None
