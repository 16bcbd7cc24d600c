# long: every Slurm command wattclass runs, and the parsing of both JSON dialects, behind one door
"""Slurm through its own commands (squeue/sinfo --json, scontrol, sacct --json).

Every command goes through ``run_slurm``: an argv list (never a shell, since job names and
comments are user-controlled), a timeout (a hung slurmctld must not hang a Prolog forever),
``SLURM_CONF`` passed through, and any failure turned into a SlurmError naming the command.

Both JSON dialects are read (docs/slurm.md, "Versions"): Slurm 22.05 (openapi v0.0.38) and
23.02+ data_parser (25.11: v0.0.44). ``normalize_job`` turns a 25.11 record into the 22.05 shape:
``job_state`` ``["RUNNING"]`` -> ``"RUNNING"``, numbers wrapped as ``{"set", "infinite",
"number"}`` -> the number or None. 22.05's ``squeue --json`` ignores ``-j``/``-t`` and 25.11's
hides finished jobs unless ``--states=all``, so we pass both and still filter by job id here.
``sacct --json`` needs slurmdbd; its GPU count comes from ``tres.allocated`` (type ``gres``, name
``gpu``; needs ``AccountingStorageTRES=gres/gpu``). admin_comment is read with ``squeue -j ID -O
admin_comment`` (that one field only), never parsed out of ``scontrol show job`` text, where a job
name holding "AdminComment=" could forge it.

pyslurm: PyPI ships 25.11 (and 17/18.x); a build only works against the Slurm it was built for,
and importing it where slurm.conf names another version's plugins kills the process (Slurm's
fatal()). ``open_slurm_client`` therefore compares the installed pyslurm's version (package
metadata, no import) with the running Slurm's major.minor and imports it only when they match;
otherwise (Debian 12's 22.05) it returns this command client. It logs which it picked and why,
and the client's ``name`` says it too.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from wattclass.errors import ConfigError, SlurmError
from wattclass.fsutil import refuse_untrusted_program
from wattclass.jobrecord import JobRecord, nodes_text
from wattclass.slurm.client import SlurmClient

DEFAULT_TIMEOUT_S = 10.0
ADMIN_COMMENT_WIDTH = 4096
log = logging.getLogger(__name__)


#: Job ids as the Prolog writes them in job files: plain, array task (123_4), het component (123+0).
JOB_DISPLAY_ID = re.compile(r"[0-9]+(?:_[0-9]+|\+[0-9]+)?")

#: Job states in which a job may hold its node's GPUs (squeue's long names); any other state
#: (pending, requeued, held, or one of the end states) holds none.
HOLDING_STATES = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED", "SIGNALING",
                            "STAGE_OUT", "RESIZING"})


#: The id columns that lead the hooks' squeue lines: JobID (unique per array task and het
#: component: "1235") and JobArrayID ("1234_5" for a task, "1234+1" for a het component).
#: ``squeue --jobs 1234`` lists every task of array 1234 when 1234 is the array's own id (the
#: task that keeps it, or the pending rest) and every component of het job 1234; the hooks keep
#: only the lines of the id they asked about.
JOB_ID_COLUMNS = "JobID:24,JobArrayID:48"


def own_lines(out: str, n_ids: int) -> list[tuple[tuple[str, ...], str]]:
    """squeue lines split into their ``n_ids`` leading id fields and the rest of the line."""
    lines = []
    for line in out.splitlines():
        parts = line.split(None, n_ids)
        if len(parts) >= n_ids:
            lines.append((tuple(parts[:n_ids]), parts[n_ids] if len(parts) > n_ids else ""))
    return lines


def run_slurm(argv: Sequence[str], *, timeout: float = DEFAULT_TIMEOUT_S,
              env: Mapping[str, str] | None = None) -> str:
    """Run one Slurm command and return its stdout; the single door to Slurm's commands."""
    args = [str(a) for a in argv]
    what = " ".join(args[:2])
    try:
        # errors="replace": job names are user input in any encoding; one must not fail the call
        proc = subprocess.run(args, capture_output=True, text=True, errors="replace", timeout=timeout,
                              check=False,
                              env=dict(env) if env is not None else None, stdin=subprocess.DEVNULL)
    except FileNotFoundError as exc:
        raise SlurmError(f"{args[0]}: command not found (is Slurm's client installed?)") from exc
    except subprocess.TimeoutExpired as exc:
        raise SlurmError(f"{what}: no answer within {timeout:g} s") from exc
    except OSError as exc:
        raise SlurmError(f"{what}: cannot run: {exc.strerror or exc}") from exc
    if proc.returncode != 0:
        err = (proc.stderr or proc.stdout).strip().splitlines()
        raise SlurmError(f"{what}: exit {proc.returncode}: {err[-1] if err else 'no output'}")
    return proc.stdout


