# long: one DuckDB pass (query, input rules, rule codes, sample and its file draw) on one connection
"""The nightly scan in DuckDB: telemetry files -> per-(job, host) partial aggregates in one pass.

Why DuckDB: the feature stage is a scan of a few columns of tens of thousands of small Parquet
files followed by a group-by to a few tens of thousands of jobs. An embedded engine does both in
C++ over all cores with no per-file Python work; the previous pyarrow + numpy engine spent most of
its time in per-batch Python and numpy calls (issue 15). numpy is used only where per-window
arrays are needed: the model's predictions for windows without GPM, and the retraining sample.

One pass (``partials``) computes per (job_id, host), over the windows that have a job:
n_windows, summed duration and energy, first start and last end, the smallest user, the GPM
rule's window counts (n_gpm, r_idle, r_compute, r_memory; the rule in SQL is exactly
``rules.window_labels``: a null or NaN metric is missing, a missing pipe among present ones
does not count), the number of windows without GPM and the files that hold them (so the model
pass reads only those), and optionally the retraining sample: up to n GPM windows per job, those
of smallest seeded hash among one file in SAMPLE_FILE_SHARE (deterministic whatever the threads
or the file order). It groups by (job, host, file, reject code, rule code), so that no aggregate
needs a per-row filter (issue 15: the filtered aggregates cost as much as the read); the per-row
codes are ``rowsql``'s.

The model pass (``model_partials``) streams the windows that need the model in Arrow batches,
computes the window features in numpy (``features.window_features``, the same code that trained
the model) and sums the model's window classes and top probabilities per (job, host).

Files: DuckDB reads them with the first file's schema; a set of files that differ (a GPU without
GPM writes no GPM columns, older writers fewer optional columns) is re-read by column name
(``union_by_name``), after each file's own schema was checked: a file DuckDB cannot read, or one
that lacks a required column, is skipped with a warning naming it and counted (``validity``).
Rows: ``validity``'s rules are SQL (``rowsql._reject_sql``: impossible rows counted per reason and
left out; duplicate windows dropped, exactly, when two files overlap in time on a GPU).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from wattclass.classifier import rules
from wattclass.classifier.features import INPUT_COLUMNS
from wattclass.classifier.rowsql import (
    JOB_HOST,
    JOB_USER,
    REJECT_REASONS,
    _lit,
    _q,
    _raw,
    _reject_sql,
    _val,
    job_check_sql,
    job_group_check_sql,
    partition_day_sql,
    rule_code_sql,
)
from wattclass.classifier.validity import (
    SKIP_BAD_TYPE,
    SKIP_MISSING_COLUMN,
    SKIP_REFUSED,
    SKIP_UNREADABLE,
)
from wattclass.errors import DataError
from wattclass.logsafe import clip
from wattclass.schema import REQUIRED_COLUMNS

log = logging.getLogger("wattclass.classifier")

#: Rows per Arrow batch handed to numpy in the model pass.
MODEL_BATCH_ROWS = 1 << 18
#: The retraining sample is drawn from one file in SAMPLE_FILE_SHARE (chosen by a seeded hash of
#: the file name, at least SAMPLE_MIN_FILES, at most SAMPLE_MAX_FILES; ``sample_file_count``):
#: drawing it from every window in the main pass cost as much as the pass itself.
SAMPLE_FILE_SHARE = 8
SAMPLE_MIN_FILES = 64
#: Why a cap: a night retrains on at most MAX_TRAIN_JOBS // 2 (750) of its own jobs
#: (nightly.MAX_TRAIN_JOBS), and one file in eight of 10,000 GPUs' day (3,750 files) drew about
#: 8,600 jobs, most of them never trained on, while the draw's reading cost that night's scan
#: 0.15x of the labels anchor (issue 15). 512 files is what a fleet of about 1,400 GPUs draws
#: (hourly files of 8 GPUs): about 1,200 jobs on the bench's day, above the 750.
SAMPLE_MAX_FILES = 512
#: A sampled window's columns: the model's inputs, and the GPM columns of the roofline margin (the
#: margin model's target).
SAMPLE_COLUMNS: tuple[str, ...] = (*INPUT_COLUMNS, "dram_bw_util_pct", *rules.COMPUTE_UNITS)
#: The columns two copies of a window must agree on to be the same window (a copy that differs in
#: any of them is a conflicting duplicate): what its energy, GPU-hours, rule label, sharing and
#: input checks are made of, all of them columns the pass reads anyway. The model's other inputs
#: (clocks, temperatures; read only for windows without GPM) are not compared: the de-duplicating
#: pass would have to read them for every window of the night.
DUPLICATE_VALUE_COLUMNS: tuple[str, ...] = (
    "host", "ts_end", "user", "energy_j", "power_avg_w", "power_max_w", *rules.RULE_COLUMNS,
    "shared_jobs", "share_basis")
#: The name of the job records' table on the scan's connection (``Scanner.partials``'s ``jobs``).
JOBS_TABLE = "wattclass_job_records"
#: Slurm job records (``jobcheck.job_records_table``), or a function that returns them once the
#: pass's query has run, or None (windows not checked).
JobRecords: TypeAlias = pa.Table | Callable[[], pa.Table | None] | None
#: Pass codes of dropped duplicate copies (beside the reject codes, which are > 0).
_DUP, _DUP_CONFLICT = -1, -2
#: Attribution warnings logged per scan (the counts are exact in the summary).
_MAX_JOB_WARNINGS = 20


@dataclass
class ScanResult:
    partials: pa.Table  # per (job_id, host); see module docstring
    n_windows: int  # valid, distinct windows read (with or without a job)
    files: list[Path]  # files actually read (unreadable ones skipped)
    skipped: list[tuple[Path, str]]  # (file, "reason: detail")
    rejected: dict[str, int]  # impossible rows per reason (validity)
    duplicates: int  # duplicate windows dropped
    #: of ``duplicates``, copies whose values (``DUPLICATE_VALUE_COLUMNS``) differ from the kept one's
    conflicting: int = 0
    nogpm_files: list[str] = field(default_factory=list)  # files holding job windows without GPM
    #: the retraining sample (``Scanner.partials`` with ``sample_per_job``): job_id, h (the draw's
    #: hash), code and the model's input columns; at most ``sample_per_job`` windows a job
    sample: pa.Table | None = None


@contextlib.contextmanager
def _registered(con: Any, name: str, table: pa.Table) -> Iterator[str]:
    """``table`` as the view ``name`` on ``con`` for the block's queries, unregistered after."""
    con.register(name, table)
    try:
        yield name
    finally:
        con.unregister(name)


