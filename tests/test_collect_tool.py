"""tools/h200_collect: the workload table, its selection and its output format.

The tool runs on a GPU machine; here we check what can fail without one: the table (>= 64
distinct labelled workloads, listable without torch), refusal of unknown names, that the samples it
writes have exactly the schema of the stored H200 recordings, and (when torch is installed) that a
CPU smoke run writes the three files the replay backend reads.
"""

from __future__ import annotations

import csv
import importlib
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

REPO = Path(__file__).resolve().parent.parent
TOOL = REPO / "tools" / "h200_collect"
VALID = {"compute", "memory", "mixed", "low", "idle"}
# Run the tool with torch, pynvml and cupy made unimportable: listing must not need them.
NO_GPU_STACK = ("import runpy, sys; sys.modules.update(torch=None, pynvml=None, cupy=None); "
                f"sys.argv = [{str(TOOL)!r}]; runpy.run_path({str(TOOL)!r}, run_name='__main__')")


def run_tool(env: dict[str, str], *, block_gpu_stack: bool = False,
             timeout: float = 120) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, "-c", NO_GPU_STACK] if block_gpu_stack else [sys.executable, str(TOOL)]
    full = {k: v for k, v in os.environ.items()
            if k not in ("PART", "ONLY", "SMOKE", "LIST", "DEVICE", "TAG", "DUR", "PARTS", "RUN_DUR")}
    return subprocess.run(args, env={**full, **env}, capture_output=True, text=True, timeout=timeout,
                          check=False)


def table(stdout: str) -> list[list[str]]:
    return [ln.split(None, 5) for ln in stdout.splitlines() if ln.strip() and not ln.startswith("#")]


def load_tool() -> SimpleNamespace:
    """The tool's public pieces, imported from its package the way its __main__ does."""
    if str(TOOL.parent) not in sys.path:
        sys.path.insert(0, str(TOOL.parent))
    mods = [importlib.import_module(f"h200_collect.{m}")
            for m in ("config", "context", "catalog", "output", "runner")]
    return SimpleNamespace(**{k: v for m in mods for k, v in vars(m).items() if not k.startswith("__")})


def load_sweep() -> ModuleType:
    load_tool()
    return importlib.import_module("h200_collect.workloads.sweep")


def test_list_has_64_distinct_labelled_workloads_without_torch() -> None:
    p = run_tool({"LIST": "1"}, block_gpu_stack=True)
    assert p.returncode == 0, p.stderr
    rows = table(p.stdout)
    names = [r[4] for r in rows]
    assert len(names) >= 64
    assert len(set(names)) == len(names), "workload names must be unique"
    labels = [r[2] for r in rows]
    assert set(labels) <= VALID
    for lab in ("compute", "memory", "mixed", "low", "idle"):
        assert labels.count(lab) >= 2, f"too few {lab} workloads"
    # the two halves of the default split each get every kind of job
    for part in ("0", "1"):
        assert {r[2] for r in rows if r[1] == part} == VALID
        assert abs(sum(r[1] == part for r in rows) - len(rows) / 2) <= 1


def test_list_estimates_each_part_under_nine_minutes() -> None:
    p = run_tool({"LIST": "1", "DUR": "13"}, block_gpu_stack=True)
    est = [ln for ln in p.stdout.splitlines() if ln.startswith("# PART=")]
    assert len(est) == 2
    for ln in est:
        seconds = float(ln.split("estimated ")[1].split(" s")[0])
        assert seconds < 540, ln


def test_unknown_only_name_is_refused_by_name() -> None:
    p = run_tool({"ONLY": "gemm_bf16_4096,no_such_job", "DEVICE": "cpu"}, block_gpu_stack=True)
    assert p.returncode != 0
    assert "no_such_job" in p.stderr


def test_part_out_of_range_is_refused() -> None:
    p = run_tool({"LIST": "1", "PART": "2"}, block_gpu_stack=True)
    assert p.returncode != 0
    assert "PART=2" in p.stderr


