"""``wattclass calibrate``: measure on a site's own idle GPU what each cap costs and saves.

At each cap (share of the GPU's default limit) it runs representative kernels -- a compute GEMM, a
memory stream, a mix of both (PyTorch on a real GPU; the file-state backend's simulated kernels in
tests) or the site's own command timed by wall clock -- and measures wall time and energy from the
GPU's energy counter. Ratios against the uncapped run form the response file ``simulate`` reads.

The original limit is ALWAYS restored:
* each change goes through the Prolog's ``record_then_set``: the previous limit is written to the
  cap-record folder before the GPU is touched, so after a kill -9 (or a crash, or a reboot)
  ``wattclass plugin reconcile`` restores it like a job whose Epilog never ran;
* errors, Ctrl-C, SIGTERM and SIGHUP unwind through ``finally``, which restores from the record.

``--dry-run`` measures every kernel at the CURRENT limit and sets nothing: the backend is wrapped
so that any set-limit call raises, and the record/set path asserts it is not a dry run. It checks
the measurement path on a GPU whose limit must not change (the lent H200).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import os
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from wattclass.caps import Cap, cap_watts
from wattclass.errors import ConfigError, GpuError, WattclassError
from wattclass.fsutil import atomic_write_text
from wattclass.gpu.base import GpuBackend, GpuInfo, GpuSample
from wattclass.savings.response import RESPONSE_VERSION

log = logging.getLogger("wattclass.savings")


class Interrupted(WattclassError):
    """A signal asked calibrate to stop (the limit is restored on the way out)."""

    exit_code = 130


@dataclass(frozen=True)
class Workload:
    """A named kernel: ``run()`` does a fixed amount of work and returns when it is done, with its own
    timing in seconds if it has one (a simulated kernel), else None (then the wall clock counts)."""

    name: str
    run: Callable[[], float | None]


class DryRunBackend(GpuBackend):
    """Reads through to a backend; any attempt to set a limit is a bug and raises."""

    name = "dry-run"

    def __init__(self, inner: GpuBackend) -> None:
        self.inner = inner

    def gpus(self) -> list[GpuInfo]:
        return self.inner.gpus()

    def sample(self, index: int) -> GpuSample:
        return self.inner.sample(index)

    def energy_mj(self, index: int) -> int | None:
        return self.inner.energy_mj(index)

    def power_limit_w(self, index: int) -> float | None:
        return self.inner.power_limit_w(index)

    def processes(self, index: int) -> list[Any]:
        return list(self.inner.processes(index))

    def set_power_limit_w(self, index: int, watts: float) -> None:
        raise AssertionError(f"calibrate --dry-run tried to set GPU {index} to {watts} W")


def parse_caps(text: str) -> list[float]:
    """"100,85,70,60,50" -> shares [1.0, 0.85, ...]; 100 is added if missing (the baseline)."""
    out = []
    for part in text.split(","):
        try:
            v = float(part.strip().rstrip("%"))
        except ValueError as exc:
            raise ConfigError(f"--caps: {part.strip()!r} is not a percentage") from exc
        if not 0 < v <= 100:
            raise ConfigError(f"--caps: {v} is not in (0, 100]")
        out.append(v / 100.0)
    shares = sorted(set(out) | {1.0}, reverse=True)
    return shares


# -- workloads ---------------------------------------------------------------------------------
def simulated_workloads(backend: GpuBackend, index: int, units: float = 20.0) -> list[Workload]:
    """The file-state backend's simulated kernels (tests, CI)."""
    run_sim = getattr(backend, "run_simulated", None)
    if run_sim is None:
        raise ConfigError(f"backend {backend.name} has no simulated kernels")
    def kernel(kind: str) -> Callable[[], float | None]:
        def run() -> float | None:
            seconds: float = run_sim(index, kind, units)
            return seconds

        return run

    return [Workload(k, kernel(k)) for k in ("compute", "memory", "mix")]


def torch_workloads(index: int, seconds: float = 2.0) -> list[Workload]:  # pragma: no cover - GPU only
    """GEMM (bf16 8192^2), memory streaming (copy of 2 GiB), and a mix, each sized to ~``seconds``."""
    try:
        import torch
    except ImportError as exc:
        raise ConfigError("--workload builtin needs PyTorch with CUDA on a real GPU "
                          "(or pass --workload 'CMD')") from exc
    if not torch.cuda.is_available():
        raise ConfigError("--workload builtin: torch sees no CUDA GPU")
    dev = torch.device(f"cuda:{index}")
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    x = torch.empty(1 << 29, device=dev, dtype=torch.float32)  # 2 GiB
    y = torch.empty_like(x)

    def gemm(n: int) -> None:
        for _ in range(n):
            torch.matmul(a, b)

    def stream(n: int) -> None:
        for _ in range(n):
            y.copy_(x)

    def mix(n: int) -> None:
        for _ in range(n):
            torch.matmul(a, b)
            y.copy_(x)

    def sized(fn: Callable[[int], None]) -> int:
        fn(2)
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        fn(10)
        torch.cuda.synchronize(dev)
        return max(10, int(10 * seconds / max(time.perf_counter() - t0, 1e-6)))

    out = []
    for name, fn in (("compute", gemm), ("memory", stream), ("mix", mix)):
        n = sized(fn)

        def run(fn: Callable[[int], None] = fn, n: int = n) -> None:
            fn(n)
            torch.cuda.synchronize(dev)
            return None

        out.append(Workload(name, run))
    return out


