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
(``union_by_name``), after each file's own schema was checked for the required columns. A file
DuckDB cannot read is found by reading each file's footer, skipped with a warning naming it,
and counted.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from wattclass.classifier import rules
from wattclass.classifier.features import INPUT_COLUMNS
from wattclass.errors import DataError
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
    """``rules.window_labels`` as a SQL expression (NO_GPM = -1)."""
    sm, dram = _val("sm_util_pct", dropped), _val("dram_bw_util_pct", dropped)
    comp = "greatest(" + ", ".join(_val(u, dropped) for u in rules.COMPUTE_UNITS) + ")"  # NULLs skipped
    return (f"(CASE WHEN ({sm}) IS NULL OR ({dram}) IS NULL OR ({comp}) IS NULL THEN {rules.NO_GPM} "
            f"WHEN ({sm}) < {rules.SM_ACTIVE_PCT} THEN {rules.IDLE} "
            f"WHEN ({comp}) >= ({dram}) THEN {rules.COMPUTE} ELSE {rules.MEMORY} END)")


@dataclass
class ScanResult:
    partials: pa.Table  # per (job_id, host); see module docstring
    n_windows: int  # windows read (with or without a job)
    files: list[Path]  # files actually read (unreadable ones skipped)
    skipped: list[tuple[Path, str]]  # (file, why)


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
        """Per file: readable, and has every required column (else DataError naming both).

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
                log.warning("skipping unreadable telemetry file %s: %s", f, exc)
                bad.append((f, f"unreadable: {exc}"))
                continue
            missing = [c for c in REQUIRED_COLUMNS if c not in names]
            if missing:
                raise DataError(f"{f}: telemetry is missing required column(s) {', '.join(missing)}")
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
        try:
            return self.con.sql(sql_for(files)).to_arrow_table(), files, []
        except (duckdb.IOException, duckdb.InvalidInputException, duckdb.BinderException,
                duckdb.ConversionException) as exc:
            log.info("telemetry files differ or one is unreadable (%s): checking each file",
                     str(exc).splitlines()[0][:300])
        good, bad = self._check_schemas(files)
        self._union = True
        if not good:
            return None, good, bad
        return self.con.sql(sql_for(good)).to_arrow_table(), good, bad

    # -- the one pass -------------------------------------------------------------------------
    def partials(self, files: Sequence[Path], drop_columns: Sequence[str] = ()) -> ScanResult:
        def sql(fs: list[Path]) -> str:
            dropped = frozenset(drop_columns) | self._absent
            code = rule_code_sql(dropped)
            energy = "CASE WHEN isnan(energy_j) THEN 0.0 ELSE coalesce(energy_j, 0.0) END"
            user = "CAST(NULL AS VARCHAR)" if "user" in self._absent else '"user"'
            sel = [
                "job_id", "host", f"{user} AS \"user\"", "ts_start", "ts_end", f"{energy} AS e",
                f"{code} AS code", "filename",
            ]
            aggs = [
                'min("user") AS "user"', "count(*) AS n_windows",
                "CAST(sum(epoch_ms(ts_end) - epoch_ms(ts_start)) AS BIGINT) AS dur_ms", "sum(e) AS energy_j",
                "epoch_ms(min(ts_start)) AS ts_start_ms", "epoch_ms(max(ts_end)) AS ts_end_ms",
                "count(*) FILTER (WHERE code >= 0) AS n_gpm",
                f"count(*) FILTER (WHERE code = {rules.IDLE}) AS r_idle",
                f"count(*) FILTER (WHERE code = {rules.COMPUTE}) AS r_compute",
                f"count(*) FILTER (WHERE code = {rules.MEMORY}) AS r_memory",
                "list(DISTINCT filename) FILTER (WHERE code < 0 AND job_id IS NOT NULL) AS nogpm_files",
            ]
            # Windows without a job are grouped too (per host): they count as windows read.
            return (f"SELECT job_id, host, {', '.join(aggs)} FROM (SELECT {', '.join(sel)} "
                    f"FROM {self._source(fs, filename=True)}) GROUP BY job_id, host")

        table, good, bad = self._run(sql, list(files))
        if table is None:
            return ScanResult(_empty_partials(), 0, [], bad)
        n_windows = int(pc.sum(table.column("n_windows")).as_py() or 0)
        return ScanResult(table.filter(pc.is_valid(table.column("job_id"))), n_windows, good, bad)

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
        cols = ", ".join(f"{_val(c, dropped)} AS {_q(c)}" for c in INPUT_COLUMNS)
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


def _empty_partials() -> pa.Table:
    return pa.table({"job_id": pa.array([], pa.string()), "host": pa.array([], pa.string())})
