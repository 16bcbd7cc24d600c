"""The energy counter is read only at energy points, and window energies stay exact.

The counter read is the one expensive NVML call (docs/benchmarks.md, "Per NVML call":
milliseconds against microseconds for every other field), so the daemon reads it at the first
poll, window closes (every N-th with ``energy_every_windows``) and after gaps only, never at a
job change. These tests count the reads at the hardware boundary (a replay backend) and check
that window energies are still counter differences, and that a span's delta is split across
its job segments in proportion to their integrated power and adds up exactly.
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


@pytest.mark.parametrize("every", [1, 2])
def test_daemon_reads_the_counter_only_at_energy_points(tmp_path: Path, h200_raw: Path, every: int) -> None:
    backend = CountingReplay(h200_raw)
    root = tmp_path / "d"
    assert Daemon(backend, DaemonConfig(data_root=root, host="n1", energy_every_windows=every)).run() == 0
    # The energy points, derived from the polls alone: the first poll, a poll after a gap, and
    # a poll in a later 10 s window than the poll before when that makes `every` windows
    # closed since the last point. Not a poll that sees another job.
    distinct: list[tuple[float, Any]] = []
    for ts, job in backend.polls:
        if not distinct or ts > distinct[-1][0]:
            distinct.append((ts, job))
    expected = [distinct[0][0]]
    changes_inside = closed = 0
    for (t0, j0), (t1, j1) in itertools.pairwise(distinct):
        closes = math.floor(t1 / 10) - math.floor(t0 / 10)
        if t1 - t0 > 2.5 or (closes and closed + closes >= every):
            expected.append(t1)
            closed = 0
        else:
            closed += closes
            changes_inside += j1 != j0 and not closes
    assert changes_inside >= 30  # the recording has job changes inside windows ...
    # ... and none of them is a read; one settling read at shutdown, at the last poll.
    assert backend.reads == [*expected, distinct[-1][0]]
    assert len(backend.reads) < 0.12 / every * len(distinct)  # most polls are cheap
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


def _power_w(t: float) -> float:
    """The power behind ``_counter`` over second ``floor(t)`` (W)."""
    return (300_000 + 250_000 * math.sin(math.floor(t))) / 1e3


def _poll_power(b: WindowBuilder, ts: float, job: Any, power_w: float | None) -> tuple[list[dict], bool]:
    """As ``_poll_protocol``, with the instantaneous power reading of this poll."""
    cheap = GpuSample(ts, None, power_w, 700.0, 90.0, 40.0, 1800.0, 3200.0, 0, 60.0, 1000.0)
    read = b.needs_energy(INFO, cheap, job)
    s = cheap._replace(energy_mj=_counter(ts)) if read else cheap
    return b.add(INFO, s, job, None, lambda a, c: GpmMetrics()), read


def _trapezoid_j(times: list[float], power: dict[float, float | None]) -> float:
    return sum((power[a] + power[b]) / 2 * (b - a) for a, b in itertools.pairwise(times))  # type: ignore[operator]


def test_job_change_mid_window_is_no_read_and_splits_by_integrated_power() -> None:
    b = WindowBuilder("h", 10, 1)
    rows: list[dict] = []
    reads: list[float] = []
    times = [100.5 + i for i in range(25)]
    power = {ts: _power_w(ts) for ts in times}
    for ts in times:
        job = ("1", "ann") if ts < 114 else ("2", "bob")
        got, read = _poll_power(b, ts, job, power[ts])
        rows += got
        if read:
            reads.append(ts)
    assert reads == [100.5, 110.5, 120.5]  # first, window closes; the change at 114.5 is no read
    w = {r["job_id"]: r for r in rows if r["ts_start"] >= 110 and r["ts_end"] <= 120.5}
    # The window's energy is still the counter difference, to the millijoule ...
    delta_mj = _counter(120.5) - _counter(110.5)
    assert (w["1"]["energy_j"] + w["2"]["energy_j"]) * 1e3 == pytest.approx(delta_mj, abs=1e-6)
    # ... split in proportion to each job's integrated power over its intervals (job 1 owns the
    # intervals starting at its polls, up to the change poll): the trapezoid of the readings.
    p1 = _trapezoid_j([110.5, 111.5, 112.5, 113.5, 114.5], power)
    p2 = _trapezoid_j([114.5 + i for i in range(7)], power)
    assert w["1"]["energy_j"] * 1e3 == pytest.approx(delta_mj * p1 / (p1 + p2), rel=1e-12)
    assert w["2"]["energy_j"] * 1e3 == pytest.approx(delta_mj * p2 / (p1 + p2), rel=1e-12)
    # By time it would have been 4:6; the power differs, so the split does too.
    assert w["1"]["energy_j"] * 1e3 != pytest.approx(delta_mj * 0.4, rel=1e-3)
    assert w["1"]["ts_end"] == w["2"]["ts_start"] == 114.5
    assert w["1"]["n_polls"] == 4 and w["2"]["n_polls"] == 6
    first = next(r for r in rows if r["ts_end"] == 110)
    assert first["energy_j"] * 1e3 == _counter(110.5) - _counter(100.5)


def test_span_without_power_is_split_by_time() -> None:
    b = WindowBuilder("h", 10, 1)
    rows: list[dict] = []
    for ts in [110.5 + i for i in range(11)]:
        job = ("1", "ann") if ts < 114 else ("2", "bob")
        # No power reading at two polls in a row: the interval between them has none at all.
        rows += _poll_power(b, ts, job, None if ts in (112.5, 113.5) else _power_w(ts))[0]
    w = {r["job_id"]: r for r in rows}
    delta_mj = _counter(120.5) - _counter(110.5)
    assert w["1"]["energy_j"] * 1e3 == pytest.approx(delta_mj * 0.4, rel=1e-12)
    assert w["2"]["energy_j"] * 1e3 == pytest.approx(delta_mj * 0.6, rel=1e-12)


def test_energy_every_two_windows_holds_rows_and_still_telescopes() -> None:
    b = WindowBuilder("h", 10, 1, energy_every_windows=2)
    times = [100.5 + i for i in range(41)]  # windows 100, 110, 120, 130 closed; 140 open
    power = {ts: _power_w(ts) for ts in times}
    out: list[tuple[float, list[dict]]] = []
    reads: list[float] = []
    for ts in times:
        got, read = _poll_power(b, ts, ("7", "ann") if ts < 125 else ("8", "bob"), power[ts])
        out.append((ts, got))
        if read:
            reads.append(ts)
    assert reads == [100.5, 120.5, 140.5]  # first poll, then every second window close
    emitted = {ts: [r["ts_start"] for r in got] for ts, got in out if got}
    # Window 100-110 waits for the read at 120.5 and comes out with window 110-120.
    assert emitted == {120.5: [100.5, 110.0], 140.5: [120.0, 125.5, 130.0]}
    rows = [r for _, got in out for r in got]
    total_mj = _counter(140.5) - _counter(100.5)
    assert sum(r["energy_j"] for r in rows) * 1e3 == pytest.approx(total_mj, abs=1e-6)
    by_start = {r["ts_start"]: r for r in rows}
    # The span 120.5 -> 140.5 covers three segments; each gets its integrated power's share.
    span = _counter(140.5) - _counter(120.5)
    tot = _trapezoid_j([120.5 + i for i in range(21)], power)
    for start, ts_list in ((120.0, [120.5 + i for i in range(6)]), (125.5, [125.5 + i for i in range(6)]),
                           (130.0, [130.5 + i for i in range(11)])):
        assert by_start[start]["energy_j"] * 1e3 == pytest.approx(span * _trapezoid_j(ts_list, power) / tot,
                                                                  rel=1e-12)


def test_exact_key_windows_close_at_a_read() -> None:
    b = WindowBuilder("h", 10, 1, energy_every_windows=3, exact_key=lambda j: j is not None and j[0] == "S")
    reads = []
    for ts in [100.5 + i for i in range(31)]:
        job = ("S", None) if 112 < ts < 116 else ("1", "ann")
        if _poll_power(b, ts, job, _power_w(ts))[1]:
            reads.append(ts)
    # The window 110-120 holds the exact key: its close is a read, though only 2 windows closed.
    assert reads == [100.5, 120.5]


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


def test_gap_gets_the_rest_of_the_span_by_time_after_the_polled_intervals() -> None:
    """The polls before a gap have their 1 s average power; the gap has no reading, so it takes
    what the counter says is left, spread over the windows it covers by time."""
    b = WindowBuilder("h", 10, 1)
    job = ("1", "ann")

    def poll(ts: float, e: int | None) -> list[dict]:
        s = GpuSample(ts, e, 310.0, 700.0, 90.0, 40.0, 1800.0, 3200.0, 0, 60.0, 1000.0, power_avg_w=300.0)
        if e is None:
            assert not b.needs_energy(INFO, s, job)
        return b.add(INFO, s, job, None, lambda a, c: GpmMetrics())

    rows = poll(100.5, 1_000_000)
    for ts in (101.5, 102.5, 103.5, 104.5):
        rows += poll(ts, None)
    gap = GpuSample(125.5, None, 310.0, 700.0, None, None, None, None, None, None, None, power_avg_w=300.0)
    assert b.needs_energy(INFO, gap, job)  # a gap ends in a counter read
    rows += poll(125.5, 11_000_000)  # 10 kJ since 100.5
    by_start = {r["ts_start"]: r["energy_j"] for r in rows}
    rest_j = 10_000 - 4 * 300.0  # 4 polled seconds at 300 W; the 21 s gap has the rest
    assert by_start[100.5] == pytest.approx(4 * 300.0 + rest_j * 5.5 / 21, rel=1e-12)
    assert by_start[110.0] == pytest.approx(rest_j * 10 / 21, rel=1e-12)
    (last,) = b.flush(INFO, None, lambda a, c: GpmMetrics())
    assert sum(by_start.values()) + last["energy_j"] == pytest.approx(10_000, rel=1e-12)
