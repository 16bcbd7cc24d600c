"""Replay: recorded 1 Hz GPU data played back as live GPUs.

Input is a folder in the probe format (wattclass/data/h200/README.md, data/h200/raw): parts named
``<part>_caps.json``, ``<part>_samples_1hz.parquet`` and ``<part>_runs.csv``.

Conventions (other components rely on them):

* A part belongs to the GPU named by its caps ``uuid``. Parts with the same uuid are one GPU,
  played in time order; different uuids are different GPUs. ``gpu_index`` is the caps ``index``
  key where present, else the order of first appearance with parts sorted by name.
* A samples file may carry several GPUs with an optional ``gpu_uuid`` column (the demo cluster
  uses it); each uuid then inherits the part's caps.
* Jobs are the rows of ``runs.csv`` (``job``, ``start``, ``end``...). Optional columns win:
  ``job_id``, ``user``, and ``uuid`` (the GPU a row belongs to, when a runs file lists several).
  Otherwise job ids count up from ``first_job_id`` (5001) over the rows of all parts sorted by
  part name, and users cycle ayaka, bruno, chen, dana by the row's index within its part -- the
  convention of the reference converter that built the bundled windows, so the bundled
  recording reproduces job ids 5001-5021.
  A job holds its GPU from ``start`` to ``end + 0.5 s`` (the probe's poll after the end still
  belongs to it, as in that converter).
* The running job is exposed through ``processes()`` (a GpuProcess with job_id and user), so
  the daemon's no-Prolog-file attribution path is the one exercised.

Like NVML, ``sample`` leaves the energy counter out and ``energy_mj`` reads it (for the sample
last polled), so replay runs exercise the daemon's sparse counter reads.

Clock: real time (``realtime=True``: recording time advances with the wall clock times
``speed``) or virtual (``realtime=False``: ``sleep_until`` jumps, for ``--once``). A poll at
time ``t`` returns the latest recorded sample at or before ``t``.
"""

from __future__ import annotations

import bisect
import json
import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from wattclass.errors import DataError, GpuLostError
from wattclass.gpu.base import GpmMetrics, GpuBackend, GpuInfo, GpuProcess, GpuSample, ProcessUtil

DEFAULT_USERS: tuple[str, ...] = ("ayaka", "bruno", "chen", "dana")
JOB_GRACE_S = 0.5

#: Recorded per-poll columns the backend reads (each optional except energy_mj; missing -> None).
_SAMPLE_COLUMNS = ("energy_mj", "power_instant_mw", "util_gpu", "util_mem", "sm_clock_mhz",
                   "mem_clock_mhz", "clock_event_reasons", "temp_c", "fb_used_mib")
#: Recorded GPM columns -> GpmMetrics fields (the probe stores metrics over the preceding second).
GPM_COLUMNS = {
    "gpm_sm_util": "sm_util_pct",
    "gpm_sm_occupancy": "sm_occupancy_pct",
    "gpm_any_tensor_util": "tensor_util_pct",
    "gpm_dram_bw_util": "dram_bw_util_pct",
    "gpm_fp64_util": "fp64_util_pct",
    "gpm_fp32_util": "fp32_util_pct",
    "gpm_fp16_util": "fp16_util_pct",
    "gpm_int_util": "int_util_pct",
    "gpm_pcie_tx_mibs": "pcie_tx_mibs",
    "gpm_pcie_rx_mibs": "pcie_rx_mibs",
}


@dataclass
class _Job:
    job_id: str
    user: str | None
    start: float
    end: float


@dataclass
class _Gpu:
    info: GpuInfo
    ts: list[float] = field(default_factory=list)
    cols: dict[str, list[Any]] = field(default_factory=dict)
    jobs: list[_Job] = field(default_factory=list)
    last_i: int = -1


@dataclass(frozen=True)
class _GpmMark:
    """A replay GPM snapshot: the index of the sample it was taken at."""

    i: int


def _num(v: Any) -> float | None:
    if v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def _seconds(v: Any, path: Path, row: int, col: str) -> float:
    """A runs.csv time (seconds, as the probe writes them); DataError naming file, row and column."""
    f = _num(v)
    if f is None or not math.isfinite(f):
        raise DataError(f"{path} row {row}: {col} {str(v)[:40]!r} is not a time in seconds")
    return f


