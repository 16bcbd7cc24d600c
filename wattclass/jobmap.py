"""The GPU -> job mapping folder: written by the Prolog, read by the telemetry daemon.

One small JSON file per GPU, named ``<gpu_uuid>.json``, in a spool folder (default
``/run/wattclass/jobs``)::

    {"version": 1, "job_id": "1234_5", "user": "alice", "uid": 1000, "written_at": 1795967767.8,
     "label": "memory", "label_source": "submit"}

``label``/``label_source``/``account`` are optional (the label the job was submitted with, when the
Prolog knows it, and the Slurm account); the telemetry daemon's exporter publishes them as
``wattclass_job_label_info`` and ``wattclass_job_info``.

The Prolog writes it atomically (temp file + rename, mode 0644) for each GPU of the job; the
Epilog removes it. The daemon reads it every poll (a ``stat`` per GPU, a read only when the
mtime changes) and falls back to NVML's process list when no file exists. Files that others
can write are refused, since the daemon runs as root and labels energy with what they say.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import time
from pathlib import Path
from typing import NamedTuple

from wattclass.errors import ConfigError, DataError
from wattclass.fsutil import atomic_write_text, read_trusted_bytes

DEFAULT_SPOOL = Path("/run/wattclass/jobs")
FORMAT_VERSION = 1
_UUID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")

log = logging.getLogger(__name__)


class JobAssignment(NamedTuple):
    """Which Slurm job holds a GPU."""

    job_id: str
    user: str | None
    uid: int | None = None
    label: str | None = None
    label_source: str | None = None
    account: str | None = None


def _path(spool: Path, gpu_uuid: str) -> Path:
    if not _UUID_RE.match(gpu_uuid):
        raise ConfigError(f"invalid GPU UUID for a job file: {gpu_uuid!r}")
    return Path(spool) / f"{gpu_uuid}.json"


def write_job_file(spool: Path, gpu_uuid: str, job: JobAssignment) -> Path:
    """Record that ``job`` holds ``gpu_uuid`` (atomic, durable, mode 0644)."""
    path = _path(spool, gpu_uuid)
    doc: dict[str, object] = {"version": FORMAT_VERSION, "job_id": job.job_id, "user": job.user,
                              "uid": job.uid, "written_at": time.time()}
    if job.label is not None:
        doc["label"] = job.label
        doc["label_source"] = job.label_source
    if job.account is not None:
        doc["account"] = job.account
    atomic_write_text(path, json.dumps(doc, sort_keys=True) + "\n", mode=0o644)
    return path


def remove_job_file(spool: Path, gpu_uuid: str, job_id: str | None = None) -> bool:
    """Remove the GPU's job file; with ``job_id``, only if it still names that job.

    Returns True if a file was removed. Removing twice is harmless (Epilogs may rerun).
    """
    path = _path(spool, gpu_uuid)
    if job_id is not None:
        current = read_job_file(path)
        if current is not None and current.job_id != job_id:
            return False
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


#: Longest excerpt of a bad job file quoted in an error (the spool is written by root, but a log
#: line must stay one short line whatever the file holds).
EXCERPT_CHARS = 120
_JOB_ID_RE = re.compile(r"^[0-9]+(_[0-9]+)?(\+[0-9]+)?$")


def _excerpt(raw: str) -> str:
    text = raw if len(raw) <= EXCERPT_CHARS else raw[:EXCERPT_CHARS] + "..."
    return repr(text)


def parse_job_file(path: Path, raw: bytes) -> JobAssignment:
    """Validate a job file's bytes; any defect is a DataError naming the file and the field.

    Every type is checked here (not left to ``int()``/``str()`` later) so that no content, however
    wrong, escapes as anything but a DataError: callers (the daemon's poll, the Epilog's cleanup)
    skip the file and go on.
    """
    try:
        text = raw.decode("utf-8")
        doc = json.loads(text)
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise DataError(f"{path}: not a wattclass job file ({type(exc).__name__}): "
                        f"{_excerpt(raw.decode('utf-8', 'replace'))}") from exc
    if not isinstance(doc, dict):
        raise DataError(f"{path}: not a wattclass job file (a JSON {type(doc).__name__}, not an object)")
    job_id, user, uid = doc.get("job_id"), doc.get("user"), doc.get("uid")
    if isinstance(job_id, int) and not isinstance(job_id, bool):
        job_id = str(job_id)
    if not isinstance(job_id, str) or not _JOB_ID_RE.match(job_id):
        raise DataError(f"{path}: job_id must be a Slurm job id like 123 or 123_4, got "
                        f"{_excerpt(json.dumps(job_id))}")
    if user is not None and (not isinstance(user, str) or not user or len(user) > 256):
        raise DataError(f"{path}: user must be a user name or null, got {_excerpt(json.dumps(user))}")
    if uid is not None and (isinstance(uid, bool) or not isinstance(uid, int) or uid < 0):
        raise DataError(f"{path}: uid must be a non-negative integer or null, got "
                        f"{_excerpt(json.dumps(uid))}")
    extra: dict[str, str | None] = {}
    for key in ("label", "label_source", "account"):  # optional (exporter labels), short strings
        v = doc.get(key)
        if v is not None and (not isinstance(v, str) or not v or len(v) > 256):
            raise DataError(f"{path}: {key} must be a short string or absent, got {_excerpt(json.dumps(v))}")
        extra[key] = v
    return JobAssignment(job_id, user, uid, extra["label"], extra["label_source"], extra["account"])


def read_job_file(path: Path) -> JobAssignment | None:
    """Parse one job file; None if it does not exist. Bad content raises DataError naming the file."""
    try:
        raw = read_trusted_bytes(path)  # owner root, no symlink, not writable by others
    except FileNotFoundError:
        return None
    return parse_job_file(Path(path), raw)


class JobMapReader:
    """Cached reader of the spool folder: re-reads a GPU's file only when its mtime changes."""

    def __init__(self, spool: Path = DEFAULT_SPOOL) -> None:
        self.spool = Path(spool)
        self._cache: dict[str, tuple[int, JobAssignment | None]] = {}

    def lookup(self, gpu_uuid: str) -> JobAssignment | None:
        path = _path(self.spool, gpu_uuid)
        try:
            mtime = path.stat().st_mtime_ns
        except FileNotFoundError:
            self._cache.pop(gpu_uuid, None)
            return None
        cached = self._cache.get(gpu_uuid)
        if cached is not None and cached[0] == mtime:
            return cached[1]
        job: JobAssignment | None = None
        with contextlib.suppress(FileNotFoundError):
            try:
                job = read_job_file(path)
            except (DataError, ConfigError) as exc:
                # Logged once per content (the cache holds the mtime): no log flood per poll.
                log.warning("ignoring job file: %s", exc)
            except OSError as exc:  # e.g. EACCES, EISDIR: a broken spool entry, not a dead daemon
                log.warning("ignoring unreadable job file %s: %s", path, exc)
        self._cache[gpu_uuid] = (mtime, job)
        return job


