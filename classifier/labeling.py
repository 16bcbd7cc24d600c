"""Label jobs from telemetry: rule where GPM exists, model elsewhere (the engine streams files).

Per batch of windows (``wattclass.classifier.engine`` drives it): window features, the GPM
window rule, and (for windows without GPM, or all windows when the model is forced) the model's
window class; all of it folded into mergeable per-job partial
aggregates. Nothing per window outlives its row group except an optional small random sample of
GPM-labelled windows for retraining (a few per job and row group).

Per job (``decide``): source ``rule`` when every window of the job has GPM (docs/design.md: "present
and not null"); otherwise ``model:<version>``, whose window counts take the rule's class for the
job's GPM windows (they are the truth) and the model's class for the rest.

Shared GPUs (docs/shared-gpus.md): a window of a GPU other jobs held too describes the whole GPU,
not the job, unless it is a MIG instance's row with the instance's own GPM. A job with such
windows gets the source suffix ``+shared`` and its confidence scaled by
``1 - SHARED_CONFIDENCE_PENALTY x (share of its windows that were shared)``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from wattclass.classifier import rules
from wattclass.classifier.features import (
    INPUT_COLUMNS,
    feature_matrix,
)
from wattclass.classifier.model import LengthWeights, TrainingSet, WindowModel, job_from_counts
from wattclass.classifier.training import window_rule_codes
from wattclass.classifier.validity import InputReport

log = logging.getLogger("wattclass.classifier")

Source = Literal["auto", "rule", "model"]
COUNT_COLUMNS = ("n_gpm", "r_idle", "r_compute", "r_memory", "m_idle", "m_compute", "m_memory", "m_pmax",
                 "n_shared", "n_pipe_gap")
#: A job whose every window came from a shared (non-MIG-GPM) GPU keeps half its confidence: below
#: the usual policy min_confidence, so such a label is reported but does not cap future jobs alone.
SHARED_CONFIDENCE_PENALTY = 0.5
LABEL_COLUMNS = (
    "job_id", "user", "label", "confidence", "source", "n_windows", "energy_j", "gpu_hours",
    "hosts", "start", "end", "gpm_share", "inputs", "confidence_unchecked",
)
#: The telemetry columns labelling reads (the rest of v1 is never decoded).
READ_COLUMNS: tuple[str, ...] = ("user", *INPUT_COLUMNS, *rules.RULE_COLUMNS, "shared_jobs", "share_basis")


@dataclass
class LabelResult:
    """Per-job labels plus what the run saw."""

    labels: pd.DataFrame  # LABEL_COLUMNS
    n_files: int
    n_windows: int
    sample: TrainingSet  # GPM-labelled windows kept for retraining (may be empty)
    report: InputReport = field(default_factory=InputReport)  # skipped files, dropped rows


def _batch_counts(
    table: pa.Table, feats: dict[str, np.ndarray], model: WindowModel | None, source: Source
) -> dict[str, np.ndarray]:
    codes = window_rule_codes(table)
    has_gpm = codes >= 0
    out = {
        "n_gpm": has_gpm.astype(np.float64),
        "r_idle": (codes == rules.IDLE).astype(np.float64),
        "r_compute": (codes == rules.COMPUTE).astype(np.float64),
        "r_memory": (codes == rules.MEMORY).astype(np.float64),
        "n_pipe_gap": (codes == rules.PIPE_GAP).astype(np.float64),
    }
    mcls = np.where(has_gpm, codes, -1).astype(np.int64)
    pmax = np.where(has_gpm, 1.0, 0.0)
    if model is not None and source != "rule":
        need = pc.is_valid(table.column("job_id")).to_numpy(zero_copy_only=False)
        if source == "auto":
            need &= ~has_gpm
        if need.any():
            proba = model.predict_proba(feature_matrix(feats)[need])
            mcls[need] = proba.argmax(axis=1)
            pmax[need] = proba.max(axis=1)
    for k, name in enumerate(("m_idle", "m_compute", "m_memory")):
        out[name] = (mcls == k).astype(np.float64)
    out["m_pmax"] = pmax
    out["n_shared"] = _shared_windows(table, has_gpm)
    return out


def _shared_windows(table: pa.Table, has_gpm: np.ndarray) -> np.ndarray:
    """1.0 for windows whose activity columns are the whole shared GPU's, not the job's own: other
    jobs held the GPU, and it is not a MIG instance row with the instance's GPM."""
    names = table.column_names
    if "shared_jobs" not in names:
        return np.zeros(table.num_rows)
    n = table.column("shared_jobs").to_numpy(zero_copy_only=False)
    n = np.nan_to_num(np.asarray(n, dtype=np.float64), nan=0.0)
    basis = (table.column("share_basis").to_numpy(zero_copy_only=False) if "share_basis" in names
             else np.full(table.num_rows, None, dtype=object))
    own = (basis == "mig") & has_gpm
    shared: np.ndarray = ((n > 1) & ~own).astype(np.float64)
    return shared


def _empty_labels() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object) for c in LABEL_COLUMNS})


