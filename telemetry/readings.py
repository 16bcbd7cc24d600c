"""What one poll's readings are worth to a window: finite or missing, and an interval's power.

Why non-finite means missing: NVML hands out doubles (FieldValues' power fields, GPM metrics,
which are ratios of counters over the time between two snapshots) that can be NaN or infinite,
and one such value in a row used to reach the WAL, whose JSON refuses it: a daemon crashed at
SIGTERM and its last rows never reached Parquet (H200 run of 2026-11-30, issue 15). The window
builder treats a non-finite reading exactly like a field the GPU does not support (None): it
is left out of means, maxima, spreads and the energy split's weights, counted
(``wattclass_daemon_nonfinite_readings``) and logged once per GPU and field. The nvml backend
drops them at the source as well; this is the same rule for every backend.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from wattclass.gpu.base import GpmMetrics, GpuInfo, GpuSample

log = logging.getLogger(__name__)

#: The float readings of a poll (``energy_mj`` and the reason bitmask are integers).
SAMPLE_FLOATS = ("power_w", "power_limit_w", "util_gpu_pct", "util_mem_pct", "sm_clock_mhz",
                 "mem_clock_mhz", "temp_c", "fb_used_mib", "power_avg_w")
#: GPM metrics are rates over the span between two snapshots; over less than this (a stop a
#: few milliseconds after a GPM point) they mean nothing and NVML may return NaN, so such a
#: span gets no GPM metrics (null) instead.
MIN_GPM_SPAN_S = 0.1


def _bad(v: float | None) -> bool:
    return v is not None and not math.isfinite(v)


class NonFinite:
    """Replaces non-finite readings by None; counts them and warns once per GPU and field."""

    def __init__(self) -> None:
        self.count = 0
        self._warned: set[tuple[int, str]] = set()

    def _note(self, info: GpuInfo, fields: list[str], values: list[object]) -> None:
        self.count += len(fields)
        for f, v in zip(fields, values, strict=True):
            if (info.gpu_index, f) not in self._warned:
                self._warned.add((info.gpu_index, f))
                log.warning("GPU %d (%s): non-finite %s reading (%s) taken as missing; further ones "
                            "are counted in wattclass_daemon_nonfinite_readings", info.gpu_index,
                            info.uuid, f, v)

    def sample(self, info: GpuInfo, s: GpuSample) -> GpuSample:
        bad = [f for f in SAMPLE_FLOATS if _bad(getattr(s, f))]
        if not bad:
            return s
        self._note(info, bad, [getattr(s, f) for f in bad])
        missing: dict[str, Any] = dict.fromkeys(bad)
        return s._replace(**missing)

    def gpm(self, info: GpuInfo, m: GpmMetrics) -> GpmMetrics:
        bad = [f for f in GpmMetrics._fields if _bad(getattr(m, f))]
        if not bad:
            return m
        self._note(info, [f"GPM {f}" for f in bad], [getattr(m, f) for f in bad])
        missing: dict[str, Any] = dict.fromkeys(bad)
        return m._replace(**missing)


def interval_power_w(a: GpuSample, b: GpuSample) -> float | None:
    """The mean power of the interval ``(a, b]`` (W): the 1 s average read at ``b``, else the
    trapezoid of the instantaneous readings at both ends (one end if one is missing); None
    without a usable reading (finite ones only: ``NonFinite.sample`` ran first)."""
    if b.power_avg_w is not None:
        p: float | None = b.power_avg_w
    elif a.power_w is None or b.power_w is None:
        p = a.power_w if b.power_w is None else b.power_w
    else:
        p = (a.power_w + b.power_w) / 2
    return p if p is None or p >= 0 else None


def proportional(total: float, weights: list[float]) -> list[float]:
    """``total`` split in proportion to ``weights`` (all zeros where they sum to nothing usable)."""
    w = sum(weights)
    return [total * x / w for x in weights] if w > 0 and math.isfinite(w) else [0.0] * len(weights)
