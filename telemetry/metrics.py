"""Prometheus exporter of the telemetry daemon, following Prometheus's naming conventions.

Base units in the names (watts, joules, hertz, bytes, seconds), ratios 0-1 named ``_ratio``,
counters end in ``_total`` (after prometheus/client_python and the exposition-format guide), so a
site's existing PromQL habits work. What is served:

* per GPU, from the latest closed window, labels ``gpu``, ``uuid``, ``host``, ``job_id``, ``user``
  (empty when no job): power, clocks, utilisation and GPM activity ratios, temperature, memory, the
  enforced power cap and the default one (a cap is in force where cap < default); a GPU that has
  closed no window for ``gpu_stale_s`` while the others did (off the bus) is left out;
* ``wattclass_gpu_energy_joules_total``: a counter per GPU, the sum of the windows' energy (each one
  a delta of the GPU's own energy counter) since the daemon started;
* ``wattclass_job_gpu_energy_joules_total``: the same per job and GPU (kept for ``job_ttl_s`` after
  the job's last window, so finished jobs do not pile up series);
* ``wattclass_job_label_info{job_id,label,source}``: the label the job was submitted with, where
  the Prolog recorded it in the GPU's job file; ``wattclass_job_info{job_id,user,account}`` so
  dashboards can sum by account (``* on(job_id) group_left(account)``);
* daemon health: last window time, GPU errors, non-finite GPU readings taken as missing
  (``wattclass_daemon_nonfinite_readings_total``), and the WAL's state
  (``wattclass_wal_write_errors_total``, ``wattclass_wal_backlog_rows`` held in memory,
  ``wattclass_wal_unconverted_segments`` waiting for Parquet, ``wattclass_wal_nonfinite_values_total``
  row values written as null).

Privacy: ``job_id`` and ``user`` per GPU are what Slurm's ``PrivateData=jobs,users`` hides from
other users; the endpoint has no authentication, so it binds 127.0.0.1 unless the site opens it
with ``--metrics-bind`` (docs/admin.md).

A custom collector over an injected ``CollectorRegistry`` (never the global one) renders the rows
at scrape time; the poll loop only swaps dicts under a lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

LABELS = ("gpu", "uuid", "host", "job_id", "user")
GPU_LABELS = ("gpu", "uuid", "host")

#: Default bind address: loopback, because the endpoint names each GPU's job and user (docs/admin.md).
DEFAULT_BIND = "127.0.0.1"

#: A GPU's gauges are dropped once its latest window ended this long (s) before the newest window
#: of the node's GPUs: a GPU that fell off the bus closes no windows, and its last power, cap and
#: job would otherwise be served as current until the daemon restarts (its energy counter stays).
DEFAULT_GPU_STALE_S = 300.0

#: row column -> (metric name, scale to the base unit, help)
GAUGES: tuple[tuple[str, str, float, str], ...] = (
    ("power_avg_w", "wattclass_gpu_power_watts", 1.0, "Mean power over the latest window (energy / time)"),
    ("power_max_w", "wattclass_gpu_power_max_watts", 1.0, "Max 1 s power reading in the latest window"),
    ("power_limit_w", "wattclass_gpu_power_cap_watts", 1.0, "Enforced power limit (the cap in force)"),
    ("util_gpu_pct", "wattclass_gpu_utilization_ratio", 0.01, "NVML GPU utilization (any kernel running)"),
    ("util_mem_pct", "wattclass_gpu_memory_utilization_ratio", 0.01, "NVML memory controller utilization"),
    ("sm_clock_mhz", "wattclass_gpu_sm_clock_hertz", 1e6, "Mean SM clock"),
    ("mem_clock_mhz", "wattclass_gpu_memory_clock_hertz", 1e6, "Mean memory clock"),
    ("temp_c", "wattclass_gpu_temperature_celsius", 1.0, "Max GPU temperature"),
    ("fb_used_mib", "wattclass_gpu_memory_used_bytes", 2.0**20, "Max framebuffer memory used"),
    ("throttle_power_frac", "wattclass_gpu_throttle_power_ratio", 1.0, "Polls with power clock events"),
    ("throttle_thermal_frac", "wattclass_gpu_throttle_thermal_ratio", 1.0, "Polls with thermal clock events"),
    ("sm_util_pct", "wattclass_gpu_sm_active_ratio", 0.01, "GPM SM activity (DCGM PROF_SM_ACTIVE)"),
    ("sm_occupancy_pct", "wattclass_gpu_sm_occupancy_ratio", 0.01, "GPM SM occupancy"),
    ("tensor_util_pct", "wattclass_gpu_tensor_active_ratio", 0.01, "GPM tensor pipe activity"),
    ("dram_bw_util_pct", "wattclass_gpu_dram_active_ratio", 0.01, "GPM DRAM bandwidth utilization"),
    ("fp64_util_pct", "wattclass_gpu_fp64_active_ratio", 0.01, "GPM FP64 pipe activity"),
    ("fp32_util_pct", "wattclass_gpu_fp32_active_ratio", 0.01, "GPM FP32 pipe activity"),
    ("fp16_util_pct", "wattclass_gpu_fp16_active_ratio", 0.01, "GPM FP16 pipe activity"),
    ("int_util_pct", "wattclass_gpu_int_active_ratio", 0.01, "GPM integer pipe activity (a GPM rule pipe)"),
)


@dataclass(frozen=True)
class Health:
    """The daemon's state as the exporter reports it."""

    gpu_errors: int = 0
    #: GPU readings that were NaN or infinite, taken as missing (telemetry.readings)
    nonfinite_readings: int = 0
    #: Row values the WAL wrote as null (not finite: a bug upstream; telemetry.wal.scrub)
    nonfinite_values: int = 0
    # The WAL's state comes through ``set_wal_state`` (the daemon publishes it on every append).


