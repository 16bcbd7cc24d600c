"""End to end: `wattclass telemetry run --backend replay:... --once` on the real H200 recording."""

from __future__ import annotations

import glob
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from wattclass.schema import TELEMETRY_V1, schema_version_of


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "wattclass.cli", *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    raw = Path(__file__).resolve().parent.parent / "wattclass" / "data" / "h200" / "raw"
    root = tmp_path_factory.mktemp("replay")
    r = run_cli(
        "telemetry",
        "run",
        "--backend",
        f"replay:{raw}",
        "--data-root",
        str(root),
        "--once",
        "--host",
        "gpu-h200-03",
    )
    assert r.returncode == 0, r.stderr
    return root


def _files(root: Path) -> list[Path]:
    return sorted(Path(p) for p in glob.glob(f"{root}/telemetry/date=*/host=gpu-h200-03/*.parquet"))


def _read(root: Path) -> pd.DataFrame:
    return pd.concat([pq.read_table(f).to_pandas() for f in _files(root)], ignore_index=True)


def test_parquet_in_v1_schema(replayed: Path) -> None:
    files = _files(replayed)
    assert files, "no Parquet written"
    for f in files:
        assert pq.read_schema(f).remove_metadata().equals(TELEMETRY_V1.remove_metadata())
        assert schema_version_of(f) == "1"
        assert pq.ParquetFile(f).metadata.row_group(0).column(0).compression == "ZSTD"
    # No temporary files and no WAL left behind after a clean exit.
    assert not [p for p in replayed.rglob(".*") if p.is_file()]
    assert not list((replayed / "wal").rglob("wal-*.log"))


def test_energy_equals_counter_delta(replayed: Path, h200_raw: Path) -> None:
    s = pd.concat([pd.read_parquet(f) for f in sorted(h200_raw.glob("*_samples_1hz.parquet"))]).sort_values(
        "ts"
    )
    delta_j = (s.energy_mj.iloc[-1] - s.energy_mj.iloc[0]) / 1e3
    total = _read(replayed).energy_j.sum()
    assert abs(total - delta_j) / delta_j < 0.005
    assert total == pytest.approx(delta_j, rel=1e-9)  # windows telescope exactly


def test_every_job_present_and_matches_reference(
    replayed: Path, h200_telemetry: Path, h200_raw: Path
) -> None:
    t = _read(replayed)
    ref = pd.read_parquet(h200_telemetry)
    jobs = sorted(t.job_id.dropna().unique())
    assert jobs == [str(j) for j in range(5001, 5022)]
    assert (t.groupby("job_id").size() >= 3).all()
    assert t.groupby("job_id").user.first().equals(ref.groupby("job_id").user.first())
    ours = t.groupby("job_id").energy_j.sum()
    # Against the counter differences of the intervals whose start poll saw the job (a job is
    # seen from its start to end + 0.5 s). The daemon reads the counter at window closes, not
    # at job changes, and splits a window's delta between its jobs by the 1 s average power of
    # each interval: within 0.5 % per job here (0.25 % measured; by instantaneous power it was
    # 4.6 %: docs/benchmarks.md, "Energy split at job changes").
    s = pd.concat([pd.read_parquet(f) for f in sorted(h200_raw.glob("*_samples_1hz.parquet"))])
    s = s.sort_values("ts", kind="stable").reset_index(drop=True)
    ts, e = s.ts.to_numpy(), s.energy_mj.to_numpy()
    runs = pd.concat([pd.read_csv(f) for f in sorted(h200_raw.glob("*_runs.csv"))], ignore_index=True)
    runs.index = [str(5001 + i) for i in range(len(runs))]
    abs_err_j = exact_sum_j = 0.0
    for job_id, r in runs.iterrows():
        start_polls = ((ts >= r.start) & (ts <= r.end + 0.5))[:-1].nonzero()[0]
        exact_j = (e[start_polls + 1] - e[start_polls]).sum() / 1e3
        assert ours[job_id] == pytest.approx(exact_j, rel=0.005), job_id
        abs_err_j += abs(ours[job_id] - exact_j)
        exact_sum_j += exact_j
    assert abs_err_j < 0.002 * exact_sum_j  # (the windows still telescope: test above)
    # Against the probe's own counter reading per run (start..end): within 2.5 %. (The second
    # before a job's process is first seen belongs to the GPU's previous owner, because the
    # split must sit at a counter reading; with a Prolog job file the job is seen before its
    # work starts. The reference windows in ``ref`` use the other convention.)
    assert ((ours / runs.energy_j - 1).abs() < 0.025).all()


def test_windows_aligned_and_bounded(replayed: Path) -> None:
    t = _read(replayed)
    start = t.ts_start.dt.as_unit("ms").astype("int64")
    end = t.ts_end.dt.as_unit("ms").astype("int64")
    assert (end > start).all()
    assert ((end - start) <= 10_000).all()
    # Full windows (no job change inside) sit exactly on the 10 s grid.
    full = (end - start) == 10_000
    assert full.sum() > 50
    assert ((start[full] % 10_000) == 0).all()
    # One row per GPU per window per job.
    assert not t.duplicated(["gpu_uuid", "ts_start", "job_id"]).any()


def test_inspect_json(replayed: Path) -> None:
    r = run_cli("telemetry", "inspect", str(replayed / "telemetry"), "--json")
    assert r.returncode == 0, r.stderr
    import json

    d = json.loads(r.stdout)
    assert len(d["jobs"]) == 21 and d["rows"] == len(_read(replayed))


def test_unwritable_data_root_is_a_clear_error(tmp_path: Path, h200_raw: Path) -> None:
    blocker = tmp_path / "afile"
    blocker.write_text("not a folder")
    bad = blocker / "root"
    r = run_cli("telemetry", "run", "--backend", f"replay:{h200_raw}", "--data-root", str(bad), "--once")
    assert r.returncode != 0
    assert str(bad) in r.stderr and "not writable" in r.stderr
    assert "Traceback" not in r.stderr


def test_bad_backend_spec(tmp_path: Path) -> None:
    r = run_cli(
        "telemetry",
        "run",
        "--backend",
        "replay:" + str(tmp_path / "nope"),
        "--data-root",
        str(tmp_path / "d"),
        "--once",
    )
    assert r.returncode == 3 and "nope" in r.stderr
