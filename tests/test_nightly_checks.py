"""The nightly does not trust a window's day, its copies or its job attribution blindly: windows
outside their date= partition's day, conflicting duplicate copies, and windows that their job's
Slurm record contradicts (foreign host, outside the job's time, another user), through the real
``wattclass nightly`` on real Parquet files."""

from __future__ import annotations

import json
import logging
import shutil
import threading
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import H200_DATE, H200_HOST

from wattclass.classifier.validity import (
    JOB_TIME_SLACK_S,
    PARTITION_SLACK_S,
    REJECT_DAY,
    REJECT_JOB_HOST,
    REJECT_JOB_TIME,
    REJECT_JOB_USER,
)
from wattclass.cli import main

DATE, HOST = H200_DATE, H200_HOST
NEXT_MIDNIGHT = pd.Timestamp("2026-11-30", tz="UTC")


@pytest.fixture
def jobs_csv(h200_telemetry: Path, tmp_path: Path) -> Path:
    """The bundled jobs with the node each ran on (``nodes``, as sacct's NodeList)."""
    jobs = pd.read_csv(h200_telemetry.parent / "jobs.csv", dtype={"job_id": str})
    jobs["nodes"] = jobs["host"]
    jf = tmp_path / "jobs.csv"
    jobs[["job_id", "name", "user", "start", "end", "nodes"]].to_csv(jf, index=False)
    return jf


