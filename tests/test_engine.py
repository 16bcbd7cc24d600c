"""The batched local engine and the Dask engine label a day exactly like the per-file path."""

from __future__ import annotations

import datetime as dt
import logging
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
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


def test_sample_keeps_at_most_n_windows_per_job_whatever_the_split(fleet: Path, model) -> None:  # type: ignore[no-untyped-def]
    """The retraining sample: at most n GPM windows per job, chosen by a seeded hash, so the same
    windows whatever the chunking of the files (and another seed draws others)."""
    files = _files(fleet)
    res = label_files_local(files, model, "auto", sample_per_job=2, sample_prefix="d")
    assert len(res.sample) > 0
    assert pd.Series(res.sample.group).value_counts().max() <= 2
    assert set(res.sample.y.tolist()) <= {0, 1, 2}  # GPM-labelled windows only
    split = label_files_local(files, model, "auto", sample_per_job=2, sample_prefix="d", chunk_files=2)
    key = lambda ts: sorted(zip(ts.group.tolist(), ts.X[:, 0].tolist(), strict=True))  # noqa: E731
    assert key(split.sample) == key(res.sample)
    other = label_files_local(files, model, "auto", sample_per_job=2, sample_prefix="d", seed=7)
    assert key(other.sample) != key(res.sample)


