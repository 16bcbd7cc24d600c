"""Accounting for real: MariaDB + slurmdbd + slurmctld/slurmd, ``sacct --json`` and pyslurm.

One cluster with accounting per module (tests/slurm_cluster.py, ``accounting=True``), on the Slurm
under test (``WATTCLASS_TEST_SLURM``; Debian's 22.05 by default, 25.11 from .ci/build-slurm):

- ``slurmdbd`` tests: the command client's records from ``sacct --json`` (user, name, account,
  partition, times, admin_comment, GPUs, array tasks) and the nightly run joining them; on both
  versions (22.05 with Debian's slurmdbd package).
- ``pyslurm`` tests: pyslurm's live (slurmctld) and slurmdbd records equal the command client's
  for the same jobs, and ``open_slurm_client`` picks pyslurm. They need pyslurm built against the
  Slurm under test (25.11); elsewhere tests/conftest.py deselects them.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from slurm_cluster import ACCOUNT, ClusterError, SlurmCluster, daemons_available

from wattclass.errors import SlurmError
from wattclass.jobrecord import JobRecord
from wattclass.slurm.commands import CommandSlurmClient, installed_pyslurm_version, open_slurm_client

MEM = "wattclass:label=memory;conf=0.93;cap=60%;src=rule;mode=enforce"
BUNDLED = Path(__file__).resolve().parent.parent / "wattclass" / "data" / "h200" / "telemetry.parquet"


class Acct:
    """The cluster, its command client, and the jobs submitted once for every test."""

    def __init__(self, cluster: SlurmCluster) -> None:
        self.cluster = cluster
        self.client = CommandSlurmClient(cluster.conf, timeout=30, bin_dir=cluster.install.bin_dir)
        self.t0 = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(seconds=2)
        c = cluster
        # admin_comment as job_submit.lua would set it: an operator's update before the job runs
        self.gpu = c.sbatch("-o", "/dev/null", "-H", "-J", "acct-gpu", "-p", "debug", "--gres=gpu:2",
                            "--comment=user says hi")
        c.run(["scontrol", "update", f"jobid={self.gpu}", f"AdminComment={MEM}"])
        c.run(["scontrol", "release", self.gpu])
        self.plain = c.sbatch("-o", "/dev/null", "-J", "plain", "--account=benchmark")
        self.array = c.sbatch("-o", "/dev/null", "-J", "sweep", "--array=1-2", "--gres=gpu:1")
        # another user: "daemon", not "nobody": 25.11 gives uid 65534 (NO_VAL16) no association,
        # so no default account (recorded; 22.05 gives it one)
        self.other = c.sbatch("-o", "/dev/null", "-J", "as-daemon", "--chdir=/tmp", "--gres=gpu:1",
                              user="daemon")
        for j in (self.gpu, self.plain, self.other):
            c.wait_job(j, timeout=60)
        self.array_tasks = self._wait_array(f"{self.array}_1", f"{self.array}_2")
        self.wait_accounted([self.gpu, self.plain, self.other, *self.array_tasks])

    def _wait_array(self, *names: str) -> dict[str, str]:
        """Array task name ("12_1") -> its own job id, once every task has completed."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            jobs = self.client.squeue_jobs()
            tasks = {f"{j['array_job_id']}_{j['array_task_id']}": j for j in jobs
                     if j.get("array_job_id") and j.get("array_task_id") is not None}
            if all(n in tasks and tasks[n]["job_state"] == "COMPLETED" for n in names):
                return {n: str(tasks[n]["job_id"]) for n in names}
            time.sleep(0.2)
        raise ClusterError(f"array tasks {names} did not complete")

    def window(self) -> tuple[dt.datetime, dt.datetime]:
        return self.t0, dt.datetime.now(dt.UTC) + dt.timedelta(seconds=5)

    def records(self) -> dict[str, JobRecord]:
        return {r.job_id: r for r in self.client.jobs(*self.window())}

    def wait_accounted(self, ids: list[str], timeout: float = 30) -> None:
        """Until sacct has every job with its end time (slurmdbd is asynchronous)."""
        deadline = time.monotonic() + timeout
        have: dict[str, JobRecord] = {}
        while time.monotonic() < deadline:
            have = self.records()
            if all(i in have and have[i].end is not None for i in ids):
                return
            time.sleep(0.2)
        raise ClusterError(f"jobs {ids} not all in sacct after {timeout} s: {sorted(have)}")