def _fingerprints(jobs: pd.DataFrame) -> np.ndarray:
    """Per job: the fingerprint of the windows the model labelled (classifier/ambiguity.py), from the
    engine's fp_* sums; NaN (no lowering) where the model labelled none of a job's windows."""
    from wattclass.classifier.ambiguity import FP_SUM_COLUMNS, FP_WEIGHT_COLUMNS, fingerprint_from_sums

    if not all(c in jobs for c in FP_SUM_COLUMNS + FP_WEIGHT_COLUMNS):  # no window went to the model
        return np.full((len(jobs), len(FP_SUM_COLUMNS)), np.nan)
    return fingerprint_from_sums(jobs[list(FP_SUM_COLUMNS)].to_numpy(dtype=np.float64),
                                 jobs[list(FP_WEIGHT_COLUMNS)].to_numpy(dtype=np.float64))


def decide(jobs: pd.DataFrame, model: WindowModel | None, source: Source = "auto") -> pd.DataFrame:
    """Per-job label, confidence and source from finalized job aggregates."""
    n = jobs["n_windows"].to_numpy(dtype=np.float64)
    n_gpm = jobs["n_gpm"].to_numpy()
    use_rule = (n_gpm >= n) if source != "model" else np.zeros(len(jobs), dtype=bool)
    r_lab = rules.job_labels(jobs["r_idle"], jobs["r_compute"], jobs["r_memory"])
    r_conf = rules.job_confidence(jobs["r_idle"], jobs["r_compute"], jobs["r_memory"], r_lab)
    no_label = np.full(len(jobs), None, dtype=object)
    label = np.where(use_rule, rules.label_names(r_lab), no_label).astype(object)
    conf = np.asarray(np.where(use_rule, r_conf, np.nan), dtype=np.float64)
    src = np.asarray(np.where(use_rule, "rule", "none"), dtype=object)
    # The confidence before the ambiguity check, for the table's per-key vote (table.build_entries):
    # a check that lowers some of a key's jobs must not raise the share of the others.
    unchecked = conf.copy()
    if model is not None and source != "rule":
        weighted = model.aggregation == "length-weighted" and "m_compute_w" in jobs
        weights = (LengthWeights(jobs["m_idle_w"], jobs["m_compute_w"], jobs["m_memory_w"])
                   if weighted else None)
        m_lab, m_raw = job_from_counts(jobs["m_idle"], jobs["m_compute"], jobs["m_memory"], jobs["m_pmax"],
                                       weights=weights, evidence_cap=model.evidence_cap)
        m_unchecked = model.calibrate(m_raw, m_lab)
        m_conf = model.checked(m_unchecked, m_lab, _fingerprints(jobs) if model.ambiguity else None)
        use_model = ~use_rule
        label[use_model] = rules.label_names(m_lab)[use_model]
        conf[use_model] = m_conf[use_model]
        unchecked[use_model] = m_unchecked[use_model]
        src[use_model] = model.source
    if "n_shared" in jobs:
        shared = jobs["n_shared"].to_numpy(dtype=np.float64) / np.maximum(n, 1)
        marked = (shared > 0) & (src != "none")
        conf = np.where(marked, conf * (1 - SHARED_CONFIDENCE_PENALTY * shared), conf)
        unchecked = np.where(marked, unchecked * (1 - SHARED_CONFIDENCE_PENALTY * shared), unchecked)
        src = np.where(marked, src.astype(str) + "+shared", src).astype(object)
    inputs = np.where(use_rule, "gpm (sm, dram, compute pipes)",
                      np.where(src == "none", "-", "nvml basic counters (model)")).astype(object)
    gap = jobs["n_pipe_gap"].to_numpy(dtype=np.float64) if "n_pipe_gap" in jobs else np.zeros(len(jobs))
    for i in np.flatnonzero(gap > 0):
        inputs[i] = (f"{inputs[i]}; rule withheld: {int(gap[i])} active window(s) lacked a compute pipe "
                     "(FP64/FP32/FP16/integer/tensor not exported), could be compute on that pipe")
    unlabelled = int((src == "none").sum())
    if unlabelled:
        log.warning("%d job(s) lack GPM in some window and no model was used: left unlabelled", unlabelled)
    return pd.DataFrame({
        "job_id": jobs["job_id"].astype(str),
        "user": jobs["user"],
        "label": label,
        "confidence": np.round(conf, 4),
        "source": src,
        "n_windows": jobs["n_windows"].astype(np.int64),
        "energy_j": jobs["energy_j"].astype(np.float64),
        "gpu_hours": jobs["gpu_hours"].astype(np.float64),
        "hosts": jobs["hosts"],
        "start": jobs["ts_start"],
        "end": jobs["ts_end"],
        "gpm_share": np.round(n_gpm / np.maximum(n, 1), 4),
        "inputs": inputs,
        "confidence_unchecked": np.round(unchecked, 4),
    })


def write_labels(labels: pd.DataFrame, path: Path) -> None:
    """Write a labels table as Parquet, atomically."""
    import pyarrow.parquet as pq

    from wattclass.fsutil import atomic_writer

    table = pa.Table.from_pandas(labels, preserve_index=False)
    with atomic_writer(Path(path)) as fh:
        pq.write_table(table, fh, compression="zstd")
