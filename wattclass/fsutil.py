"""Durable, atomic file writes and permission checks shared by every component.

Readers (job_submit.lua, the nightly run, dashboards) must never see half a file, so every
output goes to a temporary file in the same folder, is fsynced, then renamed over the target;
the folder is fsynced too so the rename itself survives a crash.
"""

from __future__ import annotations

import contextlib
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


@contextlib.contextmanager
def atomic_writer(path: Path, mode: int = 0o644, binary: bool = True) -> Iterator[IO[bytes]]:
    """Yield a file that replaces ``path`` atomically when the block ends without error.

    On error the temporary file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
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


def refuse_if_others_can_write(path: Path) -> None:
    """Raise ConfigError if ``path`` (or its folder) is group- or world-writable.

    Hooks run as root; a file that another user can change would let that user steer root.
    """
    path = Path(path)
    for p in (path, path.parent):
        st = p.stat()
        if st.st_mode & (stat.S_IWOTH | stat.S_IWGRP) and not (p.is_dir() and st.st_mode & stat.S_ISVTX):
            mode = stat.filemode(st.st_mode)
            raise ConfigError(f"{p}: refusing a file that others can write (mode {mode})")


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