@pytest.fixture(scope="module")
def acct() -> Iterator[Acct]:
    missing = daemons_available(accounting=True)
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI: Slurm accounting daemons missing: {missing}")
        pytest.skip(f"Slurm accounting daemons missing: {missing}")
    root = Path(tempfile.mkdtemp(prefix="wattclass-acct-"))
    root.chmod(0o755)  # the job run as nobody needs to reach its files
    cluster = SlurmCluster(root, accounting=True)
    try:
        cluster.start(timeout=60)
        yield Acct(cluster)
    except (ClusterError, OSError) as exc:
        print(cluster.logs(), file=sys.stderr)
        raise ClusterError(f"accounting cluster: {exc}") from exc
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


# -- slurmdbd: sacct --json through the command client --------------------------------------------
@pytest.mark.slurmdbd
def test_sacct_records_carry_the_job_fields(acct: Acct) -> None:
    recs = acct.records()
    lo, hi = acct.window()
    gpu = recs[acct.gpu]
    assert (gpu.name, gpu.user, gpu.account, gpu.partition) == ("acct-gpu", "root", ACCOUNT, "debug")
    assert gpu.admin_comment == MEM and gpu.gpus == 2
    assert gpu.start is not None and gpu.end is not None and lo <= gpu.start <= gpu.end <= hi
    plain = recs[acct.plain]
    assert (plain.account, plain.partition, plain.admin_comment, plain.gpus) == \
        ("benchmark", "main", None, None)
    other = recs[acct.other]
    assert (other.user, other.account, other.gpus) == ("daemon", ACCOUNT, 1)  # --allusers


@pytest.mark.slurmdbd
def test_array_tasks_are_named_like_telemetry_and_the_window_filters(acct: Acct) -> None:
    recs = acct.records()
    for name in acct.array_tasks:
        assert recs[name].name == "sweep" and recs[name].gpus == 1
    assert not set(acct.array_tasks.values()) & set(recs)  # only under their "N_i" names
    before = acct.client.jobs(acct.t0 - dt.timedelta(hours=2), acct.t0 - dt.timedelta(hours=1))
    assert before == []


@pytest.mark.slurmdbd
def test_running_job_has_a_start_and_no_end(acct: Acct) -> None:
    c = acct.cluster
    job = c.sbatch("-o", "/dev/null", "-J", "long", "--gres=gpu:1", script="#!/bin/sh\nsleep 60\n")
    try:
        c.wait_job(job, states=("RUNNING",), timeout=60)
        deadline = time.monotonic() + 20
        rec = None
        while time.monotonic() < deadline and (rec is None or rec.start is None):
            rec = acct.records().get(job)
            time.sleep(0.2)
        assert rec is not None and rec.start is not None and rec.end is None and rec.gpus == 1
    finally:
        c.run(["scancel", job])
        c.wait_job(job, states=("CANCELLED",), timeout=30)


