"""Real Slurm 22.05 with gres/shard: two jobs on one GPU, caps that respect the neighbour.

Each GPU of the test cluster carries 2 shards (GresTypes=gpu,shard; the GPUs are /dev/null
symlinks and Slurm 22.05 accepts them); Slurm places the first two shard jobs on GPU 0. The
Prolog/Epilog run as slurmd starts them, against the filestate backend. Job A (memory, 60% =
420 W) starts first, job B (mixed, 85% = 595 W) joins: the GPU runs at B's 595 W (never under a
job's own cap); A leaves: still 595 W and B's mapping is intact; B leaves: 700 W is back.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_cluster import WattclassRig, require_daemons, start_rig_or_skip

from wattclass.labeltable import TableEntry, write_label_table
from wattclass.policy import parse_policy

pytestmark = pytest.mark.slurm

POLICY = {"mode": "enforce", "min_confidence": 0.8, "caps": {"memory": "60%", "mixed": "85%"}}


@pytest.fixture(scope="module")
def rig() -> Iterator[WattclassRig]:
    require_daemons()
    root = Path(tempfile.mkdtemp(prefix="wattclass-shard-"))
    r = WattclassRig(root, sys.executable, shards=2)
    write_label_table(r.table, [
        TableEntry("user_name", "root", "mem-a", None, "memory", 0.93, 7, "rule"),
        TableEntry("user_name", "root", "mix-b", None, "mixed", 0.93, 7, "rule"),
    ], parse_policy(POLICY).table_dict(set()))
    start_rig_or_skip(r)
    yield r
    r.cluster.stop()
    shutil.rmtree(root, ignore_errors=True)


def _start(rig: WattclassRig, name: str) -> str:
    """A shard job that records its GPUs, then waits for ``<out>/go-<id>``."""
    script = ("#!/bin/sh\n"
              f"echo $SLURM_JOB_GPUS > {rig.out}/gpus-$SLURM_JOB_ID.txt\n"
              f"while [ ! -e {rig.out}/go-$SLURM_JOB_ID ]; do sleep 0.1; done\n")
    job_id = rig.cluster.sbatch("-o", "/dev/null", "-J", name, "--gres=shard:1", script=script)
    rig.cluster.wait_job(job_id, states=("RUNNING",))
    _wait(lambda: (rig.out / f"gpus-{job_id}.txt").exists(), f"job {job_id} running its script")
    return job_id


def _finish(rig: WattclassRig, job_id: str) -> None:
    (rig.out / f"go-{job_id}").touch()
    rig.cluster.wait_job(job_id)
    # slurmd runs the Epilog after the job is COMPLETED: wait until its job file is gone.
    _wait(lambda: not any(rig.jobs_dir.rglob(f"{job_id}.json")), f"Epilog of job {job_id}")


def _wait(cond, what: str, timeout: float = 20) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_two_shard_jobs_on_one_gpu_keep_the_highest_cap_until_the_last_leaves(rig: WattclassRig) -> None:
    gpu0 = rig.backend.gpus()[rig.slurm_to_backend[0]].uuid
    a = _start(rig, "mem-a")
    assert (rig.out / f"gpus-{a}.txt").read_text().strip() == "0"
    assert rig.limits()[0] == 420.0
    b = _start(rig, "mix-b")
    assert (rig.out / f"gpus-{b}.txt").read_text().strip() == "0"  # the same GPU, by shards
    assert rig.limits()[0] == 595.0  # b never runs under its own 85%
    assert sorted(p.stem for p in (rig.jobs_dir / gpu0).glob("*.json")) == sorted([a, b])
    _finish(rig, a)
    assert rig.limits()[0] == 595.0  # not restored while b runs
    assert [p.stem for p in (rig.jobs_dir / gpu0).glob("*.json")] == [b]
    _finish(rig, b)
    # the Epilog sets the limit, removes the record, then logs: wait for the line as well (a CI
    # run read the log between the two)
    _wait(lambda: rig.limits()[0] == 700.0 and not any(rig.caps_dir.glob("*.json"))
          and f"job {b}: restored GPU {gpu0}" in rig.log.read_text(), "restore")
    assert set(rig.limits().values()) == {700.0}
    assert f"job {a}: restored" not in rig.log.read_text()
    assert rig.cluster.node_state() == "idle"
