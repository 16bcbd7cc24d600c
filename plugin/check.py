"""``wattclass plugin check``: verify an installed node, as a checklist with a non-zero exit on failure.

A broken install fails quietly by design: the hook wrappers exit 0 so a wattclass problem never
drains a node. This command is the loud counterpart an admin (or config management) runs after
installing or upgrading: it checks the same paths the hooks will use, read from the installed
wrappers themselves (their PYTHON= and WATTCLASS_ARGS= lines), so it tests what slurmd will run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from wattclass.errors import WattclassError


class Check(NamedTuple):
    """One line of the checklist."""

    name: str
    ok: bool
    detail: str


def _wrapper_config(path: Path) -> tuple[str | None, list[str]]:
    text = path.read_text(encoding="utf-8")
    py = re.search(r"^PYTHON=(.*)$", text, re.M)
    args = re.search(r'^WATTCLASS_ARGS="(.*)"$', text, re.M)
    python = shlex.split(py.group(1))[0] if py and shlex.split(py.group(1)) else None
    return python, (args.group(1).split() if args else [])


def _run(name: str, fn: Callable[[], str]) -> Check:
    try:
        return Check(name, True, fn())
    except (WattclassError, OSError, ValueError, subprocess.SubprocessError) as exc:
        return Check(name, False, str(exc))


def _check_wrapper(path: Path, python: str | None) -> str:
    from wattclass.fsutil import refuse_if_others_can_write
    from wattclass.plugin.install import check_hook_args

    refuse_if_others_can_write(path)
    st = os.stat(path)
    if not st.st_mode & stat.S_IXUSR:
        raise WattclassError(f"{path} is not executable")
    text = path.read_text(encoding="utf-8")
    if " -I -m wattclass.plugin.prolog" not in text:
        raise WattclassError(f"{path}: does not run `python -I -m wattclass.plugin.prolog` (old wrapper? "
                             "re-run `wattclass plugin install-hooks`)")
    if not python or not python.startswith("/"):
        raise WattclassError(f"{path}: PYTHON= is not an absolute path")
    check_hook_args(_wrapper_config(path)[1], f"{path}: WATTCLASS_ARGS")
    return f"{path} (root, {stat.filemode(st.st_mode)}) runs {python}"


def _check_interpreter(python: str) -> str:
    """The hooks' interpreter imports wattclass, and root may run it: the program (and the links
    and folders on its way), every folder on its ``sys.path`` and the wattclass package's files
    are root's and not writable by others. Why: slurmd runs it as root on every job start, so a
    venv, a ``.pth`` folder or a source tree a non-root user can write is their code run as root."""
    from wattclass.fsutil import refuse_if_others_can_write, refuse_untrusted_dir, refuse_untrusted_program

    refuse_untrusted_program(Path(python))  # before running it here, as root
    proc = subprocess.run([python, "-I", "-c", "import json, sys, wattclass.plugin.prolog, wattclass; "
                           "print(json.dumps([wattclass.__file__, sys.path]))"], cwd="/",
                          capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise WattclassError(f"{python} -I cannot import wattclass: {last}")
    package, path = json.loads(proc.stdout)
    pkg = Path(package).parent
    for d in [pkg, *(Path(p) for p in path if os.path.isdir(p))]:
        refuse_untrusted_dir(Path(os.path.realpath(d)))
    for folder, _dirs, files in os.walk(pkg):  # each file and folder of the hooks' own code
        for name in files:
            refuse_if_others_can_write(Path(folder) / name)
    return f"{python} imports wattclass from {package}"


def _check_dir(path: Path, creates: bool = False) -> str:
    """``creates``: a folder the hooks create files in (state, spool), where sticky is not enough."""
    from wattclass.fsutil import nearest_existing, refuse_untrusted_dir

    if not path.exists():
        # the hooks create the missing folders by their fixed names in the nearest one that exists,
        # so nobody else may write that one either, sticky or not (a user who made the name first
        # would own the folder, which the hooks then refuse: every job on the node uncapped)
        base = nearest_existing(path)
        refuse_untrusted_dir(base, creates=creates)
        return f"{path} does not exist yet (the Prolog creates it); {base} is safe"
    refuse_untrusted_dir(path, creates=creates)
    return f"{path} owned by root, mode {stat.filemode(os.lstat(path).st_mode)}"


def _check_policy(path: Path) -> str:
    from wattclass.fsutil import refuse_if_others_can_write
    from wattclass.policy import load_policy

    pol = load_policy(path)  # first: "policy file not found" names the file, not a missing folder
    refuse_if_others_can_write(path)
    return f"{path}: valid, mode {pol.mode}, {len(pol.caps)} caps"


def _group_name(gid: int) -> str:
    import grp

    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def _slurmctld_reads(path: Path, slurm_conf: Path) -> None:
    """WattclassError unless slurm.conf's SlurmUser (slurmctld's user; Slurm's default root) can
    read the table. Why: a 0640 table of another group is refused by nothing but the kernel, and
    job_submit.lua then leaves every job as submitted, said only in slurmctld's log."""
    import grp
    import pwd

    from wattclass.plugin.slurmconf import read_conf

    user = read_conf(slurm_conf).get("slurmuser") or "root"
    try:
        pw = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
    except KeyError:
        raise WattclassError(f"{slurm_conf}: SlurmUser={user} is not a user on this machine") from None
    st = path.stat()
    try:
        members = grp.getgrgid(st.st_gid).gr_mem
    except KeyError:
        members = []
    in_group = st.st_gid == pw.pw_gid or user in members
    if pw.pw_uid == 0 or st.st_mode & 0o004 or (st.st_mode & 0o040 and in_group) \
            or (st.st_mode & 0o400 and st.st_uid == pw.pw_uid):
        return
    raise WattclassError(
        f"{path}: {st.st_mode & 0o777:04o}, group {_group_name(st.st_gid)}: slurmctld runs as "
        f"SlurmUser={user} ({slurm_conf}), which cannot read it, so job_submit.lua leaves every job as "
        f"submitted; run the nightly with --table-group {_group_name(pw.pw_gid)}")


