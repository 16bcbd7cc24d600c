"""Randomised (seeded) property tests of the window builder and the daemon's shutdown path.

Why: on the H200 (2026-11-30) a daemon with ``--energy-every-windows 1`` crashed at SIGTERM
with a NaN in a row (``json.dumps(allow_nan=False)`` in the WAL append) and the rows of its
shutdown flush never reached Parquet. Real NVML hands out doubles (FieldValues, GPM metrics) that
can be NaN or infinite, power fields that are missing on some polls, and a SIGTERM lands at any
moment. The fake GPUs here (the hardware boundary) do all of that at random, with jobs coming
and going, shared GPUs, outages and stalls, the counter read every 1, 2 or 3 windows, and a stop
at a random poll. Whatever the seed:

* every numeric field of every row is finite or null;
* the window energies of each GPU telescope to its counter: their sum is the last counter read
  minus the first (rows whose energy is unknown, null, lie after the last read);
* nothing is lost: every row the builder closed is in Parquet, the WAL is empty, exit code 0;
* no value had to be nulled by the WAL's last-resort check (the builder never makes one).
"""

from __future__ import annotations

import itertools
import math
import random
import threading
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from wattclass.errors import GpuLostError
from wattclass.gpu.base import GpmMetrics, GpuBackend, GpuInfo, GpuProcess, GpuSample
from wattclass.schema import GPM_COLUMNS
from wattclass.telemetry.daemon import Daemon, DaemonConfig
from wattclass.telemetry.metrics import LatestWindows
from wattclass.telemetry.windows import WindowBuilder

_BAD = (None, math.nan, math.inf, -math.inf)
_FLOATS = ("power_w", "power_limit_w", "util_gpu_pct", "util_mem_pct", "sm_clock_mhz", "mem_clock_mhz",
           "temp_c", "fb_used_mib", "power_avg_w")


