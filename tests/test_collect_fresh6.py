"""tools/h200_collect/workloads/fresh6.py: round 8's never-seen test families.

The lead records them on the H200; here we check what can fail without a GPU: the plan of a seed is
the same every time (so the recording stays traceable to the code), the families are drawn only
when named (earlier seeds' plans are untouched), their draws span both sides of the ridge, and
every family builds and runs on the CPU path with small sizes, alone and through the collector.
"""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import pytest

from tests.test_collect_tool import VALID, load_sweep, run_tool

SEEDS = (61, 62)  # the seeds the lead records


def fresh6() -> tuple[str, ...]:
    return tuple(load_sweep().FRESH6_TEST)


def test_plan_is_deterministic_per_seed_and_draws_every_family() -> None:
    sweep = load_sweep()
    fams = fresh6()
    assert len(fams) == 8
    for seed in SEEDS:
        a, b = sweep.plan(seed, 60, fams), sweep.plan(seed, 60, fams)
        assert [(w.name, w.family, w.params, w.dur) for w in a] == [
            (w.name, w.family, w.params, w.dur) for w in b]
        assert {w.family for w in a} == set(fams)
        assert all(w.label in VALID for w in a)
        assert all(w.name.startswith(f"{w.family}_s{seed}_") for w in a)
    assert [w.params for w in sweep.plan(61, 60, fams)] != [w.params for w in sweep.plan(62, 60, fams)]


def test_families_are_weight_zero_and_leave_earlier_plans_alone() -> None:
    sweep = load_sweep()
    assert all(sweep.FAMILIES[f][2] == 0.0 for f in fresh6())
    assert not {w.family for w in sweep.plan(21, 200)} & set(fresh6())
    # the first runs of the recorded seed-21 session are unchanged (as the ridge-family test pins)
    assert sweep.plan(21, 3)[2].params == {"dtype": "fp8", "m": 519, "k": 16384, "n": 16384}


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
    torch = pytest.importorskip("torch")
    sweep = load_sweep()
    from h200_collect.context import Ctx

    sample, factory, _ = sweep.FAMILIES[family]
    ctx = Ctx(torch, "cpu", True, 1.0)
    for k in range(6):  # several draws, so each family's modes (ops, train/infer, dtypes) get built
        p = sample(random.Random(k))
        json.dumps(p)  # params go into runs.csv as JSON
        job = factory(p)(ctx)
        job.step()
        assert job.work > 0 and job.unit in ("B", "FLOP"), (family, p)


def test_cpu_collector_smoke_records_the_eight_families(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    sweep = load_sweep()
    fams = fresh6()
    p = run_tool({"SWEEP": "12", "SEED": "61", "SMOKE": "1", "DEVICE": "cpu", "OUT": str(tmp_path),
                  "TAG": "f6", "JOB_BASE": "60000", "FAMILIES": ",".join(fams)}, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    with open(tmp_path / "f6_runs.csv") as f:
        runs = list(csv.DictReader(f))
    plan = {w.name: w for w in sweep.plan(61, 12, fams)}
    assert [r["job"] for r in runs] == list(plan)
    for r in runs:
        assert (r["family"], json.loads(r["params"])) == (plan[r["job"]].family, plan[r["job"]].params)
    assert [int(r["job_id"]) for r in runs] == list(range(60000, 60012))