def _check_table(path: Path, slurm_conf: Path | None = None) -> str:
    from wattclass.fsutil import read_trusted_text
    from wattclass.labeltable import parse_label_table

    if not path.exists():
        raise WattclassError(f"{path} not found: every job is left as submitted until the nightly run "
                             "writes it")
    parent = path.parent
    while True:  # job_submit.lua checks every folder up to / the same way
        _check_dir(parent)
        if parent == parent.parent:
            break
        parent = parent.parent
    t = parse_label_table(read_trusted_text(path), str(path))
    if t["policy"] is None:
        raise WattclassError(f"{path}: written without a policy; job_submit.lua decides nothing")
    n = sum(len(v) for v in t["by_user_name"].values()) + len(t["by_user"]) + len(t["by_account"])
    perm = path.stat().st_mode & 0o777
    seen_by = ("readable by every user (job names; nightly --table-group hides them)" if perm & 0o004
               else f"{perm:04o}, group {_group_name(path.stat().st_gid)} only")
    if slurm_conf is not None:
        _slurmctld_reads(path, slurm_conf)
        seen_by += ", readable by SlurmUser"
    return f"{path}: {n} keys, generated {t['generated_at']}, mode {t['policy'].get('mode')}, {seen_by}"


def _check_job_submit(path: Path, table: Path) -> str:
    """The controller's job_submit.lua is this wattclass's, reading ``table``.

    Why: the label table and job_submit.lua are upgraded on different hosts. A table line an
    older script does not know (e.g. ``min_confidence_label``) makes it refuse the whole table,
    which is safe (jobs are left as submitted) but silent outside slurmctld.log.
    """
    from wattclass.fsutil import read_trusted_text
    from wattclass.labeltable import lua_string
    from wattclass.plugin.install import render_job_submit, table_literal

    text = read_trusted_text(path)
    literal = table_literal(text)
    if literal is None:
        raise WattclassError(f"{path}: no `local LABEL_TABLE = ...` line: not wattclass's job_submit.lua")
    if literal != lua_string(str(table)):  # as install-lua writes it (escaped Lua literal)
        raise WattclassError(f"{path} reads the label table {literal}, not {str(table)!r}")
    if text != render_job_submit(table):
        raise WattclassError(f"{path} differs from this wattclass's job_submit.lua (an older version? "
                             "re-run `wattclass plugin install-lua`; slurmctld reloads it when the "
                             "file changes)")
    return f"{path}: this wattclass's, reads {table}"


