"""The daily report on real H200 telemetry: numbers, estimates, missing pieces, self-containment."""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest

from wattclass.cli import main
from wattclass.errors import DataError
from wattclass.report.build import normalise_labels, read_table_file, render_report
from wattclass.report.estimates import (
    attach_labels,
    by_label,
    estimate_savings,
    estimated_tflops,
    rule_job_labels,
)

REPO = Path(__file__).resolve().parent.parent
JOBS_CSV = REPO / "wattclass" / "data" / "h200" / "jobs.csv"
IMG_SRC = re.compile(r'<img alt="[^"]*" src="data:image/png;base64,([A-Za-z0-9+/=]+)">')
#: The classifier's metric names (classifier/model.py ``cross_validate``).
METRICS = {
    "accuracy": 0.875,
    "ece": 0.041,
    "labels": ["idle", "compute", "memory", "mixed"],
    "confusion": [[4, 0, 0, 0], [0, 6, 1, 0], [0, 0, 9, 1], [0, 0, 0, 1]],
}


@pytest.fixture
def windows(h200_telemetry: Path) -> pd.DataFrame:
    return pd.read_parquet(h200_telemetry)


@pytest.fixture
def truth() -> pd.DataFrame:
    return normalise_labels(read_table_file(JOBS_CSV, "labels"), str(JOBS_CSV), "truth")


@pytest.fixture
def data_root(tmp_path: Path, h200_telemetry: Path) -> Path:
    d = tmp_path / "root" / "telemetry" / "date=2026-11-29" / "host=gpu-h200-03"
    d.mkdir(parents=True)
    shutil.copy(h200_telemetry, d / "part-0.parquet")
    return tmp_path / "root"


def _pngs(page: str) -> list[bytes]:
    return [base64.b64decode(m) for m in IMG_SRC.findall(page)]


def test_fallback_rule_reproduces_the_recorded_truth(windows: pd.DataFrame, truth: pd.DataFrame) -> None:
    got = rule_job_labels(windows).set_index("job_id")["label"]
    want = truth.set_index("job_id")["label"]
    assert got.reindex(want.index).tolist() == want.tolist()


def test_energy_by_label_adds_up_to_the_measured_total(windows: pd.DataFrame, truth: pd.DataFrame) -> None:
    t = by_label(attach_labels(windows, truth))
    assert t["energy_kwh"].sum() == pytest.approx(windows["energy_j"].sum() / 3.6e6)
    mem_jobs = truth.loc[truth["label"] == "memory", "job_id"]
    mem_j = windows.loc[windows["job_id"].isin(mem_jobs), "energy_j"].sum()
    assert t.loc["memory", "energy_kwh"] == pytest.approx(mem_j / 3.6e6)
    # measured: memory-bound jobs on the H200 still draw hundreds of watts per GPU-hour
    assert 0.4 < t.loc["memory", "kwh_per_gpu_hour"] < 0.7


def test_tflops_estimate_is_activity_times_peak(windows: pd.DataFrame) -> None:
    row = windows[windows["job_id"] == "5002"].iloc[[1]]
    want = (
        row["tensor_util_pct"] / 100 * 989.5
        + row["fp64_util_pct"] / 100 * 34.0
        + row["fp32_util_pct"] / 100 * 67.0
        + row["fp16_util_pct"] / 100 * 134.0
    )
    assert estimated_tflops(row).iloc[0] == pytest.approx(float(want.iloc[0]), rel=1e-6)
    assert estimated_tflops(row.assign(sm_util_pct=None)).isna().all()


def test_tflops_estimate_uses_each_boards_own_peaks_and_never_guesses(windows: pd.DataFrame) -> None:
    """An A100's pipes peak at a third of an H200's; a board the table does not know (a PCIe
    card, a newer GPU, no name) gets no estimate rather than another board's figures."""
    row = windows[windows["job_id"] == "5002"].iloc[[1]]
    h200 = float(estimated_tflops(row).iloc[0])
    a100 = float(estimated_tflops(row.assign(gpu_model="NVIDIA A100-SXM4-80GB")).iloc[0])
    want = float((row["tensor_util_pct"] / 100 * 312.0 + row["fp64_util_pct"] / 100 * 9.7
                  + row["fp32_util_pct"] / 100 * 19.5 + row["fp16_util_pct"] / 100 * 78.0).iloc[0])
    assert a100 == pytest.approx(want, rel=1e-6) and a100 < h200 / 2
    for model in ("NVIDIA H100 PCIe", "NVIDIA A100 80GB PCIe", "NVIDIA B300", None, ""):
        assert estimated_tflops(row.assign(gpu_model=model)).isna().all(), model


def _win(job: str, power: float, label: str, seconds: int = 10) -> dict[str, object]:
    t = pd.Timestamp("2026-01-01", tz="UTC")
    return {
        "ts_start": t,
        "ts_end": t + pd.Timedelta(seconds=seconds),
        "job_id": job,
        "label": label,
        "energy_j": power * seconds,
        "power_avg_w": power,
        "power_limit_w": 700.0,
    }


