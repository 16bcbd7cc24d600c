# long: data set, folds, CV, both model kinds and the file format are one contract (split: import cycles)
"""The LightGBM model that labels jobs where GPM is missing, and its evaluation.

Why a *window-level* model aggregated to jobs (not one row per job): real training data is a few
dozen jobs, far too few rows for a job-level model over four classes (the development set has one
``mixed`` job). Windows give hundreds of rows; the model predicts the GPM rule's *window* class
(idle/compute/memory) from basic NVML columns, and the job label is the docs/design.md job rule applied
to the windows' predicted classes (``job_from_counts``). So ``mixed`` needs no training
examples of its own: it emerges from a job's windows, as it does for the rule. Training weights
every job equally (long jobs do not drown short ones).

Evaluation is cross-validation grouped by job (``job_folds``: no job's windows on both sides;
stratified by the job's rule label) and reports job-level accuracy, the confusion matrix and
the expected calibration error (ECE) of the job confidence. Confidences are recalibrated with a
two-parameter logistic map on out-of-fold predictions (Platt scaling of logit(confidence));
the reported ECE is cross-fitted (each fold's map is fitted on the other folds), so it is honest.

Kinds (issue 13): ``lightgbm-window-multiclass`` is the LightGBM window classifier described
here; ``roofline-margin`` (the shipped kind) replaces its compute/memory split by the regression
of the GPM roofline margin in classifier/margin.py behind a binary idle-vs-active booster. Both
give window probabilities over idle/compute/memory, so everything downstream is the same.

Model files: ``model.txt`` (LightGBM text) + ``model.json`` (metadata: format version, wattclass
version, kind, features, classes, calibration, margin map, metrics, training data summary). A file
written by a newer format version is refused with a message that says so.
"""

from __future__ import annotations

import functools
import json
import math
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, TypeVar

import numpy as np
import numpy.typing as npt

from wattclass import __version__
from wattclass.classifier import lgbload, rules
from wattclass.classifier.ambiguity import check_ambiguity, lower_confidence
from wattclass.classifier.calibration import apply_calibration, ece, fit_calibration_by_label, significant
from wattclass.classifier.features import FEATURES
from wattclass.classifier.margin import SIGMA_FOLDS, fit_margin, memory_probability
from wattclass.errors import DataError
from wattclass.fsutil import atomic_write_text

if TYPE_CHECKING:  # LightGBM loads only to train or predict, without scikit-learn (lgbload)
    import lightgbm as lgb

#: The newest model-file format this wattclass reads. 2: the roofline-margin kind (its model.json
#: carries the margin map, and an older wattclass would read its binary booster as the multiclass
#: one); multiclass models are still written as format 1, so an older wattclass keeps reading them.
#: 3: a model with an ``ambiguity`` check (classifier/ambiguity.py, issue 13 round 6): an older
#: wattclass would ignore it and act on confidences the model says are too high, so it refuses the
#: file; models without the check keep format 1 or 2 (every shipped model since round 6 has it).
#: 4: a model whose job confidence counts a job of more than ``evidence_cap_windows`` windows as
#: that long (issue 13 round 10): an older wattclass would let a long job's confidence grow past what the
#: calibration maps were fitted on, so it refuses the file.
FORMAT_VERSION = 4
FORMAT_AMBIGUITY = 3
FORMAT_EVIDENCE_CAP = 4
MODEL_FILE = "model.txt"
META_FILE = "model.json"

#: Small trees, strong regularisation: the training set is a few thousand windows at most.
DEFAULT_PARAMS: dict[str, Any] = {
    "objective": "multiclass",
    "num_class": len(rules.WINDOW_CLASSES),
    "learning_rate": 0.05,
    "num_leaves": 7,
    "max_depth": 4,
    "min_data_in_leaf": 3,
    "min_sum_hessian_in_leaf": 1e-3,
    "lambda_l2": 1.0,
    "feature_fraction": 0.9,
    "bagging_fraction": 0.9,
    "bagging_freq": 1,
    "verbosity": -1,
    # One thread: the data is tiny, and OpenMP threads spin-waiting on a busy 2-core node cost
    # minutes of CPU (measured: a 3 s nightly took 166 s beside another CPU-bound process).
    "num_threads": 1,
    "seed": 7,
    "deterministic": True,
}
NUM_ROUNDS = 150

#: Model kinds. ``lightgbm-window-multiclass``: one LightGBM over idle/compute/memory windows
#: (h200-20261130 and before). ``roofline-margin`` (issue 13): LightGBM idle-vs-active with the
#: same settings, then P(memory | active) from the regression of the GPM roofline margin in
#: classifier/margin.py.
KIND_MULTICLASS = "lightgbm-window-multiclass"
KIND_MARGIN = "roofline-margin"
MODEL_KINDS: tuple[str, ...] = (KIND_MULTICLASS, KIND_MARGIN)
#: What ``wattclass model train`` builds and the shipped model is: roofline-margin since issue 13
#: (chosen on leave-one-family-out of the 134 jobs before the 61 held-out runs were looked at;
#: docs/benchmarks.md, docs/measurements/issue13-preregistration-2026-11-30.md).
DEFAULT_KIND = KIND_MARGIN
#: The job aggregation ``wattclass model train`` writes (see AGGREGATIONS below): length-weighted
#: since issue 13 round 2 (chosen on leave-one-family-out of the 276 H200 jobs;
#: docs/measurements/issue13-preregistration-round2-2026-11-30.md).
DEFAULT_AGGREGATION = "length-weighted"
#: Whether ``wattclass model train`` chooses a cost-aware compute weight (``choose_compute_weight``
#: on the family-grouped out-of-fold predictions; model.json ``compute_weight``). Off, as in rounds
#: 1 and 2. Round 3's recipe turned it on (``bench/eval_families.py --round3-recipe``): once the
#: round-2 test families (random gathers, sparse, memory-bound 3-D convolutions) joined training,
#: they share NVML readings with unthrottled mid-power compute work, and leave-one-family-out of
#: the 442 H200 jobs called 6 compute-bound jobs memory-bound without it, 2 with it. That recipe
#: failed its registered no-regression rule on the round-3 test set and was not shipped
#: (docs/benchmarks.md, issue 13 round 3).
DEFAULT_COST_AWARE = False
#: The fixed weight on the compute window probability a model is trained with when the weight is
#: not chosen per training set (``cost_aware`` off); model.json ``compute_weight``, which the
#: model applies to every window it labels. 1.0 (none): round 4 chose 1.25 (below), but its model
#: failed its registered shipping rule on the round-4 test set (``fresh4``: one compute-bound job
#: called memory-bound where the shipped model called none), so the shipped recipe stays round 2's.
#: Round 4's reasoning, kept for the record: with the two former test
#: sets (latency-bound gathers, sparse SpMM, 3-D convolutions, ...) in training, the ridge moves
#: towards unthrottled mid-power work and leave-one-family-out of the 513 H200 jobs called 9
#: compute-bound jobs memory-bound (DLRM-like mixes, GEMMs at the ridge, wide decode) at weight
#: 1, 3 at 1.25. Chosen on a fixed grid (1 to 2) as the weight of least issue-13 cost (wrong jobs
#: + 4 extra per compute job called memory) on leave-one-family-out among the weights that lose
#: no accepted call on either former test set held out whole; the weight chosen per training set
#: (round 3) came out at 2 and lost those sets (docs/measurements/
#: issue13-preregistration-round4-2026-11-30.md). ``bench/eval_families.py --round2-recipe``: 1.
DEFAULT_COMPUTE_WEIGHT = 1.0
#: model.json ``cv_grouping`` values whose calibration maps were fitted on out-of-fold predictions
#: with whole recording folders held out (``source_groups``; ``wattclass model train --calibration
#: source``). A nightly candidate keeps such an incumbent's maps (classifier/nightly.py): its own
#: sample has no folders, and a job-grouped CV would fit optimistic maps (issue 13 round 5).
SET_OUT_GROUPINGS: tuple[str, ...] = ("source",)
#: Training uses only windows at least this long (see TrainingSet.trainable); jobs' truth uses all.
MIN_TRAIN_WINDOW_S = 5.0

