"""Hostile-review cases for the nightly's input checks (tests/test_nightly_checks.py has the
feature's own): broken job records must neither crash the night nor switch the host check off
unnoticed, a night whose every job window its records reject must not pass as "no jobs", and a
replay that loses data must still say so."""

from __future__ import annotations

import json
import logging
import resource
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import test_nightly_checks
from conftest import H200_DATE, H200_HOST

from wattclass.cli import main
from wattclass.jobrecord import hostnames

DATE, HOST = H200_DATE, H200_HOST
jobs_csv = test_nightly_checks.jobs_csv  # the fixture: the bundled jobs with the node each ran on


def test_hostlist_numbers_too_long_or_too_wide_are_broken_records_not_a_crash_or_a_memory_bomb() -> None:
    # Python refuses int() of more than 4,300 digits: this raised ValueError out of the nightly
    assert hostnames("n[" + "1" * 5000 + "]") is None
    assert hostnames("n[" + "0" * 5000 + "-1]") is None
    # 100,000 names padded to 3,000 digits: 300 MB from one record of a jobs file
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert hostnames("n[" + "0" * 3000 + "-99999]") is None
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100_000  # KiB
    assert hostnames("gpu[0001-0003]") == ["gpu0001", "gpu0002", "gpu0003"]  # real padding still works
    # one bracket group a recursion level: 1,500 of them raised RecursionError
    assert hostnames("a[1]" * 1500) is None
    assert hostnames("a[1-2]" * 3) == [f"a{i}a{j}a{k}" for i in (1, 2) for j in (1, 2) for k in (1, 2)]


def nightly(root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, dict]:
    rc = main(["nightly", "--data-root", str(root), "--date", DATE, "--no-retrain", "--table-out",
               str(tmp_path / "table.lua"), "--json", *extra])
    return rc, json.loads(capsys.readouterr().out)


