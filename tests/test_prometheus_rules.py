"""The shipped alerting rules (deploy/prometheus-wattclass-rules.yml) against promtool.

docs/admin.md told sysadmins to alert on the daemon's health metrics but shipped no rule: each
site wrote its own, or none, and a full WAL disk was seen in the journal only. Each alert here is
run by ``promtool test rules`` on series shaped as the exporter serves them (names and labels
from telemetry/metrics.py): it fires on the failure it names and stays quiet on a healthy node.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from wattclass.telemetry.metrics import LatestWindows

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "deploy" / "prometheus-wattclass-rules.yml"
PROMTOOL = shutil.which("promtool")

pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="needs promtool (apt prometheus)")

INST = 'job="wattclass",instance="gpu01:9410"'
GPU = f'{INST},host="gpu01",gpu="0",uuid="GPU-a"'


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60, check=False)


def _healthy(minutes: int) -> list[tuple[str, str]]:
    """A node whose daemon closes a window every 30 s (1 min steps here: the end of the latest
    window is 20 s before each scrape), with an idle GPU at its default limit."""
    return [
        (f"up{{{INST}}}", f"1x{minutes}"),
        (f"wattclass_daemon_last_window_timestamp_seconds{{{INST}}}", f"40+60x{minutes}"),
        (f"wattclass_wal_backlog_rows{{{INST}}}", f"0x{minutes}"),
        (f"wattclass_wal_unconverted_segments{{{INST}}}", f"0x{minutes}"),
        (f"wattclass_daemon_gpu_errors_total{{{INST}}}", f"0x{minutes}"),
        (f"wattclass_wal_nonfinite_values_total{{{INST}}}", f"0x{minutes}"),
        (f'wattclass_gpu_power_cap_watts{{{GPU},job_id="",user=""}}', f"700x{minutes}"),
        (f"wattclass_gpu_power_default_cap_watts{{{GPU}}}", f"700x{minutes}"),
    ]


Firing = list[tuple[str, str, dict[str, str]]]


def _run(tmp_path: Path, series: list[tuple[str, str]], firing: Firing) -> None:
    """Evaluate the rules on ``series`` (1 min steps, promtool notation) and check, for each
    (eval time, alert name, labels), that exactly these alerts are firing then ({} for none).

    The firing alerts are read back as Prometheus's own ``ALERTS`` series, so the test holds the
    labels (not the annotation texts, which are for people)."""
    doc = {"rule_files": [str(RULES)], "evaluation_interval": "1m", "tests": [{
        "interval": "1m",
        "input_series": [{"series": s, "values": v} for s, v in series],
        "promql_expr_test": [{
            "expr": f'ALERTS{{alertname="{name}",alertstate="firing"}}', "eval_time": at,
            "exp_samples": [{"labels": "ALERTS" + _labels({"alertname": name, "alertstate": "firing",
                                                           **labels}), "value": 1}] if labels else []}
            for at, name, labels in firing]}]}
    test_file = tmp_path / "rules_test.yml"
    test_file.write_text(json.dumps(doc))  # YAML is a superset of JSON
    run = _promtool("test", "rules", str(test_file))
    assert run.returncode == 0, run.stdout + run.stderr


def _labels(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def _alert_names() -> list[str]:
    return re.findall(r"^\s+- alert: (\w+)$", RULES.read_text(), re.M)


def test_the_rules_file_is_valid() -> None:
    run = _promtool("check", "rules", str(RULES))
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"SUCCESS: {len(_alert_names())} rules found" in run.stdout


def test_a_healthy_node_fires_nothing(tmp_path: Path) -> None:
    _run(tmp_path, _healthy(60), [(f"{m}m", name, {}) for name in _alert_names() for m in (10, 30, 59)])


def _replace(series: list[tuple[str, str]], name: str, values: str) -> list[tuple[str, str]]:
    out = [(s, values if s.startswith(name + "{") else v) for s, v in series]
    assert out != series, name
    return out


@pytest.mark.parametrize(("metric", "values", "alert", "labels", "fires_at"), [
    # the daemon stopped at minute 10: scrapes fail
    ("up", "1x10 0x50", "WattclassExporterDown", {}, "16m"),
    # the poll loop hung at minute 10: the endpoint answers, the last window stays at 10:40
    ("wattclass_daemon_last_window_timestamp_seconds", "40+60x10 640x50", "WattclassNoNewWindows", {}, "18m"),
    # disk full at minute 10: 80 windows held in memory
    ("wattclass_wal_backlog_rows", "0x10 80x50", "WattclassWindowsOnlyInMemory", {}, "13m"),
    # the shared data root went read-only at minute 10
    ("wattclass_wal_unconverted_segments", "0x10 3x50", "WattclassParquetWritesFailing", {}, "21m"),
    # a GPU fell off the bus at minute 10: an error at every poll
    ("wattclass_daemon_gpu_errors_total", "0x10 60+60x50", "WattclassGpuErrors", {}, "22m"),
    ("wattclass_wal_nonfinite_values_total", "0x10 1x50", "WattclassNonFiniteValuesWritten", {}, "12m"),
    # the Epilog failed at minute 10: the GPU kept its 420 W cap with no job
    ("wattclass_gpu_power_cap_watts", "700x10 420x50", "WattclassGpuCappedWithoutJob",
     {"host": "gpu01", "gpu": "0"}, "27m"),
])
def test_each_alert_fires_on_its_failure(tmp_path: Path, metric: str, values: str, alert: str,
                                         labels: dict[str, str], fires_at: str) -> None:
    series = _replace(_healthy(60), metric, values)
    want = {"job": "wattclass", "instance": "gpu01:9410", **labels, "severity": _severity(alert)}
    before = f"{int(fires_at[:-1]) - 2}m"  # pending: not yet firing for its `for:`
    _run(tmp_path, series, [(before, alert, {}), (fires_at, alert, want)])


def _severity(alert: str) -> str:
    block = RULES.read_text().split(f"- alert: {alert}\n", 1)[1]
    found = re.search(r"severity: (\w+)", block)
    assert found
    return found.group(1)


def test_a_capped_gpu_with_a_job_does_not_fire(tmp_path: Path) -> None:
    """A cap is what the job's Prolog is for: only a cap that outlives its job is an alert."""
    series = [(s, v) for s, v in _healthy(60) if "power_cap_watts" not in s]
    series.append((f'wattclass_gpu_power_cap_watts{{{GPU},job_id="7",user="alice"}}', "420x60"))
    _run(tmp_path, series, [("59m", "WattclassGpuCappedWithoutJob", {})])