def test_savings_model_clips_memory_power_and_leaves_compute_alone() -> None:
    w = pd.DataFrame([_win("1", 700.0, "memory"), _win("2", 300.0, "memory"), _win("3", 700.0, "compute")])
    s = estimate_savings(w, {"memory": "60%", "compute": "100%"}, slowdown=0.07)
    # 700 W -> 420 W for 10 s saves 2800 J; the 300 W window is already under the cap
    assert s.table.loc["memory", "saved_kwh"] == pytest.approx(2800 / 3.6e6)
    assert s.table.loc["compute", "saved_kwh"] == 0.0
    assert s.table.loc["memory", "saved_kwh_slow"] == pytest.approx((10000 - 7200 * 1.07) / 3.6e6)
    watts = estimate_savings(w, {"memory": "500"}).table.loc["memory", "saved_kwh"]
    assert watts == pytest.approx(2000 / 3.6e6)


def test_full_report_has_every_section_and_real_pngs(windows: pd.DataFrame, truth: pd.DataFrame) -> None:
    decisions = pd.DataFrame(
        {
            "job_id": ["9001", "9002", "9003"],
            "label": ["memory", "compute", "memory"],
            "status": ["shadow", "none", "shadow"],
            "reason": ["shadow", "low_confidence", "shadow"],
            "cap": ["60%", None, "60%"],
        }
    )
    page = render_report(windows, truth, METRICS, decisions, title="t")
    for heading in (
        "Where the energy went",
        "Power per GPU over time",
        "Estimated useful work per energy",
        "Model: held-out accuracy",
        "Policy decisions",
        "Estimated energy saved",
    ):
        assert heading in page
    assert "not available" not in page
    pngs = _pngs(page)
    assert len(pngs) == 6 == page.count("<img ")
    for png in pngs:
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
        assert width > 300 and height > 150
    assert "0.875" in page and "Estimate" in page and "989.5" in page
    assert "shadow: cap 60%" in page and "none: low_confidence" in page


def test_missing_pieces_are_notes_not_crashes(windows: pd.DataFrame) -> None:
    page = render_report(windows)  # no labels, no model, no decisions
    assert page.count("not available") == 2
    assert "computed here with the GPM rule of wattclass.classifier.rules" in page
    no_gpm = windows.assign(**{c: None for c in ("sm_util_pct", "tensor_util_pct", "dram_bw_util_pct")})
    page = render_report(no_gpm, rule_job_labels(windows))
    assert "Useful work per energy: not available" in page


def test_user_strings_are_escaped(windows: pd.DataFrame, truth: pd.DataFrame) -> None:
    evil = windows.assign(user='<script>alert("x")</script>')
    page = render_report(evil, truth)
    assert "<script>" not in page and "&lt;script&gt;" in page


def test_cli_writes_one_self_contained_file(data_root: Path, tmp_path: Path) -> None:
    from wattclass.classifier.store import ModelRegistry

    (data_root / "decisions.csv").write_text(
        "job_id,label,status,reason,cap\n1,memory,shadow,shadow,60%\n2,compute,none,low_confidence,\n"
    )
    current = ModelRegistry(data_root).index()["current"]  # seeded with the packaged model
    out = tmp_path / "r.html"
    rc = main(
        [
            "report",
            "--data-root",
            str(data_root),
            "--out",
            str(out),
            "--labels",
            str(JOBS_CSV),
            "--label-column",
            "truth",
        ]
    )
    assert rc == 0
    page = out.read_text()
    assert len(_pngs(page)) == page.count("<img ") == 6
    assert not re.search(r'(src|href)="(?!data:)', page), "no external assets"
    assert "<script" not in page
    assert str(data_root / "decisions.csv") in page and "registry.json" in page
    assert f"model {current}" in page and "Confusion matrix" in page
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp leftovers


