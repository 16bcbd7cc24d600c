"""The wattclass token in a job's admin_comment, and the canary arm it carries.

job_submit.lua writes ``wattclass:label=..;conf=..;cap=..;src=..;mode=..[;arm=capped|control]``;
the Prolog (plugin layer) reads it to cap, and the nightly run (classifier layer) reads it to know
which jobs were really capped for the canary comparison. Both layers need the same parser, so it
lives in the foundation. Standard library only: the Prolog imports it on every job start.

The canary arm (issue 12) is decided at submission from ``canary_key``: Slurm's job_submit/lua gets
no job id (25.11's job_desc getter has no ``job_id`` field; in 22.05 it is NO_VAL unless the user
passed --jobid), so the key is the user and the UTC day of submission (``CANARY_PERIOD_S``). Not
the job name nor the second: a user controls both, and could resubmit or rename until a job lands
in the uncapped arm. With user + day the arm cannot be re-rolled: a user is in one arm for the
whole day, whatever they submit. ``canary_bucket`` is a small polynomial hash written so Lua 5.1
(doubles, no bit operators) computes the same value exactly.
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

from wattclass.caps import Cap, parse_cap
from wattclass.errors import ConfigError
from wattclass.labeltable import LABELS, MODES

COMMENT_PREFIX = "wattclass:"
ARMS: tuple[str, ...] = ("capped", "control")
#: Buckets of the canary hash; a fraction is resolved to 1/10000.
CANARY_BUCKETS = 10000
#: The arm is fixed per user for this long (UTC days): users cannot re-roll it by resubmitting.
CANARY_PERIOD_S = 86400
_HASH_MOD = 2147483647  # 2^31 - 1: h * 257 + byte stays below 2^53, exact in a Lua double
_SRC_UNSAFE = re.compile(r"[^A-Za-z0-9._:-]")


class Comment(NamedTuple):
    """The wattclass token of an admin_comment. ``arm`` is None when the policy has no canary."""

    label: str
    confidence: float
    cap: Cap | None
    source: str
    mode: str
    arm: str | None = None

    def capped_for_real(self) -> bool:
        """Whether the Prolog sets the cap: the canary arm decides; without one, the mode does."""
        if self.cap is None:
            return False
        if self.arm is not None:
            return self.arm == "capped"
        return self.mode == "enforce"


def format_comment(label: str, confidence: float, cap: str | None, source: str, mode: str,
                   arm: str | None = None) -> str:
    """The admin_comment token (job_submit.lua's ``format_comment`` builds the same text)."""
    parts = [f"label={label}", f"conf={confidence:.2f}"]
    if cap:
        parts.append(f"cap={cap}")
    parts += [f"src={_SRC_UNSAFE.sub('_', source)}", f"mode={mode}"]
    if arm is not None:
        parts.append(f"arm={arm}")
    return COMMENT_PREFIX + ";".join(parts)


def parse_admin_comment(text: str | None) -> Comment | None:
    """Parse the wattclass token of an admin_comment; None if absent or malformed."""
    if not text:
        return None
    token = next((t for t in text.split() if t.startswith(COMMENT_PREFIX)), None)
    if token is None:
        return None
    fields: dict[str, str] = {}
    for part in token[len(COMMENT_PREFIX):].split(";"):
        key, sep, value = part.partition("=")
        if not sep or key in fields:
            return None
        fields[key] = value
    try:
        label, mode = fields["label"], fields["mode"]
        conf = float(fields["conf"])
        cap = parse_cap(fields["cap"], "admin_comment cap") if "cap" in fields else None
    except (KeyError, ValueError, ConfigError):
        return None
    arm = fields.get("arm")
    if label not in LABELS or mode not in MODES or (arm is not None and arm not in ARMS):
        return None
    return Comment(label, conf, cap, fields.get("src", ""), mode, arm)


def canary_key(user: str | None, submit_s: int) -> str:
    """What decides a job's arm: the user and the UTC day of submission (nothing a user can vary)."""
    return f"{user or ''}\n{int(submit_s) // CANARY_PERIOD_S}"


def canary_bucket(key: str) -> int:
    """A bucket in [0, CANARY_BUCKETS) from the key's UTF-8 bytes (mirrored in job_submit.lua)."""
    h = 0
    for b in key.encode("utf-8"):
        h = (h * 257 + b) % _HASH_MOD
    return h % CANARY_BUCKETS


def canary_threshold(fraction: float) -> int:
    """Buckets in the canary for a policy fraction (the label table carries this integer to Lua)."""
    return math.floor(fraction * CANARY_BUCKETS + 0.5)


def canary_arm(threshold: int, mode: str, key: str) -> str | None:
    """The job's arm, or None without a canary (threshold 0).

    The canary is the jobs whose bucket is below ``threshold`` (see ``canary_threshold``). In
    shadow mode the canary is capped for real (everyone else is the control); in enforce mode the
    canary is left uncapped as the control arm. So ``arm`` always says what really happened.
    """
    if threshold <= 0:
        return None
    in_canary = canary_bucket(key) < threshold
    if mode == "enforce":
        return "control" if in_canary else "capped"
    return "capped" if in_canary else "control"
