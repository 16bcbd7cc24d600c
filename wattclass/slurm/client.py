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
from wattclass.logsafe import clip

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

    ``start``/``end`` may be ISO timestamps or epoch seconds; a time without a zone is read as
    UTC (convert sacct's local times, or export them with ``SLURM_TIME_FORMAT`` carrying the
    offset). Missing optional columns read as null; a missing ``job_id`` column is an error naming
    the file.

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
        marked = False
        try:
            if self.path.suffix == ".parquet":
                df = pd.read_parquet(self.path)
            else:
                import io

                text = self.path.read_bytes().decode("utf-8", "surrogateescape").translate(_MARK_BAD)
                text = _whole_rows(text)
                marked = _CR_MARK in text
                # Text stays text ("0042" is an account, not 42; a user called "NA" is a user), a
                # blank is null, and sacct's words for "no time" (a running job's End) are null.
                df = pd.read_csv(io.StringIO(text), dtype=dict.fromkeys(_TEXT_COLUMNS, str),
                                 keep_default_na=False,
                                 na_values={**{c: [""] for c in _TEXT_COLUMNS}, "start": _NO_TIME,
                                            "end": _NO_TIME, "gpus": _NO_NUMBER})
        except FileNotFoundError as exc:
            raise DataError(f"{self.path}: jobs file not found") from exc
        except Exception as exc:  # pandas raises many types for unreadable files
            raise DataError(f"{self.path}: cannot read jobs file: {exc}") from exc
        for col in _REQUIRED:
            if col not in df.columns:
                raise DataError(f"{self.path}: jobs file is missing column {col} (it has "
                                f"{_names(df.columns)}; a jobs file's columns: {', '.join(JOB_COLUMNS)}, "
                                "all but job_id optional)")
        _warn_missing_key_columns(self.path, df.columns)
        row_numbers = range(1, len(df) + 1)  # every row whole (_whole_rows), blank lines skipped
        if marked:
            for col in _TEXT_COLUMNS:  # a CR inside a field (see _whole_rows) back as itself
                if col in df.columns:
                    df[col] = df[col].map(lambda v: v.replace(_CR_MARK, "\r") if isinstance(v, str) else v)
        raw_ids = _text(df["job_id"], [f"row {n}" for n in row_numbers], self.path)
        ids = ["" if v is None else v for v in raw_ids]
        # Column by column rather than row by row (issue 15: 0.15-0.3 s of a 1,000-GPU night went
        # to building 4,000 records one dict and one Timestamp at a time).
        cols = {f: _column(df, f, ids, self.path) for f in _RECORD_FIELDS}
        utf8 = {f: [_utf8(v) for v in (ids if f == "job_id" else cols[f])] for f in _TEXT_FIELDS}
        self._records: list[JobRecord] = []
        for i, values in enumerate(zip(*cols.values(), strict=True)):
            if raw_ids[i] is None:
                self.problems.append(f"row {row_numbers[i]}: no job_id, record skipped")
                continue
            rec = JobRecord(ids[i], **dict(zip(_RECORD_FIELDS, values, strict=True)))
            bad = [f for f in _TEXT_FIELDS if not utf8[f][i]]
            if not bad:
                self._records.append(rec)
                continue
            shown = _shown(rec.job_id)
            if set(bad) <= {"name", "admin_comment"}:
                self.problems.append(f"job {shown}: {' and '.join(bad)} not UTF-8, dropped")
                self._records.append(rec._replace(
                    name=None if "name" in bad else rec.name,
                    admin_comment=None if "admin_comment" in bad else rec.admin_comment))
            else:
                self.problems.append(f"job {shown}: {', '.join(bad)} not UTF-8, record skipped")
        _one_user_per_job(self.path, self._records)
        for msg in self.problems[:20]:
            log.warning("%s: %s", self.path, msg)
        if len(self.problems) > 20:
            log.warning("%s: %d more record problem(s)", self.path, len(self.problems) - 20)

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


#: A carriage return inside a field of a file whose lines end in LF or CRLF, while the file is
#: parsed (``_whole_rows``): pandas would end the row there and shift the rest into the next one.
_CR_MARK = chr(_BAD_BASE + 0x0D)
_BARE_CR = re.compile("\r(?!\n)")


def _one_user_per_job(path: Path, records: list[JobRecord]) -> None:
    """A DataError where one job id's records name two users. A job keeps its user through every
    requeue (one record per run), so two users for one id is no Slurm record: it is what a job
    name holding line breaks makes of an unquoted export whose every line it fills to the
    header's field count (a row giving another user's job to a user of its choosing), which no
    field count can tell. The records decide whose key a job's label joins and whose windows are
    a job's (classifier/jobcheck.py), so the file is refused rather than one record trusted."""
    seen: dict[str, str] = {}
    for r in records:
        if r.user is None:
            continue
        first = seen.setdefault(r.job_id, r.user)
        if first != r.user:
            raise DataError(f"{path}: job {_shown(r.job_id)} has records of two users ({clip(first, 64)} "
                            f"and {clip(r.user, 64)}): a job keeps its user; in an unquoted export a job "
                            "name can forge rows; not read. Export the records with every text field quoted, "
                            "or as Parquet")