def _poll(what: str, ok: Any, timeout: float = 60) -> Any:
    """``ok()``'s first truthy answer, polled every 0.2 s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = ok()
        if got:
            return got
        time.sleep(0.2)
    raise ClusterError(f"{what}: not after {timeout} s")


@pytest.fixture(scope="module")
def requeued(acct: Acct) -> str:
    """A job requeued while it ran (``scontrol requeue``), run again and completed; its id.

    Slurm holds a requeued job back (reason BeginTime) for 120 s (22.05 and 25.11, recorded);
    ``StartTime=now+2`` once it says so lets it run again within seconds. 22.05 may record that
    run's eligible time as Unknown, and its time-window sacct query then lists the run only some
    seconds after ``sacct -j`` does (recorded): both are waited for. The first run sleeps until
    requeued; the second (SLURM_RESTART_COUNT=1) ends at once."""
    c = acct.cluster
    job = c.sbatch("-o", "/dev/null", "-J", "requeued", "--requeue", "--gres=gpu:1",
                   script='#!/bin/sh\n[ "${SLURM_RESTART_COUNT:-0}" -gt 0 ] || sleep 60\n')
    c.wait_job(job, states=("RUNNING",), timeout=60)
    c.run(["scontrol", "requeue", job])
    _poll(f"job {job} pending after its requeue", lambda: c.job(job).get("state_reason") == "BeginTime")
    c.run(["scontrol", "update", f"jobid={job}", "StartTime=now+2"])
    c.wait_job(job, timeout=60)
    # slurmdbd is asynchronous: until sacct's own text lists both runs (not through the clients)
    _poll(f"both runs of job {job} in slurmdbd", lambda: c.run(
        ["sacct", "-n", "-X", "--duplicates", "-j", job, "-o", "state"]).split() == ["REQUEUED", "COMPLETED"])
    # and in the time-window query (22.05: a moment later, see above)
    _poll(f"both runs of job {job} in the window", lambda: len(
        [r for r in acct.client.jobs(*acct.window()) if r.job_id == job and r.end is not None]) == 2,
        timeout=30)
    return job


def _runs(client: Any, acct: Acct, job: str) -> list[JobRecord]:
    return sorted((r for r in client.jobs(*acct.window()) if r.job_id == job), key=lambda r: r.start)


@pytest.mark.slurmdbd
def test_sacct_lists_each_run_of_a_requeued_job(acct: Acct, requeued: str) -> None:
    first, last = _runs(acct.client, acct, requeued)
    lo, hi = acct.window()
    assert first.start and first.end and last.start and last.end
    assert lo <= first.start <= first.end <= last.start <= last.end <= hi
    assert first.nodes == last.nodes == "localhost"  # one node here: the runs differ in time
    assert (first.name, first.gpus, first.slurm_job_id) == (last.name, last.gpus, last.slurm_job_id) \
        == ("requeued", 1, requeued)


def _telemetry_for(root: Path, date: str, jobs: dict[str, tuple[str | None, JobRecord]]) -> None:
    """Recorded H200 telemetry re-keyed to real Slurm job ids (one bundled job each), so the
    nightly run has something to label and join. ``jobs``: job id (as telemetry names it) -> user
    (None: left empty) and the job's record: each job's windows start at its recorded start, on
    its recorded node, and end by its recorded end (+ half the slack), as the daemon's would."""
    from wattclass.classifier.validity import JOB_TIME_SLACK_S
    from wattclass.jobrecord import hostnames

    src = pd.read_parquet(BUNDLED)
    first = sorted(src["job_id"].dropna().unique())[: len(jobs)]
    parts = []
    for (job_id, (user, rec)), old in zip(jobs.items(), first, strict=True):
        assert rec.start is not None and rec.end is not None and rec.nodes is not None
        part = src[src["job_id"] == old].copy()
        shift = pd.Timestamp(rec.start) - part["ts_start"].min()
        part["ts_start"] += shift
        part["ts_end"] += shift
        keep = part["ts_end"] <= pd.Timestamp(rec.end) + pd.Timedelta(seconds=JOB_TIME_SLACK_S / 2)
        part = part[keep | (part["ts_start"] == part["ts_start"].min())]
        part["job_id"] = job_id
        part["user"] = user
        part["host"] = (hostnames(rec.nodes) or ["?"])[0]
        parts.append(part)
    out = root / "telemetry" / f"date={date}"
    out.mkdir(parents=True)
    pd.concat(parts).to_parquet(out / "node.parquet", index=False)


