"""The dispatcher imports only the module of the command it runs (issue 15), so its map of
commands to modules must be what the modules register."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys

import pytest

from wattclass import cli


def test_command_map_is_what_each_module_registers() -> None:
    registered: dict[str, str] = {}
    for name in cli.COMMAND_MODULES:
        parser = argparse.ArgumentParser()
        sub = parser.add_subparsers(dest="command")
        importlib.import_module(name).register(sub)
        registered.update(dict.fromkeys(sub.choices, name))
    assert registered == cli.COMMANDS


@pytest.mark.parametrize(("argv", "command"), [
    (["nightly", "--date", "2026-11-29"], "nightly"),
    (["-v", "-q", "classify", "--help"], "classify"),
    (["-vv", "report"], "report"),
    (["--help"], None),
    (["--version"], None),
    ([], None),
])
def test_the_command_is_found_after_global_options(argv: list[str], command: str | None) -> None:
    assert cli._command_of(argv) == command


def test_a_command_parser_has_its_module_only_and_help_lists_all() -> None:
    one = cli.build_parser("classify")
    sub = next(a for a in one._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == {"classify", "effects", "model", "nightly"}
    full = cli.build_parser()
    sub = next(a for a in full._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == set(cli.COMMANDS)
    out = subprocess.run([sys.executable, "-m", "wattclass.cli", "--help"], capture_output=True, text=True,
                         check=True).stdout
    assert all(c in out for c in cli.COMMANDS)


def test_an_unknown_command_is_refused_with_the_full_list() -> None:
    run = subprocess.run([sys.executable, "-m", "wattclass.cli", "nightlly"], capture_output=True, text=True,
                         check=False)
    assert run.returncode == 2
    assert "invalid choice" in run.stderr and "nightly" in run.stderr
