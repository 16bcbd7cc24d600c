"""Hardening of the nightly run (issue 9, items 4, 15, 16, 17), through the real ``wattclass``
command: a second run on the same folder, bad input files and rows, empty days, users from
Slurm's job records only."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import H200_DATE, H200_HOST

from wattclass.cli import main

DATE, HOST = H200_DATE, H200_HOST


@pytest.fixture
def root(h200_day_root: Path) -> Path:
    return h200_day_root


@pytest.fixture
def jobs_csv(h200_telemetry: Path, tmp_path: Path) -> Path:
    jobs = pd.read_csv(h200_telemetry.parent / "jobs.csv", dtype={"job_id": str})
    jobs["name"] = jobs["workload"]
    jobs["account"] = "ml"
    jobs["partition"] = "gpu"
    jf = tmp_path / "jobs.csv"
    jobs[["job_id", "name", "user", "account", "partition", "start", "end"]].to_csv(jf, index=False)
    return jf


def nightly(root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, dict]:
    rc = main(["nightly", "--data-root", str(root), "--date", DATE, "--no-retrain", "--table-out",
               str(tmp_path / "table.lua"), "--json", *extra])
    out = capsys.readouterr().out
    return rc, json.loads(out) if out.strip() else {}


def part(root: Path) -> Path:
    return root / "telemetry" / f"date={DATE}" / f"host={HOST}"


# -- 16. bad input: files --------------------------------------------------------------------------
def test_file_missing_a_column_is_skipped_and_counted_not_fatal(
    root: Path, tmp_path: Path, h200_telemetry: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pq.write_table(pq.read_table(h200_telemetry).drop_columns(["energy_j"]).slice(0, 10),
                   part(root) / "no-energy.parquet")
    (part(root) / "torn.parquet").write_bytes(b"PAR1 cut short")
    rc, s = nightly(root, tmp_path, capsys)
    assert rc == 0 and s["status"] == "ok" and s["jobs"] == 21
    sk = s["skipped_files"]
    assert sk["count"] == 2
    assert sk["by_reason"] == {"missing required column": 1, "unreadable": 1}
    assert "energy_j" in sk["files"][str(part(root) / "no-energy.parquet")]


def test_duplicate_and_impossible_rows_are_dropped_and_counted(
    root: Path, tmp_path: Path, h200_telemetry: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, clean = nightly(root, tmp_path, capsys)
    assert rc == 0
    t = pq.read_table(h200_telemetry)
    # the same windows again under another file name (a segment converted twice, a copied file)
    pq.write_table(t.slice(0, 40), part(root) / "copy.parquet")
    # impossible rows: backwards window, infinite / negative energy, 50 kW
    bad = t.slice(40, 4).to_pandas()
    bad["job_id"] = "999"
    bad.loc[bad.index[0], "ts_end"] = bad["ts_start"].iloc[0] - pd.Timedelta(seconds=10)
    bad.loc[bad.index[1], "energy_j"] = np.inf
    bad.loc[bad.index[2], "energy_j"] = -5.0
    bad.loc[bad.index[3], "power_avg_w"] = 50_000.0
    pq.write_table(pa.Table.from_pandas(bad, schema=t.schema, preserve_index=False),
                   part(root) / "bad-rows.parquet")
    rc, s = nightly(root, tmp_path, capsys)
    assert rc == 0
    # the night's figures are those of the clean night: nothing counted twice, no inf
    assert s["windows"] == clean["windows"] and s["jobs"] == clean["jobs"]
    assert s["by_label"] == clean["by_label"]
    assert "inf" not in json.dumps(s["by_label"]).lower()
    assert clean["duplicate_windows"] == 0 and clean["rejected_rows"]["count"] == 0
    assert s["duplicate_windows"] == 40
    assert s["rejected_rows"]["count"] == 4
    assert s["rejected_rows"]["ts_end <= ts_start"] == 1
    assert s["rejected_rows"]["energy_j negative, NaN or infinite"] == 2
    assert s["rejected_rows"]["power above 3000 W"] == 1


def test_energy_beyond_the_power_limit_over_its_window_is_rejected(
    root: Path, tmp_path: Path, h200_telemetry: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """validity's third power check: energy_j over the window's duration. Both power columns
    are plausible here, only the energy says 4 kW; the DuckDB scan once divided by the duration
    in ms and then by 1,000 again, so the row passed (issue 15)."""
    rc, clean = nightly(root, tmp_path, capsys)
    assert rc == 0
    bad = pq.read_table(h200_telemetry).slice(0, 2).to_pandas()
    bad["job_id"] = "999"
    dur_s = (bad["ts_end"] - bad["ts_start"]).dt.total_seconds()
    bad["energy_j"] = [4000.0 * dur_s.iloc[0], 2900.0 * dur_s.iloc[1]]  # 4 kW: rejected; 2.9 kW: kept
    pq.write_table(pa.Table.from_pandas(bad, schema=pq.read_schema(h200_telemetry), preserve_index=False),
                   part(root) / "hot-energy.parquet")
    rc, s = nightly(root, tmp_path, capsys)
    assert rc == 0
    assert s["rejected_rows"] == {"count": 1, "power above 3000 W": 1}
    assert s["windows"] == clean["windows"] + 1 and s["jobs"] == clean["jobs"] + 1


def test_a_window_whose_end_is_a_year_late_is_rejected_not_counted_as_gpu_hours(
    root: Path, tmp_path: Path, h200_telemetry: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only ``ts_start`` was held to its day: one row whose ``ts_end`` a clock step put a year
    later added 8,760 GPU-hours to its job and the night (no Slurm record to check it against)."""
    rc, clean = nightly(root, tmp_path, capsys)
    assert rc == 0
    t = pq.read_table(h200_telemetry).to_pandas()
    first = t["job_id"] == t["job_id"].iloc[0]
    t.loc[t.index[0], "ts_end"] = t["ts_start"].iloc[0] + pd.Timedelta(days=365)
    t.loc[t.index[1], "ts_end"] = t["ts_start"].iloc[1] + pd.Timedelta(hours=1)  # an hour: kept
    assert first.iloc[1]
    pq.write_table(pa.Table.from_pandas(t, schema=pq.read_schema(h200_telemetry), preserve_index=False),
                   part(root) / "part-0.parquet")
    rc, s = nightly(root, tmp_path, capsys)
    assert rc == 0
    assert s["rejected_rows"] == {"count": 1, "window longer than 3600 s": 1}
    assert s["windows"] == clean["windows"] - 1 and s["jobs"] == clean["jobs"]
    gpu_h = sum(v["gpu_hours"] for v in s["by_label"].values())
    assert gpu_h < sum(v["gpu_hours"] for v in clean["by_label"].values()) + 1.01


