"""Telemetry files a node or a user on the shared store could plant (review, 2026-11-30).

The nightly must skip them, name them and count them, and label the other files' jobs as if
they were not there: a FIFO named ``*.parquet`` used to block the night forever (holding its lock),
a symlink made root read any file, a file others can write let them replace another user's
windows, and nanosecond timestamps crashed the whole scan with a traceback.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from wattclass.classifier.engine import label_files_local
from wattclass.classifier.reader import telemetry_files
from wattclass.fleet.generate import FleetSpec, generate
from wattclass.fsutil import split_trusted_files

DATE = dt.date(2026, 3, 2)


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("clean")
    generate(FleetSpec(gpus=8, date=DATE, gpus_per_host=4, seed=5, hours=2), root, workers=1)
    return root


def _labels(root: Path) -> tuple[pd.DataFrame, dict[str, object]]:
    res = label_files_local(telemetry_files([root], date=DATE.isoformat()), None, "rule", workers=1)
    return res.labels.sort_values("job_id").reset_index(drop=True), res.report.summary()


def _copy(clean: Path, tmp_path: Path) -> tuple[Path, Path]:
    root = tmp_path / "root"
    shutil.copytree(clean, root)
    host = sorted((root / "telemetry" / f"date={DATE}").iterdir())[0]
    return root, host


def test_a_fifo_and_a_symlink_are_skipped_and_named(clean: Path, tmp_path: Path) -> None:
    want, _ = _labels(clean)
    root, host = _copy(clean, tmp_path)
    os.mkfifo(host / "00-fifo.parquet")  # opening it would block until someone writes
    secret = tmp_path / "secret.parquet"
    shutil.copy(next(host.glob("*.parquet")), secret)
    (host / "01-link.parquet").symlink_to(secret)
    got, report = _labels(root)
    pd.testing.assert_frame_equal(got, want)
    skipped = report["skipped_files"]
    assert skipped["by_reason"] == {"refused": 2}
    reasons = {Path(f).name: r for f, r in skipped["files"].items()}
    assert "not a regular file" in reasons["00-fifo.parquet"] and "symlink" in reasons["01-link.parquet"]


@pytest.mark.skipif(os.geteuid() != 0, reason="the owner and mode rules apply to runs as root")
def test_as_root_a_file_or_folder_others_can_write_is_refused(clean: Path, tmp_path: Path) -> None:
    root, host = _copy(clean, tmp_path)
    files = telemetry_files([root], date=DATE.isoformat())
    victim = files[0]
    os.chmod(victim, 0o666)
    good, refused = split_trusted_files(files)
    assert [f for f, _ in refused] == [victim] and "others can write" in refused[0][1]
    os.chmod(victim, 0o644)
    os.chown(victim, 12345, 12345)  # a user's file
    good, refused = split_trusted_files(files)
    assert [f for f, _ in refused] == [victim] and "owned by uid 12345" in refused[0][1]
    os.chown(victim, 0, 0)
    os.chmod(host, 0o777)  # a folder a user can write: every file in it
    good, refused = split_trusted_files(files)
    assert {f for f, _ in refused} == {f for f in files if f.parent == host}
    assert len(good) == len(files) - len(refused) > 0
    os.chmod(host, 0o755)
    assert split_trusted_files(files) == (files, [])


def test_nanosecond_timestamps_skip_the_file_not_the_night(clean: Path, tmp_path: Path) -> None:
    root, host = _copy(clean, tmp_path)
    f = sorted(host.glob("*.parquet"))[0]
    t = pq.read_table(f)
    for c in ("ts_start", "ts_end"):
        t = t.set_column(t.column_names.index(c), c, t[c].cast(pa.timestamp("ns", tz="America/New_York")))
    pq.write_table(t, f)
    got, report = _labels(root)
    skipped = report["skipped_files"]
    assert skipped["by_reason"] == {"bad column type": 1}
    assert "ts_start is timestamp[ns, tz=America/New_York]" in next(iter(skipped["files"].values()))
    assert len(got) > 0


def test_report_simulate_and_job_refuse_a_fifo_by_name(clean: Path, tmp_path: Path) -> None:
    from wattclass.errors import DataError
    from wattclass.report import data as report_data
    from wattclass.savings.simulate import scan_jobs

    root, host = _copy(clean, tmp_path)
    os.mkfifo(host / "00-fifo.parquet")
    files = telemetry_files([root], date=DATE.isoformat())
    with pytest.raises(DataError, match=r"refusing 1 telemetry file\(s\): .*00-fifo\.parquet: not a regular"):
        report_data.load(files=files)
    with pytest.raises(DataError, match=r"00-fifo\.parquet: not a regular file"):
        scan_jobs(root)


@pytest.mark.skipif(os.geteuid() != 0, reason="the owner and mode rules apply to runs as root")
def test_a_linked_telemetry_folder_is_followed_and_its_target_checked(clean: Path, tmp_path: Path) -> None:
    # a data root whose telemetry/ links to shared storage is a normal setup; the target's
    # folders must pass the same rules
    store = tmp_path / "store"
    shutil.copytree(clean / "telemetry", store / "telemetry")
    root = tmp_path / "root"
    root.mkdir()
    (root / "telemetry").symlink_to(store / "telemetry")
    files = telemetry_files([root], date=DATE.isoformat())
    assert split_trusted_files(files) == (files, [])
    os.chmod(store, 0o777)  # whoever can write there can swap the whole tree
    good, refused = split_trusted_files(files)
    assert not good and len(refused) == len(files) and "others can write" in refused[0][1]


@pytest.mark.parametrize("job_ids", [["\xff\xfe"], ["ok"]], ids=["not-utf8", "utf8"])
def test_job_ids_stored_as_bytes_skip_the_file_not_the_night(clean: Path, tmp_path: Path,
                                                            job_ids: list[str]) -> None:
    # A writer that stores strings as Parquet BYTE_ARRAY without the UTF8 annotation (binary):
    # DuckDB then read every file's job_id as BLOB, and the jobs came out as bytes (or, with
    # bytes that are not UTF-8, the retraining sample raised UnicodeDecodeError: a traceback).
    want, _ = _labels(clean)
    root, host = _copy(clean, tmp_path)
    f = sorted(host.glob("*.parquet"))[0]
    t = pq.read_table(f).filter(pa.compute.is_valid(pq.read_table(f)["job_id"]))
    t = t.set_column(t.column_names.index("job_id"), "job_id",
                     pa.array([job_ids[0].encode("latin-1") + b"1"] * t.num_rows, pa.binary()))
    t = t.set_column(t.column_names.index("gpu_uuid"), "gpu_uuid", pa.array(["GPU-bytes"] * t.num_rows))
    pq.write_table(t, host / "zz-bytes.parquet")
    res = label_files_local(telemetry_files([root], date=DATE.isoformat()), None, "rule", workers=1,
                            sample_per_job=4)
    skipped = res.report.summary()["skipped_files"]
    assert skipped["by_reason"] == {"bad column type": 1}
    assert "job_id is binary" in skipped["files"][str(host / "zz-bytes.parquet")]
    got = res.labels.sort_values("job_id").reset_index(drop=True)
    cols = ["job_id", "label", "n_windows"]
    pd.testing.assert_frame_equal(got[cols], want[cols])


def test_telemetry_inspect_reads_a_data_roots_telemetry_and_names_a_bad_file(clean: Path,
                                                                              tmp_path: Path) -> None:
    # `telemetry inspect DATA_ROOT` read every *.parquet under it, the nightly's label store too,
    # as one dataset with the first file's types: a traceback (large_string to null), as was a
    # torn file or a job id that is not UTF-8
    from wattclass.errors import DataError
    from wattclass.telemetry.cli import summarize

    root, host = _copy(clean, tmp_path)
    want = summarize(root / "telemetry")
    labels = root / "classifier" / "labels" / f"date={DATE}"
    labels.mkdir(parents=True)
    pq.write_table(pa.table({"job_id": ["1"], "user": pa.nulls(1), "label": ["memory"]}),
                   labels / "labels.parquet")
    assert summarize(root) == want
    f = sorted(host.glob("*.parquet"))[0]
    t = pq.read_table(f)
    t = t.set_column(t.column_names.index("job_id"), "job_id", pa.array([b"\xff"] * t.num_rows, pa.binary()))
    pq.write_table(t, host / "zz-bytes.parquet")
    with pytest.raises(DataError, match=r"zz-bytes\.parquet: column job_id has type binary"):
        summarize(root)
    (host / "zz-bytes.parquet").write_bytes(b"PAR1 torn")
    with pytest.raises(DataError, match=r"zz-bytes\.parquet: not a readable Parquet file"):
        summarize(root)
