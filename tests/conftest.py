"""Shared fixtures: paths to the bundled and shared H200 recordings."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"


@pytest.fixture
def h200_raw() -> Path:
    """The recorded 1 Hz H200 data (probe format) bundled in the package."""
    return REPO / "wattclass" / "data" / "h200" / "raw"


@pytest.fixture
def h200_telemetry() -> Path:
    """Real H200 telemetry in the v1 schema (21 jobs), bundled in the package."""
    return REPO / "wattclass" / "data" / "h200" / "telemetry.parquet"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """In CI (CI=true) a skipped test is a failure, except tests that need a real GPU.

    The real-Slurm, Lua and headless-browser tests skip on a laptop without those programs;
    in CI `.ci/run` installs them, so a skip there means a broken install, not a missing tool.
    """
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI") == "true" and report.skipped and item.get_closest_marker("gpu") is None:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped in CI (CI=true), which counts as a failure: {reason}"
