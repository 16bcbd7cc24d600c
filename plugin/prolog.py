# long: the node hooks share GPU resolution, cap records and job files; one light module
"""Prolog / Epilog / reconcile: apply a job's power cap on its GPUs and undo it afterwards.

slurmd runs the Prolog as root before the job and the Epilog after it. The Prolog

1. maps the job's Slurm GPU indices (SLURM_JOB_GPUS) to backend GPUs through a GPU map
   (Slurm index -> UUID or PCI bus id), never by assuming Slurm and NVML number GPUs alike;
2. writes the GPU -> job files the telemetry daemon reads (``telemetry.jobmap``);
3. reads the job's decision from admin_comment through ``squeue -j ID -O admin_comment`` (not from the
   environment: 22.05 exports only the user's own SLURM_JOB_COMMENT, which users control);
4. for a decision that caps for real (``mode=enforce``, or the canary's ``arm=capped`` in shadow
   mode; ``arm=control`` is never capped: ``Comment.capped_for_real``) records each GPU's previous
   limit in the state folder (atomically, before touching the GPU, so a crash between the two
   still restores) and sets the cap, computed per GPU from its default limit and clamped to its min/max.

Shared GPUs (gres/shard, MPS, MIG instances; docs/shared-gpus.md): power limits exist only per
physical GPU, so the cap record is per physical GPU and lists every job holding it with the
limit its decision allows (None: uncapped). The enforced limit is the highest of them (a
neighbour never runs under a lower cap than its own decision allows); the previous limit is
recorded once, by the first job, and restored only when the last job leaves. A job without a cap
joins an existing record (or one another job creates later, found through the job map), so
sites without enforcement never write records. Each change is a read-modify-write under an
exclusive lock on ``<state>/<gpu_uuid>.lock``: two Prologs on one GPU may run at once.

Invariant: a failing Prolog drains the node, so ``main`` exits 0 on any wattclass error and logs
it with the job id. This module imports only the standard library and light wattclass modules
(no pandas) to keep the Prolog fast; ``python -m wattclass.plugin.prolog`` skips the CLI's
other components.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from wattclass.admincomment import COMMENT_PREFIX, Comment, parse_admin_comment
from wattclass.argtypes import positive_float
from wattclass.caps import cap_watts
from wattclass.errors import ConfigError, DataError, GpuError, WattclassError
from wattclass.fsutil import (
    atomic_write_text,
    ensure_trusted_dir,
    open_trusted_append,
    read_trusted_text,
    refuse_untrusted_dir,
)
from wattclass.gpu.base import GpuBackend, GpuInfo
from wattclass.jobmap import (
    DEFAULT_SPOOL,
    JobAssignment,
    job_file_gpus,
    jobs_on_gpu,
    remove_hpc_job_file,
    remove_job_file,
    remove_job_files,
    write_hpc_job_file,
    write_job_file,
)
from wattclass.logsafe import ClipFilter
from wattclass.plugin.sharedcaps import (
    JobEnded,
    Liveness,
    drop_ended,
    gpu_lock,
    held_and_physical,
    leave_shared,
    never_ended,
    record_jobs,
    register,
    resolve_targets,
    usable_w,
)

log = logging.getLogger("wattclass.plugin.prolog")

DEFAULT_STATE = Path("/run/wattclass/caps")
DEFAULT_LOG = Path("/var/log/wattclass/plugin.log")
_UUID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
#: The token job_submit.lua's slurm_job_modify writes when root's change leaves a job no decision
#: (Slurm ignores an empty admin_comment): no cap, and nothing wrong.
_NO_DECISION = re.compile(r"(?:^|\s)" + re.escape(COMMENT_PREFIX) + r"decision=none;reason=[a-z_]+(?:\s|$)")


# -- GPU mapping -------------------------------------------------------------------------------
def load_gpu_map(path: Path) -> dict[str, str]:
    """A JSON object {slurm_gpu_index: uuid or PCI bus id}, written by the site (refused if unsafe)."""
    path = Path(path)
    try:
        doc = json.loads(read_trusted_text(path))
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: GPU map not found") from exc
    except ValueError as exc:
        raise ConfigError(f"{path}: GPU map is not JSON: {exc}") from exc
    if not isinstance(doc, dict) or not all(isinstance(v, str) for v in doc.values()):
        raise ConfigError(f"{path}: GPU map must be an object {{\"0\": \"GPU-uuid or PCI bus id\"}}")
    return {str(k): v for k, v in doc.items()}


def discover_gpu_map(backend: GpuBackend) -> dict[str, str]:
    """Slurm index -> GPU UUID from each GPU's minor number (NVML): index i is /dev/nvidia<i>.

    This holds for gres.conf ``File=/dev/nvidia[0-N]`` (Slurm numbers GPUs in File order and the
    device minor is the N of /dev/nvidiaN); other layouts need an explicit ``--gpu-map``, and so
    does ``AutoDetect=nvml`` where minor numbers are not in NVML order (slurmd then numbers GPUs
    in NVML order; ``wattclass plugin check --slurm-conf`` compares the two). With
    MIG instances on the node it does not hold (Slurm numbers the instances it hands out): the
    minor numbers would cap other jobs' GPUs and leave the job's own uncapped, so that is refused.
    """
    gpus = backend.gpus()
    mig = [g.uuid for g in gpus if backend.mig_instances(g.gpu_index)]
    if mig:
        raise ConfigError(f"GPU {mig[0]} has MIG instances: Slurm's GPU indices are not device minor "
                          "numbers; pass --gpu-map naming each Slurm GPU's MIG- UUID")
    out = {str(g.minor_number): g.uuid for g in gpus if g.minor_number is not None}
    if not out:
        raise ConfigError("the GPU backend reports no device minor numbers; pass --gpu-map")
    return out


def resolve_gpus(backend: GpuBackend, slurm_gpus: str, gpu_map: Mapping[str, str],
                 on_error: Callable[[WattclassError], None] | None = None) -> list[GpuInfo]:
    """The physical backend GPUs behind SLURM_JOB_GPUS, once each, in Slurm's order."""
    return _physical(resolve_targets(backend, slurm_gpus, gpu_map, on_error))


