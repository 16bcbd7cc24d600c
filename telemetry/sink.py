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
import math
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.json as pajson
import pyarrow.parquet as pq

from wattclass.fsutil import atomic_writer, fsync_dir
from wattclass.schema import TELEMETRY_V1
from wattclass.telemetry import wal

log = logging.getLogger(__name__)

TableWriter = Callable[[pa.Table, Path], None]


def write_parquet_atomic(table: pa.Table, path: Path) -> None:
    """Write ``table`` to ``path`` via temp file + fsync + rename (zstd)."""
    with atomic_writer(path) as fh:
        pq.write_table(table, fh, compression="zstd")


#: How the JSON reader parses WAL rows: the v1 types, except timestamps as epoch milliseconds
#: (int64, then viewed as timestamp[ms, UTC]: the same bits, no cast).
_PARSE_SCHEMA = pa.schema(
    [pa.field(f.name, pa.int64() if pa.types.is_timestamp(f.type) else f.type) for f in TELEMETRY_V1]
)
_F32 = frozenset(f.name for f in TELEMETRY_V1 if pa.types.is_float32(f.type))
_TS = ("ts_start", "ts_end")
_F32_PACK = struct.Struct("<f")


def _f32(v: float) -> float | None:
    """``v`` rounded to float32 exactly as a cast from float64 rounds it: the text written for it
    then parses to that very float32 value (no second rounding from decimal). A reading beyond
    float32's range (no NVML field comes near) is stored as missing, not as infinity."""
    try:
        return float(_F32_PACK.unpack(_F32_PACK.pack(v))[0])
    except OverflowError:
        return None


def rows_to_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Rows (epoch-second timestamps) -> a TELEMETRY_V1 table.

    Through Arrow's JSON reader, with values already in their v1 types, so no Arrow cast runs.
    Why (issue 15): ``pa.array`` on Python values imports pandas when it is installed (about
    30 MB of RSS and 0.6 s of CPU at the daemon's first roll), and the first cast imports
    ``pyarrow.compute`` (about 0.17 s of CPU on the H200 machine); the daemon needs neither.
    """
    if not rows:
        return TELEMETRY_V1.empty_table()
    lines = []
    for r in rows:
        out = {k: r.get(k) for k in _PARSE_SCHEMA.names}
        for k in _TS:  # never null: the window builder sets both bounds of every row
            out[k] = round(float(r[k]) * 1000)
        for k in _F32:
            v = out[k]
            if v is not None:
                out[k] = _f32(float(v))
        lines.append(json.dumps(out, separators=(",", ":"), allow_nan=False))
    opts = pajson.ParseOptions(explicit_schema=_PARSE_SCHEMA, unexpected_field_behavior="ignore")
    parsed = pajson.read_json(io.BytesIO("\n".join(lines).encode()), parse_options=opts,
                              read_options=pajson.ReadOptions(use_threads=False))
    cols = []
    for f in TELEMETRY_V1:
        col = parsed.column(f.name)
        cols.append(pa.chunked_array([c.view(f.type) for c in col.chunks], f.type) if f.name in _TS else col)
    return pa.Table.from_arrays(cols, schema=TELEMETRY_V1)


def _fits(field: pa.Field, v: object) -> bool:
    """Whether the JSON reader takes ``v`` for ``field`` (``_PARSE_SCHEMA``'s types)."""
    t = field.type
    if v is None:
        return True
    if pa.types.is_string(t):
        if not isinstance(v, str):
            return False
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    if isinstance(v, bool) or not isinstance(v, int | float):
        return False
    if pa.types.is_integer(t):
        bits = t.bit_width - 1
        return isinstance(v, int) and -(2**bits) <= v < 2**bits
    return math.isfinite(v)


def _seconds(v: object) -> bool:
    """Whether ``v`` is a time bound as the window builder writes it (finite epoch seconds)."""
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def fit_rows(rows: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """``rows`` with every value Parquet refuses for its column made null (an integer where a
    string belongs becomes its text), one ERROR per row naming columns and window; a row without
    both time bounds is dropped (ERROR). Why: one such value made the whole segment fail at every
    conversion (review finding); the WAL's own check (``wal.scrub``) only knows JSON's limits."""
    out = []
    for r in rows:
        if not isinstance(r, dict) or not all(_seconds(r.get(k)) for k in _TS):
            log.error("%s: a WAL row without valid time bounds dropped: %s", where, repr(r)[:200])
            continue
        fixed = dict(r)
        bad = []
        for f in _PARSE_SCHEMA:
            v = fixed.get(f.name)
            if f.name in _TS or _fits(f, v):
                continue
            bad.append(f"{f.name}={v!r}"[:80])
            is_int = isinstance(v, int) and not isinstance(v, bool)
            fixed[f.name] = str(v) if pa.types.is_string(f.type) and is_int else None
        if bad:
            log.error("%s: GPU %s window %s: value(s) Parquet refuses: %s (an integer kept as text, "
                      "others null)", where, repr(r.get("gpu_index"))[:20], repr(r.get("ts_start"))[:30],
                      ", ".join(bad))
        out.append(fixed)
    return out


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
        try:
            tables = self._tables(rows)
        except (pa.ArrowInvalid, TypeError, ValueError, KeyError, AttributeError):
            tables = self._tables(fit_rows(rows, segment_path.name))
        written: list[Path] = []
        for (date, host), (n, table) in tables.items():
            path = self.target(date, host, sid)
            self.writer(table, path)
            written.append(path)
            self.rows_written += n
        os.unlink(segment_path)
        try:
            fsync_dir(segment_path.parent)
        except OSError as exc:
            # Not a failed conversion: the rows are in Parquet and the segment is gone, so the
            # daemon must not retry it (that stalled every later segment: review finding). If a
            # crash brings the segment back, it is converted again to the same file names.
            log.warning("rolled %s, but fsyncing %s after removing it failed (%s)", segment_path.name,
                        segment_path.parent, exc.strerror or exc)
        self.files_written += len(written)
        log.info("rolled %s: %d row(s) -> %s", segment_path.name, len(rows),
                 ", ".join(str(p) for p in written) or "no rows")
        return written

    @staticmethod
    def _tables(rows: list[dict[str, Any]]) -> dict[tuple[str, str], tuple[int, pa.Table]]:
        """One table per (date, host) of the rows, sorted by GPU and time: built before any file
        is written, so a row Parquet refuses fails the conversion before it has written half."""
        groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for r in rows:
            groups.setdefault((_date(float(r["ts_start"])), str(r["host"])), []).append(r)
        out = {}
        for key, grp in sorted(groups.items()):
            grp.sort(key=lambda r: (r["gpu_index"] if isinstance(r["gpu_index"], int) else -1, r["ts_start"]))
            out[key] = (len(grp), rows_to_table(grp))
        return out

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
