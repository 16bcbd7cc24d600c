"""Real Slurm: job arrays and heterogeneous jobs through job_submit.lua, the Prolog and the Epilog.

job_submit.lua runs once for a whole array (slurmctld copies the admin_comment to every task)
and once per het job component (slurmctld calls validate_job_create_req per component, 22.05 and
25.11 alike). Each array task and each het component is a job of its own on the node, with its
own SLURM_JOB_ID; ``squeue --jobs ID`` lists every task of the array when ID is the array's own
id and every component of a het job when ID is its leader's, so the Prolog must read only its own
line (a leader without a decision would otherwise take a component's cap, or the reverse).

A het job runs only on the two-node rig (``nodes=TWO_NODES``): Slurm starts het jobs through
sched/backfill only, when it could place each component on a different node, so on one node it
stays pending.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_cluster import NODE, TWO_NODES, WattclassRig, require_daemons, start_rig_or_skip
from test_slurm_shared import _wait

from wattclass.labeltable import TableEntry, write_label_table
from wattclass.policy import parse_policy

pytestmark = pytest.mark.slurm

MEM = "wattclass:label=memory;conf=0.93;cap=60%;src=rule;mode=enforce"


def _started_rig(prefix: str, nodes: tuple[str, ...] | None = None) -> WattclassRig:
    require_daemons()
    root = Path(tempfile.mkdtemp(prefix=prefix))
    r = WattclassRig(root, sys.executable, nodes=nodes or (NODE,))
    write_label_table(r.table, [TableEntry("user_name", "root", "mem-a", None, "memory", 0.93, 7, "rule")],
                      parse_policy({"mode": "enforce", "min_confidence": 0.8,
                                    "caps": {"memory": "60%"}}).table_dict(set()))
    start_rig_or_skip(r)
    return r


@pytest.fixture(scope="module")
def rig() -> Iterator[WattclassRig]:
    r = _started_rig("wattclass-arrhet-")
    yield r
    r.cluster.stop()
    shutil.rmtree(r.root, ignore_errors=True)


@pytest.fixture(scope="module")
def rig2() -> Iterator[WattclassRig]:
    """Two nodes, each with its own fake GPUs, cap records and hooks: het jobs run here."""
    r = _started_rig("wattclass-het2-", TWO_NODES)
    yield r
    r.cluster.stop()
    shutil.rmtree(r.root, ignore_errors=True)


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
    cluster a het job stays pending; it runs, capped per component, in the two-node test below;
    squeue's answers the Prolog reads are also tested in tests/test_slurm_liveness.py.)"""
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


def _placement(rig: WattclassRig, job_id: str) -> tuple[str, int]:
    """(node, Slurm GPU index) of a one-GPU job, from squeue's gres_detail ("gpu:1(IDX:2)")."""
    job = rig.cluster.job(job_id)
    (detail,) = job["gres_detail"]
    found = re.fullmatch(r"gpu(?::\w+)?:1\(IDX:(\d+)\)", detail)
    assert found, detail
    return str(job["nodes"]), int(found.group(1))


def _set_counts(rig: WattclassRig, node: str) -> dict[int, int]:
    """Slurm GPU index -> how often anything set the GPU's limit on ``node`` (filestate's count)."""
    by_index = {int(g["index"]): int(g["set_count"])
                for g in json.loads(rig.nodes[node].state.read_text())["gpus"]}
    return {j: by_index[b] for j, b in rig.slurm_to_backend.items()}


def _job_files(rig: WattclassRig, node: str) -> dict[str, str | None]:
    """Job id -> its label in ``node``'s GPU -> job files."""
    return {f.stem: json.loads(f.read_text()).get("label") for f in rig.nodes[node].jobs_dir.glob("*/*.json")}


def _log(rig: WattclassRig, node: str) -> str:
    """``node``'s hook log so far ("" before its first line)."""
    return rig.nodes[node].log.read_text() if rig.nodes[node].log.exists() else ""


