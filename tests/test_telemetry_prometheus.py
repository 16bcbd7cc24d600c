"""`wattclass telemetry import` against a real Prometheus holding dcgm-exporter series.

The bundled H200 recording is written as OpenMetrics with DCGM names, backfilled with promtool and
served by Debian's prometheus on 127.0.0.1. Several exporters share the TSDB, one per host: the
plain recording, one with missed scrapes, one whose energy counter restarts, one without the FP
pipes (dcgm-exporter's default counters) and one without the energy counter.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from free_ports import free_port
from prometheus_server import (
    HOST,
    Recorded,
    Variant,
    backfill,
    have_prometheus,
    openmetrics,
    prometheus,
    recorded,
)

from wattclass.classifier.engine import label_files_local
from wattclass.cli import main
from wattclass.schema import TELEMETRY_V1

pytestmark = pytest.mark.skipif(not have_prometheus(),
                                reason="needs prometheus and promtool (apt prometheus)")

ENERGY = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
NO_FP = ("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "DCGM_FI_PROF_PIPE_FP32_ACTIVE", "DCGM_FI_PROF_PIPE_FP16_ACTIVE")
GAP = range(662, 680)  # 18 missed scrapes in the middle of one job (5018)
RESET_AT = 400  # the counter restarts from 0 just after scrape RESET_AT - 1


def _reset(rec: Recorded) -> Recorded:
    e = list(rec.values[ENERGY])
    base = e[RESET_AT - 1]
    assert base is not None
    vals = {**rec.values, ENERGY: [x if i < RESET_AT else x - base for i, x in enumerate(e)]}  # type: ignore[operator]
    return dataclasses.replace(rec, values=vals)


@pytest.fixture(scope="module")
def rec(h200_raw_module: Path) -> Recorded:
    return recorded(h200_raw_module)


@pytest.fixture(scope="module")
def h200_raw_module() -> Path:
    return Path(__file__).resolve().parent.parent / "wattclass" / "data" / "h200" / "raw"


@pytest.fixture(scope="module")
def prom(rec: Recorded, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    d = tmp_path_factory.mktemp("prom")
    variants = [
        Variant(rec),
        Variant(rec, host="gap-node", uuid_suffix="-gap", keep=lambda i: i not in GAP),
        Variant(_reset(rec), host="reset-node", uuid_suffix="-reset"),
        Variant(rec, host="nofp-node", uuid_suffix="-nofp", drop=NO_FP),
        Variant(rec, host="noenergy-node", uuid_suffix="-noe", drop=(ENERGY,)),
    ]
    backfill(openmetrics(variants), d / "tsdb")
    with prometheus(d / "tsdb") as url:
        yield url


@pytest.fixture(scope="module")
def imported(prom: str, rec: Recorded, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("imported")
    # A chunk much shorter than the recording: the import stitches chunks.
    rc = main(["telemetry", "import", "--prometheus", prom, "--start", f"{rec.t[0] - 30:.3f}",
               "--end", f"{rec.t[-1] + 30:.3f}", "--data-root", str(root), "--chunk", "120"])
    assert rc == 0
    return root


def _read(root: Path, host: str) -> pd.DataFrame:
    files = sorted((root / "telemetry").glob(f"date=*/host={host}/*.parquet"))
    assert files, f"no Parquet for {host}"
    for f in files:
        assert pq.read_schema(f).remove_metadata().equals(TELEMETRY_V1.remove_metadata())
    return pd.concat([pq.read_table(f).to_pandas() for f in files], ignore_index=True)


def _expected_job_energy_j(rec: Recorded) -> dict[str, float]:
    """Counter deltas of consecutive scrapes, each to the job seen at the interval's start."""
    e = rec.values[ENERGY]
    out: dict[str, float] = defaultdict(float)
    for i in range(1, len(rec.t)):
        job = rec.job[i - 1]
        # The recording's one long gap (13 s between its parts) has no job at its start: the window
        # builder splits such a gap by time, so a job there would need the split modelled here.
        if rec.t[i] - rec.t[i - 1] > 2.5:
            assert job is None or job == rec.job[i]
        if job is not None:
            out[job] += (e[i] - e[i - 1]) / 1e3  # type: ignore[operator]
    return dict(out)


