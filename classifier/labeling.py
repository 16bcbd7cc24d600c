"""Label jobs from telemetry in one streaming pass: rule where GPM exists, model elsewhere.

Per row group: window features, the GPM window rule, and (for windows without GPM, or all windows
when the model is forced) the model's window class; all of it folded into mergeable per-job partial
aggregates. Nothing per window outlives its row group except an optional small random sample of
GPM-labelled windows for retraining (a few per job and row group).

Per job (``decide``): source ``rule`` when every window of the job has GPM (DESIGN.md: "present
and not null"); otherwise ``model:<version>``, whose window counts take the rule's class for the
job's GPM windows (they are the truth) and the model's class for the rest.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from wattclass.classifier import rules
from wattclass.classifier.features import (
    INPUT_COLUMNS,
    batch_partials,
    feature_matrix,
    finalize,
    merge_partials,
    window_features,
)
from wattclass.classifier.model import TrainingSet, WindowModel, job_from_counts
from wattclass.classifier.reader import iter_tables
from wattclass.classifier.training import window_rule_codes
from wattclass.errors import DataError

log = logging.getLogger("wattclass.classifier")

Source = Literal["auto", "rule", "model"]
COUNT_COLUMNS = ("n_gpm", "r_idle", "r_compute", "r_memory", "m_idle", "m_compute", "m_memory", "m_pmax")
LABEL_COLUMNS = (
    "job_id", "user", "label", "confidence", "source", "n_windows", "energy_j", "gpu_hours",
    "hosts", "start", "end", "gpm_share",
)
_MERGE_EVERY = 256
#: Files per unit of work handed to a worker process.
_CHUNK_FILES = 100
#: The telemetry columns labelling reads (the rest of v1 is never decoded).
READ_COLUMNS: tuple[str, ...] = ("user", *INPUT_COLUMNS, *rules.RULE_COLUMNS)


@dataclass
class LabelResult:
    """Per-job labels plus what the run saw."""

    labels: pd.DataFrame  # LABEL_COLUMNS
    n_files: int
    n_windows: int
    sample: TrainingSet  # GPM-labelled windows kept for retraining (may be empty)


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
    return out


def _sample(table: pa.Table, feats: dict[str, np.ndarray], codes: np.ndarray, per_job: int,
            rng: np.random.Generator, prefix: str) -> TrainingSet:
    """Up to ``per_job`` random GPM-labelled windows of each job in this row group."""
    cand = np.flatnonzero((codes >= 0) & pc.is_valid(table.column("job_id")).to_numpy(zero_copy_only=False))
    if len(cand) == 0:
        return TrainingSet.concat([])
    cand = cand[rng.permutation(len(cand))]
    enc = pc.dictionary_encode(table.column("job_id").combine_chunks())
    job_code = np.asarray(enc.indices.to_numpy(zero_copy_only=False))[cand]
    order = np.argsort(job_code, kind="stable")
    sorted_codes = job_code[order]
    first = np.searchsorted(sorted_codes, sorted_codes, side="left")
    rank = np.empty(len(cand), dtype=np.int64)
    rank[order] = np.arange(len(cand)) - first
    keep = np.zeros(len(codes), dtype=bool)
    keep[cand[rank < per_job]] = True
    jobs = np.asarray(table.column("job_id").to_numpy(zero_copy_only=False), dtype=object)[keep]
    return TrainingSet(feature_matrix(feats)[keep], codes[keep],
                       np.asarray([f"{prefix}:{j}" for j in jobs], dtype=object), [prefix])


def _label_chunk(
    files: Sequence[Path],
    model: WindowModel | None,
    source: Source,
    drop_columns: Sequence[str],
    sample_per_job: int,
    sample_prefix: str,
    seed: int,
    on_file: Callable[[int, Path], None] | None = None,
) -> tuple[pa.Table | None, TrainingSet, int, int]:
    """Merged partials, sample, windows and readable files of one run of files (also a worker's job)."""
    rng = np.random.default_rng(seed)
    partials: list[pa.Table] = []
    samples: list[TrainingSet] = []
    seen: set[Path] = set()
    n_windows = 0
    for path, table in iter_tables(files, drop_columns=drop_columns, on_file=on_file, columns=READ_COLUMNS):
        seen.add(path)
        n_windows += table.num_rows
        feats = window_features(table)
        counts = _batch_counts(table, feats, model, source)
        partials.append(batch_partials(table, feats, counts))
        if sample_per_job > 0:
            codes = window_rule_codes(table)
            samples.append(_sample(table, feats, codes, sample_per_job, rng, sample_prefix))
        if len(partials) >= _MERGE_EVERY:
            merged = merge_partials(partials)
            partials = [merged] if merged is not None else []
    return merge_partials(partials), TrainingSet.concat(samples), n_windows, len(seen)


def label_files(
    files: Sequence[Path],
    model: WindowModel | None,
    source: Source = "auto",
    drop_columns: Sequence[str] = (),
    on_file: Callable[[int, Path], None] | None = None,
    sample_per_job: int = 0,
    sample_prefix: str = "",
    seed: int = 0,
    workers: int = 1,
) -> LabelResult:
    """Stream ``files`` and label every job in them (see module docstring).

    With ``workers`` > 1 and enough files, chunks of files go to worker processes (spawned, so no
    OpenMP state is forked) and their partial aggregates are merged here; the result is the same.
    """
    if source == "model" and model is None:
        raise DataError("--source model needs a model, and none could be loaded")
    files = list(files)
    chunks = [files[i:i + _CHUNK_FILES] for i in range(0, len(files), _CHUNK_FILES)]
    if workers <= 1 or len(chunks) < 2:
        results = [_label_chunk(files, model, source, drop_columns, sample_per_job, sample_prefix, seed,
                                on_file)]
    else:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        ctx = mp.get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            futures = [pool.submit(_label_chunk, c, model, source, tuple(drop_columns), sample_per_job,
                                   sample_prefix, seed + i) for i, c in enumerate(chunks)]
            results = []
            done_files = 0
            for fut, chunk in zip(futures, chunks, strict=True):
                results.append(fut.result())
                done_files += len(chunk)
                if on_file is not None:
                    on_file(done_files - 1, chunk[-1])
    merged = merge_partials([r[0] for r in results if r[0] is not None])
    labels = decide(finalize(merged), model, source) if merged is not None else _empty_labels()
    return LabelResult(labels, sum(r[3] for r in results), sum(r[2] for r in results),
                       TrainingSet.concat([r[1] for r in results]))


def _empty_labels() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object) for c in LABEL_COLUMNS})


