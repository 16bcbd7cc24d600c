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


JOB_COLUMNS: tuple[str, ...] = JobRecord._fields
