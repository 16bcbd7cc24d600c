"""Exclusive locks on a folder, held for a process's life, that name their holder.

Two writers on one folder corrupt it (two telemetry daemons convert each other's open WAL
segment; two nightly runs add duplicate model versions), so each takes ``<folder>/wattclass.lock`` with
``flock(LOCK_EX)`` first. The kernel drops the lock when the holder exits, even on ``kill -9``,
so a crashed holder never leaves a stale lock; the pid, host and start time written into the
file are only there to name the holder in the refusal message. ``flock`` is per host on NFS
(Linux emulates it with POSIX locks there, which do cross hosts with NFSv4): that is why the
host is recorded too.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

from wattclass.errors import LockBusyError

LOCK_NAME = "wattclass.lock"
#: How often a waiting process retries a held lock.
POLL_S = 0.2


@contextlib.contextmanager
def held_flock(path: Path, flags: int, mode: int = 0o600) -> Iterator[None]:
    """Hold ``flock(LOCK_EX)`` on ``path`` for the block, waiting until it is free: the short
    exclusive sections of hooks that run at once (``os.open`` ``flags``, always with O_NOFOLLOW:
    a link planted at the path is refused, never followed). The lock goes with the descriptor."""
    fd = os.open(path, flags | os.O_NOFOLLOW, mode)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)



def describe_holder(path: Path) -> str:
    """The holder recorded in a lock file, as one short line (never the raw file)."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8")[:1024])
        return (f"pid {int(doc['pid'])} on host {str(doc['host'])[:64]}, "
                f"{str(doc.get('what', 'a process'))[:64]} started {str(doc['started'])[:32]}")
    except (OSError, ValueError, KeyError, TypeError):
        return "an unknown process (lock file unreadable)"


class FolderLock:
    """``with FolderLock(folder, "telemetry daemon"):`` -- exclusive, or LockBusyError."""

    def __init__(self, folder: Path, what: str, timeout_s: float = 0.0) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self.what = what
        self.timeout_s = timeout_s
        self._fd: int | None = None

    def acquire(self) -> FolderLock:
        """Take the lock, waiting up to ``timeout_s`` (0: fail at once); LockBusyError names the holder.

        Idempotent: taking a lock this object already holds is a no-op (a second ``flock`` on a new
        descriptor would conflict with our own and name ourselves as the holder).
        """
        if self._fd is not None:
            return self
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        deadline = time.monotonic() + max(0.0, self.timeout_s)
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = describe_holder(self.path)
                    os.close(fd)
                    waited = f" after waiting {self.timeout_s:g} s" if self.timeout_s > 0 else ""
                    raise LockBusyError(
                        f"{self.folder} is locked by {holder}{waited}; only one {self.what} may use "
                        f"it at a time (lock file {self.path})"
                    ) from None
                time.sleep(POLL_S)
        # Ours now: record who we are (truncate + write in place; the lock is on the inode).
        doc = {"pid": os.getpid(), "host": socket.gethostname(), "what": self.what,
               "started": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
        with contextlib.suppress(OSError):  # disk full: the lock holds anyway, only the name is lost
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(doc) + "\n").encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        """Drop the lock (the file stays: unlinking it would race with a waiting process)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing the last descriptor releases the flock
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()
