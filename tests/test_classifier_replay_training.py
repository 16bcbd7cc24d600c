"""Training from raw recordings replayed through the telemetry daemon; deterministic model files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from wattclass.classifier import model as M
from wattclass.classifier.replay import is_recording, materialize
from wattclass.classifier.training import ROUND2_RECORDINGS, bundled_training_sources, training_set
from wattclass.cli import main
from wattclass.errors import DataError

DATA = Path(__file__).resolve().parent.parent / "wattclass" / "data" / "h200"


@pytest.fixture(scope="module")
def dev_set() -> M.TrainingSet:
    return training_set([DATA / "raw"])


def test_replayed_dev_recording_gives_its_21_jobs_with_the_recorded_truth(dev_set: M.TrainingSet) -> None:
    keys, truth = dev_set.job_truth()
    assert sorted(keys) == [f"raw:{j}" for j in range(5001, 5022)]
    # The rule over the daemon's windows agrees with the reference converter's jobs.csv.
    jobs = pd.read_csv(DATA / "jobs.csv", dtype={"job_id": str}).set_index("job_id")["truth"]
    from wattclass.classifier.rules import label_names

    got = dict(zip([k.split(":")[1] for k in keys], label_names(truth), strict=True))
    agree = sum(got[j] == jobs[j] for j in jobs.index)
    assert agree >= 19, got  # boundary segments differ slightly from tools/windows.py
    assert dev_set.dur is not None and (dev_set.dur > 0).all() and (dev_set.dur <= 10.0 + 1e-9).all()


def test_short_boundary_windows_are_not_trained_on(dev_set: M.TrainingSet) -> None:
    ok = dev_set.trainable(M.MIN_TRAIN_WINDOW_S)
    assert dev_set.dur is not None
    assert not ok[dev_set.dur < M.MIN_TRAIN_WINDOW_S].any() and ok[dev_set.dur >= M.MIN_TRAIN_WINDOW_S].all()
    assert 0 < (~ok).sum() < len(ok)
    assert dev_set.trainable(0).all()


def test_bundled_sources_are_the_raw_recordings_not_live() -> None:
    srcs = bundled_training_sources()
    # issue 13 round 7: every recording folder trains the shipped model (the integer-bound compute
    # work is in the later sets); live-nvml (the same jobs written live) never does
    assert [s.name for s in srcs] == ["raw", "collected", "sweep", "sweep-heldout", "ridge", "ridge2",
                                      "fresh", "fresh3", "fresh4", "latency", "fresh5", "fresh6",
                                      "long-families", "fresh7", "fresh8"]
    assert all(is_recording(s) for s in srcs)


def test_materialize_refuses_two_recordings_with_one_name(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="two recordings named"):
        materialize([DATA / "raw", DATA / "raw"], tmp_path)


def test_model_files_are_identical_across_rebuilds(tmp_path: Path) -> None:
    for out in ("a", "b"):
        assert main(["model", "train", "--raw", str(DATA / "raw"), "--out", str(tmp_path / out),
                     "--version", "t1", "--folds", "3"]) == 0
    for f in ("model.txt", "model.json"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
    meta = M.load_model(tmp_path / "a").meta
    assert meta["created"] is None and meta["training_data"]["n_jobs"] == 21


def test_source_calibration_holds_out_whole_recording_folders(tmp_path: Path) -> None:
    # issue 13 round 5: ``--calibration source`` fits the maps on out-of-fold predictions with one
    # recording folder per fold (what a nightly then keeps); one folder alone is refused
    raw, ridge2 = str(DATA / "raw"), str(DATA / "ridge2")
    assert main(["model", "train", "--raw", raw, ridge2, "--out", str(tmp_path / "s"), "--version", "t",
                 "--calibration", "source"]) == 0
    meta = M.load_model(tmp_path / "s").meta
    assert meta["cv_grouping"] == "source" and meta["metrics"]["n_folds"] == 2
    assert meta["training_data"]["n_jobs"] == 21 + 42
    assert main(["model", "train", "--raw", raw, ridge2, "--out", str(tmp_path / "f"), "--version", "t"]) == 0
    fam = M.load_model(tmp_path / "f").meta
    assert fam["cv_grouping"] == "family" and fam["calibration"] != meta["calibration"]
    assert fam["model_version"] == meta["model_version"]
    assert main(["model", "train", "--raw", raw, "--out", str(tmp_path / "one"), "--version", "t",
                 "--calibration", "source"]) != 0
    assert not (tmp_path / "one").exists()


def test_source_groups_are_the_folder_or_date_before_the_first_colon() -> None:
    keys = np.asarray(["raw:5001", "fresh4:42007", "2026-11-30:host:77"], dtype=object)
    assert M.source_groups(keys) == {"raw:5001": "raw", "fresh4:42007": "fresh4",
                                     "2026-11-30:host:77": "2026-11-30"}
    # whole sources per fold: the CV never splits a folder
    folds = M.family_folds(keys, M.source_groups(keys), 3)
    assert len(set(folds.tolist())) == 3
    # one fold per source, from window keys (repeated); one source cannot hold anything out
    groups, n_folds = M.source_folds(np.repeat(keys, 2))
    assert (groups, n_folds) == (M.source_groups(keys), 3)
    with pytest.raises(DataError, match="at least two recording folders"):
        M.source_folds(np.asarray(["raw:1", "raw:2"], dtype=object))


def test_train_raw_rejects_a_folder_that_is_not_a_recording(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["model", "train", "--raw", str(tmp_path), "--out", str(tmp_path / "m")]) != 0
    assert f"--raw {tmp_path}: not a probe recording" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


def test_shipped_model_labels_unseen_style_windows_without_gpm(dev_set: M.TrainingSet) -> None:
    m = M.load_model(M.default_model_dir())
    p = m.predict_proba(dev_set.X)
    assert p.shape == (len(dev_set), 3) and np.allclose(p.sum(axis=1), 1.0)
    assert m.meta["training_data"]["n_jobs"] == 1296  # all fifteen recording folders (issue 13 round 12)
    assert m.meta["cv_grouping"] == "family"
    assert m.kind == M.KIND_MARGIN  # issue 13: chosen before the held-out runs were looked at
    assert m.aggregation == "length-weighted"  # issue 13 round 2, chosen on leave-one-family-out


def _rebuild_shipped_model(out: Path) -> None:
    """``wattclass model train`` with the shipped model's version, kind, aggregation and date into
    ``out``: both files must be the shipped ones, byte for byte."""
    shipped = M.default_model_dir()
    model = M.load_model(shipped)
    meta = model.meta
    args = ["model", "train", "--out", str(out), "--version", meta["model_version"],
            "--kind", meta["kind"], "--aggregation", model.aggregation]
    if meta.get("created"):
        args += ["--created", meta["created"]]
    assert main(args) == 0
    for f in ("model.txt", "model.json"):
        assert (out / f).read_bytes() == (shipped / f).read_bytes(), f


def test_shipped_model_is_rebuilt_byte_for_byte_from_the_bundled_recordings(tmp_path: Path) -> None:
    _rebuild_shipped_model(tmp_path / "m")


def _last_bit_noise(ufunc: Any) -> Any:
    """``ufunc`` with every other float64 result of an array call moved up by one ulp: what another
    CPU's SIMD exp, log or tanh may give (numpy picks that code at run time)."""

    def noisy(*args: Any, **kwargs: Any) -> Any:
        out = ufunc(*args, **kwargs)
        if isinstance(out, np.ndarray) and out.dtype == np.float64 and out.size > 1:
            flat = out.reshape(-1)
            flat[::2] = np.nextafter(flat[::2], np.inf)
        return out

    return noisy


