"""Execution engines of the nightly feature stage: batched local processes, or dask.distributed.

The feature stage folds every telemetry window into mergeable per-job partial aggregates
(``features``). At fleet scale (10,000 GPUs: 30,000 hourly files of 2,880 rows a day) the cost is
not the arithmetic but the per-call overhead of doing it one small file at a time, so both engines
work on *file batches*: ``BATCH_FILES`` files are scanned together with ``pyarrow.dataset`` (only
the columns labelling needs, no hive partitioning -- the ``host=`` folders would clash with the
``host`` column), concatenated into one table of a few hundred thousand rows, and pushed through
the same window features, rule codes and model predictions (``labeling``) and the numpy group-by
of ``features.batch_partials``. ``batch_files=1`` scans file by file; the labels are identical
whatever the batch size (tests/test_engine.py), only the per-call bookkeeping is amortised.
``wattclass classify`` and ``wattclass nightly`` both label through this module.

Why pyarrow and not DuckDB or polars as the engine: the stage is more than a group-by. Windows
without GPM need the LightGBM model's prediction per window, and retraining needs a random sample
of labelled windows; both want the window features as numpy arrays, which Arrow gives without a
copy. The group-by runs in numpy on integer-coded job/host keys. See bench/fleet_nightly.py for the figures
against DuckDB's own group-by of the same aggregates.

Engines:
- ``local``: file chunks go to ``workers`` spawned processes (or run in this one); their merged
  partials and samples are merged here.
- ``dask``: the same chunk function runs as tasks on a dask.distributed cluster (see
  ``wattclass.classifier.scaleout``), whose results are merged here in the same order, so the labels
  equal the local engine's.

A batch that cannot be scanned as a whole (an unreadable file, a file lacking a required column)
is re-read file by file through ``reader.iter_tables``, which skips such a file with a warning.
Every scanned table then goes through the input rules of ``validity`` (impossible rows rejected,
duplicate windows dropped) before any feature is computed; what they drop is counted in the
``InputReport`` each unit of work returns, merged in chunk order like the partials.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from wattclass.classifier.features import batch_partials, feature_matrix, merge_partials, window_features
from wattclass.classifier.labeling import (
    READ_COLUMNS,
    LabelResult,
    Source,
    _batch_counts,
    _empty_labels,
    decide,
)
from wattclass.classifier.model import TrainingSet, WindowModel
from wattclass.classifier.reader import iter_tables
from wattclass.classifier.training import window_rule_codes
from wattclass.classifier.validity import RULE_INPUT_COLUMNS, InputReport, RowRules
from wattclass.errors import DataError
from wattclass.schema import REQUIRED_COLUMNS, TELEMETRY_V1

if TYPE_CHECKING:
    from distributed import Client

log = logging.getLogger("wattclass.classifier")

#: Files scanned together (about 290 k rows of 10 s windows at 2,880 rows a file).
BATCH_FILES = 100
#: Files per unit of work (a worker process's or a Dask task's share).
CHUNK_FILES = 1000
#: Merge the partials of this many batches into one (bounds memory on long chunks).
MERGE_EVERY = 16

#: Columns the feature stage reads: keys, time, energy, model inputs, GPM rule inputs.
SCAN_COLUMNS: tuple[str, ...] = tuple(
    dict.fromkeys(("ts_start", "ts_end", "host", "job_id", "energy_j", *RULE_INPUT_COLUMNS, *READ_COLUMNS))
)
_SCAN_SCHEMA = pa.schema([TELEMETRY_V1.field(c) for c in SCAN_COLUMNS])
#: Columns every telemetry row has (non-null in v1); a null here means a file lacked the column.
_NON_NULL = ("ts_start", "ts_end", "host")
_REQUIRED = frozenset(REQUIRED_COLUMNS)


@dataclass
class ChunkResult:
    """What one chunk of files contributes: merged partials, sample, windows, readable files."""

    partials: pa.Table | None
    sample: TrainingSet
    n_windows: int
    n_files: int
    report: InputReport


def _scan(files: Sequence[Path]) -> tuple[pa.Table, np.ndarray] | None:
    """One table of ``files`` (scan columns only) and each row's file index; None if it fails."""
    import pyarrow.dataset as ds

    try:
        dataset = ds.dataset([str(f) for f in files], schema=_SCAN_SCHEMA, format="parquet",
                             partitioning=None)
        # The scan fills a column a file lacks with nulls, and energy_j may be null in valid data,
        # so a missing required column is only visible in the files' own schemas.
        for fragment in dataset.get_fragments():
            if not _REQUIRED.issubset(fragment.physical_schema.names):
                return None  # let the per-file path name the file and the column
        index = {str(f): i for i, f in enumerate(files)}
        batches: list[pa.RecordBatch] = []
        file_idx: list[np.ndarray] = []
        for tagged in dataset.scanner(columns=list(SCAN_COLUMNS), use_threads=False).scan_batches():
            rb = tagged.record_batch
            if rb.num_rows:
                batches.append(rb)
                file_idx.append(np.full(rb.num_rows, index[tagged.fragment.path], dtype=np.int32))
    except (OSError, pa.ArrowException, KeyError):
        return None
    table = pa.Table.from_batches(batches, schema=_SCAN_SCHEMA)
    if any(table.column(c).null_count for c in _NON_NULL):
        return None  # some file lacks a required column: let the per-file path name it
    fidx = np.concatenate(file_idx) if file_idx else np.zeros(0, dtype=np.int32)
    return table, fidx