class LatestWindows(Collector):
    """Holds the latest window rows per GPU and the running counters; collected at scrape time."""

    def __init__(self, health: Callable[[], Health] | None = None, job_ttl_s: float = 3600.0,
                 gpu_stale_s: float = DEFAULT_GPU_STALE_S) -> None:
        self._lock = threading.Lock()
        self.health = health
        self.job_ttl_s = job_ttl_s
        self.gpu_stale_s = gpu_stale_s
        self._latest: dict[str, list[dict[str, Any]]] = {}
        self._windows_total: dict[tuple[str, str, str], int] = {}
        self._energy_total: dict[tuple[str, str, str], float] = {}
        self._job_energy: dict[tuple[str, str, str, str, str], float] = {}
        self._job_seen: dict[str, float] = {}  # job_id -> ts_end of its latest window
        self._job_labels: dict[str, tuple[str, str]] = {}
        self._job_info: dict[str, tuple[str, str]] = {}  # job_id -> (user, account)
        self._default_cap_w: dict[str, float] = {}  # uuid -> default power limit
        self._last_window_ts: float | None = None
        self._wal = (0, 0, 0)  # write errors so far, rows held in memory, segments not yet in Parquet

    def set_wal_state(self, write_errors: int, backlog_rows: int, unconverted_segments: int) -> None:
        """The daemon's durability state, so an alert fires while the disk is full (not only in logs)."""
        with self._lock:
            self._wal = (write_errors, backlog_rows, unconverted_segments)

    def set_default_caps(self, caps_w: dict[str, float]) -> None:
        """Default power limit per GPU uuid (from the backend's GpuInfo)."""
        with self._lock:
            self._default_cap_w = dict(caps_w)

    def update(self, rows: list[dict[str, Any]], labels: dict[str, tuple[str, str]] | None = None,
               accounts: dict[str, str] | None = None) -> None:
        """Publish closed window rows; ``labels``: job_id -> (label, source), ``accounts``: job_id ->
        Slurm account, where the Prolog's job file said so."""
        by_gpu: dict[str, list[dict[str, Any]]] = {}
        for r in rows:
            by_gpu.setdefault(str(r["gpu_uuid"]), []).append(r)
        with self._lock:
            for uuid, rs in by_gpu.items():
                end = max(r["ts_end"] for r in rs)
                self._latest[uuid] = [r for r in rs if r["ts_end"] == end] or rs
                key = (str(rs[0]["gpu_index"]), uuid, str(rs[0]["host"]))
                self._windows_total[key] = self._windows_total.get(key, 0) + len(rs)
                for r in rs:
                    e = float(r.get("energy_j") or 0.0)
                    self._energy_total[key] = self._energy_total.get(key, 0.0) + e
                    job = r.get("job_id")
                    if job:
                        jkey = (*key, str(job), str(r.get("user") or ""))
                        self._job_energy[jkey] = self._job_energy.get(jkey, 0.0) + e
                        self._job_seen[str(job)] = max(self._job_seen.get(str(job), 0.0), float(r["ts_end"]))
                if self._last_window_ts is None or end > self._last_window_ts:
                    self._last_window_ts = float(end)
            self._job_labels.update(labels or {})
            for r in rows:
                if r.get("job_id"):
                    j = str(r["job_id"])
                    acct = (accounts or {}).get(j) or self._job_info.get(j, ("", ""))[1]
                    self._job_info[j] = (str(r.get("user") or ""), acct)
            if rows:
                self._drop_stale_gpus(max(float(r["ts_end"]) for r in rows))
            self._expire_jobs()

    def _drop_stale_gpus(self, batch_end: float) -> None:
        """Forget the latest rows of GPUs that stopped closing windows (their jobs then expire).

        Measured from the batch just published, not from the newest window ever: after the wall
        clock stepped back, every live GPU's windows are older than that, and only the dead
        GPU's are far (in either direction) from the batch."""
        for uuid, rs in list(self._latest.items()):
            if abs(batch_end - max(float(r["ts_end"]) for r in rs)) > self.gpu_stale_s:
                del self._latest[uuid]

    def _expire_jobs(self) -> None:
        if self._last_window_ts is None:
            return
        old = {j for j, t in self._job_seen.items() if t < self._last_window_ts - self.job_ttl_s}
        if not old:
            return
        running = {str(r.get("job_id")) for rs in self._latest.values() for r in rs}
        old -= running
        for j in old:
            del self._job_seen[j]
            self._job_labels.pop(j, None)
            self._job_info.pop(j, None)
        self._job_energy = {k: v for k, v in self._job_energy.items() if k[3] not in old}

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            latest = [r for rs in self._latest.values() for r in rs]
            windows = dict(self._windows_total)
            energy = dict(self._energy_total)
            job_energy = dict(self._job_energy)
            labels = dict(self._job_labels)
            job_info = dict(self._job_info)
            defaults = dict(self._default_cap_w)
            last_ts = self._last_window_ts
            wal_errors, backlog_rows, unconverted = self._wal
        for col, name, scale, help_ in GAUGES:
            g = GaugeMetricFamily(name, help_, labels=LABELS)
            for r in latest:
                v = r.get(col)
                if v is not None:
                    g.add_metric(_labels(r), float(v) * scale)
            yield g
        g = GaugeMetricFamily("wattclass_gpu_power_default_cap_watts",
                              "Default power limit; a cap is in force where the cap is below it",
                              labels=GPU_LABELS)
        # per physical GPU: a MIG instance's row names its parent, whose limit it is (a fully
        # partitioned GPU has no row with its own uuid)
        for uuid, r in {_physical_uuid(r): r for r in latest}.items():
            d = defaults.get(uuid)
            if d is not None:
                g.add_metric([str(r["gpu_index"]), uuid, str(r["host"])], d)
        yield g
        c = CounterMetricFamily("wattclass_gpu_energy_joules", "GPU energy since the daemon started "
                                "(sum of window energy-counter deltas)", labels=GPU_LABELS)
        for key, j in energy.items():
            c.add_metric(list(key), j)
        yield c
        c = CounterMetricFamily("wattclass_job_gpu_energy_joules", "Energy of a job on a GPU", labels=LABELS)
        for jkey, j in job_energy.items():
            c.add_metric(list(jkey), j)
        yield c
        info = InfoMetricFamily("wattclass_job_label", "The job's label and where it came from",
                                labels=("job_id",))
        for job, (label, source) in labels.items():
            info.add_metric([job], {"label": label, "source": source})
        yield info
        info = InfoMetricFamily("wattclass_job", "The job's user and Slurm account (empty if unknown)",
                                labels=("job_id",))
        for job, (user, acct) in job_info.items():
            info.add_metric([job], {"user": user, "account": acct})
        yield info
        c = CounterMetricFamily("wattclass_telemetry_windows", "Window rows written per GPU",
                                labels=GPU_LABELS)
        for key, n in windows.items():
            c.add_metric(list(key), n)
        yield c
        yield from self._health(last_ts)
        yield CounterMetricFamily("wattclass_wal_write_errors",
                                  "Failed WAL appends (disk full...) since start", value=wal_errors)
        yield GaugeMetricFamily("wattclass_wal_backlog_rows",
                                "Closed window rows not yet durable: held in memory after a failed "
                                "WAL append", value=backlog_rows)
        yield GaugeMetricFamily("wattclass_wal_unconverted_segments",
                                "WAL segments waiting for a Parquet write that failed", value=unconverted)

    def _health(self, last_ts: float | None) -> Iterator[Metric]:
        h = self.health() if self.health is not None else Health()
        g = GaugeMetricFamily("wattclass_daemon_last_window_timestamp_seconds",
                              "End of the latest closed window (the backend's clock)")
        if last_ts is not None:
            g.add_metric([], last_ts)
        yield g
        yield CounterMetricFamily("wattclass_daemon_gpu_errors", "GPU polls that failed", value=h.gpu_errors)
        yield CounterMetricFamily("wattclass_daemon_nonfinite_readings",
                                  "GPU readings (or GPM metrics) that were NaN or infinite, taken as "
                                  "missing", value=h.nonfinite_readings)
        yield CounterMetricFamily("wattclass_wal_nonfinite_values",
                                  "Window row values written to the WAL as null because they were not "
                                  "finite (a bug; the ERROR log names the column)", value=h.nonfinite_values)


def _physical_uuid(r: dict[str, Any]) -> str:
    return str(r.get("parent_gpu_uuid") or r["gpu_uuid"])


def _labels(r: dict[str, Any]) -> list[str]:
    return [str(r["gpu_index"]), str(r["gpu_uuid"]), str(r["host"]), r.get("job_id") or "",
            r.get("user") or ""]


def serve(port: int, collector: LatestWindows, addr: str = DEFAULT_BIND) -> CollectorRegistry:
    """Start the HTTP endpoint on its own registry (loopback unless ``addr`` opens it)."""
    from prometheus_client import start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    start_http_server(port, addr=addr, registry=registry)
    return registry