def _samples_schema(h200_raw: Path) -> pa.Schema:
    """The stored recordings' columns, plus the two fields recorded since issue 13 round 13 (the
    HBM's average power and temperature: null where a GPU does not answer them)."""
    stored = pq.read_schema(h200_raw / "part1_samples_1hz.parquet").remove_metadata()
    added = pa.schema([("mem_temp_c", pa.int64()), ("power_mem_avg_mw", pa.int64())])
    return pa.schema(sorted([*stored, *added], key=lambda f: f.name))


def test_field_values_are_decoded_by_their_value_type() -> None:
    """The polls' NVML field values (the HBM's power and temperature since issue 13 round 13) are
    read from the union member their valueType names: a double or a signed int read as a 64-bit
    unsigned one would be recorded as a plausible-looking wrong integer."""
    load_tool()
    from h200_collect.sampler import _field_int

    def fv(ret: int, vtype: int, **value: float) -> SimpleNamespace:
        return SimpleNamespace(nvmlReturn=ret, valueType=vtype, value=SimpleNamespace(**value))

    assert _field_int(fv(0, 1, uiVal=41043, ullVal=41043)) == 41043
    assert _field_int(fv(0, 3, uiVal=7, ullVal=2**33 + 7)) == 2**33 + 7
    assert _field_int(fv(0, 0, dVal=196665.4, ullVal=4_686_000_000_000_000_000)) == 196665
    assert _field_int(fv(0, 0, dVal=float("nan"))) is None
    assert _field_int(fv(0, 5, siVal=-3, ullVal=2**64 - 3)) == -3
    assert _field_int(fv(3, 1, uiVal=0)) is None  # NOT_SUPPORTED
    assert _field_int(fv(0, 99, uiVal=1)) is None  # a type this tool does not know


def test_samples_schema_matches_stored_h200_recordings(h200_raw: Path, tmp_path: Path) -> None:
    tool = load_tool()
    rows = [{"ts": 1.5, "job": "startup", "power_mw": 77824, "energy_mj": 10, "util_gpu": 0,
             "nvml_basic_us": 3.0, "nvml_gpm_us": 2.0, "gpm_sm_util": 0.0},
            {"ts": 2.5, "job": "gemm_bf16_4096", "power_mw": 690000, "energy_mj": 700010,
             "power_instant_mw": None}]
    out = tmp_path / "x_samples_1hz.parquet"
    tool.write_samples(str(out), rows)
    assert pq.read_schema(out).remove_metadata() == _samples_schema(h200_raw)
    back = pq.read_table(out).to_pylist()
    assert [r["job"] for r in back] == ["startup", "gemm_bf16_4096"]
    assert back[1]["power_mw"] == 690000 and back[1]["power_instant_mw"] is None
    assert back[1]["power_mem_avg_mw"] is None and back[0]["mem_temp_c"] is None
    assert not list(tmp_path.glob("*.tmp*")), "atomic write left a temporary file"


def test_runs_csv_header_matches_stored_recordings(h200_raw: Path, tmp_path: Path) -> None:
    tool = load_tool()
    out = tmp_path / "x_runs.csv"
    tool.write_runs(str(out), [{"job": "a", "label": "compute", "start": 1.0, "end": 2.0, "steps": 3,
                                "rate": None, "unit": "-", "energy_j": 5.0, "avg_power_w": 5.0}])
    with open(h200_raw / "part1_runs.csv") as f:
        stored_header = next(csv.reader(f))
    with open(out) as f:
        rows = list(csv.reader(f))
    # the stored header, plus the job identity columns the replay backend honours, plus the
    # family and parameters of randomised sweep runs (empty for table workloads)
    assert rows[0] == [*stored_header, "job_id", "user", "family", "params"]
    assert rows[1][:3] == ["a", "compute", "1.0"]


def test_cpu_smoke_writes_the_three_files(tmp_path: Path, h200_raw: Path) -> None:
    pytest.importorskip("torch")
    only = "gemm_fp32_8192,cg_fp64_poisson3d,phase_compute_then_memory,gpt3b_decode_b1_ctx512"
    p = run_tool({"SMOKE": "1", "DEVICE": "cpu", "OUT": str(tmp_path), "ONLY": only, "TAG": "t"})
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("OK   ") == 4
    with open(tmp_path / "t_runs.csv") as f:
        runs = list(csv.DictReader(f))
    # table order, whatever the order in ONLY
    assert [(r["job"], r["label"]) for r in runs] == [
        ("gemm_fp32_8192", "compute"), ("gpt3b_decode_b1_ctx512", "memory"),
        ("cg_fp64_poisson3d", "memory"), ("phase_compute_then_memory", "mixed")]
    for r in runs:
        assert float(r["end"]) > float(r["start"]) and int(r["steps"]) >= 1
    assert pq.read_schema(tmp_path / "t_samples_1hz.parquet").remove_metadata() == _samples_schema(h200_raw)