def _whole_rows(text: str) -> str:
    """The CSV ``text``, its bare CRs marked; a DataError where a row's field count differs from
    the header's.

    Why: a job name or user holding a carriage return split its row in two and shifted every
    later column of it silently (pandas ends a row at a bare CR even outside quotes: 21 jobs read
    as 42 records, job 5001 with user "a"). Where the file's lines end in LF or CRLF, a CR not
    before LF is a character of the field (marked as ``_CR_MARK`` while parsing); the rows are
    then split as the csv module splits them (newline="": a line break inside quotes stays in the
    field). A row of another field count means an unquoted field held a line break or the
    delimiter: then no row of the file can be trusted, since a job name (the user's to choose)
    holding line breaks can forge whole rows of the header's count after the broken one (a record
    giving another user's job id to a user of its choosing), so the file is refused, naming the
    rows. Skipping the broken rows alone kept the forged ones (a fresh-eyes review)."""
    import csv
    import io

    if "\n" in text and "\r" in text:
        text = _BARE_CR.sub(_CR_MARK, text)
    reader = csv.reader(io.StringIO(text, newline=""))
    header = next(reader, None)
    if header is None:
        return text
    at = header.index("job_id") if "job_id" in header else None
    broken: list[str] = []
    n = 0
    for row in reader:
        if not row:  # a blank line: pandas skips it too
            continue
        n += 1
        if len(row) == len(header):
            continue
        job = _shown(row[at]).replace(_CR_MARK, "?") if at is not None and at < len(row) else "?"
        broken.append(f"row {n} (line {reader.line_num}, job {job}): {len(row)} fields, the header has "
                      f"{len(header)}")
    if broken:
        more = f" and {len(broken) - 3} more" if len(broken) > 3 else ""
        raise DataError(f"{'; '.join(broken[:3])}{more}: a line break or the delimiter in an unquoted field, "
                        "so a job name may have forged rows; not read. Export the records with every "
                        "text field quoted (a CSV writer's quoting), or as Parquet")
    return text


_NOT_UTF8 = re.compile(f"[{chr(_BAD_BASE + 0x80)}-{chr(_BAD_BASE + 0xFF)}]")
#: JobRecord's fields after job_id, as read from a jobs file (a missing column: None).
_RECORD_FIELDS = ("name", "user", "account", "partition", "start", "end", "admin_comment", "gpus",
                  "slurm_job_id", "nodes")
#: Columns read as text whatever they look like (job ids, names, accounts: "0042" stays "0042").
_TEXT_COLUMNS = ("job_id", "name", "user", "account", "partition", "admin_comment", "slurm_job_id", "nodes")
#: The text fields checked for bytes that were not UTF-8, in the order problems name them.
_TEXT_FIELDS = ("job_id", "user", "account", "partition", "name", "admin_comment")
#: pandas' own words for a missing number (its read_csv default), kept for the number and time
#: columns: a spreadsheet export writes #N/A, <NA>, n/a.
_NA_WORDS = ("", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN",
             "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null")
#: ... and what sacct writes for "no time" (a running job's End=Unknown): null.
_NO_TIME = (*_NA_WORDS, "Unknown", "unknown", "UNKNOWN", "none", "NaT")
_NO_NUMBER = _NA_WORDS
#: Epoch values at or above this are not seconds (1e11 s is the year 5138; 1.7e12 is a millisecond
#: epoch of today, a common export mistake).
_MAX_EPOCH_S = 1e11


#: Columns whose absence empties what the nightly needs most: the table's keys and the time checks.
_KEY_COLUMNS = ("user", "name", "account", "start", "end")


def _names(columns: Any, limit: int = 12) -> str:
    """The header's names, clipped: a jobs file is site input, a header may be anything."""
    names = [clip(str(c), 40) for c in list(columns)[:limit]]
    return ", ".join(names) + (f" and {len(columns) - limit} more" if len(columns) > limit else "")


def _warn_missing_key_columns(path: Path, columns: Any) -> None:
    """A WARNING when a key column is missing. Why: optional columns read as null, so an export
    with sacct's names (``User``, ``JobName``) was read without error and gave the night no
    user, name or account keys; the columns that were not read are named as the likely cause."""
    missing = [c for c in _KEY_COLUMNS if c not in columns]
    if not missing:
        return
    unread = [c for c in columns if c not in JOB_COLUMNS]
    lost = {"user": "no user or account keys", "name": "no user+name keys", "account": "no account keys",
            "start": "no time checks", "end": "no time checks"}
    log.warning("%s: jobs file has no column %s: read as empty (%s); columns not read: %s; a jobs "
                "file's columns: %s", clip(str(path), 300), ", ".join(missing),
                ", ".join(dict.fromkeys(lost[c] for c in missing)), _names(unread) or "none",
                ", ".join(JOB_COLUMNS))