class ChaosGpus(GpuBackend):
    """Fake GPUs on a virtual clock: true power integrates into the counter; the readings are
    noisy, sometimes missing, NaN or infinite; jobs of 1-150 s with 2 s gaps, sometimes two at
    once (a shared GPU); outages and stalls; GPM metrics NaN over spans shorter than 50 ms (a
    ratio of counters over no time) and now and then anyway."""

    name = "chaos"

    def __init__(self, seed: int, n_gpus: int = 2, bad: float = 0.04, stop_poll: int | None = None,
                 stop_frac: float = 0.5, stop: threading.Event | None = None) -> None:
        self.rng = random.Random(seed)
        self.bad = bad
        self.clock = 1_800_000_000.0 + self.rng.uniform(0.0, 10.0)
        self._infos = [GpuInfo(i, f"GPU-chaos-{i}", "H200", f"0000:0{i}:00.0", 143771.0, 1980.0, 700.0,
                               200.0, 700.0, gpm_supported=i == 0) for i in range(n_gpus)]
        self.counter_mj = [float(self.rng.randrange(2**40)) for _ in range(n_gpus)]
        self.counter_ts = [self.clock] * n_gpus
        self.power = [self.rng.uniform(70, 700) for _ in range(n_gpus)]
        self.down_until = [0.0] * n_gpus
        self.reads: list[list[int]] = [[] for _ in range(n_gpus)]
        self.failed = [False] * n_gpus  # the GPU's last call failed (it was down at the stop)
        # per GPU: (end time, job ids) of the current stretch
        self.stretch: list[tuple[float, tuple[str, ...]]] = [(self.clock, ()) for _ in range(n_gpus)]
        self.next_job = 1000
        self.polls = 0
        self.stop_poll = stop_poll
        self.stop_frac = stop_frac
        self.stop = stop

    # -- the virtual clock ---------------------------------------------------------------------
    def now(self) -> float:
        return self.clock

    def sleep_until(self, t: float, stop: threading.Event) -> None:
        self.polls += 1
        if self.stop_poll is not None and self.polls >= self.stop_poll:  # SIGTERM between polls
            self.clock = max(self.clock, t - 1.0 + self.stop_frac)
            stop.set()
            return
        self.clock = max(self.clock, t)
        if self.rng.random() < 0.01:  # a stall (suspend, slow driver): the next polls come late
            self.clock += self.rng.uniform(1.5, 6.0)

    def _tick(self, i: int, dt: float) -> None:
        self.clock += dt
        self._integrate(i)

    def _integrate(self, i: int) -> None:
        t = self.clock
        self.counter_mj[i] += self.power[i] * (t - self.counter_ts[i]) * 1e3
        self.counter_ts[i] = t
        if self.rng.random() < 0.05:
            self.power[i] = self.rng.uniform(70, 700)

    def _check(self, i: int) -> None:
        self.failed[i] = True
        if self.clock < self.down_until[i]:
            raise GpuLostError(f"GPU {i} fell off the bus")
        if self.rng.random() < 0.004:
            self.down_until[i] = self.clock + self.rng.uniform(1.0, 40.0)
            raise GpuLostError(f"GPU {i} fell off the bus")
        self.failed[i] = False

    def _noisy(self, v: float) -> float | None:
        if self.rng.random() < self.bad:
            return self.rng.choice(_BAD)
        return v

    # -- GpuBackend ------------------------------------------------------------------------------
    def gpus(self) -> list[GpuInfo]:
        return list(self._infos)

    def sample(self, index: int) -> GpuSample:
        self._tick(index, 0.0015)
        self._check(index)
        p = self.power[index]
        vals: dict[str, Any] = {
            "power_w": p + self.rng.uniform(-20, 20), "power_limit_w": 700.0,
            "util_gpu_pct": self.rng.uniform(0, 100), "util_mem_pct": self.rng.uniform(0, 100),
            "sm_clock_mhz": self.rng.uniform(300, 1980), "mem_clock_mhz": 2619.0,
            "temp_c": self.rng.uniform(30, 80), "fb_used_mib": self.rng.uniform(0, 143771.0),
            "power_avg_w": p + self.rng.uniform(-5, 5),
        }
        vals = {k: self._noisy(v) for k, v in vals.items()}
        return GpuSample(ts=self.clock, energy_mj=None, clock_event_reasons=self.rng.choice([None, 0, 4, 32]),
                         **vals)

    def energy_mj(self, index: int) -> int | None:
        self._tick(index, 0.007)  # the expensive read
        self._check(index)
        e = int(self.counter_mj[index])
        self.reads[index].append(e)
        return e

    def processes(self, index: int) -> list[GpuProcess]:
        end, jobs = self.stretch[index]
        while self.clock >= end:  # the next stretch: a job (sometimes two), or a 2 s gap
            if jobs:
                end, jobs = end + 2.0, ()
            else:
                n = 2 if self.rng.random() < 0.1 else 1
                jobs = tuple(str(self.next_job + k) for k in range(n))
                self.next_job += n
                end += self.rng.choice([1.0, 3.5, 8.0, 12.3, 20.0, 45.0, 90.0, 150.0])
            self.stretch[index] = (end, jobs)
        return [GpuProcess(pid=int(j), job_id=j, user="u" + j, used_mib=1000.0 * (k + 1))
                for k, j in enumerate(jobs)]

    def gpm_snapshot(self, index: int) -> object | None:
        self._tick(index, 0.0003)
        self._check(index)
        return ("gpm", self.clock)

    def gpm_metrics(self, index: int, first: object, second: object) -> GpmMetrics:
        dt = second[1] - first[1]  # type: ignore[index]
        if dt < 0.05:
            return GpmMetrics(*([math.nan] * len(GpmMetrics._fields)))
        return GpmMetrics(*(self._noisy(self.rng.uniform(0, 100)) for _ in GpmMetrics._fields))


def _assert_finite_rows(rows: list[dict[str, Any]]) -> None:
    for r in rows:
        for k, v in r.items():
            if isinstance(v, float):
                assert math.isfinite(v), f"{k}={v} in {r}"


def _assert_telescopes(gpus: ChaosGpus, rows: list[dict[str, Any]]) -> None:
    """Window energies add up to the counter: exactly, unless the GPU was down at the stop (then
    the polls after its last counter read are unknown: null rows, the GPU's last ones)."""
    for info in gpus.gpus():
        mine = sorted((r for r in rows if r["gpu_index"] == info.gpu_index), key=lambda r: r["ts_start"])
        reads = gpus.reads[info.gpu_index]
        want = (reads[-1] - reads[0]) / 1e3 if reads else 0.0
        got = sum(r["energy_j"] for r in mine if r["energy_j"] is not None)
        known = [r["energy_j"] is not None for r in mine]
        if not gpus.failed[info.gpu_index]:
            assert all(known), [r for r in mine if r["energy_j"] is None]
            # shared-GPU rows are split to the millijoule (telemetry.sharing.split_mj): <= 0.5 mJ each
            tol = 5e-4 * len(mine) + 1e-6
            assert got == pytest.approx(want, rel=1e-12, abs=tol), (info.gpu_index, got, want)
        else:
            assert known == sorted(known, reverse=True)  # unknown only after the last known
            assert got <= want + 5e-4 * len(mine) + 1e-6


def _gpm(gpus: ChaosGpus, info: GpuInfo, point: bool) -> object | None:
    """A GPM snapshot where the daemon takes one (a failed snapshot is None, as in the daemon)."""
    if not (info.gpm_supported and point):
        return None
    try:
        return gpus.gpm_snapshot(info.gpu_index)
    except GpuLostError:
        return None


