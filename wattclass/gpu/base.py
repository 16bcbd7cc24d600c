"""The GPU backend interface: the only place wattclass touches hardware.

Three implementations share it: ``nvml`` (real GPUs through pynvml), ``replay`` (plays recorded
1 Hz H200 data as live GPUs) and ``filestate`` (a fake whose power limits live in a JSON file, so
separate Prolog and Epilog processes see one state in tests). The telemetry daemon reads through
it; the Prolog/Epilog set power limits through it.

Conventions (after Zeus and nvitop): units are in the names (``_mj``, ``_w``, ``_mhz``); a field
a GPU does not support is ``None``, never an exception; a GPU that stops answering raises
``GpuLostError`` for that GPU only; a library that cannot start raises ``GpuInitError`` once.
"""

from __future__ import annotations

import abc
import threading
from typing import NamedTuple


class GpuInfo(NamedTuple):
    """Static facts about one GPU, read once when the backend opens."""

    gpu_index: int
    uuid: str
    model: str
    pci_bus_id: str
    fb_total_mib: float | None
    sm_clock_max_mhz: float | None
    power_limit_default_w: float | None
    power_limit_min_w: float | None
    power_limit_max_w: float | None
    gpm_supported: bool
    #: The N of /dev/nvidiaN (NVML's minor number): Slurm's GPU index where gres.conf lists
    #: ``File=/dev/nvidia[0-N]``. None where the backend has no device files (replay).
    minor_number: int | None = None


class GpuSample(NamedTuple):
    """One poll of one GPU. ``ts`` is the backend's clock (wall clock, or recorded time on replay)."""

    ts: float
    energy_mj: int | None  # cumulative energy counter since driver load
    power_w: float | None  # instantaneous power reading
    power_limit_w: float | None  # enforced limit
    util_gpu_pct: float | None
    util_mem_pct: float | None
    sm_clock_mhz: float | None
    mem_clock_mhz: float | None
    clock_event_reasons: int | None  # NVML clocks-event (throttle) reason bitmask
    temp_c: float | None
    fb_used_mib: float | None
    #: Power averaged over the second before the poll (NVML's POWER_AVERAGE field, what
    #: nvmlDeviceGetPowerUsage returns on Ampere and later): integrated over a 1 s poll interval
    #: it is that interval's energy to ~3 J (docs/benchmarks.md, "Energy split at job changes").
    power_avg_w: float | None = None
    #: ``time.monotonic()`` when ``ts`` was read, where the backend reads the wall clock (None on
    #: replay): a wall clock that ran ahead of it was stepped (NTP) or the node suspended, and the
    #: window builder gives the skipped time no rows (telemetry.windows).
    mono_s: float | None = None


class GpmMetrics(NamedTuple):
    """NVML GPM metrics between two GPM snapshots; each None where unsupported."""

    sm_util_pct: float | None = None
    sm_occupancy_pct: float | None = None
    tensor_util_pct: float | None = None
    dram_bw_util_pct: float | None = None
    fp64_util_pct: float | None = None
    fp32_util_pct: float | None = None
    fp16_util_pct: float | None = None
    int_util_pct: float | None = None
    pcie_tx_mibs: float | None = None
    pcie_rx_mibs: float | None = None


class GpuProcess(NamedTuple):
    """A compute process on a GPU, for job attribution when no Prolog file exists.

    ``job_id``/``user`` are filled by backends that know them directly (replay); the NVML
    backend leaves them None and the attribution layer reads SLURM_JOB_ID from /proc.
    """

    pid: int
    job_id: str | None = None
    user: str | None = None
    used_mib: float | None = None  # framebuffer memory the process holds (None where unknown)


class ProcessUtil(NamedTuple):
    """One NVML per-process utilisation sample (nvmlDeviceGetProcessesUtilizationInfo).

    ``sm_util_pct`` is the share of the sample period in which a kernel of this process ran;
    the energy split on shared GPUs weighs jobs by it (docs/shared-gpus.md).
    """

    pid: int
    ts_us: int  # the driver's sample timestamp, microseconds since the epoch
    sm_util_pct: float
    mem_util_pct: float


class MigInstance(NamedTuple):
    """A MIG GPU instance: a GPU of its own for Slurm and CUDA, a slice of ``parent_index``.

    ``slices`` is the instance's share of the parent's compute slices (of ``total_slices``,
    7 on an H100/H200); the energy split gives it that share of the parent's static power.
    """

    uuid: str  # MIG-...: what SLURM_JOB_GPUS / CUDA_VISIBLE_DEVICES name
    parent_index: int
    parent_uuid: str
    gpu_instance_id: int
    slices: int
    total_slices: int