def _physical(targets: list[tuple[str, GpuInfo]]) -> list[GpuInfo]:
    seen: dict[str, GpuInfo] = {}
    for _, g in targets:
        seen.setdefault(g.uuid, g)
    return list(seen.values())


# -- state records -----------------------------------------------------------------------------
def _record_path(state_dir: Path, uuid: str) -> Path:
    if not _UUID_RE.match(uuid):
        raise ConfigError(f"invalid GPU UUID {uuid!r}")
    return Path(state_dir) / f"{uuid}.json"


def read_record(path: Path) -> dict[str, Any] | None:
    """A cap record, None if there is none; DataError/ConfigError if it is corrupt or untrusted."""
    try:
        doc = json.loads(read_trusted_text(path))
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise DataError(f"{path}: corrupt cap record: {exc}") from exc
    if not isinstance(doc, dict) or "previous_w" not in doc:
        raise DataError(f"{path}: not a cap record")
    return doc


def record_then_set(backend: GpuBackend, gpu: GpuInfo, target_w: float, owner: str,
                    state_dir: Path = DEFAULT_STATE) -> float:
    """Record the GPU's limit to restore, durably, THEN set ``target_w``; returns the recorded limit.

    The order is the whole point: if the process dies between the two (or at any time after),
    ``reconcile`` (or the owner's Epilog) finds the record and restores the limit. Shared by the
    Prolog (owner = job id) and ``wattclass calibrate`` (owner = ``calibrate:<pid>``).
    """
    ensure_trusted_dir(state_dir)
    rec_path = _record_path(state_dir, gpu.uuid)
    try:
        old = read_record(rec_path)
    except DataError as exc:  # unusable leftover: the GPU's default is the limit to go back to
        log.error("%s: %s; recording the default limit instead", owner, exc)
        old = {"previous_w": gpu.power_limit_default_w}
    # A record left by an owner that never restored holds the true original limit: keep it.
    current = backend.power_limit_w(gpu.gpu_index)
    previous = old["previous_w"] if old is not None and usable_w(old.get("previous_w")) else current
    if previous is None:
        raise GpuError(f"GPU {gpu.uuid}: current power limit unknown; refusing to change it")
    atomic_write_text(rec_path, json.dumps({
        "version": 1, "job_id": owner, "previous_w": previous, "set_w": target_w,
        "written_at": time.time()}) + "\n", mode=0o644)
    backend.set_power_limit_w(gpu.gpu_index, target_w)
    return float(previous)


def restore_recorded(backend: GpuBackend, uuid: str, owner: str, state_dir: Path = DEFAULT_STATE) -> bool:
    """Restore one GPU from its record if ``owner`` wrote it (the record is removed); False if none."""
    rec_path = _record_path(state_dir, uuid)
    rec = read_record(rec_path)
    if rec is None or str(rec.get("job_id")) != owner:
        return False
    _restore(backend, uuid, rec_path, rec, owner)
    return True


class JobEnv(NamedTuple):
    """What the Prolog/Epilog know from slurmd's environment."""

    job_id: str  # Slurm's unique id (squeue's job_id)
    display_id: str  # "123_4" for array tasks, as telemetry records it
    user: str | None
    uid: int | None
    gpus: str
    account: str | None = None


