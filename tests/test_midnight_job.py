"""A job that runs across midnight: its windows sit in two ``date=`` partitions, so two nights
label it (each on its own day's windows) and the label store holds a row of it for each night.

Found by review (data the project was not developed on): the label table counted such a job as
two jobs (two votes, ``n_jobs`` 2), and ``wattclass job`` read the telemetry of the newest
night's row only, so its energy and GPU-hours were those of the part after midnight.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import H200_HOST

from wattclass.cli import main
from wattclass.labeltable import read_label_table

JOB = "5003"
DAYS = ("2026-11-29", "2026-11-30")


@pytest.fixture
def two_nights(h200_telemetry: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """The bundled day moved so that job 5003's third window starts at midnight, filed by each
    window's start day as the daemon files it, and the nightly run on both days."""
    src = pq.read_table(h200_telemetry)
    w = src.to_pandas()
    j = w[w["job_id"] == JOB].sort_values("ts_start")
    shift = pd.Timestamp(f"{DAYS[1]}T00:00:00Z") - j["ts_start"].iloc[2]
    t = src
    for c in ("ts_start", "ts_end"):
        t = t.set_column(t.column_names.index(c), c, pa.array(w[c] + shift, t.schema.field(c).type))
    day = (w["ts_start"] + shift).dt.strftime("%Y-%m-%d").to_numpy()
    root = tmp_path / "root"
    for d in DAYS:
        assert (day == d).any()
        p = root / "telemetry" / f"date={d}" / f"host={H200_HOST}"
        p.mkdir(parents=True)
        pq.write_table(t.filter(pa.array(day == d)), p / "part-0.parquet")
    jobs = pd.read_csv(h200_telemetry.parent / "jobs.csv", dtype={"job_id": str})
    jobs["start"] += shift.total_seconds()
    jobs["end"] += shift.total_seconds()
    jobs["name"], jobs["account"], jobs["partition"] = jobs["workload"], "ml", "gpu"
    jf = tmp_path / "jobs.csv"
    jobs[["job_id", "name", "user", "account", "partition", "start", "end"]].to_csv(jf, index=False)
    for d in DAYS:
        assert main(["nightly", "--data-root", str(root), "--date", d, "--no-retrain", "--jobs-file", str(jf),
                     "--table-out", str(tmp_path / "table.lua"), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["status"] == "ok"
    days = sorted((root / "classifier" / "labels").glob("date=*/labels.parquet"))
    store = [pd.read_parquet(p) for p in days]
    assert sum(int((s["job_id"] == JOB).sum()) for s in store) == 2  # one row per night
    return root


def test_a_job_labelled_on_two_nights_is_one_vote_in_the_label_table(two_nights: Path) -> None:
    table = read_label_table(two_nights.parent / "table.lua")
    jobs = pd.read_csv(two_nights.parent / "jobs.csv", dtype={"job_id": str}).set_index("job_id")
    user, name = jobs.loc[JOB, "user"], jobs.loc[JOB, "name"]
    assert table["by_user_name"][user][name]["n"] == 1
    assert table["by_user"][user]["n"] == int((jobs["user"] == user).sum())

def test_job_command_reads_both_days_of_a_job_that_ran_across_midnight(
        two_nights: Path, h200_telemetry: Path, capsys: pytest.CaptureFixture[str]) -> None:
    w = pd.read_parquet(h200_telemetry)
    j = w[w["job_id"] == JOB]
    assert main(["job", JOB, "--data-root", str(two_nights), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["energy_kwh"] == pytest.approx(j["energy_j"].sum() / 3.6e6, rel=1e-9)
    secs = (j["ts_end"] - j["ts_start"]).dt.total_seconds().sum()
    assert d["gpu_hours"] == pytest.approx(secs / 3600, rel=1e-9)
    assert d["start"] < f"{DAYS[1]}T00:00:00"
