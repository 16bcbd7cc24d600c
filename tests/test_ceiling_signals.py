"""bench/nvml_signals.py, the all-signals fingerprint of eval_ceiling --fingerprint nvml-all (issue 13
round 8): re-runs land together, GPM never enters, and only normalised quantities do."""

from __future__ import annotations

import csv
import importlib.util
import json
import shutil
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pandas as pd
import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
GPM = ("gpm_sm_util", "gpm_dram_bw_util", "gpm_fp32_util", "gpm_hmma_tensor_util", "gpm_int_util")


def _load(name: str) -> ModuleType:
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def ns() -> ModuleType:
    return _load("nvml_signals")


def _job_samples(rng: np.random.Generator, t0: float, n: int, kind: str) -> dict[str, np.ndarray]:
    """n 1 Hz samples of a job: ``compute`` (high power, clock dips) or ``memory`` (high util_mem)."""
    hot = kind == "compute"
    power = (620_000 if hot else 380_000) + rng.normal(0, 25_000, n)
    return {
        "ts": t0 + np.arange(n, dtype=float),
        "util_gpu": np.clip(rng.normal(98 if hot else 90, 2, n), 0, 100).round(),
        "util_mem": np.clip(rng.normal(20 if hot else 75, 5, n), 0, 100).round(),
        "power_mw": power.round(),
        "power_instant_mw": (power + rng.normal(0, 40_000, n)).round(),
        "energy_mj": (1e7 + np.cumsum(power / 1000.0 * 1000.0)).round(),
        "sm_clock_mhz": 1980.0 - (rng.integers(0, 200, n) if hot else np.zeros(n)),
        "mem_clock_mhz": np.full(n, 3201.0),
        "pstate": np.zeros(n),
        "clock_event_reasons": np.where(rng.random(n) < (0.5 if hot else 0.0), 0x4, 0).astype(float),
        "temp_c": 40 + np.arange(n) * (0.4 if hot else 0.2) + rng.normal(0, 0.3, n).round(),
        "fb_used_mib": np.full(n, 20_000.0 if hot else 60_000.0),
        "n_procs": np.ones(n),
    }


