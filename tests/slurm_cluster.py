"""A real one-node Slurm cluster (munged, slurmctld, slurmd; optionally MariaDB + slurmdbd).

Opt-in: ``nodes=TWO_NODES`` runs two nodes (two slurmds on this host) for heterogeneous jobs,
which Slurm never starts on a one-node cluster; see ``SlurmCluster``. The default is one node.

The Slurm install comes from ``WATTCLASS_TEST_SLURM``, a prefix (binaries in PREFIX/bin and
PREFIX/sbin); unset means Debian 12's Slurm 22.05 in /usr. ``.ci/build-slurm`` builds 25.11 into
/opt/slurm-25.11. Every command gets an explicit SLURM_CONF and a PATH that starts with the
prefix's bin folders: a 22.05 client against a 25.11 controller fails ("Insane message length").

Everything lives in one temporary folder: slurm.conf, gres.conf (four fake GPUs as symlinks to
/dev/null, AutoDetect=off; Slurm rejects regular files and file-less GPUs), cgroup.conf
(``CgroupPlugin=disabled`` on 25.11: no cgroup use, no v1 deprecation warnings), the optional
job_submit.lua next to slurm.conf, state and spool folders. With ``accounting=True`` a MariaDB
(Debian's mariadbd as a plain process, own datadir, 127.0.0.1 on a free port) and slurmdbd
(slurmdbd.conf mode 600) start first, and the cluster, account and users are added with
sacctmgr BEFORE slurmctld's first start (otherwise slurmctld writes its own ClusterID and later
exits with "CLUSTER ID MISMATCH"). The daemons run in the foreground (-D) as children of this
process so teardown stops exactly what was started. Ports are picked free so two clusters on one
machine do not collide. The facts behind each line are in docs/slurm.md ("Versions").

Used by ``tests/test_slurm_hooks.py``, ``tests/slurm_fixtures.py`` (accounting), the scale-out
test and ``bench/*.py``.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from free_ports import free_port

MUNGE_SOCKET = Path("/run/munge/munge.socket.2")
NODE = "localhost"
TWO_NODES = ("wcnode0", "wcnode1")  # ``SlurmCluster(nodes=TWO_NODES)``: two slurmds on this host
ACCOUNT = "research"  # every user's default account when accounting is on
USERS = ("root", "nobody", "daemon")
_serial = itertools.count()


class ClusterError(RuntimeError):
    """The cluster could not start or a command failed; the message says which and why."""


class SlurmInstall:
    """One Slurm installation under a prefix: where its programs are and which version it is."""

    def __init__(self, prefix: str | os.PathLike[str]) -> None:
        self.prefix = Path(prefix)

    def path(self, name: str) -> Path:
        """PREFIX/bin/NAME or PREFIX/sbin/NAME (the first that exists; the bin one if neither)."""
        for d in ("bin", "sbin"):
            p = self.prefix / d / name
            if p.exists():
                return p
        return self.prefix / "bin" / name

    @property
    def bin_dir(self) -> Path:
        return self.prefix / "bin"

    @functools.cached_property
    def version(self) -> str:
        """e.g. "22.05.8" or "25.11.7" (from ``slurmctld -V``)."""
        try:
            out = subprocess.run([str(self.path("slurmctld")), "-V"], capture_output=True, text=True,
                                 timeout=10, check=True).stdout.split()
        except (OSError, subprocess.SubprocessError) as exc:
            raise ClusterError(f"{self.path('slurmctld')} -V failed: {exc}") from exc
        if len(out) < 2:
            raise ClusterError(f"{self.path('slurmctld')} -V: unexpected output {out!r}")
        return out[-1]

    @property
    def major_minor(self) -> tuple[int, int]:
        major, minor = self.version.split(".")[:2]
        return int(major), int(minor)

    def missing(self, accounting: bool = False) -> str | None:
        """None if the daemons and clients are installed, else what is missing."""
        names = ["slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scontrol"]
        if accounting:
            names += ["slurmdbd", "sacctmgr", "sacct"]
        gone = [str(self.path(n)) for n in names if not self.path(n).exists()]
        gone += [b for b in ["munged", *(["mariadbd", "mariadb-install-db"] if accounting else [])]
                 if shutil.which(b, path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin"])) is None]
        return ", ".join(gone) if gone else None


def slurm_install() -> SlurmInstall:
    """The install under test: ``WATTCLASS_TEST_SLURM`` (a prefix), else Debian's in /usr."""
    return SlurmInstall(os.environ.get("WATTCLASS_TEST_SLURM") or "/usr")