# NVML clock-event reason bits (nvml.h, nvmlClocksEventReason*).
CLOCK_EVENT_SW_POWER_CAP = 0x4
CLOCK_EVENT_HW_SLOWDOWN = 0x8
CLOCK_EVENT_SW_THERMAL = 0x20
CLOCK_EVENT_HW_THERMAL = 0x40
CLOCK_EVENT_HW_POWER_BRAKE = 0x80
POWER_REASONS = CLOCK_EVENT_SW_POWER_CAP | CLOCK_EVENT_HW_POWER_BRAKE
THERMAL_REASONS = CLOCK_EVENT_SW_THERMAL | CLOCK_EVENT_HW_THERMAL


class GpuBackend(abc.ABC):
    """Access to the GPUs of one node. Open with the factory in ``wattclass.gpu``."""

    #: Short name used in logs and ``--backend``.
    name: str = "abstract"

    @abc.abstractmethod
    def gpus(self) -> list[GpuInfo]:
        """All GPUs of the node, by NVML index."""

    @abc.abstractmethod
    def sample(self, index: int) -> GpuSample:
        """Poll one GPU now. Raises GpuLostError if that GPU does not answer.

        ``energy_mj`` may be None even where the GPU has a counter: backends whose counter read
        is expensive (nvml) leave it to ``energy_mj``, which the daemon calls only where exact
        accounting needs it. A backend that fills it on every poll is also correct.
        """

    def energy_mj(self, index: int) -> int | None:
        """The cumulative energy counter (mJ) now; None where unsupported.

        Separate from ``sample`` because on an H200 VM this one read costs milliseconds while
        every other field costs microseconds (docs/benchmarks.md, "Per NVML call"); the window
        builder asks for it only at (every N-th) window close, after a gap and at the first poll.
        """
        return self.sample(index).energy_mj

    def gpm_snapshot(self, index: int) -> object | None:
        """Take a GPM sample (opaque); None where GPM is unsupported."""
        return None

    def gpm_metrics(self, index: int, first: object, second: object) -> GpmMetrics:
        """GPM metrics between two snapshots of the same GPU."""
        return GpmMetrics()

    def processes(self, index: int) -> list[GpuProcess]:
        """Compute processes on the GPU (empty where unknown)."""
        return []

    def process_utilization(self, index: int, since_us: int) -> list[ProcessUtil]:
        """Per-process utilisation samples newer than ``since_us`` (empty where unsupported).

        Asked only for GPUs that several jobs share, at most once per poll.
        """
        return []

    # -- MIG --------------------------------------------------------------------------------------
    def mig_instances(self, index: int) -> list[MigInstance]:
        """The MIG instances of a physical GPU (empty: MIG off or unsupported)."""
        return []

    def gpm_mig_snapshot(self, index: int, gpu_instance_id: int) -> object | None:
        """A GPM sample of one MIG instance of GPU ``index`` (opaque); None where unsupported.
        ``gpm_metrics`` turns two of them into the instance's metrics."""
        return None

    def now(self) -> float:
        """The backend's clock in seconds since the epoch (recorded time on replay)."""
        import time

        return time.time()

    def sleep_until(self, t: float, stop: threading.Event) -> None:
        """Wait until the backend clock reads ``t`` or ``stop`` is set.

        Lives on the backend because replay owns its clock: a virtual clock jumps to ``t`` at
        once (``--once``), a real-time replay waits the wall-clock equivalent.
        """
        delay = t - self.now()
        if delay > 0:
            stop.wait(delay)

    def exhausted(self) -> bool:
        """True when the backend has no more data (a replay past its end); live GPUs never are."""
        return False

    # -- power limits (used by Prolog/Epilog; daemons only read) -------------------------------
    def power_limit_w(self, index: int) -> float | None:
        """The current (requested) power limit, watts."""
        return self.sample(index).power_limit_w

    def set_power_limit_w(self, index: int, watts: float) -> None:
        """Set the power limit. Backends that cannot (replay) raise GpuNotSupportedError."""
        from wattclass.errors import GpuNotSupportedError

        raise GpuNotSupportedError(f"backend {self.name} cannot set power limits")

    def close(self) -> None:  # noqa: B027 - optional hook, most backends hold nothing
        """Release the library (nvmlShutdown)."""

    def __enter__(self) -> GpuBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def find_gpu(self, key: str) -> GpuInfo:
        """Find a GPU by UUID, PCI bus id or index string (Prolog maps SLURM_JOB_GPUS with this)."""
        from wattclass.errors import GpuError

        k = key.strip().lower()
        for g in self.gpus():
            if k in (g.uuid.lower(), g.pci_bus_id.lower(), str(g.gpu_index)):
                return g
        raise GpuError(f"no GPU matches {key!r} on backend {self.name}")

    def find_mig(self, key: str) -> MigInstance | None:
        """The MIG instance with UUID ``key`` (Slurm hands instances out as GPUs); None if none."""
        k = key.strip().lower()
        if not k.startswith("mig-"):
            return None
        for g in self.gpus():
            for m in self.mig_instances(g.gpu_index):
                if m.uuid.lower() == k:
                    return m
        return None
