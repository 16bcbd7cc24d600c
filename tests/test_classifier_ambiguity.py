"""The ambiguity check (issue 13 round 6): a job's confidence is lowered where training jobs of both
labels sit next to it, and only there; labels never change; a model without it is unchanged; the
check survives model.json and the labelling engine; bad entries are refused naming the key."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from wattclass.classifier import ambiguity as A
from wattclass.classifier import model as M
from wattclass.classifier import rules
from wattclass.classifier.engine import label_files_local
from wattclass.classifier.reader import telemetry_files
from wattclass.classifier.replay import materialize
from wattclass.classifier.training import training_set
from wattclass.cli import main
from wattclass.errors import DataError

DATA = Path(__file__).resolve().parent.parent / "wattclass" / "data" / "h200"
NF = len(A.FEATURES)
C, MEM = rules.J_COMPUTE, rules.J_MEMORY


def _fp(f0: list[float] | np.ndarray) -> np.ndarray:
    """Fingerprints that differ in the first input only (the others equal for every job)."""
    out = np.ones((len(f0), NF))
    out[:, 0] = f0
    return out


def _reference() -> tuple[np.ndarray, np.ndarray]:
    """20 compute jobs at 0..1, 20 memory jobs at 3..4, and an overlap at 1.9..2.1 of 6 compute and
    6 memory jobs (first input; quantiles over the 52 jobs)."""
    f0 = np.r_[np.linspace(0, 1, 20), np.linspace(3, 4, 20), np.linspace(1.9, 2.1, 12)]
    truth = np.r_[np.full(20, C), np.full(20, MEM), np.tile([C, MEM], 6)]
    return _fp(f0), truth


def test_quantiles_interpolate_share_ties_clamp_and_put_missing_in_the_middle() -> None:
    grids = [[0.0, 1.0, 1.0, 1.0, 2.0]] + [[0.0, 1.0]] * (NF - 1)
    fp = np.full((5, NF), 0.5)
    fp[:, 0] = [0.5, 1.0, -5.0, 5.0, np.nan]
    z = A.to_quantiles(fp, grids)
    assert z[:, 0].tolist() == pytest.approx([0.125, 0.5, 0.0, 1.0, 0.5])
    assert z[:, 1].tolist() == pytest.approx([0.5] * 5)


def test_fingerprint_sums_merge_over_any_split_of_the_windows() -> None:
    rng = np.random.default_rng(3)
    X = rng.random((9, NF))
    X[2, 4] = np.nan
    dur = np.array([10.0, 2.0, 10.0, np.nan, 5.0, 10.0, 10.0, 1.0, 10.0])
    group = np.array(["a"] * 4 + ["b"] * 5, dtype=object)
    keys, fp = A.job_fingerprints(X, group, dur)
    num, den = A.window_sums(X, dur)
    split = A.fingerprint_from_sums(num[:2].sum(0) + num[2:4].sum(0), den[:2].sum(0) + den[2:4].sum(0))
    assert keys.tolist() == ["a", "b"] and np.allclose(split, fp[0])
    # length-weighted; a missing input is left out of its own mean only; unknown length counts 10 s
    w = np.array([10.0, 2.0, 10.0, 10.0])
    assert fp[0, 0] == pytest.approx((X[:4, 0] * w).sum() / w.sum(), rel=1e-6)
    assert fp[0, 4] == pytest.approx((X[[0, 1, 3], 4] * w[[0, 1, 3]]).sum() / w[[0, 1, 3]].sum(), rel=1e-6)


def test_confidence_is_lowered_only_where_both_labels_are_near() -> None:
    fp, truth = _reference()
    amb = A.fit_ambiguity(fp, truth, "knn", 5)
    # jobs: in the overlap (called compute, called memory), deep among compute jobs, deep among
    # memory jobs called compute (no compute neighbour: not ambiguous), idle and mixed in the
    # overlap, and one without a fingerprint
    q = _fp([2.0, 2.0, 0.5, 3.5, 2.0, 2.0, 2.0])
    q[6] = np.nan
    labels = np.array([C, MEM, C, C, rules.J_IDLE, rules.J_MIXED, C])
    conf = np.full(7, 0.95)
    p = A.purity(amb, q, labels)
    assert 0 < p[0] < 1 and 0 < p[1] < 1 and p[0] + p[1] == pytest.approx(1.0)
    assert np.isnan(p[2:]).all()
    low = A.lower_confidence(amb, conf, q, labels)
    assert low[:2].tolist() == pytest.approx(p[:2].tolist())
    assert low[2:].tolist() == conf[2:].tolist()
    # never raised: a confidence already below the purity stays; scale multiplies
    assert A.lower_confidence(amb, np.full(7, 0.1), q, labels).tolist() == [0.1] * 7
    scaled = A.lower_confidence({**amb, "lowering": "scale"}, conf, q, labels)
    assert scaled[:2].tolist() == pytest.approx((0.95 * p[:2]).tolist())
    assert A.lower_confidence(None, conf, q, labels).tolist() == conf.tolist()
    # the same whatever the block size the distances are computed in
    many = np.repeat(q, 200, axis=0)
    assert A.purity(amb, many, np.repeat(labels, 200)).tolist() == pytest.approx(
        np.repeat(p, 200).tolist(), nan_ok=True)


def test_the_radius_is_a_quantile_of_the_repeat_distances_and_far_jobs_are_left_alone() -> None:
    fp, truth = _reference()
    # repeats: neighbouring jobs of each cluster ran one workload twice
    configs: list[str | None] = [f"w{i // 2}" for i in range(len(truth))]
    amb = A.fit_ambiguity(fp, truth, "radius", 0.5, configs=configs)
    z = A.to_quantiles(fp, amb["grids"])
    rep = A.repeat_distances(np.round(z, A.DIGITS), configs)
    assert amb["radius"] == pytest.approx(float(np.quantile(rep, 0.5)), abs=1e-4) and amb["radius"] > 0
    q = _fp([2.0, 0.5, 3.5])
    low = A.lower_confidence(amb, np.full(3, 0.9), q, np.array([C, C, MEM]))
    assert low[0] < 0.9 and low[1:].tolist() == [0.9, 0.9]
    with pytest.raises(DataError, match="no two training jobs ran the same workload"):
        A.fit_ambiguity(fp, truth, "radius", 0.5, configs=[None] * len(truth))
    with pytest.raises(DataError, match="workload configurations"):
        A.fit_ambiguity(fp, truth, "radius", 0.5)


@pytest.fixture(scope="module")
def ridge() -> Iterator[tuple[list[Path], M.TrainingSet, M.WindowModel, dict[str, Any]]]:
    """One GPU's 40 ridge jobs: their telemetry files, windows, a model trained on them and a knn
    check built from their fingerprints."""
    with tempfile.TemporaryDirectory(prefix="wattclass-amb-") as tmp:
        roots = materialize([DATA / "ridge"], Path(tmp))
        ts = training_set([DATA / "ridge"], max_windows_per_job=0)
        sub = ts.subset(np.char.startswith(ts.group.astype(str), "ridge:90"))
        model = M.train_model(sub, "t-amb", n_folds=3)
        _, truth = sub.job_truth()
        _, fp = A.job_fingerprints(sub.X, sub.group, sub.dur)
        yield telemetry_files(roots), ts, model, A.fit_ambiguity(fp, truth, "knn", 5)


def test_the_engine_applies_the_check_and_never_changes_a_label(ridge: Any, tmp_path: Path) -> None:
    files, ts, plain, entry = ridge
    plain.save(tmp_path / "plain")
    amb = M.load_model(tmp_path / "plain")
    amb.set_ambiguity(entry)
    amb.save(tmp_path / "amb")
    amb = M.load_model(tmp_path / "amb")
    # both carry the evidence cap (issue 13 round 10): the newest format either way
    assert amb.ambiguity == entry and amb.meta["format_version"] == M.FORMAT_VERSION
    plain = M.load_model(tmp_path / "plain")
    assert plain.ambiguity is None and plain.meta["format_version"] == M.FORMAT_EVIDENCE_CAP
    got_p = label_files_local(files, plain, source="model", workers=1).labels.set_index("job_id")
    got_a = label_files_local(files, amb, source="model", workers=1).labels.set_index("job_id")
    assert (got_a["label"] == got_p["label"]).all() and len(got_a) == 81
    assert (got_a["confidence"] <= got_p["confidence"]).all()
    lowered = got_a["confidence"] < got_p["confidence"]
    assert 0 < lowered.sum() < len(got_a)
    # the engine's fingerprints (sums over the scanned windows) are the jobs' own: the same
    # confidences as the model's job_confidence on the training set's windows
    keys, lab, raw = amb.job_predictions(ts.X, ts.group, ts.dur)
    _, fp = A.job_fingerprints(ts.X, ts.group, ts.dur)
    want = amb.job_confidence(raw, lab, fp)
    for k, c in zip(keys, want, strict=True):
        assert got_a.loc[str(k).split(":", 1)[1], "confidence"] == pytest.approx(c, abs=6e-5), k
    # a model without the check: job_confidence is its calibration; with it, fingerprints are needed
    assert plain.job_confidence(raw, lab, None).tolist() == plain.calibrate(raw, lab).tolist()
    with pytest.raises(DataError, match="has an ambiguity check"):
        amb.job_confidence(raw, lab, None)


def test_the_shipped_model_carries_the_round6_check() -> None:
    # issue 13: the check passed its registered rule on fresh5 (round 6) and every model since
    # carries it; its reference is the model's compute- and memory-bound training jobs
    shipped = M.load_model(M.default_model_dir())
    amb = shipped.ambiguity
    assert amb is not None
    assert (amb["mode"], amb["radius_quantile"], amb["lowering"]) == ("radius", 0.15, "cap")
    per_label = shipped.meta["training_data"]["jobs_per_label"]
    assert len(amb["reference"]) == len(amb["reference_labels"]) == per_label["compute"] + per_label["memory"]
    ref = np.asarray(amb["reference"], dtype=np.float64)
    ref_lab = np.asarray(amb["reference_labels"])
    grids = np.asarray(amb["grids"], dtype=np.float64)
    # a reference job whose neighbourhood holds both labels, put back into input units
    d = np.sqrt(((ref[:, None, :] - ref[None, :, :]) ** 2).sum(axis=2))
    near = d <= amb["radius"]
    mixed = [i for i in range(len(ref)) if len({str(x) for x in ref_lab[near[i]]}) == 2]
    assert mixed, "the shipped check lowers no training job at all"
    i = mixed[0]
    on = np.array([[np.interp(ref[i, j], np.linspace(0, 1, grids.shape[1]), grids[j])
                    for j in range(NF)]])
    lab = np.array([C if str(ref_lab[i]) == "compute" else MEM])
    purity = float(np.mean([str(x) == str(ref_lab[i]) for x in ref_lab[near[i]]]))
    cal = shipped.calibrate(np.array([0.999]), lab)
    got = shipped.job_confidence(np.array([0.999]), lab, on)
    assert got[0] == pytest.approx(min(cal[0], purity), abs=1e-3) and got[0] < cal[0]
    # no fingerprint (the model labelled none of the job's windows): its calibration, unchanged
    none = np.full((1, NF), np.nan)
    assert shipped.job_confidence(np.array([0.999]), lab, none).tolist() == cal.tolist()


@pytest.mark.parametrize("key", ["format", "mode", "lowering", "features", "grids", "k", "reference",
                                 "reference_labels"])
def test_a_check_without_a_field_is_refused_naming_it(ridge: Any, tmp_path: Path, key: str) -> None:
    _, _, model, entry = ridge
    model.save(tmp_path / "m")
    meta = json.loads((tmp_path / "m" / "model.json").read_text())
    meta["ambiguity"] = {k: v for k, v in entry.items() if k != key}
    meta["format_version"] = M.FORMAT_VERSION
    (tmp_path / "m" / "model.json").write_text(json.dumps(meta))
    with pytest.raises(DataError, match=f"model.json: ambiguity entry lacks '{key}'"):
        M.load_model(tmp_path / "m")


@pytest.mark.parametrize(("change", "message"), [
    ({"mode": "radius"}, "lacks 'radius'"),
    ({"mode": "radius", "radius": -1.0}, "'radius' must be a finite number > 0"),
    ({"mode": "radius", "radius": float("inf")}, "'radius' must be a finite number > 0"),
    ({"mode": "cosine"}, "'mode' 'cosine' unknown"),
    ({"lowering": "drop"}, "'lowering' 'drop' unknown"),
    ({"k": "5"}, "'k' has the wrong type"),
    ({"k": 0}, "'k' must be >= 1"),
    ({"format": A.AMBIGUITY_FORMAT + 1}, "newer than this wattclass reads"),
    ({"grids": [[1.0, 0.0]] * NF}, "'grids' must be"),
    ({"grids": [["a", "b"]] * NF}, "'grids' must be"),
    ({"reference": [[True] * NF], "reference_labels": ["memory"]}, f"rows must have {NF} numbers"),
    ({"reference_labels": ["idle"]}, "must be non-empty and of one length"),
    ({"reference": [[0.5] * NF], "reference_labels": ["idle"]}, "must be compute or memory"),
    ({"reference": [[0.5] * 3], "reference_labels": ["memory"]}, f"rows must have {NF} numbers"),
    ({"features": ["power_frac"]}, "'features' differ"),
])
def test_a_bad_check_is_refused_with_a_clear_error(ridge: Any, tmp_path: Path, change: dict[str, Any],
                                                   message: str) -> None:
    _, _, model, entry = ridge
    model.set_ambiguity(entry)
    model.save(tmp_path / "m")
    model.set_ambiguity(None)
    meta = json.loads((tmp_path / "m" / "model.json").read_text())
    meta["ambiguity"].update(change)
    (tmp_path / "m" / "model.json").write_text(json.dumps(meta))
    with pytest.raises(DataError, match=message):
        M.load_model(tmp_path / "m")
    # an older format may not carry a check (an older wattclass would ignore it)
    meta["ambiguity"] = entry
    meta["format_version"] = 2
    meta.pop("evidence_cap_windows")  # (format 4's own field: refused in a format 2 file too)
    (tmp_path / "m" / "model.json").write_text(json.dumps(meta))
    with pytest.raises(DataError, match="'ambiguity' in a format 2 file"):
        M.load_model(tmp_path / "m")


def test_model_train_writes_the_check_byte_for_byte_and_refuses_bad_specs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    raw = str(DATA / "raw")
    for out in ("a", "b"):
        assert main(["model", "train", "--raw", raw, "--out", str(tmp_path / out), "--version", "t",
                     "--folds", "3", "--ambiguity", "knn:4"]) == 0
    for f in ("model.txt", "model.json"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
    amb = M.load_model(tmp_path / "a").ambiguity
    assert amb is not None and amb["k"] == 4 and amb["lowering"] == "cap"
    per_label = M.load_model(tmp_path / "a").meta["training_data"]["jobs_per_label"]
    assert len(amb["reference"]) == per_label["compute"] + per_label["memory"]
    capsys.readouterr()
    for spec, message in (("radius", "--ambiguity 'radius': expected MODE:VALUE"),
                          ("knn:x", "'x' is not a number"), ("knn:3:soft", "expected MODE:VALUE"),
                          ("radius:0.5", "no two training jobs ran the same workload")):
        assert main(["model", "train", "--raw", raw, "--out", str(tmp_path / "bad"), "--version", "t",
                     "--folds", "3", "--ambiguity", spec]) != 0
        assert message in capsys.readouterr().err, spec
        assert not (tmp_path / "bad").exists()


def test_any_split_of_the_files_gives_the_same_lowered_confidences(ridge: Any, tmp_path: Path) -> None:
    # the Dask engine labels chunks of files and merges their partial sums: the fingerprints (and
    # so the check) must not depend on the split. Every job's windows are dealt to two files.
    import pyarrow.parquet as pq

    from wattclass.classifier.engine import _combine, _Model, label_chunk

    files, _, model, entry = ridge
    table = pq.read_table(files[0]) if len(files) == 1 else None
    assert table is not None and table.num_rows > 100
    halves = [tmp_path / "a.parquet", tmp_path / "b.parquet"]
    for i, path in enumerate(halves):
        pq.write_table(table.take(np.arange(i, table.num_rows, 2)), path)
    plain = label_files_local(files, model, source="model", workers=1).labels.set_index("job_id")
    model.set_ambiguity(entry)
    try:
        whole = label_files_local(files, model, source="model", workers=1).labels.set_index("job_id")
        parts = [label_chunk([path], model, "model") for path in halves]
        split = _combine(parts, _Model(model), "model").labels.set_index("job_id")
    finally:
        model.set_ambiguity(None)
    assert (split.index == whole.index).all() and len(split) == 81
    assert (split["label"] == whole["label"]).all()
    assert np.allclose(split["confidence"].to_numpy(float), whole["confidence"].to_numpy(float), atol=1e-4)
    assert (split["confidence"] < plain["confidence"]).any()  # the check acted on this split too
