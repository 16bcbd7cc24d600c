"""simulate (cap-response model, per-job scan, totals) and calibrate (file-state GPUs that respond to
caps; the original limit comes back on success, on SIGTERM and, through reconcile, after kill -9)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from wattclass.cli import main
from wattclass.errors import DataError
from wattclass.gpu.filestate import FileStateBackend, simulated_response
from wattclass.policy import parse_policy
from wattclass.savings.calibrate import CalibrateOptions, calibrate, simulated_workloads
from wattclass.savings.response import clock_bound_share, default_effect, load_response
from wattclass.savings.simulate import simulate
from wattclass.schema import TELEMETRY_V1, conform

POLICY = "[caps]\ncompute = \"100%\"\nmemory = \"60%\"\nmixed = \"85%\"\nidle = \"40%\"\n" \
         "[exempt]\naccounts = [\"benchmark\"]\n"


def _a(*v: float) -> np.ndarray:
    return np.asarray(v, dtype=float)


def test_default_model_reproduces_the_published_anchor() -> None:
    """Samsi et al. (HPEC 2023): A100 250 -> 175 W on LLaMA inference: ~23% less energy, 6-7% slower."""
    eff = default_effect(_a(175.0), _a(250.0), _a(250.0), _a(250.0), _a(0.45), _a(0.15))
    assert 1.04 <= eff.runtime[0] <= 1.09
    assert 0.72 <= eff.energy[0] <= 0.80
    assert eff.runtime_lo[0] < eff.runtime[0] < eff.runtime_hi[0]
    assert eff.energy_lo[0] < eff.energy[0] < eff.energy_hi[0]


def test_a_job_under_the_cap_loses_and_saves_nothing_and_compute_loses_more_than_memory() -> None:
    eff = default_effect(_a(420.0, 420.0, 420.0), _a(300.0, 650.0, 650.0), _a(280.0, 600.0, 600.0),
                         _a(700.0, 700.0, 700.0), _a(0.9, 0.9, 0.2), _a(0.15, 0.15, 0.15))
    assert (eff.runtime[0], eff.energy[0], eff.runtime_hi[0]) == (1.0, 1.0, 1.0)
    assert eff.runtime[1] > eff.runtime[2] > 1.0
    assert eff.energy[2] < eff.energy[1] < 1.0


def test_clock_bound_share_from_gpm_or_the_label_prior() -> None:
    s, band = clock_bound_share(_a(0.8, 0.1, np.nan), _a(0.2, 0.9, np.nan), ["compute", "memory", "memory"])
    assert s[0] == pytest.approx(0.8) and s[1] == pytest.approx(0.1) and s[2] == pytest.approx(0.3)
    assert band[2] > band[0]


def _telemetry(root: Path) -> None:
    """Two jobs on one H200: j1 memory-bound drawing 600 W, j2 compute-bound drawing 690 W, 1 h each."""
    n = 360
    t0 = pd.Timestamp("2026-11-20T00:00:00Z")
    rows = []
    for job, user, pw, sm, tensor, dram in (("j1", "ann", 600.0, 60.0, 10.0, 80.0),
                                            ("j2", "bo", 690.0, 95.0, 85.0, 20.0)):
        for i in range(n):
            ts = t0 + pd.Timedelta(seconds=10 * i)
            rows.append({"ts_start": ts, "ts_end": ts + pd.Timedelta(seconds=10),
                         "host": "n1", "gpu_index": 0 if job == "j1" else 1, "gpu_uuid": f"GPU-{job}",
                         "gpu_model": "NVIDIA H200", "job_id": job, "user": user, "energy_j": pw * 10,
                         "power_avg_w": pw, "power_max_w": pw + 5, "power_limit_w": 700.0, "sm_util_pct": sm,
                         "tensor_util_pct": tensor, "fp64_util_pct": 0.0, "fp32_util_pct": 1.0,
                         "fp16_util_pct": 0.0, "int_util_pct": 2.0, "dram_bw_util_pct": dram})
    rows.append({**rows[0], "job_id": None, "user": None})  # an idle window: no job
    df = pd.DataFrame(rows)
    t = conform(pa.Table.from_pandas(df, preserve_index=False), "test")
    out = root / "telemetry" / "date=2026-11-20" / "host=n1"
    out.mkdir(parents=True)
    pq.write_table(t.cast(TELEMETRY_V1), out / "00.parquet")


def test_simulate_per_job_and_per_group(tmp_path: Path) -> None:
    _telemetry(tmp_path)
    res = simulate(tmp_path, parse_policy({"caps": {"compute": "85%", "memory": "60%"}}))
    j = res.jobs.set_index("job_id")
    assert j.loc["j1", "label"] == "memory" and j.loc["j2", "label"] == "compute"
    assert j.loc["j1", "label_source"] == "rule(sim)"
    assert j.loc["j1", "energy_j"] == pytest.approx(600 * 3600)
    assert j.loc["j1", "cap_w"] == 420.0 and j.loc["j2", "cap_w"] == 595.0
    assert j.loc["j1", "kwh_saved"] > j.loc["j2", "kwh_saved"] > 0
    assert j.loc["j2", "runtime_ratio"] > j.loc["j1", "runtime_ratio"] > 1.0
    assert res.totals["kwh_saved_lo"] <= res.totals["kwh_saved"] <= res.totals["kwh_saved_hi"]
    by_user = res.by["user"].set_index("user")
    assert by_user.loc["ann", "kwh_saved"] == pytest.approx(j.loc["j1", "kwh_saved"])
    none = simulate(tmp_path, parse_policy({"caps": {"memory": "90%"}, "exempt": {"users": ["ann"]}}))
    assert none.totals["kwh_saved"] == 0.0 and none.totals["capped_jobs"] == 0
    with pytest.raises(DataError, match="no job windows"):
        simulate(tmp_path, parse_policy({}), date_from="2026-12-01")
    with pytest.raises(DataError, match="--from"):
        simulate(tmp_path, parse_policy({}), date_from="yesterday")


def test_simulate_cli_json_and_response_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _telemetry(tmp_path / "d")
    pol = tmp_path / "p.toml"
    pol.write_text(POLICY)
    assert main(["simulate", "--data-root", str(tmp_path / "d"), "--policy", str(pol), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert {r["label"] for r in d["by_label"]} == {"memory", "compute"}
    assert {"by_user", "by_account", "totals"} <= set(d)
    resp = tmp_path / "r.json"
    resp.write_text(json.dumps({"version": 1, "gpu_model": "NVIDIA H200", "workloads": {
        "memory": [{"cap_share": 0.5, "runtime_ratio": 1.5, "energy_ratio": 0.5},
                   {"cap_share": 1.0, "runtime_ratio": 1.0, "energy_ratio": 1.0}]}}))
    assert main(["simulate", "--data-root", str(tmp_path / "d"), "--policy", str(pol), "--json",
                 "--response", str(resp)]) == 0
    d2 = json.loads(capsys.readouterr().out)
    mem = next(r for r in d2["by_label"] if r["label"] == "memory")
    # 420 W cap on a job needing 605 W: effective share 0.694, interpolated energy ratio = 0.694
    share = 420.0 / 605.0
    assert mem["kwh_saved"] == pytest.approx(0.6 * (1 - share), rel=1e-3)  # 0.6 kWh: 600 W for 1 h
    assert "site calibration" in d2["model"]
    resp.write_text(json.dumps({"version": 1, "dry_run": True, "workloads": {"x": []}}))
    assert main(["simulate", "--data-root", str(tmp_path / "d"), "--policy", str(pol),
                 "--response", str(resp)]) == 3
    assert "dry-run" in capsys.readouterr().err


def test_simulated_gpu_responds_to_caps_deterministically() -> None:
    assert simulated_response("memory", 700, 700, 84) == (1.0, 420.0)
    speed_c, p = simulated_response("compute", 420, 700, 84)
    speed_m, _ = simulated_response("memory", 420, 700, 84)
    assert p == 420 and speed_c < 0.85 and speed_m == 1.0
    assert simulated_response("memory", 250, 700, 84)[0] < 1.0  # below the memory knee


def test_calibrate_in_process_restores_and_measures_the_response(tmp_path: Path) -> None:
    be = FileStateBackend.create(tmp_path / "g.json", 2, simulate=True)
    doc = calibrate(be, CalibrateOptions(1, [1.0, 0.7, 0.5], tmp_path / "caps", repeats=1),
                    simulated_workloads(be, 1, units=5))
    assert be.power_limit_w(1) == 700.0 and not list((tmp_path / "caps").glob("*.json"))
    comp = {p["cap_share"]: p for p in doc["workloads"]["compute"]}
    mem = {p["cap_share"]: p for p in doc["workloads"]["memory"]}
    assert comp[0.5]["energy_ratio"] < comp[0.7]["energy_ratio"] < 1.0
    assert comp[0.5]["runtime_ratio"] > 1.15  # the model: ~1.31 at 50%
    assert mem[0.7]["energy_ratio"] == pytest.approx(1.0)  # memory kernel draws 420 W < 490 W
    assert json.loads((tmp_path / "g.json").read_text())["gpus"][1]["set_count"] == 4  # 3 caps + restore
    resp = tmp_path / "resp.json"
    resp.write_text(json.dumps(doc))
    assert set(load_response(resp).curves) == {"compute", "memory", "mix"}


@pytest.mark.parametrize("workload", ["no-such-program-for-wattclass --size 8", "/nonexistent/bin/bench"])
def test_a_workload_command_that_cannot_start_is_refused_before_any_cap(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], workload: str) -> None:
    """``--workload 'CMD'`` runs without a shell; a CMD that is not there was a FileNotFoundError
    traceback (exit 1) at the first measured run, after the GPU had been capped and restored. Now
    one line naming it, exit 2, and the GPU's limit never touched."""
    gfile = tmp_path / "g.json"
    FileStateBackend.create(gfile, 1, simulate=True)
    out = tmp_path / "resp.json"
    rc = main(["calibrate", "--gpu", "0", "--backend", f"filestate:{gfile}", "--caps", "100,60",
               "--workload", workload, "--state-dir", str(tmp_path / "caps"), "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert f"--workload {workload.split()[0]!r}" in err and "Traceback" not in err
    assert json.loads(gfile.read_text())["gpus"][0]["set_count"] == 0 and not out.exists()


def test_dry_run_never_sets_a_limit(tmp_path: Path) -> None:
    be = FileStateBackend.create(tmp_path / "g.json", 1, simulate=True)
    doc = calibrate(be, CalibrateOptions(0, [1.0, 0.5], tmp_path / "caps", dry_run=True, repeats=1),
                    simulated_workloads(be, 0, units=2))
    assert doc["dry_run"] and json.loads((tmp_path / "g.json").read_text())["gpus"][0]["set_count"] == 0
    assert {p["limit_w"] for p in doc["raw"]} == {700.0}
    from wattclass.savings.calibrate import DryRunBackend, _set_cap

    with pytest.raises(AssertionError):
        DryRunBackend(be).set_power_limit_w(0, 300.0)
    with pytest.raises(AssertionError):
        _set_cap(be, be.gpus()[0], 300.0, "x", tmp_path / "caps", dry_run=True)


def _start_calibrate(tmp_path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    gfile = tmp_path / "g.json"
    FileStateBackend.create(gfile, 1, simulate=True)
    doc = json.loads(gfile.read_text())
    doc["gpus"][0]["sim"]["seconds_per_unit"] = 0.03  # ~0.6 s kernels: the signal lands mid-run
    gfile.write_text(json.dumps(doc))
    proc = subprocess.Popen([sys.executable, "-m", "wattclass.cli", "calibrate", "--gpu", "0", "--backend",
                             f"filestate:{gfile}", "--state-dir", str(tmp_path / "caps"), "--caps", "70,50",
                             "--repeats", "1", "--out", str(tmp_path / "r.json")], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # wait until the cap is set (record written, limit changed)
        if json.loads(gfile.read_text())["gpus"][0]["limit_w"] != 700.0:
            return proc, gfile
        time.sleep(0.05)
    proc.kill()
    pytest.fail("calibrate never set a cap")


def test_sigterm_restores_the_original_limit(tmp_path: Path) -> None:
    proc, gfile = _start_calibrate(tmp_path)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert b"SIGTERM" in err
    assert json.loads(gfile.read_text())["gpus"][0]["limit_w"] == 700.0
    assert not list((tmp_path / "caps").glob("*.json")) and not (tmp_path / "r.json").exists()


def test_more_signals_during_the_restore_do_not_cut_it_short(tmp_path: Path) -> None:
    """Review finding: every signal raised, also in the ``finally`` that restores the limit, so a
    second SIGTERM (or Ctrl-C) during the restore left the GPU capped while the message said
    "original limit restored" (4 of 16 runs with two signals 0.5-20 ms apart). A burst of signals
    now raises once; the restore runs to its end."""
    proc, gfile = _start_calibrate(tmp_path)
    for _ in range(60):
        if proc.poll() is not None:
            break
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.001)
    _, err = proc.communicate(timeout=60)
    # 130 from the first signal; or killed by a later one, after calibrate gave the process its
    # own handlers back (the default for SIGTERM: exit) -- either way after the restore
    assert proc.returncode in (130, -signal.SIGTERM), err
    assert json.loads(gfile.read_text())["gpus"][0]["limit_w"] == 700.0
    assert not list((tmp_path / "caps").glob("*.json"))


def test_the_signal_gate_raises_once_and_never_while_restoring() -> None:
    from wattclass.savings.calibrate import Interrupted, _SignalGate

    gate = _SignalGate()
    with pytest.raises(Interrupted, match="SIGINT"):
        gate.handler(signal.SIGINT, None)
    gate.handler(signal.SIGTERM, None)  # the second: nothing
    fresh = _SignalGate()
    fresh.restoring = True
    fresh.handler(signal.SIGTERM, None)  # during the restore: nothing
    assert not fresh.raised


def test_kill_9_leaves_a_record_that_reconcile_restores(tmp_path: Path) -> None:
    proc, gfile = _start_calibrate(tmp_path)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert json.loads(gfile.read_text())["gpus"][0]["limit_w"] < 700.0  # left capped...
    rec = json.loads(next((tmp_path / "caps").glob("*.json")).read_text())
    assert rec["previous_w"] == 700.0 and rec["job_id"] == f"calibrate:{proc.pid}"
    out = subprocess.run([sys.executable, "-m", "wattclass.cli", "plugin", "reconcile", "--backend",
                          f"filestate:{gfile}", "--state-dir", str(tmp_path / "caps"), "--jobs-dir",
                          str(tmp_path / "jobs"), "--log", str(tmp_path / "log")],
                         capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(gfile.read_text())["gpus"][0]["limit_w"] == 700.0  # ...until reconcile
    assert not list((tmp_path / "caps").glob("*.json"))


def test_simulate_reads_files_that_lack_gpm_columns(tmp_path: Path) -> None:
    _telemetry(tmp_path)
    f = next((tmp_path / "telemetry").rglob("*.parquet"))
    t = pq.read_table(f)
    old = t.filter(pa.compute.equal(t["job_id"], "j2")).drop_columns(
        ["sm_util_pct", "dram_bw_util_pct", "tensor_util_pct", "fp64_util_pct", "fp32_util_pct",
         "fp16_util_pct", "int_util_pct"])
    pq.write_table(t.filter(pa.compute.equal(t["job_id"], "j1")), f)
    pq.write_table(old, f.with_name("01.parquet"))
    j = simulate(tmp_path, parse_policy({"caps": {"memory": "60%"}})).jobs.set_index("job_id")
    assert j.loc["j1", "label"] == "memory" and j.loc["j2", "label"] == "unlabelled"
    assert np.isnan(j.loc["j2", "compute_act"]) and j.loc["j2", "energy_j"] == pytest.approx(690 * 3600)


def test_simulate_never_calls_memory_where_the_integer_pipe_was_not_measured(tmp_path: Path) -> None:
    # issue 13 round 7 (review): the simulation's own rule, like the engine's, needs every compute
    # pipe for "memory": without the integer pipe a pooling kernel looks memory-bound
    _telemetry(tmp_path)
    f = next((tmp_path / "telemetry").rglob("*.parquet"))
    t = pq.read_table(f)
    pq.write_table(t.drop_columns(["int_util_pct"]), f)
    j = simulate(tmp_path, parse_policy({"caps": {"memory": "60%"}})).jobs.set_index("job_id")
    assert j.loc["j1", "label"] == "unlabelled"  # memory with the pipe, unknown without it
    assert j.loc["j2", "label"] == "compute"  # a measured pipe above DRAM still says compute


def test_simulate_leaves_out_the_rows_the_nightly_rejects(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """One window of infinite energy, one of negative energy and one backwards window (a second file of
    j1): the nightly rejects them (classifier.validity); simulate used to sum them into inf kWh and
    negative GPU-hours, and wrote ``Infinity`` into its JSON."""
    _telemetry(tmp_path)
    clean = simulate(tmp_path, parse_policy({"caps": {"memory": "60%"}}))
    day = tmp_path / "telemetry" / "date=2026-11-20" / "host=n1"
    t = pq.read_table(day / "00.parquet").slice(0, 3).to_pandas()
    t["energy_j"] = [np.inf, -1e12, 6000.0]
    t.loc[2, "ts_end"] = t.loc[2, "ts_start"] - pd.Timedelta(days=3000)
    pq.write_table(pa.Table.from_pandas(t, preserve_index=False).cast(TELEMETRY_V1), day / "01.parquet")
    res = simulate(tmp_path, parse_policy({"caps": {"memory": "60%"}}))
    assert res.totals["rejected_rows"] == {"ts_end <= ts_start": 1, "energy_j negative, NaN or infinite": 2}
    for k in ("energy_kwh", "gpu_hours", "kwh_saved", "gpu_hours_added"):
        assert res.totals[k] == pytest.approx(clean.totals[k]), k
    j1 = res.jobs.set_index("job_id").loc["j1"]
    assert j1["n_windows"] == 360 and j1["gpu_hours"] == pytest.approx(1.0)
    assert clean.totals["rejected_rows"] == {}
    capsys.readouterr()
    pol = tmp_path / "p.toml"
    pol.write_text(POLICY)
    assert main(["simulate", "--data-root", str(tmp_path), "--policy", str(pol), "--json"]) == 0
    out = capsys.readouterr().out
    doc = json.loads(out, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    assert doc["totals"]["rejected_rows"]["ts_end <= ts_start"] == 1
    assert main(["simulate", "--data-root", str(tmp_path), "--policy", str(pol)]) == 0
    assert "3 impossible telemetry row(s) left out" in capsys.readouterr().out


def test_simulate_counts_a_window_in_two_files_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A day's file copied under another name (or a Prometheus import over the daemon's span):
    simulate summed both copies, so every kWh and kWh saved doubled, where the nightly counts each
    window once."""
    _telemetry(tmp_path)
    pol = parse_policy({"caps": {"memory": "60%"}})
    clean = simulate(tmp_path, pol)
    day = tmp_path / "telemetry" / "date=2026-11-20"
    shutil.copy(day / "host=n1" / "00.parquet", day / "host=n1" / "01-copy.parquet")
    res = simulate(tmp_path, pol)
    for k in ("energy_kwh", "gpu_hours", "kwh_saved", "gpu_hours_added"):
        assert res.totals[k] == pytest.approx(clean.totals[k]), k
    assert res.jobs.set_index("job_id").loc["j1", "n_windows"] == 360
    assert "720 duplicate telemetry window(s)" in caplog.text  # job windows only


#: One job's window row on an H200 (GPM: memory-bound unless a test says otherwise).
_ROW = {"host": "n1", "gpu_index": 0, "gpu_uuid": "GPU-a", "gpu_model": "NVIDIA H200", "job_id": "j1",
        "user": "ann", "power_limit_w": 700.0, "sm_util_pct": 60.0, "tensor_util_pct": 10.0,
        "fp64_util_pct": 0.0, "fp32_util_pct": 1.0, "fp16_util_pct": 0.0, "int_util_pct": 2.0}


def _simulated_job(tmp_path: Path, rows: list[dict[str, object]]) -> pd.Series:
    """Job j1 of ``rows`` (one day's file on host n1) as ``simulate`` sees it under a 60% memory cap."""
    t = conform(pa.Table.from_pandas(pd.DataFrame(rows), preserve_index=False), "test")
    out = tmp_path / "telemetry" / "date=2026-11-20" / "host=n1"
    out.mkdir(parents=True)
    pq.write_table(t.cast(TELEMETRY_V1), out / "00.parquet")
    return simulate(tmp_path, parse_policy({"caps": {"memory": "60%"}})).jobs.set_index("job_id").loc["j1"]


def test_simulate_weights_a_jobs_power_by_window_length(tmp_path: Path) -> None:
    """A job's power is its windows' power weighted by their length: a 0.1 s segment at a job edge
    (docs/design.md) is not worth a 10 s window. One job, 10 s at 600 W (max 605 W) and 0.1 s at
    100 W (max 105 W): need = (605 x 10 + 105 x 0.1) / 10.1 = 600.05 W, above a 60% cap of 420 W;
    the unweighted mean (355 W) said the cap never bites and the job saves nothing."""
    t0 = pd.Timestamp("2026-11-20T00:00:00Z")
    base = _ROW | {"dram_bw_util_pct": 80.0}
    rows = [base | {"ts_start": t0, "ts_end": t0 + pd.Timedelta(seconds=10), "energy_j": 6000.0,
                    "power_avg_w": 600.0, "power_max_w": 605.0},
            base | {"ts_start": t0 + pd.Timedelta(seconds=10), "ts_end": t0 + pd.Timedelta(seconds=10.1),
                    "energy_j": 100.0, "power_avg_w": 100.0, "power_max_w": 105.0}]
    j = _simulated_job(tmp_path, rows)
    assert j["label"] == "memory" and j["cap_w"] == 420.0
    assert j["need_w"] == pytest.approx((605 * 10 + 105 * 0.1) / 10.1)
    assert j["avg_w"] == pytest.approx((600 * 10 + 100 * 0.1) / 10.1)
    assert j["kwh_saved"] > 0


def test_a_cap_at_the_limit_the_job_ran_under_costs_no_time_and_saves_nothing(tmp_path: Path) -> None:
    """A compute-bound job on a 700 W H200 whose 1 s readings overshoot the limit (window maxima of
    725 W, as half the bundled H200 jobs' do): ``compute = "100%"`` is 700 W, the limit it already
    ran under, so the what-if must leave it alone, with the default model and with a site
    calibration. Both took the 725 W as the job's demand, and the cap "bit": 1.3 % more runtime
    by default, 5.5 % with the calibration below, and energy saved that no cap would save."""
    t0 = pd.Timestamp("2026-11-20T00:00:00Z")
    rows = [_ROW | {"ts_start": t0 + pd.Timedelta(seconds=10 * i),
                    "ts_end": t0 + pd.Timedelta(seconds=10 * i + 10), "energy_j": 6900.0,
                    "power_avg_w": 690.0, "power_max_w": 725.0, "sm_util_pct": 95.0,
                    "tensor_util_pct": 85.0, "dram_bw_util_pct": 20.0} for i in range(36)]
    t = conform(pa.Table.from_pandas(pd.DataFrame(rows), preserve_index=False), "test")
    out = tmp_path / "telemetry" / "date=2026-11-20" / "host=n1"
    out.mkdir(parents=True)
    pq.write_table(t.cast(TELEMETRY_V1), out / "00.parquet")
    policy = parse_policy({"caps": {"compute": "100%"}})
    resp = tmp_path / "r.json"
    resp.write_text(json.dumps({"version": 1, "gpu_model": "NVIDIA H200", "workloads": {
        "compute": [{"cap_share": 0.5, "runtime_ratio": 1.8, "energy_ratio": 0.8},
                    {"cap_share": 1.0, "runtime_ratio": 1.0, "energy_ratio": 1.0}]}}))
    for response in (None, load_response(resp)):
        j = simulate(tmp_path, policy, response=response).jobs.set_index("job_id").loc["j1"]
        assert j["label"] == "compute" and j["cap_w"] == 700.0 and j["need_w"] == pytest.approx(725.0)
        assert (j["runtime_ratio"], j["energy_ratio"]) == (1.0, 1.0), response
        assert j["kwh_saved"] == 0.0 and j["gpu_hours_added"] == 0.0
    # a cap below that limit still bites, measured against the limit (700 W), not the overshoot
    j = simulate(tmp_path, parse_policy({"caps": {"compute": "85%"}})).jobs.set_index("job_id").loc["j1"]
    assert j["cap_w"] == 595.0 and j["runtime_ratio"] > 1.0 and j["kwh_saved"] > 0


def test_simulate_scales_a_shared_gpus_power_not_the_jobs_share(tmp_path: Path) -> None:
    """On a shared GPU a row's power_avg_w is the job's share (telemetry/splitter.py) while the idle
    floor and the cap are the physical GPU's. Four jobs on a 600 W GPU (max 605 W): the job's row
    says 150 W. Capped at 420 W: k = (420 - 84) / (605 - 84), the GPU's power becomes
    84 + 516 k, a ratio of (84 + 516 k) / 600 = 0.6946 for every job on it. With 150 W against the
    GPU's 84 W floor the model said 0.8437 (and a job share under 84 W saved nothing and lost
    energy to the slowdown)."""
    t0 = pd.Timestamp("2026-11-20T00:00:00Z")
    rows = [_ROW | {"ts_start": t0 + pd.Timedelta(seconds=10 * i),
                    "ts_end": t0 + pd.Timedelta(seconds=10 * i + 10), "energy_j": 1500.0,
                    "power_avg_w": 150.0, "power_max_w": 605.0, "dram_bw_util_pct": 80.0,
                    "share_ratio": 0.25, "shared_jobs": 4, "share_basis": "util"} for i in range(6)]
    j = _simulated_job(tmp_path, rows)
    assert j["cap_w"] == 420.0 and j["avg_w"] == pytest.approx(600.0)
    k = (420 - 84) / (605 - 84)
    assert j["energy_ratio"] / j["runtime_ratio"] == pytest.approx((84 + 516 * k) / 600)
    assert j["kwh_saved"] == pytest.approx(9000 * (1 - j["energy_ratio"]) / 3.6e6)


def test_simulate_weights_a_jobs_gpm_activity_by_window_length(tmp_path: Path) -> None:
    """The GPM activity that sets how much of a job's runtime follows the clock is weighted by
    window length too (a review's remaining finding beside the power's): 10 s at 80% DRAM and a
    0.1 s edge at 0% give (80 x 10 + 0 x 0.1) / 10.1 = 79.2%, not the rows' mean of 40%."""
    t0 = pd.Timestamp("2026-11-20T00:00:00Z")
    base = _ROW | {"power_avg_w": 600.0, "power_max_w": 605.0}
    rows = [base | {"ts_start": t0, "ts_end": t0 + pd.Timedelta(seconds=10), "energy_j": 6000.0,
                    "dram_bw_util_pct": 80.0},
            base | {"ts_start": t0 + pd.Timedelta(seconds=10), "ts_end": t0 + pd.Timedelta(seconds=10.1),
                    "energy_j": 60.0, "dram_bw_util_pct": 0.0, "tensor_util_pct": 30.0}]
    j = _simulated_job(tmp_path, rows)
    assert j["dram_act"] == pytest.approx((80 * 10 + 0 * 0.1) / 10.1 / 100)
    assert j["compute_act"] == pytest.approx((10 * 10 + 30 * 0.1) / 10.1 / 100)


def test_simulate_counts_a_copy_in_another_host_folder_once(tmp_path: Path) -> None:
    """A day's file copied into a second folder (``host=n1.bak``): DuckDB's hive partitioning gave
    the copy's rows the folder's host, so the copies were never compared and every kWh doubled,
    where the nightly (and the report) count each window once."""
    _telemetry(tmp_path)
    pol = parse_policy({"caps": {"memory": "60%"}})
    clean = simulate(tmp_path, pol)
    day = tmp_path / "telemetry" / "date=2026-11-20"
    (day / "host=n1.bak").mkdir()
    shutil.copy(day / "host=n1" / "00.parquet", day / "host=n1.bak" / "00.parquet")
    res = simulate(tmp_path, pol)
    for k in ("energy_kwh", "gpu_hours", "kwh_saved", "gpu_hours_added"):
        assert res.totals[k] == pytest.approx(clean.totals[k]), k
    assert res.jobs.set_index("job_id").loc["j1", "n_windows"] == 360


def test_simulate_reads_only_the_files_it_checked(tmp_path: Path) -> None:
    """simulate checked the files the nightly reads (no ``.hidden`` names) but read a glob, whose
    ``*`` matches ``.x.parquet``: a hidden file's job was simulated (a job the nightly never
    saw) and a hidden symlink was read past the refusal of links."""
    _telemetry(tmp_path)
    host = tmp_path / "telemetry" / "date=2026-11-20" / "host=n1"
    t = pq.read_table(host / "00.parquet")
    other = t.set_column(t.schema.get_field_index("job_id"), "job_id",
                         pa.array(["j9"] * t.num_rows, pa.string()))
    pq.write_table(other, host / ".x.parquet")
    pq.write_table(other, tmp_path / "outside.parquet")
    (host / ".y.parquet").symlink_to(tmp_path / "outside.parquet")
    res = simulate(tmp_path, parse_policy({"caps": {"memory": "60%"}}))
    assert set(res.jobs["job_id"]) == {"j1", "j2"} and res.files == 1


def test_simulate_on_a_day_of_idle_gpus_says_there_are_no_job_windows(tmp_path: Path) -> None:
    """A day whose every window has no job (a quiet or maintenance day): a TypeError traceback from
    the empty per-file table, where the message says what is missing."""
    _telemetry(tmp_path)
    f = tmp_path / "telemetry" / "date=2026-11-20" / "host=n1" / "00.parquet"
    t = pq.read_table(f)
    pq.write_table(t.set_column(t.schema.get_field_index("job_id"), "job_id",
                                pa.nulls(t.num_rows, pa.string())), f)
    with pytest.raises(DataError, match="no job windows"):
        simulate(tmp_path, parse_policy({"caps": {"memory": "60%"}}))


@pytest.mark.parametrize(("model", "limit_w", "cap_w"), [
    ("NVIDIA A100-PCIE-40GB", 250.0, 150.0),  # a 250 W board, not the SXM's 400 W
    ("NVIDIA A100 80GB PCIe", 300.0, 180.0),
    ("NVIDIA H200 NVL", 600.0, 360.0),
    ("Tesla V100-SXM3-32GB", 350.0, 210.0),  # a limit seen above the table's: its own board
    ("NVIDIA A100-SXM4-80GB", 400.0, 240.0),
    ("NVIDIA A100-SXM4-80GB", 240.0, 240.0),  # already capped under enforce: the board's default
    ("Tesla V100-SXM2-32GB", 300.0, 180.0),
    ("Tesla V100-FHHL-16GB", 150.0, 90.0),  # a PCIe card of 150 W, not a 300 W SXM2 board
    ("Tesla V100-SXM2-32GB-LS", 250.0, 150.0),  # the 250 W low-power SXM2 board
])
def test_simulate_caps_a_share_of_the_boards_own_default_limit(tmp_path: Path, model: str,
                                                                limit_w: float, cap_w: float) -> None:
    """The default limit came from a name fragment ("A100" in any A100's name: 400 W), so a "60%"
    memory cap on an A100 PCIe of 250 W was simulated as 240 W (nearly no saving) where the Prolog
    sets 150 W; a PCIe or NVL board's default is the limit its telemetry shows."""
    t0 = pd.Timestamp("2026-11-20T00:00:00Z")
    p = limit_w * 0.9
    rows = [_ROW | {"gpu_model": model, "power_limit_w": limit_w, "power_avg_w": p, "power_max_w": p,
                    "energy_j": p * 10, "dram_bw_util_pct": 80.0,
                    "ts_start": t0 + pd.Timedelta(seconds=10 * i),
                    "ts_end": t0 + pd.Timedelta(seconds=10 * (i + 1))} for i in range(6)]
    j = _simulated_job(tmp_path, rows)
    assert j["label"] == "memory" and j["cap_w"] == pytest.approx(cap_w)


def test_simulate_and_report_policy_leave_out_an_unreadable_file_by_name(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A file cut short (a copy interrupted) failed the whole what-if with DuckDB's error and its
    SQL, and with it ``wattclass report --policy``, where the nightly, the report and ``job``
    leave that file out and name it."""
    _telemetry(tmp_path)
    pol = parse_policy({"caps": {"memory": "60%"}})
    clean = simulate(tmp_path, pol)
    host = tmp_path / "telemetry" / "date=2026-11-20" / "host=n1"
    data = (host / "00.parquet").read_bytes()
    (host / "01.parquet").write_bytes(data[: len(data) // 2])
    (host / "02.parquet").write_bytes(b"")
    res = simulate(tmp_path, pol)
    assert res.totals["energy_kwh"] == pytest.approx(clean.totals["energy_kwh"]) and res.files == 1
    assert sorted(Path(f).name for f in res.totals["skipped_files"]) == ["01.parquet", "02.parquet"]
    policy = tmp_path / "p.toml"
    policy.write_text(POLICY)
    capsys.readouterr()
    assert main(["simulate", "--data-root", str(tmp_path), "--policy", str(policy)]) == 0
    assert "2 unreadable telemetry file(s) left out" in capsys.readouterr().out
    out = tmp_path / "r.html"
    assert main(["report", "--data-root", str(tmp_path), "--policy", str(policy), "--out", str(out)]) == 0
    (host / "00.parquet").write_bytes(b"PAR1")
    with pytest.raises(DataError, match=r"no readable telemetry file \(3 unreadable"):
        simulate(tmp_path, pol)


def test_simulate_leaves_a_job_of_an_exempt_partition_uncapped(tmp_path: Path) -> None:
    """The policy's exempt partitions (the example exempts "debug") were ignored: the label store
    names each job's partition, but only users and accounts were exempted, so a debug job's saving
    and slowdown were counted although the Prolog never caps it."""
    _telemetry(tmp_path)
    store = tmp_path / "classifier" / "labels" / "date=2026-11-20"
    store.mkdir(parents=True)
    pd.DataFrame({"job_id": ["j1", "j2"], "label": ["memory", "memory"], "user": ["ann", "bo"],
                  "account": ["phys", "phys"], "partition": ["debug", "gpu"]}
                 ).to_parquet(store / "labels.parquet")
    pol = parse_policy({"caps": {"memory": "60%"}, "exempt": {"partitions": ["debug"]}})
    j = simulate(tmp_path, pol).jobs.set_index("job_id")
    assert np.isnan(j.loc["j1", "cap_w"]) and j.loc["j1", "kwh_saved"] == 0.0
    assert j.loc["j2", "cap_w"] == 420.0 and j.loc["j2", "kwh_saved"] > 0


def test_simulate_reads_only_date_folders_named_as_dates(tmp_path: Path) -> None:
    """A day copied aside as date=2026-11-20.bak was read beside the real day (its windows with no
    day to be checked against), where the nightly reads only date=<its date>."""
    _telemetry(tmp_path)
    day = tmp_path / "telemetry" / "date=2026-11-20"
    shutil.copytree(day, day.with_name("date=2026-11-20.bak"))
    res = simulate(tmp_path, parse_policy({"caps": {"memory": "60%"}}))
    assert res.files == 1 and res.totals["energy_kwh"] == pytest.approx((600 + 690) / 1000)


def test_simulate_says_why_a_day_whose_every_row_is_rejected_has_no_job_windows(tmp_path: Path) -> None:
    """Every window a year off its date= day (a clock step): the error said only "no job windows"."""
    _telemetry(tmp_path)
    f = tmp_path / "telemetry" / "date=2026-11-20" / "host=n1" / "00.parquet"
    t = pq.read_table(f).to_pandas()
    for c in ("ts_start", "ts_end"):
        t[c] += pd.Timedelta(days=365)
    pq.write_table(pa.Table.from_pandas(t, preserve_index=False).cast(TELEMETRY_V1), f)
    with pytest.raises(DataError, match=r"no job windows in telemetry \(720 impossible row\(s\) left out.*"
                                        r"outside its date= partition's day: 720"):
        simulate(tmp_path, parse_policy({"caps": {"memory": "60%"}}))


@pytest.mark.parametrize(("cap", "model", "cap_w"), [
    ("20%", "NVIDIA H200", 200.0),  # 140 W asked; an H200's NVML minimum is 200 W
    ("120W", "NVIDIA A100-SXM4-80GB", 120.0),  # within an A100's 100-400 W
    ("60W", "NVIDIA A100-SXM4-80GB", 100.0),
    ("20%", "NVIDIA L40S", 70.0),  # a board without known min/max: not clamped, not guessed
])
def test_simulate_clamps_a_cap_to_the_boards_known_range_as_the_prolog_does(
        tmp_path: Path, cap: str, model: str, cap_w: float) -> None:
    """The Prolog clamps every cap to the GPU's NVML min/max; the what-if did not, so a "20%" memory
    cap on an H200 was simulated at 140 W, though the GPU never goes below 200 W: savings and
    slowdown of a cap that cannot be set (found by review). Boards of known limits
    (``caps.KNOWN_LIMITS_W``) are clamped; others are left as the policy says."""
    t0 = pd.Timestamp("2026-11-20T00:00:00Z")
    limit_w = 350.0 if "L40S" in model else (400.0 if "A100" in model else 700.0)
    p = limit_w * 0.9
    rows = [_ROW | {"gpu_model": model, "power_limit_w": limit_w, "power_avg_w": p, "power_max_w": p,
                    "energy_j": p * 10, "dram_bw_util_pct": 80.0,
                    "ts_start": t0 + pd.Timedelta(seconds=10 * i),
                    "ts_end": t0 + pd.Timedelta(seconds=10 * (i + 1))} for i in range(6)]
    t = conform(pa.Table.from_pandas(pd.DataFrame(rows), preserve_index=False), "test")
    out = tmp_path / "telemetry" / "date=2026-11-20" / "host=n1"
    out.mkdir(parents=True)
    pq.write_table(t.cast(TELEMETRY_V1), out / "00.parquet")
    j = simulate(tmp_path, parse_policy({"caps": {"memory": cap}})).jobs.set_index("job_id").loc["j1"]
    assert j["label"] == "memory" and j["cap_w"] == pytest.approx(cap_w)


def _shared_gpu_day(root: Path, labels: dict[str, str]) -> None:
    """Jobs j1 and j2 on one 600 W H200 for an hour, each with half its energy (a shared GPU:
    both rows carry the GPU's activity), labelled ``labels`` in the label store."""
    t0 = pd.Timestamp("2026-11-20T00:00:00Z")
    rows = [_ROW | {"job_id": job, "user": user, "ts_start": t0 + pd.Timedelta(seconds=10 * i),
                    "ts_end": t0 + pd.Timedelta(seconds=10 * i + 10), "energy_j": 3000.0,
                    "power_avg_w": 300.0, "power_max_w": 605.0, "dram_bw_util_pct": 80.0,
                    "share_ratio": 0.5, "shared_jobs": 2, "share_basis": "util"}
            for i in range(360) for job, user in (("j1", "ann"), ("j2", "bo"))]
    t = conform(pa.Table.from_pandas(pd.DataFrame(rows), preserve_index=False), "test")
    out = root / "telemetry" / "date=2026-11-20" / "host=n1"
    out.mkdir(parents=True)
    pq.write_table(t.cast(TELEMETRY_V1), out / "00.parquet")
    store = root / "classifier" / "labels" / "date=2026-11-20"
    store.mkdir(parents=True)
    pd.DataFrame({"job_id": list(labels), "label": list(labels.values())}
                 ).to_parquet(store / "labels.parquet")


def test_simulate_runs_a_shared_gpu_at_the_highest_cap_its_jobs_allow(tmp_path: Path) -> None:
    """Power limits exist per physical GPU: on one several jobs share, the Prolog enforces the
    highest cap any of them allows (docs/shared-gpus.md), and a neighbour without a cap holds the
    GPU at its limit. The what-if capped each job at its own label's cap: a memory-bound job
    sharing its H200 with a compute-bound one (100%) was simulated at 420 W, saving energy that no
    enforced limit would save (found by a fresh-eyes review of shared GPUs)."""
    _shared_gpu_day(tmp_path, {"j1": "memory", "j2": "compute"})
    res = simulate(tmp_path, parse_policy({"caps": {"memory": "60%", "compute": "100%"}}))
    j = res.jobs.set_index("job_id")
    assert j.loc["j1", "cap"] == "60%" and j.loc["j1", "cap_w"] == 700.0  # held at j2's 100%
    assert j.loc["j1", "kwh_saved"] == 0.0 and j.loc["j1", "gpu_hours_added"] == 0.0
    assert res.totals["caps_raised_by_neighbours"] == 1
    # a neighbour the policy leaves uncapped (no cap for its label) holds the GPU at its limit
    j = simulate(tmp_path, parse_policy({"caps": {"memory": "60%"}})).jobs.set_index("job_id")
    assert np.isnan(j.loc["j1", "cap_w"]) and j.loc["j1", "kwh_saved"] == 0.0
    # both memory-bound: the GPU runs at 60% and both save
    shutil.rmtree(tmp_path / "telemetry")
    shutil.rmtree(tmp_path / "classifier")
    _shared_gpu_day(tmp_path, {"j1": "memory", "j2": "memory"})
    res = simulate(tmp_path, parse_policy({"caps": {"memory": "60%", "compute": "100%"}}))
    j = res.jobs.set_index("job_id")
    assert list(j["cap_w"]) == [420.0, 420.0] and (j["kwh_saved"] > 0).all()
    assert res.totals["caps_raised_by_neighbours"] == 0


def test_a_report_with_a_policy_on_a_day_without_jobs_is_written_without_the_what_if(
        tmp_path: Path) -> None:
    """A quiet or maintenance day (every window without a job): ``wattclass report --policy``
    failed with exit 3 and wrote no report, because its what-if section's ``simulate`` found no
    job windows, while the same report without ``--policy`` was written (found by a fresh-eyes
    review of empty days). The page is written and says why the what-if is missing."""
    import html
    import re

    _telemetry(tmp_path)
    f = tmp_path / "telemetry" / "date=2026-11-20" / "host=n1" / "00.parquet"
    t = pq.read_table(f)
    pq.write_table(t.set_column(t.schema.get_field_index("job_id"), "job_id",
                                pa.nulls(t.num_rows, pa.string())), f)
    policy = tmp_path / "policy.toml"
    policy.write_text('[caps]\nmemory = "60%"\n')
    out = tmp_path / "r.html"
    assert main(["report", "--data-root", str(tmp_path), "--policy", str(policy), "--out", str(out)]) == 0
    text = html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", out.read_text())))
    assert "What-if not available: no job windows in telemetry on 2026-11-20" in text