def daemons_available(accounting: bool = False) -> str | None:
    """None if the Slurm install under test (and munged) is complete, else what is missing."""
    return slurm_install().missing(accounting)


class Accounting:
    """MariaDB + slurmdbd for one cluster; started before slurmctld, stopped after it.

    MariaDB runs as the ``mysql`` user from Debian's mariadb-server as a plain process (no
    systemd), in its own datadir under /tmp (the test folders are 0700 root, which mysql cannot
    enter), on 127.0.0.1 and a free port. slurmdbd talks TCP to it (it has no socket option).
    """

    PASSWORD = "wattclass-test"
    DB = "slurm_acct_db"

    def __init__(self, install: SlurmInstall, conf_dir: Path, log_dir: Path, state_dir: Path) -> None:
        self.install = install
        self.conf_dir = conf_dir
        self.log_dir = log_dir
        self.state_dir = state_dir
        self.db_port = free_port()
        self.dbd_port = free_port()
        self.db_root: Path | None = None
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def socket(self) -> Path:
        assert self.db_root is not None
        return self.db_root / "mysqld.sock"

    def slurm_conf_lines(self) -> list[str]:
        return [
            "AccountingStorageType=accounting_storage/slurmdbd",
            "AccountingStorageHost=127.0.0.1",
            f"AccountingStoragePort={self.dbd_port}",
            "AccountingStorageTRES=gres/gpu",  # else no gres/gpu in sacct's tres
            "AccountingStoreFlags=job_comment",  # else sacct's comment.job stays empty
        ]

    def _popen(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        logf = open(self.log_dir / f"{name}.stderr", "ab")  # noqa: SIM115
        self.procs.append(subprocess.Popen(argv, env=env, stdout=logf, stderr=logf, start_new_session=True))

    def _sql(self, statement: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["mariadb", f"--socket={self.socket}", "-uroot", "-e", statement],
                              capture_output=True, text=True, timeout=10)

    def _wait(self, what: str, ok: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    raise ClusterError(f"{p.args[0]} exited with {p.returncode} while waiting for {what}")
            if ok():
                return
            time.sleep(0.1)
        raise ClusterError(f"{what} not ready after {timeout} s")

    def start(self, cluster_name: str, env: dict[str, str], timeout: float = 60.0) -> None:
        self.db_root = Path(tempfile.mkdtemp(prefix="wattclass-mariadb-"))
        data = self.db_root / "data"
        data.mkdir()
        shutil.chown(self.db_root, "mysql", "mysql")
        shutil.chown(data, "mysql", "mysql")
        proc = subprocess.run(["mariadb-install-db", "--user=mysql", f"--datadir={data}", "--skip-test-db",
                               "--auth-root-authentication-method=socket"],
                              capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise ClusterError(f"mariadb-install-db: rc {proc.returncode}: {proc.stderr[-2000:]}")
        mariadbd = shutil.which("mariadbd", path="/usr/sbin:/usr/bin") or "/usr/sbin/mariadbd"
        self._popen("mariadbd", [mariadbd, "--no-defaults", "--user=mysql", f"--datadir={data}",
                                 f"--socket={self.socket}", f"--pid-file={self.db_root / 'mysqld.pid'}",
                                 f"--port={self.db_port}", "--bind-address=127.0.0.1",
                                 "--innodb-buffer-pool-size=256M", "--innodb-lock-wait-timeout=900",
                                 f"--log-error={self.db_root / 'mariadbd.err'}"], env)
        self._wait("MariaDB", lambda: self._sql("SELECT 1").returncode == 0, timeout)
        grants = "".join(f"CREATE USER 'slurm'@'{h}' IDENTIFIED BY '{self.PASSWORD}'; "
                         f"GRANT ALL ON {self.DB}.* TO 'slurm'@'{h}'; " for h in ("127.0.0.1", "localhost"))
        proc = self._sql(grants)
        if proc.returncode != 0:
            raise ClusterError(f"MariaDB grants: {proc.stderr.strip()}")
        dbd_conf = self.conf_dir / "slurmdbd.conf"  # slurmdbd looks next to SLURM_CONF
        dbd_conf.write_text("\n".join([
            "AuthType=auth/munge",
            "DbdHost=localhost",
            "DbdAddr=127.0.0.1",
            f"DbdPort={self.dbd_port}",
            "SlurmUser=root",
            "DebugLevel=info",
            f"PidFile={self.state_dir / 'slurmdbd.pid'}",
            f"LogFile={self.log_dir / 'slurmdbd.log'}",
            "StorageType=accounting_storage/mysql",
            "StorageHost=127.0.0.1",
            f"StoragePort={self.db_port}",
            "StorageUser=slurm",
            f"StoragePass={self.PASSWORD}",
            f"StorageLoc={self.DB}",
        ]) + "\n")
        dbd_conf.chmod(0o600)  # slurmdbd exits on 644: "should be 600 or 640"
        self._popen("slurmdbd", [str(self.install.path("slurmdbd")), "-D"], env)
        sacctmgr = str(self.install.path("sacctmgr"))

        def answers() -> bool:
            return subprocess.run([sacctmgr, "-n", "show", "cluster"], env=env, capture_output=True,
                                  timeout=10).returncode == 0

        self._wait("slurmdbd", answers, timeout)
        for argv in (["add", "cluster", cluster_name],
                     ["add", "account", ACCOUNT, "Description=wattclass tests", "Organization=wattclass"],
                     ["add", "account", "benchmark", "Description=exempt", "Organization=wattclass"],
                     *(["add", "user", u, f"Account={ACCOUNT}", f"DefaultAccount={ACCOUNT}"]
                       for u in USERS),
                     *(["add", "user", u, "Account=benchmark"] for u in USERS)):
            proc = subprocess.run([sacctmgr, "-i", *argv], env=env, capture_output=True, text=True,
                                  timeout=30)
            if proc.returncode != 0:
                raise ClusterError(f"sacctmgr {' '.join(argv)}: rc {proc.returncode}: {proc.stderr.strip()}")

    def stop(self) -> None:
        """slurmdbd, then MariaDB (SIGKILL after a timeout), then the datadir."""
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)
        self.procs.clear()
        if self.db_root is not None:
            shutil.rmtree(self.db_root, ignore_errors=True)
            self.db_root = None


class SlurmCluster:
    """One node ``localhost`` with 4 GPUs, features ``hbm``, partitions ``main`` and ``debug``.

    ``nodes=TWO_NODES`` (opt-in): two nodes of 4 GPUs each, two slurmds on this one host, so that
    heterogeneous jobs run (sched/backfill starts one only when it could place each component
    on a different node: never on one node). Slurm built without --enable-multiple-slurmd
    refuses two nodes with one NodeHostName, so each node gets its name as NodeHostname,
    NodeAddr=127.0.0.1 and a Port of its own; slurmd runs with ``-N <name>``, spool/pid/log
    files carry ``%n``.
    ``node_hooks`` gives a node its own Prolog/Epilog (a node's hooks are local files on a real
    cluster): that node's slurmd reads ``etc/<node>/slurm.conf`` (with gres.conf and cgroup.conf
    next to it), the shared file with those two lines changed, and every file says
    ``DebugFlags=NO_CONF_HASH`` so slurmctld does not log the difference as an error.
    """

    def __init__(
        self,
        root: Path,
        *,
        job_submit_lua: str | None = None,
        prolog: Path | None = None,
        epilog: Path | None = None,
        features: Sequence[str] = ("hbm",),
        cpus: int = 16,
        shards: int = 0,
        default_partition: str = "main",
        accounting: bool = False,
        install: SlurmInstall | None = None,
        extra_conf: Sequence[str] = (),
        nodes: Sequence[str] = (NODE,),
        node_hooks: Mapping[str, tuple[Path, Path]] | None = None,
        gpu_types: Sequence[str] = (),
    ) -> None:
        """``shards``: that many gres/shard per GPU (GresTypes=gpu,shard), so shard jobs share GPUs.
        ``nodes``/``node_hooks``: see the class docstring (default: today's one node).
        ``gpu_types``: two type names, e.g. ("ta", "tb"): GPUs 0-1 are of the first, 2-3 of the
        second (a node of two GPU types, where the Prolog's SLURM_JOB_GPUS names one type only)."""
        if gpu_types and (len(gpu_types) != 2 or shards):
            raise ClusterError(f"gpu_types takes two names and no shards, got {list(gpu_types)}")
        self.gpu_types = list(gpu_types)
        self.root = Path(root)
        self.conf_dir = self.root / "etc"
        self.conf = self.conf_dir / "slurm.conf"
        self.job_submit_lua = job_submit_lua
        self.prolog = prolog
        self.epilog = epilog
        self.features = list(features)
        self.cpus = cpus
        self.shards = shards
        self.default_partition = default_partition
        self.extra_conf = list(extra_conf)  # more slurm.conf lines (benchmarks: MaxArraySize=...)
        self.nodes = list(nodes)
        if not self.nodes or len(set(self.nodes)) != len(self.nodes):
            raise ClusterError(f"nodes must be distinct names, got {self.nodes}")
        self.node_hooks = dict(node_hooks or {})
        if set(self.node_hooks) - set(self.nodes):
            raise ClusterError(f"node_hooks names nodes not in {self.nodes}: {sorted(self.node_hooks)}")
        self.procs: list[subprocess.Popen[bytes]] = []
        self.install = install if install is not None else slurm_install()
        path = os.pathsep.join([str(self.install.prefix / "bin"), str(self.install.prefix / "sbin"),
                                os.environ.get("PATH", os.defpath)])
        self.env = dict(os.environ, SLURM_CONF=str(self.conf), PATH=path)
        self.env.pop("SLURM_JOB_ID", None)
        self.name = f"wc{os.getpid()}x{next(_serial)}"
        self.accounting = (Accounting(self.install, self.conf_dir, self.root / "log", self.root / "state")
                           if accounting else None)

    def path(self, name: str) -> str:
        """The full path of one of this install's programs (sbatch, scontrol, sacct, ...)."""
        return str(self.install.path(name))

    # -- configuration ---------------------------------------------------------------------
    @property
    def multi_node(self) -> bool:
        return self.nodes != [NODE]

    def node_conf(self, node: str) -> Path:
        """The slurm.conf ``node``'s slurmd reads: its own with ``node_hooks``, else the shared one."""
        return self.conf_dir / node / "slurm.conf" if node in self.node_hooks else self.conf

    def _daemon_lines(self) -> list[str]:
        """Ports, files and daemon settings; per-node ports and ``%n`` files with ``nodes``."""
        ctld_port, d_port = free_port(), free_port()
        n = "-%n" if self.multi_node else ""
        return [
            f"ClusterName={self.name}",
            f"SlurmctldHost={NODE}",
            f"SlurmctldPort={ctld_port}",
            *([] if self.multi_node else [f"SlurmdPort={d_port}"]),
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            f"StateSaveLocation={self.root / 'state'}",
            f"SlurmdSpoolDir={self.root / 'spool'}" + ("/%n" if self.multi_node else ""),
            f"SlurmctldPidFile={self.root / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.root / f'slurmd{n}.pid'}",
            f"SlurmctldLogFile={self.root / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={self.root / 'log' / f'slurmd{n}.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            *(self.accounting.slurm_conf_lines() if self.accounting is not None
              else ["AccountingStorageType=accounting_storage/none"]),
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "GresTypes=gpu,shard" if self.shards else "GresTypes=gpu",
            "SlurmdParameters=config_overrides",
            "MailProg=/bin/true",
            "ReturnToService=2",
            # het jobs start only through sched/backfill (the default of 22.05 and 25.11 alike,
            # named here for the mode that needs it); bf_interval=1: started within a second
            *(["SchedulerType=sched/backfill", "SchedulerParameters=sched_interval=1,bf_interval=1"]
              if self.multi_node else ["SchedulerParameters=sched_interval=1"]),
            *(["DebugFlags=NO_CONF_HASH"] if self.node_hooks else []),
            "MinJobAge=600",
            "MaxJobCount=20000",
            "PrologFlags=Alloc",
        ]

    def _node_lines(self) -> list[str]:
        feat = f" Feature={','.join(self.features)}" if self.features else ""
        shard = f",shard:{4 * self.shards}" if self.shards else ""
        gres = ",".join(f"gpu:{t}:2" for t in self.gpu_types) or "gpu:4"
        where = {n: (f" NodeHostname={n} NodeAddr=127.0.0.1 Port={free_port()}" if self.multi_node else "")
                 for n in self.nodes}
        nodes = ",".join(self.nodes)
        return [
            *(f"NodeName={n}{where[n]} CPUs={self.cpus} RealMemory=8000 Gres={gres}{shard}{feat}"
              " State=UNKNOWN"
              for n in self.nodes),
            *(f"PartitionName={p} Nodes={nodes} Default={'YES' if p == self.default_partition else 'NO'}"
              " MaxTime=INFINITE State=UP" for p in ("main", "debug")),
        ]

    def _gres_text(self, dev: Path) -> str:
        if self.gpu_types:
            return "AutoDetect=off\n" + "".join(
                f"NodeName={n} Name=gpu Type={t} File={dev}/gpu[{2 * i}-{2 * i + 1}]\n"
                for n in self.nodes for i, t in enumerate(self.gpu_types))
        if not self.shards:
            return "AutoDetect=off\n" + "".join(f"NodeName={n} Name=gpu File={dev}/gpu[0-3]\n"
                                                for n in self.nodes)
        # One gpu and one shard line per GPU. With a single ``Name=shard Count=4 File=gpu0``
        # line, 22.05 put the second shard job's SLURM_JOB_GPUS at "1" (the shard's slot,
        # not its GPU); per-GPU lines give the GPU's index.
        return "AutoDetect=off\n" + "".join(
            f"NodeName={n} Name=gpu File={dev}/gpu{i}\n"
            f"NodeName={n} Name=shard Count={self.shards} File={dev}/gpu{i}\n"
            for n in self.nodes for i in range(4))

    def write_config(self) -> None:
        for d in ("etc", "state", "spool", "log", "dev", "out"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        if self.multi_node:  # slurmd does not create its %n spool folder
            for node in self.nodes:
                (self.root / "spool" / node).mkdir(exist_ok=True)
        dev = self.root / "dev"
        for i in range(4):
            link = dev / f"gpu{i}"
            if not link.is_symlink():
                link.symlink_to("/dev/null")
        lines = self._daemon_lines()
        if self.job_submit_lua is not None:
            lines.append("JobSubmitPlugins=lua")
            (self.conf_dir / "job_submit.lua").write_text(self.job_submit_lua)
        hooks = [f"Prolog={self.prolog}"] if self.prolog is not None else []
        hooks += [f"Epilog={self.epilog}"] if self.epilog is not None else []
        rest = [*self.extra_conf, *self._node_lines()]
        self.conf.write_text("\n".join([*lines, *hooks, *rest]) + "\n")
        files = {"gres.conf": self._gres_text(dev)}
        if self.install.major_minor >= (24, 5):
            # No cgroup use at all: this build has no cgroup/v2 plugin and v1 is deprecated. Jobs,
            # GRES variables and the Prolog work the same. 22.05 has no "disabled" value.
            files["cgroup.conf"] = "CgroupPlugin=disabled\n"
        for name, text in files.items():
            (self.conf_dir / name).write_text(text)
        for node, (prolog, epilog) in self.node_hooks.items():  # slurmd reads these next to its slurm.conf
            self.node_conf(node).parent.mkdir(exist_ok=True)
            self.node_conf(node).write_text("\n".join([*lines, f"Prolog={prolog}", f"Epilog={epilog}", *rest])
                                            + "\n")
            for name, text in files.items():
                (self.node_conf(node).parent / name).write_text(text)

    # -- daemons ---------------------------------------------------------------------------
    def _munge_ok(self) -> bool:
        try:
            enc = subprocess.run(["munge", "-n"], capture_output=True, timeout=5, check=True)
            subprocess.run(["unmunge"], input=enc.stdout, capture_output=True, timeout=5, check=True)
        except (OSError, subprocess.SubprocessError):
            return False
        return True

    def _start_munge(self) -> None:
        if self._munge_ok():
            return
        if not Path("/etc/munge/munge.key").exists():
            subprocess.run(["mungekey", "--create"], check=True, capture_output=True)
        subprocess.run(["install", "-d", "-o", "munge", "-g", "munge", "/run/munge"], check=True)
        # munged refuses to run as root; it daemonises itself and outlives the tests on purpose
        # (other clusters on this machine may share it).
        subprocess.run(["runuser", "-u", "munge", "--", "/usr/sbin/munged"], check=True,
                       capture_output=True, timeout=20)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self._munge_ok():
                return
            time.sleep(0.1)
        raise ClusterError("munged did not start (munge -n | unmunge fails)")

    def start(self, timeout: float = 40.0) -> None:
        self.write_config()
        self._start_munge()
        if self.accounting is not None:  # before slurmctld's first start (CLUSTER ID MISMATCH)
            self.accounting.start(self.name, self.env)
        daemons = [("slurmctld", [self.path("slurmctld"), "-D", "-i", "-f", str(self.conf)], self.conf)]
        for node in self.nodes:  # a slurmd reads gres.conf next to SLURM_CONF: its own file in both
            daemons.append((f"slurmd-{node}" if self.multi_node else "slurmd",
                            [self.path("slurmd"), "-D", "-N", node, "-f", str(self.node_conf(node))],
                            self.node_conf(node)))
        for name, argv, conf in daemons:
            logf = open(self.root / "log" / f"{name}.stderr", "ab")  # noqa: SIM115
            self.procs.append(subprocess.Popen(argv, env=dict(self.env, SLURM_CONF=str(conf)),
                                               stdout=logf, stderr=logf))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    raise ClusterError(f"{p.args[0]} exited with {p.returncode}: {self.logs()}")
            with contextlib.suppress(ClusterError):
                if all(self.node_state(n) in ("idle", "mixed", "allocated") for n in self.nodes):
                    return
            time.sleep(0.1)
        raise ClusterError(f"node did not become idle in {timeout} s: {self.logs()}")

    def stop(self) -> None:
        """slurmd first, then slurmctld (a slurmd stopped after its controller can hang: SIGKILL
        after a timeout), then slurmdbd and MariaDB."""
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)
        self.procs.clear()
        if self.accounting is not None:
            self.accounting.stop()

    def restart_ctld(self) -> None:
        """Restart slurmctld only (job_submit.lua is re-read by mtime anyway)."""
        ctld = self.procs[0]
        ctld.terminate()
        ctld.wait(timeout=15)
        logf = open(self.root / "log" / "slurmctld.stderr", "ab")  # noqa: SIM115
        self.procs[0] = subprocess.Popen([self.path("slurmctld"), "-D", "-f", str(self.conf)], env=self.env,
                                         stdout=logf, stderr=logf)

    def logs(self, tail: int = 3000) -> str:
        out = []
        for f in sorted((self.root / "log").glob("*")):
            text = f.read_text(errors="replace")
            out.append(f"--- {f.name}\n{text[-tail:]}")
        return "\n".join(out)

    # -- commands --------------------------------------------------------------------------
    def run(self, argv: Sequence[str], check: bool = True, timeout: float = 30) -> str:
        argv = [self.path(argv[0]) if "/" not in argv[0] else argv[0], *argv[1:]]
        proc = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise ClusterError(f"{' '.join(argv)}: rc {proc.returncode}: {proc.stderr.strip()}")
        return proc.stdout

    def sbatch(self, *args: str, script: str = "#!/bin/sh\ntrue\n", user: str | None = None) -> str:
        """Submit (as ``user``, through runuser: 25.11 dropped ``sbatch --uid``) and return the job id."""
        as_user = ["runuser", "-u", user, "--"] if user is not None else []
        proc = subprocess.run([*as_user, self.path("sbatch"), "--parsable", *args], input=script,
                              env=self.env,
                              capture_output=True, text=True, timeout=30)
        if proc.returncode != 0:
            raise ClusterError(f"sbatch {' '.join(args)}: rc {proc.returncode}: {proc.stderr.strip()}")
        return proc.stdout.strip().split(";")[0]

    def node(self, name: str = NODE) -> dict[str, Any]:
        data = json.loads(self.run(["sinfo", "--json"]))
        if "nodes" not in data:  # 23.02+: sinfo --json lists partition/state groups; scontrol has nodes
            data = json.loads(self.run(["scontrol", "--json", "show", "nodes"]))
        for n in data.get("nodes", []):
            if n.get("name") == name:
                return dict(n)
        raise ClusterError(f"node {name} not in sinfo --json")

    def node_state(self, name: str = NODE) -> str:
        try:
            node = self.node(name)
        except (ClusterError, ValueError, subprocess.TimeoutExpired) as exc:
            raise ClusterError(str(exc)) from exc
        from wattclass.slurm.commands import state

        # 22.05: "idle" (flags apart); 25.11: ["IDLE"] or ["IDLE", "DRAIN"]: base state first
        return (state(node.get("state")) or "").lower()

    def job(self, job_id: str) -> dict[str, Any]:
        """The job's squeue --json record in one shape for every version (``normalize_job``).

        ``--states=all``: 25.11 hides finished jobs without it (22.05 ignores -j/-t: filter here).
        """
        from wattclass.slurm.commands import normalize_job

        data = json.loads(self.run(["squeue", "--json", "--states=all", "--jobs", str(job_id)]))
        for j in data.get("jobs", []):
            if str(j.get("job_id")) == str(job_id):
                return normalize_job(j)
        raise ClusterError(f"job {job_id} not in squeue --json")

    def wait_job(self, job_id: str, states: Sequence[str] = ("COMPLETED",),
                 timeout: float = 30) -> dict[str, Any]:
        """Poll until the job reaches one of ``states`` (or a final state, which is an error)."""
        final = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "BOOT_FAIL", "OUT_OF_MEMORY"}
        deadline = time.monotonic() + timeout
        job: dict[str, Any] = {}
        while time.monotonic() < deadline:
            job = self.job(job_id)
            state = str(job.get("job_state", ""))
            if state in states:
                return job
            if state in final:
                raise ClusterError(f"job {job_id} ended {state}, wanted {list(states)}: "
                                   f"{job.get('state_reason')}")
            time.sleep(0.1)
        raise ClusterError(f"job {job_id} not {list(states)} after {timeout} s: {job.get('job_state')} "
                           f"{job.get('state_reason')}")


