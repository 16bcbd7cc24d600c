"""A real one-node Slurm 22.05 cluster (munged, slurmctld, slurmd) for tests and benchmarks.

Everything lives in one temporary folder: slurm.conf, gres.conf (four fake GPUs as symlinks to
/dev/null, AutoDetect=off; Slurm rejects regular files and file-less GPUs), the optional
job_submit.lua next to slurm.conf, state and spool folders. The daemons run in the foreground
(-D) as children of this process so teardown stops exactly what was started. Ports are picked
free so two clusters on one machine do not collide. Facts behind each line:
/work/shared/notes/slurm-22.05.md.

Used by ``tests/test_slurm_hooks.py`` (session fixture) and ``bench/*.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

MUNGE_SOCKET = Path("/run/munge/munge.socket.2")
NODE = "localhost"


class ClusterError(RuntimeError):
    """The cluster could not start or a command failed; the message says which and why."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def daemons_available() -> str | None:
    """None if slurmctld, slurmd and munged are installed, else what is missing."""
    missing = [b for b in ("slurmctld", "slurmd", "munged", "sbatch") if shutil.which(b) is None]
    return ", ".join(missing) if missing else None


class SlurmCluster:
    """One node ``localhost`` with 4 GPUs, features ``hbm``, partitions ``main`` and ``debug``."""

    def __init__(
        self,
        root: Path,
        *,
        job_submit_lua: str | None = None,
        prolog: Path | None = None,
        epilog: Path | None = None,
        features: Sequence[str] = ("hbm",),
        cpus: int = 16,
        default_partition: str = "main",
    ) -> None:
        self.root = Path(root)
        self.conf_dir = self.root / "etc"
        self.conf = self.conf_dir / "slurm.conf"
        self.job_submit_lua = job_submit_lua
        self.prolog = prolog
        self.epilog = epilog
        self.features = list(features)
        self.cpus = cpus
        self.default_partition = default_partition
        self.procs: list[subprocess.Popen[bytes]] = []
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))
        self.env.pop("SLURM_JOB_ID", None)

    # -- configuration ---------------------------------------------------------------------
    def write_config(self) -> None:
        for d in ("etc", "state", "spool", "log", "dev", "out"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        dev = self.root / "dev"
        for i in range(4):
            link = dev / f"gpu{i}"
            if not link.is_symlink():
                link.symlink_to("/dev/null")
        ctld_port, d_port = _free_port(), _free_port()
        lines = [
            f"ClusterName=wc{os.getpid()}",
            f"SlurmctldHost={NODE}",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={d_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            f"StateSaveLocation={self.root / 'state'}",
            f"SlurmdSpoolDir={self.root / 'spool'}",
            f"SlurmctldPidFile={self.root / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.root / 'slurmd.pid'}",
            f"SlurmctldLogFile={self.root / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={self.root / 'log' / 'slurmd.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "GresTypes=gpu",
            "SlurmdParameters=config_overrides",
            "MailProg=/bin/true",
            "ReturnToService=2",
            "SchedulerParameters=sched_interval=1",
            "MinJobAge=600",
            "MaxJobCount=20000",
            "PrologFlags=Alloc",
        ]
        if self.job_submit_lua is not None:
            lines.append("JobSubmitPlugins=lua")
            (self.conf_dir / "job_submit.lua").write_text(self.job_submit_lua)
        if self.prolog is not None:
            lines.append(f"Prolog={self.prolog}")
        if self.epilog is not None:
            lines.append(f"Epilog={self.epilog}")
        feat = f" Feature={','.join(self.features)}" if self.features else ""
        lines += [
            f"NodeName={NODE} CPUs={self.cpus} RealMemory=8000 Gres=gpu:4{feat} State=UNKNOWN",
            *(f"PartitionName={p} Nodes={NODE} Default={'YES' if p == self.default_partition else 'NO'}"
              " MaxTime=INFINITE State=UP" for p in ("main", "debug")),
        ]
        self.conf.write_text("\n".join(lines) + "\n")
        (self.conf_dir / "gres.conf").write_text(
            "AutoDetect=off\n" + f"NodeName={NODE} Name=gpu File={dev}/gpu[0-3]\n"
        )

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
        for argv in (
            ["slurmctld", "-D", "-i", "-f", str(self.conf)],
            ["slurmd", "-D", "-N", NODE, "-f", str(self.conf)],
        ):
            logf = open(self.root / "log" / f"{argv[0]}.stderr", "ab")  # noqa: SIM115
            self.procs.append(subprocess.Popen(argv, env=self.env, stdout=logf, stderr=logf))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    raise ClusterError(f"{p.args[0]} exited with {p.returncode}: {self.logs()}")
            with contextlib.suppress(ClusterError):
                if self.node_state() in ("idle", "mixed", "allocated"):
                    return
            time.sleep(0.1)
        raise ClusterError(f"node did not become idle in {timeout} s: {self.logs()}")

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)
        self.procs.clear()

    def restart_ctld(self) -> None:
        """Restart slurmctld only (job_submit.lua is re-read by mtime anyway)."""
        ctld = self.procs[0]
        ctld.terminate()
        ctld.wait(timeout=15)
        logf = open(self.root / "log" / "slurmctld.stderr", "ab")  # noqa: SIM115
        self.procs[0] = subprocess.Popen(["slurmctld", "-D", "-f", str(self.conf)], env=self.env,
                                         stdout=logf, stderr=logf)

    def logs(self, tail: int = 3000) -> str:
        out = []
        for f in sorted((self.root / "log").glob("*")):
            text = f.read_text(errors="replace")
            out.append(f"--- {f.name}\n{text[-tail:]}")
        return "\n".join(out)

    # -- commands --------------------------------------------------------------------------
    def run(self, argv: Sequence[str], check: bool = True, timeout: float = 30) -> str:
        proc = subprocess.run(list(argv), env=self.env, capture_output=True, text=True,
                              timeout=timeout)
        if check and proc.returncode != 0:
            raise ClusterError(f"{' '.join(argv)}: rc {proc.returncode}: {proc.stderr.strip()}")
        return proc.stdout

    def sbatch(self, *args: str, script: str = "#!/bin/sh\ntrue\n") -> str:
        """Submit and return the job id."""
        proc = subprocess.run(["sbatch", "--parsable", *args], input=script, env=self.env,
                              capture_output=True, text=True, timeout=30)
        if proc.returncode != 0:
            raise ClusterError(f"sbatch {' '.join(args)}: rc {proc.returncode}: {proc.stderr.strip()}")
        return proc.stdout.strip().split(";")[0]

    def node(self) -> dict[str, Any]:
        data = json.loads(self.run(["sinfo", "--json"]))
        for n in data.get("nodes", []):
            if n.get("name") == NODE:
                return dict(n)
        raise ClusterError(f"node {NODE} not in sinfo --json")

    def node_state(self) -> str:
        try:
            node = self.node()
        except (ClusterError, ValueError, subprocess.TimeoutExpired) as exc:
            raise ClusterError(str(exc)) from exc
        return str(node.get("state", "")).lower()

    def job(self, job_id: str) -> dict[str, Any]:
        """The job's squeue --json record (squeue ignores -j, so filter here)."""
        data = json.loads(self.run(["squeue", "--json"]))
        for j in data.get("jobs", []):
            if str(j.get("job_id")) == str(job_id):
                return dict(j)
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
class WattclassRig:
    """A cluster with wattclass's job_submit.lua, Prolog and Epilog wired to a filestate backend.

    GPUs are permuted against Slurm's numbering (Slurm GPU j is backend GPU ``SLURM_TO_BACKEND[j]``)
    so a Prolog that mapped by index order would cap the wrong GPUs.
    """

    ORDER = (2, 0, 3, 1)  # backend GPU i carries PCI bus ORDER[i]; Slurm index j maps to bus j

    def __init__(self, root: Path, python: str, run_root: Path | None = None,
                 default_partition: str = "main") -> None:
        """``run_root``: where GPU state, job files and cap records live (default ``root``); the
        benchmark puts them on tmpfs, as /run/wattclass is on a real node."""
        from wattclass.gpu.filestate import FileStateBackend
        from wattclass.plugin.install import render_hook, render_job_submit

        self.root = Path(root)
        self.root.chmod(0o755)  # jobs run as other users too (nobody) and must reach out/
        self.table = self.root / "etc" / "wattclass" / "labels.tsv"
        self.table.parent.mkdir(parents=True, exist_ok=True)
        run = Path(run_root) if run_root is not None else self.root
        self.state = run / "gpus.json"
        self.jobs_dir = run / "run" / "jobs"
        self.caps_dir = run / "run" / "caps"
        self.log = self.root / "log" / "wattclass.log"
        self.out = self.root / "out"
        self.out.mkdir(parents=True, exist_ok=True)
        self.out.chmod(0o1777)
        self.backend = FileStateBackend.create(self.state, 4, order=list(self.ORDER))
        self.gpu_map = self.root / "gpumap.json"
        self.gpu_map.write_text(json.dumps(
            {str(j): f"00000000:{0x19 + 0x10 * j:02X}:00.0" for j in range(4)}))
        self.slurm_to_backend = {j: self.ORDER.index(j) for j in range(4)}
        args = ["--backend", f"filestate:{self.state}", "--gpu-map", str(self.gpu_map), "--jobs-dir",
                str(self.jobs_dir), "--state-dir", str(self.caps_dir), "--log", str(self.log)]
        hooks = self.root / "hooks"
        hooks.mkdir(exist_ok=True)
        for kind in ("prolog", "epilog"):
            (hooks / f"{kind}.sh").write_text(render_hook(kind, python, args))
            (hooks / f"{kind}.sh").chmod(0o755)
        self.cluster = SlurmCluster(self.root, job_submit_lua=render_job_submit(self.table),
                                    prolog=hooks / "prolog.sh", epilog=hooks / "epilog.sh",
                                    default_partition=default_partition)

    def limits(self) -> dict[int, float]:
        """Slurm GPU index -> current limit in the fake backend."""
        doc = json.loads(self.state.read_text())
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