def _utf8(value: str | None) -> bool:
    """False if ``value`` held bytes that were not UTF-8 (see ``_MARK_BAD``)."""
    return value is None or _NOT_UTF8.search(value) is None


def _shown(job_id: str) -> str:
    """A job id as errors and problems show it: bytes that were not UTF-8 as '?', at most 32 chars."""
    return _NOT_UTF8.sub("?", job_id[:32])


def _bad(path: Path, job_id: str, column: object, value: object, why: str) -> DataError:
    shown = _NOT_UTF8.sub("?", str(value)[:64])
    return DataError(f"{path}: job {_shown(job_id)}: {column} {shown!r} {why}")


def _column(df: pd.DataFrame, field: str, ids: list[str], path: Path) -> list[Any]:
    """One JobRecord field for every row of ``df`` (``ids``: the rows' job ids, for errors)."""
    if field not in df.columns:
        return [None] * len(df)
    col = df[field]
    if field in ("start", "end"):
        return _times(col, ids, path)
    if field == "gpus":
        return _gpus(col, ids, path)
    return _text(col, ids, path)


def _text(col: pd.Series, ids: list[str], path: Path) -> list[str | None]:
    """A text field: strings as they are, integers (a Parquet id column) in decimal, an integral
    float (an integer column with a null, as pandas reads it) as the integer, bytes decoded as the
    CSV path decodes them; anything else (lists, booleans, maps) is a DataError."""
    import pandas as pd

    out: list[str | None] = []
    for job_id, v in zip(ids, col.tolist(), strict=True):
        if v is None or v is pd.NaT or v is pd.NA or (isinstance(v, float) and v != v):
            out.append(None)
        elif isinstance(v, str):
            out.append(v)
        elif isinstance(v, bytes):
            out.append(v.decode("utf-8", "surrogateescape").translate(_MARK_BAD))
        elif isinstance(v, bool):
            raise _bad(path, job_id, col.name, v, "is not text")
        elif isinstance(v, int):
            out.append(str(v))
        elif isinstance(v, float):
            out.append(str(int(v)) if v.is_integer() else repr(v))
        else:
            raise _bad(path, job_id, col.name, v, "is not text")
    return out


def _gpus(col: pd.Series, ids: list[str], path: Path) -> list[int | None]:
    """GPU counts: whole, finite, not negative; blank is null."""
    import numpy as np
    import pandas as pd

    if pd.api.types.is_bool_dtype(col.dtype):
        raise _bad(path, ids[0] if ids else "", "gpus", col.iloc[0], "is not a number")
    gpus = pd.to_numeric(col, errors="coerce")
    values = gpus.to_numpy(dtype=np.float64, na_value=np.nan)
    not_numbers = (gpus.isna() & col.notna()).to_numpy()
    if not_numbers.any():
        i = int(np.flatnonzero(not_numbers)[0])
        raise _bad(path, ids[i], "gpus", col.iloc[i], "is not a number")
    wrong = ~np.isnan(values) & (~np.isfinite(values) | (values < 0) | (values != np.floor(values)))
    if wrong.any():
        i = int(np.flatnonzero(wrong)[0])
        raise _bad(path, ids[i], "gpus", col.iloc[i], "is not a GPU count")
    return [None if v != v else int(v) for v in values.tolist()]


def _times(col: pd.Series, ids: list[str], path: Path) -> list[dt.datetime | None]:
    """Each value as a UTC datetime floored to microseconds, or None. A numeric column is epoch
    seconds (anything not finite, or at least ``_MAX_EPOCH_S``, is a DataError naming the job);
    datetime columns (what Parquet gives) and ISO 8601 text (what exports write) are converted at
    once; the values that leaves unread go one by one through ``_ts``, which reads other spellings
    or names the job whose value is not a time."""
    import numpy as np
    import pandas as pd

    if pd.api.types.is_bool_dtype(col.dtype):
        raise _bad(path, ids[0] if ids else "", col.name, col.iloc[0], "is not a time")
    if pd.api.types.is_numeric_dtype(col.dtype):
        values = col.to_numpy(dtype=np.float64, na_value=np.nan)
        wrong = ~np.isnan(values) & ~(np.abs(values) < _MAX_EPOCH_S)
        if wrong.any():
            i = int(np.flatnonzero(wrong)[0])
            raise _bad(path, ids[i], col.name, col.iloc[i], "is not a time in epoch seconds (milliseconds?)")
        col = pd.to_datetime(col, unit="s", utc=True)
    fast: list[Any] = pd.to_datetime(col, utc=True, errors="coerce", format="ISO8601").dt.floor("us").tolist()
    out: list[dt.datetime | None] = []
    for job_id, value, t in zip(ids, col.tolist(), fast, strict=True):
        if t is not pd.NaT:
            out.append(t.to_pydatetime())
            continue
        try:
            out.append(None if isinstance(value, str) and value.strip() in _NO_TIME else _ts(value))
        except (ValueError, TypeError, OverflowError) as exc:
            raise _bad(path, job_id, col.name, value, f"is not a time ({str(exc)[:120]})") from exc
    return out
