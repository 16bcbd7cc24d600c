"""The exporter and the shipped Grafana dashboard against a real Prometheus.

The telemetry daemon replays the H200 recording in real time (sped up) with its exporter on
127.0.0.1; a Prometheus started here scrapes it every second; then every panel's PromQL of
deploy/grafana-wattclass.json must parse and return data through the HTTP API.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from free_ports import free_port
from prometheus_server import have_prometheus, prometheus

from wattclass.jobmap import JobAssignment, write_job_file

pytestmark = pytest.mark.skipif(not have_prometheus(), reason="needs prometheus (apt prometheus)")

REPO = Path(__file__).resolve().parent.parent
DASHBOARD = REPO / "deploy" / "grafana-wattclass.json"
RAW = REPO / "wattclass" / "data" / "h200" / "raw"
UUID = "GPU-807c0827-6a8b-a9eb-a8b2-613c99a8f1a3"
#: What Grafana substitutes for its variables, at this test's scale.
GRAFANA_VARS = {"$__rate_interval": "15s", "$__range": "1m", "$__interval": "5s", "$job": "wattclass"}


def _query(url: str, expr: str) -> list[dict]:  # type: ignore[type-arg]
    q = urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(f"{url}/api/v1/query?{q}", timeout=10) as r:
            doc = json.load(r)
    except urllib.error.HTTPError as exc:  # a PromQL parse or execution error
        raise AssertionError(f"{expr}: {exc.read().decode()}") from exc
    assert doc["status"] == "success", doc
    return doc["data"]["result"]  # type: ignore[no-any-return]


def _panel_exprs() -> list[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    out = []
    for p in dash["panels"]:
        for t in p["targets"]:
            e = t["expr"]
            for k, v in GRAFANA_VARS.items():
                e = e.replace(k, v)
            out.append((p["title"], e))
    return out


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    d = tmp_path_factory.mktemp("dash")
    spool = d / "spool"
    spool.mkdir(mode=0o755)
    # What the Prolog writes for a job submitted as memory-bound (the label table's decision).
    write_job_file(spool, UUID, JobAssignment("777", "alice", 1000, "memory", "rule", "physics"))
    port = free_port()
    log = (d / "daemon.log").open("w")
    daemon = subprocess.Popen(
        [sys.executable, "-m", "wattclass.cli", "telemetry", "run", "--backend", f"replay:{RAW}",
         "--data-root", str(d / "root"), "--spool", str(spool), "--metrics-port", str(port),
         "--speed", "10", "--host", "gpu-h200-03"], stdout=log, stderr=subprocess.STDOUT)
    try:
        with prometheus(d / "tsdb", scrape=f"127.0.0.1:{port}", interval_s=1.0) as url:
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                got = _query(url, "count_over_time(wattclass_job_gpu_energy_joules_total[1m])")
                if got and float(got[0]["value"][1]) >= 20:
                    break
                assert daemon.poll() is None, (d / "daemon.log").read_text()[-2000:]
                time.sleep(1)
            else:
                raise AssertionError("Prometheus did not collect 20 scrapes of the exporter in 90 s")
            yield url
    finally:
        daemon.terminate()
        daemon.wait(timeout=30)
        log.close()


def test_dashboard_is_valid_grafana_json() -> None:
    dash = json.loads(DASHBOARD.read_text())
    titles = [p["title"] for p in dash["panels"]]
    assert len(set(titles)) == len(titles) and len(titles) >= 8
    ids = [p["id"] for p in dash["panels"]]
    assert len(set(ids)) == len(ids)
    for want in ("label", "user", "account", "cap", "saving", "health"):
        assert any(want in t.lower() for t in titles), want
    for p in dash["panels"]:
        assert p["targets"] and all(t["expr"] for t in p["targets"])
        assert p["datasource"]["uid"] == "${datasource}"


def test_every_panel_query_parses_and_returns_data(scraped: str) -> None:
    empty = [(title, e) for title, e in _panel_exprs() if not _query(scraped, e)]
    assert not empty, f"panels without data: {empty}"


def test_exporter_series_follow_conventions_and_carry_the_job(scraped: str) -> None:
    labels = _query(scraped, "wattclass_job_label_info")
    assert {(r["metric"]["job_id"], r["metric"]["label"], r["metric"]["source"]) for r in labels} == {
        ("777", "memory", "rule")}
    acct = _query(scraped, "sum by (account) (increase(wattclass_job_gpu_energy_joules_total[1m])"
                           " * on(job_id) group_left(account) max by (job_id, account) (wattclass_job_info))")
    assert [r["metric"]["account"] for r in acct] == ["physics"] and float(acct[0]["value"][1]) > 0
    # The per-GPU energy counter only grows, and by what the windows measured (hundreds of W).
    inc = _query(scraped, "increase(wattclass_gpu_energy_joules_total[30s])")
    assert inc and float(inc[0]["value"][1]) > 0
    ratio = _query(scraped, "max(wattclass_gpu_utilization_ratio)")
    assert 0 <= float(ratio[0]["value"][1]) <= 1
    clk = _query(scraped, "max(wattclass_gpu_sm_clock_hertz)")
    assert float(clk[0]["value"][1]) > 1e8  # hertz, not MHz
    names = {r["metric"]["__name__"] for r in _query(scraped, '{__name__=~"wattclass_.*"}')}
    assert not {n for n in names if n.endswith(("_percent", "_mhz"))}
    assert {"wattclass_gpu_power_cap_watts", "wattclass_wal_unconverted_segments",
            "wattclass_daemon_last_window_timestamp_seconds"} <= names


def _panel_expr(title: str, ref: str) -> str:
    dash = json.loads(DASHBOARD.read_text())
    panel = next(p for p in dash["panels"] if p["title"] == title)
    return str(next(t["expr"] for t in panel["targets"] if t["refId"] == ref))


def test_the_gpu_panels_join_each_nodes_gpus_when_every_node_has_the_same_instance(tmp_path: Path) -> None:
    """admin.md's private alternative to opening port 9410: a local agent on each node scrapes
    127.0.0.1:9410, so every node's series carry instance="127.0.0.1:9410". The cap panels joined the
    per-GPU gauges on (instance, gpu): GPU 0 of two nodes then met twice and Prometheus refused the
    query ("many-to-many matching not allowed"), leaving the caps and saving panels empty. They join
    on the exporter's own host label now, and count a GPU that two jobs share once.

    Two nodes behind one instance: gpu01's GPU 0 runs memory-bound job 7 at 600 W under a 420 W
    cap (60% of 700 W); gpu02's GPU 0 is shared by jobs 8 and 9, uncapped at 700 W."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("needs promtool (apt prometheus)")
    inst = 'job="wattclass",instance="127.0.0.1:9410"'
    gpus = {"gpu01": ("GPU-a", [("7", "alice", 420, 600)]),
            "gpu02": ("GPU-b", [("8", "bob", 700, 300), ("9", "carol", 700, 300)])}
    series = []
    for host, (uuid, jobs) in gpus.items():
        gpu = f'{inst},host="{host}",gpu="0",uuid="{uuid}"'
        series.append((f"wattclass_gpu_power_default_cap_watts{{{gpu}}}", 700))
        for job, user, cap, power in jobs:
            series.append((f'wattclass_gpu_power_cap_watts{{{gpu},job_id="{job}",user="{user}"}}', cap))
            series.append((f'wattclass_gpu_power_watts{{{gpu},job_id="{job}",user="{user}"}}', power))
    series.append((f'wattclass_job_label_info{{{inst},job_id="7",label="memory",source="rule"}}', 1))
    cases = [
        (_panel_expr("GPUs under a cap", "A"), [("{}", 1)]),
        (_panel_expr("GPUs under a cap", "B"), [("{}", 2)]),
        (_panel_expr("Estimated saving from caps (now)", "A"), [("{}", 600 - 0.6 * 700)]),
        (_panel_expr("Caps in force", "A"), [
            (f'{{{inst},host="gpu01",gpu="0",uuid="GPU-a",job_id="7",user="alice"}}', 0.6),
            (f'{{{inst},host="gpu02",gpu="0",uuid="GPU-b",job_id="8",user="bob"}}', 1.0),
            (f'{{{inst},host="gpu02",gpu="0",uuid="GPU-b",job_id="9",user="carol"}}', 1.0)]),
    ]
    doc = {"rule_files": [], "evaluation_interval": "10s", "tests": [{
        "interval": "10s",
        "input_series": [{"series": s, "values": f"{v} {v} {v}"} for s, v in series],
        "promql_expr_test": [{"expr": expr, "eval_time": "20s",
                              "exp_samples": [{"labels": lb, "value": v} for lb, v in want]}
                             for expr, want in cases]}]}
    test_file = tmp_path / "dashboard_test.yml"
    test_file.write_text(json.dumps(doc))  # YAML is a superset of JSON
    run = subprocess.run([promtool, "test", "rules", str(test_file)], capture_output=True, text=True,
                         timeout=60, check=False)
    assert run.returncode == 0, run.stdout + run.stderr


