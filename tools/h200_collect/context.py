"""What workload builders get (Ctx) and give back (Job), and the Workload record."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Job:
    """A built workload: step() does one unit of work; work is FLOP or bytes per step (0 = n/a)."""

    step: Callable[[], object]
    work: float = 0.0
    unit: str = "-"
    state: list[Any] = field(default_factory=list)  # keeps buffers alive; dropped after the job


@dataclass(frozen=True)
class Workload:
    name: str
    label: str
    family: str
    desc: str
    build: Callable[[Ctx], Job]
    #: Randomised runs (workloads/sweep.py): their parameters, written to runs.csv ``params``.
    params: dict[str, Any] = field(default_factory=dict)
    #: Seconds this run lasts (None: the configured DUR).
    dur: float | None = None


class Ctx:
    """What builders need: torch, the device, size scaling and the job's clock."""

    def __init__(self, torch: Any, device: str, small: bool, dur: float) -> None:
        self.torch = torch
        self.dev = device
        self.cuda = device.startswith("cuda")
        self.small = small
        self.dur = dur
        self.t0 = time.time()
        self._nn: Any = None

    def n(self, full: int, small: int) -> int:
        return small if self.small else full

    def elapsed(self) -> float:
        """Seconds since the timed window began (multi-phase and bursty jobs key off it)."""
        return time.time() - self.t0

    def frac(self) -> float:
        return self.elapsed() / self.dur

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def sleep(self, s: float) -> None:
        time.sleep(min(s, 0.05) if self.small else s)

    @property
    def nn(self) -> Any:
        if self._nn is None:
            from h200_collect.models import _model_classes  # torch.nn classes, built on first use

            self._nn = _model_classes(self.torch)
        return self._nn

    def autocast(self, enabled: bool = True) -> Any:
        return self.torch.autocast("cuda" if self.cuda else "cpu", dtype=self.torch.bfloat16,
                                   enabled=enabled)

    def dtype(self, name: str) -> Any:
        t = self.torch
        return {"bf16": t.bfloat16, "fp16": t.float16, "fp32": t.float32, "tf32": t.float32,
                "fp64": t.float64}[name]

