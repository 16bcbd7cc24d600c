"""The job record: what every layer knows about a Slurm job, whichever client read it.

A contract shared by the Slurm clients (``wattclass.slurm``), the nightly run and the report, so it
lives in the foundation and imports nothing of wattclass.
"""

from __future__ import annotations

import datetime as dt
from typing import NamedTuple


class JobRecord(NamedTuple):
    """What wattclass needs to know about a Slurm job."""

    job_id: str  # array jobs as "123_4"
    name: str | None
    user: str | None
    account: str | None
    partition: str | None
    start: dt.datetime | None  # UTC
    end: dt.datetime | None  # UTC
    admin_comment: str | None = None
    gpus: int | None = None  # GPUs allocated (sacct tres gres/gpu); None when not accounted
    # Slurm's own unique id; differs from job_id for array tasks ("5" for "3_1"). slurmd gives the
    # Prolog no SLURM_ARRAY_* variables (22.05 and 25.11, recorded), so telemetry carries this one.
    slurm_job_id: str | None = None


JOB_COLUMNS: tuple[str, ...] = JobRecord._fields
