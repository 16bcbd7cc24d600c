"""Prolog/Epilog runs that overlap on one node: array tasks, shared GPUs, real processes.

slurmd runs each job's Prolog and Epilog as its own process, so two jobs starting or ending at
once on a node run their hooks at the same time, and the tasks of an array run as separate jobs
(SLURM_JOB_ID the task's own id, SLURM_ARRAY_JOB_ID / SLURM_ARRAY_TASK_ID set). Here the hooks
are called as slurmd calls them (its environment), in forked processes where the point is the
locking; the test holds a GPU's lock itself to force which hook waits for which (no timing).
The real-Slurm side (array and het jobs through slurmctld) is tests/test_slurm_arrays_het.py.
"""

from __future__ import annotations

import json
import multiprocessing
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from wattclass.gpu.filestate import FileStateBackend
from wattclass.jobmap import jobs_on_gpu
from wattclass.plugin.prolog import epilog, prolog
from wattclass.plugin.sharedcaps import gpu_lock

MEM = "wattclass:label=memory;conf=0.93;cap=60%;src=rule;mode=enforce"  # 420 W of 700 W
MIX = "wattclass:label=mixed;conf=0.93;cap=85%;src=rule;mode=enforce"  # 595 W
# forkserver: a child forked from this process would inherit the test's open lock and keep the
# GPU locked after the test lets go (flock belongs to the open file, shared across fork)
CTX = multiprocessing.get_context("forkserver")


def _env(job_id: str, gpus: str, array: tuple[str, str] | None = None) -> dict[str, str]:
    env = {"SLURM_JOB_ID": job_id, "SLURM_JOB_GPUS": gpus, "SLURM_JOB_USER": "alice", "SLURM_JOB_UID": "1000"}
    if array is not None:
        env |= {"SLURM_ARRAY_JOB_ID": array[0], "SLURM_ARRAY_TASK_ID": array[1]}
    return env


class Node:
    """One node's GPUs (file-state backend, two GPUs), job map and cap records."""

    def __init__(self, root: Path, create: bool = True) -> None:
        self.root = root
        self.be = (FileStateBackend.create(root / "g.json", 2) if create
                   else FileStateBackend(root / "g.json"))
        self.gmap = {str(g.gpu_index): g.uuid for g in self.be.gpus()}
        self.jobs, self.caps = root / "jobs", root / "caps"
        if create:
            self.jobs.mkdir(mode=0o755)
            self.caps.mkdir(mode=0o755)

    def uuid(self, i: int) -> str:
        return self.gmap[str(i)]

    def limit(self, i: int) -> float | None:
        return self.be.power_limit_w(self.be.find_gpu(self.uuid(i)).gpu_index)

    def record(self, i: int) -> dict[str, object] | None:
        p = self.caps / f"{self.uuid(i)}.json"
        return json.loads(p.read_text()) if p.exists() else None

    def prolog(self, env: dict[str, str], comment: str | None) -> None:
        prolog(env, self.be, lambda _j: comment, self.gmap, self.jobs, self.caps)

    def epilog(self, env: dict[str, str]) -> None:
        epilog(env, self.be, self.jobs, self.caps, self.gmap)

    def lock(self, i: int):  # type: ignore[no-untyped-def]
        return gpu_lock(self.caps / f"{self.uuid(i)}.json")


