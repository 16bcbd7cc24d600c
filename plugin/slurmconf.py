"""What the caps need from slurm.conf and cgroup.conf, checked by ``wattclass plugin check``.

Why: the hooks cap the GPUs Slurm gives a job; the promise that a user cannot escape the cap
(docs/admin.md, threat model) also rests on Slurm confining the job. A node whose slurm.conf
lacks one of these runs every job normally, so the gap is silent until someone looks:

* ``JobSubmitPlugins`` includes ``lua`` (the decision is made at submission), and ``Prolog`` and
  ``Epilog`` are set (they cap and restore);
* ``ProctrackType=proctrack/cgroup``: no process of a job outlives it (and its Epilog) on a
  GPU that is then no longer capped;
* cgroup.conf ``ConstrainDevices=yes``: a job sees only its own, capped GPUs;
* ``AllowSpecResourcesUsage`` is not ``yes``: a core specialisation (``-S``) then makes a job
  whole-node, with every GPU of its nodes, and Slurm does not show it to job_submit.lua;
* ``SelectType`` is not ``select/linear``, which allocates whole nodes: every job then gets every
  GPU of its nodes (``_resolve_shared_status``, ``_handle_exclusive_gres``), and a job that asks
  for none is not decided. It is the default before Slurm 23.11 (22.05's, 23.02's; 23.11 changed
  it to ``select/cons_tres``, CHANGELOG/slurm-23.11.md), so a slurm.conf without the line passes
  only where the installed Slurm (``slurmd -V``, else ``slurmctld -V``) is 23.11 or later.

The files are read as Slurm reads them, as far as these keys go: ``#`` starts a comment, keys
are case-insensitive, a line may hold several ``Key=Value`` pairs, the last value wins, and
``Include`` lines are followed (relative to the file's folder, with shell-style globs).
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
from pathlib import Path

from wattclass.errors import ConfigError, WattclassError
from wattclass.fsutil import refuse_untrusted_program

#: Include depth at which a loop of Include lines is given up on.
_MAX_INCLUDE_DEPTH = 8
#: The first release whose default SelectType is select/cons_tres, not select/linear.
CONS_TRES_DEFAULT_SINCE = (23, 11)


def installed_slurm_version() -> tuple[int, int] | None:
    """(major, minor) of the Slurm daemon installed here (``slurmd -V``, else ``slurmctld -V``:
    neither needs a readable slurm.conf, unlike ``sinfo --version``), or None if neither answers."""
    for argv in (["slurmd", "-V"], ["slurmctld", "-V"]):
        try:
            run = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False, cwd="/")
        except (OSError, subprocess.SubprocessError):
            continue
        m = re.search(r"\b(\d+)\.(\d+)\.\d+", run.stdout)
        if run.returncode == 0 and m:
            return int(m.group(1)), int(m.group(2))
    return None


def read_conf(path: Path, _depth: int = 0) -> dict[str, str]:
    """The ``Key=Value`` settings of a Slurm-style config file, keys lower-cased, Includes followed."""
    if _depth > _MAX_INCLUDE_DEPTH:
        raise WattclassError(f"{path}: Include nested more than {_MAX_INCLUDE_DEPTH} deep (a loop?)")
    out: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        head, _, rest = line.partition(" ")
        if head.lower() == "include" and "=" not in head:
            pattern = os.path.join(path.parent, rest.strip())  # an absolute name stays as it is
            for name in sorted(glob.glob(pattern)):
                out.update(read_conf(Path(name), _depth + 1))
            continue
        for pair in line.split():
            key, eq, value = pair.partition("=")
            if eq:
                out[key.lower()] = value
    return out


def cap_preconditions(slurm_conf: Path, slurm_version: tuple[int, int] | None = None) -> list[str]:
    """What ``slurm_conf`` (and the cgroup.conf beside it) lacks for the caps to hold; [] = none.
    ``slurm_version``: the installed Slurm's (major, minor), which decides what an unset SelectType
    means; None (unknown) counts as a Slurm whose default is select/linear."""
    conf = read_conf(slurm_conf)
    missing: list[str] = []
    plugins = [p.strip().lower() for p in conf.get("jobsubmitplugins", "").split(",")]
    if "lua" not in plugins and "job_submit/lua" not in plugins:
        missing.append("JobSubmitPlugins does not include lua (no job is decided)")
    for key, name in (("prolog", "Prolog"), ("epilog", "Epilog")):
        if not conf.get(key):
            missing.append(f"{name} is not set (no GPU is {'capped' if key == 'prolog' else 'restored'})")
    if conf.get("proctracktype", "").lower() != "proctrack/cgroup":
        missing.append(f"ProctrackType is {conf.get('proctracktype') or 'not set'}, not proctrack/cgroup "
                       "(a job's processes may outlive its Epilog)")
    if conf.get("allowspecresourcesusage", "no").lower() in ("yes", "1", "true"):
        missing.append("AllowSpecResourcesUsage=yes: a -S job gets every GPU of its nodes, unseen by "
                       "job_submit.lua (uncapped)")
    select = conf.get("selecttype", "").lower()
    if select == "select/linear":
        missing.append("SelectType=select/linear: every job gets every GPU of its nodes, and one that "
                       "asks for no GPU is not decided (uncapped); use select/cons_tres")
    elif not select and (slurm_version is None or slurm_version < CONS_TRES_DEFAULT_SINCE):
        which = ("the installed Slurm's version is unknown" if slurm_version is None
                 else f"Slurm {slurm_version[0]}.{slurm_version[1]:02d}'s default is select/linear")
        missing.append(f"SelectType is not set and {which} (before 23.11 the default gives every job "
                       "every GPU of its nodes, and one that asks for no GPU is not decided: uncapped); "
                       "set SelectType=select/cons_tres")
    tres = [t.strip().lower() for t in conf.get("accountingstoragetres", "").split(",")]
    if conf.get("accountingstoragetype", "").lower() == "accounting_storage/slurmdbd" and not any(
            t == "gres/gpu" or t.startswith("gres/gpu:") for t in tres):
        missing.append("AccountingStorageTRES lacks gres/gpu: sacct has no GPU counts for the nightly, and "
                       "job_submit.lua cannot see the GPUs of a pending --ntasks-per-gpu job, which its "
                       "user may then move out of an exempt partition or account uncapped")
    cgroup = slurm_conf.parent / "cgroup.conf"
    try:
        devices = read_conf(cgroup).get("constraindevices", "no").lower()
    except FileNotFoundError:
        devices = "no cgroup.conf"
    if devices not in ("yes", "1", "true"):
        missing.append(f"{cgroup}: ConstrainDevices is {devices}, not yes (a job can use the node's "
                       "other, uncapped GPUs)")
    return missing


def gres_autodetect(slurm_conf: Path) -> str | None:
    """gres.conf's ``AutoDetect`` beside ``slurm_conf`` (lower-cased; None: not set, or no gres.conf).

    With ``AutoDetect=nvml`` slurmd numbers GPUs in NVML's order (it sorts them by the position
    of each GPU in its NVLink matrix, gres_gpu.c ``_sort_gpu_by_links_order``), not by the N of
    /dev/nvidiaN, which the hooks' default GPU map assumes.
    """
    try:
        value = read_conf(slurm_conf.parent / "gres.conf").get("autodetect")
    except FileNotFoundError:
        return None
    return value.lower() if value else None


def check_slurm_conf(slurm_conf: Path) -> str:
    """One ``plugin check`` line: raises naming every precondition ``slurm_conf`` lacks."""
    missing = cap_preconditions(slurm_conf, installed_slurm_version())
    if missing:
        raise WattclassError(f"{slurm_conf}: " + "; ".join(missing))
    return (f"{slurm_conf}: job_submit/lua, Prolog and Epilog set; proctrack/cgroup; ConstrainDevices=yes; "
            "AllowSpecResourcesUsage off; SelectType not select/linear")


#: The PATH the shipped wrappers give the hooks (deploy/slurm/prolog.sh): slurmd gives them none.
HOOK_PATH = ("/usr/sbin", "/usr/bin", "/sbin", "/bin")


def check_hook_squeue(slurm_bin: Path | None, slurm_conf: Path) -> str:
    """The squeue the Prolog will run (``--slurm-bin``, else the wrappers' PATH) exists and, where
    it tells its version, is the installed daemons' Slurm; WattclassError naming it otherwise.

    Why: the Prolog reads each job's decision with that squeue. Missing (Slurm in /opt/slurm/bin
    without ``--slurm-bin``, a typo'd folder) or of another version than slurmctld ("Insane
    message length"), it fails at every job start, which the hook logs and lets the job run
    uncapped: the whole node off, seen only in plugin.log. ``squeue --version`` needs a slurm.conf
    it can parse, so a version it cannot tell is not a failure.
    """
    dirs = [slurm_bin] if slurm_bin is not None else [Path(d) for d in HOOK_PATH]
    found = next((d / "squeue" for d in dirs if os.access(d / "squeue", os.X_OK)), None)
    fix = ("every job on this node runs uncapped; give the wrappers --slurm-bin DIR (the folder of "
           "this cluster's squeue) with `wattclass plugin install-hooks --hook-args`")
    if found is None:
        where = " or ".join(str(d / "squeue") for d in dirs)
        raise WattclassError(f"the Prolog runs {where} to read each job's decision: not there or not "
                             f"executable: {fix}")
    try:  # the hooks refuse to run, as root, a squeue a non-root user could replace
        refuse_untrusted_program(found)
    except ConfigError as exc:
        raise WattclassError(f"the Prolog refuses to run {found} as root ({exc}): every job on this "
                             "node runs uncapped; install Slurm's clients owned by root, not writable "
                             "by others") from exc
    try:
        run = subprocess.run([str(found), "--version"], capture_output=True, text=True, timeout=10,
                             check=False, cwd="/", env={**os.environ, "SLURM_CONF": str(slurm_conf)})
        m = re.search(r"\b(\d+)\.(\d+)\.\d+", run.stdout) if run.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        m = None
    if m is None:
        return f"the Prolog runs {found} (its version unknown: `squeue --version` did not answer)"
    daemon = installed_slurm_version()
    if daemon is not None and daemon != (int(m.group(1)), int(m.group(2))):
        raise WattclassError(f"the Prolog runs {found}, Slurm {m.group(0)}, but slurmd/slurmctld here is "
                             f"{daemon[0]}.{daemon[1]:02d}: a client of another version fails against "
                             f"slurmctld: {fix}")
    return f"the Prolog runs {found}, Slurm {m.group(0)}"
