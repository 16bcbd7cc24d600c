"""Cap records of shared GPUs: which jobs hold a physical GPU and what limit each allows.

Also where a job's GPU is a MIG instance: ``resolve_targets`` maps it to its parent GPU.

Power limits exist per physical GPU only, while Slurm shards, MPS and MIG instances put several
jobs on one (docs/shared-gpus.md). The Prolog/Epilog (``plugin.prolog``) keep one record per GPU
(``<state>/<gpu_uuid>.json``)::

    {"version": 2, "previous_w": 700.0, "jobs": {"41": 420.0, "42": null}, "set_w": 700.0, ...}

``jobs`` maps each job to the limit its decision allows (null: uncapped); the enforced limit is
the highest (``effective_limit``), so a neighbour never runs under a lower cap than its own
decision allows; ``previous_w`` is restored when the last job leaves. Version 1 records (one
``job_id``, written before shared GPUs) are read as a one-job record during an upgrade.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from wattclass.errors import ConfigError, DataError, GpuError, WattclassError
from wattclass.fsutil import atomic_write_text, ensure_trusted_dir
from wattclass.gpu.base import GpuBackend, GpuInfo
from wattclass.jobmap import jobs_on_gpu, remove_job_files
from wattclass.lockfile import held_flock

log = logging.getLogger("wattclass.plugin.prolog")

#: ``read_record`` of the Prolog: the record at a path, None if none, DataError if unusable.
RecordReader = Callable[[Path], "dict[str, Any] | None"]

#: Whether a job no longer holds GPUs on this node: True (ended, unknown to slurmctld, pending
#: or requeued, or running elsewhere), False (runs here), None (cannot tell: kept, as before the
#: check existed). ``CommandSlurmClient.job_ended`` with the node's name.
JobEnded = Callable[[str], "bool | None"]


def never_ended(_job_id: str) -> bool | None:
    return None


class Liveness:
    """``JobEnded`` asked once per job per hook run, within one time budget.

    The Prolog asks before it takes any GPU's lock (``ask``), so a slow slurmctld delays only
    this job's start, never a neighbour's hook waiting on the lock; and each other job costs one
    squeue whatever the number of GPUs it shares. Past ``budget_s`` the rest are unknown (kept).
    """

    def __init__(self, fn: JobEnded, budget_s: float = 5.0) -> None:
        self._fn = fn
        self._deadline = time.monotonic() + budget_s
        self._seen: dict[str, bool | None] = {}
        self._asked_at: dict[str, float] = {}
        #: Jobs whose files this hook run already removed (the Prolog's pass before any lock;
        #: ``register`` then drops them from a cap record without removing or logging again).
        self.dropped: set[str] = set()

    def __call__(self, job_id: str) -> bool | None:
        if job_id not in self._seen:
            self._asked_at[job_id] = time.time()
            self._seen[job_id] = self._fn(job_id) if time.monotonic() < self._deadline else None
        return self._seen[job_id]

    def asked_at(self, job_id: str) -> float | None:
        """When Slurm was asked about ``job_id`` (epoch seconds): files written since are newer
        than the answer (a requeued job back on this node) and are not removed on it."""
        return self._asked_at.get(job_id)

    def ask(self, job_ids: list[str]) -> None:
        for j in job_ids:
            self(j)


def drop_ended(jobs_dir: Path, where: str, job_ids: list[str], liveness: Liveness) -> list[str]:
    """``job_ids`` without the jobs that no longer hold GPUs on this node; their job files are
    removed from every GPU of the node.

    A job whose Epilog never ran (slurmd killed mid-job, node not rebooted) leaves its job files
    and its place in the GPU's cap record: as an uncapped neighbour it would keep every later
    job on that GPU uncapped. When Slurm cannot answer, the job is kept (fail-open, as before).
    """
    alive = []
    for j in job_ids:
        if liveness(j) is not True:
            alive.append(j)
        elif j not in liveness.dropped:
            liveness.dropped.add(j)
            log.warning("%s: job %s no longer runs on this node but left its files (no Epilog): "
                        "its job files and its place in any cap record are dropped", where, j)
            with contextlib.suppress(OSError):
                for problem in remove_job_files(jobs_dir, j, written_before=liveness.asked_at(j)):
                    log.warning("%s: job %s: left a job file: %s", where, j, problem)
    return alive


def record_jobs(rec: Mapping[str, Any]) -> dict[str, float | None]:
    """Job id -> the limit its decision allows (None: uncapped), from a version 2 record or a
    version 1 one (one job, written before shared GPUs; read during an upgrade)."""
    try:
        jobs = rec.get("jobs")
        if isinstance(jobs, dict):
            return {str(k): (float(v) if v is not None else None) for k, v in jobs.items()}
        if "job_id" in rec:
            return {str(rec["job_id"]): float(rec["set_w"]) if rec.get("set_w") is not None else None}
    except (TypeError, ValueError) as exc:
        raise DataError(f"cap record with a bad limit: {exc}") from exc
    return {}


def effective_limit(previous_w: float, jobs: Mapping[str, float | None]) -> float:
    """The highest limit any job on the GPU allows (an uncapped job allows the previous limit),
    never above the previous limit.

    A cap only ever lowers a GPU: a ``%`` cap is a share of the default limit and a ``W`` cap is
    watts, so on a GPU an administrator had set below its default (a site power budget: 500 W on
    a 700 W H200) ``80%`` (560 W) or ``compute`` at ``100%`` raised it for the job's length.
    """
    if not jobs:
        return previous_w
    return min(previous_w, max((previous_w if w is None else w) for w in jobs.values()))


@contextlib.contextmanager
def gpu_lock(record_path: Path) -> Iterator[None]:
    """Exclusive lock for one physical GPU's cap record (Prologs/Epilogs of jobs sharing it), on
    ``<record>.lock`` next to it (the record itself is replaced atomically, so it cannot hold one)."""
    path = Path(record_path).with_suffix(".lock")
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    with held_flock(path, os.O_RDWR | os.O_CREAT):
        yield


def write_record(path: Path, previous_w: float, jobs: Mapping[str, float | None], set_w: float) -> None:
    atomic_write_text(path, json.dumps({
        "version": 2, "previous_w": previous_w, "jobs": dict(jobs), "set_w": set_w,
        "written_at": time.time()}, sort_keys=True) + "\n", mode=0o644)


def usable_w(value: object) -> bool:
    """A recorded limit worth restoring: a positive, finite number (not a bool, string or null)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    return math.isfinite(value) and value > 0


