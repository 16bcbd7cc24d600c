"""Which Slurm job holds a GPU: the Prolog's job file first, then the GPU's process list.

The job file (``telemetry.jobmap``) is the cheap and authoritative path: a ``stat`` per GPU per
poll. Without one (no Prolog installed, or a job started before the daemon), the GPU's compute
processes are asked for (an NVML call, so only then) and each pid's environment is read from
``<proc_root>/<pid>/environ`` for SLURM_JOB_ID / SLURM_JOB_USER; array tasks become
``<array_job_id>_<task_id>`` (SLURM_ARRAY_JOB_ID / SLURM_ARRAY_TASK_ID), as sacct writes them.
Backends that know the job directly (replay) fill ``GpuProcess.job_id`` and skip /proc.

A process's environment is whatever its owner chose to put there: anyone can start a GPU
program with ``SLURM_JOB_ID=<your job> SLURM_JOB_USER=<you>``. So the claim is trusted only
when the process's owner (the uid owning ``/proc/<pid>``) is the claimed job user's uid (the
name resolved with ``pwd``); a mismatch, a missing or unknown user is logged once per process
and not booked to any job. The nightly run takes the user from Slurm's job record anyway.
"""

from __future__ import annotations

import logging
import pwd
from collections import Counter
from pathlib import Path

from wattclass.errors import GpuError
from wattclass.gpu.base import GpuBackend, GpuInfo, GpuProcess
from wattclass.jobmap import JobAssignment, JobMapReader

log = logging.getLogger(__name__)

Job = tuple[str, str | None]
#: Longest user-controlled string quoted in a log line.
LOG_CHARS = 64


def _short(text: str) -> str:
    return repr(text if len(text) <= LOG_CHARS else text[:LOG_CHARS] + "...")


def uid_of_user(name: str) -> int | None:
    """The uid of a user name (NSS: files, LDAP, sssd...), or None if there is no such user."""
    try:
        return pwd.getpwnam(name).pw_uid
    except (KeyError, UnicodeEncodeError, ValueError):
        return None


def trusted_job(pid: int, owner_uid: int, job: Job) -> bool:
    """True if a process of ``owner_uid`` may claim ``job`` (its owner is the job's user)."""
    job_id, user = job
    if user is None:
        log.warning("pid %d (uid %d) claims job %s without SLURM_JOB_USER: not trusted",
                    pid, owner_uid, _short(job_id))
        return False
    uid = uid_of_user(user)
    if uid is None or uid != owner_uid:
        why = "an unknown user" if uid is None else f"uid {uid}"
        log.warning("pid %d (uid %d) claims job %s of user %s (%s): not its owner, not trusted",
                    pid, owner_uid, _short(job_id), _short(user), why)
        return False
    return True


def parse_environ(raw: bytes) -> dict[str, str]:
    """Parse a NUL-separated /proc/<pid>/environ blob (only the SLURM_* entries)."""
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        if item.startswith(b"SLURM_"):
            k, _, v = item.partition(b"=")
            env[k.decode("ascii", "replace")] = v.decode("utf-8", "replace")
    return env


def job_from_environ(env: dict[str, str]) -> Job | None:
    """The Slurm job of a process environment, array tasks as ``123_4``; None outside Slurm."""
    array_id, task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    if array_id and task:
        job_id = f"{array_id}_{task}"
    else:
        job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or ""
    if not job_id:
        return None
    return job_id, env.get("SLURM_JOB_USER") or None


class Attributor:
    """Resolve the job on each GPU every poll, as cheaply as possible."""

    def __init__(self, backend: GpuBackend, jobmap: JobMapReader | None,
                 proc_root: Path = Path("/proc")) -> None:
        self.backend = backend
        self.jobmap = jobmap
        self.proc_root = Path(proc_root)
        self._pid_cache: dict[int, dict[int, Job | None]] = {}  # per GPU: pid -> job
        self.process_queries = 0  # how often the (costly) process list was needed

    def job_for(self, info: GpuInfo) -> Job | None:
        if self.jobmap is not None:
            try:
                a = self.jobmap.lookup(info.uuid)
            except OSError as exc:
                log.warning("job spool %s unreadable: %s", self.jobmap.spool, exc)
                a = None
            if a is not None:
                return a.job_id, a.user
        try:
            procs = self.backend.processes(info.gpu_index)
        except GpuError as exc:
            log.debug("GPU %d: no process list: %s", info.gpu_index, exc)
            return None
        self.process_queries += 1
        return self._from_processes(info.gpu_index, procs)

    def assignment_for(self, info: GpuInfo) -> JobAssignment | None:
        """The GPU's job file as the Prolog wrote it (label, account...), if any (cached)."""
        if self.jobmap is None:
            return None
        try:
            return self.jobmap.lookup(info.uuid)
        except OSError:
            return None

    def _from_processes(self, gpu: int, procs: list[GpuProcess]) -> Job | None:
        jobs: list[Job] = []
        live = set()
        cache = self._pid_cache.setdefault(gpu, {})
        for p in procs:
            if p.job_id:
                jobs.append((p.job_id, p.user))
                continue
            live.add(p.pid)
            if p.pid not in cache:
                cache[p.pid] = self._read_pid(p.pid)
            j = cache[p.pid]
            if j is not None:
                jobs.append(j)
        for pid in [q for q in cache if q not in live]:
            del cache[pid]  # pids get reused; forget the ones that left the GPU
        if not jobs:
            return None
        # Several jobs sharing a GPU (MPS, oversubscription): the one with most processes.
        return Counter(jobs).most_common(1)[0][0]

    def _read_pid(self, pid: int) -> Job | None:
        folder = self.proc_root / str(pid)
        try:
            owner_uid = folder.stat().st_uid
            raw = (folder / "environ").read_bytes()
            if folder.stat().st_uid != owner_uid:  # the pid was reused (setuid exec) in between
                return None
        except OSError as exc:  # gone already, or not root
            log.debug("pid %d: cannot read environ: %s", pid, exc)
            return None
        job = job_from_environ(parse_environ(raw))
        if job is None or not trusted_job(pid, owner_uid, job):
            return None
        return job
