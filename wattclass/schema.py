"""Telemetry v1: the one row per GPU per window that every component reads or writes.

Declared once, as data, so the daemon, the classifier and the fleet generator cannot drift.
See docs/design.md ("Telemetry v1"). Readers must tolerate missing *nullable* columns; the
columns in REQUIRED_COLUMNS must be present.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from wattclass.errors import DataError

SCHEMA_NAME = "wattclass.telemetry"
SCHEMA_VERSION = "1"
METADATA_KEY = b"wattclass.schema"

#: GPM metrics over the window; null where the GPU (or driver) has no GPM.
GPM_COLUMNS: tuple[str, ...] = (
    "sm_util_pct",
    "sm_occupancy_pct",
    "tensor_util_pct",
    "dram_bw_util_pct",
    "fp64_util_pct",
    "fp32_util_pct",
    "fp16_util_pct",
    "int_util_pct",
    "pcie_tx_mibs",
    "pcie_rx_mibs",
)

_TS = pa.timestamp("ms", tz="UTC")

TELEMETRY_V1 = pa.schema(
    [
        pa.field("ts_start", _TS, nullable=False),
        pa.field("ts_end", _TS, nullable=False),
        pa.field("host", pa.string(), nullable=False),
        pa.field("gpu_index", pa.int16(), nullable=False),
        pa.field("gpu_uuid", pa.string(), nullable=False),
        pa.field("gpu_model", pa.string()),
        pa.field("job_id", pa.string()),
        pa.field("user", pa.string()),
        pa.field("energy_j", pa.float64()),
        pa.field("power_avg_w", pa.float64()),
        pa.field("power_max_w", pa.float64()),
        pa.field("power_limit_w", pa.float64()),
        pa.field("util_gpu_pct", pa.float32()),
        pa.field("util_mem_pct", pa.float32()),
        pa.field("sm_clock_mhz", pa.float32()),
        pa.field("mem_clock_mhz", pa.float32()),
        pa.field("sm_clock_max_mhz", pa.float32()),
        pa.field("throttle_power_frac", pa.float32()),
        pa.field("throttle_thermal_frac", pa.float32()),
        pa.field("temp_c", pa.float32()),
        pa.field("fb_used_mib", pa.float32()),
        pa.field("fb_total_mib", pa.float32()),
        *[pa.field(c, pa.float32()) for c in GPM_COLUMNS],
        # Shared GPUs and MIG (docs/shared-gpus.md): the job's share of the GPU's energy in the
        # window (1 for a sole job), how many jobs shared it, what the split was based on
        # (util | memory | equal | mig; null when unshared) and, for a MIG instance's row
        # (gpu_uuid = the instance), the physical GPU.
        pa.field("share_ratio", pa.float32()),
        pa.field("shared_jobs", pa.int16()),
        pa.field("share_basis", pa.string()),
        pa.field("parent_gpu_uuid", pa.string()),
        # Within-window spread of the 1 s polls (added for issue 13; nullable: older files lack them).
        pa.field("power_std_w", pa.float32()),
        pa.field("sm_clock_std_mhz", pa.float32()),
        pa.field("util_mem_std_pct", pa.float32()),
    ],
    metadata={METADATA_KEY: f"{SCHEMA_NAME}/{SCHEMA_VERSION}".encode()},
)

#: Columns without which a file cannot be used at all (identity, time, energy).
REQUIRED_COLUMNS: tuple[str, ...] = (
    "ts_start",
    "ts_end",
    "host",
    "gpu_index",
    "gpu_uuid",
    "job_id",
    "energy_j",
)

#: NVML basic columns: present on every NVIDIA GPU, the model's inputs where GPM is absent.
_IDENTITY_COLUMNS = ("ts_start", "ts_end", "host", "gpu_index", "gpu_uuid", "gpu_model", "job_id", "user")
#: How a shared GPU's energy was split (telemetry.splitter); not NVML readings.
SHARE_COLUMNS: tuple[str, ...] = ("share_ratio", "shared_jobs", "share_basis", "parent_gpu_uuid")
BASIC_COLUMNS: tuple[str, ...] = tuple(
    f.name for f in TELEMETRY_V1
    if f.name not in GPM_COLUMNS and f.name not in _IDENTITY_COLUMNS and f.name not in SHARE_COLUMNS
)


def conform(table: pa.Table, source: str | Path = "<table>") -> pa.Table:
    """Return ``table`` cast to TELEMETRY_V1 column order and types.

    Missing nullable columns are added as nulls (older or GPM-less writers); a missing
    required column raises DataError naming the column and ``source``. Extra columns are
    dropped.
    """
    names = set(table.column_names)
    missing = [c for c in REQUIRED_COLUMNS if c not in names]
    if missing:
        raise DataError(f"{source}: telemetry is missing required column(s) {', '.join(missing)}")
    cols = []
    for field in TELEMETRY_V1:
        if field.name in names:
            col = table.column(field.name)
            if not col.type.equals(field.type):
                try:
                    col = col.cast(field.type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise DataError(
                        f"{source}: column {field.name} has type {col.type}, expected {field.type}: {exc}"
                    ) from exc
        else:
            col = pa.nulls(table.num_rows, field.type)
        cols.append(col)
    return pa.Table.from_arrays(cols, schema=TELEMETRY_V1)


def schema_version_of(path: Path) -> str | None:
    """Schema version recorded in a Parquet file's metadata, or None for files written elsewhere."""
    meta = pq.read_schema(path).metadata or {}
    raw = meta.get(METADATA_KEY)
    if raw is None:
        return None
    return str(raw.decode()).rpartition("/")[2]