def _overlapping_files(con: Any, per_file: pa.Table) -> bool:
    """Whether two files of a host share a GPU range and their window-start ranges meet.

    ``per_file``: host, filename, t0, t1 (first and last window start, ms) and lo, hi (the smallest
    and largest gpu_uuid) of each file's valid rows on each host."""
    with _registered(con, "wattclass_files", per_file) as name:
        return bool(con.sql(f"SELECT EXISTS (SELECT 1 FROM {name} a JOIN {name} b ON a.host = b.host "
                            "AND a.filename < b.filename AND a.t0 <= b.t1 AND b.t0 <= a.t1 "
                            "AND a.lo <= b.hi AND b.lo <= a.hi)").fetchall()[0][0])


def _repeats_in_a_file(valid: pa.Table) -> bool:
    """Whether a file may hold a window twice: a job's windows on one host in one file (``valid``:
    the pass's valid groups) that last longer in all than their span times the GPUs they could be
    on (``gpu_index`` from the smallest to the largest), which windows of one job on one GPU, never
    overlapping in time, cannot. Why: only files whose ranges meet were de-duplicated, so a file
    holding each window twice (a segment converted into it twice, an import of overlapping
    chunks) doubled its jobs' energy, windows and GPU-hours, and the summary said 0 duplicates.
    GPUs missing between the smallest and largest index loosen the bound; MIG instances sharing
    an index tighten it (then the exact pass runs, for nothing but its cost)."""
    t = valid.group_by(["job_id", "host", "file_index"], use_threads=False).aggregate(
        [("dur_ms", "sum"), ("ts_start_ms", "min"), ("ts_end_ms", "max"), ("gpu_lo", "min"),
         ("gpu_hi", "max")])
    if t.num_rows == 0:
        return False
    span = pc.subtract(t.column("ts_end_ms_max"), t.column("ts_start_ms_min"))
    gpus = pc.add(pc.subtract(pc.cast(t.column("gpu_hi_max"), pa.int64()),
                              pc.cast(t.column("gpu_lo_min"), pa.int64())), 1)
    return bool(pc.any(pc.greater(t.column("dur_ms_sum"), pc.multiply(span, gpus))).as_py())


def _meeting_hosts(con: Any, per_file: pa.Table) -> list[str]:
    """Hosts with two files whose window-start ranges meet (``per_file``: host, filename, t0, t1)."""
    with _registered(con, "wattclass_spans", per_file) as name:
        rows = con.sql(f"SELECT DISTINCT a.host FROM {name} a JOIN {name} b ON a.host = b.host "
                       "AND a.filename < b.filename AND a.t0 <= b.t1 AND b.t0 <= a.t1").fetchall()
    return sorted(r[0] for r in rows)


