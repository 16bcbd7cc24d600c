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
import logging
from collections.abc import Iterable
from typing import Any

from wattclass.errors import SlurmError
from wattclass.jobrecord import JobRecord, nodes_text
from wattclass.logsafe import clip
from wattclass.slurm.client import SlurmClient
from wattclass.slurm.commands import CommandSlurmClient

log = logging.getLogger(__name__)

#: Slurm's "no value" markers for 32-bit fields (array task id of a non-array job).
_NO_VAL = frozenset({0xFFFFFFFE, 0xFFFFFFFF})


class PySlurmClient(SlurmClient):
    """SlurmClient over ``pyslurm.db.Jobs.load`` (slurmdbd), plus live jobs from slurmctld."""

    name = "pyslurm"

    def __init__(self, pyslurm_module: Any = None, *, runs: CommandSlurmClient | None = None) -> None:
        """``runs``: the command client that lists a requeued job's runs (``sacct --duplicates``);
        default: Slurm's commands on PATH with the environment's SLURM_CONF."""
        if pyslurm_module is None:
            import pyslurm  # type: ignore[import-not-found,unused-ignore]

            pyslurm_module = pyslurm
        self._ps = pyslurm_module
        self._runs = runs if runs is not None else CommandSlurmClient()

    def describe(self) -> str:
        return f"pyslurm {getattr(self._ps, '__version__', '?')}"

    def jobs(self, start: dt.datetime, end: dt.datetime) -> list[JobRecord]:
        db = self._ps.db
        try:
            found = db.Jobs.load(db.JobFilter(start_time=int(start.timestamp()),
                                              end_time=int(end.timestamp())))
        except Exception as exc:  # pyslurm raises RPCError and friends
            raise SlurmError(f"pyslurm: loading jobs {start:%F %T} .. {end:%F %T} failed: {exc}") from exc
        pairs = [(j, r) for j in _values(found) if (r := _readable_record(j)) is not None]
        recs = [r for _, r in pairs]
        requeued = [r.slurm_job_id for j, r in pairs
                    if (getattr(j, "requeue_count", 0) or 0) > 0 and r.slurm_job_id]
        return self._with_runs(recs, requeued, start, end) if requeued else recs

    def _with_runs(self, recs: list[JobRecord], requeued: list[str], start: dt.datetime,
                   end: dt.datetime) -> list[JobRecord]:
        """``recs`` with each requeued job's one record (its last run) replaced by all its runs.

        Why: slurmdbd's job query keeps one record per id unless asked for duplicates, and
        pyslurm 25.11.2's JobFilter cannot ask; checked against its last run alone, a requeued
        job's earlier windows (another node, earlier) would be rejected. ``sacct --duplicates``
        for just those ids gives each run's nodes and times (same slurmdbd, same records). If it
        fails, the last run stays, with one WARNING naming the jobs whose earlier windows may be
        rejected."""
        try:
            runs = self._runs.job_runs(requeued, start, end)
        except SlurmError as exc:
            log.warning("pyslurm: %d requeued job(s) (e.g. %s): their earlier runs are unknown (%s); "
                        "windows of those runs may be rejected", len(requeued), requeued[0], exc)
            return recs
        by_id: dict[str, list[JobRecord]] = {}
        for run in runs:
            by_id.setdefault(run.slurm_job_id or run.job_id, []).append(run)
        wanted = set(requeued)  # a preempting site requeues thousands a day: no list scan per record
        out: list[JobRecord] = []
        for r in recs:
            mine = by_id.get(r.slurm_job_id or "") if r.slurm_job_id in wanted else None
            out.extend(mine or [r])  # sacct without the job (slurmdbd lagging): its last run
        return out

    def live_jobs(self) -> list[JobRecord]:
        """Jobs slurmctld still knows (pending, running, recently ended), from ``pyslurm.Jobs``."""
        try:
            found = self._ps.Jobs.load()
        except Exception as exc:
            raise SlurmError(f"pyslurm: loading live jobs failed: {exc}") from exc
        return [r for j in _values(found) if (r := _readable_record(j)) is not None]

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


class NotUtf8Error(ValueError):
    """A job's user, account or partition that pyslurm cannot decode (not UTF-8)."""


def _readable_record(j: Any) -> JobRecord | None:
    """``record(j)``, or None (logged) for a job whose user, account or partition is not UTF-8,
    as the jobs-file client skips such a record."""
    try:
        return record(j)
    except NotUtf8Error as exc:
        log.warning("pyslurm: %s; record skipped", exc)
        return None


def record(j: Any) -> JobRecord:
    """A pyslurm ``Job`` or ``db.Job`` as a JobRecord; array tasks as "123_4".

    pyslurm decodes Slurm's strings as strict UTF-8 when a field is read, so a job name in another
    encoding (a Slurm user's own bytes) raises UnicodeDecodeError there: such a name or admin
    comment is dropped (None, logged), as the jobs-file client drops it; any other text field that
    is not UTF-8 raises NotUtf8Error."""
    job_id = str(j.id)
    array_id = getattr(j, "array_id", None)
    task = getattr(j, "array_task_id", None)
    if array_id and task is not None and task not in _NO_VAL:
        job_id = f"{array_id}_{task}"
    text: dict[str, str | None] = {}
    bad = []
    for attr in ("name", "user_name", "account", "partition", "admin_comment"):
        try:
            text[attr] = _text(getattr(j, attr, None))
        except UnicodeDecodeError:
            text[attr] = None
            bad.append(attr)
    if bad:
        what = f"job {clip(job_id, 40)}: {' and '.join(bad)} not UTF-8"
        if not set(bad) <= {"name", "admin_comment"}:
            raise NotUtf8Error(what)
        log.warning("pyslurm: %s, dropped", what)
    return JobRecord(
        job_id=job_id,
        name=text["name"],
        user=text["user_name"],
        account=text["account"],
        partition=text["partition"],
        start=_when(getattr(j, "start_time", None)),
        end=_when(getattr(j, "end_time", None)),
        admin_comment=text["admin_comment"],
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
