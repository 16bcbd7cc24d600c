"""The optional pyslurm backend: field mapping and when open_slurm_client picks it.

No pyslurm release builds against Debian 12's Slurm 22.05, so pyslurm itself is replaced by a
stand-in module with the ``pyslurm.db`` surface (the library boundary, like NVML's).
"""

from __future__ import annotations

import datetime as dt
import sys
import types
from typing import Any

import pytest

from wattclass.errors import SlurmError
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


def test_slurmdbd_failure_is_a_slurm_error_naming_the_range() -> None:
    with pytest.raises(SlurmError, match="pyslurm: loading jobs 2026-11-29"):
        PySlurmClient(fake_pyslurm([], fail=True)).jobs(T0, T0 + dt.timedelta(hours=1))


def test_open_client_uses_pyslurm_only_when_versions_match(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyslurm", fake_pyslurm([], version="25.11.2"))
    assert isinstance(open_slurm_client(version="25.11.0"), PySlurmClient)
    # Debian 12's Slurm with PyPI's pyslurm: the command client
    assert isinstance(open_slurm_client(version="22.05.8"), CommandSlurmClient)


def test_open_client_without_pyslurm_is_the_command_client(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyslurm", None)  # import fails
    assert isinstance(open_slurm_client(version="25.11.0"), CommandSlurmClient)
