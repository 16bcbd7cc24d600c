"""The job record: what every layer knows about a Slurm job, whichever client read it.

A contract shared by the Slurm clients (``wattclass.slurm``), the nightly run and the report, so it
lives in the foundation and imports nothing of wattclass.
"""

from __future__ import annotations

import datetime as dt
import re
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
    #: The nodes the job ran on, as Slurm writes them (a hostlist: ``gpu[01-04],login1``); None
    #: when unknown (an older jobs file, a job that never started: sacct's "None assigned").
    nodes: str | None = None


JOB_COLUMNS: tuple[str, ...] = JobRecord._fields


#: Most host names one job's hostlist may expand to (a bigger range is a broken record).
MAX_HOSTS = 100_000
#: Longest host name an expansion may produce (a DNS name's limit): past it, or past _MAX_DIGITS
#: digits in a range (Python refuses to parse past 4,300, and a zero-padded width multiplies
#: every name), a node list is a broken record, not one to build in memory.
MAX_HOST_CHARS = 253
_MAX_DIGITS = 18
#: Most bracket groups in one host name (Slurm's own hostlists have up to a few dimensions); each
#: is a recursion level of ``_expand``.
_MAX_GROUPS = 8
_RANGE = re.compile(rf"^(\d{{1,{_MAX_DIGITS}}})(?:-(\d{{1,{_MAX_DIGITS}}}))?$")


def _split_top(text: str) -> list[str]:
    """``text`` split at the commas outside brackets."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p for p in (q.strip() for q in parts) if p]


def _expand(item: str, budget: int) -> list[str] | None:
    """One hostlist item (``gpu[01-03,7]-ib``, brackets possibly repeated) as names, or None."""
    open_ = item.find("[")
    if open_ < 0:
        return None if "]" in item else [item]
    close = item.find("]", open_)
    if close < 0:
        return None
    head, body, tail = item[:open_], item[open_ + 1:close], item[close + 1:]
    rest = _expand(tail, budget) if tail else [""]
    if rest is None:
        return None
    out: list[str] = []
    for rng in body.split(","):
        m = _RANGE.match(rng.strip())
        if m is None:
            return None
        lo, hi = m.group(1), m.group(2) or m.group(1)
        width = len(lo) if lo.startswith("0") or len(lo) == len(hi) else 0
        if len(head) + max(width, len(hi)) + max(map(len, rest)) > MAX_HOST_CHARS:
            return None
        if int(hi) < int(lo) or (int(hi) - int(lo) + 1) * len(rest) + len(out) > budget:
            return None
        out.extend(f"{head}{n:0{width}d}{r}" for n in range(int(lo), int(hi) + 1) for r in rest)
    return out


def nodes_text(value: object) -> str | None:
    """A client's node list as JobRecord.nodes: None for nothing or sacct's "None assigned"."""
    text = str(value).strip() if value is not None else ""
    return None if not text or text.lower() == "none assigned" else text


def hostnames(nodelist: str | None) -> list[str] | None:
    """Slurm's hostlist expression as host names (``gpu[01-02],cpu1`` -> gpu01, gpu02, cpu1), in
    Python rather than ``scontrol show hostnames`` (one call per job for tens of thousands of
    jobs a night); None when it is missing or not a hostlist (sacct's "None assigned")."""
    if not nodelist or not nodelist.strip() or " " in nodelist.strip():
        return None
    out: list[str] = []
    for item in _split_top(nodelist.strip()):
        if item.count("[") > _MAX_GROUPS:
            return None
        names = _expand(item, MAX_HOSTS - len(out))
        if names is None:
            return None
        out.extend(names)
    return out or None
