"""Who runs what, where and when on a synthetic fleet for one day.

The schedule is small (tens of thousands of jobs for 10,000 GPUs) and is built once in the
parent process, deterministically from the seed; the heavy per-window rendering then runs host by
host in workers from it. Realism that the classifier and the label table rely on:

- users drawn Zipf-like, each with a few accounts and a repertoire of job names that they submit
  again and again (the label table keys on user + job name), each name replaying one real job;
- heavy-tailed durations (log-normal per name, log-normal around it per job);
- 1/2/4/8-GPU single-node jobs, multi-node jobs (the same job id on several hosts) and job
  arrays (``123_4``); idle gaps between jobs; jobs already running at midnight and still
  running at the end of the day.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import numpy as np

WINDOW_S = 10
WINDOWS_PER_HOUR = 3600 // WINDOW_S
_EPOCH = dt.date(2020, 1, 1)
_MAX_DURATION_W = 3 * 24 * WINDOWS_PER_HOUR  # longest job: 3 days
_LOOKBACK_W = 6 * WINDOWS_PER_HOUR  # GPUs were already busy this long before midnight
_VERBS = (
    "train",
    "infer",
    "eval",
    "sim",
    "md",
    "finetune",
    "bench",
    "prep",
    "sweep",
    "serve",
    "fit",
    "solve",
)
_NOUNS = (
    "gpt", "llama", "resnet", "bert", "vit", "unet", "lammps", "gromacs", "cfd", "fft", "qcd",
    "climate", "protein", "diffusion", "moe", "rl", "graph", "seismic", "ocean", "spmm",
)  # fmt: skip


@dataclass(frozen=True)
class FleetSpec:
    """The size and identity of a generated fleet-day."""

    gpus: int
    date: dt.date
    gpus_per_host: int = 8
    seed: int = 0
    hours: int = 24  # generate only the first ``hours`` of the day (tests)

    @property
    def n_hosts(self) -> int:
        return -(-self.gpus // self.gpus_per_host)

    @property
    def windows(self) -> int:
        return self.hours * WINDOWS_PER_HOUR

    def host_gpus(self, host: int) -> int:
        """GPUs on host ``host`` (the last host holds the remainder)."""
        return min(self.gpus_per_host, self.gpus - host * self.gpus_per_host)

    def host_name(self, host: int) -> str:
        return f"gpu{host:05d}"

    @property
    def day_start_ms(self) -> int:
        return int(
            dt.datetime(self.date.year, self.date.month, self.date.day, tzinfo=dt.UTC).timestamp() * 1000
        )


@dataclass(frozen=True)
class Population:
    """Users, accounts and job-name templates; depends on the seed and fleet size, not the date."""

    users: tuple[str, ...]
    n_profiles: int
    accounts: tuple[str, ...]
    t_user: np.ndarray  # per template: user index
    t_name: tuple[str, ...]
    t_account: np.ndarray  # account index
    t_partition: tuple[str, ...]
    t_gpus: np.ndarray  # GPUs per node
    t_nodes: np.ndarray  # nodes (1 = single-node)
    t_array: np.ndarray  # bool: submitted as a job array
    t_median_w: np.ndarray  # median duration in windows
    t_profile: np.ndarray  # real job replayed
    w_single: np.ndarray  # pick probability among single-node templates (0 for others)
    w_multi: np.ndarray  # pick probability among multi-node templates


# long: one seeded random draw after another; splitting would spread the seed order over functions
def make_population(spec: FleetSpec, n_profiles: int) -> Population:
    """Users (Zipf-like activity), their accounts and their recurring job names."""
    rng = np.random.default_rng([spec.seed, spec.gpus, 101])
    n_users = max(8, round(spec.gpus / 20))
    n_accounts = max(2, n_users // 8)
    users = tuple(f"u{i:04d}" for i in range(n_users))
    accounts = tuple(f"proj{i:03d}" for i in range(n_accounts))
    user_w = 1.0 / np.arange(1, n_users + 1) ** 1.0
    user_w /= user_w.sum()
    acct_w = 1.0 / np.arange(1, n_accounts + 1) ** 0.8
    acct_w /= acct_w.sum()
    t_user: list[int] = []
    t_name: list[str] = []
    t_account: list[int] = []
    t_partition: list[str] = []
    t_gpus: list[int] = []
    t_nodes: list[int] = []
    t_array: list[bool] = []
    t_median: list[int] = []
    t_profile: list[int] = []
    for u in range(n_users):
        own = [int(rng.choice(n_accounts, p=acct_w))]
        if rng.random() < 0.2:
            own.append(int(rng.integers(n_accounts)))
        n_names = min(12, 1 + int(rng.geometric(0.35)))
        for k in range(n_names):
            name = f"{_VERBS[rng.integers(len(_VERBS))]}_{_NOUNS[rng.integers(len(_NOUNS))]}"
            if rng.random() < 0.4:
                name += f"_{k}"
            gpus = int(rng.choice([1, 2, 4, 8], p=[0.45, 0.15, 0.15, 0.25]))
            nodes = 1
            if gpus == 8 and rng.random() < 0.5:
                nodes = int(rng.choice([2, 2, 2, 4, 4, 8, 16, 32]))
            is_array = gpus == 1 and rng.random() < 0.15
            if nodes > 1:
                median = float(rng.lognormal(np.log(3 * WINDOWS_PER_HOUR), 0.8))
            else:
                median = float(rng.lognormal(np.log(WINDOWS_PER_HOUR / 2), 1.3))
            median_w = int(np.clip(median, 6, 12 * WINDOWS_PER_HOUR))
            if median_w < WINDOWS_PER_HOUR / 3 and rng.random() < 0.5:
                partition = "debug"
            elif median_w > 8 * WINDOWS_PER_HOUR:
                partition = "gpu-long"
            else:
                partition = "gpu"
            t_user.append(u)
            t_name.append(name)
            t_account.append(own[int(rng.integers(len(own)))])
            t_partition.append(partition)
            t_gpus.append(gpus)
            t_nodes.append(nodes)
            t_array.append(is_array)
            t_median.append(median_w)
            t_profile.append(int(rng.integers(n_profiles)))
    # Small fleets draw few templates: make sure every kind of job exists at least once.
    singles = [i for i, g in enumerate(t_gpus) if g == 1]
    if singles and not any(t_array):
        t_array[singles[int(rng.integers(len(singles)))]] = True
    if not any(n > 1 for n in t_nodes):
        i = int(rng.integers(len(t_nodes)))
        t_gpus[i], t_nodes[i], t_array[i] = 8, 2, False
        t_median[i] = 3 * WINDOWS_PER_HOUR
    tu = np.array(t_user, dtype=np.int64)
    nodes_a = np.array(t_nodes, dtype=np.int64)
    per_user = np.bincount(tu, minlength=n_users).astype(np.float64)
    base = user_w[tu] / per_user[tu]
    # One pick of an array template places ~5 tasks: weigh it down so arrays stay a minority.
    arrays = np.array(t_array, dtype=bool)
    w_single = np.where(nodes_a == 1, base, 0.0) / np.where(arrays, 5.0, 1.0)
    w_multi = np.where(nodes_a > 1, base, 0.0)
    w_single /= w_single.sum()
    if w_multi.sum() > 0:
        w_multi /= w_multi.sum()
    return Population(
        users=users,
        n_profiles=n_profiles,
        accounts=accounts,
        t_user=tu,
        t_name=tuple(t_name),
        t_account=np.array(t_account, dtype=np.int64),
        t_partition=tuple(t_partition),
        t_gpus=np.array(t_gpus, dtype=np.int64),
        t_nodes=nodes_a,
        t_array=arrays,
        t_median_w=np.array(t_median, dtype=np.int64),
        t_profile=np.array(t_profile, dtype=np.int64),
        w_single=w_single,
        w_multi=w_multi,
    )


@dataclass(frozen=True)
class Schedule:
    """Jobs of the day and their GPU segments (window indices relative to midnight)."""

    job_template: np.ndarray
    job_start: np.ndarray  # first window (may be < 0: started the day before)
    job_end: np.ndarray  # window after the last (may be > windows: still running)
    job_profile: np.ndarray  # real job replayed (template's, or another one now and then)
    job_gpus: np.ndarray  # GPUs per node
    job_nodes: np.ndarray
    job_ids: tuple[str, ...]
    seg_host: np.ndarray  # one row per (job, host, gpu), clipped to [0, windows)
    seg_gpu: np.ndarray
    seg_job: np.ndarray
    seg_start: np.ndarray
    seg_end: np.ndarray


class _Picker:
    """Draw templates by weight with one uniform number (cheaper than rng.choice in a loop)."""

    def __init__(self, weights: np.ndarray) -> None:
        self.cdf = np.cumsum(weights)

    def __call__(self, rng: np.random.Generator) -> int:
        return int(
            min(np.searchsorted(self.cdf, rng.random() * self.cdf[-1], side="right"), len(self.cdf) - 1)
        )


def _duration(rng: np.random.Generator, median_w: int) -> int:
    return int(np.clip(round(rng.lognormal(np.log(median_w), 0.6)), 3, _MAX_DURATION_W))


# long: one packing pass over hosts whose local state (reservations, cursors) the steps share
def build_schedule(spec: FleetSpec, pop: Population) -> Schedule:
    """Place multi-node jobs first (they need whole hosts at once), then fill each host's GPUs."""
    rng = np.random.default_rng([spec.seed, (spec.date - _EPOCH).days, 202])
    n_hosts, W = spec.n_hosts, spec.windows
    jobs: list[tuple[int, int, int, int, int]] = []  # template, start, end, family, nodes
    segs: list[tuple[int, int, int, int, int]] = []  # host, gpu, job, start, end
    reserved: list[list[tuple[int, int]]] = [[] for _ in range(n_hosts)]

    # Multi-node jobs: whole hosts, a contiguous block of them (same job id on every host).
    if n_hosts >= 2 and pop.w_multi.sum() > 0:
        pick_multi = _Picker(pop.w_multi)
        n_multi = max(1, round(0.33 * n_hosts * spec.hours / 24))
        for _ in range(n_multi):
            t = pick_multi(rng)
            k = int(min(pop.t_nodes[t], n_hosts))
            dur = _duration(rng, int(pop.t_median_w[t]))
            for _attempt in range(5):
                h0 = int(rng.integers(0, n_hosts - k + 1))
                start = int(rng.integers(-min(dur, _LOOKBACK_W), W))
                end = start + dur
                block = range(h0, h0 + k)
                if all(not (start < re and end > rs) for h in block for rs, re in reserved[h]):
                    break
            else:
                continue
            j = len(jobs)
            jobs.append((t, start, end, -1, k))
            for h in block:
                reserved[h].append((start, end))
                for g in range(spec.host_gpus(h)):
                    segs.append((h, g, j, max(start, 0), min(end, W)))

    # Single-node jobs, host by host, around the reservations.
    pick_single = _Picker(pop.w_single)
    n_families = 0
    for h in range(n_hosts):
        ng = spec.host_gpus(h)
        res = sorted(reserved[h])
        free = -rng.integers(0, _LOOKBACK_W, size=ng)
        pending: list[tuple[int, int]] = []  # remaining tasks of a job array: (template, family)
        while True:
            order = np.argsort(free, kind="stable")
            if free[order[0]] >= W:
                break
            if pending:
                t, fam = pending.pop()
            else:
                t, fam = pick_single(rng), -1
                if pop.t_array[t]:
                    fam = n_families
                    n_families += 1
                    pending = [(t, fam)] * int(rng.integers(1, 9))
            g = int(min(pop.t_gpus[t], ng))
            idx = order[:g]
            gap = 0 if rng.random() < 0.6 else int(rng.exponential(60))
            start = int(free[idx].max()) + gap
            dur = _duration(rng, int(pop.t_median_w[t]))
            end = start + dur
            moved = True
            while moved:
                moved = False
                for rs, re in res:
                    if start < re and end > rs:
                        if start >= rs:  # would start inside a reservation: wait for it to end
                            start, end = re, re + dur
                            moved = True
                            break
                        end = rs  # backfilled: this job ends before the reservation starts
            free[idx] = end
            if end <= 0 or start >= W:
                continue
            j = len(jobs)
            jobs.append((t, start, end, fam, 1))
            for gi in idx:
                segs.append((h, int(gi), j, max(start, 0), min(end, W)))

    tmpl = np.array([r[0] for r in jobs], dtype=np.int64)
    start_a = np.array([r[1] for r in jobs], dtype=np.int64)
    end_a = np.array([r[2] for r in jobs], dtype=np.int64)
    fam_a = np.array([r[3] for r in jobs], dtype=np.int64)
    nodes_a = np.array([r[4] for r in jobs], dtype=np.int64)
    gpus_a = np.minimum(pop.t_gpus[tmpl], spec.gpus_per_host)
    # A job now and then behaves unlike its name's usual self (new input, new code version).
    profile = pop.t_profile[tmpl].copy()
    odd = rng.random(len(jobs)) < 0.05
    profile[odd] = rng.integers(0, pop.n_profiles, size=int(odd.sum()))
    job_ids = _assign_ids(spec, start_a, fam_a, rng)
    seg = np.array(segs, dtype=np.int64).reshape(-1, 5)
    return Schedule(
        job_template=tmpl,
        job_start=start_a,
        job_end=end_a,
        job_profile=profile,
        job_gpus=gpus_a,
        job_nodes=nodes_a,
        job_ids=job_ids,
        seg_host=seg[:, 0],
        seg_gpu=seg[:, 1],
        seg_job=seg[:, 2],
        seg_start=seg[:, 3],
        seg_end=seg[:, 4],
    )


def _assign_ids(
    spec: FleetSpec, start: np.ndarray, family: np.ndarray, rng: np.random.Generator
) -> tuple[str, ...]:
    """Slurm-like ids: increasing with start time, unique per date; array tasks as ``base_i``."""
    n = len(start)
    stride = max(1_000_000, 10 ** len(str(n)))
    next_id = 1 + (spec.date - _EPOCH).days * stride
    order = np.lexsort((rng.random(n), start))
    ids: list[str] = [""] * n
    base: dict[int, int] = {}
    count: dict[int, int] = {}
    for j in order:
        fam = int(family[j])
        if fam < 0:
            ids[j] = str(next_id)
            next_id += 1
        else:
            if fam not in base:
                base[fam] = next_id
                count[fam] = 0
                next_id += 1
            ids[j] = f"{base[fam]}_{count[fam]}"
            count[fam] += 1
    return tuple(ids)
