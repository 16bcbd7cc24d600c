"""deploy.scaleout: cluster configs parse strictly, and the clients it opens really run work."""

from __future__ import annotations

import logging
import os
import socket
import ssl
import stat
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from wattclass.classifier.scaleout import (
    LocalConfig,
    SlurmConfig,
    load_config,
    local_cluster,
    open_client,
    slurm_cluster,
)
from wattclass.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent
#: In-process (thread) workers: no memory limit. Dask measures a thread worker's memory as the
#: whole process's, and pauses the worker at 80% of its limit; late in the full suite the pytest
#: process holds about 0.9 GiB, so with a 1 GiB limit the workers paused and the tests waited
#: forever (seen in CI).
THREADS = LocalConfig(n_workers=2, threads_per_worker=1, processes=False, memory_limit="0")


def _square_sum(n: int) -> int:
    return sum(i * i for i in range(n))


def _http_hosts(server: Any) -> set[str]:
    """The addresses a Dask scheduler's or worker's HTTP server listens on."""
    return {sock.getsockname()[0] for sock in server.http_server._sockets.values()}


def test_local_cluster_runs_tasks_on_both_workers() -> None:
    with open_client(local=THREADS) as client:
        assert len(client.scheduler_info()["workers"]) == 2
        # Dask starts an HTTP server (metrics, /info pages, /proxy) in the scheduler and each worker
        # even without a dashboard; with thread workers it listened on every interface
        cluster = client.cluster
        assert _http_hosts(cluster.scheduler) == {"127.0.0.1"}
        assert all(_http_hosts(w) == {"127.0.0.1"} for w in cluster.workers.values())
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


def _shared_dir(tmp_path: Path) -> Path:
    """A folder fit for slurm.shared_temp_directory: ours (root in CI), mode 0700."""
    d = tmp_path / "dask-tls"
    d.mkdir(mode=0o700)
    d.chmod(0o700)
    return d


def test_example_config_builds_the_slurm_job_script(tmp_path: Path) -> None:
    pytest.importorskip("dask_jobqueue")
    cfg = load_config(REPO / "deploy" / "dask-slurm.example.toml")
    assert cfg.kind == "slurm"
    s = cfg.slurm
    assert s.tls and s.shared_temp_directory  # the example keeps TLS on
    # Build the cluster without submitting anything: jobs=0, no adapt.
    cluster = slurm_cluster(replace(s, jobs=0, log_directory=str(tmp_path),
                                    shared_temp_directory=str(_shared_dir(tmp_path))))
    try:
        script = cluster.job_script()
    finally:
        cluster.close()
    assert "#SBATCH -p cpu" in script
    assert "#SBATCH -A wattclass" in script
    assert "#SBATCH --qos=normal" in script
    assert "#SBATCH -t 01:00:00" in script
    assert "source /opt/wattclass/bin/activate" in script
    assert "/opt/wattclass/bin/python -m distributed.cli.dask_worker" in script
    assert "--nworkers 4" in script and "--nthreads 2" in script
    assert "--protocol tls://" in script and "--tls-key" in script


def test_example_config_runs_the_workers_in_the_environment_admin_md_installs() -> None:
    """admin.md installs wattclass with ``python3 -m venv /opt/wattclass``; the example config (and
    SCALEOUT.md's copy of it) started the workers with /opt/wattclass/venv/bin/python, an
    interpreter that install never made, so every worker job failed at once."""
    import re

    venv = re.search(r"python3 -m venv (\S+)", (REPO / "docs" / "admin.md").read_text())
    assert venv is not None
    s = load_config(REPO / "deploy" / "dask-slurm.example.toml").slurm
    assert s.python == f"{venv.group(1)}/bin/python"
    assert s.job_script_prologue == (f"source {venv.group(1)}/bin/activate",)
    scaleout = (REPO / "deploy" / "SCALEOUT.md").read_text()
    assert f'python = "{venv.group(1)}/bin/python"' in scaleout and "/venv/bin/" not in scaleout


