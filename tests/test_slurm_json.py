"""Both Slurm JSON dialects and Prolog environments, on outputs recorded from real clusters.

tests/data/slurm/<version>/ holds the same four jobs run on Debian's Slurm 22.05.8 and on 25.11.7
(see its README). Whatever the version, the command client must read the same records.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from wattclass.plugin.prolog import job_env
from wattclass.slurm.commands import gpus_from_tres, normalize_job, number, sacct_record, slurm_version, state

DATA = Path(__file__).parent / "data" / "slurm"
VERSIONS = ("22.05", "25.11")
MEM = "wattclass:label=memory;conf=0.93;cap=60%;src=rule;mode=enforce"


def load(version: str, name: str) -> dict:  # type: ignore[type-arg]
    return json.loads((DATA / version / name).read_text())


def env(version: str, name: str) -> dict[str, str]:
    lines = (DATA / version / name).read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


@pytest.mark.parametrize("version", VERSIONS)
def test_sacct_records_are_the_same_whatever_the_version(version: str) -> None:
    recs = {r.job_id: r for r in map(sacct_record, load(version, "sacct.json")["jobs"])}
    assert set(recs) == {"1", "2", "3_1", "3_2"}
    gpu = recs["1"]
    assert (gpu.name, gpu.user, gpu.account, gpu.partition) == ("acct-gpu", "root", "research", "debug")
    assert gpu.admin_comment == MEM and gpu.gpus == 2
    assert gpu.start is not None and gpu.end is not None and gpu.start <= gpu.end
    assert gpu.start.tzinfo == dt.UTC and gpu.start.year == 2026
    plain = recs["2"]
    assert (plain.account, plain.partition, plain.admin_comment, plain.gpus) == \
        ("benchmark", "main", None, None)
    assert [recs[k].gpus for k in ("3_1", "3_2")] == [1, 1]
    assert recs["3_1"].name == "arr"


@pytest.mark.parametrize("version", VERSIONS)
def test_version_from_meta(version: str) -> None:
    for name in ("sacct.json", "squeue.json"):
        assert slurm_version(load(version, name)) == {"22.05": "22.05.8", "25.11": "25.11.7"}[version]


@pytest.mark.parametrize("version", VERSIONS)
def test_squeue_jobs_normalize_to_one_shape(version: str) -> None:
    jobs = {str(j["job_id"]): normalize_job(j) for j in load(version, "squeue.json")["jobs"]}
    assert jobs["1"]["job_state"] == "COMPLETED" and jobs["4"]["job_state"] == "PENDING"
    assert isinstance(jobs["1"]["start_time"], int) and jobs["1"]["start_time"] > 1.7e9
    assert jobs["1"]["admin_comment"] == MEM
    assert jobs["1"]["name"] == "acct-gpu"
    assert jobs["5"]["array_job_id"] == 3 and jobs["5"]["array_task_id"] == 1
    # The GRES request text itself differs (gres:gpu:2 on 22.05, gres/gpu:2 on 25.11); it is kept
    # as Slurm wrote it (job_submit.lua and plugin/decide.py parse it).
    assert jobs["1"]["tres_per_node"] == {"22.05": "gres:gpu:2", "25.11": "gres/gpu:2"}[version]


def test_25_11_dialect_details() -> None:
    raw = {str(j["job_id"]): j for j in load("25.11", "squeue.json")["jobs"]}
    assert raw["1"]["job_state"] == ["COMPLETED"]  # a list: the base state, then flags
    assert raw["1"]["start_time"]["set"] is True
    assert normalize_job(raw["2"])["array_task_id"] is None  # {"set": false} = not an array task
    assert number({"set": True, "infinite": True, "number": 0}) is None  # unlimited
    assert number({"set": False, "infinite": False, "number": 5}) is None
    assert state(["PENDING", "REQUEUED"]) == "PENDING" and state("RUNNING") == "RUNNING"
    sacct = {j["job_id"]: j for j in load("25.11", "sacct.json")["jobs"]}
    assert sacct[1]["state"]["current"] == ["COMPLETED"]
    assert sacct[2]["comment"]["administrator"] == ""  # 22.05: null; both read as None
    assert load("22.05", "sacct.json")["jobs"][1]["comment"]["administrator"] is None


def test_gpus_from_tres_variants() -> None:
    assert gpus_from_tres({"allocated": [{"type": "cpu", "name": "", "count": 1}]}) is None
    assert gpus_from_tres({"allocated": [{"type": "gres", "name": "gpu", "count": 4},
                                         {"type": "gres", "name": "gpu:h200", "count": 4}]}) == 4
    assert gpus_from_tres({"allocated": [{"type": "gres", "name": "gpu:h200", "count": 2}]}) == 2
    assert gpus_from_tres(None) is None and gpus_from_tres({"allocated": "x"}) is None


@pytest.mark.parametrize("version", VERSIONS)
def test_node_state_and_features(version: str) -> None:
    node = load(version, "nodes.json")["nodes"][0]
    assert (state(node["state"]) or "").lower() == "idle"
    feats = node["features"]
    assert (feats if isinstance(feats, list) else feats.split(",")) == ["hbm"]


@pytest.mark.parametrize("version", VERSIONS)
def test_prolog_reads_what_both_versions_export(version: str) -> None:
    job = job_env(env(version, "prolog-env.txt"))
    assert (job.job_id, job.display_id, job.user, job.uid, job.gpus) == ("1", "1", "root", 0, "0,1")
    # Neither version exports SLURM_ARRAY_JOB_ID/TASK_ID to the slurmd Prolog (recorded): an
    # array task's job files carry its own job id (5), not "3_1".
    arr_env = env(version, "prolog-env-array.txt")
    assert not any(k.startswith("SLURM_ARRAY") for k in arr_env)
    arr = job_env(arr_env)
    assert (arr.job_id, arr.display_id, arr.gpus) == ("5", "5", "2")
    # neither exports the job name; 25.11 adds start/end times and the SLUID
    assert "SLURM_JOB_NAME" not in arr_env
    assert ("SLURM_JOB_START_TIME" in arr_env) == (version == "25.11")


def test_jobs_file_gpus_column(tmp_path: Path) -> None:
    from wattclass.errors import DataError
    from wattclass.slurm.client import JobsFileClient

    good = tmp_path / "jobs.csv"
    good.write_text("job_id,start,gpus\n7,1796014788,2\n8,1796014788,\n")
    recs = {r.job_id: r for r in JobsFileClient(good).jobs(dt.datetime(2020, 1, 1, tzinfo=dt.UTC),
                                                          dt.datetime(2030, 1, 1, tzinfo=dt.UTC))}
    assert (recs["7"].gpus, recs["8"].gpus) == (2, None)
    bad = tmp_path / "bad.csv"
    bad.write_text("job_id,gpus\n7,two\n")
    with pytest.raises(DataError, match=r"bad.csv: job 7: gpus 'two' is not a number"):
        JobsFileClient(bad)