@pytest.mark.parametrize("memory_component", [1, 0])
def test_a_running_het_job_caps_only_the_memory_components_gpu_on_its_own_node(
        rig2: WattclassRig, memory_component: int) -> None:
    """Each component runs on its own node; each node's Prolog reads only its own component's
    decision (``squeue --jobs <leader>`` lists both): the memory component's one GPU is capped to
    60 % of 700 W on its node, the other component's node is never touched, and the Epilog puts
    the GPU back. The unlabelled component carries what a user controls: a ``--comment`` with a
    memory token (asserted to be on the job; the Prolog's environment has it as
    SLURM_JOB_COMMENT), which does not reach the decision, and the leader's being the het job's id
    (whose squeue lines include the other component) neither takes nor gives a cap. (The exported
    SLURM_HET_JOB_ID / SLURM_JOB_ID / SLURM_JOB_COMMENT reach the job's steps only, never the
    Prolog or job_submit: they show a user's environment plays no part, they test no guard.)"""
    fake = f"--comment={MEM} --export=ALL,SLURM_HET_JOB_ID=99999,SLURM_JOB_ID=99999,SLURM_JOB_COMMENT={MEM}"
    lines = ["-J mem-a --gres=gpu:1", f"-J other --gres=gpu:1 {fake}"]
    if memory_component == 1:  # --comment and --export then propagate to component 1 too
        lines.reverse()
    script = (f"#!/bin/sh\n#SBATCH {lines[0]}\n#SBATCH hetjob\n#SBATCH {lines[1]}\n"
              # a step on component 1 starts after its node's Prolog has ended (the leader's
              # batch script after the leader's): both Prologs are done once this file exists
              f"srun --het-group=1 true && touch {rig2.out}/started-$SLURM_JOB_ID\n"
              f"while [ ! -e {rig2.out}/go-$SLURM_JOB_ID ]; do sleep 0.1; done\n")
    before = {n: _set_counts(rig2, n) for n in TWO_NODES}
    logged = {n: _log(rig2, n) for n in TWO_NODES}
    het = rig2.cluster.sbatch("-o", "/dev/null", script=script)
    try:
        _wait(lambda: len(_ids(rig2, f"{het}+")) == 2, "both components listed")
        comp = {int(b.split("+")[1]): a for a, b in _ids(rig2, f"{het}+").items()}
        assert comp[0] == het
        mem, other = comp[memory_component], comp[1 - memory_component]
        _wait(lambda: all(rig2.cluster.job(j)["job_state"] == "RUNNING" for j in comp.values())
              and (rig2.out / f"started-{het}").exists(), "both components' Prologs", timeout=30)
        (mem_node, mem_gpu), (other_node, _) = _placement(rig2, mem), _placement(rig2, other)
        assert {mem_node, other_node} == set(TWO_NODES)  # one component per node
        assert _job_files(rig2, other_node) == {other: None}  # its Prolog ran, found no decision
        assert rig2.cluster.job(mem)["admin_comment"] == MEM
        assert not rig2.cluster.job(other).get("admin_comment")
        assert rig2.cluster.job(other).get("comment") == MEM  # the user's token is there, unused
        assert rig2.limits(mem_node) == {j: 420.0 if j == mem_gpu else 700.0 for j in range(4)}
        assert rig2.limits(other_node) == dict.fromkeys(range(4), 700.0)
        assert _job_files(rig2, mem_node) == {mem: "memory"}
        assert len(list(rig2.nodes[mem_node].caps_dir.glob("*.json"))) == 1
        assert not list(rig2.nodes[other_node].caps_dir.glob("*.json"))
        (rig2.out / f"go-{het}").touch()
        for j in comp.values():
            rig2.cluster.wait_job(j)
        _wait(lambda: all(set(rig2.limits(n).values()) == {700.0} and not _job_files(rig2, n)
                          and not list(rig2.nodes[n].caps_dir.glob("*.json")) for n in TWO_NODES),
              "both Epilogs")
    finally:
        rig2.cluster.run(["scancel", het], check=False)
    # set by the Prolog and the Epilog only, on the memory component's GPU only, and never on the other node
    assert _set_counts(rig2, other_node) == before[other_node]
    assert _set_counts(rig2, mem_node) == {j: n + 2 * (j == mem_gpu) for j, n in before[mem_node].items()}
    assert f"job {mem}: capped GPU" in _log(rig2, mem_node)[len(logged[mem_node]):]
    assert "capped" not in _log(rig2, other_node)[len(logged[other_node]):]