def _write_folder(root: Path, jobs: list[dict[str, np.ndarray]], job_ids: list[str] | None = None,
                  caps: dict[str, object] | None = None) -> Path:
    """A probe recording folder (one part) whose runs are ``jobs``, with GPM columns and a gap
    between runs."""
    root.mkdir(parents=True, exist_ok=True)
    frames = []
    for i, j in enumerate(jobs):
        df = pd.DataFrame(j)
        for c in GPM:
            df[c] = 0.9 if i % 2 == 0 else 0.1
        df["job"] = f"job{i}"
        df["nvml_basic_us"] = 3000.0
        frames.append(df)
    pd.concat(frames).to_parquet(root / "p0_samples_1hz.parquet", index=False)
    (root / "p0_caps.json").write_text(json.dumps(caps or {
        "name": "NVIDIA H200", "uuid": "GPU-x", "enforced_limit_mw": 700_000, "limit_mw": 700_000,
        "clocks_max_sm": 1980, "clocks_max_mem": 3201, "fb_total_mib": 143771.0}))
    with (root / "p0_runs.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["job", "label", "start", "end", *(["job_id"] if job_ids else [])])
        for i, j in enumerate(jobs):
            w.writerow([f"job{i}", "x", j["ts"][0], j["ts"][-1], *([job_ids[i]] if job_ids else [])])
    return root


def _shifted(j: dict[str, np.ndarray], dt: float) -> dict[str, np.ndarray]:
    return {k: (v + dt if k == "ts" else v.copy()) for k, v in j.items()}


def test_two_identical_runs_have_distance_zero_and_others_do_not(ns: ModuleType, tmp_path: Path) -> None:
    from wattclass.classifier.ambiguity import distances

    rng = np.random.default_rng(1)
    a = _job_samples(rng, 1000.0, 10, "compute")
    jobs = [a, _shifted(a, 100.0), _job_samples(rng, 300.0, 10, "memory")]
    keys, fp = ns.signal_fingerprints([_write_folder(tmp_path / "rec", jobs)])
    assert keys == ["rec:5001", "rec:5002", "rec:5003"]  # classifier/training.py's job keys
    assert fp.shape == (3, len(ns.FEATURE_NAMES))
    z = _load("eval_ceiling").scaled(fp)
    d = distances(z, z)
    assert d[0, 1] == 0.0
    assert d[0, 2] > 0.5 and d[1, 2] > 0.5


def test_gpm_columns_never_reach_the_fingerprint(ns: ModuleType, tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    jobs = [_job_samples(rng, 1000.0 + 50 * i, 9, kind) for i, kind in enumerate(("compute", "memory"))]
    base = _write_folder(tmp_path / "base", jobs)
    _, fp = ns.signal_fingerprints([base])
    # the same NVML readings with entirely different GPM readings: the same fingerprint
    changed = tmp_path / "gpm_changed"
    shutil.copytree(base, changed)
    df = pd.read_parquet(changed / "p0_samples_1hz.parquet")
    for c in GPM:
        df[c] = rng.random(len(df))
    df["gpm_extra_util"] = rng.random(len(df))
    df.to_parquet(changed / "p0_samples_1hz.parquet", index=False)
    _, fp2 = ns.signal_fingerprints([changed])
    np.testing.assert_array_equal(fp, fp2)
    # and without any GPM column it still reads (it never asked for one)
    gone = tmp_path / "no_gpm"
    shutil.copytree(base, gone)
    df.drop(columns=[c for c in df.columns if c.startswith("gpm_")]).to_parquet(
        gone / "p0_samples_1hz.parquet", index=False)
    _, fp3 = ns.signal_fingerprints([gone])
    np.testing.assert_array_equal(fp, fp3)
    assert not any(c.startswith("gpm_") for c in ns.SAMPLE_COLUMNS)


def test_only_normalised_quantities_enter(ns: ModuleType, tmp_path: Path) -> None:
    # another GPU model: twice the watts and framebuffer, 1.5x the clocks, runs 15 K warmer
    rng = np.random.default_rng(3)
    jobs = [_job_samples(rng, 1000.0 + 50 * i, 10, kind) for i, kind in enumerate(("compute", "memory"))]
    _, fp = ns.signal_fingerprints([_write_folder(tmp_path / "h200", jobs)])
    big = []
    for j in jobs:
        b = dict(j)
        for c in ("power_mw", "power_instant_mw", "energy_mj", "fb_used_mib"):
            b[c] = j[c] * 2
        for c in ("sm_clock_mhz", "mem_clock_mhz"):
            b[c] = j[c] * 1.5
        b["temp_c"] = j["temp_c"] + 15
        big.append(b)
    caps = {"name": "bigger", "uuid": "GPU-y", "enforced_limit_mw": 1_400_000, "clocks_max_sm": 1980 * 1.5,
            "clocks_max_mem": 3201 * 1.5, "fb_total_mib": 143771.0 * 2}
    _, fp2 = ns.signal_fingerprints([_write_folder(tmp_path / "big", big, caps=caps)])
    np.testing.assert_allclose(fp, fp2, rtol=1e-9, atol=1e-12, equal_nan=True)


def test_runs_csv_job_ids_and_missing_fb_total(ns: ModuleType, tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    jobs = [_job_samples(rng, 1000.0, 8, "memory")]
    folder = _write_folder(tmp_path / "ids", jobs, job_ids=["7001"])
    other = _write_folder(tmp_path / "nofb", [_shifted(jobs[0], 0.0)], caps={
        "name": "NVIDIA H200", "uuid": "GPU-z", "limit_mw": 700_000, "clocks_max_sm": 1980,
        "clocks_max_mem": 3201})
    keys, fp = ns.signal_fingerprints([folder, other])
    assert keys == ["ids:7001", "nofb:5001"]
    # a caps file without fb_total_mib borrows it from a part of the same GPU model
    np.testing.assert_array_equal(fp[0], fp[1])


def test_every_feature_has_a_group(ns: ModuleType) -> None:
    groups = {ns.feature_group(n) for n in ns.FEATURE_NAMES}
    assert groups == set(ns.GROUPS)
    assert ns.feature_group("power_inst_std") == "power" and ns.feature_group("fb_growth_ratio") == "fb_used"
    with pytest.raises(ValueError, match="in no group"):
        ns.feature_group("gpm_sm_util_mean")


def test_twin_bound_counts_disjoint_opposite_label_pairs() -> None:
    ec = _load("eval_ceiling")
    # jobs 0/1 and 2/3 are re-runs 0.1 apart; memory 4 sits within 0.1 of computes 0 and 1, memory 5
    # of compute 2: two disjoint twin pairs, a bound of 1 - 2/6
    z = np.array([[0.0], [0.1], [1.0], [1.1], [0.04], [0.96]])
    truth = np.array([1, 1, 1, 1, 2, 2], dtype=np.int8)
    b = ec.twin_bound(z, truth, ["a", "a", "b", "b", None, None], 0.5)
    assert b["tau"] == pytest.approx(0.1)
    assert sorted(b["edges"]) == [(0, 4), (1, 4), (2, 5)]
    assert len(b["matched"]) == 2 and b["bound"] == pytest.approx(1 - 2 / 6)
    # 1-NN: only compute 3 has a job of its label nearest (compute 2)
    assert ec.knn_loo_accuracy(np.abs(z - z.T), truth, 1) == pytest.approx(1 / 6)


def test_a_caps_file_belongs_to_its_own_folder(ns: ModuleType, tmp_path: Path) -> None:
    # two recording folders with a part of one name ("p0"): each part normalised by its own folder's
    # caps, not by the last folder's (another GPU model: twice the watts and twice the limit)
    rng = np.random.default_rng(5)
    jobs = [_job_samples(rng, 1000.0 + 50 * i, 10, kind) for i, kind in enumerate(("compute", "memory"))]
    h200 = _write_folder(tmp_path / "h200", jobs)
    big = [{**j, **{c: j[c] * 2 for c in ("power_mw", "power_instant_mw", "energy_mj")}} for j in jobs]
    caps = {"name": "NVIDIA H200", "uuid": "GPU-w", "enforced_limit_mw": 1_400_000, "clocks_max_sm": 1980,
            "clocks_max_mem": 3201, "fb_total_mib": 143771.0}
    other = _write_folder(tmp_path / "big", big, caps=caps)
    keys, fp = ns.signal_fingerprints([h200, other])
    assert keys == ["h200:5001", "h200:5002", "big:5001", "big:5002"]
    np.testing.assert_allclose(fp[:2], fp[2:], rtol=1e-9, atol=1e-12, equal_nan=True)


@pytest.fixture(scope="module")
def cs() -> ModuleType:
    return _load("ceiling_signals")


def test_folds_merge_folders_that_share_a_family(cs: ModuleType) -> None:
    folder = np.array(["raw", "raw", "collected", "sweep", "sweep-heldout", "a", "b", "b", "c", "latency"],
                      dtype=object)
    family = np.array(["gemm", "fft", "gemm", "conv", "conv", "x", "x", "y", "y", "chase"], dtype=object)
    fold = cs.family_disjoint_folds(folder, family)
    # a~b share x, b~c share y: one fold by the chain
    assert fold.tolist() == ["collected+raw", "collected+raw", "collected+raw", "sweep+sweep-heldout",
                             "sweep+sweep-heldout", "a+b+c", "a+b+c", "a+b+c", "a+b+c", "latency"]
    cs.check_family_disjoint(fold, family)
    with pytest.raises(ValueError, match=r"2 workload families cross folds \(conv in sweep, sweep-heldout; "
                                         r"gemm in collected, raw"):
        cs.check_family_disjoint(folder[:5], family[:5])


def _family_coded_jobs(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Jobs of 20 families, each recorded in two folders (10 jobs per folder). Feature 0 encodes the
    family (its index, plus a little noise), the label follows the family (0, 0, 1, 1, 0, 0, ... in
    index order), features 1-2 are noise: a model can only learn "which family is this", which is
    worth nothing on a family it has not seen (chance: 0.5) and everything on one it has."""
    rng = np.random.default_rng(seed)
    fam_idx = np.repeat(np.repeat(np.arange(20), 2), 10)
    folder = np.repeat([f"rec{i:02d}" for i in range(40)], 10).astype(object)
    family = np.array([f"fam{i:02d}" for i in fam_idx], dtype=object)
    X = np.column_stack([fam_idx + rng.normal(0, 0.01, len(fam_idx)), rng.normal(size=(len(fam_idx), 2))])
    y = ((fam_idx // 2) % 2).astype(np.int64)
    return X, y, folder, family


@pytest.mark.parametrize("seed", [0, 1])
def test_held_out_folds_never_see_the_family(cs: ModuleType, seed: int) -> None:
    X, y, folder, family = _family_coded_jobs(seed)
    fold = cs.family_disjoint_folds(folder, family)
    assert len(set(fold.tolist())) == 20
    res = cs.lgbm_loso(X, y, fold, family, ["family_code", "noise1", "noise2"], seed=seed)
    assert abs(res["accuracy"] - 0.5) <= 0.15
    assert res["jobs"] == 400 == sum(v["jobs"] for v in res["per_fold"].values())
    assert sum(v["right"] for v in res["per_family"].values()) == round(res["accuracy"] * 400)
    # every family seen in training: the same model is near perfect ...
    assert cs.lgbm_random_cv(X, y) >= 0.9
    # ... and so is one folder held out, when its sibling folder (same family) is in training: the
    # leak the folds exist to prevent, which lgbm_loso refuses when told the families
    assert cs.lgbm_loso(X, y, folder, folder, ["family_code", "noise1", "noise2"])["accuracy"] >= 0.9
    with pytest.raises(ValueError, match="20 workload families cross folds"):
        cs.lgbm_loso(X, y, folder, family, ["family_code", "noise1", "noise2"])


def test_without_a_fold_needs_that_fold(cs: ModuleType) -> None:
    res = {"per_fold": {"latency": {"jobs": 10, "right": 2, "accuracy": 0.2},
                        "collected+raw": {"jobs": 30, "right": 27, "accuracy": 0.9}}}
    assert cs._without(res, "latency") == 0.9
    with pytest.raises(ValueError, match=r"no fold 'latncy'.*collected\+raw, latency"):
        cs._without(res, "latncy")


def test_noise_scaled_counts_each_feature_in_its_rerun_noise(cs: ModuleType) -> None:
    # jobs 0/1 and 2/3 are re-runs; feature 0 differs by 0.1 between them, feature 1 by 0.4,
    # feature 2 never moves (dropped), feature 3 varies but is the same in both re-runs (floored)
    z = np.array([[0.0, 0.0, 0.5, 0.0],
                  [0.1, 0.4, 0.5, 0.0],
                  [1.0, 2.0, 0.5, 1.0],
                  [1.1, 2.4, 0.5, 1.0],
                  [3.0, 3.0, 0.5, 3.0]])
    out = cs.noise_scaled(z, ["a", "a", "b", "b", None])
    assert out.shape == (5, 3)
    rms, pairs = cs.repeat_rms(z, ["a", "a", "b", "b", None])
    assert pairs == 2 and rms[:2] == pytest.approx([0.1, 0.4])
    # the floor: the NOISE_FLOOR_QUANTILE of the positive re-run RMS differences (0.13 here), so the
    # quietest feature (0.1) and the one whose re-runs never differ count at most 1/0.13 per unit
    floor = float(np.quantile([0.1, 0.4], cs.NOISE_FLOOR_QUANTILE))
    assert floor == pytest.approx(0.13)
    np.testing.assert_allclose(out, np.column_stack([z[:, 0] / floor, z[:, 1] / 0.4, z[:, 3] / floor]))
    # feature 1's re-runs differ by one unit of its noise
    assert abs(out[1, 1] - out[0, 1]) == pytest.approx(1.0)


def test_whitened_keeps_the_components_of_95_percent_at_unit_variance(cs: ModuleType) -> None:
    rng = np.random.default_rng(6)
    base = rng.normal(size=(200, 2)) * [5.0, 2.0]
    # four correlated columns of two strong directions, plus a faint one
    z = np.column_stack([base[:, 0], base[:, 0] + base[:, 1], base[:, 1], rng.normal(0, 0.01, 200)])
    w = cs.whitened(z)
    assert w.shape == (200, 2)
    np.testing.assert_allclose(np.cov(w, rowvar=False), np.eye(2), atol=1e-9)
    assert cs.whitened(z, variance=0.999999).shape == (200, 3)
