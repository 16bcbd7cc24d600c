"""Write-ahead log: every closed window is on disk (fsynced) before the daemon moves on.

Format: a segment file ``wal-<id>.log`` is a sequence of records, each
``b"WCR1" | u32 length | u32 crc32(payload) | payload`` (little endian), payload = UTF-8 JSON
list of rows. Length + CRC make a torn record (power loss, ``kill -9`` mid-write) detectable.

Disk full is the case that matters most: ``write(2)`` may write part of a record and return a
short count, or fail with ENOSPC after writing part of it. ``WalWriter.append`` writes a record
whole or not at all: it loops over short writes, and on any failure cuts the file back to its
last whole record (``ftruncate``, which needs no free space) and keeps the rows in memory to
retry with the next append; if even the cut fails, the segment is closed and the next append
starts a new one, so a torn record can only ever be a segment's *last* bytes. (If that record was
written whole and only its fsync failed, it is a valid record of the closed segment: its rows are
not retried, which would write them twice.)

One bad value never costs a row: a value JSON cannot hold (NaN, infinity, an object) is written as
null, with an ERROR naming the column, GPU and window, and counted (``nonfinite_values``, the
``wattclass_wal_nonfinite_values_total`` metric). The window builder makes no such values (its
readings are finite or missing: telemetry.readings), so this is the last line of defence; before
it, one NaN made the append raise and the daemon crash at stop with its last rows unwritten
(H200 run of 2026-11-30, issue 15). Rows stay in ``pending`` until their record is on disk, so
whatever else fails in an append, the daemon still knows which rows it has not persisted.

A segment removed while open (its folder deleted while the daemon runs) would keep taking
appends under no name and vanish with its descriptor: the writer notices (``st_nlink`` 0 at the
next append or roll), makes the folder again and writes the segment's records into a new
segment first (``WalWriter._rescue``).

Reading is defensive as well: ``read_segment`` skips a bad record and resynchronises on the
next valid frame (magic + length + CRC) instead of giving up, so one damaged record never costs
the records after it; a bad tail (nothing valid after it) is cut off.

Segment ids are ``<wall-clock ns>-<pid>``: unique across restarts, and the Parquet file made
from a segment is named after it, so converting a segment twice (crash between the Parquet
rename and the WAL unlink) overwrites the same file instead of duplicating rows.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import os
import struct
import time
import zlib
from pathlib import Path
from typing import Any

from wattclass.fsutil import fsync_dir, make_dirs

log = logging.getLogger(__name__)

MAGIC = b"WCR1"
_HEADER = struct.Struct("<4sII")
MAX_RECORD = 64 * 2**20
#: While appends keep failing, repeat the ERROR line this often (the metrics say it continuously).
ERROR_RELOG_S = 60.0
PREFIX, SUFFIX = "wal-", ".log"


def encode(rows: list[dict[str, Any]]) -> bytes:
    payload = json.dumps(rows, separators=(",", ":"), allow_nan=False).encode()
    return _HEADER.pack(MAGIC, len(payload), zlib.crc32(payload)) + payload


def _plain(v: object) -> bool:
    if isinstance(v, float):
        return math.isfinite(v)
    if v is None or isinstance(v, str | int):
        return True
    try:
        json.dumps(v, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


def scrub(rows: list[dict[str, Any]]) -> int:
    """Set every value JSON cannot hold to None, in place (so the exporter and the stats see what
    the WAL holds); one ERROR per row naming its columns, GPU and window. Returns the count."""
    n = 0
    for r in rows:
        bad = [k for k, v in r.items() if not _plain(v)]
        if not bad:
            continue
        log.error("WAL: %s written as null in the row of GPU %s (%s), window %s-%s, job %s: not a "
                  "finite number or plain value (a bug upstream; the rest of the row is kept)",
                  ", ".join(f"{k}={r[k]!r}"[:80] for k in bad), r.get("gpu_index"), r.get("gpu_uuid"),
                  r.get("ts_start"), r.get("ts_end"), r.get("job_id"))
        for k in bad:
            r[k] = None
        n += len(bad)
    return n


def encode_records(rows: list[dict[str, Any]]) -> bytes:
    """``rows`` as one record, or as several when one would pass ``MAX_RECORD`` (rows held in
    memory through a long disk-full outage): the writer must never write a record the reader
    refuses."""
    frame = encode(rows)
    if len(frame) - _HEADER.size <= MAX_RECORD or len(rows) < 2:
        return frame
    mid = len(rows) // 2
    return encode_records(rows[:mid]) + encode_records(rows[mid:])


def _frame_at(data: bytes, off: int) -> tuple[list[dict[str, Any]] | None, int, str]:
    """Decode the record at ``off``: (rows, next offset, "") or (None, off, why it is bad)."""
    if len(data) - off < _HEADER.size:
        return None, off, "short header"
    magic, n, crc = _HEADER.unpack_from(data, off)
    if magic != MAGIC or n > MAX_RECORD:
        return None, off, "bad record header"
    body = data[off + _HEADER.size : off + _HEADER.size + n]
    if len(body) < n:
        return None, off, "short record"
    if zlib.crc32(body) != crc:
        return None, off, "CRC mismatch"
    try:
        rows = json.loads(body)
    except ValueError:
        return None, off, "undecodable record"
    if not isinstance(rows, list):
        return None, off, "undecodable record"
    return rows, off + _HEADER.size + n, ""


def read_segment(path: Path, repair: bool = True) -> list[dict[str, Any]]:
    """All rows of a segment. A bad record is skipped (logged) and reading resumes at the next
    valid record; a bad tail is cut off (``repair``) and logged."""
    data = Path(path).read_bytes()
    rows: list[dict[str, Any]] = []
    off = 0
    end_of_good = 0
    while off < len(data):
        got, nxt, reason = _frame_at(data, off)
        if got is not None:
            rows.extend(got)
            off = end_of_good = nxt
            continue
        # Resynchronise: the next offset where a whole, CRC-valid record starts.
        probe = data.find(MAGIC, off + 1)
        while probe != -1 and _frame_at(data, probe)[0] is None:
            probe = data.find(MAGIC, probe + 1)
        if probe == -1:
            break
        log.error("%s: damaged WAL record (%s): skipped %d byte(s) at offset %d, reading on at %d",
                  path, reason, probe - off, off, probe)
        off = probe
    if end_of_good < len(data):
        log.warning("%s: torn WAL tail: cutting %d byte(s) at offset %d; %d row(s) before it kept",
                    path, len(data) - end_of_good, end_of_good, len(rows))
        if repair:
            os.truncate(path, end_of_good)
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
        self.write_errors = 0  # failed appends since start (a metric)
        self.nonfinite_values = 0  # values written as null (``scrub``; a metric)
        self._failing = 0  # failed appends in a row
        self._last_error_log = 0.0
        self._retired: list[Path] = []
        # Whole records of a segment removed while open, to be written first into the next one
        # (``_rescue``); rows_in_segment counts their rows.
        self._carry = b""
        self.carry_rows = 0  # rows in ``_carry``: on disk nowhere until written

    def _open(self) -> None:
        make_dirs(self.dir, 0o700)  # removed while the daemon runs: made again, appends go on
        sid = f"{time.time_ns():020d}-{os.getpid()}"
        self.path = self.dir / f"{PREFIX}{sid}{SUFFIX}"
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._size = 0
        self.rows_in_segment = 0
        fsync_dir(self.dir)

    def append(self, rows: list[dict[str, Any]]) -> bool:
        """Append ``rows`` (plus any pending) as one record (several past ``MAX_RECORD``) and fsync;
        False if it failed.

        The record is written whole or not at all (see the module docstring): on failure (disk
        full...) the file is cut back to its last whole record and the rows stay pending in
        memory for the next call.
        """
        held, batch = len(self.pending), self.pending + rows
        if not batch and not self._carry:
            return True
        self.pending = batch  # until the record is on disk, whatever fails below
        try:
            frame = encode_records(batch) if batch else b""
        except (TypeError, ValueError):  # a NaN or an object in a row: null it, keep the row
            self.nonfinite_values += scrub(batch)
            frame = encode_records(batch)
        whole = False  # every byte of the frame written (only fsync may have failed)
        carried = 0  # bytes of a removed segment written first (``_rescue``)
        try:
            self._rescue()
            if self._fd is None:
                self._open()
            assert self._fd is not None
            carried = len(self._carry)
            frame = self._carry + frame
            view = memoryview(frame)
            while view:  # a short write is not an error yet: write the rest (ENOSPC raises then)
                n = os.write(self._fd, view)
                if n <= 0:
                    raise OSError(errno.ENOSPC, "short write: no bytes written")
                view = view[n:]
            whole = True
            os.fsync(self._fd)
        except OSError as exc:
            self.write_errors += 1
            self._failing += 1
            now = time.monotonic()
            if self._failing == 1 or now - self._last_error_log >= ERROR_RELOG_S:  # no log flood
                self._last_error_log = now
                log.error("WAL append to %s failed (%s): %d row(s) held in memory, retrying "
                          "(%d failed append(s) in a row)", self.path or self.dir,
                          exc.strerror or exc, len(batch), self._failing)
            if not self._cut_back() and whole:
                # The retired segment ends in this whole, valid record: its rows are there and
                # are converted with it; kept pending too, they were written twice (review finding).
                log.error("WAL %s: its last record (%d row(s)) is kept as written; not retried",
                          self.path or self._retired[-1], len(batch))
                self.pending, self._carry, self.carry_rows = [], b"", 0
            return False
        if self._failing:
            log.warning("WAL append to %s works again after %d failed append(s): %d held row(s) "
                        "written", self.path, self._failing, held)
            self._failing = 0
        self._size += len(frame)
        self.rows_in_segment += len(batch)
        self.pending = []
        if carried:
            log.warning("WAL: %d byte(s) of a removed segment written again to %s", carried, self.path)
            self._carry, self.carry_rows = b"", 0
        return True

    def _rescue(self) -> bool:
        """If the open segment was removed (its folder deleted while the daemon runs), keep what it
        holds for the next segment: the rows in it would vanish with the descriptor, and its name
        would stall the daemon's conversion queue (review finding). Read back through
        ``/proc/self/fd`` (the file has no name left). Whether it was removed."""
        if self._fd is None or os.fstat(self._fd).st_nlink > 0:
            return False
        try:
            with open(f"/proc/self/fd/{self._fd}", "rb") as fh:
                data = fh.read(self._size)
        except OSError as exc:
            log.error("WAL segment %s was removed while open and cannot be read back (%s): its %d "
                      "row(s) are LOST", self.path, exc.strerror or exc, self.rows_in_segment)
            data, rows = b"", 0
        else:
            log.error("WAL segment %s was removed while open (its folder deleted?): its %d row(s) go "
                      "into a new segment", self.path, self.rows_in_segment)
            rows = self.rows_in_segment
        with contextlib.suppress(OSError):
            os.close(self._fd)
        self._fd, self.path = None, None
        self._carry += data
        self.carry_rows += rows
        self._open()
        self.rows_in_segment = self.carry_rows
        return True

    def hold(self, rows: list[dict[str, Any]]) -> None:
        """Keep ``rows`` in memory after the pending ones, for the next ``append`` (no write now)."""
        self.pending = self.pending + rows

    def _cut_back(self) -> bool:
        """Remove a partly written record; if that fails, retire the segment so that nothing is
        ever appended after the torn bytes (they stay its tail, which readers cut off). False
        when the segment was retired."""
        if self._fd is None:
            return True
        try:
            os.ftruncate(self._fd, self._size)
        except OSError as exc:
            log.error("WAL %s: cannot cut back a partial record (%s): closing the segment, the "
                      "next append starts a new one", self.path, exc.strerror or exc)
            self._retired.append(self.roll_keep())
            return False
        return True

    def roll_keep(self) -> Path:
        """Close the current segment even if it holds no whole record (its tail is torn)."""
        path = self.path
        assert path is not None and self._fd is not None
        with contextlib.suppress(OSError):
            os.close(self._fd)
        self._fd = None
        self.path = None
        return path

    def take_retired(self) -> list[Path]:
        """Segments closed early by a failed cut-back; the daemon converts them like rolled ones."""
        out, self._retired = self._retired, []
        return out

    def roll(self) -> Path | None:
        """Close the current segment (if any) and return its path; the next append starts a new one."""
        if self._rescue():  # removed while open: its records go into a new segment, rolled here
            self.append([])
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