def test_a_jobs_file_with_a_broken_node_list_neither_crashes_the_night_nor_goes_unnoticed(
    h200_day_root: Path, tmp_path: Path, jobs_csv: Path, capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    jobs = pd.read_csv(jobs_csv, dtype={"job_id": str})
    evil = "n[" + "9" * 5000 + "]"
    jobs.loc[jobs.index[0], "nodes"] = evil
    jobs.to_csv(jobs_csv, index=False)
    with caplog.at_level(logging.WARNING):
        rc, s = nightly(h200_day_root, tmp_path, capsys, "--jobs-file", str(jobs_csv))
    assert rc == 0 and s["status"] == "ok"
    warned = [r.getMessage() for r in caplog.records if "node list" in r.getMessage()]
    assert len(warned) == 1 and "1 job record" in warned[0] and jobs.iloc[0]["job_id"] in warned[0]
    assert evil not in warned[0]  # clipped


def test_a_night_whose_records_reject_every_job_window_fails_loudly_not_as_no_jobs(
    h200_day_root: Path, tmp_path: Path, h200_telemetry: Path, jobs_csv: Path,
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
) -> None:
    """The daemon's host names unlike Slurm's node names (``--host``, NodeHostname): every job
    window is "not on the job's host". Before, the night ended "no jobs: telemetry but no job
    windows", exit 0, the label table left stale without an error."""
    jobs = pd.read_csv(jobs_csv, dtype={"job_id": str})
    jobs["nodes"] = "node-[01-04]"
    jobs.to_csv(jobs_csv, index=False)
    n = pq.read_metadata(h200_telemetry).num_rows
    with caplog.at_level(logging.ERROR):
        rc, s = nightly(h200_day_root, tmp_path, capsys, "--jobs-file", str(jobs_csv))
    assert rc == 3  # DataError's exit code
    assert s["status"] == "job windows rejected" and s["jobs"] == 0
    assert s["job_check"]["rejected_windows"] == s["rejected_rows"]["count"] > 0.9 * n
    assert "Slurm record" in s["message"] and "no job windows" not in s["message"]
    assert any("contradict" in r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)


def test_a_night_whose_records_reject_most_job_windows_logs_an_error(
    h200_day_root: Path, tmp_path: Path, jobs_csv: Path,
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
) -> None:
    jobs = pd.read_csv(jobs_csv, dtype={"job_id": str})
    jobs.loc[jobs.index[1:], "nodes"] = "elsewhere"  # all but one job
    jobs.to_csv(jobs_csv, index=False)
    with caplog.at_level(logging.ERROR):
        rc, s = nightly(h200_day_root, tmp_path, capsys, "--jobs-file", str(jobs_csv))
    assert rc == 0 and s["status"] == "ok" and s["jobs"] >= 1
    assert s["job_check"]["rejected_share"] > 0.5
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("contradict" in m and "host" in m for m in errors)


def test_a_replay_keeps_the_daemons_data_loss_errors_in_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """replay.py keeps the replayed daemon's GPU-failure ERRORs (recording gaps) out of the log;
    an ERROR that says rows were damaged or lost (the WAL's: a value written as null, a damaged
    record skipped, both with exit status 0) must still reach it."""
    from wattclass.classifier.replay import replay_recording
    from wattclass.telemetry import daemon

    real = daemon.Daemon.record
    said: list[bool] = []

    def record(self: daemon.Daemon, rows: list) -> None:
        if rows and not said:
            said.append(True)
            logging.getLogger("wattclass.telemetry.wal").error("WAL: power_avg_w=nan written as null")
        real(self, rows)

    monkeypatch.setattr(daemon.Daemon, "record", record)
    fresh = Path(__file__).resolve().parent.parent / "wattclass" / "data" / "h200" / "fresh"
    with caplog.at_level(logging.WARNING):
        replay_recording(fresh, tmp_path / "fresh")
    msgs = [r.getMessage() for r in caplog.records if r.name.startswith("wattclass.telemetry")]
    assert any("written as null" in m for m in msgs)
    assert not any("failed" in m for m in msgs), msgs  # the recording's gaps stay quiet


def test_the_day_from_a_file_name_is_its_innermost_date_folder_as_in_the_nightly(tmp_path: Path) -> None:
    """A data root under a folder named date=... (a dated backup: /backup/date=2026-01-01/wattclass):
    the file name's day must be the partition's (the innermost date= folder, as
    ``partition_day_ms`` reads it), not the backup's, else ``wattclass simulate`` and a nightly
    over many days rejected every window as outside its day."""
    import duckdb

    from wattclass.classifier.rowsql import FILENAME_DAY_SQL, partition_day_ms

    path = f"{tmp_path}/date=2026-01-01/wattclass/telemetry/date={DATE}/host={HOST}/x.parquet"
    got = duckdb.sql(f"SELECT {FILENAME_DAY_SQL} AS d FROM (SELECT '{path}' AS filename)").fetchall()[0][0]
    assert got == partition_day_ms(path) == int(pd.Timestamp(DATE, tz="UTC").timestamp()) * 1000


def test_a_job_record_with_a_far_time_does_not_crash_the_night(
    h200_day_root: Path, tmp_path: Path, jobs_csv: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """The jobs file reader takes year 9999 (or 1000) as a time; the job table's epoch ms went
    through nanoseconds and raised OverflowError out of the nightly."""
    jobs = pd.read_csv(jobs_csv, dtype={"job_id": str})
    for c in ("start", "end"):
        jobs[c] = pd.to_datetime(jobs[c], unit="s", utc=True).map(lambda t: t.isoformat()).astype(object)
    jobs.loc[jobs.index[0], "end"] = "9999-12-31T00:00:00+00:00"
    jobs.loc[jobs.index[1], "start"] = "1000-01-01T00:00:00+00:00"
    jobs.to_csv(jobs_csv, index=False)
    rc, s = nightly(h200_day_root, tmp_path, capsys, "--jobs-file", str(jobs_csv))
    assert rc == 0 and s["status"] == "ok" and s["rejected_rows"]["count"] == 0


def test_a_requeued_jobs_earlier_run_is_not_rejected_against_its_last_run(
    h200_day_root: Path, tmp_path: Path, h200_telemetry: Path, jobs_csv: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A requeued job keeps its id: its records (sacct --duplicates, or a jobs file exported so)
    are one per run. Checked against the last run alone, the windows of the run before it (another
    node, earlier) were rejected as "not on this host" and "outside start..end", with a warning
    blaming the job; a host none of its runs had is still rejected."""
    jobs = pd.read_csv(jobs_csv, dtype={"job_id": str})
    rerun = jobs.iloc[[0]].copy()
    rerun["start"], rerun["end"] = rerun["start"] + 7200, rerun["end"] + 7200
    rerun["nodes"] = "gpu-h200-[07-08]"
    pd.concat([jobs, rerun]).to_csv(jobs_csv, index=False)
    w = pq.read_table(h200_telemetry).to_pandas()
    own = w[w["job_id"] == jobs.iloc[0]["job_id"]]
    stray = own.iloc[[0]].copy()
    stray["host"] = "gpu-h200-09"
    d = h200_day_root / "telemetry" / f"date={DATE}" / "host=gpu-h200-09"
    d.mkdir(parents=True)
    stray.to_parquet(d / "stray.parquet", index=False)
    rc, s = nightly(h200_day_root, tmp_path, capsys, "--jobs-file", str(jobs_csv))
    assert rc == 0 and s["rejected_rows"] == {"count": 1, "job not on this host (Slurm record)": 1}
    labels = pd.read_parquet(h200_day_root / "classifier" / "labels" / f"date={DATE}" / "labels.parquet")
    assert labels.set_index("job_id").loc[jobs.iloc[0]["job_id"], "n_windows"] == len(own)
