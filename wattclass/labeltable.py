"""The submission-time label table: the contract between the nightly run and job_submit.lua.

Jobs do not exist yet when they are submitted, so the nightly run condenses past labels into
keys from most to least specific (user + job name, user, account) and writes them, with the
policy's decision per label, as a Lua file that ``job_submit.lua`` loads with ``dofile``. Lua
never parses TOML and never sees a user string except as a table key.

File layout (version 1)::

    return {
      version = 1, generated_at = "2026-11-29T03:00:00Z",
      policy = { mode = "enforce", min_confidence = 0.8, decisions = { memory = {...}, ... },
                 exempt = { accounts = { benchmark = true }, partitions = {...}, users = {...} } },
      by_user_name = { ["alice"] = { ["train.sh"] = { label = "memory", confidence = 0.93,
                                                      n = 12, source = "rule" } } },
      by_user = { ["alice"] = { ... } },
      by_account = { ["physics"] = { ... } },
    }

Every string is written as a Lua literal with non-printable bytes, quotes and backslashes as
``\\ddd`` escapes, so a job name can hold quotes, newlines, ``%`` or ``]]`` and still only ever
be data. Written atomically (temp file + rename), mode 0644.
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, NamedTuple

from wattclass.errors import ConfigError, DataError
from wattclass.fsutil import atomic_write_text

TABLE_VERSION = 1
Level = Literal["user_name", "user", "account"]
#: Job labels and policy modes: the table's vocabulary, shared by the policy, the nightly run and
#: the Prolog (this module imports only the standard library, so the Prolog stays fast).
LABELS = ("compute", "memory", "mixed", "idle")
MODES = ("enforce", "shadow")


class TableEntry(NamedTuple):
    """One key of the table. ``name`` is set only for level user_name, ``account`` only for account."""

    level: Level
    user: str | None
    name: str | None
    account: str | None
    label: str
    confidence: float
    n_jobs: int
    source: str


def lua_string(value: str) -> str:
    """A Lua 5.1 string literal for any text: printable ASCII as is, every other byte as \\ddd."""
    out = ['"']
    for b in value.encode("utf-8"):
        if 32 <= b < 127 and b not in (34, 92):  # printable, not " or \
            out.append(chr(b))
        else:
            out.append(f"\\{b:03d}")
    out.append('"')
    return "".join(out)


def lua_value(value: Any, indent: int = 0) -> str:
    """Serialise nested dicts/lists/str/int/float/bool/None as a Lua expression."""
    pad = "  " * (indent + 1)
    if value is None:
        return "nil"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(f"label table: cannot write non-finite number {value}")
        return repr(value)
    if isinstance(value, str):
        return lua_string(value)
    if isinstance(value, Mapping):
        if not value:
            return "{}"
        items = [f"{pad}[{lua_string(str(k))}] = {lua_value(v, indent + 1)}," for k, v in value.items()]
        return "{\n" + "\n".join(items) + "\n" + "  " * indent + "}"
    if isinstance(value, list | tuple):
        if not value:
            return "{}"
        return "{ " + ", ".join(lua_value(v, indent + 1) for v in value) + " }"
    raise ConfigError(f"label table: cannot write value of type {type(value).__name__}")


def build_table(
    entries: Iterable[TableEntry],
    policy: Mapping[str, Any] | None = None,
    generated_at: dt.datetime | None = None,
) -> dict[str, Any]:
    """Arrange entries into the nested table (see module docstring)."""
    by_user_name: dict[str, dict[str, dict[str, Any]]] = {}
    by_user: dict[str, dict[str, Any]] = {}
    by_account: dict[str, dict[str, Any]] = {}
    for e in entries:
        if e.label not in LABELS:
            raise ConfigError(f"label table: unknown label {e.label!r} for {e.level} key")
        if not 0.0 <= e.confidence <= 1.0:
            raise ConfigError(f"label table: confidence {e.confidence} outside [0, 1]")
        rec = {"label": e.label, "confidence": round(float(e.confidence), 4), "n": int(e.n_jobs),
               "source": e.source}
        if e.level == "user_name":
            if not e.user or e.name is None:
                raise ConfigError("label table: user_name entry needs user and name")
            by_user_name.setdefault(e.user, {})[e.name] = rec
        elif e.level == "user":
            if not e.user:
                raise ConfigError("label table: user entry needs user")
            by_user[e.user] = rec
        elif e.level == "account":
            if not e.account:
                raise ConfigError("label table: account entry needs account")
            by_account[e.account] = rec
        else:
            raise ConfigError(f"label table: unknown level {e.level!r}")
    when = (generated_at or dt.datetime.now(dt.UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "version": TABLE_VERSION,
        "generated_at": when,
        "policy": dict(policy) if policy is not None else None,
        "by_user_name": by_user_name,
        "by_user": by_user,
        "by_account": by_account,
    }


def render_table(table: Mapping[str, Any]) -> str:
    """The Lua source of a table built by build_table."""
    return "-- wattclass label table: written by `wattclass nightly`; do not edit by hand.\n" + (
        "return " + lua_value(table) + "\n"
    )


def write_label_table(
    path: Path,
    entries: Iterable[TableEntry],
    policy: Mapping[str, Any] | None = None,
    generated_at: dt.datetime | None = None,
) -> None:
    """Write the table atomically to ``path`` (mode 0644; job_submit.lua refuses writable-by-others)."""
    atomic_write_text(Path(path), render_table(build_table(entries, policy, generated_at)), mode=0o644)


# -- reading (policy explain, tests) ---------------------------------------------------------
_LUA_TOKEN = re.compile(
    r"""\s*(?:
      (?P<comment>--[^\n]*)
    | (?P<string>"(?:[^"\\\n]|\\[0-9]{1,3}|\\[\\"'nrt])*")
    | (?P<number>-?(?:[0-9]+\.?[0-9]*(?:[eE][-+]?[0-9]+)?|\.[0-9]+(?:[eE][-+]?[0-9]+)?))
    | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
    | (?P<punct>[{}\[\]=,;])
    )""",
    re.VERBOSE,
)
_ESCAPES = {"n": 10, "r": 13, "t": 9, "\\": 92, '"': 34, "'": 39}


def _unlua_string(lit: str) -> str:
    out = bytearray()
    body, i = lit[1:-1], 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out += c.encode("utf-8")
            i += 1
            continue
        nxt = body[i + 1]
        if nxt.isdigit():
            j = i + 1
            while j < len(body) and j < i + 4 and body[j].isdigit():
                j += 1
            out.append(int(body[i + 1 : j]))
            i = j
        else:
            out.append(_ESCAPES[nxt])
            i += 2
    return out.decode("utf-8", errors="replace")


def parse_lua_table(text: str, source: str = "<label table>") -> Any:
    """Parse the subset of Lua that ``render_table`` writes (``return`` + a literal) into Python.

    Tables with only positional items become lists; others dicts. Not a Lua interpreter: anything
    outside the subset (calls, operators) is a DataError naming ``source``.
    """
    toks: list[tuple[str, str]] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        m = _LUA_TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise DataError(f"{source}: cannot parse label table near byte {pos}")
        pos = m.end()
        kind = m.lastgroup or ""
        if kind != "comment":
            toks.append((kind, m.group(kind)))
    it = itertools.chain(toks, itertools.repeat(("eof", "")))
    cur = [next(it)]

    def take(kind: str | None = None, value: str | None = None) -> tuple[str, str]:
        tok = cur[0]
        if (kind and tok[0] != kind) or (value is not None and tok[1] != value):
            raise DataError(f"{source}: unexpected {tok[1] or 'end of file'!r} in label table")
        cur[0] = next(it)
        return tok

    def value() -> Any:
        kind, text_ = cur[0]
        if kind == "string":
            take()
            return _unlua_string(text_)
        if kind == "number":
            take()
            return float(text_) if any(c in text_ for c in ".eE") else int(text_)
        if kind == "word" and text_ in ("true", "false", "nil"):
            take()
            return {"true": True, "false": False, "nil": None}[text_]
        if kind == "punct" and text_ == "{":
            return table()
        raise DataError(f"{source}: unexpected {text_ or 'end of file'!r} in label table")

    def table() -> Any:
        take("punct", "{")
        items: list[Any] = []
        mapping: dict[Any, Any] = {}
        while cur[0] != ("punct", "}"):
            kind, text_ = cur[0]
            if (kind, text_) == ("punct", "["):
                take()
                key = value()
                take("punct", "]")
                take("punct", "=")
                mapping[key] = value()
            elif kind == "word" and text_ not in ("true", "false", "nil"):
                take()
                take("punct", "=")
                mapping[text_] = value()
            else:
                items.append(value())
            if cur[0][0] == "punct" and cur[0][1] in (",", ";"):
                take()
        take("punct", "}")
        if items and mapping:
            raise DataError(f"{source}: mixed list and map table in label table")
        return items if items else mapping

    take("word", "return")
    result = value()
    take("eof")
    return result


def read_label_table(path: Path) -> dict[str, Any]:
    """Read a label table written by ``write_label_table`` back into the dict build_table made."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise DataError(f"{path}: label table not found") from exc
    table = parse_lua_table(text, str(path))
    if not isinstance(table, dict) or table.get("version") != TABLE_VERSION:
        raise DataError(f"{path}: not a version {TABLE_VERSION} wattclass label table")
    return table
