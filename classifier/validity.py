"""What the nightly run accepts as telemetry: the one place for the input rules.

Whatever engine scans the files (pyarrow batches today, perhaps DuckDB later), these rules decide
what counts, and their counts go into the night's summary so that nothing is dropped silently:

- **Files** (``SkipReason``): a file Parquet cannot read, or one that lacks a required column
  (``schema.REQUIRED_COLUMNS``) or holds a column of a type that does not cast to the schema's, is
  skipped with a warning naming it and the reason; the rest of
  the night counts. A bad file is one host's problem, not a reason to label nobody.
- **Impossible rows** (``impossible_rows``): a null ``ts_start``, ``ts_end`` or ``gpu_uuid`` (a
  window nowhere in time or on no GPU; it would crash the features), ``ts_end <= ts_start`` (a
  backwards or empty window would shrink GPU-hours), a window longer than ``MAX_WINDOW_S`` (one
  would inflate them), ``energy_j`` negative, NaN or infinite (null
  is allowed: the counter may be unsupported), or a power beyond ``MAX_GPU_POWER_W``
  (``power_avg_w``, ``power_max_w``, or ``energy_j`` over the window's duration, at least
  ``ENERGY_SPAN_FLOOR_S``: a row's energy covers the poll intervals that start in it, so it may
  reach one interval past its end). Rejected, counted per reason.
- **Windows outside their day** (``REJECT_DAY``): ``ts_start`` more than ``PARTITION_SLACK_S``
  outside the UTC day of the file's ``date=`` partition (a wrong clock, a misfiled file);
  rejected and counted. Files outside a ``date=`` folder are not checked.
- **Job attribution** (nightly, where Slurm has the job's record): a window from a host the job
  did not run on, outside its start..end (+- ``JOB_TIME_SLACK_S``) or of another user than the
  record's is rejected, counted per reason and logged with job id and host.
- **Duplicate windows** (``Deduplicator``): one GPU's window for one job is one row; a second
  row with the same ``(gpu_uuid, ts_start, job_id)`` (a file copied into another partition or
  under another name; Prometheus imports over overlapping spans) is dropped and counted. The scan
  keeps the copy of the first file by path (then the first in that file), and counts apart the
  dropped copies whose values differ from the kept one (``conflicting_duplicates``).
  The engine applies it over every file one unit of work reads (all files of a night on the
  default local engine with one worker; per chunk of ``engine.CHUNK_FILES`` files otherwise).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

log = logging.getLogger("wattclass.classifier")

#: No GPU draws more (H200: 700 W, B200: 1,000 W, GB300: 1,400 W); a row above it is a bad reading.
MAX_GPU_POWER_W = 3000.0

#: The shortest time the energy test holds a row's energy to MAX_GPU_POWER_W over: the row's
#: length, but at least one default window period. Why: the daemon gives each poll interval to the
#: row its start poll lies in (telemetry/windows.py), so a row's energy may cover one interval past
#: its ``ts_end``: a poll (1 s by default), up to ``split_gap_s`` (2.5 polls) after missed polls,
#: a scrape interval for the Prometheus importer. Where samples are off the window grid (replays of
#: recordings, the importer's scrapes; the live daemon polls on whole seconds), a job that starts
#: 0.08 s of a sample before a window boundary gets a row of 0.08 s holding that sample's whole
#: interval (the H200 replays: 16 rows of 0.01-0.21 s, 119-697 J, 3.2-47 kW over their length);
#: over its length alone such a row was rejected and its job's energy lost. A full 10 s row keeps
#: the bound it always had (30 kJ); a shorter one may hold up to that, which no poll or scrape
#: interval of a real GPU reaches, while a counter glitch (a wrap, a driver reload: terajoules) is
#: still rejected. ``power_avg_w`` (the daemon's: energy over the time it covers) is held to
#: MAX_GPU_POWER_W as it is.
ENERGY_SPAN_FLOOR_S = 10.0

#: Reasons a file is skipped (keys of the summary's ``skipped_files`` counts).
SKIP_UNREADABLE = "unreadable"
SKIP_MISSING_COLUMN = "missing required column"
SKIP_BAD_TYPE = "bad column type"
SKIP_REFUSED = "refused"  # not a regular file, a symlink, or (as root) others can write it

#: Reasons a row is rejected (keys of the summary's ``rejected_rows``).
REJECT_NULL = "ts_start, ts_end or gpu_uuid null"
REJECT_TIME = "ts_end <= ts_start"
REJECT_ENERGY = "energy_j negative, NaN or infinite"
REJECT_POWER = f"power above {MAX_GPU_POWER_W:g} W"

#: The longest window a row may span. No writer makes a window longer than its period (the
#: daemon's 10 s by default, a Prometheus import's ``--period`` of a few minutes at most), and a
#: job change splits it. Why: only ``ts_start`` was held to its day, so one row whose ``ts_end``
#: a clock step or a damaged file put a year later added 8,760 GPU-hours to its job (and ended it
#: then), with its energy spread to near zero watts, and nothing in the summary said so.
MAX_WINDOW_S = 3600
REJECT_LONG = f"window longer than {MAX_WINDOW_S} s"

#: How far a window's ``ts_start`` may lie outside the UTC day of the ``date=D`` partition its file
#: sits in. The daemon and the Prometheus importer file a window under its own ``ts_start``'s UTC
#: date (telemetry/sink.py), so a window that straddles midnight is in the day it starts in and
#: a correct file has none outside; the slack admits a writer that files by the window's end
#: and windows of a few minutes (the importer's ``--period``). Farther out is a node with a wrong
#: clock or a file copied into the wrong folder: its windows would count for a job in a day it
#: did not run in.
PARTITION_SLACK_S = 300
REJECT_DAY = f"ts_start more than {PARTITION_SLACK_S} s outside its date= partition's day"

#: How far a window may reach past its job's Slurm start..end and still count for it: the
#: daemon's windows are 10 s, aligned to the period (the first may start before the job, the last
#: end after it), and a node's clock may be off slurmctld's by some seconds.
JOB_TIME_SLACK_S = 60
#: Windows attributed to a job whose Slurm record contradicts them (nightly only: the checks need
#: the day's job records). The job id is the daemon's attribution (a Prolog job file, else the
#: GPU processes' SLURM_JOB_ID, which the job's user controls), so a user could book their GPU's
#: windows on another job and change that job's label, and its cap.
REJECT_JOB_HOST = "job not on this host (Slurm record)"
REJECT_JOB_TIME = f"outside the job's start..end +- {JOB_TIME_SLACK_S} s (Slurm record)"
REJECT_JOB_USER = "user not the job's (Slurm record)"

#: Columns the rules read (the engines must scan them).
RULE_INPUT_COLUMNS: tuple[str, ...] = ("gpu_uuid", "ts_start", "ts_end", "job_id", "energy_j",
                                       "power_avg_w", "power_max_w")

_MAX_LISTED = 20  # files named in a summary; the counts stay exact


@dataclass
class InputReport:
    """What the rules dropped; mergeable across units of work (chunk order)."""

    skipped_files: dict[str, str] = field(default_factory=dict)  # path -> reason
    duplicate_windows: int = 0
    #: of those, copies whose values (the label's inputs) differ from the kept copy's
    conflicting_duplicates: int = 0
    rejected_rows: dict[str, int] = field(default_factory=dict)  # reason -> rows

    def skip(self, path: Path, reason: str, detail: str) -> None:
        log.warning("skipping telemetry file %s (%s): %s", path, reason, detail[:300])
        self.skipped_files[str(path)] = f"{reason}: {detail[:200]}"

    def merge(self, other: InputReport) -> None:
        self.skipped_files.update(other.skipped_files)
        self.duplicate_windows += other.duplicate_windows
        self.conflicting_duplicates += other.conflicting_duplicates
        for k, v in other.rejected_rows.items():
            self.rejected_rows[k] = self.rejected_rows.get(k, 0) + v

    def summary(self) -> dict[str, Any]:
        """The night-summary fields: counts always, the first files by name with their reasons."""
        by_reason: dict[str, int] = {}
        for why in self.skipped_files.values():
            key = why.split(":", 1)[0]
            by_reason[key] = by_reason.get(key, 0) + 1
        listed = dict(sorted(self.skipped_files.items())[:_MAX_LISTED])
        return {"skipped_files": {"count": len(self.skipped_files), "by_reason": by_reason,
                                  "files": listed},
                "duplicate_windows": self.duplicate_windows,
                "conflicting_duplicates": self.conflicting_duplicates,
                "rejected_rows": {"count": sum(self.rejected_rows.values()), **self.rejected_rows}}


def _f64(table: pa.Table, name: str) -> np.ndarray:
    if name not in table.column_names:
        return np.full(table.num_rows, np.nan)
    return np.asarray(pc.cast(table.column(name), pa.float64()).to_numpy(zero_copy_only=False),
                      dtype=np.float64)


def _ms(table: pa.Table, name: str) -> np.ndarray:
    """Milliseconds since 1970; a null reads as 0 (``impossible_rows`` rejects it by its own rule)."""
    col = table.column(name)
    if pa.types.is_timestamp(col.type):
        col = pc.cast(pc.cast(col, pa.timestamp("ms", tz="UTC")), pa.int64())
    return np.asarray(pc.fill_null(col, 0).to_numpy(zero_copy_only=False), dtype=np.int64)


def _null(table: pa.Table, name: str) -> np.ndarray:
    if name not in table.column_names:
        return np.ones(table.num_rows, dtype=bool)
    return np.asarray(pc.is_null(table.column(name)).to_numpy(zero_copy_only=False), dtype=bool)


def impossible_rows(table: pa.Table) -> dict[str, np.ndarray]:
    """Per reason, a boolean mask of the rows that break it (a row may break several)."""
    start, end = _ms(table, "ts_start"), _ms(table, "ts_end")
    energy = _f64(table, "energy_j")  # null -> NaN here; told apart below
    valid_energy = (pc.is_valid(table.column("energy_j")).to_numpy(zero_copy_only=False)
                    if "energy_j" in table.column_names else np.zeros(table.num_rows, dtype=bool))
    null_key = _null(table, "ts_start") | _null(table, "ts_end") | _null(table, "gpu_uuid")
    bad_time = (end <= start) & ~null_key
    too_long = (end - start > MAX_WINDOW_S * 1000) & ~null_key
    with np.errstate(invalid="ignore"):
        bad_energy = valid_energy & ~(np.isfinite(energy) & (energy >= 0))
        dur_s = np.where(bad_time | too_long | null_key, np.nan, (end - start) / 1000.0)
        mean_w = np.where(valid_energy & ~bad_energy, energy / np.maximum(dur_s, ENERGY_SPAN_FLOOR_S), np.nan)
        too_much = np.zeros(table.num_rows, dtype=bool)
        for p in (_f64(table, "power_avg_w"), _f64(table, "power_max_w"), mean_w):
            too_much |= np.nan_to_num(p, nan=0.0, posinf=np.inf) > MAX_GPU_POWER_W
    return {REJECT_NULL: null_key, REJECT_TIME: bad_time, REJECT_LONG: too_long, REJECT_ENERGY: bad_energy,
            REJECT_POWER: too_much}


class Deduplicator:
    """Remembers the ``(gpu_uuid, job_id, ts_start)`` keys seen; ``first_seen`` masks repeats."""

    _TS_BITS = 42  # ms since 1970 fit until 2109

    def __init__(self) -> None:
        self._codes: dict[tuple[str, str | None], int] = {}
        self._seen = np.zeros(0, dtype=np.int64)

    def first_seen(self, table: pa.Table) -> np.ndarray:
        if table.num_rows == 0:
            return np.zeros(0, dtype=bool)
        g = pc.dictionary_encode(pc.cast(table.column("gpu_uuid").combine_chunks(), pa.string()))
        j = pc.dictionary_encode(pc.cast(table.column("job_id").combine_chunks(), pa.string()))
        g_idx = np.asarray(g.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
        j_idx = np.asarray(pc.fill_null(j.indices, -1).to_numpy(zero_copy_only=False), dtype=np.int64)
        local = g_idx * (len(j.dictionary) + 1) + (j_idx + 1)
        uniq, inverse = np.unique(local, return_inverse=True)
        g_names, j_names = g.dictionary.to_pylist(), j.dictionary.to_pylist()
        codes = np.asarray([
            self._codes.setdefault((g_names[u // (len(j_names) + 1)],
                                    j_names[u % (len(j_names) + 1) - 1] if u % (len(j_names) + 1) else None),
                                   len(self._codes))
            for u in uniq.tolist()], dtype=np.int64)
        pair_code = codes[inverse.reshape(-1)]
        ts = _ms(table, "ts_start") & ((1 << self._TS_BITS) - 1)
        key = (pair_code << self._TS_BITS) | ts
        # first occurrence within the batch, and not seen in an earlier batch
        _, first_idx = np.unique(key, return_index=True)
        keep = np.zeros(len(key), dtype=bool)
        keep[first_idx] = True
        keep &= ~np.isin(key, self._seen)
        self._seen = np.union1d(self._seen, key[keep])
        return keep


class RowRules:
    """Applies the row rules to each scanned table of one unit of work and counts what it drops."""

    def __init__(self, report: InputReport) -> None:
        self.report = report
        self.dedup = Deduplicator()

    def keep_mask(self, table: pa.Table) -> np.ndarray:
        bad = np.zeros(table.num_rows, dtype=bool)
        for reason, mask in impossible_rows(table).items():
            n = int((mask & ~bad).sum())  # each rejected row counted once, under its first reason
            if n:
                self.report.rejected_rows[reason] = self.report.rejected_rows.get(reason, 0) + n
            bad |= mask
        keep = ~bad
        if keep.any():
            first = np.zeros(table.num_rows, dtype=bool)
            idx = np.flatnonzero(keep)
            first[idx] = self.dedup.first_seen(table.take(pa.array(idx)))
            self.report.duplicate_windows += int(keep.sum() - first.sum())
            keep = first
        return keep


