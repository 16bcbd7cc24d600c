"""The batched local engine and the Dask engine label a day exactly like the per-file path."""

from __future__ import annotations

import datetime as dt
import logging
import shutil
from pathlib import Path
from typing import Any

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
from wattclass.classifier.validity import REJECT_JOB_HOST, REJECT_JOB_TIME, REJECT_JOB_USER
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


def test_sample_file_count_is_one_in_eight_between_its_floor_and_its_cap() -> None:
    from wattclass.classifier import scan

    assert scan.SAMPLE_MIN_FILES < scan.SAMPLE_MAX_FILES
    # all of a small night; the floor; one in eight (1,000 GPUs: 3,000 hourly files); the cap
    for n, want in ((10, 10), (100, 64), (3_000, 375), (4_096, 512), (30_000, 512), (300_000, 512)):
        assert scan.sample_file_count(n) == want, n


def test_sample_draw_is_capped_and_drawn_once_for_the_night_whatever_the_chunks(
        fleet: Path, model, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """Issue 15: one file in eight of a 10,000-GPU day drew 11x the jobs a night trains on, so the
    draw stops at SAMPLE_MAX_FILES; and an engine that scans the night in chunks (the Dask
    engine, ``chunk_files``) reads the night's draw, not a share of each chunk (one file in eight
    whatever the cap, and other files than the engine that scans it at once)."""
    from wattclass.classifier import scan

    files = _files(fleet)
    monkeypatch.setattr(scan, "SAMPLE_MIN_FILES", 1)
    monkeypatch.setattr(scan, "SAMPLE_FILE_SHARE", 1)
    uncapped = label_files_local(files, model, "auto", sample_per_job=2, sample_prefix="d")
    monkeypatch.setattr(scan, "SAMPLE_MAX_FILES", 3)
    for seed in range(20):  # the draw hashes the paths: a seed whose three files hold GPM job windows
        kw: dict[str, Any] = {"sample_per_job": 2, "sample_prefix": "d", "seed": seed}
        whole = label_files_local(files, model, "auto", **kw)
        if whole.sample.group.size:
            break
    drawn = scan.sample_files(files, seed)
    assert len(drawn) == 3 < len(files)
    jobs_drawn = {f"d:{j}" for f in drawn
                  for j in pq.read_table(f, columns=["job_id"]).column(0).to_pylist() if j}
    assert whole.sample.group.size and set(whole.sample.group.tolist()) <= jobs_drawn
    assert len(set(whole.sample.group.tolist())) < len(set(uncapped.sample.group.tolist()))  # the cap bit
    # the same rows in the same order (the order changes a retrained model: LightGBM's bagging)
    rows = lambda ts: list(zip(ts.group.tolist(), ts.X[:, 0].tolist(), strict=True))  # noqa: E731
    for chunk in (1, 2, 4):
        split = label_files_local(files, model, "auto", chunk_files=chunk, **kw)
        assert rows(split.sample) == rows(whole.sample), chunk
    with open_client(local=LocalConfig(n_workers=2, processes=False, memory_limit="0")) as client:
        dask = label_files_dask(client, files, model, "auto", chunk_files=2, **kw)
    assert rows(dask.sample) == rows(whole.sample)


def test_a_chunked_engines_sample_comes_in_the_whole_nights_row_order(
        fleet: Path, model, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """Jobs whose sampled windows lie in several files (hourly files of one host) sampled by a
    one-file-a-chunk engine: the merged sample is in (job, hash) order like the whole night's,
    not in blocks per chunk (the row order changes a retrained model: LightGBM's bagging)."""
    from wattclass.classifier import scan

    monkeypatch.setattr(scan, "SAMPLE_MIN_FILES", 10**6)  # every file drawn
    files = _files(fleet)
    kw: dict[str, Any] = {"sample_per_job": 4, "sample_prefix": "d"}
    whole = label_files_local(files, model, "auto", **kw)
    split = label_files_local(files, model, "auto", chunk_files=1, **kw)
    rows = lambda ts: list(zip(ts.group.tolist(), ts.X[:, 0].tolist(), strict=True))  # noqa: E731
    assert sorted(rows(split.sample)) == sorted(rows(whole.sample)) and rows(whole.sample)
    assert rows(split.sample) == rows(whole.sample)


def test_a_skipped_drawn_file_is_lost_to_the_sample_of_every_engine_alike(
        fleet: Path, model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """The night's draw is made over the files as listed, so a drawn file that turns out unreadable
    is lost to the whole-night scan as to a chunked one; had the whole-night scan drawn over the
    readable files only, it would take the next file in line and retrain on another sample."""
    from wattclass.classifier import scan

    root = tmp_path / "root"
    shutil.copytree(fleet / "telemetry", root / "telemetry")
    files = _files(root)
    monkeypatch.setattr(scan, "SAMPLE_MIN_FILES", 1)
    monkeypatch.setattr(scan, "SAMPLE_FILE_SHARE", 1)
    monkeypatch.setattr(scan, "SAMPLE_MAX_FILES", 4)
    drawn = sorted(scan.sample_files(files, 0))
    Path(drawn[0]).write_bytes(b"not parquet")
    kw: dict[str, Any] = {"sample_per_job": 2, "sample_prefix": "d", "seed": 0}
    whole = label_files_local(files, model, "auto", **kw)
    assert str(drawn[0]) in whole.report.skipped_files and whole.sample.group.size
    rows = lambda ts: list(zip(ts.group.tolist(), ts.X[:, 0].tolist(), strict=True))  # noqa: E731
    split = label_files_local(files, model, "auto", chunk_files=2, **kw)
    assert rows(split.sample) == rows(whole.sample)
    jobs_read = {f"d:{j}" for f in drawn[1:]
                 for j in pq.read_table(f, columns=["job_id"]).column(0).to_pylist() if j}
    assert set(whole.sample.group.tolist()) <= jobs_read  # no file beyond the draw stood in


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
    # with job records (one of them naming another user), given up front or after the query as the
    # nightly gives them: the de-duplicating pass checks every row against them alike
    from wattclass.classifier.jobcheck import index_records, job_records_table
    from wattclass.classifier.store import utc_day_bounds

    frame = JobsFileClient(fleet / "jobs" / f"date={DATE}" / "jobs.parquet").jobs_frame(
        *utc_day_bounds(DATE.isoformat()))
    victim = t.filter(pc.equal(t.column("gpu_uuid"), gpus[0])).column("job_id").drop_null()[0].as_py()
    frame.loc[frame["job_id"] == victim, "user"] = "mallory"
    recs = job_records_table(index_records(frame))
    checked = []
    for given in (recs, lambda: recs):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="wattclass.classifier"):
            checked.append(label_chunk(_files(root), model, "rule", jobs=given))
        assert "de-duplicating" in caplog.text
    eager, deferred = checked
    assert eager.report.rejected_rows.get(REJECT_JOB_USER, 0) > 0 and eager.report.duplicate_windows > 0
    assert deferred.report.summary() == eager.report.summary()
    pd.testing.assert_frame_equal(merged_labels(deferred), merged_labels(eager))


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


def test_the_job_check_per_group_rejects_exactly_the_windows_the_check_per_row_does(
    fleet: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The scan decides the job check per (job, host, file) group where the group's host, time
    range and users can, and reads only the other groups' files again with the check per row;
    forced to check every group's rows (every checked group flagged), it must give the same
    partials, reject counts, sample and model-pass rows. The records contradict some windows of
    a few jobs (a host, the time after a start moved to the middle of the job or before an end
    moved so, another user), know nothing of others (no nodes, no end, no user); the last host's
    files lack the GPM columns (read by column name)."""
    from wattclass.classifier import scan

    files = _files(fleet)
    w = pd.concat([pq.read_table(f, columns=["job_id", "host", "ts_start", "ts_end", "user"]).to_pandas()
                   for f in files]).dropna(subset=["job_id"])
    ms = {c: w[c].astype("datetime64[ms, UTC]").astype("int64") for c in ("ts_start", "ts_end")}
    per = w.assign(**ms).groupby("job_id").agg(hosts=("host", lambda h: sorted(set(h))),
                                               t0=("ts_start", "min"), t1=("ts_end", "max"),
                                               user=("user", "first"))
    jobs = sorted(per.index)
    assert len(jobs) >= 8
    many_hosts = next(j for j in jobs if len(per.at[j, "hosts"]) > 1)
    per.at[many_hosts, "hosts"] = per.at[many_hosts, "hosts"][1:]  # one of its hosts not in its record
    later, earlier, other, unknown, no_user = [j for j in jobs if j != many_hosts][:5]
    per.at[later, "t0"] = (per.at[later, "t0"] + per.at[later, "t1"]) // 2
    per.at[earlier, "t1"] = (per.at[earlier, "t0"] + per.at[earlier, "t1"]) // 2
    per.at[other, "user"] = "mallory"
    per.at[unknown, "hosts"], per.at[unknown, "t1"] = None, None
    per.at[no_user, "user"] = None
    users = [u if isinstance(u, str) else None for u in per["user"]]
    table = pa.table({"job_id": pa.array(list(per.index), pa.string()),
                      "hosts": pa.array(list(per["hosts"]), pa.list_(pa.string())),
                      "t0_ms": pa.array([int(v) for v in per["t0"]], pa.int64()),
                      "t1_ms": pa.array([None if pd.isna(v) else int(v) for v in per["t1"]], pa.int64()),
                      "user": pa.array(users, pa.string())})

    def scanned(records: scan.JobRecords = table) -> tuple[scan.ScanResult, pd.DataFrame]:
        scanner = scan.Scanner(1)
        try:
            res = scanner.partials(files, (), 3, 5, records)
            batches = list(scanner.model_batches([Path(f) for f in res.nogpm_files], False))
        finally:
            scanner.close()
        model = pa.concat_tables(batches).to_pandas() if batches else pd.DataFrame()
        return res, model.sort_values(["job_id", "host", "window_ms"]).reset_index(drop=True)

    def rows(t: pa.Table) -> pd.DataFrame:
        return t.to_pandas().sort_values(list(t.column_names)[:2] if "h" not in t.column_names
                                         else ["job_id", "h"]).reset_index(drop=True)

    with caplog.at_level(logging.INFO, logger="wattclass.classifier"):
        by_group, model_g = scanned()
    again = [r.getMessage() for r in caplog.records if "window by window" in r.getMessage()]
    assert len(again) == 1 and 0 < int(again[0].split(" ")[0]) < len(files)
    _same_scan(by_group, model_g, *_records_after_the_query(scanned, table, monkeypatch), rows)
    monkeypatch.setattr(scan, "job_group_check_sql",
                        lambda r, g: (f"{g}.bad", f"({g}.bad = 0 AND {r}.job_id IS NOT NULL)"))
    by_row, model_r = scanned()
    assert set(by_group.rejected) == {REJECT_JOB_HOST, REJECT_JOB_TIME, REJECT_JOB_USER}
    _same_scan(by_group, model_g, by_row, model_r, rows)
    # records that turn out to be none: as if none were given
    _same_scan(*scanned(None), *scanned(lambda: None), rows)


def _records_after_the_query(scanned: Any, table: pa.Table, monkeypatch: pytest.MonkeyPatch
                             ) -> tuple[Any, pd.DataFrame]:
    """``scanned`` with the job records given as a function (the nightly reads them beside the
    scan): it must be called once, after the pass's query ran."""
    from wattclass.classifier import scan

    events: list[str] = []
    real_execute = scan.Scanner._execute

    def execute(self: scan.Scanner, sql: str) -> pa.Table:
        events.append("query")
        return real_execute(self, sql)

    def later() -> pa.Table:
        events.append("records")
        return table

    monkeypatch.setattr(scan.Scanner, "_execute", execute)
    out = scanned(later)
    assert events[:1] == ["query"] and events.count("records") == 1, events
    return out


def _same_scan(a: Any, model_a: pd.DataFrame, b: Any, model_b: pd.DataFrame, rows: Any) -> None:
    """Two scans of the same files gave the same partials, reject counts, sample and model rows."""
    assert a.rejected == b.rejected and a.n_windows == b.n_windows
    assert a.nogpm_files == b.nogpm_files and len(model_a) > 0
    pd.testing.assert_frame_equal(rows(a.partials), rows(b.partials), check_exact=False)
    assert a.sample is not None and b.sample is not None
    pd.testing.assert_frame_equal(rows(a.sample), rows(b.sample))
    pd.testing.assert_frame_equal(model_a, model_b)


def test_preload_starts_once_as_the_first_scan_starts_whatever_the_chunks(
        fleet: Path, model, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """The preload begins when the first chunk's query is bound (not before the files are listed
    and checked), once however many chunks the files are scanned in; the labels are the same."""
    import threading

    from wattclass.classifier.scan import Scanner

    files = _files(fleet)
    whole = label_files_local(files, model, "auto", workers=1).labels
    calls: list[str] = []
    real_execute = Scanner._execute

    def execute(self: Scanner, sql: str) -> pa.Table:
        calls.append("query")
        return real_execute(self, sql)

    monkeypatch.setattr(Scanner, "_execute", execute)
    split = label_files_local(files, model, "auto", workers=1, chunk_files=4,
                              preload=(lambda: calls.append("preload"),))
    wait = threading.Event()
    for _ in range(300):  # the preload runs in a thread beside the scan
        if "preload" in calls:
            break
        wait.wait(0.1)
    assert calls.count("preload") == 1 and calls.index("preload") == 1  # after the first query
    assert calls.count("query") == len(chunks_of(files, 4)) > 1
    pd.testing.assert_frame_equal(split.labels, whole, check_exact=False, rtol=1e-9)


def test_the_retraining_sample_skips_shared_and_mig_rows(tmp_path: Path, model) -> None:  # type: ignore[no-untyped-def]
    """A shared GPU's row pairs the whole GPU's GPM (its label) with the job's share of the power,
    a MIG instance's row its share of the parent's energy over the parent's limit: trained on,
    neither shows what a whole GPU running that work shows. Such rows are labelled and counted,
    never drawn into the sample; the other jobs' windows are drawn as before."""
    spec = FleetSpec(gpus=8, date=DATE, gpus_per_host=8, seed=3, hours=2)
    generate(spec, tmp_path, workers=1)
    files = _files(tmp_path)
    before = label_files_local(files, model, "auto", sample_per_job=2, sample_prefix="d")
    jobs = sorted({g.removeprefix("d:") for g in before.sample.group})
    shared, mig = jobs[0], jobs[1]
    for f in files:
        t = pq.read_table(f).to_pandas()
        is_shared, is_mig = t["job_id"] == shared, t["job_id"] == mig
        t.loc[is_shared, "shared_jobs"], t.loc[is_shared, "share_basis"] = 2, "util"
        t.loc[is_mig, "shared_jobs"], t.loc[is_mig, "share_basis"] = 1, "mig"
        pq.write_table(pa.Table.from_pandas(t, schema=pq.read_schema(f)), f)
    after = label_files_local(files, model, "auto", sample_per_job=2, sample_prefix="d")
    drawn = {g.removeprefix("d:") for g in after.sample.group}
    assert drawn == set(jobs) - {shared, mig}
    assert {shared, mig} <= set(after.labels["job_id"])  # still labelled
    keep = ~np.isin(before.sample.group, [f"d:{shared}", f"d:{mig}"])
    assert sorted(after.sample.X[:, 0].tolist()) == sorted(before.sample.X[keep, 0].tolist())


@pytest.mark.parametrize("column", ["energy_j", "dram_bw_util_pct", "sm_util_pct", "power_max_w"])
def test_a_nan_among_numbers_in_a_file_reads_as_the_pandas_reference_reads_it(
        h200_telemetry: Path, tmp_path: Path, column: str) -> None:
    """DuckDB 2.0 folds ``isnan`` of a Parquet column to false where the file's statistics (which
    leave NaN out) show only numbers, so the scan's NaN tests never fired on a file holding NaN
    among numbers (found by the session review): a NaN ``energy_j`` was kept, not rejected as the
    validity rules say (an infinity was), and a NaN rule input was not read as missing. A NaN
    now reads as the reference's NaN: the same rejections and labels as the rows computed by
    ``classifier.validity`` and the pandas rule on the same file."""
    from wattclass.classifier.validity import REJECT_ENERGY

    t = pq.read_table(h200_telemetry)
    v = t.column(column).to_numpy(zero_copy_only=False).astype(float)
    nan = np.arange(len(v)) % 7 == 5
    v[nan] = np.nan  # NaN, not null, among numbers: the file's statistics show no NaN
    i = t.schema.get_field_index(column)
    pq.write_table(t.set_column(i, column, pa.array(v)), tmp_path / "nan.parquet")
    got = label_chunk([tmp_path / "nan.parquet"], None, "rule")
    # the same file with null there: NaN reads as missing, as in the pandas rule and validity checks
    nulls = t.set_column(i, column, pa.array(v, mask=nan))
    pq.write_table(nulls, tmp_path / "null.parquet")
    ref = label_chunk([tmp_path / "null.parquet"], None, "rule")
    assert ref.report.rejected_rows == {}
    if column == "energy_j":  # a null energy is no reject; a NaN one is (classifier.validity)
        assert got.report.rejected_rows == {REJECT_ENERGY: int(nan.sum())}
    else:
        assert got.report.rejected_rows == {}
        pd.testing.assert_frame_equal(merged_labels(got), merged_labels(ref))
