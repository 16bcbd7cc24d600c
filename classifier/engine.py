"""Execution engines of the nightly feature stage: DuckDB on this machine, or Dask tasks of it.

The feature stage folds every telemetry window into per-(job, host) partial aggregates: window
counts, duration, energy, time span, user, the GPM rule's window counts, and (for windows without
GPM) the model's window classes. DuckDB does the scan and the group-by in one pass over all
files with all cores (``scan.Scanner``); numpy runs only where per-window arrays are needed: the
model on windows without GPM (read in a second, filtered pass over only the files that hold
them) and the retraining sample. Partials merge by sums and min/max, so any split of the files
gives the same labels; ``decide`` turns the merged per-job rows into labels (``labeling``).
``wattclass classify`` and ``wattclass nightly`` both label through this module.

Engines:
- ``local``: one DuckDB connection over all files, ``workers`` threads (0: every core).
- ``dask``: the same chunk function runs as tasks on a dask.distributed cluster (see
  ``wattclass.classifier.scaleout``), each over a chunk of files with one thread; the partials
  are merged here, so the labels equal the local engine's.

Input rules (``validity``, issue 9): a file DuckDB cannot read or one lacking a required column is
skipped with a warning naming it; impossible rows are rejected and duplicate windows dropped in
the DuckDB pass itself; all of it is counted in the result's ``report`` (the night's summary).

Imports: the scan needs DuckDB, pyarrow and numpy only. pandas (the per-job table), SciPy (the
rule's confidence) and LightGBM (the model) are imported after it, where they are used, and the
model may be given as a loader that is called only when a window needs it (``ModelSource``): a
fleet whose GPUs all export GPM never loads LightGBM to be labelled (issue 15).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from wattclass.classifier import rules
from wattclass.classifier.scan import JobRecords, Scanner, sample_files
from wattclass.classifier.validity import InputReport
from wattclass.errors import DataError

if TYPE_CHECKING:
    import pandas as pd
    from distributed import Client

    from wattclass.classifier.labeling import LabelResult
    from wattclass.classifier.model import TrainingSet, WindowModel

Source: TypeAlias = Literal["auto", "rule", "model"]  # labeling.Source, without importing pandas
#: A model, or a loader returning one (or None: no usable model) called only when a window needs it.
ModelSource: TypeAlias = "WindowModel | Callable[[], WindowModel | None] | None"


class _Model:
    """A ``ModelSource`` resolved at most once, on first use."""

    def __init__(self, model: ModelSource) -> None:
        self._given = model
        self._loaded = model is None or not callable(model)
        self._model: WindowModel | None = None if callable(model) else model

    @property
    def given(self) -> bool:
        """Whether there is a model or a loader (the labels may use one)."""
        return self._given is not None

    def get(self) -> WindowModel | None:
        if not self._loaded:
            loader = self._given
            assert callable(loader)
            self._model = loader()
            self._loaded = True
        return self._model

log = logging.getLogger("wattclass.classifier")

#: Files per Dask task.
CHUNK_FILES = 1000
#: GPM windows the nightly samples per job for retraining (a seeded random draw; see scan.py).
SAMPLE_PER_JOB = 16
#: Kept for callers of the former pyarrow engine; DuckDB reads all files of a chunk at once.
BATCH_FILES = 100

_SUMS = ("n_windows", "dur_ms", "energy_j", "n_gpm", "r_idle", "r_compute", "r_memory", "n_shared",
         "n_pipe_gap", "x_idle", "x_compute", "x_memory", "x_pmax", "x_idle_w", "x_compute_w",
         "x_memory_w")
#: Per-(job, host) sums of the model's window decisions: argmax class counts, summed top
#: probability, and the class counts weighted by window length (``window_weights``; the idle one
#: gives the job's length in windows for the model's evidence cap).
_X_SUMS = ("x_idle", "x_compute", "x_memory", "x_pmax", "x_idle_w", "x_compute_w", "x_memory_w")


@dataclass
class ChunkResult:
    """What one chunk of files contributes: merged partials, sample, windows, files read."""

    partials: pa.Table | None
    sample: TrainingSet
    n_windows: int
    n_files: int
    #: The sample's hash keys (one per sampled window): merging chunks keeps the smallest per job.
    sample_h: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.uint64))
    #: Files skipped, impossible rows rejected and duplicate windows dropped (``validity``).
    report: InputReport = field(default_factory=InputReport)


def _model_counts(scanner: Scanner, files: Sequence[Path], model: WindowModel, forced: bool,
                  drop_columns: Sequence[str]) -> pa.Table | None:
    """Per (job, host): the model's window classes, summed top probability and length-weighted
    compute and memory counts (x_*, ``_X_SUMS``); for a model with the ambiguity check, the sums of
    its windows' fingerprints too (fp_*, classifier/ambiguity.py)."""
    from wattclass.classifier.ambiguity import FP_SUM_COLUMNS, FP_WEIGHT_COLUMNS, window_sums
    from wattclass.classifier.features import column_f64, feature_matrix, window_features
    from wattclass.classifier.model import window_weights

    amb = model.ambiguity is not None
    cols = [*_X_SUMS, *(FP_SUM_COLUMNS + FP_WEIGHT_COLUMNS if amb else ())]
    parts = []
    for batch in scanner.model_batches(files, forced, drop_columns):
        X = feature_matrix(window_features(batch))
        proba = model.predict_proba(X)
        cls = proba.argmax(axis=1)
        dur_s = column_f64(batch, "window_ms") / 1000.0
        w = window_weights(dur_s)
        data = {"job_id": batch.column("job_id"), "host": batch.column("host"),
                "x_idle": (cls == 0).astype(np.int64), "x_compute": (cls == 1).astype(np.int64),
                "x_memory": (cls == 2).astype(np.int64),
                "x_pmax": proba.max(axis=1).astype(np.float64),
                "x_idle_w": np.where(cls == 0, w, 0.0), "x_compute_w": np.where(cls == 1, w, 0.0),
                "x_memory_w": np.where(cls == 2, w, 0.0)}
        if amb:
            num, den = window_sums(X, dur_s)
            for j, (cn, cd) in enumerate(zip(FP_SUM_COLUMNS, FP_WEIGHT_COLUMNS, strict=True)):
                data[cn], data[cd] = num[:, j], den[:, j]
        parts.append(_sum_by_key(pa.table(data), cols))
    if not parts:
        return None
    return _sum_by_key(pa.concat_tables(parts), cols)


