"""Cap records of shared GPUs: which jobs hold a physical GPU and what limit each allows.

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
import fcntl
import json
import os
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from wattclass.errors import DataError
from wattclass.fsutil import atomic_write_text


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
    """The highest limit any job on the GPU allows; an uncapped job allows the previous limit."""
    return max((previous_w if w is None else w) for w in jobs.values()) if jobs else previous_w


@contextlib.contextmanager
def gpu_lock(record_path: Path) -> Iterator[None]:
    """Exclusive lock for one physical GPU's cap record (Prologs/Epilogs of jobs sharing it), on
    ``<record>.lock`` next to it (the record itself is replaced atomically, so it cannot hold one)."""
    path = Path(record_path).with_suffix(".lock")
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def write_record(path: Path, previous_w: float, jobs: Mapping[str, float | None], set_w: float) -> None:
    atomic_write_text(path, json.dumps({
        "version": 2, "previous_w": previous_w, "jobs": dict(jobs), "set_w": set_w,
        "written_at": time.time()}, sort_keys=True) + "\n", mode=0o644)