def resolve_targets(backend: GpuBackend, slurm_gpus: str, gpu_map: Mapping[str, str],
                    on_error: Callable[[WattclassError], None] | None = None) -> list[tuple[str, GpuInfo]]:
    """(held UUID, physical GPU) behind SLURM_JOB_GPUS ("0,2"), matched by UUID or PCI bus id.

    A MIG instance (its ``MIG-`` UUID in the map: Slurm hands instances out as GPUs) is held by
    its own UUID (the telemetry daemon looks its job up by it) and capped on its parent GPU.
    ``on_error``: a GPU that cannot be resolved (not in the map, gone from the backend: fallen
    off the bus) is reported there and skipped, so the job's other GPUs are still handled;
    without it the first such GPU raises.
    """
    out = []
    for idx in (s.strip() for s in slurm_gpus.split(",") if s.strip()):
        try:
            if idx not in gpu_map:
                raise ConfigError(f"Slurm GPU {idx} is not in the GPU map")
            out.append(held_and_physical(backend, gpu_map[idx]))
        except WattclassError as exc:
            if on_error is None:
                raise
            on_error(exc)
    return out


def held_and_physical(backend: GpuBackend, key: str) -> tuple[str, GpuInfo]:
    """(the UUID a job holds, the physical GPU capped for it) behind ``key``, a GPU's or a MIG
    instance's UUID or a PCI bus id: an instance is held by its own UUID, capped on its parent."""
    mig = backend.find_mig(key)
    if mig is not None:
        return mig.uuid, next(g for g in backend.gpus() if g.gpu_index == mig.parent_index)
    g = backend.find_gpu(key)
    return g.uuid, g