class Scanner:
    """One DuckDB connection scanning telemetry files; ``threads`` = cores it may use."""

    def __init__(self, threads: int = 0, on_scan: Callable[[], object] | None = None) -> None:
        import duckdb

        #: Called once, as the first pass's query starts (bound, about to run without the GIL):
        #: what the caller imports beside the scan (``engine.preload_after_scan``).
        self._on_scan = on_scan
        self.con = duckdb.connect(config={"threads": threads or os.cpu_count() or 1})
        self.con.execute("SET preserve_insertion_order = false")
        self._union = False
        self._names: dict[Path, set[str]] = {}  # columns of each file, when the files differ
        self._absent: frozenset[str] = frozenset()  # columns no file of the scan has (read as NULL)
        self._jobs = False  # JOBS_TABLE is registered: check job windows against their records
        #: The job records as a function, called after the pass's query (``partials``' ``jobs``).
        self._later: Callable[[], pa.Table | None] | None = None
        #: Files with windows the job check rejected, or may have (``_recheck``): the model pass
        #: checks its rows against the records only if it reads one of them (None: not known).
        self._job_rejects: set[Path] | None = None
        #: The last ``_sample_first`` (files, (per job, seed), its result): the pass's SQL and the
        #: reading of its file_index need the same order, computed once (3,000 paths hashed).
        self._drawn: tuple[list[Path], tuple[int, int], tuple[list[Path], int]] | None = None
        #: The night's draw given to ``partials`` (``sample_files``), None: draw over its files.
        self._night_draw: frozenset[str] | None = None

    def close(self) -> None:
        self.con.close()

    # -- files ------------------------------------------------------------------------------
    def _source(self, files: Sequence[Path], filename: bool = False) -> str:
        """``files`` as a read_parquet; ``filename``: with each row's file name and place in it."""
        lst = "[" + ", ".join(_lit(str(f)) for f in files) + "]"
        opts = ", hive_partitioning = false"
        if self._union:
            opts += ", union_by_name = true"
        if filename:
            opts += ", filename = true, file_row_number = true"
        return f"read_parquet({lst}{opts})"

    def _check_schemas(self, files: Sequence[Path]) -> tuple[list[Path], list[tuple[Path, str]]]:
        """Per file: readable, and has every required column; the others are skipped (reasons of
        ``validity``), as the night must go on without one host's bad file.

        Also notes the columns that no readable file has: the queries read them as NULL."""
        import pyarrow.parquet as pq

        from wattclass.schema import TELEMETRY_V1

        good: list[Path] = []
        bad: list[tuple[Path, str]] = []
        seen: set[str] = set()
        for f in files:
            try:
                schema = pq.read_schema(f)
            except (OSError, pa.ArrowException) as exc:
                bad.append((f, f"{SKIP_UNREADABLE}: {exc}"))
                log.warning("skipping telemetry file %s (%s): %s", f, SKIP_UNREADABLE, str(exc)[:300])
                continue
            names = schema.names
            missing = [c for c in REQUIRED_COLUMNS if c not in names]
            if missing:
                bad.append((f, f"{SKIP_MISSING_COLUMN}: {', '.join(missing)}"))
                log.warning("skipping telemetry file %s (%s): %s", f, SKIP_MISSING_COLUMN,
                            ", ".join(missing))
                continue
            wrong = _bad_types(schema)
            if wrong:
                bad.append((f, f"{SKIP_BAD_TYPE}: {', '.join(wrong)}"))
                log.warning("skipping telemetry file %s (%s): %s", f, SKIP_BAD_TYPE, ", ".join(wrong))
                continue
            seen.update(names)
            self._names[Path(f)] = set(names)
            good.append(f)
        self._absent = frozenset(TELEMETRY_V1.names) - seen
        return good, bad

    def _run(self, sql_for: Any, files: list[Path]
             ) -> tuple[pa.Table | None, list[Path], list[tuple[Path, str]]]:
        """``sql_for(files)`` as an Arrow table; on a read or schema error, check every file (skip
        unreadable ones, refuse a missing required column) and read the rest by column name."""
        import duckdb

        from wattclass.fsutil import split_trusted_files
        from wattclass.schema import TELEMETRY_V1, first_schema_reads_all

        self._union, self._absent = False, frozenset()
        files, refused = split_trusted_files(files)
        for f, why in refused:
            log.warning("skipping telemetry file %s (%s): %s", clip(f), SKIP_REFUSED, clip(why))
        refused = [(f, f"{SKIP_REFUSED}: {why}") for f, why in refused]
        if not files:
            return None, [], refused
        plan = first_schema_reads_all(files)
        try:
            if not plan.exact:
                raise _Differ("not every file has the first file's columns")
            # Columns the files do not have at all (older writers, GPUs without GPM) read as NULL;
            # a file that lacks a column the first has fails the fast read and sends the night
            # down the checked path (first_schema_reads_all: why a file with more is looked for).
            self._absent = frozenset(TELEMETRY_V1.names) - set(plan.first or ())
            table = self._execute(sql_for(files))
            blobs = [f.name for f in table.schema
                     if pa.types.is_binary(f.type) or pa.types.is_large_binary(f.type)]
            if blobs:
                # A file's string column stored as bytes (Parquet BYTE_ARRAY without the UTF8
                # annotation) makes DuckDB read that column of every file as BLOB: job ids came out
                # as bytes (b'123', or a traceback where they are not UTF-8). The checked path
                # skips that file by name (_bad_types) and reads the others.
                raise _Differ(f"{', '.join(blobs)} read as bytes")
            return table, files, refused
        except _Differ as exc:
            log.info("telemetry files differ (%s): checking each file", exc)
        except (duckdb.IOException, duckdb.InvalidInputException, duckdb.BinderException,
                duckdb.ConversionException) as exc:
            log.info("telemetry files differ or one is unreadable (%s): checking each file",
                     str(exc).splitlines()[0][:300])
        self._absent = frozenset()
        good, bad = self._check_schemas(files)
        bad = refused + bad
        self._union = True
        if not good:
            return None, good, bad
        try:
            return self._execute(sql_for(good)), good, bad
        except duckdb.Error as exc:  # every file passed its own checks: name the set, not a traceback
            raise DataError(f"telemetry ({len(good)} files from {clip(good[0])}) cannot be read: "
                            f"{str(exc).splitlines()[0][:300]}") from exc

    def _execute(self, sql: str) -> pa.Table:
        """``sql`` as an Arrow table; ``on_scan`` (once) between binding and running it.

        Why (issue 15): started before the Python that lists, checks and binds 3,000 files, the
        preload's imports took the GIL from it, and the scan started later; DuckDB runs the query
        itself without the GIL, beside them."""
        rel = self.con.sql(sql)
        hook, self._on_scan = self._on_scan, None
        if hook is not None:
            hook()
        return text_job_ids(rel.to_arrow_table())

    # -- the one pass -------------------------------------------------------------------------
    def partials(self, files: Sequence[Path], drop_columns: Sequence[str] = (), sample_per_job: int = 0,
                 seed: int = 0, jobs: JobRecords = None, drawn: frozenset[str] | None = None) -> ScanResult:
        """Per (job_id, host) over the valid, de-duplicated windows (``validity``'s rules).

        The pass groups by (job, host, file, reject code, rule code): every aggregate then runs
        without a per-row filter, the reject and rule counts are the groups' row counts, and each
        file's time range falls out. Files whose window-start ranges meet on a host may hold the
        same windows twice: only then are their GPU ranges read, and if two of them share one, the
        scan is run again with an exact de-duplication (``_dedup_sql``), as a normal night has no
        such files; so is it where one file's windows of a job outlast what its GPUs can hold
        (``_repeats_in_a_file``).

        ``jobs``: the day's Slurm job records (``job_records_table``); a window of a job among them
        is checked against its record (``rowsql.job_check_sql``) and rejected where the record
        contradicts it. Jobs without a record are not checked. The pass checks each group
        (``rowsql.job_group_check_sql``: its host, time range and users decide it, or flag it);
        only the files of flagged groups are read again, with the check per row (``_recheck``),
        as a normal night has none: a join of every row on its job cost the 1,000-GPU nightly 5%.

        ``jobs`` may also be a function that returns them (or None): it is called once, after the
        pass's query, whose groups are then checked (``_check_groups``), so that reading the
        records (``sacct`` at a large site takes seconds) runs beside the scan, not before it.

        With ``sample_per_job``, the same pass draws the retraining sample (``_pass_sql``) from
        ``drawn``, the files the whole night's sample is drawn from (``sample_files``; a chunk of
        the night holds some of them), or, without it, from ``sample_files`` of ``files``."""
        # drawn over the files as listed, before any is refused or skipped: a chunked engine draws
        # over the same list, so a skipped drawn file is lost to both, not replaced in one
        self._night_draw = drawn
        if drawn is None and sample_per_job > 0:
            self._night_draw = sample_files(list(files), seed)
        if self._jobs:
            self.con.unregister(JOBS_TABLE)
        self._job_rejects = None
        self._later = jobs if callable(jobs) else None
        self._register_jobs(None if callable(jobs) else jobs)
        return self._partials(list(files), drop_columns, sample_per_job, seed)

    def _register_jobs(self, jobs: pa.Table | None) -> None:
        """Check job windows against ``jobs`` from here on (none: no check); until the next
        partials or close, as the model pass checks the same records."""
        self._jobs = jobs is not None and jobs.num_rows > 0
        if self._jobs:
            self.con.register(JOBS_TABLE, jobs)

    def _check_groups(self, table: pa.Table) -> pa.Table:
        """The pass's groups (``table``, read before the job records were known: each with its
        users' extremes, ``user_max``) with the group-level job check that the pass's own SQL
        makes when the records are given up front (``_group_checked``): the same SQL, over the
        groups instead of inside the query. Records that turn out to be none: no check."""
        later, self._later = self._later, None
        assert later is not None
        self._register_jobs(later())
        if not self._jobs:
            return table.drop_columns(["user_max"])
        with _registered(self.con, "wattclass_pass_groups", table) as name:
            return self.con.sql(_group_checked(f"SELECT * FROM {name}")).to_arrow_table()

    def _partials(self, files: list[Path], drop_columns: Sequence[str], sample_per_job: int,
                  seed: int) -> ScanResult:
        table, good, bad = self._run(
            lambda fs: self._pass_sql(fs, drop_columns, dedup=False, sample=(sample_per_job, seed)), files)
        if self._later is not None:
            if table is None:  # nothing read: the records are not needed, but their reading ends here
                later, self._later = self._later, None
                self._register_jobs(later())
            else:
                table = self._check_groups(table)
        if table is None:
            return ScanResult(_empty_partials(), 0, [], bad, {}, 0)
        sample = _sample_rows(table) if sample_per_job > 0 else None
        order = self._sample_order(good, sample_per_job, seed)[0]  # the files in file_index order
        if self._jobs:
            table = self._recheck(table, order, drop_columns)
        valid_mask = pc.equal(table.column("bad"), 0)
        rejects = table.filter(pc.invert(valid_mask))
        _warn_attribution(rejects)
        by_code = _n_by(rejects, "bad")
        rejected = {reason: by_code.get(k, 0) for k, reason in enumerate(REJECT_REASONS, start=1)}
        table = table.filter(valid_mask)
        dups = conflicting = 0
        if self._overlap(order, table):
            log.info("telemetry files overlap in time on a GPU: de-duplicating windows exactly")
            table = self.con.sql(self._pass_sql(good, drop_columns, dedup=True)).to_arrow_table()
            dropped = _n_by(table.filter(pc.less(table.column("bad"), 0)), "bad")
            dups, conflicting = sum(dropped.values()), dropped.get(_DUP_CONFLICT, 0)
            if conflicting:
                log.warning("%d duplicate window(s) differ from the copy kept (the first file by path): "
                            "telemetry written twice with different values (see the summary)", conflicting)
            table = table.filter(pc.equal(table.column("bad"), 0))
            order = good
        return _per_job(table, order, good, bad, rejected, dups, conflicting, sample)

    def _recheck(self, table: pa.Table, order: list[Path], drop_columns: Sequence[str]) -> pa.Table:
        """The pass's groups (``table``, file_index into ``order``) with the job check exact: the
        groups of every file that has a group flagged ``recheck`` are replaced by those of an exact
        pass over these files alone (the check per row, ``_pass_sql``'s ``exact``); the sample
        column is dropped (the sample is taken from the pass: GPM windows whatever their codes).

        Also notes the files the check rejected windows of, or may have (``_job_rejects``)."""
        flagged = pc.unique(pc.filter(table.column("file_index"), table.column("recheck"))).to_pylist()
        codes = table.column("bad")
        hit = pc.and_(pc.greater_equal(codes, JOB_HOST), pc.less_equal(codes, JOB_USER))
        rejected = pc.unique(pc.filter(table.column("file_index"), hit)).to_pylist()
        self._job_rejects = {order[i] for i in (*flagged, *rejected)}
        table = table.drop_columns([c for c in ("recheck", "sample") if c in table.column_names])
        if not flagged:
            return table
        idx = sorted(int(i) for i in flagged)
        log.info("%d file(s) with windows reaching past their job's time or of another user than its "
                 "record's: checking them window by window", len(idx))
        some = [order[i] for i in idx]
        exact = self.con.sql(self._pass_sql(some, drop_columns, dedup=False, exact=True)).to_arrow_table()
        back = pc.take(pa.array(idx, pa.int64()), exact.column("file_index").cast(pa.int64()))
        exact = exact.set_column(exact.column_names.index("file_index"), "file_index", back)
        keep = pc.invert(pc.is_in(table.column("file_index"), pa.array(idx, table.column("file_index").type)))
        return pa.concat_tables([table.filter(keep), exact.select(table.column_names).cast(table.schema)])

    def _overlap(self, files: list[Path], valid: pa.Table) -> bool:
        """Whether two of ``files`` may hold the same windows (``valid``: the pass's valid groups).

        Window-start ranges first (the pass has them); only the files of a host where two ranges
        meet are read again for their GPU ranges (``_overlapping_files``). One file may hold a
        window twice too (``_repeats_in_a_file``)."""
        if _repeats_in_a_file(valid):
            return True
        spans = valid.group_by(["host", "file_index"], use_threads=False).aggregate(
            [("ts_start_ms", "min"), ("file_t1", "max")]).rename_columns(["host", "filename", "t0", "t1"])
        hosts = _meeting_hosts(self.con, spans)
        if not hosts:
            return False
        index = pc.filter(spans.column("filename"),
                          pc.is_in(spans.column("host"), pa.array(hosts, spans.column("host").type)))
        some = [files[i] for i in sorted(set(index.to_pylist()))]
        reject = _reject_sql(self._absent, partition_day_sql(some))
        ranges = self.con.sql(
            "SELECT host, filename, epoch_ms(min(ts_start)) AS t0, epoch_ms(max(ts_start)) AS t1, "
            "min(gpu_uuid) AS lo, max(gpu_uuid) AS hi FROM (SELECT host, filename, ts_start, "
            f"CAST(gpu_uuid AS VARCHAR) AS gpu_uuid, {reject} AS bad "
            f"FROM {self._source(some, filename=True)}) WHERE bad = 0 GROUP BY host, filename"
        ).to_arrow_table()
        return _overlapping_files(self.con, ranges)

    def _pass_sql(self, fs: list[Path], drop_columns: Sequence[str], dedup: bool,
                  sample: tuple[int, int] = (0, 0), exact: bool = False) -> str:
        """The pass's SQL over ``fs``. With ``sample`` = (per job, seed) > 0, the files the sample is
        drawn from (``_sample_first``) are read in a branch of their own that also reads the
        model's input columns, and each group keeps its ``per job`` GPM windows of smallest hash
        (``arg_min``); the other files' rows carry no sample columns. Their file_index then counts
        in ``_sample_first``'s order.

        With job records, the de-duplicating and the ``exact`` pass check every row against its
        job's record; the others check each group (``job_group_check_sql``) and say which groups
        need the rows checked (``recheck``)."""
        per_job, seed = sample
        # a chunk of the night may hold none of the night's draw (``drawn``): no sample branch
        order, n_drawn = self._sample_order(fs, per_job, seed) if per_job > 0 and not dedup else (fs, 0)
        if n_drawn == 0:
            absent = self._branch_absent(fs) if exact else self._absent  # a part of the files
            sel = self._row_sql(absent, drop_columns, dedup, fs)
            rows = f"SELECT {', '.join(sel)} FROM {self._source(fs, filename=dedup)}"
        else:
            drawn, rest = order[:n_drawn], order[n_drawn:]
            absent = self._branch_absent(drawn)
            dropped = frozenset(drop_columns) | absent
            # A sampled window travels as one list of doubles (``_sample_rows`` unpacks it): the
            # model's inputs as read, then the window's length in ms (for the length-weighted job
            # aggregation and the shortest window trained on), the rule code and the hash's two
            # 32-bit halves (all exact in a double). Why not a struct of them, or NaN tested per
            # value: the struct cost DuckDB as much per row as the rest of the sample (issue 15);
            # NaN reads as missing in numpy (features.column_f64), as NULL does. Hash and code:
            # once per row (inner).
            raw = {c: _q(f"s_{c}") for c in SAMPLE_COLUMNS}
            inner = [*self._row_sql(absent, drop_columns, False, drawn),
                     f"CASE WHEN {_sole_gpu_sql(absent)} THEN hash(job_id, host, gpu_index, ts_start, "
                     f"{int(seed)}) END AS h",
                     *(f"{_raw(c, dropped)} AS {raw[c]}" for c in SAMPLE_COLUMNS)]
            packed = ", ".join([*raw.values(), "CAST(ms AS DOUBLE)", "CAST(code AS DOUBLE)",
                                "CAST(h >> 32 AS DOUBLE)",
                                "CAST(h & CAST(4294967295 AS UBIGINT) AS DOUBLE)"])
            rows = (f"SELECT * EXCLUDE ({', '.join(raw.values())}), "
                    f"CASE WHEN job_id IS NOT NULL AND code >= 0 THEN [{packed}] END AS s "
                    f"FROM (SELECT {', '.join(inner)} FROM {self._source(drawn)})")
            if rest:
                sel = [c if c != "file_index" else f"file_index + {n_drawn} AS file_index"
                       for c in self._row_sql(self._branch_absent(rest), drop_columns, False, rest)]
                rows += f" UNION ALL BY NAME SELECT {', '.join(sel)} FROM {self._source(rest)}"
        n_shared = ("CAST(0 AS BIGINT) AS n_shared" if "shared_jobs" in self._absent
                    else "count(*) FILTER (WHERE sh) AS n_shared")
        aggs = ['min("user") AS "user"', "count(*) AS n_windows",
                "CAST(sum(ms) AS BIGINT) AS dur_ms", "sum(e) AS energy_j",
                "epoch_ms(min(ts_start)) AS ts_start_ms", "epoch_ms(max(ts_end)) AS ts_end_ms",
                "epoch_ms(max(ts_start)) AS file_t1", n_shared,
                "min(gpu_index) AS gpu_lo", "max(gpu_index) AS gpu_hi"]  # for _repeats_in_a_file
        if n_drawn:
            # the draw of the former separate pass: GPM windows of a job, whatever their reject code
            aggs.append(f"arg_min(s, h, {int(per_job)}) FILTER (WHERE h IS NOT NULL AND job_id IS NOT NULL "
                        "AND code >= 0) AS sample")
        elif per_job > 0 and not dedup:
            aggs.append("CAST(NULL AS DOUBLE[][]) AS sample")
        by_row = self._jobs and (dedup or exact)
        if by_row:  # windows of a job with a Slurm record, checked against it
            rows = (f"SELECT r.* EXCLUDE (bad), CAST(CASE WHEN r.bad <> 0 OR j.job_id IS NULL THEN r.bad "
                    f"ELSE {_JOB_CHECK} END AS TINYINT) AS bad FROM {_job_joined(rows)}")
        elif self._jobs or self._later is not None:
            aggs.append('max("user") AS user_max')  # with min("user"): are they all the record's
        if dedup:
            rows = _dedup_sql(rows)
        # Windows without a job are grouped too (per host and file): they count as windows read.
        keys = "job_id, host, file_index, bad, code"  # file_index: the file's place in ``fs``
        grouped = f"SELECT {keys}, {', '.join(aggs)} FROM ({rows}) GROUP BY {keys}"
        # records not known yet (``_later``): the groups are checked after the query (``_check_groups``)
        return grouped if by_row or not self._jobs else _group_checked(grouped)

    def _sample_order(self, files: list[Path], per_job: int, seed: int) -> tuple[list[Path], int]:
        """``_sample_first(files, per_job, seed, the night's draw)``, reused when the pass drew it
        for these files."""
        d = self._drawn
        if d is not None and d[0] is files and d[1] == (per_job, seed):
            return d[2]
        drawn = _sample_first(files, per_job, seed, self._night_draw)
        self._drawn = (files, (per_job, seed), drawn)
        return drawn

    def _branch_absent(self, files: Sequence[Path]) -> frozenset[str]:
        """Columns none of ``files`` has (read as NULL): the scan's, or, when the files differ
        (read by name), those of this part of them, as a part cannot name a column it lacks."""
        if not self._union:
            return self._absent
        from wattclass.schema import TELEMETRY_V1

        have: set[str] = set()
        for f in files:
            have.update(self._names.get(Path(f), ()))
        return frozenset(TELEMETRY_V1.names) - have

    def _row_sql(self, absent: frozenset[str], drop_columns: Sequence[str], dedup: bool,
                 files: Sequence[Path]) -> list[str]:
        """The per-row columns of the pass, for ``files`` (read by one read_parquet) lacking ``absent``."""
        code = rule_code_sql(frozenset(drop_columns) | absent)
        reject = _reject_sql(absent, partition_day_sql(files))
        sel = ["job_id", "host", f'{_user_sql(absent)} AS "user"', "ts_start", "ts_end",
               # beside the reject code, so that DuckDB computes epoch_ms once per row for both
               "epoch_ms(ts_end) - epoch_ms(ts_start) AS ms",
               # NaN energy is rejected (bad = 3): a valid row's energy is a number or NULL
               "coalesce(CAST(energy_j AS DOUBLE), 0.0) AS e", f"CAST({code} AS TINYINT) AS code",
               "file_index", f"CAST({reject} AS TINYINT) AS bad", "gpu_index"]
        if dedup:
            values = ", ".join(_q(c) for c in DUPLICATE_VALUE_COLUMNS if c not in absent)
            sel += ["gpu_uuid", "filename", "file_row_number", f"hash({values}) AS vh"]
        if "shared_jobs" not in self._absent:
            # labeling._shared_windows: other jobs held the GPU, and it is not a MIG instance's row
            # with the instance's own GPM (docs/shared-gpus.md)
            basis = "NULL" if "share_basis" in absent else "share_basis"
            sel.append("FALSE AS sh" if "shared_jobs" in absent else
                       f"(coalesce(CAST(shared_jobs AS DOUBLE), 0) > 1 AND NOT (coalesce(CAST({basis} AS "
                       f"VARCHAR), '') = 'mig' AND ({code}) >= 0)) AS sh")
        return sel

    # -- the model pass -------------------------------------------------------------------------
    def model_batches(self, files: Sequence[Path], all_job_windows: bool,
                      drop_columns: Sequence[str] = ()) -> Iterator[pa.Table]:
        """Windows that need the model (no GPM, or every job window), in Arrow batches.

        ``files`` were read by ``partials`` already (readable, required columns present). The rows
        ``partials`` rejected are left out here too (its reject code and, with job records, their
        check), so a rejected window adds nothing to its job's model counts either. The check
        joins every row on its job: only when one of ``files`` had a window it rejected, or might
        have (``_job_rejects``); on the others every job window passed it."""
        import duckdb

        rejects = self._job_rejects
        check = self._jobs and (rejects is None or any(Path(f) in rejects for f in files))

        def sql() -> str:
            dropped = frozenset(drop_columns) | self._absent
            cols = ", ".join(f"{_val(c, dropped)} AS {_q(c)}" for c in INPUT_COLUMNS)
            where = (f"job_id IS NOT NULL AND ({_reject_sql(self._absent, partition_day_sql(files))}) = 0"
                     + ("" if all_job_windows else f" AND {rule_code_sql(dropped)} < 0"))
            # the job check's own columns (the user is read only for it), dropped after it
            checked = f'ts_start, ts_end, {_user_sql(self._absent)} AS "user", ' if check else ""
            # window_ms: the window's length, for the length-weighted job aggregation (model.window_weights)
            rows = (f"SELECT {checked}job_id, host, epoch_ms(ts_end) - epoch_ms(ts_start) AS window_ms, "
                    f"{cols} FROM {self._source(files)} WHERE {where}")
            if not check:
                return rows
            return (f'SELECT r.* EXCLUDE (ts_start, ts_end, "user") FROM {_job_joined(rows)} '
                    f"WHERE j.job_id IS NULL OR ({_JOB_CHECK}) = 0")

        self._union, self._absent = False, frozenset()
        try:
            reader = self.con.sql(sql()).to_arrow_reader(MODEL_BATCH_ROWS)
        except (duckdb.InvalidInputException, duckdb.BinderException) as exc:
            log.info("model pass: files differ (%s): reading by column name", str(exc).splitlines()[0][:200])
            self._check_schemas(files)
            self._union = True
            reader = self.con.sql(sql()).to_arrow_reader(MODEL_BATCH_ROWS)
        for rb in reader:
            if rb.num_rows:
                yield text_job_ids(pa.Table.from_batches([rb]))