def _tables(files: Sequence[Path], drop_columns: Sequence[str], on_file: Callable[[int, Path], None] | None,
            batch_files: int, report: InputReport) -> Iterator[tuple[pa.Table, np.ndarray, int]]:
    """Yield (table, per-row file index, files read) per batch of files."""
    for start in range(0, len(files), max(1, batch_files)):
        batch = files[start:start + max(1, batch_files)]
        if on_file is not None:
            on_file(start + len(batch) - 1, batch[-1])
        scanned = None if drop_columns else _scan(batch)
        if scanned is not None:
            yield scanned[0], scanned[1], len(batch)
            continue
        seen: dict[Path, int] = {}
        for path, table in iter_tables(batch, drop_columns=drop_columns, columns=READ_COLUMNS,
                                       report=report):
            k = seen.setdefault(path, len(seen))
            yield table, np.full(table.num_rows, k, dtype=np.int32), 0
        yield pa.table({}), np.zeros(0, dtype=np.int32), len(seen)


def _sample(table: pa.Table, feats: dict[str, np.ndarray], codes: np.ndarray, file_idx: np.ndarray,
            per_job: int, rng: np.random.Generator, prefix: str) -> TrainingSet:
    """Up to ``per_job`` random GPM-labelled windows of each job in each file (row group)."""
    job = table.column("job_id")
    cand = np.flatnonzero((codes >= 0) & pc.is_valid(job).to_numpy(zero_copy_only=False))
    if len(cand) == 0:
        return TrainingSet.concat([])
    cand = cand[rng.permutation(len(cand))]
    enc = pc.dictionary_encode(job.combine_chunks())
    n_codes = len(enc.dictionary)
    job_code = np.asarray(enc.indices.to_numpy(zero_copy_only=False))[cand]
    key = file_idx[cand].astype(np.int64) * n_codes + job_code
    order = np.argsort(key, kind="stable")
    sorted_key = key[order]
    first = np.searchsorted(sorted_key, sorted_key, side="left")
    rank = np.empty(len(cand), dtype=np.int64)
    rank[order] = np.arange(len(cand)) - first
    keep = np.zeros(len(codes), dtype=bool)
    keep[cand[rank < per_job]] = True
    jobs = np.asarray(job.filter(pa.array(keep)).to_numpy(zero_copy_only=False), dtype=object)
    return TrainingSet(feature_matrix(feats)[keep], codes[keep],
                       np.asarray([f"{prefix}:{j}" for j in jobs], dtype=object), [prefix])


