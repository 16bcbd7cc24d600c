"""Calibration of job confidences and its measure (ECE): Platt maps, pooled and per predicted label.

Why a module of its own: the maps are fitted on out-of-fold predictions by the model's
cross-validation, applied by the model at labelling time, and measured by the evaluations in
bench/; none of that needs LightGBM.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from wattclass.classifier import rules
from wattclass.errors import DataError

F64 = npt.NDArray[np.float64]

#: Weight of the pull of the calibration map towards the identity (guards against tiny data sets).
CAL_PRIOR = 0.1


def _logit(p: F64) -> F64:
    p = np.clip(p, 1e-6, 1 - 1e-6)
    return np.asarray(np.log(p / (1 - p)), dtype=np.float64)


#: The Platt map's box: a slope that keeps the map increasing and short of a step, an offset of
#: at most 10 logits.
CAL_BOUNDS = ((0.05, 20.0), (-10.0, 10.0))
#: Significant digits of the fitted figures model.json keeps (``significant``: these maps, the CV's
#: ECE, the margin map's coefficients): the fits are exact to ~1e-15, but their inputs' last bits
#: differ between CPUs (numpy's exp and log have SIMD versions chosen at run time), and the shipped
#: model must rebuild byte for byte on any machine (issue 13).
CAL_DIGITS = 9


def _platt_loss(ab: F64, z: F64, t: F64) -> float:
    """The penalised Platt negative log-likelihood at ``ab`` (what the line search and the box's
    edges compare: no gradient or Hessian needed)."""
    s = ab[0] * z + ab[1]
    return float(np.sum(np.logaddexp(0.0, s) - t * s) + CAL_PRIOR * ((ab[0] - 1.0) ** 2 + ab[1] ** 2))


def _platt_terms(ab: F64, z: F64, t: F64) -> tuple[float, F64, F64]:
    """Loss, gradient and Hessian of the penalised Platt negative log-likelihood at ``ab``."""
    s = ab[0] * z + ab[1]
    p = 0.5 * (1.0 + np.tanh(0.5 * s))  # sigmoid, stable at both ends
    r, w = p - t, p * (1.0 - p)
    loss = _platt_loss(ab, z, t)
    grad = np.array([np.sum(r * z) + 2 * CAL_PRIOR * (ab[0] - 1.0), np.sum(r) + 2 * CAL_PRIOR * ab[1]])
    wz = np.sum(w * z)
    hess = np.array([[np.sum(w * z * z) + 2 * CAL_PRIOR, wz], [wz, np.sum(w) + 2 * CAL_PRIOR]])
    return loss, grad, hess


def _newton(z: F64, t: F64, ab: F64, free: list[int]) -> F64:
    """Minimise the Platt loss over the coordinates ``free`` of ``ab`` (the others held): Newton
    steps with backtracking, until the step is below 1e-14. The loss is strictly convex (the
    prior), so this is its unique minimum on that line or plane, to the last bits. The 2 x 2
    algebra is written out: BLAS and LAPACK pick their kernels by CPU, and with them their
    rounding."""
    x = ab.copy()
    for _ in range(200):
        loss, g, h = _platt_terms(x, z, t)
        step = np.zeros(2)
        if len(free) == 2:
            det = h[0, 0] * h[1, 1] - h[0, 1] * h[1, 0]
            step[0] = -(h[1, 1] * g[0] - h[0, 1] * g[1]) / det
            step[1] = -(h[0, 0] * g[1] - h[1, 0] * g[0]) / det
        else:
            step[free[0]] = -g[free[0]] / h[free[0], free[0]]
        slope = float(g[0] * step[0] + g[1] * step[1])
        size = 1.0
        # Armijo backtracking, blind below the loss's own rounding: near the minimum the loss
        # cannot tell a full Newton step from none, and halving it there would stall the fit
        noise = 1e-12 * max(1.0, abs(loss))
        while size > 1e-10 and _platt_loss(x + size * step, z, t) > loss + 1e-4 * size * slope + noise:
            size /= 2
        x = x + size * step
        if max(abs(size * step[0]), abs(size * step[1])) <= 1e-14 * (1.0 + max(abs(x[0]), abs(x[1]))):
            return x
    # a strictly convex loss of two values converges in a few steps (3-15 seen): a fit that does
    # not must never be stored as if it had
    raise DataError(f"calibration fit did not converge in 200 Newton steps over {len(z)} jobs "
                    f"(at a={x[0]!r}, b={x[1]!r})")


def fit_calibration(conf: npt.ArrayLike, correct: npt.ArrayLike) -> dict[str, float]:
    """Platt map p' = sigmoid(a * logit(p) + b), with a weak pull (CAL_PRIOR) to the identity (a=1, b=0),
    within CAL_BOUNDS.

    Why Newton and not a general optimiser: the loss is smooth and strictly convex in two
    values, so Newton reaches its one minimum exactly, where L-BFGS-B (SciPy, used until
    2026-12-01) stopped at its tolerance, about 1e-7 away, at a point that moved with the last
    bits of its inputs: the shipped model's maps came out different on another CPU. Within the
    box the minimum is the unconstrained one if it lies inside, else the best of the four edges'
    own minima (the loss is convex, so the box's minimum lies on an edge), each clamped to its
    edge. Stored to CAL_DIGITS significant digits.
    """
    c = np.asarray(conf, dtype=np.float64)
    if not np.isfinite(c).all():
        raise DataError(f"calibration fit: {int((~np.isfinite(c)).sum())} of {len(c)} job confidences are "
                        "not finite numbers")
    z = _logit(c)
    t = np.asarray(correct, dtype=np.float64)
    if len(z) == 0:
        return {"a": 1.0, "b": 0.0}
    lo = np.array([CAL_BOUNDS[0][0], CAL_BOUNDS[1][0]])
    hi = np.array([CAL_BOUNDS[0][1], CAL_BOUNDS[1][1]])
    x = _newton(z, t, np.array([1.0, 0.0]), [0, 1])
    if np.any(x < lo) or np.any(x > hi):
        edges = []
        inside = np.clip(np.array([1.0, 0.0]), lo, hi)  # the identity map, where the box allows
        for held in (0, 1):
            for bound in (lo[held], hi[held]):
                start = inside.copy()
                start[held] = bound
                e = np.clip(_newton(z, t, start, [1 - held]), lo, hi)
                edges.append((_platt_loss(e, z, t), e))
        x = min(edges, key=lambda le: le[0])[1]
    return {"a": significant(float(x[0])), "b": significant(float(x[1]))}


def significant(v: float) -> float:
    """``v`` to CAL_DIGITS significant digits (NaN stays NaN), as model.json stores a fitted figure."""
    return float(f"{v:.{CAL_DIGITS}g}")


#: A predicted label gets its own calibration map once the out-of-fold data has this many jobs of it.
MIN_JOBS_PER_LABEL_MAP = 8


def fit_calibration_by_label(conf: npt.ArrayLike, correct: npt.ArrayLike,
                             labels: npt.ArrayLike) -> dict[str, Any]:
    """One Platt map over all jobs plus one per predicted label (``by_label``, label name keys).

    Why per label (issue 13): the two errors cost differently. A job called ``memory`` gets capped,
    so if memory calls are wrong more often than compute calls their confidence must say so, and
    the policy's single ``min_confidence`` then asks more evidence of the costly direction.
    """
    c = np.asarray(conf, dtype=np.float64)
    t = np.asarray(correct, dtype=bool)
    lab = np.asarray(labels, dtype=np.int64)
    cal: dict[str, Any] = dict(fit_calibration(c, t))
    by_label = {}
    for code, name in enumerate(rules.JOB_LABELS):
        m = lab == code
        if m.sum() >= MIN_JOBS_PER_LABEL_MAP:
            by_label[name] = fit_calibration(c[m], t[m])
    if by_label:
        cal["by_label"] = by_label
    return cal


def apply_calibration(conf: npt.ArrayLike, cal: Mapping[str, Any] | None,
                      labels: npt.ArrayLike | None = None) -> F64:
    """Calibrated confidence; with ``labels`` (job label codes) each label's own map where fitted."""
    c = np.asarray(conf, dtype=np.float64)
    if not cal:
        return c
    a = np.full(c.shape, float(cal["a"]))
    b = np.full(c.shape, float(cal["b"]))
    if labels is not None and cal.get("by_label"):
        lab = np.asarray(labels, dtype=np.int64)
        for name, ab in cal["by_label"].items():
            m = lab == rules.JOB_LABELS.index(name)
            a[m], b[m] = ab["a"], ab["b"]
    s = a * _logit(c) + b
    return np.asarray(1.0 / (1.0 + np.exp(-s)), dtype=np.float64)


def ece(conf: npt.ArrayLike, correct: npt.ArrayLike, n_bins: int = 10) -> float:
    """Expected calibration error: bin-size-weighted |accuracy - mean confidence| over 10 bins."""
    c = np.asarray(conf, dtype=np.float64)
    t = np.asarray(correct, dtype=np.float64)
    if len(c) == 0:
        return float("nan")
    bins = np.minimum((c * n_bins).astype(int), n_bins - 1)
    total = 0.0
    for b in range(n_bins):
        m = bins == b
        if m.any():
            total += m.sum() / len(c) * abs(t[m].mean() - c[m].mean())
    return float(total)


def ece_of_draws(conf: npt.ArrayLike, hits: npt.ArrayLike, n_bins: int = 10) -> F64:
    """``ece(conf, row)`` for every row of ``hits`` (draws x jobs, right or wrong), at once: one-hot
    bins (jobs x bins) turn ``ece``'s loop over bins into one product over all draws."""
    c = np.asarray(conf, dtype=np.float64)
    h = np.asarray(hits, dtype=np.float64)
    bins = np.minimum((c * n_bins).astype(int), n_bins - 1)
    onehot = np.zeros((len(c), n_bins))
    onehot[np.arange(len(c)), bins] = 1.0
    count = onehot.sum(axis=0)
    conf_mean = (c @ onehot) / np.maximum(count, 1)
    acc = (h @ onehot) / np.maximum(count, 1)
    return np.asarray((count / len(c) * np.abs(acc - conf_mean)).sum(axis=1), dtype=np.float64)


#: Draws of ``ece_noise_floor``: enough for its mean and 95th percentile to two decimals.
ECE_FLOOR_DRAWS = 2000


def ece_noise_floor(conf: npt.ArrayLike, n_bins: int = 10, draws: int = ECE_FLOOR_DRAWS,
                    seed: int = 0) -> dict[str, float]:
    """The ECE a *perfectly calibrated* model would show on these jobs: its mean and 95th percentile.

    Why: ECE over a test set of tens of jobs is mostly noise. Each job is right or wrong, so even a
    model whose confidences are exact probabilities scores an ECE above zero, the more so the fewer
    jobs a bin holds (86 jobs of confidences spread evenly over 0.55-1: 0.07 on average, 0.12 at
    the 95th percentile). Against this floor an evaluation can say whether
    its ECE shows miscalibration (above the 95th percentile) or only the set's size. Each draw
    makes every job right with probability equal to its confidence and measures ``ece``; seeded,
    so a report is reproducible.
    """
    c = np.asarray(conf, dtype=np.float64)
    if len(c) == 0:
        return {"mean": float("nan"), "p95": float("nan")}
    hits = np.random.default_rng(seed).random((draws, len(c))) < c
    values = ece_of_draws(c, hits, n_bins)
    return {"mean": float(values.mean()), "p95": float(np.quantile(values, 0.95))}