def _sole_gpu_sql(absent: frozenset[str]) -> str:
    """SQL true where a row is a whole GPU held by one job: the only rows the retraining sample may
    draw (its h is NULL elsewhere).

    Why: a shared GPU's row carries the whole GPU's GPM (its rule label) beside the job's share of
    the power, and a MIG instance's row its share of the parent's energy over the parent's limit;
    trained on, either pairs a label with power features no whole-GPU window of that work shows
    (docs/shared-gpus.md). The rows are still labelled and counted; only the sample skips them."""
    conds = []
    if "shared_jobs" not in absent:
        conds.append("coalesce(CAST(shared_jobs AS DOUBLE), 0) <= 1")
    if "share_basis" not in absent:
        conds.append("coalesce(CAST(share_basis AS VARCHAR), '') = ''")
    return " AND ".join(conds) or "TRUE"


def _user_sql(absent: frozenset[str]) -> str:
    """A row's ``user`` (NULL where the files have no such column)."""
    return "CAST(NULL AS VARCHAR)" if "user" in absent else '"user"'


#: A row (alias r) of ``_job_joined`` checked against its job's record (alias j): 0 or a reject code.
_JOB_CHECK = job_check_sql("j", 'r."user"')


def _job_joined(rows: str) -> str:
    """``rows`` (alias r) joined to their job's Slurm record (alias j; NULL where the job has none):
    the one join of the pass and the model pass, which ``_JOB_CHECK`` reads."""
    return f"({rows}) r LEFT JOIN {JOBS_TABLE} j ON r.job_id = j.job_id"


