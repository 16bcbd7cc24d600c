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
from pathlib import Path
from typing import TYPE_CHECKING

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
        self._records: list[JobRecord] = []
        for row in df.to_dict("records"):
            rec = JobRecord(
                job_id=str(row["job_id"]),
                name=_str(row.get("name")),
                user=_str(row.get("user")),
                account=_str(row.get("account")),
                partition=_str(row.get("partition")),
                start=_ts(row.get("start")),
                end=_ts(row.get("end")),
                admin_comment=_str(row.get("admin_comment")),
                gpus=_int(row.get("gpus")),
            )
            bad = [f for f in ("job_id", "user", "account", "partition", "name", "admin_comment")
                   if not _utf8(getattr(rec, f))]
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


def _utf8(value: str | None) -> bool:
    """False if ``value`` held bytes that were not UTF-8 (see ``_MARK_BAD``)."""
    return value is None or not any(_BAD_BASE + 0x80 <= ord(c) <= _BAD_BASE + 0xFF for c in value)


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
