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
from pathlib import Path
from typing import TYPE_CHECKING

from wattclass.errors import DataError
from wattclass.jobrecord import JOB_COLUMNS, JobRecord

if TYPE_CHECKING:  # pandas is imported inside functions: the Prolog imports this module and must
    import pandas as pd  # start fast (no pandas on its path).


_REQUIRED = ("job_id",)


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
    """

    name = "jobs-file"

    def __init__(self, path: Path) -> None:
        import pandas as pd

        self.path = Path(path)
        try:
            if self.path.suffix == ".parquet":
                df = pd.read_parquet(self.path)
            else:
                df = pd.read_csv(self.path, dtype={"job_id": str})
        except FileNotFoundError as exc:
            raise DataError(f"{self.path}: jobs file not found") from exc
        except Exception as exc:  # pandas raises many types for unreadable files
            raise DataError(f"{self.path}: cannot read jobs file: {exc}") from exc
        for col in _REQUIRED:
            if col not in df.columns:
                raise DataError(f"{self.path}: jobs file is missing column {col}")
        if "gpus" in df.columns:
            gpus = pd.to_numeric(df["gpus"], errors="coerce")
            bad = gpus.isna() & df["gpus"].notna()
            if bad.any():
                row = df[bad].iloc[0]
                raise DataError(f"{self.path}: job {row['job_id']}: gpus {row['gpus']!r} is not a number")
            df["gpus"] = gpus.astype(object).where(gpus.notna(), None)
        for col in ("start", "end"):
            if col in df.columns and pd.api.types.is_numeric_dtype(df[col]):
                df[col] = pd.to_datetime(df[col], unit="s", utc=True)
        self._records = [
            JobRecord(
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
            for row in df.to_dict("records")
        ]

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