def _group_checked(grouped: str) -> str:
    """The pass's groups (``grouped``, with user_max) joined to their job's record, with the
    group's job check (``job_group_check_sql``): bad (JOB_HOST where the host is not the job's)
    and recheck (the rows must tell); one join per group, not per row."""
    code, recheck = job_group_check_sql("j", "g")
    return (f"SELECT g.* EXCLUDE (bad, user_max), CAST({code} AS TINYINT) AS bad, {recheck} AS recheck "
            f"FROM ({grouped}) g LEFT JOIN {JOBS_TABLE} j ON g.job_id = j.job_id")


def _dedup_sql(rows: str) -> str:
    """``rows`` with each dropped copy of a window marked: per (gpu_uuid, job_id, ts_start) among
    the valid rows, the copy of the first file by path (then the first in that file) is kept;
    the others get the code _DUP, or _DUP_CONFLICT where their values (``vh``, a hash of
    DUPLICATE_VALUE_COLUMNS) differ from the kept copy's. Deterministic whatever the threads or
    the listing order; rejected rows (bad > 0) never shadow a valid one.

    Why the first by path: the daemon names a file after its WAL segment (``<host>-<ns>-<pid>``)
    and the importer after its span, so a copy's path is the only thing both copies have that
    orders them the same on every run; a re-run converts a segment to the same name (no copy)."""
    w = "PARTITION BY gpu_uuid, job_id, ts_start, bad = 0 ORDER BY filename, file_row_number"
    return (f"SELECT * EXCLUDE (vh, kept_vh, rn) REPLACE (CAST(CASE WHEN rn = 1 OR bad <> 0 THEN bad "
            f"WHEN vh IS NOT DISTINCT FROM kept_vh THEN {_DUP} ELSE {_DUP_CONFLICT} END AS TINYINT) AS bad) "
            f"FROM (SELECT *, row_number() OVER ({w}) AS rn, first_value(vh) OVER ({w}) AS kept_vh "
            f"FROM ({rows}))")


