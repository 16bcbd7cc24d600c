"""Window features and mergeable per-job partial aggregates."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from wattclass.classifier import features as F
from wattclass.schema import conform


def _real(path: Path) -> pa.Table:
    return conform(pq.read_table(path))


def test_partials_merge_equals_one_pass(h200_telemetry: Path) -> None:
    t = _real(h200_telemetry)
    whole = F.finalize(F.batch_partials(t, F.window_features(t)))
    parts = []
    for start in range(0, t.num_rows, 13):  # splits cut through jobs
        s = t.slice(start, 13)
        parts.append(F.batch_partials(s, F.window_features(s)))
    merged = F.merge_partials(parts[::-1])
    assert merged is not None
    split = F.finalize(merged)
    assert list(split["job_id"]) == list(whole["job_id"])
    num = whole.select_dtypes("number").columns
    assert np.allclose(split[num].to_numpy(float), whole[num].to_numpy(float), equal_nan=True)


def test_job_aggregates_match_direct_computation(h200_telemetry: Path) -> None:
    t = _real(h200_telemetry)
    jobs = F.finalize(F.batch_partials(t, F.window_features(t))).set_index("job_id")
    df = t.to_pandas()
    df = df[df.job_id.notna()]
    dur = (df.ts_end - df.ts_start).dt.total_seconds()
    assert len(jobs) == 21
    assert np.allclose(jobs["energy_j"], df.groupby("job_id").energy_j.sum().loc[jobs.index])
    assert np.allclose(jobs["gpu_hours"], dur.groupby(df.job_id).sum().loc[jobs.index] / 3600)
    pf = df.power_avg_w / df.power_limit_w
    wmean = (pf * dur).groupby(df.job_id).sum() / dur.groupby(df.job_id).sum()
    assert np.allclose(jobs["power_frac_mean"], wmean.loc[jobs.index])
    assert np.allclose(jobs["power_frac_max"], pf.groupby(df.job_id).max().loc[jobs.index])
    assert (jobs["hosts"] == "gpu-h200-03").all()


def test_nan_in_optional_columns_is_fine(h200_telemetry: Path) -> None:
    t = _real(h200_telemetry)
    i = t.schema.get_field_index("util_mem_pct")
    t = t.set_column(i, "util_mem_pct", pa.nulls(t.num_rows, pa.float32()))
    feats = F.window_features(t)
    assert np.isnan(feats["util_mem_pct"]).all()
    jobs = F.finalize(F.batch_partials(t, feats))
    assert jobs["util_mem_pct_mean"].isna().all()
    assert jobs["power_frac_mean"].notna().all()