def column_names(path: Path) -> tuple[str, ...] | None:
    """A Parquet file's column names, in order (None if its footer cannot be read)."""
    try:
        return tuple(pq.read_schema(path).names)
    except (OSError, pa.ArrowException):
        return None


@dataclass(frozen=True)
class ReadPlan:
    """``first_schema_reads_all``'s answer: ``exact`` when reading with the first file's schema
    loses no column; ``first``, the first file's names (None: unreadable); ``seen``, every
    column name found in the files it opened."""

    exact: bool
    first: tuple[str, ...] | None
    seen: frozenset[str]


def first_schema_reads_all(files: Sequence[Path]) -> ReadPlan:
    """Whether many telemetry files can be read with the first file's schema without losing a
    column, opening as few footers as that takes.

    Why: the fast way to read a day's files (DuckDB's ``read_parquet`` without
    ``union_by_name``) binds the first file's columns, by name. A later file that lacks one fails
    the read, and every caller then reads by column name; but a later file that has a column the
    first lacks is read without it, silently. Files from older writers do that (the daemon has
    written every v1 column only since the schema's last additions, and older ones wrote no GPM
    columns for a GPU without GPM): when the first file (by path: the first host by name) lacked
    the GPM columns, the GPM hosts' columns were dropped and their jobs went to the model
    instead of the rule. Reading every footer costs a quarter of the scan (0.7 s for 3,000
    files), so: the first and the last file must have the same columns; if the first has every
    v1 column (every file of today's writers), nothing can be dropped; otherwise the first and
    the last file of every folder (one host's files, whose writer and GPUs rarely change within
    a day) must have the first file's columns too, read by DuckDB in one query (0.4 s for the
    2,500 files that are the ends of 10,000 GPUs' hosts, half of pyarrow's time).
    """
    if not files:
        return ReadPlan(True, None, frozenset())
    first, last = column_names(files[0]), column_names(files[-1])
    seen = set(first or ()) | set(last or ())
    if first is None or last is None or set(first) != set(last):
        return ReadPlan(False, first, frozenset(seen))
    if set(TELEMETRY_V1.names) <= set(first):
        return ReadPlan(True, first, frozenset(seen))
    ends: dict[Path, list[Path]] = {}
    for f in files:
        pair = ends.setdefault(f.parent, [f, f])
        pair[1] = f
    probe = [str(p) for p in dict.fromkeys(p for pair in ends.values() for p in pair)]
    names = _column_sets(probe)
    if names is None or len(names) != len(probe):  # a footer DuckDB cannot read: check each file
        return ReadPlan(False, first, frozenset(seen))
    for cols in names.values():
        seen.update(cols)
    return ReadPlan(all(cols == set(first) for cols in names.values()), first, frozenset(seen))


def _column_sets(paths: list[str]) -> dict[str, set[str]] | None:
    """Each file's column names, from DuckDB's ``parquet_schema`` (None if a footer is unreadable)."""
    import duckdb

    try:
        with duckdb.connect() as con:
            rows = con.execute("SELECT file_name, name FROM parquet_schema(?) WHERE num_children IS NULL",
                               [paths]).fetchall()
    except duckdb.Error:
        return None
    out: dict[str, set[str]] = {}
    for file_name, name in rows:
        out.setdefault(str(file_name), set()).add(str(name))
    return out