def test_cli_bad_inputs_name_the_problem(
    data_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "r.html"
    assert main(["report", "--data-root", str(data_root), "--date", "29/11/2026", "--out", str(out)]) == 2
    assert "--date" in capsys.readouterr().err
    assert main(["report", "--data-root", str(data_root), "--date", "2026-11-30", "--out", str(out)]) == 3
    assert "2026-11-29" in capsys.readouterr().err
    bad = tmp_path / "labels.csv"
    bad.write_text("job_id,klass\n5001,compute\n")
    assert main(["report", "--data-root", str(data_root), "--labels", str(bad), "--out", str(out)]) == 3
    assert "labels.csv: labels are missing column label" in capsys.readouterr().err
    assert not out.exists()


def test_metrics_come_from_the_model_in_use_and_a_rejected_candidate_is_said(tmp_path: Path) -> None:
    from wattclass.report.build import read_model_metrics

    reg = tmp_path / "registry.json"
    reg.write_text(json.dumps({"current": "a", "versions": [
        {"version": "a", "metrics": METRICS, "gate": None},
        {"version": "b", "metrics": {**METRICS, "accuracy": 0.99},
         "gate": {"candidate_accuracy": 0.8, "incumbent_accuracy": 0.9, "new_jobs": 12}},
    ]}))
    m = read_model_metrics(reg)
    assert m["version"] == "a" and m["accuracy"] == 0.875 and m["rejected"]["version"] == "b"
    reg.write_text(json.dumps({"current": "zz", "versions": []}))
    with pytest.raises(DataError, match=r"registry\.json: registry's current model 'zz'"):
        read_model_metrics(reg)


def test_report_on_the_demo_cluster_day(tmp_path: Path, h200_raw: Path) -> None:
    """Windows made from the synthetic cluster (10 s means) give a report with many GPUs and jobs."""
    from wattclass.demo.cluster import ClusterSpec, build_cluster

    build_cluster(h200_raw, tmp_path, ClusterSpec(nodes=2, gpus_per_node=2, span_s=1800, job_max_s=300))
    rows = []
    for caps in sorted((tmp_path / "nodes").glob("*/*_caps.json")):
        s = pd.read_parquet(caps.with_name(caps.name.replace("_caps.json", "_samples_1hz.parquet")))
        runs = pd.read_csv(
            caps.with_name(caps.name.replace("_caps.json", "_runs.csv")), dtype={"job_id": str}
        )
        iv = pd.IntervalIndex.from_arrays(runs["start"], runs["end"], closed="both")
        pos = iv.get_indexer(s["ts"])
        s["job_id"] = [runs["job_id"].iloc[p] if p >= 0 else None for p in pos]
        s["win"] = (s["ts"] // 10) * 10
        for (win, job), g in s.groupby(["win", s["job_id"].fillna("")]):
            rows.append(
                {
                    "ts_start": dt.datetime.fromtimestamp(win, dt.UTC),
                    "ts_end": dt.datetime.fromtimestamp(win + len(g), dt.UTC),
                    "host": caps.parent.name,
                    "gpu_index": int(caps.name[3]),
                    "gpu_uuid": caps.name,
                    "gpu_model": "NVIDIA H200",  # recorded on an H200: its peaks weigh the work estimate
                    "job_id": job or None,
                    "user": None,
                    "energy_j": g["energy_mj"].diff().sum() / 1e3,
                    "power_avg_w": g["power_mw"].mean() / 1e3,
                    "power_limit_w": 700.0,
                    "sm_util_pct": g["gpm_sm_util"].mean(),
                    "tensor_util_pct": g["gpm_any_tensor_util"].mean(),
                    "dram_bw_util_pct": g["gpm_dram_bw_util"].mean(),
                    "fp64_util_pct": 0.0,
                    "fp32_util_pct": g["gpm_fp32_util"].mean(),
                    "fp16_util_pct": g["gpm_fp16_util"].mean(),
                }
            )
    page = render_report(pd.DataFrame(rows))
    assert "4 GPU(s)" in page and "2 node(s)" in page
    assert len(_pngs(page)) == 4  # no model and no decisions: two notes instead


def test_a_label_file_with_a_label_the_report_does_not_know_is_refused_by_name(
        data_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A label other than compute/memory/mixed/idle ("bogus", a class of another tool) was kept as a
    label of its own: its jobs got no cap in the savings estimate and their energy left its total
    without a word. Case and blanks are not a difference ("Memory " is memory)."""
    out = tmp_path / "r.html"
    labels = tmp_path / "labels.csv"
    labels.write_text("job_id,label\n5001,compute\n5003,bogus\n")
    assert main(["report", "--data-root", str(data_root), "--labels", str(labels), "--out", str(out)]) == 3
    err = capsys.readouterr().err
    assert "labels.csv: label 'bogus' of job 5003" in err and not out.exists()
    labels.write_text("job_id,label\n5001,Compute\n5003, Memory \n")
    got = normalise_labels(read_table_file(labels, "labels"), str(labels)).set_index("job_id")["label"]
    assert got.to_dict() == {"5001": "compute", "5003": "memory"}


def test_a_date_folder_whose_name_is_no_date_is_not_the_newest_day(
        data_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A copy kept aside as date=2026-11-29.bak sorted after the real day: the report took it for
    the most recent day and died in a ValueError traceback on its name."""
    day = data_root / "telemetry" / "date=2026-11-29"
    shutil.copytree(day, day.with_name("date=2026-11-29.bak"))
    out = tmp_path / "r.html"
    assert main(["report", "--data-root", str(data_root), "--out", str(out)]) == 0
    assert "date=2026-11-29 (1 files)" in out.read_text()


def test_a_response_file_without_a_policy_is_refused(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """``--response F`` (a site calibration) feeds only the what-if section, which runs only with
    ``--policy``: without it the file was read by nothing and the report said nothing about it."""
    out = tmp_path / "r.html"
    rc = main(["report", "--data-root", str(tmp_path), "--response", str(tmp_path / "resp.json"),
               "--out", str(out)])
    assert rc == 2
    assert "--response" in capsys.readouterr().err and not out.exists()