A = TypeVar("A")
B = TypeVar("B")
F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


@dataclass
class TrainingSet:
    """Windows with a GPM rule label: X (n x FEATURES), y (window class), group (job key)."""

    X: F32
    y: npt.NDArray[np.int8]
    group: npt.NDArray[np.object_]
    sources: list[str] = field(default_factory=list)
    #: Window lengths in seconds (NaN or None = unknown, treated as a full window).
    dur: F64 | None = None
    #: GPM roofline margin per window (``margin.roofline_margin``; None = not recorded): the
    #: target of the roofline-margin model's second stage.
    margin: F64 | None = None

    def __len__(self) -> int:
        return len(self.y)

    def subset(self, mask: npt.NDArray[np.bool_] | npt.NDArray[np.intp]) -> TrainingSet:
        """The windows of ``mask``: a boolean mask, or row indices (taken in their order)."""
        dur = None if self.dur is None else self.dur[mask]
        margin = None if self.margin is None else self.margin[mask]
        return TrainingSet(self.X[mask], self.y[mask], self.group[mask], self.sources, dur, margin)

    def trainable(self, min_window_s: float = 0.0) -> npt.NDArray[np.bool_]:
        """Windows fit to learn from: at least ``min_window_s`` long (unknown lengths pass).

        Why: the daemon takes GPM snapshots per period, so a short segment of a job at a job
        boundary carries GPM that is mostly the neighbouring job's (or the gap's); its rule label
        says little about its own NVML readings.
        """
        if self.dur is None or min_window_s <= 0:
            return np.ones(len(self), dtype=bool)
        return np.asarray(~(self.dur < min_window_s), dtype=bool)

    def job_truth(self) -> tuple[npt.NDArray[np.object_], npt.NDArray[np.int8]]:
        """(job keys, job label codes by the rule over each job's windows)."""
        keys, inv = np.unique(self.group, return_inverse=True)
        counts = np.zeros((len(keys), 3))
        np.add.at(counts, (inv, self.y.astype(np.int64)), 1.0)
        return keys, rules.job_labels(counts[:, 0], counts[:, 1], counts[:, 2])

    @staticmethod
    def concat(sets: Sequence[TrainingSet]) -> TrainingSet:
        sets = [s for s in sets if len(s)]
        if not sets:
            return TrainingSet(np.zeros((0, len(FEATURES)), np.float32), np.zeros(0, np.int8),
                               np.zeros(0, object))
        return TrainingSet(
            np.concatenate([s.X for s in sets]),
            np.concatenate([s.y for s in sets]),
            np.concatenate([s.group for s in sets]),
            [src for s in sets for src in s.sources],
            None if all(s.dur is None for s in sets) else np.concatenate(
                [s.dur if s.dur is not None else np.full(len(s), np.nan) for s in sets]),
            None if all(s.margin is None for s in sets) else np.concatenate(
                [s.margin if s.margin is not None else np.full(len(s), np.nan) for s in sets]),
        )


# --------------------------------------------------------------------------- model


def _job_weights(group: npt.NDArray[np.object_]) -> F64:
    _, inv, cnt = np.unique(group, return_inverse=True, return_counts=True)
    w = 1.0 / cnt[inv]
    return np.asarray(w / w.mean(), dtype=np.float64)


def fit_booster(
    ts: TrainingSet, params: Mapping[str, Any] | None = None, rounds: int = NUM_ROUNDS
) -> lgb.Booster:
    """Train the window classifier on a training set (every job weighted equally)."""
    lgbload.core()  # without scikit-learn (lgbload); the import below then finds it loaded
    import lightgbm as lgb

    if len(np.unique(ts.y)) < 2:
        raise DataError("training set has windows of fewer than two classes; cannot train a model")
    p = dict(DEFAULT_PARAMS if params is None else params)
    data = lgb.Dataset(ts.X, label=ts.y.astype(np.int64), weight=_job_weights(ts.group),
                       feature_name=list(FEATURES), free_raw_data=True)
    return lgb.train(p, data, num_boost_round=rounds)


def format_version_for(kind: str, ambiguity: bool = False, evidence_cap: bool = False) -> int:
    """The model-file format a model of ``kind`` (with an ambiguity check or not, with an evidence
    cap or not) is written in (see FORMAT_VERSION)."""
    if evidence_cap:
        return FORMAT_EVIDENCE_CAP
    if ambiguity:
        return FORMAT_AMBIGUITY
    return 1 if kind == KIND_MULTICLASS else 2


