"""Durable, atomic file writes and permission checks shared by every component.

Readers (job_submit.lua, the nightly run, dashboards) must never see half a file, so every
output goes to a temporary file in the same folder, is fsynced, then renamed over the target;
the folder is fsynced too so the rename itself survives a crash.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from wattclass.errors import ConfigError, WattclassError


def fsync_dir(path: Path) -> None:
    """fsync a directory so a rename or create inside it is durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_dirs(path: Path, mode: int = 0o755) -> None:
    """``mkdir -p`` whose new folders get exactly ``mode``, whatever the umask.

    Root's outputs are read by others that check modes: job_submit.lua refuses a table in a
    group-writable folder, the hooks refuse such a state folder. ``Path.mkdir`` masks with the
    umask (an admin's shell with umask 002 made /etc/slurm/wattclass 0775, so the table was
    refused and the policy was off); folders that already exist are left as they are.
    """
    p = Path(path)
    missing: list[Path] = []
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another process made it first: theirs stands
            os.mkdir(d, mode)
            os.chmod(d, mode)


@contextlib.contextmanager
def atomic_writer(path: Path, mode: int = 0o644, binary: bool = True, group: int | None = None,
                  dir_mode: int | None = None) -> Iterator[IO[bytes]]:
    """Yield a file that replaces ``path`` atomically when the block ends without error.

    On error the temporary file is removed and ``path`` is left as it was. Missing folders are
    created with ``dir_mode``, by default the file's mode plus search bits, whatever the umask
    (``make_dirs``). ``group``: the file's group id, set before the rename (so the file never
    appears with another group), for files one daemon's group may read and others may not.
    """
    path = Path(path)
    if dir_mode is None:
        dir_mode = mode | (mode & 0o444) >> 2  # a file 0644 gets folders 0755, 0600 gets 0700
    make_dirs(path.parent, dir_mode)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        if group is not None:
            os.chown(tmp, -1, group)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` atomically and durably."""
    with atomic_writer(path, mode) as fh:
        fh.write(data)


def atomic_write_text(path: Path, text: str, mode: int = 0o644) -> None:
    """Write UTF-8 ``text`` to ``path`` atomically and durably."""
    atomic_write_bytes(path, text.encode("utf-8"), mode)


def trusted_uids() -> frozenset[int]:
    """Owners whose files a hook may trust: root, and the user running it (a non-root test or dev run)."""
    return frozenset({0, os.geteuid()})


def _refuse_stat(p: Path, st: os.stat_result, is_dir: bool) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise ConfigError(f"{p}: refusing a symlink where root trusts a path")
    if st.st_uid not in trusted_uids():
        raise ConfigError(f"{p}: refusing a {'folder' if is_dir else 'file'} owned by uid {st.st_uid} "
                          "(must be owned by root)")
    sticky_dir = is_dir and bool(st.st_mode & stat.S_ISVTX)
    if st.st_mode & (stat.S_IWOTH | stat.S_IWGRP) and not sticky_dir:
        raise ConfigError(f"{p}: refusing a {'folder' if is_dir else 'file'} that others can write "
                          f"(mode {stat.filemode(st.st_mode)})")


def refuse_untrusted_dir(path: Path) -> None:
    """Raise ConfigError unless the folder ``path`` is a real folder (no symlink), owned by root
    and not writable by group or others (a sticky folder such as /tmp is fine), and so is every
    folder above it: whoever can rename a folder on the way can swap the whole subtree (the same
    rule as job_submit.lua's)."""
    p = Path(path)
    st = os.lstat(p)
    _refuse_stat(p, st, True)
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{p}: not a folder")
    for above in Path(os.path.abspath(p)).parents:
        _refuse_stat(above, os.lstat(above), True)


def refuse_if_others_can_write(path: Path) -> None:
    """Raise ConfigError unless ``path`` and its folders are trusted: owned by root, not writable by
    group or others, and not symlinks (``lstat``: the check sees the link, not its target).

    Hooks run as root; a file that another user owns or can change, or a link another user can
    point elsewhere, would let that user steer root (e.g. a planted cap record). Raises
    FileNotFoundError if ``path`` does not exist.
    """
    p = Path(path)
    refuse_untrusted_dir(p.parent)
    _refuse_stat(p, os.lstat(p), False)


def read_trusted_bytes(path: Path, max_bytes: int = 16 * 1024 * 1024) -> bytes:
    """Read a file root trusts: opened with O_NOFOLLOW, checked on the open descriptor (fstat, so a
    swap between check and open cannot slip through), its folders up to / checked with lstat.

    Raises ConfigError for an untrusted file or folder, FileNotFoundError if it does not exist.
    """
    p = Path(path)
    refuse_untrusted_dir(p.parent)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ConfigError(f"{p}: refusing a symlink where root trusts a path") from exc
        raise
    try:
        st = os.fstat(fd)
        _refuse_stat(p, st, False)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{p}: not a regular file")
        if st.st_size > max_bytes:
            raise ConfigError(f"{p}: {st.st_size} bytes, more than the {max_bytes} allowed")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            return fh.read(max_bytes + 1)[:max_bytes]
    finally:
        os.close(fd)


def read_trusted_text(path: Path) -> str:
    """``read_trusted_bytes`` decoded as UTF-8 (bad bytes are a ConfigError naming the file)."""
    try:
        return read_trusted_bytes(path).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text: {exc}") from exc


def ensure_trusted_dir(path: Path) -> Path:
    """Create ``path`` (and missing parents, mode 0755 whatever the umask) if missing, then refuse
    it unless it is a trusted folder."""
    p = Path(path)
    make_dirs(p)
    refuse_untrusted_dir(p)
    return p


def ensure_writable_dir(path: Path, what: str) -> Path:
    """Create ``path`` if needed and prove it is writable now, with an error naming ``what``."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".wattclass-probe-"):
            pass
    except OSError as exc:
        raise WattclassError(f"{what} {path} is not writable: {exc.strerror or exc}") from exc
    return path