def _check_backend(spec: str) -> str:
    from wattclass.gpu import open_backend

    with open_backend(spec) as be:
        gpus = be.gpus()
        if not gpus:
            raise WattclassError(f"backend {spec}: no GPUs")
        g = gpus[0]
        return (f"backend {spec}: {len(gpus)} GPU(s), {g.model}, limits default {g.power_limit_default_w} W "
                f"min {g.power_limit_min_w} W max {g.power_limit_max_w} W")


def _check_gpu_map(slurm_conf: Path, spec: str, gpu_map: Path | None) -> str:
    """The hooks' GPU map names Slurm's GPUs as slurmd numbers them.

    Why: the default map (no ``--gpu-map``) takes Slurm's index N for the GPU of /dev/nvidiaN,
    true for gres.conf ``File=/dev/nvidia[0-N]``; with ``AutoDetect=nvml`` slurmd numbers the
    GPUs in NVML's order instead, so where a GPU's minor number differs from its NVML index the
    Prolog caps another job's GPU and leaves the job's own uncapped, silently.
    """
    from wattclass.gpu import open_backend
    from wattclass.plugin.prolog import discover_gpu_map, load_gpu_map, resolve_gpus
    from wattclass.plugin.slurmconf import gres_autodetect

    with open_backend(spec) as be:
        if gpu_map is not None:
            mapping = load_gpu_map(gpu_map)
            resolve_gpus(be, ",".join(mapping), mapping)  # every GPU it names is on this node
            return f"{gpu_map}: {len(mapping)} GPU(s), each found on this node"
        autodetect = gres_autodetect(slurm_conf)
        mapping = discover_gpu_map(be)
        if autodetect == "nvml":
            off = [g for g in be.gpus() if g.minor_number != g.gpu_index]
            if off:
                g = off[0]
                wanted = json.dumps({str(x.gpu_index): x.pci_bus_id for x in be.gpus()})
                raise WattclassError(
                    f"{slurm_conf.parent / 'gres.conf'}: AutoDetect=nvml numbers GPUs in NVML order, but "
                    f"GPU {g.gpu_index} ({g.pci_bus_id}) is /dev/nvidia{g.minor_number}: the default GPU "
                    f"map would cap other jobs' GPUs; write --gpu-map FILE with {wanted}")
        how = "AutoDetect=nvml, minor numbers in NVML order" if autodetect == "nvml" else "minor numbers"
        return f"default GPU map from {how}: {len(mapping)} GPU(s)"


