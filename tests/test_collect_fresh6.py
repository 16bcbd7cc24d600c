"""tools/h200_collect/workloads/fresh6.py: round 8's never-seen test families.

The lead records them on the H200; here we check what can fail without a GPU: the plan of a seed is
the same every time (so the recording stays traceable to the code), the families are drawn only
when named (earlier seeds' plans are untouched), their draws span both sides of the ridge, and
every family builds and runs on the CPU path with small sizes, alone and through the collector.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_collect_tool import (
    check_builds_and_steps_on_the_cpu,
    check_cpu_collector_smoke,
    check_new_families_leave_earlier_plans,
    check_plans_per_seed,
    load_sweep,
)

SEEDS = (61, 62)  # the seeds the lead records


def fresh6() -> tuple[str, ...]:
    return tuple(load_sweep().FRESH6_TEST)


def test_plan_is_deterministic_per_seed_and_draws_every_family() -> None:
    assert len(fresh6()) == 8
    check_plans_per_seed(fresh6(), SEEDS)


def test_families_are_weight_zero_and_leave_earlier_plans_alone() -> None:
    check_new_families_leave_earlier_plans(fresh6())


def test_draws_span_both_sides_of_the_ridge() -> None:
    sweep = load_sweep()
    runs = [w for seed in SEEDS for w in sweep.plan(seed, 60, fresh6())]
    intended = {(w.family, w.label) for w in runs}
    for fam in ("int_hash", "hamming_search", "divergent_iter", "cuda_graph", "per_sample_grad"):
        assert {(fam, "compute"), (fam, "memory")} <= intended, fam
    queries = sorted(w.params["queries"] for w in runs if w.family == "hamming_search")
    assert queries[0] < 8 < 100 < queries[-1]
    compact_ops = {w.params["op"] for w in runs if w.family == "stream_compact"}
    assert len(compact_ops) >= 4


@pytest.mark.parametrize("family", ["stream_compact", "int_hash", "hamming_search", "ctc_loss",
                                    "divergent_iter", "cuda_graph", "per_sample_grad", "hash_encoding"])
def test_every_family_builds_and_steps_on_the_cpu(family: str) -> None:
    check_builds_and_steps_on_the_cpu(family, draws=6)  # several draws: ops, train/infer, dtypes


def test_cpu_collector_smoke_records_the_eight_families(tmp_path: Path) -> None:
    check_cpu_collector_smoke(tmp_path, fresh6(), seed=61, n=12, job_base=60000)