def label_chunk(
    files: Sequence[Path],
    model: WindowModel | None,
    source: Source = "auto",
    drop_columns: Sequence[str] = (),
    sample_per_job: int = 0,
    sample_prefix: str = "",
    seed: int = 0,
    on_file: Callable[[int, Path], None] | None = None,
    batch_files: int = BATCH_FILES,
) -> ChunkResult:
    """Merged partials (and sample) of a run of files, batch by batch; also a worker's task."""
    rng = np.random.default_rng(seed)
    partials: list[pa.Table] = []
    samples: list[TrainingSet] = []
    n_windows = n_files = 0
    report = InputReport()
    rules_ = RowRules(report)
    for table, file_idx, n_read in _tables(list(files), drop_columns, on_file, batch_files, report):
        n_files += n_read
        if not table.num_rows:
            continue
        keep = rules_.keep_mask(table)
        if not keep.all():
            table, file_idx = table.filter(pa.array(keep)), file_idx[keep]
            if not table.num_rows:
                continue
        n_windows += table.num_rows
        feats = window_features(table)
        counts = _batch_counts(table, feats, model, source)
        partials.append(batch_partials(table, feats, counts))
        if sample_per_job > 0:
            codes = window_rule_codes(table)
            samples.append(_sample(table, feats, codes, file_idx, sample_per_job, rng, sample_prefix))
        if len(partials) >= MERGE_EVERY:
            merged = merge_partials(partials)
            partials = [merged] if merged is not None else []
    return ChunkResult(merge_partials(partials), TrainingSet.concat(samples), n_windows, n_files, report)


def chunks_of(files: Sequence[Path], chunk_files: int = CHUNK_FILES) -> list[list[Path]]:
    """Split ``files`` (in order) into units of work of at most ``chunk_files`` files."""
    files = list(files)
    return [files[i:i + chunk_files] for i in range(0, len(files), max(1, chunk_files))]


def _combine(results: Sequence[ChunkResult], model: WindowModel | None, source: Source) -> LabelResult:
    """Merge chunk results (in chunk order) and decide every job's label."""
    from wattclass.classifier.features import finalize

    merged = merge_partials([r.partials for r in results if r.partials is not None])
    labels = decide(finalize(merged), model, source) if merged is not None else _empty_labels()
    report = InputReport()
    for r in results:
        report.merge(r.report)
    return LabelResult(labels, sum(r.n_files for r in results), sum(r.n_windows for r in results),
                       TrainingSet.concat([r.sample for r in results]), report)


def _require_model(model: WindowModel | None, source: Source) -> None:
    if source == "model" and model is None:
        raise DataError("--source model needs a model, and none could be loaded")


def _collect(futures: Sequence[Any], chunks: Sequence[Sequence[Path]],
             on_file: Callable[[int, Path], None] | None) -> list[ChunkResult]:
    """Chunk results in chunk order (local or Dask futures), reporting progress per chunk."""
    results: list[ChunkResult] = []
    done = 0
    for fut, chunk in zip(futures, chunks, strict=True):
        results.append(fut.result())
        done += len(chunk)
        if on_file is not None:
            on_file(done - 1, chunk[-1])
    return results


def label_files_local(
    files: Sequence[Path],
    model: WindowModel | None,
    source: Source = "auto",
    drop_columns: Sequence[str] = (),
    on_file: Callable[[int, Path], None] | None = None,
    sample_per_job: int = 0,
    sample_prefix: str = "",
    seed: int = 0,
    workers: int = 1,
    chunk_files: int = CHUNK_FILES,
    batch_files: int = BATCH_FILES,
) -> LabelResult:
    """The local engine: chunks in ``workers`` spawned processes (or here), merged here."""
    _require_model(model, source)
    chunks = chunks_of(files, chunk_files)
    if workers <= 1 or len(chunks) < 2:
        results = [label_chunk(list(files), model, source, drop_columns, sample_per_job, sample_prefix, seed,
                               on_file, batch_files)]
        return _combine(results, model, source)
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    ctx = mp.get_context("spawn")  # no forked OpenMP (LightGBM) state
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        futures = [pool.submit(label_chunk, c, model, source, tuple(drop_columns), sample_per_job,
                               sample_prefix, seed + i, None, batch_files) for i, c in enumerate(chunks)]
        results = _collect(futures, chunks, on_file)
    return _combine(results, model, source)


