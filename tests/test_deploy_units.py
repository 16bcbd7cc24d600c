"""The shipped systemd units call wattclass with options its parser really has."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from wattclass.cli import build_parser

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"


def _exec_lines(unit: Path) -> list[str]:
    """ExecStart*/ExecStartPost lines, continuation lines joined."""
    text = unit.read_text().replace("\\\n", " ")
    return [m.group(1) for m in re.finditer(r"^ExecStart(?:Post)?=-?(.*)$", text, re.M)]


def _wattclass_argv(line: str, env: dict[str, str]) -> list[str]:
    line = re.sub(r"\$\{?(\w+)\}?", lambda m: env.get(m.group(1), "X"), line)
    if "/bin/sh -c" in line:  # the command inside the shell string
        line = shlex.split(line)[2].split("exec ", 1)[1]
        line = re.sub(r"\$\([^)]*\)", "2026-11-30", line).replace("%%F", "")
    argv = shlex.split(line)
    assert argv[0].endswith("/wattclass"), line
    return [a for a in argv[1:] if a]


UNITS = ["wattclass-nightly.service", "wattclass-telemetry.service", "wattclass-reconcile.service"]


@pytest.mark.parametrize("unit", UNITS)
def test_unit_commands_parse(unit: str) -> None:
    path = DEPLOY / unit
    env = dict(re.findall(r"^Environment=(\w+)=(.*)$", path.read_text(), re.M))
    lines = _exec_lines(path)
    assert lines
    parser = build_parser()
    for line in lines:
        args = parser.parse_args(_wattclass_argv(line, env))  # SystemExit on an unknown option
        assert callable(args.func)


def _directives(unit: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in unit.read_text().replace("\\\n", " ").splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key.strip(), []).append(value.strip())
    return out


@pytest.mark.parametrize("unit", UNITS)
def test_units_read_site_settings_from_etc_default(unit: str) -> None:
    assert "-/etc/default/wattclass" in _directives(DEPLOY / unit).get("EnvironmentFile", [])


def test_nightly_unit_has_its_state_directory() -> None:
    d = _directives(DEPLOY / "wattclass-nightly.service")
    assert d["StateDirectory"] == ["wattclass"]
    assert "/var/lib/wattclass" in d["ReadWritePaths"][0].split()


def test_reconcile_unit_runs_once_before_slurmd() -> None:
    d = _directives(DEPLOY / "wattclass-reconcile.service")
    assert d["Type"] == ["oneshot"] and d["Before"] == ["slurmd.service"]
    assert "Requires" not in d and "RequiredBy" not in d  # a failed reconcile must not keep slurmd down
    argv = _wattclass_argv(_exec_lines(DEPLOY / "wattclass-reconcile.service")[0],
                           dict(re.findall(r"^Environment=(\w+)=(.*)$",
                                           (DEPLOY / "wattclass-reconcile.service").read_text(), re.M)))
    assert argv[:2] == ["plugin", "reconcile"]
