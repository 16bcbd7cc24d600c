"""Shared fixtures: paths to the bundled and shared H200 recordings."""

from __future__ import annotations

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
