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


@pytest.mark.parametrize("unit", ["wattclass-nightly.service", "wattclass-telemetry.service"])
def test_unit_commands_parse(unit: str) -> None:
    path = DEPLOY / unit
    env = dict(re.findall(r"^Environment=(\w+)=(.*)$", path.read_text(), re.M))
    lines = _exec_lines(path)
    assert lines
    parser = build_parser()
    for line in lines:
        args = parser.parse_args(_wattclass_argv(line, env))  # SystemExit on an unknown option
        assert callable(args.func)
