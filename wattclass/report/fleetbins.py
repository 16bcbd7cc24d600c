"""The report's fleet view: the fleet's energy per time bin and label, drawn above ``max_gpus``
GPUs instead of one strip per GPU.

Why its own module: the bins are chosen before the report's one scan (``report.data``), from
what the files' ``date=`` days allow, so that scan also bins every window; afterwards the bins
are added up, merged, or (rarely) the windows read again. The bins are round widths on the UTC
clock, each a multiple of the narrower ones, so a window of 10, 30 or 60 s falls wholly in one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd


class Scan(Protocol):
    """What the fleet view needs of ``report.data``'s scan: the files or DataFrame it reads, its
    DuckDB connection (with the ``w`` view of valid windows and the ``fine`` table of sums)."""

    files: list[Path]
    from_windows: bool
    con: Any

    def df(self, sql: str) -> pd.DataFrame: ...

    def col(self, name: str, sql_type: str = "DOUBLE") -> str: ...


#: About this many bins in the fleet view over the span (a day: 5 min; 30 days: 3 h).
FLEET_BINS = 288
#: The fleet bins' widths (s), each a multiple of the one before, then days doubling: round clock
#: times that windows of 10, 30 or 60 s fill evenly (a bin of a width no whole number of windows
#: long holds one window more every few bins: stripes).
_NICE_S = (1, 2, 10, 30, 60, 300, 600, 1800, 3600, 10800, 21600, 43200, 86400)


def nice_width_s(span_s: float) -> float:
    """The shortest width of ``_NICE_S`` (then 2, 4, 8... days) splitting ``span_s`` into at most
    FLEET_BINS bins."""
    want = max(span_s, 1.0) / FLEET_BINS
    w = next((x for x in _NICE_S if x >= want), _NICE_S[-1])
    while w < want:
        w *= 2
    return float(w)


def bin_sql(width_s: float) -> str:
    """The fleet bin of a window's midpoint, ``width_s`` bins on the UTC clock (epoch 0 starts one)."""
    return f"CAST(floor((epoch_ms(ts_start) + epoch_ms(ts_end)) / {2000.0 * width_s!r}) AS BIGINT)"


def grain_s(src: Scan) -> float | None:
    """The fleet bins' width, chosen before the scan so that the one pass over the windows also
    bins them: from the span of a DataFrame's valid windows, or of the files' ``date=`` days (a
    window lies within its day, ``rowsql``); None where neither is known (a second pass bins them)."""
    from wattclass.classifier import rowsql

    if src.from_windows:
        # The valid windows' span, in DuckDB: pandas raised its own KeyError or DateParseError (a
        # traceback) for a DataFrame without ts_end or with text times, where the scan's DuckDB
        # error is the report's DataError; and the rejected rows no longer stretch the grain.
        span = src.con.execute("SELECT epoch(max(ts_end)) - epoch(min(ts_start)) FROM w").fetchone()
        return nice_width_s(float(span[0])) if span is not None and span[0] is not None else None
    days = [rowsql.partition_day_ms(f) for f in src.files]
    known = [d for d in days if d is not None]
    if not known or len(known) < len(days):
        return None
    return nice_width_s((max(known) - min(known)) / 1000.0 + 86400.0)


def fleet(src: Scan, jobs: pd.DataFrame, grain_s: float | None, t0: pd.Timestamp, t1: pd.Timestamp
          ) -> tuple[pd.DataFrame, float, pd.Timestamp]:
    """The fleet's energy per time bin and label (the view that stays readable at 1,000 GPUs):
    (bin, label, energy_j), the bin width, where bin 0 starts.

    Each window's energy goes to the bin of its midpoint; bins are ``nice_width_s`` of the span
    long, on the UTC clock (5 min for a day, 3 h for 30 days). The main scan binned the windows
    by ``grain_s``: those bins are used, merged where the span turned out much longer; only where
    the data covers much less than its days (fewer than a quarter of the bins) and its own width
    is shorter than the grain, or no grain was known, are the windows read again. (Coverage
    alone read 5 h of a day's data a second time into the very same 5-minute bins.)"""
    span_s = (t1 - t0).total_seconds()
    width = nice_width_s(span_s)
    if grain_s is not None and (span_s / grain_s >= FLEET_BINS / 4 or width >= grain_s):
        # the grain's bins unless they come out far more than FLEET_BINS (a day's windows ending a
        # few seconds past midnight must not double a day's 5 minutes); a wider nice width is a
        # multiple of the grain (_NICE_S), so its bins are the grain's merged
        width = grain_s if span_s / grain_s <= FLEET_BINS * 1.25 else width
        df = src.df("SELECT _fb, job_id, sum(energy_j) AS energy_j FROM fine WHERE _bad = 0 GROUP BY ALL")
        df["_fb"] = np.floor_divide(df["_fb"].to_numpy(np.int64), round(width / grain_s))
    else:
        df = src.df(f"SELECT {bin_sql(width)} AS _fb, CAST(job_id AS VARCHAR) AS job_id, "
                    f"sum({src.col('energy_j')}) AS energy_j FROM w GROUP BY ALL")
    label = df["job_id"].map(jobs.set_index("job_id")["label"]).fillna("unlabelled")
    df["label"] = label.where(df["job_id"].notna(), "no job")
    df["energy_j"] = df["energy_j"].astype(float).fillna(0.0)
    out = df.groupby(["_fb", "label"])["energy_j"].sum().reset_index()
    first = int(out["_fb"].min()) if len(out) else 0
    out["bin"] = out["_fb"] - first
    start = pd.Timestamp(first * width, unit="s", tz="UTC")
    return out[["bin", "label", "energy_j"]].sort_values(["bin", "label"], ignore_index=True), width, start
