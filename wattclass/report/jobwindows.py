"""``wattclass job``'s telemetry: which files can hold a job's windows, reading its windows from
them, and leaving out the windows the nightly leaves out, so the job's energy and GPU-hours are
the nightly's (``counted_windows``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from wattclass.classifier import rules
from wattclass.classifier.reader import partition_dates
from wattclass.errors import DataError

log = logging.getLogger("wattclass.report.job")

#: Telemetry columns the summary reads (and nothing else): the GPM rule's columns from the rule itself.
READ_COLUMNS: tuple[str, ...] = (
    "host", "gpu_uuid", "gpu_model", "user", "ts_start", "ts_end", "energy_j", "power_limit_w", "power_max_w",
    "power_avg_w", *rules.RULE_COLUMNS,
)


def telemetry_files(root: Path, start: pd.Timestamp | None, end: pd.Timestamp | None,
                    hosts: Sequence[str] | None, dates: Sequence[str] | None = None) -> list[Path]:
    """Files that can hold the job's windows: its dates, its hosts, and its hours where files are
    hourly (``HH.parquet``); everything under ``dates`` when the span is unknown. Not a hidden
    ``.name.parquet``, which the nightly never reads (``classifier.reader``): the command found
    jobs in it that the nightly never saw."""
    base = root / "telemetry"
    if start is not None and end is not None:
        days = pd.date_range(start.normalize(), end.normalize(), freq="D")
        dates = [d.strftime("%Y-%m-%d") for d in days]
    elif dates is None:
        dates = partition_dates(base)
    out: list[Path] = []
    for d in dates:
        host_dirs = [base / f"date={d}" / f"host={h}" for h in hosts] if hosts else \
            sorted((base / f"date={d}").glob("host=*"))
        for hd in host_dirs:
            for f in sorted(hd.glob("*.parquet")):
                if f.name.startswith("."):
                    continue
                if start is not None and end is not None and f.stem.isdigit() and len(f.stem) == 2:
                    h0 = pd.Timestamp(f"{d}T{f.stem}:00:00Z")
                    if h0 + pd.Timedelta(hours=1) <= start or h0 > end:
                        continue
                out.append(f)
    from wattclass.fsutil import require_trusted_files

    return require_trusted_files(out)  # a FIFO or a planted link: refused by name


#: The column ``read_job_windows`` adds: the UTC midnight (epoch ms) of the row's file's
#: ``date=`` partition, null outside one (``counted_windows`` rejects a window outside that day).
DAY_COLUMN = "_partition_day_ms"


def _outside_day(w: pd.DataFrame) -> np.ndarray:
    """Rows whose ``ts_start`` lies more than PARTITION_SLACK_S outside their file's ``date=``
    day (``validity.REJECT_DAY``: a clock step, a misfiled file), as the nightly's SQL tests it."""
    from wattclass.classifier.validity import PARTITION_SLACK_S

    if DAY_COLUMN not in w or w.empty:
        return np.zeros(len(w), dtype=bool)
    day = pd.to_numeric(w[DAY_COLUMN], errors="coerce").to_numpy(np.float64, na_value=np.nan)
    start = pd.to_datetime(w["ts_start"], utc=True, errors="coerce")
    start_s = (start - pd.Timestamp(0, tz="UTC")).dt.total_seconds()
    start_ms = start_s.to_numpy(np.float64, na_value=np.nan) * 1000
    off = start_ms - day
    slack = PARTITION_SLACK_S * 1000
    with np.errstate(invalid="ignore"):
        out = np.isfinite(off) & ((off < -slack) | (off > 86_400_000 + slack - 1))
    return np.asarray(out, dtype=bool)


def _read_with_arrow(files: Sequence[Path], job_id: str) -> pd.DataFrame:
    """The same read with pyarrow alone (DuckDB is optional: the dev and bench extras)."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    from wattclass.classifier.rowsql import partition_day_ms
    from wattclass.schema import TELEMETRY_V1

    parts = []
    for f in files:  # one by one: each row's day is its file's date= partition's (DAY_COLUMN)
        try:
            d = ds.dataset([str(f)], format="parquet", schema=TELEMETRY_V1)
            t = d.to_table(columns=list(READ_COLUMNS), filter=ds.field("job_id") == job_id)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
            why = str(exc).splitlines()[0][:300]
            raise DataError(f"{f}: cannot read job {job_id[:64]!r}: {why}") from exc
        day = partition_day_ms(f)
        parts.append(t.append_column(DAY_COLUMN, pa.array([day] * t.num_rows, pa.int64())))
    out: pd.DataFrame = pa.concat_tables(parts).to_pandas()
    return out


def read_job_windows(files: Sequence[Path], job_id: str) -> pd.DataFrame:
    """The job's windows, reading only READ_COLUMNS (DuckDB, job_id filter pushed down)."""
    if not files:
        return pd.DataFrame(columns=list(READ_COLUMNS))
    try:
        import duckdb
    except ImportError:
        return _read_with_arrow(files, job_id)
    from wattclass.classifier.rowsql import FILENAME_DAY_SQL

    con = duckdb.connect()
    con.execute("SET threads TO 2")
    cols = ", ".join(READ_COLUMNS)
    try:
        df = con.execute(
            f"SELECT {cols}, {FILENAME_DAY_SQL} AS {DAY_COLUMN} "
            "FROM read_parquet(?, union_by_name=true, hive_partitioning=false, filename=true) "
            "WHERE job_id = ?",
            [[str(f) for f in files], job_id],
        ).df()
    except duckdb.BinderException:
        # a column no file has (telemetry older than a GPM column, e.g. int_util_pct): the arrow
        # read fills it with nulls from the v1 schema, so the rule sees the pipe as not measured
        return _read_with_arrow(files, job_id)
    except duckdb.Error as exc:
        # a file Parquet cannot read (empty, cut short, not Parquet) was a traceback: skip it by
        # name, as the nightly does, and read the others
        from wattclass.report.data import readable_files

        good, bad = readable_files(files)
        if not bad:
            raise DataError(f"job {job_id[:64]!r}: cannot read its telemetry: "
                            f"{str(exc).splitlines()[0][:300]}") from exc
        for f, why in bad:
            log.warning("job: skipping telemetry file %s (unreadable): %s", f, why)
        return read_job_windows(good, job_id)
    finally:
        con.close()
    return df