class ReplayBackend(GpuBackend):
    """Recorded GPUs from a probe-format folder."""

    name = "replay"

    # long: reads and checks every part of a recording once, so playback needs no further checks
    def __init__(
        self,
        folder: Path,
        realtime: bool = True,
        speed: float = 1.0,
        first_job_id: int = 5001,
        users: tuple[str, ...] = DEFAULT_USERS,
        start_at: float | None = None,
    ) -> None:
        import pandas as pd
        import pyarrow as pa

        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise DataError(f"replay folder {self.folder} does not exist")
        caps_files = sorted(self.folder.glob("*_caps.json"))
        if not caps_files:
            raise DataError(f"replay folder {self.folder}: no <part>_caps.json files")
        if speed <= 0:
            raise DataError(f"replay speed must be > 0, got {speed}")
        self.realtime = realtime
        self.speed = speed
        gpus: dict[str, _Gpu] = {}
        frames: dict[str, list[Any]] = {}
        next_id = first_job_id
        for caps_path in caps_files:
            part = caps_path.name[: -len("_caps.json")]
            try:
                caps = json.loads(caps_path.read_text())
            except ValueError as exc:
                raise DataError(f"{caps_path}: not JSON: {exc}") from exc
            if "uuid" not in caps:
                raise DataError(f"{caps_path}: missing key 'uuid'")
            samples_path = self.folder / f"{part}_samples_1hz.parquet"
            if not samples_path.exists():
                raise DataError(f"{samples_path}: missing (part {part} has caps but no samples)")
            try:
                s = pd.read_parquet(samples_path)
            except (OSError, ValueError, pa.ArrowException) as exc:
                raise DataError(f"{samples_path}: not a readable Parquet file: {str(exc)[:300]}") from exc
            for col in ("ts", "energy_mj"):
                if col not in s.columns:
                    raise DataError(f"{samples_path}: missing column '{col}'")
            uuids = sorted(s["gpu_uuid"].astype(str).unique()) if "gpu_uuid" in s.columns else [caps["uuid"]]
            for uuid in uuids:
                if uuid not in gpus:
                    gpus[uuid] = _Gpu(self._info(caps, uuid, len(gpus)))
                sub = s[s["gpu_uuid"].astype(str) == uuid] if "gpu_uuid" in s.columns else s
                frames.setdefault(uuid, []).append(sub)
            runs_path = self.folder / f"{part}_runs.csv"
            if runs_path.exists():
                try:
                    r = pd.read_csv(runs_path, dtype={"job_id": str, "user": str, "uuid": str})
                except (OSError, ValueError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
                    raise DataError(f"{runs_path}: not a readable runs CSV: {str(exc)[:300]}") from exc
                for col in ("start", "end"):
                    if col not in r.columns:
                        raise DataError(f"{runs_path}: missing column '{col}'")
                for i, rd in enumerate(r.to_dict("records")):
                    jid = rd.get("job_id")
                    job_id = str(jid) if isinstance(jid, str) and jid else str(next_id)
                    next_id += 1
                    usr = rd.get("user")
                    user = str(usr) if isinstance(usr, str) and usr else users[i % len(users)]
                    target = rd.get("uuid")
                    targets = [str(target)] if isinstance(target, str) and target else uuids
                    for u in targets:
                        if u not in gpus:
                            raise DataError(f"{runs_path} row {i}: uuid {u} has no samples")
                        gpus[u].jobs.append(_Job(job_id, user, _seconds(rd["start"], runs_path, i, "start"),
                                                 _seconds(rd["end"], runs_path, i, "end")))
        for uuid, g in gpus.items():
            df = pd.concat(frames[uuid]).sort_values("ts", kind="stable").reset_index(drop=True)
            try:
                g.ts = [float(x) for x in df["ts"]]
            except (TypeError, ValueError) as exc:
                raise DataError(f"replay folder {self.folder}: GPU {uuid}: column 'ts' is not seconds: "
                                f"{str(exc)[:120]}") from exc
            if any(not math.isfinite(x) for x in g.ts):
                raise DataError(f"replay folder {self.folder}: GPU {uuid}: column 'ts' holds a NaN or "
                                "an infinity")
            for col in (*_SAMPLE_COLUMNS, *GPM_COLUMNS, "power_limit_mw", "power_mw"):
                if col in df.columns:
                    g.cols[col] = [_num(x) for x in df[col]]
            g.jobs.sort(key=lambda j: j.start)
        # Indexes: caps 'index' wins; others by first appearance.
        self._gpus = sorted(gpus.values(), key=lambda g: g.info.gpu_index)
        idx = [g.info.gpu_index for g in self._gpus]
        if len(set(idx)) != len(idx):
            raise DataError(f"replay folder {self.folder}: two GPUs share a gpu_index ({idx})")
        self._by_index = {g.info.gpu_index: g for g in self._gpus}
        if not any(g.ts for g in self._gpus):
            raise DataError(f"replay folder {self.folder}: no samples (every samples file is empty)")
        self.t_first = min(g.ts[0] for g in self._gpus if g.ts)
        self.t_last = max(g.ts[-1] for g in self._gpus if g.ts)
        self._vnow = self.t_first if start_at is None else start_at
        self._wall0 = time.time()
        self._rec0 = self._vnow

    @staticmethod
    def _info(caps: dict[str, Any], uuid: str, order: int) -> GpuInfo:
        def w(key: str) -> float | None:
            v = caps.get(key)
            return float(v) / 1e3 if isinstance(v, int | float) else None

        cons = caps.get("limit_constraints_mw")
        lo = float(cons[0]) / 1e3 if isinstance(cons, list) and len(cons) == 2 else None
        hi = float(cons[1]) / 1e3 if isinstance(cons, list) and len(cons) == 2 else None
        idx = caps.get("index")
        fb = caps.get("fb_total_mib")
        clk = caps.get("clocks_max_sm")
        return GpuInfo(
            gpu_index=int(idx) if isinstance(idx, int) else order,
            uuid=uuid,
            model=str(caps.get("name", "unknown")),
            pci_bus_id=str(caps.get("pci_bus_id", f"replay:{order}")),
            fb_total_mib=float(fb) if isinstance(fb, int | float) else None,
            sm_clock_max_mhz=float(clk) if isinstance(clk, int | float) else None,
            power_limit_default_w=w("default_limit_mw"),
            power_limit_min_w=lo,
            power_limit_max_w=hi,
            gpm_supported=caps.get("gpm_supported") == 1,
        )

    # -- clock --------------------------------------------------------------------------------
    def now(self) -> float:
        if not self.realtime:
            return self._vnow
        return self._rec0 + (time.time() - self._wall0) * self.speed

    def sleep_until(self, t: float, stop: threading.Event) -> None:
        if not self.realtime:
            self._vnow = max(self._vnow, t)
            return
        delay = (t - self.now()) / self.speed
        if delay > 0:
            stop.wait(delay)

    def exhausted(self) -> bool:
        """Past the end, once every GPU's last recorded sample has been polled (or 60 s later)."""
        now = self.now()
        if now <= self.t_last:
            return False
        return now > self.t_last + 60 or all(g.last_i == len(g.ts) - 1 for g in self._gpus)

    # -- GPUs ----------------------------------------------------------------------------------
    def gpus(self) -> list[GpuInfo]:
        return [g.info for g in self._gpus]

    def _gpu(self, index: int) -> _Gpu:
        try:
            return self._by_index[index]
        except KeyError:
            raise GpuLostError(f"replay: no GPU {index}") from None

    def sample(self, index: int) -> GpuSample:
        g = self._gpu(index)
        t = self.now()
        i = bisect.bisect_right(g.ts, t) - 1
        if i < 0:
            raise GpuLostError(f"replay GPU {index}: no recorded data before {t:.3f}")
        g.last_i = i
        c = g.cols

        def col(name: str) -> float | None:
            v = c.get(name)
            return v[i] if v is not None else None

        power = col("power_instant_mw")
        avg = col("power_mw")  # the probe's nvmlDeviceGetPowerUsage: the 1 s average on Hopper
        if power is None:
            power = avg
        limit = col("power_limit_mw")
        reasons = col("clock_event_reasons")
        return GpuSample(
            ts=g.ts[i],
            energy_mj=None,  # like nvml: the counter comes from energy_mj(), when asked for
            power_w=power / 1e3 if power is not None else None,
            power_limit_w=limit / 1e3 if limit is not None else g.info.power_limit_default_w,
            util_gpu_pct=col("util_gpu"),
            util_mem_pct=col("util_mem"),
            sm_clock_mhz=col("sm_clock_mhz"),
            mem_clock_mhz=col("mem_clock_mhz"),
            clock_event_reasons=int(reasons) if reasons is not None else None,
            temp_c=col("temp_c"),
            fb_used_mib=col("fb_used_mib"),
            power_avg_w=avg / 1e3 if avg is not None else None,
        )

    def energy_mj(self, index: int) -> int | None:
        """The counter of the sample last polled (the same instant as that poll), like NVML's
        separate counter read; the first call without a poll polls."""
        g = self._gpu(index)
        if g.last_i < 0:
            self.sample(index)
        v = g.cols.get("energy_mj")
        e = v[g.last_i] if v is not None else None
        return int(e) if e is not None else None

    def gpm_snapshot(self, index: int) -> object | None:
        g = self._gpu(index)
        if not g.info.gpm_supported or g.last_i < 0:
            return None
        return _GpmMark(g.last_i)

    def gpm_metrics(self, index: int, first: object, second: object) -> GpmMetrics:
        """Mean of the recorded per-second GPM values over the samples after ``first`` up to ``second``."""
        g = self._gpu(index)
        if not isinstance(first, _GpmMark) or not isinstance(second, _GpmMark) or second.i <= first.i:
            return GpmMetrics()
        out: dict[str, float | None] = {}
        for col, name in GPM_COLUMNS.items():
            vals = g.cols.get(col)
            if vals is None:
                out[name] = None
                continue
            xs = [v for v in vals[first.i + 1 : second.i + 1] if v is not None]
            out[name] = sum(xs) / len(xs) if xs else None
        return GpmMetrics(**out)

    def processes(self, index: int) -> list[GpuProcess]:
        g = self._gpu(index)
        if g.last_i < 0:
            return []
        t = g.ts[g.last_i]
        # One synthetic process per running job (pid -1, -2, ... by its row), so recordings with
        # overlapping jobs on one GPU exercise the shared-GPU split.
        return [
            GpuProcess(pid=-1 - k, job_id=j.job_id, user=j.user)
            for k, j in enumerate(g.jobs)
            if j.start <= t <= j.end + JOB_GRACE_S
        ]

    def process_utilization(self, index: int, since_us: int) -> list[ProcessUtil]:
        """Recordings hold no per-process utilisation: each running job's process gets the GPU's
        recorded utilisation (so a shared recording splits its dynamic energy equally), stamped
        with the sample's time."""
        g = self._gpu(index)
        if g.last_i < 0:
            return []
        ts_us = int(g.ts[g.last_i] * 1e6)
        if ts_us <= since_us:
            return []
        util = g.cols.get("util_gpu", [None] * (g.last_i + 1))[g.last_i]
        mem = g.cols.get("util_mem", [None] * (g.last_i + 1))[g.last_i]
        return [ProcessUtil(p.pid, ts_us, float(util or 0.0), float(mem or 0.0))
                for p in self.processes(index)]

    # -- facts for tests and benchmarks ----------------------------------------------------------
    def counter_delta_j(self, index: int) -> float:
        """Energy counter delta over the whole recording of one GPU (last - first), joules."""
        e = [v for v in self._gpu(index).cols.get("energy_mj", []) if v is not None]
        return (e[-1] - e[0]) / 1e3 if e else 0.0

    def jobs(self) -> dict[str, tuple[str | None, int]]:
        """job_id -> (user, gpu_index) for every job of the recording."""
        return {j.job_id: (j.user, g.info.gpu_index) for g in self._gpus for j in g.jobs}