def job_env(env: Mapping[str, str]) -> JobEnv:
    job_id = env.get("SLURM_JOB_ID", "").strip()
    if not job_id.isdigit():
        raise ConfigError(f"SLURM_JOB_ID is missing or not a number: {job_id!r}")
    arr, task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    display = f"{arr}_{task}" if arr and task else job_id
    uid = env.get("SLURM_JOB_UID")
    return JobEnv(job_id, display, env.get("SLURM_JOB_USER") or None,
                  int(uid) if uid and uid.isdigit() else None, env.get("SLURM_JOB_GPUS", ""),
                  env.get("SLURM_JOB_ACCOUNT") or None)


# -- the hooks ---------------------------------------------------------------------------------
def _drop_jobs_gone(jobs_dir: Path, held: list[str], job_id: str, liveness: Liveness) -> None:
    """Ask Slurm about the other jobs on the GPUs ``held`` (before any GPU lock is taken) and
    remove the files of those that no longer run here.

    In every mode, capped or not: a job that left without its Epilog must not keep its job files,
    or the telemetry daemon splits this job's windows (energy, label) with it. Its place in a cap
    record is dropped later, under the GPU's lock (``register``, with the same answers).
    """
    others = sorted({a.job_id for u in held for a in jobs_on_gpu(jobs_dir, u)} - {job_id})
    liveness.ask(others)
    drop_ended(jobs_dir, "GPU " + ",".join(held), others, liveness)


def _write_hpc_job_files(hpc_job_dir: Path, gpus: list[GpuInfo], job: JobEnv) -> None:
    """dcgm-exporter's job mapping, best effort: it only labels metrics, so a folder it cannot
    use (refused as untrusted: say owned by the exporter's user) is logged and the cap still set."""
    for g in gpus:
        try:
            write_hpc_job_file(hpc_job_dir, g.gpu_index, job.display_id)
        except (WattclassError, OSError) as exc:
            log.error("job %s: dcgm-exporter job mapping for GPU %s not written: %s", job.job_id,
                      g.gpu_index, exc)


def _gpus_beyond_env(backend: GpuBackend, job: JobEnv, gpu_map: Mapping[str, str],
                     job_gpus: Callable[[str], list[str] | None], targets: list[tuple[str, GpuInfo]],
                     unresolved: Callable[[WattclassError], None]) -> list[tuple[str, GpuInfo]]:
    """The job's GPUs that Slurm allocated but SLURM_JOB_GPUS does not name.

    slurmd writes the Prolog's SLURM_JOB_GPUS once per GPU entry of the allocation, each
    overwriting the last, so a job given two GPU types (``--gres=gpu:a100:1,gpu:h200:1`` on a
    node with both) shows only the last type's GPUs there, and its other GPUs ran uncapped: a
    user could escape the cap on all but one type. Asked only for a decision with a cap (one
    more squeue per such job start); a failed answer leaves SLURM_JOB_GPUS as it was.
    """
    try:
        allocated = job_gpus(job.job_id)
    except (WattclassError, OSError) as exc:
        log.error("job %s: cannot ask Slurm for the job's GPUs (SLURM_JOB_GPUS=%s used): %s",
                  job.job_id, job.gpus, exc)
        return []
    named = {s.strip() for s in job.gpus.split(",") if s.strip()}
    missing = [i for i in allocated or [] if i not in named]
    if not missing:
        return []
    log.warning("job %s: Slurm allocated GPUs %s on this node but SLURM_JOB_GPUS=%s (several GPU "
                "types: slurmd names only the last type's); all of them are capped", job.job_id,
                ",".join(allocated or []), job.gpus)
    have = {held for held, _ in targets}
    return [t for t in resolve_targets(backend, ",".join(missing), gpu_map, unresolved) if t[0] not in have]


def _decision(job_id: str, text: str | None) -> Comment | None:
    """The job's wattclass decision from its admin_comment (None: no cap).

    Only job_submit.lua or an administrator writes admin_comment: a wattclass token nobody can
    read is a bug or a hand edit, and the job runs uncapped; so that is logged as an ERROR where
    the sysadmin looks (hook review)."""
    comment = parse_admin_comment(text)
    if comment is None and text and COMMENT_PREFIX in text:
        if _NO_DECISION.search(text):  # job_submit.lua re-decided it (root's scontrol update): none
            log.info("job %s: no decision (admin_comment: %s)", job_id, text)
        else:
            log.error("job %s: malformed wattclass token in admin_comment, not capped: %s", job_id, text)
    return comment


