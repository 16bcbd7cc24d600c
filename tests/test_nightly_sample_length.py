"""The nightly retraining sample carries each window's length (review finding H1).

Without it the length-weighted job aggregation (``model.window_weights``) counted every sampled
window as a whole one in the candidate's cross-validation, the incumbent gate and the calibration
maps, while the engine labels with the real lengths; and ``trainable(MIN_TRAIN_WINDOW_S)`` let the
short stubs at job boundaries into training (an unknown length passes)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from wattclass.classifier import model as M
from wattclass.classifier import nightly, rules, scan
from wattclass.classifier.engine import label_files_local
from wattclass.classifier.features import FEATURES
from wattclass.classifier.model import MIN_TRAIN_WINDOW_S, TrainingSet, cross_validate, job_predictions
from wattclass.classifier.nightly import NightlyOptions, run_nightly
from wattclass.classifier.reader import telemetry_files
from wattclass.classifier.store import ClassifierStore
from wattclass.fleet.generate import FleetSpec, generate
from wattclass.slurm.client import JobsFileClient

DATE = dt.date(2026, 3, 2)
SPEC = FleetSpec(gpus=16, date=DATE, gpus_per_host=8, seed=5, hours=2)
#: The length the stub job's windows are cut to: below MIN_TRAIN_WINDOW_S.
STUB_S = 2.0
#: A sample size per job above any job's windows here (DuckDB's arg_min takes n < 1,000,000).
ALL_WINDOWS = 100_000


def _files(root: Path) -> list[Path]:
    return telemetry_files([root], date=DATE.isoformat())


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A small fleet-day whose first job's windows are all STUB_S long (energy scaled with them,
    so that their mean power stays plausible); returns the root and that job's id."""
    root = tmp_path_factory.mktemp("fleet")
    generate(SPEC, root, workers=1)
    files = _files(root)
    stub_job = sorted(j for j in pq.read_table(files[0]).column("job_id").to_pylist() if j is not None)[0]
    for f in files:
        t = pq.read_table(f)
        hit = pc.fill_null(pc.equal(t.column("job_id"), stub_job), False).to_numpy(zero_copy_only=False)
        if not hit.any():
            continue
        start = pc.cast(t.column("ts_start"), pa.int64()).to_numpy()
        end = pc.cast(t.column("ts_end"), pa.int64()).to_numpy()
        new_end = np.where(hit, start + int(STUB_S * 1000), end)
        energy = t.column("energy_j").to_numpy(zero_copy_only=False).astype(np.float64)
        new_energy = np.where(hit, energy * (STUB_S * 1000) / (end - start), energy)
        i_end, i_e = t.schema.get_field_index("ts_end"), t.schema.get_field_index("energy_j")
        t = t.set_column(i_end, t.schema.field(i_end), pa.array(new_end).cast(t.schema.field(i_end).type))
        t = t.set_column(i_e, t.schema.field(i_e), pa.array(new_energy, t.schema.field(i_e).type))
        pq.write_table(t, f)
    return root, str(stub_job)


def _gpm_lengths_s(files: list[Path]) -> dict[str, list[float]]:
    """Per job, the sorted lengths of its GPM-labelled windows, read straight from the files."""
    import duckdb

    lst = ", ".join(f"'{f}'" for f in files)
    df = duckdb.connect().sql(
        "SELECT job_id, (epoch_ms(ts_end) - epoch_ms(ts_start)) / 1000.0 AS d FROM (SELECT *, "
        f"{scan.rule_code_sql(frozenset())} AS code FROM read_parquet([{lst}])) "
        "WHERE job_id IS NOT NULL AND code >= 0").df()
    return {str(j): sorted(g["d"].tolist()) for j, g in df.groupby("job_id")}


