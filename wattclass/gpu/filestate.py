"""Fake GPUs whose settings live in one JSON file: the hardware boundary for tests and CI.

The Prolog and the Epilog are separate processes started by slurmd, so a cap set by one must be
visible to the other: the state is a JSON file, changed by read-modify-write under an exclusive
``fcntl`` lock on a sidecar ``<file>.lock`` (the JSON itself is replaced atomically, so its inode
changes and cannot carry the lock). Limits outside [min, max] raise like NVML's
NVML_ERROR_INVALID_ARGUMENT, so clamping bugs show up in tests.

File layout::

    {"version": 1, "gpus": [{"index": 0, "uuid": "GPU-...", "pci_bus_id": "00000000:19:00.0",
      "model": "NVIDIA H200", "default_w": 700.0, "min_w": 200.0, "max_w": 700.0,
      "limit_w": 700.0, "set_count": 0, "energy_mj": 0, "sim": {...}}, ...]}

Optional per GPU, for shared-GPU tests: ``"mig": {"total_slices": 7, "instances": [{"uuid":
"MIG-...", "gi_id": 1, "slices": 3, "sm_util_pct": 40.0}, ...]}`` (MIG instances, their GPM
SM activity) and ``"processes": [{"pid": 11, "job_id": "7", "user": "u", "used_mib": 1024,
"sm_util_pct": 60.0}, ...]`` (compute processes and their utilisation samples). Tests edit
these with ``update_gpu`` while a daemon or hook runs.

``sim`` (optional, ``create(simulate=True)``) makes the GPU respond to its cap for ``wattclass
calibrate`` tests: ``run_simulated`` runs a kernel of a given kind whose speed and power follow
``simulated_response`` (a deterministic model) and advances the GPU's energy counter.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from wattclass.errors import GpuError, GpuLostError
from wattclass.fsutil import atomic_write_text
from wattclass.gpu.base import (
    GpmMetrics,
    GpuBackend,
    GpuInfo,
    GpuProcess,
    GpuSample,
    MigInstance,
    ProcessUtil,
)

FORMAT_VERSION = 1


class FileStateBackend(GpuBackend):
    """GPUs described by ``path``; power limits persist there across processes."""

    name = "filestate"

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock_path = self.path.with_name(self.path.name + ".lock")
        with self._locked():
            self._gpus = self._read()["gpus"]

    @classmethod
    def create(
        cls,
        path: Path,
        n: int = 4,
        *,
        default_w: float = 700.0,
        min_w: float = 200.0,
        max_w: float = 700.0,
        model: str = "NVIDIA H200",
        order: list[int] | None = None,
        mig: dict[int, list[int]] | None = None,
        simulate: bool = False,
    ) -> FileStateBackend:
        """Write ``n`` fake GPUs to ``path`` and open it.

        ``order`` permutes PCI bus ids against NVML indices (GPU ``i`` gets bus ``order[i]``) so
        tests can prove that nothing maps GPUs by assuming index order. ``mig`` gives GPUs MIG
        instances: ``{gpu_index: [slices of instance 1, ...]}`` (of 7 slices), UUIDs
        ``MIG-fa4e0000-...-<gpu><instance>``.
        """
        order = list(range(n)) if order is None else list(order)
        if sorted(order) != list(range(n)):
            raise GpuError(f"order {order} is not a permutation of 0..{n - 1}")
        gpus = [
            {
                "index": i,
                "uuid": f"GPU-fa4e0000-0000-4000-8000-{order[i]:012d}",
                "pci_bus_id": f"00000000:{0x19 + 0x10 * order[i]:02X}:00.0",
                "minor": order[i],  # the driver numbers /dev/nvidiaN in PCI bus order
                "model": model,
                "default_w": float(default_w),
                "min_w": float(min_w),
                "max_w": float(max_w),
                "limit_w": float(default_w),
                "set_count": 0,
                "energy_mj": 0,
                **({"sim": {"static_w": 0.12 * float(default_w), "seconds_per_unit": 0.01}}
                   if simulate else {}),
            }
            for i in range(n)
        ]
        for idx, sizes in (mig or {}).items():
            if sum(sizes) > 7:
                raise GpuError(f"GPU {idx}: MIG instances {sizes} exceed 7 slices")
            gpus[idx]["mig"] = {"total_slices": 7, "instances": [
                {"uuid": f"MIG-fa4e0000-0000-4000-9000-{idx:06d}{k + 1:06d}", "gi_id": k + 1,
                 "slices": sl, "sm_util_pct": 0.0} for k, sl in enumerate(sizes)]}
        atomic_write_text(Path(path), json.dumps({"version": FORMAT_VERSION, "gpus": gpus}, indent=1))
        return cls(path)

    # -- file access -----------------------------------------------------------------------
    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self._lock_path, "a+b") as lk:
            fcntl.flock(lk.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lk.fileno(), fcntl.LOCK_UN)

    def _read(self) -> dict[str, Any]:
        try:
            doc = json.loads(self.path.read_text(encoding="utf-8"))
            gpus = doc["gpus"]
            if doc.get("version") != FORMAT_VERSION or not isinstance(gpus, list):
                raise ValueError("unsupported version or layout")
        except FileNotFoundError as exc:
            raise GpuError(f"{self.path}: filestate file not found") from exc
        except (ValueError, KeyError, TypeError) as exc:
            raise GpuError(f"{self.path}: not a filestate GPU file: {exc}") from exc
        return dict(doc)

    def _gpu(self, doc: dict[str, Any], index: int) -> dict[str, Any]:
        for g in doc["gpus"]:
            if int(g["index"]) == index:
                return dict(g)
        raise GpuLostError(f"{self.path}: no GPU with index {index}")

    # -- GpuBackend ------------------------------------------------------------------------
    def gpus(self) -> list[GpuInfo]:
        return [
            GpuInfo(
                gpu_index=int(g["index"]),
                uuid=str(g["uuid"]),
                model=str(g["model"]),
                pci_bus_id=str(g["pci_bus_id"]),
                fb_total_mib=143771.0,
                sm_clock_max_mhz=1980.0,
                power_limit_default_w=float(g["default_w"]),
                power_limit_min_w=float(g["min_w"]),
                power_limit_max_w=float(g["max_w"]),
                gpm_supported=bool(g.get("mig")),  # MIG tests need GPM per instance
                minor_number=int(g.get("minor", g["index"])),
            )
            for g in self._gpus
        ]

    def sample(self, index: int) -> GpuSample:
        with self._locked():
            g = self._gpu(self._read(), index)
        return GpuSample(
            ts=time.time(), energy_mj=int(g.get("energy_mj", 0)) if "sim" in g else None, power_w=None,
            power_limit_w=float(g["limit_w"]),
            util_gpu_pct=None, util_mem_pct=None, sm_clock_mhz=None, mem_clock_mhz=None,
            clock_event_reasons=None, temp_c=None, fb_used_mib=None,
        )

    def power_limit_w(self, index: int) -> float | None:
        return self.sample(index).power_limit_w

    def set_power_limit_w(self, index: int, watts: float) -> None:
        with self._locked():
            doc = self._read()
            for g in doc["gpus"]:
                if int(g["index"]) == index:
                    if not float(g["min_w"]) <= watts <= float(g["max_w"]):
                        raise GpuError(
                            f"GPU {index}: power limit {watts} W outside [{g['min_w']}, {g['max_w']}] W "
                            "(NVML_ERROR_INVALID_ARGUMENT)"
                        )
                    g["limit_w"] = float(watts)
                    g["set_count"] = int(g.get("set_count", 0)) + 1
                    break
            else:
                raise GpuLostError(f"{self.path}: no GPU with index {index}")
            atomic_write_text(self.path, json.dumps(doc, indent=1))

    # -- shared GPUs: processes and MIG ----------------------------------------------------------
    def update_gpu(self, index: int, **fields: Any) -> None:
        """Replace top-level fields of one GPU's entry (tests: processes, MIG activity)."""
        with self._locked():
            doc = self._read()
            for g in doc["gpus"]:
                if int(g["index"]) == index:
                    g.update(fields)
                    break
            else:
                raise GpuLostError(f"{self.path}: no GPU with index {index}")
            atomic_write_text(self.path, json.dumps(doc, indent=1))
        self._gpus = doc["gpus"]

    def _current(self, index: int) -> dict[str, Any]:
        with self._locked():
            return self._gpu(self._read(), index)

    def processes(self, index: int) -> list[GpuProcess]:
        return [GpuProcess(int(p["pid"]), p.get("job_id"), p.get("user"), p.get("used_mib"))
                for p in self._current(index).get("processes", [])]

    def process_utilization(self, index: int, since_us: int) -> list[ProcessUtil]:
        """One sample per listed process, stamped now (the file holds the current rates)."""
        now_us = int(time.time() * 1e6)
        if now_us <= since_us:
            return []
        return [ProcessUtil(int(p["pid"]), now_us, float(p.get("sm_util_pct", 0.0)),
                            float(p.get("mem_util_pct", 0.0)))
                for p in self._current(index).get("processes", [])]

    def mig_instances(self, index: int) -> list[MigInstance]:
        g = self._current(index)
        mig = g.get("mig") or {}
        total = int(mig.get("total_slices", 7))
        return [MigInstance(str(m["uuid"]), index, str(g["uuid"]), int(m["gi_id"]), int(m["slices"]), total)
                for m in mig.get("instances", [])]

    def gpm_mig_snapshot(self, index: int, gpu_instance_id: int) -> object | None:
        """(time, SM activity now): the fake's GPM sample of one instance."""
        for m in (self._current(index).get("mig") or {}).get("instances", []):
            if int(m["gi_id"]) == gpu_instance_id:
                return ("mig", time.time(), float(m.get("sm_util_pct", 0.0)))
        return None

    def gpm_metrics(self, index: int, first: object, second: object) -> GpmMetrics:
        """For MIG snapshots: the activity of the later one (the fake holds rates, not counters)."""
        if isinstance(second, tuple) and second and second[0] == "mig":
            return GpmMetrics(sm_util_pct=float(second[2]))
        return GpmMetrics()

    # -- simulated kernels (calibrate tests) -------------------------------------------------
    def run_simulated(self, index: int, kind: str, units: float) -> float:
        """Run ``units`` of a ``kind`` kernel at the GPU's current limit: sleep its duration, add its
        energy to the counter and return the modelled seconds (the kernel's own timer: exact, unlike
        the wall clock of a busy test machine). Raises GpuError on a GPU without ``sim``."""
        with self._locked():
            g = self._gpu(self._read(), index)
        sim = g.get("sim")
        if not isinstance(sim, dict):
            raise GpuError(f"{self.path}: GPU {index} is not simulated (create(simulate=True))")
        speed, power_w = simulated_response(kind, float(g["limit_w"]), float(g["default_w"]),
                                            float(sim["static_w"]))
        seconds = units * float(sim["seconds_per_unit"]) / speed
        time.sleep(seconds)
        with self._locked():
            doc = self._read()
            for gg in doc["gpus"]:
                if int(gg["index"]) == index:
                    gg["energy_mj"] = int(gg.get("energy_mj", 0)) + round(power_w * seconds * 1000)
            atomic_write_text(self.path, json.dumps(doc, indent=1))
        return seconds