# -- dcgm-exporter's job mapping (``dcgm-exporter --hpc-job-mapping-dir DIR``) -------------------
# One file per GPU, named by the GPU's index, holding the ids of the jobs on it, one per line;
# dcgm-exporter adds them as the ``hpc_job`` label of that GPU's series. Written by the Prolog when
# the site runs dcgm-exporter instead of (or next to) the wattclass daemon.


def _hpc_path(directory: Path, gpu_index: int) -> Path:
    if gpu_index < 0:
        raise ConfigError(f"invalid GPU index for dcgm-exporter's job mapping: {gpu_index}")
    return Path(directory) / str(int(gpu_index))


def write_hpc_job_file(directory: Path, gpu_index: int, job_id: str) -> Path:
    """Name ``job_id`` as the job on GPU ``gpu_index`` for dcgm-exporter (atomic, mode 0644)."""
    if not job_id or "\n" in job_id:
        raise ConfigError(f"invalid job id for dcgm-exporter's job mapping: {job_id!r}")
    path = _hpc_path(directory, gpu_index)
    atomic_write_text(path, job_id + "\n", mode=0o644)
    return path


def remove_hpc_job_file(directory: Path, gpu_index: int, job_id: str) -> bool:
    """Remove GPU ``gpu_index``'s mapping if it still names ``job_id``; True if removed."""
    path = _hpc_path(directory, gpu_index)
    try:
        if read_trusted_bytes(path, 4096).decode("utf-8", "replace").split() != [job_id]:
            return False
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True

