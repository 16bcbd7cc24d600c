"""Build the model's training set from any list of v1 telemetry files (GPM gives the labels).

Each telemetry *source* (a file or a data root given on the command line) is a namespace for job
ids: two recordings that both number their jobs from 5001 stay distinct jobs (key
``<source>:<job_id>``), while the hourly files of one data root still join into one job each.
Long jobs are thinned to at most ``max_windows_per_job`` evenly spaced windows so the set stays
small and balanced.
"""

from __future__ import annotations

import csv
import logging
import re
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from wattclass.classifier import rules
from wattclass.classifier.features import column_f64, durations_s, feature_matrix, window_features
from wattclass.classifier.margin import roofline_margin
from wattclass.classifier.model import TrainingSet
from wattclass.classifier.reader import iter_tables, telemetry_files
from wattclass.classifier.replay import materialize
from wattclass.classifier.validity import InputReport, RowRules

log = logging.getLogger("wattclass.classifier")


def window_rule_codes(table: pa.Table) -> np.ndarray:
    """The GPM window rule over a conformed telemetry table (NO_GPM where GPM is null)."""
    return rules.window_labels(
        column_f64(table, "sm_util_pct"),
        column_f64(table, "dram_bw_util_pct"),
        [column_f64(table, c) for c in rules.COMPUTE_UNITS],
    )


class SourceWindows(NamedTuple):
    """One telemetry source's labelled windows and what the serving rules dropped from it."""

    windows: TrainingSet
    #: Rows the nightly would reject (per reason) or drop as duplicates, job or not, GPM or not.
    report: InputReport
    #: Of those, windows of a job with GPM: training would have used them.
    dropped_windows: int


def source_windows(tables: Iterable[pa.Table], prefix: str) -> SourceWindows:
    """The windows of one source (its tables in file order, as the nightly reads them) that belong
    to a job, have GPM and that the nightly keeps, as a TrainingSet.

    Why: the nightly (scan.py, ``rowsql._reject_sql``) rejects impossible rows and drops repeated
    windows before it labels a job; the training side must see those windows too, or its CV
    accuracy, calibration maps, evidence cap and ambiguity fingerprints are fitted on jobs the
    nightly never sees (the replay's 16 job-boundary rows of 0.01-0.2 s, which the energy test
    rejected until it allowed for ``validity.ENERGY_SPAN_FLOOR_S``, moved three fresh6 jobs'
    confidence by up to 0.021 against the nightly's). The rules are validity's ``RowRules``
    (``impossible_rows`` and the ``Deduplicator``, the numpy twin of the scan's SQL), one per
    source as the nightly has one per night; a source's dates are not checked against its
    ``date=`` folders (the replay files each window under its own day).
    """
    report = InputReport()
    row_rules = RowRules(report)
    parts: list[TrainingSet] = []
    dropped = 0
    for table in tables:
        served = row_rules.keep_mask(table)
        codes = window_rule_codes(table)
        has_job = pc.is_valid(table.column("job_id")).to_numpy(zero_copy_only=False)
        labelled = np.asarray(has_job & (codes >= 0), dtype=bool)  # a job's window with GPM
        dropped += int((labelled & ~served).sum())
        parts.append(_windows(table, codes, labelled & served, prefix))
    return SourceWindows(TrainingSet.concat(parts), report, dropped)


def _windows(table: pa.Table, codes: np.ndarray, keep: np.ndarray, prefix: str) -> TrainingSet:
    """The rows ``keep`` of ``table`` (rule ``codes``) as a TrainingSet, jobs keyed ``<prefix>:<job_id>``."""
    if not keep.any():
        return TrainingSet.concat([])
    X = feature_matrix(window_features(table))[keep]
    jobs = np.asarray(table.column("job_id").to_numpy(zero_copy_only=False), dtype=object)[keep]
    group = np.asarray([f"{prefix}:{j}" for j in jobs], dtype=object)
    margin = roofline_margin([column_f64(table, c) for c in rules.COMPUTE_UNITS],
                             column_f64(table, "dram_bw_util_pct"))[keep]
    return TrainingSet(X, codes[keep], group, [prefix], durations_s(table)[keep], margin)


