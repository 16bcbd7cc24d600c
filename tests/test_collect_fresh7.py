"""tools/h200_collect/workloads/fresh7.py: round 11's never-seen test families.

The lead records them on the H200; here we check what can fail without a GPU: the plan of a seed is
the same every time (so the recording stays traceable to the code), the families are drawn only
when named (earlier seeds' plans are untouched), their draws span both sides of the ridge, and
every family builds and runs on the CPU path with small sizes, alone and through the collector.
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

SEEDS = (71, 72)  # the seeds the lead records
FRESH6_DATA = Path(__file__).resolve().parents[1] / "wattclass" / "data" / "h200" / "fresh6"
FAMILIES = ["ntt_modmul", "ising_metropolis", "md_neighbor", "hash_join", "tree_ensemble", "dfa_scan",
            "concurrent_streams", "spgemm"]


def fresh7() -> tuple[str, ...]:
    return tuple(load_sweep().FRESH7_TEST)


def test_plan_is_deterministic_per_seed_and_draws_every_family() -> None:
    assert list(fresh7()) == FAMILIES
    check_plans_per_seed(fresh7(), SEEDS)


def test_families_are_new_weight_zero_and_leave_earlier_plans_alone() -> None:
    sweep = load_sweep()
    earlier = (sweep.FRESH_TEST | sweep.FRESH3_TEST | sweep.FRESH4_TEST | sweep.FRESH5_TEST
               | sweep.FRESH6_TEST | sweep.LATENCY_TRAIN)
    # and round 8's recorded runs (seeds 61 and 62, its eight families) are still their plans' runs
    f6 = tuple(sweep.FRESH6_TEST)
    check_new_families_leave_earlier_plans(fresh7(), tuple(earlier), (
        (FRESH6_DATA / "fresh6_gpu0_runs.csv", f6, 61), (FRESH6_DATA / "fresh6_gpu1_runs.csv", f6, 62)))


def test_draws_span_both_sides_of_the_ridge() -> None:
    sweep = load_sweep()
    runs = [w for seed in SEEDS for w in sweep.plan(seed, 60, fresh7())]
    intended = {(w.family, w.label) for w in runs}
    for fam in ("ntt_modmul", "md_neighbor", "hash_join", "dfa_scan", "concurrent_streams"):
        assert {(fam, "compute"), (fam, "memory")} <= intended, fam
    orders = {w.params["order"] for w in runs if w.family == "md_neighbor"}
    assert orders == {"sorted", "shuffled", "stencil"}
    states = sorted(w.params["states"] for w in runs if w.family == "dfa_scan")
    assert states[0] <= 128 < 16384 <= states[-1]  # the table from L1 to HBM
    ops = {w.params["op"] for w in runs if w.family == "hash_join"}
    assert ops == {"probe", "build", "groupby"}


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_builds_and_steps_on_the_cpu(family: str) -> None:
    check_builds_and_steps_on_the_cpu(family, draws=8)  # several draws: ops, orders, dtypes


def test_ntt_is_a_number_theoretic_transform() -> None:
    """The butterflies are a real NTT: on a bit-reversed input they give sum_j x_j w^(jk) mod q."""
    torch = pytest.importorskip("torch")
    load_sweep()
    from h200_collect.workloads.fresh7 import NTT_G, NTT_Q

    q, n = NTT_Q, 16
    assert pow(NTT_G, (q - 1) // 2, q) == q - 1  # a non-residue, so its powers give roots of every 2^k
    w = pow(NTT_G, (q - 1) // n, q)
    x = [random.Random(3).randrange(q) for _ in range(n)]
    want = [sum(x[j] * pow(w, j * k, q) for j in range(n)) % q for k in range(n)]
    rev = [int(format(i, "04b")[::-1], 2) for i in range(n)]
    v = torch.tensor([x[r] for r in rev], dtype=torch.int64).view(1, n)
    for s in range(4):  # the stage loop of b_ntt, on one limb
        h = 1 << s
        wh = pow(NTT_G, (q - 1) // (2 * h), q)
        tw = torch.tensor([pow(wh, j, q) for j in range(h)], dtype=torch.int64)
        y = v.view(1, n // (2 * h), 2, h)
        a, b = y[:, :, 0], (y[:, :, 1] * tw) % q
        v = torch.stack([(a + b) % q, (a - b + q) % q], 2).view(1, n)
    assert v.view(-1).tolist() == want


def test_spgemm_matrices_hold_the_csr_invariants() -> None:
    """cuSPARSE needs sorted, distinct column indices per row; torch's CSR validator checks them here."""
    torch = pytest.importorskip("torch")
    load_sweep()
    from h200_collect.workloads.fresh7 import spgemm_csr

    for structure in ("random", "banded"):
        for k in (2, 8, 32):
            A = spgemm_csr(torch, 1024, k, structure, torch.float32, "cpu", 1)
            crow, col = A.crow_indices(), A.col_indices()
            torch._validate_sparse_csr_tensor_args(crow, col, A.values(), A.shape)  # raises if broken
            rows = col.view(1024, k)
            assert bool((rows[:, 1:] > rows[:, :-1]).all()), (structure, k)
            assert crow.dtype == col.dtype == torch.int32


def test_cpu_collector_smoke_records_the_eight_families(tmp_path: Path) -> None:
    check_cpu_collector_smoke(tmp_path, fresh7(), seed=71, n=14, job_base=70000)
    assert {w.family for w in load_sweep().plan(71, 14, fresh7())} == set(fresh7())


def test_device_script_and_preregistration_name_the_eight_families(tmp_path: Path) -> None:
    """The recording command (script and registered text) records exactly FRESH7_TEST, seed 71."""
    root = Path(__file__).resolve().parents[1]
    check_device_script(tmp_path, "device_fresh7.sh", tuple(FAMILIES), "fresh7", 71, 70000)
    prereg = (root / "docs" / "measurements" / "issue13-preregistration-round11-2026-12-01.md").read_text()
    assert f"F={','.join(FAMILIES)}\n" in prereg
    assert "SEED=71 TAG=fresh7_gpu0 JOB_BASE=70000 FAMILIES=$F GAP=1.5 DEADLINE=515 timeout 560" in prereg
