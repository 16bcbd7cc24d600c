"""Job records through pyslurm, for sites whose pyslurm build matches their Slurm.

Optional (``pip install 'wattclass[pyslurm]'`` against the site's Slurm, docs/slurm.md): PyPI's
pyslurm 25.11 only works with Slurm 25.11, so on Debian 12 (22.05) ``open_slurm_client`` keeps the
command client. Where the versions match, this backend saves a ``sacct --json`` subprocess and
its JSON parsing per night (figures in docs/benchmarks.md). Tested against a live Slurm 25.11.7
cluster with slurmdbd (tests/test_slurm_accounting.py, marker ``pyslurm``): for the same jobs its
records equal the command client's.

pyslurm 25.11 API used: ``pyslurm.db.Jobs.load(pyslurm.db.JobFilter(start_time=, end_time=))``
(slurmdbd; a dict-like {job_id: db.Job}), ``pyslurm.Jobs.load()`` / ``pyslurm.Job.load(id)``
(slurmctld's live jobs). Job fields: ``id``, ``name``, ``user_name``, ``account``, ``partition``,
``start_time``/``end_time`` (epoch seconds, 0 = not yet), ``array_id``/``array_task_id``,
``admin_comment``, ``allocated_tres.gres`` / ``gpus`` for the GPU count.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from typing import Any

from wattclass.errors import SlurmError
from wattclass.jobrecord import JobRecord, nodes_text
from wattclass.slurm.client import SlurmClient

#: Slurm's "no value" markers for 32-bit fields (array task id of a non-array job).
_NO_VAL = frozenset({0xFFFFFFFE, 0xFFFFFFFF})


class PySlurmClient(SlurmClient):
    """SlurmClient over ``pyslurm.db.Jobs.load`` (slurmdbd), plus live jobs from slurmctld."""

    name = "pyslurm"

    def __init__(self, pyslurm_module: Any = None) -> None:
        if pyslurm_module is None:
            import pyslurm  # type: ignore[import-not-found,unused-ignore]

            pyslurm_module = pyslurm
        self._ps = pyslurm_module

    def describe(self) -> str:
        return f"pyslurm {getattr(self._ps, '__version__', '?')}"

    def jobs(self, start: dt.datetime, end: dt.datetime) -> list[JobRecord]:
        db = self._ps.db
        try:
            found = db.Jobs.load(db.JobFilter(start_time=int(start.timestamp()),
                                              end_time=int(end.timestamp())))
        except Exception as exc:  # pyslurm raises RPCError and friends
            raise SlurmError(f"pyslurm: loading jobs {start:%F %T} .. {end:%F %T} failed: {exc}") from exc
        return [record(j) for j in _values(found)]

    def live_jobs(self) -> list[JobRecord]:
        """Jobs slurmctld still knows (pending, running, recently ended), from ``pyslurm.Jobs``."""
        try:
            found = self._ps.Jobs.load()
        except Exception as exc:
            raise SlurmError(f"pyslurm: loading live jobs failed: {exc}") from exc
        return [record(j) for j in _values(found)]

    def live_job(self, job_id: str) -> JobRecord | None:
        """One live job from slurmctld, or None if it does not know the id."""
        if not str(job_id).isdigit():
            raise SlurmError(f"pyslurm: invalid job id {job_id!r}")
        try:
            return record(self._ps.Job.load(int(job_id)))
        except Exception as exc:
            if "Invalid job id" in str(exc):
                return None
            raise SlurmError(f"pyslurm: loading job {job_id} failed: {exc}") from exc


def _values(found: Any) -> Iterable[Any]:
    """pyslurm's collections are dicts {job_id: Job}; a plain list is taken as it is."""
    return list(found.values()) if hasattr(found, "values") else list(found)


def record(j: Any) -> JobRecord:
    """A pyslurm ``Job`` or ``db.Job`` as a JobRecord; array tasks as "123_4"."""
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
        gpus=_gpus(j),
        slurm_job_id=str(j.id),
        # db.Job.nodelist (slurmdbd), Job.allocated_nodes (slurmctld): the same hostlist as sacct's
        nodes=nodes_text(getattr(j, "nodelist", None) or getattr(j, "allocated_nodes", None)),
    )


def _gpus(j: Any) -> int | None:
    """Allocated GPUs: ``allocated_tres.gres["gpu"].count`` (db.Job and Job), else None."""
    tres = getattr(j, "allocated_tres", None)
    gres = getattr(tres, "gres", None) if tres is not None else None
    if not gres:
        return None
    try:
        gpu = gres.get("gpu") if hasattr(gres, "get") else None
    except Exception:  # a TRES collection without dict semantics
        return None
    count = getattr(gpu, "count", None) if gpu is not None else None
    return int(count) if isinstance(count, int | float) else None


def _text(v: object) -> str | None:
    return None if v is None or v == "" else str(v)


def _when(v: object) -> dt.datetime | None:
    if isinstance(v, dt.datetime):
        return v if v.tzinfo else v.replace(tzinfo=dt.UTC)
    if isinstance(v, int | float) and v > 0:
        return dt.datetime.fromtimestamp(float(v), dt.UTC)
    return None