def thin(ts: TrainingSet, max_windows_per_job: int) -> TrainingSet:
    """Keep at most ``max_windows_per_job`` evenly spaced windows of each job."""
    if max_windows_per_job <= 0 or len(ts) == 0:
        return ts
    _, inv, cnt = np.unique(ts.group, return_inverse=True, return_counts=True)
    order = np.argsort(inv, kind="stable")
    rank = np.empty(len(ts), dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(cnt)[:-1]])
    rank[order] = np.arange(len(ts)) - np.repeat(starts, cnt)
    n = cnt[inv]
    step = np.maximum(n / max_windows_per_job, 1.0)
    keep = (n <= max_windows_per_job) | (np.floor(rank / step) != np.floor((rank - 1) / step))
    return ts.subset(keep)


#: Windows per job ``wattclass model train`` learns from (``thin``): evenly spaced.
MAX_WINDOWS_PER_JOB = 64


def training_set(
    sources: Sequence[Path], max_windows_per_job: int = MAX_WINDOWS_PER_JOB, date: str | None = None
) -> TrainingSet:
    """Labelled windows from every source: a v1 Parquet file, a data root, or a raw probe
    recording (replayed through the telemetry daemon into a temporary data root first); only the
    windows the nightly keeps (``source_windows``), so training and serving see one window set."""
    with tempfile.TemporaryDirectory(prefix="wattclass-replay-") as tmp:
        parts: list[TrainingSet] = []
        for src in materialize(sources, Path(tmp)):
            prefix = Path(src).stem if Path(src).is_file() else Path(src).name
            files = telemetry_files([Path(src)], date=date)
            got = source_windows((t for _, t in iter_tables(files)), prefix)
            if got.report.duplicate_windows or got.report.rejected_rows:
                log.info("%s: rows the nightly drops: rejected %s, duplicate windows %d; %d of them "
                         "job windows with GPM, not trained on either", src, got.report.rejected_rows,
                         got.report.duplicate_windows, got.dropped_windows)
            parts.append(got.windows)
    return thin(TrainingSet.concat(parts), max_windows_per_job)


#: Bump to drop every cached base training set (``cached_training_set``) whatever its key says.
BASE_CACHE_FORMAT = 1
#: Largest cache file read back (the bundled set takes a few MB).
MAX_CACHE_BYTES = 512 * 1024 * 1024


def cached_training_set(sources: Sequence[Path], max_windows_per_job: int, cache_dir: Path) -> TrainingSet:
    """``training_set(sources, max_windows_per_job)``, kept in ``cache_dir`` between runs.

    Why (issue 15): the nightly adds the bundled H200 recordings to every retraining, and
    replaying them through the telemetry daemon took 0.55 s a night, a fifth of the retraining,
    for the same windows every night. The result is a pure function of the source files and of
    the code that replays and featurises them, so it is cached under a key that hashes both: the
    bytes of every file under each source, ``max_windows_per_job``, the wattclass version and
    the source of the modules involved (``_code_digest``). Any change rebuilds it; a cache
    file that cannot be read is rebuilt (and replaced) too. Written atomically (temp + rename).

    The nightly runs as root and trains the model that decides caps on these windows, so the
    cache is a file root trusts: it is read only through ``read_trusted_bytes`` (no symlink,
    owned by root or the running user, neither it nor a folder above it writable by others;
    ``allow_pickle=False``). An untrusted cache or folder is neither read nor written: the set
    is built in memory, as on a first night.
    """
    import io
    import zipfile

    from wattclass.errors import ConfigError
    from wattclass.fsutil import read_trusted_bytes

    key = _cache_key(sources, max_windows_per_job)
    path = Path(cache_dir) / f"base-training-{key[:32]}.npz"
    trusted = True
    try:
        with np.load(io.BytesIO(read_trusted_bytes(path, MAX_CACHE_BYTES)), allow_pickle=False) as z:
            if str(z["key"]) == key:
                return _from_arrays(z)
            log.info("cached base training set %s has another key: rebuilding it", path)
    except FileNotFoundError:
        pass
    except ConfigError as exc:
        trusted = False
        log.warning("cached base training set not used: %s; building it in memory", exc)
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
        log.warning("cached base training set %s unreadable (%s): rebuilding it", path, exc)
    ts = training_set(sources, max_windows_per_job=max_windows_per_job)
    if trusted:
        try:
            _save_arrays(path, ts, key)
            _drop_stale_caches(path)
        except OSError as exc:  # a cache that cannot be written costs time, not correctness
            log.warning("cannot cache the base training set in %s: %s", path, exc)
    return ts


