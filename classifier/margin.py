"""Stage 2 of the roofline-margin model: how far an active window sits from the roofline ridge.

Why (issue 13): the GPM rule calls a window compute-bound when its busiest compute pipe is at least
as busy as DRAM. A classifier of that yes/no learns where the named training jobs happened to
lie and is as sure next to the ridge as far from it; on work of an unseen family near the ridge
it made confident costly errors. Here a small linear model predicts the *margin*
``m = ln((max pipe % + 1) / (DRAM % + 1))`` (positive = compute side), a continuous target that
GPM gives for every training window, from six inputs with a physical reading: memory-controller
activity, the clock (the power cap pulls it down when the pipes draw more than the limit), the
power, and the power the chip would draw at full clock (``demand``) against what memory traffic
explains. ``P(memory) = Phi(-m_hat / sigma)`` where sigma is the out-of-family residual spread,
so a window predicted close to the ridge gets a probability close to 1/2 whatever the training
families were. A ridge regression (a handful of coefficients) extrapolates smoothly to families
it never saw, where trees stay flat at their last leaf.

Everything is numpy; the fitted map is plain data in model.json (numbers rounded to 9
significant digits so that a rebuild on another BLAS writes the same bytes).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from wattclass.classifier.features import FEATURES

F64 = npt.NDArray[np.float64]

#: Inputs of the margin regression, derived from FEATURES columns (see ``margin_inputs``).
MARGIN_INPUTS: tuple[str, ...] = (
    "util_mem_pct", "clock_frac", "power_frac", "demand", "demand_excess", "mem_per_demand",
)
#: Ridge penalty on standardised inputs (fixed on leave-one-family-out of the 134 H200 jobs).
RIDGE_ALPHA = 10.0
#: Folds for the out-of-family residual spread (sigma).
SIGMA_FOLDS = 5
#: Clock share below which ``demand`` stops growing (a guard, never reached on an H200: 0.68).
MIN_CLOCK_FRAC = 0.3
#: Significant digits kept in model.json.
DIGITS = 9


def roofline_margin(pipes: list[F64], dram_pct: F64) -> F64:
    """The GPM roofline margin ln((max pipe + 1) / (DRAM + 1)); NaN where GPM is missing."""
    busiest = np.full(np.shape(dram_pct), np.nan)
    for p in pipes:
        busiest = np.fmax(busiest, np.asarray(p, dtype=np.float64))
    dram = np.asarray(dram_pct, dtype=np.float64)
    return np.asarray(np.log((busiest + 1.0) / (dram + 1.0)), dtype=np.float64)


def margin_inputs(X: npt.ArrayLike) -> F64:
    """The MARGIN_INPUTS columns from a FEATURES matrix.

    ``demand`` = power_frac / clock_frac^2: dynamic power grows with clock x voltage^2, so a chip
    held below its clock by the cap would draw more at full clock; memory-bound work runs at full
    clock and its power is mostly explained by memory traffic (``demand_excess`` = demand -
    util_mem share; ``mem_per_demand`` = util_mem share / demand).
    """
    x = np.asarray(X, dtype=np.float64)
    col = {f: x[:, i] for i, f in enumerate(FEATURES)}
    um = col["util_mem_pct"] / 100.0
    demand = col["power_frac"] / np.maximum(col["clock_frac"], MIN_CLOCK_FRAC) ** 2
    return np.column_stack([col["util_mem_pct"], col["clock_frac"], col["power_frac"], demand,
                            demand - um, um / np.maximum(demand, 0.05)])


def _round(v: float) -> float:
    return float(f"{v:.{DIGITS}g}")


def _solve(Z: F64, y: F64, w: F64, alpha: float) -> tuple[F64, float]:
    """Weighted ridge (intercept unpenalised): coefficients on Z and the intercept."""
    sw = w / w.sum()
    zm = sw @ Z
    ym = float(sw @ y)
    Zc, yc = Z - zm, y - ym
    A = (Zc * w[:, None]).T @ Zc + alpha * np.eye(Z.shape[1])
    coef = np.linalg.solve(A, (Zc * w[:, None]).T @ yc)
    return np.asarray(coef, dtype=np.float64), ym - float(zm @ coef)


def _fit_map(inp: F64, y: F64, w: F64, alpha: float) -> Callable[[F64], F64]:
    med = np.nanmedian(inp, axis=0)
    med = np.where(np.isnan(med), 0.0, med)
    Z = np.where(np.isnan(inp), med, inp)
    mu, sd = Z.mean(axis=0), Z.std(axis=0) + 1e-9
    coef, icpt = _solve((Z - mu) / sd, y, w, alpha)

    def predict(J: F64) -> F64:
        return np.asarray(((np.where(np.isnan(J), med, J) - mu) / sd) @ coef + icpt, dtype=np.float64)

    predict.params = {"median": med, "mean": mu, "scale": sd, "coef": coef, "intercept": icpt}  # type: ignore[attr-defined]
    return predict


def fit_margin(X: npt.ArrayLike, margin: npt.ArrayLike, weight: npt.ArrayLike, fold: npt.ArrayLike,
               alpha: float = RIDGE_ALPHA) -> dict[str, Any]:
    """Fit the margin map on active windows; sigma from the residuals on held-out ``fold`` groups.

    ``fold``: a fold number per window (whole families per fold, so sigma says how far off the
    map is on kinds of work it did not see).
    """
    inp = margin_inputs(X)
    y = np.asarray(margin, dtype=np.float64)
    w = np.asarray(weight, dtype=np.float64)
    f = np.asarray(fold)
    resid = np.zeros(len(y))
    for k in np.unique(f):
        te = f == k
        if (~te).sum() > len(MARGIN_INPUTS):
            resid[te] = y[te] - _fit_map(inp[~te], y[~te], w[~te], alpha)(inp[te])
    sigma = math.sqrt(float(np.average(resid ** 2, weights=w))) if len(y) else 1.0
    p = _fit_map(inp, y, w, alpha).params  # type: ignore[attr-defined]
    return {
        "inputs": list(MARGIN_INPUTS),
        "alpha": alpha,
        "median": [_round(v) for v in p["median"]],
        "mean": [_round(v) for v in p["mean"]],
        "scale": [_round(v) for v in p["scale"]],
        "coef": [_round(v) for v in p["coef"]],
        "intercept": _round(p["intercept"]),
        "sigma": _round(max(sigma, 1e-3)),
    }


def predict_margin(X: npt.ArrayLike, m: Mapping[str, Any]) -> F64:
    """Predicted roofline margin per window (FEATURES matrix in)."""
    inp = margin_inputs(X)
    med, mu, sd, coef = (np.asarray(m[k], dtype=np.float64) for k in ("median", "mean", "scale", "coef"))
    return np.asarray(((np.where(np.isnan(inp), med, inp) - mu) / sd) @ coef + float(m["intercept"]),
                      dtype=np.float64)


def memory_probability(X: npt.ArrayLike, m: Mapping[str, Any]) -> F64:
    """P(memory-bound | active) per window: Phi(-margin_hat / sigma)."""
    from scipy.special import ndtr  # only where the model predicts: labelling by the rule needs no SciPy

    return np.asarray(ndtr(-predict_margin(X, m) / float(m["sigma"])), dtype=np.float64)