def _fp_columns(names: Sequence[str]) -> list[str]:
    """The fingerprint sums (``_model_counts``) among ``names``: present only for a model with the
    ambiguity check."""
    return [c for c in names if c.startswith("fp_")]


def _sum_by_key(t: pa.Table, cols: Sequence[str]) -> pa.Table:
    out = t.group_by(["job_id", "host"], use_threads=False).aggregate([(c, "sum") for c in cols])
    return out.rename_columns([n.removesuffix("_sum") for n in out.column_names])


def _sample(rows: pa.Table | None, per_job: int, prefix: str) -> tuple[TrainingSet, np.ndarray]:
    """The sampled GPM windows (``Scanner.sample``) as a TrainingSet, at most ``per_job`` a job."""
    from wattclass.classifier.features import column_f64, feature_matrix, window_features
    from wattclass.classifier.margin import roofline_margin
    from wattclass.classifier.model import TrainingSet

    if rows is None or rows.num_rows == 0:
        return TrainingSet.concat([]), np.zeros(0, dtype=np.uint64)
    jobs = np.asarray(rows.column("job_id").to_pylist(), dtype=object)
    h = rows.column("h").to_numpy().astype(np.uint64)
    # In (job, hash) order: DuckDB returns groups in any order, and the row order of the
    # training set changes the model (LightGBM's bagging), so the same night retrains the same.
    idx = _smallest_per_group(jobs, h, per_job)
    rows, jobs, h = rows.take(pa.array(idx)), jobs[idx], h[idx]
    X = feature_matrix(window_features(rows))
    y = rows.column("code").to_numpy().astype(np.int8)
    group = np.asarray([f"{prefix}:{j}" for j in jobs], dtype=object)
    margin = roofline_margin([column_f64(rows, c) for c in rules.COMPUTE_UNITS],
                             column_f64(rows, "dram_bw_util_pct"))
    # The window's length: the length-weighted job aggregation (model.window_weights) and the
    # shortest window trained on (MIN_TRAIN_WINDOW_S) need it, as for the bundled recordings.
    dur = column_f64(rows, "window_ms") / 1000.0
    return TrainingSet(X, y, group, [prefix], dur=dur, margin=margin), h


def _smallest_per_group(groups: np.ndarray, h: np.ndarray, n: int) -> npt.NDArray[np.intp]:
    """Indices of the ``n`` smallest ``h`` of each group, in (group as text, ``h``) order."""
    if len(h) == 0:
        return np.zeros(0, dtype=np.intp)
    order = np.lexsort((h, groups.astype(str)))
    g = groups[order]
    first = np.r_[True, g[1:] != g[:-1]]
    start = np.maximum.accumulate(np.where(first, np.arange(len(g)), 0))
    return order[(np.arange(len(g)) - start) < n]