def _drop_stale_caches(current: Path) -> None:
    """Earlier keys' files (an upgrade, new recordings) would otherwise pile up night after night."""
    import contextlib

    for old in current.parent.glob("base-training-*.npz"):
        if old.name != current.name:
            with contextlib.suppress(OSError):
                old.unlink()


def _cache_key(sources: Sequence[Path], max_windows_per_job: int) -> str:
    import hashlib

    from wattclass import __version__

    h = hashlib.sha256(f"{BASE_CACHE_FORMAT}|{__version__}|{max_windows_per_job}|{_code_digest()}".encode())
    for src in sources:
        src = Path(src)
        files = [src] if src.is_file() else sorted(f for f in src.rglob("*") if f.is_file())
        h.update(f"\0source {src.resolve().name} {len(files)}".encode())
        for f in files:
            h.update(f"\0{f.relative_to(src) if f != src else f.name}\0".encode())
            h.update(hashlib.sha256(f.read_bytes()).digest())
    return h.hexdigest()


def _code_digest() -> str:
    """Hash of the Python source that turns recordings into training windows: the telemetry
    daemon and GPU backends (the replay), the classifier (features, rules, margin) and the
    foundation modules they import."""
    import hashlib

    import wattclass
    import wattclass.gpu
    import wattclass.telemetry

    h = hashlib.sha256()
    roots = [Path(wattclass.__file__).parent, Path(wattclass.gpu.__file__).parent,
             Path(wattclass.telemetry.__file__).parent, Path(__file__).parent]
    for root in roots:
        for f in sorted(root.rglob("*.py")):
            h.update(f"\0{root.name}/{f.relative_to(root)}\0".encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def _save_arrays(path: Path, ts: TrainingSet, key: str) -> None:
    from wattclass.fsutil import atomic_writer

    nan = np.full(len(ts), np.nan)
    with atomic_writer(path) as fh:
        np.savez(fh, key=np.asarray(key), X=ts.X, y=ts.y, group=ts.group.astype(str),
                 sources=np.asarray(ts.sources, dtype=str),
                 has_dur=np.asarray(ts.dur is not None), dur=ts.dur if ts.dur is not None else nan,
                 has_margin=np.asarray(ts.margin is not None),
                 margin=ts.margin if ts.margin is not None else nan)


def _from_arrays(z: Any) -> TrainingSet:
    return TrainingSet(np.asarray(z["X"]), np.asarray(z["y"]), np.asarray(z["group"]).astype(object),
                       [str(s) for s in z["sources"]],
                       np.asarray(z["dur"]) if bool(z["has_dur"]) else None,
                       np.asarray(z["margin"]) if bool(z["has_margin"]) else None)


def h200_data_dir() -> Path:
    """``wattclass/data/h200`` (in a checkout or an installed package)."""
    data = Path(__file__).resolve().parent.parent / "wattclass" / "data" / "h200"
    if not data.is_dir():  # installed (non-editable): wattclass/data sits next to the classifier
        import wattclass

        data = Path(wattclass.__file__).resolve().parent / "data" / "h200"
    return data


#: Raw recordings the default model is trained on (folders under wattclass/data/h200): every one
#: since issue 13 round 7, twelve since round 9 (``fresh6`` joined after it was scored once). With
#: the integer pipe in the GPM rule, the later sets hold most of the integer-bound compute work
#: (layout permutes, random numbers, sparse and graph kernels, quantised GEMMs, pooling, top-k,
#: hashing), which the six round-2 folders barely have: trained on those six, leave one set out
#: called 53 of 509 compute-bound jobs memory-bound and acted on all 53; trained on every other
#: folder, 24 acted, and 16 with ``fresh6`` in training too (docs/benchmarks.md, rounds 7 and 9).
BUNDLED_RECORDINGS: tuple[str, ...] = (
    "raw", "collected", "sweep", "sweep-heldout", "ridge", "ridge2", "fresh", "fresh3", "fresh4",
    "latency", "fresh5", "fresh6", "long-families", "fresh7", "fresh8",
)
#: The recordings h200-20261130-lenweight (issue 13 round 2) and -lenweight-amb (round 6) were
#: trained on; ``--round2-recipe`` trains that recipe on them. With the round-7 rule (integer
#: pipe) their truth differs, so it no longer rebuilds those files byte for byte.
ROUND2_RECORDINGS: tuple[str, ...] = ("raw", "collected", "sweep", "sweep-heldout", "ridge", "ridge2")


def bundled_training_sources() -> list[Path]:
    """The real H200 recordings shipped in the package: the default model is trained on these.

    ``raw`` (21 development jobs, 5001-5021, ~34 s each) and ``collected`` (66 jobs, 6000-6165,
    13 s each, two recording sessions), then the randomised mechanism runs of issue 13: ``sweep``
    (47), ``sweep-heldout`` (61), ``ridge`` (81), ``ridge2`` (42), and the later test sets, each
    scored once by its round's registered commands before it joined: ``fresh`` (124), ``fresh3``
    (71), ``fresh4`` (165), ``latency`` (82 randomised latency-bound runs), ``fresh5`` (237) and
    ``fresh6`` (85), ``long-families`` (45 runs of 30 s over all families, round 10) and
    ``fresh7`` (86, round 11), ``fresh8`` (83 framework workloads, round 12); 1,296 jobs (see
    BUNDLED_RECORDINGS for why all of them since round 7). All are
    raw 1 Hz probe recordings that ``training_set`` replays through the telemetry daemon.
    ``live-nvml`` (66 jobs of ``collected`` written live by the NVML daemon) is *not* a training
    source: it would count
    those jobs twice; it is kept for the replay-vs-live check in bench/eval_classifier.py. Rebuild
    the default model with ``wattclass model train --out classifier/models --version V``.
    """
    data = h200_data_dir()
    return [data / name for name in BUNDLED_RECORDINGS if (data / name).is_dir()]


#: Workload name -> family, first match wins, for recordings whose runs.csv has no per-run
#: ``params`` (the 87 named jobs). Families group the variants of one kind of work (sizes,
#: dtypes, batch sizes), so a leave-family-out test never sees a sibling of its test jobs.
FAMILY_RULES: tuple[tuple[str, str], ...] = (
    (r"phase", "phase"),
    (r"^bursty", "bursty"),
    (r"starved|dataloader|pcie_h2d", "host_bound"),
    (r"^idle", "idle"),
    (r"launch_tiny|mlp_infer_b1", "tiny"),
    (r"decode", "llm_decode"),
    (r"^gpt", "gpt_train"),
    (r"^gem[mv]_", "gemm"),
    (r"^resnet", "resnet"),
    (r"^vit", "vit"),
    (r"^mlp", "mlp"),
    (r"^(lstm|gru)", "rnn"),
    (r"^dlrm", "dlrm"),
    (r"^stencil", "stencil"),
    (r"^fft", "fft"),
    (r"^(spmv|spmm|cg_)", "sparse"),
    (r"^(lu_|cholesky)", "dense_solve"),
    (r"^(nbody|mc_option)", "nbody_mc"),
    (r".", "memops"),
)
FIRST_JOB_ID = 5001


def family_of(name: str, family: str = "", params: str = "") -> str:
    """A run's family: the runs.csv ``family`` of randomised sweep runs, else by FAMILY_RULES."""
    if family and params:
        return family
    return next(fam for pattern, fam in FAMILY_RULES if re.search(pattern, name))


def _runs_rows(sources: Sequence[Path]) -> Iterator[tuple[str, dict[str, str]]]:
    """(job key, runs.csv row) of every recorded run, keyed as ``training_set`` names jobs
    (``<recording folder>:<job_id>``). Job ids follow the replay backend: the runs.csv ``job_id``
    column, else counting up from 5001 over the rows of all parts sorted by part name."""
    for src in sources:
        runs_files = sorted(Path(src).glob("*_runs.csv")) if Path(src).is_dir() else []
        index = 0
        for runs in runs_files:
            with runs.open(newline="") as fh:
                for row in csv.DictReader(fh):
                    job_id = row.get("job_id") or str(FIRST_JOB_ID + index)
                    index += 1
                    yield f"{Path(src).name}:{job_id}", row


def job_families(sources: Sequence[Path]) -> dict[str, str]:
    """Job key (``<recording folder>:<job_id>``, as ``training_set`` names jobs) -> family."""
    return {key: family_of(row["job"], row.get("family") or "", row.get("params") or "")
            for key, row in _runs_rows(sources)}


def workload_configs(sources: Sequence[Path]) -> dict[str, str]:
    """Job key (as ``job_families`` names it) -> its workload configuration: the runs.csv ``family``
    (or ``job``) and ``params``. Two jobs with one configuration are repeats of one workload: the
    ambiguity check (classifier/ambiguity.py) takes its radius from how far such runs land apart."""
    return {key: f"{row.get('family') or row['job']}|{row.get('params') or ''}"
            for key, row in _runs_rows(sources)}
