"""``CommandSlurmClient.job_gpu_indices``: the job's GPUs on a node from squeue's gres_detail.

slurmd gives the Prolog SLURM_JOB_GPUS of the last GPU type only (a job of two GPU types, 25.11:
``SLURM_JOB_GPUS=2`` for ``gpu:ta:1(IDX:0),gpu:tb:1(IDX:2)``), so the Prolog asks Slurm for the
whole allocation. Here ``run`` answers as squeue does; the real squeue is in test_slurm_hooks.py.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from wattclass.errors import SlurmError
from wattclass.slurm.commands import CommandSlurmClient, gpu_indices


class Answers(CommandSlurmClient):
    def __init__(self, jobs: list[dict[str, object]] | Exception, hostnames: str = "") -> None:
        super().__init__()
        self.jobs, self.hostnames, self.calls = jobs, hostnames, []  # type: ignore[var-annotated]

    def run(self, argv: Sequence[str], env: object = None) -> str:  # type: ignore[override]
        self.calls.append(list(argv))
        if argv[0] == "scontrol":
            return self.hostnames
        if isinstance(self.jobs, Exception):
            raise self.jobs
        return json.dumps({"jobs": self.jobs})


@pytest.mark.parametrize(("detail", "want"), [
    ("gpu:ta:1(IDX:0),gpu:tb:1(IDX:2)", ["0", "2"]),  # recorded on 25.11
    ("gpu:2(IDX:0-1)", ["0", "1"]),
    ("gpu:h200:4(IDX:0,2-3,5)", ["0", "2", "3", "5"]),
    ("gpu:a100:1(IDX:3),gpu:h200:2(IDX:0-1)", ["3", "0", "1"]),
    ("shard:2(2/4,0/4,0/4,0/4)", []),  # a share of a GPU: no IDX list (SLURM_JOB_GPUS names it)
    ("gpu(CNT:2)", []),
    ("", []),
    ("gpu:1(IDX:0-99999999)", []),  # no node has that many: not expanded
])
def test_gpu_indices_reads_every_gpu_entry_of_a_node(detail: str, want: list[str]) -> None:
    assert gpu_indices(detail) == want


def test_job_gpu_indices_takes_the_asked_jobs_allocation() -> None:
    c = Answers([{"job_id": 41, "gres_detail": ["gpu:1(IDX:1)"], "nodes": "gpu07"},
                 {"job_id": 42, "gres_detail": ["gpu:ta:1(IDX:0),gpu:tb:1(IDX:2)"], "nodes": "gpu07"}])
    assert c.job_gpu_indices("42", "gpu07") == ["0", "2"]
    assert c.calls[0][:3] == ["squeue", "--json", "--states=all"] and c.calls[0][-2:] == ["--jobs", "42"]


def test_job_gpu_indices_on_several_nodes_takes_this_nodes_entry() -> None:
    job = {"job_id": 42, "gres_detail": ["gpu:ta:1(IDX:0)", None, "gpu:ta:1(IDX:1),gpu:tb:1(IDX:3)"],
           "nodes": "gpu[06-08]"}
    c = Answers([job], hostnames="gpu06\ngpu07\ngpu08\n")
    assert c.job_gpu_indices("42", "gpu08") == ["1", "3"]
    assert c.job_gpu_indices("42", "gpu07") == []  # no GPU of the job on this node
    assert c.job_gpu_indices("42", "gpu09") is None  # not one of its nodes: cannot tell
    assert c.job_gpu_indices("42", None) is None


@pytest.mark.parametrize("answer", [
    SlurmError("squeue --json: no answer within 5 s"),
    [],  # slurmctld no longer lists it
    [{"job_id": 42, "gres_detail": [], "nodes": ""}],  # not running
])
def test_job_gpu_indices_is_none_when_slurm_cannot_tell(answer: list[dict[str, object]] | Exception) -> None:
    assert Answers(answer).job_gpu_indices("42", "gpu07") is None


def test_job_gpu_indices_refuses_what_is_no_job_id() -> None:
    c = Answers([])
    for bad in ("42;rm -rf /", "42_1", "", "../x"):
        assert c.job_gpu_indices(bad, "gpu07") is None
    assert c.calls == []
