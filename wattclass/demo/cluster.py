"""A small synthetic Slurm cluster spliced from the REAL recorded H200 workloads.

Why: the demo (and the report's tests) must show the whole flow on a laptop with no GPU and no
Slurm, on data that looks like a site's day rather than 21 jobs on one GPU. We have one real
H200 recording (``wattclass/data/h200/raw``: 21 workloads of ~34 s each at 1 Hz). This module
cuts each recorded workload out of that recording and splices its 1 Hz rows, repeated or cut, into
jobs of 1-15 minutes on several GPUs of several nodes, with idle rows (the recording's own idle
samples) between jobs. Nothing is invented per row except the timestamp and the energy counter,
which is rebuilt as a continuous counter from the recorded per-second energy deltas.

Output (one folder per node, the probe format the replay backend plays)::

    OUT/nodes/<host>/gpu<i>_caps.json          recorded caps, distinct uuid, plus "index": i
                                               (gpm_supported 0 on the last ``no_gpm_nodes`` nodes)
    OUT/nodes/<host>/gpu<i>_samples_1hz.parquet  1 Hz rows; ``job`` = workload name or "gap"
    OUT/nodes/<host>/gpu<i>_runs.csv           job (workload), job_id, user, start, end, label, ...
    OUT/jobs.csv          Slurm job records (JobsFileClient format): job_id,name,user,account,...
    OUT/truth.csv         per job: workload, the class it was built to have, the GPM-rule truth
    OUT/submissions.csv   a batch of NEW submissions (no telemetry yet) for the policy step
    OUT/manifest.json     what was built (seed, hosts, counts, time span)

Replay convention: each part belongs to the GPU named by its caps ``uuid`` (``index`` = gpu
index); parts of one uuid are one GPU in time order; ``job_id``/``user`` in runs.csv win over any
name-derived job id. Deterministic for a given seed.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import io
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from wattclass.errors import ConfigError, DataError
from wattclass.fsutil import atomic_write_bytes, atomic_write_text

#: Rows of the recording that mean "no job ran"; ``startup`` rows are a truly idle GPU.
IDLE_JOB = "gap"
_NOT_A_JOB = ("gap", "startup")
_UUID_NS = uuid.UUID("5b0c1a8e-4f43-4a8e-9a51-7761747463ea")


@dataclass(frozen=True)
class Habit:
    """A job a user submits again and again: same script name, workloads drawn from ``workloads``.

    Users reuse job names, which is what lets the submission-time label table learn.
    """

    user: str
    account: str
    partition: str
    name: str
    workloads: tuple[str, ...]
    weight: float = 1.0


#: The demo site: users with habits over the recorded workloads. Most habits are consistent
#: (one class), a few are not, so the table shows confident and unsure keys.
DEFAULT_HABITS: tuple[Habit, ...] = (
    Habit(
        "alice", "llm", "gpu", "train_llm.sh", ("gemm_bf16_16384", "gemm_fp16_8192", "decode_batch1024"), 3
    ),
    Habit("alice", "llm", "gpu", "serve_llama.sh", ("decode_batch16", "decode_batch64"), 2),
    Habit("bob", "cfd", "gpu", "cfd_stencil", ("gelu_bf16", "adam_step_1G", "sort_fp32"), 3),
    Habit("bob", "cfd", "gpu", "fft_poisson", ("fft_c64",), 1.5),
    Habit("carol", "bio", "gpu", "graph_embed.py", ("spmm_csr",), 1.5),
    Habit(
        "carol", "bio", "gpu", "md_pipeline.sh", ("two_phase_compute_then_memory", "bursty_gemm_50pct"), 1.5
    ),
    Habit("dave", "vision", "gpu", "resnet_train.py", ("resnet50_train_amp",), 2),
    Habit("dave", "vision", "gpu", "gpt2_finetune.py", ("gpt2_medium_train_bf16",), 1.5),
    Habit("erin", "llm", "interactive", "jupyter", ("idle_holding_100GB", "dataloader_starved"), 1.5),
    Habit("erin", "llm", "gpu", "chat_eval.py", ("gpt2_medium_decode_b1", "decode_batch1"), 1),
    Habit("frank", "physics", "gpu", "lattice_qcd", ("gemm_tf32_8192", "decode_batch256"), 2),
    Habit("gita", "benchmark", "gpu", "hpl_like", ("gemm_bf16_2048", "gemm_fp16_8192"), 1),
)

#: Users who appear only in the submission batch: the table has no key for them.
_NEW_USERS: tuple[tuple[str, str, str], ...] = (
    ("hana", "llm", "rlhf_ppo.sh"),
    ("ivan", "cfd", "les_channel"),
)


@dataclass(frozen=True)
class ClusterSpec:
    """Size and shape of the synthetic cluster.

    Defaults: 4 nodes x 4 GPUs for 2 h = 115 200 samples, jobs of 1-10 min, about 300 jobs, so
    the whole demo (replay of every 1 Hz sample through the daemon in Python) stays under a minute.
    """

    nodes: int = 4
    gpus_per_node: int = 4
    start: dt.datetime = dt.datetime(2026, 11, 28, 8, 0, tzinfo=dt.UTC)
    span_s: int = 7200
    job_min_s: int = 60
    job_max_s: int = 600
    gap_min_s: int = 10
    gap_max_s: int = 120
    first_job_id: int = 20001
    n_submissions: int = 40
    seed: int = 7
    host_prefix: str = "gpu-node-"
    #: The last nodes replay WITHOUT GPM (caps ``gpm_supported`` = 0), as a pre-Hopper GPU reports,
    #: so the demo shows both label sources: the GPM rule, and the LightGBM model where GPM is absent.
    no_gpm_nodes: int = 1

    def validate(self) -> None:
        checks = [
            (self.nodes >= 1, "nodes must be >= 1"),
            (self.gpus_per_node >= 1, "gpus_per_node must be >= 1"),
            (self.span_s >= 60, "span_s must be >= 60"),
            (0 < self.job_min_s <= self.job_max_s, "need 0 < job_min_s <= job_max_s"),
            (0 <= self.gap_min_s <= self.gap_max_s, "need 0 <= gap_min_s <= gap_max_s"),
            (self.start.tzinfo is not None, "start must be timezone-aware (UTC)"),
            (0 <= self.no_gpm_nodes <= self.nodes, "need 0 <= no_gpm_nodes <= nodes"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ConfigError(f"demo cluster: {msg}")

    @property
    def hosts(self) -> list[str]:
        return [f"{self.host_prefix}{i + 1:02d}" for i in range(self.nodes)]


@dataclass(frozen=True)
class Recording:
    """The recorded workloads: per workload its 1 Hz rows (with per-second energy ``de_mj``)."""

    caps: dict[str, object]
    segments: dict[str, pd.DataFrame]
    idle: pd.DataFrame
    intended: dict[str, str]  # workload -> class it was built to have (runs.csv ``label``)
    columns: tuple[str, ...]


@dataclass(frozen=True)
class ClusterManifest:
    """What ``build_cluster`` wrote."""

    out: Path
    hosts: list[str]
    node_dirs: dict[str, Path]
    jobs_file: Path
    truth_file: Path
    submissions_file: Path
    n_gpus: int
    n_jobs: int
    n_samples: int
    start: dt.datetime
    end: dt.datetime
    seed: int

    def to_json(self) -> dict[str, object]:
        d = dataclasses.asdict(self)
        return {k: (str(v) if isinstance(v, Path | dt.datetime) else v) for k, v in d.items()} | {
            "node_dirs": {h: str(p) for h, p in self.node_dirs.items()}
        }


def load_recording(raw_dir: Path) -> Recording:
    """Read every recorded part in ``raw_dir``: ``<part>_{samples_1hz.parquet,runs.csv,caps.json}``."""
    raw_dir = Path(raw_dir)
    parts = sorted(p.name[: -len("_samples_1hz.parquet")] for p in raw_dir.glob("*_samples_1hz.parquet"))
    if not parts:
        raise DataError(f"{raw_dir}: no *_samples_1hz.parquet recordings found")
    segments: dict[str, pd.DataFrame] = {}
    idle: list[pd.DataFrame] = []
    intended: dict[str, str] = {}
    caps: dict[str, object] = {}
    columns: tuple[str, ...] = ()
    for part in parts:
        try:
            caps = json.loads((raw_dir / f"{part}_caps.json").read_text())
            s = pd.read_parquet(raw_dir / f"{part}_samples_1hz.parquet")
            runs = pd.read_csv(raw_dir / f"{part}_runs.csv")
        except FileNotFoundError as exc:
            raise DataError(
                f"{raw_dir}: recording part {part} is incomplete: {exc.filename} missing"
            ) from exc
        for col in ("ts", "job", "energy_mj", "power_mw"):
            if col not in s.columns:
                raise DataError(f"{raw_dir / (part + '_samples_1hz.parquet')}: missing column {col}")
        s = s.sort_values("ts").reset_index(drop=True)
        # Energy over the second before each poll; the first poll has no predecessor: use power x 1 s.
        de = s["energy_mj"].diff()
        de.iloc[0] = s["power_mw"].iloc[0]
        s["de_mj"] = de.clip(lower=0)
        columns = tuple(c for c in s.columns if c != "de_mj")
        for job, label, start, end in zip(
            runs["job"], runs["label"], runs["start"], runs["end"], strict=True
        ):
            seg = s[(s["ts"] >= float(start)) & (s["ts"] <= float(end) + 0.5) & (s["job"] == job)]
            if len(seg):
                segments[str(job)] = seg.reset_index(drop=True)
                intended[str(job)] = str(label)
        idle.append(s[s["job"] == "startup"])
    idle_df = pd.concat(idle, ignore_index=True)
    if idle_df.empty:
        raise DataError(f"{raw_dir}: recording has no idle (startup) samples to put between jobs")
    return Recording(caps=caps, segments=segments, idle=idle_df, intended=intended, columns=columns)


def _tile(rows: pd.DataFrame, n: int) -> pd.DataFrame:
    """``n`` rows taken cyclically from ``rows`` (a recorded job repeated or cut to length)."""
    idx = np.arange(n) % len(rows)
    return rows.iloc[idx]


def _gpu_uuid(seed: int, host: str, index: int) -> str:
    return "GPU-" + str(uuid.uuid5(_UUID_NS, f"{seed}/{host}/{index}"))


@dataclass
class _Job:
    host: str
    gpu: int
    habit: Habit
    workload: str
    start: int  # seconds from cluster start
    dur: int
    job_id: str = ""


def _schedule(
    spec: ClusterSpec, rec: Recording, habits: Sequence[Habit], rng: np.random.Generator
) -> list[_Job]:
    usable = [h for h in habits if any(w in rec.segments for w in h.workloads)]
    if not usable:
        raise DataError("demo cluster: no habit uses a workload present in the recording")
    weights = np.array([h.weight for h in usable], dtype=float)
    weights /= weights.sum()
    jobs: list[_Job] = []
    for host in spec.hosts:
        for gpu in range(spec.gpus_per_node):
            t = int(rng.integers(0, spec.gap_max_s + 1))
            while True:
                habit = usable[int(rng.choice(len(usable), p=weights))]
                options = [w for w in habit.workloads if w in rec.segments]
                workload = options[int(rng.integers(len(options)))]
                dur = int(rng.integers(spec.job_min_s, spec.job_max_s + 1))
                if t + dur > spec.span_s:
                    break
                jobs.append(_Job(host, gpu, habit, workload, t, dur))
                t += dur + int(rng.integers(spec.gap_min_s, spec.gap_max_s + 1))
    jobs.sort(key=lambda j: (j.start, j.host, j.gpu))
    for i, j in enumerate(jobs):
        j.job_id = str(spec.first_job_id + i)
    return jobs


def _gpu_samples(
    rec: Recording, jobs: list[_Job], span_s: int, t0: float, counter0: int
) -> tuple[pd.DataFrame, list[dict[str, object]]]:
    """The 1 Hz rows of one GPU over the span, and its runs.csv rows."""
    pieces: list[pd.DataFrame] = []
    runs: list[dict[str, object]] = []
    t = 0
    for j in sorted(jobs, key=lambda j: j.start):
        if j.start > t:
            pieces.append(_tile(rec.idle, j.start - t).assign(job=IDLE_JOB, n_procs=0))
        seg = _tile(rec.segments[j.workload], j.dur).assign(job=j.workload)
        pieces.append(seg)
        runs.append(
            {
                "job": j.workload,
                "job_id": j.job_id,
                "user": j.habit.user,
                "start": t0 + j.start,
                "end": t0 + j.start + j.dur - 1,
                "label": rec.intended[j.workload],
                "energy_j": float(seg["de_mj"].sum()) / 1e3,
                "avg_power_w": float(seg["de_mj"].sum()) / 1e3 / j.dur,
            }
        )
        t = j.start + j.dur
    if t < span_s:
        pieces.append(_tile(rec.idle, span_s - t).assign(job=IDLE_JOB, n_procs=0))
    s = pd.concat(pieces, ignore_index=True)
    s["ts"] = t0 + np.arange(len(s), dtype=float)
    s["energy_mj"] = counter0 + s["de_mj"].round().astype("int64").cumsum()
    return s[list(rec.columns)], runs


def _parquet_bytes(df: pd.DataFrame) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), buf, compression="zstd")
    return buf.getvalue()


def _truth_labels(raw_dir: Path) -> dict[str, str]:
    """workload -> GPM-rule label from the bundled jobs.csv next to ``raw`` (empty if absent)."""
    jobs_csv = Path(raw_dir).parent / "jobs.csv"
    if not jobs_csv.exists():
        return {}
    df = pd.read_csv(jobs_csv)
    if not {"workload", "truth"} <= set(df.columns):
        return {}
    return dict(zip(df["workload"].astype(str), df["truth"].astype(str), strict=True))


def _submissions(
    spec: ClusterSpec, habits: Sequence[Habit], rng: np.random.Generator, first_id: int
) -> pd.DataFrame:
    """New submissions: mostly known (user, name) pairs, some new scripts of known users, new users."""
    rows = []
    for i in range(spec.n_submissions):
        r = rng.random()
        if r < 0.7:
            h = habits[int(rng.integers(len(habits)))]
            user, account, partition, name = h.user, h.account, h.partition, h.name
        elif r < 0.85:
            h = habits[int(rng.integers(len(habits)))]
            user, account, partition, name = h.user, h.account, "gpu", f"new_experiment_{i}.sh"
        else:
            user, account, name = _NEW_USERS[int(rng.integers(len(_NEW_USERS)))]
            partition = "gpu"
        rows.append(
            {
                "job_id": str(first_id + i),
                "name": name,
                "user": user,
                "account": account,
                "partition": partition,
            }
        )
    return pd.DataFrame(rows)


# long: one linear recipe (nodes, schedule, splice, write) that reads best top to bottom
def build_cluster(
    raw_dir: Path,
    out: Path,
    spec: ClusterSpec | None = None,
    habits: Sequence[Habit] = DEFAULT_HABITS,
) -> ClusterManifest:
    """Write the synthetic cluster under ``out`` (see module docstring) and return what was built."""
    spec = spec or ClusterSpec()
    spec.validate()
    rec = load_recording(raw_dir)
    missing = sorted({w for h in habits for w in h.workloads} - set(rec.segments))
    if missing and len(missing) == len({w for h in habits for w in h.workloads}):
        raise DataError(f"{raw_dir}: none of the habit workloads were recorded ({', '.join(missing)})")
    rng = np.random.default_rng(spec.seed)
    jobs = _schedule(spec, rec, habits, rng)
    out = Path(out)
    t0 = spec.start.timestamp()
    node_dirs: dict[str, Path] = {}
    n_samples = 0
    limit_mw = rec.caps.get("enforced_limit_mw") or rec.caps.get("limit_mw")
    for n, host in enumerate(spec.hosts):
        node_dir = out / "nodes" / host
        node_dirs[host] = node_dir
        for gpu in range(spec.gpus_per_node):
            mine = [j for j in jobs if j.host == host and j.gpu == gpu]
            counter0 = int(rng.integers(10**9, 10**11))
            samples, runs = _gpu_samples(rec, mine, spec.span_s, t0, counter0)
            n_samples += len(samples)
            caps = dict(rec.caps) | {
                "uuid": _gpu_uuid(spec.seed, host, gpu),
                "index": gpu,
                "serial": f"demo-{n:02d}{gpu:02d}",
                "pci": f"00000000:{0x18 + 0x10 * gpu:02X}:00.0",
                "energy_mj": counter0,
                "host": host,
                "synthetic": "spliced from recorded H200 workloads by wattclass.demo.cluster",
            }
            if limit_mw is not None:
                caps["enforced_limit_mw"] = limit_mw
            if n >= spec.nodes - spec.no_gpm_nodes:
                caps["gpm_supported"] = 0
                caps["synthetic"] = f"{caps['synthetic']}; replayed without GPM, as a GPU without GPM reports"
            part = f"gpu{gpu}"
            atomic_write_text(node_dir / f"{part}_caps.json", json.dumps(caps, indent=1) + "\n")
            atomic_write_bytes(node_dir / f"{part}_samples_1hz.parquet", _parquet_bytes(samples))
            runs_df = pd.DataFrame(
                runs, columns=["job", "job_id", "user", "start", "end", "label", "energy_j", "avg_power_w"]
            )
            atomic_write_text(node_dir / f"{part}_runs.csv", runs_df.to_csv(index=False))


    def iso(s: float) -> str:
        return dt.datetime.fromtimestamp(t0 + s, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    jobs_df = pd.DataFrame(
        [
            {
                "job_id": j.job_id,
                "name": j.habit.name,
                "user": j.habit.user,
                "account": j.habit.account,
                "partition": j.habit.partition,
                "start": iso(j.start),
                "end": iso(j.start + j.dur),
            }
            for j in jobs
        ],
        columns=["job_id", "name", "user", "account", "partition", "start", "end"],
    )
    truth_of = _truth_labels(raw_dir)
    truth_df = pd.DataFrame(
        [
            {
                "job_id": j.job_id,
                "host": j.host,
                "gpu_index": j.gpu,
                "workload": j.workload,
                "intended": rec.intended[j.workload],
                "truth": truth_of.get(j.workload, ""),
            }
            for j in jobs
        ],
        columns=["job_id", "host", "gpu_index", "workload", "intended", "truth"],
    )
    subs = _submissions(spec, habits, rng, spec.first_job_id + len(jobs))
    atomic_write_text(out / "jobs.csv", jobs_df.to_csv(index=False))
    atomic_write_text(out / "truth.csv", truth_df.to_csv(index=False))
    atomic_write_text(out / "submissions.csv", subs.to_csv(index=False))
    manifest = ClusterManifest(
        out=out,
        hosts=spec.hosts,
        node_dirs=node_dirs,
        jobs_file=out / "jobs.csv",
        truth_file=out / "truth.csv",
        submissions_file=out / "submissions.csv",
        n_gpus=spec.nodes * spec.gpus_per_node,
        n_jobs=len(jobs),
        n_samples=n_samples,
        start=spec.start,
        end=spec.start + dt.timedelta(seconds=spec.span_s),
        seed=spec.seed,
    )
    atomic_write_text(out / "manifest.json", json.dumps(manifest.to_json(), indent=1) + "\n")
    return manifest


def bundled_raw_dir() -> Path:
    """The recorded H200 data shipped inside the package."""
    return Path(__file__).resolve().parents[1] / "data" / "h200" / "raw"
