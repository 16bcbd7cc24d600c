"""Whether another holder has a ``flock`` on a path: tests that a lock is held while a step runs."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


def flock_held(path: Path, flags: int = os.O_RDONLY) -> bool:
    """True when ``flock(LOCK_EX | LOCK_NB)`` on ``path`` (opened with ``flags``) would block:
    another open file description holds the lock now."""
    fd = os.open(path, flags)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
