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
    ("123  123  " "RUNNING   gpu07\n", "gpu07", False),
    ("123  123  " "RUNNING   gpu07\n", "gpu08", True),  # running elsewhere (requeued after a node failure)
    ("123  123  " "RUNNING   gpu07\n", None, False),  # no node name: running anywhere counts
    ("123  123  " "PENDING   \n", "gpu07", True),  # requeued and waiting: holds nothing here
    ("123  123  " "COMPLETING gpu07\n", "gpu07", False),
    ("123  123  " "COMPLETED gpu07\n", "gpu07", True),
    ("", "gpu07", True),  # slurmctld no longer lists it
    (SlurmError("squeue --noheader: exit 1: slurm_load_jobs error: Invalid job id specified"), "gpu07", True),
    (SlurmError("squeue --noheader: no answer within 5 s"), "gpu07", None),  # cannot tell: kept
])
def test_job_ended_reads_state_and_node(answer: str | Exception, node: str | None, want: bool | None) -> None:
    assert Answers(answer).job_ended("123", node) is want


def test_job_ended_expands_bracketed_node_lists_and_refuses_odd_ids() -> None:
    c = Answers("131  123_4  RUNNING   gpu[06-08]\n", hostnames="gpu06\ngpu07\ngpu08\n")
    assert c.job_ended("123_4", "gpu07") is False
    assert c.calls[-1] == ["scontrol", "show", "hostnames", "gpu[06-08]"]
    two = Answers("123  123  RUNNING   gpu[06-08]\n", hostnames="gpu06\ngpu08\n")
    assert two.job_ended("123", "gpu07") is True
    odd = Answers("123  123  RUNNING   gpu07\n")
    for bad in ("123;rm -rf /", "../x", "12 3", ""):
        assert odd.job_ended(bad, "gpu07") is None
    assert odd.calls == []  # never reached squeue


def test_job_ended_reads_only_the_asked_jobs_line_not_its_array_siblings_or_het_components() -> None:
    """``squeue --jobs 123`` also lists the other tasks of array 123 (123 is the id of the task
    that kept it) and the other components of het job 123: their lines say nothing of job 123."""
    array = ("123  123_2  COMPLETED gpu07\n"
             "124  123_0  RUNNING   gpu07\n"
             "125  123_1  RUNNING   gpu07\n")
    assert Answers(array).job_ended("123", "gpu07") is True
    assert Answers(array).job_ended("123_0", "gpu07") is False  # by its array id too
    het = "123  123+0  COMPLETING gpu07\n124  123+1  RUNNING   gpu07\n"
    assert Answers(het).job_ended("123", "gpu07") is False
    ended = "123  123+0  COMPLETED gpu07\n124  123+1  RUNNING   gpu07\n"
    assert Answers(ended).job_ended("123", "gpu07") is True


@pytest.mark.parametrize(("answer", "want"), [
    ("123  123  wattclass:label=memory;conf=0.93;cap=60%;src=rule;mode=enforce\n",
     "wattclass:label=memory;conf=0.93;cap=60%;src=rule;mode=enforce"),
    ("123  123  (null)\n", None),
    ("123  123  site note wattclass:label=idle;conf=0.9;src=rule;mode=shadow\n",
     "site note wattclass:label=idle;conf=0.9;src=rule;mode=shadow"),
    # a het leader: the other component's decision is not the leader's
    ("123  123+0  (null)\n"
     "124  123+1  wattclass:label=memory;conf=0.93;cap=60%;src=rule;mode=enforce\n", None),
    # an array's own id (the task that kept it): the siblings' lines are not this task's
    ("124  123_0  wattclass:label=idle;conf=0.9;cap=30%;src=rule;mode=enforce\n"
     "123  123_1  wattclass:label=memory;conf=0.93;cap=60%;src=rule;mode=enforce\n",
     "wattclass:label=memory;conf=0.93;cap=60%;src=rule;mode=enforce"),
])
def test_admin_comment_is_the_asked_jobs_own(answer: str, want: str | None) -> None:
    assert Answers(answer).admin_comment("123") == want


def test_admin_comment_without_the_jobs_own_line_is_an_error_not_no_decision() -> None:
    with pytest.raises(SlurmError, match="0 lines for the job itself"):
        Answers("124  123+1  wattclass:label=memory;conf=0.93;cap=60%;src=rule;mode=enforce\n"
                ).admin_comment("123")