def command_workload(cmd: str, index: int) -> Workload:
    """The site's own command (no shell), CUDA_VISIBLE_DEVICES set to the GPU; must exit 0."""
    argv = shlex.split(cmd)
    if not argv:
        raise ConfigError("--workload: empty command")
    # before any cap is set: a command that cannot start was a FileNotFoundError traceback at the
    # first measured run (the limit was restored, the calibration lost)
    if shutil.which(argv[0]) is None:
        raise ConfigError(f"--workload {argv[0]!r}: no such executable (it runs without a shell: give "
                          "a program on PATH or its path)")

    def run() -> None:
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(index)}
        try:
            proc = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  check=False)
        except OSError as exc:  # removed or made unrunnable since the check
            raise ConfigError(f"--workload {argv[0]!r}: cannot run: {exc.strerror or exc}") from exc
        if proc.returncode != 0:
            raise GpuError(f"--workload {argv[0]!r} exited {proc.returncode}: "
                           f"{proc.stderr.decode(errors='replace')[-300:]}")

    return Workload("site", run)


# -- measurement -------------------------------------------------------------------------------
def measure(backend: GpuBackend, index: int, w: Workload) -> tuple[float, float | None]:
    """(wall seconds, joules from the energy counter; None without a counter) of one run."""
    e0 = backend.energy_mj(index)
    t0 = time.perf_counter()
    own = w.run()
    wall = own if own is not None else time.perf_counter() - t0
    e1 = backend.energy_mj(index)
    energy = (e1 - e0) / 1000.0 if e0 is not None and e1 is not None else None
    return wall, energy


class _SignalGate:
    """SIGTERM/SIGHUP/SIGINT raise Interrupted once, and never while the limit is being restored.

    Why (review): every signal used to raise, also inside the ``finally`` that restores the
    limit; a second Ctrl-C or SIGTERM during the restore cut it short, and the GPU stayed capped
    while the message said "original limit restored" (4 of 16 runs with two SIGTERMs 0.5-20 ms
    apart)."""

    def __init__(self) -> None:
        self.raised = False
        self.restoring = False

    def handler(self, signum: int, _frame: FrameType | None) -> None:
        if self.raised or self.restoring:
            return
        self.raised = True
        raise Interrupted(f"stopped by signal {signal.Signals(signum).name}; original limit restored")


