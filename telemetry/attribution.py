"""Which Slurm job holds a GPU: the Prolog's job file first, then the GPU's process list.

The job file (``telemetry.jobmap``) is the cheap and authoritative path: a ``stat`` per GPU per
poll. Without one (no Prolog installed, or a job started before the daemon), the GPU's compute
processes are asked for (an NVML call, so only then) and each pid's environment is read from
``<proc_root>/<pid>/environ`` for SLURM_JOB_ID / SLURM_JOB_USER; array tasks become
``<array_job_id>_<task_id>`` (SLURM_ARRAY_JOB_ID / SLURM_ARRAY_TASK_ID), as sacct writes them.
Backends that know the job directly (replay) fill ``GpuProcess.job_id`` and skip /proc.
"""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path

from wattclass.errors import GpuError
from wattclass.gpu.base import GpuBackend, GpuInfo, GpuProcess
from wattclass.jobmap import JobAssignment, JobMapReader

log = logging.getLogger(__name__)

Job = tuple[str, str | None]


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
        try:
            raw = (self.proc_root / str(pid) / "environ").read_bytes()
        except OSError as exc:  # gone already, or not root
            log.debug("pid %d: cannot read environ: %s", pid, exc)
            return None
        return job_from_environ(parse_environ(raw))