def _promtool_cases(tmp_path: Path, series: list[tuple[str, str]], interval: str,
                    cases: list[tuple[str, str, list[tuple[str, float]]]]) -> None:
    """Run ``promtool test rules`` on ``series`` (name{labels}, promtool values notation) and
    check each (expr, eval_time, expected samples)."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("needs promtool (apt prometheus)")
    doc = {"rule_files": [], "evaluation_interval": interval, "tests": [{
        "interval": interval,
        "input_series": [{"series": s, "values": v} for s, v in series],
        "promql_expr_test": [{"expr": expr, "eval_time": at,
                              "exp_samples": [{"labels": lb, "value": v} for lb, v in want]}
                             for expr, at, want in cases]}]}
    test_file = tmp_path / "dashboard_test.yml"
    test_file.write_text(json.dumps(doc))  # YAML is a superset of JSON
    run = subprocess.run([promtool, "test", "rules", str(test_file)], capture_output=True, text=True,
                         timeout=60, check=False)
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_energy_panels_count_jobs_that_ended_earlier_in_the_range(tmp_path: Path) -> None:
    """The exporter drops a job's energy counter and its label/account info series an hour after
    the job's last window (LatestWindows.job_ttl_s). The energy-by-label and energy-by-account
    panels joined ``increase(...[$__range])`` with the info series *at the end* of the range, so
    over a day only the jobs of the last hour were counted: a job that ran in the morning vanished
    from the afternoon's view. They take the info series over the whole range now.

    Job 7 (memory-bound, account physics) runs 0-60 min at 1000 W on gpu01 and is gone after;
    the panels are read at 3 h over a 3 h range: about 1 kWh for label memory and account physics."""
    inst = 'job="wattclass",instance="gpu01:9410",host="gpu01",gpu="0",uuid="GPU-a"'
    series = [  # 1 min steps; the counter grows 60 kJ a minute (1000 W) for an hour, then ends
        (f'wattclass_job_gpu_energy_joules_total{{{inst},job_id="7",user="alice"}}', "0+60000x60"),
        ('wattclass_job_label_info{job="wattclass",instance="gpu01:9410",job_id="7",label="memory",'
         'source="rule"}', "1x60"),
        ('wattclass_job_info{job="wattclass",instance="gpu01:9410",job_id="7",user="alice",'
         'account="physics"}', "1x60"),
    ]
    # increase() extrapolates half a step (30 s) past the last sample of a series that ends early
    kwh = (60 * 60000 + 30000) / 3.6e6
    cases = []
    for title, label in (("Energy by job label", '{label="memory"}'),
                         ("Energy per account (top 20)", '{account="physics"}'),
                         ("Energy per user (top 20)", '{user="alice"}')):
        cases.append((_panel_expr(title, "A").replace("$__range", "3h"), "3h", [(label, kwh)]))
    _promtool_cases(tmp_path, series, "1m", cases)


def _panel(title: str) -> dict:  # type: ignore[type-arg]
    dash = json.loads(DASHBOARD.read_text())
    return next(p for p in dash["panels"] if p["title"] == title)  # type: ignore[no-any-return]


def test_table_panels_get_one_table_not_one_frame_per_series() -> None:
    """Grafana's Prometheus source returns one frame per series unless a target asks for
    ``format: table``; a table panel then shows one GPU (or one health column) at a time behind a
    frame picker. Both table panels ask for tables; the health table, fed by six queries, merges
    them into one row per node and names their columns."""
    for title in ("Caps in force", "Daemon health"):
        assert all(t.get("format") == "table" and t.get("instant") for t in _panel(title)["targets"]), title
    health = _panel("Daemon health")
    kinds = [t["id"] for t in health.get("transformations", [])]
    assert kinds[:1] == ["merge"], kinds
    renames = next(t["options"]["renameByName"] for t in health["transformations"] if t["id"] == "organize")
    assert set(renames) == {f"Value #{t['refId']}" for t in health["targets"]}


def test_the_health_queries_share_one_key_so_their_rows_merge(scraped: str) -> None:
    """Grafana's merge joins the health queries' rows on the labels they share: each query must
    return exactly one series per node, labelled by ``instance`` alone (``up`` also carried
    ``job``, and its column would not have joined the others' rows)."""
    for target in _panel("Daemon health")["targets"]:
        expr = target["expr"]
        for k, v in GRAFANA_VARS.items():
            expr = expr.replace(k, v)
        got = _query(scraped, expr)
        assert len(got) == 1 and set(got[0]["metric"]) == {"instance"}, (expr, got)
