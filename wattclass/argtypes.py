"""Checks of command-line values shared by every subcommand: argparse ``type=`` functions for
numbers and dates, and path checks for the handlers.

Why: each parser took ``type=int``/``type=float`` and each command checked (or forgot to check)
the range itself, so ``simulate --top -1`` dropped a row, ``nightly --workers -2`` and
``calibrate --kernel-seconds 0`` were taken silently, ``--speed inf`` was a traceback and
``--date 20261129`` (which ``date.fromisoformat`` accepts since Python 3.11) named a partition that
never exists. A ``type=`` function refuses the value while the arguments are parsed, before a
command opens a GPU or creates a folder: argparse prints ``argument --top: ...`` with the value,
and ``wattclass`` exits 2 (usage), as documented.

Paths are checked in the handlers, not here: the systemd units' paths are parsed on machines
where they do not exist (tests/test_deploy_units.py), and a path's state belongs to run time.
Only the standard library is imported: the node daemon builds its parser from this module.
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import re
from collections.abc import Callable
from pathlib import Path

from wattclass.errors import ConfigError

_ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_HOST_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,252}")


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None


def int_at_least(minimum: int) -> Callable[[str], int]:
    """A ``type=`` for a whole number ``>= minimum`` (a count, a size, an index)."""

    def parse(text: str) -> int:
        value = _int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {minimum}, got {text!r}")
        return value

    parse.__name__ = f"int_at_least_{minimum}"
    return parse


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def positive_float(text: str) -> float:
    """A ``type=`` for a finite number > 0 (a duration, a period, a speed)."""
    value = _finite(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    """A ``type=`` for a finite number >= 0 (a wait where 0 means "not at all")."""
    value = _finite(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def is_iso_date(text: str) -> bool:
    """True for a real calendar day written YYYY-MM-DD, the form of the ``date=`` folders
    (``date.fromisoformat`` alone also takes ``20261129`` and ``2026-W48-1``)."""
    if not _ISO_DATE.fullmatch(text):
        return False
    try:
        dt.date.fromisoformat(text)
    except ValueError:
        return False
    return True


def iso_date(text: str) -> str:
    """A ``type=`` for a day, YYYY-MM-DD; the text is kept (it names ``date=`` partitions)."""
    if not is_iso_date(text):
        raise argparse.ArgumentTypeError(f"expected a day YYYY-MM-DD, got {text!r}")
    return text


def host_name(text: str) -> str:
    """A ``type=`` for a node's short name, as Slurm and the ``host=`` folders use it: letters,
    digits, '.', '_' and '-', not starting with '.' or '-' (253 characters at most).

    Why: the daemon makes ``wal/HOST`` and ``host=HOST`` folders from it, so ``--host ../x`` put its
    write-ahead log beside ``wal/`` and a name with '/' or a space made folders no node name
    matches (the nightly checks windows' hosts against Slurm's)."""
    if not _HOST_NAME.fullmatch(text):
        raise argparse.ArgumentTypeError("expected a host name (letters, digits, '.', '_', '-'; not "
                                         f"starting with '.' or '-'), got {text!r}")
    return text


def existing_dir(path: Path, option: str) -> Path:
    """``path`` if it is a folder; else ConfigError naming ``option`` and the path.

    For a folder a command reads (a data root): a typo must not be created as a new, empty one."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"{option} {p}: no such folder")
    if not p.is_dir():
        raise ConfigError(f"{option} {p}: not a folder")
    return p


def existing_file(path: Path, option: str) -> Path:
    """``path`` if it is a file (not a folder); else ConfigError naming ``option`` and the path."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"{option} {p}: no such file")
    if p.is_dir():
        raise ConfigError(f"{option} {p}: is a folder, not a file")
    return p
