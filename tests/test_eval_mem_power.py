"""bench/eval_mem_power.py, issue 13 round 13's registered analysis, on synthetic recordings: where
only the HBM's power share separates memory- from compute-bound jobs, B beats A, the threshold rule
is near perfect and the decision says carry; jobs without the field are counted and refused; a
recording without the new columns is refused naming the column."""

from __future__ import annotations

import csv
import importlib
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pandas as pd
import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
FAMILIES = 6
JOBS_PER_LABEL = 4  # per family and label
JOB_S = 10
GAP_S = 3
#: GPM per label (percent): compute-bound (fp32 pipe above DRAM) or memory-bound (DRAM above every pipe).
GPM = {
    "compute": {"gpm_sm_util": 90.0, "gpm_dram_bw_util": 10.0, "gpm_fp32_util": 80.0},
    "memory": {"gpm_sm_util": 90.0, "gpm_dram_bw_util": 80.0, "gpm_fp32_util": 5.0},
    "idle": {"gpm_sm_util": 0.0, "gpm_dram_bw_util": 0.0, "gpm_fp32_util": 0.0},
}
GPM_ZERO = ("gpm_sm_occupancy", "gpm_any_tensor_util", "gpm_fp64_util", "gpm_fp16_util", "gpm_int_util",
            "gpm_pcie_tx_mibs", "gpm_pcie_rx_mibs")


@pytest.fixture(scope="module")
def emp() -> ModuleType:
    if str(BENCH) not in sys.path:  # the bench scripts import each other by name
        sys.path.insert(0, str(BENCH))
    return importlib.import_module("eval_mem_power")


def _samples(rng: np.random.Generator, t0: float, n: int, kind: str | None, hbm: bool) -> pd.DataFrame:
    """n 1 Hz polls: ``kind`` None is idle; a job's NVML fields are drawn alike for both labels,
    only GPM (the truth) and the HBM power share (0.12 compute, 0.40 memory) depend on it."""
    busy = kind is not None
    power = (rng.normal(450_000, 60_000, n) if busy else np.full(n, 80_000.0)).round()
    share = {"compute": 0.12, "memory": 0.40, None: 0.5}[kind] + rng.normal(0, 0.02, n)
    temp = 40 + np.arange(n) * (0.3 if busy else 0.0) + rng.normal(0, 0.3, n)
    df = pd.DataFrame({
        "ts": t0 + np.arange(n, dtype=float),
        "util_gpu": np.clip(rng.normal(90, 5, n) if busy else np.zeros(n), 0, 100).round().astype(np.int64),
        "util_mem": np.clip(rng.normal(50, 20, n) if busy else np.zeros(n), 0, 100).round().astype(np.int64),
        "power_mw": power.astype(np.int64),
        "power_instant_mw": (power + rng.normal(0, 40_000, n)).round().astype(np.int64),
        "sm_clock_mhz": (1980 - rng.integers(0, 150, n)).astype(np.int64),
        "mem_clock_mhz": np.full(n, 3201, dtype=np.int64),
        "pstate": np.zeros(n, dtype=np.int64),
        "clock_event_reasons": np.where(rng.random(n) < 0.3, 0x4, 0).astype(np.int64),
        "temp_c": temp.round().astype(np.int64),
        "fb_used_mib": rng.normal(40_000, 10_000, 1)[0] * np.ones(n),
        "n_procs": np.full(n, 1 if busy else 0, dtype=np.int64),
        "power_mem_avg_mw": pd.array((power * share).round() if hbm else [None] * n, dtype="Int64"),
        "mem_temp_c": pd.array((temp + 5).round() if hbm else [None] * n, dtype="Int64"),
    })
    for c in GPM_ZERO:
        df[c] = 0.0
    for c, v in GPM[kind or "idle"].items():
        df[c] = v + (rng.normal(0, 2, n) if busy else 0.0)
    return df