def prolog(
    env: Mapping[str, str],
    backend: GpuBackend,
    admin_comment: Callable[[str], str | None],
    gpu_map: Mapping[str, str],
    jobs_dir: Path = DEFAULT_SPOOL,
    state_dir: Path = DEFAULT_STATE,
    dry_run: bool = False,
    hpc_job_dir: Path | None = None,
    job_ended: JobEnded | None = None,
    job_gpus: Callable[[str], list[str] | None] | None = None,
) -> list[dict[str, Any]]:
    """Apply the job's cap (see module docstring); returns one plan entry per GPU.

    ``hpc_job_dir``: also write dcgm-exporter's job mapping there (``--hpc-job-mapping-dir``).
    ``job_ended``: Slurm's answer whether another job on the GPU has ended (its Epilog never
    ran); such jobs no longer hold the GPU uncapped. None: every job file counts.
    ``job_gpus``: Slurm's GPU indices of the job on this node from its allocation (None: cannot
    tell), asked for a job whose decision carries a cap (``_gpus_beyond_env``).
    """
    job = job_env(env)

    def unresolved(exc: WattclassError) -> None:  # the job's other GPUs are still capped
        log.error("job %s: a GPU of SLURM_JOB_GPUS=%s is not capped: %s", job.job_id, job.gpus, exc)

    targets = resolve_targets(backend, job.gpus, gpu_map, unresolved)
    gpus = _physical(targets)
    if not targets:
        log.info("job %s: no GPUs", job.job_id)
        return []
    if not dry_run:
        ensure_trusted_dir(jobs_dir)
        for held, _ in targets:
            write_job_file(jobs_dir, held, JobAssignment(job.display_id, job.user, job.uid,
                                                         account=job.account))
        if hpc_job_dir is not None:
            _write_hpc_job_files(hpc_job_dir, gpus, job)
    comment = _decision(job.job_id, admin_comment(job.job_id))
    if comment is not None and comment.cap is not None and job_gpus is not None:
        more = _gpus_beyond_env(backend, job, gpu_map, job_gpus, targets, unresolved)
        if more and not dry_run and hpc_job_dir is not None:  # their job files: with the label, below
            known = {g.uuid for g in gpus}
            _write_hpc_job_files(hpc_job_dir, [g for g in _physical(more) if g.uuid not in known], job)
        targets += more
        gpus = _physical(targets)
    if comment is not None and not dry_run:  # the label, for the exporter's wattclass_job_label_info
        for held, _ in targets:
            write_job_file(jobs_dir, held, JobAssignment(job.display_id, job.user, job.uid,
                                                         comment.label, comment.source, job.account))
    liveness = Liveness(job_ended if job_ended is not None else never_ended)
    if not dry_run:
        _drop_jobs_gone(jobs_dir, [held for held, _ in targets], job.display_id, liveness)
    if not dry_run:  # an untrusted state folder fails the whole job, loudly
        ensure_trusted_dir(state_dir)
    plan = []
    for g in gpus:
        try:
            plan.append(_prolog_gpu(backend, g, job, comment, jobs_dir, state_dir, dry_run, liveness))
        except (WattclassError, OSError) as exc:
            # One GPU that cannot be capped (lost from the bus, an NVML error, an unusable record)
            # must not leave the job's other GPUs uncapped: the rest are still capped.
            log.error("job %s: GPU %s: not capped: %s", job.job_id, g.uuid, exc)
            plan.append({"job_id": job.job_id, "gpu_index": g.gpu_index, "uuid": g.uuid,
                         "action": "error", "error": str(exc)})
    return plan