@contextlib.contextmanager
def _signals_raise(gate: _SignalGate) -> Iterator[None]:
    """The signals go to ``gate`` (which raises Interrupted so ``finally`` restores the limit)."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    for s in saved:
        signal.signal(s, gate.handler)
    try:
        yield
    finally:
        for s, h in saved.items():
            signal.signal(s, h)


@dataclass
class CalibrateOptions:
    gpu: int
    caps: list[float]
    state_dir: Path
    dry_run: bool = False
    repeats: int = 2
    force: bool = False


def _set_cap(backend: GpuBackend, gpu: GpuInfo, watts: float, owner: str, state_dir: Path,
             dry_run: bool) -> None:
    from wattclass.plugin.prolog import record_then_set

    assert not dry_run, "calibrate --dry-run must never set a power limit"
    record_then_set(backend, gpu, watts, owner, state_dir)


def _restore(backend: GpuBackend, gpu: GpuInfo, original_w: float, owner: str, state_dir: Path) -> None:
    from wattclass.plugin.prolog import restore_recorded

    if not restore_recorded(backend, gpu.uuid, owner, state_dir):
        now = backend.power_limit_w(gpu.gpu_index)
        if now is not None and abs(now - original_w) > 0.5:
            backend.set_power_limit_w(gpu.gpu_index, original_w)
    log.info("calibrate: GPU %s back at %.1f W", gpu.uuid, backend.power_limit_w(gpu.gpu_index) or -1)


def calibrate(backend: GpuBackend, opts: CalibrateOptions, workloads: Sequence[Workload],
              on_step: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run every workload at every cap; return the response document (see ``response_document``)."""
    if opts.dry_run:
        backend = DryRunBackend(backend)
    gpu = backend.find_gpu(str(opts.gpu))
    others = [p for p in backend.processes(gpu.gpu_index) if p.pid != os.getpid()]  # our kernels' context
    if not opts.force and others:
        raise GpuError(f"GPU {gpu.gpu_index} runs other processes; calibrate needs an idle GPU (--force)")
    original = backend.power_limit_w(gpu.gpu_index)
    default = gpu.power_limit_default_w or original
    if original is None or default is None:
        raise GpuError(f"GPU {gpu.uuid}: power limit unknown; cannot calibrate")
    owner = f"calibrate:{os.getpid()}"
    points: list[dict[str, Any]] = []
    gate = _SignalGate()
    with _signals_raise(gate):
        try:
            for share in opts.caps:
                target = cap_watts(Cap(share * 100.0, "%"), default, gpu.power_limit_min_w,
                                   gpu.power_limit_max_w)
                if not opts.dry_run:
                    _set_cap(backend, gpu, target, owner, opts.state_dir, opts.dry_run)
                applied = backend.power_limit_w(gpu.gpu_index)
                for w in workloads:
                    w.run()  # warm-up: clocks and caches settle at this cap
                    runs = [measure(backend, gpu.gpu_index, w) for _ in range(max(1, opts.repeats))]
                    walls = [r[0] for r in runs]
                    pt: dict[str, Any] = {"workload": w.name, "cap_share": share, "cap_w": target,
                                          "limit_w": applied, "wall_s": walls,
                                          "energy_j": [r[1] for r in runs]}
                    points.append(pt)
                    if on_step:
                        on_step(f"cap {share:.0%} ({applied} W) {w.name}: "
                                f"{statistics.median(walls):.3f} s")
        finally:
            while True:  # a first signal that lands before ``restoring`` is set: restore again
                try:
                    gate.restoring = True
                    if not opts.dry_run:
                        _restore(backend, gpu, original, owner, opts.state_dir)
                    break
                except Interrupted:
                    continue
    return response_document(gpu, default, original, points, opts.dry_run)


def _ratios(vals: list[float | None], base: list[float | None]) -> tuple[float, float, float] | None:
    v = [x for x in vals if x is not None and x > 0]
    b = [x for x in base if x is not None and x > 0]
    if not v or not b:
        return None
    mb = statistics.median(b)
    return statistics.median(v) / mb, min(v) / max(b), max(v) / min(b)


def response_document(gpu: GpuInfo, default_w: float, original_w: float, points: list[dict[str, Any]],
                      dry_run: bool) -> dict[str, Any]:
    """The response file: per workload, runtime and energy ratio (median, lo, hi) vs the 100% run.

    lo/hi pair the extremes of the repeats (fastest capped over slowest uncapped, and the reverse),
    so the band covers run-to-run noise. ``raw`` keeps every measurement.
    """
    workloads: dict[str, list[dict[str, Any]]] = {}
    power_share: dict[str, float] = {}
    for w in sorted({p["workload"] for p in points}):
        pts = [p for p in points if p["workload"] == w]
        base = max(pts, key=lambda p: p["cap_share"])
        rows = []
        for p in sorted(pts, key=lambda p: p["cap_share"]):
            rt = _ratios(p["wall_s"], base["wall_s"])
            en = _ratios(p["energy_j"], base["energy_j"])
            if rt is None:
                continue
            row = {"cap_share": p["cap_share"], "cap_w": p["cap_w"], "limit_w": p["limit_w"],
                   "runtime_ratio": rt[0], "runtime_ratio_lo": rt[1], "runtime_ratio_hi": rt[2]}
            if en is not None:
                row.update({"energy_ratio": en[0], "energy_ratio_lo": en[1], "energy_ratio_hi": en[2]})
            rows.append(row)
        workloads[w] = rows
        e = [x for x in base["energy_j"] if x is not None]
        if e and default_w > 0:  # what the kernel draws uncapped: maps a job's cap onto the curve
            power_share[w] = statistics.median(e) / statistics.median(base["wall_s"]) / default_w
    return {
        "version": RESPONSE_VERSION, "gpu_model": gpu.model, "gpu_uuid": gpu.uuid, "default_w": default_w,
        "original_w": original_w, "dry_run": dry_run, "host": socket.gethostname(),
        "written_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "note": ("dry run: every kernel at the current limit, nothing set; ratios show run-to-run noise only"
                 if dry_run else "ratios against the 100% run; lo/hi from the repeats' extremes"),
        "workloads": workloads, "uncapped_power_share": power_share, "raw": points,
    }


def write_response(doc: dict[str, Any], out: Path) -> Path:
    atomic_write_text(Path(out), json.dumps(doc, indent=1) + "\n", mode=0o644)
    return Path(out)
