"""The GPM window and job rules (docs/design.md "Labels") and the rule confidence."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from wattclass.classifier import rules
from wattclass.classifier.training import window_rule_codes
from wattclass.schema import conform

nan = np.nan


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


def test_the_engines_sql_rule_equals_window_labels_with_nulls_and_nans(tmp_path: Path) -> None:
    """Review finding: the SQL's quick path tested ``sum <= infinity``, which DuckDB decided from the
    Parquet statistics (they leave NaN out), so a window with a NaN pipe came out memory or compute
    where ``window_labels`` says PIPE_GAP or NO_GPM. Random windows with nulls and NaNs, written with
    statistics, must get the same code from both."""
    import duckdb
    import pyarrow as pa

    from wattclass.classifier.rowsql import rule_code_sql

    rng = np.random.default_rng(0)
    n = 2000
    cols = ("sm_util_pct", "dram_bw_util_pct", *rules.COMPUTE_UNITS)
    vals = {}
    for c in cols:
        v = rng.choice([5.0, 9.99, 10.0, 30.0, 50.0, 70.0, 100.0], n)
        r = rng.random(n)
        v[(r >= 0.12) & (r < 0.2)] = np.nan
        vals[c] = (v, r < 0.12)  # values, null mask
    table = pa.table({"i": pa.array(np.arange(n)),
                      **{c: pa.array(v, mask=m, type=pa.float64(), from_pandas=False)
                         for c, (v, m) in vals.items()}})
    f = tmp_path / "w.parquet"
    pq.write_table(table, f, write_statistics=True)
    want = rules.window_labels(*(np.where(vals[c][1], np.nan, vals[c][0]) for c in cols[:2]),
                               [np.where(vals[c][1], np.nan, vals[c][0]) for c in cols[2:]])
    got = duckdb.sql(f"SELECT {rule_code_sql()} AS c FROM read_parquet('{f}') ORDER BY i").df()["c"]
    assert (got.to_numpy() == want).all()
    assert {rules.PIPE_GAP, rules.NO_GPM, rules.MEMORY, rules.COMPUTE} <= set(want.tolist())