def _json(text: str, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise SlurmError(f"{what}: output is not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise SlurmError(f"{what}: output is not a JSON object")
    return doc


def number(value: object) -> int | float | None:
    """A JSON number in either dialect: 22.05's plain int, 25.11's ``{"set", "infinite", "number"}``.

    Unset and infinite values are None (22.05 writes null for those).
    """
    if isinstance(value, dict):
        if not value.get("set", False) or value.get("infinite", False):
            return None
        value = value.get("number")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value


def state(value: object) -> str | None:
    """A job state in either dialect: 22.05's ``"RUNNING"``, 25.11's ``["RUNNING"]`` (base state
    first, then flags such as ``"REQUEUED"``, which are dropped here)."""
    if isinstance(value, list):
        value = value[0] if value else None
    return str(value) if value not in (None, "") else None


def slurm_version(doc: Mapping[str, Any]) -> str | None:
    """The Slurm version from a --json document's meta: 22.05 ``meta.Slurm.version`` (ints), 25.11
    ``meta.slurm.version`` (strings)."""
    meta = doc.get("meta")
    if not isinstance(meta, dict):
        return None
    block = meta.get("slurm") or meta.get("Slurm")
    ver = block.get("version") if isinstance(block, dict) else None
    if not isinstance(ver, dict):
        return None
    try:
        major, minor, micro = (int(ver[k]) for k in ("major", "minor", "micro"))
    except (KeyError, TypeError, ValueError):
        return None
    return f"{major:02d}.{minor:02d}.{micro}"


_WRAPPED_FIELDS = ("submit_time", "start_time", "end_time", "eligible_time", "time_limit", "cpus",
                   "node_count", "tasks", "priority", "array_job_id", "array_task_id", "het_job_id",
                   "memory_per_node", "memory_per_cpu", "minimum_cpus_per_node", "last_sched_evaluation",
                   "pre_sus_time", "suspend_time", "resize_time", "preempt_time", "accrue_time",
                   "deadline", "time_minimum", "cpus_per_task", "threads_per_core", "restart_cnt")


def normalize_job(j: Mapping[str, Any]) -> dict[str, Any]:
    """A squeue/scontrol --json job in the 22.05 shape, whichever version wrote it.

    ``job_state`` becomes a string, wrapped numbers plain numbers (or None); everything else
    is kept as Slurm wrote it.
    """
    out = dict(j)
    if "job_state" in out:
        out["job_state"] = state(out["job_state"])
    for k in _WRAPPED_FIELDS:
        if isinstance(out.get(k), dict):
            out[k] = number(out[k])
    return out


#: One GPU entry of a node's gres_detail: "gpu:2(IDX:0-1)", "gpu:h200:1(IDX:3)" (gres_stepmgr.c
#: writes name[:type]:count(IDX:bit_fmt)); shares of a GPU ("shard:2(...)") carry no IDX list.
_GPU_DETAIL = re.compile(r"(?:^|,)gpu(?::[^:(),]+)?:[0-9]+\(IDX:([0-9,-]*)\)")


#: More GPUs than any node has: a range past it in gres_detail is not expanded (nothing to loop on).
MAX_GPUS_PER_NODE = 4096


def gpu_indices(detail: str) -> list[str]:
    """Slurm GPU indices in one node's gres_detail, in order, once each:
    ``"gpu:ta:1(IDX:0),gpu:tb:2(IDX:2-3)"`` -> ``["0", "2", "3"]``."""
    out: list[str] = []
    for m in _GPU_DETAIL.finditer(detail):
        for part in (p for p in m.group(1).split(",") if p):
            lo, _, hi = part.partition("-")
            hi = hi or lo
            if not lo.isdigit() or not hi.isdigit() or int(hi) - int(lo) > MAX_GPUS_PER_NODE:
                continue
            for i in range(int(lo), int(hi) + 1):
                if str(i) not in out:
                    out.append(str(i))
    return out


def gpus_from_tres(tres: object) -> int | None:
    """GPUs allocated to a job from sacct's ``tres.allocated`` (None if not accounted).

    22.05 writes ``{"type": "gres", "name": "gpu", "count": N}`` per GRES as 25.11 does; the
    typed variant ``gpu:h200`` counts too, without double-counting the untyped total.
    """
    if not isinstance(tres, dict):
        return None
    alloc = tres.get("allocated")
    if not isinstance(alloc, list):
        return None
    total: int | None = None
    typed = 0
    for t in alloc:
        if not isinstance(t, dict) or t.get("type") != "gres":
            continue
        name = str(t.get("name") or "")
        count = number(t.get("count"))
        if count is None:
            continue
        if name == "gpu":
            total = int(count)
        elif name.startswith("gpu:"):
            typed += int(count)
    if total is None and typed:
        total = typed
    return total


def _utc(epoch: object) -> dt.datetime | None:
    epoch = number(epoch)
    if epoch is not None and epoch > 0:
        return dt.datetime.fromtimestamp(epoch, dt.UTC)
    return None


def _str(value: object) -> str | None:
    return str(value) if value not in (None, "") else None


class CommandSlurmClient(SlurmClient):
    """SlurmClient over Slurm's commands. ``conf`` sets SLURM_CONF (else the environment's);
    ``bin_dir`` is where Slurm's clients are (else PATH), e.g. /opt/slurm/bin."""

    name = "commands"

    def __init__(self, conf: str | os.PathLike[str] | None = None,
                 timeout: float = DEFAULT_TIMEOUT_S,
                 bin_dir: str | os.PathLike[str] | None = None,
                 trusted_programs: bool = False) -> None:
        """``trusted_programs``: run only programs root may run (``refuse_untrusted_program``):
        for the hooks, which run as root, so a squeue that a non-root user could replace (in
        ``--slurm-bin`` or on PATH) is refused as a SlurmError instead of run."""
        self.timeout = timeout
        self.bin_dir = Path(bin_dir) if bin_dir is not None else None
        self.env = dict(os.environ)
        if conf is not None:
            self.env["SLURM_CONF"] = str(conf)
        self.trusted_programs = trusted_programs
        self._checked: dict[str, str] = {}  # program name -> the file found trusted

    def _argv(self, argv: Sequence[str]) -> list[str]:
        args = [str(a) for a in argv]
        if self.bin_dir is not None and "/" not in args[0]:
            args[0] = str(self.bin_dir / args[0])
        if self.trusted_programs:
            args[0] = self._trusted(args[0])
        return args

    def _trusted(self, program: str) -> str:
        """The file to run for ``program``, once checked (per client: one hook run)."""
        if program not in self._checked:
            found = program if "/" in program else shutil.which(program, path=self.env.get("PATH"))
            if found is None:
                raise SlurmError(f"{program}: command not found (is Slurm's client installed?)")
            try:
                self._checked[program] = str(refuse_untrusted_program(Path(found)))
            except FileNotFoundError as exc:
                raise SlurmError(f"{program}: command not found (is Slurm's client installed?)") from exc
            except ConfigError as exc:
                raise SlurmError(f"{Path(program).name}: not run as root: {exc}") from exc
        return self._checked[program]

    def run(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
        return run_slurm(self._argv(argv), timeout=self.timeout, env=self.env if env is None else env)

    def describe(self) -> str:
        return f"Slurm commands ({self.bin_dir or 'PATH'})"

    # -- live state ------------------------------------------------------------------------
    def squeue_jobs(self, job_id: str | None = None) -> list[dict[str, Any]]:
        """Jobs slurmctld still knows (pending, running, recently ended), in the 22.05 shape."""
        argv = ["squeue", "--json", "--states=all"]
        if job_id is not None:
            argv += ["--jobs", str(job_id)]
        jobs = _json(self.run(argv), "squeue --json").get("jobs", [])
        return [normalize_job(j) for j in jobs if isinstance(j, dict)]

    def job(self, job_id: str) -> dict[str, Any] | None:
        """One job's squeue --json record, or None (22.05 ignores -j: filter here too)."""
        if not str(job_id).isdigit():
            raise SlurmError(f"squeue: invalid job id {job_id!r}")
        try:
            jobs = self.squeue_jobs(job_id)
        except SlurmError as exc:
            if "Invalid job id" in str(exc):  # 25.11 honours -j and fails for unknown ids
                return None
            raise
        for j in jobs:
            if str(j.get("job_id")) == str(job_id):
                return j
        return None

    def admin_comment(self, job_id: str) -> str | None:
        """The job's admin_comment (settable only by Slurm operators and job_submit.lua).

        ``squeue -j ID -O admin_comment`` asks slurmctld for one job and prints only that field,
        so no user string (job name, comment, paths) shares the output; measured 8 ms against
        190 ms for ``squeue --json`` with 1,000 jobs queued (which dumps every job).
        """
        if not str(job_id).isdigit():
            raise SlurmError(f"squeue: invalid job id {job_id!r}")
        out = self.run(["squeue", "--noheader", "--states=all", "--jobs", str(job_id),
                        "--Format", f"{JOB_ID_COLUMNS},admin_comment:{ADMIN_COMMENT_WIDTH}"])
        mine = [rest.strip() for ids, rest in own_lines(out, 2) if str(job_id) in ids]
        if len(mine) != 1:
            # squeue answered but not with this job's one line: read as "no decision" it would
            # run a job uncapped on a neighbour's answer; the Prolog logs this and leaves it
            raise SlurmError(f"squeue --jobs {job_id}: {len(mine)} lines for the job itself")
        return None if mine[0] in ("", "(null)") else mine[0]

    def job_ended(self, display_id: str, node: str | None = None) -> bool | None:
        """Whether the job no longer holds GPUs on ``node``: True when slurmctld does not list it
        there in a running state (ended, unknown, pending, requeued after a node failure, or
        running on other nodes), False while it runs there, None when it cannot tell (squeue
        failed or timed out, or an id it cannot take). Without ``node``: on any node.

        For the Prolog's liveness check of job files left by jobs whose Epilog never ran
        (slurmd killed mid-job): such a file would hold its GPU as an uncapped neighbour. A
        requeued job keeps its id, so "still known to Slurm" is not enough: it must run here.
        """
        if not JOB_DISPLAY_ID.fullmatch(str(display_id)):
            return None
        try:
            out = self.run(["squeue", "--noheader", "--states=all", "--jobs", str(display_id),
                            "--Format", f"{JOB_ID_COLUMNS},State:32,NodeList:4096"])
        except SlurmError as exc:
            return True if "invalid job id" in str(exc).lower() else None
        try:
            for ids, rest in own_lines(out, 2):
                if str(display_id) not in ids:  # a sibling task or het component of the id
                    continue
                state, _, nodes = rest.strip().partition(" ")
                if state.upper().rstrip("+") in HOLDING_STATES and (
                        node is None or node in self._hostnames(nodes.strip())):
                    return False
        except SlurmError:
            return None
        return True

    def job_gpu_indices(self, job_id: str, node: str | None = None) -> list[str] | None:
        """Slurm's GPU indices of the job on ``node`` from its allocation (squeue --json
        ``gres_detail``), every GPU type together; None when Slurm cannot tell (no such job,
        a command failed, no ``node`` for a job on several nodes).

        Why: slurmd builds the Prolog's SLURM_JOB_GPUS and CUDA_VISIBLE_DEVICES once per GPU
        entry of the allocation, each overwriting the last (gres_common_prep_set_env), so a job
        given two GPU types (``--gres=gpu:a100:1,gpu:h200:1``) sees only the last type's GPUs
        there (recorded on 25.11: SLURM_JOB_GPUS=2 for ``gpu:ta:1(IDX:0),gpu:tb:1(IDX:2)``).
        """
        if not str(job_id).isdigit():
            return None
        try:  # 22.05 ignores --jobs (every job): the job is picked by its id below either way
            jobs = self.squeue_jobs(str(job_id))
        except SlurmError as exc:
            log.warning("squeue --json --jobs %s: %s", job_id, exc)
            return None
        job = next((j for j in jobs if str(j.get("job_id")) == str(job_id)), None)
        if job is None or not isinstance(job.get("gres_detail"), list) or not job["gres_detail"]:
            return None
        details: list[object] = job["gres_detail"]  # one entry per node of the job, in its order
        if len(details) == 1:
            detail = details[0]
        else:
            nodes = job.get("nodes")
            if node is None or not isinstance(nodes, str):
                return None
            try:
                names = self._hostnames(nodes)
            except SlurmError as exc:
                log.warning("scontrol show hostnames for job %s: %s", job_id, exc)
                return None
            if node not in names or len(names) != len(details):
                return None
            detail = details[names.index(node)]
        return gpu_indices(detail) if isinstance(detail, str) else []

    def _hostnames(self, nodelist: str) -> list[str]:
        """Slurm's hostlist expression (``gpu[01-03],login``) as names; scontrol expands ranges."""
        if "[" not in nodelist:
            return [n for n in nodelist.split(",") if n]
        return self.run(["scontrol", "show", "hostnames", nodelist]).split()

    def nodes(self) -> list[dict[str, Any]]:
        """Nodes as slurmctld describes them: ``sinfo --json``'s ``nodes`` on 22.05; 23.02+ moved
        sinfo --json to per-partition groups, so there ``scontrol --json show nodes``."""
        doc = _json(self.run(["sinfo", "--json"]), "sinfo --json")
        if "nodes" not in doc:
            doc = _json(self.run(["scontrol", "--json", "show", "nodes"]), "scontrol --json show nodes")
        nodes = doc.get("nodes", [])
        return [n for n in nodes if isinstance(n, dict)]

    def node_features(self) -> set[str]:
        """Features that exist on some node (job_submit.lua may only add these)."""
        out: set[str] = set()
        for n in self.nodes():
            feats = n.get("features") or ""
            if isinstance(feats, list):
                out.update(str(f) for f in feats if f)
            else:
                out.update(f for f in str(feats).split(",") if f)
        return out

    def scontrol_show(self, kind: str, name: str) -> str:
        """``scontrol show KIND NAME`` text, for people; not parsed for security-relevant fields."""
        return self.run(["scontrol", "show", kind, name])

    def version(self) -> str:
        """The running Slurm's version, e.g. "22.05.8"."""
        out = self.run(["sinfo", "--version"]).split()
        if len(out) < 2:
            raise SlurmError("sinfo --version: unexpected output")
        return out[-1]

    # -- history (SlurmClient) -------------------------------------------------------------
    def jobs(self, start: dt.datetime, end: dt.datetime) -> list[JobRecord]:
        """Jobs between start and end from ``sacct --json --duplicates`` (needs slurmdbd), one
        record per run: a requeued job keeps its id, and 25.11's ``sacct --json`` lists only its
        last run without ``--duplicates`` (22.05's lists every run either way; both recorded), so
        the check would reject the earlier runs' windows. ``--duplicates`` also lists an older job
        that had the same id (ids reused after slurmctld lost its state) if it ran in the window:
        its records are then checked together with the new job's, the check looser, not wrong."""
        return self._sacct(start, end)

    def job_runs(self, job_ids: Sequence[str], start: dt.datetime, end: dt.datetime) -> list[JobRecord]:
        """Every run of these jobs (Slurm's own ids) between start and end, one record per run;
        for the pyslurm client, whose slurmdbd query keeps one record per id."""
        bad = [j for j in job_ids if not str(j).isdigit()]
        if bad or not job_ids:
            raise SlurmError(f"sacct: invalid job ids {bad or list(job_ids)!r}")
        return self._sacct(start, end, ["--jobs", ",".join(str(j) for j in job_ids)])

    def _sacct(self, start: dt.datetime, end: dt.datetime, more: Sequence[str] = ()) -> list[JobRecord]:
        fmt = "%Y-%m-%dT%H:%M:%S"
        argv = ["sacct", "--json", "--allusers", "--duplicates",
                "--starttime", start.astimezone(dt.UTC).strftime(fmt),
                "--endtime", end.astimezone(dt.UTC).strftime(fmt), *more]
        env_tz = dict(self.env, TZ="UTC")
        doc = _json(self.run(argv, env=env_tz), "sacct --json")
        return [sacct_record(j) for j in doc.get("jobs", []) if isinstance(j, dict)]


_NO_VAL = frozenset({0xFFFFFFFE, 0xFFFFFFFF})


def sacct_record(j: Mapping[str, Any]) -> JobRecord:
    """One ``sacct --json`` job (22.05 or 25.11 layout) as a JobRecord; array tasks as "123_4"."""
    job_id = str(j.get("job_id"))
    array = j.get("array") or {}
    if isinstance(array, dict):
        task, parent = number(array.get("task_id")), number(array.get("job_id"))
        if parent and task is not None and task not in _NO_VAL:
            job_id = f"{int(parent)}_{int(task)}"
    t = j.get("time") or {}
    return JobRecord(
        job_id=job_id,
        name=_str(j.get("name")),
        user=_str(j.get("user")),
        account=_str(j.get("account")),
        partition=_str(j.get("partition")),
        start=_utc(t.get("start")) if isinstance(t, dict) else None,
        end=_utc(t.get("end")) if isinstance(t, dict) else None,
        admin_comment=_admin_comment(j),
        gpus=gpus_from_tres(j.get("tres")),
        slurm_job_id=_str(j.get("job_id")),
        nodes=nodes_text(j.get("nodes")),  # a hostlist in both layouts ("gpu[01-02]"; "None assigned")
    )


def _admin_comment(j: Mapping[str, Any]) -> str | None:
    """sacct --json nests it as comment.administrator; squeue --json has admin_comment."""
    comment = j.get("comment")
    if isinstance(comment, dict):
        return _str(comment.get("administrator"))
    return _str(j.get("admin_comment"))


def installed_pyslurm_version() -> str | None:
    """The installed pyslurm's version from its package metadata, WITHOUT importing it (the import
    reads slurm.conf and can kill the process when that names another Slurm version's plugins)."""
    from importlib import metadata

    try:
        return metadata.version("pyslurm")
    except metadata.PackageNotFoundError:
        return None


def _major_minor(version: str) -> tuple[str, ...]:
    return tuple(str(int(p)) if p.isdigit() else p for p in version.split(".")[:2])


def pyslurm_matches(slurm_version: str) -> bool:
    """True if pyslurm is installed for this Slurm's major.minor and imports."""
    return _pyslurm_choice(slurm_version)[0]


def _pyslurm_choice(slurm_version: str, conf: str | None = None) -> tuple[bool, str]:
    """(use pyslurm?, why) for a running Slurm of ``slurm_version``.

    pyslurm reads slurm.conf once, at import, from SLURM_CONF: a ``conf`` given here is exported
    before that import (it cannot change an already imported pyslurm's cluster).
    """
    ver = installed_pyslurm_version()
    if ver is None:
        return False, "pyslurm is not installed"
    if _major_minor(ver) != _major_minor(slurm_version):
        return False, f"pyslurm {ver} is built for Slurm {'.'.join(_major_minor(ver))}, not {slurm_version}"
    if conf is not None and "pyslurm" not in sys.modules:
        os.environ["SLURM_CONF"] = str(conf)
    try:
        import pyslurm  # type: ignore[import-not-found,unused-ignore]  # noqa: F401
    except Exception as exc:  # ImportError (e.g. libslurmfull missing), a version RuntimeError
        return False, f"pyslurm {ver} does not import: {exc}"
    return True, f"pyslurm {ver} matches Slurm {slurm_version}"


def open_slurm_client(conf: str | None = None, timeout: float = DEFAULT_TIMEOUT_S,
                      *, version: str | None = None,
                      bin_dir: str | os.PathLike[str] | None = None) -> SlurmClient:
    """The best available client for job records, with its choice logged.

    ``PySlurmClient`` when pyslurm is installed for the running Slurm's major.minor (``version``,
    else ``sinfo --version``) and imports; otherwise, as on Debian 12 with Slurm 22.05, the command
    client. The returned client's ``name`` ("pyslurm" or "commands") says which; the nightly
    summary shows it.
    """
    commands = CommandSlurmClient(conf, timeout, bin_dir)
    try:
        running = version if version is not None else commands.version()
    except SlurmError as exc:
        log.info("Slurm job records: Slurm commands (Slurm version unknown: %s)", exc)
        return commands
    use, why = _pyslurm_choice(running, conf)
    if use:
        from wattclass.slurm.pyslurm_client import PySlurmClient

        log.info("Slurm job records: pyslurm (%s)", why)
        return PySlurmClient(runs=commands)
    log.info("Slurm job records: Slurm commands (%s)", why)
    return commands
