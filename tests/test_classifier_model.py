"""Grouped cross-validation, the promotion gate, calibration and the model file format."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from wattclass.classifier import calibration as C
from wattclass.classifier import model as M
from wattclass.classifier.training import training_set
from wattclass.errors import DataError


@pytest.fixture(scope="module")
def real_set() -> M.TrainingSet:
    return training_set([Path(__file__).resolve().parent.parent / "wattclass/data/h200/telemetry.parquet"])


def test_folds_never_split_a_job_and_are_stratified(real_set: M.TrainingSet) -> None:
    keys, truth = real_set.job_truth()
    assert len(keys) == 21
    for seed in range(5):
        fold = M.job_folds(keys, truth, 5, seed)
        job_fold = dict(zip(keys, fold, strict=True))
        window_fold = np.array([job_fold[g] for g in real_set.group])
        for k in keys:  # all windows of a job land in one fold
            assert len(set(window_fold[real_set.group == k])) == 1
        for lab in np.unique(truth):  # each label spread over folds as evenly as possible
            counts = np.bincount(fold[truth == lab], minlength=5)
            assert counts.max() - counts.min() <= 1


def test_cross_validation_reports_job_level_metrics(real_set: M.TrainingSet) -> None:
    cv = M.cross_validate(real_set, n_folds=5, seed=0)
    assert cv["n_jobs"] == 21
    conf = np.array(cv["confusion"])
    assert conf.sum() == 21
    assert cv["accuracy"] == pytest.approx(np.trace(conf) / 21)
    assert cv["accuracy"] >= 0.85  # the basic columns do separate the classes on real H200 data
    assert 0 <= cv["ece"] <= 1
    assert len(set(cv["jobs"]["fold"])) == 5


@pytest.mark.parametrize(("cand", "inc", "expected"), [
    (0.96, 0.95, True),  # better
    (0.94, 0.95, False),  # worse
    (0.95, 0.95, True),  # equal: not worse
    (None, 0.95, False),  # candidate without metrics
    (0.50, None, True),  # incumbent without metrics
])
def test_promotion_gate(cand: float | None, inc: float | None, expected: bool) -> None:
    c = None if cand is None else {"accuracy": cand}
    i = None if inc is None else {"accuracy": inc}
    assert M.should_promote(c, i) is expected


def test_ece() -> None:
    assert M.ece([0.9] * 10, [1] * 9 + [0]) == pytest.approx(0.0)
    assert M.ece([1.0] * 4, [1, 0, 1, 0]) == pytest.approx(0.5)


def test_save_load_roundtrip_and_newer_format_refused(real_set: M.TrainingSet, tmp_path: Path) -> None:
    m = M.train_model(real_set, "test-1", evaluate=False)
    m.save(tmp_path / "m")
    back = M.load_model(tmp_path / "m")
    assert back.source == "model:test-1"
    assert np.allclose(back.predict_proba(real_set.X[:5]), m.predict_proba(real_set.X[:5]))
    meta = json.loads((tmp_path / "m" / "model.json").read_text())
    meta["format_version"] = M.FORMAT_VERSION + 1
    meta["wattclass_version"] = "9.0.0"
    (tmp_path / "m" / "model.json").write_text(json.dumps(meta))
    newer = M.FORMAT_VERSION + 1
    with pytest.raises(DataError, match=rf"format version {newer} was written by wattclass 9\.0\.0"):
        M.load_model(tmp_path / "m")


def test_default_model_is_shipped_and_loads() -> None:
    m = M.load_model(M.default_model_dir())
    # the shipped model carries the ambiguity check (issue 13 round 6) and the evidence cap (round
    # 10): the newest format, 4
    newest = M.FORMAT_VERSION
    assert m.evidence_cap is not None and m.ambiguity is not None
    assert m.meta["format_version"] == M.format_version_for(m.kind, True, True) == newest
    assert m.meta["training_data"]["n_jobs"] >= 21
    assert m.meta["metrics"]["n_jobs"] == m.meta["training_data"]["n_jobs"]


def test_family_folds_keep_each_family_in_one_fold() -> None:
    keys = np.array([f"s:{i}" for i in range(40)], dtype=object)
    fams = {f"s:{i}": f"f{i % 7}" for i in range(36)}  # s:36..39 have no family: their own
    fold = M.family_folds(keys, fams, 5, seed=1)
    for f in set(fams.values()):
        assert len({fold[i] for i in range(36) if fams[f"s:{i}"] == f}) == 1
    assert set(fold) == set(range(5))
    assert max(np.bincount(fold)) - min(np.bincount(fold)) <= 6


def test_per_label_calibration_lowers_the_confidence_of_the_label_that_errs() -> None:
    rng = np.random.default_rng(0)
    n = 200
    raw = rng.uniform(0.7, 0.99, n)
    lab = np.where(np.arange(n) % 2 == 0, 1, 2)  # compute / memory calls
    correct = np.where(lab == 1, rng.random(n) < 0.95, rng.random(n) < 0.6)
    cal = C.fit_calibration_by_label(raw, correct, lab)
    assert set(cal["by_label"]) == {"compute", "memory"}
    out = C.apply_calibration(raw, cal, lab)
    assert out[lab == 2].mean() < out[lab == 1].mean() - 0.15
    assert abs(out[lab == 2].mean() - 0.6) < 0.08 and abs(out[lab == 1].mean() - 0.95) < 0.05
    # without labels the pooled map applies; a label with too few jobs falls back to it
    pooled = {"a": cal["a"], "b": cal["b"]}
    assert np.allclose(C.apply_calibration(raw, cal), C.apply_calibration(raw, pooled))
    few = C.fit_calibration_by_label(raw[:10], correct[:10], lab[:10])
    assert "by_label" not in few


def test_training_samples_written_before_a_feature_existed_load_with_it_missing(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from wattclass.classifier.features import FEATURES
    from wattclass.classifier.store import ClassifierStore

    old = [f for f in FEATURES if f != "power_std_frac"] + ["temp_c"]  # an older feature list
    d = tmp_path / "classifier" / "training" / "date=2026-11-01"
    d.mkdir(parents=True)
    pq.write_table(pa.table({**{f: np.full(3, 0.5, np.float32) for f in old},
                             "window_class": np.array([0, 1, 2], np.int8), "group": ["a:1"] * 3}),
                   d / "windows.parquet")
    ts = ClassifierStore(tmp_path).samples()
    assert ts.X.shape == (3, len(FEATURES))
    i = FEATURES.index("power_std_frac")
    assert np.isnan(ts.X[:, i]).all() and (np.delete(ts.X, i, axis=1) == 0.5).all()
    # written before the roofline-margin model: no margin (NaN: not trained on by its second stage)
    assert ts.margin is not None and np.isnan(ts.margin).all()
    # written before window lengths were kept: unknown (NaN: counts whole, passes the trainable filter)
    assert ts.dur is not None and np.isnan(ts.dur).all() and ts.trainable(5.0).all()


def _make_old_current(reg: Any, version: str, edit: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Register a copy of model ``version`` as "old-v1", its model.json changed by ``edit``, and make
    it current (as a registry written by an older wattclass would have it); its meta."""
    import shutil

    old = reg.root / "old-v1"
    shutil.copytree(reg.root / version, old)
    meta: dict[str, Any] = json.loads((old / "model.json").read_text())
    edit(meta)
    meta["model_version"] = "old-v1"
    (old / "model.json").write_text(json.dumps(meta))
    index = reg.index()
    index["current"] = "old-v1"
    index["versions"].append({"version": "old-v1", "promoted": True})
    reg._save(index)
    return meta


