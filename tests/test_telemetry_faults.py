"""The real daemon on file-state GPUs under the faults real nodes have: the wall clock stepped by
NTP, a GPU lost at start-up, job files changing between two reads.

The GPUs are ``FileStateBackend`` GPUs (the hardware boundary) on a virtual clock: ``real_s``
only runs forward (what the GPU's energy counter integrates), the wall clock the daemon stamps
windows with is ``real_s + offset_s``, and a test steps ``offset_s`` as NTP would. Every GPU
draws a constant ``POWER_W``, so every window's mean power must be that, whatever the clock did.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from wattclass import jobmap
from wattclass.errors import GpuLostError, GpuNotSupportedError
from wattclass.fsutil import atomic_write_text
from wattclass.gpu.base import GpmMetrics, GpuInfo, GpuSample
from wattclass.gpu.filestate import FileStateBackend
from wattclass.jobmap import JobAssignment, JobMapReader, write_job_file
from wattclass.telemetry.daemon import Daemon, DaemonConfig

POWER_W = 100.0
START_S = 1_800_000_003.25


class SteppedClockGpus(FileStateBackend):
    """File-state GPUs whose wall clock a test steps at given polls (NTP), on a virtual clock."""

    real_s = START_S
    offset_s = 0.0
    polls = 0
    stop_after = 120
    steps: dict[int, float]
    reads: dict[int, list[int]]  # per GPU: every counter read (mJ)
    events: dict[int, Callable[[SteppedClockGpus], None]]  # at poll N: change the GPUs' file
    counter_offset_mj: dict[int, int]  # per GPU: added to the counter (mod 2**64: it wraps)

    def configure(self, steps: dict[int, float], stop_after: int,
                  events: dict[int, Callable[[SteppedClockGpus], None]] | None = None) -> SteppedClockGpus:
        self.steps, self.stop_after, self.reads, self.events = dict(steps), stop_after, {}, dict(events or {})
        self.counter_offset_mj = {}
        return self

    def now(self) -> float:
        return self.real_s + self.offset_s

    def sleep_until(self, t: float, stop: threading.Event) -> None:
        # The daemon waits on a monotonic timer: a step during the wait does not stretch it.
        self.real_s += max(t - self.now(), 0.0) + 0.002
        self.polls += 1
        self.offset_s += self.steps.get(self.polls, 0.0)
        if self.polls in self.events:
            self.events[self.polls](self)
        if self.polls >= self.stop_after:
            stop.set()

    def sample(self, index: int) -> GpuSample:
        self.real_s += 0.0005
        return super().sample(index)._replace(ts=self.now(), mono_s=self.real_s, power_w=POWER_W,
                                              power_avg_w=POWER_W)

    def energy_mj(self, index: int) -> int | None:
        self.real_s += 0.001
        e = (round(self.real_s * POWER_W * 1e3) + self.counter_offset_mj.get(index, 0)) % 2**64
        self.reads.setdefault(index, []).append(e)
        return e


def _run(tmp_path: Path, steps: dict[int, float], stop_after: int = 120, every: int = 3,
         events: dict[int, Callable[[SteppedClockGpus], None]] | None = None
         ) -> tuple[Daemon, int, list[dict[str, Any]]]:
    FileStateBackend.create(tmp_path / "g.json", n=2)
    gpus = SteppedClockGpus(tmp_path / "g.json").configure(steps, stop_after, events)
    d = Daemon(gpus, DaemonConfig(data_root=tmp_path / "d", host="n1", roll_s=60.0, stop_retry_s=0.0,
                                  energy_every_windows=every))
    rc = d.run()
    files = sorted((tmp_path / "d" / "telemetry").rglob("*.parquet"))
    rows = [r for f in files for r in pq.read_table(f).to_pylist()]
    for r in rows:  # epoch seconds, as the daemon made them
        r["ts_start"], r["ts_end"] = r["ts_start"].timestamp(), r["ts_end"].timestamp()
    return d, rc, rows


def _parquet_rows(data_root: Path) -> list[dict[str, Any]]:
    """Every row the daemon wrote under ``data_root`` (times as datetimes)."""
    files = sorted((data_root / "telemetry").rglob("*.parquet"))
    return [r for f in files for r in pq.read_table(f).to_pylist()]


def _run_faulty(cls: type[SteppedClockGpus], tmp_path: Path, polls: int
                ) -> tuple[SteppedClockGpus, Daemon, list[dict[str, Any]]]:
    """Two file-state GPUs of ``cls`` polled ``polls`` times, the counter read at every window
    close: the GPUs, the daemon (it exited 0) and its rows."""
    FileStateBackend.create(tmp_path / "g.json", n=2)
    gpus = cls(tmp_path / "g.json").configure({}, polls)
    d = Daemon(gpus, DaemonConfig(data_root=tmp_path / "d", host="n1", energy_every_windows=1))
    assert d.run() == 0
    return gpus, d, _parquet_rows(tmp_path / "d")


def _assert_no_overlap(rows: list[dict[str, Any]]) -> None:
    for gpu in {r["gpu_index"] for r in rows}:
        mine = sorted((r for r in rows if r["gpu_index"] == gpu), key=lambda r: r["ts_start"])
        for a, b in itertools.pairwise(mine):
            assert a["ts_end"] <= b["ts_start"], (gpu, a, b)


@pytest.mark.parametrize("every", [1, 3])
@pytest.mark.parametrize("step_s", [-60.0, -3600.0])
def test_a_clock_stepped_back_mid_window_keeps_every_window_at_the_gpus_power(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, step_s: float, every: int) -> None:
    """Review finding: the polls a step back repeats were dropped, but the counter ran on, and its
    whole delta over the repeated stretch went to the first window after it: a 60 s step made a
    100 W GPU's window read 700 W (an hour: 36,000 W), which the classifier takes for work. Now
    the windows end at the step, the repeated stretch's energy is not attributed, and windows
    neither overlap nor draw more than the GPU did."""
    with caplog.at_level(logging.WARNING, logger="wattclass.telemetry"):
        d, rc, rows = _run(tmp_path, {25: step_s}, stop_after=25 + int(-step_s) + 60, every=every)
    assert rc == 0 and d.unpersisted() == (0, 0)
    assert {r["gpu_index"] for r in rows} == {0, 1}
    known = [r for r in rows if r["energy_j"] is not None]
    assert len(known) >= len(rows) - 2  # at most the windows cut by the stop are unknown
    for r in known:
        covered = r["ts_end"] - r["ts_start"]
        assert r["energy_j"] <= POWER_W * (covered + 1.0), r  # never the repeated stretch's energy
        if covered >= 3.0:
            assert r["power_avg_w"] == pytest.approx(POWER_W, rel=0.02), r
    _assert_no_overlap(rows)
    assert any("clock stepped back" in r.getMessage() and "GPU 0" in r.getMessage() for r in caplog.records)


def test_a_clock_step_of_a_poll_or_two_loses_no_window(tmp_path: Path) -> None:
    """NTP's small steps (under the gap tolerance) keep the windows going: no rows cut, the
    energy still adds up to the counter."""
    d, rc, rows = _run(tmp_path, {25: -1.5, 60: 1.5}, stop_after=100, every=1)
    assert rc == 0
    _assert_no_overlap(rows)
    for gpu in (0, 1):
        mine = [r for r in rows if r["gpu_index"] == gpu]
        assert all(r["energy_j"] is not None for r in mine)
        # the counter's whole delta from the first read to the last, to the millijoule
        reads = d.backend.reads[gpu]  # type: ignore[attr-defined]
        assert round(sum(r["energy_j"] for r in mine) * 1e3) == reads[-1] - reads[0]



def _procs(*jobs: str) -> Callable[[SteppedClockGpus], None]:
    """An event: GPU 0's compute processes become those of ``jobs`` (the backend names the job).
    (No utilisation samples: the fake stamps them with the real clock, before the virtual one;
    a shared GPU's rows are split by the memory the processes hold.)"""
    def set_procs(g: SteppedClockGpus) -> None:
        g.update_gpu(0, processes=[{"pid": 100 + k, "job_id": j, "user": "alice",
                                    "used_mib": 1024}
                                   for k, j in enumerate(jobs)])
    return set_procs


@pytest.mark.parametrize("every", [1, 3])
def test_a_job_seen_again_in_the_same_window_gets_rows_that_do_not_overlap(tmp_path: Path,
                                                                           every: int) -> None:
    """Review finding: a window kept one segment per job, so a job that left the GPU and came back
    inside one window (two job steps with a second between them; a short neighbour on a shared
    GPU) had one row spanning the time in between: it overlapped the other row and its mean power
    was its energy over time it did not run (70 W for a GPU at 100 W). Now each stretch is a row."""
    # polls 1-10: job 500; 4 and 5: no process (between two steps); then job 500 again
    _, rc, rows = _run(tmp_path, {}, stop_after=40, every=every,
                       events={1: _procs("500"), 4: _procs(), 6: _procs("500")})
    assert rc == 0
    _assert_no_overlap(rows)
    gpu0 = [r for r in rows if r["gpu_index"] == 0]
    assert {r["job_id"] for r in gpu0} == {"500", None}
    for r in gpu0:
        if r["energy_j"] is not None and r["ts_end"] - r["ts_start"] >= 1.0:
            assert r["power_avg_w"] == pytest.approx(POWER_W, rel=0.02), r
    # every second of the run is in exactly one row of GPU 0: no row counts another's time
    covered = sum(r["ts_end"] - r["ts_start"] for r in gpu0)
    assert covered == pytest.approx(max(r["ts_end"] for r in gpu0) - min(r["ts_start"] for r in gpu0))



def test_a_shared_gpu_whose_second_job_leaves_and_comes_back_splits_both_stretches_by_use(
        tmp_path: Path) -> None:
    """The same on a shared GPU: the pair's two stretches in one window are two rows, and what
    the daemon gathered for the pair (the memory its processes hold) splits both, not only the
    first (the second got an equal split)."""
    _, rc, rows = _run(tmp_path, {}, stop_after=40, every=3,
                       events={1: _procs("500", "501"), 4: _procs("500"), 6: _procs("500", "501")})
    assert rc == 0
    _assert_no_overlap([r for r in rows if r["job_id"] != "501"])
    _assert_no_overlap([r for r in rows if r["job_id"] != "500"])
    shared = [r for r in rows if r["gpu_index"] == 0 and r["shared_jobs"] == 2]
    assert len({r["ts_start"] for r in shared}) >= 3  # both stretches of the first window, and more
    assert {r["share_basis"] for r in shared} == {"memory"}


# -- job files changing between two reads ----------------------------------------------------------
def _same_tick(folder: Path, mtime_ns: int) -> None:
    """Give ``folder`` the mtime ``mtime_ns`` again: what the kernel's coarse file clock (one tick,
    1-10 ms) stamps on two changes that fall in the same tick."""
    st = os.stat(folder)
    os.utime(folder, ns=(st.st_atime_ns, mtime_ns))


def test_a_job_file_renamed_in_within_the_listings_clock_tick_is_seen(tmp_path: Path) -> None:
    """Review finding: the reader re-lists a GPU's job folder only when its mtime changes. The
    Prolog writes a temp file and renames it; a listing between the two, within one tick of the
    file clock, cached a folder without the new job under the mtime the rename leaves in place:
    the job was never seen on that GPU (on a shared GPU its energy went to its neighbour). Now
    a listing whose folder changed too recently to tell is not cached."""
    spool = tmp_path / "jobs"
    spool.mkdir(mode=0o755)
    uuid = "GPU-aaaa"
    write_job_file(spool, uuid, JobAssignment("7", "alice", 1000))
    folder = spool / uuid
    tmp = folder / ".8.json.x1y2.tmp"  # the Prolog's atomic write of job 8, before its rename
    tmp.write_text(json.dumps({"version": 1, "job_id": "8", "user": "bob", "uid": 1001}))
    os.chmod(tmp, 0o644)
    tick_ns = time.time_ns() + 5 * 10**9  # the tick the listing and the rename fall in
    _same_tick(folder, tick_ns)
    reader = JobMapReader(spool)
    assert [j.job_id for j in reader.jobs(uuid)] == ["7"]
    os.rename(tmp, folder / "8.json")
    _same_tick(folder, tick_ns)
    assert [j.job_id for j in reader.jobs(uuid)] == ["7", "8"]


def test_a_job_folder_that_settled_is_listed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache still works: a folder whose last change is older than a tick is listed once."""
    spool = tmp_path / "jobs"
    spool.mkdir(mode=0o755)
    write_job_file(spool, "GPU-aaaa", JobAssignment("7", "alice", 1000))
    _same_tick(spool / "GPU-aaaa", time.time_ns() - 60 * 10**9)
    reader = JobMapReader(spool)
    listed: list[str] = []
    real = jobmap._list_jobs

    def spy(sp: Path, uuid: str) -> tuple[list[JobAssignment], list[str]]:
        listed.append(uuid)
        return real(sp, uuid)

    monkeypatch.setattr(jobmap, "_list_jobs", spy)
    for _ in range(3):
        assert [j.job_id for j in reader.jobs("GPU-aaaa")] == ["7"]
    assert listed == ["GPU-aaaa"]


# -- a full disk for hours ---------------------------------------------------------------------------
def test_a_long_full_disk_retries_the_wal_now_and_then_not_at_every_poll(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review finding: while WAL appends failed (disk full), every poll encoded every held row
    again and tried to write them: the cost grew with the outage (1.4 s of CPU a poll after 17
    hours on 8 GPUs), so polls and windows came late. Now a failing append is tried again every
    ``wal_retry_s``; new rows join the held ones in between, and the stop still writes them all
    once space is back."""
    from wattclass.telemetry import wal

    FileStateBackend.create(tmp_path / "g.json", n=2)
    gpus = SteppedClockGpus(tmp_path / "g.json").configure({}, stop_after=10**6)
    d = Daemon(gpus, DaemonConfig(data_root=tmp_path / "d", host="n1", wal_retry_s=3600.0,
                                  stop_retry_s=0.0, energy_every_windows=1))
    d.prepare()
    encoded: list[int] = []
    real_encode = wal.encode_records

    def counting(rows: list[dict[str, Any]]) -> bytes:
        encoded.append(len(rows))
        return real_encode(rows)

    monkeypatch.setattr(wal, "encode_records", counting)
    full = {"on": True}
    real_write = os.write

    def write(fd: int, data: bytes) -> int:
        if full["on"] and fd == d.writer._fd:
            raise OSError(28, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    for _ in range(200):  # 200 s: 20 windows of 2 GPUs close while the disk is full
        gpus.sleep_until(gpus.now() + 1.0, threading.Event())
        d.record(d.poll_once())
    held = len(d.writer.pending)
    assert held >= 38
    assert len(encoded) == 1  # one attempt, not one per poll
    full["on"] = False
    d.shutdown()
    assert d.unpersisted() == (0, 0)
    files = sorted((tmp_path / "d" / "telemetry").rglob("*.parquet"))
    assert sum(pq.read_metadata(f).num_rows for f in files) == d.stats.rows >= held


# -- a crash at each step of a roll ------------------------------------------------------------------
class Crash(BaseException):
    """SIGKILL: nothing after it runs (not an Exception, so no handler of the daemon catches it)."""


_MIDNIGHT_S = 20834 * 86400.0  # a segment rolled across it becomes two Parquet files


@pytest.mark.parametrize("step", ["parquet-temp", "first-file", "between-files", "wal-unlink",
                                  "dir-fsync"])
def test_a_crash_at_any_step_of_a_roll_keeps_every_window_exactly_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str) -> None:
    """kill -9 at each step of converting a WAL segment that spans midnight (two Parquet files):
    the restart converts what the WAL still holds, and every window the first run closed is in
    Parquet once: none lost, none twice."""
    from wattclass import fsutil
    from wattclass.telemetry import sink as sink_mod

    FileStateBackend.create(tmp_path / "g.json", n=2)
    gpus = SteppedClockGpus(tmp_path / "g.json").configure({}, stop_after=10**6)
    gpus.real_s = _MIDNIGHT_S - 125.0
    cfg = DaemonConfig(data_root=tmp_path / "d", host="n1", roll_s=3600.0, energy_every_windows=1)
    d = Daemon(gpus, cfg)
    d.prepare()
    closed: list[dict[str, Any]] = []
    for _ in range(250):  # across midnight, inside one roll period: one segment, two dates
        gpus.sleep_until(gpus.now() + 1.0, threading.Event())
        rows = d.poll_once()
        closed += rows
        d.record(rows)
    files_done = {"n": 0}
    real_replace, real_unlink, real_fsync_dir = os.replace, os.unlink, sink_mod.fsync_dir

    def replace(src: Any, dst: Any) -> None:
        if str(dst).endswith(".parquet"):
            if step == "parquet-temp":
                raise Crash
            real_replace(src, dst)
            files_done["n"] += 1
            if (step == "first-file" and files_done["n"] == 1) or (step == "between-files"
                                                                   and files_done["n"] == 2):
                raise Crash
            return
        real_replace(src, dst)

    def unlink(path: Any, *a: Any, **k: Any) -> None:
        real_unlink(path, *a, **k)
        if step == "wal-unlink" and str(path).endswith(".log"):
            raise Crash

    def fsync_dir(path: Path) -> None:
        if step == "dir-fsync":
            raise Crash
        real_fsync_dir(path)

    monkeypatch.setattr(fsutil.os, "replace", replace)
    monkeypatch.setattr(sink_mod.os, "unlink", unlink)
    monkeypatch.setattr(sink_mod, "fsync_dir", fsync_dir)
    with pytest.raises(Crash):
        d.roll()
    d.lock.release()  # the kernel drops a dead process's lock
    monkeypatch.undo()
    again = Daemon(gpus, cfg)
    again.prepare()  # replays the WAL
    again.shutdown()
    files = sorted((tmp_path / "d" / "telemetry").rglob("*.parquet"))
    assert {f.parent.parent.name for f in files} == {"date=2027-01-15", "date=2027-01-16"}
    got = [(r["gpu_index"], round(r["ts_start"].timestamp(), 2), round(r["energy_j"], 3))
           for f in files for r in pq.read_table(f).to_pylist()]
    want = [(r["gpu_index"], round(r["ts_start"], 2), round(r["energy_j"], 3)) for r in closed]
    assert len(closed) > 40
    assert sorted(got) == sorted(want)
    assert not list((tmp_path / "d" / "wal").rglob("wal-*.log"))
    assert not [p for p in (tmp_path / "d").rglob(".*") if p.is_file() and p.suffix != ".lock"]


# -- the WAL folder removed while the daemon runs ----------------------------------------------------
@pytest.mark.parametrize("when", ["mid-segment", "just-before-a-roll"])
def test_a_wal_folder_removed_while_running_loses_no_window(tmp_path: Path, when: str) -> None:
    """Review finding: the open segment of a deleted WAL folder took appends (a file without a
    name) until the roll, whose conversion then failed on the missing file at every retry and
    held every later segment back; new segments could not be made (no folder), so the next
    windows stayed in memory and were LOST at stop. Now the folder is made again, the open
    segment's records are written into a new segment, and every window reaches Parquet."""
    import shutil

    FileStateBackend.create(tmp_path / "g.json", n=2)
    gpus = SteppedClockGpus(tmp_path / "g.json").configure({}, stop_after=10**6)
    d = Daemon(gpus, DaemonConfig(data_root=tmp_path / "d", host="n1", roll_s=60.0, retry_s=1.0,
                                  energy_every_windows=1))
    d.prepare()
    closed: list[dict[str, Any]] = []

    def polls(n: int) -> None:
        for _ in range(n):
            gpus.sleep_until(gpus.now() + 1.0, threading.Event())
            rows = d.poll_once()
            closed.extend(rows)
            d.record(rows)
            d.maybe_roll(gpus.now())

    polls(75)  # one roll behind, the next segment half full
    if when == "just-before-a-roll":
        polls(int(60 - gpus.now() % 60) - 1)
    shutil.rmtree(d.wal_dir)
    polls(150)
    d.shutdown()
    assert d.unpersisted() == (0, 0)
    files = sorted((tmp_path / "d" / "telemetry").rglob("*.parquet"))
    got = [(r["gpu_index"], round(r["ts_start"].timestamp(), 2))
           for f in files for r in pq.read_table(f).to_pylist()]
    assert len(got) == len(set(got)) == d.stats.rows  # each window once, the stop's last ones too
    assert set(got) >= {(r["gpu_index"], round(r["ts_start"], 2)) for r in closed}


def test_a_segment_removed_while_open_is_rolled_with_its_rows(tmp_path: Path) -> None:
    """The roll of a segment whose folder was deleted since its last append (no window closed in
    between) hands over a segment that exists and holds its rows, not a name that stalls the
    conversion queue."""
    import shutil

    from wattclass.telemetry import wal

    w = wal.WalWriter(tmp_path / "wal")
    assert w.append([{"a": 1}]) and w.append([{"a": 2}])
    shutil.rmtree(tmp_path / "wal")
    seg = w.roll()
    assert seg is not None and wal.read_segment(seg) == [{"a": 1}, {"a": 2}]
    assert w.append([{"a": 3}])  # and the next segment goes on in the folder made again
    nxt = w.roll()
    assert nxt is not None and nxt != seg and wal.read_segment(nxt) == [{"a": 3}]


def test_a_queued_segment_removed_before_its_conversion_does_not_hold_back_the_others(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A segment waiting for its Parquet write (the data root was full) and then removed by
    someone: its conversion failed on the missing file at every retry, and the queue, converted
    in order, held every later segment in the WAL until a restart (the stop exited 1). Now it
    is dropped with an ERROR and the others go on."""
    import errno

    import pyarrow as pa

    from wattclass.telemetry.sink import ParquetSink, write_parquet_atomic

    full = {"on": True}

    def writer(table: pa.Table, path: Path) -> None:
        if full["on"]:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        write_parquet_atomic(table, path)

    FileStateBackend.create(tmp_path / "g.json", n=2)
    gpus = SteppedClockGpus(tmp_path / "g.json").configure({}, stop_after=10**6)
    d = Daemon(gpus, DaemonConfig(data_root=tmp_path / "d", host="n1", roll_s=60.0, retry_s=1.0,
                                  energy_every_windows=1), sink=ParquetSink(tmp_path / "d", writer=writer))
    d.prepare()

    def polls(n: int) -> None:
        for _ in range(n):
            gpus.sleep_until(gpus.now() + 1.0, threading.Event())
            d.record(d.poll_once())
            d.maybe_roll(gpus.now())

    polls(200)
    assert len(d.pending_segments) >= 3
    gone = d.pending_segments[0]
    gone.unlink()
    full["on"] = False
    with caplog.at_level(logging.ERROR, logger="wattclass.telemetry"):
        polls(5)
    assert d.pending_segments == []
    assert any(str(gone) in r.getMessage() and "removed" in r.getMessage() for r in caplog.records)
    d.shutdown()
    assert d.unpersisted() == (0, 0)



# -- NVML faults of one GPU ----------------------------------------------------------------------------
def _lose_gpu1(g: SteppedClockGpus) -> None:
    """GPU 1 falls off the bus: the file-state backend answers GpuLostError for it."""
    with g._locked():
        doc = g._read()
        g._gone = [x for x in doc["gpus"] if int(x["index"]) == 1]  # type: ignore[attr-defined]
        doc["gpus"] = [x for x in doc["gpus"] if int(x["index"]) != 1]
        atomic_write_text(g.path, json.dumps(doc))


def _gpu1_back(reset_counter: bool) -> Callable[[SteppedClockGpus], None]:
    def back(g: SteppedClockGpus) -> None:
        with g._locked():
            doc = g._read()
            doc["gpus"] += g._gone  # type: ignore[attr-defined]
            atomic_write_text(g.path, json.dumps(doc))
        if reset_counter:  # the driver was reloaded: its counter starts again near 0
            g.counter_offset_mj[1] = -round(g.real_s * POWER_W * 1e3) + 5000
    return back


@pytest.mark.parametrize(("outage_polls", "reset"), [(4, False), (30, True), (700, True)])
def test_one_gpu_lost_mid_run_leaves_the_other_untouched_and_comes_back(
        tmp_path: Path, outage_polls: int, reset: bool) -> None:
    """GPU 1 answers GpuLostError for a few seconds, half a minute (and comes back with its counter
    reset by a driver reload) or longer than the longest gap: GPU 0's windows go on whole and
    exact, GPU 1's rows never overlap, never draw more than the GPU did, and the energy of a
    reset counter is never negative."""
    d, rc, rows = _run(tmp_path, {}, stop_after=60 + outage_polls + 60, every=3,
                       events={20: _lose_gpu1, 20 + outage_polls: _gpu1_back(reset)})
    assert rc == 0
    _assert_no_overlap(rows)
    gpu0 = sorted((r for r in rows if r["gpu_index"] == 0), key=lambda r: r["ts_start"])
    for a, b in itertools.pairwise(gpu0):
        assert a["ts_end"] == b["ts_start"]  # no hole
    reads = d.backend.reads[0]  # type: ignore[attr-defined]
    assert round(sum(r["energy_j"] for r in gpu0) * 1e3) == reads[-1] - reads[0]
    gpu1 = [r for r in rows if r["gpu_index"] == 1]
    assert gpu1 and max(r["ts_end"] for r in gpu1) > max(r["ts_end"] for r in gpu0) - 11
    for r in gpu1:
        if r["energy_j"] is not None:
            assert 0 <= r["energy_j"] <= POWER_W * (r["ts_end"] - r["ts_start"] + 1.0), r
    assert 1 <= d.stats.gpu_errors <= outage_polls  # tried again now and then, not every poll


def test_a_counter_that_wraps_past_2_64_keeps_the_energy_exact(tmp_path: Path) -> None:
    """The energy counter is an unsigned 64-bit millijoule count: past 2**64 it starts again at
    0, and the window across the wrap gets the energy of its time, not 0 or 18 EJ."""
    def near_wrap(g: SteppedClockGpus) -> None:
        g.counter_offset_mj[0] = 2**64 - round(g.real_s * POWER_W * 1e3) - 15_000  # 150 s to go

    _, rc, rows = _run(tmp_path, {}, stop_after=400, every=3, events={1: near_wrap})
    assert rc == 0
    for r in (r for r in rows if r["gpu_index"] == 0):
        if r["ts_end"] - r["ts_start"] >= 3.0:
            assert r["power_avg_w"] == pytest.approx(POWER_W, rel=0.02), r


# -- attribution under hostile or changing job files -------------------------------------------------
def test_refused_job_files_and_foreign_processes_never_name_a_job(tmp_path: Path) -> None:
    """GPU 0's job file is owned by a user, GPU 1's is a symlink to a root file elsewhere: both are
    refused (the daemon runs as root and books energy by what they say). GPU 0 gets a good file
    mid-run and loses it again; GPU 1 falls back to its processes, one of which claims a job of
    another user and one of which has no readable environment: neither is booked to a job."""
    spool, proc = tmp_path / "jobs", tmp_path / "proc"
    spool.mkdir(mode=0o755)
    FileStateBackend.create(tmp_path / "g.json", n=2)
    uuids = [g.uuid for g in FileStateBackend(tmp_path / "g.json").gpus()]
    write_job_file(spool, uuids[0], JobAssignment("66", "mallory", 1000))
    os.chown(spool / uuids[0] / "66.json", 1000, 1000)
    elsewhere = tmp_path / "elsewhere"
    write_job_file(elsewhere, uuids[1], JobAssignment("67", "mallory", 1000))
    (spool / uuids[1]).mkdir(mode=0o755)
    os.symlink(elsewhere / uuids[1] / "67.json", spool / uuids[1] / "67.json")
    (proc / "4242").mkdir(parents=True)  # claims job 68 of a user it does not run as
    (proc / "4242" / "environ").write_bytes(b"SLURM_JOB_ID=68\0SLURM_JOB_USER=nobody\0")
    (proc / "4243").mkdir()  # no environ to read (another PID namespace, or gone)

    def good_file(_g: SteppedClockGpus) -> None:
        write_job_file(spool, uuids[0], JobAssignment("77", "root", 0))

    def file_gone(_g: SteppedClockGpus) -> None:
        os.unlink(spool / uuids[0] / "77.json")

    FileStateBackend(tmp_path / "g.json").update_gpu(1, processes=[{"pid": 4242}, {"pid": 4243}])
    gpus = SteppedClockGpus(tmp_path / "g.json").configure({}, 80, {20: good_file, 50: file_gone})
    d = Daemon(gpus, DaemonConfig(data_root=tmp_path / "d", host="n1", job_spool=spool, proc_root=proc,
                                  energy_every_windows=1))
    assert d.run() == 0
    files = sorted((tmp_path / "d" / "telemetry").rglob("*.parquet"))
    rows = [r for f in files for r in pq.read_table(f).to_pylist()]
    assert {r["job_id"] for r in rows if r["gpu_index"] == 1} == {None}
    gpu0 = sorted((r for r in rows if r["gpu_index"] == 0), key=lambda r: r["ts_start"])
    assert [k for k, _ in itertools.groupby(r["job_id"] for r in gpu0)] == [None, "77", None]


# -- a stop signal in the middle of a roll -----------------------------------------------------------
def test_sigterm_during_a_roll_finishes_it_then_flushes(tmp_path: Path) -> None:
    """SIGTERM arrives while a segment is being written to Parquet: the handler only records it
    (telemetry/stopsignal.py), the roll completes, and the stop flushes the open windows; every
    window is in Parquet once and the exit code is 0."""
    import pyarrow as pa

    from wattclass.telemetry.sink import ParquetSink, write_parquet_atomic
    from wattclass.telemetry.stopsignal import SignalStop

    stop = SignalStop()
    written: list[Path] = []

    def writer(table: pa.Table, path: Path) -> None:
        if not written:
            stop.on_signal(15, None)  # what the SIGTERM handler does, half-way through the roll
        write_parquet_atomic(table, path)
        written.append(path)

    FileStateBackend.create(tmp_path / "g.json", n=2)
    gpus = SteppedClockGpus(tmp_path / "g.json").configure({}, stop_after=10**6)
    d = Daemon(gpus, DaemonConfig(data_root=tmp_path / "d", host="n1", roll_s=60.0, energy_every_windows=3),
               sink=ParquetSink(tmp_path / "d", writer=writer), stop=stop)
    assert d.run() == 0
    assert gpus.polls < 70  # stopped at the first roll, not at the end of the recording
    got = [(r["gpu_index"], r["ts_start"]) for f in written for r in pq.read_table(f).to_pylist()]
    assert len(got) == len(set(got)) == d.stats.rows > 0
    assert sorted({p.name for p in written}) == sorted(p.name for p in (tmp_path / "d").rglob("*.parquet"))
    assert not list((tmp_path / "d" / "wal").rglob("wal-*.log"))


@pytest.mark.parametrize("step_s", [60.0, 400.0])
def test_a_clock_stepped_forward_makes_no_rows_for_the_skipped_time(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, step_s: float) -> None:
    """Review finding: a wall clock stepped forward by NTP (or a suspend) looked like a gap of the
    GPU's polls: the next poll's counter delta, one second of energy, was spread by time over
    windows of the running job that never ran (a 100 W job at under 2 W for a minute; the
    classifier sees idle). Where the backend stamps polls with the monotonic clock too, the
    skipped time now gets no rows: the windows end at the last poll before the step."""
    with caplog.at_level(logging.WARNING, logger="wattclass.telemetry"):
        _, rc, rows = _run(tmp_path, {25: step_s}, stop_after=90, every=3,
                           events={1: _procs("500")})
    assert rc == 0
    _assert_no_overlap(rows)
    for r in rows:
        if r["energy_j"] is not None and r["ts_end"] - r["ts_start"] >= 3.0:
            assert r["power_avg_w"] == pytest.approx(POWER_W, rel=0.02), r
    covered = sum(r["ts_end"] - r["ts_start"] for r in rows if r["gpu_index"] == 0)
    assert covered < 90 + 2  # the run's 90 s of polls, not the skipped time on top
    assert any("stepped forward" in r.getMessage() for r in caplog.records)


# -- a WAL segment that cannot become Parquet -----------------------------------------------------
def test_a_segment_parquet_refuses_is_set_aside_and_the_daemon_runs_on(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Review finding: a WAL segment whose conversion fails for its content (ArrowInvalid, not a
    full disk) failed at every roll: out of the poll loop, then out of every restart's replay --
    no telemetry from the node at all until someone deleted the file. Now it is renamed ``.bad``
    (rows kept), named in an ERROR, counted as unpersisted (exit 1), and the daemon runs on."""
    import pyarrow as pa

    from wattclass.telemetry import wal
    from wattclass.telemetry.sink import ParquetSink, write_parquet_atomic

    wal_dir = tmp_path / "d" / "wal" / "n1"
    w = wal.WalWriter(wal_dir)
    old = [{"ts_start": START_S - 600, "ts_end": START_S - 590, "host": "n1", "gpu_index": 0,
            "gpu_uuid": "GPU-x", "job_id": "5", "energy_j": 1.0}]
    assert w.append(old)
    seg = w.roll()
    assert seg is not None

    def writer(table: pa.Table, path: Path) -> None:
        if wal.segment_id(seg) in path.name:  # what Parquet makes of this segment's rows
            raise pa.ArrowInvalid("a bug, or a row of a version to come")
        write_parquet_atomic(table, path)

    FileStateBackend.create(tmp_path / "g.json", n=2)
    gpus = SteppedClockGpus(tmp_path / "g.json").configure({}, 40)
    cfg = DaemonConfig(data_root=tmp_path / "d", host="n1", roll_s=60.0)
    d = Daemon(gpus, cfg, sink=ParquetSink(tmp_path / "d", writer=writer))
    with caplog.at_level(logging.ERROR, logger="wattclass.telemetry"):
        assert d.run() == 1
    assert d.unpersisted() == (0, 1)
    files = sorted((tmp_path / "d" / "telemetry").rglob("*.parquet"))
    assert sum(pq.read_metadata(f).num_rows for f in files) == d.stats.rows > 0  # this run's windows
    bad = seg.with_name(seg.name + ".bad")
    assert not seg.exists() and wal.read_segment(bad, repair=False) == old
    assert any(seg.name in r.getMessage() and "set aside" in r.getMessage() for r in caplog.records)
    again = Daemon(gpus, cfg)  # the next start: nothing left to replay
    again.prepare()
    again.shutdown()
    assert again.unpersisted() == (0, 0) and bad.exists()


@pytest.mark.parametrize(("named", "want"), [(7, "7"), ("7_2", "7_2"), ("../x", None), (True, None)])
def test_a_job_the_backend_names_with_a_number_is_its_text(tmp_path: Path, named: object,
                                                           want: str | None) -> None:
    """Review finding: a GPU process whose backend names its job with a number (file-state
    ``"job_id": 7``) put the int into the rows: the shared-GPU splitter crashed the daemon on it
    (``startswith``), and Parquet's string column would have refused the segment. Now a backend's
    job id is its text if it is a Slurm job id, else no job."""
    def job(g: SteppedClockGpus) -> None:
        g.update_gpu(0, processes=[{"pid": 100, "job_id": named, "user": "alice"}])

    d, rc, rows = _run(tmp_path, {}, stop_after=40, events={1: job})
    assert rc == 0 and d.unpersisted() == (0, 0) and len(rows) == d.stats.rows
    assert {r["job_id"] for r in rows if r["gpu_index"] == 0} == {want}


def test_a_value_parquet_refuses_costs_the_value_not_the_segment(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """Review finding: one row value Parquet's column type refuses (a number in a string column,
    text in a number column, an integer past int16) made the whole segment fail at every
    conversion. Now the segment's rows are fitted: an integer in a string column is kept as its
    text, anything else refused is null (ERROR naming it), a row without time bounds dropped."""
    import pyarrow.parquet as pq

    from wattclass.telemetry import wal
    from wattclass.telemetry.sink import ParquetSink

    row = {"ts_start": START_S, "ts_end": START_S + 10, "host": "n1", "gpu_index": 0, "gpu_uuid": "G"}
    w = wal.WalWriter(tmp_path / "wal")
    assert w.append([dict(row, job_id=123, energy_j="x", shared_jobs=2**40), dict(row, ts_end="y"),
                     dict(row, gpu_index=1, job_id="9", energy_j=5.0)])
    seg = w.roll()
    assert seg is not None
    with caplog.at_level(logging.ERROR, logger="wattclass.telemetry"):
        files = ParquetSink(tmp_path / "d").convert(seg)
    got = [(r["gpu_index"], r["job_id"], r["energy_j"], r["shared_jobs"])
           for f in files for r in pq.read_table(f).to_pylist()]
    assert got == [(0, "123", None, None), (1, "9", 5.0, None)]
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "job_id=123" in text and "energy_j='x'" in text and "without valid time bounds" in text



class BuggyGpu1(SteppedClockGpus):
    """GPU 1's poll raises what no backend should (a bug in a binding) for a stretch of polls."""

    def sample(self, index: int) -> GpuSample:
        if index == 1 and 20 <= self.polls < 30:
            raise RuntimeError("ctypes: wrong struct version")
        return super().sample(index)


def test_an_unexpected_error_of_one_gpu_leaves_the_others_polling(tmp_path: Path) -> None:
    """Review finding: only GpuError was caught per GPU; anything else one GPU's poll raised
    left the poll loop: the daemon stopped for every GPU, and the rows the GPUs before it had
    closed in that poll never reached the WAL. Now it is that GPU's failure, like a lost GPU."""
    _, d, rows = _run_faulty(BuggyGpu1, tmp_path, 80)
    gpu0 = sorted((r["ts_start"], r["ts_end"]) for r in rows if r["gpu_index"] == 0)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(gpu0))
    assert (gpu0[-1][1] - gpu0[0][0]).total_seconds() > 70
    gpu1 = [r for r in rows if r["gpu_index"] == 1]
    assert (gpu0[-1][1] - max(r["ts_end"] for r in gpu1)).total_seconds() < 0.1  # GPU 1 came back
    assert 1 <= d.stats.gpu_errors <= 10


class GpmLateGpus(SteppedClockGpus):
    """GPM-capable GPUs whose GPM sampling fails (NOT_SUPPORTED: profiling held by another tool)
    until poll 35, then works: a snapshot is (time, SM activity 40 %)."""

    def gpus(self) -> list[GpuInfo]:
        return [g._replace(gpm_supported=True) for g in super().gpus()]

    def gpm_snapshot(self, index: int) -> object | None:
        if self.polls < 35:
            raise GpuNotSupportedError(f"GPU {index} gpm_snapshot: NVML error 3")
        return ("gpm", self.real_s)

    def gpm_metrics(self, index: int, first: object, second: object) -> GpmMetrics:
        return GpmMetrics(sm_util_pct=40.0)


def test_gpm_unavailable_then_available_gives_null_then_real_metrics(tmp_path: Path) -> None:
    """Windows begun while GPM failed get null GPM metrics (not another window's, not NaN); from
    the first window begun with a snapshot on, the metrics are there; energy is unaffected."""
    FileStateBackend.create(tmp_path / "g.json", n=2)
    gpus = GpmLateGpus(tmp_path / "g.json").configure({}, 90)
    d = Daemon(gpus, DaemonConfig(data_root=tmp_path / "d", host="n1", energy_every_windows=3))
    assert d.run() == 0
    files = sorted((tmp_path / "d" / "telemetry").rglob("*.parquet"))
    rows = sorted((r for f in files for r in pq.read_table(f).to_pylist() if r["gpu_index"] == 0),
                  key=lambda r: r["ts_start"])
    sm = [r["sm_util_pct"] for r in rows[:-1]]  # the last: cut by the stop
    first = sm.index(40.0)
    assert first >= 3 and set(sm[:first]) == {None} and set(sm[first:]) == {40.0}
    assert all(r["power_avg_w"] == pytest.approx(POWER_W, rel=0.02) for r in rows[:-1])


class HungGpu1(SteppedClockGpus):
    """GPU 1 falls off the bus at poll 10 and each call to it waits 3 s for the driver's timeout
    before it fails; it is back at poll 100."""

    def sample(self, index: int) -> GpuSample:
        if index == 1 and 10 <= self.polls < 100:
            self.real_s += 3.0
            raise GpuLostError("GPU 1 sample: NVML error 10: Timeout")
        return super().sample(index)


def test_a_gpu_that_times_out_does_not_slow_the_others_polls(tmp_path: Path) -> None:
    """Review finding: a failing GPU was tried at every poll; where each try waits for the
    driver's timeout, every other GPU's poll came that much late for the whole outage (a 1 s poll
    every 4 s: windows of 3 polls, gaps). Now it is tried after 1, 2, 4... polls, at least every
    10 s, and comes back within that."""
    gpus, d, rows = _run_faulty(HungGpu1, tmp_path, 160)
    # 160 polls of GPU 0 took 160 s and a few timeouts, not 160 s and 90 of them (430 s)
    assert gpus.real_s - START_S < 160 + 20 * 3.0
    assert d.stats.gpu_errors <= 20  # tries during a 90-poll outage
    gpu0_end = max(r["ts_end"] for r in rows if r["gpu_index"] == 0)
    assert (gpu0_end - max(r["ts_end"] for r in rows if r["gpu_index"] == 1)).total_seconds() < 0.1


class RefusingGpu1(SteppedClockGpus):
    """GPU 1 refuses every call at once (NVML answers GPU_IS_LOST without waiting) from poll 10
    to poll 40."""

    def sample(self, index: int) -> GpuSample:
        if index == 1 and 10 <= self.polls < 40:
            raise GpuLostError("GPU 1 sample: NVML error 15: GPU is lost")
        return super().sample(index)


def test_a_gpu_whose_failures_come_at_once_is_tried_at_every_poll(tmp_path: Path) -> None:
    """A failure that costs the other GPUs no wait is no reason to skip polls: the GPU is tried
    at each one, so its windows resume at the first poll it answers (not up to 10 s later), and
    a replayed GPU before its first recorded sample replays to the same windows as before the
    back-off (the shipped model is rebuilt from such replays byte for byte)."""
    _, d, rows = _run_faulty(RefusingGpu1, tmp_path, 80)
    assert d.stats.gpu_errors == 30  # polls 10..39, each tried
    rows = [r for r in rows if r["gpu_index"] == 1]
    back = min(r["ts_start"] for r in rows if r["ts_start"].timestamp() > START_S + 20)
    # the first poll it answers is poll 40, at about START_S + 40 s; its window starts there
    assert back.timestamp() - START_S < 41.5


def test_a_rescued_segment_that_cannot_be_written_yet_is_held_and_counted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The records of a removed segment wait in memory while the disk is full, are counted as not
    persisted (the stop's exit code says so), and are written first once space is back."""
    import errno
    import shutil

    from wattclass.telemetry import wal

    w = wal.WalWriter(tmp_path / "wal")
    assert w.append([{"a": 1}]) and w.append([{"a": 2}])
    shutil.rmtree(tmp_path / "wal")
    real_write = os.write

    def full(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    assert not w.append([{"a": 3}])
    assert w.carry_rows == 2 and w.pending == [{"a": 3}]
    monkeypatch.setattr(os, "write", real_write)
    assert w.append([])
    assert w.carry_rows == 0 and not w.pending
    seg = w.roll()
    assert seg is not None and wal.read_segment(seg) == [{"a": 1}, {"a": 2}, {"a": 3}]


def test_partitions_follow_utc_whatever_the_nodes_time_zone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    """Windows and date partitions are UTC: a node in a zone with summer time (here on the night
    its clocks change) files a window by its UTC date, at its UTC bounds."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        FileStateBackend.create(tmp_path / "g.json", n=1)
        gpus = SteppedClockGpus(tmp_path / "g.json").configure({}, 200)
        gpus.real_s = 20891 * 86400.0 - 100.0  # 100 s before 2027-03-14 00:00 UTC; DST starts that night
        d = Daemon(gpus, DaemonConfig(data_root=tmp_path / "d", host="n1", energy_every_windows=1))
        assert d.run() == 0
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    files = sorted((tmp_path / "d" / "telemetry").rglob("*.parquet"))
    by_date = {f.parent.parent.name: pq.read_table(f).column("ts_start").to_pylist() for f in files}
    assert set(by_date) == {"date=2027-03-13", "date=2027-03-14"}
    for name, starts in by_date.items():
        assert {s.strftime("date=%Y-%m-%d") for s in starts} == {name}  # s is UTC-aware
    assert all(s.timestamp() % 10 == 0 for s in by_date["date=2027-03-14"][1:])  # on the UTC grid