def run_checks(args: argparse.Namespace) -> list[Check]:
    """Every check of ``args.role``; the paths default to what the installed wrappers pass to the hooks.

    Why roles: a compute node has the hooks but not the policy or the label table (only
    job_submit.lua on the controller and the nightly read them), so checking everything there
    failed a correct node."""
    from wattclass.plugin.install import check_hook_args

    checks: list[Check] = []
    node = args.role in ("all", "node")  # what slurmd's Prolog and Epilog use
    ctld = args.role in ("all", "controller")  # what job_submit.lua and the nightly use
    prolog_sh, epilog_sh = args.hooks_dir / "prolog.sh", args.hooks_dir / "epilog.sh"
    python: str | None = None
    hook_args: list[str] = []
    install = (f"install them with `wattclass plugin install-hooks --dest {args.hooks_dir} --python "
               "/opt/wattclass/bin/python`, or give --hooks-dir where they are")
    try:
        python, hook_args = _wrapper_config(prolog_sh)
    except OSError as exc:
        if node:
            checks.append(Check("prolog wrapper", False, f"{prolog_sh}: {exc.strerror}: {install}"))
    try:  # the paths the hooks will use; wrong arguments fail the wrapper's own check
        hook = check_hook_args(hook_args)
    except WattclassError:
        hook = check_hook_args([])  # the hooks' defaults
    python = args.python or python
    if node:
        if prolog_sh.exists():
            checks.append(_run("prolog wrapper", lambda: _check_wrapper(prolog_sh, python)))
        if epilog_sh.exists():
            checks.append(_run("epilog wrapper",
                               lambda: _check_wrapper(epilog_sh, _wrapper_config(epilog_sh)[0])))
        else:
            checks.append(Check("epilog wrapper", False, f"{epilog_sh}: No such file: {install}"))
        if python is not None:
            checks.append(_run("hook interpreter", lambda: _check_interpreter(python)))
        else:
            checks.append(Check("hook interpreter", False, f"no PYTHON= line to read in {prolog_sh} (give "
                                f"--python to check one): {install}"))
        checks.append(_run("cap state folder", lambda: _check_dir(args.state_dir or hook.state_dir, True)))
        checks.append(_run("job map spool", lambda: _check_dir(args.jobs_dir or hook.jobs_dir, True)))
    if ctld:
        checks.append(_run("policy", lambda: _check_policy(args.policy)))
        checks.append(_run("label table", lambda: _check_table(args.table, args.slurm_conf)))
    if node:
        checks.append(_run("GPU backend", lambda: _check_backend(args.backend or hook.backend)))
    if args.job_submit is not None and ctld:
        checks.append(_run("job_submit.lua", lambda: _check_job_submit(args.job_submit, args.table)))
    if args.slurm_conf is not None:
        from wattclass.plugin.slurmconf import check_slurm_conf

        checks.append(_run("slurm.conf", lambda: check_slurm_conf(args.slurm_conf)))
        if node:
            from wattclass.plugin.slurmconf import check_hook_squeue

            checks.append(_run("Slurm client", lambda: check_hook_squeue(hook.slurm_bin, args.slurm_conf)))
            backend = args.backend or hook.backend
            checks.append(_run("GPU map", lambda: _check_gpu_map(args.slurm_conf, backend, hook.gpu_map)))
    return checks


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hooks-dir", type=Path, default=Path("/etc/slurm/wattclass"),
                   help="folder of the installed prolog.sh/epilog.sh")
    p.add_argument("--python", help="interpreter to check (default: PYTHON= of the installed prolog.sh)")
    p.add_argument("--state-dir", type=Path, help="default: the wrapper's --state-dir")
    p.add_argument("--jobs-dir", type=Path, help="default: the wrapper's --jobs-dir")
    p.add_argument("--backend", help="default: the wrapper's --backend")
    p.add_argument("--policy", type=Path, default=Path("/etc/wattclass/policy.toml"))
    p.add_argument("--table", type=Path, default=Path("/etc/slurm/wattclass/labels.tsv"))
    p.add_argument("--job-submit", type=Path, default=None,
                   help="on the controller: also check this job_submit.lua (e.g. /etc/slurm/job_submit.lua) "
                        "is this wattclass's and reads --table")
    p.add_argument("--slurm-conf", type=Path, default=None,
                   help="also check that this slurm.conf (and the cgroup.conf beside it) has what the caps "
                        "need: job_submit/lua, Prolog, Epilog, proctrack/cgroup, ConstrainDevices=yes, "
                        "AllowSpecResourcesUsage off, and a GPU map as slurmd numbers GPUs (gres.conf "
                        "AutoDetect) (e.g. /etc/slurm/slurm.conf)")
    p.add_argument("--role", choices=("all", "node", "controller"), default="all",
                   help="what to check: node = the Prolog/Epilog side (wrappers, interpreter, state and "
                        "spool folders, GPU backend, GPU map); controller = the policy, the label table and "
                        "job_submit.lua, which compute nodes do not have; all (default) = both, for a node "
                        "that is both")
    p.add_argument("--json", action="store_true")


def main(args: argparse.Namespace) -> int:
    from wattclass.output import emit

    checks = run_checks(args)
    data: dict[str, Any] = {"ok": all(c.ok for c in checks), "checks": [c._asdict() for c in checks]}
    emit(data, args.json, lambda d: "\n".join(
        f"[{' OK ' if c['ok'] else 'FAIL'}] {c['name']}: {c['detail']}" for c in d["checks"]))
    return 0 if data["ok"] else 1