def stage_params(kind: str, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """LightGBM parameters of a kind's booster (the roofline-margin model's is binary)."""
    p = dict(DEFAULT_PARAMS if params is None else params)
    if kind == KIND_MARGIN:
        p.pop("num_class", None)
        p["objective"] = "binary"
    return p


def fit_windows(
    ts: TrainingSet, kind: str = DEFAULT_KIND, params: Mapping[str, Any] | None = None,
    rounds: int = NUM_ROUNDS, families: Mapping[str, str] | None = None,
) -> tuple[lgb.Booster, dict[str, Any] | None]:
    """Fit a window model of ``kind`` on ``ts`` (already the windows to learn from).

    Returns the booster and, for ``roofline-margin``, the margin map (plain data). ``families``
    (job key -> family) groups the folds of the margin map's out-of-family residual spread; jobs
    without one are their own family.
    """
    if kind == KIND_MULTICLASS:
        return fit_booster(ts, params, rounds), None
    if kind != KIND_MARGIN:
        raise DataError(f"unknown model kind {kind!r} (known: {', '.join(MODEL_KINDS)})")
    if ts.margin is None:
        raise DataError("a roofline-margin model needs the GPM roofline margin of its training windows "
                        "(TrainingSet.margin; training.training_set records it)")
    lgbload.core()  # without scikit-learn (lgbload); the import below then finds it loaded
    import lightgbm as lgb

    # One window class only (a retraining sample without idle windows) still trains: LightGBM's
    # binary booster then predicts that class everywhere.
    active = ts.y != rules.IDLE
    data = lgb.Dataset(ts.X, label=active.astype(np.int64), weight=_job_weights(ts.group),
                       feature_name=list(FEATURES), free_raw_data=True)
    booster = lgb.train(stage_params(kind, params), data, num_boost_round=rounds)
    return booster, fit_margin_stage(ts, families)


def fit_margin_stage(ts: TrainingSet, families: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The roofline-margin model's second stage (classifier/margin.py) on the active windows of
    ``ts`` that have a margin; sigma's folds hold out whole families (jobs without one: their own)."""
    if ts.margin is None:
        raise DataError("a roofline-margin model needs the GPM roofline margin of its training windows "
                        "(TrainingSet.margin; training.training_set records it)")
    act = ts.subset(ts.y != rules.IDLE)
    assert act.margin is not None
    act = act.subset(np.isfinite(act.margin))
    assert act.margin is not None
    if len(act) == 0:
        raise DataError("training set has no active window with a GPM roofline margin; "
                        "cannot train a roofline-margin model")
    keys, inv = np.unique(act.group, return_inverse=True)
    fold = family_folds(keys, families or {}, SIGMA_FOLDS)[inv]
    return fit_margin(act.X, act.margin, _job_weights(act.group), fold)


def window_proba(booster: lgb.Booster, kind: str, margin: Mapping[str, Any] | None, X: F32) -> F64:
    """Window class probabilities (idle, compute, memory) of a fitted window model."""
    if len(X) == 0:
        return np.zeros((0, 3))
    p = np.asarray(booster.predict(X, num_threads=1), dtype=np.float64)
    if kind == KIND_MULTICLASS:
        return p
    if margin is None:
        raise DataError("roofline-margin model without its margin map")
    q = memory_probability(X, margin)
    return np.column_stack([1.0 - p, p * (1.0 - q), p * q])


#: Job aggregations (model.json ``aggregation``). ``counts``: the job rule on the windows' argmax
#: classes, every window one count (h200-20261130-margin and before). ``length-weighted`` (issue 13,
#: round 2): the same, except that in the compute/memory split each active window counts
#: ``window_weights`` of its length: a window cut short by the job's start or end holds a second
#: or two of ramp-up or tail, whose power, clock and spread are not the job's; with every window
#: counted whole, such a stub turned two-window memory-bound jobs into ``mixed``.
AGG_COUNTS = "argmax window counts + docs/design.md job rule"
AGG_LENGTH = "argmax window counts, compute/memory split weighted by window length + docs/design.md job rule"
AGGREGATIONS = {"counts": AGG_COUNTS, "length-weighted": AGG_LENGTH}
#: How model files before the design doc moved to docs/ spelled ``counts``.
AGG_COUNTS_OLD = "argmax window counts + DESIGN.md job rule"
#: A window this long or longer counts whole in the length-weighted split (the daemon's default period).
FULL_WINDOW_S = 10.0
#: The least a window counts (a window of unknown or zero length still counts a little).
MIN_WINDOW_WEIGHT = 0.05
#: The evidence cap (issue 13 round 10): this quantile of the training jobs' evidence (their summed
#: window weights, ``job_evidence``). Why: the job confidence is the rule's Beta posterior on the
#: window counts, which treats every window as independent evidence, so it grows with the job's
#: length; but one job's windows repeat one job's error. The calibration maps are fitted on jobs of
#: about one window (the recordings last 8-12 s: median 1.1 windows, 90th percentile 1.3), so a
#: 30 s job's raw confidence lay beyond them. Measured (docs/benchmarks.md, round 10): 45 runs of
#: 30 s from families held out had the same 7 wrong labels whole and cut to 10 s, but the three
#: compute-bound jobs called memory-bound went from 0.85-0.86 confidence cut to 0.98-0.99 whole,
#: past any memory threshold. Capped, a long job is about as sure as the longer jobs the maps were
#: fitted on, no surer. The 90th percentile: the median also lowers the confidence of the short
#: jobs longer than it (pooled ECE 0.032 -> 0.036 leaving one set out, 0.032 at the 90th); the
#: 95th would move up to the long jobs' length as soon as 5% of the training jobs are long (the 21
#: development jobs of 34 s and the 45 of 30 s are 5.9% of 1,127).
EVIDENCE_QUANTILE = 0.9
#: Whether ``cross_validate`` caps the evidence by default (the recipe since round 10; evaluation
#: scripts turn it off to rerun the recipes of rounds 1-9, as they set the margin map's settings).
DEFAULT_CAP_EVIDENCE = True


#: ``evidence_cap`` of ``cross_validate`` and ``train_model``: fit the cap on the training jobs
#: (``evidence_cap_for``); a number (or None: no cap) keeps a given recipe's cap, as the nightly
#: keeps its incumbent's (a fleet sample's jobs are long: refitted there, the cap would rise to
#: their length and undo it).
FIT_CAP: Literal["fit"] = "fit"


def _posterior_counts(ni: F64, nc: F64, nm: F64, wc: F64, wm: F64) -> tuple[F64, F64, F64]:
    """The idle, compute and memory counts the job rule's posterior sees with the length-weighted
    split (``wc``/``wm``: the compute and memory windows' summed weights): those weights, the idle
    count scaled by the active windows' mean weight (see ``job_from_counts``)."""
    act = nc + nm
    with np.errstate(invalid="ignore", divide="ignore"):
        scale = np.where(act > 0, (wc + wm) / np.where(act > 0, act, 1.0), 1.0)
    return ni * scale, wc, wm


def job_evidence(group: npt.NDArray[np.object_], dur_s: npt.ArrayLike | None) -> F64:
    """Each job's evidence in windows (``np.unique(group)`` order): its windows' summed
    ``window_weights`` (its length in full windows), or its window count without lengths -- the
    quantity ``capped_counts`` holds to the cap."""
    _, inv = np.unique(group, return_inverse=True)
    w = np.ones(len(inv)) if dur_s is None else window_weights(dur_s)
    return np.asarray(np.bincount(inv, weights=w), dtype=np.float64)


def evidence_cap_for(group: npt.NDArray[np.object_], dur_s: npt.ArrayLike | None) -> float:
    """The evidence cap of a model trained and calibrated on these jobs (EVIDENCE_QUANTILE)."""
    ev = job_evidence(group, dur_s)
    return round(float(np.quantile(ev, EVIDENCE_QUANTILE)), 4) if len(ev) else 1.0


def resolve_evidence_cap(ts: TrainingSet, aggregation: str,
                         cap: float | Literal["fit"] | None) -> float | None:
    """The cap a model trained on ``ts`` gets: ``FIT_CAP`` fits it (when DEFAULT_CAP_EVIDENCE),
    a number or None is kept as given."""
    if cap == FIT_CAP:
        return (evidence_cap_for(ts.group, aggregation_durations(ts, aggregation))
                if DEFAULT_CAP_EVIDENCE else None)
    return None if cap is None else float(cap)


def capped_counts(ni: F64, nc: F64, nm: F64, cap: float | None, evidence: F64) -> tuple[F64, F64, F64]:
    """The posterior's counts scaled by min(1, cap / ``evidence``) (``evidence``: the job's length in
    windows, ``job_evidence``; ``cap`` None: unchanged). The shares, and so the labels, stay; only
    the posterior's certainty stops growing with length."""
    if cap is None:
        return ni, nc, nm
    n = np.asarray(evidence, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        f = np.where(n > cap, cap / np.where(n > 0, n, 1.0), 1.0)
    return ni * f, nc * f, nm * f


class LengthWeights(NamedTuple):
    """A job's summed ``window_weights`` per argmax class: the length-weighted aggregation's input
    to ``job_from_counts``. All three or none: the idle weights are part of the job's length, which
    the evidence cap is held against."""

    idle: npt.ArrayLike
    compute: npt.ArrayLike
    memory: npt.ArrayLike


def window_weights(dur_s: npt.ArrayLike) -> F64:
    """A window's count in the length-weighted split: min(length / FULL_WINDOW_S, 1), at least
    MIN_WINDOW_WEIGHT; unknown length (NaN) counts whole."""
    d = np.asarray(dur_s, dtype=np.float64)
    w = np.where(np.isnan(d), 1.0, d / FULL_WINDOW_S)
    return np.asarray(np.clip(w, MIN_WINDOW_WEIGHT, 1.0), dtype=np.float64)


def job_from_counts(
    n_idle: npt.ArrayLike, n_compute: npt.ArrayLike, n_memory: npt.ArrayLike, sum_pmax: npt.ArrayLike,
    *, weights: LengthWeights | None = None, evidence_cap: float | None = None,
) -> tuple[npt.NDArray[np.int8], F64]:
    """(job label codes, raw confidence) from the model's per-window decisions.

    Label: the job rule over the windows' argmax classes (hard counts). Confidence: the rule's
    Beta-posterior confidence on those counts times the mean top window probability, i.e. "the
    windows are sure and there are enough of them". Hard counts generalised better than summed
    probabilities in grouped CV on the H200 data (soft counts turn uncertain jobs into ``mixed``).

    ``weights`` (the length-weighted aggregation; None: plain counts): the idle, compute and
    memory windows' summed ``window_weights``. The compute share and its evidence are then the
    weighted compute and memory counts; the idle count is scaled by the active windows' mean
    weight, so the active share (idle or not) stays the plain count's, as in the rule.

    ``evidence_cap`` (the model's ``evidence_cap_windows``; None: none): the counts the posterior
    sees are scaled by min(1, cap / the job's length in windows) (``capped_counts``,
    EVIDENCE_QUANTILE says why); the length is the three summed weights, or the plain window count
    without ``weights`` (as ``job_evidence`` measures it).
    """
    ni, nc, nm = (np.asarray(a, dtype=np.float64) for a in (n_idle, n_compute, n_memory))
    n = ni + nc + nm
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_pmax = np.where(n > 0, np.asarray(sum_pmax, dtype=np.float64) / np.where(n > 0, n, 1), 0.0)
    evidence = n
    if weights is not None:
        wi, wc, wm = (np.asarray(w, dtype=np.float64) for w in weights)
        evidence = wi + wc + wm
        ni, nc, nm = _posterior_counts(ni, nc, nm, wc, wm)
    lab = rules.job_labels(ni, nc, nm)
    return lab, rules.job_confidence(*capped_counts(ni, nc, nm, evidence_cap, evidence), lab) * mean_pmax


def job_predictions(
    proba: F64, group: npt.NDArray[np.object_], dur_s: npt.ArrayLike | None = None,
    evidence_cap: float | None = None,
) -> tuple[npt.NDArray[np.object_], npt.NDArray[np.int8], F64]:
    """(job keys, job label codes, raw confidence) from window probabilities.

    ``dur_s`` (window lengths): the length-weighted aggregation; None: plain counts.
    ``evidence_cap``: see ``job_from_counts``.
    """
    keys, inv = np.unique(group, return_inverse=True)
    top = proba.argmax(axis=1)
    counts = np.zeros((len(keys), 3))
    for k in range(3):
        counts[:, k] = np.bincount(inv, weights=(top == k).astype(np.float64), minlength=len(keys))
    sum_pmax = np.bincount(inv, weights=proba.max(axis=1), minlength=len(keys))
    if dur_s is None:
        lab, conf = job_from_counts(counts[:, 0], counts[:, 1], counts[:, 2], sum_pmax,
                                    evidence_cap=evidence_cap)
        return keys, lab, conf
    w = window_weights(dur_s)
    by_class = LengthWeights(*(np.bincount(inv, weights=w * (top == k), minlength=len(keys))
                               for k in (rules.IDLE, rules.COMPUTE, rules.MEMORY)))
    lab, conf = job_from_counts(counts[:, 0], counts[:, 1], counts[:, 2], sum_pmax, weights=by_class,
                                evidence_cap=evidence_cap)
    return keys, lab, conf


def aggregation_durations(ts: TrainingSet, aggregation: str) -> F64 | None:
    """The window lengths ``job_predictions`` takes for ``aggregation`` (None: plain counts)."""
    if aggregation not in AGGREGATIONS:
        raise DataError(f"unknown job aggregation {aggregation!r} (known: {', '.join(AGGREGATIONS)})")
    if aggregation == "counts":
        return None
    return ts.dur if ts.dur is not None else np.full(len(ts), np.nan)


#: Candidate weights on the compute-window probability (see ``choose_compute_weight``).
COMPUTE_WEIGHTS: tuple[float, ...] = (1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0)
#: How many ordinary errors one compute-bound job called memory-bound costs (fixed in advance,
#: not fitted): such a job gets capped and slows down, while a memory job called compute only
#: misses a saving (issue 13).
COST_COMPUTE_AS_MEMORY = 5.0


def weigh(proba: F64, compute_weight: float) -> F64:
    """Window probabilities with the compute class scaled by ``compute_weight``, renormalised."""
    if compute_weight == 1.0 or len(proba) == 0:
        return proba
    p = np.array(proba, dtype=np.float64)
    p[:, rules.COMPUTE] *= compute_weight
    return np.asarray(p / p.sum(axis=1, keepdims=True), dtype=np.float64)


def choose_compute_weight(oof: F64, group: npt.NDArray[np.object_], truth: npt.NDArray[np.int8],
                          dur_s: npt.ArrayLike | None = None) -> float:
    """The compute weight that minimises the expected cost of the out-of-fold job decisions.

    Cost: 1 per wrong job, ``COST_COMPUTE_AS_MEMORY`` per compute-bound job called memory-bound;
    ties go to the smaller weight. ``truth`` is per job in ``np.unique(group)`` order.
    """
    best_w, best_cost = 1.0, math.inf
    for w in COMPUTE_WEIGHTS:
        _, pred, _ = job_predictions(weigh(oof, w), group, dur_s)
        wrong = pred != truth
        c_to_m = (truth == rules.J_COMPUTE) & (pred == rules.J_MEMORY)
        cost = float(wrong.sum() + (COST_COMPUTE_AS_MEMORY - 1.0) * c_to_m.sum())
        if cost < best_cost - 1e-9:
            best_w, best_cost = w, cost
    return best_w


def job_folds(keys: npt.NDArray[np.object_], labels: npt.ArrayLike, n_folds: int, seed: int = 0) -> I64:
    """Fold number per job: shuffled, then dealt round-robin within each label (stratified)."""
    rng = np.random.default_rng(seed)
    lab = np.asarray(labels)
    fold = np.zeros(len(keys), dtype=np.int64)
    start = 0
    for value in np.unique(lab):
        idx = np.flatnonzero(lab == value)
        rng.shuffle(idx)
        fold[idx] = (start + np.arange(len(idx))) % n_folds
        start += len(idx)
    return fold


def source_groups(keys: Sequence[str] | npt.NDArray[np.object_]) -> dict[str, str]:
    """Job key -> its source: the recording folder (or a nightly's date) before the first ``:`` of
    ``<source>:<job_id>``, as ``training.training_set`` and the nightly name jobs."""
    return {str(k): str(k).split(":", 1)[0] for k in keys}


def source_folds(keys: Sequence[str] | npt.NDArray[np.object_]) -> tuple[dict[str, str], int]:
    """``source_groups`` of the distinct ``keys`` and the number of folds that makes: one per source.

    One source is a DataError: a single fold cannot hold anything out."""
    groups = source_groups(np.unique(np.asarray(keys, dtype=object).astype(str)))
    n_folds = len(set(groups.values()))
    if n_folds < 2:
        raise DataError("--calibration source: needs at least two recording folders (sources), "
                        f"got {n_folds}")
    return groups, n_folds


def family_folds(keys: npt.NDArray[np.object_], families: Mapping[str, str], n_folds: int,
                 seed: int = 0) -> I64:
    """Fold number per job such that every job of one family lands in the same fold.

    Families are shuffled, then dealt largest first to the fold with the fewest jobs so far.
    A job without a family is its own family.
    """
    fam = np.asarray([families.get(str(k), str(k)) for k in keys], dtype=object)
    names, inv, cnt = np.unique(fam, return_inverse=True, return_counts=True)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(names))
    order = order[np.argsort(-cnt[order], kind="stable")]
    load = np.zeros(n_folds, dtype=np.int64)
    fold_of_family = np.zeros(len(names), dtype=np.int64)
    for i in order:
        f = int(np.argmin(load))
        fold_of_family[i] = f
        load[f] += cnt[i]
    return np.asarray(fold_of_family[inv], dtype=np.int64)


def cross_validate(
    ts: TrainingSet, n_folds: int = 5, seed: int = 0, params: Mapping[str, Any] | None = None,
    rounds: int = NUM_ROUNDS, min_window_s: float = MIN_TRAIN_WINDOW_S,
    families: Mapping[str, str] | None = None, cost_aware: bool = False, kind: str = DEFAULT_KIND,
    aggregation: str = DEFAULT_AGGREGATION, workers: int = 0, compute_weight: float = DEFAULT_COMPUTE_WEIGHT,
    fold_groups: Mapping[str, str] | None = None, evidence_cap: float | Literal["fit"] | None = FIT_CAP,
) -> dict[str, Any]:
    """Grouped k-fold CV at job level; returns metrics and the out-of-fold predictions.

    ``aggregation`` (AGGREGATIONS): how window decisions make the job's; the calibration maps
    returned belong to it. ``workers``: folds fitted at once, each in its own thread (0: one per
    core, at most one per fold); LightGBM trains outside the GIL, and the result does not depend on it.

    With ``cost_aware`` the compute weight (``choose_compute_weight``) is chosen on the
    out-of-fold predictions before the job decisions and calibration are made from them; without
    it the out-of-fold predictions are weighed by the fixed ``compute_weight`` (the one the model
    applies: DEFAULT_COMPUTE_WEIGHT, as in ``train_model``), so calibration fits it. Off
    here by default; ``train_model`` passes DEFAULT_COST_AWARE (off: round 3's recipe turned it on,
    which on 442 jobs removed four costly errors for 0.3 points, but that recipe failed its
    registered rule on the round-3 test set and was not shipped).

    Without ``families`` folds are stratified by the job's rule label; with a job key -> family
    map, whole families are held out together (the out-of-fold predictions then say how the
    model does on kinds of work it never saw, which is what calibration should reflect).
    ``fold_groups`` (job key -> group, e.g. ``source_groups``: the recording folder) deals whole
    groups to the folds instead (``families`` still groups the margin map's sigma folds).
    ``evidence_cap``: the length in windows past which job confidences stop growing (``resolve_evidence_cap``:
    FIT_CAP fits it on ``ts``, the recipe since issue 13 round 10; returned as
    ``evidence_cap_windows``).
    """
    with _OneBlasThread():
        return _cross_validate(ts, n_folds, seed, params, rounds, min_window_s, families, cost_aware, kind,
                               aggregation, workers, compute_weight, fold_groups,
                               resolve_evidence_cap(ts, aggregation, evidence_cap))


def _cross_validate(
    ts: TrainingSet, n_folds: int, seed: int, params: Mapping[str, Any] | None, rounds: int,
    min_window_s: float, families: Mapping[str, str] | None, cost_aware: bool, kind: str, aggregation: str,
    workers: int, fixed_weight: float, fold_groups: Mapping[str, str] | None = None,
    cap: float | None = None,
) -> dict[str, Any]:
    keys, truth = ts.job_truth()
    dur = aggregation_durations(ts, aggregation)
    n_folds = max(2, min(n_folds, len(keys)))
    fold_of_job = (family_folds(keys, fold_groups, n_folds, seed) if fold_groups is not None
                   else family_folds(keys, families, n_folds, seed) if families is not None
                   else job_folds(keys, truth, n_folds, seed))
    job_index = {k: i for i, k in enumerate(keys)}
    window_job = np.fromiter((job_index[g] for g in ts.group), dtype=np.int64, count=len(ts.group))
    window_fold = fold_of_job[window_job]
    oof = np.zeros((len(ts), 3))
    fit_ok = ts.trainable(min_window_s)

    def fold(f: int) -> None:
        test = window_fold == f
        train = ~test & fit_ok
        if not test.any():
            return
        if len(np.unique(ts.y[train])) < 2:
            oof[test] = np.bincount(ts.y[train].astype(np.int64), minlength=3) / max(train.sum(), 1)
            return
        booster, margin = fit_windows(ts.subset(train), kind, params, rounds, families)
        oof[test] = window_proba(booster, kind, margin, ts.X[test])

    # Folds are independent (each booster single-threaded and seeded; each writes only its own
    # test rows), so they run side by side on ``workers`` threads with the same result as in turn.
    run_parallel([functools.partial(fold, f) for f in range(n_folds)], workers)
    compute_weight = choose_compute_weight(oof, ts.group, truth, dur) if cost_aware else fixed_weight
    oof = weigh(oof, compute_weight)
    pkeys, pred, raw_conf = job_predictions(oof, ts.group, dur, cap)
    assert (pkeys == keys).all()
    correct = pred == truth
    # Cross-fitted calibration: each fold's confidences mapped with a fit on the other folds.
    cal_conf = np.zeros(len(keys))
    for f in range(n_folds):
        m = fold_of_job == f
        cal = fit_calibration_by_label(raw_conf[~m], correct[~m], pred[~m])
        cal_conf[m] = apply_calibration(raw_conf[m], cal, pred[m])
    confusion = np.zeros((4, 4), dtype=np.int64)
    np.add.at(confusion, (truth.astype(np.int64), pred.astype(np.int64)), 1)
    window_acc = float((oof.argmax(axis=1) == ts.y).mean()) if len(ts) else float("nan")
    return {
        "n_jobs": len(keys),
        "n_windows": len(ts),
        "n_folds": n_folds,
        "accuracy": float(correct.mean()),
        "window_accuracy": window_acc,
        # to calibration.CAL_DIGITS: the confidences' last bits differ between CPUs (numpy's
        # SIMD exp and log), and model.json keeps these figures (byte-reproducible: issue 13)
        "ece_raw": significant(ece(raw_conf, correct)),
        "ece": significant(ece(cal_conf, correct)),
        "confusion": confusion.tolist(),
        "labels": list(rules.JOB_LABELS),
        "calibration": fit_calibration_by_label(raw_conf, correct, pred),
        "compute_weight": compute_weight,
        "evidence_cap_windows": cap,
        "jobs": {
            "key": keys.tolist(),
            "truth": rules.label_names(truth).tolist(),
            "pred": rules.label_names(pred).tolist(),
            "confidence": [round(float(c), 4) for c in cal_conf],
            "raw_confidence": [round(float(c), 6) for c in raw_conf],
            "fold": fold_of_job.tolist(),
        },
    }


class _OneBlasThread:
    """Context: BLAS (OpenBLAS) runs on one thread while any training is under way.

    Why (issue 15): small BLAS calls inside a training (the margin map's ridge fits; until
    2026-12-01 every L-BFGS-B step of the calibration fit) woke OpenBLAS's thread pool each
    time: 1.5 s of the 1.7 s of a nightly's cross-validation at 1,000 GPUs once went to those
    threads, spinning against the scan's and the folds' own. One BLAS thread gives the same
    numbers.
    Entered by concurrent and nested trainings alike: the first entry sets the limit and the
    last exit restores what was there (threadpoolctl's own contexts must not interleave).
    """

    _lock = threading.Lock()
    _depth = 0
    _ctl: Any = None

    def __enter__(self) -> None:
        with self._lock:
            cls = type(self)
            if cls._depth == 0:
                try:
                    from threadpoolctl import threadpool_limits
                except ImportError:  # not installed: BLAS keeps its threads (slower, same result)
                    cls._ctl = None
                else:
                    cls._ctl = threadpool_limits(limits=1, user_api="blas")
            cls._depth += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            cls = type(self)
            cls._depth -= 1
            if cls._depth == 0 and cls._ctl is not None:
                cls._ctl.restore_original_limits()
                cls._ctl = None


def fit_workers(workers: int = 0, tasks: int = 1) -> int:
    """Threads for ``tasks`` independent fits: ``workers``, or (0) one per core, at most ``tasks``."""
    import os

    n = workers if workers > 0 else len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else os.cpu_count() or 1
    return max(1, min(n, tasks))


def run_parallel(tasks: Sequence[Callable[[], None]], workers: int = 0) -> None:
    """Run independent ``tasks`` on up to ``workers`` threads (0: one per core); re-raise the first
    error. Why threads: each task is a single-threaded LightGBM fit, which releases the GIL."""
    n = fit_workers(workers, len(tasks))
    if n <= 1:
        for task in tasks:
            task()
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="wattclass-fit") as pool:
        futs = [pool.submit(task) for task in tasks]
        try:
            for fut in futs:
                fut.result()
        except BaseException:
            for fut in futs:  # the fits not started yet: the run ends on this error anyway
                fut.cancel()
            raise


def beside(first: Callable[[], A], second: Callable[[], B]) -> tuple[A, B]:
    """``(first(), second())``, the second in a thread of its own while the first runs here.

    For two independent pieces of training (the cross-validation and the final fit): LightGBM
    fits release the GIL, so on two cores they take the time of the longer one."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="wattclass-fit") as pool:
        fut = pool.submit(second)
        a = first()
        return a, fut.result()


def model_meta(version: str, kind: str, aggregation: str, created: str | None, min_window_s: float,
               ts: TrainingSet, evidence_cap: float | None) -> dict[str, Any]:
    """The model.json fields every training path writes (local ``train_model``, the Dask fit);
    ``evidence_cap``: the one its calibration maps are fitted with (None: none, and no field)."""
    meta = {
        "format_version": format_version_for(kind, evidence_cap=evidence_cap is not None),
        "wattclass_version": __version__,
        "model_version": version,
        "created": created,
        "min_train_window_s": min_window_s,
        "kind": kind,
        "aggregation": AGGREGATIONS[aggregation],
        "features": list(FEATURES),
        "window_classes": list(rules.WINDOW_CLASSES),
        "job_labels": list(rules.JOB_LABELS),
        "params": stage_params(kind),
        "num_rounds": NUM_ROUNDS,
        "training_data": training_summary(ts),
    }
    if evidence_cap is not None:
        meta["evidence_cap_windows"] = evidence_cap
    return meta


def training_summary(ts: TrainingSet) -> dict[str, Any]:
    keys, truth = ts.job_truth()
    names = rules.label_names(truth)
    return {
        "n_jobs": len(keys),
        "n_windows": len(ts),
        "jobs_per_label": {lab: int((names == lab).sum()) for lab in rules.JOB_LABELS},
        "windows_per_class": {c: int((ts.y == i).sum()) for i, c in enumerate(rules.WINDOW_CLASSES)},
        "sources": sorted(set(ts.sources)),
    }


@dataclass
class WindowModel:
    """A trained window classifier plus its metadata (see module docstring)."""

    booster: lgb.Booster
    meta: dict[str, Any]

    @property
    def version(self) -> str:
        return str(self.meta.get("model_version", "unknown"))

    @property
    def source(self) -> str:
        return f"model:{self.version}"

    def predict_proba(self, X: F32) -> F64:
        """Window class probabilities, compute weighted by the model's ``compute_weight`` (fixed or
        cost-aware)."""
        proba = window_proba(self.booster, self.kind, self.meta.get("margin"), X)
        return weigh(proba, float(self.meta.get("compute_weight") or 1.0))

    @property
    def aggregation(self) -> str:
        """The job aggregation (an AGGREGATIONS key) its calibration was fitted for."""
        return "length-weighted" if self.meta.get("aggregation") == AGG_LENGTH else "counts"

    def job_predictions(self, X: F32, group: npt.NDArray[np.object_], dur_s: npt.ArrayLike | None = None,
                        ) -> tuple[npt.NDArray[np.object_], npt.NDArray[np.int8], F64]:
        """(job keys, label codes, raw confidence) of windows X by this model's aggregation
        (``dur_s``: window lengths, NaN = unknown; needed for the length-weighted one)."""
        if self.aggregation == "counts":
            return job_predictions(self.predict_proba(X), group, evidence_cap=self.evidence_cap)
        d = np.full(len(X), np.nan) if dur_s is None else dur_s
        return job_predictions(self.predict_proba(X), group, d, self.evidence_cap)

    @property
    def evidence_cap(self) -> float | None:
        """The length in windows past which a job's confidence stops growing (model.json
        ``evidence_cap_windows``, EVIDENCE_QUANTILE); None for models before issue 13 round 10."""
        cap = self.meta.get("evidence_cap_windows")
        return None if cap is None else float(cap)

    @property
    def kind(self) -> str:
        return str(self.meta.get("kind") or KIND_MULTICLASS)

    def calibrate(self, conf: npt.ArrayLike, labels: npt.ArrayLike | None = None) -> F64:
        """Calibrated job confidence; ``labels`` (job label codes) select per-label maps. Without
        the ambiguity check: ``job_confidence`` is the confidence the policy reads."""
        return apply_calibration(conf, self.meta.get("calibration"), labels)

    @property
    def ambiguity(self) -> dict[str, Any] | None:
        """The model.json ``ambiguity`` check (classifier/ambiguity.py), or None."""
        amb = self.meta.get("ambiguity")
        return amb if isinstance(amb, dict) else None

    def job_confidence(self, raw: npt.ArrayLike, labels: npt.ArrayLike, fingerprint: npt.ArrayLike | None,
                       ) -> F64:
        """The job confidence the labels carry (and the policy reads): calibrated, then lowered by
        the ambiguity check where the model has one (``fingerprint``: the jobs' fingerprints,
        ``ambiguity.job_fingerprints``; None only for a model without the check). Labels never
        change."""
        return self.checked(self.calibrate(raw, labels), labels, fingerprint)

    def checked(self, calibrated: npt.ArrayLike, labels: npt.ArrayLike, fingerprint: npt.ArrayLike | None,
                ) -> F64:
        """Calibrated job confidences after the ambiguity check (unchanged for a model without one):
        for callers that keep the calibrated confidence too (labeling: the table's vote uses it)."""
        amb = self.ambiguity
        if amb is None:
            return np.asarray(calibrated, dtype=np.float64)
        if fingerprint is None:
            raise DataError(f"model {self.version} has an ambiguity check: job confidences need the "
                            "jobs' fingerprints")
        return lower_confidence(amb, calibrated, fingerprint, labels)

    def set_ambiguity(self, entry: dict[str, Any] | None) -> None:
        """Attach (or, None, remove) an ambiguity check (``ambiguity.fit_ambiguity``) and write the
        file format it needs."""
        if entry is None:
            self.meta.pop("ambiguity", None)
        else:
            check_ambiguity(entry, f"model {self.version}")
            self.meta["ambiguity"] = entry
        self.meta["format_version"] = format_version_for(self.kind, entry is not None,
                                                         self.evidence_cap is not None)

    def save(self, directory: Path) -> None:
        """Write model.txt then model.json (atomically each); model.json last marks it complete."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        atomic_write_text(d / MODEL_FILE, self.booster.model_to_string())
        atomic_write_text(d / META_FILE, json.dumps(self.meta, indent=2, sort_keys=True) + "\n")


def train_model(
    ts: TrainingSet, version: str, n_folds: int = 5, seed: int = 0, evaluate: bool = True,
    created: str | None = None, min_window_s: float = MIN_TRAIN_WINDOW_S,
    families: Mapping[str, str] | None = None, kind: str = DEFAULT_KIND,
    aggregation: str = DEFAULT_AGGREGATION, workers: int = 0, cost_aware: bool = DEFAULT_COST_AWARE,
    compute_weight: float = DEFAULT_COMPUTE_WEIGHT, fold_groups: Mapping[str, str] | None = None,
    evidence_cap: float | Literal["fit"] | None = FIT_CAP,
) -> WindowModel:
    """Cross-validate (for metrics, calibration and, with ``cost_aware``, the compute weight), and
    fit on every trainable window. The model applies ``compute_weight`` (or, with ``cost_aware``
    and ``evaluate``, the weight chosen on the out-of-fold predictions) to its window probabilities;
    a caller that fits calibration itself (the nightly) cross-validates with the same weight.

    The final fit does not depend on the cross-validation, so it runs beside it (``beside``);
    ``workers`` as for ``cross_validate``.

    ``created`` goes into the metadata as given (None: omitted), never the wall clock, so that
    rebuilding from the same data gives byte-identical model files. ``fold_groups``
    (``source_groups``): the CV deals whole groups to its folds (model.json ``cv_grouping``
    ``source``; ``families`` still group the margin map's sigma). ``evidence_cap``
    (``resolve_evidence_cap``): resolved once, so the model carries the cap its maps were fitted with.
    """
    if aggregation not in AGGREGATIONS:
        raise DataError(f"unknown job aggregation {aggregation!r} (known: {', '.join(AGGREGATIONS)})")
    cap = resolve_evidence_cap(ts, aggregation, evidence_cap)

    def fit_all() -> tuple[lgb.Booster, dict[str, Any] | None]:
        with _OneBlasThread():
            return fit_windows(ts.subset(ts.trainable(min_window_s)), kind, families=families)

    cv: dict[str, Any] | None = None
    if evaluate:
        cv, (booster, margin) = beside(
            lambda: cross_validate(ts, n_folds, seed, min_window_s=min_window_s, families=families, kind=kind,
                                   aggregation=aggregation, workers=workers, cost_aware=cost_aware,
                                   compute_weight=compute_weight, fold_groups=fold_groups,
                                   evidence_cap=cap), fit_all)
    else:
        booster, margin = fit_all()
    meta: dict[str, Any] = {
        **model_meta(version, kind, aggregation, created, min_window_s, ts, cap),
        "calibration": cv["calibration"] if cv else None,
        "cv_grouping": ("source" if fold_groups is not None else "family" if families is not None
                        else "job") if cv else None,
        "compute_weight": cv["compute_weight"] if cv else compute_weight,
        "metrics": ({k: v for k, v in cv.items()
                     if k not in ("jobs", "calibration", "compute_weight", "evidence_cap_windows")}
                    if cv else None),
    }
    if margin is not None:
        meta["margin"] = margin
    return WindowModel(booster, meta)


def load_model(directory: Path) -> WindowModel:
    """Load a model folder; refuse files from a newer format or with a feature list we lack."""
    d = Path(directory)
    meta_path = d / META_FILE
    try:
        meta = json.loads(meta_path.read_bytes().decode("utf-8"))
    except FileNotFoundError as exc:
        raise DataError(f"{meta_path}: model metadata not found") from exc
    except (OSError, ValueError) as exc:  # ValueError: json's, and bytes that are not UTF-8
        raise DataError(f"{meta_path}: unreadable model metadata: {exc}") from exc
    if not isinstance(meta, dict):
        raise DataError(f"{meta_path}: model metadata is not a JSON object")
    fmt = meta.get("format_version")
    if not isinstance(fmt, int):
        raise DataError(f"{meta_path}: model metadata has no integer format_version")
    if fmt > FORMAT_VERSION:
        raise DataError(
            f"{meta_path}: model format version {fmt} was written by wattclass "
            f"{meta.get('wattclass_version', '?')}; this wattclass ({__version__}) reads format "
            f"{FORMAT_VERSION} or older. Upgrade wattclass or use an older model."
        )
    if fmt >= FORMAT_EVIDENCE_CAP and "evidence_cap_windows" not in meta:
        raise DataError(f"{meta_path}: a format {fmt} model without its 'evidence_cap_windows' (its "
                        "calibration maps were fitted on capped confidences)")
    if "evidence_cap_windows" in meta:
        cap = meta["evidence_cap_windows"]
        if fmt < FORMAT_EVIDENCE_CAP:
            raise DataError(f"{meta_path}: 'evidence_cap_windows' in a format {fmt} file (it needs format "
                            f"{FORMAT_EVIDENCE_CAP})")
        if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not math.isfinite(cap) or cap <= 0:
            raise DataError(f"{meta_path}: 'evidence_cap_windows' must be a positive number, "
                            f"not {str(cap)[:40]!r}")
    missing = [f for f in meta.get("features", []) if f not in FEATURES]
    if missing or not meta.get("features"):
        raise DataError(f"{meta_path}: model needs features this wattclass does not compute: {missing}")
    if list(meta["features"]) != list(FEATURES):
        raise DataError(f"{meta_path}: model feature order differs from this wattclass's FEATURES")
    kind = meta.get("kind") or KIND_MULTICLASS
    if kind not in MODEL_KINDS:
        raise DataError(f"{meta_path}: unknown model kind {kind!r} "
                        f"(this wattclass knows {', '.join(MODEL_KINDS)})")
    if kind == KIND_MARGIN and not isinstance(meta.get("margin"), dict):
        raise DataError(f"{meta_path}: roofline-margin model without its 'margin' map")
    if "ambiguity" in meta:
        if fmt < FORMAT_AMBIGUITY:
            raise DataError(f"{meta_path}: 'ambiguity' in a format {fmt} file (it needs format "
                            f"{FORMAT_AMBIGUITY})")
        check_ambiguity(meta["ambiguity"], str(meta_path))
    agg = meta.get("aggregation")
    if agg is not None and agg not in (*AGGREGATIONS.values(), AGG_COUNTS_OLD):
        # its calibration belongs to an aggregation this wattclass does not apply
        raise DataError(f"{meta_path}: unknown job aggregation {str(agg)[:120]!r} (this wattclass knows "
                        f"{', '.join(AGGREGATIONS)})")
    if kind == KIND_MARGIN:
        from wattclass.classifier.margin import KNOWN_INPUTS

        for part in (meta["margin"], meta["margin"].get("fallback") or {"inputs": [], "coef": []}):
            inputs = part.get("inputs") if isinstance(part, dict) else None
            coef = part.get("coef") if isinstance(part, dict) else None
            if (not isinstance(inputs, list) or not isinstance(coef, list)
                    or [i for i in inputs if i not in KNOWN_INPUTS] or len(inputs) != len(coef)):
                raise DataError(f"{meta_path}: margin map inputs {inputs} are not ones this wattclass "
                                f"computes ({', '.join(KNOWN_INPUTS)}) or do not match its coefficients")
    _check_model_text(d / MODEL_FILE)
    lgbload.core()  # without scikit-learn (lgbload); the import below then finds it loaded
    import lightgbm as lgb

    try:
        booster = lgb.Booster(model_file=str(d / MODEL_FILE))
    except (lgb.basic.LightGBMError, OSError) as exc:
        raise DataError(f"{d / MODEL_FILE}: cannot load LightGBM model: {exc}") from exc
    return WindowModel(booster, meta)


def _check_model_text(path: Path) -> None:
    """Refuse a LightGBM model text that is cut short, or whose trees do not fill the bytes its
    header's ``tree_sizes`` says they take (DataError naming the file).

    Why: LightGBM's loader does not fail on such a file, it kills the process: a model.txt cut
    anywhere before its trees end aborted (SIGABRT) or crashed (SIGSEGV) ``classify --model``
    and any nightly whose registry held it, with no error naming the file (measured with the
    shipped model cut at 1 kB, 5 kB, half and 10 bytes before the end of its trees)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError as exc:
        raise DataError(f"{path}: LightGBM model not found") from exc
    except OSError as exc:
        raise DataError(f"{path}: cannot read LightGBM model: {exc.strerror or exc}") from exc
    end = raw.find(b"\nend of trees\n") + 1
    if end <= 0:
        raise DataError(f"{path}: not a complete LightGBM model (no 'end of trees': cut short?)")
    sizes = re.search(rb"^tree_sizes=([0-9 ]*)$", raw[:end], re.MULTILINE)
    first = raw.find(b"\nTree=0\n") + 1
    if sizes is not None and (first <= 0 or first + sum(int(n) for n in sizes.group(1).split()) != end):
        raise DataError(f"{path}: LightGBM model damaged: its trees do not take the bytes its "
                        "tree_sizes header says")


def default_model_dir() -> Path:
    """The model shipped inside the package (trained on the real H200 data)."""
    return Path(__file__).resolve().parent / "models"


def should_promote(candidate: Mapping[str, Any] | None, incumbent: Mapping[str, Any] | None) -> bool:
    """Promotion gate: the candidate's grouped-CV job accuracy must not be lower than the incumbent's.

    Equal accuracy promotes (the candidate has seen more data); ties are not broken on ECE. A
    candidate without metrics never wins; an incumbent without metrics always loses.
    """
    if not candidate or not _finite(candidate.get("accuracy")):
        return False
    if not incumbent or not _finite(incumbent.get("accuracy")):
        return True
    return float(candidate["accuracy"]) >= float(incumbent["accuracy"]) - 1e-12


def _finite(x: object) -> bool:
    return isinstance(x, int | float) and math.isfinite(float(x))
