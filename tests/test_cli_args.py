"""A sysadmin's mistakes on the command line: each is refused with one line naming the option and
the value, exit 2 (usage, as documented), before anything is created, opened or half-written.

Before: ``simulate --top -1`` dropped the last row of each table, ``nightly --workers -2`` and
``calibrate --kernel-seconds 0`` ran, ``nightly --data-root <typo>`` created the folder with a
model and a summary in it, ``--date 20261129`` named a partition that never exists, ``--speed
inf`` and ``import --start nan`` were tracebacks. The checks: wattclass/argtypes.py."""

from __future__ import annotations

import argparse

import pytest

from wattclass.argtypes import int_at_least, iso_date, non_negative_float, positive_float
from wattclass.cli import main


@pytest.mark.parametrize("text", ["20261129", "2026-11-31", "2026-W48-1", "2026-11-29T00:00", " 2026-11-29",
                                  ""])
def test_a_day_is_yyyy_mm_dd_and_a_real_one(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="YYYY-MM-DD"):
        iso_date(text)


def test_good_values_pass_unchanged() -> None:
    assert iso_date("2026-11-29") == "2026-11-29"
    assert positive_float("0.5") == 0.5 and non_negative_float("0") == 0.0 and int_at_least(2)("2") == 2
    for bad in ("nan", "inf", "-inf", "1e999", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            positive_float(bad)


def test_a_usage_error_is_returned_as_2_and_help_as_0(capsys: pytest.CaptureFixture[str]) -> None:
    """In-process callers (the demo, tests) get the exit code, as for a ConfigError, not SystemExit."""
    assert main(["nightly", "--data-root", "/x", "--no-such-option"]) == 2
    assert "unrecognized arguments: --no-such-option" in capsys.readouterr().err
    assert main(["simulate", "--help"]) == 0
    assert "--top" in capsys.readouterr().out
