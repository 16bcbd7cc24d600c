"""The exporter's conventions: base units, _ratio, _total counters, label info, health, loopback."""

from __future__ import annotations

import socket
import urllib.request

import pytest
from free_ports import free_port
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from wattclass.telemetry.metrics import DEFAULT_BIND, Health, LatestWindows, serve


def _samples(col: LatestWindows) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    reg = CollectorRegistry()
    reg.register(col)
    out = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _get(samples: dict, name: str, **labels: str) -> float:  # type: ignore[type-arg]
    hits = [v for (n, ls), v in samples.items() if n == name and labels.items() <= dict(ls).items()]
    assert len(hits) == 1, (name, labels, hits)
    return hits[0]


ROW = {"gpu_index": 0, "gpu_uuid": "GPU-a", "host": "n1", "power_avg_w": 500.0, "util_gpu_pct": 87.0,
       "sm_clock_mhz": 1980.0, "sm_util_pct": 42.0, "fb_used_mib": 1024.0, "power_limit_w": 420.0,
       "int_util_pct": 76.0}


def test_units_ratios_counters_and_labels() -> None:
    col = LatestWindows(health=lambda: Health(gpu_errors=3))
    col.set_wal_state(write_errors=4, backlog_rows=5, unconverted_segments=2)
    col.set_default_caps({"GPU-a": 700.0})
    col.update([dict(ROW, ts_end=10.0, energy_j=5000.0, job_id="1", user="a")], {"1": ("memory", "submit")},
               {"1": "physics"})
    col.update([dict(ROW, ts_end=20.0, energy_j=3000.0, job_id="2", user="b")])
    s = _samples(col)
    assert _get(s, "wattclass_gpu_energy_joules_total", uuid="GPU-a") == 8000.0
    assert _get(s, "wattclass_job_gpu_energy_joules_total", job_id="1") == 5000.0
    assert _get(s, "wattclass_job_gpu_energy_joules_total", job_id="2") == 3000.0
    assert _get(s, "wattclass_gpu_utilization_ratio", job_id="2") == pytest.approx(0.87)
    assert _get(s, "wattclass_gpu_sm_active_ratio", job_id="2") == pytest.approx(0.42)
    assert _get(s, "wattclass_gpu_int_active_ratio", job_id="2") == pytest.approx(0.76)  # a rule pipe
    assert _get(s, "wattclass_gpu_sm_clock_hertz", job_id="2") == 1.98e9
    assert _get(s, "wattclass_gpu_memory_used_bytes", job_id="2") == 2**30
    assert _get(s, "wattclass_gpu_power_cap_watts", job_id="2") == 420.0
    assert _get(s, "wattclass_gpu_power_default_cap_watts", uuid="GPU-a") == 700.0
    assert _get(s, "wattclass_job_label_info", job_id="1", label="memory", source="submit") == 1.0
    assert _get(s, "wattclass_job_info", job_id="1", user="a", account="physics") == 1.0
    assert _get(s, "wattclass_job_info", job_id="2", user="b", account="") == 1.0
    assert _get(s, "wattclass_daemon_gpu_errors_total") == 3
    assert _get(s, "wattclass_wal_unconverted_segments") == 2
    assert _get(s, "wattclass_wal_backlog_rows") == 5
    assert _get(s, "wattclass_wal_write_errors_total") == 4
    assert _get(s, "wattclass_daemon_last_window_timestamp_seconds") == 20.0
    names = {n for n, _ in s}
    assert not any(n.endswith(("_percent", "_mhz", "_pct")) for n in names)


def test_finished_jobs_expire_but_gpu_energy_keeps_counting() -> None:
    col = LatestWindows(job_ttl_s=100.0)
    col.update([dict(ROW, ts_end=10.0, energy_j=1.0, job_id="1", user="a")], {"1": ("compute", "submit")})
    col.update([dict(ROW, ts_end=500.0, energy_j=2.0, job_id="2", user="a")])
    s = _samples(col)
    assert not [k for k in s if dict(k[1]).get("job_id") == "1"]
    assert _get(s, "wattclass_gpu_energy_joules_total", uuid="GPU-a") == 3.0


def test_endpoint_binds_loopback_by_default() -> None:
    assert DEFAULT_BIND == "127.0.0.1"
    port = free_port()
    col = LatestWindows()
    col.update([dict(ROW, ts_end=10.0, energy_j=1.0, job_id="1", user="a")])
    serve(port, col)
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert "wattclass_gpu_power_watts" in body
    # Nothing listens on the machine's other addresses.
    others = {a[4][0] for a in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)} - {"127.0.0.1"}
    others = {a for a in others if not a.startswith("127.")}
    for addr in others:
        with socket.socket() as s, pytest.raises(OSError):
            s.settimeout(2)
            s.connect((addr, port))