def test_every_metric_the_rules_read_is_exported() -> None:
    """A renamed metric would leave an alert that can never fire."""
    rows = [{"gpu_uuid": "GPU-a", "gpu_index": 0, "host": "gpu01", "ts_end": 10.0, "energy_j": 1.0,
             "power_limit_w": 700.0, "job_id": None, "user": None}]
    collector = LatestWindows()
    collector.set_default_caps({"GPU-a": 700.0})
    collector.update(rows)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    exported = set(re.findall(r"^(wattclass_\w+?)(?:\{| )", generate_latest(registry).decode(), re.M))
    exprs = re.findall(r"^\s+expr: (.*(?:\n\s{12,}.*)*)", RULES.read_text(), re.M)
    named = {m for e in exprs for m in re.findall(r"\b(wattclass_\w+)", e)}
    assert named and named <= exported, named - exported


def test_a_capped_mig_gpu_fires_only_when_none_of_its_instances_has_a_job(tmp_path: Path) -> None:
    """A MIG GPU's rows are its instances (one ``uuid`` each, the same ``gpu`` index), all at the
    GPU's one limit. An idle instance beside a capped job's instance is under the default with
    no job of its own: that is the job's cap, not a leftover one. Once no instance has a job for
    15 minutes, the GPU's cap is a leftover."""
    mig = f'{INST},host="gpu01",gpu="0"'
    series = [(s, v) for s, v in _healthy(60) if "power_cap_watts" not in s]
    series += [
        # instance 1 runs job 7 until minute 20, capped at 420 W; instance 2 is idle throughout
        # (the exporter drops job 7's series: Prometheus marks it stale at the next scrape)
        (f'wattclass_gpu_power_cap_watts{{{mig},uuid="MIG-1",job_id="7",user="alice"}}', "420x20 stale"),
        (f'wattclass_gpu_power_cap_watts{{{mig},uuid="MIG-1"}}', "_x20 420x39"),
        (f'wattclass_gpu_power_cap_watts{{{mig},uuid="MIG-2"}}', "420x60"),
    ]
    want = {"job": "wattclass", "instance": "gpu01:9410", "host": "gpu01", "gpu": "0",
            "severity": _severity("WattclassGpuCappedWithoutJob")}
    _run(tmp_path, series, [("19m", "WattclassGpuCappedWithoutJob", {}),
                            ("30m", "WattclassGpuCappedWithoutJob", {}),  # pending since 21m
                            ("37m", "WattclassGpuCappedWithoutJob", want)])