def _prolog_gpu(backend: GpuBackend, g: GpuInfo, job: JobEnv, comment: Comment | None, jobs_dir: Path,
                state_dir: Path, dry_run: bool, liveness: Liveness) -> dict[str, Any]:
    """The Prolog on one physical GPU of the job: its plan entry, the cap set where one applies."""
    current = backend.power_limit_w(g.gpu_index)
    entry: dict[str, Any] = {
        "job_id": job.job_id, "gpu_index": g.gpu_index, "uuid": g.uuid, "pci_bus_id": g.pci_bus_id,
        "current_w": current, "default_w": g.power_limit_default_w, "min_w": g.power_limit_min_w,
        "max_w": g.power_limit_max_w, "label": comment.label if comment else None,
        "cap": comment.cap.text() if comment and comment.cap else None, "target_w": None,
        "action": "none", "effective_w": current,
    }
    target: float | None = None
    if comment is not None and comment.cap is not None:
        default = g.power_limit_default_w if g.power_limit_default_w is not None else current
        if default is None:
            log.error("job %s: GPU %s reports no default limit; not capped", job.job_id, g.uuid)
        else:
            target = cap_watts(comment.cap, default, g.power_limit_min_w, g.power_limit_max_w)
            entry["target_w"] = target
            entry["arm"] = comment.arm
            if dry_run or not comment.capped_for_real():
                idle_arm = "control" if comment.arm == "control" else "shadow"
                entry["action"] = "dry-run" if dry_run else idle_arm
                log.info("job %s: %s: GPU %s label=%s cap=%s would set %.1f W (now %s W)", job.job_id,
                         entry["action"], g.uuid, comment.label, entry["cap"], target, current)
                if dry_run:
                    return entry
                target = None  # not capped for real: holds the GPU uncapped among neighbours
    if dry_run:
        return entry
    # Every job takes its place in its GPUs' cap records, capped for real or holding a GPU at its
    # decision's limit among neighbours (no decision, no cap, a control arm, shadow mode): one not
    # capped for real that stayed out of an existing record ran under its neighbour's cap.
    # the record names the job as the job map does (display id: "123_4" for an array task),
    # so a neighbour found through the map and the job's own Epilog name the same entry
    entry.update(register(backend, g, job.display_id, target, jobs_dir,
                          _record_path(state_dir, g.uuid), read_record, liveness))
    if target is not None:
        entry["action"] = "capped"
        log.info("job %s: capped GPU %s (%s) label=%s cap=%s: %s W -> %.1f W (jobs on it: %s)",
                 job.job_id, g.uuid, g.pci_bus_id, comment.label if comment else None, entry["cap"],
                 current, entry["effective_w"], ",".join(entry["jobs"]))
    return entry


def _set_clamped(backend: GpuBackend, g: GpuInfo, watts: float) -> float:
    if g.power_limit_min_w is not None:
        watts = max(watts, g.power_limit_min_w)
    if g.power_limit_max_w is not None:
        watts = min(watts, g.power_limit_max_w)
    backend.set_power_limit_w(g.gpu_index, watts)
    return watts


def _restore(backend: GpuBackend, uuid: str, rec_path: Path | None, rec: Mapping[str, Any] | None,
             why: str) -> float:
    """Put one GPU back: to the record's previous limit, or to its default limit when there is no
    usable record (corrupt, ``previous_w`` missing/null/not a number, or an untrusted folder)."""
    g = backend.find_gpu(uuid)
    prev = rec.get("previous_w") if rec is not None else None
    if usable_w(prev):
        watts = _set_clamped(backend, g, float(prev))  # type: ignore[arg-type]
        how = "recorded"
    elif g.power_limit_default_w is not None:
        watts = _set_clamped(backend, g, g.power_limit_default_w)
        how = "default (no usable record)"
    else:
        raise GpuError(f"GPU {uuid}: no usable record and no default limit")
    if rec_path is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(rec_path)
    log.info("%s: restored GPU %s to %.1f W (%s)", why, uuid, watts, how)
    return watts


def _job_gpus(backend: GpuBackend, job: JobEnv, gpu_map: Mapping[str, str] | None) -> dict[str, GpuInfo]:
    if gpu_map is None or not job.gpus:
        return {}
    def unresolved(exc: WattclassError) -> None:  # the others still count as the job's
        log.error("job %s: epilog: cannot map a GPU of the job: %s", job.job_id, exc)

    return {g.uuid: g for g in resolve_gpus(backend, job.gpus, gpu_map, unresolved)}


def _held_gpus(backend: GpuBackend, jobs_dir: Path, display_id: str) -> dict[str, list[str]]:
    """Physical GPU UUID -> the UUIDs (the GPU's own, its MIG instances') the job map says the job
    holds there: the Epilog removes those files under the GPU's lock, before it reads the record.

    A neighbour's Prolog reads the job map under the same lock: if it saw the files it put this
    job into the record, and the Epilog then finds and removes it; removed only at the end, a
    record made in between would keep the ended job as an uncapped neighbour (the GPU uncapped)
    until the last job left."""
    out: dict[str, list[str]] = {}
    with contextlib.suppress(OSError):
        for held in job_file_gpus(jobs_dir, display_id):
            try:
                parent = held_and_physical(backend, held)[1].uuid
                _record_path(Path("."), parent)  # a name fit for a record path
            except (WattclassError, StopIteration):
                continue  # not a GPU of this node: the final cleanup removes the file
            out.setdefault(parent, []).append(held)
    return out


