"""One bad value, or one unexpected failure at stop, never costs rows silently.

On the H200 (2026-11-30) a NaN in one row made the WAL append raise at SIGTERM: the daemon
crashed half-way through its stop, its last rows never reached the WAL or Parquet, the open
segment was not rolled, and nothing said LOST. Now a non-finite value is written as null (ERROR
naming column, GPU and window; counted in the stats and metrics), and whatever fails while the
last windows are written, the stop goes on: roll, lock release, LOST with exit code 1.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from wattclass.gpu.replay import ReplayBackend
from wattclass.telemetry import wal
from wattclass.telemetry.daemon import Daemon, DaemonConfig
from wattclass.telemetry.metrics import LatestWindows


def _row(i: int, **kw: object) -> dict[str, object]:
    r: dict[str, object] = {"ts_start": 1795967770.0 + 10 * i, "ts_end": 1795967780.0 + 10 * i, "host": "n1",
                            "gpu_index": 0, "gpu_uuid": "GPU-x", "gpu_model": "H200", "job_id": "1",
                            "user": "u", "energy_j": 100.0, "power_max_w": 500.0}
    r.update(kw)
    return r


def _parquet_rows(root: Path) -> list[dict[str, object]]:
    return [r for f in sorted((root / "telemetry").rglob("*.parquet")) for r in pq.read_table(f).to_pylist()]


def test_wal_writes_a_nonfinite_value_as_null_and_says_where(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    w = wal.WalWriter(tmp_path)
    rows = [_row(0), _row(1, energy_j=math.nan, power_max_w=math.inf), _row(2)]
    with caplog.at_level(logging.ERROR):
        assert w.append(rows)
    assert w.nonfinite_values == 2 and not w.pending
    err = "\n".join(r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)
    assert "energy_j=nan" in err and "power_max_w=inf" in err
    assert "GPU 0 (GPU-x)" in err and "window 1795967780.0-1795967790.0" in err
    seg = w.close()
    assert seg is not None
    back = wal.read_segment(seg)
    assert len(back) == 3  # the row is kept, only its bad values are null
    assert back[1]["energy_j"] is None and back[1]["power_max_w"] is None and back[1]["job_id"] == "1"
    assert back[0] == _row(0) and back[2] == _row(2)


def test_nulled_values_are_counted_in_stats_and_metrics(tmp_path: Path, h200_raw: Path) -> None:
    collector = LatestWindows()
    d = Daemon(ReplayBackend(h200_raw, realtime=False),
               DaemonConfig(data_root=tmp_path / "d", host="n1", roll_s=60), collector=collector)
    d.prepare()
    d.record([_row(0, energy_j=math.nan)])
    from prometheus_client import generate_latest
    from prometheus_client.registry import CollectorRegistry

    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    text = generate_latest(reg).decode()
    assert "wattclass_wal_nonfinite_values_total 1.0" in text
    assert "wattclass_daemon_nonfinite_readings_total 0.0" in text
    assert d.stats.nonfinite_values == 1 and "nonfinite=0/1" in d.stats.summary()
    d.shutdown()
    assert [r["energy_j"] for r in _parquet_rows(tmp_path / "d")] == [None]


class StopFails(ReplayBackend):
    """Hardware boundary: the recording, ending with a driver call that raises what no one
    expects (not a GpuError) at the stop's last counter read."""

    def __init__(self, folder: Path) -> None:
        super().__init__(folder, realtime=False)
        self.stopping = False
        self.raised = 0

    def exhausted(self) -> bool:
        self.stopping = self.stopping or super().exhausted()
        return self.stopping

    def energy_mj(self, index: int) -> int | None:
        if self.stopping:
            self.raised += 1
            raise RuntimeError("driver returned garbage")
        return super().energy_mj(index)


def test_an_unexpected_failure_at_the_last_poll_still_rolls_and_says_lost(
    tmp_path: Path, h200_raw: Path, caplog: pytest.LogCaptureFixture
) -> None:
    backend = StopFails(h200_raw)
    cfg = DaemonConfig(data_root=tmp_path / "d", host="n1", roll_s=60, stop_retry_s=0.0)
    d = Daemon(backend, cfg)
    with caplog.at_level(logging.ERROR):
        assert d.run() == 1
    assert backend.raised == 1
    assert "LOST" in caplog.text and "GPU 0" in caplog.text
    # Everything written before the stop is in Parquet (the segment was rolled), the lock is free.
    assert len(_parquet_rows(tmp_path / "d")) == d.stats.rows > 0
    assert not wal.list_segments(d.wal_dir)
    Daemon(ReplayBackend(h200_raw, realtime=False), cfg).prepare()


def test_a_failing_wal_append_at_stop_keeps_the_rows_and_says_lost(
    tmp_path: Path, h200_raw: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Not a full disk (that is retried): an append that raises for another reason at the stop."""
    backend = StopFails(h200_raw)
    backend.energy_mj = ReplayBackend.energy_mj.__get__(backend)  # type: ignore[method-assign]
    cfg = DaemonConfig(data_root=tmp_path / "d", host="n1", roll_s=60, stop_retry_s=0.0)
    d = Daemon(backend, cfg)
    encode = wal.encode_records

    def failing(rows: list[dict[str, object]]) -> bytes:
        if backend.stopping:
            raise RuntimeError("encoder bug")
        return encode(rows)

    monkeypatch.setattr(wal, "encode_records", failing)
    with caplog.at_level(logging.ERROR):
        assert d.run() == 1
    lost = d.unpersisted()[0]
    assert lost > 0 and f"{lost} window row(s) could not be written to the WAL and are LOST" in caplog.text
    assert len(_parquet_rows(tmp_path / "d")) == d.stats.rows > 0
    Daemon(ReplayBackend(h200_raw, realtime=False), cfg).prepare()  # the lock was released
