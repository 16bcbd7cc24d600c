"""deploy.scaleout with real Slurm daemons: Dask workers start as Slurm jobs and run work.

Uses the one-node cluster of tests/slurm_cluster.py (real slurmctld, slurmd, munged); skipped
where that helper, the daemons or dask-jobqueue are missing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from distributed import wait

from wattclass.classifier.scaleout import open_client

pytestmark = pytest.mark.slurm
pytest.importorskip("dask_jobqueue")
slurm_cluster = pytest.importorskip("slurm_cluster", reason="needs tests/slurm_cluster.py")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    missing = slurm_cluster.daemons_available()
    if missing:
        pytest.skip(f"Slurm daemons missing: {missing}")
    if os.geteuid() != 0:
        pytest.skip("the test cluster runs its daemons as root")
    cluster = slurm_cluster.SlurmCluster(tmp_path_factory.mktemp("slurm"), cpus=4)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def _squeue(env: dict[str, str]) -> list[str]:
    out = subprocess.run(
        ["squeue", "-h", "-o", "%i %j %T"], env=env, capture_output=True, text=True, check=True
    )
    return [line for line in out.stdout.splitlines() if line.strip()]


def test_slurm_cluster_workers_are_slurm_jobs(
    slurm: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    monkeypatch.setenv("PATH", slurm.env["PATH"])  # dask-jobqueue runs sbatch: the version under test
    # The workers' copy of the run's TLS key and certificate: a folder root trusts (root-owned,
    # 0700). One node: the test's tmp folder is "shared" with the compute node.
    shared = tmp_path / "dask-tls"
    shared.mkdir(mode=0o700)
    shared.chmod(0o700)
    cfg = tmp_path / "dask.toml"
    cfg.write_text(
        'kind = "slurm"\n[slurm]\nqueue = "main"\ncores = 2\nprocesses = 2\nmemory = "1GiB"\n'
        f'walltime = "00:10:00"\njobs = 1\npython = "{sys.executable}"\n'
        f'log_directory = "{tmp_path}"\nlocal_directory = "{tmp_path}"\n'
        f'shared_temp_directory = "{shared}"\n'
    )
    with open_client(config=cfg) as client:
        assert client.scheduler.address.startswith("tls://")
        client.wait_for_workers(2, timeout=90)
        # The workers came in over mutual TLS, with the key and certificate this run made.
        workers = client.scheduler_info()["workers"]
        assert workers and all(addr.startswith("tls://") for addr in workers), list(workers)
        jobs = _squeue(slurm.env)
        assert len(jobs) == 1 and "RUNNING" in jobs[0], jobs
        job_id = jobs[0].split()[0]
        # os.getenv, not a function of this module: the workers cannot import the test module.
        futures = client.map(os.getenv, ["SLURM_JOB_ID"] * 20 + ["SLURM_JOB_PARTITION"] * 20, pure=False)
        wait(futures, timeout=60)
        seen = client.gather(futures)
        assert set(seen[:20]) == {job_id} and set(seen[20:]) == {"main"}  # all ran inside that Slurm job
        assert len({w for ws in client.who_has(futures).values() for w in ws}) == 2
    deadline = time.monotonic() + 30
    while _squeue(slurm.env) and time.monotonic() < deadline:  # closing the client cancels the job
        time.sleep(0.5)
    assert _squeue(slurm.env) == []
    assert list(shared.iterdir()) == []  # the workers' key and certificate went with the cluster