def epilog(env: Mapping[str, str], backend: GpuBackend, jobs_dir: Path = DEFAULT_SPOOL,
           state_dir: Path = DEFAULT_STATE, gpu_map: Mapping[str, str] | None = None,
           hpc_job_dir: Path | None = None) -> list[str]:
    """Leave the job's GPUs: remove it from each cap record; where it was the last job restore
    the recorded limit, else enforce the highest cap of the jobs that remain; remove its job
    files. Idempotent. Returns the UUIDs whose limit was restored.

    Each GPU is handled on its own, so one bad record never strands the others. A record that is
    unusable (corrupt JSON, ``previous_w`` null) sends its GPU to the default limit when the GPU
    is one of this job's (SLURM_JOB_GPUS + ``gpu_map``, or its job files: ``_gpus_beyond_env``);
    an untrusted state folder sends all of them to their default limit (no record is believed).
    ``hpc_job_dir``: remove this job from dcgm-exporter's job mapping too.
    """
    job = job_env(env)
    if hpc_job_dir is not None:
        for g in backend.gpus():
            with contextlib.suppress(WattclassError, OSError):
                remove_hpc_job_file(hpc_job_dir, g.gpu_index, job.display_id)
    mine = _job_gpus(backend, job, gpu_map)
    restored: list[str] = []
    errors: list[str] = []

    def attempt(uuid: str, rec_path: Path | None, rec: Mapping[str, Any] | None) -> None:
        try:
            _restore(backend, uuid, rec_path, rec, f"job {job.job_id}")
            restored.append(uuid)
        except (WattclassError, OSError) as exc:  # one bad GPU must not stop the others
            errors.append(f"GPU {uuid}: {exc}")
            log.error("job %s: epilog: GPU %s: %s", job.job_id, uuid, exc)

    records: list[Path] = []
    held = _held_gpus(backend, Path(jobs_dir), job.display_id)
    trusted = True
    try:
        refuse_untrusted_dir(Path(state_dir), creates=True)
        found = set(Path(state_dir).glob("*.json"))
        records = sorted(found | {_record_path(state_dir, u) for u in held})
    except FileNotFoundError:  # no capped job yet; one may start now: lock the job's GPUs
        records = sorted(_record_path(state_dir, u) for u in held)
    except ConfigError as exc:
        trusted = False
        log.error("job %s: epilog: %s; the job's GPUs go to their default limit", job.job_id, exc)
    for rec_path in records:
        uuid = rec_path.stem
        try:
            with gpu_lock(rec_path):
                for held_uuid in held.get(uuid, []):
                    remove_job_file(Path(jobs_dir), held_uuid, job.display_id)
                try:
                    rec = read_record(rec_path)
                    jobs = record_jobs(rec) if rec is not None else {}
                except (DataError, ConfigError) as exc:
                    if uuid in mine or uuid in held:
                        log.error("job %s: epilog: %s; GPU %s goes to its default limit", job.job_id, exc,
                                  uuid)
                        attempt(uuid, rec_path, None)
                    else:
                        log.error("job %s: epilog: %s (not this job's GPU: left for reconcile)",
                                  job.job_id, exc)
                    continue
                # display id ("123_4"), and the plain id an older version recorded array tasks by
                names = {job.display_id, job.job_id}
                if rec is None or not names & jobs.keys():
                    continue
                for name in names:
                    jobs.pop(name, None)
                if not jobs:
                    attempt(uuid, rec_path, rec)
                else:
                    leave_shared(backend, backend.find_gpu(uuid), rec_path, rec, jobs, job.job_id)
        except (WattclassError, OSError) as exc:  # one bad GPU must not stop the others
            errors.append(f"GPU {uuid}: {exc}")
            log.error("job %s: epilog: GPU %s: %s", job.job_id, uuid, exc)
    if not trusted:
        for uuid in sorted(set(mine) | set(held)):
            attempt(uuid, None, None)
    _remove_job_files(Path(jobs_dir), job)
    if errors:
        raise GpuError("; ".join(errors))
    return restored


def _drop_files_after_failed_epilog(hook: str, env: Mapping[str, str], jobs_dir: Path) -> None:
    """The job has ended even when restoring its GPUs failed (a broken GPU backend): its job files
    must still go, or every later job on those GPUs would count it as a live, uncapped neighbour
    and stay uncapped. Its cap records stay, for ``reconcile``."""
    if hook != "epilog":
        return
    try:
        _remove_job_files(Path(jobs_dir), job_env(env))
    except Exception as exc:  # the Epilog must exit 0 whatever happens
        log.error("job %s: epilog: cannot remove its job files: %r", env.get("SLURM_JOB_ID", "?"), exc)


def _remove_job_files(spool: Path, job: JobEnv) -> None:
    """The job's files in every GPU folder, and legacy per-GPU files naming it."""
    for problem in remove_job_files(spool, job.display_id):
        log.error("job %s: epilog: %s", job.job_id, problem)


