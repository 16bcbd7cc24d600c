"""The optional pyslurm backend: field mapping and when open_slurm_client picks it.

These unit tests replace pyslurm by a stand-in module with the ``pyslurm.db`` surface, so they
run anywhere; the real pyslurm 25.11 against a live 25.11 cluster is tested in
tests/test_slurm_accounting.py (marker ``pyslurm``).
"""

from __future__ import annotations

import datetime as dt
import logging
import sys
import types
from typing import Any

import pytest

from wattclass.errors import SlurmError
from wattclass.jobrecord import JobRecord
from wattclass.slurm import commands
from wattclass.slurm.commands import CommandSlurmClient, open_slurm_client
from wattclass.slurm.pyslurm_client import PySlurmClient

T0 = dt.datetime(2026, 11, 29, tzinfo=dt.UTC)


def fake_pyslurm(jobs: list[Any], version: str = "25.11.0", fail: bool = False) -> types.ModuleType:
    seen: dict[str, Any] = {}

    class JobFilter:
        def __init__(self, **kw: Any) -> None:
            seen["filter"] = kw

    class Jobs:
        @staticmethod
        def load(f: JobFilter) -> list[Any]:
            if fail:
                raise RuntimeError("Failed to get Jobs from slurmdbd")
            return jobs

    mod = types.ModuleType("pyslurm")
    mod.__version__ = version  # type: ignore[attr-defined]
    mod.db = types.SimpleNamespace(JobFilter=JobFilter, Jobs=Jobs)  # type: ignore[attr-defined]
    mod.seen = seen  # type: ignore[attr-defined]
    return mod


def test_records_map_fields_array_ids_and_times() -> None:
    jobs = [
        types.SimpleNamespace(id=41, name="train.sh", user_name="alice", account="llm", partition="gpu",
                              start_time=1795967767, end_time=0, array_id=0, array_task_id=0xFFFFFFFE,
                              admin_comment="wattclass:label=memory"),
        types.SimpleNamespace(id=57, name="sweep", user_name="bob", account=None, partition="gpu",
                              start_time=1795967800, end_time=1795967900, array_id=50, array_task_id=7,
                              admin_comment=""),
    ]
    mod = fake_pyslurm(jobs)
    recs = PySlurmClient(mod).jobs(T0, T0 + dt.timedelta(days=1))
    assert mod.seen["filter"] == {"start_time": int(T0.timestamp()),  # type: ignore[attr-defined]
                                  "end_time": int(T0.timestamp()) + 86400}
    assert [r.job_id for r in recs] == ["41", "50_7"]
    assert recs[0].user == "alice" and recs[0].end is None
    assert recs[0].admin_comment == "wattclass:label=memory"
    assert recs[0].start == dt.datetime.fromtimestamp(1795967767, dt.UTC)
    assert recs[1].account is None and recs[1].admin_comment is None


class FakeRuns(CommandSlurmClient):
    """The command client's ``job_runs`` (sacct --duplicates --jobs): canned runs, calls kept."""

    def __init__(self, runs: list[JobRecord], fail: bool = False) -> None:
        super().__init__()
        self.runs, self.fail = runs, fail
        self.calls: list[Any] = []

    def job_runs(self, job_ids: Any, start: dt.datetime, end: dt.datetime) -> list[JobRecord]:
        self.calls.append((list(job_ids), start, end))
        if self.fail:
            raise SlurmError("sacct: rc 1: slurmdbd down")
        return self.runs


def _db_job(job_id: int, requeues: int, start: int, end: int, nodes: str) -> Any:
    return types.SimpleNamespace(id=job_id, name="j", user_name="alice", account="a", partition="gpu",
                                 start_time=start, end_time=end, array_id=0, array_task_id=0xFFFFFFFE,
                                 admin_comment="", requeue_count=requeues, nodelist=nodes)


def _run(job_id: str, start: int, end: int, nodes: str) -> JobRecord:
    return JobRecord(job_id, "j", "alice", "a", "gpu", dt.datetime.fromtimestamp(start, dt.UTC),
                     dt.datetime.fromtimestamp(end, dt.UTC), None, None, job_id, nodes)


def test_a_requeued_jobs_one_record_becomes_its_runs_from_sacct() -> None:
    t = int(T0.timestamp())
    mod = fake_pyslurm([_db_job(7, 0, t + 10, t + 20, "gpu1"), _db_job(8, 1, t + 500, t + 600, "gpu3")])
    runs = FakeRuns([_run("8", t + 30, t + 90, "gpu2"), _run("8", t + 500, t + 600, "gpu3")])
    end = T0 + dt.timedelta(days=1)
    recs = PySlurmClient(mod, runs=runs).jobs(T0, end)
    assert runs.calls == [(["8"], T0, end)]  # only the requeued job, in the same window
    assert [(r.job_id, r.nodes) for r in recs] == [("7", "gpu1"), ("8", "gpu2"), ("8", "gpu3")]


def test_without_requeued_jobs_sacct_is_not_asked() -> None:
    t = int(T0.timestamp())
    runs = FakeRuns([])
    recs = PySlurmClient(fake_pyslurm([_db_job(7, 0, t, t + 5, "gpu1")]), runs=runs).jobs(T0, T0)
    assert runs.calls == [] and len(recs) == 1


