"""The energy counter is read only where exact accounting needs it, and stays exact.

The counter read is the one expensive NVML call (docs/benchmarks.md, "Per NVML call":
milliseconds against microseconds for every other field), so the daemon reads it at the first
poll, window closes, job changes and after gaps only. These tests count the reads at the
hardware boundary (a replay backend) and check that window and job energies are still counter
differences.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from wattclass.gpu.base import GpmMetrics, GpuInfo, GpuSample
from wattclass.gpu.replay import ReplayBackend
from wattclass.telemetry.daemon import Daemon, DaemonConfig
from wattclass.telemetry.windows import WindowBuilder

INFO = GpuInfo(0, "GPU-t", "Test", "0000:01:00.0", 80000.0, 1980.0, 700.0, 200.0, 700.0, False)


class CountingReplay(ReplayBackend):
    """Hardware boundary: the recorded GPU, remembering every poll and every counter read."""

    def __init__(self, folder: Path) -> None:
        super().__init__(folder, realtime=False)
        self.polls: list[tuple[float, Any]] = []  # (sample ts, job ids seen at that poll)
        self.reads: list[float] = []  # sample ts of each counter read

    def sample(self, index: int) -> GpuSample:
        s = super().sample(index)
        self.polls.append((s.ts, tuple(p.job_id for p in self.processes(index))))
        return s

    def energy_mj(self, index: int) -> int | None:
        g = self._gpu(index)
        self.reads.append(g.ts[g.last_i])
        return super().energy_mj(index)


def _read(root: Path) -> pd.DataFrame:
    return pd.concat([pd.read_parquet(f) for f in sorted((root / "telemetry").rglob("*.parquet"))])


def test_daemon_reads_the_counter_only_at_energy_points(tmp_path: Path, h200_raw: Path) -> None:
    backend = CountingReplay(h200_raw)
    root = tmp_path / "d"
    assert Daemon(backend, DaemonConfig(data_root=root, host="n1")).run() == 0
    # The energy points, derived from the polls alone: the first poll, a poll in a later
    # 10 s window than the poll before, a poll that sees another job, a poll after a gap.
    distinct: list[tuple[float, Any]] = []
    for ts, job in backend.polls:
        if not distinct or ts > distinct[-1][0]:
            distinct.append((ts, job))
    expected = [distinct[0][0]]
    for (t0, j0), (t1, j1) in itertools.pairwise(distinct):
        if math.floor(t1 / 10) > math.floor(t0 / 10) or j1 != j0 or t1 - t0 > 2.5:
            expected.append(t1)
    # ... and one settling read at shutdown, at the last poll, for the open window.
    assert backend.reads == [*expected, distinct[-1][0]]
    assert len(backend.reads) < 0.2 * len(distinct)  # most polls are cheap
    # Still exact: window energies telescope to the recorded counter delta.
    t = _read(root)
    assert t.energy_j.notna().all()
    assert t.energy_j.sum() == pytest.approx(backend.counter_delta_j(0), rel=1e-9)


def _counter(t: float) -> int:
    """A counter (mJ) under a power that changes every second, so a split by time is wrong."""
    return round(sum(300_000 + 250_000 * math.sin(k) for k in range(math.floor(t))) + 10_000_000)


def _poll_protocol(b: WindowBuilder, ts: float, job: Any) -> tuple[list[dict], bool]:
    """What the daemon does per GPU: cheap sample, ask, then read the counter if needed."""
    cheap = GpuSample(ts, None, 500.0, 700.0, 90.0, 40.0, 1800.0, 3200.0, 0, 60.0, 1000.0)
    read = b.needs_energy(INFO, cheap, job)
    s = cheap._replace(energy_mj=_counter(ts)) if read else cheap
    return b.add(INFO, s, job, None, lambda a, c: GpmMetrics()), read


def test_job_change_mid_window_splits_energy_exactly() -> None:
    b = WindowBuilder("h", 10, 1)
    rows: list[dict] = []
    reads: list[float] = []
    times = [100.5 + i for i in range(25)]
    for ts in times:
        job = ("1", "ann") if ts < 114 else ("2", "bob")
        got, read = _poll_protocol(b, ts, job)
        rows += got
        if read:
            reads.append(ts)
    assert reads == [100.5, 110.5, 114.5, 120.5]  # first, window close, job change, close
    w = {r["job_id"]: r for r in rows if r["ts_start"] >= 110 and r["ts_end"] <= 120.5}
    # Job 1 owns the intervals starting at its polls (up to the change poll), job 2 the rest.
    assert w["1"]["energy_j"] * 1e3 == _counter(114.5) - _counter(110.5)
    assert w["2"]["energy_j"] * 1e3 == _counter(120.5) - _counter(114.5)
    assert w["1"]["ts_end"] == w["2"]["ts_start"] == 114.5
    assert w["1"]["n_polls"] == 4 and w["2"]["n_polls"] == 6
    first = next(r for r in rows if r["ts_end"] == 110)
    assert first["energy_j"] * 1e3 == _counter(110.5) - _counter(100.5)


def test_flush_settles_the_open_window_with_one_last_read() -> None:
    b = WindowBuilder("h", 10, 1)
    for ts in (100.5, 101.5, 102.5, 103.5):
        _poll_protocol(b, ts, None)
    assert b.unsettled(INFO)
    # The same instant again, now with the counter (what replay returns at shutdown).
    last = GpuSample(103.5, _counter(103.5), 500.0, 700.0, None, None, None, None, None, None, None)
    assert b.add(INFO, last, None, None, lambda a, c: GpmMetrics()) == []
    assert not b.unsettled(INFO)
    (row,) = b.flush(INFO, None, lambda a, c: GpmMetrics())
    assert row["energy_j"] * 1e3 == _counter(103.5) - _counter(100.5)


def test_flush_without_a_last_read_leaves_energy_unknown_not_guessed() -> None:
    b = WindowBuilder("h", 10, 1)
    for ts in (100.5, 101.5, 102.5):
        _poll_protocol(b, ts, None)
    (row,) = b.flush(INFO, None, lambda a, c: GpmMetrics())
    assert row["energy_j"] is None and row["n_polls"] == 2