def text_job_ids(table: pa.Table) -> pa.Table:
    """``table`` with an integer ``job_id`` column (another writer's plain Slurm ids) as text, the
    schema's type; any other table as it is (bytes stay bytes: ``_run`` skips such a file by name).

    Why: the passes read each set of files with its first file's type, so a day mixing text and
    integer ids gave the scan text and the model pass, over the files without GPM, integers; their
    tables did not join and the night failed (ArrowInvalid), or such a file was read on one night
    and skipped as a bad type on the next, by the order and columns of the day's files."""
    i = table.schema.get_field_index("job_id")
    if i < 0 or not pa.types.is_integer(table.schema.field(i).type):
        return table
    return table.set_column(i, pa.field("job_id", pa.string()), pc.cast(table.column(i), pa.string()))


def _bad_types(schema: pa.Schema) -> list[str]:
    """Columns of ``schema`` whose type cannot stand for the v1 column's (``ts_start`` of strings)."""
    from wattclass.schema import TELEMETRY_V1

    out: list[str] = []
    for col in schema:
        if col.name not in TELEMETRY_V1.names:
            continue
        want, got = TELEMETRY_V1.field(col.name).type, col.type
        if pa.types.is_dictionary(got):
            got = got.value_type
        if pa.types.is_null(got):
            continue
        if pa.types.is_timestamp(want):
            # not nanoseconds: DuckDB's epoch_ms has no form for them, and the whole scan failed
            ok = (pa.types.is_timestamp(got) and got.unit != "ns") or pa.types.is_date(got)
        elif pa.types.is_string(want) or pa.types.is_large_string(want):
            ok = (pa.types.is_string(got) or pa.types.is_large_string(got)
                    or (col.name == "job_id" and pa.types.is_integer(got)))  # text_job_ids
        else:
            ok = pa.types.is_integer(got) or pa.types.is_floating(got) or pa.types.is_boolean(got)
        if not ok:
            out.append(f"{col.name} is {col.type}, expected {want}")
    return out