def test_registry_after_an_upgrade_that_changed_features_uses_the_packaged_model(tmp_path: Path) -> None:
    from wattclass.classifier.store import ModelRegistry

    reg = ModelRegistry(tmp_path)
    first = reg.current()

    def older(meta: dict[str, Any]) -> None:
        meta["features"] = [*meta["features"][:-1], "temp_c"]

    meta = _make_old_current(reg, first.version, older)
    got = reg.current()
    assert got.version == first.version and got.meta["features"] != meta["features"]
    index = reg.index()
    assert index["current"] == first.version
    assert index["versions"][-1]["gate"] == {"reason": "features changed"}
    assert [v["version"] for v in index["versions"]].count(first.version) == 1


@pytest.mark.parametrize("packaged_capped", [True, False])
def test_registry_with_an_uncapped_model_moves_to_the_capped_packaged_one(tmp_path: Path,
                                                                          packaged_capped: bool) -> None:
    # issue 13 round 10: a model without the evidence cap gives long jobs confidences its maps never
    # saw, and its nightly candidates keep its recipe: after the upgrade the packaged (capped) model
    # becomes current, the old one stays registered; with an uncapped packaged model nothing moves
    import shutil

    from wattclass.classifier.store import ModelRegistry

    packaged = tmp_path / "packaged"
    shutil.copytree(M.default_model_dir(), packaged, ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    if not packaged_capped:
        meta = json.loads((packaged / "model.json").read_text())
        del meta["evidence_cap_windows"]
        meta["format_version"] = M.FORMAT_AMBIGUITY
        (packaged / "model.json").write_text(json.dumps(meta))
    reg = ModelRegistry(tmp_path / "root", default_dir=packaged)
    first = reg.current()

    def uncapped(meta: dict[str, Any]) -> None:
        meta.pop("evidence_cap_windows", None)
        meta["format_version"] = M.FORMAT_AMBIGUITY

    _make_old_current(reg, first.version, uncapped)
    got = reg.current()
    if packaged_capped:
        assert got.version == first.version and got.evidence_cap is not None
        assert reg.index()["versions"][-1]["gate"] == {"reason": "evidence cap"}
        assert (reg.root / "old-v1" / "model.json").exists()
    else:
        assert got.version == "old-v1" and reg.index()["current"] == "old-v1"


def test_a_format_4_model_without_its_cap_is_refused(tmp_path: Path) -> None:
    import shutil

    shutil.copytree(M.default_model_dir(), tmp_path / "m",
                    ignore=shutil.ignore_patterns("__pycache__", "*.py"))
    meta = json.loads((tmp_path / "m" / "model.json").read_text())
    del meta["evidence_cap_windows"]
    (tmp_path / "m" / "model.json").write_text(json.dumps(meta))
    with pytest.raises(DataError, match="format 4 model without its 'evidence_cap_windows'"):
        M.load_model(tmp_path / "m")


def test_ece_of_draws_equals_ece_per_draw() -> None:
    from wattclass.classifier.calibration import ece_of_draws

    rng = np.random.default_rng(3)
    conf = np.concatenate([rng.uniform(0.3, 1.0, 57), [1.0, 0.0, 0.1]])  # both ends of the bins too
    hits = rng.random((25, len(conf))) < conf
    got = ece_of_draws(conf, hits)
    assert got == pytest.approx([M.ece(conf, h) for h in hits], abs=1e-12)


def test_ece_noise_floor_is_the_ece_of_a_calibrated_model_and_shrinks_with_jobs() -> None:
    from wattclass.classifier.calibration import ece_noise_floor

    rng = np.random.default_rng(4)
    small, large = rng.uniform(0.55, 1.0, 80), rng.uniform(0.55, 1.0, 4000)
    f_small, f_large = ece_noise_floor(small), ece_noise_floor(large)
    # perfectly calibrated outcomes drawn apart from the floor's own: about 95% under its p95
    under = sum(M.ece(small, np.random.default_rng(100 + i).random(len(small)) < small) <= f_small["p95"]
                for i in range(400))
    assert 0.90 <= under / 400 <= 0.99
    assert 0.03 < f_small["mean"] < f_small["p95"] < 0.2
    assert f_large["p95"] < f_small["mean"] / 2  # the floor is the set's size, not the model
    assert ece_noise_floor(small) == f_small  # seeded: a report is reproducible
    # confidences of 1 (or 0) are always right (wrong): no noise at all
    assert ece_noise_floor(np.ones(30))["p95"] == pytest.approx(0.0)


def _platt_loss(ab: np.ndarray, conf: np.ndarray, correct: np.ndarray) -> float:
    from wattclass.classifier.calibration import CAL_PRIOR

    z = np.log(np.clip(conf, 1e-6, 1 - 1e-6) / (1 - np.clip(conf, 1e-6, 1 - 1e-6)))
    s = ab[0] * z + ab[1]
    return float(np.sum(np.logaddexp(0, s) - correct * s) + CAL_PRIOR * ((ab[0] - 1) ** 2 + ab[1] ** 2))


@pytest.mark.parametrize("case", range(8))
def test_platt_fit_is_the_minimum_within_its_box(case: int) -> None:
    """The Newton fit reaches the penalised loss's minimum (no other point of the box is lower,
    SciPy's L-BFGS-B run to a tight tolerance included), also where a bound holds it."""
    from scipy.optimize import minimize

    from wattclass.classifier.calibration import CAL_BOUNDS, fit_calibration

    rng = np.random.default_rng(case)
    n = (3, 12, 60, 400, 2000, 40, 200, 200)[case]
    conf = rng.uniform(0.3, 1.0, n)
    correct = (rng.random(n) < conf ** (0.5, 1, 2, 1, 1.5, 3, 1, 1)[case]).astype(float)
    if case == 6:  # every job right at low confidence: the offset runs far up
        conf, correct = rng.uniform(0.5, 0.6, n), np.ones(n)
    if case == 7:  # every job wrong at high confidence: the slope is held at its lower bound
        conf, correct = rng.uniform(0.9, 0.99, n), np.zeros(n)
    fit = fit_calibration(conf, correct)
    ab = np.array([fit["a"], fit["b"]])
    assert CAL_BOUNDS[0][0] <= ab[0] <= CAL_BOUNDS[0][1] and CAL_BOUNDS[1][0] <= ab[1] <= CAL_BOUNDS[1][1]
    ref = minimize(lambda x: _platt_loss(x, conf, correct), np.array([1.0, 0.0]), method="L-BFGS-B",
                   bounds=list(CAL_BOUNDS), options={"ftol": 1e-15, "gtol": 1e-12, "maxiter": 10_000})
    got = _platt_loss(ab, conf, correct)
    assert got <= ref.fun + 1e-9 * max(1.0, abs(ref.fun))
    for d in ([1e-4, 0], [-1e-4, 0], [0, 1e-4], [0, -1e-4]):  # no better point next to it in the box
        nb = np.clip(ab + d, [b[0] for b in CAL_BOUNDS], [b[1] for b in CAL_BOUNDS])
        assert got <= _platt_loss(nb, conf, correct) + 1e-9
    if case == 7:
        assert fit["a"] == CAL_BOUNDS[0][0]


def test_platt_fit_does_not_move_with_the_last_bits_of_its_inputs() -> None:
    """Why the fit is exact and stored to CAL_DIGITS: another CPU computes the model's confidences
    with other SIMD code, equal but for their last bits; the shipped model.json must not change.
    L-BFGS-B (used before) stopped at its tolerance and moved by ~1e-7 under such noise."""
    from wattclass.classifier.calibration import fit_calibration

    rng = np.random.default_rng(11)
    for _ in range(30):
        n = int(rng.integers(8, 600))
        conf = rng.uniform(0.2, 1.0, n)
        correct = rng.random(n) < conf
        noisy = conf * (1 + rng.choice([-1, 0, 1], n) * 2.0 ** -52)
        assert not np.array_equal(noisy, conf)
        assert fit_calibration(noisy, correct) == fit_calibration(conf, correct)


def test_platt_fit_refuses_confidences_that_are_not_numbers() -> None:
    """A NaN confidence would make every Newton step fail and leave NaN maps for model.json."""
    from wattclass.classifier.calibration import fit_calibration
    from wattclass.errors import DataError

    with pytest.raises(DataError, match="1 of 3 job confidences are not finite"):
        fit_calibration([0.9, float("nan"), 0.7], [True, False, True])
