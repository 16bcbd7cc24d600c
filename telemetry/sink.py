"""Roll WAL segments into Parquet files that readers can trust.

Layout: ``<data_root>/telemetry/date=YYYY-MM-DD/host=<host>/<host>-<segment id>.parquet``, in
the telemetry v1 schema (zstd, schema version in the metadata). A segment that spans midnight
gives one file per date. Each file is written to a hidden temporary file in the same folder,
fsynced and renamed (``fsutil.atomic_writer``), so a reader never sees half a file (pyarrow and
DuckDB skip dot-files); the WAL segment is removed only after every file of it is in place.
A failed write (disk full) keeps the segment for a later retry; nothing is lost.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.json as pajson
import pyarrow.parquet as pq

from wattclass.fsutil import atomic_writer, fsync_dir
from wattclass.schema import TELEMETRY_V1, conform
from wattclass.telemetry import wal

log = logging.getLogger(__name__)

TableWriter = Callable[[pa.Table, Path], None]


def write_parquet_atomic(table: pa.Table, path: Path) -> None:
    """Write ``table`` to ``path`` via temp file + fsync + rename (zstd)."""
    with atomic_writer(path) as fh:
        pq.write_table(table, fh, compression="zstd")


#: The JSON parse schema of WAL rows: timestamps as epoch milliseconds, every float as float64
#: (the cast to the v1 types happens in Arrow, exactly as from Python floats).
_PARSE_SCHEMA = pa.schema(
    [pa.field(f.name, pa.int64() if pa.types.is_timestamp(f.type)
              else pa.float64() if pa.types.is_floating(f.type) else f.type) for f in TELEMETRY_V1]
)


def rows_to_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Rows (epoch-second timestamps) -> a TELEMETRY_V1 table.

    Through Arrow's JSON reader, not ``pa.array`` on Python lists: pyarrow's Python-object
    conversion imports pandas (if installed) to check for pandas inputs, which cost the daemon
    about 45 MB of RSS and 0.6 s of CPU at its first roll (issue 15). The rows come out of the
    WAL's JSON anyway; the reader builds the columns in C++.
    """
    if not rows:
        return pa.Table.from_batches([], schema=TELEMETRY_V1)
    lines = []
    for r in rows:
        out = dict(r)
        for k in ("ts_start", "ts_end"):
            v = out.get(k)
            if v is not None:
                out[k] = round(float(v) * 1000)
        lines.append(json.dumps(out, separators=(",", ":"), allow_nan=False))
    opts = pajson.ParseOptions(explicit_schema=_PARSE_SCHEMA, unexpected_field_behavior="ignore")
    parsed = pajson.read_json(io.BytesIO("\n".join(lines).encode()), parse_options=opts,
                              read_options=pajson.ReadOptions(use_threads=False))
    return conform(parsed, "<wal rows>")


def _date(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).strftime("%Y-%m-%d")


class ParquetSink:
    """Converts WAL segments to Parquet under ``data_root``."""

    def __init__(self, data_root: Path, writer: TableWriter = write_parquet_atomic) -> None:
        self.root = Path(data_root) / "telemetry"
        self.writer = writer
        self.files_written = 0
        self.rows_written = 0

    def target(self, date: str, host: str, segment: str) -> Path:
        return self.root / f"date={date}" / f"host={host}" / f"{host}-{segment}.parquet"

    def convert(self, segment_path: Path) -> list[Path]:
        """Write the segment's rows as Parquet, then delete the segment. Raises OSError on failure."""
        rows = wal.read_segment(segment_path)
        sid = wal.segment_id(segment_path)
        groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for r in rows:
            groups.setdefault((_date(float(r["ts_start"])), str(r["host"])), []).append(r)
        written: list[Path] = []
        for (date, host), grp in sorted(groups.items()):
            grp.sort(key=lambda r: (r["gpu_index"], r["ts_start"]))
            path = self.target(date, host, sid)
            self.writer(rows_to_table(grp), path)
            written.append(path)
            self.rows_written += len(grp)
        os.unlink(segment_path)
        fsync_dir(segment_path.parent)
        self.files_written += len(written)
        log.info("rolled %s: %d row(s) -> %s", segment_path.name, len(rows),
                 ", ".join(str(p) for p in written) or "no rows")
        return written

    def clean_stale_temps(self, host: str) -> int:
        """Remove temporary files a killed writer left in this host's partitions."""
        n = 0
        for tmp in self.root.glob(f"date=*/host={host}/.*.parquet.*.tmp"):
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
                n += 1
        if n:
            log.info("removed %d stale temporary file(s) under %s", n, self.root)
        return n