def _job_energy(df: pd.DataFrame) -> dict[str, float]:
    return {str(k): float(v) for k, v in df[df["job_id"].notna()].groupby("job_id")["energy_j"].sum().items()}


def test_per_job_energy_equals_the_recorded_counter_deltas(imported: Path, rec: Recorded) -> None:
    got = _job_energy(_read(imported, HOST))
    want = _expected_job_energy_j(rec)
    assert len(want) == 21 and set(got) == set(want)
    for job, j in want.items():
        assert got[job] == pytest.approx(j, abs=1e-6), job
    df = _read(imported, HOST)
    e = rec.values[ENERGY]
    assert df["energy_j"].sum() == pytest.approx((e[-1] - e[0]) / 1e3, abs=1e-6)  # type: ignore[operator]
    # Real gauges and GPM-equivalents made it through, in v1 units.
    assert df["power_avg_w"].max() > 500 and df["sm_clock_mhz"].max() == pytest.approx(1980, abs=1)
    assert df["sm_util_pct"].max() > 50 and df["fp64_util_pct"].notna().mean() > 0.9


def test_rule_labels_equal_the_nvml_replay_path(imported: Path, h200_raw_module: Path,
                                                tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "wattclass.cli", "telemetry", "run", "--backend",
                        f"replay:{h200_raw_module}", "--data-root", str(tmp_path), "--once", "--host", HOST],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    nvml_files = sorted((tmp_path / "telemetry").glob("date=*/host=*/*.parquet"))
    prom_files = sorted((imported / "telemetry").glob(f"date=*/host={HOST}/*.parquet"))
    nvml = label_files_local(nvml_files, None, source="rule").labels.set_index("job_id")
    prom = label_files_local(prom_files, None, source="rule").labels.set_index("job_id")
    assert len(nvml) == 21 and (nvml["source"] == "rule").all() and (prom["source"] == "rule").all()
    assert prom["label"].to_dict() == nvml["label"].to_dict()
    assert set(nvml["label"]) >= {"compute", "memory"}


def test_missed_scrapes_keep_the_energy_and_split_the_gap(imported: Path, rec: Recorded) -> None:
    df = _read(imported, "gap-node")
    e = rec.values[ENERGY]
    assert df["energy_j"].sum() == pytest.approx((e[-1] - e[0]) / 1e3, abs=1e-6)  # type: ignore[operator]
    # The gap's energy goes to the job that held the GPU on both sides of it.
    before, after = rec.job[GAP.start - 1], rec.job[GAP.stop]
    assert before is not None and before == after
    i0, i1 = GAP.start - 1, GAP.stop
    inside = sum((e[i] - e[i - 1]) / 1e3 for i in range(i0 + 1, i1 + 1))  # type: ignore[operator]
    assert inside > 1000  # the gap hides real energy
    assert _job_energy(df)[before] == pytest.approx(_expected_job_energy_j(rec)[before], abs=1e-6)
    # ... spread over the windows it covers, not lumped into one.
    t0, t1 = rec.t[i0], rec.t[i1]
    w = df[(df["ts_end"] > pd.Timestamp(t0, unit="s", tz="UTC"))
           & (df["ts_start"] < pd.Timestamp(t1, unit="s", tz="UTC"))]
    assert len(w) >= 2 and (w["energy_j"] > 0).all() and (w["job_id"] == before).all()


def test_counter_reset_counts_the_new_value(imported: Path, rec: Recorded) -> None:
    got = _job_energy(_read(imported, "reset-node"))
    want = _expected_job_energy_j(rec)
    assert set(got) == set(want)
    for job, j in want.items():
        assert got[job] == pytest.approx(j, abs=1e-6), job


