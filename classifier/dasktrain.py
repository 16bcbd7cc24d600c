"""Fit the nightly's candidate window model on Dask workers (the scale-out path of retraining).

Why a module of its own: the engine labels windows; this trains a model, with LightGBM's
scikit-learn-style Dask estimator (the only place wattclass needs that API, ``lgbload.full``).
The local nightly trains with ``model.train_model``; both give the same kind of model file.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from wattclass.classifier import rules

if TYPE_CHECKING:
    from distributed import Client

    from wattclass.classifier.model import TrainingSet, WindowModel

log = logging.getLogger("wattclass.classifier")


def train_model_dask(client: Client, ts: TrainingSet, version: str,
                     kind: str | None = None, aggregation: str | None = None,
                     evidence_cap: float | Literal["fit"] | None = "fit") -> WindowModel:
    """Fit the window model with LightGBM's Dask estimator on ``client``'s workers.

    Same parameters, rounds, features, per-job weights and trainable windows (>= 5 s) as
    ``model.train_model``; ``kind`` and ``aggregation`` default to its. A set lacking a window
    class is fitted with ``train_model`` (the estimator would renumber the classes it saw). For
    a roofline-margin model the workers train the idle-vs-active booster, the client the ridge
    stage. ``aggregation`` is recorded for the calibration the caller attaches."""
    import datetime as dt

    import dask.array as da

    from wattclass.classifier import lgbload
    from wattclass.classifier.features import FEATURES
    from wattclass.classifier.model import (
        DEFAULT_AGGREGATION,
        DEFAULT_KIND,
        KIND_MARGIN,
        MIN_TRAIN_WINDOW_S,
        NUM_ROUNDS,
        WindowModel,
        _job_weights,
        fit_margin_stage,
        model_meta,
        resolve_evidence_cap,
        stage_params,
        train_model,
    )

    kind, aggregation = kind or DEFAULT_KIND, aggregation or DEFAULT_AGGREGATION

    lgbload.full()  # DaskLGBMClassifier is LightGBM's scikit-learn API (lgbload)
    import lightgbm as lgb
    margin_kind = kind == KIND_MARGIN
    fit = ts.subset(ts.trainable(MIN_TRAIN_WINDOW_S))
    # the roofline-margin model's booster is binary: idle vs active windows
    y = (fit.y != rules.IDLE).astype(np.int64) if margin_kind else fit.y.astype(np.int64)
    n_classes = 2 if margin_kind else len(rules.WINDOW_CLASSES)
    if set(np.unique(y).tolist()) != set(range(n_classes)):
        log.info("training set lacks a window class: fitting the candidate locally")
        return train_model(ts, version, evaluate=False, kind=kind, aggregation=aggregation,
                           evidence_cap=evidence_cap)
    n_workers = max(1, len(client.scheduler_info().get("workers", {})))
    rows = max(1, -(-len(y) // n_workers))
    # Rows in a seeded random order: each worker's part must hold every class (LightGBM's Dask
    # training takes the class count from each part), whatever order the sample came in.
    perm = np.random.default_rng(0).permutation(len(y))
    X = da.from_array(np.asarray(fit.X, dtype=np.float32)[perm], chunks=(rows, fit.X.shape[1]))
    dy = da.from_array(y[perm], chunks=(rows,))
    dw = da.from_array(_job_weights(fit.group)[perm], chunks=(rows,))
    params = {k: v for k, v in stage_params(kind).items() if k not in ("objective", "num_class")}
    est = lgb.DaskLGBMClassifier(client=client, objective="binary" if margin_kind else "multiclass",
                                 n_estimators=NUM_ROUNDS, **params)
    est.fit(X, dy, sample_weight=dw, feature_name=list(FEATURES))
    booster = est.to_local().booster_
    meta: dict[str, Any] = {
        **model_meta(version, kind, aggregation, dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                     MIN_TRAIN_WINDOW_S, ts, resolve_evidence_cap(ts, aggregation, evidence_cap)),
        "trained_with": f"lightgbm.DaskLGBMClassifier on {n_workers} worker(s)"
                        + ("; margin map fitted on the client" if margin_kind else ""),
        "calibration": None,
        "metrics": None,
    }
    if margin_kind:
        meta["margin"] = fit_margin_stage(fit)
    return WindowModel(booster, meta)
