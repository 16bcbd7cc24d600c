"""Shared fixtures: paths to the bundled and shared H200 recordings."""

from __future__ import annotations

import os
import shutil
import subprocess
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


#: The day and host the bundled H200 telemetry was recorded on.
H200_DATE, H200_HOST = "2026-11-29", "gpu-h200-03"


@pytest.fixture
def h200_day_root(h200_telemetry: Path, tmp_path: Path) -> Path:
    """A data root holding the bundled telemetry where the daemon would have written it."""
    r = tmp_path / "root"
    d = r / "telemetry" / f"date={H200_DATE}" / f"host={H200_HOST}"
    d.mkdir(parents=True)
    shutil.copy(h200_telemetry, d / "part-0.parquet")
    return r


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


PYSLURM_SLURM = (25, 11)  # the Slurm release PyPI's pyslurm 25.11 builds and runs against


def _slurm_under_test() -> tuple[int, int] | None:
    """major.minor of the Slurm the real-Slurm tests use (WATTCLASS_TEST_SLURM, else /usr)."""
    ctld = Path(os.environ.get("WATTCLASS_TEST_SLURM") or "/usr") / "sbin" / "slurmctld"
    try:
        out = subprocess.run([str(ctld), "-V"], capture_output=True, text=True, timeout=10).stdout.split()
        major, minor = out[-1].split(".")[:2]
        return int(major), int(minor)
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``pyslurm`` tests run only against Slurm 25.11 (``WATTCLASS_TEST_SLURM=/opt/slurm-25.11``).

    Elsewhere they are deselected, not skipped: pyslurm cannot even be imported next to another
    Slurm version (its import fatal()s on 22.05's plugins), so on Debian's 22.05 they are not a
    missing tool but a different test run (.ci/run runs both).
    """
    marked = [i for i in items if i.get_closest_marker("pyslurm") is not None]
    if not marked or _slurm_under_test() == PYSLURM_SLURM:
        return
    config.hook.pytest_deselected(items=marked)
    items[:] = [i for i in items if i.get_closest_marker("pyslurm") is None]