#: Simulated kernels: (power share of the default limit it draws uncapped, SM-clock-bound share).
SIM_KERNELS: dict[str, tuple[float, float]] = {
    "compute": (1.0, 0.95), "memory": (0.6, 0.15), "mix": (0.85, 0.55)}
SIM_MEM_KNEE = 0.45


def simulated_response(kind: str, limit_w: float, default_w: float, static_w: float) -> tuple[float, float]:
    """(speed relative to uncapped, power drawn in W) of a simulated kernel under ``limit_w``.

    Deterministic: a kernel needing ``need`` W under a lower cap runs its SM clock at
    ``((cap - static) / (need - static)) ** (1/3)`` (dynamic power ~ f^3); its clock-bound share
    slows with it, the rest (memory) is flat until the cap falls below SIM_MEM_KNEE of the default
    limit, then slows with sqrt(cap share / knee). It draws min(need, cap).
    """
    if kind not in SIM_KERNELS:
        raise GpuError(f"unknown simulated kernel {kind!r} (known: {', '.join(SIM_KERNELS)})")
    need_share, s = SIM_KERNELS[kind]
    need = need_share * default_w
    if limit_w >= need:
        return 1.0, need
    f = ((limit_w - static_w) / (need - static_w)) ** (1.0 / 3.0)
    share = limit_w / default_w
    mem = 1.0 if share >= SIM_MEM_KNEE else (share / SIM_MEM_KNEE) ** 0.5
    return 1.0 / (s / f + (1.0 - s) / mem), limit_w