def test_metrics_bind_without_port_is_a_usage_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from wattclass.cli import main

    assert main(["telemetry", "run", "--backend", "replay:/nonexistent", "--data-root", str(tmp_path),
                 "--metrics-bind", "0.0.0.0"]) == 2


def test_a_gpu_that_stops_reporting_leaves_the_gauges_but_keeps_its_energy() -> None:
    """A GPU that fails mid-job (off the bus) closes no more windows while the node's other GPUs
    go on. Its gauges stayed at its last window forever: the dashboard drew 600 W for a job on a
    dead GPU and counted it under a cap, and its job never expired (it looked running). Its
    gauges go once its latest window is ``gpu_stale_s`` older than the node's newest; its energy
    counter, a total, stays."""
    col = LatestWindows(gpu_stale_s=300.0, job_ttl_s=600.0)
    col.set_default_caps({"GPU-a": 700.0, "GPU-b": 700.0})
    b = dict(ROW, gpu_index=1, gpu_uuid="GPU-b", power_avg_w=600.0, energy_j=6000.0, job_id="7", user="c")
    col.update([dict(ROW, ts_end=10.0, energy_j=5000.0), dict(b, ts_end=10.0)], {"7": ("memory", "rule")})
    for t in range(40, 310, 30):  # GPU-b is gone; GPU-a closes windows every 30 s
        col.update([dict(ROW, ts_end=float(t), energy_j=5000.0)])
    s = _samples(col)
    assert _get(s, "wattclass_gpu_power_watts", uuid="GPU-b") == 600.0  # 290 s: not yet stale
    col.update([dict(ROW, ts_end=340.0, energy_j=5000.0)])
    s = _samples(col)
    gpus = {dict(ls)["uuid"] for (n, ls) in s if n == "wattclass_gpu_power_watts"}
    assert gpus == {"GPU-a"}
    assert {dict(ls)["uuid"] for (n, ls) in s if n == "wattclass_gpu_power_default_cap_watts"} == {"GPU-a"}
    assert _get(s, "wattclass_gpu_energy_joules_total", uuid="GPU-b") == 6000.0
    # its job is no longer running: it expires with the job TTL like any finished job
    col.update([dict(ROW, ts_end=700.0, energy_j=5000.0)])
    s = _samples(col)
    assert not [ls for (n, ls) in s if n == "wattclass_job_label_info"]


def test_a_wall_clock_stepped_back_keeps_the_live_gpus_gauges() -> None:
    """Staleness is measured against the windows just published: after NTP stepped the clock back
    an hour, the live GPUs' new windows are older than the newest ever seen, and must stay."""
    col = LatestWindows(gpu_stale_s=300.0)
    col.update([dict(ROW, ts_end=4000.0, energy_j=1.0)])
    col.update([dict(ROW, ts_end=400.0, energy_j=1.0, power_avg_w=321.0)])  # an hour earlier
    assert _get(_samples(col), "wattclass_gpu_power_watts", uuid="GPU-a") == 321.0


def test_a_mig_gpu_whose_slices_are_all_in_use_still_has_its_default_limit() -> None:
    """A MIG GPU's rows name its instances (``gpu_uuid`` MIG-..., ``parent_gpu_uuid`` the GPU);
    a row with the GPU's own uuid exists only for slices no instance uses. The default limit was
    served only for rows with the GPU's own uuid, so a fully partitioned GPU had none: it was
    missing from the dashboard's "GPUs under a cap" and "Caps in force". It is served per
    physical GPU now, once, whatever its rows."""
    col = LatestWindows()
    col.set_default_caps({"GPU-p": 700.0})
    mig = dict(ROW, gpu_uuid="MIG-1", parent_gpu_uuid="GPU-p", power_limit_w=420.0, ts_end=10.0, energy_j=1.0)
    col.update([dict(mig, job_id="7", user="a"), dict(mig, gpu_uuid="MIG-2", job_id="8", user="b")])
    s = _samples(col)
    defaults = [(dict(ls), v) for (n, ls), v in s.items() if n == "wattclass_gpu_power_default_cap_watts"]
    assert defaults == [({"gpu": "0", "uuid": "GPU-p", "host": "n1"}, 700.0)]