def _tls_options(script: str) -> dict[str, str]:
    words = script.split()
    return {w: words[i + 1] for i, w in enumerate(words) if w.startswith("--tls-")}


def _talk_without_a_certificate(address: str, ca_pem: str) -> None:
    """A TLS peer that trusts ``ca_pem`` but shows no certificate of its own."""
    host, port = address.removeprefix("tls://").rsplit(":", 1)
    ctx = ssl.create_default_context(cadata=ca_pem)
    ctx.check_hostname = False
    with socket.create_connection((host, int(port)), timeout=5) as raw, ctx.wrap_socket(raw) as conn:
        # TLS 1.3: the server's refusal (its alert, or an EOF when its close comes first) arrives
        # after the client's handshake; a server that took the peer raises no TLS error here
        conn.recv(1)


def test_slurm_cluster_speaks_mutual_tls_and_its_workers_get_this_runs_certificate(tmp_path: Path) -> None:
    pytest.importorskip("dask_jobqueue")
    from distributed import Client
    from distributed.security import Security

    shared = _shared_dir(tmp_path)
    cfg = tmp_path / "dask.toml"
    cfg.write_text(f'kind = "slurm"\n[slurm]\njobs = 0\nshared_temp_directory = "{shared}"\n'
                   f'log_directory = "{tmp_path}"\n')
    with open_client(config=cfg) as client:  # jobs = 0: nothing is submitted
        cluster = client.cluster
        assert cluster.scheduler_address.startswith("tls://")
        assert client.scheduler.address.startswith("tls://")  # root's own client speaks TLS too
        script = cluster.job_script()
        assert "--protocol tls://" in script
        # the HTTP servers TLS does not cover (plain, no authentication) stay on loopback: the
        # scheduler's listened on every interface at :8787 though no dashboard was asked for
        assert _http_hosts(cluster.scheduler) == {"127.0.0.1"}
        assert "--dashboard-address 127.0.0.1:0 --no-dashboard" in script
        tls = _tls_options(script)
        assert set(tls) == {"--tls-ca-file", "--tls-cert", "--tls-key"}, tls
        for path in tls.values():  # the workers' copy: in the shared folder, only root can read it
            assert Path(path).parent == shared
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        # Mutual: the scheduler refuses a peer without this run's certificate. The stranger trusts
        # the run's CA, so only the scheduler's own check can stop it (a client that distrusts the
        # scheduler's certificate fails on its side and says nothing of the scheduler's).
        other = Security.temporary()
        stranger = Security(tls_ca_file=cluster.security.tls_ca_file, tls_client_cert=other.tls_client_cert,
                            tls_client_key=other.tls_client_key, require_encryption=True)
        with pytest.raises((OSError, TimeoutError)):
            Client(cluster.scheduler_address, security=stranger, timeout="3s")
        with pytest.raises(ssl.SSLError):  # "certificate required", or EOF when the close came first
            _talk_without_a_certificate(cluster.scheduler_address, cluster.security.tls_ca_file)
    assert list(shared.iterdir()) == []  # the key and certificate are gone with the cluster