# -- the wattclass test rig on top of the cluster ------------------------------------------------
class RigNode(NamedTuple):
    """One node's wattclass files: its fake GPUs, GPU -> job files, cap records and hook log."""

    state: Path
    jobs_dir: Path
    caps_dir: Path
    log: Path
    hooks: Path  # the folder of its prolog.sh and epilog.sh


class WattclassRig:
    """A cluster with wattclass's job_submit.lua, Prolog and Epilog wired to a filestate backend.

    GPUs are permuted against Slurm's numbering (Slurm GPU j is backend GPU ``SLURM_TO_BACKEND[j]``)
    so a Prolog that mapped by index order would cap the wrong GPUs.

    ``nodes=TWO_NODES``: each node has its own fake GPUs, job files, cap records and log under
    ``<run>/<node>/`` and its own rendered hooks (``hooks/<node>/``), as each node of a real
    cluster has its own /run/wattclass and /etc/slurm/wattclass; ``self.nodes[name]`` holds
    them and ``self.state`` etc. are the first node's.
    """

    ORDER = (2, 0, 3, 1)  # backend GPU i carries PCI bus ORDER[i]; Slurm index j maps to bus j

    def __init__(self, root: Path, python: str, run_root: Path | None = None, *,
                 default_partition: str = "main", accounting: bool = False, shards: int = 0,
                 nodes: Sequence[str] = (NODE,), gpu_types: Sequence[str] = ()) -> None:
        """``run_root``: where GPU state, job files and cap records live (default ``root``); the
        benchmark puts them on tmpfs, as /run/wattclass is on a real node."""
        install = slurm_install()
        from wattclass.gpu.filestate import FileStateBackend
        from wattclass.plugin.install import render_hook, render_job_submit

        self.root = Path(root)
        self.root.chmod(0o755)  # jobs run as other users too (nobody) and must reach out/
        self.table = self.root / "etc" / "wattclass" / "labels.tsv"
        self.table.parent.mkdir(parents=True, exist_ok=True)
        run = Path(run_root) if run_root is not None else self.root
        one = list(nodes) == [NODE]
        self.nodes = {n: RigNode(run / "gpus.json", run / "run" / "jobs", run / "run" / "caps",
                                 self.root / "log" / "wattclass.log", self.root / "hooks") if one else
                      RigNode(run / n / "gpus.json", run / n / "run" / "jobs", run / n / "run" / "caps",
                              self.root / "log" / f"wattclass-{n}.log", self.root / "hooks" / n)
                      for n in nodes}
        self.state, self.jobs_dir, self.caps_dir, self.log, _ = self.nodes[nodes[0]]
        self.out = self.root / "out"
        self.out.mkdir(parents=True, exist_ok=True)
        self.out.chmod(0o1777)
        self.gpu_map = self.root / "gpumap.json"
        self.gpu_map.write_text(json.dumps(
            {str(j): f"00000000:{0x19 + 0x10 * j:02X}:00.0" for j in range(4)}))
        self.slurm_to_backend = {j: self.ORDER.index(j) for j in range(4)}
        for node in self.nodes.values():
            node.state.parent.mkdir(parents=True, exist_ok=True)
            FileStateBackend.create(node.state, 4, order=list(self.ORDER))
            args = ["--backend", f"filestate:{node.state}", "--gpu-map", str(self.gpu_map), "--jobs-dir",
                    str(node.jobs_dir), "--state-dir", str(node.caps_dir), "--log", str(node.log),
                    "--slurm-bin", str(install.bin_dir)]  # slurmd gives hooks no PATH
            node.hooks.mkdir(parents=True, exist_ok=True)
            for kind in ("prolog", "epilog"):
                (node.hooks / f"{kind}.sh").write_text(render_hook(kind, python, args))
                (node.hooks / f"{kind}.sh").chmod(0o755)
        self.backend = FileStateBackend(self.state)
        first = self.nodes[nodes[0]].hooks
        self.cluster = SlurmCluster(self.root, job_submit_lua=render_job_submit(self.table),
                                    prolog=first / "prolog.sh", epilog=first / "epilog.sh",
                                    default_partition=default_partition, shards=shards,
                                    accounting=accounting, install=install, nodes=nodes,
                                    gpu_types=gpu_types,
                                    node_hooks=None if one else {
                                        n: (h.hooks / "prolog.sh", h.hooks / "epilog.sh")
                                        for n, h in self.nodes.items()})

    def limits(self, node: str | None = None) -> dict[int, float]:
        """Slurm GPU index -> current limit in the fake backend (of ``node``; default the first)."""
        state = self.nodes[node].state if node is not None else self.state
        doc = json.loads(state.read_text())
        by_index = {int(g["index"]): float(g["limit_w"]) for g in doc["gpus"]}
        return {j: by_index[b] for j, b in self.slurm_to_backend.items()}

    def snapshot_script(self) -> str:
        """A job that records the GPU state and job files as seen while it runs."""
        return ("#!/bin/sh\n"
                f"cat {self.state} > {self.out}/snap-$SLURM_JOB_ID.json\n"
                f"echo $SLURM_JOB_GPUS > {self.out}/gpus-$SLURM_JOB_ID.txt\n"
                f"ls {self.jobs_dir} > {self.out}/jobs-$SLURM_JOB_ID.txt 2>/dev/null\n")

    def seen(self, job_id: str) -> tuple[dict[int, float], list[int]]:
        """(Slurm GPU -> limit while the job ran, the job's Slurm GPU indices)."""
        doc = json.loads((self.out / f"snap-{job_id}.json").read_text())
        by_index = {int(g["index"]): float(g["limit_w"]) for g in doc["gpus"]}
        gpus = [int(x) for x in (self.out / f"gpus-{job_id}.txt").read_text().strip().split(",") if x]
        return {j: by_index[b] for j, b in self.slurm_to_backend.items()}, gpus


def require_daemons() -> None:
    """For a fixture, before it builds a rig: missing Slurm daemons fail the test under CI (where
    they must be there) and skip it elsewhere."""
    import pytest

    missing = daemons_available()
    if missing:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI: Slurm daemons missing: {missing}")
        pytest.skip(f"Slurm daemons missing: {missing}")


def start_rig_or_skip(rig: WattclassRig) -> None:
    """Start ``rig``'s cluster for a fixture: a cluster that does not start fails the test under
    CI and skips it elsewhere (its daemons' logs on stderr)."""
    import sys

    import pytest

    try:
        rig.cluster.start()
    except (ClusterError, OSError, subprocess.SubprocessError) as exc:
        rig.cluster.stop()
        print(rig.cluster.logs(), file=sys.stderr)
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI: Slurm cluster did not start: {exc}")
        pytest.skip(f"Slurm cluster did not start: {exc}")