def test_missing_fp_pipes_never_give_a_rule_memory_label(imported: Path) -> None:
    from wattclass.classifier import rules
    from wattclass.classifier.model import load_model

    full = label_files_local(sorted((imported / "telemetry").glob(f"date=*/host={HOST}/*.parquet")),
                             None, source="rule").labels.set_index("job_id")
    files = sorted((imported / "telemetry").glob("date=*/host=nofp-node/*.parquet"))
    df = _read(imported, "nofp-node")
    assert df["fp64_util_pct"].isna().all() and df["tensor_util_pct"].notna().any()
    model = load_model(Path(rules.__file__).parent / "models")
    got = label_files_local(files, model).labels.set_index("job_id")
    assert not ((got["source"] == "rule") & (got["label"] == "memory")).any()
    for job in full.index[full["label"] == "memory"]:
        assert got.loc[job, "source"].startswith("model")
        assert "lacked a compute pipe" in got.loc[job, "inputs"]


def test_missing_energy_counter_is_null_energy_and_reported(prom: str, rec: Recorded, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["telemetry", "import", "--prometheus", prom, "--start", f"{rec.t[0] - 30:.3f}",
               "--end", f"{rec.t[-1] + 30:.3f}", "--data-root", str(tmp_path), "--json"])
    assert rc == 0
    out = capsys.readouterr().out
    assert f"noenergy-node/{rec.uuid}-noe" in out and ENERGY in out
    assert "nofp-node" in out and "DCGM_FI_PROF_PIPE_FP64_ACTIVE" in out
    df = _read(tmp_path, "noenergy-node")
    assert df["energy_j"].isna().all() and df["power_max_w"].notna().all()


def test_prometheus_down_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    rc = main(["telemetry", "import", "--prometheus", url, "--start", "2026-11-29T00:00Z",
               "--end", "2026-11-29T01:00Z", "--data-root", str(tmp_path)])
    assert rc == 3
    err = capsys.readouterr().err
    assert f"Prometheus at {url} is not reachable" in err
    assert not (tmp_path / "telemetry").exists()


@pytest.mark.parametrize(("option", "value"), [("--chunk", "0"), ("--chunk", "-3600"), ("--period", "nan"),
                                               ("--period", "inf"), ("--chunk", "inf")])
def test_a_chunk_or_period_that_is_not_positive_is_refused_before_asking_prometheus(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, value: str) -> None:
    """``--chunk 0`` fetched the same empty span forever from a Prometheus that answers (``--chunk``
    negative walked backwards, ``--period nan`` passed the check, ``--period inf`` too): refused first,
    naming it, exit 2.
    The server here is down, so without the check the import said "not reachable" (exit 3)."""
    url = f"http://127.0.0.1:{free_port()}"
    rc = main(["telemetry", "import", "--prometheus", url, "--start", "2026-11-29T00:00Z",
               "--end", "2026-11-29T01:00Z", "--data-root", str(tmp_path), option, value])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert f"{option} must be positive" in err and "not reachable" not in err


def test_empty_range_and_bad_times_name_the_problem(prom: str, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["telemetry", "import", "--prometheus", prom, "--start", "2020-01-01T00:00Z",
                 "--end", "2020-01-01T01:00Z", "--data-root", str(tmp_path)]) == 3
    assert "no DCGM series" in capsys.readouterr().err
    assert main(["telemetry", "import", "--prometheus", prom, "--start", "yesterday",
                 "--end", "2020-01-01T01:00Z", "--data-root", str(tmp_path)]) == 2
    assert "--start 'yesterday'" in capsys.readouterr().err


def test_shipped_counters_file_lists_every_field_the_import_reads() -> None:
    from wattclass.telemetry.prometheus import mapping

    csv = Path(__file__).resolve().parent.parent / "deploy" / "dcgm-exporter-counters.csv"
    rows = [ln.split(",") for ln in csv.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
    fields = {r[0].strip(): r[1].strip() for r in rows}
    assert all(len(r) >= 3 and r[1].strip() in ("gauge", "counter") for r in rows)
    # every field but the older duplicate name of the clock-event reasons
    assert set(mapping.ALL_FIELDS) - {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"} <= set(fields)
    assert fields[ENERGY] == "counter"
