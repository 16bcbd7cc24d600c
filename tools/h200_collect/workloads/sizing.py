"""Sizing helpers shared by the randomised families (sweep.py, fresh.py).

Rough H200 ceilings for sizing launches, never for labels (the GPM rule decides the truth), and
the log-uniform draw the families use for sizes that span decades.
"""

from __future__ import annotations

import math
import random

#: Rough H200 ceilings for sizing launches (not for labels): HBM bytes/s.
HBM_BPS = 4.0e12
#: Target length of one launch batch (one ``step``), so the run loop's sync gaps stay small.
STEP_S = 0.05


def loguniform(rng: random.Random, lo: float, hi: float) -> float:
    return math.exp(rng.uniform(math.log(lo), math.log(hi)))