def test_each_worker_job_makes_a_private_local_directory(tmp_path: Path) -> None:
    """Dask's workspace is ``<local_directory>/dask-scratch-space``, a fixed name it uses as it finds
    it: with the example config's ``local_directory = "/tmp"`` (or Dask's default, the same) a user
    who made that folder first on a shared compute node held root's worker folders, spill files
    the worker unpickles included. Each worker job now makes its own with mktemp, root-only."""
    pytest.importorskip("dask_jobqueue")
    base = tmp_path / "tmp"
    base.mkdir()
    base.chmod(0o1777)  # a shared /tmp
    (base / "dask-scratch-space").mkdir()  # made first by a user
    cluster = slurm_cluster(SlurmConfig(jobs=0, tls=False, local_directory=str(base),
                                        log_directory=str(tmp_path)))
    try:
        script = cluster.job_script()
    finally:
        cluster.close()
    assert '--local-directory "$WATTCLASS_DASK_DIR"' in script
    prologue = [line for line in script.splitlines()
                if line.startswith(("WATTCLASS_DASK_DIR=", "trap ", 'cd "$WATTCLASS_DASK_DIR"'))]
    assert len(prologue) == 3, script
    # run from a folder a user could have prepared, as Slurm's /tmp fallback would
    (base / ".tmp").mkdir()
    lines = [*prologue, 'stat -c "%a %n" "$WATTCLASS_DASK_DIR"', "pwd"]
    proc = subprocess.run(["bash", "-c", "\n".join(lines)], capture_output=True, text=True, check=True,
                          cwd=base)
    mode, made, cwd = proc.stdout.split()
    assert mode == "700" and Path(made).parent == base and Path(made).name.startswith("wattclass-dask.")
    # the workers work (and DuckDB spills into .tmp) in their private folder, not in the job's cwd
    assert cwd == made
    assert not Path(made).exists()  # removed when the job script ends
    with pytest.raises(ConfigError, match=r"slurm\.local_directory"):
        slurm_cluster(SlurmConfig(jobs=0, tls=False, local_directory='/tmp/x"; id; "'))


@pytest.mark.parametrize("missing", [False, True])
def test_a_log_directory_others_can_write_is_refused(tmp_path: Path, missing: bool) -> None:
    """slurmstepd writes the workers' output there as root by predictable names
    (dask-worker-<job id>.err), following symlinks: a shared, writable folder let a user point
    one at any file first."""
    pytest.importorskip("dask_jobqueue")
    shared = tmp_path / "scratch"
    shared.mkdir()
    shared.chmod(0o1777)
    logs = shared / "dask-logs" if missing else shared
    with pytest.raises(ConfigError, match=f"slurm.log_directory {logs}: .*others can write"):
        slurm_cluster(SlurmConfig(jobs=0, tls=False, log_directory=str(logs)))
    assert not (shared / "dask-logs").exists()


def _untrusted(tmp_path: Path, how: str) -> Path:
    good = _shared_dir(tmp_path)
    if how == "group-writable":
        good.chmod(0o770)
    elif how == "world-writable, sticky":
        good.chmod(0o1777)
    elif how == "other owner":
        if os.geteuid() != 0:
            pytest.skip("chown needs root")
        os.chown(good, 65534, -1)
    elif how == "symlink":
        link = tmp_path / "link"
        link.symlink_to(good)
        return link
    elif how == "under a writable folder":
        tmp_path.chmod(0o777)
    elif how == "missing":
        return tmp_path / "missing"
    return good


@pytest.mark.parametrize("how", ["group-writable", "world-writable, sticky", "other owner", "symlink",
                                 "under a writable folder", "missing"])
def test_untrusted_shared_temp_directory_is_refused_naming_it(tmp_path: Path, how: str) -> None:
    pytest.importorskip("dask_jobqueue")
    d = _untrusted(tmp_path, how)
    try:
        with pytest.raises(ConfigError) as err:
            slurm_cluster(SlurmConfig(jobs=0, shared_temp_directory=str(d), log_directory=str(tmp_path)))
    finally:
        tmp_path.chmod(0o700)
    assert f"slurm.shared_temp_directory {d}" in str(err.value)
    assert list(tmp_path.glob("**/.dask-jobqueue*")) == []  # no key was written anywhere