def label_files_dask(
    client: Client,
    files: Sequence[Path],
    model: WindowModel | None,
    source: Source = "auto",
    drop_columns: Sequence[str] = (),
    on_file: Callable[[int, Path], None] | None = None,
    sample_per_job: int = 0,
    sample_prefix: str = "",
    seed: int = 0,
    chunk_files: int = CHUNK_FILES,
) -> LabelResult:
    """The Dask engine: one task per chunk of files on the cluster's workers, merged here.

    Workers read the files themselves, so the telemetry must be on storage they all see (the
    shared file system a Slurm site has anyway). The model is scattered once, not sent per task.
    """
    _require_model(model, source)
    chunks = chunks_of(files, chunk_files)
    model_f: Any = client.scatter(model, broadcast=True) if model is not None else None
    futures = [client.submit(label_chunk, c, model_f, source, tuple(drop_columns), sample_per_job,
                             sample_prefix, seed + i, pure=False) for i, c in enumerate(chunks)]
    return _combine(_collect(futures, chunks, on_file), model, source)


def train_model_dask(client: Client, ts: TrainingSet, version: str) -> WindowModel:
    """Fit the window model with LightGBM's Dask estimator on ``client``'s workers.

    Same parameters, rounds, features and per-job weights as ``model.train_model`` (which the
    local engine uses); the rows are split over the workers and LightGBM trains data-parallel
    across them. A training set that lacks one of the three window classes is fitted here with
    ``train_model`` instead: the sklearn-style estimator would renumber the classes it saw.
    """
    import datetime as dt

    import dask.array as da
    import lightgbm as lgb

    from wattclass import __version__
    from wattclass.classifier import rules
    from wattclass.classifier.features import FEATURES
    from wattclass.classifier.model import (
        DEFAULT_PARAMS,
        FORMAT_VERSION,
        NUM_ROUNDS,
        _job_weights,
        train_model,
        training_summary,
    )

    y = ts.y.astype(np.int64)
    if set(np.unique(y).tolist()) != set(range(len(rules.WINDOW_CLASSES))):
        log.info("training set lacks a window class: fitting the candidate locally")
        return train_model(ts, version, evaluate=False)
    n_workers = max(1, len(client.scheduler_info().get("workers", {})))
    rows = max(1, -(-len(y) // n_workers))
    X = da.from_array(np.asarray(ts.X, dtype=np.float32), chunks=(rows, ts.X.shape[1]))
    dy = da.from_array(y, chunks=(rows,))
    dw = da.from_array(_job_weights(ts.group), chunks=(rows,))
    params = {k: v for k, v in DEFAULT_PARAMS.items() if k not in ("objective", "num_class")}
    est = lgb.DaskLGBMClassifier(client=client, objective="multiclass", n_estimators=NUM_ROUNDS, **params)
    est.fit(X, dy, sample_weight=dw, feature_name=list(FEATURES))
    booster = est.to_local().booster_
    meta: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "wattclass_version": __version__,
        "model_version": version,
        "created": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "kind": "lightgbm-window-multiclass",
        "trained_with": f"lightgbm.DaskLGBMClassifier on {n_workers} worker(s)",
        "aggregation": "argmax window counts + DESIGN.md job rule",
        "features": list(FEATURES),
        "window_classes": list(rules.WINDOW_CLASSES),
        "job_labels": list(rules.JOB_LABELS),
        "params": dict(DEFAULT_PARAMS),
        "num_rounds": NUM_ROUNDS,
        "calibration": None,
        "metrics": None,
        "training_data": training_summary(ts),
    }
    return WindowModel(booster, meta)