def _nightly(acct: Acct, tmp_path: Path, slurm: Any,
             hostile: bool = False) -> tuple[dict[str, Any], pd.DataFrame]:
    from wattclass.classifier.nightly import NightlyOptions, run_nightly
    from wattclass.classifier.store import ClassifierStore

    date = acct.t0.date().isoformat()
    if dt.datetime.now(dt.UTC).date() != acct.t0.date():
        pytest.skip("the jobs ran just before midnight UTC; the nightly's day window missed them")
    name = min(acct.array_tasks)
    task = acct.array_tasks[name]  # telemetry knows the task by its own job id
    recs = acct.records()
    _telemetry_for(tmp_path, date, {acct.gpu: (None, recs[acct.gpu]), acct.plain: ("root", recs[acct.plain]),
                                    acct.other: (None, recs[acct.other]), task: (None, recs[name])})
    if hostile:  # root's windows from a node no job ran on, claiming daemon's job
        w = pd.read_parquet(tmp_path / "telemetry" / f"date={date}" / "node.parquet")
        w = w[w["job_id"] == acct.gpu].assign(job_id=acct.other, user="root", host="not-a-node")
        w.to_parquet(tmp_path / "telemetry" / f"date={date}" / "evil.parquet", index=False)
    opts = NightlyOptions(data_root=tmp_path, date=date, table_out=tmp_path / "table.lua", retrain=False)
    summary = run_nightly(opts, slurm)
    labels = ClassifierStore(tmp_path).label_history(date).set_index("job_id")
    return summary, labels


@pytest.mark.slurmdbd
def test_nightly_joins_real_sacct_records(acct: Acct, tmp_path: Path) -> None:
    summary, labels = _nightly(acct, tmp_path, acct.client)
    assert summary["status"] == "ok" and summary["jobs"] == 4 and summary["slurm_backend"] == "commands"
    recs = acct.records()
    for job in (acct.gpu, acct.plain, acct.other):
        row, rec = labels.loc[job], recs[job]
        assert (row["name"], row["account"], row["partition"]) == (rec.name, rec.account, rec.partition)
        assert pd.Timestamp(row["slurm_start"]) == pd.Timestamp(rec.start)
        assert pd.Timestamp(row["slurm_end"]) == pd.Timestamp(rec.end)
    assert labels.loc[acct.gpu, "user"] == "root"  # missing in telemetry: taken from Slurm
    assert labels.loc[acct.other, "user"] == "daemon"
    assert labels.loc[acct.gpu, "label"] in ("compute", "memory", "idle", "mixed")
    name = min(acct.array_tasks)  # "N_1": sacct's name; the Prolog's job files carry its own id
    task = labels.loc[acct.array_tasks[name]]
    assert (task["name"], task["user"]) == ("sweep", "root")
    assert pd.Timestamp(task["slurm_end"]) == pd.Timestamp(recs[name].end)
    assert summary["rejected_rows"]["count"] == 0  # every window agrees with its job's record


@pytest.mark.slurmdbd
def test_real_sacct_records_reject_a_claim_from_a_foreign_node(acct: Acct, tmp_path: Path) -> None:
    from wattclass.classifier.validity import REJECT_JOB_HOST

    _, before = _nightly(acct, tmp_path / "clean", acct.client)
    summary, labels = _nightly(acct, tmp_path / "hostile", acct.client, hostile=True)
    n = int(before.loc[acct.gpu, "n_windows"])
    assert summary["rejected_rows"] == {"count": n, REJECT_JOB_HOST: n}
    assert labels.loc[acct.other, "n_windows"] == before.loc[acct.other, "n_windows"]
    assert labels.loc[acct.other, "label"] == before.loc[acct.other, "label"]
    assert acct.records()[acct.other].nodes  # sacct --json gave the job's nodes


# -- pyslurm against the same cluster -------------------------------------------------------------
@pytest.fixture(scope="module")
def pyslurm_client(acct: Acct) -> Any:
    if installed_pyslurm_version() is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI: pyslurm is not installed in this interpreter (see .ci/run)")
        pytest.skip("pyslurm is not installed (docs/slurm.md: building pyslurm)")
    # pyslurm reads slurm.conf once, at import, from SLURM_CONF
    os.environ["SLURM_CONF"] = str(acct.cluster.conf)
    client = open_slurm_client(str(acct.cluster.conf), bin_dir=acct.cluster.install.bin_dir)
    assert client.name == "pyslurm", "pyslurm is installed for this Slurm but was not picked"
    return client


