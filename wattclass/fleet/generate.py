"""Fleet generator: one day of telemetry for a cluster of any size, built from real H200 windows.

A 10,000-GPU site writes 86.4 million 10 s windows a day; the nightly run has to be measured on
that, but no such recording exists here. So we replay the real windows we have: a schedule of
users, recurring jobs, multi-GPU/multi-node jobs, arrays and gaps (``fleetgen_schedule``) decides
which real job (``fleetgen_sources``) runs on which GPU when; every window copies that job's real
values with small jitter, and idle GPUs copy real idle windows. Output is laid out as the
telemetry daemons write it:

  <root>/telemetry/date=YYYY-MM-DD/host=<host>/<HH>.parquet   (TELEMETRY_V1, zstd, hourly)
  <root>/jobs/date=YYYY-MM-DD/jobs.parquet                    (JobsFileClient format)
  <root>/jobs/date=YYYY-MM-DD/truth.parquet                   (job_id -> real job replayed)
  <root>/jobs/date=YYYY-MM-DD/fleet.json                      (what was generated, how long)

Every GPU has exactly one row per window; windows with no job have a null job_id (docs/design.md).
Memory is bounded by one host-hour per worker, whatever the fleet size; hosts are rendered in
parallel worker processes, each from its own seeded random stream, so the output is identical
for a seed whatever ``workers`` is.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime as dt
import hashlib
import json
import multiprocessing
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from wattclass.argtypes import iso_date, non_negative_int
from wattclass.errors import ConfigError
from wattclass.fleet.schedule import (
    _EPOCH,
    WINDOW_S,
    WINDOWS_PER_HOUR,
    FleetSpec,
    Population,
    Schedule,
    build_schedule,
    make_population,
)
from wattclass.fleet.sources import SourcePool, default_sources, load_sources
from wattclass.fsutil import atomic_write_text, atomic_writer
from wattclass.schema import TELEMETRY_V1

__all__ = ["FleetResult", "FleetSpec", "generate", "register"]

#: Columns worth dictionary-encoding (few distinct values); jittered floats are not.
_DICT_COLUMNS = [
    "host", "gpu_uuid", "gpu_model", "job_id", "user", "power_limit_w", "mem_clock_mhz",
    "sm_clock_max_mhz", "fb_total_mib", "throttle_power_frac", "throttle_thermal_frac", "fb_used_mib",
]  # fmt: skip
_PCT_GPM = ("sm_util_pct", "sm_occupancy_pct", "tensor_util_pct", "dram_bw_util_pct", "fp64_util_pct",
            "fp32_util_pct", "fp16_util_pct", "int_util_pct")  # fmt: skip
_MAX_GPUS_PER_HOST = 64


@dataclass(frozen=True)
class HostPlan:
    """What one worker needs to render one host-day: its GPU segments and its jobs only."""

    host: int
    name: str
    n_gpus: int
    seg_gpu: np.ndarray
    seg_start: np.ndarray
    seg_end: np.ndarray
    seg_job: np.ndarray  # index into the local job arrays below
    job_ids: tuple[str, ...]
    job_users: tuple[str, ...]
    job_profile: np.ndarray
    job_start: np.ndarray  # first window of the job (phase of the replayed sequence)


@dataclass(frozen=True)
class FleetResult:
    telemetry_dir: Path
    jobs_path: Path
    truth_path: Path
    gpus: int
    hosts: int
    jobs: int
    multi_node_jobs: int
    rows: int
    files: int
    bytes: int
    seconds: float


def gpu_uuid(seed: int, host: str, index: int) -> str:
    """A stable NVML-style UUID per (seed, host, GPU): the same GPU keeps it across dates."""
    h = hashlib.blake2b(f"{seed}:{host}:{index}".encode(), digest_size=16).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _host_plans(spec: FleetSpec, pop: Population, sched: Schedule) -> list[HostPlan]:
    order = np.argsort(sched.seg_host, kind="stable")
    bounds = np.searchsorted(sched.seg_host[order], np.arange(spec.n_hosts + 1))
    plans = []
    for h in range(spec.n_hosts):
        sel = order[bounds[h] : bounds[h + 1]]
        jobs, local = np.unique(sched.seg_job[sel], return_inverse=True)
        plans.append(
            HostPlan(
                host=h,
                name=spec.host_name(h),
                n_gpus=spec.host_gpus(h),
                seg_gpu=sched.seg_gpu[sel],
                seg_start=sched.seg_start[sel],
                seg_end=sched.seg_end[sel],
                seg_job=local.astype(np.int64),
                job_ids=tuple(sched.job_ids[j] for j in jobs),
                job_users=tuple(pop.users[pop.t_user[sched.job_template[j]]] for j in jobs),
                job_profile=sched.job_profile[jobs],
                job_start=sched.job_start[jobs],
            )
        )
    return plans


def _render_host(plan: HostPlan, pool: SourcePool, spec: FleetSpec, out_dir: Path) -> tuple[int, int]:
    """Write one host-day as hourly Parquet files; returns (rows, bytes)."""
    G, W = plan.n_gpus, spec.windows
    rng = np.random.default_rng([spec.seed, (spec.date - _EPOCH).days, plan.host, 303])
    grid = np.full((G, W), -1, dtype=np.int64)
    scale = np.ones((G, W), dtype=np.float64)
    seg_scale = np.clip(rng.normal(1.0, 0.015, len(plan.seg_gpu)), 0.95, 1.05)
    for i in range(len(plan.seg_gpu)):
        g, s, e = plan.seg_gpu[i], plan.seg_start[i], plan.seg_end[i]
        grid[g, s:e] = plan.seg_job[i]
        scale[g, s:e] = seg_scale[i]
    wins = np.broadcast_to(np.arange(W, dtype=np.int64), (G, W))
    src = pool.idle_off + (wins + rng.integers(0, pool.idle_len, size=(G, 1))) % pool.idle_len
    active = grid >= 0
    lj = grid[active]
    prof = plan.job_profile[lj]
    src[active] = pool.prof_off[prof] + (wins[active] - plan.job_start[lj]) % pool.prof_len[prof]
    # Time-major, as the daemon appends: every GPU's window t, then t+1, ...
    src_t, grid_t, scale_t = src.T.ravel(), grid.T.ravel(), scale.T.ravel()
    temp_off = rng.integers(-3, 4, size=G).astype(np.float64)
    uuids = pa.array([gpu_uuid(spec.seed, plan.name, g) for g in range(G)], pa.string())
    job_dict = pa.array([*plan.job_ids, None], pa.string())
    user_dict = pa.array([*plan.job_users, None], pa.string())
    host_dict = pa.array([plan.name], pa.string())
    model_dict = pa.array([pool.gpu_model], pa.string())
    out_dir.mkdir(parents=True, exist_ok=True)
    per_hour = WINDOWS_PER_HOUR * G
    total_bytes = 0
    for hour in range(spec.hours):
        sl = slice(hour * per_hour, (hour + 1) * per_hour)
        n = per_hour
        s_idx = src_t[sl]
        gpu = np.tile(np.arange(G, dtype=np.int16), WINDOWS_PER_HOUR)
        win = np.repeat(np.arange(hour * WINDOWS_PER_HOUR, (hour + 1) * WINDOWS_PER_HOUR, dtype=np.int64), G)
        t0 = spec.day_start_ms + win * (WINDOW_S * 1000)
        cols = _jittered_values(pool, s_idx, scale_t[sl], temp_off[gpu], rng)
        j = grid_t[sl]
        j_idx = pa.array(np.where(j >= 0, j, len(plan.job_ids)))
        arrays: dict[str, pa.Array] = {
            "ts_start": pa.array(t0, pa.timestamp("ms", tz="UTC")),
            "ts_end": pa.array(t0 + WINDOW_S * 1000, pa.timestamp("ms", tz="UTC")),
            "host": host_dict.take(pa.array(np.zeros(n, dtype=np.int32))),
            "gpu_index": pa.array(gpu, pa.int16()),
            "gpu_uuid": uuids.take(pa.array(gpu.astype(np.int32))),
            "gpu_model": model_dict.take(pa.array(np.zeros(n, dtype=np.int32))),
            "job_id": job_dict.take(j_idx),
            "user": user_dict.take(j_idx),
            # The generated fleet has no shared GPUs: a job holds its GPU alone.
            "share_ratio": pa.array(np.where(j >= 0, 1.0, np.nan), pa.float32(), from_pandas=True),
            "shared_jobs": pa.array((j >= 0).astype(np.int16), pa.int16()),
            "share_basis": pa.nulls(n, pa.string()),
            "parent_gpu_uuid": pa.nulls(n, pa.string()),
        }
        for field in TELEMETRY_V1:
            if field.name not in arrays:
                arrays[field.name] = pa.array(
                    cols[field.name].astype(field.type.to_pandas_dtype()), from_pandas=True
                )
        table = pa.Table.from_arrays([arrays[f.name] for f in TELEMETRY_V1], schema=TELEMETRY_V1)
        total_bytes += _write_atomic(table, out_dir / f"{hour:02d}.parquet")
    return G * W, total_bytes


def _jittered_values(
    pool: SourcePool, s: np.ndarray, scale: np.ndarray, temp_off: np.ndarray, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """Copy the real values at rows ``s`` with realistic noise and keep the physical relations.

    Power scales per job-GPU (silicon lottery) plus 1% per window; the energy counter has mJ
    resolution and power_avg_w is derived from it exactly; percentages stay in [0, 100]; the SM
    clock never exceeds its maximum; temperatures are whole degrees, offset per GPU (airflow).
    Constant-per-GPU facts (limits, totals, clock-event fractions, frame buffer) are copied.
    """
    n = len(s)
    c = pool.columns

    def z(sigma: float) -> np.ndarray:
        return 1.0 + sigma * rng.standard_normal(n, dtype=np.float32).astype(np.float64)

    out: dict[str, np.ndarray] = {}
    for name in ("power_limit_w", "mem_clock_mhz", "sm_clock_max_mhz", "fb_total_mib",
                 "throttle_power_frac", "throttle_thermal_frac", "fb_used_mib"):  # fmt: skip
        out[name] = c[name][s]
    limit = out["power_limit_w"]
    pavg = c["power_avg_w"][s] * scale * z(0.01)
    # At the limit the firmware holds the average just under it; clip with a little play.
    cap = limit * (1.0 - 0.004 * np.abs(rng.standard_normal(n)))
    pavg = np.where(np.isnan(limit), pavg, np.fmin(pavg, cap))
    energy = np.round(pavg * WINDOW_S, 3)
    out["energy_j"] = energy
    out["power_avg_w"] = energy / WINDOW_S
    pmax = np.round(c["power_max_w"][s] * scale * z(0.01), 3)
    out["power_max_w"] = np.where(np.isnan(pmax), pmax, np.fmax(pmax, out["power_avg_w"]))
    for name in ("util_gpu_pct", "util_mem_pct"):
        out[name] = np.round(np.clip(c[name][s] * z(0.02), 0.0, 100.0), 1)
    clk = np.round(c["sm_clock_mhz"][s] * z(0.003), 1)
    out["sm_clock_mhz"] = np.where(
        np.isnan(out["sm_clock_max_mhz"]), clk, np.fmin(clk, out["sm_clock_max_mhz"])
    )
    out["temp_c"] = np.round(c["temp_c"][s] + temp_off + 0.5 * rng.standard_normal(n))
    for name in _PCT_GPM:
        out[name] = np.clip(c[name][s] * z(0.02), 0.0, 100.0)
    for name in ("pcie_tx_mibs", "pcie_rx_mibs"):
        out[name] = np.clip(c[name][s] * z(0.05), 0.0, None)
    # Within-window spreads (null in sources written before they existed): power's scales with it.
    out["power_std_w"] = c["power_std_w"][s] * scale
    for name in ("sm_clock_std_mhz", "util_mem_std_pct"):
        out[name] = c[name][s]
    return out


def _write_atomic(table: pa.Table, path: Path) -> int:
    """Write a Parquet file under a temporary name, then rename: readers never see half a file.

    No fsync: generated data is reproducible from its seed, so durability is not promised, and
    30,000 fsyncs would dominate the run; atomicity is.
    """
    tmp = path.with_name(f".{path.name}.tmp")
    pq.write_table(
        table, tmp, compression="zstd", use_dictionary=_DICT_COLUMNS, row_group_size=table.num_rows
    )
    os.replace(tmp, path)
    return path.stat().st_size


# Worker-process state: the source pool and spec are sent once per worker, not once per host.
_W_STATE: dict[str, Any] = {}


def _init_worker(pool: SourcePool, spec: FleetSpec, tel_dir: Path) -> None:
    _W_STATE.update(pool=pool, spec=spec, tel_dir=tel_dir)


def _render_chunk(plans: list[HostPlan]) -> tuple[int, int, int]:
    rows = nbytes = 0
    for p in plans:
        r, b = _render_host(p, _W_STATE["pool"], _W_STATE["spec"], _W_STATE["tel_dir"] / f"host={p.name}")
        rows += r
        nbytes += b
    return rows, nbytes, len(plans)


def _jobs_table(spec: FleetSpec, pop: Population, sched: Schedule) -> pa.Table:
    ms = WINDOW_S * 1000
    still_running = sched.job_end > spec.windows
    start = spec.day_start_ms + sched.job_start * ms
    end = spec.day_start_ms + sched.job_end * ms
    t = sched.job_template
    return pa.table(
        {
            "job_id": pa.array(sched.job_ids, pa.string()),
            "name": pa.array([pop.t_name[i] for i in t], pa.string()),
            "user": pa.array([pop.users[pop.t_user[i]] for i in t], pa.string()),
            "account": pa.array([pop.accounts[pop.t_account[i]] for i in t], pa.string()),
            "partition": pa.array([pop.t_partition[i] for i in t], pa.string()),
            "start": pa.array(start, pa.timestamp("ms", tz="UTC")),
            "end": pa.array(end, pa.timestamp("ms", tz="UTC"), mask=still_running),
            "num_nodes": pa.array(sched.job_nodes, pa.int32()),
            "num_gpus": pa.array(sched.job_nodes * sched.job_gpus, pa.int32()),
        }
    )


def generate(
    spec: FleetSpec,
    root: Path,
    sources: Sequence[Path] | None = None,
    workers: int = 1,
    overwrite: bool = False,
    jobs_format: str = "parquet",
) -> FleetResult:
    """Generate one fleet-day under ``root``; see the module docstring for the layout."""
    t_begin = time.monotonic()
    _validate(spec, workers, jobs_format)
    root = Path(root)
    tel_dir = root / "telemetry" / f"date={spec.date.isoformat()}"
    jobs_dir = root / "jobs" / f"date={spec.date.isoformat()}"
    for d in (tel_dir, jobs_dir):
        if d.exists() and any(d.iterdir()):
            if not overwrite:
                raise ConfigError(f"{d}: already holds generated data (use --overwrite to replace it)")
            shutil.rmtree(d)
    src_paths = [Path(p) for p in (sources or default_sources())]
    pool = load_sources(src_paths)
    pop = make_population(spec, pool.n_profiles)
    sched = build_schedule(spec, pop)
    plans = _host_plans(spec, pop, sched)
    tel_dir.mkdir(parents=True, exist_ok=True)
    rows = nbytes = 0
    if workers == 1:
        _init_worker(pool, spec, tel_dir)
        for p in plans:
            r, b, _ = _render_chunk([p])
            rows += r
            nbytes += b
    else:
        chunk = max(1, min(16, len(plans) // (workers * 8)))
        ctx = multiprocessing.get_context("spawn")
        with cf.ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker,
                                    initargs=(pool, spec, tel_dir)) as ex:  # fmt: skip
            futures = [ex.submit(_render_chunk, plans[i : i + chunk]) for i in range(0, len(plans), chunk)]
            for fut in cf.as_completed(futures):
                r, b, _ = fut.result()
                rows += r
                nbytes += b
    jobs = _jobs_table(spec, pop, sched)
    ext = "csv" if jobs_format == "csv" else "parquet"
    jobs_path = jobs_dir / f"jobs.{ext}"
    _write_table(jobs, jobs_path)
    truth = pa.table(
        {
            "job_id": jobs.column("job_id"),
            "source": pa.array([pool.prof_names[p] for p in sched.job_profile], pa.string()),
        }
    )
    truth_path = jobs_dir / "truth.parquet"
    _write_table(truth, truth_path)
    result = FleetResult(
        telemetry_dir=tel_dir,
        jobs_path=jobs_path,
        truth_path=truth_path,
        gpus=spec.gpus,
        hosts=spec.n_hosts,
        jobs=len(sched.job_ids),
        multi_node_jobs=int((sched.job_nodes > 1).sum()),
        rows=rows,
        files=spec.n_hosts * spec.hours,
        bytes=nbytes,
        seconds=round(time.monotonic() - t_begin, 2),
    )
    manifest = {
        "spec": {**asdict(spec), "date": spec.date.isoformat()},
        "sources": [str(p) for p in src_paths],
        "workers": workers,
        **{k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(result).items()},
    }
    atomic_write_text(jobs_dir / "fleet.json", json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return result


def _write_table(table: pa.Table, path: Path) -> None:
    with atomic_writer(path) as fh:
        if path.suffix == ".csv":
            import pyarrow.csv as pacsv

            pacsv.write_csv(table, fh)
        else:
            pq.write_table(table, fh, compression="zstd")


def _validate(spec: FleetSpec, workers: int, jobs_format: str) -> None:
    if spec.gpus < 1:
        raise ConfigError(f"--gpus must be at least 1, got {spec.gpus}")
    if not 1 <= spec.gpus_per_host <= _MAX_GPUS_PER_HOST:
        raise ConfigError(f"--gpus-per-host must be 1..{_MAX_GPUS_PER_HOST}, got {spec.gpus_per_host}")
    if not 1 <= spec.hours <= 24:
        raise ConfigError(f"--hours must be 1..24, got {spec.hours}")
    if workers < 1:
        raise ConfigError(f"--workers must be at least 1, got {workers}")
    if jobs_format not in ("parquet", "csv"):
        raise ConfigError(f"--jobs-format must be parquet or csv, got {jobs_format}")


# ---------------------------------------------------------------- command line


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add ``wattclass fleet generate``."""
    fleet = sub.add_parser("fleet", help="synthetic fleet-scale telemetry built from real windows")
    fsub = fleet.add_subparsers(dest="fleet_command", metavar="ACTION")
    fleet.set_defaults(func=lambda a: (fleet.print_help(), 2)[1])
    gen = fsub.add_parser(
        "generate",
        help="write one day of telemetry for N GPUs, laid out as the daemons write it",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    gen.add_argument("--gpus", type=int, required=True, help="number of GPUs in the fleet")
    gen.add_argument("--date", type=iso_date, required=True, help="day to generate, YYYY-MM-DD (UTC)")
    gen.add_argument("--out", type=Path, required=True, metavar="DATA_ROOT", help="data root to write under")
    gen.add_argument("--gpus-per-host", type=int, default=8)
    gen.add_argument("--seed", type=non_negative_int, default=0)
    gen.add_argument("--hours", type=int, default=24, help="only the first HOURS of the day (default 24)")
    gen.add_argument(
        "--source", type=Path, nargs="+", metavar="PARQUET",
        help="real v1 telemetry to replay (default: bundled H200 data and data/h200/collected/*.parquet)",
    )  # fmt: skip
    gen.add_argument(
        "--workers", type=int, default=os.cpu_count() or 1, help="worker processes (default: cores)"
    )
    gen.add_argument("--jobs-format", choices=("parquet", "csv"), default="parquet")
    gen.add_argument("--overwrite", action="store_true", help="replace this date's data if present")
    gen.add_argument("--json", action="store_true", help="print the result as JSON")
    gen.set_defaults(func=_cmd_generate)


def _cmd_generate(args: argparse.Namespace) -> int:
    from wattclass.fsutil import check_output_dir
    from wattclass.output import emit

    check_output_dir(args.out, "--out")
    spec = FleetSpec(
        gpus=args.gpus, date=dt.date.fromisoformat(args.date), gpus_per_host=args.gpus_per_host,
        seed=args.seed, hours=args.hours,
    )
    res = generate(spec, args.out, args.source, workers=args.workers, overwrite=args.overwrite,
                   jobs_format=args.jobs_format)  # fmt: skip
    data = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(res).items()}
    emit(
        data,
        args.json,
        lambda d: (
            f"{d['rows']:,} windows for {d['gpus']} GPUs on {d['hosts']} hosts, {d['jobs']:,} jobs "
            f"({d['multi_node_jobs']} multi-node), {d['files']} files, {d['bytes'] / 2**20:.1f} MiB "
            f"in {d['seconds']} s\ntelemetry: {d['telemetry_dir']}\njobs: {d['jobs_path']}"
        ),
    )
    return 0