def _assert_rows_do_not_overlap(rows: list[dict[str, Any]]) -> None:
    """One GPU's rows cover disjoint time: a row spanning another's time (a job seen again in
    one window, 9b0007b) counts that time twice and halves its own mean power."""
    for gpu in {r["gpu_index"] for r in rows}:
        mine = sorted((r for r in rows if r["gpu_index"] == gpu), key=lambda r: (r["ts_start"], r["ts_end"]))
        for a, b in itertools.pairwise(mine):
            assert a["ts_end"] <= b["ts_start"] + 1e-9, (gpu, a["ts_start"], a["ts_end"], a["job_id"],
                                                         b["ts_start"], b["ts_end"], b["job_id"])


def _seeds(n: int) -> list[tuple[int, int]]:
    return [(seed, (1, 2, 3)[seed % 3]) for seed in range(n)]


@pytest.mark.parametrize(("seed", "every"), _seeds(90))
def test_builder_rows_are_finite_and_telescope(seed: int, every: int) -> None:
    """The builder alone, fed bad readings and bad GPM, with a flush at a random moment."""
    rng = random.Random(seed)
    gpus = ChaosGpus(seed)
    b = WindowBuilder("n", energy_every_windows=every)
    rows: list[dict[str, Any]] = []
    last_job: dict[int, Any] = {}
    for _ in range(rng.randrange(5, 400)):
        gpus.sleep_until(math.floor(gpus.clock) + 1.0, threading.Event())
        for info in gpus.gpus():
            i = info.gpu_index
            try:
                s = gpus.sample(i)
                procs = gpus.processes(i)
                job = (procs[0].job_id, procs[0].user) if procs else None
                if b.needs_energy(info, s, job) or last_job.get(i) == "down":
                    s = s._replace(energy_mj=gpus.energy_mj(i))
            except GpuLostError:
                last_job[i] = "down"
                continue
            last_job[i] = job
            gpm = _gpm(gpus, info, b.needs_gpm(info, s, job))
            rows += b.add(info, s, job, gpm, lambda a, c, i=i: gpus.gpm_metrics(i, a, c))
    gpus.clock += rng.uniform(0.001, 0.999)  # the stop: one last poll with the counter, then flush
    for info in gpus.gpus():
        i = info.gpu_index
        if b.unsettled(info):
            try:
                s = gpus.sample(i)._replace(energy_mj=gpus.energy_mj(i))
            except GpuLostError:
                pass
            else:
                procs = gpus.processes(i)
                job = (procs[0].job_id, procs[0].user) if procs else None
                gpm = _gpm(gpus, info, b.needs_gpm(info, s, job))
                rows += b.add(info, s, job, gpm, lambda a, c, i=i: gpus.gpm_metrics(i, a, c))
        rows += b.flush(info, _gpm(gpus, info, True), lambda a, c, i=i: gpus.gpm_metrics(i, a, c))
    _assert_finite_rows(rows)
    _assert_telescopes(gpus, rows)
    _assert_rows_do_not_overlap(rows)


@pytest.mark.parametrize(("seed", "every"), _seeds(30))
def test_daemon_stop_at_a_random_poll_loses_nothing(tmp_path: Path, seed: int, every: int) -> None:
    """The whole daemon: poll loop, shared-GPU splitter, WAL, rolls, SIGTERM at a random moment."""
    rng = random.Random(1000 + seed)
    stop = threading.Event()
    gpus = ChaosGpus(seed, stop_poll=rng.randrange(3, 300), stop_frac=rng.uniform(0.001, 0.999))
    cfg = DaemonConfig(data_root=tmp_path / "d", host="n", roll_s=60.0, stop_retry_s=0.0,
                       energy_every_windows=every)
    d = Daemon(gpus, cfg, stop=stop, collector=LatestWindows())  # the exporter sees every row too
    recorded: list[dict[str, Any]] = []
    record = d.record

    def spy(rows: list[dict[str, Any]]) -> None:
        recorded.extend(rows)
        record(rows)

    d.record = spy  # type: ignore[method-assign]
    assert d.run() == 0
    files = sorted((tmp_path / "d" / "telemetry").rglob("*.parquet"))
    table = [r for f in files for r in pq.read_table(f).to_pylist()]
    assert len(table) == len(recorded) == d.stats.rows > 0
    assert not list((tmp_path / "d" / "wal").rglob("wal-*.log"))
    _assert_finite_rows(table)
    assert d.writer.nonfinite_values == 0  # the builder made none: the WAL's check is a last resort
    assert d.stats.nonfinite_readings > 0  # ... though the GPUs handed out plenty
    _assert_telescopes(gpus, table)
    assert all(c in table[0] for c in GPM_COLUMNS)
