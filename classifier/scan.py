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
pass reads only those), and optionally a seeded random sample of GPM windows (``min_by`` on a
hash: deterministic whatever the threads or the file order).

The model pass (``model_partials``) streams the windows that need the model in Arrow batches,
computes the window features in numpy (``features.window_features``, the same code that trained
the model) and sums the model's window classes and top probabilities per (job, host).

Files: DuckDB reads them with the first file's schema; a set of files that differ (a GPU without
GPM writes no GPM columns, older writers fewer optional columns) is re-read by column name
(``union_by_name``), after each file's own schema was checked: a file DuckDB cannot read, or one
that lacks a required column, is skipped with a warning naming it and counted (``validity``).
Rows: ``validity``'s rules are SQL here (``_reject_sql``: impossible rows counted per reason and
left out; duplicate windows dropped, exactly, when two files overlap in time on a GPU).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from wattclass.classifier import rules
from wattclass.classifier.features import INPUT_COLUMNS
from wattclass.classifier.validity import (
    MAX_GPU_POWER_W,
    REJECT_ENERGY,
    REJECT_NULL,
    REJECT_POWER,
    REJECT_TIME,
    SKIP_BAD_TYPE,
    SKIP_MISSING_COLUMN,
    SKIP_UNREADABLE,
)
from wattclass.schema import REQUIRED_COLUMNS

log = logging.getLogger("wattclass.classifier")

