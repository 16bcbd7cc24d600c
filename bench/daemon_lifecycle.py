"""The node daemon's whole-process CPU and memory over a realistic job lifecycle.

The per-poll figure of bench/telemetry_overhead.py is the poll loop's own thread time with no job
changes. A real node also has jobs starting and ending (a Prolog job file written at the start,
removed at the end), gaps between jobs where no job file exists and the daemon falls back to the
GPU's process list and ``/proc/<pid>/environ``, jobs that never got a job file, and a WAL roll
into Parquet every ``--roll-seconds``. This script drives exactly that, and measures the daemon
*process* (all threads, user + system CPU from ``/proc/<pid>/stat``, peak RSS from ``VmHWM``),
start-up excluded (counted from the first poll).

Two modes:

``sim``: in this process, the real ``Daemon`` on a simulated backend whose clock is virtual, so
an hour of node time runs in seconds; the job driver lives in the backend's clock (job files in a
real spool folder, ``environ`` files in a fake ``/proc`` root, rolls every 60 s of virtual time).
It measures the daemon's own Python cost (NVML calls cost nothing here) and, with ``--profile``,
writes a cProfile of the run.

  python bench/daemon_lifecycle.py sim --gpus 8 --hours 1 --profile /tmp/daemon.pstats

``live``: real daemons as separate processes (``--daemon CMD``, repeatable, e.g. the new and
the old code side by side on the same GPUs) and a real job driver: per GPU, jobs of varied length
run a GPU load (``--load-cmd``, started with SLURM_JOB_ID/SLURM_JOB_USER in its environment),
each with a job file in the spool (every fourth job without one, so the daemon has to find it
through the process list), 2 s gaps with no job and no file between jobs.

  python bench/daemon_lifecycle.py live --seconds 180 --gpus 2 \
      --daemon "python -m wattclass.cli telemetry run --backend nvml --roll-seconds 60" \
      --load-cmd "python gemm.py"

``--nvml-probe`` (live) also times each of the daemon's NVML calls once per second per GPU in the
driver process (cold, as the daemon makes them) and back to back (hot). Each new daemon logs its
poll loop's CPU per kind of poll at stop; the JSON carries that line (``poll_loop``).
``bench/device_daemon2.sh`` runs the old and the new daemon this way on the H200 x2.

Prints one JSON document. Target (issue 15): <= 1 ms CPU per GPU per second, peak RSS <= 150 MB.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchstamp import emit

#: Job lengths (s) drawn uniformly: short test jobs up to a few minutes (an hour-long job only
#: lowers the per-second cost: fewer changes).
JOB_LENGTHS_S = (8, 12, 20, 20, 30, 45, 60, 90, 150)
GAP_S = 2.0
NO_FILE_EVERY = 4
CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass
class Job:
    job_id: str
    user: str
    gpu: int
    start: float
    end: float
    with_file: bool
    pid: int = 0


def schedule(n_gpus: int, t0: float, seconds: float, seed: int) -> list[Job]:
    """Per GPU, back-to-back jobs of random length with GAP_S between them."""
    rng = random.Random(seed)
    jobs: list[Job] = []
    n = 0
    for g in range(n_gpus):
        t = t0 + rng.uniform(0, 5)
        while t < t0 + seconds:
            length = rng.choice(JOB_LENGTHS_S)
            n += 1
            # The job's user owns its processes; the daemon trusts a process's SLURM_JOB_ID only
            # then (issue 9). This driver's processes run as the bench's own user.
            jobs.append(Job(str(900000 + n), _me(), g, t, min(t + length, t0 + seconds),
                            with_file=n % NO_FILE_EVERY != 0))
            t += length + GAP_S
    return jobs


def _me() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


# ---------------------------------------------------------------- sim mode


def run_sim(args: argparse.Namespace) -> dict[str, Any]:
    from wattclass.gpu.base import GpmMetrics, GpuBackend, GpuInfo, GpuProcess, GpuSample
    from wattclass.jobmap import JobAssignment, remove_job_file, write_job_file
    from wattclass.telemetry.daemon import Daemon, DaemonConfig

    tmp = Path(tempfile.mkdtemp(prefix="daemon-sim-"))
    spool, proc_root, data_root = tmp / "spool", tmp / "proc", tmp / "data"
    for d in (spool, proc_root, data_root):
        d.mkdir(mode=0o755)
    t0 = 1_800_000_000.0
    seconds = args.hours * 3600.0
    jobs = schedule(args.gpus, t0, seconds, args.seed)
    events: list[tuple[float, int, Job]] = sorted(
        [(j.start, 1, j) for j in jobs] + [(j.end, 0, j) for j in jobs], key=lambda e: (e[0], e[1]))
    cpu_at_first_poll: list[float] = []
    driver_cpu_s = [0.0]  # the job driver's own file work (job files, /proc entries): not the daemon's

    class SimBackend(GpuBackend):
        """GPUs in virtual time; the job driver runs inside the clock (see module docstring)."""

        name = "sim"

        def __init__(self) -> None:
            self.t = t0 - 1.0
            self.next_event = 0
            self.running: dict[int, Job] = {}
            self.energy = [0.0] * args.gpus
            self.last_t = [self.t] * args.gpus
            self.next_pid = 4000

        def gpus(self) -> list[GpuInfo]:
            return [GpuInfo(i, f"GPU-5151{i:04d}-0000-4000-8000-000000000000", "NVIDIA H200",
                            f"00000000:{0x19 + i:02X}:00.0", 143771.0, 1980.0, 700.0, 200.0, 700.0, True)
                    for i in range(args.gpus)]

        def _power(self, i: int) -> float:
            return 650.0 if i in self.running else 75.0

        def _advance_energy(self, i: int) -> None:
            self.energy[i] += self._power(i) * (self.t - self.last_t[i]) * 1e3
            self.last_t[i] = self.t

        def sample(self, index: int) -> GpuSample:
            busy = index in self.running
            return GpuSample(self.t, None, self._power(index), 700.0, 97.0 if busy else 0.0,
                             40.0 if busy else 0.0, 1755.0 if busy else 345.0, 2619.0, 4 if busy else 0,
                             61.0 if busy else 30.0, 70000.0 if busy else 0.5)

        def energy_mj(self, index: int) -> int | None:
            self._advance_energy(index)
            return int(self.energy[index])

        def gpm_snapshot(self, index: int) -> object | None:
            return (index, self.t)

        def gpm_metrics(self, index: int, first: object, second: object) -> GpmMetrics:
            return GpmMetrics(95.0, 60.0, 80.0, 20.0, 0.0, 5.0, 0.0, 1.0, 10.0, 10.0)

        def processes(self, index: int) -> list[GpuProcess]:
            j = self.running.get(index)
            return [GpuProcess(pid=j.pid)] if j is not None else []

        def now(self) -> float:
            return self.t

        def sleep_until(self, t: float, stop: threading.Event) -> None:
            if not cpu_at_first_poll:
                cpu_at_first_poll.append(_self_cpu_s())
            c0 = _self_cpu_s()
            while self.next_event < len(events) and events[self.next_event][0] <= t:
                et, starting, job = events[self.next_event]
                self.next_event += 1
                self.t = max(self.t, et)
                self._advance_energy(job.gpu)
                if starting:
                    self.next_pid += 1
                    job.pid = self.next_pid
                    d = proc_root / str(job.pid)
                    d.mkdir()
                    (d / "environ").write_bytes(
                        f"PATH=/usr/bin\0SLURM_JOB_ID={job.job_id}\0SLURM_JOB_USER={job.user}\0".encode())
                    if job.with_file:
                        write_job_file(spool, self.gpus()[job.gpu].uuid,
                                       JobAssignment(job.job_id, job.user, None))
                    self.running[job.gpu] = job
                else:
                    self.running.pop(job.gpu, None)
                    shutil.rmtree(proc_root / str(job.pid), ignore_errors=True)
                    if job.with_file:
                        remove_job_file(spool, self.gpus()[job.gpu].uuid, job.job_id)
            self.t = max(self.t, t)
            driver_cpu_s[0] += _self_cpu_s() - c0

        def exhausted(self) -> bool:
            return self.t >= t0 + seconds

    backend = SimBackend()
    cfg = DaemonConfig(data_root=data_root, host="simnode", roll_s=args.roll_seconds, job_spool=spool,
                       proc_root=proc_root)
    if args.energy_every_windows is not None:
        cfg.energy_every_windows = args.energy_every_windows
    daemon = Daemon(backend, cfg)
    prof = None
    if args.profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    w0 = time.perf_counter()
    daemon.run()
    wall = time.perf_counter() - w0
    cpu_end = _self_cpu_s()
    if prof is not None:
        prof.disable()
        prof.dump_stats(args.profile)
    cpu = cpu_end - cpu_at_first_poll[0] - driver_cpu_s[0]
    files = sorted((data_root / "telemetry").rglob("*.parquet"))
    heavy = sorted(m for m in ("pandas", "matplotlib", "lightgbm", "scipy", "duckdb") if m in sys.modules)
    short = _short_rows(files)  # after the daemon's imports are taken: reading Parquet may import pandas
    shutil.rmtree(tmp, ignore_errors=True)
    return {
        "mode": "sim (virtual clock; NVML calls free)", **short,
        "gpus": args.gpus, "node_seconds": seconds, "jobs": len(jobs),
        "jobs_without_file": sum(not j.with_file for j in jobs),
        "roll_seconds": args.roll_seconds, "parquet_files": len(files), "rows": daemon.stats.rows,
        "energy_reads": daemon.stats.energy_reads, "process_queries": daemon.attributor.process_queries,
        "energy_every_windows": getattr(daemon.cfg, "energy_every_windows", None),  # None: before issue 15
        "energy_reads_per_gpu_s": round(daemon.stats.energy_reads / (seconds * args.gpus), 4),
        "cpu_s": round(cpu, 3), "driver_cpu_s_excluded": round(driver_cpu_s[0], 3),
        "wall_s": round(wall, 2), "profiled": bool(args.profile),
        "cpu_ms_per_gpu_s": round(cpu * 1e3 / (seconds * args.gpus), 4),
        "peak_rss_mb": round(_self_hwm_mb(), 1),
        "imported_heavy": heavy,
    }


def _short_rows(files: list[Path]) -> dict[str, int]:
    """What the nightly's energy test makes of the rows the daemon wrote: rows shorter than a poll
    (job-boundary segments that may hold their start poll's whole interval), those a test of
    energy over the row's length alone would reject (as before ENERGY_SPAN_FLOOR_S), and those
    the row rules reject today (classifier/validity.py; zero expected)."""
    import numpy as np
    import pyarrow.parquet as pq

    from wattclass.classifier.validity import MAX_GPU_POWER_W, impossible_rows

    out = {"rows_under_1s": 0, "rows_over_max_power_by_length": 0, "rows_rejected_now": 0}
    for f in files:
        t = pq.read_table(f)
        ms = [t.column(c).cast("int64").to_numpy() for c in ("ts_start", "ts_end")]
        dur = (ms[1] - ms[0]) / 1e3
        e = t.column("energy_j").to_numpy(zero_copy_only=False).astype(float)
        out["rows_under_1s"] += int((dur < 1.0).sum())
        with np.errstate(divide="ignore", invalid="ignore"):
            over = np.nan_to_num(e / dur, nan=0.0) > MAX_GPU_POWER_W
        out["rows_over_max_power_by_length"] += int(over.sum())
        out["rows_rejected_now"] += int(np.logical_or.reduce(list(impossible_rows(t).values())).sum())
    return out


def _self_cpu_s() -> float:
    return time.process_time()  # user + system of this process, at nanosecond resolution


def _self_hwm_mb() -> float:
    return _status_kb(os.getpid(), "VmHWM") / 1024


def _status_kb(pid: int, key: str) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return float(line.split()[1])
    return 0.0


def _proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime (fields 14, 15)


# ---------------------------------------------------------------- live mode


@dataclass
class DaemonRun:
    name: str
    cmd: list[str]
    data_root: Path
    proc: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    cpu_start: float | None = None
    t_start: float | None = None
    rss_samples_mb: list[float] = field(default_factory=list)
    #: (seconds since the first poll, process CPU seconds since then), every ``--cpu-every`` s
    cpu_series: list[tuple[float, float]] = field(default_factory=list)


def _started(run: DaemonRun) -> bool:
    assert run.log_path is not None
    return b"polling" in run.log_path.read_bytes()


def run_live(args: argparse.Namespace) -> dict[str, Any]:
    from wattclass.jobmap import JobAssignment, remove_job_file, write_job_file

    tmp = Path(tempfile.mkdtemp(prefix="daemon-live-"))
    spool = tmp / "spool"
    spool.mkdir(mode=0o755)
    uuids = args.uuids.split(",") if args.uuids else _nvml_uuids(args.gpus)
    runs: list[DaemonRun] = []
    for k, spec in enumerate(args.daemon):
        name, _, cmd = spec.partition("=")
        root = tmp / f"data{k}"
        root.mkdir()
        runs.append(DaemonRun(name, [*shlex.split(cmd), "--data-root", str(root), "--spool", str(spool),
                                     "--host", f"node{k}"], root))
    for r in runs:
        r.log_path = tmp / f"{r.name}.log"
        with open(r.log_path, "wb") as fh:
            r.proc = subprocess.Popen(r.cmd, stdout=fh, stderr=subprocess.STDOUT)
    deadline = time.time() + args.startup_timeout
    while not all(_started(r) for r in runs):
        if time.time() > deadline or any(r.proc and r.proc.poll() is not None for r in runs):
            raise SystemExit("a daemon did not start:\n" + "\n".join(
                r.log_path.read_text(errors="replace")[-2000:] for r in runs if r.log_path))
        time.sleep(0.05)
    for r in runs:
        assert r.proc is not None
        r.cpu_start, r.t_start = _proc_cpu_s(r.proc.pid), time.time()
    probe: dict[str, Any] = {}
    probe_stop = threading.Event()
    probe_thread = None
    if args.nvml_probe:
        probe_thread = threading.Thread(target=nvml_probe, args=(args.gpus, probe_stop, probe), daemon=True)
        probe_thread.start()
    t0 = time.time()
    jobs = schedule(args.gpus, t0, args.seconds, args.seed)
    events = sorted([(j.start, 1, j) for j in jobs] + [(j.end, 0, j) for j in jobs],
                    key=lambda e: (e[0], e[1]))
    loads: dict[str, subprocess.Popen[bytes]] = {}
    next_sample = next_cpu = t0
    for et, starting, job in events:
        while time.time() < et:
            now = time.time()
            if now >= next_sample:
                for r in runs:
                    assert r.proc is not None
                    r.rss_samples_mb.append(_status_kb(r.proc.pid, "VmRSS") / 1024)
                next_sample += 1.0
            if args.cpu_every > 0 and now >= next_cpu:
                for r in runs:
                    assert r.proc is not None and r.cpu_start is not None and r.t_start is not None
                    r.cpu_series.append((round(now - r.t_start, 1),
                                         round(_proc_cpu_s(r.proc.pid) - r.cpu_start, 2)))
                next_cpu += args.cpu_every
            time.sleep(min(0.05, max(0.0, et - time.time())))
        if starting:
            if job.with_file:  # the Prolog writes the file before the job's processes start
                write_job_file(spool, uuids[job.gpu], JobAssignment(job.job_id, job.user, None))
            env = {**os.environ, "SLURM_JOB_ID": job.job_id, "SLURM_JOB_USER": job.user,
                   "CUDA_VISIBLE_DEVICES": str(job.gpu)}
            loads[job.job_id] = subprocess.Popen(shlex.split(args.load_cmd), env=env,
                                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        else:
            p = loads.pop(job.job_id)
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            if job.with_file:  # the Epilog removes it after the processes are gone
                remove_job_file(spool, uuids[job.gpu], job.job_id)
    elapsed = time.time() - t0
    probe_stop.set()
    out_runs = []
    for r in runs:
        assert r.proc is not None and r.cpu_start is not None and r.t_start is not None
        cpu = _proc_cpu_s(r.proc.pid) - r.cpu_start
        span = time.time() - r.t_start
        hwm = _status_kb(r.proc.pid, "VmHWM") / 1024
        r.proc.send_signal(signal.SIGTERM)
        rc = r.proc.wait(60)
        files = sorted((r.data_root / "telemetry").rglob("*.parquet"))
        log_text = r.log_path.read_text(errors="replace") if r.log_path else ""
        out_runs.append({
            "name": r.name, "cmd": " ".join(r.cmd), "exit_code": rc, "measured_s": round(span, 1),
            "cpu_s": round(cpu, 3), "cpu_ms_per_gpu_s": round(cpu * 1e3 / (span * args.gpus), 3),
            "peak_rss_mb": round(hwm, 1), "rss_end_mb": r.rss_samples_mb[-1] if r.rss_samples_mb else None,
            "parquet_files": len(files), "rows": _rows(files), "jobs_seen": _jobs(files),
            "energy_j": round(_energy_j(files), 1),
            "cpu_series": r.cpu_series,
            "cpu_ms_per_gpu_s_per_interval": _interval_rates(r.cpu_series, args.gpus),
            "poll_loop": next((ln.split("poll-loop CPU: ", 1)[1] for ln in log_text.splitlines()
                               if "poll-loop CPU: " in ln), None),
            "log_tail": log_text[-1500:],
        })
    if probe_thread is not None:
        probe_thread.join(120)
    shutil.rmtree(tmp, ignore_errors=True)
    return {"mode": "live", "gpus": args.gpus, "seconds": round(elapsed, 1), "jobs": len(jobs),
            "job_lengths_s": sorted({round(j.end - j.start) for j in jobs}),
            "jobs_without_file": sum(not j.with_file for j in jobs), "daemons": out_runs,
            "nvml_probe": probe or None}


def _interval_rates(series: list[tuple[float, float]], gpus: int) -> list[float]:
    """CPU ms per GPU per second between consecutive samples of ``series``: whether the cost
    stays flat over a long run (no growth with rolls, jobs seen or files written)."""
    return [round((c1 - c0) * 1e3 / ((t1 - t0) * gpus), 3)
            for (t0, c0), (t1, c1) in itertools.pairwise(series) if t1 > t0]


#: The daemon's per-poll NVML calls, and the expensive counter, for ``--nvml-probe``.
def _probe_calls(nv: Any) -> dict[str, Any]:
    avg = getattr(nv, "NVML_FI_DEV_POWER_AVERAGE", 185)
    fields = [nv.NVML_FI_DEV_POWER_INSTANT, nv.NVML_FI_DEV_POWER_CURRENT_LIMIT, avg]
    return {
        "FieldValues[power_instant,limit,average]": lambda h: nv.nvmlDeviceGetFieldValues(h, fields),
        "FieldValues[power_instant,limit] (before issue 15's split)":
            lambda h: nv.nvmlDeviceGetFieldValues(h, fields[:2]),
        "UtilizationRates": nv.nvmlDeviceGetUtilizationRates,
        "ClockInfo[SM]": lambda h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
        "ClockInfo[MEM]": lambda h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
        "CurrentClocksEventReasons": nv.nvmlDeviceGetCurrentClocksEventReasons,
        "Temperature": lambda h: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
        "MemoryInfo": nv.nvmlDeviceGetMemoryInfo,
        "ComputeRunningProcesses": nv.nvmlDeviceGetComputeRunningProcesses,
        "TotalEnergyConsumption": nv.nvmlDeviceGetTotalEnergyConsumption,
    }


def nvml_probe(gpus: int, stop: threading.Event, out: dict[str, Any]) -> None:
    """Thread CPU (and wall) per NVML call made once per second per GPU, as the daemon makes them
    (cold: whatever the driver caches has expired), then the same calls back to back (hot: how
    the earlier "Per NVML call" figures were taken). The energy counter only every 10th second."""
    import statistics

    import pynvml as nv

    nv.nvmlInit()
    try:
        hs = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(gpus)]
        calls = _probe_calls(nv)

        def timed(fn: Any, h: Any) -> tuple[float, float]:
            c0, w0 = time.thread_time_ns(), time.perf_counter_ns()
            with contextlib.suppress(nv.NVMLError):
                fn(h)
            return (time.thread_time_ns() - c0) / 1e3, (time.perf_counter_ns() - w0) / 1e3

        cold: dict[str, list[tuple[float, float]]] = {k: [] for k in calls}
        k = 0
        t = time.time()
        while not stop.is_set():
            stop.wait(max(0.0, t + 1.0 - time.time()))
            t += 1.0
            k += 1
            for h in hs:
                for name, fn in calls.items():
                    if name != "TotalEnergyConsumption" or k % 10 == 0:
                        cold[name].append(timed(fn, h))
        hot = {name: [timed(fn, hs[0]) for _ in range(10 if name == "TotalEnergyConsumption" else 200)]
               for name, fn in calls.items()}

        def stats(xs: list[tuple[float, float]]) -> dict[str, float]:
            if not xs:
                return {}
            return {"n": len(xs), "cpu_us_mean": round(statistics.fmean(c for c, _ in xs), 1),
                    "cpu_us_median": round(statistics.median(c for c, _ in xs), 1),
                    "wall_us_mean": round(statistics.fmean(w for _, w in xs), 1)}

        out["cold_1hz"] = {k: stats(v) for k, v in cold.items()}
        out["hot_back_to_back"] = {k: stats(v) for k, v in hot.items()}
        cheap = [k for k in calls if k not in ("TotalEnergyConsumption", "ComputeRunningProcesses")
                 and "before" not in k]
        out["cheap_fields_cpu_us_per_poll"] = {
            "cold_1hz": round(sum(out["cold_1hz"][k].get("cpu_us_mean", 0.0) for k in cheap), 1),
            "hot": round(sum(out["hot_back_to_back"][k].get("cpu_us_mean", 0.0) for k in cheap), 1)}
    finally:
        nv.nvmlShutdown()


def _nvml_uuids(n: int) -> list[str]:
    import pynvml

    pynvml.nvmlInit()
    try:
        return [str(pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))) for i in range(n)]
    finally:
        pynvml.nvmlShutdown()


def _rows(files: list[Path]) -> int:
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(f).metadata.num_rows for f in files)


def _energy_j(files: list[Path]) -> float:
    import pyarrow.parquet as pq

    return sum(sum(x for x in pq.read_table(f, columns=["energy_j"]).column("energy_j").to_pylist() if x)
               for f in files)


def _jobs(files: list[Path]) -> int:
    import pyarrow.parquet as pq

    ids: set[str] = set()
    for f in files:
        ids.update(x for x in pq.read_table(f, columns=["job_id"]).column("job_id").to_pylist() if x)
    return len(ids)


def summary(path: Path) -> str:
    """A ``live`` result (the JSON this script printed) as a few lines, for the device scripts."""
    import json

    d = json.loads(path.read_text())
    lines = [f"{d['seconds']} s, {d['jobs']} jobs ({d['jobs_without_file']} without a job file)"]
    for r in d["daemons"]:
        lines.append(f"{r['name']:7s} {r['cpu_ms_per_gpu_s']:.3f} ms/GPU/s  cpu {r['cpu_s']} s  "
                     f"rss {r['peak_rss_mb']} MB  rows {r['rows']}  jobs {r['jobs_seen']}  "
                     f"{r['energy_j']} J  exit {r['exit_code']}  {r['poll_loop']}")
        if r.get("cpu_ms_per_gpu_s_per_interval"):
            lines.append(f"        per interval, ms/GPU/s: {r['cpu_ms_per_gpu_s_per_interval']}")
    p = d.get("nvml_probe") or {}
    lines.append(f"cheap fields per poll, CPU us: {p.get('cheap_fields_cpu_us_per_poll')}")
    for k, v in (p.get("cold_1hz") or {}).items():
        hot = (p.get("hot_back_to_back") or {}).get(k, {})
        lines.append(f"  {k:42s} cold {v.get('cpu_us_mean')} us  hot {hot.get('cpu_us_mean')} us")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="mode", required=True)
    sm = sub.add_parser("summary", help="print a live result's JSON as a few lines")
    sm.add_argument("result", type=Path)
    s = sub.add_parser("sim")
    s.add_argument("--gpus", type=int, default=8)
    s.add_argument("--hours", type=float, default=1.0)
    s.add_argument("--roll-seconds", type=float, default=60.0)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--profile", default=None, help="write a cProfile here (adds profiler overhead)")
    s.add_argument("--energy-every-windows", type=int, default=None, help="default: the daemon's")
    lv = sub.add_parser("live")
    lv.add_argument("--gpus", type=int, default=2)
    lv.add_argument("--seconds", type=float, default=180.0)
    lv.add_argument("--daemon", action="append", required=True, metavar="NAME=CMD")
    lv.add_argument("--load-cmd", required=True)
    lv.add_argument("--seed", type=int, default=0)
    lv.add_argument("--startup-timeout", type=float, default=90.0)
    lv.add_argument("--uuids", default=None, help="GPU UUIDs by index, comma-separated (default: from NVML)")
    lv.add_argument("--cpu-every", type=float, default=0.0,
                    help="also sample each daemon's CPU every this many seconds (a series in the JSON)")
    lv.add_argument("--nvml-probe", action="store_true",
                    help="also time each NVML call at 1 Hz (cold) and back to back (hot), in this process")
    a = ap.parse_args()
    if a.mode == "summary":
        print(summary(a.result))
        return 0
    out = run_sim(a) if a.mode == "sim" else run_live(a)
    return emit(out)


if __name__ == "__main__":
    sys.exit(main())
