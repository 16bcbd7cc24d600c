"""How far the daemon's per-job energy is from the exact counter differences, on real H200 data.

The daemon reads the energy counter only at window closes (every ``--energy-every-windows``-th
one), first poll, gaps and shutdown, not at job changes: a span between two reads that holds
several job segments is split across them by integrated instantaneous power
(``telemetry.windows``). Window energies stay counter differences; a job's energy becomes an
estimate. This script measures that estimate's error.

For every bundled recording with a counter every second (wattclass/data/h200: raw, collected,
sweep, sweep-heldout, live-check) it runs the real ``Daemon`` on the replay backend twice per
setting: once with the counter on *every* poll (every poll an energy point: each 1 s interval
gets its own counter difference, so a job's energy is exact under the daemon's interval
semantics) and once as deployed (sparse reads, power split). Per job it reports the relative
error of the split energy against the exact one; over each recording it checks that the windows
still add up to the counter delta.

Job boundaries: the recordings' own jobs (``runs.csv``: idle gaps of ~2 s between jobs, so every
job starts and ends in a power step), and, with ``--synthetic-seeds``, the same recordings cut
into back-to-back synthetic jobs of 5-60 s at random instants (boundaries inside steady work and
at workload switches alike).

Also printed: how well each 1 s interval's energy is estimated from the power readings at the
polls that bound it (instantaneous power at either end or their trapezoid; the 1 s average
power read at its end), which is why the split uses the 1 s average (trapezoid as fallback).

  python bench/energy_split_error.py --every 1 2 3 --synthetic-seeds 5 > /tmp/split.json
"""

from __future__ import annotations

import argparse
import itertools
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchstamp import emit

from wattclass.gpu.base import GpuSample
from wattclass.gpu.replay import JOB_GRACE_S, ReplayBackend, _Job
from wattclass.telemetry.daemon import Daemon, DaemonConfig

DATA = Path(__file__).resolve().parent.parent / "wattclass" / "data" / "h200"
RECORDINGS = ("raw", "collected", "sweep", "sweep-heldout", "live-check")


class _Replay(ReplayBackend):
    """The recording, optionally with the counter in every sample and/or synthetic jobs."""

    def __init__(self, folder: Path, every_poll: bool, synthetic_seed: int | None,
                 power: str = "average") -> None:
        super().__init__(folder, realtime=False)
        self.every_poll = every_poll
        self.power = power
        if synthetic_seed is not None:
            rng = random.Random(synthetic_seed)
            n = 0
            for g in self._gpus:
                cuts = [g.ts[0] - 0.25]
                while cuts[-1] < g.ts[-1]:
                    cuts.append(cuts[-1] + rng.uniform(5.0, 60.0))
                jobs = []
                for lo, hi in itertools.pairwise(cuts):
                    n += 1
                    # seen on [lo, hi): the replay keeps a job JOB_GRACE_S after its end
                    jobs.append(_Job(f"s{n}", "synthetic", lo, hi - JOB_GRACE_S - 1e-6))
                g.jobs = jobs

    def sample(self, index: int) -> GpuSample:
        s = super().sample(index)
        if self.power != "average":  # the split's fallbacks: instantaneous power only, or none
            s = s._replace(power_avg_w=None, power_w=s.power_w if self.power == "instant" else None)
        return s._replace(energy_mj=super().energy_mj(index)) if self.every_poll else s


def _run(folder: Path, every_poll: bool, every_windows: int, seed: int | None, power: str = "average"
         ) -> tuple[list[dict], _Replay]:
    backend = _Replay(folder, every_poll, seed, power)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="split-") as tmp:
        d = Daemon(backend, DaemonConfig(data_root=Path(tmp), host="bench", once=True,
                                         energy_every_windows=every_windows))
        d.record = rows.extend  # type: ignore[method-assign]  # rows in memory, no WAL/Parquet
        d.run()
    return rows, backend


def _per_job(rows: list[dict]) -> dict[str, float]:
    out: dict[str, float] = {}
    for r in rows:
        if r["job_id"] is not None and r["energy_j"] is not None:
            out[r["job_id"]] = out.get(r["job_id"], 0.0) + r["energy_j"]
    return out