def test_failing_workload_is_reported_and_the_rest_still_recorded(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    tool = load_tool()
    cfg = tool.Config.from_env({"SMOKE": "1", "DEVICE": "cpu", "OUT": str(tmp_path), "TAG": "f"})

    def boom(ctx: object) -> object:
        raise RuntimeError("CUDA out of memory (simulated)")
    table_ = {w.name: w for w in tool.workloads()}
    ws = [tool.Workload("boom", "compute", "x", "fails in setup", boom),
          table_["stream_copy_4GB"]]
    runner = tool.Runner(cfg, torch, None, None, None, t_start=time.time())
    assert runner.run(ws) == 1
    out = capsys.readouterr()
    assert "FAIL boom" in out.out and "simulated" in out.err
    assert "OK   stream_copy_4GB" in out.out
    with open(tmp_path / "f_runs.csv") as f:
        assert [r["job"] for r in csv.DictReader(f)] == ["stream_copy_4GB"]


def test_sweep_plan_is_reproducible_randomised_and_covers_every_family() -> None:
    sweep = load_sweep()
    a, b = sweep.plan(11, 120), sweep.plan(11, 120)
    assert [(w.name, w.params, w.dur) for w in a] == [(w.name, w.params, w.dur) for w in b]
    assert [w.params for w in sweep.plan(12, 120)] != [w.params for w in a]
    # every family of the default plan; the ridge families (weight 0) only when FAMILIES names them
    assert {w.family for w in a} == {f for f, (_, _, weight) in sweep.FAMILIES.items() if weight > 0}
    assert all(8.0 <= (w.dur or 0) <= 12.0 for w in a)
    fma = [w.params for w in a if w.family == "fma_sweep"]
    assert {p["pattern"] for p in fma} == {"stream", "strided", "gather"}
    assert {p["dtype"] for p in fma} == {"fp32", "fp64", "fp16"}
    iters = sorted(p["iters"] for p in fma)
    assert iters[0] < 8 and iters[-1] > 100, "intensity must sweep across the ridge point"
    gemm_m = sorted(w.params["m"] for w in a if w.family == "gemm_sweep")
    assert gemm_m[0] < 32 and gemm_m[-1] > 1024
    with pytest.raises(SystemExit, match="no_such_family"):
        sweep.plan(1, 3, ("fma_sweep", "no_such_family"))


def test_ridge_families_are_drawn_only_when_named_and_leave_earlier_plans_alone() -> None:
    sweep = load_sweep()
    ridge = ("gemm_ridge", "dlrm_mix", "decode_batch")
    assert all(sweep.FAMILIES[f][2] == 0.0 for f in ridge)
    assert not {w.family for w in sweep.plan(21, 200)} & set(ridge)
    named = sweep.plan(31, 60, ridge)
    assert {w.family for w in named} == set(ridge)
    assert all(16 <= w.params["m"] <= 1024 for w in named if w.family == "gemm_ridge")
    # the first runs of the recorded seed-21 session (wattclass/data/h200/sweep-heldout) are unchanged
    first = sweep.plan(21, 3)
    assert [w.family for w in first] == ["fma_sweep", "embedding", "gemm_sweep"]
    assert first[2].params == {"dtype": "fp8", "m": 519, "k": 16384, "n": 16384}


def test_sweep_list_needs_no_torch() -> None:
    p = run_tool({"LIST": "1", "SWEEP": "20", "SEED": "4"}, block_gpu_stack=True)
    assert p.returncode == 0, p.stderr
    rows = [ln.split() for ln in p.stdout.splitlines() if ln.strip()]
    assert len(rows) == 20
    assert all(r[1] in VALID for r in rows)


def test_sweep_only_reruns_named_runs_of_the_plan_at_a_forced_length() -> None:
    """Long re-runs of recorded runs (issue 13 round 9): ONLY picks runs of the sweep plan by name,
    keeping their plan index (the job id) and parameters; RUN_DUR overrides each run's own length;
    a name the plan lacks is refused by name."""
    full = run_tool({"LIST": "1", "SWEEP": "20", "SEED": "4"}, block_gpu_stack=True)
    rows = {r[3]: r for r in (ln.split(None, 5) for ln in full.stdout.splitlines() if ln.strip())}
    pick = [name for name in rows][7:9]
    p = run_tool({"LIST": "1", "SWEEP": "20", "SEED": "4", "ONLY": ",".join(reversed(pick)),
                  "RUN_DUR": "45"}, block_gpu_stack=True)
    assert p.returncode == 0, p.stderr
    got = [ln.split(None, 5) for ln in p.stdout.splitlines() if ln.strip()]
    assert [r[3] for r in got] == pick  # plan order, whatever the order in ONLY
    assert [r[0] for r in got] == ["7", "8"]
    assert all(r[4] == "45.0s" for r in got) and all(rows[r[3]][4] != "45.0s" for r in got)
    assert [r[5] for r in got] == [rows[n][5] for n in pick]
    bad = run_tool({"LIST": "1", "SWEEP": "20", "SEED": "4", "ONLY": f"{pick[0]},no_such_run"},
                   block_gpu_stack=True)
    assert bad.returncode != 0 and "no_such_run" in bad.stderr


def test_cpu_sweep_smoke_records_family_and_params(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    p = run_tool({"SWEEP": "6", "SEED": "5", "SMOKE": "1", "DEVICE": "cpu", "OUT": str(tmp_path),
                  "TAG": "s", "FAMILIES": "fma_sweep,gemm_sweep,attn_decode,dwconv,cholesky,duty_mix"})
    assert p.returncode == 0, p.stdout + p.stderr
    with open(tmp_path / "s_runs.csv") as f:
        runs = list(csv.DictReader(f))
    assert len(runs) == 6
    for r in runs:
        assert r["job"].startswith(r["family"] + "_s5_")
        params = json.loads(r["params"])
        assert params and r["label"] in VALID
    assert [int(r["job_id"]) for r in runs] == list(range(6000, 6006))


def test_long_twin_reruns_are_the_recorded_runs_at_40_s_on_both_gpus() -> None:
    """wattclass/data/h200/long-twins (issue 13 round 9) re-ran recorded runs for 40 s: each run has
    the plan's parameters of its seed and family set (fresh4's or fresh5's), lasted 40 s, and ran
    on both GPUs, so bench/eval_long_twins.py has a re-run of each; its PAIRS are those runs."""
    sweep = load_sweep()
    sys.path.insert(0, str(REPO / "bench"))
    from eval_long_twins import PAIRS

    data = REPO / "wattclass/data/h200/long-twins"
    seen: dict[str, int] = {}
    for runs_csv in sorted(data.glob("*_runs.csv")):
        with open(runs_csv) as f:
            for r in csv.DictReader(f):
                seed = int(r["job"].rsplit("_s", 1)[1].split("_")[0])
                fams = sweep.FRESH4_TEST if r["family"] in sweep.FRESH4_TEST else sweep.FRESH5_TEST
                w = {w.name: w for w in sweep.plan(seed, 60, tuple(fams))}[r["job"]]
                assert (w.family, w.params) == (r["family"], json.loads(r["params"])), r["job"]
                assert 39.5 <= float(r["end"]) - float(r["start"]) <= 41.0, r["job"]
                seen[r["job"]] = seen.get(r["job"], 0) + 1
    assert seen == {name: 2 for pair in PAIRS for name in pair}


@pytest.mark.parametrize("folder", ["latency", "fresh4", "fresh5", "fresh6", "fresh7", "fresh8", "mempower"])
def test_recorded_round4_runs_are_what_the_plan_draws(folder: str) -> None:
    """Every run of the round 4-13 recordings (wattclass/data/h200/latency, fresh4-8, mempower) is the
    plan's run of its seed: same name, family and parameters, so the data stays traceable to the
    code that made it."""
    sweep = load_sweep()
    data = Path(__file__).resolve().parent.parent / "wattclass/data/h200" / folder
    runs_files = sorted(data.glob("*_runs.csv"))
    assert runs_files
    n = 0
    for runs_csv in runs_files:
        with open(runs_csv) as f:
            runs = list(csv.DictReader(f))
        seed = int(runs[0]["job"].rsplit("_s", 1)[1].split("_")[0])
        families = tuple(sorted({r["family"] for r in runs}))
        test_families = {"fresh4": tuple(sweep.FRESH4_TEST), "fresh5": tuple(sweep.FRESH5_TEST),
                         "fresh6": tuple(sweep.FRESH6_TEST), "fresh7": tuple(sweep.FRESH7_TEST),
                         "fresh8": tuple(sweep.FRESH8_TEST), "mempower": tuple(sweep.FAMILIES)}
        plan = {w.name: w for w in sweep.plan(seed, 60, test_families.get(folder, families))}
        for r in runs:
            w = plan[r["job"]]
            assert (w.family, w.params) == (r["family"], json.loads(r["params"])), r["job"]
            n += 1
    assert n == {"latency": 82, "fresh4": 165, "fresh5": 237, "fresh6": 85, "fresh7": 86,
                 "fresh8": 83, "mempower": 85}[folder]


def test_the_round13_recording_has_the_hbm_fields_in_every_poll() -> None:
    """wattclass/data/h200/mempower (issue 13 round 13): every 1 Hz poll holds the HBM's average
    power and temperature, in plausible ranges for an H200 (its idle HBM draws about 41 W)."""
    data = REPO / "wattclass/data/h200/mempower"
    for samples in sorted(data.glob("*_samples_1hz.parquet")):
        t = pq.read_table(samples, columns=["power_mem_avg_mw", "mem_temp_c", "power_mw"]).to_pandas()
        assert len(t) > 400 and t.notna().all().all(), samples
        assert t["power_mem_avg_mw"].between(20_000, 300_000).all(), samples
        assert (t["power_mem_avg_mw"] < t["power_mw"]).all(), samples
        assert t["mem_temp_c"].between(20, 95).all(), samples


# -- checks every never-seen test module's tests share (tests/test_collect_fresh6.py, _fresh7, _fresh8) --
def check_plans_per_seed(families: tuple[str, ...], seeds: tuple[int, ...], n: int = 60) -> None:
    """Each seed's plan over ``families`` is the same every time, draws every family with valid
    intended labels and names runs ``<family>_s<seed>_``; two seeds draw different parameters."""
    sweep = load_sweep()
    for seed in seeds:
        a, b = sweep.plan(seed, n, families), sweep.plan(seed, n, families)
        assert [(w.name, w.family, w.params, w.dur) for w in a] == [
            (w.name, w.family, w.params, w.dur) for w in b]
        assert {w.family for w in a} == set(families)
        assert all(w.label in VALID for w in a)
        assert all(w.name.startswith(f"{w.family}_s{seed}_") for w in a)
    assert [w.params for w in sweep.plan(seeds[0], n, families)] != [
        w.params for w in sweep.plan(seeds[1], n, families)]


def check_new_families_leave_earlier_plans(families: tuple[str, ...], earlier: tuple[str, ...] = (),
                                          recorded: tuple[tuple[Path, tuple[str, ...], int], ...] = (),
                                          ) -> None:
    """A round's test ``families`` have weight 0 in the plan and none is among the ``earlier``
    rounds' families; the default plan never draws them and seed 21's recorded session keeps its
    first runs; and each ``recorded`` runs.csv (path, its round's families, its seed) of an earlier
    round is still its plan's runs (more than 40 of them)."""
    sweep = load_sweep()
    assert all(sweep.FAMILIES[f][2] == 0.0 for f in families)
    assert not set(families) & set(earlier)
    assert not {w.family for w in sweep.plan(21, 200)} & set(families)
    # the first runs of the recorded seed-21 session are unchanged (as the ridge-family test pins)
    assert sweep.plan(21, 3)[2].params == {"dtype": "fp8", "m": 519, "k": 16384, "n": 16384}
    for runs_csv, fams, seed in recorded:
        with open(runs_csv) as f:
            done = {r["job"]: (r["family"], json.loads(r["params"])) for r in csv.DictReader(f)}
        planned = {w.name: (w.family, w.params) for w in sweep.plan(seed, 60, fams)}
        assert len(done) > 40 and all(planned[job] == fp for job, fp in done.items()), runs_csv


def check_builds_and_steps_on_the_cpu(family: str, draws: int) -> None:
    """``draws`` draws of ``family`` (so its modes get built) build and take one step on the CPU,
    with parameters that go into runs.csv as JSON."""
    torch = pytest.importorskip("torch")
    sweep = load_sweep()
    from h200_collect.context import Ctx

    sample, factory, _ = sweep.FAMILIES[family]
    ctx = Ctx(torch, "cpu", True, 1.0)
    for k in range(draws):
        p = sample(random.Random(k))
        json.dumps(p)
        job = factory(p)(ctx)
        job.step()
        assert job.work > 0 and job.unit in ("B", "FLOP"), (family, p)


def check_cpu_collector_smoke(tmp_path: Path, families: tuple[str, ...], seed: int, n: int,
                              job_base: int) -> None:
    """The collector records a smoke run of ``n`` planned runs on the CPU: every run is its plan's
    (name, family, parameters), and job ids count up from ``job_base``."""
    pytest.importorskip("torch")
    sweep = load_sweep()
    p = run_tool({"SWEEP": str(n), "SEED": str(seed), "SMOKE": "1", "DEVICE": "cpu", "OUT": str(tmp_path),
                  "TAG": "smoke", "JOB_BASE": str(job_base), "FAMILIES": ",".join(families)}, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    with open(tmp_path / "smoke_runs.csv") as f:
        runs = list(csv.DictReader(f))
    plan = {w.name: w for w in sweep.plan(seed, n, families)}
    assert [r["job"] for r in runs] == list(plan)
    for r in runs:
        assert (r["family"], json.loads(r["params"])) == (plan[r["job"]].family, plan[r["job"]].params)
    assert [int(r["job_id"]) for r in runs] == list(range(job_base, job_base + n))


def check_device_script(tmp_path: Path, script: str, families: tuple[str, ...], name: str, seed: int,
                        job_base: int) -> None:
    """``bench/<script>`` runs the collector as its round registered it: the plan listing, then
    the recording, each with the round's families, seed, job ids, tag, gap and deadline (a stub
    ``python3`` on PATH records what it was asked; nothing runs)."""
    stub = tmp_path / "bin"
    stub.mkdir()
    calls = tmp_path / "calls.jsonl"
    (stub / "python3").write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        f"with open({str(calls)!r}, 'a') as f:\n"
        "    keys = ('FAMILIES', 'SEED', 'JOB_BASE', 'TAG', 'GAP', 'DEADLINE', 'SWEEP', 'LIST', 'OUT')\n"
        "    f.write(json.dumps({'argv': sys.argv[1:], 'cwd': os.path.basename(os.getcwd()),\n"
        "                        **{k: os.environ.get(k) for k in keys}}) + '\\n')\n")
    (stub / "python3").chmod(0o755)
    repo = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PATH": f"{stub}:{os.environ['PATH']}", "OUT": str(tmp_path / "out")}
    for k in ("SEED", "TAG", "JOB_BASE", "DEADLINE", "SWEEP", "FAMILIES"):
        env.pop(k, None)
    done = subprocess.run(["bash", str(repo / "bench" / script)], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    listing, record = [json.loads(line) for line in calls.read_text().splitlines()]
    for call in (listing, record):
        assert call["argv"] == ["-m", "h200_collect"] and call["cwd"] == "tools"
        assert call["FAMILIES"] == ",".join(families) and call["SEED"] == str(seed)
        assert call["SWEEP"] == "60"
    assert listing["LIST"] == "1"
    assert (record["TAG"], record["JOB_BASE"], record["GAP"], record["DEADLINE"]) == (
        f"{name}_gpu0", str(job_base), "1.5", "515")
    assert record["OUT"] == str(tmp_path / "out") and (tmp_path / "out" / f"{name}_gpu0_plan.txt").exists()