def test_sampled_windows_carry_their_real_lengths_and_stubs_are_not_trained_on(
    fleet: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, stub_job = fleet
    files = _files(root)
    monkeypatch.setattr(scan, "SAMPLE_MIN_FILES", 10**6)  # every file drawn: every GPM window sampled
    res = label_files_local(files, None, "auto", sample_per_job=ALL_WINDOWS, sample_prefix="d")
    ts = res.sample
    assert len(ts) > 0 and ts.dur is not None and not np.isnan(ts.dur).any()
    got: dict[str, list[float]] = {}
    for g, d in zip(ts.group.astype(str), ts.dur.tolist(), strict=True):
        got.setdefault(g.removeprefix("d:"), []).append(d)
    assert {j: sorted(v) for j, v in got.items()} == _gpm_lengths_s(files)
    stub = ts.group.astype(str) == f"d:{stub_job}"
    assert stub.any() and (ts.dur[stub] == STUB_S).all() and (ts.dur[~stub] >= MIN_TRAIN_WINDOW_S).all()
    ok = ts.trainable(MIN_TRAIN_WINDOW_S)
    assert not ok[stub].any() and ok[~stub].all()
    # drawing the sample changes nothing of the scan's labels and counts
    plain = label_files_local(files, None, "auto")
    assert plain.labels.equals(res.labels) and plain.n_windows == res.n_windows


def test_the_night_stores_its_sample_with_lengths(fleet: tuple[Path, str], tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    root, stub_job = fleet
    night = tmp_path / "night"
    night.mkdir()
    for sub in ("telemetry", "jobs"):
        (night / sub).symlink_to(root / sub)
    monkeypatch.setattr(scan, "SAMPLE_MIN_FILES", 10**6)
    monkeypatch.setattr(nightly, "SAMPLE_PER_JOB", ALL_WINDOWS)
    opts = NightlyOptions(data_root=night, date=DATE.isoformat(), table_out=night / "table.tsv", workers=1)
    summary = run_nightly(opts, JobsFileClient(night / "jobs" / f"date={DATE}" / "jobs.parquet"))
    assert summary["status"] == "ok" and summary["retrain"]["retrained"]
    stored = pq.read_table(night / "classifier" / "training" / f"date={DATE}" / "windows.parquet")
    dur = stored.column("dur_s").to_numpy()
    group = np.asarray(stored.column("group").to_pylist(), dtype=str)
    stub = group == f"{DATE}:{stub_job}"
    assert stub.any() and (dur[stub] == STUB_S).all() and (dur[~stub] >= MIN_TRAIN_WINDOW_S).all()
    back = ClassifierStore(night).samples()
    assert back.dur is not None and np.array_equal(back.dur, dur)


def _set(n_per_job: dict[str, list[tuple[int, float]]]) -> TrainingSet:
    """A training set from {job: [(window class, length s), ...]}; feature 0 holds the class."""
    rows = [(j, c, d) for j, ws in n_per_job.items() for c, d in ws]
    X = np.zeros((len(rows), len(FEATURES)), np.float32)
    X[:, 0] = [c for _, c, _ in rows]
    return TrainingSet(X, np.asarray([c for _, c, _ in rows], np.int8),
                       np.asarray([j for j, _, _ in rows], dtype=object), ["t"],
                       dur=np.asarray([d for _, _, d in rows], np.float64))


def test_old_sample_files_without_lengths_still_load(tmp_path: Path) -> None:
    store = ClassifierStore(tmp_path)
    new = _set({"2026-11-30:1": [(1, 10.0), (2, 3.0)]})
    store.write_sample("2026-11-30", new)
    old = _set({"2026-11-29:7": [(0, 10.0), (1, 10.0), (2, 10.0)]})
    store.write_sample("2026-11-29", old)
    path = tmp_path / "classifier" / "training" / "date=2026-11-29" / "windows.parquet"
    pq.write_table(pq.read_table(path).drop_columns(["dur_s"]), path)  # as written before dur_s
    ts = store.samples()
    assert ts.dur is not None and len(ts) == 5
    assert np.isnan(ts.dur[:3]).all() and ts.dur[3:].tolist() == [10.0, 3.0]
    assert ts.trainable(MIN_TRAIN_WINDOW_S).tolist() == [True, True, True, True, False]


def test_retraining_cv_on_stored_samples_labels_jobs_length_weighted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CV the nightly gates and calibrates with: its job labels are ``job_predictions`` with the
    sample's lengths. The folds' model is an oracle (the window's class, from feature 0), so the
    job decisions depend on the aggregation alone: job "flip" has 6 compute windows of 1 s and 4
    memory windows of 10 s, mixed by counts (compute share 0.6), memory by length (0.6 / 4.6)."""
    fitted_lengths: list[np.ndarray] = []

    def fit(ts: TrainingSet, *a: Any, **k: Any) -> tuple[None, None]:
        assert ts.dur is not None
        fitted_lengths.append(ts.dur)
        return None, None

    def oracle(booster: Any, kind: str, margin: Any, X: np.ndarray) -> np.ndarray:
        return np.eye(3)[X[:, 0].astype(np.int64)] * 0.9 + 0.1 / 3

    monkeypatch.setattr(M, "fit_windows", fit)
    monkeypatch.setattr(M, "window_proba", oracle)
    flip = [(rules.COMPUTE, 1.0)] * 6 + [(rules.MEMORY, 10.0)] * 4
    jobs: dict[str, list[tuple[int, float]]] = {"d:flip": flip}
    for i in range(6):
        jobs[f"d:c{i}"] = [(rules.COMPUTE, 10.0)] * 5 + [(rules.IDLE, 10.0)]
        jobs[f"d:m{i}"] = [(rules.MEMORY, 10.0)] * 5 + [(rules.IDLE, 10.0)]
    store = ClassifierStore(tmp_path)
    store.write_sample("2026-11-30", _set(jobs))
    ts = store.samples()
    cv = cross_validate(ts, n_folds=3, aggregation="length-weighted")
    keys, lab, _ = job_predictions(oracle(None, "", None, ts.X), ts.group, ts.dur)
    assert cv["jobs"]["key"] == keys.tolist()
    assert cv["jobs"]["pred"] == rules.label_names(lab).tolist()
    pred = dict(zip(cv["jobs"]["key"], cv["jobs"]["pred"], strict=True))
    truth = dict(zip(cv["jobs"]["key"], cv["jobs"]["truth"], strict=True))
    assert pred["d:flip"] == "memory" and truth["d:flip"] == "mixed"
    # the 1 s windows are scored but never trained on
    assert fitted_lengths and all((d >= MIN_TRAIN_WINDOW_S).all() for d in fitted_lengths)
    # a sample stored before the lengths were kept: every window counts whole (the old behaviour)
    path = tmp_path / "classifier" / "training" / "date=2026-11-30" / "windows.parquet"
    pq.write_table(pq.read_table(path).drop_columns(["dur_s"]), path)
    old = cross_validate(store.samples(), n_folds=3, aggregation="length-weighted")
    assert dict(zip(old["jobs"]["key"], old["jobs"]["pred"], strict=True))["d:flip"] == "mixed"
