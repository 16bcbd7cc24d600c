"""Real Slurm: job arrays and heterogeneous jobs through job_submit.lua, the Prolog and the Epilog.

job_submit.lua runs once for a whole array (slurmctld copies the admin_comment to every task)
and once per het job component (slurmctld calls validate_job_create_req per component, 22.05 and
25.11 alike). Each array task and each het component is a job of its own on the node, with its
own SLURM_JOB_ID; ``squeue --jobs ID`` lists every task of the array when ID is the array's own
id and every component of a het job when ID is its leader's, so the Prolog must read only its own
line (a leader without a decision would otherwise take a component's cap, or the reverse).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_cluster import WattclassRig, require_daemons, start_rig_or_skip
from test_slurm_shared import _wait

from wattclass.labeltable import TableEntry, write_label_table
from wattclass.policy import parse_policy

pytestmark = pytest.mark.slurm

MEM = "wattclass:label=memory;conf=0.93;cap=60%;src=rule;mode=enforce"


@pytest.fixture(scope="module")
def rig() -> Iterator[WattclassRig]:
    require_daemons()
    root = Path(tempfile.mkdtemp(prefix="wattclass-arrhet-"))
    r = WattclassRig(root, sys.executable)
    write_label_table(r.table, [TableEntry("user_name", "root", "mem-a", None, "memory", 0.93, 7, "rule")],
                      parse_policy({"mode": "enforce", "min_confidence": 0.8,
                                    "caps": {"memory": "60%"}}).table_dict(set()))
    start_rig_or_skip(r)
    yield r
    r.cluster.stop()
    shutil.rmtree(root, ignore_errors=True)


def _script(rig: WattclassRig, head: str = "") -> str:
    """Records its GPUs and the limits it sees, then waits for ``<out>/go-<job id>``."""
    return ("#!/bin/sh\n" + head +
            f"echo $SLURM_JOB_GPUS > {rig.out}/gpus-$SLURM_JOB_ID.txt\n"
            f"cat {rig.state} > {rig.out}/snap-$SLURM_JOB_ID.json\n"
            f"while [ ! -e {rig.out}/go-$SLURM_JOB_ID ]; do sleep 0.1; done\n")


def _ids(rig: WattclassRig, key: str) -> dict[str, str]:
    """JobID -> JobArrayID ("12_3" / "12+1") of the jobs whose JobArrayID starts with ``key``."""
    out = rig.cluster.run(["squeue", "--noheader", "--states=all", "-O", "JobID:24,JobArrayID:48"])
    return {a: b for a, b in (line.split() for line in out.splitlines()) if b.startswith(key)}


def _done(rig: WattclassRig) -> bool:
    return (set(rig.limits().values()) == {700.0} and not any(rig.caps_dir.glob("*.json"))
            and not any(rig.jobs_dir.rglob("*.json")))


def test_array_tasks_carry_the_submit_decision_and_restore_only_their_own_gpu(rig: WattclassRig) -> None:
    _wait(lambda: _done(rig), "an idle node")
    arr = rig.cluster.sbatch("-o", "/dev/null", "-J", "mem-a", "--gres=gpu:1", "--array=0-2",
                             script=_script(rig))
    _wait(lambda: len(_ids(rig, f"{arr}_")) == 3 and all(
        (rig.out / f"snap-{j}.json").exists() for j in _ids(rig, f"{arr}_")), "three running tasks")
    tasks = _ids(rig, f"{arr}_")
    assert arr in tasks  # one task keeps the array's own id: squeue -j lists all three for it
    gpus = {j: int((rig.out / f"gpus-{j}.txt").read_text()) for j in tasks}
    assert sorted(gpus.values()) == sorted(set(gpus.values()))  # each its own GPU
    for j in tasks:
        assert rig.cluster.job(j)["admin_comment"] == MEM  # decided once, at submission
        assert rig.seen(j)[0][gpus[j]] == 420.0
    first = sorted(tasks, key=lambda j: j != arr)  # the array's own id ends first
    for n, j in enumerate(first):
        (rig.out / f"go-{j}").touch()
        _wait(lambda j=j: rig.limits()[gpus[j]] == 700.0, f"task {tasks[j]} restored")
        assert all(rig.limits()[gpus[k]] == 420.0 for k in first[n + 1:]), rig.limits()
    _wait(lambda: _done(rig), "every task's Epilog")
    log = rig.log.read_text()
    assert all(f"job {j}: capped GPU" in log for j in tasks)


@pytest.mark.parametrize("leader", ["-J other --gres=gpu:1", "-J mem-a -n 1"])
def test_job_submit_decides_each_het_component_on_its_own(rig: WattclassRig, leader: str) -> None:
    """Component 1 is a labelled memory job; the leader (component 0, whose id is the het job's)
    has no label, or no GPUs: only component 1 carries the decision. (On this one-node test
    cluster a het job stays pending; the Prolog's reading of its own squeue line is tested in
    tests/test_slurm_liveness.py.)"""
    head = f"#SBATCH {leader}\n#SBATCH hetjob\n#SBATCH -J mem-a --gres=gpu:1\n"
    het = rig.cluster.sbatch("-o", "/dev/null", script=_script(rig, head))
    try:
        _wait(lambda: len(_ids(rig, f"{het}+")) == 2, "both components listed")
        comps = {b: a for a, b in _ids(rig, f"{het}+").items()}
        assert comps[f"{het}+0"] == het
        assert not rig.cluster.job(het).get("admin_comment")  # job_submit ran per component
        assert rig.cluster.job(comps[f"{het}+1"])["admin_comment"] == MEM
        from wattclass.slurm.commands import CommandSlurmClient

        client = CommandSlurmClient(rig.cluster.conf, bin_dir=rig.cluster.install.bin_dir)
        assert client.admin_comment(het) is None  # squeue -j <leader> lists both components
        assert client.admin_comment(comps[f"{het}+1"]) == MEM
    finally:
        rig.cluster.run(["scancel", het], check=False)
