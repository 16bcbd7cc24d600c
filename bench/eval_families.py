"""Leave-one-family-out evaluation of the GPM-less classifier on real H200 jobs (issue 13).

Why this protocol: grouped CV by job still trains on siblings of each test job (the same workload
at another size or dtype), which flatters the model. Here every job of one workload *family*
(tools/h200_collect families for the randomised sweep runs, ``FAMILY_RULES`` in
classifier/training.py for the 87 named jobs) is on the test side at once, and the model is
trained on all other families. Calibration is nested: the per-label Platt maps are fitted on
family-grouped out-of-fold predictions of the *training* families only, so no test job
influences its own confidence. Features and hyper-parameters are fixed in advance
(classifier/features.py FEATURES, classifier/model.py DEFAULT_PARAMS); nothing here is tuned on
the test families.

Truth: the docs/design.md job rule over all of a job's windows, from GPM (what ``classify`` does).
Inputs: basic NVML columns only (checked: features do not change when GPM columns are dropped).

Reported: job accuracy per family and overall; the two error kinds apart (compute-bound called
memory-bound = costly: the job gets capped; memory called compute = a missed saving); the
decision with the policy's ``min_confidence``: below it the job is ``unsure`` (the policy does
nothing), counted as *not correct* in the accuracy, with the coverage beside it; ECE of the
calibrated confidence.

    python bench/eval_families.py [--kind K] [--min-confidence 0.8] [--json]  # LOFO, the bundled folders
    python bench/eval_families.py --raw wattclass/data/h200/{raw,collected,sweep,sweep-heldout,ridge} \
        --extra wattclass/data/h200/ridge2                       # issue 13 round 2's decision protocol
    python bench/eval_families.py --test DIR --model classifier/models  # the shipped model on DIR
    python bench/eval_families.py ... --shipped-margin                  # the round-1 recipe
    python bench/eval_families.py ... --round2-recipe                   # round 2's (lenweight, rounds 2-5)
    python bench/eval_families.py ... --round3-recipe                   # round 3's (spread, not shipped)
    python bench/eval_families.py \
        --raw wattclass/data/h200/{raw,collected,sweep,sweep-heldout,ridge,ridge2,fresh}  # round 3: LOFO-442
    python bench/eval_families.py --raw <all but one former test set> --test <that set>  # round 4: set out
    python bench/eval_families.py --loso [--round2-recipe]     # round 5: leave one SET out, pooled
    python bench/eval_families.py --loso --round2-recipe \
        --train-folders raw,collected,sweep,sweep-heldout,ridge,ridge2  # the round-2 model's folders

``--loso`` (issue 13 round 5; no never-seen test set was left, all ten folders are development
data): each of the seven test-like folders (LOSO_SETS) held out whole in turn, trained on the
other folders (``--train-folders``: only these), calibration nested, the held-out predictions
pooled and reported per set too (docs/measurements/issue13-preregistration-round5-2026-11-30.md).

``--test``: train once on ``--raw`` (default: the bundled recordings), calibration nested the same
way, and score the jobs of the ``--test`` recordings; with ``--model DIR`` score that saved model
as it is instead, with its ambiguity check where it has one (issue 13 round 6)
(docs/measurements/issue13-preregistration-round2-2026-11-30.md). 10-60 s on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

CODE = {"idle": 0, "compute": 1, "memory": 2, "mixed": 3}


#: The folders under wattclass/data/h200 that are development data in issue 13 round 5 (all 760
#: jobs; no never-seen test set is left) and the ones held out whole, one at a time, by ``--loso``
#: (the test-like folders: each a set of kinds of work recorded apart; raw, collected and sweep
#: always train).
DEVELOPMENT_FOLDERS = ("raw", "collected", "sweep", "sweep-heldout", "ridge", "ridge2",
                       "fresh", "fresh3", "fresh4", "latency")
LOSO_SETS = ("sweep-heldout", "ridge", "ridge2", "fresh", "fresh3", "fresh4", "latency")
#: ``--calibration``: how the inner out-of-fold predictions the Platt maps are fitted on are grouped.
#: ``family``: whole workload families per fold, 5 folds (rounds 1-4); ``source``: one fold per
#: recording folder (leave-one-folder-out: the error on a whole set of new kinds of work).
CALIBRATIONS = ("family", "source")


def predict_unseen(train: Any, test: Any, families: dict[str, str], kind: str, inner_folds: int = 5,
                   cost_aware: bool = False, aggregation: str = "length-weighted",
                   compute_weight: float = 1.0, calibration: str = "family",
                   calibration_extra: Any = None) -> tuple[Any, Any, Any, Any, float]:
    """Fit on ``train`` (calibration nested on its out-of-fold predictions, grouped by ``calibration``:
    CALIBRATIONS), predict the jobs of ``test``: (job keys, labels, raw confidence, calibrated
    confidence, compute weight). ``compute_weight``: the fixed weight when not ``cost_aware``
    (model.DEFAULT_COMPUTE_WEIGHT). ``calibration_extra``: windows of jobs neither trained on nor
    tested; the fitted model's predictions of them (set-out: the model never saw their kinds of
    work) join the out-of-fold predictions the Platt maps are fitted on."""
    from wattclass.classifier.calibration import apply_calibration, fit_calibration_by_label
    from wattclass.classifier.model import (
        MIN_TRAIN_WINDOW_S,
        aggregation_durations,
        cross_validate,
        fit_windows,
        job_predictions,
        source_folds,
        weigh,
        window_proba,
    )
    from wattclass.classifier.rules import JOB_LABELS
    from wattclass.errors import DataError

    if calibration not in CALIBRATIONS:
        raise SystemExit(f"--calibration: unknown {calibration!r} (known: {', '.join(CALIBRATIONS)})")
    groups = None
    if calibration == "source":
        try:
            groups, inner_folds = source_folds(train.group)
        except DataError as exc:  # one training folder: nothing to hold out
            raise SystemExit(str(exc)) from exc
    inner = cross_validate(train, inner_folds, seed=0, families=families, cost_aware=cost_aware, kind=kind,
                           aggregation=aggregation, compute_weight=compute_weight, fold_groups=groups)
    booster, margin = fit_windows(train.subset(train.trainable(MIN_TRAIN_WINDOW_S)), kind, families=families)
    w = inner["compute_weight"]

    def predict(ts: Any) -> tuple[Any, Any, Any]:
        proba = weigh(window_proba(booster, kind, margin, ts.X), w)
        return job_predictions(proba, ts.group, aggregation_durations(ts, aggregation),
                               inner["evidence_cap_windows"])

    k, p, r = predict(test)
    cal = inner["calibration"]
    if calibration_extra is not None and len(calibration_extra):
        _, xp, xr = predict(calibration_extra)
        _, xt = calibration_extra.job_truth()
        jobs = inner["jobs"]
        oof_pred = np.asarray([JOB_LABELS.index(x) for x in jobs["pred"]], dtype=np.int64)
        oof_ok = np.asarray(jobs["pred"]) == np.asarray(jobs["truth"])
        cal = fit_calibration_by_label(np.concatenate([np.asarray(jobs["raw_confidence"]), xr]),
                                       np.concatenate([oof_ok, xp == xt]), np.concatenate([oof_pred, xp]))
    return k, p, r, apply_calibration(r, cal, p), w


def held_out(train: Any, test: Any, families: dict[str, str], kind: str,
             cost_aware: bool = False, aggregation: str = "length-weighted", compute_weight: float = 1.0,
             calibration: str = "family") -> dict[str, Any]:
    """Train on one set of recordings, test on another (the frozen held-out runs)."""
    keys, truth = test.job_truth()
    k, pred, raw, conf, w = predict_unseen(train, test, families, kind, cost_aware=cost_aware,
                                           aggregation=aggregation, compute_weight=compute_weight,
                                           calibration=calibration)
    assert (k == keys).all()
    return {"keys": keys, "truth": truth, "pred": pred, "raw": raw, "conf": conf,
            "compute_weights": {"all": w}}


def loso(ts: Any, families: dict[str, str], kind: str, sets: tuple[str, ...] = LOSO_SETS,
         train_folders: tuple[str, ...] | None = None, calibration: str = "family",
         calibrate_on_unused: bool = False, cost_aware: bool = False, aggregation: str = "length-weighted",
         compute_weight: float = 1.0) -> dict[str, Any]:
    """Leave one SET out (issue 13 round 5): each folder of ``sets`` held out whole in turn, trained
    on the other folders of ``ts`` (``train_folders``: only these, less the held-out one), nested
    calibration, the held-out predictions pooled. ``calibrate_on_unused``: the folders of ``ts``
    neither trained on nor held out join the calibration data (``predict_unseen``)."""
    from wattclass.classifier.model import source_groups

    of_job = source_groups(np.unique(ts.group))
    src = np.asarray([of_job[str(g)] for g in ts.group], dtype=object)
    missing = [s for s in sets if not (src == s).any()]
    if missing:
        raise SystemExit(f"--loso: no jobs of the held-out set(s) {', '.join(missing)} in the sources")
    keys, truth = ts.job_truth()
    index = {k: i for i, k in enumerate(keys)}
    tested = np.zeros(len(keys), dtype=bool)
    pred = np.zeros(len(keys), dtype=np.int8)
    raw = np.zeros(len(keys))
    conf = np.zeros(len(keys))
    weights: dict[str, float] = {}
    for held in sets:
        test_w = src == held
        train_w = ~test_w if train_folders is None else ~test_w & np.isin(src, list(train_folders))
        unused = ts.subset(~test_w & ~train_w) if calibrate_on_unused else None
        k, p, r, c, weights[held] = predict_unseen(
            ts.subset(train_w), ts.subset(test_w), families, kind, cost_aware=cost_aware,
            aggregation=aggregation, compute_weight=compute_weight, calibration=calibration,
            calibration_extra=unused)
        for key, pi, ri, ci in zip(k, p, r, c, strict=True):
            i = index[key]
            tested[i], pred[i], raw[i], conf[i] = True, pi, ri, ci
    return {"keys": keys[tested], "truth": truth[tested], "pred": pred[tested], "raw": raw[tested],
            "conf": conf[tested], "compute_weights": weights}


def saved_model(model_dir: Path, test: Any) -> dict[str, Any]:
    """Score a saved model folder (e.g. the shipped classifier/models) on ``test`` as it is: its own
    aggregation and calibration maps and, where it has one, its ambiguity check (the confidence the
    labels carry, ``WindowModel.job_confidence``); no refit."""
    from wattclass.classifier.ambiguity import job_fingerprints
    from wattclass.classifier.model import load_model

    model = load_model(model_dir)
    keys, truth = test.job_truth()
    k, pred, raw = model.job_predictions(test.X, test.group, test.dur)
    assert (k == keys).all()
    fkeys, fp = job_fingerprints(test.X, test.group, test.dur)
    assert (fkeys == keys).all()
    return {"keys": keys, "truth": truth, "pred": pred, "raw": raw,
            "conf": model.job_confidence(raw, pred, fp),
            "compute_weights": {"all": float(model.meta.get("compute_weight") or 1.0)}}


def lofo(ts: Any, families: dict[str, str], inner_folds: int = 5, cost_aware: bool = False,
         kind: str = "roofline-margin", extra: Any = None, aggregation: str = "length-weighted",
         compute_weight: float = 1.0, calibration: str = "family") -> dict[str, Any]:
    """Out-of-family predictions for every job: label, raw and calibrated confidence.

    ``extra``: windows added to the training side of every fold and never tested (to ask whether
    new recordings help on the families already held).
    """
    from wattclass.classifier.model import TrainingSet

    keys, truth = ts.job_truth()
    fam_of_window = np.asarray([families.get(g, g) for g in ts.group], dtype=object)
    pred = np.zeros(len(keys), dtype=np.int8)
    raw = np.zeros(len(keys))
    conf = np.zeros(len(keys))
    index = {k: i for i, k in enumerate(keys)}
    weights: dict[str, float] = {}
    for fam in sorted(set(fam_of_window)):
        test_w = fam_of_window == fam
        train = ts.subset(~test_w) if extra is None else TrainingSet.concat([ts.subset(~test_w), extra])
        k, p, r, c, weights[fam] = predict_unseen(train, ts.subset(test_w), families, kind,
                                                  inner_folds, cost_aware, aggregation, compute_weight,
                                                  calibration)
        for key, pi, ri, ci in zip(k, p, r, c, strict=True):
            i = index[key]
            pred[i], raw[i], conf[i] = pi, ri, ci
    return {"keys": keys, "truth": truth, "pred": pred, "raw": raw, "conf": conf, "compute_weights": weights}


def drop_features(ts: Any, names: list[str]) -> Any:
    """The training set without some feature columns, and the model module told so (ablation only:
    fit_booster names its columns from model.FEATURES; this process never saves a model)."""
    from wattclass.classifier import features as F
    from wattclass.classifier import model as M

    unknown = [n for n in names if n not in F.FEATURES]
    if unknown:
        raise SystemExit(f"--drop-features: unknown feature(s) {', '.join(unknown)}")
    keep = [i for i, f in enumerate(F.FEATURES) if f not in names]
    M.FEATURES = tuple(F.FEATURES[i] for i in keep)  # type: ignore[misc]
    return M.TrainingSet(ts.X[:, keep], ts.y, ts.group, ts.sources, ts.dur, ts.margin)


def summarize(res: dict[str, Any], families: dict[str, str], min_conf: float,
              min_conf_by_label: dict[str, float] | None = None, by_set: bool = False) -> dict[str, Any]:
    """Metrics; a job is acted on when its calibrated confidence reaches ``min_conf``, or its
    label's entry of ``min_conf_by_label`` (the policy's ``[min_confidence_by_label]``).
    ``by_set``: the metrics per recording folder too (``sets``: the held-out sets of ``--loso``)."""
    from wattclass.classifier import rules
    from wattclass.classifier.calibration import ece, ece_noise_floor

    keys, truth, pred, conf = res["keys"], res["truth"], res["pred"], res["conf"]
    fam = np.asarray([families.get(k, k) for k in keys], dtype=object)
    correct = pred == truth
    by_label = min_conf_by_label or {}
    threshold = np.asarray([by_label.get(rules.JOB_LABELS[p], min_conf) for p in pred], dtype=np.float64)
    acted = conf >= threshold
    c_truth = truth == CODE["compute"]
    m_truth = truth == CODE["memory"]
    c_to_m = c_truth & (pred == CODE["memory"])
    m_to_c = m_truth & (pred == CODE["compute"])

    def block(m: np.ndarray) -> dict[str, Any]:
        n = int(m.sum())
        nc, nm = int((c_truth & m).sum()), int((m_truth & m).sum())
        return {
            "jobs": n,
            "accuracy": float(correct[m].mean()) if n else float("nan"),
            "accuracy_unsure_wrong": float((correct & acted)[m].mean()) if n else float("nan"),
            "coverage": float(acted[m].mean()) if n else float("nan"),
            "selective_accuracy": float(correct[m & acted].mean()) if (m & acted).any() else float("nan"),
            "compute_jobs": nc, "memory_jobs": nm,
            "compute_called_memory": int((c_to_m & m).sum()),
            "compute_called_memory_acted": int((c_to_m & acted & m).sum()),
            "memory_called_compute": int((m_to_c & m).sum()),
            "memory_called_compute_acted": int((m_to_c & acted & m).sum()),
            "ece": ece(conf[m], correct[m]) if n else float("nan"),
            "ece_raw": ece(res["raw"][m], correct[m]) if n else float("nan"),
            # the ECE a perfectly calibrated model would show on these jobs (calibration.ece_noise_floor):
            # over tens of jobs an ECE below its p95 shows the set's size, not miscalibration
            **{f"ece_floor_{k}": v for k, v in ece_noise_floor(conf[m]).items()},
        }

    src = np.asarray([str(k).split(":", 1)[0] for k in keys], dtype=object)
    named = np.isin(src, ["raw", "collected"])
    out = {"min_confidence": min_conf, "min_confidence_by_label": by_label,
           "all": block(np.ones(len(keys), bool)), "families": {}}
    blocks = (("named_87", named), ("sweep", src == "sweep"), ("sweep_heldout", src == "sweep-heldout"))
    for name, m in blocks:
        if m.any():
            out[name] = block(m)
    for f in sorted(set(fam)):
        out["families"][f] = block(fam == f)
    if by_set:
        order = {name: i for i, name in enumerate(LOSO_SETS)}
        out["sets"] = {s: block(src == s) for s in sorted(set(src), key=lambda s: (order.get(s, 99), s))}
    wrong = [f"{k} [{families.get(k, k)}] {rules.JOB_LABELS[t]}->{rules.JOB_LABELS[p]} conf {c:.2f}"
             for k, t, p, c in zip(keys, truth, pred, conf, strict=True) if t != p]
    out["wrong"] = wrong
    out["compute_weight_per_test_family"] = res.get("compute_weights", {})
    out["truth_counts"] = {lab: int((truth == i).sum()) for i, lab in enumerate(rules.JOB_LABELS)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--raw", type=Path, nargs="*", default=None,
                    help="raw probe recordings (default: the bundled raw, collected, sweep)")
    ap.add_argument("--min-confidence", type=float, default=0.8,
                    help="the policy's min_confidence: below it a job is 'unsure' (default 0.8)")
    ap.add_argument("--cost-aware", action=argparse.BooleanOptionalAction, default=None,
                    help="weigh compute windows by a cost-chosen factor, nested (default: "
                         "DEFAULT_COST_AWARE, off; on in round 3's recipe)")
    ap.add_argument("--drop-features", default="",
                    help="comma-separated FEATURES left out (ablation), e.g. power_std_frac,clock_std_frac")
    ap.add_argument("--kind", default=None,
                    help="model kind (classifier/model.py MODEL_KINDS; default: the shipped model's, "
                         "DEFAULT_KIND = roofline-margin; h200-20261130 was lightgbm-window-multiclass)")
    ap.add_argument("--test", type=Path, nargs="*", default=None,
                    help="held-out recordings: train on --raw (default: the bundled ones) once, test on "
                         "these (no leave-one-family-out)")
    ap.add_argument("--extra", type=Path, nargs="*", default=None,
                    help="recordings added to the training side of every leave-one-family-out fold, "
                         "never tested (does new data help on the families held?)")
    ap.add_argument("--aggregation", default=None,
                    help="job aggregation (classifier/model.py AGGREGATIONS: counts, length-weighted; "
                         "default: DEFAULT_AGGREGATION = length-weighted; h200-20261130-margin used counts)")
    ap.add_argument("--shipped-margin", action="store_true",
                    help="the model shipped before issue 13 round 2 (h200-20261130-margin): "
                         "--kind roofline-margin --aggregation counts, its six margin inputs, ridge alpha 10")
    ap.add_argument("--round2-recipe", action="store_true",
                    help="the recipe of h200-20261130-lenweight (issue 13 round 2): its ten margin inputs, "
                         "one sigma per map, no cost-aware compute weight, length-weighted, alpha 3")
    ap.add_argument("--round3-recipe", action="store_true",
                    help="the recipe of h200-20261130-spread (issue 13 round 3, not shipped): eleven margin "
                         "inputs, a spread map for sigma, the cost-aware compute weight")
    ap.add_argument("--compute-weight", type=float, default=None,
                    help="fixed weight on the compute window probability when not --cost-aware (default: "
                         "DEFAULT_COMPUTE_WEIGHT, 1; round 4 chose 1.25 and failed its rule on fresh4)")
    ap.add_argument("--min-confidence-memory", type=float, default=None,
                    help="a higher min_confidence for jobs called memory (the policy's "
                         "[min_confidence_by_label] memory = X): the costly direction")
    ap.add_argument("--model", type=Path, default=None,
                    help="with --test: score this saved model folder as it is (e.g. classifier/models, the "
                         "shipped model) instead of training the recipe on --raw")
    ap.add_argument("--loso", action="store_true",
                    help="leave one SET out (issue 13 round 5): hold out each of the test-like folders "
                         f"({', '.join(LOSO_SETS)}) whole in turn, train on the other folders of --raw "
                         "(default: all ten development folders), pool the held-out predictions")
    ap.add_argument("--sets", default=",".join(LOSO_SETS),
                    help="with --loso: the folders held out in turn (comma-separated names; default: the "
                         "seven test-like folders)")
    ap.add_argument("--train-folders", default="",
                    help="with --loso: train only on these folders (comma-separated names), less the "
                         "held-out one; e.g. the shipped model's six: "
                         "raw,collected,sweep,sweep-heldout,ridge,ridge2")
    ap.add_argument("--calibration", choices=CALIBRATIONS, default="family",
                    help="grouping of the out-of-fold predictions the Platt maps are fitted on: family "
                         "(5 folds of whole families, rounds 1-4) or source (one fold per recording folder)")
    ap.add_argument("--calibrate-on-unused", action="store_true",
                    help="with --loso and --train-folders: the model's predictions of the folders neither "
                         "trained on nor held out join the calibration data (set-out predictions)")
    ap.add_argument("--evidence-cap", action=argparse.BooleanOptionalAction, default=None,
                    help="cap a job's evidence at the training jobs' (classifier/model.py EVIDENCE_QUANTILE; "
                         "the recipe since round 10, default; off in the earlier rounds' recipes)")
    ap.add_argument("--evidence-quantile", type=float, default=None,
                    help="the cap's quantile of the training jobs' evidence (default: EVIDENCE_QUANTILE)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.loso and (a.test or a.extra or a.model is not None):
        raise SystemExit("--loso holds out the sets of --raw itself: no --test, --extra or --model")
    if (a.train_folders or a.calibrate_on_unused) and not a.loso:
        raise SystemExit("--train-folders and --calibrate-on-unused go with --loso")
    if a.model is not None and not a.test:
        raise SystemExit("--model needs --test (a saved model is scored on held-out recordings only)")
    from wattclass.classifier import margin as margin_module
    from wattclass.classifier.model import (
        AGGREGATIONS,
        DEFAULT_AGGREGATION,
        DEFAULT_COMPUTE_WEIGHT,
        DEFAULT_COST_AWARE,
        DEFAULT_KIND,
        MODEL_KINDS,
        load_model,
    )
    # each earlier round's recipe: (aggregation, ridge alpha, margin inputs, spread map, cost-aware,
    # fixed compute weight)
    recipes = {
        "shipped_margin": ("counts", 10.0, margin_module.MARGIN_INPUTS_R1, False, False, 1.0),
        "round2_recipe": ("length-weighted", 3.0, margin_module.MARGIN_INPUTS_R2, False, False, 1.0),
        "round3_recipe": ("length-weighted", 3.0, margin_module.MARGIN_INPUTS_R3, True, True, 1.0),
    }
    chosen = [name for name in recipes if getattr(a, name)]
    if len(chosen) > 1:
        raise SystemExit("--shipped-margin, --round2-recipe and --round3-recipe are different recipes: "
                         "pick one")
    if chosen:
        aggregation, alpha, inputs, spread, cost_aware, weight = recipes[chosen[0]]
        a.kind = a.kind or "roofline-margin"
        a.aggregation = a.aggregation or aggregation
        # read when the margin map is fitted
        margin_module.RIDGE_ALPHA = alpha
        margin_module.MARGIN_INPUTS = inputs
        margin_module.SPREAD_MAP = spread
        a.cost_aware = cost_aware if a.cost_aware is None else a.cost_aware
        a.compute_weight = weight if a.compute_weight is None else a.compute_weight
    from wattclass.classifier import model as model_module

    # rounds 1-9 had no evidence cap
    set_evidence_recipe((not chosen) if a.evidence_cap is None else a.evidence_cap, a.evidence_quantile)
    a.cost_aware = DEFAULT_COST_AWARE if a.cost_aware is None else a.cost_aware
    a.compute_weight = DEFAULT_COMPUTE_WEIGHT if a.compute_weight is None else a.compute_weight
    if a.compute_weight <= 0:
        raise SystemExit(f"--compute-weight: must be > 0, got {a.compute_weight:g}")
    a.kind = a.kind or DEFAULT_KIND
    a.aggregation = a.aggregation or DEFAULT_AGGREGATION
    if a.aggregation not in AGGREGATIONS:
        raise SystemExit(f"--aggregation: unknown {a.aggregation!r} (known: {', '.join(AGGREGATIONS)})")
    if a.kind not in MODEL_KINDS:
        raise SystemExit(f"--kind: unknown model kind {a.kind!r} (known: {', '.join(MODEL_KINDS)})")
    if a.drop_features and a.kind != "lightgbm-window-multiclass":
        raise SystemExit("--drop-features works with the multiclass kind only")

    from wattclass.classifier import features as F
    from wattclass.classifier.reader import iter_tables, telemetry_files
    from wattclass.classifier.replay import materialize
    from wattclass.classifier.training import (
        bundled_training_sources,
        h200_data_dir,
        job_families,
        training_set,
    )
    from wattclass.schema import GPM_COLUMNS, conform

    sources = a.raw or ([h200_data_dir() / n for n in DEVELOPMENT_FOLDERS] if a.loso
                        else bundled_training_sources())
    train_folders = tuple(n.strip() for n in a.train_folders.split(",") if n.strip()) or None
    unknown = sorted(set(train_folders or ()) - {Path(s).name for s in sources})
    if unknown:
        raise SystemExit(f"--train-folders: {', '.join(unknown)} not among the sources")
    families = job_families([*sources, *(a.test or []), *(a.extra or [])])
    with tempfile.TemporaryDirectory(prefix="wattclass-lofo-") as tmp:
        test_ts = training_set(a.test, max_windows_per_job=0) if a.test else None
        extra_ts = training_set(a.extra, max_windows_per_job=0) if a.extra else None
        roots = materialize(sources, Path(tmp))
        for f in telemetry_files(roots)[:10]:  # the model never reads GPM
            for _, t in iter_tables([f]):
                nogpm = conform(t.drop_columns([c for c in GPM_COLUMNS if c in t.column_names]))
                assert np.array_equal(F.feature_matrix(F.window_features(t)),
                                      F.feature_matrix(F.window_features(nogpm)), equal_nan=True)
        ts = training_set(roots, max_windows_per_job=0)
    if a.drop_features:
        ts = drop_features(ts, [f.strip() for f in a.drop_features.split(",") if f.strip()])
    if test_ts is not None and a.model is not None:
        res = saved_model(a.model, test_ts)
        saved = load_model(a.model)
        a.kind, a.aggregation = saved.kind, saved.aggregation
    elif test_ts is not None:
        train = ts if extra_ts is None else type(ts).concat([ts, extra_ts])
        res = held_out(train, test_ts, families, a.kind, cost_aware=a.cost_aware, aggregation=a.aggregation,
                       compute_weight=a.compute_weight, calibration=a.calibration)
    elif a.loso:
        res = loso(ts, families, a.kind, sets=tuple(n.strip() for n in a.sets.split(",") if n.strip()),
                   train_folders=train_folders, calibration=a.calibration,
                   calibrate_on_unused=a.calibrate_on_unused, cost_aware=a.cost_aware,
                   aggregation=a.aggregation, compute_weight=a.compute_weight)
    else:
        res = lofo(ts, families, cost_aware=a.cost_aware, kind=a.kind, extra=extra_ts,
                   aggregation=a.aggregation, compute_weight=a.compute_weight, calibration=a.calibration)
    by_label = {} if a.min_confidence_memory is None else {"memory": a.min_confidence_memory}
    out = summarize(res, families, a.min_confidence, by_label, by_set=a.loso)
    out["protocol"] = (f"saved model {a.model}, test on held-out" if a.model is not None
                       else "train on sources, test on held-out" if test_ts is not None
                       else "leave one set out" if a.loso
                       else "leave one family out")
    out["calibration"] = a.calibration
    out["held_out_sets"] = list(out.get("sets", {}))
    out["train_folders"] = list(train_folders or ())
    out["calibrate_on_unused"] = a.calibrate_on_unused
    if a.model is not None:
        out["model_version"] = saved.version
    out["kind"] = a.kind
    out["aggregation"] = a.aggregation
    out["sources"] = [str(s) for s in sources]
    out["test_sources"] = [str(s) for s in a.test or []]
    out["extra_training_sources"] = [str(s) for s in a.extra or []]
    out["cost_aware"] = a.cost_aware
    # the saved model's own cap with --model; else whether the trained recipe capped, at which quantile
    out["evidence_cap"] = (saved.evidence_cap if a.model is not None else
                           model_module.EVIDENCE_QUANTILE if model_module.DEFAULT_CAP_EVIDENCE else None)
    out["compute_weight"] = (float(saved.meta.get("compute_weight") or 1.0) if a.model is not None
                             else None if a.cost_aware else a.compute_weight)
    out["margin_inputs"] = list(margin_module.MARGIN_INPUTS)  # what a recipe flag set, as fitted
    out["spread_map"] = margin_module.SPREAD_MAP
    out["dropped_features"] = a.drop_features
    if a.json:
        print(json.dumps(out, indent=2))
        return 0
    print_report(out)
    return 0


def set_evidence_recipe(cap: bool, quantile: float | None) -> float | None:
    """Set the evidence cap of the recipe trained here (read by ``cross_validate`` through
    classifier/model.py DEFAULT_CAP_EVIDENCE and EVIDENCE_QUANTILE, as the recipe flags set the margin
    map's settings); ``quantile`` None keeps EVIDENCE_QUANTILE. Returns the quantile in use, None
    without a cap (for the JSON)."""
    from wattclass.classifier import model as model_module

    model_module.DEFAULT_CAP_EVIDENCE = cap
    if quantile is not None:
        if not 0 < quantile <= 1:
            raise SystemExit(f"--evidence-quantile: must be in (0, 1], got {quantile:g}")
        model_module.EVIDENCE_QUANTILE = quantile
    return model_module.EVIDENCE_QUANTILE if cap else None


def table_header(first: str = "family") -> str:
    """The column heads of ``table_line`` (shared with bench/eval_long_families.py)."""
    return (f"{first:<14} {'jobs':>4} {'acc':>6} {'acc(u=x)':>7} {'cover':>6} {'selacc':>6} "
            f"{'C->M (acted)':<13} {'M->C (acted)':<13} {'ECE':>6}")


def table_line(name: str, b: dict[str, Any]) -> str:
    """One row of the report: a ``summarize`` block (jobs, accuracies, coverage, errors, ECE)."""
    return (f"{name:<14} {b['jobs']:>4} {b['accuracy']:>6.3f} {b['accuracy_unsure_wrong']:>7.3f} "
            f"{b['coverage']:>6.3f} {b['selective_accuracy']:>6.3f} "
            f"{b['compute_called_memory']:>2}/{b['compute_jobs']:<3} ({b['compute_called_memory_acted']}) "
            f"{b['memory_called_compute']:>2}/{b['memory_jobs']:<3} ({b['memory_called_compute_acted']}) "
            f"{b['ece']:>6.3f}")


def print_report(out: dict[str, Any]) -> None:
    print(f"{out['protocol']}, model kind {out['kind']} ({out['aggregation']}), "
          f"{out['all']['jobs']} real H200 test jobs, "
          f"{len(out['families'])} families; truth = GPM job rule {out['truth_counts']}; "
          f"model inputs: basic NVML only")
    print(f"unsure = calibrated confidence < min_confidence {out['min_confidence']:g} "
          f"{out['min_confidence_by_label'] or ''} (policy does nothing)")
    print(table_header())
    for f, b in out["families"].items():
        print(table_line(f, b))
    print("-" * 96)
    for name in ("named_87", "sweep", "sweep_heldout", "all"):
        if name in out:
            print(table_line(name, out[name]))
    if "sets" in out:
        print("-" * 96)
        for name, b in out["sets"].items():
            print(table_line(name, b))
    a = out["all"]
    print(f"\nall: accuracy {a['accuracy']:.3f} (unsure counted wrong: {a['accuracy_unsure_wrong']:.3f}, "
          f"coverage {a['coverage']:.3f}); compute called memory {a['compute_called_memory']}/"
          f"{a['compute_jobs']} = {a['compute_called_memory'] / max(a['compute_jobs'], 1):.3f} "
          f"(acted on: {a['compute_called_memory_acted']}); ECE {a['ece']:.3f} (uncalibrated "
          f"{a['ece_raw']:.3f}; a perfectly calibrated model here: {a['ece_floor_mean']:.3f}, 95% under "
          f"{a['ece_floor_p95']:.3f})")
    print("wrong: " + "; ".join(out["wrong"]))


if __name__ == "__main__":
    sys.exit(main())
