"""Per-job rows for shared GPUs and MIG instances: gather activity each poll, split closed rows.

The window builder keeps one segment per job key; for a GPU that several jobs hold, the daemon
gives it one *composite* key per set of jobs (``shared:<id>,<id>`` or, for a MIG GPU,
``mig:<instance>=<ids>;...``), so a segment's energy is the GPU's energy over it (its window's
counter delta, split by integrated power where the set changes inside the window:
telemetry.windows; such a window always closes at a counter read). Meanwhile this module
gathers, per GPU and composite key, what the split needs: per-process SM utilisation samples
and memory held (mapped to jobs through the attributor), or per-instance GPM activity on MIG.
When the builder closes a composite row, ``split`` replaces it with one row per job (per
instance on MIG) whose energies add up to the row's to the millijoule (``sharing.split_mj``).

Columns added to every row (docs/shared-gpus.md): ``share_ratio`` (the job's share of the GPU's
energy in the window; 1 for a sole job), ``shared_jobs`` (jobs on the GPU or instance's parent),
``share_basis`` (``util`` | ``memory`` | ``equal`` | ``mig``; null on unshared GPUs) and
``parent_gpu_uuid`` (MIG rows: ``gpu_uuid`` is the instance's, this is the physical GPU's).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from wattclass.errors import GpuError
from wattclass.gpu.base import GpuBackend, GpuInfo, MigInstance
from wattclass.schema import GPM_COLUMNS, SHARE_COLUMNS
from wattclass.telemetry.attribution import Attributor, Job
from wattclass.telemetry.sharing import IdleTracker, mig_shares, split_mj, split_shares

log = logging.getLogger(__name__)

Row = dict[str, Any]
SHARED_PREFIX = "shared:"
MIG_PREFIX = "mig:"


@dataclass
class _Activity:
    """What one composite segment saw: per job (shared) or per instance (MIG)."""

    sm: dict[str, float] = field(default_factory=dict)  # job -> sum of SM util samples
    mem_sum: dict[str, float] = field(default_factory=dict)  # job -> sum of MiB over polls
    mem_n: int = 0
    users: dict[str, str | None] = field(default_factory=dict)
    # MIG: instance uuid -> [activity x seconds, seconds], and GPM sums per column
    mig_act: dict[str, list[float]] = field(default_factory=dict)
    mig_gpm: dict[str, dict[str, list[float]]] = field(default_factory=dict)


@dataclass
class _MigState:
    instances: list[MigInstance]
    snaps: dict[int, tuple[float, object]] = field(default_factory=dict)  # gi id -> (ts, sample)


class Splitter:
    """Shared-GPU state of one host's GPUs (one poll loop owns it)."""

    def __init__(self, backend: GpuBackend, attributor: Attributor) -> None:
        self.backend = backend
        self.attributor = attributor
        self.idle = IdleTracker()
        self._acc: dict[tuple[int, str], _Activity] = {}
        self._since_us: dict[int, int] = {}
        self._mig: dict[int, _MigState] = {}
        self._prev_key: dict[int, str | None] = {}
        self._users: dict[str, str | None] = {}  # job id -> user, as the job files say

    # -- discovery ----------------------------------------------------------------------------
    def prepare(self, gpus: list[GpuInfo]) -> None:
        """Find MIG instances once (layouts change only with the GPU idle and the daemon restarted)."""
        for g in gpus:
            try:
                inst = self.backend.mig_instances(g.gpu_index)
            except GpuError as exc:
                log.warning("GPU %d: cannot list MIG instances: %s", g.gpu_index, exc)
                inst = []
            if inst:
                self._mig[g.gpu_index] = _MigState(inst)
                log.info("GPU %d (%s): MIG, %d instance(s): %s", g.gpu_index, g.uuid, len(inst),
                         ", ".join(f"{m.uuid} ({m.slices}/{m.total_slices} slices)" for m in inst))

    def is_mig(self, info: GpuInfo) -> bool:
        return info.gpu_index in self._mig

    # -- each poll ----------------------------------------------------------------------------
    def job_key(self, info: GpuInfo) -> tuple[Job | None, list[Job]]:
        """The builder's job for this poll and the jobs behind it."""
        key, jobs = self._job_key(info)
        for j, u in jobs:
            if u is not None or j not in self._users:
                self._users[j] = u
        return key, jobs

    def _job_key(self, info: GpuInfo) -> tuple[Job | None, list[Job]]:
        st = self._mig.get(info.gpu_index)
        if st is not None:
            parts = []
            jobs: list[Job] = []
            for m in st.instances:
                js = self.attributor.jobs_for_uuid(m.uuid)
                jobs += js
                parts.append(f"{m.uuid}={','.join(j[0] for j in js)}")
            if not jobs:
                return None, []
            return (MIG_PREFIX + ";".join(parts), None), jobs
        jobs = self.attributor.jobs_for(info)
        if len(jobs) <= 1:
            return (jobs[0] if jobs else None), jobs
        return (SHARED_PREFIX + ",".join(j[0] for j in jobs), None), jobs

    def observe(self, info: GpuInfo, ts: float, key: Job | None, jobs: list[Job], gpm_point: bool) -> None:
        """Gather this poll's activity for the interval that ends now (it belongs to the key of
        the poll before, as in the window builder); then remember ``key`` for the next poll."""
        i = info.gpu_index
        prev = self._prev_key.get(i)
        self._prev_key[i] = key[0] if key is not None and _composite(key[0]) else None
        if i in self._mig:
            if gpm_point or prev is not None:
                self._observe_mig(info, ts, prev, gpm_point)
            return
        if prev is None and (key is None or not _composite(key[0])):
            self._since_us.pop(i, None)
            return
        try:
            procs = self.backend.processes(i)
            samples = self.backend.process_utilization(i, self._since_us.get(i, int((ts - 1.0) * 1e6)))
        except GpuError as exc:
            log.debug("GPU %d: per-process data unavailable: %s", i, exc)
            return
        if samples:
            self._since_us[i] = max(self._since_us.get(i, 0), max(s.ts_us for s in samples))
        if prev is None:  # the first poll of a shared span: only sets the sample baseline
            return
        acc = self._acc.setdefault((i, prev), _Activity())
        by_pid = {p.pid: p for p in procs}
        self.attributor.forget_pids(i, set(by_pid))
        acc.mem_n += 1
        for p in procs:
            job = self.attributor.job_of_process(i, p)
            if job is not None and p.used_mib is not None:
                acc.mem_sum[job[0]] = acc.mem_sum.get(job[0], 0.0) + p.used_mib
                acc.users.setdefault(job[0], job[1])
        for s in samples:
            owner = by_pid.get(s.pid)
            job = self.attributor.job_of_process(i, owner) if owner is not None else None
            if job is not None:
                acc.sm[job[0]] = acc.sm.get(job[0], 0.0) + s.sm_util_pct

    def _observe_mig(self, info: GpuInfo, ts: float, prev: str | None, gpm_point: bool) -> None:
        st = self._mig[info.gpu_index]
        if not gpm_point:
            return
        for m in st.instances:
            try:
                snap = self.backend.gpm_mig_snapshot(info.gpu_index, m.gpu_instance_id)
            except GpuError as exc:
                log.debug("GPU %d instance %d: GPM failed: %s", info.gpu_index, m.gpu_instance_id, exc)
                snap = None
            old = st.snaps.pop(m.gpu_instance_id, None)
            if snap is not None:
                st.snaps[m.gpu_instance_id] = (ts, snap)
            if old is None or snap is None or prev is None or ts <= old[0]:
                continue
            try:
                met = self.backend.gpm_metrics(info.gpu_index, old[1], snap)
            except GpuError as exc:
                log.debug("GPU %d instance %d: GPM metrics failed: %s", info.gpu_index,
                          m.gpu_instance_id, exc)
                continue
            dt = ts - old[0]
            acc = self._acc.setdefault((info.gpu_index, prev), _Activity())
            if met.sm_util_pct is not None:
                a = acc.mig_act.setdefault(m.uuid, [0.0, 0.0])
                a[0] += met.sm_util_pct * dt
                a[1] += dt
            cols = acc.mig_gpm.setdefault(m.uuid, {})
            for c in GPM_COLUMNS:
                v = getattr(met, c)
                if v is not None:
                    s = cols.setdefault(c, [0.0, 0.0])
                    s[0] += v * dt
                    s[1] += dt

    # -- closed rows --------------------------------------------------------------------------
    def split(self, info: GpuInfo, rows: list[Row]) -> list[Row]:
        """One row per job for composite rows; the share columns on every row."""
        out: list[Row] = []
        for row in rows:
            self.idle.observe(info.uuid, row.get("power_avg_w"))
        # A set of jobs seen again after another in one window has a row per stretch; what was
        # gathered for the set covers them all and weighs each of them.
        taken: dict[str, _Activity] = {}
        for row in rows:
            key = row.get("job_id")
            if key is None or not _composite(key):
                row.update(share_ratio=1.0 if key is not None else None,
                           shared_jobs=1 if key is not None else 0, share_basis=None, parent_gpu_uuid=None)
                out.append(row)
                continue
            if key not in taken:
                taken[key] = self._acc.pop((info.gpu_index, key), _Activity())
            acc = taken[key]
            if key.startswith(MIG_PREFIX):
                out += self._split_mig(info, row, key, acc)
            else:
                out += self._split_shared(info, row, key, acc)
        return out

    def _split_shared(self, info: GpuInfo, row: Row, key: str, acc: _Activity) -> list[Row]:
        jobs = key[len(SHARED_PREFIX):].split(",")
        users = {j: self._users.get(j) for j in jobs}
        users.update({j: u for j, u in acc.users.items() if u is not None})
        mem = {j: v / acc.mem_n for j, v in acc.mem_sum.items()} if acc.mem_n else {}
        dur = max(row["ts_end"] - row["ts_start"], 0.0)
        e = row["energy_j"]
        split = split_shares(jobs, acc.sm, mem, e if e is not None else 0.0, dur,
                             self.idle.idle_w(info.uuid, info.power_limit_default_w))
        return self._emit(row, {j: (j, users.get(j)) for j in jobs}, split.ratios, split.basis,
                          len(jobs), {})

    def _split_mig(self, info: GpuInfo, row: Row, key: str, acc: _Activity) -> list[Row]:
        st = self._mig[info.gpu_index]
        inst_jobs: dict[str, list[str]] = {}
        for part in key[len(MIG_PREFIX):].split(";"):
            uuid, _, ids = part.partition("=")
            inst_jobs[uuid] = [j for j in ids.split(",") if j]
        dur = max(row["ts_end"] - row["ts_start"], 0.0)
        e = row["energy_j"]
        act = {u: (a[0] / a[1] if a[1] > 0 else None) for u, a in acc.mig_act.items()}
        split = mig_shares({m.uuid: m.slices for m in st.instances}, act,
                           st.instances[0].total_slices if st.instances else 7,
                           e if e is not None else 0.0, dur,
                           self.idle.idle_w(info.uuid, info.power_limit_default_w))
        users = self._users
        n_jobs = sum(len(v) for v in inst_jobs.values())
        # Each instance's share goes to its jobs (equally if an instance is itself shared).
        ratios: dict[tuple[str, str | None], float] = {}
        for uuid, r in split.ratios.items():
            holders: list[str | None] = [*inst_jobs.get(uuid, [])] or [None]
            for j in holders:
                ratios[(uuid, j)] = ratios.get((uuid, j), 0.0) + r / len(holders)
        gpm = {}
        for uuid, cols in acc.mig_gpm.items():
            gpm[uuid] = {c: s / t for c, (s, t) in cols.items() if t > 0}
        targets = {k: (k[1], users.get(k[1]) if k[1] else None) for k in ratios}
        return self._emit(row, targets, ratios, "mig", n_jobs, gpm, mig_parent=info.uuid)

    @staticmethod
    def _emit(row: Row, targets: dict[Any, tuple[str | None, str | None]], ratios: dict[Any, float],
              basis: str, n_jobs: int, gpm: dict[str, dict[str, float]], mig_parent: str | None = None
              ) -> list[Row]:
        e = row["energy_j"]
        parts = split_mj(round(e * 1000), ratios) if e is not None else {}
        out = []
        for k, r in ratios.items():
            job_id, user = targets[k]
            new = dict(row)
            ej = parts[k] / 1000 if e is not None else None
            p = row.get("power_avg_w")
            new.update(job_id=job_id, user=user, energy_j=ej,
                       power_avg_w=p * ej / e if p is not None and ej is not None and e else None,
                       share_ratio=r, shared_jobs=n_jobs, share_basis=basis, parent_gpu_uuid=None)
            if mig_parent is not None:
                inst = k[0]
                new["parent_gpu_uuid"] = mig_parent
                if inst:
                    new["gpu_uuid"] = inst
                    for c in GPM_COLUMNS:  # the instance's own activity, not the parent's
                        new[c] = gpm.get(inst, {}).get(c)
            out.append(new)
        return out


def split_equally(row: Row, users: dict[str, str | None]) -> list[Row]:
    """A ``shared:`` row (SHARED_PREFIX) as one row per job, each with an equal share of its
    energy (``share_basis`` ``equal``): for a writer that knows which jobs hold a GPU but not how
    much each uses it (the dcgm-exporter import: DCGM has no per-process activity). Any other
    row is returned as it is."""
    key = row.get("job_id")
    if key is None or not key.startswith(SHARED_PREFIX):
        return [row]
    jobs = key[len(SHARED_PREFIX):].split(",")
    ratios = {j: 1.0 / len(jobs) for j in jobs}
    return Splitter._emit(row, {j: (j, users.get(j)) for j in jobs}, ratios, "equal", len(jobs), {})


def _composite(job_id: str) -> bool:
    return job_id.startswith((SHARED_PREFIX, MIG_PREFIX))


def is_composite(job: Job | None) -> bool:
    """Whether a builder job key stands for several jobs (a shared GPU or a MIG GPU's instances)."""
    return job is not None and _composite(job[0])


__all__ = ["SHARED_PREFIX", "SHARE_COLUMNS", "Splitter", "split_equally"]