def test_shipped_model_rebuilds_byte_for_byte_when_transcendentals_differ_in_their_last_bit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Byte-reproducible on any CPU, not only this one: with numpy's exp, log, log1p, expm1,
    logaddexp, tanh and sqrt off by one ulp in half their results, the rebuild is still the shipped
    model (the calibration fit is exact and stored to 9 digits; the L-BFGS-B fit before moved by
    ~1e-7 with such bits, and h200-20261201-fresh7 did not rebuild on another machine)."""
    for name in ("exp", "log", "log1p", "expm1", "logaddexp", "tanh", "sqrt"):
        monkeypatch.setattr(np, name, _last_bit_noise(getattr(np, name)))
    assert np.exp(np.zeros(4))[0] != 1.0  # the noise is on
    _rebuild_shipped_model(tmp_path / "m")


def test_round2_recipe_flag_pins_its_six_recordings_weight_and_no_check(tmp_path: Path) -> None:
    # issue 13's round-2 recipe (h200-20261130-lenweight): six recordings, compute weight 1, no
    # ambiguity check unless asked. Since round 7 (the integer pipe in the GPM rule) its truth
    # differs, so the recipe no longer rebuilds that model's bytes; older code does (git history).
    assert main(["model", "train", "--round2-recipe", "--out", str(tmp_path / "m"), "--version", "r2",
                 "--created", "2026-11-30"]) == 0
    meta = M.load_model(tmp_path / "m").meta
    assert meta["training_data"]["n_jobs"] == 318 and meta["compute_weight"] == 1.0
    assert sorted(meta["training_data"]["sources"]) == sorted(ROUND2_RECORDINGS)
    assert "ambiguity" not in meta


def test_every_bundled_job_has_a_family_and_sweep_runs_keep_their_own() -> None:
    from wattclass.classifier.training import family_of, job_families

    fams = job_families(bundled_training_sources())
    ts_keys = set(fams)
    assert {"raw:5001", "raw:5021", "collected:6000", "sweep:7000"} <= ts_keys
    assert fams["raw:5001"] == "gemm" and fams["raw:5006"] == "gpt_train"  # gemm_bf16_2048, gpt2 train
    assert fams["raw:5021"] == "phase"
    assert family_of("gpt2_medium_decode_b1") == "llm_decode"
    assert family_of("phase_train_then_decode") == "phase"
    assert family_of("gemm_sweep_s11_004", "gemm_sweep", '{"m": 3}') == "gemm_sweep"
    assert family_of("gemm_bf16_4096", "gemm", "") == "gemm"  # table workloads: by name
    sweep = {v for k, v in fams.items() if k.startswith("sweep:")}
    assert {"fma_sweep", "gemm_sweep", "attn_decode", "dwconv", "cholesky"} <= sweep


def test_replaying_a_recording_with_a_late_gpu_logs_no_gpu_failure(tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    """fresh/'s GPU 1 was recorded ~9 minutes after GPU 0: the replay is a recording gap, not a
    failed GPU, so no ERROR reaches the demo's output or the nightly's journal; the rows still do."""
    import logging

    from wattclass.classifier.replay import replay_recording

    fresh = Path(__file__).resolve().parent.parent / "wattclass" / "data" / "h200" / "fresh"
    with caplog.at_level(logging.WARNING):
        root = replay_recording(fresh, tmp_path / "fresh")
    assert not [r for r in caplog.records if r.name.startswith("wattclass.telemetry")], caplog.text
    assert sorted(root.glob("telemetry/date=*/host=*/*.parquet"))
    assert logging.getLogger("wattclass.telemetry").level == logging.NOTSET  # restored


def _served_out(root: Path) -> tuple[int, dict[str, list[float]]]:
    """(job windows with GPM under ``root``, job id -> lengths (s) of those the nightly's row
    rules reject (validity.impossible_rows: the numpy twin of the scan's SQL))."""
    import pyarrow.compute as pc

    from wattclass.classifier.features import durations_s
    from wattclass.classifier.reader import iter_tables, telemetry_files
    from wattclass.classifier.training import window_rule_codes
    from wattclass.classifier.validity import impossible_rows

    out: dict[str, list[float]] = {}
    n = 0
    for _, t in iter_tables(telemetry_files([root])):
        has_job = pc.is_valid(t.column("job_id")).to_numpy(zero_copy_only=False)
        labelled = has_job & (window_rule_codes(t) >= 0)
        n += int(labelled.sum())
        bad = labelled & np.logical_or.reduce(list(impossible_rows(t).values()))
        jobs, dur = t.column("job_id").to_pylist(), durations_s(t)
        for i in np.flatnonzero(bad):
            out.setdefault(str(jobs[i]), []).append(float(dur[i]))
    return n, out


def test_a_boundary_window_holding_its_polls_second_is_served_and_trained_on(tmp_path: Path) -> None:
    """fresh6's replay holds three job-boundary windows of 0.08 s that carry their start poll's
    whole second of energy (telemetry/windows.py: an interval belongs to the row of its start
    poll): hundreds of joules, kilowatts over the row's length. The row rules measure a row's
    energy over its length, at least one window period (validity.ENERGY_SPAN_FLOOR_S), so the nightly keeps
    them and the job's energy is not lost; training, on the same rules, keeps them too."""
    from wattclass.classifier.reader import iter_tables, telemetry_files
    from wattclass.classifier.training import source_windows

    (root,) = materialize([DATA / "fresh6"], tmp_path)
    n_labelled, rejected = _served_out(root)
    assert rejected == {}
    got = source_windows((t for _, t in iter_tables(telemetry_files([root]))), "fresh6")
    assert got.dropped_windows == 0 and got.report.rejected_rows == {} and got.report.duplicate_windows == 0
    ts = training_set([root], max_windows_per_job=0)
    assert ts.dur is not None and len(ts) == len(got.windows) == n_labelled
    for job in ("61009", "61018", "61019"):  # each keeps its boundary window of 0.076 s
        mine = ts.dur[ts.group == f"fresh6:{job}"]
        assert np.isclose(mine, 0.076, atol=1e-3).sum() == 1, (job, mine)


def test_training_windows_drop_what_serving_drops_impossible_rows_and_copies(tmp_path: Path) -> None:
    """The training side applies the nightly's own row rules (validity.RowRules), per source: a row
    whose energy over its window says 4 kW is rejected, a file copied under another name adds no
    window, and both are counted."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from wattclass.classifier.reader import telemetry_files
    from wattclass.classifier.training import source_windows, window_rule_codes
    from wattclass.classifier.validity import ENERGY_SPAN_FLOOR_S, REJECT_POWER

    (root,) = materialize([DATA / "raw"], tmp_path / "replayed")
    files = telemetry_files([root])
    clean = training_set([root], max_windows_per_job=0)
    t = pq.read_table(files[0])
    has_job = np.asarray([j is not None for j in t.column("job_id").to_pylist()])
    labelled = (window_rule_codes(t) >= 0) & has_job
    row = int(np.flatnonzero(labelled)[0])
    dur_s = (t.column("ts_end")[row].value - t.column("ts_start")[row].value) / 1000.0
    energy = t.column("energy_j").to_pylist()
    energy[row] = 4000.0 * max(dur_s, ENERGY_SPAN_FLOOR_S)
    hot = t.set_column(t.column_names.index("energy_j"), "energy_j",
                       pa.array(energy, type=t.schema.field("energy_j").type))
    pq.write_table(hot, files[0])
    pq.write_table(t, files[0].with_name("zz-copy-" + files[0].name))  # the original rows again
    got = source_windows((pq.read_table(f) for f in telemetry_files([root])), "raw")
    assert got.report.rejected_rows == {REJECT_POWER: 1}
    assert got.report.duplicate_windows == t.num_rows - 1  # the copy's twin of the hot row is new
    # the hot window, and the copy's job windows but the hot one's twin: the copy's whole share
    assert got.dropped_windows == int(labelled.sum())
    assert len(training_set([root], max_windows_per_job=0)) == len(clean)
