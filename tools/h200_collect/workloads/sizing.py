"""Sizing helpers shared by the randomised families (sweep.py, fresh.py, latency.py, fresh4.py).

Rough H200 ceilings for sizing launches, never for labels (the GPM rule decides the truth), and
the log-uniform draw the families use for sizes that span decades.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from typing import Any

#: Rough H200 ceilings for sizing launches (not for labels): HBM bytes/s.
HBM_BPS = 4.0e12
#: Target length of one launch batch (one ``step``), so the run loop's sync gaps stay small.
STEP_S = 0.05


def loguniform(rng: random.Random, lo: float, hi: float) -> float:
    return math.exp(rng.uniform(math.log(lo), math.log(hi)))


def calibrated_reps(c: Any, op: Callable[[], object], cap: int = 2000) -> int:
    """How many calls of ``op`` fill one ``STEP_S`` launch batch, timed on the device.

    Why timed: the newer families (latency.py, fresh4.py) span shapes where no roofline estimate is
    trustworthy (dependent loads, cuSOLVER, tiny batched GEMMs); one warm call then two timed calls
    give the real per-call time. On the CPU smoke path one call is enough.
    """
    if not c.cuda:
        return 1
    op()
    c.sync()
    t0 = time.perf_counter()
    op()
    op()
    c.sync()
    per_call_s = (time.perf_counter() - t0) / 2
    return max(1, min(cap, int(STEP_S / max(per_call_s, 1e-7))))
