"""tools/h200_collect/workloads/fresh8.py: round 12's never-seen test families (framework workloads).

The lead records them on the H200; here we check what can fail without a GPU: the plan of a seed is
the same every time (so the recording stays traceable to the code), the families are drawn only
when named (earlier seeds' plans are untouched), their draws span both sides of the ridge, and
every family builds and runs on the CPU path with small sizes (in its drawn dtype: the CPU runs
bf16 and fp16 too), alone and through the collector.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.test_collect_tool import (
    check_builds_and_steps_on_the_cpu,
    check_cpu_collector_smoke,
    check_device_script,
    check_new_families_leave_earlier_plans,
    check_plans_per_seed,
    load_sweep,
)

SEEDS = (81, 82)  # the seeds the lead records
FRESH7_DATA = Path(__file__).resolve().parents[1] / "wattclass" / "data" / "h200" / "fresh7"
FAMILIES = ["lora_finetune", "lattice_boltzmann", "pointnet_fps", "pinn_train", "sparse_conv3d",
            "rl_rollout", "particle_filter", "qat_finetune"]


def fresh8() -> tuple[str, ...]:
    return tuple(load_sweep().FRESH8_TEST)


def test_plan_is_deterministic_per_seed_and_draws_every_family() -> None:
    assert list(fresh8()) == FAMILIES
    check_plans_per_seed(fresh8(), SEEDS)


def test_families_are_new_weight_zero_and_leave_earlier_plans_alone() -> None:
    sweep = load_sweep()
    earlier = (sweep.FRESH_TEST | sweep.FRESH3_TEST | sweep.FRESH4_TEST | sweep.FRESH5_TEST
               | sweep.FRESH6_TEST | sweep.FRESH7_TEST | sweep.LATENCY_TRAIN)
    # and round 11's recorded runs (seeds 71 and 72, its eight families) are still their plans' runs
    f7 = tuple(sweep.FRESH7_TEST)
    check_new_families_leave_earlier_plans(fresh8(), tuple(earlier), (
        (FRESH7_DATA / "fresh7_gpu0_runs.csv", f7, 71), (FRESH7_DATA / "fresh7_gpu0b_runs.csv", f7, 72)))


def test_draws_span_both_sides_of_the_ridge() -> None:
    sweep = load_sweep()
    runs = [w for seed in SEEDS for w in sweep.plan(seed, 60, fresh8())]
    intended = {(w.family, w.label) for w in runs}
    for fam in ("lora_finetune", "pinn_train", "sparse_conv3d", "rl_rollout", "qat_finetune",
                "lattice_boltzmann"):
        assert {(fam, "compute"), (fam, "memory")} <= intended, fam

    def drawn(fam: str, key: str) -> set[object]:
        return {w.params[key] for w in runs if w.family == fam}
    assert drawn("lora_finetune", "mode") == {"train", "serve"}
    assert drawn("lora_finetune", "dtype") == drawn("qat_finetune", "dtype") == {"bf16", "fp16", "fp32"}
    assert drawn("pointnet_fps", "mode") == {"fps", "sa_infer", "sa_train"}
    assert drawn("lattice_boltzmann", "lattice") == {"D2Q9", "D3Q19"}
    assert drawn("lattice_boltzmann", "collision") == {"bgk", "mrt"}
    assert drawn("pinn_train", "order") == {1, 2}
    assert drawn("sparse_conv3d", "mode") == {"train", "infer"}
    assert drawn("rl_rollout", "mode") == {"rollout", "ppo"}
    assert drawn("particle_filter", "model") == {"linear", "growth", "volatility"}


def test_the_first_forty_runs_of_each_seed_hold_every_family() -> None:
    """About 40 of the 60 fit in one device call (DEADLINE=515): each call records all eight."""
    sweep = load_sweep()
    for seed in SEEDS:
        assert {w.family for w in sweep.plan(seed, 40, fresh8())} == set(FAMILIES), seed


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_builds_and_steps_on_the_cpu(family: str) -> None:
    check_builds_and_steps_on_the_cpu(family, draws=12)  # several draws: modes, dtypes, orders


def test_the_cpu_draws_cover_every_mode() -> None:
    """The twelve draws the CPU test builds reach every mode of every family (and fp16 and bf16)."""
    sweep = load_sweep()
    for fam in FAMILIES:
        sample = sweep.FAMILIES[fam][0]
        draws = [sample(random.Random(k)) for k in range(12)]
        for key in ("mode", "dtype", "model", "order", "lattice", "collision", "occupancy", "resample"):
            if key in draws[0]:
                every = {w.params[key] for seed in SEEDS for w in sweep.plan(seed, 60, (fam,))}
                assert {p[key] for p in draws} == every, (fam, key)


def test_cpu_collector_smoke_records_the_eight_families(tmp_path: Path) -> None:
    check_cpu_collector_smoke(tmp_path, fresh8(), seed=82, n=16, job_base=81000)
    assert {w.family for w in load_sweep().plan(82, 16, fresh8())} == set(fresh8())


def test_device_script_and_preregistration_name_the_eight_families(tmp_path: Path) -> None:
    """The recording command (script and registered text) records exactly FRESH8_TEST, seed 81."""
    root = Path(__file__).resolve().parents[1]
    check_device_script(tmp_path, "device_fresh8.sh", tuple(FAMILIES), "fresh8", 81, 80000)
    prereg = (root / "docs" / "measurements" / "issue13-preregistration-round12-2026-12-01.md").read_text()
    assert f"F={','.join(FAMILIES)}\n" in prereg
    assert "SEED=81 TAG=fresh8_gpu0 JOB_BASE=80000 FAMILIES=$F GAP=1.5 DEADLINE=515 timeout 560" in prereg
