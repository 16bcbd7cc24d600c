"""``CommandSlurmClient.job_ended``: how the Prolog's liveness check reads squeue's answer.

The real squeue is exercised in tests/test_slurm_hooks.py (an unknown id, a COMPLETED, a pending
and a running job on a real cluster). Here ``run`` answers as squeue does in the cases a test
cluster cannot produce: a timeout, a job running on other nodes, a bracketed node list.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from wattclass.errors import SlurmError
from wattclass.slurm.commands import CommandSlurmClient


class Answers(CommandSlurmClient):
    def __init__(self, squeue: str | Exception, hostnames: str = "") -> None:
        super().__init__()
        self.squeue, self.hostnames, self.calls = squeue, hostnames, []  # type: ignore[var-annotated]

    def run(self, argv: Sequence[str], env: object = None) -> str:  # type: ignore[override]
        self.calls.append(list(argv))
        if argv[0] == "scontrol":
            return self.hostnames
        if isinstance(self.squeue, Exception):
            raise self.squeue
        return self.squeue


@pytest.mark.parametrize(("answer", "node", "want"), [
    ("RUNNING   gpu07\n", "gpu07", False),
    ("RUNNING   gpu07\n", "gpu08", True),  # running elsewhere (requeued after a node failure)
    ("RUNNING   gpu07\n", None, False),  # no node name: running anywhere counts
    ("PENDING   \n", "gpu07", True),  # requeued and waiting: holds nothing here
    ("COMPLETING gpu07\n", "gpu07", False),
    ("COMPLETED gpu07\n", "gpu07", True),
    ("", "gpu07", True),  # slurmctld no longer lists it
    (SlurmError("squeue --noheader: exit 1: slurm_load_jobs error: Invalid job id specified"), "gpu07", True),
    (SlurmError("squeue --noheader: no answer within 5 s"), "gpu07", None),  # cannot tell: kept
])
def test_job_ended_reads_state_and_node(answer: str | Exception, node: str | None, want: bool | None) -> None:
    assert Answers(answer).job_ended("123", node) is want


def test_job_ended_expands_bracketed_node_lists_and_refuses_odd_ids() -> None:
    c = Answers("RUNNING   gpu[06-08]\n", hostnames="gpu06\ngpu07\ngpu08\n")
    assert c.job_ended("123_4", "gpu07") is False
    assert c.calls[-1] == ["scontrol", "show", "hostnames", "gpu[06-08]"]
    assert Answers("RUNNING   gpu[06-08]\n", hostnames="gpu06\ngpu08\n").job_ended("123", "gpu07") is True
    odd = Answers("RUNNING   gpu07\n")
    for bad in ("123;rm -rf /", "../x", "12 3", ""):
        assert odd.job_ended(bad, "gpu07") is None
    assert odd.calls == []  # never reached squeue