def _hook(root: Path, kind: str, env: dict[str, str], comment: str | None = None) -> None:
    """One hook in a process of its own, as slurmd runs it."""
    n = Node(root, create=False)
    if kind == "prolog":
        n.prolog(env, comment)
    else:
        n.epilog(env)


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def _wait(cond: Callable[[], bool], what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def procs() -> Iterator[Callable[..., multiprocessing.process.BaseProcess]]:
    started: list[multiprocessing.process.BaseProcess] = []

    def start(fn: Callable[..., None], *args: object) -> multiprocessing.process.BaseProcess:
        n = fn.__self__  # type: ignore[attr-defined]  # a Node's prolog or epilog
        p = CTX.Process(target=_hook, args=(n.root, fn.__name__, *args))
        p.start()
        started.append(p)
        return p

    yield start
    for p in started:
        p.join(20)
        if p.is_alive():
            p.kill()
        assert p.exitcode == 0, f"a hook process exited {p.exitcode}"


def _joined(*ps: multiprocessing.process.BaseProcess) -> None:
    for p in ps:
        p.join(20)
        assert p.exitcode == 0


# -- array tasks --------------------------------------------------------------------------------
def test_array_tasks_cap_and_restore_only_their_own_gpus(node: Node) -> None:
    """Tasks 0 and 1 of array 40 run at once on GPUs 0 and 1 (task 1 kept the array's id, 40)."""
    t0, t1 = _env("41", "0", ("40", "0")), _env("40", "1", ("40", "1"))
    node.prolog(t0, MEM)
    node.prolog(t1, MEM)
    assert (node.limit(0), node.limit(1)) == (420.0, 420.0)
    assert [a.job_id for a in jobs_on_gpu(node.jobs, node.uuid(0))] == ["40_0"]
    assert node.record(0)["jobs"] == {"40_0": 420.0}  # type: ignore[index]
    node.epilog(t1)  # the task holding the array's own id ends first: only its GPU goes back
    assert (node.limit(0), node.limit(1)) == (420.0, 700.0)
    assert node.record(1) is None and node.record(0) is not None
    node.epilog(t0)
    assert (node.limit(0), node.limit(1)) == (700.0, 700.0)
    assert not list(node.caps.glob("*.json")) and not list(node.jobs.rglob("*.json"))


def test_uncapped_array_task_leaving_a_shared_gpu_lets_the_neighbours_cap_apply(node: Node) -> None:
    """The cap record names jobs as the job map does ("40_2"): an uncapped array task found there
    by a capped neighbour's Prolog is taken out by its own Epilog, so the neighbour's cap applies
    from then on (before, the record kept "40_2" and the GPU ran uncapped until the last job left)."""
    task = _env("43", "0", ("40", "2"))
    node.prolog(task, None)  # no decision: holds the shared GPU uncapped
    node.prolog(_env("50", "0"), MEM)
    assert node.limit(0) == 700.0  # never under the neighbour's allowance
    assert node.record(0)["jobs"] == {"40_2": None, "50": 420.0}  # type: ignore[index]
    node.epilog(task)
    assert node.limit(0) == 420.0
    assert node.record(0)["jobs"] == {"50": 420.0}  # type: ignore[index]
    node.epilog(_env("50", "0"))
    assert node.limit(0) == 700.0 and node.record(0) is None


def test_epilog_still_leaves_a_record_an_older_version_keyed_by_the_tasks_plain_id(node: Node) -> None:
    task = _env("43", "0", ("40", "2"))
    node.prolog(task, MEM)
    rec = node.caps / f"{node.uuid(0)}.json"
    doc = json.loads(rec.read_text())
    doc["jobs"] = {"43": 420.0}  # as the version before this change wrote it
    rec.write_text(json.dumps(doc))
    node.epilog(task)
    assert node.limit(0) == 700.0 and node.record(0) is None


# -- hooks at once: the test holds the GPU's lock -------------------------------------------------
def test_epilog_removes_its_job_file_only_under_the_gpus_lock(node: Node, procs) -> None:  # type: ignore[no-untyped-def]
    """An uncapped job A ends while capped job B starts on the same GPU. A's job file goes under
    the GPU's lock, so B's Prolog (which reads the job map under that lock) either sees A and A's
    Epilog then takes A out of B's record, or does not see A; never the third way, where A was
    added after its Epilog looked and the GPU stayed uncapped for all of B's run."""
    a, b = _env("60", "0"), _env("61", "0")
    node.prolog(a, None)
    with node.lock(0):
        pa = procs(node.epilog, a)
        pb = procs(node.prolog, b, MEM)
        _wait(lambda: (node.jobs / node.uuid(0) / "61.json").exists(), "B's job file")
        assert (node.jobs / node.uuid(0) / "60.json").exists(), "A's file went without the GPU's lock"
        assert pa.is_alive() and pb.is_alive()
    _joined(pa, pb)
    assert node.record(0)["jobs"] == {"61": 420.0}  # type: ignore[index]
    assert node.limit(0) == 420.0
    node.epilog(b)
    assert node.limit(0) == 700.0 and node.record(0) is None


def test_two_prologs_then_two_epilogs_at_once_on_one_shared_gpu(node: Node, procs) -> None:  # type: ignore[no-untyped-def]
    a, b = _env("70", "0"), _env("71", "0", ("69", "3"))
    with node.lock(0):
        pa, pb = procs(node.prolog, a, MEM), procs(node.prolog, b, MIX)
        _wait(lambda: len(jobs_on_gpu(node.jobs, node.uuid(0))) == 2, "both job files")
        assert node.record(0) is None and node.limit(0) == 700.0  # both wait for the lock
    _joined(pa, pb)
    assert node.record(0)["jobs"] == {"70": 420.0, "69_3": 595.0}  # type: ignore[index]
    assert node.limit(0) == 595.0  # the highest allowance: neither runs under its own cap
    with node.lock(0):
        pa, pb = procs(node.epilog, a), procs(node.epilog, b)
        assert node.limit(0) == 595.0
    _joined(pa, pb)
    assert node.limit(0) == 700.0 and node.record(0) is None
    assert not list(node.jobs.rglob("*.json"))


def test_a_held_lock_on_one_gpu_does_not_stop_a_job_on_another(node: Node, procs) -> None:  # type: ignore[no-untyped-def]
    a, b = _env("80", "0"), _env("81", "1")
    with node.lock(0):
        pa = procs(node.prolog, a, MEM)
        pb = procs(node.prolog, b, MIX)
        _joined(pb)  # GPU 1's lock is its own
        assert node.limit(1) == 595.0
        assert pa.is_alive() and node.limit(0) == 700.0
    _joined(pa)
    assert node.limit(0) == 420.0
    assert node.record(0)["jobs"] == {"80": 420.0}  # type: ignore[index]
    assert node.record(1)["jobs"] == {"81": 595.0}  # type: ignore[index]
    for p in (procs(node.epilog, a), procs(node.epilog, b)):
        _joined(p)
    assert (node.limit(0), node.limit(1)) == (700.0, 700.0)
    assert not list(node.caps.glob("*.json"))
