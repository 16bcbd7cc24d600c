"""Hardening of the telemetry daemon (issue 9, items 1-3): disk full, a second daemon, bad job
files. Real processes and a real small file system where the behaviour depends on them. (Item 4,
forged Slurm environments, is in test_telemetry_units.py next to the other attribution tests.)"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from wattclass.errors import DataError
from wattclass.gpu.replay import ReplayBackend
from wattclass.jobmap import JobAssignment, read_job_file, write_job_file
from wattclass.telemetry import wal
from wattclass.telemetry.daemon import Daemon, DaemonConfig
from wattclass.telemetry.metrics import LatestWindows

KEY = ["gpu_uuid", "ts_start", "job_id"]
IS_ROOT = os.geteuid() == 0


def daemon_cmd(raw: Path, root: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "wattclass.cli", "telemetry", "run", "--backend", f"replay:{raw}",
            "--data-root", str(root), "--host", "n1", *extra]


def parquet_rows(root: Path) -> pd.DataFrame:
    files = sorted(root.glob("telemetry/date=*/host=*/*.parquet"))
    if not files:
        return pd.DataFrame(columns=KEY)
    return pd.concat([pq.read_table(f).to_pandas() for f in files], ignore_index=True)


def keys(df: pd.DataFrame) -> set[tuple[str, int, str | None]]:
    ts = df.ts_start.dt.as_unit("ms").astype("int64")
    return {(u, int(t), j if isinstance(j, str) else None) for u, t, j in zip(df.gpu_uuid, ts, df.job_id,
                                                                               strict=True)}


def wal_record_count(wal_dir: Path) -> int:
    n = 0
    for seg in wal.list_segments(wal_dir):
        data = seg.read_bytes()
        n += data.count(wal.MAGIC)
    return n


# -- 1. disk full ---------------------------------------------------------------------------------
@contextlib.contextmanager
def small_tmpfs(size: str) -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="wattclass-full-"))
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(d)],
                       capture_output=True, text=True)
    if r.returncode:
        d.rmdir()
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)
        d.rmdir()


def fill(folder: Path) -> Path:
    """Fill the file system of ``folder`` to the last byte; returns the filler file."""
    filler = folder / "filler.bin"
    with open(filler, "wb", buffering=0) as fh:
        chunk = b"\0" * 65536
        while chunk:
            try:
                fh.write(chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                chunk = chunk[: len(chunk) // 2]
    return filler


@pytest.mark.skipif(not IS_ROOT, reason="mounting a small tmpfs needs root")
def test_disk_full_on_a_real_tmpfs_loses_no_window(tmp_path: Path, h200_raw: Path) -> None:
    """A 2 MB tmpfs filled to the last byte for a few seconds while the daemon runs: every window
    it closed (its own count, logged at exit) reaches Parquet once space is back, each once."""
    with small_tmpfs("2m") as root:
        proc = subprocess.Popen(daemon_cmd(h200_raw, root, "--speed", "60", "--roll-seconds", "60"),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.time() + 60
            while time.time() < deadline and wal_record_count(root / "wal" / "n1") < 2:
                time.sleep(0.05)
            filler = fill(root)
            time.sleep(3.0)  # about 18 windows close while the disk is full
            filler.unlink()
            _, err = proc.communicate(timeout=90)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert "WAL append" in err and "No space left on device" in err, err[-3000:]
        assert proc.returncode == 0, err[-3000:]
        closed = re.search(r"stopped: (\d+) window row", err)
        assert closed is not None, err[-3000:]
        got = parquet_rows(root)
        assert len(got) == int(closed.group(1)) > 50, err[-3000:]
        assert len(keys(got)) == len(got)  # each window once
        assert not wal.list_segments(root / "wal" / "n1")
        assert "damaged WAL record" not in err and "torn WAL tail" not in err


def _row(i: int) -> dict[str, object]:
    return {"ts_start": 1795967770.0 + 10 * i, "ts_end": 1795967780.0 + 10 * i, "host": "n1",
            "gpu_index": 0, "gpu_uuid": "GPU-x", "gpu_model": "H200", "job_id": "1", "user": "u",
            "energy_j": 100.0}


def test_short_write_never_leaves_a_torn_record_before_later_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """write(2) returning a short count (no exception) is the disk-full case on a real file system:
    the record is finished or cut back, never buried under later records."""
    real_write = os.write
    state = {"mode": "ok"}

    def boundary(fd: int, data: bytes) -> int:  # the OS boundary: short write, then ENOSPC
        if state["mode"] == "short":
            state["mode"] = "full"
            return real_write(fd, bytes(data[:7]))
        if state["mode"] == "full":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", boundary)
    w = wal.WalWriter(tmp_path)
    assert w.append([_row(0)])
    state["mode"] = "short"
    assert not w.append([_row(1)])
    assert w.pending == [_row(1)] and w.write_errors == 1
    with caplog.at_level(logging.WARNING):
        assert not w.append([_row(2)])  # still full: kept, in order
        state["mode"] = "ok"
        assert w.append([_row(3)])
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1  # one ERROR per outage (and per minute), not one per poll
    assert "works again after 2 failed append(s)" in caplog.text
    seg = w.close()
    assert seg is not None
    assert wal.read_segment(seg) == [_row(i) for i in range(4)]


def test_a_whole_record_whose_fsync_and_cut_back_fail_is_not_written_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review finding (rev-daemon): the record was written whole, then fsync failed (EIO) and so
    did the cut-back (ftruncate). The segment was retired with that whole, CRC-valid record as
    its tail, and its rows were also kept pending and written again into the next segment, so
    both segments' Parquet files held them: the windows twice, their energy counted twice. The
    retired segment's last record is now where those rows are (the daemon converts it)."""
    real_fsync, real_ftruncate = os.fsync, os.ftruncate
    fail = {"on": False}

    def eio(real: Callable[..., None]) -> Callable[..., None]:
        def call(*args: int) -> None:
            if fail["on"]:
                raise OSError(errno.EIO, "Input/output error")
            return real(*args)
        return call

    monkeypatch.setattr(os, "fsync", eio(real_fsync))
    monkeypatch.setattr(os, "ftruncate", eio(real_ftruncate))
    w = wal.WalWriter(tmp_path)
    assert w.append([_row(0)])
    fail["on"] = True
    w.append([_row(1)])
    fail["on"] = False
    assert w.append([_row(2)])
    segs = [*w.take_retired(), w.close()]
    rows = [r for seg in segs if seg is not None for r in wal.read_segment(seg)]
    assert sorted(rows, key=lambda r: r["ts_start"]) == [_row(0), _row(1), _row(2)]


