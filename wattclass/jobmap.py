"""The GPU -> job mapping folder: written by the Prolog, read by the telemetry daemon.

Several jobs can hold one GPU (Slurm gres/shard, MPS, oversubscription, and the MIG instances
of one GPU, which have UUIDs of their own), so there is one small JSON file per job per GPU,
``<spool>/<gpu_uuid>/<job_id>.json`` (default spool ``/run/wattclass/jobs``)::

    {"version": 1, "job_id": "1234_5", "user": "alice", "uid": 1000, "written_at": 1795967767.8,
     "label": "memory", "label_source": "rule", "account": "physics"}

``label``/``label_source``/``account`` are optional (the label the job was submitted with, when the
Prolog knows it, and the Slurm account); the telemetry daemon's exporter publishes them as
``wattclass_job_label_info`` and ``wattclass_job_info``.

The Prolog writes it atomically (temp file + rename, mode 0644) for each GPU of the job; the
Epilog removes only its own job's file, so a neighbour's mapping survives. The daemon lists a
GPU's folder every poll (a ``stat`` per GPU, a listing and reads only when the folder's mtime
changes) and falls back to NVML's process list when no file exists. Files that others can
write are refused, since the daemon runs as root and labels energy with what they say.

Upgrade: the previous layout, one file per GPU named ``<spool>/<gpu_uuid>.json``, is still read
(``jobs_on_gpu`` merges both), so jobs started by an older Prolog keep their mapping while the
new daemon runs, and the new Epilog removes such a file when it names its job. New files are
only written in the per-job layout.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from wattclass.errors import ConfigError, DataError
from wattclass.fsutil import atomic_write_text, make_dirs, read_trusted_bytes, refuse_untrusted_dir
from wattclass.lockfile import held_flock

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


#: A Slurm job id as telemetry records it (``123``, array task ``123_4``, het component ``123+1``);
#: also the name of a job's file, so nothing else may reach a path. ``\Z``, not ``$``: ``$`` also
#: matches before a final newline, so ``"123\n"`` passed as a job id (review finding).
_JOB_ID_RE = re.compile(r"^[0-9]+(_[0-9]+)?(\+[0-9]+)?\Z")


def is_job_id(text: str) -> bool:
    """Whether ``text`` is a Slurm job id as telemetry records it (``123``, ``123_4``, ``123+1``)."""
    return len(text) <= 64 and _JOB_ID_RE.match(text) is not None


def _gpu_dir(spool: Path, gpu_uuid: str) -> Path:
    if not _UUID_RE.match(gpu_uuid):
        raise ConfigError(f"invalid GPU UUID for a job folder: {gpu_uuid!r}")
    return Path(spool) / gpu_uuid


def job_path(spool: Path, gpu_uuid: str, job_id: str) -> Path:
    """``<spool>/<gpu_uuid>/<job_id>.json``; both names validated (they come from the environment)."""
    if not _JOB_ID_RE.match(job_id):
        raise ConfigError(f"invalid job id for a job file: {job_id[:40]!r}")
    return _gpu_dir(spool, gpu_uuid) / f"{job_id}.json"


def legacy_path(spool: Path, gpu_uuid: str) -> Path:
    """The one-file-per-GPU layout of earlier versions, still read during an upgrade."""
    return _path(spool, gpu_uuid)


def job_file_gpus(spool: Path, job_id: str) -> list[str]:
    """The GPU folders (UUIDs) of the spool that hold a file of ``job_id``, sorted; none for what
    is no job id (never a glob pattern)."""
    if not _JOB_ID_RE.match(job_id):
        return []
    return sorted(f.parent.name for f in Path(spool).glob(f"*/{job_id}.json"))


def _path(spool: Path, gpu_uuid: str) -> Path:
    if not _UUID_RE.match(gpu_uuid):
        raise ConfigError(f"invalid GPU UUID for a job file: {gpu_uuid!r}")
    return Path(spool) / f"{gpu_uuid}.json"


def write_job_file(spool: Path, gpu_uuid: str, job: JobAssignment) -> Path:
    """Record that ``job`` holds ``gpu_uuid`` (atomic, durable, mode 0644), next to any other job
    that holds it too."""
    path = job_path(spool, gpu_uuid, job.job_id)
    if not path.parent.is_dir():
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        os.chmod(path.parent, 0o755)  # not the umask's choice: readers refuse writable folders
    refuse_untrusted_dir(path.parent, creates=True)  # no planted folder or symlink receives root's file
    doc: dict[str, object] = {"version": FORMAT_VERSION, "job_id": job.job_id, "user": job.user,
                              "uid": job.uid, "written_at": time.time()}
    if job.label is not None:
        doc["label"] = job.label
        doc["label_source"] = job.label_source
    if job.account is not None:
        doc["account"] = job.account
    atomic_write_text(path, json.dumps(doc, sort_keys=True) + "\n", mode=0o644)
    return path


def remove_job_file(spool: Path, gpu_uuid: str, job_id: str) -> bool:
    """Remove ``job_id``'s file for the GPU (and a legacy per-GPU file naming that job).

    Other jobs' files on the same GPU stay. Returns True if a file was removed. Removing twice is
    harmless (Epilogs may rerun). The GPU's folder is left in place (empty folders cost nothing
    and removing one could race with a Prolog writing into it).
    """
    removed = False
    with contextlib.suppress(FileNotFoundError):
        os.unlink(job_path(spool, gpu_uuid, job_id))
        removed = True
    legacy = legacy_path(spool, gpu_uuid)
    try:
        current = read_job_file(legacy)
    except (DataError, ConfigError) as exc:
        log.warning("leaving legacy job file: %s", exc)
        current = None
    if current is not None and current.job_id == job_id:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(legacy)
            removed = True
    return removed


#: How much earlier than the clock a file's mtime may read (s). The kernel stamps files from its
#: coarse clock, a tick (1-10 ms) behind ``time.time()``: a requeued job's file written just after
#: Slurm was asked could read as written before, and was removed (a CI run of
#: test_a_job_back_on_the_node_after_slurm_was_asked_keeps_its_new_files). A file of a job that
#: ended is far older than this; one written within it is kept until the next hook's pass.
MTIME_SLACK_S = 0.05


def remove_job_files(spool: Path, job_id: str, written_before: float | None = None) -> list[str]:
    """Remove ``job_id``'s files in every GPU folder of the spool, and legacy per-GPU files naming
    it; a file goes only if it names the job inside. Returns why the files it could not read were
    left (for the caller's log): the Epilog's cleanup, and the Prolog's for a job that left
    without its Epilog.

    ``written_before`` (epoch seconds): only files last written before then go -- the Prolog asks
    Slurm first and removes later, and a requeued job placed back on this node in between writes
    new files that must stay (compared allowing for the file clock's lag, ``MTIME_SLACK_S``)."""
    if not _JOB_ID_RE.match(job_id):  # never a glob pattern; nothing of it can be on disk
        return [f"invalid job id for a job file: {job_id[:40]!r}"]
    problems = []
    for f in sorted([*Path(spool).glob(f"*/{job_id}.json"), *Path(spool).glob("*.json")]):
        try:
            a = read_job_file(f)
            if written_before is not None and os.stat(f).st_mtime >= written_before - MTIME_SLACK_S:
                continue
        except FileNotFoundError:
            continue
        except (DataError, ConfigError) as exc:
            problems.append(str(exc))
            continue
        if a is not None and a.job_id == job_id:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f)
    return problems


#: Longest excerpt of a bad job file quoted in an error (the spool is written by root, but a log
#: line must stay one short line whatever the file holds).
EXCERPT_CHARS = 120


def _excerpt(raw: str) -> str:
    text = raw if len(raw) <= EXCERPT_CHARS else raw[:EXCERPT_CHARS] + "..."
    return repr(text)


def _utf8(text: str) -> bool:
    """Whether ``text`` is UTF-8 text. A JSON escape such as ``"\\udc80"`` decodes to a lone
    surrogate, which no UTF-8 file holds: in a row it made the WAL segment unconvertible to
    Parquet (ArrowInvalid at every roll and every restart: review finding)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


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
    if not isinstance(job_id, str) or not is_job_id(job_id):
        raise DataError(f"{path}: job_id must be a Slurm job id like 123 or 123_4, got "
                        f"{_excerpt(json.dumps(job_id))}")
    if user is not None and (not isinstance(user, str) or not user or len(user) > 256 or not _utf8(user)):
        raise DataError(f"{path}: user must be a user name or null, got {_excerpt(json.dumps(user))}")
    if uid is not None and (isinstance(uid, bool) or not isinstance(uid, int) or uid < 0):
        raise DataError(f"{path}: uid must be a non-negative integer or null, got "
                        f"{_excerpt(json.dumps(uid))}")
    extra: dict[str, str | None] = {}
    for key in ("label", "label_source", "account"):  # optional (exporter labels), short strings
        v = doc.get(key)
        if v is not None and (not isinstance(v, str) or not v or len(v) > 256 or not _utf8(v)):
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


def jobs_on_gpu(spool: Path, gpu_uuid: str) -> list[JobAssignment]:
    """Every job that holds ``gpu_uuid``, ordered by job id: the per-job files plus a legacy
    per-GPU file. A bad file is skipped with a warning naming it (the others still count)."""
    jobs, problems = _list_jobs(spool, gpu_uuid)
    for msg in problems:
        log.warning("%s", msg)
    return jobs


def _list_jobs(spool: Path, gpu_uuid: str) -> tuple[list[JobAssignment], list[str]]:
    """``jobs_on_gpu`` without the log: the jobs, and why each bad file or folder was skipped."""
    found: dict[str, JobAssignment] = {}
    problems: list[str] = []
    gdir = _gpu_dir(spool, gpu_uuid)
    try:
        refuse_untrusted_dir(gdir)  # owner root, no symlink, not writable by others
        names = sorted(os.listdir(gdir))
    except FileNotFoundError:
        names = []
    except (ConfigError, NotADirectoryError) as exc:
        problems.append(f"ignoring job folder {gdir}: {exc}")
        names = []
    for name in names:
        if not name.endswith(".json") or name.startswith("."):
            continue  # temp files of a write in progress
        try:
            job = read_job_file(gdir / name)
        except (DataError, ConfigError, OSError) as exc:
            problems.append(f"ignoring job file: {exc}")
            continue
        if job is not None:
            found.setdefault(job.job_id, job)
    try:
        legacy = read_job_file(legacy_path(spool, gpu_uuid))
    except (DataError, ConfigError, OSError) as exc:
        problems.append(f"ignoring job file: {exc}")
        legacy = None
    if legacy is not None:
        found.setdefault(legacy.job_id, legacy)
    return [found[k] for k in sorted(found)], problems


#: A listing of a job folder whose mtime is less than this old (or in the future: the clock
#: stepped back) is not cached (ns). Why: the kernel stamps changes from its coarse clock, one tick
#: (1-10 ms) per value, so a change just after a listing, in the same tick (the Prolog's rename
#: of the temp file the listing saw), leaves the mtime the listing was cached under (review
#: finding: that job was never seen on the GPU). Costs a listing or two after each change; a
#: bad file is still logged once (``JobMapReader.jobs``).
RACY_MTIME_NS = 1_000_000_000


class JobMapReader:
    """Cached reader of all jobs on each GPU: re-lists a GPU's folder only when its mtime or the
    legacy file's mtime changes (two ``stat`` calls per GPU per poll otherwise, on path strings
    built once per GPU: building them with pathlib every poll was most of the daemon's own
    per-poll Python, issue 15), or while the last change is too recent to tell
    (``RACY_MTIME_NS``)."""

    def __init__(self, spool: Path = DEFAULT_SPOOL) -> None:
        self.spool = Path(spool)
        self._cache: dict[str, tuple[tuple[int, int], list[JobAssignment]]] = {}
        self._paths: dict[str, tuple[str, str]] = {}  # GPU uuid -> (its folder, legacy file)
        self._problems: dict[str, set[str]] = {}  # GPU uuid -> what its last listing skipped

    @staticmethod
    def _mtime(path: str) -> int:
        try:
            return os.stat(path).st_mtime_ns
        except (FileNotFoundError, NotADirectoryError):
            return -1

    def jobs(self, gpu_uuid: str) -> list[JobAssignment]:
        paths = self._paths.get(gpu_uuid)
        if paths is None:  # validates the uuid once (ConfigError for a bad one, as before)
            paths = (os.fspath(_gpu_dir(self.spool, gpu_uuid)), os.fspath(legacy_path(self.spool, gpu_uuid)))
            self._paths[gpu_uuid] = paths
        key = (self._mtime(paths[0]), self._mtime(paths[1]))
        if key == (-1, -1):
            self._cache.pop(gpu_uuid, None)
            return []
        cached = self._cache.get(gpu_uuid)
        if cached is not None and cached[0] == key:
            return cached[1]
        listed_ns = time.time_ns()
        jobs, problems = _list_jobs(self.spool, gpu_uuid)
        for msg in problems:  # once per problem, however often the folder is listed again
            if msg not in self._problems.get(gpu_uuid, ()):
                log.warning("%s", msg)
        self._problems[gpu_uuid] = set(problems)
        if max(key) < listed_ns - RACY_MTIME_NS:
            self._cache[gpu_uuid] = (key, jobs)
        else:  # a change in the listing's clock tick could keep this mtime: list again next time
            self._cache.pop(gpu_uuid, None)
        return jobs

    def lookup(self, gpu_uuid: str) -> JobAssignment | None:
        """The job holding ``gpu_uuid`` when it is not shared; the lowest job id if it is."""
        jobs = self.jobs(gpu_uuid)
        return jobs[0] if jobs else None


# -- dcgm-exporter's job mapping (``dcgm-exporter --hpc-job-mapping-dir DIR``) -------------------
# One file per GPU, named by the GPU's index, holding the ids of the jobs on it, one per line;
# dcgm-exporter adds them as the ``hpc_job`` label of that GPU's series. Written by the Prolog when
# the site runs dcgm-exporter instead of (or next to) the wattclass daemon.


def _hpc_path(directory: Path, gpu_index: int) -> Path:
    if gpu_index < 0:
        raise ConfigError(f"invalid GPU index for dcgm-exporter's job mapping: {gpu_index}")
    return Path(directory) / str(int(gpu_index))


def _hpc_jobs(path: Path) -> list[str]:
    try:
        return read_trusted_bytes(path, 65536).decode("utf-8", "replace").split()
    except FileNotFoundError:
        return []


@contextlib.contextmanager
def _hpc_lock(directory: Path) -> Iterator[None]:
    """Exclusive lock on dcgm-exporter's mapping folder, held over a read-modify-write of one of
    its files: the hooks of jobs sharing a GPU (shards, MPS) run at once, and without it one
    hook's rewrite lost the other's change (a new job missing from the file, or an ended job
    written back after its Epilog removed it, then named on that GPU until the file emptied).
    The folder itself is locked (flock on its descriptor): no lock file among dcgm-exporter's."""
    make_dirs(Path(directory), 0o755)
    with held_flock(Path(directory), os.O_RDONLY | os.O_DIRECTORY):
        yield


def write_hpc_job_file(directory: Path, gpu_index: int, job_id: str) -> Path:
    """Add ``job_id`` to GPU ``gpu_index``'s jobs for dcgm-exporter (atomic rewrite, mode 0644);
    a shared GPU keeps the jobs already named there."""
    if not _JOB_ID_RE.match(job_id):
        raise ConfigError(f"invalid job id for dcgm-exporter's job mapping: {job_id!r}")
    path = _hpc_path(directory, gpu_index)
    with _hpc_lock(directory):
        jobs = [j for j in _hpc_jobs(path) if j != job_id] + [job_id]
        atomic_write_text(path, "".join(j + "\n" for j in jobs), mode=0o644)
    return path


def remove_hpc_job_file(directory: Path, gpu_index: int, job_id: str) -> bool:
    """Remove ``job_id`` from GPU ``gpu_index``'s mapping (the file goes with its last job)."""
    path = _hpc_path(directory, gpu_index)
    if not Path(directory).is_dir():
        return False
    with _hpc_lock(directory):
        jobs = _hpc_jobs(path)
        if job_id not in jobs:
            return False
        rest = [j for j in jobs if j != job_id]
        if rest:
            atomic_write_text(path, "".join(j + "\n" for j in rest), mode=0o644)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    return True
