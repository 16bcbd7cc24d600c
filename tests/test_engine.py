"""The batched local engine and the Dask engine label a day exactly like the per-file path."""

from __future__ import annotations

import datetime as dt
import logging
import shutil
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from wattclass.classifier.engine import chunks_of, label_chunk, label_files_dask, label_files_local
from wattclass.classifier.model import default_model_dir, load_model
from wattclass.classifier.nightly import NightlyOptions, run_nightly
from wattclass.classifier.reader import telemetry_files
from wattclass.classifier.scaleout import LocalConfig, open_client
from wattclass.classifier.store import ClassifierStore
from wattclass.fleet.generate import FleetSpec, generate
from wattclass.schema import GPM_COLUMNS
from wattclass.slurm.client import JobsFileClient

DATE = dt.date(2026, 3, 1)
SPEC = FleetSpec(gpus=24, date=DATE, gpus_per_host=8, seed=3, hours=3)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small fleet-day; the last host's files lose their GPM columns (a GPU without GPM)."""
    root = tmp_path_factory.mktemp("fleet")
    generate(SPEC, root, workers=1)
    day = root / "telemetry" / f"date={DATE}"
    last = sorted(day.iterdir())[-1]
    for f in sorted(last.glob("*.parquet")):
        t = pq.read_table(f)
        pq.write_table(t.drop_columns([c for c in GPM_COLUMNS if c in t.column_names]), f)
    return root


@pytest.fixture(scope="module")
def model():  # type: ignore[no-untyped-def]
    return load_model(default_model_dir())


def _files(root: Path) -> list[Path]:
    return telemetry_files([root], date=DATE.isoformat())


def test_batched_engine_gives_the_per_file_labels(fleet: Path, model) -> None:  # type: ignore[no-untyped-def]
    files = _files(fleet)
    ref = label_files_local(files, model, "auto", batch_files=1).labels  # one file per scan
    assert set(ref["source"]) == {"rule", model.source}  # both paths are exercised
    for batch, chunk, workers in ((4, 1000, 1), (100, 1000, 1), (3, 2, 2)):
        res = label_files_local(files, model, "auto", workers=workers, chunk_files=chunk, batch_files=batch)
        pd.testing.assert_frame_equal(res.labels, ref, check_exact=False, rtol=1e-9)
        assert res.n_files == len(files)
    part = label_chunk(files, model, "auto", batch_files=4)
    assert part.n_windows == sum(pq.ParquetFile(f).metadata.num_rows for f in files)


def test_sample_keeps_at_most_n_windows_per_job_and_file(fleet: Path, model) -> None:  # type: ignore[no-untyped-def]
    files = _files(fleet)
    res = label_chunk(files, model, "auto", sample_per_job=2, sample_prefix="d", batch_files=100)
    assert len(res.sample) > 0
    per_job = pd.Series(res.sample.group).value_counts()
    n_files_of = {}
    for f in files:
        jobs = pq.read_table(f, columns=["job_id"]).column("job_id").drop_null().unique().to_pylist()
        for j in jobs:
            n_files_of[f"d:{j}"] = n_files_of.get(f"d:{j}", 0) + 1
    assert all(n <= 2 * n_files_of[k] for k, n in per_job.items())


def test_bad_files_in_a_batch(fleet: Path, model, tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    root = tmp_path / "root"
    shutil.copytree(fleet / "telemetry", root / "telemetry")
    files = _files(root)
    files[1].write_bytes(b"not parquet")
    with caplog.at_level(logging.WARNING, logger="wattclass.classifier"):
        res = label_chunk(files, model, "auto", batch_files=100)
    assert res.n_files == len(files) - 1
    assert str(files[1]) in caplog.text
    t = pq.read_table(files[2])
    pq.write_table(t.drop_columns(["energy_j"]), files[2])
    # issue 9 item 16: a file lacking a required column is skipped and reported like an unreadable
    # one (it used to fail the whole night with a DataError)
    res = label_chunk(files, model, "auto", batch_files=100)
    assert res.n_files == len(files) - 2
    assert "energy_j" in res.report.skipped_files[str(files[2])]
    assert res.report.skipped_files[str(files[1])].startswith("unreadable")


def test_dask_engine_gives_the_local_labels(fleet: Path, model) -> None:  # type: ignore[no-untyped-def]
    files = _files(fleet)
    local = label_files_local(files, model, "auto")
    with open_client(local=LocalConfig(n_workers=2, processes=False, memory_limit="1GiB")) as client:
        res = label_files_dask(client, files, model, "auto", chunk_files=2)
    assert len(chunks_of(files, 2)) > 2
    pd.testing.assert_frame_equal(res.labels, local.labels, check_exact=False, rtol=1e-9)
    assert (res.n_files, res.n_windows) == (local.n_files, local.n_windows)


def _root_linking(fleet: Path, at: Path) -> Path:
    at.mkdir()
    for sub in ("telemetry", "jobs"):
        (at / sub).symlink_to(fleet / sub)
    return at


def test_nightly_dask_and_local_store_identical_labels(fleet: Path, tmp_path: Path) -> None:
    """The whole night on a LocalCluster (process workers: LightGBM's Dask training needs them)."""
    out = {}
    for engine in ("local", "dask"):
        root = _root_linking(fleet, tmp_path / engine)
        opts = NightlyOptions(data_root=root, date=DATE.isoformat(), table_out=root / "table.tsv",
                              engine=engine)
        jobs = JobsFileClient(root / "jobs" / f"date={DATE}" / "jobs.parquet")
        summary = run_nightly(opts, jobs)
        assert summary["status"] == "ok" and summary["engine"] == engine
        out[engine] = (summary, ClassifierStore(root).label_history(DATE.isoformat()))
    (s_local, l_local), (s_dask, l_dask) = out["local"], out["dask"]
    assert s_dask["jobs"] == s_local["jobs"] > 0
    assert s_dask["by_label"] == s_local["by_label"]
    cols = ["job_id", "label", "source", "n_windows", "confidence"]
    pd.testing.assert_frame_equal(l_dask[cols].sort_values("job_id").reset_index(drop=True),
                                  l_local[cols].sort_values("job_id").reset_index(drop=True))
    assert s_dask["retrain"]["retrained"] and s_local["retrain"]["retrained"]
    meta = (tmp_path / "dask" / "classifier").rglob("model.json")
    assert any("DaskLGBMClassifier" in p.read_text() for p in meta)
