"""Splitting one GPU's window energy among the jobs that share it (docs/shared-gpus.md).

Power is not additive (a GEMM and a copy together draw little more than the GEMM alone:
docs/benchmarks.md, "Shared GPUs"), so a share cannot be measured; it is modelled:

* a **static** part, the GPU's idle power times the window, split equally among the jobs (it is
  paid for holding the GPU, whoever computes);
* a **dynamic** part, the rest, split by per-process SM utilisation (NVML's per-process samples,
  the fraction of time a kernel of that process ran), optionally blended with the framebuffer
  memory each job holds (``SM_WEIGHT``; 1.0 by default, as measured); with no utilisation
  samples by memory held, and with neither, equally.

MIG instances are split by ``mig_shares``: a static part by the instance's slices and a dynamic
part by its GPM SM activity times its slices (GPM MIG utilisation is relative to the instance).

Every split is exact: ``split_mj`` hands out integer millijoules by largest remainder, so the
jobs' energy adds up to the GPU's counter delta to the millijoule.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from typing import NamedTuple, TypeVar

K = TypeVar("K", bound=Hashable)

#: Weight of SM utilisation against memory held in the dynamic part. Chosen on the H200
#: co-location measurement (docs/benchmarks.md, "Shared GPUs"): every blend with memory held was
#: worse (a 1 GiB GEMM draws more than an 8 GiB copy), so memory held decides only where no job
#: has a utilisation sample (processes NVML does not report, e.g. in another PID namespace).
SM_WEIGHT = 1.0
#: Idle power prior, as a fraction of the GPU's default power limit, until a window shows less.
IDLE_PRIOR_RATIO = 0.15
#: The idle estimate never exceeds this fraction of the default limit (a GPU busy since the
#: daemon started would otherwise call its lowest busy power "idle").
IDLE_MAX_RATIO = 0.25


class Split(NamedTuple):
    """Each job's share of a window (ratios summing to 1) and what decided the dynamic part."""

    ratios: dict[str, float]
    basis: str  # "util" | "memory" | "equal" | "mig"


class IdleTracker:
    """The GPU's idle power estimate: the lowest window average seen, bounded by the limit."""

    def __init__(self) -> None:
        self._lowest_w: dict[str, float] = {}

    def observe(self, gpu_uuid: str, power_avg_w: float | None) -> None:
        if power_avg_w is not None and power_avg_w > 0:
            self._lowest_w[gpu_uuid] = min(self._lowest_w.get(gpu_uuid, math.inf), power_avg_w)

    def idle_w(self, gpu_uuid: str, default_limit_w: float | None) -> float:
        cap = (default_limit_w or 0.0) * IDLE_MAX_RATIO
        seen = self._lowest_w.get(gpu_uuid)
        if seen is None:
            return (default_limit_w or 0.0) * IDLE_PRIOR_RATIO
        return min(seen, cap) if cap > 0 else seen


def _norm(values: Mapping[K, float]) -> dict[K, float] | None:
    total = sum(max(0.0, v) for v in values.values())
    if total <= 0:
        return None
    return {k: max(0.0, v) / total for k, v in values.items()}


def split_shares(jobs: list[str], sm_util: Mapping[str, float], mem_used_mib: Mapping[str, float],
                 energy_j: float, duration_s: float, idle_w: float,
                 sm_weight: float = SM_WEIGHT) -> Split:
    """Each job's share of ``energy_j`` over ``duration_s`` on one GPU (see module docstring).

    ``sm_util``: per job, the sum of its processes' SM utilisation samples in the window (any
    scale, only ratios matter); ``mem_used_mib``: per job, the memory its processes hold.
    """
    if not jobs:
        return Split({}, "equal")
    n = len(jobs)
    if n == 1:
        return Split({jobs[0]: 1.0}, "sole")
    static_j = min(max(energy_j, 0.0), max(idle_w, 0.0) * max(duration_s, 0.0))
    dyn_j = max(energy_j, 0.0) - static_j
    sm = _norm({j: sm_util.get(j, 0.0) for j in jobs})
    mem = _norm({j: mem_used_mib.get(j, 0.0) for j in jobs})
    if sm is not None:
        weights = {j: sm_weight * sm[j] + (1 - sm_weight) * (mem[j] if mem else sm[j]) for j in jobs}
        basis = "util"
    elif mem is not None:
        weights, basis = mem, "memory"
    else:
        weights, basis = {j: 1.0 / n for j in jobs}, "equal"
    if energy_j <= 0:
        return Split({j: weights[j] for j in jobs}, basis)
    return Split({j: (static_j / n + dyn_j * weights[j]) / energy_j for j in jobs}, basis)


def mig_shares(slices: Mapping[str, int], activity_pct: Mapping[str, float | None], total_slices: int,
               energy_j: float, duration_s: float, idle_w: float) -> Split:
    """Split a MIG parent's energy among its instances (keys: instance UUIDs).

    Static: idle power x window, by slices over all the GPU's slices (slices of no instance keep
    their part under the key ``""``, the unattributed rest). Dynamic: by GPM SM activity x slices
    (an instance's GPM utilisation is relative to its own SMs); with no activity anywhere, the
    dynamic part follows the slices too.
    """
    total_slices = max(total_slices, sum(slices.values()), 1)
    static_j = min(max(energy_j, 0.0), max(idle_w, 0.0) * max(duration_s, 0.0))
    dyn_j = max(energy_j, 0.0) - static_j
    act = _norm({k: (activity_pct.get(k) or 0.0) * s for k, s in slices.items()})
    if act is None:
        act = _norm({k: float(s) for k, s in slices.items()}) or {}
    parts = {k: static_j * s / total_slices + dyn_j * act.get(k, 0.0) for k, s in slices.items()}
    unused = total_slices - sum(slices.values())
    if unused > 0:
        parts[""] = static_j * unused / total_slices
    if energy_j <= 0:
        return Split({k: 0.0 for k in parts}, "mig")
    return Split({k: v / energy_j for k, v in parts.items()}, "mig")


def split_mj(total_mj: int, ratios: Mapping[K, float]) -> dict[K, int]:
    """Integer millijoules per key, proportional to ``ratios``, summing exactly to ``total_mj``
    (largest remainder; ties go to the earlier key)."""
    keys = list(ratios)
    if not keys:
        return {}
    norm = _norm(ratios) or {k: 1.0 / len(keys) for k in keys}
    raw = {k: total_mj * norm[k] for k in keys}
    out = {k: math.floor(v) for k, v in raw.items()}
    rest = total_mj - sum(out.values())
    for k in sorted(keys, key=lambda k: raw[k] - out[k], reverse=True)[:rest]:
        out[k] += 1
    return out
