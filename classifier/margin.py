"""Stage 2 of the roofline-margin model: how far an active window sits from the roofline ridge.

Why (issue 13): the GPM rule calls a window compute-bound when its busiest compute pipe is at least
as busy as DRAM. A classifier of that yes/no learns where the named training jobs happened to lie
and is as sure next to the ridge as far from it; on work of an unseen family near the ridge it made
confident costly errors. Here a small linear model predicts the *margin* ``m = ln((max pipe % + 1)
/ (DRAM % + 1))`` (positive = compute side), a continuous target that GPM gives for every training
window, from inputs with a physical reading: memory-controller activity, the clock (the power cap
pulls it down when the pipes draw more than the limit), the power, the power the chip would draw at
full clock (``demand``) against what memory traffic explains, and (since issue 13 round 2) how much
power, clock and memory activity vary inside the window and how long the power cap held.
``P(memory) = Phi(-m_hat / sigma)`` where sigma is the out-of-family residual spread, so a window
predicted close to the ridge gets a probability close to 1/2 whatever the training families were
(round 3's recipe, not shipped, made sigma depend on the window, ``SPREAD_MAP``, and added
``util_gpu_pct`` as an input). A
ridge regression (a handful of coefficients) extrapolates smoothly to families it never saw, where
trees stay flat at their last leaf.

Everything is numpy; the fitted map is plain data in model.json (numbers rounded to 9
significant digits so that a rebuild on another BLAS writes the same bytes).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from wattclass.classifier.calibration import significant
from wattclass.classifier.features import FEATURES

F64 = npt.NDArray[np.float64]

#: Every input the margin map can use, derived from FEATURES columns (see ``margin_inputs``). A
#: fitted map names its own (model.json ``margin.inputs``), so older model files keep working.
KNOWN_INPUTS: tuple[str, ...] = (
    "util_mem_pct", "clock_frac", "power_frac", "demand", "demand_excess", "mem_per_demand",
    "power_std_frac", "clock_std_frac", "util_mem_std_pct", "throttle_power_frac", "util_gpu_pct",
)
#: Inputs of h200-20261130-margin (issue 13, first round): the six of the mean power and clock.
MARGIN_INPUTS_R1: tuple[str, ...] = KNOWN_INPUTS[:6]
#: Inputs a new map is fitted on. Issue 13 round 2 added the within-window dynamics of the 1 s
#: polls the daemon writes (spread of power, clock and memory-controller activity) and the
#: power-cap share: a capped GEMM's power hunts around the limit while streaming draws steadily,
#: which told the skinny fp32 GEMMs just past the ridge from eager training in leave-one-family-out
#: (docs/benchmarks.md, issue 13 round 2). A map on more than MARGIN_INPUTS_R1 carries a
#: ``fallback`` map on those six for windows without the spreads (telemetry written before the
#: daemon recorded them, one-poll stubs): a training median standing in for a missing spread
#: cost 3 of 66 jobs on the live-NVML check.
#: Inputs of h200-20261130-lenweight (issue 13 round 2, shipped) and -cweight (round 4): the six plus the
#: spreads and the power-cap share.
MARGIN_INPUTS_R2: tuple[str, ...] = KNOWN_INPUTS[:10]
#: Round 3's recipe (h200-20261130-spread, not shipped: it failed its registered no-regression
#: rule on the round-3 test set, docs/benchmarks.md) added ``util_gpu_pct`` (the share of time a
#: kernel runs): a random gather or sparse kernel keeps the SMs "busy" at full clock while it
#: waits on memory latency, drawing mid power with modest memory-controller activity.
MARGIN_INPUTS_R3: tuple[str, ...] = KNOWN_INPUTS
MARGIN_INPUTS: tuple[str, ...] = MARGIN_INPUTS_R2
#: Ridge penalty on standardised inputs: 3 since issue 13 round 2, chosen on leave-one-family-out
#: of the 276 H200 jobs (1, 3, 5, 10 compared; 10, fixed on the first 134 jobs, was
#: h200-20261130-margin's: ``bench/eval_families.py --shipped-margin`` sets it back). The fitted
#: model records its own in model.json, so this constant only matters when training.
RIDGE_ALPHA = 3.0
#: Folds for the out-of-family residual spread (sigma).
SIGMA_FOLDS = 5
#: Window-dependent sigma (issue 13 round 3; model.json ``margin.spread``): a second ridge map
#: predicts ln(residual^2) of the out-of-family residuals from the same inputs, so sigma is wide
#: where held-out families were mispredicted (next to the ridge, unthrottled mid power) and far
#: from the data (the map is linear in the inputs: sigma grows on the way out of the training
#: cloud), narrow where they were not. True fits it; a map without a ``spread``
#: (h200-20261130-margin, -lenweight) keeps its one sigma. Off by default: round 3's recipe used
#: it and was not shipped (``bench/eval_families.py --round3-recipe`` turns it on).
SPREAD_MAP = False
#: Ridge penalty of the spread map (heavier than the margin map's: ln r^2 is noisy).
SPREAD_ALPHA = 10.0
#: A window's sigma never falls below this share of the map's overall sigma.
SPREAD_FLOOR_RATIO = 0.5
#: Added to squared residuals before the log (a residual of zero has no log).
SPREAD_EPS = 1e-3
#: Clock share below which ``demand`` stops growing (a guard, never reached on an H200: 0.68).
MIN_CLOCK_FRAC = 0.3


def roofline_margin(pipes: list[F64], dram_pct: F64) -> F64:
    """The GPM roofline margin ln((max pipe + 1) / (DRAM + 1)); NaN where GPM is missing."""
    busiest = np.full(np.shape(dram_pct), np.nan)
    for p in pipes:
        busiest = np.fmax(busiest, np.asarray(p, dtype=np.float64))
    dram = np.asarray(dram_pct, dtype=np.float64)
    return np.asarray(np.log((busiest + 1.0) / (dram + 1.0)), dtype=np.float64)


def margin_inputs(X: npt.ArrayLike, names: Sequence[str] | None = None) -> F64:
    """The ``names`` columns (default MARGIN_INPUTS; each one of KNOWN_INPUTS) from a FEATURES matrix.

    ``demand`` = power_frac / clock_frac^2: dynamic power grows with clock x voltage^2, so a chip
    held below its clock by the cap would draw more at full clock; memory-bound work runs at full
    clock and its power is mostly explained by memory traffic (``demand_excess`` = demand -
    util_mem share; ``mem_per_demand`` = util_mem share / demand). The spreads are the FEATURES
    of the same name (NaN in telemetry written before the daemon recorded them: the map then
    uses its training median).
    """
    names = MARGIN_INPUTS if names is None else tuple(names)
    unknown = [n for n in names if n not in KNOWN_INPUTS]
    if unknown:
        raise ValueError(f"unknown margin input(s) {', '.join(unknown)} (known: {', '.join(KNOWN_INPUTS)})")
    x = np.asarray(X, dtype=np.float64)
    col = {f: x[:, i] for i, f in enumerate(FEATURES)}
    um = col["util_mem_pct"] / 100.0
    demand = col["power_frac"] / np.maximum(col["clock_frac"], MIN_CLOCK_FRAC) ** 2
    derived = {"demand": demand, "demand_excess": demand - um,
               "mem_per_demand": um / np.maximum(demand, 0.05)}
    return np.column_stack([derived[n] if n in derived else col[n] for n in names])


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
    # an input no window has (telemetry older than the spreads): 0. Not through
    # warnings.catch_warnings: folds fit in threads, and it is not thread-safe.
    has = ~np.isnan(inp).all(axis=0)
    med = np.zeros(inp.shape[1])
    med[has] = np.nanmedian(inp[:, has], axis=0)
    Z = np.where(np.isnan(inp), med, inp)
    mu, sd = Z.mean(axis=0), Z.std(axis=0) + 1e-9
    coef, icpt = _solve((Z - mu) / sd, y, w, alpha)

    def predict(J: F64) -> F64:
        return np.asarray(((np.where(np.isnan(J), med, J) - mu) / sd) @ coef + icpt, dtype=np.float64)

    predict.params = {"median": med, "mean": mu, "scale": sd, "coef": coef, "intercept": icpt}  # type: ignore[attr-defined]
    return predict


def fit_margin(X: npt.ArrayLike, margin: npt.ArrayLike, weight: npt.ArrayLike, fold: npt.ArrayLike,
               alpha: float | None = None, inputs: Sequence[str] | None = None) -> dict[str, Any]:
    """Fit the margin map on active windows; sigma from the residuals on held-out ``fold`` groups.

    ``fold``: a fold number per window (whole families per fold, so sigma says how far off the
    map is on kinds of work it did not see). ``alpha`` and ``inputs`` default to RIDGE_ALPHA and
    MARGIN_INPUTS as they are when called.
    """
    alpha = RIDGE_ALPHA if alpha is None else alpha
    names = tuple(MARGIN_INPUTS if inputs is None else inputs)
    inp = margin_inputs(X, names)
    y = np.asarray(margin, dtype=np.float64)
    w = np.asarray(weight, dtype=np.float64)
    f = np.asarray(fold)
    resid = np.zeros(len(y))
    for k in np.unique(f):
        te = f == k
        if (~te).sum() > len(names):
            resid[te] = y[te] - _fit_map(inp[~te], y[~te], w[~te], alpha)(inp[te])
    sigma = math.sqrt(float(np.average(resid ** 2, weights=w))) if len(y) else 1.0
    p = _fit_map(inp, y, w, alpha).params  # type: ignore[attr-defined]
    spread = _fit_spread(inp, resid, w) if SPREAD_MAP and len(y) > len(names) else None
    out: dict[str, Any] = {
        "inputs": list(names),
        "alpha": alpha,
        "median": [significant(v) for v in p["median"]],
        "mean": [significant(v) for v in p["mean"]],
        "scale": [significant(v) for v in p["scale"]],
        "coef": [significant(v) for v in p["coef"]],
        "intercept": significant(p["intercept"]),
        "sigma": significant(max(sigma, 1e-3)),
    }
    if spread is not None:
        out["spread"] = spread
    if set(names) - set(MARGIN_INPUTS_R1):
        # windows without the spreads (telemetry older than them, one-poll stubs) get a map that
        # never saw them, instead of the training median standing in for a spread
        out["fallback"] = fit_margin(X, y, w, f, alpha, MARGIN_INPUTS_R1)
    return out


def _fit_spread(inp: F64, resid: F64, w: F64) -> dict[str, Any]:
    """The spread map: ridge of ln(residual^2 + SPREAD_EPS) on the inputs, its intercept shifted so
    that the weighted mean of residual^2 / predicted variance is 1 (the out-of-family residuals
    are, on average, as wide as it says)."""
    ly = np.log(resid ** 2 + SPREAD_EPS)
    fit = _fit_map(inp, ly, w, SPREAD_ALPHA)
    shift = math.log(float(np.average(resid ** 2 / np.exp(fit(inp)), weights=w)))
    p = fit.params  # type: ignore[attr-defined]
    return {
        "alpha": SPREAD_ALPHA,
        "floor_ratio": SPREAD_FLOOR_RATIO,
        "median": [significant(v) for v in p["median"]],
        "mean": [significant(v) for v in p["mean"]],
        "scale": [significant(v) for v in p["scale"]],
        "coef": [significant(v) for v in p["coef"]],
        "intercept": significant(p["intercept"] + shift),
    }


def _sigma_one(inp: F64, m: Mapping[str, Any]) -> F64:
    """Sigma per window: the map's one ``sigma``, or its ``spread`` map's (at least
    ``floor_ratio`` x sigma) where it has one."""
    sigma = float(m["sigma"])
    sp = m.get("spread")
    if not isinstance(sp, Mapping) or not len(inp):
        return np.full(len(inp), sigma)
    med, mu, sd, coef = (np.asarray(sp[k], dtype=np.float64) for k in ("median", "mean", "scale", "coef"))
    logvar = ((np.where(np.isnan(inp), med, inp) - mu) / sd) @ coef + float(sp["intercept"])
    with np.errstate(over="ignore"):
        s = np.sqrt(np.exp(np.minimum(logvar, 50.0)))
    return np.asarray(np.maximum(s, float(sp["floor_ratio"]) * sigma), dtype=np.float64)


def _predict_one(X: npt.ArrayLike, m: Mapping[str, Any]) -> F64:
    inp = margin_inputs(X, m.get("inputs") or MARGIN_INPUTS_R1)
    med, mu, sd, coef = (np.asarray(m[k], dtype=np.float64) for k in ("median", "mean", "scale", "coef"))
    return np.asarray(((np.where(np.isnan(inp), med, inp) - mu) / sd) @ coef + float(m["intercept"]),
                      dtype=np.float64)


def margin_and_sigma(X: npt.ArrayLike, m: Mapping[str, Any]) -> tuple[F64, F64]:
    """Predicted roofline margin and its sigma per window: the map's own (sigma from its
    ``spread`` map where it has one), or, where one of its inputs beyond MARGIN_INPUTS_R1 is
    missing, its ``fallback`` map's (fitted on those six, with its own spread map)."""
    pred = _predict_one(X, m)
    sigma = _sigma_one(margin_inputs(X, m.get("inputs") or MARGIN_INPUTS_R1), m)
    fb = m.get("fallback")
    extra = [n for n in m.get("inputs") or [] if n not in MARGIN_INPUTS_R1]
    if isinstance(fb, Mapping) and extra and len(pred):
        use = np.isnan(margin_inputs(X, extra)).any(axis=1)
        if use.any():
            xu = np.asarray(X)[use]
            pred[use] = _predict_one(xu, fb)
            sigma[use] = _sigma_one(margin_inputs(xu, fb.get("inputs") or MARGIN_INPUTS_R1), fb)
    return pred, sigma


def predict_margin(X: npt.ArrayLike, m: Mapping[str, Any]) -> F64:
    """Predicted roofline margin per window (FEATURES matrix in; the map's own inputs)."""
    return margin_and_sigma(X, m)[0]


def memory_probability(X: npt.ArrayLike, m: Mapping[str, Any]) -> F64:
    """P(memory-bound | active) per window: Phi(-margin_hat / sigma)."""
    from scipy.special import ndtr  # only where the model predicts: labelling by the rule needs no SciPy

    pred, sigma = margin_and_sigma(X, m)
    return np.asarray(ndtr(-pred / sigma), dtype=np.float64)
