"""The synthetic demo cluster: built from the real H200 recording, deterministic, replayable."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from wattclass.demo.cluster import ClusterSpec, build_cluster, load_recording
from wattclass.errors import ConfigError, DataError
from wattclass.report.estimates import rule_job_labels
from wattclass.slurm.client import JobsFileClient

SMALL = ClusterSpec(nodes=2, gpus_per_node=2, span_s=1800, job_min_s=60, job_max_s=300, seed=3)
GPM_V1 = {
    "gpm_sm_util": "sm_util_pct",
    "gpm_any_tensor_util": "tensor_util_pct",
    "gpm_dram_bw_util": "dram_bw_util_pct",
    "gpm_fp64_util": "fp64_util_pct",
    "gpm_fp32_util": "fp32_util_pct",
    "gpm_fp16_util": "fp16_util_pct",
    "gpm_int_util": "int_util_pct",
}


@pytest.fixture(scope="module")
def default_cluster(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from wattclass.demo.cluster import bundled_raw_dir

    out = tmp_path_factory.mktemp("cluster")
    build_cluster(bundled_raw_dir(), out)
    return out


def _parts(root: Path) -> list[Path]:
    return sorted((root / "nodes").glob("*/*_caps.json"))


def test_default_cluster_has_the_promised_shape(default_cluster: Path) -> None:
    man = json.loads((default_cluster / "manifest.json").read_text())
    assert len(man["hosts"]) == 4 and man["n_gpus"] == 16
    assert 200 <= man["n_jobs"] <= 400
    assert man["n_samples"] == 16 * 7200 <= 200_000
    jobs = pd.read_csv(default_cluster / "jobs.csv", dtype={"job_id": str})
    assert list(jobs.columns) == ["job_id", "name", "user", "account", "partition", "start", "end"]
    assert len(jobs) == man["n_jobs"] and jobs["job_id"].is_unique
    assert jobs["user"].nunique() >= 5 and jobs["account"].nunique() >= 4
    # users reuse job names, so a (user, name) key is seen many times
    assert jobs.groupby(["user", "name"]).size().max() >= 10
    # the truth labels cover every class the recording has
    truth = pd.read_csv(default_cluster / "truth.csv")
    assert set(truth["truth"]) == {"compute", "memory", "mixed", "idle"}


def test_jobs_file_is_readable_by_the_slurm_client(default_cluster: Path) -> None:
    client = JobsFileClient(default_cluster / "jobs.csv")
    man = json.loads((default_cluster / "manifest.json").read_text())
    start, end = dt.datetime.fromisoformat(man["start"]), dt.datetime.fromisoformat(man["end"])
    recs = client.jobs(start, end)
    assert len(recs) == man["n_jobs"]
    assert all(r.start is not None and r.end is not None and start <= r.start < r.end <= end for r in recs)


def test_each_gpu_part_is_a_valid_probe_recording(tmp_path: Path, h200_raw: Path) -> None:
    build_cluster(h200_raw, tmp_path, SMALL)
    parts = _parts(tmp_path)
    assert len(parts) == 4
    uuids = set()
    raw_cols = set(pd.read_parquet(next(h200_raw.glob("*_samples_1hz.parquet"))).columns)
    for caps_path in parts:
        caps = json.loads(caps_path.read_text())
        uuids.add(caps["uuid"])
        assert caps["index"] in (0, 1) and caps["name"] == "NVIDIA H200"
        stem = caps_path.name.removesuffix("_caps.json")
        s = pd.read_parquet(caps_path.with_name(f"{stem}_samples_1hz.parquet"))
        runs = pd.read_csv(caps_path.with_name(f"{stem}_runs.csv"), dtype={"job_id": str})
        assert set(s.columns) == raw_cols
        assert len(s) == SMALL.span_s and np.allclose(np.diff(s["ts"]), 1.0)
        assert (np.diff(s["energy_mj"]) >= 0).all(), "energy counter must never go back"
        assert {"job", "job_id", "user", "start", "end", "label"} <= set(runs.columns)
        prev_end = -np.inf
        for r in runs.itertuples():
            assert r.start > prev_end
            prev_end = r.end
            rows = s[(s["ts"] >= r.start) & (s["ts"] <= r.end)]
            assert set(rows["job"]) == {r.job}
            assert SMALL.job_min_s <= len(rows) <= SMALL.job_max_s
            # energy_j in runs.csv is the counter's own delta over the job's rows
            first = s.index[s["ts"] == r.start][0]
            counted = (s.loc[rows.index[-1], "energy_mj"] - s.loc[first - 1, "energy_mj"]) / 1e3
            assert counted == pytest.approx(r.energy_j, abs=0.01 * len(rows))
        assert set(s.loc[~s["job"].isin(set(runs["job"])), "job"]) <= {"gap"}
    assert len(uuids) == 4


def test_job_rows_are_the_recorded_rows(tmp_path: Path, h200_raw: Path) -> None:
    rec = load_recording(h200_raw)
    build_cluster(h200_raw, tmp_path, SMALL)
    caps_path = _parts(tmp_path)[0]
    s = pd.read_parquet(caps_path.with_name("gpu0_samples_1hz.parquet"))
    runs = pd.read_csv(caps_path.with_name("gpu0_runs.csv"))
    r = runs.iloc[0]
    rows = s[(s["ts"] >= r.start) & (s["ts"] <= r.end)].reset_index(drop=True)
    seg = rec.segments[r.job]
    n = min(len(rows), len(seg))
    for col in ("power_mw", "gpm_dram_bw_util", "gpm_any_tensor_util", "sm_clock_mhz"):
        assert rows[col].iloc[:n].tolist() == seg[col].iloc[:n].tolist()
    if len(rows) > len(seg):  # repeated from the start of the recorded segment
        assert rows["power_mw"].iloc[len(seg)] == seg["power_mw"].iloc[0]


def test_same_seed_same_bytes_other_seed_differs(tmp_path: Path, h200_raw: Path) -> None:
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    build_cluster(h200_raw, a, SMALL)
    build_cluster(h200_raw, b, SMALL)
    build_cluster(h200_raw, c, ClusterSpec(**{**SMALL.__dict__, "seed": 4}))
    for rel in ("jobs.csv", "submissions.csv", "nodes/gpu-node-01/gpu0_samples_1hz.parquet"):
        assert (a / rel).read_bytes() == (b / rel).read_bytes()
    assert (a / "jobs.csv").read_bytes() != (c / "jobs.csv").read_bytes()


def test_spliced_jobs_keep_their_recorded_class(default_cluster: Path) -> None:
    """10 s windows of each synthetic job, labelled by the GPM rule, give the recording's truth."""
    wins = []
    for caps_path in _parts(default_cluster):
        stem = caps_path.name.removesuffix("_caps.json")
        s = pd.read_parquet(caps_path.with_name(f"{stem}_samples_1hz.parquet"))
        runs = pd.read_csv(caps_path.with_name(f"{stem}_runs.csv"), dtype={"job_id": str})
        iv = pd.IntervalIndex.from_arrays(runs["start"], runs["end"], closed="both")
        pos = iv.get_indexer(s["ts"])
        s = s[pos >= 0].assign(job_id=runs["job_id"].to_numpy()[pos[pos >= 0]])
        s["win"] = (s["ts"] // 10).astype(int)
        w = s.groupby(["job_id", "win"])[list(GPM_V1)].mean().rename(columns=GPM_V1).reset_index()
        wins.append(w)
    labels = rule_job_labels(pd.concat(wins, ignore_index=True)).set_index("job_id")["label"]
    truth = pd.read_csv(default_cluster / "truth.csv", dtype={"job_id": str}).set_index("job_id")["truth"]
    agree = (labels.reindex(truth.index) == truth).mean()
    assert agree >= 0.9, f"only {agree:.0%} of synthetic jobs keep their recorded class"


def test_submissions_mix_known_and_unknown_keys(default_cluster: Path) -> None:
    subs = pd.read_csv(default_cluster / "submissions.csv", dtype={"job_id": str})
    jobs = pd.read_csv(default_cluster / "jobs.csv", dtype={"job_id": str})
    assert list(subs.columns) == ["job_id", "name", "user", "account", "partition"]
    assert set(subs["job_id"]).isdisjoint(set(jobs["job_id"]))
    known = subs.merge(
        jobs[["user", "name"]].drop_duplicates(), on=["user", "name"], how="left", indicator=True
    )
    assert (known["_merge"] == "both").sum() >= len(subs) // 2
    assert (~subs["user"].isin(jobs["user"])).any(), "some submissions must come from users never seen"


def test_bad_spec_and_missing_recording_are_clear_errors(tmp_path: Path, h200_raw: Path) -> None:
    with pytest.raises(ConfigError, match="job_min_s"):
        build_cluster(h200_raw, tmp_path / "x", ClusterSpec(job_min_s=600, job_max_s=60))
    with pytest.raises(DataError, match=r"no \*_samples_1hz\.parquet"):
        build_cluster(tmp_path, tmp_path / "y")