def decide(jobs: pd.DataFrame, model: WindowModel | None, source: Source = "auto") -> pd.DataFrame:
    """Per-job label, confidence and source from finalized job aggregates."""
    n = jobs["n_windows"].to_numpy(dtype=np.float64)
    n_gpm = jobs["n_gpm"].to_numpy()
    use_rule = (n_gpm >= n) if source != "model" else np.zeros(len(jobs), dtype=bool)
    r_lab = rules.job_labels(jobs["r_idle"], jobs["r_compute"], jobs["r_memory"])
    r_conf = rules.job_confidence(jobs["r_idle"], jobs["r_compute"], jobs["r_memory"], r_lab)
    label = np.asarray(np.where(use_rule, rules.label_names(r_lab), None), dtype=object)
    conf = np.asarray(np.where(use_rule, r_conf, np.nan), dtype=np.float64)
    src = np.asarray(np.where(use_rule, "rule", "none"), dtype=object)
    if model is not None and source != "rule":
        m_lab, m_raw = job_from_counts(jobs["m_idle"], jobs["m_compute"], jobs["m_memory"], jobs["m_pmax"])
        m_conf = model.calibrate(m_raw)
        use_model = ~use_rule
        label[use_model] = rules.label_names(m_lab)[use_model]
        conf[use_model] = m_conf[use_model]
        src[use_model] = model.source
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
    })


def write_labels(labels: pd.DataFrame, path: Path) -> None:
    """Write a labels table as Parquet, atomically."""
    import pyarrow.parquet as pq

    from wattclass.fsutil import atomic_writer

    table = pa.Table.from_pandas(labels, preserve_index=False)
    with atomic_writer(Path(path)) as fh:
        pq.write_table(table, fh, compression="zstd")