#: Rows per Arrow batch handed to numpy in the model pass.
MODEL_BATCH_ROWS = 1 << 18
#: The retraining sample is drawn from one file in SAMPLE_FILE_SHARE (chosen by a seeded hash of
#: the file name, at least SAMPLE_MIN_FILES): drawing it from every window in the main pass
#: cost as much as the pass itself. The nightly retrains on at most a few thousand jobs anyway.
SAMPLE_FILE_SHARE = 8
SAMPLE_MIN_FILES = 64


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _lit(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _val(col: str, dropped: frozenset[str]) -> str:
    """A float column with NaN read as missing (NULL), as ``features.column_f64`` + NaN checks."""
    if col in dropped:
        return "CAST(NULL AS DOUBLE)"
    c = _q(col)
    return f"CASE WHEN isnan({c}) THEN NULL ELSE CAST({c} AS DOUBLE) END"


def rule_code_sql(dropped: frozenset[str] = frozenset()) -> str:
    """``rules.window_labels`` as a SQL expression (NO_GPM = -1, PIPE_GAP = -2: a memory verdict
    needs every compute pipe measured)."""
    sm, dram = _val("sm_util_pct", dropped), _val("dram_bw_util_pct", dropped)
    pipes = [_val(u, dropped) for u in rules.COMPUTE_UNITS]
    comp = "greatest(" + ", ".join(pipes) + ")"  # NULLs skipped
    gap = " OR ".join(f"({p}) IS NULL" for p in pipes)
    return (f"(CASE WHEN ({sm}) IS NULL OR ({dram}) IS NULL OR ({comp}) IS NULL THEN {rules.NO_GPM} "
            f"WHEN ({sm}) < {rules.SM_ACTIVE_PCT} THEN {rules.IDLE} "
            f"WHEN ({comp}) >= ({dram}) THEN {rules.COMPUTE} "
            f"WHEN {gap} THEN {rules.PIPE_GAP} ELSE {rules.MEMORY} END)")


@dataclass
class ScanResult:
    partials: pa.Table  # per (job_id, host); see module docstring
    n_windows: int  # valid, distinct windows read (with or without a job)
    files: list[Path]  # files actually read (unreadable ones skipped)
    skipped: list[tuple[Path, str]]  # (file, "reason: detail")
    rejected: dict[str, int]  # impossible rows per reason (validity)
    duplicates: int  # duplicate windows dropped
    nogpm_files: list[str] = field(default_factory=list)  # files holding job windows without GPM


#: validity's row rules in order; a row is counted under the first it breaks.
_REJECT_REASONS = (REJECT_NULL, REJECT_TIME, REJECT_ENERGY, REJECT_POWER)


def _reject_sql(absent: frozenset[str]) -> str:
    """``validity.impossible_rows`` as a SQL code: 0 valid, else 1 + the first broken rule."""
    def f(c: str) -> str:
        return "CAST(NULL AS DOUBLE)" if c in absent else f"CAST({_q(c)} AS DOUBLE)"

    dur = "(epoch_ms(ts_end) - epoch_ms(ts_start)) / 1000.0"
    e = f("energy_j")
    bad_e = f"({e} IS NOT NULL AND (isnan({e}) OR isinf({e}) OR {e} < 0))"

    def over(x: str) -> str:  # NaN and NULL count as 0 (np.nan_to_num), +inf as too much
        return f"coalesce(CASE WHEN isnan({x}) THEN 0 ELSE {x} END, 0) > {MAX_GPU_POWER_W!r}"

    mean_w = f"CASE WHEN {bad_e} THEN NULL ELSE {e} / {dur} END"
    return ("CASE WHEN ts_start IS NULL OR ts_end IS NULL OR gpu_uuid IS NULL THEN 1 "
            f"WHEN epoch_ms(ts_end) <= epoch_ms(ts_start) THEN 2 WHEN {bad_e} THEN 3 "
            f"WHEN {over(f('power_avg_w'))} OR {over(f('power_max_w'))} OR {over(mean_w)} THEN 4 ELSE 0 END")


def _overlapping_files(t: pa.Table) -> bool:
    """Whether two files share a host and a GPU range and their window-start ranges meet."""

    df = t.select(["filename", "host", "file_t0", "file_t1", "uuid_lo", "uuid_hi"]).to_pandas()
    df = df.dropna(subset=["file_t0"])
    f = df.groupby(["host", "filename"], sort=False).agg(
        t0=("file_t0", "min"), t1=("file_t1", "max"), lo=("uuid_lo", "min"), hi=("uuid_hi", "max"))
    f = f.reset_index()
    for _, g in f.groupby("host", sort=False):
        if len(g) < 2:
            continue
        g = g.sort_values("t0")
        t0, t1 = g["t0"].to_numpy(), g["t1"].to_numpy()
        lo, hi = g["lo"].to_numpy(), g["hi"].to_numpy()
        for i in range(1, len(g)):
            j = np.flatnonzero(t1[:i] >= t0[i])  # earlier-starting files still open at this start
            if len(j) and np.any((lo[j] <= hi[i]) & (hi[j] >= lo[i])):
                return True
    return False


class Scanner:
    """One DuckDB connection scanning telemetry files; ``threads`` = cores it may use."""

    def __init__(self, threads: int = 0) -> None:
        import duckdb

        self.con = duckdb.connect(config={"threads": threads or os.cpu_count() or 1})
        self.con.execute("SET preserve_insertion_order = false")
        self._union = False
        self._absent: frozenset[str] = frozenset()  # columns no file of the scan has (read as NULL)

    def close(self) -> None:
        self.con.close()

    # -- files ------------------------------------------------------------------------------
    def _source(self, files: Sequence[Path], filename: bool = False) -> str:
        lst = "[" + ", ".join(_lit(str(f)) for f in files) + "]"
        opts = ", hive_partitioning = false"
        if self._union:
            opts += ", union_by_name = true"
        if filename:
            opts += ", filename = true"
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
                names = pq.read_schema(f).names
            except (OSError, pa.ArrowException) as exc:
                bad.append((f, f"{SKIP_UNREADABLE}: {exc}"))
                log.warning("skipping telemetry file %s (%s): %s", f, SKIP_UNREADABLE, str(exc)[:300])
                continue
            missing = [c for c in REQUIRED_COLUMNS if c not in names]
            if missing:
                bad.append((f, f"{SKIP_MISSING_COLUMN}: {', '.join(missing)}"))
                log.warning("skipping telemetry file %s (%s): %s", f, SKIP_MISSING_COLUMN,
                            ", ".join(missing))
                continue
            wrong = _bad_types(pq.read_schema(f))
            if wrong:
                bad.append((f, f"{SKIP_BAD_TYPE}: {', '.join(wrong)}"))
                log.warning("skipping telemetry file %s (%s): %s", f, SKIP_BAD_TYPE, ", ".join(wrong))
                continue
            seen.update(names)
            good.append(f)
        self._absent = frozenset(TELEMETRY_V1.names) - seen
        return good, bad

    def _run(self, sql_for: Any, files: list[Path]
             ) -> tuple[pa.Table | None, list[Path], list[tuple[Path, str]]]:
        """``sql_for(files)`` as an Arrow table; on a read or schema error, check every file (skip
        unreadable ones, refuse a missing required column) and read the rest by column name."""
        import duckdb

        self._union, self._absent = False, frozenset()
        first_last = _names(files[0]), _names(files[-1])
        try:
            if None in first_last or first_last[0] != first_last[1]:
                raise _Differ("the first and the last file have different columns")
            from wattclass.schema import TELEMETRY_V1

            # Columns the files do not have at all (older writers) read as NULL; a night's files
            # come from one writer version, checked at both ends (a file that lacks a column
            # the first has fails the fast read and sends the night down the checked path).
            self._absent = frozenset(TELEMETRY_V1.names) - set(first_last[0] or ())
            return self.con.sql(sql_for(files)).to_arrow_table(), files, []
        except _Differ as exc:
            log.info("telemetry files differ (%s): checking each file", exc)
        except (duckdb.IOException, duckdb.InvalidInputException, duckdb.BinderException,
                duckdb.ConversionException) as exc:
            log.info("telemetry files differ or one is unreadable (%s): checking each file",
                     str(exc).splitlines()[0][:300])
        self._absent = frozenset()
        good, bad = self._check_schemas(files)
        self._union = True
        if not good:
            return None, good, bad
        return self.con.sql(sql_for(good)).to_arrow_table(), good, bad

    # -- the one pass -------------------------------------------------------------------------
    def partials(self, files: Sequence[Path], drop_columns: Sequence[str] = ()) -> ScanResult:
        """Per (job_id, host) over the valid, de-duplicated windows (``validity``'s rules).

        Grouped by file too, which costs little and gives each file's time range: files whose
        ranges overlap on a GPU may hold the same windows twice, and only then is the scan run
        again with an exact de-duplication (first row of each (gpu_uuid, job_id, ts_start) in
        file order kept), as a normal night has no such files."""
        table, good, bad = self._run(lambda fs: self._pass_sql(fs, drop_columns, dedup=False),
                                     list(files))
        if table is None:
            return ScanResult(_empty_partials(), 0, [], bad, {}, 0)
        rejected = {reason: int(pc.sum(table.column(f"bad_{k}")).as_py() or 0)
                    for k, reason in enumerate(_REJECT_REASONS, start=1)}
        dups = 0
        if _overlapping_files(table):
            log.info("telemetry files overlap in time on a GPU: de-duplicating windows exactly")
            valid = int(pc.sum(table.column("n_windows")).as_py() or 0)
            table = self.con.sql(self._pass_sql(good, drop_columns, dedup=True)).to_arrow_table()
            dups = valid - int(pc.sum(table.column("n_windows")).as_py() or 0)
        n_windows = int(pc.sum(table.column("n_windows")).as_py() or 0)
        nogpm = pc.filter(table.column("filename"), pc.and_(pc.is_valid(table.column("job_id")),
                                                             pc.greater(table.column("n_nogpm"), 0)))
        part = table.filter(pc.and_(pc.is_valid(table.column("job_id")),
                                    pc.greater(table.column("n_windows"), 0)))
        keep = ["job_id", "host", "user", "n_windows", "dur_ms", "energy_j", "ts_start_ms", "ts_end_ms",
                "n_gpm", "r_idle", "r_compute", "r_memory", "n_shared", "n_pipe_gap"]
        sums = ["n_windows", "dur_ms", "energy_j", "n_gpm", "r_idle", "r_compute", "r_memory", "n_shared",
                "n_pipe_gap"]
        aggs = [(c, "sum") for c in sums] + [("user", "min"), ("ts_start_ms", "min"), ("ts_end_ms", "max")]
        per_job = part.select(keep).group_by(["job_id", "host"], use_threads=False).aggregate(aggs)
        back = {f"{c}_{a}": c for c, a in aggs}
        per_job = per_job.rename_columns([back.get(n, n) for n in per_job.column_names])
        return ScanResult(per_job, n_windows, good, bad, {k: v for k, v in rejected.items() if v},
                          dups, sorted(set(nogpm.to_pylist())))

    def _pass_sql(self, fs: list[Path], drop_columns: Sequence[str], dedup: bool) -> str:
        dropped = frozenset(drop_columns) | self._absent
        code = rule_code_sql(dropped)
        energy = "CASE WHEN isnan(energy_j) THEN 0.0 ELSE coalesce(energy_j, 0.0) END"
        user = "CAST(NULL AS VARCHAR)" if "user" in self._absent else '"user"'
        # labeling._shared_windows: other jobs held the GPU, and it is not a MIG instance's row
        # with the instance's own GPM (docs/shared-gpus.md)
        shared = ("FALSE" if "shared_jobs" in self._absent else
                  "(coalesce(CAST(shared_jobs AS DOUBLE), 0) > 1 AND NOT (coalesce(CAST("
                  + ("NULL" if "share_basis" in self._absent else "share_basis")
                  + f" AS VARCHAR), '') = 'mig' AND ({code}) >= 0))")
        sel = ["job_id", "host", f'{user} AS "user"', "ts_start", "ts_end", f"{energy} AS e",
               f"{code} AS code", "filename", f"{_reject_sql(self._absent)} AS bad",
               "CAST(gpu_uuid AS VARCHAR) AS gpu_uuid", f"{shared} AS sh"]
        v = "bad = 0"
        aggs = [
            f'min("user") FILTER (WHERE {v}) AS "user"', f"count(*) FILTER (WHERE {v}) AS n_windows",
            f"CAST(sum(epoch_ms(ts_end) - epoch_ms(ts_start)) FILTER (WHERE {v}) AS BIGINT) AS dur_ms",
            f"sum(e) FILTER (WHERE {v}) AS energy_j",
            f"epoch_ms(min(ts_start) FILTER (WHERE {v})) AS ts_start_ms",
            f"epoch_ms(max(ts_end) FILTER (WHERE {v})) AS ts_end_ms",
            f"count(*) FILTER (WHERE {v} AND code >= 0) AS n_gpm",
            f"count(*) FILTER (WHERE {v} AND code = {rules.IDLE}) AS r_idle",
            f"count(*) FILTER (WHERE {v} AND code = {rules.COMPUTE}) AS r_compute",
            f"count(*) FILTER (WHERE {v} AND code = {rules.MEMORY}) AS r_memory",
            f"count(*) FILTER (WHERE {v} AND code < 0) AS n_nogpm",
            f"count(*) FILTER (WHERE {v} AND code = {rules.PIPE_GAP}) AS n_pipe_gap",
            f"count(*) FILTER (WHERE {v} AND sh) AS n_shared",
            f"epoch_ms(min(ts_start) FILTER (WHERE {v})) AS file_t0",
            f"epoch_ms(max(ts_start) FILTER (WHERE {v})) AS file_t1",
            f"min(gpu_uuid) FILTER (WHERE {v}) AS uuid_lo", f"max(gpu_uuid) FILTER (WHERE {v}) AS uuid_hi",
            *[f"count(*) FILTER (WHERE bad = {k}) AS bad_{k}" for k in range(1, len(_REJECT_REASONS) + 1)],
        ]
        rows = f"SELECT {', '.join(sel)} FROM {self._source(fs, filename=True)}"
        if dedup:  # the first row of each key in file order; rejected rows never shadow a valid one
            rows = (f"SELECT * FROM ({rows}) QUALIFY row_number() OVER (PARTITION BY gpu_uuid, job_id, "
                    "ts_start, bad = 0 ORDER BY filename) = 1 OR bad <> 0")
        # Windows without a job are grouped too (per host and file): they count as windows read.
        return (f"SELECT job_id, host, filename, {', '.join(aggs)} FROM ({rows}) "
                "GROUP BY job_id, host, filename")

    # -- the retraining sample ------------------------------------------------------------------
    def sample(self, files: Sequence[Path], per_job: int, seed: int, drop_columns: Sequence[str] = ()
               ) -> pa.Table | None:
        """Up to ``per_job`` GPM windows per job, a seeded random draw (by hash) from a seeded
        random share of the files: job_id, h (the hash), code and the model's input columns."""
        import hashlib

        if per_job <= 0 or not files:
            return None
        n = min(len(files), max(SAMPLE_MIN_FILES, -(-len(files) // SAMPLE_FILE_SHARE)))
        key = {f: hashlib.blake2b(f"{seed}:{f}".encode(), digest_size=8).digest() for f in map(str, files)}
        chosen = sorted(files, key=lambda f: key[str(f)])[:n]
        dropped = frozenset(drop_columns) | self._absent
        code = rule_code_sql(dropped)
        # the model's inputs, and the GPM columns of the roofline margin (the margin model's target)
        cols = ", ".join(f"{_val(c, dropped)} AS {_q(c)}"
                         for c in (*INPUT_COLUMNS, "dram_bw_util_pct", *rules.COMPUTE_UNITS))
        sql = (f"SELECT * FROM (SELECT job_id, hash(job_id, host, gpu_index, ts_start, {int(seed)}) AS h, "
               f"{code} AS code, {cols} FROM {self._source(chosen)} WHERE job_id IS NOT NULL) "
               "WHERE code >= 0 QUALIFY row_number() OVER (PARTITION BY job_id ORDER BY h) "
               f"<= {int(per_job)}")
        return self.con.sql(sql).to_arrow_table()

    # -- the model pass -------------------------------------------------------------------------
    def model_batches(self, files: Sequence[Path], all_job_windows: bool,
                      drop_columns: Sequence[str] = ()) -> Iterator[pa.Table]:
        """Windows that need the model (no GPM, or every job window), in Arrow batches.

        ``files`` were read by ``partials`` already (readable, required columns present)."""
        import duckdb

        def sql() -> str:
            dropped = frozenset(drop_columns) | self._absent
            cols = ", ".join(f"{_val(c, dropped)} AS {_q(c)}" for c in INPUT_COLUMNS)
            where = "job_id IS NOT NULL" + ("" if all_job_windows else f" AND {rule_code_sql(dropped)} < 0")
            return f"SELECT job_id, host, {cols} FROM {self._source(files)} WHERE {where}"

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
                yield pa.Table.from_batches([rb])


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
            ok = pa.types.is_timestamp(got) or pa.types.is_date(got)
        elif pa.types.is_string(want) or pa.types.is_large_string(want):
            ok = pa.types.is_string(got) or pa.types.is_large_string(got)
        else:
            ok = pa.types.is_integer(got) or pa.types.is_floating(got) or pa.types.is_boolean(got)
        if not ok:
            out.append(f"{col.name} is {col.type}, expected {want}")
    return out


class _Differ(Exception):
    """The files of a scan do not share one schema: read them by column name."""


def _names(path: Path) -> tuple[str, ...] | None:
    """A Parquet file's column names (None if its footer cannot be read)."""
    import pyarrow.parquet as pq

    try:
        return tuple(pq.read_schema(path).names)
    except (OSError, pa.ArrowException):
        return None


def _empty_partials() -> pa.Table:
    return pa.table({"job_id": pa.array([], pa.string()), "host": pa.array([], pa.string())})