def label_chunk(
    files: Sequence[Path],
    model: ModelSource,
    source: Source = "auto",
    drop_columns: Sequence[str] = (),
    sample_per_job: int = 0,
    sample_prefix: str = "",
    seed: int = 0,
    on_file: Callable[[int, Path], None] | None = None,
    batch_files: int = BATCH_FILES,
    threads: int = 1,
    jobs: JobRecords = None,
    on_scan: Callable[[], object] | None = None,
    drawn: frozenset[str] | None = None,
) -> ChunkResult:
    """Partials (and sample) of a run of files; also a Dask task. ``batch_files`` is ignored.

    ``jobs``: Slurm job records (``jobcheck.job_records_table``) the windows are checked against,
    or a function returning them once the scan's query has run (``Scanner.partials``).
    ``on_scan``: called as the scan's query starts (``Scanner``). ``drawn``: the files the night's
    retraining sample is drawn from (``scan.sample_files`` of all its files; None: of ``files``)."""
    files = list(files)
    lazy = _Model(model)
    scanner = Scanner(threads, on_scan)
    try:
        res = scanner.partials(files, drop_columns, sample_per_job, seed, jobs, drawn)
        part = res.partials
        sampled = res.sample
        x = None
        if lazy.given and source != "rule" and part.num_rows:
            forced = source == "model"
            mfiles = res.files if forced else res.nogpm_files
            m = lazy.get() if mfiles else None
            if m is not None:
                x = _model_counts(scanner, [Path(f) for f in mfiles], m, forced, drop_columns)
    finally:
        scanner.close()
    if on_file is not None and files:
        on_file(len(files) - 1, files[-1])
    sample, sample_h = _sample(sampled, sample_per_job, sample_prefix)
    part = _with_model_counts(part, x, lazy.given and source != "rule", source == "model")
    report = InputReport()
    for f, why in res.skipped:
        reason, _, detail = why.partition(": ")
        report.skipped_files[str(f)] = f"{reason}: {detail[:200]}"
    report.duplicate_windows = res.duplicates
    report.conflicting_duplicates = res.conflicting
    report.rejected_rows = dict(res.rejected)
    return ChunkResult(part if part.num_rows else None, sample, res.n_windows, len(res.files), sample_h,
                       report)


def _with_model_counts(part: pa.Table, x: pa.Table | None, use_model: bool, forced: bool) -> pa.Table:
    """Add x_* (the model's counts over the windows it labelled) and ``forced`` per row."""
    n = part.num_rows
    zeros_i, zeros_f = pa.array(np.zeros(n, dtype=np.int64)), pa.array(np.zeros(n, dtype=np.float64))
    if x is not None and x.num_rows:
        joined = part.join(x, ["job_id", "host"], join_type="left outer", use_threads=False)
        part = joined.select([*part.column_names, *_X_SUMS, *_fp_columns(x.column_names)])
        part = pa.table({c: (pc.fill_null(part.column(c), 0) if c.startswith(("x_", "fp_"))
                             else part.column(c)) for c in part.column_names})
    else:
        for c in ("x_idle", "x_compute", "x_memory"):
            part = part.append_column(c, zeros_i)
        for c in ("x_pmax", "x_idle_w", "x_compute_w", "x_memory_w"):
            part = part.append_column(c, zeros_f)
    flag = pa.array(np.full(n, 2 if forced else 1 if use_model else 0, dtype=np.int8))
    return part.append_column("model_mode", flag)


def merge_partials(parts: Sequence[pa.Table]) -> pa.Table | None:
    """Merge per-(job, host) partials from any split of the files into one."""
    parts = [p for p in parts if p is not None and p.num_rows]
    if not parts:
        return None
    t = pa.concat_tables(parts, promote_options="default")
    aggs = [(c, "sum") for c in (*_SUMS, *_fp_columns(t.column_names))] + [
        ("user", "min"), ("ts_start_ms", "min"), ("ts_end_ms", "max"), ("model_mode", "max")]
    out = t.group_by(["job_id", "host"], use_threads=False).aggregate(aggs)
    back = {f"{c}_{a}": c for c, a in aggs}
    return out.rename_columns([back.get(n, n) for n in out.column_names])