def _recording(root: Path, seed: int = 0, null_hbm_job: bool = True) -> Path:
    """One part of FAMILIES families, JOBS_PER_LABEL compute and memory jobs each (labels in a
    random order), idle polls between jobs; ``null_hbm_job``: one more compute job whose GPU
    answered no HBM field."""
    rng = np.random.default_rng(seed)
    root.mkdir(parents=True)
    jobs = [(f"fam{f}", k, True) for f in range(FAMILIES) for k in ("compute", "memory") * JOBS_PER_LABEL]
    jobs = [jobs[i] for i in rng.permutation(len(jobs))]
    if null_hbm_job:
        jobs.append(("fam0", "compute", False))
    frames, runs, t = [], [], 1_800_000_000.0
    for i, (fam, kind, hbm) in enumerate(jobs):
        frames.append(_samples(rng, t, GAP_S, None, True))
        t += GAP_S
        frames.append(_samples(rng, t, JOB_S, kind, hbm))
        runs.append({"job": f"{fam}_{i:03d}", "label": kind, "start": t, "end": t + JOB_S - 1,
                     "family": fam, "params": json.dumps({"i": i})})
        t += JOB_S
    frames.append(_samples(rng, t, GAP_S, None, True))
    df = pd.concat(frames, ignore_index=True).assign(job="")
    df["energy_mj"] = (10_000_000 + df["power_mw"].cumsum()).astype(np.int64)  # mW x 1 s = mJ
    df.to_parquet(root / "p0_samples_1hz.parquet", index=False)
    (root / "p0_caps.json").write_text(json.dumps({
        "name": "NVIDIA H200", "uuid": "GPU-synthetic", "enforced_limit_mw": 700_000, "limit_mw": 700_000,
        "clocks_max_sm": 1980, "clocks_max_mem": 3201, "fb_total_mib": 143771.0, "gpm_supported": 1}))
    with (root / "p0_runs.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(runs[0]))
        w.writeheader()
        w.writerows(runs)
    return root


@pytest.fixture(scope="module")
def result(emp: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out: dict[str, Any] = emp.evaluate([_recording(tmp_path_factory.mktemp("mp") / "mempower")])
    return out


def test_only_the_hbm_share_separates_and_the_decision_says_carry(result: dict[str, Any]) -> None:
    n = FAMILIES * JOBS_PER_LABEL * 2
    assert result["truth_counts"] == {"idle": 0, "compute": n // 2 + 1, "memory": n // 2, "mixed": 0}
    assert result["left_out"] == {"idle": 0, "mixed": 0}
    assert result["families_evaluated"] == FAMILIES
    s = result["sets"]
    assert s["A"]["jobs"] == s["B"]["jobs"] == s["P"]["jobs"] == s["T"]["jobs"] == n
    # A sees nothing that tells the labels apart; B and P have the HBM share
    assert s["A"]["accuracy_mean"] <= 0.75
    assert s["B"]["accuracy_mean"] >= 0.9 and s["P"]["accuracy_mean"] >= 0.9
    assert s["B"]["accuracy_mean"] - s["A"]["accuracy_mean"] >= 0.2
    assert s["T"]["accuracy"] >= 0.95 and s["T"]["compute_called_memory"] == 0
    assert 0.12 < s["T"]["cut_on_all_jobs"] < 0.40
    assert s["A"]["accuracy_min"] <= s["A"]["accuracy_mean"] <= s["A"]["accuracy_max"]
    assert sum(v["jobs"] for v in s["B"]["per_family_seed0"].values()) == n
    assert set(s["T"]["per_family"]) == {f"fam{f}" for f in range(FAMILIES)}
    d = result["decision"]
    assert d["carry_into_product"] is True
    assert d["B_minus_A_mean_accuracy"] == round(s["B"]["accuracy_mean"] - s["A"]["accuracy_mean"], 4)
    json.dumps(result)  # one JSON document


def test_jobs_without_the_hbm_field_are_counted_and_refused(result: dict[str, Any]) -> None:
    f = result["hbm_field"]
    assert f["jobs_lacking_hbm_power_refused_from_B_P_T"] == 1 and len(f["jobs_lacking_hbm_power"]) == 1
    assert f["jobs_lacking_hbm_temperature_kept"] == 1
    assert result["compute_memory_jobs"] == result["jobs_evaluated"] + 1
    # A beside it on every compute/memory job, the refused one included
    assert result["A_on_all_compute_memory_jobs"]["jobs"] == result["compute_memory_jobs"]


def test_threshold_cut_is_the_middle_of_the_gap(emp: ModuleType) -> None:
    share = np.array([0.1, 0.15, 0.2, 0.5, 0.6])
    y = np.array([1, 1, 1, 0, 0])
    assert emp.fit_cut(share, y) == pytest.approx(0.35)
    fam = np.array(["a", "a", "b", "b", "c"], dtype=object)
    t = emp.threshold_lofo(share, y, fam)
    assert t["accuracy"] == 1.0 and t["per_family"]["b"]["cut"] == pytest.approx(0.375)


def test_a_recording_without_the_hbm_column_is_refused_naming_it(emp: ModuleType, tmp_path: Path) -> None:
    root = _recording(tmp_path / "old", null_hbm_job=False)
    samples = root / "p0_samples_1hz.parquet"
    pd.read_parquet(samples).drop(columns=["power_mem_avg_mw"]).to_parquet(samples, index=False)
    with pytest.raises(ValueError, match=r"p0_samples_1hz\.parquet: no column 'power_mem_avg_mw'"):
        emp.evaluate([root])


def test_posthoc_figures_follow_the_synthetic_recording(emp: ModuleType, tmp_path: Path) -> None:
    """The post-hoc script's figures over a recording where the HBM share separates the labels:
    memory-bound jobs' shares sit above every compute-bound job's."""
    posthoc = importlib.import_module("eval_mem_power_posthoc")
    out = posthoc.posthoc([_recording(tmp_path / "mempower", null_hbm_job=False)])
    spread = out["hbm_power_share_by_truth"]
    assert spread["memory"]["share_q10"] > spread["compute"]["share_q90"]
    assert out["jobs"] == sum(v["jobs"] for v in spread.values())
    assert -1.0 <= out["pearson_r_hbm_power_util_mem"] <= 1.0
    assert 0.0 <= out["r2_hbm_power_on_util_mem"] <= out["r2_hbm_power_on_util_mem_and_board_power"] <= 1.0
