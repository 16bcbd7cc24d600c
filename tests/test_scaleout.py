"""deploy.scaleout: cluster configs parse strictly, and the clients it opens really run work."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from wattclass.classifier.scaleout import LocalConfig, load_config, local_cluster, open_client, slurm_cluster
from wattclass.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent
#: In-process (thread) workers: no memory limit. Dask measures a thread worker's memory as the
#: whole process's, and pauses the worker at 80% of its limit; late in the full suite the pytest
#: process holds about 0.9 GiB, so with a 1 GiB limit the workers paused and the tests waited
#: forever (seen in CI).
THREADS = LocalConfig(n_workers=2, threads_per_worker=1, processes=False, memory_limit="0")


def _square_sum(n: int) -> int:
    return sum(i * i for i in range(n))


def test_local_cluster_runs_tasks_on_both_workers() -> None:
    with open_client(local=THREADS) as client:
        assert len(client.scheduler_info()["workers"]) == 2
        futures = client.map(_square_sum, range(50))
        assert client.gather(futures) == [_square_sum(n) for n in range(50)]
        who = client.who_has(futures)
    assert len({w for ws in who.values() for w in ws}) == 2  # the work was spread


def test_open_client_connects_to_a_running_scheduler_and_leaves_it_running() -> None:
    cluster = local_cluster(THREADS)
    try:
        with open_client(scheduler=cluster.scheduler_address) as client:
            assert client.submit(_square_sum, 10).result() == 285
        with open_client(scheduler=cluster.scheduler_address) as client:  # still up
            assert client.submit(_square_sum, 3).result() == 5
    finally:
        cluster.close()


def test_config_file_kind_local(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('kind = "local"\n[local]\nn_workers = 1\nprocesses = false\n')
    with open_client(config=cfg) as client:
        assert len(client.scheduler_info()["workers"]) == 1
        assert client.submit(_square_sum, 4).result() == 14


def test_example_config_builds_the_slurm_job_script(tmp_path: Path) -> None:
    pytest.importorskip("dask_jobqueue")
    cfg = load_config(REPO / "deploy" / "dask-slurm.example.toml")
    assert cfg.kind == "slurm"
    s = cfg.slurm
    # Build the cluster without submitting anything: jobs=0, no adapt.
    cluster = slurm_cluster(replace(s, jobs=0, log_directory=str(tmp_path)))
    try:
        script = cluster.job_script()
    finally:
        cluster.close()
    assert "#SBATCH -p cpu" in script
    assert "#SBATCH -A wattclass" in script
    assert "#SBATCH --qos=normal" in script
    assert "#SBATCH -t 01:00:00" in script
    assert "source /opt/wattclass/venv/bin/activate" in script
    assert "/opt/wattclass/venv/bin/python -m distributed.cli.dask_worker" in script
    assert "--nworkers 4" in script and "--nthreads 2" in script


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('kind = "cloud"\n', "kind must be one of"),
        ('kind = "scheduler"\n', "needs address"),
        ('kind = "slurm"\n[slurm]\nqueue = "cpu"\nnodes = 3\n', "unknown key 'nodes'"),
        ('kind = "slurm"\n[slurm]\ncores = "eight"\n', "slurm.cores"),
        ('kind = "slurm"\n[slurm]\ncores = 2\nprocesses = 4\n', "slurm.cores (2)"),
        ('kind = "slurm"\n[slurm]\njob_extra_directives = "--qos=x"\n', "job_extra_directives"),
        ('kind = "local"\n[local]\nprocesses = 1\n', "local.processes"),
        ('kind = "local"\nworkers = 3\n', "unknown key(s) workers"),
        ("kind = \n", "not valid TOML"),
    ],
)
def test_bad_configs_name_file_and_key(tmp_path: Path, text: str, needle: str) -> None:
    cfg = tmp_path / "cluster.toml"
    cfg.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(cfg)
    assert needle in str(err.value)
    assert str(cfg) in str(err.value)


def test_missing_config_and_conflicting_targets(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "none.toml")
    with (
        pytest.raises(ConfigError, match="--scheduler or --dask-config, not both"),
        open_client(scheduler="tcp://x:1", config=tmp_path / "c"),
    ):
        pass


@pytest.mark.parametrize("bad", ["other owner", "writable by others", "folder writable by others", "symlink"])
def test_a_cluster_config_another_user_could_change_is_refused(tmp_path: Path, bad: str) -> None:
    """The config's ``python`` and ``job_script_prologue`` go into the sbatch scripts the nightly
    submits (as root under the shipped unit): it was read whoever owned or could write it."""
    folder = tmp_path / "etc"
    folder.mkdir()
    cfg = folder / "dask.toml"
    cfg.write_text('kind = "slurm"\n[slurm]\njob_script_prologue = ["id > /tmp/owned"]\n')
    if bad == "other owner":
        os.chown(cfg, 65534, 65534)
    elif bad == "writable by others":
        cfg.chmod(0o666)
    elif bad == "folder writable by others":
        folder.chmod(0o777)
    else:
        real = tmp_path / "real.toml"
        cfg.rename(real)
        cfg.symlink_to(real)
    if os.geteuid() != 0 and bad == "other owner":
        pytest.skip("chown needs root")
    with pytest.raises(ConfigError, match="refusing") as err:
        load_config(cfg)
    assert str(cfg) in str(err.value)