def _quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    if not s:
        return float("nan")
    k = (len(s) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def compare(every_windows: int, seed: int | None, power: str = "average") -> dict[str, Any]:
    errs: list[float] = []
    abs_j = 0.0
    total_j = 0.0
    telescope: list[float] = []
    worst: tuple[float, str] = (0.0, "")
    for name in RECORDINGS:
        folder = DATA / name
        exact_rows, _ = _run(folder, True, 1, seed)
        rows, backend = _run(folder, False, every_windows, seed, power)
        delta = sum(backend.counter_delta_j(g.gpu_index) for g in backend.gpus())
        telescope.append(abs(sum(r["energy_j"] for r in rows) / delta - 1))
        exact, ours = _per_job(exact_rows), _per_job(rows)
        if set(exact) != set(ours):
            raise SystemExit(f"{name}: jobs differ between the exact and the split run")
        for job, e in exact.items():
            err = ours[job] / e - 1
            errs.append(abs(err))
            abs_j += abs(ours[job] - e)
            total_j += e
            if abs(err) > worst[0]:
                worst = (abs(err), f"{name} job {job} ({e:.0f} J exact, {ours[job]:.0f} J split)")
    return {
        "energy_every_windows": every_windows,
        "split_by": {"average": "1 s average power", "instant": "trapezoid of instantaneous power",
                     "none": "time (no power readings)"}[power],
        "jobs": "recorded" if seed is None else f"synthetic 5-60 s, seed {seed}",
        "n_jobs": len(errs),
        "abs_rel_error_median_pct": round(100 * _quantile(errs, 0.5), 4),
        "abs_rel_error_p95_pct": round(100 * _quantile(errs, 0.95), 4),
        "abs_rel_error_max_pct": round(100 * max(errs), 4),
        "worst_job": worst[1],
        "sum_abs_error_over_job_energy_pct": round(100 * abs_j / total_j, 4),
        "windows_vs_counter_delta_max_rel": max(telescope),
    }


def interval_rules() -> dict[str, Any]:
    """Per 1 s interval: |estimate - counter difference| by the power reading(s) used."""
    import pyarrow.parquet as pq

    rules = ("instant_left", "instant_right", "instant_trapezoid", "average_1s_right")
    sums = dict.fromkeys(rules, 0.0)
    step_sums = dict.fromkeys(rules, 0.0)
    n = n_step = 0
    for f in sorted(DATA.glob("*/*_samples_1hz.parquet")):
        cols = ["ts", "energy_mj", "power_instant_mw", "power_mw"]
        t = pq.read_table(f, columns=cols).to_pydict()
        rows = [r for r in zip(*(t[c] for c in cols), strict=True) if None not in r]
        for (t0, e0, p0, _), (t1, e1, p1, a1) in itertools.pairwise(rows):
            dt, de = t1 - t0, (e1 - e0) / 1e3
            est = {"instant_left": p0 / 1e3 * dt, "instant_right": p1 / 1e3 * dt,
                   "instant_trapezoid": (p0 + p1) / 2e3 * dt, "average_1s_right": a1 / 1e3 * dt}
            step = abs(p1 - p0) > 100_000  # a power step of more than 100 W inside the interval
            n += 1
            n_step += step
            for k, v in est.items():
                sums[k] += abs(v - de)
                if step:
                    step_sums[k] += abs(v - de)
    return {"intervals": n, "mean_abs_error_j": {k: round(v / n, 1) for k, v in sums.items()},
            "intervals_with_power_step_over_100w": n_step,
            "mean_abs_error_j_at_steps": {k: round(v / n_step, 1) for k, v in step_sums.items()}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--every", type=int, nargs="+", default=[1, 2, 3],
                    help="energy_every_windows values to compare (default 1 2 3)")
    ap.add_argument("--synthetic-seeds", type=int, default=3,
                    help="also cut the recordings into random 5-60 s jobs with this many seeds (default 3)")
    a = ap.parse_args()
    t0 = time.perf_counter()
    results = []
    for n in a.every:
        results.append(compare(n, None))
        for seed in range(a.synthetic_seeds):
            results.append(compare(n, seed))
    for power in ("instant", "none"):  # the fallbacks, for comparison (every window, recorded jobs)
        results.append(compare(1, None, power))
    return emit({"recordings": [f"wattclass/data/h200/{r}" for r in RECORDINGS],
                 "interval_estimate": interval_rules(), "results": results,
                 "wall_s": round(time.perf_counter() - t0, 1)})


if __name__ == "__main__":
    sys.exit(main())