def test_rows_with_null_times_or_gpu_are_rejected_not_fatal(
    root: Path, tmp_path: Path, h200_telemetry: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A null ts_start / ts_end / gpu_uuid (a writer bug, a hand-made file) is an impossible row:
    it used to crash the whole night in the features (cast of NaN to a timestamp)."""
    rc, clean = nightly(root, tmp_path, capsys)
    assert rc == 0
    t = pq.read_table(h200_telemetry).slice(0, 3)
    bad = t.to_pandas()
    bad["job_id"] = "999"
    bad.loc[bad.index[0], "ts_start"] = pd.NaT
    bad.loc[bad.index[1], "ts_end"] = pd.NaT
    bad.loc[bad.index[2], "gpu_uuid"] = None
    pq.write_table(pa.Table.from_pandas(bad, schema=t.schema, preserve_index=False),
                   part(root) / "null-rows.parquet")
    rc, s = nightly(root, tmp_path, capsys)
    assert rc == 0 and s["status"] == "ok"
    assert s["windows"] == clean["windows"] and s["by_label"] == clean["by_label"]
    assert s["rejected_rows"]["count"] == 3
    assert s["rejected_rows"]["ts_start, ts_end or gpu_uuid null"] == 3


def test_file_whose_required_column_has_a_wrong_type_is_skipped_not_fatal(
    root: Path, tmp_path: Path, h200_telemetry: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Like a missing column (item 16): a ts_start of strings used to fail the night (exit 3)."""
    t = pq.read_table(h200_telemetry).slice(0, 10)
    t = t.set_column(t.column_names.index("ts_start"), "ts_start", pa.array(["yesterday"] * 10))
    pq.write_table(t, part(root) / "string-times.parquet")
    rc, s = nightly(root, tmp_path, capsys)
    assert rc == 0 and s["status"] == "ok" and s["jobs"] == 21
    assert s["skipped_files"]["by_reason"] == {"bad column type": 1}
    assert "ts_start" in s["skipped_files"]["files"][str(part(root) / "string-times.parquet")]


def test_jobs_file_with_a_name_that_is_not_utf8_does_not_fail_the_night(
    root: Path, tmp_path: Path, jobs_csv: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = jobs_csv.read_bytes().splitlines(keepends=True)
    first_job = lines[1].split(b",")[0].decode()
    fields = lines[1].split(b",")
    fields[1] = b"caf\xe9-\xff\xfe"  # Latin-1, not UTF-8
    lines[1] = b",".join(fields)
    jobs_csv.write_bytes(b"".join(lines))
    rc, s = nightly(root, tmp_path, capsys, "--jobs-file", str(jobs_csv))
    assert rc == 0 and s["status"] == "ok" and s["jobs"] == 21
    assert s["job_records"]["record_problems"] == 1
    assert first_job in s["job_records"]["examples"][0]
    labels = pd.read_parquet(root / "classifier" / "labels" / f"date={DATE}" / "labels.parquet")
    row = labels[labels.job_id == first_job].iloc[0]
    assert pd.isna(row["name"]) and isinstance(row["user"], str)  # the record still gives the user


# -- 17. a day without telemetry -------------------------------------------------------------------
def test_day_without_telemetry_exits_7_unless_allow_empty(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.rmtree(root / "telemetry" / f"date={DATE}")
    rc, s = nightly(root, tmp_path, capsys)
    assert rc == 7 and s["status"] == "no telemetry"
    rc, s = nightly(root, tmp_path, capsys, "--allow-empty")
    assert rc == 0 and s["status"] == "no telemetry"


def test_day_whose_every_file_is_bad_is_no_telemetry(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (part(root) / "part-0.parquet").write_bytes(b"not parquet")
    rc, s = nightly(root, tmp_path, capsys)
    assert rc == 7 and s["skipped_files"]["count"] == 1


# -- 4. the user comes from Slurm's job record ------------------------------------------------------
def test_job_record_user_wins_over_telemetry_and_no_record_means_no_user(
    root: Path, tmp_path: Path, jobs_csv: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The user is the record's. Where telemetry names a user (the Prolog's job file, or the
    process's owner-checked environment) and the record another, the windows do not count for
    the job (tests/test_nightly_checks.py; this test asserted before that the record's user
    simply replaced it): here telemetry names none for the first job, so the record's is taken."""
    jobs = pd.read_csv(jobs_csv, dtype={"job_id": str})
    ids = sorted(jobs.job_id)
    jobs.loc[jobs.job_id == ids[0], "user"] = "mallory"  # Slurm says mallory ran it
    jobs = jobs[jobs.job_id != ids[1]]  # no record at all
    jobs.to_csv(jobs_csv, index=False)
    t = pq.read_table(part(root) / "part-0.parquet").to_pandas()
    t.loc[t.job_id == ids[0], "user"] = None  # telemetry without a user (an import without one)
    pq.write_table(pa.Table.from_pandas(t, schema=pq.read_schema(part(root) / "part-0.parquet"),
                                        preserve_index=False), part(root) / "part-0.parquet")
    rc, s = nightly(root, tmp_path, capsys, "--jobs-file", str(jobs_csv))
    assert rc == 0 and s["rejected_rows"]["count"] == 0
    labels = pd.read_parquet(root / "classifier" / "labels" / f"date={DATE}" / "labels.parquet")
    labels = labels.set_index("job_id")
    assert labels.loc[ids[0], "user"] == "mallory"
    assert pd.isna(labels.loc[ids[1], "user"])
    assert pd.isna(labels.loc[ids[0], "telemetry_user"])
    assert s["job_records"]["jobs_without_record"] == 1
    no_record_user = labels.loc[ids[1], "telemetry_user"]
    if no_record_user not in set(jobs.user):  # only that job could have given this user an entry
        assert f'"{no_record_user}"' not in (tmp_path / "table.lua").read_text()


# -- 15. two nightly runs at once --------------------------------------------------------------------
def test_second_nightly_run_exits_6_or_waits(root: Path, tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "wattclass.cli", "nightly", "--data-root", str(root), "--date", DATE,
           "--no-retrain", "--table-out", str(tmp_path / "t.lua")]
    # a first run, standing in as a real process that holds the lock until told to finish
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys; from pathlib import Path; from wattclass.lockfile import FolderLock\n"
        f"l = FolderLock(Path({str(root / 'classifier')!r}), 'nightly run').acquire()\n"
        "print('locked', flush=True); sys.stdin.readline()")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert r.returncode == 6, r.stderr
        assert f"pid {holder.pid}" in r.stderr and "nightly run" in r.stderr
        assert not (root / "classifier" / "labels").exists()  # it wrote nothing
        # with --lock-timeout it waits for the first run, then runs
        waiting = subprocess.Popen([*cmd, "--lock-timeout", "120"], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, text=True)
        time.sleep(2.0)
        assert waiting.poll() is None and not (root / "classifier" / "labels").exists()
        assert holder.stdin is not None
        holder.stdin.write("done\n")
        holder.stdin.flush()
        _, err = waiting.communicate(timeout=120)
        assert waiting.returncode == 0, err
        assert (root / "classifier" / "labels" / f"date={DATE}" / "labels.parquet").exists()
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait()


def test_lock_file_names_holder(tmp_path: Path) -> None:
    from wattclass.lockfile import FolderLock

    with FolderLock(tmp_path / "c", "nightly run"):
        doc = json.loads((tmp_path / "c" / "wattclass.lock").read_text())
        assert {"pid", "host", "started", "what"} <= set(doc)


@pytest.mark.parametrize("batch_files", [1, 100])
def test_duplicates_across_scan_batches_are_dropped_by_the_engine(
    root: Path, h200_telemetry: Path, batch_files: int
) -> None:
    """The rules hold whatever the engine's batching: a copy read in another batch is still a copy."""
    from wattclass.classifier.engine import label_files_local
    from wattclass.classifier.reader import telemetry_files

    one = label_files_local(telemetry_files([root], date=DATE), None, "rule", batch_files=batch_files)
    shutil.copy(part(root) / "part-0.parquet", part(root) / "part-1.parquet")
    two = label_files_local(telemetry_files([root], date=DATE), None, "rule", batch_files=batch_files)
    assert two.n_windows == one.n_windows > 0  # the copy is not counted a second time
    pd.testing.assert_frame_equal(two.labels, one.labels)
    assert two.report.duplicate_windows == one.n_windows


def test_the_numpy_row_rules_reject_exactly_what_the_scans_sql_rejects(h200_telemetry: Path,
                                                                        tmp_path: Path) -> None:
    """Training drops rows by ``validity.impossible_rows`` (classifier/training.py) while the
    nightly's scan rejects them by ``rowsql._reject_sql``: one window set for both needs the two
    to agree row for row, edge cases included."""
    import duckdb

    from wattclass.classifier.rowsql import _reject_sql
    from wattclass.classifier.validity import ENERGY_SPAN_FLOOR_S, MAX_GPU_POWER_W, impossible_rows

    df = pq.read_table(h200_telemetry).slice(0, 14).to_pandas()
    dur_s = (df["ts_end"] - df["ts_start"]).dt.total_seconds()
    df.loc[0, "energy_j"] = np.nan
    df.loc[1, "energy_j"] = np.inf
    df.loc[2, "energy_j"] = -1.0
    df.loc[3, "energy_j"] = None  # unsupported counter: kept
    df.loc[4, "energy_j"] = MAX_GPU_POWER_W * max(dur_s[4], ENERGY_SPAN_FLOOR_S)  # at the limit: kept
    df.loc[5, "energy_j"] = (MAX_GPU_POWER_W + 1) * max(dur_s[5], ENERGY_SPAN_FLOOR_S)
    df.loc[6, "power_max_w"] = MAX_GPU_POWER_W + 0.5
    df.loc[7, "power_avg_w"] = np.nan  # kept
    df.loc[8, "ts_end"] = df.loc[8, "ts_start"]
    df.loc[9, "gpu_uuid"] = None
    df.loc[10, "power_avg_w"] = np.inf
    df.loc[11, "ts_start"] = df.loc[11, "ts_end"] - pd.Timedelta(milliseconds=20)  # a 20 ms stub holding
    df.loc[11, "energy_j"] = 31000.0  # more than a window period at MAX_GPU_POWER_W: rejected
    df.loc[12, "ts_start"] = df.loc[12, "ts_end"] - pd.Timedelta(milliseconds=76)  # a boundary row holding
    df.loc[12, "energy_j"] = 348.4  # its poll's whole second (fresh6's replay): kept
    df.loc[13, "ts_end"] = df.loc[13, "ts_start"] + pd.Timedelta(seconds=3600, milliseconds=1)  # too long
    f = tmp_path / "edges.parquet"
    t = pa.Table.from_pandas(df, schema=pq.read_schema(h200_telemetry), preserve_index=False)
    for col in ("energy_j", "power_avg_w"):  # from_pandas reads NaN as null: a NaN stays a NaN here
        values = [None if i == 3 and col == "energy_j" else v for i, v in enumerate(df[col].tolist())]
        t = t.set_column(t.column_names.index(col), col, pa.array(values, t.schema.field(col).type))
    assert np.isnan(t.column("energy_j")[0].as_py()) and t.column("energy_j")[3].as_py() is None
    pq.write_table(t, f)
    t = pq.read_table(f)
    numpy_bad = np.logical_or.reduce(list(impossible_rows(t).values()))
    codes = duckdb.connect().execute(
        f"SELECT {_reject_sql(frozenset())} AS c FROM read_parquet('{f}')").fetchnumpy()["c"]
    assert numpy_bad.tolist() == (codes > 0).tolist()
    assert np.flatnonzero(numpy_bad).tolist() == [0, 1, 2, 5, 6, 8, 9, 10, 11, 13]


@pytest.mark.parametrize(("scrape_s", "power_w"), [(1.0, 700.0), (5.0, 1400.0)])
def test_a_boundary_row_of_off_grid_samples_passes_the_row_rules(scrape_s: float, power_w: float) -> None:
    """Samples off the window grid (the Prometheus importer's scrapes; replays of recordings): a
    job that starts at the last sample before a window boundary gets a row of 0.1 s holding that
    sample's whole interval (telemetry/windows.py). The row rules keep it (energy over at least
    ENERGY_SPAN_FLOOR_S), so the job's energy is not lost: 1 s samples of an H200, 5 s scrapes of
    a 1,400 W GPU. Over the row's length alone (the rule before) it was 7 and 70 kW; at 5 s
    scrapes even over length + 1 s (the review's case) it is above MAX_GPU_POWER_W."""
    from wattclass.classifier.validity import MAX_GPU_POWER_W, impossible_rows
    from wattclass.gpu.base import GpmMetrics, GpuInfo, GpuSample
    from wattclass.telemetry.windows import WindowBuilder

    info = GpuInfo(0, "GPU-t", "Test", "0000:01:00.0", 80000.0, 1980.0, 1400.0, 200.0, 1400.0, False)
    b = WindowBuilder("h", 10.0, scrape_s)
    t0 = 1_000.0 - 0.1  # the last sample before the boundary at 1,000 s
    rows: list[dict[str, Any]] = []
    for k in range(-3, 4):
        ts = t0 + k * scrape_s
        job = ("7", "ann") if ts >= t0 else None
        s = GpuSample(ts, round(power_w * (ts + 10_000) * 1e3), power_w, 1400.0, 90.0, 40.0, 1800.0,
                      3200.0, 0, 60.0, 1000.0)
        rows += b.add(info, s, job, None, lambda a, c: GpmMetrics())
    short = [r for r in rows if r["job_id"] == "7" and r["ts_end"] - r["ts_start"] < 0.2]
    assert len(short) == 1 and short[0]["energy_j"] == pytest.approx(power_w * scrape_s)
    dur = short[0]["ts_end"] - short[0]["ts_start"]
    assert short[0]["energy_j"] / dur > MAX_GPU_POWER_W  # the rule before
    assert (short[0]["energy_j"] / (dur + 1.0) > MAX_GPU_POWER_W) == (scrape_s > 1.0)  # length + 1 s

    def ms(key: str) -> pa.Array:
        return pa.array([round(r[key] * 1000) for r in rows], pa.int64()).cast(pa.timestamp("ms", "UTC"))

    t = pa.table({"ts_start": ms("ts_start"), "ts_end": ms("ts_end"), **{
        c: [r[c] for r in rows] for c in ("gpu_uuid", "energy_j", "power_avg_w", "power_max_w")}})
    assert not np.logical_or.reduce(list(impossible_rows(t).values())).any()


# -- output paths the command cannot write: refused before any work, naming the option -----------
@pytest.mark.parametrize("where", ["folder", "under a file"])
def test_an_unwritable_output_path_is_refused_before_the_work(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    # The output was written last, through atomic_writer: a --table-out that is a folder failed
    # its rename after the night's labels were stored, with a traceback (IsADirectoryError).
    (tmp_path / "a-file").write_text("x")
    out = tmp_path / "out-dir" if where == "folder" else tmp_path / "a-file" / "out"
    if where == "folder":
        out.mkdir()
    argvs = {"nightly": ["nightly", "--data-root", str(root), "--date", DATE, "--no-retrain",
                         "--table-out", str(out)],
             "report": ["report", "--data-root", str(root), "--date", DATE, "--out", str(out)],
             "classify": ["classify", "--telemetry", str(root), "--out", str(out)]}
    for name, argv in argvs.items():
        assert main(argv) == 2, name
        err = capsys.readouterr().err
        opt = "--table-out" if name == "nightly" else "--out"
        assert f"wattclass: error: {opt} {out}" in err, (name, err)
    assert not (root / "classifier" / "labels").exists()  # the night did nothing
    (tmp_path / "root-file").write_text("x")
    assert main(["nightly", "--data-root", str(tmp_path / "root-file"), "--date", DATE]) == 2
    assert "--data-root" in capsys.readouterr().err


def test_an_unreadable_label_store_day_is_named_not_dropped_silently(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """The label table is built from 30 days of stored labels; a day whose file is torn was
    skipped without a word, and its jobs' keys left the table."""
    from wattclass.classifier.store import ClassifierStore

    rc, _ = nightly(root, tmp_path, capsys)
    assert rc == 0
    torn = root / "classifier" / "labels" / "date=2026-11-28" / "labels.parquet"
    torn.parent.mkdir(parents=True)
    torn.write_bytes(b"PAR1 torn")
    history = ClassifierStore(root).label_history()
    assert len(history) > 0
    assert f"label store: skipping unreadable {torn}" in caplog.text


def test_model_train_fleet_and_calibrate_refuse_an_unwritable_out_first(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # model train failed after training (FileExistsError), fleet generate at its first write
    # (NotADirectoryError), calibrate would after minutes of measuring: tracebacks
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    (tmp_path / "a-dir").mkdir()
    for argv in (["model", "train", "--telemetry", str(root), "--out", str(blocker)],
                 ["fleet", "generate", "--gpus", "4", "--date", "2026-03-02", "--out", str(blocker / "root")],
                 ["calibrate", "--gpu", "0", "--dry-run", "--out", str(tmp_path / "a-dir")]):
        assert main(argv) == 2, argv
        assert "wattclass: error: --out " in capsys.readouterr().err, argv


def test_a_file_holding_each_window_twice_counts_each_once(
    root: Path, tmp_path: Path, h200_telemetry: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only files whose window ranges meet were de-duplicated: one file holding every window
    twice (a segment converted into it twice, an import of overlapping chunks) doubled the
    night's energy, windows and GPU-hours, and its summary said 0 duplicates (admin.md promises
    the first copy in a file kept)."""
    rc, clean = nightly(root, tmp_path, capsys)
    assert rc == 0
    t = pq.read_table(h200_telemetry)
    pq.write_table(pa.concat_tables([t, t]), part(root) / "part-0.parquet")
    rc, s = nightly(root, tmp_path, capsys)
    assert rc == 0
    assert s["duplicate_windows"] == t.num_rows and s["conflicting_duplicates"] == 0
    assert s["windows"] == clean["windows"] and s["by_label"] == clean["by_label"]