def _hosts(partials: pa.Table) -> pd.Series:
    """Per job_id: its hosts, sorted and comma-joined (``partials`` has one row per job and host).

    In Arrow rather than a Python join per job: 0.1 s of a 1,000-GPU night's stage."""
    import pandas as pd

    t = partials.select(["job_id", "host"]).sort_by([("job_id", "ascending"), ("host", "ascending")])
    lists = t.group_by("job_id", use_threads=False).aggregate([("host", "list")])
    col = lists.column("host_list")
    joined = pc.binary_join(col, pa.scalar(",", col.type.value_type))
    return pd.Series(joined.to_pylist(), index=lists.column("job_id").to_pylist())


def finalize(partials: pa.Table) -> pd.DataFrame:
    """One row per job (sorted by job_id) with what ``labeling.decide`` reads."""
    import pandas as pd

    df = partials.to_pandas()
    g = df.groupby("job_id", sort=True)
    jobs = g[[*_SUMS, *_fp_columns(list(df.columns))]].sum()
    jobs["user"] = g["user"].min()
    jobs["hosts"] = _hosts(partials).reindex(jobs.index)
    for col, src, how in (("ts_start", "ts_start_ms", "min"), ("ts_end", "ts_end_ms", "max")):
        ms = g[src].min() if how == "min" else g[src].max()
        jobs[col] = pd.to_datetime(ms.astype(np.int64), unit="ms", utc=True).astype("datetime64[ms, UTC]")
    jobs["gpu_hours"] = jobs["dur_ms"] / 3.6e6
    mode = g["model_mode"].max()
    rule_m = {"m_idle": "r_idle", "m_compute": "r_compute", "m_memory": "r_memory"}
    for m, r in rule_m.items():
        x = jobs["x" + m[1:]]
        # auto: the rule's class on GPM windows, the model's elsewhere; model: the model's only
        jobs[m] = np.where(mode == 2, x, jobs[r] + x).astype(np.float64)
    jobs["m_pmax"] = np.where(mode == 2, jobs["x_pmax"], jobs["n_gpm"] + jobs["x_pmax"])
    # length-weighted split (model.job_from_counts): the model's windows by length, the rule's whole
    for m, r in (("m_idle_w", "r_idle"), ("m_compute_w", "r_compute"), ("m_memory_w", "r_memory")):
        jobs[m] = np.where(mode == 2, jobs["x" + m[1:]], jobs[r] + jobs["x" + m[1:]]).astype(np.float64)
    out: pd.DataFrame = jobs.reset_index()
    return out


def _combine(results: Sequence[ChunkResult], model: _Model, source: Source,
             sample_per_job: int = 0) -> LabelResult:
    """Merge chunk results and decide every job's label."""
    from wattclass.classifier.labeling import LabelResult, _empty_labels, decide
    from wattclass.classifier.model import TrainingSet

    merged = merge_partials([r.partials for r in results if r.partials is not None])
    if merged is None:
        labels = _empty_labels()
    else:
        jobs = finalize(merged)
        # The model decides only jobs with a window the rule cannot label (or all, when forced).
        needs = source == "model" or (source == "auto" and bool((jobs["n_gpm"] < jobs["n_windows"]).any()))
        labels = decide(jobs, model.get() if needs else None, source)
    samples = [r.sample for r in results]
    sample = TrainingSet.concat(samples)
    if len(results) > 1 and len(sample) and sample_per_job > 0:
        h = np.concatenate([r.sample_h for r in results if len(r.sample)])
        # in (job, hash) order, as ``_sample`` orders one chunk's: a job's windows from several
        # chunks would otherwise come in blocks, and the row order changes the retrained model
        sample = sample.subset(_smallest_per_group(sample.group, h, sample_per_job))
    report = InputReport()
    for r in results:
        report.merge(r.report)
    return LabelResult(labels, sum(r.n_files for r in results), sum(r.n_windows for r in results), sample,
                       report)


#: What the stage imports after the scan: the per-job table and labels (pandas) and the rule's
#: confidence (SciPy's special functions).
AFTER_SCAN_MODULES = ("wattclass.classifier.labeling", "scipy.special")


def preload_after_scan(modules: Sequence[str | Callable[[], object]] = AFTER_SCAN_MODULES,
                       ) -> threading.Thread:
    """Import ``modules`` (names; or call loaders) in a background thread while DuckDB scans.

    Why (issue 15): at 1,000 GPUs these imports were a fifth of the stage after a scan of two
    seconds, and the scan leaves some CPU free (DuckDB runs without the GIL). Nothing depends on
    the thread: a module still loading when the stage needs it is waited for by Python's own
    import lock (a loader must be thread-safe and load once, as nightly's model loader), and an
    import or load that fails here fails again, with its error, where it is used."""
    import importlib

    def run() -> None:
        for item in modules:
            try:
                if callable(item):
                    item()
                else:
                    importlib.import_module(item)
            except Exception:  # raised again, properly, where it is used
                log.debug("preloading %s failed", item, exc_info=True)

    th = threading.Thread(target=run, name="wattclass-preload", daemon=True)
    th.start()
    return th


