"""The day's Slurm job records as the nightly scan checks job windows against them.

Why: the daemon books a GPU's windows on the job named by the Prolog's job file or, without one,
by the GPU processes' ``SLURM_JOB_ID`` (telemetry/attribution.py), which the job's user sets.
A user could thus book their own GPU's windows on another user's job, or on a job of theirs that
ran elsewhere or earlier, and change that job's label and with it the caps of the jobs keyed like
it. Where Slurm has the job's record, the scan rejects a window from a host the job did not run
on, outside its start..end (+- ``validity.JOB_TIME_SLACK_S``) or of another user than the
record's (``rowsql.job_check_sql``). A job without a record is not checked (a site without
slurmdbd, a job older than the records fetched): its windows count as the daemon booked them, and
it keeps no user (``nightly._join_slurm``), so it adds no user-keyed entry to the label table.
"""

from __future__ import annotations

import logging
import math

import pandas as pd
import pyarrow as pa

from wattclass.jobrecord import hostnames, nodes_text
from wattclass.logsafe import clip

log = logging.getLogger(__name__)


def index_records(recs: pd.DataFrame) -> pd.DataFrame:
    """Job records (``SlurmClient.jobs_frame``) indexed by the job id telemetry names them by.

    Telemetry names an array task by Slurm's own id ("5"; the Prolog sees no SLURM_ARRAY_*), the
    records by "3_1": each record is indexed under both, the array name winning a clash; of two
    records of one id (a requeued job's runs) the last is kept, with all runs' nodes and span for
    the check (``_all_runs``)."""
    recs = _all_runs(recs).drop_duplicates("job_id", keep="last")
    alias = recs[recs["slurm_job_id"].notna() & (recs["slurm_job_id"] != recs["job_id"])]
    alias = alias[~alias["slurm_job_id"].isin(recs["job_id"])].assign(job_id=alias["slurm_job_id"])
    return pd.concat([recs, alias]).drop_duplicates("job_id", keep="first").set_index("job_id")


def _all_runs(recs: pd.DataFrame) -> pd.DataFrame:
    """``recs`` with ``check_nodes``, ``check_start``, ``check_end``: per job id, the nodes of all
    its records (None if one run's are unknown), the first start and the last end (None if one
    run has none: still running).

    Why: a requeued job keeps its id and runs again, elsewhere and later (``sacct --json`` lists
    each run: REQUEUED, then the next; 22.05 recorded, 25.11 with ``--duplicates``, which both
    clients ask for, docs/slurm.md); checked against its last run alone, the windows of the runs
    before it would be rejected (and the job blamed in the log). The name, user and times the
    labels carry stay the last record's."""
    nodes = recs["nodes"] if "nodes" in recs.columns else pd.Series(None, index=recs.index, dtype=object)
    out = recs.assign(check_nodes=nodes, check_start=recs["start"], check_end=recs["end"])
    dup = recs["job_id"].duplicated(keep=False)
    if not dup.any():
        return out
    for _, rows in out[dup].groupby("job_id", sort=False):
        lists = [n for n in rows["check_nodes"] if isinstance(n, str) and n.strip()]
        starts = pd.to_datetime(rows["start"], utc=True)
        ends = pd.to_datetime(rows["end"], utc=True)
        out.loc[rows.index, "check_nodes"] = ",".join(lists) if len(lists) == len(rows) else None
        out.loc[rows.index, "check_start"] = starts.min()
        out.loc[rows.index, "check_end"] = None if ends.isna().any() else ends.max()
    return out


def _ms(col: pd.Series) -> list[int | None]:
    """Epoch ms of each time (None: none); not through nanoseconds, which end in 2262 (a jobs
    file may say 9999)."""
    t = pd.to_datetime(col, utc=True)
    return [None if pd.isna(v) else math.floor(v.timestamp() * 1000) for v in t]


def job_records_table(recs: pd.DataFrame) -> pa.Table:
    """``index_records``' frame as the scan's job table: job_id, hosts (None: unknown), t0_ms and
    t1_ms (the start of its first run and the end of its last, epoch ms; None: unknown, or still
    running), user."""
    nodes = recs["check_nodes"]
    hosts = [hostnames(n) if isinstance(n, str) else None for n in nodes]
    _warn_broken_nodes(recs.index, nodes, hosts)
    return pa.table({
        "job_id": pa.array([str(j) for j in recs.index], pa.string()),
        "hosts": pa.array(hosts, pa.list_(pa.string())),
        "t0_ms": pa.array(_ms(recs["check_start"]), pa.int64()),
        "t1_ms": pa.array(_ms(recs["check_end"]), pa.int64()),
        "user": pa.array([u if isinstance(u, str) and u else None for u in recs["user"]], pa.string()),
    })


def _warn_broken_nodes(job_ids: pd.Index, nodes: pd.Series, hosts: list[list[str] | None]) -> None:
    """One warning for the records whose node list is given but is no hostlist (or too big):
    their windows' hosts go unchecked, which must not pass unnoticed (ids and lists clipped)."""
    broken = [(j, n) for j, n, h in zip(job_ids, nodes, hosts, strict=True)
              if h is None and isinstance(n, str) and nodes_text(n) is not None]
    if broken:
        j, n = broken[0]
        log.warning("%d job record(s) with a node list that is not a Slurm hostlist (or names more than "
                    "the expander builds), e.g. job %s: %s; their windows' hosts are not checked",
                    len(broken), clip(j, 40), clip(n, 80))
