"""One interface to Slurm's job records, whatever the backend.

The nightly run joins telemetry with job records (name, account, partition, times) through
``SlurmClient``; the Prolog and tests query live jobs through it too. Backends:

- ``JobsFileClient``: an offline CSV/Parquet of job records (tests, demo, sites that export sacct);
- a client over Slurm's own commands (squeue/sinfo --json, scontrol, sacct --json) in
  ``wattclass.slurm.commands``; every command goes through one function there;
- pyslurm when importable and matching the running Slurm (PyPI's 25.11 does not build against
  Debian 12's Slurm 22.05, so it is optional).
"""

from __future__ import annotations

import abc
import datetime as dt
import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from wattclass.errors import DataError
from wattclass.jobrecord import JOB_COLUMNS, JobRecord

if TYPE_CHECKING:  # pandas is imported inside functions: the Prolog imports this module and must
    import pandas as pd  # start fast (no pandas on its path).


_REQUIRED = ("job_id",)
log = logging.getLogger(__name__)


class SlurmClient(abc.ABC):
    """Read job records from Slurm or a stand-in for it.

    ``name`` says which backend this is ("commands", "pyslurm", "jobs-file"); the nightly run
    logs it and puts it in its summary, so an operator sees where the job records came from.
    """

    name: str = "unknown"

    def describe(self) -> str:
        """One line for logs: the backend and where it reads from."""
        return self.name

    @abc.abstractmethod
    def jobs(self, start: dt.datetime, end: dt.datetime) -> list[JobRecord]:
        """Jobs that ran (at least partly) between ``start`` and ``end`` (UTC)."""

    def jobs_frame(self, start: dt.datetime, end: dt.datetime) -> pd.DataFrame:
        """The same records as a DataFrame with columns JOB_COLUMNS."""
        import pandas as pd

        return pd.DataFrame(self.jobs(start, end), columns=list(JOB_COLUMNS))


def _ts(value: object) -> dt.datetime | None:
    import pandas as pd

    if value is None or (isinstance(value, float) and pd.isna(value)) or value is pd.NaT:
        return None
    t = pd.Timestamp(value)  # type: ignore[arg-type]
    if pd.isna(t):
        return None
    t = t.tz_localize("UTC") if t.tzinfo is None else t.tz_convert("UTC")
    return t.floor("us").to_pydatetime()


class JobsFileClient(SlurmClient):
    """Job records from a CSV or Parquet file with (a subset of) the JOB_COLUMNS columns.

    ``start``/``end`` may be ISO timestamps or epoch seconds. Missing optional columns read as
    null; a missing ``job_id`` column is an error naming the file.

    Job names are whatever users typed, in any encoding: a CSV field that is not valid UTF-8
    does not fail the file. A name that is not UTF-8 is dropped (the record keeps its user and
    account); a record whose job id, user, account or partition is not UTF-8 is skipped. Both are
    logged and listed in ``problems`` (job id and what was wrong) for the nightly summary.
    """

    name = "jobs-file"

    def __init__(self, path: Path) -> None:
        import pandas as pd

        self.path = Path(path)
        self.problems: list[str] = []
        try:
            if self.path.suffix == ".parquet":
                df = pd.read_parquet(self.path)
            else:
                import io

                text = self.path.read_bytes().decode("utf-8", "surrogateescape").translate(_MARK_BAD)
                df = pd.read_csv(io.StringIO(text), dtype={"job_id": str})
        except FileNotFoundError as exc:
            raise DataError(f"{self.path}: jobs file not found") from exc
        except Exception as exc:  # pandas raises many types for unreadable files
            raise DataError(f"{self.path}: cannot read jobs file: {exc}") from exc
        for col in _REQUIRED:
            if col not in df.columns:
                raise DataError(f"{self.path}: jobs file is missing column {col}")
        if "gpus" in df.columns:
            gpus = pd.to_numeric(df["gpus"], errors="coerce")
            not_numbers = gpus.isna() & df["gpus"].notna()
            if not_numbers.any():
                first = df[not_numbers].iloc[0]
                raise DataError(f"{self.path}: job {first['job_id']}: gpus {first['gpus']!r} is not a number")
            df["gpus"] = gpus.astype(object).where(gpus.notna(), None)
        for col in ("start", "end"):
            if col in df.columns and pd.api.types.is_numeric_dtype(df[col]):
                df[col] = pd.to_datetime(df[col], unit="s", utc=True)
        # Column by column rather than row by row (issue 15: 0.15-0.3 s of a 1,000-GPU night went
        # to building 4,000 records one dict and one Timestamp at a time); same records.
        ids = [str(v) for v in df["job_id"].tolist()]
        cols = {f: _column(df, f, ids, self.path) for f in _RECORD_FIELDS}
        utf8 = {f: [_utf8(v) for v in (ids if f == "job_id" else cols[f])] for f in _TEXT_FIELDS}
        self._records: list[JobRecord] = []
        for i, values in enumerate(zip(ids, *cols.values(), strict=True)):
            rec = JobRecord(*values)
            bad = [f for f in _TEXT_FIELDS if not utf8[f][i]]
            if not bad:
                self._records.append(rec)
                continue
            shown = "".join("?" if not _utf8(c) else c for c in rec.job_id)[:32]
            if set(bad) <= {"name", "admin_comment"}:
                self.problems.append(f"job {shown}: {' and '.join(bad)} not UTF-8, dropped")
                self._records.append(rec._replace(
                    name=None if "name" in bad else rec.name,
                    admin_comment=None if "admin_comment" in bad else rec.admin_comment))
            else:
                self.problems.append(f"job {shown}: {', '.join(bad)} not UTF-8, record skipped")
        for msg in self.problems[:20]:
            log.warning("%s: %s", self.path, msg)
        if len(self.problems) > 20:
            log.warning("%s: %d more record(s) with invalid UTF-8", self.path, len(self.problems) - 20)

    def describe(self) -> str:
        return f"jobs file {self.path}"

    def jobs(self, start: dt.datetime, end: dt.datetime) -> list[JobRecord]:
        out = []
        for r in self._records:
            if r.start is not None and r.start >= end:
                continue
            if r.end is not None and r.end < start:
                continue
            out.append(r)
        return out