class _Differ(Exception):
    """The files of a scan do not share one schema: read them by column name."""


def _empty_partials() -> pa.Table:
    return pa.table({"job_id": pa.array([], pa.string()), "host": pa.array([], pa.string())})


def _n_by(table: pa.Table, key: str) -> dict[int, int]:
    """Windows (summed ``n_windows``) per value of ``key`` among the pass's groups."""
    t = table.group_by(key, use_threads=False).aggregate([("n_windows", "sum")])
    return {int(k): int(v) for k, v in zip(t.column(key).to_pylist(), t.column("n_windows_sum").to_pylist(),
                                          strict=True)}


def _warn_attribution(rejects: pa.Table) -> None:
    """One warning per (job, host, reason) whose windows its Slurm record contradicts (the job id
    and host are user-controllable text: clipped), at most _MAX_JOB_WARNINGS, then a count."""
    codes = rejects.column("bad")
    hit = rejects.filter(pc.and_(pc.greater_equal(codes, JOB_HOST), pc.less_equal(codes, JOB_USER)))
    if not hit.num_rows:
        return
    t = hit.group_by(["job_id", "host", "bad"], use_threads=False).aggregate([("n_windows", "sum")])
    t = t.sort_by([("job_id", "ascending"), ("host", "ascending"), ("bad", "ascending")])
    rows = t.to_pylist()
    for r in rows[:_MAX_JOB_WARNINGS]:
        log.warning("job %s: %d window(s) from host %s rejected: %s", clip(r["job_id"], 40),
                    r["n_windows_sum"], clip(r["host"], 64), REJECT_REASONS[int(r["bad"]) - 1])
    if len(rows) > _MAX_JOB_WARNINGS:
        log.warning("... and %d more (job, host) pair(s) whose windows their Slurm record contradicts",
                    len(rows) - _MAX_JOB_WARNINGS)


