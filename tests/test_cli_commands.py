"""The dispatcher imports only the module of the command it runs (issue 15), so its map of
commands to modules must be what the modules register."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
from pathlib import Path

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


def test_a_reader_that_goes_away_ends_the_command_quietly() -> None:
    """`wattclass job 7 | head`: when the reader closes the pipe, the command stops with the shell's
    SIGPIPE status (141) and no traceback, whatever the command (here one that prints a lot)."""
    import subprocess
    import sys

    code = (
        "import argparse, sys\n"
        "from wattclass import cli\n"
        "def spam(args):\n"
        "    for i in range(500000):\n"
        "        print('line', i)\n"
        "    return 0\n"
        "def build_parser(_):\n"
        "    p = argparse.ArgumentParser()\n"
        "    p.set_defaults(func=spam, verbose=0, quiet=False)\n"
        "    return p\n"
        "cli.build_parser = build_parser\n"
        "sys.exit(cli.main([]))\n"
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None and p.stderr is not None
    assert p.stdout.read(20).startswith(b"line 0")
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err


def test_no_help_text_shows_a_doubled_percent_sign() -> None:
    """argparse expands ``%%`` in an option's help but prints a description as written, so
    ``wattclass job --help`` read "the power cap it ran under (W and %%)". Every command's help,
    options and descriptions alike, as a sysadmin reads it."""
    def helps(parser: argparse.ArgumentParser) -> list[str]:
        out = [parser.format_help()]
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    out += helps(sub)
        return out

    texts = helps(cli.build_parser())
    assert len(texts) > 20
    assert not [t.splitlines()[0] for t in texts if "%%" in t]


@pytest.mark.parametrize(("argv", "option"), [
    (["plugin", "install-lua", "--dest", "{dir}"], "--dest {dir}: is a folder"),
    (["plugin", "install-lua", "--dest", "{file}/job_submit.lua"], "--dest {file}/job_submit.lua"),
    (["plugin", "install-hooks", "--dest", "{file}"], "--dest {file}"),
    (["demo", "--out", "{file}"], "--out {file}"),
])
def test_an_output_path_that_cannot_be_written_is_named_without_a_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
        option: str) -> None:
    """A folder given where a file goes, or a file where a folder goes: one line naming the option
    and the path, exit 2. They were IsADirectoryError/NotADirectoryError tracebacks (exit 1)."""
    folder = tmp_path / "folder"
    folder.mkdir()
    afile = tmp_path / "a-file"
    afile.write_text("x\n")
    fill = {"dir": str(folder), "file": str(afile)}
    rc = cli.main([a.format(**fill) for a in argv])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert option.format(**fill) in err and "Traceback" not in err
    assert afile.read_text() == "x\n" and not any(folder.iterdir())