def reconcile(backend: GpuBackend, jobs_dir: Path = DEFAULT_SPOOL,
              state_dir: Path = DEFAULT_STATE) -> list[dict[str, Any]]:
    """On GPUs that no job holds: restore a recorded limit, else the default. Run at boot.

    Each GPU on its own, as in the Epilog: one GPU whose limit cannot be set must not leave the
    others at a crashed job's cap; the failures are raised together at the end (exit 1)."""
    done: list[dict[str, Any]] = []
    errors: list[str] = []
    for g in backend.gpus():
        try:
            entry = _reconcile_gpu(backend, g, jobs_dir, state_dir)
        except (WattclassError, OSError) as exc:
            errors.append(f"GPU {g.uuid}: {exc}")
            log.error("reconcile: GPU %s: %s", g.uuid, exc)
            continue
        if entry is not None:
            done.append(entry)
    if errors:
        raise GpuError("reconcile: " + "; ".join(errors))
    return done


def _reconcile_gpu(backend: GpuBackend, g: GpuInfo, jobs_dir: Path, state_dir: Path) -> dict[str, Any] | None:
    """One GPU, under its lock when the state folder is trusted: run on a node with jobs (a manual
    ``systemctl restart wattclass-reconcile``), a Prolog capping the GPU between the job-map check
    and the record's read had its fresh record restored and removed (the job ran uncapped).
    At boot the folder is missing (and /run read-only to the unit): nothing to lock against."""
    rec_path = _record_path(state_dir, g.uuid)
    try:
        refuse_untrusted_dir(Path(state_dir), creates=True)
        lock: contextlib.AbstractContextManager[None] = gpu_lock(rec_path)
    except (FileNotFoundError, ConfigError):  # none, or no lock to trust: read_record decides
        lock = contextlib.nullcontext()
    with lock:
        return _reconcile_unlocked(backend, g, jobs_dir, rec_path)


def _reconcile_unlocked(backend: GpuBackend, g: GpuInfo, jobs_dir: Path,
                        rec_path: Path) -> dict[str, Any] | None:
    if jobs_on_gpu(jobs_dir, g.uuid) or any(jobs_on_gpu(jobs_dir, m.uuid)
                                             for m in backend.mig_instances(g.gpu_index)):
        return None
    try:
        rec = read_record(rec_path)
    except (DataError, ConfigError) as exc:
        log.error("reconcile: %s; GPU %s goes to its default limit", exc, g.uuid)
        rec = {}
    if rec is not None:
        watts = _restore(backend, g.uuid, rec_path, rec or None, "reconcile")
        return {"uuid": g.uuid, "action": "restored", "watts": watts}
    current = backend.power_limit_w(g.gpu_index)
    default = g.power_limit_default_w
    if default is not None and current is not None and abs(current - default) > 0.5:
        backend.set_power_limit_w(g.gpu_index, default)
        log.info("reconcile: GPU %s had %s W with no job; set default %s W", g.uuid, current, default)
        return {"uuid": g.uuid, "action": "default", "watts": default}
    return None


# -- entry point -------------------------------------------------------------------------------
def add_arguments(p: argparse.ArgumentParser) -> None:
    from wattclass.gpu import SPEC_HELP

    p.add_argument("--backend", default="nvml", help=f"GPU backend: {SPEC_HELP} (default nvml)")
    p.add_argument("--gpu-map", type=Path, default=None,
                   help="JSON {slurm_index: uuid|pci_bus_id}; default: from /proc/driver/nvidia")
    p.add_argument("--jobs-dir", type=Path, default=DEFAULT_SPOOL, help="GPU->job files folder")
    p.add_argument("--state-dir", type=Path, default=DEFAULT_STATE, help="recorded previous limits")
    p.add_argument("--hpc-job-mapping-dir", type=Path, default=None, metavar="DIR",
                   help="also write dcgm-exporter's job mapping (one file per GPU index holding the "
                   "job ids) into DIR, the folder given to dcgm-exporter --hpc-job-mapping-dir")
    p.add_argument("--log", type=Path, default=DEFAULT_LOG, help="log file (appended)")
    # > 0 and finite: 0 or less timed out every squeue at once (every job left uncapped, seen only
    # in the log), and `install-hooks` refuses what this parser refuses (plugin/install.py)
    p.add_argument("--slurm-timeout", type=positive_float, default=5.0, help="seconds for squeue")
    p.add_argument("--slurm-bin", type=Path, default=None,
                   help="folder of Slurm's client commands (squeue) when they are not in /usr/bin, e.g. "
                   "/opt/slurm/bin: slurmd gives hooks no PATH, and a client of another Slurm version "
                   "than slurmctld's fails")
    p.add_argument("--dry-run", action="store_true",
                   help="read limits and constraints, compute the cap, set nothing (prints the plan)")
    p.add_argument("--admin-comment", default=None,
                   help="with --dry-run only: use this decision instead of asking Slurm (GPU machines "
                   "without Slurm), e.g. 'wattclass:label=memory;conf=0.9;cap=60%%;src=rule;mode=enforce'")