def nightly(root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> dict:
    rc = main(["nightly", "--data-root", str(root), "--date", DATE, "--no-retrain", "--table-out",
               str(tmp_path / "table.lua"), "--json", *extra])
    assert rc == 0
    return json.loads(capsys.readouterr().out)


def part(root: Path, host: str = HOST) -> Path:
    d = root / "telemetry" / f"date={DATE}" / f"host={host}"
    d.mkdir(parents=True, exist_ok=True)
    return d


def windows(h200: Path) -> pd.DataFrame:
    return pq.read_table(h200).to_pandas()


def write(df: pd.DataFrame, path: Path, h200: Path) -> None:
    pq.write_table(pa.Table.from_pandas(df, schema=pq.read_schema(h200), preserve_index=False), path)


def labels_of(root: Path) -> pd.DataFrame:
    path = root / "classifier" / "labels" / f"date={DATE}" / "labels.parquet"
    return pd.read_parquet(path).set_index("job_id")


# -- 1. windows outside their day -------------------------------------------------------------------
def test_window_far_outside_its_partition_day_is_rejected_near_midnight_kept(
    h200_day_root: Path, tmp_path: Path, h200_telemetry: Path,
    capsys: pytest.CaptureFixture[str]
) -> None:
    root = h200_day_root
    clean = nightly(root, tmp_path, capsys)
    w = windows(h200_telemetry).head(4).copy()
    w["job_id"] = "999"
    length = w["ts_end"] - w["ts_start"]
    # a wrong clock: three days ahead, and one a day behind; filed under 2026-11-29 all the same
    starts = [pd.Timestamp("2026-12-02 10:00", tz="UTC"), pd.Timestamp("2026-11-28 12:00", tz="UTC"),
              # straddles midnight: starts in the day (kept), and one a minute past it (kept: slack)
              NEXT_MIDNIGHT - pd.Timedelta(seconds=5), NEXT_MIDNIGHT + pd.Timedelta(seconds=60)]
    w["ts_start"] = pd.Series(starts, index=w.index).astype(w["ts_start"].dtype)
    w["ts_end"] = w["ts_start"] + length
    write(w, part(root) / "skewed.parquet", h200_telemetry)
    s = nightly(root, tmp_path, capsys)
    assert s["rejected_rows"] == {"count": 2, REJECT_DAY: 2}
    assert s["windows"] == clean["windows"] + 2
    assert labels_of(root).loc["999", "n_windows"] == 2
    assert str(PARTITION_SLACK_S) in REJECT_DAY


def test_report_and_simulate_leave_out_windows_outside_their_day(
    h200_day_root: Path, h200_telemetry: Path
) -> None:
    root = h200_day_root
    from wattclass.report.data import load
    from wattclass.savings.simulate import scan_jobs

    w = windows(h200_telemetry).head(3).copy()
    w["ts_start"] = w["ts_start"] + pd.Timedelta(days=5)
    w["ts_end"] = w["ts_end"] + pd.Timedelta(days=5)
    write(w, part(root) / "skewed.parquet", h200_telemetry)
    files = sorted(part(root).glob("*.parquet"))
    assert load(files).rejected_rows == {REJECT_DAY: 3}
    rejected: dict[str, int] = {}
    scan_jobs(root, rejected=rejected)
    assert rejected == {REJECT_DAY: 3}


# -- 2. conflicting duplicates ----------------------------------------------------------------------
@pytest.mark.parametrize("copy_name", ["a-copy.parquet", "z-copy.parquet"])
def test_conflicting_duplicates_are_counted_and_the_first_file_by_path_wins(
    h200_day_root: Path, tmp_path: Path, h200_telemetry: Path,
    capsys: pytest.CaptureFixture[str], copy_name: str
) -> None:
    root = h200_day_root
    clean = nightly(root, tmp_path, capsys)
    w = windows(h200_telemetry)
    job = w["job_id"].dropna().iloc[0]
    mine = w[w["job_id"] == job].copy()
    n_diff = min(3, len(mine))
    mine.loc[mine.index[:n_diff], "energy_j"] = mine["energy_j"].iloc[:n_diff] * 0.5  # a re-import's values
    write(mine, part(root) / copy_name, h200_telemetry)
    s = nightly(root, tmp_path, capsys)
    assert s["duplicate_windows"] == len(mine)
    assert s["conflicting_duplicates"] == n_diff
    assert s["windows"] == clean["windows"]
    energy = labels_of(root).loc[job, "energy_j"]
    want = mine["energy_j"].sum() if copy_name < "part-0.parquet" else w[w["job_id"] == job]["energy_j"].sum()
    assert energy == pytest.approx(want)


def test_identical_copies_are_duplicates_but_not_conflicting(
    h200_day_root: Path, tmp_path: Path, h200_telemetry: Path,
    capsys: pytest.CaptureFixture[str]
) -> None:
    root = h200_day_root
    shutil.copy(part(root) / "part-0.parquet", part(root) / "copied.parquet")
    s = nightly(root, tmp_path, capsys)
    assert s["duplicate_windows"] == len(windows(h200_telemetry)) - 0 and s["conflicting_duplicates"] == 0


# -- 3. job attribution against Slurm's records -----------------------------------------------------
def test_windows_their_slurm_record_contradicts_do_not_count_for_the_job(
    h200_day_root: Path, tmp_path: Path, h200_telemetry: Path,
    jobs_csv: Path, capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    root = h200_day_root
    clean = nightly(root, tmp_path, capsys, "--jobs-file", str(jobs_csv))
    assert clean["rejected_rows"]["count"] == 0  # the real night: every window agrees with its record
    before = labels_of(root)
    jobs = pd.read_csv(jobs_csv, dtype={"job_id": str})
    victim = jobs.iloc[0]
    end = pd.Timestamp(float(victim["end"]), unit="s", tz="UTC")
    w = windows(h200_telemetry)
    own = w[w["job_id"] == victim["job_id"]]
    assert len(own) and (own["user"] == victim["user"]).all()
    # mallory's busy GPU on a host the victim never ran on, claiming the victim's job
    evil_host = "evil-node-" + "x" * 300
    foreign = w[w["job_id"] == jobs.iloc[1]["job_id"]].copy()
    foreign["job_id"], foreign["user"], foreign["host"] = victim["job_id"], "mallory", evil_host
    write(foreign, part(root, "evil-node") / "evil.parquet", h200_telemetry)
    # on the victim's host: one window long after the job ended, one of another user in its time,
    # and one just past its end, within the slack (kept)
    late, other, edge = (own.iloc[[-1]].copy() for _ in range(3))
    late["ts_start"] = end + pd.Timedelta(minutes=10)
    late["ts_end"] = end + pd.Timedelta(minutes=10, seconds=10)
    other["user"] = "mallory"
    other["ts_start"] = other["ts_start"] + pd.Timedelta(milliseconds=1)
    edge["ts_start"] = end + pd.Timedelta(seconds=JOB_TIME_SLACK_S // 2 - 10)
    edge["ts_end"] = end + pd.Timedelta(seconds=JOB_TIME_SLACK_S // 2)
    write(pd.concat([late, other, edge]), part(root) / "claims.parquet", h200_telemetry)
    with caplog.at_level(logging.WARNING, logger="wattclass.classifier"):
        s = nightly(root, tmp_path, capsys, "--jobs-file", str(jobs_csv))
    assert s["rejected_rows"] == {"count": len(foreign) + 2, REJECT_JOB_HOST: len(foreign),
                                  REJECT_JOB_TIME: 1, REJECT_JOB_USER: 1}
    after = labels_of(root)
    assert after.loc[victim["job_id"], "n_windows"] == before.loc[victim["job_id"], "n_windows"] + 1  # edge
    assert after.loc[victim["job_id"], "label"] == before.loc[victim["job_id"], "label"]
    assert after.loc[victim["job_id"], "hosts"] == HOST
    warned = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
    host_line = next(m for m in warned if "evil-node" in m)
    assert str(victim["job_id"]) in host_line and REJECT_JOB_HOST in host_line
    assert evil_host not in host_line and "chars)" in host_line  # the user-set host is clipped
    assert any(REJECT_JOB_TIME in m for m in warned) and any(REJECT_JOB_USER in m for m in warned)


def test_the_slurm_records_are_read_beside_the_scan(
    h200_day_root: Path, tmp_path: Path, jobs_csv: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The records (``sacct`` at a large site: seconds) are asked for while the scan runs, not
    before it (issue 15): a client that answers only once the scan's query has started still
    gives the night its records, checks and joined fields, the same as one that answers at once."""
    from wattclass.classifier import scan
    from wattclass.slurm.client import JobsFileClient

    root = h200_day_root
    at_once = nightly(root, tmp_path, capsys, "--jobs-file", str(jobs_csv))
    labels = labels_of(root)
    started = threading.Event()
    asked: list[bool] = []
    real_execute, real_frame = scan.Scanner._execute, JobsFileClient.jobs_frame

    def execute(self: scan.Scanner, sql: str) -> pa.Table:
        started.set()
        return real_execute(self, sql)

    def slow_frame(self: JobsFileClient, start: object, end: object) -> pd.DataFrame:
        # False: the records were asked for before the scan; and beside it, not in the run's thread
        asked.append(started.wait(30) and threading.current_thread() is not threading.main_thread())
        return real_frame(self, start, end)  # type: ignore[arg-type]

    monkeypatch.setattr(scan.Scanner, "_execute", execute)
    monkeypatch.setattr(JobsFileClient, "jobs_frame", slow_frame)
    beside = nightly(root, tmp_path, capsys, "--jobs-file", str(jobs_csv))
    assert asked == [True]
    assert beside["job_records"] == at_once["job_records"] and beside["jobs"] == at_once["jobs"]
    assert beside["job_records"]["jobs_without_record"] < beside["jobs"]  # the records were joined
    pd.testing.assert_frame_equal(labels_of(root), labels)


def test_windows_of_a_job_without_a_record_are_not_checked(
    h200_day_root: Path, tmp_path: Path, h200_telemetry: Path,
    jobs_csv: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = h200_day_root
    """No record, nothing to check against: the windows count as the daemon booked them (the job
    keeps no user, so it adds no user-keyed table entry; tests/test_nightly_hardening.py)."""
    w = windows(h200_telemetry).head(5).copy()
    w["job_id"], w["host"] = "777", "elsewhere"
    write(w, part(root, "elsewhere") / "x.parquet", h200_telemetry)
    s = nightly(root, tmp_path, capsys, "--jobs-file", str(jobs_csv))
    assert s["rejected_rows"]["count"] == 0
    assert labels_of(root).loc["777", "n_windows"] == 5
    assert pd.isna(labels_of(root).loc["777", "user"])


def test_a_running_job_and_a_record_without_nodes_check_only_what_is_known(
    h200_day_root: Path, tmp_path: Path, h200_telemetry: Path,
    jobs_csv: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = h200_day_root
    """A job still running has no end, an older jobs file no nodes: neither is held against it."""
    jobs = pd.read_csv(jobs_csv, dtype={"job_id": str})
    jobs["end"] = None
    jobs.loc[jobs.index[0], "nodes"] = None
    jobs.to_csv(jobs_csv, index=False)
    w = windows(h200_telemetry)
    later = w[w["job_id"] == jobs.iloc[0]["job_id"]].iloc[[-1]].copy()
    later["ts_start"] = later["ts_start"] + pd.Timedelta(hours=2)
    later["ts_end"] = later["ts_end"] + pd.Timedelta(hours=2)
    later["host"] = "other-node"
    write(later, part(root, "other-node") / "later.parquet", h200_telemetry)
    s = nightly(root, tmp_path, capsys, "--jobs-file", str(jobs_csv))
    assert s["rejected_rows"]["count"] == 0
    assert labels_of(root).loc[jobs.iloc[0]["job_id"], "hosts"] == f"{HOST},other-node"


def test_hostlist_expansion() -> None:
    from wattclass.jobrecord import hostnames

    assert hostnames("gpu[01-03,10],login1") == ["gpu01", "gpu02", "gpu03", "gpu10", "login1"]
    assert hostnames("a[1-2]-ib[0-1]") == ["a1-ib0", "a1-ib1", "a2-ib0", "a2-ib1"]
    assert hostnames("node7") == ["node7"]
    for broken in (None, "", "None assigned", "n[1-2", "n[3-1]", "n[a-b]", "n[1-10000000]"):
        assert hostnames(broken) is None


def test_rejected_windows_without_gpm_give_the_model_no_votes_either(
    h200_day_root: Path, tmp_path: Path, h200_telemetry: Path, jobs_csv: Path,
    capsys: pytest.CaptureFixture[str]
) -> None:
    """Windows without GPM are labelled by the model in a pass of their own; the windows the scan
    rejected (here: another user's, on the job's own host and in its time) must not vote there."""
    from wattclass.schema import GPM_COLUMNS

    root = h200_day_root
    jobs = pd.read_csv(jobs_csv, dtype={"job_id": str})
    victim, donor = jobs.iloc[0], jobs.iloc[1]
    w = windows(h200_telemetry)
    base = w.copy()
    base.loc[base["job_id"] == victim["job_id"], list(GPM_COLUMNS)] = None  # a GPU without GPM
    write(base, part(root) / "part-0.parquet", h200_telemetry)
    nightly(root, tmp_path, capsys, "--jobs-file", str(jobs_csv))
    before = labels_of(root)
    assert before.loc[victim["job_id"], "source"] != "rule"
    own = w[w["job_id"] == victim["job_id"]]
    claims = w[w["job_id"] == donor["job_id"]].head(len(own)).copy()
    claims["ts_start"] = own["ts_start"].to_numpy()[: len(claims)] + pd.Timedelta(milliseconds=3)
    claims["ts_end"] = claims["ts_start"] + pd.Timedelta(seconds=5)
    claims["job_id"], claims["user"] = victim["job_id"], "mallory"
    # and a valid window without GPM of a job without a record in the same file, so that the
    # model pass reads the file
    legit = claims.head(1).assign(job_id="777", user="someone")
    claims = pd.concat([claims, legit])
    for c in GPM_COLUMNS:
        claims[c] = None  # no GPM: the model labels these windows
    write(claims, part(root) / "claims.parquet", h200_telemetry)
    claims = claims[claims["job_id"] == victim["job_id"]]
    s = nightly(root, tmp_path, capsys, "--jobs-file", str(jobs_csv))
    assert s["rejected_rows"] == {"count": len(claims), REJECT_JOB_USER: len(claims)}
    after = labels_of(root)
    cols = ["label", "confidence", "source", "n_windows"]
    pd.testing.assert_series_equal(after.loc[victim["job_id"], cols], before.loc[victim["job_id"], cols])


def test_a_group_of_windows_partly_outside_its_job_loses_only_the_windows_outside(
    h200_day_root: Path, tmp_path: Path, h200_telemetry: Path, jobs_csv: Path,
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
) -> None:
    """The scan checks a job's windows per (job, host, file) group: its time range and users decide
    a clean group; one that reaches past the job's start and end, with a few windows of another
    user between, holds windows of every kind, so its file is read again window by window. Only
    the windows outside start..end (+- slack) and those of another user may be rejected, each for
    the first reason that applies, and only that file is read again."""
    root = h200_day_root
    assert nightly(root, tmp_path, capsys, "--jobs-file", str(jobs_csv))["rejected_rows"]["count"] == 0
    jobs = pd.read_csv(jobs_csv, dtype={"job_id": str})
    victim = jobs.iloc[0]
    before = labels_of(root).loc[victim["job_id"], "n_windows"]
    start = pd.Timestamp(float(victim["start"]), unit="s", tz="UTC")
    end = pd.Timestamp(float(victim["end"]), unit="s", tz="UTC")
    w = windows(h200_telemetry)
    one = w[w["job_id"] == victim["job_id"]].iloc[[0]]
    # 10 s windows from 155 s before the start to 150 s after the end (none ending on a bound of
    # start..end +- slack), on a GPU of its own (no duplicates of part-0's: no de-duplicating pass)
    starts = pd.date_range(start - pd.Timedelta(seconds=155), end + pd.Timedelta(seconds=150), freq="10s")
    span = pd.concat([one] * len(starts), ignore_index=True)
    span["ts_start"] = pd.Series(starts).astype(w["ts_start"].dtype)
    span["ts_end"] = span["ts_start"] + pd.Timedelta(seconds=10)
    span["gpu_uuid"] = "GPU-zz-span"
    slack = pd.Timedelta(seconds=JOB_TIME_SLACK_S)
    late = (span["ts_start"] < start - slack) | (span["ts_end"] > end + slack)
    inside = span.index[~late]
    span.loc[inside[[1, 4, 7]], "user"] = "mallory"  # another user's, in the job's time
    span.loc[inside[5], "user"] = None  # no user: nothing to compare
    span.loc[span.index[0], "user"] = "mallory"  # too early and another user's: the time is first
    write(span, part(root) / "span.parquet", h200_telemetry)
    foreign = ~late & span["user"].notna() & (span["user"] != victim["user"])
    assert late.sum() >= 6 and (~late).sum() >= 6 and foreign.sum() == 3  # the group is mixed
    with caplog.at_level(logging.INFO, logger="wattclass.classifier"):
        s = nightly(root, tmp_path, capsys, "--jobs-file", str(jobs_csv))
    assert s["rejected_rows"] == {"count": int(late.sum() + foreign.sum()), REJECT_JOB_TIME: int(late.sum()),
                                  REJECT_JOB_USER: int(foreign.sum())}
    assert s["duplicate_windows"] == 0
    kept = len(span) - int(late.sum() + foreign.sum())
    assert labels_of(root).loc[victim["job_id"], "n_windows"] == before + kept
    again = [r.getMessage() for r in caplog.records if "window by window" in r.getMessage()]
    assert len(again) == 1 and again[0].startswith("1 file(s)")


@pytest.mark.parametrize("max_runs", [4, 0])
def test_day_check_over_several_days_by_file_order_or_by_file_name(
    tmp_path: Path, h200_telemetry: Path, monkeypatch: pytest.MonkeyPatch, max_runs: int
) -> None:
    """Files of two days: the day of each row's file comes from the file's place in the list (a
    CASE over the days' runs) or, past ``_MAX_DAY_RUNS`` runs, from its name; the scan and the
    report leave out the same rows either way: the 29th's windows filed again under the 30th."""
    import wattclass.classifier.rowsql as rowsql
    from wattclass.classifier.engine import label_files_local
    from wattclass.report.data import load

    monkeypatch.setattr(rowsql, "_MAX_DAY_RUNS", max_runs)
    w = windows(h200_telemetry)
    tel = tmp_path / "telemetry"
    for day, shift, name in (("2026-11-29", 0, "00"), ("2026-11-30", 1, "00"), ("2026-11-30", 0, "misfiled")):
        d = tel / f"date={day}" / f"host={HOST}"
        d.mkdir(parents=True, exist_ok=True)
        moved = w.assign(ts_start=w["ts_start"] + pd.Timedelta(days=shift),
                         ts_end=w["ts_end"] + pd.Timedelta(days=shift))
        write(moved, d / f"{name}.parquet", h200_telemetry)
    files = sorted(tel.rglob("*.parquet"))
    assert ("CASE" in (rowsql.partition_day_sql(files) or "")) == (max_runs > 0)
    res = label_files_local(files, None, "rule", workers=1)
    assert res.report.rejected_rows == {REJECT_DAY: len(w)}
    assert res.n_windows == 2 * len(w)
    assert load(files).rejected_rows == {REJECT_DAY: len(w)}