# long: the per-job table's columns, one per aggregate the labels read
def _per_job(table: pa.Table, order: list[Path], good: list[Path], bad: list[tuple[Path, str]],
             rejected: dict[str, int], dups: int, conflicting: int, sample: pa.Table | None) -> ScanResult:
    """The pass's valid groups (``table``) merged per (job_id, host): the scan's result."""
    n_windows = int(pc.sum(table.column("n_windows")).as_py() or 0)
    part = table.filter(pc.is_valid(table.column("job_id")))
    nogpm = pc.unique(pc.filter(part.column("file_index"), pc.less(part.column("code"), 0)))
    code, n = part.column("code"), part.column("n_windows")

    def where(cond: pa.ChunkedArray) -> pa.ChunkedArray:
        return pc.if_else(cond, n, 0)

    cols = {"job_id": part.column("job_id"), "host": part.column("host"), "user": part.column("user"),
            "n_windows": n, "dur_ms": part.column("dur_ms"), "energy_j": part.column("energy_j"),
            "ts_start_ms": part.column("ts_start_ms"), "ts_end_ms": part.column("ts_end_ms"),
            "n_gpm": where(pc.greater_equal(code, 0)), "r_idle": where(pc.equal(code, rules.IDLE)),
            "r_compute": where(pc.equal(code, rules.COMPUTE)),
            "r_memory": where(pc.equal(code, rules.MEMORY)), "n_shared": part.column("n_shared"),
            "n_pipe_gap": where(pc.equal(code, rules.PIPE_GAP))}
    sums = ["n_windows", "dur_ms", "energy_j", "n_gpm", "r_idle", "r_compute", "r_memory", "n_shared",
            "n_pipe_gap"]
    aggs = [(c, "sum") for c in sums] + [("user", "min"), ("ts_start_ms", "min"), ("ts_end_ms", "max")]
    per_job = pa.table(cols).group_by(["job_id", "host"], use_threads=False).aggregate(aggs)
    back = {f"{c}_{a}": c for c, a in aggs}
    per_job = per_job.rename_columns([back.get(n, n) for n in per_job.column_names])
    return ScanResult(per_job, n_windows, good, bad, {k: v for k, v in rejected.items() if v},
                      dups, conflicting, sorted(str(order[i]) for i in nogpm.to_pylist()), sample)


def sample_file_count(n_files: int) -> int:
    """How many of a night's ``n_files`` the retraining sample is drawn from: one in
    SAMPLE_FILE_SHARE, at least SAMPLE_MIN_FILES, at most SAMPLE_MAX_FILES (never more than all)."""
    return min(n_files, max(SAMPLE_MIN_FILES, min(-(-n_files // SAMPLE_FILE_SHARE), SAMPLE_MAX_FILES)))


def _draw_keys(files: Sequence[Path], seed: int) -> dict[str, tuple[bytes, str]]:
    """Each file's place in the draw: a seeded hash of the path's last three parts
    (``date=D/host=H/<file>`` in the telemetry layout), then the full path. Why not the whole
    path: the same night under another data root (a copy, a restore, a bench's temp folder) would
    then draw other files and retrain another model; the full path only breaks ties."""
    import hashlib

    return {str(f): (hashlib.blake2b(f"{seed}:{_tail(f)}".encode(), digest_size=8).digest(), str(f))
            for f in files}


def sample_files(files: Sequence[Path], seed: int) -> frozenset[str]:
    """The files (as text) of a night the retraining sample is drawn from: the
    ``sample_file_count`` of smallest draw key. An engine that scans the night in chunks draws
    once for the whole night and gives each chunk this set, so that the night reads the same
    number of files, and the same ones, however it is split."""
    key = _draw_keys(files, seed)
    return frozenset(sorted(key, key=key.__getitem__)[:sample_file_count(len(key))])


def _sample_first(files: Sequence[Path], per_job: int, seed: int,
                  drawn: frozenset[str] | None = None) -> tuple[list[Path], int]:
    """``files`` with the n the retraining sample is drawn from first (n = 0 without a sample):
    ``drawn`` (``sample_files`` of the whole night), or the draw over ``files`` themselves."""
    files = list(files)
    if per_job <= 0 or not files:
        return files, 0
    if drawn is None:
        drawn = sample_files(files, seed)
    chosen = [f for f in files if str(f) in drawn]
    key = _draw_keys(chosen, seed)
    chosen.sort(key=lambda f: key[str(f)])
    return chosen + [f for f in files if str(f) not in drawn], len(chosen)


def _tail(path: Path | str) -> str:
    """``"/".join(Path(path).parts[-3:])``, without parsing the path where it need not be.

    A ``Path``'s text is normalised (no empty or ``.`` parts): when its last three "/"-separated
    pieces are all names, they are its last three parts. Parsing 3,000 paths into parts cost
    0.04 s of every 1,000-GPU night (issue 15); anything else (text, a path of fewer parts)
    still goes through ``Path``."""
    if isinstance(path, Path):
        bits = str(path).rsplit("/", 3)[-3:]
        if len(bits) == 3 and all(bits):
            return "/".join(bits)
    return "/".join(Path(path).parts[-3:])


#: Values per sampled window in the pass's sample lists: SAMPLE_COLUMNS, window length (ms), code,
#: hash high, hash low.
_SAMPLE_WIDTH = len(SAMPLE_COLUMNS) + 4


def _sample_rows(table: pa.Table) -> pa.Table:
    """The pass's per-group sample lists as rows: job_id, h, code, window_ms and SAMPLE_COLUMNS
    (NaN: missing)."""
    lists = table.column("sample").combine_chunks()
    flat = pc.list_flatten(lists)  # one list of _SAMPLE_WIDTH doubles per sampled window
    job = pc.take(table.column("job_id"), pc.list_parent_indices(lists))
    values = np.asarray(pc.list_flatten(flat).to_numpy(zero_copy_only=False), dtype=np.float64)
    if values.size != len(flat) * _SAMPLE_WIDTH:
        raise AssertionError("sample rows of unexpected width")  # the SQL and this unpacking disagree
    values = values.reshape(len(flat), _SAMPLE_WIDTH)
    h = (values[:, -2].astype(np.uint64) << np.uint64(32)) | values[:, -1].astype(np.uint64)
    return pa.table({"job_id": job, "h": pa.array(h, pa.uint64()),
                     "code": pa.array(values[:, -3].astype(np.int32)),
                     "window_ms": pa.array(values[:, -4]),
                     **{c: pa.array(values[:, i]) for i, c in enumerate(SAMPLE_COLUMNS)}})