def test_unwritable_shared_temp_directory_is_a_config_error(tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A trusted folder root still cannot write (a root_squash NFS export): a ConfigError naming it."""
    core = pytest.importorskip("dask_jobqueue.core")
    shared = _shared_dir(tmp_path)

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(core.tempfile, "NamedTemporaryFile", refuse)
    with pytest.raises(ConfigError, match=f"cannot start the Dask SLURMCluster.*{shared}.*Permission denied"):
        slurm_cluster(SlurmConfig(jobs=0, shared_temp_directory=str(shared), log_directory=str(tmp_path)))


def test_tls_false_is_plain_tcp_and_warns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("dask_jobqueue")
    cfg = tmp_path / "dask.toml"
    cfg.write_text('kind = "slurm"\n[slurm]\ntls = false\n')
    s = load_config(cfg).slurm
    assert s.tls is False and s.shared_temp_directory is None
    with caplog.at_level(logging.WARNING, logger="wattclass.classifier"):
        cluster = slurm_cluster(replace(s, jobs=0, log_directory=str(tmp_path)))
    try:
        assert cluster.scheduler_address.startswith("tcp://")
        assert "--tls-" not in cluster.job_script()
    finally:
        cluster.close()
    assert any("tls = false" in r.getMessage() and "without authentication" in r.getMessage()
               for r in caplog.records if r.levelno == logging.WARNING), caplog.text


def _site_pems(tmp_path: Path) -> tuple[Any, dict[str, Path]]:
    """A Security (one self-signed certificate for every role) and its PEMs written as site files."""
    from distributed.security import Security

    sec = Security.temporary()
    files = {"ca_file": tmp_path / "ca.pem", "cert": tmp_path / "client.pem", "key": tmp_path / "client.key"}
    pems = {"ca_file": sec.tls_ca_file, "cert": sec.tls_client_cert, "key": sec.tls_client_key}
    for key, value in pems.items():
        files[key].write_text(value)
        files[key].chmod(0o600)
    return sec, files


def _scheduler_config(tmp_path: Path, address: str, files: dict[str, Path]) -> Path:
    cfg = tmp_path / "dask.toml"
    cfg.write_text(f'kind = "scheduler"\naddress = "{address}"\n[tls]\n'
                   + "".join(f'{k} = "{v}"\n' for k, v in files.items()))
    return cfg


def test_scheduler_kind_connects_over_tls_with_the_sites_files(tmp_path: Path) -> None:
    from distributed import LocalCluster

    sec, files = _site_pems(tmp_path)
    cluster = LocalCluster(n_workers=1, processes=False, protocol="tls://", security=sec,
                           dashboard_address=None, memory_limit="0")
    try:
        cfg = _scheduler_config(tmp_path, cluster.scheduler_address, files)
        with open_client(config=cfg) as client:
            assert client.security.require_encryption
            assert client.security.tls_client_cert == files["cert"].read_text()
            assert client.submit(_square_sum, 10).result() == 285
    finally:
        cluster.close()


def test_scheduler_tls_files_are_read_as_trusted_files(tmp_path: Path) -> None:
    pytest.importorskip("cryptography")
    _, files = _site_pems(tmp_path)
    files["key"].chmod(0o666)
    cfg = _scheduler_config(tmp_path, "tls://127.0.0.1:1", files)
    with pytest.raises(ConfigError, match=str(files["key"])), open_client(config=cfg):
        pass


@pytest.mark.parametrize("bad", ["key of another certificate", "no key"])
def test_unusable_scheduler_tls_files_are_a_config_error_naming_them(tmp_path: Path, bad: str) -> None:
    """A key that does not fit the certificate (or none, with a certificate that holds none) was
    reported as "cannot reach the Dask scheduler at tls://...: [SSL] PEM lib", naming neither file."""
    pytest.importorskip("cryptography")
    from distributed.security import Security

    _, files = _site_pems(tmp_path)
    if bad == "no key":
        del files["key"]
    else:
        files["key"].write_text(Security.temporary().tls_client_key)
    cfg = _scheduler_config(tmp_path, "tls://127.0.0.1:1", files)
    with pytest.raises(ConfigError) as err, open_client(config=cfg):
        pass
    assert str(files["cert"]) in str(err.value) and "not a usable CA, certificate and key" in str(err.value)
    assert "cannot reach" not in str(err.value)


class _FakeClient:
    """Stands in for distributed.Client: connects nowhere."""

    def __init__(self, target: Any, security: Any = None) -> None:
        self.target, self.security = target, security

    def close(self) -> None:
        pass


@pytest.mark.parametrize(("address", "warns"), [
    ("tcp://10.1.2.3:8786", True), ("sched.example:8786", True), ("tcp://127.0.0.1:8786", False),
    ("tcp://localhost:8786", False), ("tcp://[::1]:8786", False),
])
def test_plain_scheduler_off_loopback_warns(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
                                            address: str, warns: bool) -> None:
    import distributed

    monkeypatch.setattr(distributed, "Client", _FakeClient)
    with caplog.at_level(logging.WARNING, logger="wattclass.classifier"), open_client(scheduler=address):
        pass
    warned = [r.getMessage() for r in caplog.records if "pickles" in r.getMessage()]
    assert bool(warned) == warns, caplog.text
    if warns:
        assert address in warned[0] and "tls://" in warned[0]


def test_scheduler_tls_needs_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="needs certificate files"), open_client(scheduler="tls://h:8786"):
        pass


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('kind = "cloud"\n', "kind must be one of"),
        ('kind = "scheduler"\n', "needs address"),
        ('kind = "slurm"\n[slurm]\nqueue = "cpu"\nnodes = 3\n', "unknown key 'nodes'"),
        ('kind = "slurm"\n[slurm]\ncores = "eight"\n', "slurm.cores"),
        ('kind = "slurm"\n[slurm]\ncores = 2\nprocesses = 4\n', "slurm.cores (2)"),
        ('kind = "slurm"\n[slurm]\njob_extra_directives = "--qos=x"\n', "job_extra_directives"),
        ('kind = "slurm"\n', "slurm.shared_temp_directory is required with TLS"),
        ('kind = "slurm"\n[slurm]\nshared_temp_directory = "rel"\n', "must be an absolute path"),
        ('kind = "slurm"\n[slurm]\nshared_temp_directory = "$HOME/x"\n', "must be an absolute path"),
        ('kind = "slurm"\n[slurm]\ntls = "no"\n', "slurm.tls: expected true or false"),
        ('kind = "slurm"\n[slurm]\ntls = false\nscheduler_options = {protocol = "tcp://"}\n',
         "slurm.scheduler_options.protocol: not allowed"),
        ('kind = "slurm"\n[slurm]\ntls = false\n[tls]\nca_file = "/x"\n', "[tls] is for kind = 'scheduler'"),
        ('kind = "scheduler"\naddress = "tls://h:1"\n', "no [tls] table"),
        ('kind = "scheduler"\naddress = "tcp://h:1"\n[tls]\nca_file = "/a"\ncert = "/b"\n', "is not tls://"),
        ('kind = "scheduler"\naddress = "tls://h:1"\n[tls]\nca_file = "/a"\n', "tls.cert is required"),
        ('kind = "scheduler"\naddress = "tls://h:1"\n[tls]\nkey_file = "/a"\n', "unknown key 'key_file'"),
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


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('kind = "local"\n[local]\nn_workers = 0\n', "local.n_workers"),
        ('kind = "local"\n[local]\nthreads_per_worker = 0\n', "local.threads_per_worker"),
        ('kind = "slurm"\n[slurm]\ntls = false\nadapt_maximum_jobs = 0\n', "slurm.adapt_maximum_jobs"),
        ('kind = "slurm"\n[slurm]\ntls = false\nadapt_minimum_jobs = 2\n', "slurm.adapt_minimum_jobs"),
        ('kind = "slurm"\n[slurm]\ntls = false\nadapt_minimum_jobs = 5\nadapt_maximum_jobs = 2\n',
         "slurm.adapt_minimum_jobs"),
    ],
)
def test_worker_counts_that_run_nothing_or_are_ignored_are_refused(tmp_path: Path, text: str,
                                                                   needle: str) -> None:
    """Review (admin inputs): a cluster with no worker (n_workers = 0, threads_per_worker = 0,
    adapt_maximum_jobs = 0) was accepted, and the nightly (a oneshot unit without a start timeout)
    then waited for a worker forever; adapt_minimum_jobs without adapt_maximum_jobs was silently
    ignored (jobs was used), and a minimum above the maximum went to dask unchecked."""
    cfg = tmp_path / "cluster.toml"
    cfg.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(cfg)
    assert needle in str(err.value) and str(cfg) in str(err.value)