def _require_model(model: ModelSource, source: Source) -> _Model:
    lazy = _Model(model)
    if source == "model" and lazy.get() is None:
        raise DataError("--source model needs a model, and none could be loaded")
    return lazy


def _night_draw(files: Sequence[Path], sample_per_job: int, seed: int) -> frozenset[str] | None:
    """The files the night's retraining sample is drawn from (``scan.sample_files``), drawn once
    for every chunk: each chunk drawing its own share read one file in eight of the night whatever
    the cap, and another draw than the engine that scans the night at once."""
    return sample_files(files, seed) if sample_per_job > 0 else None


def chunks_of(files: Sequence[Path], chunk_files: int = CHUNK_FILES) -> list[list[Path]]:
    """Split ``files`` (in order) into units of work of at most ``chunk_files`` files."""
    files = list(files)
    return [files[i:i + chunk_files] for i in range(0, len(files), max(1, chunk_files))]


def label_files_local(
    files: Sequence[Path],
    model: ModelSource,
    source: Source = "auto",
    drop_columns: Sequence[str] = (),
    on_file: Callable[[int, Path], None] | None = None,
    sample_per_job: int = 0,
    sample_prefix: str = "",
    seed: int = 0,
    workers: int = 0,
    chunk_files: int = 0,
    batch_files: int = BATCH_FILES,
    preload: Sequence[str | Callable[[], object]] = AFTER_SCAN_MODULES,
    jobs: JobRecords = None,
) -> LabelResult:
    """The local engine: DuckDB over ``files`` with ``workers`` threads (0: every core).

    ``chunk_files`` > 0 splits the files into separately scanned chunks merged afterwards (what
    the Dask engine does; the labels are the same); 0 scans them all at once. ``preload``: what
    to import (or load) beside the scan (``preload_after_scan``), started as the first chunk's
    query starts. ``jobs``: Slurm job records the job windows are checked against, or a function
    returning them (``label_chunk``; with several chunks it is called once per chunk).
    """
    lazy = _require_model(model, source)
    started: list[threading.Thread] = []

    def start_preload() -> None:  # once, whichever chunk's scan starts first
        if not started:
            started.append(preload_after_scan(preload))

    chunks = chunks_of(files, chunk_files) if chunk_files > 0 else [list(files)]
    given = lazy.get if lazy.given else None  # each chunk loads it through this one, at most once
    drawn = _night_draw(files, sample_per_job, seed)
    results = [label_chunk(c, given, source, drop_columns, sample_per_job, sample_prefix, seed, on_file,
                           batch_files, threads=workers, jobs=jobs, on_scan=start_preload, drawn=drawn)
               for c in chunks if c]
    return _combine(results, lazy, source, sample_per_job)


def label_files_dask(
    client: Client,
    files: Sequence[Path],
    model: ModelSource,
    source: Source = "auto",
    drop_columns: Sequence[str] = (),
    on_file: Callable[[int, Path], None] | None = None,
    sample_per_job: int = 0,
    sample_prefix: str = "",
    seed: int = 0,
    chunk_files: int = CHUNK_FILES,
    jobs: pa.Table | None = None,
) -> LabelResult:
    """The Dask engine: one task per chunk of files on the cluster's workers, merged here.

    Workers read the files themselves, so the telemetry must be on storage they all see (the
    shared file system a Slurm site has anyway). The model is scattered once, not sent per task.
    """
    lazy = _require_model(model, source)
    chunks = chunks_of(files, chunk_files)
    resolved = lazy.get()  # the workers cannot call a loader of this process
    model_f: Any = client.scatter(resolved, broadcast=True) if resolved is not None else None
    jobs_f: Any = client.scatter(jobs, broadcast=True) if jobs is not None else None
    drawn = _night_draw(files, sample_per_job, seed)
    futures = [client.submit(label_chunk, c, model_f, source, tuple(drop_columns), sample_per_job,
                             sample_prefix, seed, jobs=jobs_f, drawn=drawn, pure=False) for c in chunks]
    results: list[ChunkResult] = []
    done = 0
    for fut, chunk in zip(futures, chunks, strict=True):
        results.append(fut.result())
        done += len(chunk)
        if on_file is not None:
            on_file(done - 1, chunk[-1])
    return _combine(results, lazy, source, sample_per_job)