def neighbours(backend: GpuBackend, jobs_dir: Path, g: GpuInfo, job_id: str) -> list[str]:
    """Other jobs the job map says hold GPU ``g`` (on the GPU itself or one of its MIG instances)."""
    uuids = [g.uuid, *(m.uuid for m in backend.mig_instances(g.gpu_index))]
    found = {a.job_id for u in uuids for a in jobs_on_gpu(jobs_dir, u)}
    found.discard(job_id)
    return sorted(found)


def apply_limit(backend: GpuBackend, g: GpuInfo, watts: float, why: str) -> None:
    """Set the limit if it differs (clamped to the GPU's range: a record may predate a change)."""
    if g.power_limit_min_w is not None:
        watts = max(watts, g.power_limit_min_w)
    if g.power_limit_max_w is not None:
        watts = min(watts, g.power_limit_max_w)
    current = backend.power_limit_w(g.gpu_index)
    if current is None or abs(current - watts) > 0.01:
        backend.set_power_limit_w(g.gpu_index, watts)
        log.info("%s: GPU %s %s W -> %.1f W", why, g.uuid, current, watts)


def register(backend: GpuBackend, g: GpuInfo, job_id: str, target: float | None,
             jobs_dir: Path, rec_path: Path, read_record: RecordReader,
             liveness: Liveness | None = None) -> dict[str, Any]:
    """Add the job to the GPU's cap record and enforce the highest allowed limit. ``job_id``: the
    job's display id ("123_4" for an array task), as the job map names it.

    An uncapped job joins only an existing record (nothing to protect it from otherwise); a capped
    one creates the record, first adding the job map's other jobs on the GPU as uncapped. Other
    jobs that Slurm says have ended (``liveness``; None: none have) are dropped from both first.
    """
    liveness = liveness if liveness is not None else Liveness(never_ended)
    ensure_trusted_dir(rec_path.parent)
    with gpu_lock(rec_path):
        try:
            old = read_record(rec_path)
            jobs = record_jobs(old) if old is not None else None
        except DataError as exc:  # unusable leftover: the GPU's default is the limit to go back to
            log.error("job %s: %s; recording the default limit instead", job_id, exc)
            old, jobs = {"previous_w": g.power_limit_default_w}, None
        if jobs is not None:
            others = [j for j in jobs if j != job_id]
            alive = set(drop_ended(jobs_dir, f"GPU {g.uuid}", others, liveness)) if others else set()
            jobs = {j: v for j, v in jobs.items() if j == job_id or j in alive}
        if old is None and target is None:
            return {"jobs": [job_id]}
        current = backend.power_limit_w(g.gpu_index)
        # A record whose jobs all left without an Epilog holds the true original limit: keep it.
        prev = old.get("previous_w") if old is not None else None
        previous = float(prev) if usable_w(prev) else current  # type: ignore[arg-type]
        if previous is None:
            raise GpuError(f"GPU {g.uuid}: no current power limit to record")
        if jobs is None:
            found = neighbours(backend, jobs_dir, g, job_id)
            jobs = dict.fromkeys(drop_ended(jobs_dir, f"GPU {g.uuid}", found, liveness) if found else [])
        jobs[job_id] = target
        limit = effective_limit(previous, jobs)
        write_record(rec_path, previous, jobs, limit)  # before touching the GPU
        apply_limit(backend, g, limit, f"job {job_id}")
    return {"effective_w": limit, "jobs": sorted(jobs)}


def leave_shared(backend: GpuBackend, g: GpuInfo, rec_path: Path, rec: Mapping[str, Any],
                  jobs: dict[str, float | None], job_id: str) -> None:
    """The job left a GPU other jobs still hold: enforce the highest limit they allow."""
    prev = rec.get("previous_w")
    previous = float(prev) if usable_w(prev) else g.power_limit_default_w  # type: ignore[arg-type]
    if previous is None:
        raise GpuError(f"GPU {g.uuid}: no usable record and no default limit")
    limit = effective_limit(previous, jobs)
    write_record(rec_path, previous, jobs, limit)
    apply_limit(backend, g, limit, f"job {job_id} left, {len(jobs)} job(s) remain")
