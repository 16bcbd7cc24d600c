"""The submission-time label table: the contract between the nightly run and job_submit.lua.

Jobs do not exist yet when they are submitted, so the nightly run condenses past labels into
keys from most to least specific (user + job name, user, account) and writes them, with the
policy's decision per label, to a file that ``job_submit.lua`` reads inside slurmctld.

The file is DATA, not code (issue 9 item 13): slurmctld never runs it, so a hostile or broken
table can at worst be refused, never hang slurmctld or hit Lua's "constant table overflow".
Format (version 2), UTF-8, one record per line, fields separated by one TAB::

    wattclass-labels<TAB>2
    generated_at<TAB>2026-11-29T03:00:00Z
    mode<TAB>enforce
    min_confidence<TAB>0.8
    min_confidence_label<TAB>memory<TAB>0.9          (only labels with their own threshold, issue 13)
    canary_threshold<TAB>1000                        (only with a canary: buckets of 10000, issue 12)
    decision<TAB>memory<TAB>60%<TAB>hbm,slow        (label, cap or "-", features or "-")
    feature<TAB>hbm                                  (a feature that exists on some node)
    exempt<TAB>partition<TAB>debug                   (partition, account or user)
    entry<TAB>user_name<TAB>alice<TAB>train.sh<TAB>memory<TAB>0.93<TAB>12<TAB>rule
    entry<TAB>user<TAB>alice<TAB>-<TAB>mixed<TAB>0.6<TAB>20<TAB>rule
    entry<TAB>account<TAB>physics<TAB>-<TAB>compute<TAB>0.99<TAB>3<TAB>model

Key fields (user, job name, account, partition, source) are percent-encoded: ``%``, TAB, newline
and every other byte below 0x20 or 0x7f become ``%XX`` (two upper-case hex digits), so a job name
can hold anything and still only ever be one field. job_submit.lua splits lines and fields with
``string.find(..., plain=true)``; no user string is ever a Lua pattern. Policy lines come first,
then entries from most to least confident, so a reader that stops early keeps the best entries.

Compatibility: readers (job_submit.lua, ``parse_label_table``) refuse a whole table that holds a
record they do not know, never skip it, and a refused table leaves every job as submitted
(uncapped, logged). So a new record can be added within version 2 when it is written only where
used: a table without ``min_confidence_label`` is byte-identical to before, and an older
job_submit.lua that meets one refuses the table ("unknown record") rather than decide with the
global threshold alone, which for a stricter ``memory`` threshold would cap exactly the jobs the
sysadmin wanted left alone. A change to what an existing record means needs a new version.

Size limits: the writer keeps at most ``MAX_ENTRIES`` entries and ``MAX_BYTES`` bytes (the most
confident, then those with the most jobs; how many it dropped is logged and returned), no job
name over ``MAX_NAME_BYTES`` and at most ``MAX_NAMES_PER_USER`` names per user (names are user
strings: one user must not crowd the others out); job_submit.lua reads at most
``MAX_BYTES`` bytes and ignores the rest (it logs that it did). Written atomically (temp file +
rename + fsync), mode 0640 root:<slurmctld's group> or 0644 (``write_label_table``), so
job_submit.lua, which refuses files others can write, accepts it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import math
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal, NamedTuple

from wattclass.errors import ConfigError, DataError
from wattclass.fsutil import atomic_writer, make_dirs
from wattclass.lockfile import held_flock

TABLE_VERSION = 2
HEADER = "wattclass-labels"
#: The writer keeps at most this many entries (see module docstring). Sized by docs/benchmarks.md:
#: slurmctld parses a new table inside the first submission after it, holding its job lock (100k
#: keys: a third of a second; 1M took seconds and timed out that sbatch on a loaded machine), and
#: with the table in slurmctld's Lua heap sbatch throughput stayed >= 0.97 of a cluster without
#: the hook at 100k keys on Slurm 22.05 and 25.11, but only 0.966-0.973 at 200k on 25.11.
#: job_submit.lua's MAX_BYTES (plugin/job_submit.lua) bounds what it reads from any file.
MAX_ENTRIES = 100_000
MAX_BYTES = 16 * 1024 * 1024
#: Job names are user strings and become keys: a name longer than this (UTF-8 bytes) gets no
#: user+name key (its jobs fall through to the user key), and one user keeps at most
#: MAX_NAMES_PER_USER names (the best ranked), so no user can crowd the others out of the table.
MAX_NAME_BYTES = 256
MAX_NAMES_PER_USER = 2000
Level = Literal["user_name", "user", "account"]
#: Job labels and policy modes: the table's vocabulary, shared by the policy, the nightly run and
#: the Prolog (this module imports only the standard library, so the Prolog stays fast).
LABELS = ("compute", "memory", "mixed", "idle")
MODES = ("enforce", "shadow")
_LEVELS = ("user_name", "user", "account")
_EXEMPT_KINDS = {"partition": "partitions", "account": "accounts", "user": "users"}

log = logging.getLogger(__name__)

_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def slurm_account(name: str) -> str:
    """An account name as Slurm keeps it: lower-cased (``xstrtolower``, C ``tolower``: ASCII letters
    only, as Lua's ``string.lower``), after job_submit and matching associations ignoring case.
    Account keys, exemptions and job_submit.lua's lookups all use this spelling, so ``-A PHYSICS``
    cannot miss the physics key."""
    return name.translate(_ASCII_LOWER)


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
    """A Lua 5.1 string literal for any text: printable ASCII as is, every other byte as \\ddd.

    Used where a path is written into job_submit.lua (``plugin install-lua``) and by tests.
    """
    out = ['"']
    for b in value.encode("utf-8"):
        if 32 <= b < 127 and b not in (34, 92):  # printable, not " or \
            out.append(chr(b))
        else:
            out.append(f"\\{b:03d}")
    out.append('"')
    return "".join(out)


def lua_value(value: Any, indent: int = 0) -> str:
    """Serialise nested dicts/lists/str/int/float/bool/None as a Lua expression (tests, drivers)."""
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


def encode_field(value: str) -> str:
    """Percent-encode ``%``, TAB, newline and other control bytes (see module docstring)."""
    if value == "":
        return "%"  # an empty key is written as a lone "%" so it stays a field ("-" means none)
    out = []
    for ch in value:
        o = ord(ch)
        if o < 0x20 or o == 0x7F or ch == "%" or (ch == "-" and value == "-"):
            out.append(f"%{o:02X}")
        else:
            out.append(ch)
    return "".join(out)


def decode_field(text: str, where: str) -> str:
    """Inverse of ``encode_field``; DataError naming ``where`` on a bad escape."""
    if text == "%":
        return ""
    if "%" not in text:
        return text
    out, i = [], 0
    while i < len(text):
        c = text[i]
        if c == "%":
            hx = text[i + 1:i + 3]
            if len(hx) != 2 or not re.fullmatch(r"[0-9A-F]{2}", hx):
                raise DataError(f"{where}: bad %-escape {text[i:i + 3]!r}")
            out.append(chr(int(hx, 16)))
            i += 3
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _rank(e: TableEntry) -> tuple[float, int, int]:
    return (-float(e.confidence), -int(e.n_jobs), _LEVELS.index(e.level))


def limit_entries(entries: Iterable[TableEntry], max_entries: int = MAX_ENTRIES,
                  max_bytes: int = MAX_BYTES) -> tuple[list[TableEntry], int]:
    """The entries to write, most confident first, at most ``max_entries`` lines and ``max_bytes``
    bytes of them; and how many were dropped.

    Past a limit the least confident keys go (ties: fewer jobs, then the broader level), since a
    dropped key only means a job falls through to a broader key or stays unlabelled (uncapped).
    User+name keys with a name over ``MAX_NAME_BYTES``, or past a user's ``MAX_NAMES_PER_USER``,
    are dropped first (logged): job names are the users' own strings.
    """
    kept: list[TableEntry] = []
    names: dict[str | None, int] = {}
    long_names = over_quota = 0
    size = 0
    ordered = sorted(entries, key=_rank)
    for e in ordered:
        if e.level == "user_name":
            if len(str(e.name).encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES:
                long_names += 1
                continue
            if names.get(e.user, 0) >= MAX_NAMES_PER_USER:
                over_quota += 1
                continue
        line = len(_entry_line(e).encode("utf-8", "surrogateescape")) + 1
        if len(kept) >= max_entries or size + line > max_bytes:
            continue
        size += line
        kept.append(e)
        if e.level == "user_name":
            names[e.user] = names.get(e.user, 0) + 1
    if long_names:
        log.warning("label table: %d job name(s) longer than %d bytes get no user+name key",
                    long_names, MAX_NAME_BYTES)
    if over_quota:
        log.warning("label table: %d user+name key(s) past %d per user dropped (least confident first)",
                    over_quota, MAX_NAMES_PER_USER)
    return kept, len(ordered) - len(kept)


def build_table(
    entries: Iterable[TableEntry],
    policy: Mapping[str, Any] | None = None,
    generated_at: dt.datetime | None = None,
) -> dict[str, Any]:
    """Arrange entries into the nested table that ``read_label_table`` returns and decide.py reads."""
    by_user_name: dict[str, dict[str, dict[str, Any]]] = {}
    by_user: dict[str, dict[str, Any]] = {}
    by_account: dict[str, dict[str, Any]] = {}
    for e in entries:
        _check_entry(e)
        rec = {"label": e.label, "confidence": round(float(e.confidence), 4), "n": int(e.n_jobs),
               "source": e.source}
        if e.level == "user_name":
            by_user_name.setdefault(str(e.user), {})[str(e.name)] = rec
        elif e.level == "user":
            by_user[str(e.user)] = rec
        else:
            by_account[slurm_account(str(e.account))] = rec
    when = (generated_at or dt.datetime.now(dt.UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "version": TABLE_VERSION,
        "generated_at": when,
        "policy": dict(policy) if policy is not None else None,
        "by_user_name": by_user_name,
        "by_user": by_user,
        "by_account": by_account,
    }


def _check_entry(e: TableEntry) -> None:
    if e.label not in LABELS:
        raise ConfigError(f"label table: unknown label {e.label!r} for {e.level} key")
    if not 0.0 <= e.confidence <= 1.0:
        raise ConfigError(f"label table: confidence {e.confidence} outside [0, 1]")
    if e.level == "user_name" and (not e.user or e.name is None):
        raise ConfigError("label table: user_name entry needs user and name")
    if e.level == "user" and not e.user:
        raise ConfigError("label table: user entry needs user")
    if e.level == "account" and not e.account:
        raise ConfigError("label table: account entry needs account")
    if e.level not in _LEVELS:
        raise ConfigError(f"label table: unknown level {e.level!r}")


def _threshold(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= float(value) <= 1.0:
        raise ConfigError(f"label table: {what} {value!r} is not a number in [0, 1]")
    return float(value)


def _policy_lines(policy: Mapping[str, Any] | None) -> list[str]:
    if policy is None:
        return []
    lines = [f"mode\t{policy.get('mode', 'shadow')}",
             f"min_confidence\t{float(policy.get('min_confidence', 1.0))!r}"]
    for label, value in (policy.get("min_confidence_by_label") or {}).items():
        if label not in LABELS:
            raise ConfigError(f"label table: min_confidence for unknown label {label!r}")
        lines.append(f"min_confidence_label\t{label}\t{_threshold(value, f'min_confidence of {label}')!r}")
    threshold = int(policy.get("canary_threshold") or 0)
    if threshold > 0:
        lines.append(f"canary_threshold\t{threshold}")
    for label, dec in (policy.get("decisions") or {}).items():
        if label not in LABELS:
            raise ConfigError(f"label table: policy decision for unknown label {label!r}")
        cap = dec.get("cap") or "-"
        feats = ",".join(dec.get("features") or []) or "-"
        if any(c in cap + feats for c in "\t\n\r"):
            raise ConfigError(f"label table: cap {cap!r} / features {feats!r} of {label} are not plain")
        lines.append(f"decision\t{label}\t{cap}\t{feats}")
    avail = policy.get("features_available") or {}
    lines += [f"feature\t{encode_field(f)}" for f, on in avail.items() if on]
    for kind, key in _EXEMPT_KINDS.items():
        lines += [f"exempt\t{kind}\t{encode_field(slurm_account(v) if kind == 'account' else v)}"
                  for v, on in ((policy.get("exempt") or {}).get(key) or {}).items() if on]
    return lines


def _entry_line(e: TableEntry) -> str:
    if e.level == "user_name":
        k1, k2 = str(e.user), encode_field(str(e.name))
    elif e.level == "user":
        k1, k2 = str(e.user), "-"
    else:
        k1, k2 = slurm_account(str(e.account)), "-"
    conf = repr(round(float(e.confidence), 4))
    return "\t".join(("entry", e.level, encode_field(k1), k2, e.label, conf, str(int(e.n_jobs)),
                      encode_field(e.source)))


def render_table(entries: Iterable[TableEntry], policy: Mapping[str, Any] | None = None,
                 generated_at: dt.datetime | None = None) -> str:
    """The text of a version 2 table (entries written in the order given)."""
    when = (generated_at or dt.datetime.now(dt.UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
    lines = [f"{HEADER}\t{TABLE_VERSION}", f"generated_at\t{when}", *_policy_lines(policy)]
    for e in entries:
        _check_entry(e)
        lines.append(_entry_line(e))
    return "\n".join(lines) + "\n"


def write_label_table(
    path: Path,
    entries: Iterable[TableEntry],
    policy: Mapping[str, Any] | None = None,
    generated_at: dt.datetime | None = None,
    max_entries: int = MAX_ENTRIES,
    group: int | None = None,
) -> int:
    """Write the table atomically to ``path``; returns how many entries were dropped.

    With ``group`` (the group slurmctld runs in) the table is 0640 root:group: its keys are
    users' job names, which Slurm's PrivateData may hide from other users; without, 0644.
    Folders it creates are 0755 either way (their names are no secret, and slurmctld must
    reach the file).

    Past ``max_entries``, or past what job_submit.lua reads (``MAX_BYTES``, policy lines
    included), the least confident entries are dropped and a WARNING says how many (see
    ``limit_entries``).
    """
    head = len(render_table([], policy, generated_at).encode("utf-8"))
    kept, dropped = limit_entries(entries, max_entries, MAX_BYTES - head)
    if dropped:
        log.warning("label table %s: %d entries over the limit of %d dropped (least confident first; "
                    "at most %d bytes)", path, dropped, max_entries, MAX_BYTES)
    data = render_table(kept, policy, generated_at).encode("utf-8")
    with atomic_writer(Path(path), 0o640 if group is not None else 0o644, group=group, dir_mode=0o755) as fh:
        fh.write(data)
    return dropped


@contextlib.contextmanager
def table_write_lock(path: Path) -> Iterator[None]:
    """Hold the label table's write lock for the block (``flock`` on ``.<name>.lock`` beside it),
    waiting while another writer holds it.

    Why: the nightly run and ``policy apply`` both rewrite the table. A rollback applied while a
    nightly run was under way was undone minutes later, when that run wrote the policy it had
    read at its start: every new job enforced again. Each now writes under this lock, and the
    nightly reads its policy file again inside it (``classifier.nightly``), so the table ends
    with the policy file as it was at the last write, whichever writer came last."""
    path = Path(path)
    make_dirs(path.parent, 0o755)  # as write_label_table makes them
    with held_flock(path.with_name(f".{path.name}.lock"), os.O_RDWR | os.O_CREAT, 0o600):
        yield


# -- reading (policy explain, the demo, tests) ---------------------------------------------------
def parse_label_table(text: str, source: str = "<label table>") -> dict[str, Any]:
    """Parse a version 2 table into the nested dict ``build_table`` makes; DataError names the line."""
    entries, policy, when = parse_table_parts(text, source)
    table = build_table(entries, policy)
    table["generated_at"] = when
    return table


def parse_table_parts(text: str, source: str = "<label table>"
                      ) -> tuple[list[TableEntry], dict[str, Any] | None, str]:
    """A version 2 table's entries, policy (None without one) and generated_at, as written:
    ``policy apply`` rewrites the policy and keeps the entries."""
    lines = text.split("\n")
    if not lines or lines[0] != f"{HEADER}\t{TABLE_VERSION}":
        raise DataError(f"{source}: not a version {TABLE_VERSION} wattclass label table "
                        f"(first line must be {HEADER!r}, TAB, {TABLE_VERSION})")
    entries: list[TableEntry] = []
    policy: dict[str, Any] = {"decisions": {}, "features_available": {}, "min_confidence_by_label": {},
                              "exempt": {v: {} for v in _EXEMPT_KINDS.values()}}
    has_policy = False
    when = ""
    for no, line in enumerate(lines[1:], start=2):
        if line == "" or line.startswith("#"):
            continue
        f = line.split("\t")
        where = f"{source}: line {no}"
        try:
            kind = f[0]
            if kind == "generated_at" and len(f) == 2:
                when = f[1]
            elif kind == "mode" and len(f) == 2:
                policy["mode"], has_policy = f[1], True
            elif kind == "min_confidence" and len(f) == 2:
                value = float(f[1])
                if not 0.0 <= value <= 1.0:  # nan too: job_submit.lua refuses the table alike
                    raise DataError(f"{where}: min_confidence {f[1]!r} outside [0, 1]")
                policy["min_confidence"], has_policy = value, True
            elif kind == "min_confidence_label" and len(f) == 3 and f[1] in LABELS:
                value = float(f[2])
                if not 0.0 <= value <= 1.0:
                    raise DataError(f"{where}: min_confidence_label {f[1]} {f[2]!r} outside [0, 1]")
                policy["min_confidence_by_label"][f[1]] = value
            elif kind == "canary_threshold" and len(f) == 2:
                if not re.fullmatch(r"[0-9]+", f[1]):  # int() takes " 5", "+5", "1_0": job_submit.lua not
                    raise DataError(f"{where}: canary_threshold {f[1]!r} is not a whole number of buckets")
                policy["canary_threshold"] = int(f[1])
                if not 0 <= policy["canary_threshold"] <= 10000:
                    raise DataError(f"{where}: canary_threshold {f[1]!r} outside [0, 10000] buckets")
            elif kind == "decision" and len(f) == 4:
                policy["decisions"][f[1]] = {"cap": None if f[2] == "-" else f[2],
                                             "features": [] if f[3] == "-" else f[3].split(",")}
            elif kind == "feature" and len(f) == 2:
                policy["features_available"][decode_field(f[1], where)] = True
            elif kind == "exempt" and len(f) == 3 and f[1] in _EXEMPT_KINDS:
                policy["exempt"][_EXEMPT_KINDS[f[1]]][decode_field(f[2], where)] = True
            elif kind == "entry" and len(f) == 8 and f[1] in _LEVELS:
                k1, k2 = decode_field(f[2], where), decode_field(f[3], where)
                lvl = f[1]
                entry = TableEntry(
                    lvl, k1 if lvl != "account" else None,  # type: ignore[arg-type]
                    k2 if lvl == "user_name" else None, k1 if lvl == "account" else None,
                    f[4], float(f[5]), int(f[6]), decode_field(f[7], where))
                try:  # here, so that a bad label or confidence names the file and line
                    _check_entry(entry)
                except ConfigError as exc:
                    raise DataError(f"{where}: {str(exc).removeprefix('label table: ')}") from exc
                entries.append(entry)
            else:
                raise DataError(f"{where}: unknown or malformed record {f[0]!r} ({len(f)} fields)")
        except ValueError as exc:
            raise DataError(f"{where}: {exc}") from exc
    return entries, (policy if has_policy else None), when


def read_label_table(path: Path) -> dict[str, Any]:
    """Read a label table written by ``write_label_table`` back into the dict build_table made."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise DataError(f"{path}: label table not found") from exc
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: label table is not UTF-8: {exc}") from exc
    except OSError as exc:  # a folder given for the table was an IsADirectoryError traceback
        raise DataError(f"{path}: cannot read the label table: {exc.strerror or exc}") from exc
    return parse_label_table(text, str(path))