def test_when_sacct_fails_the_last_run_stays_and_a_warning_names_the_job(
        caplog: pytest.LogCaptureFixture) -> None:
    t = int(T0.timestamp())
    mod = fake_pyslurm([_db_job(8, 2, t + 500, t + 600, "gpu3")])
    with caplog.at_level(logging.WARNING, logger="wattclass.slurm.pyslurm_client"):
        recs = PySlurmClient(mod, runs=FakeRuns([], fail=True)).jobs(T0, T0 + dt.timedelta(days=1))
    assert [(r.job_id, r.nodes) for r in recs] == [("8", "gpu3")]
    assert "1 requeued job(s) (e.g. 8): their earlier runs are unknown (sacct: rc 1: slurmdbd down)" \
        in caplog.text


def test_slurmdbd_failure_is_a_slurm_error_naming_the_range() -> None:
    with pytest.raises(SlurmError, match="pyslurm: loading jobs 2026-11-29"):
        PySlurmClient(fake_pyslurm([], fail=True)).jobs(T0, T0 + dt.timedelta(hours=1))


def test_open_client_uses_pyslurm_only_when_versions_match(monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(commands, "installed_pyslurm_version", lambda: "25.11.2")
    monkeypatch.setitem(sys.modules, "pyslurm", fake_pyslurm([], version="25.11.2"))
    with caplog.at_level(logging.INFO, logger="wattclass.slurm.commands"):
        client = open_slurm_client(version="25.11.0")
    assert isinstance(client, PySlurmClient) and client.name == "pyslurm"
    assert "Slurm job records: pyslurm (pyslurm 25.11.2 matches Slurm 25.11.0)" in caplog.text
    caplog.clear()
    # Debian 12's Slurm with PyPI's pyslurm: the command client, and pyslurm is NOT imported
    # (its import fatal()s on another version's plugins)
    monkeypatch.setitem(sys.modules, "pyslurm", None)  # an import would raise
    with caplog.at_level(logging.INFO, logger="wattclass.slurm.commands"):
        client = open_slurm_client(version="22.05.8")
    assert isinstance(client, CommandSlurmClient) and client.name == "commands"
    assert "Slurm commands (pyslurm 25.11.2 is built for Slurm 25.11, not 22.05.8)" in caplog.text


def test_open_client_without_pyslurm_is_the_command_client(monkeypatch: pytest.MonkeyPatch,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(commands, "installed_pyslurm_version", lambda: None)
    with caplog.at_level(logging.INFO, logger="wattclass.slurm.commands"):
        assert isinstance(open_slurm_client(version="25.11.0"), CommandSlurmClient)
    assert "pyslurm is not installed" in caplog.text
    # installed but broken (e.g. libslurmfull gone): the command client, saying why
    monkeypatch.setattr(commands, "installed_pyslurm_version", lambda: "25.11.2")
    monkeypatch.setitem(sys.modules, "pyslurm", None)
    with caplog.at_level(logging.INFO, logger="wattclass.slurm.commands"):
        assert isinstance(open_slurm_client(version="25.11.7"), CommandSlurmClient)
    assert "pyslurm 25.11.2 does not import" in caplog.text


class _RawJob(types.SimpleNamespace):
    """A pyslurm db.Job whose C strings hold ``raw`` bytes: pyslurm's Cython properties decode them
    as strict UTF-8 when read (cstr.to_unicode, c_string_encoding=default), as these do."""

    raw: dict[str, bytes]

    def __getattribute__(self, attr: str) -> Any:
        raw = object.__getattribute__(self, "__dict__").get("raw", {})
        if attr in raw:
            return raw[attr].decode("utf-8")
        return object.__getattribute__(self, attr)


def test_a_job_name_that_is_not_utf8_is_dropped_not_a_failed_night(caplog: pytest.LogCaptureFixture) -> None:
    """A Slurm user's job name in another encoding (sbatch -J $'caf\\xe9') made pyslurm raise
    UnicodeDecodeError out of jobs(): not a SlurmError, so the nightly failed every night for the
    8 days the job stayed in its window (no labels, no label table). The command client reads the
    same name with errors='replace'; here the name is dropped, as the jobs-file client drops it.
    A user or account pyslurm cannot read skips that one record. Found by a fresh-eyes review."""
    ok = dict(start_time=1795967767, end_time=1795967900, array_id=0, array_task_id=0xFFFFFFFE,
              admin_comment="", partition="gpu", account="llm")
    jobs = [
        _RawJob(id=41, user_name="alice", raw={"name": b"caf\xe9"}, **ok),
        _RawJob(id=42, name="fine", user_name="bob", **ok),
        _RawJob(id=43, name="x", raw={"user_name": b"\xff"}, **ok),
    ]
    with caplog.at_level(logging.WARNING):
        recs = PySlurmClient(fake_pyslurm(jobs)).jobs(T0, T0 + dt.timedelta(days=1))
    assert [(r.job_id, r.name, r.user) for r in recs] == [("41", None, "alice"), ("42", "fine", "bob")]
    assert "job 41: name not UTF-8, dropped" in caplog.text
    assert "job 43: user_name not UTF-8; record skipped" in caplog.text
