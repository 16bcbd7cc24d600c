"""Which Slurm job holds a GPU: the Prolog's job file first, then the GPU's process list.

The job files (``wattclass.jobmap``, one per job per GPU) are the cheap and authoritative path:
a ``stat`` per GPU per poll. A GPU can hold several jobs (shards, MPS, MIG instances):
``jobs_for`` returns all of them and the daemon splits the GPU's energy (``telemetry.splitter``).
Without a file (no Prolog installed, or a job started before the daemon), the GPU's compute
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
from pathlib import Path

from wattclass.errors import GpuError
from wattclass.gpu.base import GpuBackend, GpuInfo, GpuProcess
from wattclass.jobmap import JobAssignment, JobMapReader, is_job_id

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
    if not is_job_id(job_id):  # the process's owner wrote it: a job id or nothing
        log.warning("a process claims job %s: not a Slurm job id, ignored", _short(job_id))
        return None
    return job_id, env.get("SLURM_JOB_USER") or None


_WARNED: set[tuple[int, str]] = set()


def backend_job(proc: GpuProcess) -> Job | None:
    """The job a backend names for a process (replay, file-state), as telemetry records it: a job
    id string, else None (logged). Why: a number (file-state ``"job_id": 7``) reached the rows,
    crashed the shared-GPU splitter and made Parquet refuse the segment (review finding)."""
    raw = proc.job_id
    job_id = str(raw) if isinstance(raw, int | str) and not isinstance(raw, bool) else ""
    if not is_job_id(job_id):
        said = (proc.pid, _short(repr(raw)))
        if said not in _WARNED:  # once per process and value, not every poll
            if len(_WARNED) > 1000:
                _WARNED.clear()
            _WARNED.add(said)
            log.warning("pid %d: the backend names job %s: not a Slurm job id, ignored", *said)
        return None
    return job_id, proc.user if isinstance(proc.user, str) and proc.user else None


class Attributor:
    """Resolve the job on each GPU every poll, as cheaply as possible."""

    def __init__(self, backend: GpuBackend, jobmap: JobMapReader | None,
                 proc_root: Path = Path("/proc")) -> None:
        self.backend = backend
        self.jobmap = jobmap
        self.proc_root = Path(proc_root)
        self._pid_cache: dict[int, dict[int, Job | None]] = {}  # per GPU: pid -> job
        self._uids: dict[str, int] = {}  # job id -> uid, from the Prolog's job files
        self.process_queries = 0  # how often the (costly) process list was needed

    def job_for(self, info: GpuInfo) -> Job | None:
        """The one job on the GPU; on a shared GPU the lowest job id (``jobs_for`` has all)."""
        jobs = self.jobs_for(info)
        return jobs[0] if jobs else None

    def jobs_for_uuid(self, uuid: str) -> list[Job]:
        """The jobs the Prolog files name for a GPU or MIG instance UUID (no process fallback)."""
        if self.jobmap is None:
            return []
        try:
            found = self.jobmap.jobs(uuid)
            for a in found:
                if a.uid is not None:
                    self._uids[a.job_id] = a.uid
            return [(a.job_id, a.user) for a in found]
        except OSError as exc:
            log.warning("job spool %s unreadable: %s", self.jobmap.spool, exc)
            return []

    def assignments_for_uuid(self, uuid: str) -> list[JobAssignment]:
        """The Prolog's job files of a GPU (or MIG instance) as written: label, account... (cached)."""
        if self.jobmap is None:
            return []
        try:
            return self.jobmap.jobs(uuid)
        except OSError:
            return []

    def jobs_for(self, info: GpuInfo) -> list[Job]:
        """Every job on the GPU, by job id: the Prolog files, else the GPU's processes."""
        jobs = self.jobs_for_uuid(info.uuid)
        if jobs:
            return jobs
        try:
            procs = self.backend.processes(info.gpu_index)
        except GpuError as exc:
            log.debug("GPU %d: no process list: %s", info.gpu_index, exc)
            return []
        self.process_queries += 1
        return self._from_processes(info.gpu_index, procs)

    def job_of_process(self, gpu: int, proc: GpuProcess) -> Job | None:
        """The Slurm job of one GPU process (backend's job id, else its /proc environment).

        On a shared GPU this decides whose share a process's utilisation raises, and a user
        controls their processes' environment: a process claiming a job whose Prolog file names
        another uid is not counted for it (else a user could shift energy onto a neighbour).
        """
        if proc.job_id:
            return backend_job(proc)
        cache = self._pid_cache.setdefault(gpu, {})
        if proc.pid not in cache:
            job = self._read_pid(proc.pid)
            uid = self._uids.get(job[0]) if job is not None else None
            if job is not None and uid is not None:
                try:
                    owner = (self.proc_root / str(proc.pid)).stat().st_uid
                except OSError:
                    owner = None
                if owner != uid:
                    log.warning("GPU %d: pid %d claims job %s of uid %d but runs as uid %s; not "
                                "counted for it", gpu, proc.pid, job[0][:40], uid, owner)
                    job = None
            cache[proc.pid] = job
        return cache[proc.pid]

    def forget_pids(self, gpu: int, live: set[int]) -> None:
        """Drop cached pids no longer on the GPU (pids get reused)."""
        cache = self._pid_cache.get(gpu, {})
        for pid in [q for q in cache if q not in live]:
            del cache[pid]

    def _from_processes(self, gpu: int, procs: list[GpuProcess]) -> list[Job]:
        jobs: list[Job] = []
        live = set()
        cache = self._pid_cache.setdefault(gpu, {})
        for p in procs:
            if p.job_id:
                job = backend_job(p)
                if job is not None:
                    jobs.append(job)
                continue
            live.add(p.pid)
            if p.pid not in cache:
                cache[p.pid] = self._read_pid(p.pid)
            j = cache[p.pid]
            if j is not None:
                jobs.append(j)
        for pid in [q for q in cache if q not in live]:
            del cache[pid]  # pids get reused; forget the ones that left the GPU
        # Several jobs sharing a GPU (MPS, oversubscription): all of them, by job id.
        return sorted(set(jobs), key=lambda j: j[0])

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
