"""The GPM window and job rules (docs/design.md "Labels") and the rule confidence."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from wattclass.classifier import rules
from wattclass.classifier.training import window_rule_codes
from wattclass.schema import conform

nan = np.nan
inf = np.inf


def test_window_rule_thresholds_and_ties() -> None:
    sm = [9.99, 10.0, 50, 50, 50, 50]
    dram = [0, 6, 40, 40, 40.0001, 60]
    tensor = [90, 5, 40, 10, 40, 10]
    fp64 = [0, 0, 0, 41, 0, 20]
    got = rules.window_labels(sm, dram, [tensor, fp64, [0] * 6, [0] * 6])
    # below 10% SM is idle whatever the pipes; a tie goes to compute; the busiest pipe counts
    want = [rules.IDLE, rules.MEMORY, rules.COMPUTE, rules.COMPUTE, rules.MEMORY, rules.MEMORY]
    assert got.tolist() == want


def test_window_rule_missing_gpm() -> None:
    got = rules.window_labels([nan, 50, 50, 50], [10, nan, 10, 10],
                              [[90, 90, nan, nan], [nan, nan, nan, 30]])
    # no sm_util, no dram, no pipe at all -> no GPM; one pipe missing among present ones is fine
    assert got.tolist() == [rules.NO_GPM, rules.NO_GPM, rules.NO_GPM, rules.COMPUTE]


def test_job_rule_thresholds() -> None:
    # (idle, compute, memory) counts -> label
    cases = {
        (5, 5, 0): "compute",  # exactly half active is not idle
        (6, 4, 0): "idle",  # under half active
        (0, 7, 3): "compute",  # exactly 70% compute
        (0, 69, 31): "mixed",
        (0, 3, 7): "memory",  # exactly 30% compute
        (0, 31, 69): "mixed",
        (0, 0, 0): "idle",  # no windows
        (1, 0, 10): "memory",
    }
    arr = np.array(list(cases))
    got = rules.label_names(rules.job_labels(arr[:, 0], arr[:, 1], arr[:, 2]))
    assert got.tolist() == list(cases.values())


def test_confidence_grows_with_evidence_and_falls_near_thresholds() -> None:
    n_i, n_c, n_m = np.array([0, 0, 0, 0]), np.array([3, 30, 3, 8]), np.array([0, 0, 1, 2])
    lab = rules.job_labels(n_i, n_c, n_m)
    conf = rules.job_confidence(n_i, n_c, n_m, lab)
    assert (lab[:2] == rules.J_COMPUTE).all()
    assert conf[1] > conf[0] > 0.8  # 30 unanimous windows beat 3
    assert conf[1] > 0.999
    assert conf[2] < 0.6  # 3 of 4 compute is barely over 70%
    assert ((conf >= 0) & (conf <= 1)).all()
    # soft counts give the same answer as the equal hard counts
    assert np.allclose(rules.job_confidence([0.0], [3.0], [0.0], [rules.J_COMPUTE]), conf[0])


def test_rule_reproduces_reference_truth_on_real_h200(h200_telemetry: Path) -> None:
    t = conform(pq.read_table(h200_telemetry))
    codes = window_rule_codes(t)
    wt = pd.read_csv(h200_telemetry.parent / "window_truth.csv", dtype={"job_id": str}).dropna()
    got = np.asarray(rules.WINDOW_CLASSES, dtype=object)[codes]
    frame = pd.DataFrame({"job_id": t.column("job_id").to_pylist(), "label": got,
                          "ts": pd.to_datetime(t.column("ts_start").to_pylist(), utc=True)}).dropna()
    wt["ts"] = pd.to_datetime(wt["ts_start"], utc=True)
    m = frame.merge(wt, on=["job_id", "ts"])
    assert len(m) == len(wt) == 74  # every job window (3 windows between jobs have no job)
    assert (m["label"] == m["window_label"]).all()


def test_missing_pipe_never_makes_a_window_memory_bound() -> None:
    """dcgm-exporter's default counters: tensor only, no FP64/FP32/FP16. An FP64 job (tensor idle,
    DRAM moderately busy) must not come out memory-bound; a busy measured pipe still says compute."""
    nan = np.nan
    codes = rules.window_labels(
        [80, 80, 5, 80],  # sm
        [30, 30, 30, 30],  # dram
        [[2, 90, 2, 2], [nan, nan, nan, 1], [nan, nan, nan, 1], [nan, nan, nan, 1]],  # tensor, fp64/32/16
    )
    assert codes.tolist() == [rules.PIPE_GAP, rules.COMPUTE, rules.IDLE, rules.MEMORY]


def test_jobs_with_pipe_gaps_go_to_the_model_and_say_why(h200_telemetry: Path, tmp_path: Path) -> None:
    import pyarrow as pa

    from wattclass.classifier.engine import label_files_local
    from wattclass.classifier.model import load_model

    t = pq.read_table(h200_telemetry)
    for c in ("fp64_util_pct", "fp32_util_pct", "fp16_util_pct"):
        t = t.set_column(t.schema.get_field_index(c), c, pa.nulls(t.num_rows, pa.float32()))
    f = tmp_path / "no-fp-pipes.parquet"
    pq.write_table(conform(t), f)
    full = label_files_local([h200_telemetry], None).labels.set_index("job_id")
    model = load_model(Path(rules.__file__).parent / "models")
    got = label_files_local([f], model).labels.set_index("job_id")
    gap = got[got["inputs"].str.contains("rule withheld", na=False)]
    # Every job the full pipes call memory-bound loses its rule label and is labelled by the model.
    mem_jobs = full.index[full["label"] == "memory"]
    assert len(mem_jobs) > 0 and set(mem_jobs) <= set(gap.index)
    assert (gap["source"] != "rule").all() and gap["source"].str.startswith("model").all()
    assert (full["inputs"].str.startswith("gpm")).all()


#: Crafted windows (sm, dram, tensor, fp64, fp32, fp16, int), code; None = null, nan = NaN.
_EDGE_WINDOWS: list[tuple[tuple[float | None, ...], int]] = [
    ((50, 40, 10, 10, 10, 10, 82), rules.COMPUTE),  # the integer pipe alone beats DRAM
    ((50, 40, 0, 0, 0, 0, 40), rules.COMPUTE),  # ... or ties it
    ((50, 40.5, 0, 0, 0, 0, 40), rules.MEMORY),  # ... or falls just short, every pipe measured
    ((50, 40, 1, 1, 1, 1, nan), rules.PIPE_GAP),  # int NaN: memory would need it
    ((50, 40, 1, 1, 1, 1, None), rules.PIPE_GAP),  # int null
    ((50, 40, 1, nan, 1, 1, 60), rules.COMPUTE),  # fp64 NaN, but a measured pipe beats DRAM
    ((50, 40, 1, None, None, None, 39), rules.PIPE_GAP),  # dcgm-exporter's default counters
    ((9.99, 40, 1, nan, 1, 1, 1), rules.IDLE),  # idle needs no pipe
    ((10, 40, 1, 1, 1, 1, 1), rules.MEMORY),  # exactly 10% SM is active
    ((50, 40, nan, None, nan, None, nan), rules.NO_GPM),  # no pipe at all
    ((nan, 40, 90, 1, 1, 1, 1), rules.NO_GPM),
    ((50, None, 90, 1, 1, 1, 1), rules.NO_GPM),
    ((50, inf, 1, 1, 1, 1, inf), rules.COMPUTE),
    ((-inf, 40, 1, 1, 1, 1, 1), rules.IDLE),
    ((50, -inf, inf, 1, 1, 1, 1), rules.COMPUTE),  # infinities of both signs: the sum is NaN
]


@pytest.mark.parametrize("int_column", [True, False], ids=["all-pipes", "files-without-int-pipe"])
def test_the_three_sql_rules_equal_window_labels(tmp_path: Path, int_column: bool) -> None:
    """The GPM rule runs as SQL in the nightly scan (``rowsql.rule_code_sql``), ``wattclass report``
    (report/data.py) and ``wattclass simulate`` (savings/simulate.py); all three must give every
    window ``rules.window_labels``' code. Crafted edge windows (the integer pipe, PIPE_GAP, NaN,
    null, thresholds, infinities) and random windows with nulls and NaNs, written with Parquet
    statistics; each window is its own job, so the report's and simulate's per-job counts show
    the window's code. Once more with files lacking the int_util_pct column (older writers).

    Review finding kept from the engine's test: the SQL's quick path tested ``sum <= infinity``,
    which DuckDB decided from the Parquet statistics (they leave NaN out), so a window with a NaN
    pipe came out memory or compute where ``window_labels`` says PIPE_GAP or NO_GPM."""
    import duckdb

    from wattclass.classifier.rowsql import rule_code_sql
    from wattclass.report import data as report_data
    from wattclass.savings.simulate import scan_jobs

    cols = rules.RULE_COLUMNS
    assert cols == ("sm_util_pct", "dram_bw_util_pct", "tensor_util_pct", "fp64_util_pct", "fp32_util_pct",
                    "fp16_util_pct", "int_util_pct")  # the order of _EDGE_WINDOWS' tuples
    rng = np.random.default_rng(0)
    n_rand = 2000
    vals, nulls = {}, {}
    for k, c in enumerate(cols):
        v = rng.choice([5.0, 9.99, 10.0, 30.0, 50.0, 70.0, 100.0], n_rand)
        r = rng.random(n_rand)
        v[(r >= 0.12) & (r < 0.2)] = np.nan
        edge = [w[k] for w, _ in _EDGE_WINDOWS]
        vals[c] = np.concatenate([[nan if x is None else x for x in edge], v]).astype(np.float32)
        nulls[c] = np.concatenate([[x is None for x in edge], r < 0.12])
    n = len(vals["sm_util_pct"])
    t0 = pd.Timestamp("2026-11-28T00:00:00Z")
    table = conform(pa.table({
        "ts_start": pa.array(t0 + pd.to_timedelta(np.arange(n) * 10, unit="s")),
        "ts_end": pa.array(t0 + pd.to_timedelta(np.arange(n) * 10 + 10, unit="s")),
        "host": ["h1"] * n, "gpu_index": pa.array(np.zeros(n, np.int16)), "gpu_uuid": ["GPU-1"] * n,
        "gpu_model": ["NVIDIA H200"] * n, "job_id": [str(i) for i in range(n)], "user": ["u"] * n,
        "energy_j": np.full(n, 3000.0), "power_avg_w": np.full(n, 300.0), "power_max_w": np.full(n, 320.0),
        "power_limit_w": np.full(n, 700.0),
        **{c: pa.array(vals[c], mask=nulls[c], from_pandas=False) for c in cols}}))
    if not int_column:
        table = table.drop_columns(["int_util_pct"])
    part = tmp_path / "telemetry" / "date=2026-11-28" / "host=h1"
    part.mkdir(parents=True)
    f = part / "w.parquet"
    pq.write_table(table, f, write_statistics=True)
    rule_vals = {c: np.where(nulls[c], np.nan, vals[c]).astype(np.float64) for c in cols}
    if not int_column:
        rule_vals["int_util_pct"] = np.full(n, np.nan)
    want = rules.window_labels(rule_vals["sm_util_pct"], rule_vals["dram_bw_util_pct"],
                               [rule_vals[c] for c in rules.COMPUTE_UNITS])
    if int_column:
        assert want[:len(_EDGE_WINDOWS)].tolist() == [code for _, code in _EDGE_WINDOWS]
        assert {rules.IDLE, rules.COMPUTE, rules.MEMORY, rules.PIPE_GAP, rules.NO_GPM} <= set(want.tolist())
    else:  # no window is memory-bound: the rule cannot see the integer pipe
        assert set(want.tolist()) == {rules.IDLE, rules.COMPUTE, rules.PIPE_GAP, rules.NO_GPM}

    # the nightly scan's expression
    dropped = frozenset() if int_column else frozenset({"int_util_pct"})
    engine = duckdb.sql(f"SELECT {rule_code_sql(dropped)} AS c FROM read_parquet('{f}') ORDER BY ts_start")
    assert engine.df()["c"].tolist() == want.tolist()

    # wattclass simulate: one job per window, so its counts name the window's code
    sim = scan_jobs(tmp_path).set_index("job_id").loc[[str(i) for i in range(n)]]
    assert (sim[["n_idle", "n_comp", "n_mem", "n_gap"]].sum(axis=1) <= 1).all()
    got = np.select([sim["n_idle"] == 1, sim["n_comp"] == 1, sim["n_mem"] == 1, sim["n_gap"] == 1],
                    [rules.IDLE, rules.COMPUTE, rules.MEMORY, rules.PIPE_GAP], default=rules.NO_GPM)
    assert got.tolist() == want.tolist()
    # its busiest pipe (the response model's compute activity) is the rule's, over windows with GPM
    gpm = want >= 0
    busiest = np.fmax.reduce(np.stack([rule_vals[c] for c in rules.COMPUTE_UNITS]), axis=0)
    assert np.array_equal(sim["compute_act"].to_numpy(float)[gpm], busiest[gpm] / 100.0)
    assert sim["compute_act"].isna().to_numpy()[~gpm].all()

    # wattclass report without a label store: the rule labels a job whose every window it calls
    rep = report_data.load(files=[f]).jobs.set_index("job_id").loc[[str(i) for i in range(n)]]
    names = {rules.IDLE: "idle", rules.COMPUTE: "compute", rules.MEMORY: "memory",
             rules.PIPE_GAP: "unlabelled", rules.NO_GPM: "unlabelled"}
    assert rep["label"].tolist() == [names[c] for c in want.tolist()]
