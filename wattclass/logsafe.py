"""User strings made safe for one log line: short, and no control characters.

Hooks run as root on user-controlled input (job names, comments, user names, paths a user picked,
error texts that quote them). A 100 KB job name must not cost 100 KB of log per job, and a newline
in it must not forge a second log line. job_submit.lua has the same rule (its ``clip``).
"""

from __future__ import annotations

import logging
from typing import Any

#: Characters of one user string kept in a log line.
LOG_MAX = 200


def clip(value: object, limit: int = LOG_MAX) -> str:
    """``value`` as text of at most ``limit`` characters (plus a length note), control characters
    and backslashes escaped as ``\\xNN``."""
    text = str(value)
    extra = f"...({len(text)} chars)" if len(text) > limit else ""
    out = []
    for ch in text[:limit]:
        o = ord(ch)
        out.append(f"\\x{o:02x}" if o < 0x20 or o == 0x7F or ch == "\\" or 0x80 <= o < 0xA0 else ch)
    return "".join(out) + extra


class ClipFilter(logging.Filter):
    """Clip every argument of a log record (the message template is ours; the arguments are not)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "wattclass_clipped", False):  # one record, several handlers: clip once
            return True
        record.wattclass_clipped = True
        if isinstance(record.args, tuple) and record.args:
            record.args = tuple(_clip_arg(a) for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: _clip_arg(v) for k, v in record.args.items()}
        return True


def _clip_arg(value: Any) -> Any:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value  # numbers keep their %d / %.1f formatting
    return clip(value)