def test_rows_held_through_a_long_outage_stay_readable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows held in memory while the disk was full go out with the next append that works; however
    many there are, every record written must be one the reader accepts (a record over
    ``MAX_RECORD`` used to be written whole, then read as a bad header and cut off as a torn tail:
    days of disk-full windows lost after space came back). MAX_RECORD is lowered to hit the limit
    with a few rows instead of 64 MiB of them."""
    monkeypatch.setattr(wal, "MAX_RECORD", 600)
    full = FullDisk(monkeypatch)
    w = wal.WalWriter(tmp_path)
    assert w.append([_row(0)])
    full.on = True
    for i in range(1, 40):  # the outage: every append fails, rows pile up in memory
        assert not w.append([_row(i)])
    full.on = False
    assert w.append([_row(40)])
    seg = w.close()
    assert seg is not None
    assert wal.read_segment(seg) == [_row(i) for i in range(41)]
    assert len(wal.encode([_row(i) for i in range(1, 41)])) > 600  # the limit was really hit


def test_a_damaged_record_does_not_cut_the_records_after_it(tmp_path: Path,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    p = tmp_path / "wal-1-1.log"
    good = wal.encode([{"a": 1}])
    torn = wal.encode([{"a": 2}])[:9]
    p.write_bytes(good + torn + wal.encode([{"a": 3}]) + wal.encode([{"a": 4}]))
    with caplog.at_level(logging.ERROR):
        assert wal.read_segment(p) == [{"a": 1}, {"a": 3}, {"a": 4}]
    assert "damaged WAL record" in caplog.text


class FullDisk:
    """ENOSPC at the OS boundary for WAL appends while ``on``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.on = False
        self.real = os.write
        monkeypatch.setattr(os, "write", self)

    def __call__(self, fd: int, data: bytes) -> int:
        if self.on:
            return self.real(fd, bytes(data[: max(1, len(data) // 3)])) if len(data) > 64 else 0
        return self.real(fd, data)


def test_unpersisted_windows_are_loud_and_stop_exits_nonzero(
    tmp_path: Path, h200_raw: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    disk = FullDisk(monkeypatch)
    collector = LatestWindows()
    cfg = DaemonConfig(data_root=tmp_path / "d", host="n1", roll_s=60, stop_retry_s=0.0)
    backend = ReplayBackend(h200_raw, realtime=False)
    d = Daemon(backend, cfg, collector=collector)
    d.prepare()
    rows = [_row(0), _row(1)]
    disk.on = True
    with caplog.at_level(logging.ERROR):
        d.record(rows)
    assert "WAL append" in caplog.text
    text = _scrape(collector)
    assert "wattclass_wal_write_errors_total 1.0" in text
    assert f"wattclass_wal_backlog_rows {float(len(rows))}" in text
    with caplog.at_level(logging.ERROR):
        d.shutdown()
    assert "LOST" in caplog.text
    assert d.unpersisted()[0] >= len(rows)
    # run() turns it into the exit status
    disk.on = True
    d2 = Daemon(ReplayBackend(h200_raw, realtime=False), DaemonConfig(
        data_root=tmp_path / "d2", host="n1", roll_s=60, stop_retry_s=0.0))
    assert d2.run() == 1


def _scrape(collector: LatestWindows) -> str:
    from prometheus_client import generate_latest
    from prometheus_client.registry import CollectorRegistry

    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    return generate_latest(reg).decode()


def test_full_disk_at_stop_is_retried_until_space_comes_back(
    tmp_path: Path, h200_raw: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    disk = FullDisk(monkeypatch)
    cfg = DaemonConfig(data_root=tmp_path / "d", host="n1", roll_s=60, stop_retry_s=5.0)
    d = Daemon(ReplayBackend(h200_raw, realtime=False), cfg)
    d.prepare()
    disk.on = True
    d.record([_row(0)])
    assert d.writer.pending
    monkeypatch.setattr(time, "sleep", lambda s: setattr(disk, "on", False))  # space is back
    d.shutdown()
    assert d.unpersisted() == (0, 0)
    assert len(parquet_rows(tmp_path / "d")) == 1


# -- 2. two daemons, one WAL folder -----------------------------------------------------------------
def test_second_daemon_on_the_same_wal_refuses_and_names_the_holder(tmp_path: Path, h200_raw: Path) -> None:
    root = tmp_path / "d"
    with socket.socket() as s:  # both ask for the same metrics port: the lock must answer first
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    first = subprocess.Popen(daemon_cmd(h200_raw, root, "--speed", "20", "--metrics-port", port),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while time.time() < deadline and not wal.list_segments(root / "wal" / "n1"):
            time.sleep(0.05)
        segs = wal.list_segments(root / "wal" / "n1")
        assert segs, "first daemon never wrote its WAL"
        second = subprocess.run(daemon_cmd(h200_raw, root, "--once", "--metrics-port", port),
                                capture_output=True, text=True, timeout=60)
        assert second.returncode == 6, second.stderr
        assert f"pid {first.pid}" in second.stderr and "telemetry daemon" in second.stderr
        assert all(s.exists() for s in segs)  # the open segment was not converted under the first
        first.send_signal(signal.SIGTERM)
        _, err = first.communicate(timeout=60)
        assert first.returncode == 0, err
    finally:
        if first.poll() is None:
            first.kill()
    # once the first is gone, the lock is free again
    third = subprocess.run(daemon_cmd(h200_raw, root, "--once"), capture_output=True, text=True, timeout=60)
    assert third.returncode == 0, third.stderr


def test_a_metrics_port_already_taken_is_a_configuration_error_that_frees_the_wal_lock(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Port 9410 taken by another program (or a --metrics-bind address not on this host): one line
    naming the option and the reason, exit 2, and the WAL lock released for the next start; it was a
    Python traceback with exit 1 (a sysadmin review's finding)."""
    from wattclass import cli
    from wattclass.gpu.filestate import FileStateBackend
    from wattclass.lockfile import FolderLock

    gpus = tmp_path / "gpus.json"
    FileStateBackend.create(gpus, n=1)
    root = tmp_path / "d"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        rc = cli.main(["telemetry", "run", "--backend", f"filestate:{gpus}", "--data-root", str(root),
                       "--host", "n1", "--metrics-port", port])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert f"--metrics-port {port}" in err and "127.0.0.1" in err and "Traceback" not in err
    with FolderLock(root / "wal" / "n1", "test"):  # free again: a restart is not told "locked"
        pass


@pytest.mark.parametrize(("option", "value", "named"), [
    ("--metrics-port", "99999", "--metrics-port 99999"),
    ("--roll-seconds", "0", "--roll-seconds"),
    ("--period", "0", "--period"),
    ("--poll", "nan", "--poll"),
    ("--energy-every-windows", "0", "--energy-every-windows"),
])
def test_a_bad_daemon_option_is_refused_naming_it_with_the_usage_exit_code(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, value: str, named: str) -> None:
    """Exit 2 (bad configuration or usage, as documented) and the option's name, before any poll:
    --roll-seconds 0 was a ZeroDivisionError traceback at the first poll, --metrics-port 99999 an
    OverflowError traceback, and the others exited 1, the code of a failure at run time."""
    from wattclass import cli
    from wattclass.gpu.filestate import FileStateBackend

    gpus = tmp_path / "gpus.json"
    FileStateBackend.create(gpus, n=1)
    rc = cli.main(["telemetry", "run", "--backend", f"filestate:{gpus}", "--data-root", str(tmp_path / "d"),
                   "--host", "n1", option, value])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert named in err and "Traceback" not in err
    assert not list((tmp_path / "d").glob("telemetry/date=*"))  # refused before a window was written


# -- 3. bad job-map files ---------------------------------------------------------------------------
BAD_JOB_FILES: dict[str, bytes] = {
    "uid-not-int": b'{"version": 1, "job_id": "42", "user": "alice", "uid": "notint"}',
    "bad-json": b'{"version": 1, "job_id": ',
    "not-utf8": b'{"job_id": "42", "user": "\xff\xfe"}',
    "list": b'["42"]',
    "uid-bool": b'{"job_id": "42", "user": "alice", "uid": true}',
    "job-id-object": b'{"job_id": {"a": 1}, "user": "alice"}',
    "user-number": b'{"job_id": "42", "user": 7}',
    "huge": b'{"job_id": "' + b"%" * 100_000 + b'"}',
    # review (rev-daemon): the job id pattern ended in ``$``, which also matches before a final
    # newline, and had no length bound here, so both were read as job ids and written into rows
    "job-id-newline": b'{"job_id": "42\\n", "user": "alice"}',
    "job-id-huge-digits": b'{"job_id": "' + b"4" * 100_000 + b'", "user": "alice"}',
    # valid UTF-8 JSON whose escape decodes to a lone surrogate: no UTF-8 text can hold it
    "user-lone-surrogate": b'{"job_id": "42", "user": "\\udc80"}',
    "account-lone-surrogate": b'{"job_id": "42", "user": "alice", "account": "a\\ud800"}',
}


@pytest.mark.parametrize("name", sorted(BAD_JOB_FILES))
def test_bad_job_file_is_a_data_error_naming_the_file(tmp_path: Path, name: str) -> None:
    f = tmp_path / "GPU-x.json"
    f.write_bytes(BAD_JOB_FILES[name])
    os.chmod(f, 0o644)
    with pytest.raises(DataError, match=r"GPU-x\.json") as exc:
        read_job_file(f)
    assert len(str(exc.value)) < 400  # user-controlled content is truncated


def _reference_run_and_bad_spool(tmp_path: Path, h200_raw: Path, bad: str) -> Path:
    """A replay without job files into ``tmp_path/ref``, and a spool holding ``BAD_JOB_FILES[bad]``
    as every GPU's job file (root-trusted modes)."""
    spool = tmp_path / "spool"
    spool.mkdir()
    os.chmod(spool, 0o755)
    ref = Daemon(ReplayBackend(h200_raw, realtime=False),
                 DaemonConfig(data_root=tmp_path / "ref", host="n1", once=True))
    assert ref.run() == 0
    for g in ReplayBackend(h200_raw, realtime=False).gpus():
        (spool / f"{g.uuid}.json").write_bytes(BAD_JOB_FILES[bad])
        os.chmod(spool / f"{g.uuid}.json", 0o644)
    return spool


def test_daemon_keeps_polling_past_bad_job_files(tmp_path: Path, h200_raw: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    """The daemon's first poll used to raise ValueError on ``"uid": "notint"`` (a restart loop
    under systemd). Now the file is skipped (logged once, truncated) and the GPU is attributed
    from its process list as if there were no file."""
    spool = _reference_run_and_bad_spool(tmp_path, h200_raw, "uid-not-int")
    d = Daemon(ReplayBackend(h200_raw, realtime=False),
               DaemonConfig(data_root=tmp_path / "d", host="n1", once=True, job_spool=spool))
    with caplog.at_level(logging.WARNING):
        assert d.run() == 0
    assert "ignoring job file" in caplog.text and "notint" in caplog.text
    assert caplog.text.count("ignoring job file") == len(list(spool.iterdir()))  # once, not per poll
    assert keys(parquet_rows(tmp_path / "d")) == keys(parquet_rows(tmp_path / "ref"))


def test_a_user_no_utf8_can_hold_does_not_poison_the_wal(tmp_path: Path, h200_raw: Path) -> None:
    """Review finding (rev-daemon): a job file's ``"user": "\\udc80"`` (a JSON escape, so the file
    is valid UTF-8) was taken as the user; the rows reached the WAL, but their segment could not
    be converted (pyarrow's JSON reader refuses the lone surrogate: ArrowInvalid, not an OSError),
    so the roll raised out of the daemon, and every restart raised again on the same leftover
    segment before polling (a crash loop). Now the file is refused like any bad job file."""
    spool = _reference_run_and_bad_spool(tmp_path, h200_raw, "user-lone-surrogate")
    cfg = DaemonConfig(data_root=tmp_path / "d", host="n1", once=True, job_spool=spool)
    assert Daemon(ReplayBackend(h200_raw, realtime=False), cfg).run() == 0
    assert keys(parquet_rows(tmp_path / "d")) == keys(parquet_rows(tmp_path / "ref"))
    assert wal.list_segments(cfg.resolved_wal_dir()) == []


def test_epilog_cleans_up_its_job_files_past_a_bad_one(tmp_path: Path, h200_raw: Path) -> None:
    from wattclass.plugin.prolog import epilog

    jobs, state = tmp_path / "jobs", tmp_path / "state"
    for d in (jobs, state):
        d.mkdir()
        os.chmod(d, 0o755)
    (jobs / "GPU-aaa.json").write_bytes(BAD_JOB_FILES["uid-not-int"])
    os.chmod(jobs / "GPU-aaa.json", 0o644)
    write_job_file(jobs, "GPU-bbb", JobAssignment("42", "alice", 1000))
    write_job_file(jobs, "GPU-ccc", JobAssignment("43", "bob", 1001))
    epilog({"SLURM_JOB_ID": "42", "SLURM_JOB_USER": "alice"}, ReplayBackend(h200_raw, realtime=False),
           jobs_dir=jobs, state_dir=state)
    # one file per job per GPU since issue 16: the bad legacy file stays, job 42's file is gone
    assert sorted(str(p.relative_to(jobs)) for p in jobs.rglob("*.json")) == ["GPU-aaa.json",
                                                                               "GPU-ccc/43.json"]


def test_a_clock_stepped_back_does_not_stall_polling(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Review finding: the daemon waits for the next poll time on the wall clock, so a clock
    stepped back by 30 s (NTP at boot) made the next wait 30 s long, without a word. Now it warns
    and polls on from the new time."""
    import threading

    from wattclass.gpu.filestate import FileStateBackend

    backend = FileStateBackend.create(tmp_path / "g.json", n=1)
    offset_s = [0.0]
    backend.now = lambda: time.time() + offset_s[0]  # type: ignore[method-assign]
    stop = threading.Event()
    d = Daemon(backend, DaemonConfig(data_root=tmp_path / "d", host="n1", period_s=1.0, poll_s=0.1),
               stop=stop)
    th = threading.Thread(target=d.run)
    with caplog.at_level(logging.WARNING, logger="wattclass.telemetry"):
        th.start()
        try:
            deadline = time.monotonic() + 30
            while d.stats.polls < 5 and time.monotonic() < deadline:
                time.sleep(0.05)
            offset_s[0] = -30.0
            before = d.stats.polls
            deadline = time.monotonic() + 20
            while d.stats.polls < before + 5 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert d.stats.polls >= before + 5  # it polled on (it used to wait the 30 s out)
        finally:
            stop.set()
            th.join(timeout=60)
    assert any("clock stepped back" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(("part_file", "content", "why"), [
    ("part1_samples_1hz.parquet", b"PAR1xx", r"part1_samples_1hz\.parquet: not a readable Parquet file"),
    ("part1_runs.csv", b"", r"part1_runs\.csv: not a readable runs CSV"),
    ("part1_runs.csv", b"job,start,end\nx,abc,1\n", r"part1_runs\.csv row 0: start 'abc' is not a time"),
    ("part1_runs.csv", b"job,start,end\nx,,1\n", r"part1_runs\.csv row 0: start 'nan' is not a time"),
    ("part1_samples_1hz.parquet", "no rows", r"no samples \(every samples file is empty\)"),
    ("part1_samples_1hz.parquet", "ts as text", r"column 'ts' is not seconds"),
])
def test_a_damaged_recording_is_a_named_error(h200_raw: Path, tmp_path: Path, part_file: str,
                                              content: bytes | str, why: str) -> None:
    # `telemetry run --backend replay:DIR`: each was a traceback (ArrowInvalid, EmptyDataError,
    # ValueError, "min() arg is an empty sequence"), or a blank start read as NaN, silently
    import shutil

    import pyarrow as pa

    d = tmp_path / "rec"
    d.mkdir()
    for f in h200_raw.glob("part1_*"):
        shutil.copy(f, d / f.name)
    if isinstance(content, bytes):
        (d / part_file).write_bytes(content)
    else:
        t = pq.read_table(d / part_file)
        if content == "no rows":
            t = t.slice(0, 0)
        else:
            t = t.set_column(t.column_names.index("ts"), "ts", pa.array(["x"] * t.num_rows))
        pq.write_table(t, d / part_file)
    with pytest.raises(DataError, match=why):
        ReplayBackend(d, realtime=False)