#: Bytes that are not UTF-8 (decoded as lone surrogates U+DC80..U+DCFF) are moved to code points of
#: Supplementary Private Use Area-A, which pandas can carry and which no real job name contains.
_BAD_BASE = 0xF0000
_MARK_BAD = {0xDC80 + b: _BAD_BASE + 0x80 + b for b in range(128)}


_NOT_UTF8 = re.compile(f"[{chr(_BAD_BASE + 0x80)}-{chr(_BAD_BASE + 0xFF)}]")
#: JobRecord's fields after job_id, in order, as read from a jobs file (a missing column: None).
_RECORD_FIELDS = ("name", "user", "account", "partition", "start", "end", "admin_comment", "gpus")
#: The text fields checked for bytes that were not UTF-8, in the order problems name them.
_TEXT_FIELDS = ("job_id", "user", "account", "partition", "name", "admin_comment")


def _utf8(value: str | None) -> bool:
    """False if ``value`` held bytes that were not UTF-8 (see ``_MARK_BAD``)."""
    return value is None or _NOT_UTF8.search(value) is None


def _column(df: pd.DataFrame, field: str, ids: list[str], path: Path) -> list[Any]:
    """One JobRecord field for every row of ``df`` (``ids``: the rows' job ids, for errors)."""
    if field not in df.columns:
        return [None] * len(df)
    col = df[field]
    if field in ("start", "end"):
        return _times(col, ids, path)
    convert = _int if field == "gpus" else _str
    return [convert(v) for v in col.tolist()]


def _times(col: pd.Series, ids: list[str], path: Path) -> list[dt.datetime | None]:
    """``_ts`` of each value; a datetime column at once (what Parquet and epoch seconds give)."""
    import pandas as pd

    if isinstance(col.dtype, pd.DatetimeTZDtype) or pd.api.types.is_datetime64_dtype(col.dtype):
        utc = col.dt.tz_localize("UTC") if col.dt.tz is None else col.dt.tz_convert("UTC")
        utc = utc.dt.floor("us")
        return [None if t is pd.NaT else t.to_pydatetime() for t in utc.tolist()]
    out: list[dt.datetime | None] = []
    for job_id, value in zip(ids, col.tolist(), strict=True):
        try:
            out.append(_ts(value))
        except (ValueError, TypeError, OverflowError) as exc:
            raise DataError(f"{path}: job {job_id[:32]}: {col.name} {str(value)[:64]!r} is not a time "
                            f"({exc})") from exc
    return out


def _str(value: object) -> str | None:
    import pandas as pd

    if value is None or (isinstance(value, float) and pd.isna(value)):
        return None
    return str(value)


def _int(value: object) -> int | None:
    import pandas as pd

    if value is None or (isinstance(value, float) and pd.isna(value)):
        return None
    return int(value)  # type: ignore[call-overload,no-any-return]
