"""Write-ahead log: every closed window is on disk (fsynced) before the daemon moves on.

Format: a segment file ``wal-<id>.log`` is a sequence of records, each
``b"WCR1" | u32 length | u32 crc32(payload) | payload`` (little endian), payload = UTF-8 JSON
list of rows. Length + CRC make a torn last record (power loss, ``kill -9`` mid-write)
detectable: reading stops at the first bad frame, the tail is cut off and logged, every earlier
record is kept. A failed append (ENOSPC) truncates back to the last whole record and keeps the
rows in memory to retry, so the log never holds half a record that a later append would bury.

Segment ids are ``<wall-clock ns>-<pid>``: unique across restarts, and the Parquet file made
from a segment is named after it, so converting a segment twice (crash between the Parquet
rename and the WAL unlink) overwrites the same file instead of duplicating rows.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import struct
import time
import zlib
from pathlib import Path
from typing import Any

from wattclass.fsutil import fsync_dir

log = logging.getLogger(__name__)

MAGIC = b"WCR1"
_HEADER = struct.Struct("<4sII")
MAX_RECORD = 64 * 2**20
PREFIX, SUFFIX = "wal-", ".log"


def encode(rows: list[dict[str, Any]]) -> bytes:
    payload = json.dumps(rows, separators=(",", ":"), allow_nan=False).encode()
    return _HEADER.pack(MAGIC, len(payload), zlib.crc32(payload)) + payload


def read_segment(path: Path, repair: bool = True) -> list[dict[str, Any]]:
    """All rows of a segment; a torn or corrupt tail is cut off (``repair``) and logged."""
    data = Path(path).read_bytes()
    rows: list[dict[str, Any]] = []
    off = 0
    reason = ""
    while off < len(data):
        if len(data) - off < _HEADER.size:
            reason = "short header"
            break
        magic, n, crc = _HEADER.unpack_from(data, off)
        if magic != MAGIC or n > MAX_RECORD:
            reason = "bad record header"
            break
        body = data[off + _HEADER.size : off + _HEADER.size + n]
        if len(body) < n:
            reason = "short record"
            break
        if zlib.crc32(body) != crc:
            reason = "CRC mismatch"
            break
        try:
            rows.extend(json.loads(body))
        except ValueError:
            reason = "undecodable record"
            break
        off += _HEADER.size + n
    if off < len(data):
        log.warning("%s: torn WAL tail (%s): cutting %d byte(s) at offset %d; %d row(s) before it kept",
                    path, reason, len(data) - off, off, len(rows))
        if repair:
            os.truncate(path, off)
    return rows


def segment_id(path: Path) -> str:
    return Path(path).name[len(PREFIX) : -len(SUFFIX)]


def list_segments(wal_dir: Path) -> list[Path]:
    """Segments in creation order (ids start with a zero-padded timestamp)."""
    return sorted(p for p in Path(wal_dir).glob(f"{PREFIX}*{SUFFIX}") if p.is_file())


class WalWriter:
    """Appends records to the current segment, fsyncing each batch."""

    def __init__(self, wal_dir: Path) -> None:
        self.dir = Path(wal_dir)
        self.path: Path | None = None
        self._fd: int | None = None
        self._size = 0
        self.pending: list[dict[str, Any]] = []  # rows whose append failed; retried first
        self.rows_in_segment = 0

    def _open(self) -> None:
        sid = f"{time.time_ns():020d}-{os.getpid()}"
        self.path = self.dir / f"{PREFIX}{sid}{SUFFIX}"
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._size = 0
        self.rows_in_segment = 0
        fsync_dir(self.dir)

    def append(self, rows: list[dict[str, Any]]) -> bool:
        """Append ``rows`` (plus any pending) as one record and fsync; False if it failed.

        On failure (disk full...) the file is cut back to its last whole record and the rows
        stay pending in memory for the next call.
        """
        batch = self.pending + rows
        if not batch:
            return True
        frame = encode(batch)
        try:
            if self._fd is None:
                self._open()
            assert self._fd is not None
            os.write(self._fd, frame)
            os.fsync(self._fd)
        except OSError as exc:
            self.pending = batch
            log.error("WAL append to %s failed (%s): %d row(s) held in memory, retrying next poll",
                      self.path or self.dir, exc.strerror or exc, len(batch))
            if self._fd is not None:
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, self._size)
            return False
        self._size += len(frame)
        self.rows_in_segment += len(batch)
        self.pending = []
        return True

    def roll(self) -> Path | None:
        """Close the current segment (if any) and return its path; the next append starts a new one."""
        path = self.path
        if self._fd is not None:
            os.close(self._fd)
        self._fd = None
        self.path = None
        if path is not None and self._size == 0:
            path.unlink(missing_ok=True)
            return None
        return path

    def close(self) -> Path | None:
        return self.roll()