@pytest.mark.pyslurm
def test_open_slurm_client_picks_pyslurm_and_says_so(acct: Acct, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="wattclass.slurm.commands"):
        client = open_slurm_client(str(acct.cluster.conf), bin_dir=acct.cluster.install.bin_dir)
    assert client.name == "pyslurm"
    assert f"Slurm job records: pyslurm (pyslurm {installed_pyslurm_version()} matches Slurm " \
           f"{acct.cluster.install.version})" in caplog.text


@pytest.mark.pyslurm
def test_pyslurm_db_records_equal_sacct_records(acct: Acct, pyslurm_client: Any) -> None:
    lo, hi = acct.window()
    ours = sorted(acct.client.jobs(lo, hi), key=lambda r: r.job_id)
    theirs = sorted(pyslurm_client.jobs(lo, hi), key=lambda r: r.job_id)
    assert len(ours) >= 5
    assert theirs == ours


@pytest.mark.pyslurm
def test_pyslurm_live_jobs_equal_squeue(acct: Acct, pyslurm_client: Any) -> None:
    """slurmctld's view (pyslurm.Jobs / pyslurm.Job) against squeue --json for the same jobs."""
    squeue = {str(j["job_id"]): j for j in acct.client.squeue_jobs()}
    live = {r.job_id: r for r in pyslurm_client.live_jobs()}
    one = pyslurm_client.live_job(acct.gpu)
    assert one is not None and one == live[acct.gpu]
    assert pyslurm_client.live_job("99999999") is None
    with pytest.raises(SlurmError, match="invalid job id"):
        pyslurm_client.live_job("1;rm")
    for job_id in (acct.gpu, acct.plain, acct.other):
        j, r = squeue[job_id], live[job_id]
        assert (r.name, r.user, r.account, r.partition) == (j["name"], j["user_name"], j["account"] or None,
                                                            j["partition"])
        assert r.admin_comment == (j["admin_comment"] or None)
        assert (int(r.start.timestamp()), int(r.end.timestamp())) == (j["start_time"], j["end_time"])  # type: ignore[union-attr]
    assert live[acct.gpu].gpus == 2 and live[acct.other].gpus == 1 and live[acct.plain].gpus is None
    # live array tasks: pyslurm names them like telemetry and sacct do
    recs = acct.records()
    for name in acct.array_tasks:
        assert live[name] == recs[name]


@pytest.mark.pyslurm
def test_nightly_through_pyslurm_equals_the_command_backend(acct: Acct, pyslurm_client: Any,
                                                            tmp_path: Path) -> None:
    s_cmd, l_cmd = _nightly(acct, tmp_path / "commands", acct.client)
    s_py, l_py = _nightly(acct, tmp_path / "pyslurm", pyslurm_client)
    assert (s_cmd["slurm_backend"], s_py["slurm_backend"]) == ("commands", "pyslurm")
    cols = ["user", "name", "account", "partition", "slurm_start", "slurm_end", "label"]
    pd.testing.assert_frame_equal(l_py[cols].sort_index(), l_cmd[cols].sort_index())
    assert l_py["name"].notna().all()


@pytest.mark.pyslurm
def test_pyslurm_gives_each_run_of_a_requeued_job_like_sacct(acct: Acct, pyslurm_client: Any,
                                                               requeued: str) -> None:
    import pyslurm  # type: ignore[import-not-found,unused-ignore]

    lo, hi = acct.window()
    window = pyslurm.db.JobFilter(start_time=int(lo.timestamp()), end_time=int(hi.timestamp()))
    db = pyslurm.db.Jobs.load(window)
    one = db[int(requeued)]  # slurmdbd's query gives one record per id: the last run's
    assert one.requeue_count == 1
    runs = _runs(pyslurm_client, acct, requeued)
    assert len(runs) == 2 and runs == _runs(acct.client, acct, requeued)
    assert int(runs[1].start.timestamp()) == one.start_time  # type: ignore[union-attr]