def test_sample_draws_the_same_files_and_windows_under_any_data_root(
        fleet: Path, model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """The same night copied under another data root (a restore, a bench's temp folder) retrains on
    the same sample: the file draw hashes the path below the root, not the root."""
    from wattclass.classifier import scan

    monkeypatch.setattr(scan, "SAMPLE_MIN_FILES", 2)
    monkeypatch.setattr(scan, "SAMPLE_FILE_SHARE", 3)
    key = lambda ts: sorted(zip(ts.group.tolist(), ts.X[:, 0].tolist(), strict=True))  # noqa: E731
    draws, samples = [], []
    for name in ("a", "somewhere/much/deeper/b"):
        root = tmp_path / name
        shutil.copytree(fleet / "telemetry", root / "telemetry")
        files = _files(root)
        order, n = scan._sample_first(files, 2, 0)
        assert 0 < n < len(files)  # a real draw: some files are left out
        draws.append(sorted(str(f.relative_to(root)) for f in order[:n]))
        res = label_files_local(files, model, "auto", sample_per_job=2, sample_prefix="d")
        samples.append(key(res.sample))
    assert draws[0] == draws[1]
    assert samples[0] == samples[1] and samples[0]


def test_sample_draw_key_is_the_paths_last_three_parts_for_any_path() -> None:
    """The draw's key (``scan._tail``) skips parsing a Path's text where it can (issue 15): it must
    equal the last three of ``Path.parts`` for every form of path, short, relative or odd."""
    from wattclass.classifier import scan

    texts = ["/data/telemetry/date=2026-11-29/host=gpu00001/00.parquet", "date=D/host=H/01.parquet",
             "host=H/01.parquet", "01.parquet", "/01.parquet", "/a/01.parquet", "//a/b/c.parquet",
             "//b/c.parquet", "/data//telemetry/./host=a/x.parquet", "rel/./a//b/c.parquet",
             "/d/host=gpu-1.a b/ü.parquet", "a/b/c/"]
    for text in texts:
        for path in (Path(text), text):
            assert scan._tail(path) == "/".join(Path(text).parts[-3:]), path


def test_sample_drawn_in_the_pass_equals_a_window_query_of_the_draw(
    fleet: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 15 folded the sample into the main pass (arg_min per group; the drawn files read in a
    branch of their own, each branch with its own columns when the files differ): its rows must be
    those of the former separate query, the ``per_job`` GPM windows of smallest hash of each job
    in the drawn files. Here the files differ twice: the last host has no GPM columns, and one
    file alone has power_std_w (a model input), drawn for some seeds and not for others."""
    import duckdb

    from wattclass.classifier import scan

    root = tmp_path / "root"
    shutil.copytree(fleet / "telemetry", root / "telemetry")
    files = _files(root)
    t = pq.read_table(files[0])
    pq.write_table(t.append_column("power_std_w", pc.multiply(t.column("power_avg_w"), 0.01)), files[0])
    monkeypatch.setattr(scan, "SAMPLE_MIN_FILES", 2)
    monkeypatch.setattr(scan, "SAMPLE_FILE_SHARE", 3)
    con = duckdb.connect()
    drawn_with_it = set()
    for seed in range(60):  # the draw hashes the file paths (a tmp folder): seeds until both cases
        if seed >= 4 and drawn_with_it == {True, False}:
            break
        scanner = scan.Scanner(1)
        try:
            res = scanner.partials(files, (), 3, seed)
        finally:
            scanner.close()
        order, n = scan._sample_first(files, 3, seed)
        assert n == 3 and res.sample is not None
        drawn_with_it.add(files[0] in order[:n])
        names = {c for f in order[:n] for c in pq.read_schema(f).names}
        cols = ", ".join(f'CASE WHEN isnan("{c}") THEN NULL ELSE CAST("{c}" AS DOUBLE) END AS "{c}"'
                         if c in names else f'CAST(NULL AS DOUBLE) AS "{c}"' for c in scan.SAMPLE_COLUMNS)
        lst = ", ".join(f"'{f}'" for f in order[:n])
        ref = con.sql(
            f"SELECT * FROM (SELECT job_id, hash(job_id, host, gpu_index, ts_start, {seed}) AS h, "
            f"{scan.rule_code_sql(frozenset(GPM_COLUMNS) - names)} AS code, "
            f"epoch_ms(ts_end) - epoch_ms(ts_start) AS window_ms, {cols} FROM "
            f"read_parquet([{lst}], union_by_name = true) WHERE job_id IS NOT NULL) WHERE code >= 0 "
            "QUALIFY row_number() OVER (PARTITION BY job_id ORDER BY h) <= 3").df()
        got = res.sample.to_pandas().sort_values(["job_id", "h"]).groupby("job_id").head(3)  # as _sample
        pd.testing.assert_frame_equal(got.sort_values(["job_id", "h"]).reset_index(drop=True)[ref.columns],
                                      ref.sort_values(["job_id", "h"]).reset_index(drop=True),
                                      check_dtype=False)
    assert drawn_with_it == {True, False}


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
    # thread workers: no memory limit (Dask would weigh the whole test process against it and pause them)
    with open_client(local=LocalConfig(n_workers=2, processes=False, memory_limit="0")) as client:
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
    # the same retraining sample, window lengths included (the length-weighted aggregation's)
    t_local, t_dask = (ClassifierStore(tmp_path / e).samples() for e in ("local", "dask"))
    assert t_local.dur is not None and t_dask.dur is not None and not np.isnan(t_local.dur).any()
    assert (sorted(zip(t_local.group.astype(str), t_local.dur.tolist(), strict=True))
            == sorted(zip(t_dask.group.astype(str), t_dask.dur.tolist(), strict=True)))
    meta = (tmp_path / "dask" / "classifier").rglob("model.json")
    assert any("DaskLGBMClassifier" in p.read_text() for p in meta)


def test_files_overlapping_in_time_are_deduplicated_only_when_they_share_a_gpu(
    fleet: Path, model, tmp_path: Path, caplog  # type: ignore[no-untyped-def]
) -> None:
    """Issue 15: the scan reads GPU ranges only of files whose time ranges meet on a host, and runs
    the exact de-duplication only if two of them also share a GPU."""
    root = tmp_path / "root"
    shutil.copytree(fleet / "telemetry", root / "telemetry")
    ref = label_chunk(_files(root), model, "rule")
    one = _files(root)[0]
    t = pq.read_table(one)
    gpus = sorted(set(t.column("gpu_uuid").to_pylist()))
    assert len(gpus) > 2
    # one file split into two of the same hour, on disjoint GPUs: time ranges meet, GPUs do not
    mask = pc.is_in(t.column("gpu_uuid"), pa.array(gpus[:2]))
    pq.write_table(t.filter(mask), one)
    pq.write_table(t.filter(pc.invert(mask)), one.with_name("split.parquet"))
    with caplog.at_level(logging.INFO, logger="wattclass.classifier"):
        split = label_chunk(_files(root), model, "rule")
    assert "de-duplicating" not in caplog.text
    assert split.n_windows == ref.n_windows and split.report.duplicate_windows == 0
    # the same hour's rows of one GPU again in a third file: now two files share a GPU
    pq.write_table(t.filter(pc.equal(t.column("gpu_uuid"), gpus[0])), one.with_name("again.parquet"))
    with caplog.at_level(logging.INFO, logger="wattclass.classifier"):
        again = label_chunk(_files(root), model, "rule")
    assert "de-duplicating" in caplog.text
    assert again.n_windows == ref.n_windows
    assert again.report.duplicate_windows == pc.sum(pc.equal(t.column("gpu_uuid"), gpus[0])).as_py()
    pd.testing.assert_frame_equal(merged_labels(again), merged_labels(ref))


def merged_labels(res) -> pd.DataFrame:  # type: ignore[no-untyped-def]
    from wattclass.classifier.engine import _combine, _Model

    return _combine([res], _Model(None), "rule").labels.reset_index(drop=True)


def test_model_loader_is_called_only_when_a_window_needs_the_model(fleet: Path, model) -> None:  # type: ignore[no-untyped-def]
    """Issue 15: ``wattclass classify`` hands the default model over as a loader, so that a fleet
    whose GPUs all export GPM is labelled without importing LightGBM; the labels are the same."""
    calls: list[int] = []

    def loader():  # type: ignore[no-untyped-def]
        calls.append(1)
        return model

    files = _files(fleet)
    with_gpm = [f for f in files if "sm_util_pct" in pq.read_schema(f).names]
    assert 0 < len(with_gpm) < len(files)
    lazy = label_files_local(with_gpm, loader, "auto").labels
    assert calls == []
    pd.testing.assert_frame_equal(lazy, label_files_local(with_gpm, model, "auto").labels)
    lazy = label_files_local(files, loader, "auto").labels  # the last host has no GPM: model needed
    assert calls == [1]
    pd.testing.assert_frame_equal(lazy, label_files_local(files, model, "auto").labels)
