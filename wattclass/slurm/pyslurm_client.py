"""Job records through pyslurm's slurmdbd API, for sites whose pyslurm matches their Slurm.

Optional: PyPI's pyslurm (25.11) refuses Debian 12's Slurm 22.05 ("Slurm version mismatch"), so
on Debian 12 ``open_slurm_client`` keeps the command client. Where the versions match, this
backend saves a ``sacct --json`` subprocess and its JSON parsing per night. It uses the
``pyslurm.db`` API of pyslurm >= 23.2 (``JobFilter(start_time=, end_time=)``,
``Jobs.load(filter)``; job fields ``id``, ``name``, ``user_name``, ``account``, ``partition``,
``start_time``/``end_time`` in epoch seconds, ``array_id``/``array_task_id``,
``admin_comment``). The module is injected so the mapping can be checked without a build of
pyslurm here; no pyslurm release could be run against the Slurm on this project's machines.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from wattclass.errors import SlurmError
from wattclass.jobrecord import JobRecord
from wattclass.slurm.client import SlurmClient

#: Slurm's "no value" markers for 32-bit fields (array task id of a non-array job).
_NO_VAL = frozenset({0xFFFFFFFE, 0xFFFFFFFF})


class PySlurmClient(SlurmClient):
    """SlurmClient over ``pyslurm.db.Jobs.load`` (slurmdbd)."""

    def __init__(self, pyslurm_module: Any = None) -> None:
        if pyslurm_module is None:
            import pyslurm  # type: ignore[import-not-found,unused-ignore]

            pyslurm_module = pyslurm
        self._ps = pyslurm_module

    def jobs(self, start: dt.datetime, end: dt.datetime) -> list[JobRecord]:
        db = self._ps.db
        try:
            found = db.Jobs.load(db.JobFilter(start_time=int(start.timestamp()),
                                              end_time=int(end.timestamp())))
        except Exception as exc:  # pyslurm raises RPCError and friends
            raise SlurmError(f"pyslurm: loading jobs {start:%F %T} .. {end:%F %T} failed: {exc}") from exc
        return [self._record(j) for j in found]

    @staticmethod
    def _record(j: Any) -> JobRecord:
        job_id = str(j.id)
        array_id = getattr(j, "array_id", None)
        task = getattr(j, "array_task_id", None)
        if array_id and task is not None and task not in _NO_VAL:
            job_id = f"{array_id}_{task}"
        return JobRecord(
            job_id=job_id,
            name=_text(getattr(j, "name", None)),
            user=_text(getattr(j, "user_name", None)),
            account=_text(getattr(j, "account", None)),
            partition=_text(getattr(j, "partition", None)),
            start=_when(getattr(j, "start_time", None)),
            end=_when(getattr(j, "end_time", None)),
            admin_comment=_text(getattr(j, "admin_comment", None)),
        )


def _text(v: object) -> str | None:
    return None if v is None or v == "" else str(v)


def _when(v: object) -> dt.datetime | None:
    if isinstance(v, dt.datetime):
        return v if v.tzinfo else v.replace(tzinfo=dt.UTC)
    if isinstance(v, int | float) and v > 0:
        return dt.datetime.fromtimestamp(float(v), dt.UTC)
    return None
