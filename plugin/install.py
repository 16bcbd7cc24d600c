"""Render the installable hook files with site paths filled in.

job_submit.lua and the Prolog/Epilog wrappers carry their configuration in one line each at the
top, so a sysadmin can read them; these functions rewrite exactly those lines (the values are
written as a Lua string literal / a single-quoted shell word, so no path can inject code).
"""

from __future__ import annotations

import argparse
import re
import shlex
from importlib import resources
from pathlib import Path
from typing import Any

from wattclass.errors import ConfigError
from wattclass.labeltable import lua_string

_LUA_LINE = re.compile(r'^local LABEL_TABLE = (".*")$', re.MULTILINE)
_REPO_DEPLOY = Path(__file__).resolve().parent.parent / "deploy" / "slurm"


def job_submit_source() -> str:
    """The packaged job_submit.lua."""
    return resources.files("wattclass.plugin").joinpath("job_submit.lua").read_text(encoding="utf-8")


def render_job_submit(table_path: Path | str) -> str:
    """job_submit.lua reading the label table at ``table_path``, an absolute path.

    Why absolute: slurmctld would resolve a relative one from its own working folder, and
    job_submit.lua checks the folders above the table only as far as the path names them, so
    ``etc/slurm/wattclass/labels.tsv`` left every folder from the working one up to ``/`` unchecked.
    """
    if not str(table_path).startswith("/"):
        raise ConfigError(f"--table {str(table_path)!r}: give an absolute path (slurmctld would read a "
                          "relative one from its own working folder, whose folders job_submit.lua "
                          "does not check)")
    src = job_submit_source()
    if len(_LUA_LINE.findall(src)) != 1:
        raise ConfigError("job_submit.lua: expected exactly one `local LABEL_TABLE = ...` line")
    return _LUA_LINE.sub(lambda _m: f"local LABEL_TABLE = {lua_string(str(table_path))}", src)


def table_literal(src: str) -> str | None:
    """The Lua string literal a job_submit.lua's ``local LABEL_TABLE = ...`` line holds (as
    ``render_job_submit`` writes it), or None if it has no such line."""
    m = _LUA_LINE.search(src)
    return m.group(1) if m else None


def hook_template(kind: str) -> str:
    """deploy/slurm/{prolog,epilog}.sh from the package (installed) or the source tree."""
    if kind not in ("prolog", "epilog"):
        raise ConfigError(f"unknown hook {kind!r}")
    try:
        return resources.files("wattclass.deploy").joinpath(f"slurm/{kind}.sh").read_text(encoding="utf-8")
    except (FileNotFoundError, ModuleNotFoundError):
        return (_REPO_DEPLOY / f"{kind}.sh").read_text(encoding="utf-8")


class _HookArgParser(argparse.ArgumentParser):
    """The hooks' own option parser, raising instead of exiting (``check_hook_args``)."""

    def error(self, message: str) -> Any:  # argparse calls it for every usage error
        raise ConfigError(message)


def check_hook_args(args: list[str], where: str = "hook arguments") -> argparse.Namespace:
    """The hooks' options as ``python -m wattclass.plugin.prolog`` will parse them; ConfigError
    naming ``where`` and the option when it would reject them or would cap nothing.

    Why: the Prolog parses strictly (``parse_args``) and exits 2 on an unknown option or a bad
    value, and the wrapper exits 0 whatever happens (a hook must never drain a node), so a typo
    such as ``--stat-dir`` left every job on the node uncapped, seen only in syslog."""
    from wattclass.plugin.prolog import add_arguments

    parser = _HookArgParser(prog="wattclass-hook", add_help=False)
    add_arguments(parser)
    try:
        ns = parser.parse_args(args)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc} (the hooks would exit without capping)") from exc
    # on what the hooks will read, not the words given: argparse takes "--dry" for --dry-run too
    for option, dest in (("--dry-run", "dry_run"), ("--admin-comment", "admin_comment")):
        if getattr(ns, dest) not in (False, None):  # for a trial by hand, never for slurmd
            raise ConfigError(f"{where}: {option} makes the hooks set no cap (for a trial by hand only)")
    # the wrappers run from / (cd /): a relative --log or --state-dir named a file or folder in /
    for action in parser._actions:
        value = getattr(ns, action.dest, None)
        if isinstance(value, Path) and not value.is_absolute():
            raise ConfigError(f"{where}: {action.option_strings[0]} {str(value)!r}: give an absolute path "
                              "(the hooks run from /)")
    return ns


def render_hook(kind: str, python: str, args: list[str]) -> str:
    """The wrapper with ``PYTHON`` and ``WATTCLASS_ARGS`` set (``python`` must be absolute)."""
    if not python.startswith("/"):
        raise ConfigError(f"--python {python!r}: slurmd has no PATH, give an absolute path")
    for a in args:
        if any(c in a for c in " \t\n'\"\\$`"):
            raise ConfigError(f"hook argument {a!r}: spaces and shell characters are not allowed")
    check_hook_args(args, "--hook-args")
    src = hook_template(kind)
    src, n1 = re.subn(r"^PYTHON=.*$", lambda _m: f"PYTHON={shlex.quote(python)}", src, flags=re.MULTILINE)
    src, n2 = re.subn(r"^WATTCLASS_ARGS=.*$", lambda _m: f'WATTCLASS_ARGS="{" ".join(args)}"', src,
                      flags=re.MULTILINE)
    if n1 != 1 or n2 != 1:
        raise ConfigError(f"{kind}.sh: expected one PYTHON= and one WATTCLASS_ARGS= line")
    return src