def setup_log(path: Path | None, stderr: bool = True) -> None:
    """Log to ``path`` (appended; slurmd discards hook output) and optionally stderr."""
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)] if stderr else []
    if path is not None and os.fspath(path) == os.devnull:
        pass  # no log file (dry runs)
    elif path is not None:
        try:  # as root trusts a path: no symlink, FIFO or folder others can write
            handlers.append(logging.StreamHandler(open_trusted_append(path)))
        except (ConfigError, OSError) as exc:
            # " ERROR ": the wrappers send such stderr lines to syslog
            print(f"wattclass ERROR hook log {path} not used: {exc}", file=sys.stderr)
    root = logging.getLogger("wattclass")
    root.setLevel(logging.INFO)
    for h in handlers:
        h.addFilter(ClipFilter())  # user strings (names, paths, error texts) clipped, one line each
        h.setFormatter(logging.Formatter("%(asctime)s %(levelname)s wattclass-%(hook)s: %(message)s",
                                         defaults={"hook": "plugin"}))
        root.addHandler(h)


def run_hook(hook: str, args: argparse.Namespace, env: Mapping[str, str] | None = None) -> int:
    """Run one hook; 0 whatever wattclass's own failure (it is logged with the job id)."""
    env = dict(os.environ) if env is None else env
    old_factory = logging.getLogRecordFactory()

    def factory(*a: Any, **k: Any) -> logging.LogRecord:
        rec = old_factory(*a, **k)
        rec.hook = hook
        return rec

    logging.setLogRecordFactory(factory)
    job_id = env.get("SLURM_JOB_ID", "?")
    try:
        from wattclass.gpu import open_backend

        with open_backend(args.backend) as backend:
            if hook == "reconcile":
                done = reconcile(backend, args.jobs_dir, args.state_dir)
                print(json.dumps(done, indent=2))
                return 0
            if hook == "epilog":
                try:
                    emap: Mapping[str, str] | None = (load_gpu_map(args.gpu_map) if args.gpu_map
                                                      else discover_gpu_map(backend))
                except WattclassError as exc:
                    log.error("job %s: epilog: no GPU map (%s): only recorded GPUs are restored",
                              job_id, exc)
                    emap = None
                epilog(env, backend, args.jobs_dir, args.state_dir, emap, args.hpc_job_mapping_dir)
                return 0
            from wattclass.slurm.commands import CommandSlurmClient

            # root runs squeue: never one a non-root user could replace (refused, logged)
            slurm = CommandSlurmClient(timeout=args.slurm_timeout, bin_dir=args.slurm_bin,
                                       trusted_programs=True)
            get_comment: Callable[[str], str | None] = slurm.admin_comment
            if args.admin_comment is not None:
                if not args.dry_run:  # the decision must come from Slurm when caps are applied
                    raise ConfigError("--admin-comment is only allowed with --dry-run")
                fixed: str = args.admin_comment

                def fixed_comment(_job_id: str) -> str | None:
                    return fixed

                get_comment = fixed_comment
            gpu_map = load_gpu_map(args.gpu_map) if args.gpu_map else discover_gpu_map(backend)
            node = env.get("SLURMD_NODENAME") or None
            plan = prolog(env, backend, get_comment, gpu_map, args.jobs_dir, args.state_dir,
                          dry_run=args.dry_run, hpc_job_dir=args.hpc_job_mapping_dir,
                          job_ended=functools.partial(slurm.job_ended, node=node),
                          job_gpus=(None if args.admin_comment is not None
                                    else functools.partial(slurm.job_gpu_indices, node=node)))
            if args.dry_run:
                print(json.dumps(plan, indent=2))
            return 0
    except WattclassError as exc:
        log.error("job %s: %s failed, job continues unchanged: %s", job_id, hook, exc)
        _drop_files_after_failed_epilog(hook, env, args.jobs_dir)
    except Exception as exc:  # a bug must not drain the node either
        log.exception("job %s: %s crashed, job continues unchanged: %r", job_id, hook, exc)
        _drop_files_after_failed_epilog(hook, env, args.jobs_dir)
    finally:
        logging.setLogRecordFactory(old_factory)
    return 0 if hook != "reconcile" else 1


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m wattclass.plugin.prolog {prolog,epilog,reconcile} [options]`` (fast path)."""
    parser = argparse.ArgumentParser(prog="wattclass-hook")
    parser.add_argument("hook", choices=("prolog", "epilog", "reconcile"))
    add_arguments(parser)
    args = parser.parse_args(argv)
    setup_log(args.log)
    return run_hook(args.hook, args)


if __name__ == "__main__":
    sys.exit(main())