def discover_hosts(root: Path, start: pd.Timestamp, job_id: str) -> list[str] | None:
    """The job's hosts from the hour it started (a job keeps its nodes): one small read of two
    columns instead of every host for every hour it ran. None where files are not hourly."""
    files = telemetry_files(root, start, start, None)
    if not files or not all(f.stem.isdigit() for f in files):
        return None
    try:
        import duckdb
    except ImportError:
        return sorted(set(_read_with_arrow(files, job_id)["host"].astype(str))) or None
    con = duckdb.connect()
    try:
        con.execute("SET threads TO 2")
        rows = con.execute("SELECT DISTINCT host FROM read_parquet(?, hive_partitioning=false) "
                           "WHERE job_id = ?", [[str(f) for f in files], job_id]).fetchall()
    except duckdb.Error:  # a file it cannot read: every host is read, and that file skipped by name
        return None
    finally:
        con.close()
    return sorted(str(r[0]) for r in rows) or None


# -- summarising -------------------------------------------------------------------------------


def counted_windows(w: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, int]]:
    """The job's windows the nightly counts, and those it leaves out per reason: the row rules of
    ``classifier.validity`` (a backwards or over-long window, an energy negative, NaN or infinite,
    an impossible power, a window outside its file's ``date=`` day: a clock step's windows a year
    ahead were summed into the job's energy and GPU-hours) and its de-duplication (one row per
    GPU, job and window start).

    Why: the job's energy and GPU-hours were the sum of every row read, so a telemetry file
    copied under another name (or a Prometheus import over the daemon's own span) doubled them,
    and one infinite energy made them inf, where the nightly (and the label) counted each window
    once."""
    import pyarrow as pa

    from wattclass.classifier.validity import REJECT_DAY, InputReport, RowRules, impossible_rows

    if w.empty:
        return w, {}
    report = InputReport()
    w = w.copy()  # a file of strings makes DuckDB's union read the column as text: read it as its type
    for c in ("ts_start", "ts_end"):
        if not pd.api.types.is_datetime64_any_dtype(w[c]):
            w[c] = pd.to_datetime(w[c], utc=True, errors="coerce", format="ISO8601")
    null_energy = w["energy_j"].isna().to_numpy()
    for c in ("energy_j", "power_avg_w", "power_max_w"):
        if c in w and not pd.api.types.is_numeric_dtype(w[c]):
            w[c] = pd.to_numeric(w[c], errors="coerce")  # not a number: NaN, rejected as such
    cols = [c for c in ("gpu_uuid", "ts_start", "ts_end", "power_avg_w", "power_max_w") if c in w]
    t = pa.Table.from_pandas(w[cols], preserve_index=False)
    t = t.append_column("energy_j", pa.array(w["energy_j"].to_numpy(np.float64, na_value=np.nan),
                                             mask=null_energy))
    t = t.append_column("job_id", pa.array(["job"] * len(w), pa.string()))  # one job: its id is the key's
    # a window outside its file's day: rejected after the impossible-row reasons (the nightly's
    # order of codes) and before the de-duplication, so that it never shadows a valid copy
    impossible = np.zeros(len(w), dtype=bool)
    for mask in impossible_rows(t).values():
        impossible |= mask
    off_day = _outside_day(w) & ~impossible
    keep = np.zeros(len(w), dtype=bool)
    on_day = np.flatnonzero(~off_day)
    keep[on_day] = RowRules(report).keep_mask(t.take(pa.array(on_day)))
    if off_day.any():
        report.rejected_rows[REJECT_DAY] = int(off_day.sum())
    left = dict(report.rejected_rows)
    if report.duplicate_windows:
        left["duplicate windows"] = report.duplicate_windows
    if left:
        log.warning("job: %d telemetry window(s) left out, as the nightly leaves them out: %s",
                    sum(left.values()), "; ".join(f"{k}: {v}" for k, v in left.items()))
    return w.loc[keep].drop(columns=[DAY_COLUMN], errors="ignore").reset_index(drop=True), left
