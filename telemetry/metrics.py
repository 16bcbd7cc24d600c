"""Prometheus view of the latest closed window per GPU, in the style of dcgm-exporter.

Labels ``gpu``, ``uuid``, ``host``, ``job_id``, ``user`` (empty when no job) so dashboards can
sum power by job or user. A custom collector over an injected ``CollectorRegistry`` (never the
global one) renders the latest rows at scrape time; the poll loop only swaps a dict.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

LABELS = ("gpu", "uuid", "host", "job_id", "user")

#: row column -> (metric name, help)
GAUGES: tuple[tuple[str, str, str], ...] = (
    ("power_avg_w", "wattclass_gpu_power_avg_watts", "Mean power over the latest window (energy / time)"),
    ("power_max_w", "wattclass_gpu_power_max_watts", "Max 1 s instantaneous power in the latest window"),
    ("energy_j", "wattclass_gpu_window_energy_joules", "Energy of the latest window (counter delta)"),
    ("power_limit_w", "wattclass_gpu_power_limit_watts", "Enforced power limit"),
    ("util_gpu_pct", "wattclass_gpu_util_percent", "Mean NVML GPU utilization"),
    ("util_mem_pct", "wattclass_gpu_mem_util_percent", "Mean NVML memory utilization"),
    ("sm_clock_mhz", "wattclass_gpu_sm_clock_mhz", "Mean SM clock"),
    ("temp_c", "wattclass_gpu_temp_celsius", "Max GPU temperature"),
    ("throttle_power_frac", "wattclass_gpu_throttle_power_ratio", "Share of polls with power clock events"),
    ("sm_util_pct", "wattclass_gpu_gpm_sm_util_percent", "GPM SM activity"),
    ("tensor_util_pct", "wattclass_gpu_gpm_tensor_util_percent", "GPM tensor pipe activity"),
    ("dram_bw_util_pct", "wattclass_gpu_gpm_dram_bw_util_percent", "GPM DRAM bandwidth utilization"),
    ("ts_end", "wattclass_gpu_window_end_timestamp_seconds", "End of the latest window"),
)


class LatestWindows(Collector):
    """Holds the latest window rows per GPU; collected by prometheus_client at scrape time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._latest: dict[int, list[dict[str, Any]]] = {}
        self._windows_total: dict[tuple[str, str, str], int] = {}
        self._wal = (0, 0, 0)  # write errors so far, rows held in memory, segments not yet in Parquet

    def set_wal_state(self, write_errors: int, backlog_rows: int, unconverted_segments: int) -> None:
        """The daemon's durability state, so an alert fires while the disk is full (not only in logs)."""
        with self._lock:
            self._wal = (write_errors, backlog_rows, unconverted_segments)

    def update(self, rows: list[dict[str, Any]]) -> None:
        by_gpu: dict[int, list[dict[str, Any]]] = {}
        for r in rows:
            by_gpu.setdefault(int(r["gpu_index"]), []).append(r)
        with self._lock:
            for gpu, rs in by_gpu.items():
                end = max(r["ts_end"] for r in rs)
                self._latest[gpu] = [r for r in rs if r["ts_end"] == end] or rs
                key = (str(gpu), str(rs[0]["gpu_uuid"]), str(rs[0]["host"]))
                self._windows_total[key] = self._windows_total.get(key, 0) + len(rs)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            latest = [r for rs in self._latest.values() for r in rs]
            totals = dict(self._windows_total)
            wal_errors, backlog_rows, unconverted = self._wal
        for col, name, help_ in GAUGES:
            g = GaugeMetricFamily(name, help_, labels=LABELS)
            for r in latest:
                v = r.get(col)
                if v is not None:
                    g.add_metric(_labels(r), float(v))
            yield g
        c = CounterMetricFamily("wattclass_telemetry_windows", "Window rows written per GPU",
                                labels=("gpu", "uuid", "host"))
        for key, n in totals.items():
            c.add_metric(list(key), n)
        yield c
        yield CounterMetricFamily("wattclass_wal_write_errors",
                                  "Failed WAL appends (disk full...) since start", value=wal_errors)
        yield GaugeMetricFamily("wattclass_wal_backlog_rows",
                                "Closed window rows not yet durable: held in memory after a failed "
                                "WAL append", value=backlog_rows)
        yield GaugeMetricFamily("wattclass_wal_unconverted_segments",
                                "WAL segments waiting for a Parquet write that failed", value=unconverted)


def _labels(r: dict[str, Any]) -> list[str]:
    return [str(r["gpu_index"]), str(r["gpu_uuid"]), str(r["host"]), r.get("job_id") or "",
            r.get("user") or ""]


def serve(port: int, collector: LatestWindows, addr: str = "0.0.0.0") -> CollectorRegistry:
    """Start the HTTP endpoint on its own registry; returns the registry."""
    from prometheus_client import start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    start_http_server(port, addr=addr, registry=registry)
    return registry
