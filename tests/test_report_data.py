"""report.data (DuckDB aggregates) gives the numbers of report.estimates (window-level pandas,
the reference that states the assumptions), on the real H200 windows, and reads several days."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from wattclass.errors import DataError
from wattclass.report import data as report_data
from wattclass.report import estimates as est
from wattclass.report import fleetbins, peaks
from wattclass.report.build import load_inputs, render_report, telemetry_day_files


@pytest.fixture
def windows(h200_telemetry: Path) -> pd.DataFrame:
    return pd.read_parquet(h200_telemetry)


def test_aggregates_equal_the_window_level_reference(windows: pd.DataFrame) -> None:
    labels = est.rule_job_labels(windows)
    labels.loc[labels.index[:3], "label"] = "memory"  # some capped jobs whatever the recording holds
    caps = {"memory": "60%", "idle": "300W", "compute": "100%", "mixed": "85%"}
    agg = report_data.load(windows=windows, labels=labels, caps=caps)
    w = est.attach_labels(windows.assign(job_id=windows["job_id"].astype(object)), labels)
    pd.testing.assert_frame_equal(agg.by_label, est.by_label(w), check_names=False, rtol=1e-9)
    pd.testing.assert_frame_equal(agg.work_per_energy, est.work_per_energy(w), check_names=False, rtol=1e-9)
    ref = est.estimate_savings(w, caps)
    pd.testing.assert_frame_equal(agg.savings.table, ref.table, check_names=False, rtol=1e-9)
    assert agg.savings.saved_kwh == pytest.approx(ref.saved_kwh) and ref.saved_kwh > 0
    jobs = est.job_table(w, labels)
    cols = ["job_id", "n_windows", "energy_j", "gpu_hours", "label"]
    pd.testing.assert_frame_equal(agg.jobs[cols].reset_index(drop=True), jobs[cols], check_dtype=False)
    assert agg.n_windows == len(windows) and agg.n_gpus == windows["gpu_uuid"].nunique()


def test_rule_labels_without_a_store_match_the_reference(windows: pd.DataFrame) -> None:
    agg = report_data.load(windows=windows)
    ref = est.rule_job_labels(windows).set_index("job_id")["label"]
    got = agg.jobs.set_index("job_id")["label"]
    assert agg.labels_computed and (got.loc[ref.index] == ref).all()


def test_timeline_buckets_stay_bounded_over_a_long_span(windows: pd.DataFrame) -> None:
    # The same windows spread over 30 days: at most TIMELINE_POINTS buckets per GPU.
    spread = windows.copy()
    step = pd.to_timedelta(range(len(spread)), unit="h") * 6
    spread["ts_start"] = spread["ts_start"] + step
    spread["ts_end"] = spread["ts_end"] + step
    agg = report_data.load(windows=spread)
    assert agg.timeline.groupby(["host", "gpu_index"]).size().max() <= report_data.TIMELINE_POINTS
    assert set(agg.timeline["label"]) <= set(est.LABEL_ORDER)


def test_days_read_several_date_partitions(tmp_path: Path, h200_telemetry: Path) -> None:
    t = pd.read_parquet(h200_telemetry)
    for d in ("2026-11-01", "2026-11-02", "2026-11-03"):
        folder = tmp_path / "telemetry" / f"date={d}" / "host=n1"
        folder.mkdir(parents=True)
        t.to_parquet(folder / "00.parquet")
    files, day, read = telemetry_day_files(tmp_path, "2026-11-03", days=2)
    assert day == "2026-11-03" and read == ["2026-11-02", "2026-11-03"] and len(files) == 2
    inputs = load_inputs(tmp_path, "2026-11-03", days=30)
    assert len(inputs.files) == 3 and "2026-11-01..2026-11-03" in inputs.provenance["telemetry"]


def _fleet(windows: pd.DataFrame, n: int) -> pd.DataFrame:
    copies = []
    for i in range(n):
        c = windows.copy()
        c["host"] = f"node{i:03d}"
        c["gpu_uuid"] = c["gpu_uuid"] + f"-{i}"
        c["job_id"] = c["job_id"].where(c["job_id"].isna(), c["job_id"].astype(str) + f"{i:03d}")
        copies.append(c)
    return pd.concat(copies, ignore_index=True)


def test_fleet_bins_keep_every_joule_per_label(windows: pd.DataFrame) -> None:
    # Above max_gpus the report plots the fleet's energy per time bin: the bins add up to the
    # per-label energy, bins are whole windows long and stay about 288 over the span.
    big = _fleet(windows, 5)
    agg = report_data.load(windows=big, max_gpus=4)
    assert agg.n_gpus == 5 * windows["gpu_uuid"].nunique() and len(agg.fleet)
    per_label = agg.fleet.groupby("label")["energy_j"].sum() / 3.6e6
    pd.testing.assert_series_equal(per_label.sort_index(), agg.by_label["energy_kwh"].sort_index(),
                                   check_names=False, rtol=1e-9)
    assert agg.fleet["bin"].min() >= 0 and agg.fleet["bin"].max() <= 288
    assert agg.fleet_bin_s > 0
    small = report_data.load(windows=windows, max_gpus=16)
    assert small.fleet.empty  # few GPUs: the per-GPU strips, no fleet scan


def test_per_job_savings_add_up_to_the_savings_estimate(windows: pd.DataFrame) -> None:
    # The per-user and per-account tables sum jobs' saved_j: it must total the savings section.
    labels = est.rule_job_labels(windows)
    labels.loc[labels.index[:3], "label"] = "memory"
    agg = report_data.load(windows=windows, labels=labels)
    assert agg.savings.saved_kwh > 0
    assert agg.jobs["saved_j"].sum() / 3.6e6 == pytest.approx(agg.savings.saved_kwh, rel=1e-9)
    assert (agg.jobs.loc[~agg.jobs["label"].isin(est.CAPPED_LABELS), "saved_j"] == 0).all()


def test_report_cli_days_reads_the_span(tmp_path: Path, h200_telemetry: Path) -> None:
    from wattclass.cli import main

    t = pd.read_parquet(h200_telemetry)
    for d in ("2026-11-01", "2026-11-02"):
        folder = tmp_path / "telemetry" / f"date={d}" / "host=n1"
        folder.mkdir(parents=True)
        # each day's windows in that day (a window far outside its date= folder is left out)
        shift = pd.Timestamp(d, tz="UTC") - t["ts_start"].min().floor("D")
        t.assign(ts_start=t["ts_start"] + shift, ts_end=t["ts_end"] + shift).to_parquet(folder / "00.parquet")
    out = tmp_path / "r.html"
    assert main(["report", "--data-root", str(tmp_path), "--days", "2", "--out", str(out)]) == 0
    page = out.read_text()
    assert "date=2026-11-01..2026-11-02 (2 files)" in page
    assert main(["report", "--data-root", str(tmp_path), "--days", "0", "--out", str(out)]) == 2


def test_rule_fallback_leaves_a_job_with_an_unmeasured_pipe_unlabelled() -> None:
    # issue 13 round 7 (review): the report's own rule needs every compute pipe for "memory", like
    # the engine's: job "a" lacks the integer pipe (a pooling kernel would look memory-bound)
    nan = float("nan")
    rows = [{"job_id": j, "sm_util_pct": 90.0, "dram_bw_util_pct": 30.0, "tensor_util_pct": 2.0,
             "fp64_util_pct": 0.0, "fp32_util_pct": 1.0, "fp16_util_pct": 0.0, "int_util_pct": i}
            for j, i in (("a", nan), ("a", nan), ("b", 5.0), ("b", 5.0), ("c", 80.0), ("c", 80.0))]
    labels = est.rule_job_labels(pd.DataFrame(rows)).set_index("job_id")["label"].to_dict()
    assert labels == {"b": "memory", "c": "compute"}


def test_rule_fallback_leaves_a_job_with_a_window_without_gpm_unlabelled() -> None:
    # second review: the engine labels by the rule only a job whose every window has GPM
    # (labeling.decide); the report's fallback gave a label from the GPM windows alone
    nan = float("nan")
    gpm = {"sm_util_pct": 90.0, "dram_bw_util_pct": 30.0, "tensor_util_pct": 2.0, "fp64_util_pct": 0.0,
           "fp32_util_pct": 1.0, "fp16_util_pct": 0.0, "int_util_pct": 5.0}
    rows = [dict(gpm, job_id="a"), dict(gpm, job_id="a"), dict(gpm, job_id="b"),
            dict(gpm, job_id="b", sm_util_pct=nan, dram_bw_util_pct=nan)]
    labels = est.rule_job_labels(pd.DataFrame(rows)).set_index("job_id")["label"].to_dict()
    assert labels == {"a": "memory"}


def test_rows_the_nightly_rejects_are_left_out_and_counted(tmp_path: Path, h200_telemetry: Path) -> None:
    """A second file with an infinite energy, a backwards window and a 5 kW power: the nightly rejects
    them (classifier.validity); the report used to show inf kWh. Its numbers now equal the clean
    day's, and the page says how many windows it left out and why."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from wattclass.cli import main

    folder = tmp_path / "telemetry" / "date=2026-11-29" / "host=n1"  # the recording's day
    folder.mkdir(parents=True)
    t = pq.read_table(h200_telemetry)
    pq.write_table(t, folder / "00.parquet")
    clean = report_data.load(files=[folder / "00.parquet"])
    assert clean.rejected_rows == {}
    bad = t.slice(0, 3).to_pandas()
    bad["energy_j"] = [np.inf, 100.0, 100.0]
    bad.loc[1, "ts_end"] = bad.loc[1, "ts_start"] - pd.Timedelta(days=3000)
    bad.loc[2, "power_avg_w"] = 5000.0
    pq.write_table(pa.Table.from_pandas(bad, schema=t.schema, preserve_index=False), folder / "01.parquet")
    agg = report_data.load(files=sorted(folder.glob("*.parquet")))
    assert agg.rejected_rows == {"ts_end <= ts_start": 1, "energy_j negative, NaN or infinite": 1,
                                 "power above 3000 W": 1}
    pd.testing.assert_frame_equal(agg.by_label, clean.by_label, rtol=1e-9)
    assert np.isfinite(agg.by_label["energy_kwh"]).all() and agg.n_windows == clean.n_windows
    assert (agg.t0, agg.t1) == (clean.t0, clean.t1)  # the backwards window does not stretch the span
    assert agg.savings.saved_kwh == pytest.approx(clean.savings.saved_kwh)
    out = tmp_path / "r.html"
    assert main(["report", "--data-root", str(tmp_path), "--days", "1", "--out", str(out)]) == 0
    assert "impossible windows left out</b>: 3 (" in out.read_text()


def test_a_boundary_row_holding_a_polls_second_saves_nothing_under_a_higher_cap(
        windows: pd.DataFrame) -> None:
    """A row of 0.076 s holding its start poll's whole second (397 J, power_avg_w 397 W: the daemon
    gives a poll interval to the row its start poll lies in) under a 420 W memory cap saves
    nothing; the savings model scales the row's energy by min(1, cap / power), in the window-level
    reference and the report's SQL alike (cap x length said 367 J). A full row at 600 W under the
    same cap still saves 30%."""
    w = windows[windows["job_id"].notna()].head(2).copy()
    w["job_id"] = "b1"
    t0 = w["ts_start"].iloc[0]
    w["ts_start"] = [t0, t0 + pd.Timedelta(seconds=10)]
    w["ts_end"] = [t0 + pd.Timedelta(milliseconds=76), t0 + pd.Timedelta(seconds=20)]
    w["energy_j"] = [397.0, 6000.0]
    w["power_avg_w"] = [397.0, 600.0]
    w["power_max_w"] = [400.0, 610.0]
    w["power_limit_w"] = 700.0
    labels = pd.DataFrame({"job_id": ["b1"], "label": ["memory"]})
    caps = {"memory": "420W"}
    ww = est.attach_labels(w.assign(job_id=w["job_id"].astype(object)), labels)
    saved = est.window_saved_j(ww, caps)
    assert saved.tolist() == pytest.approx([0.0, 6000.0 * (1 - 420.0 / 600.0)])
    agg = report_data.load(windows=w, labels=labels, caps=caps)
    assert agg.savings.saved_kwh * 3.6e6 == pytest.approx(float(saved.sum()))
    assert est.estimate_savings(ww, caps).saved_kwh * 3.6e6 == pytest.approx(float(saved.sum()))


def test_a_window_in_two_files_is_counted_once(tmp_path: Path, h200_telemetry: Path) -> None:
    """A day's file copied under another name: the report summed both copies (twice the energy,
    the savings and the windows, and the rule's confidences as if each window were seen twice),
    where the nightly counts each window once; the page says how many copies it left out."""
    import shutil

    from wattclass.cli import main

    folder = tmp_path / "telemetry" / "date=2026-11-29" / "host=n1"
    folder.mkdir(parents=True)
    shutil.copy(h200_telemetry, folder / "00.parquet")
    clean = report_data.load(files=[folder / "00.parquet"])
    shutil.copy(h200_telemetry, folder / "01-copy.parquet")
    agg = report_data.load(files=sorted(folder.glob("*.parquet")))
    pd.testing.assert_frame_equal(agg.by_label, clean.by_label, rtol=1e-9)
    pd.testing.assert_frame_equal(agg.jobs, clean.jobs, rtol=1e-9)
    assert agg.n_windows == clean.n_windows and agg.duplicate_windows == clean.n_windows
    assert agg.savings.saved_kwh == pytest.approx(clean.savings.saved_kwh)
    assert len(agg.timeline) == len(clean.timeline)
    out = tmp_path / "r.html"
    assert main(["report", "--data-root", str(tmp_path), "--days", "1", "--out", str(out)]) == 0
    assert "duplicate windows counted once" in out.read_text()


@pytest.mark.parametrize("junk", [b"", b"not parquet\n", b"PAR1" + bytes(100) + b"PAR1"],
                         ids=["empty", "text", "bad footer"])
def test_an_unreadable_file_is_skipped_and_named_not_a_traceback(tmp_path: Path, h200_telemetry: Path,
                                                                 junk: bytes) -> None:
    """One file of the day that Parquet cannot read failed the whole report with DuckDB's
    traceback; the nightly skips such a file by name and labels the rest."""
    import shutil

    from wattclass.cli import main

    folder = tmp_path / "telemetry" / "date=2026-11-29" / "host=n1"
    folder.mkdir(parents=True)
    shutil.copy(h200_telemetry, folder / "00.parquet")
    clean = report_data.load(files=[folder / "00.parquet"])
    (folder / "01.parquet").write_bytes(junk)
    agg = report_data.load(files=sorted(folder.glob("*.parquet")))
    pd.testing.assert_frame_equal(agg.by_label, clean.by_label, rtol=1e-9)
    assert list(agg.skipped_files) == [str(folder / "01.parquet")]
    out = tmp_path / "r.html"
    assert main(["report", "--data-root", str(tmp_path), "--days", "1", "--out", str(out)]) == 0
    assert "unreadable files skipped" in out.read_text()
    (folder / "00.parquet").unlink()
    with pytest.raises(DataError, match=r"no readable telemetry file .*01\.parquet"):
        report_data.load(files=sorted(folder.glob("*.parquet")))


def _fleet_files(root: Path, windows: pd.DataFrame, hosts: int, spread: pd.Timedelta,
                 start: str = "2026-11-29 00:10") -> list[Path]:
    """``hosts`` copies of the windows as one day's files (date=2026-11-29/host=H), the first
    window at ``start``, each moved later by its row number x ``spread``."""
    w = windows.copy()
    step = pd.to_timedelta(range(len(w)), unit="s") * spread.total_seconds()
    base = pd.Timestamp(start, tz="UTC") - w["ts_start"].min()
    w["ts_start"] = w["ts_start"] + base + step
    w["ts_end"] = w["ts_end"] + base + step
    files = []
    for c in _fleet(w, hosts).groupby("host"):
        folder = root / "telemetry" / "date=2026-11-29" / f"host={c[0]}"
        folder.mkdir(parents=True)
        c[1].to_parquet(folder / "00.parquet")
        files.append(folder / "00.parquet")
    return files


def _count_window_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The fleet-binning passes over the windows (each builds a bin expression)."""
    calls: list[str] = []
    real = fleetbins.bin_sql

    def spy(width_s: float) -> str:
        calls.append(str(width_s))
        return real(width_s)

    monkeypatch.setattr(fleetbins, "bin_sql", spy)
    return calls


def test_the_fleet_view_over_a_days_files_comes_from_the_one_scan(
        tmp_path: Path, windows: pd.DataFrame, monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 15: the fleet view read every window a second time (a third of a month's report).
    # Now the main scan bins windows by the width the files' days allow (a day: 5 min), on the
    # UTC clock, and the fleet view adds up those bins.
    files = _fleet_files(tmp_path, windows, 20, pd.Timedelta(minutes=15))  # 77 windows over 19 h
    passes = _count_window_reads(monkeypatch)
    agg = report_data.load(files=files, max_gpus=16)
    assert len(passes) == 1 and agg.fleet_bin_s == 300.0
    assert agg.fleet_t0.timestamp() % 300 == 0
    assert agg.fleet_t0 <= agg.t0 < agg.fleet_t0 + pd.Timedelta(minutes=5)
    per_label = agg.fleet.groupby("label")["energy_j"].sum() / 3.6e6
    pd.testing.assert_series_equal(per_label.sort_index(), agg.by_label["energy_kwh"].sort_index(),
                                   check_names=False, rtol=1e-9)
    assert 200 < agg.fleet["bin"].max() <= fleetbins.FLEET_BINS
    # each window in the bin of its midpoint
    w = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
    mid = w["ts_start"] + (w["ts_end"] - w["ts_start"]) / 2
    want = w.groupby(((mid - agg.fleet_t0) // pd.Timedelta(seconds=300)).to_numpy())["energy_j"].sum()
    got = agg.fleet.groupby("bin")["energy_j"].sum()
    pd.testing.assert_series_equal(got, want.rename_axis("bin"), check_names=False, check_index_type=False)


def test_a_fleet_covering_an_hour_of_its_day_is_binned_finer_in_a_second_pass(
        tmp_path: Path, windows: pd.DataFrame, monkeypatch: pytest.MonkeyPatch) -> None:
    # The day's 5-minute bins would show 13 minutes of data as three bars: the windows are read
    # again, in bins for the span they cover (13 min / 288: 10 s).
    files = _fleet_files(tmp_path, windows, 20, pd.Timedelta(0))
    passes = _count_window_reads(monkeypatch)
    agg = report_data.load(files=files, max_gpus=16)
    assert len(passes) == 2 and agg.fleet_bin_s == 10.0
    assert agg.fleet["energy_j"].sum() == pytest.approx(agg.by_label["energy_kwh"].sum() * 3.6e6, rel=1e-9)
    assert agg.fleet_t0.timestamp() % 10 == 0 and agg.fleet["bin"].max() > 50


def test_fleet_bin_widths_are_round_and_each_divides_the_next() -> None:
    assert fleetbins.nice_width_s(86400) == 300 and fleetbins.nice_width_s(30 * 86400) == 10800
    assert fleetbins.nice_width_s(0) == 1 and fleetbins.nice_width_s(400 * 86400) == 2 * 86400
    widths = [fleetbins.nice_width_s(s) for s in (10.0 ** k for k in range(0, 9))]
    for a, b in itertools.pairwise(widths):
        assert b % a == 0


def test_a_day_whose_last_window_ends_past_midnight_keeps_five_minute_bins(
        tmp_path: Path, windows: pd.DataFrame) -> None:
    # A window that starts before midnight ends after it: the span is a few seconds over the day.
    # That must not double the day's bins to 10 minutes (nor read the windows again).
    w = windows.sort_values("ts_start").reset_index(drop=True)
    day = pd.Timestamp("2026-11-29", tz="UTC")
    length = w["ts_end"] - w["ts_start"]
    starts = day + pd.to_timedelta(range(len(w)), unit="s") * (86395 / (len(w) - 1))
    w["ts_start"], w["ts_end"] = starts, starts + length
    assert w["ts_end"].max() > day + pd.Timedelta(days=1)
    files = _fleet_files(tmp_path, w, 20, pd.Timedelta(0), start="2026-11-29 00:00")
    agg = report_data.load(files=files, max_gpus=16)
    assert agg.t1 - agg.t0 > pd.Timedelta(days=1)
    assert agg.fleet_bin_s == 300.0 and agg.fleet["bin"].max() == 288


@pytest.mark.parametrize("bad", ["no ts_end", "text times"])
def test_a_dataframe_without_usable_times_is_the_reports_error_not_a_traceback(
        windows: pd.DataFrame, bad: str) -> None:
    # The fleet grain of a DataFrame was its span in pandas, taken before DuckDB's scan: a missing
    # ts_end raised KeyError, a time that is no time pandas' DateParseError, where the scan says
    # "cannot read the telemetry" (a DataError, what the CLI prints).
    w = windows.drop(columns="ts_end") if bad == "no ts_end" else windows.assign(ts_start="garbage")
    with pytest.raises(DataError, match="cannot read the telemetry"):
        report_data.load(windows=w)


def test_a_fleet_whose_span_gets_the_days_bin_width_is_not_read_twice(
        tmp_path: Path, windows: pd.DataFrame, monkeypatch: pytest.MonkeyPatch) -> None:
    # 5.5 h of a day's data: its own width (nice_width_s) is the day's 5 minutes, so the main
    # scan's bins are the view's. It was read a second time (in the same 5-minute bins) because
    # it covers under a quarter of the day's 288 bins.
    files = _fleet_files(tmp_path, windows, 20, pd.Timedelta(seconds=260))  # 76 x 260 s: 5.5 h
    passes = _count_window_reads(monkeypatch)
    agg = report_data.load(files=files, max_gpus=16)
    assert agg.fleet_bin_s == 300.0 and 60 < agg.fleet["bin"].max() < fleetbins.FLEET_BINS / 4
    assert len(passes) == 1
    per_label = agg.fleet.groupby("label")["energy_j"].sum() / 3.6e6
    pd.testing.assert_series_equal(per_label.sort_index(), agg.by_label["energy_kwh"].sort_index(),
                                   check_names=False, rtol=1e-9)


def test_a_job_labelled_twice_counts_once_under_its_last_label(windows: pd.DataFrame) -> None:
    # A label table naming a job twice (two days of a store, concatenated by a caller of
    # render_report) doubled the job's row, so its energy was counted twice per label, and the
    # fleet view (a job -> label map since a626139) failed with pandas' InvalidIndexError.
    # As the CLI's own reading (load.normalise_labels), the last label holds.
    two = _fleet(windows, 2)
    first = est.rule_job_labels(two).assign(label="idle")
    last = first.assign(label="memory")
    agg = report_data.load(windows=two, labels=pd.concat([first, last]), max_gpus=1)
    want = report_data.load(windows=two, labels=last, max_gpus=1)
    assert set(want.by_label.index) == {"memory", "no job"}
    pd.testing.assert_frame_equal(agg.by_label, want.by_label)
    pd.testing.assert_frame_equal(agg.fleet, want.fleet)
    assert agg.jobs["job_id"].is_unique


def test_a_timeline_bucket_gets_the_label_that_held_it_longest(windows: pd.DataFrame) -> None:
    # A day's span: 60 s buckets. One bucket holds two 10 s windows of a memory job and one
    # 10.5 s window of a compute job: memory held it 20 s of 30.5. arg_max(label, secs) took the
    # label of the single longest window (compute), and between windows of equal length (the
    # daemon's 10 s) an arbitrary one, so the strips' colours changed from run to run.
    w = windows[windows["job_id"].notna()].head(4).copy()
    t = pd.Timestamp("2026-11-29 10:00", tz="UTC")
    w["job_id"] = ["m", "m", "c", "m"]
    w["ts_start"] = t + pd.to_timedelta([0, 10, 20, 89000], unit="s")
    w["ts_end"] = w["ts_start"] + pd.to_timedelta([10.0, 10.0, 10.5, 10.0], unit="s")
    w["energy_j"], w["power_avg_w"] = 3000.0, 300.0
    labels = pd.DataFrame({"job_id": ["m", "c"], "label": ["memory", "compute"]})
    agg = report_data.load(windows=w, labels=labels)
    first = agg.timeline.iloc[0]
    assert first["ts_start"] == t and first["label"] == "memory"


def test_a_mixed_fleets_work_estimate_weighs_each_board_and_names_the_unknown(windows: pd.DataFrame) -> None:
    """Windows of H200, A100, and boards of unknown peak rates in one scan: the per-label TFLOP is
    the window-level reference's (each board its own rates), the unknown boards' GPM energy is
    left out of it and reported by name, and the page says so."""
    w = windows.copy()
    jobs = sorted(w["job_id"].dropna().unique())
    models = {j: m for j, m in zip(jobs, ["NVIDIA H200", "NVIDIA A100-SXM4-80GB", "NVIDIA H100 PCIe",
                                          "NVIDIA <b>X9</b>", None] * len(jobs), strict=False)}
    w["gpu_model"] = w["job_id"].map(models).astype(object)
    w["gpu_uuid"] = w["gpu_uuid"] + "-" + w["job_id"].fillna("none").astype(str)  # a board per job
    labels = est.rule_job_labels(w)
    agg = report_data.load(windows=w, labels=labels)
    ref = est.work_per_energy(est.attach_labels(w.assign(job_id=w["job_id"].astype(object)), labels))
    pd.testing.assert_frame_equal(agg.work_per_energy, ref, check_names=False, rtol=1e-9)
    assert agg.work_models == ("NVIDIA A100-SXM4-80GB", "NVIDIA H200")
    gpm = w[["sm_util_pct", *peaks.PIPES]].notna().all(axis=1) & (w["energy_j"] > 0)
    for name, model in (("NVIDIA H100 PCIe", "NVIDIA H100 PCIe"), ("NVIDIA <b>X9</b>", "NVIDIA <b>X9</b>"),
                        ("(no model name)", None)):
        sel = gpm & (w["gpu_model"].isna() if model is None else w["gpu_model"] == model)
        assert agg.work_unrated_kwh[name] == pytest.approx(w.loc[sel, "energy_j"].sum() / 3.6e6)
    page = render_report(w, labels)
    assert "A100: tensor 312, fp64 9.7, fp32 19.5, fp16 78; H200: tensor 989.5" in page
    assert "NVIDIA H100 PCIe (" in page and "NVIDIA &lt;b&gt;X9&lt;/b&gt; (" in page and "<b>X9" not in page


def _board(windows: pd.DataFrame, model: str, limit_w: float | None, scale: float) -> pd.DataFrame:
    """The recording as another board's: its power and energy scaled, its limit ``limit_w``
    (None: the row holds none, as an import from an exporter without the limit field)."""
    w = windows.copy()
    for c in ("energy_j", "power_avg_w", "power_max_w", "power_std_w"):
        if c in w:
            w[c] = w[c] * scale
    w["gpu_model"] = model
    w["power_limit_w"] = float("nan") if limit_w is None else limit_w
    return w


def test_a_window_without_a_limit_is_capped_as_its_board_not_as_an_h200(windows: pd.DataFrame) -> None:
    """A window without ``power_limit_w`` was given an H200's 700 W (found by review): "60%" became
    420 W on a B200, whose default is 1,000 W (the Prolog sets 600 W), and the report counted
    savings the cap would never make. Now: the board's default limit by its model name
    (``savings.response.DEFAULT_LIMIT_W``), and no saving at all where the board is unknown too."""
    caps = {"memory": "60%", "idle": "300W", "compute": "100%", "mixed": "85%"}
    labels = est.rule_job_labels(windows).assign(label="memory")
    b200 = _board(windows, "NVIDIA B200", None, 1000.0 / 700.0)
    with_limit = report_data.load(windows=b200.assign(power_limit_w=1000.0), labels=labels, caps=caps)
    got = report_data.load(windows=b200, labels=labels, caps=caps)
    assert got.savings.saved_kwh == pytest.approx(with_limit.savings.saved_kwh, rel=1e-9)
    w = est.attach_labels(b200.assign(job_id=b200["job_id"].astype(object)), labels)
    assert est.estimate_savings(w, caps).saved_kwh == pytest.approx(got.savings.saved_kwh, rel=1e-9)
    unknown = _board(windows, "NVIDIA L4", None, 72.0 / 700.0)
    got = report_data.load(windows=unknown, labels=labels, caps=caps)
    assert got.savings.saved_kwh == 0.0 and got.savings.saved_kwh_slow == 0.0
    w = est.attach_labels(unknown.assign(job_id=unknown["job_id"].astype(object)), labels)
    ref = est.estimate_savings(w, caps)
    assert ref.saved_kwh == 0.0 and ref.saved_kwh_slow == 0.0
    assert est.window_saved_j(w, caps).sum() == 0.0


@pytest.mark.parametrize("model", [
    "NVIDIA H200", "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "Tesla V100-SXM2-32GB",
    "NVIDIA A100-PCIE-40GB", "NVIDIA A100 80GB PCIe", "NVIDIA H200 NVL", "NVIDIA H100 NVL", "NVIDIA L40S",
    "NVIDIA B200", "NVIDIA GH200 480GB", "  nvidia h100 pcie ", "NVIDIA_A100_SXM4", "NVIDIA-H200", "",
    "NVIDIA", "PCIE X", "H200-", "-PCIE", "NVIDIA H100\tPCIe", "TESLA V100 NVL-2", "nvidiA a100 nvlink",
    "Tesla V100-FHHL-16GB", "Tesla V100-SXM2-32GB-LS", "NVIDIA LS40",
    # white space Python's str.strip and re's \s take and RE2's \s does not (found by review: the
    # SQL capped an A100 with a no-break space in its name as no board, the pandas reference as an A100)
    "NVIDIA\u00a0A100-SXM4-80GB", "NVIDIA A100\x0b80GB", "\u3000H200", "NVIDIA H100\u2028PCIe",
    "NVIDIA A100\x85NVL", "\x1cH100\x1f", "NVIDIA\u2009B200",
])
def test_the_sql_board_key_is_the_python_one(model: str) -> None:
    """``limits.board_key_sql`` must read a model name as ``caps.board_key`` does, or the report's
    SQL and its pandas reference would cap one board two ways."""
    import duckdb

    from wattclass.caps import board_key
    from wattclass.report import limits

    with duckdb.connect() as con:
        got = con.execute(f"SELECT {limits.board_key_sql('$m')}", {"m": model}).fetchone()
    assert got is not None and got[0] == board_key(model)


def test_the_sql_board_key_takes_every_white_space_python_takes() -> None:
    """``board_key_sql`` lists the separators by hand (RE2's ``\\s`` is ASCII only): the list is
    every character ``str.isspace`` takes, as ``caps.board_key``'s strip and split do."""
    from wattclass.report import limits

    assert set(limits.WHITESPACE) == {chr(c) for c in range(0x110000) if chr(c).isspace()}


def _split_rows(windows: pd.DataFrame, basis: str, ratios: tuple[float, ...]) -> pd.DataFrame:
    """Each window as the daemon's splitter writes a GPU held by ``len(ratios)`` jobs: one row per
    job with its share of the energy and the same GPM columns (a shared GPU's are the whole GPU's;
    here the MIG instances' are equal too), ``share_basis`` ``basis``."""
    parts = []
    for k, r in enumerate(ratios):
        p = windows.copy()
        p["job_id"] = p["job_id"].astype(object).where(p["job_id"].isna(), p["job_id"].astype(str) + f"-{k}")
        for c in ("energy_j", "power_avg_w"):
            p[c] = p[c] * r
        p["share_ratio"], p["shared_jobs"], p["share_basis"] = r, len(ratios), basis
        if basis == "mig":
            p["parent_gpu_uuid"] = p["gpu_uuid"]
            p["gpu_uuid"] = f"MIG-{k}"
        parts.append(p)
    return pd.concat(parts, ignore_index=True)


def test_a_shared_gpus_work_is_counted_once_and_mig_instances_are_left_out(windows: pd.DataFrame) -> None:
    """The useful-work estimate credited every row its pipes' activity x the board's peak rates
    (found by review). A shared GPU's rows all carry the whole GPU's GPM, so two jobs on one GPU
    were credited its work twice; a MIG instance's activity is relative to its own slices, so a
    1-of-7 instance was credited 7 times its work at the whole board's peaks. Now a shared row
    counts its share of the GPU's work (``share_ratio``, as its energy), and MIG rows are left out
    of the estimate and named, as a board of unknown rates is."""
    whole = report_data.load(windows=windows)
    tflop = whole.work_per_energy["tflop"].sum()
    assert tflop > 0
    split = _split_rows(windows, "util", (0.25, 0.75))
    shared = report_data.load(windows=split)
    assert shared.work_per_energy["tflop"].sum() == pytest.approx(tflop, rel=1e-9)
    labels = est.rule_job_labels(split)  # the pandas reference says the same
    ref = est.work_per_energy(est.attach_labels(split.assign(job_id=split["job_id"].astype(object)), labels))
    assert ref["tflop"].sum() == pytest.approx(tflop, rel=1e-9)
    assert shared.work_per_energy["energy_kj"].sum() == pytest.approx(
        whole.work_per_energy["energy_kj"].sum(), rel=1e-9)
    mig = report_data.load(windows=_split_rows(windows, "mig", (3 / 7, 2 / 7, 2 / 7)))
    assert mig.work_per_energy.empty or mig.work_per_energy["tflop"].sum() == 0
    assert list(mig.work_unrated_kwh) == ["NVIDIA H200 MIG"]
    assert est.estimated_tflops(_split_rows(windows, "mig", (0.5, 0.5))).isna().all()
    assert mig.work_unrated_kwh["NVIDIA H200 MIG"] == pytest.approx(
        whole.work_per_energy["energy_kj"].sum() / 3600.0, rel=1e-9)


@pytest.mark.parametrize("basis", ["util", "mig"])
def test_a_shared_or_mig_gpu_is_one_gpu_at_its_whole_power(windows: pd.DataFrame, basis: str) -> None:
    """A GPU split between jobs (or MIG instances) writes one row per job with its share of the
    energy and power. The report counted each instance as a GPU (a node of 2 GPUs, one of them in
    MIG mode with 2 instances, was "4 GPU(s)") and drew the GPU's power as the mean of its rows, a
    third of it for 3 rows (found by review). Now GPUs are physical (``parent_gpu_uuid``) and the
    strip's power is the GPU's."""
    whole = report_data.load(windows=windows)
    split = report_data.load(windows=_split_rows(windows, basis, (3 / 7, 2 / 7, 2 / 7)))
    assert split.n_gpus == whole.n_gpus == windows["gpu_uuid"].nunique()
    a = whole.timeline.set_index(["host", "gpu_index", "ts_start"])["power_avg_w"]
    b = split.timeline.set_index(["host", "gpu_index", "ts_start"])["power_avg_w"]
    pd.testing.assert_series_equal(b.loc[a.index], a, rtol=1e-9)


def test_the_rates_named_are_those_of_boards_with_gpm_windows(windows: pd.DataFrame) -> None:
    """The page named every known board's rates as the estimate's, an A100 fleet without GPM
    (no DCGM profiling fields) too, whose windows the estimate never counted (found by review)."""
    a100 = windows.assign(gpu_model="NVIDIA A100-SXM4-80GB", gpu_uuid="GPU-a100", host="a100-node")
    for c in ("sm_util_pct", *peaks.PIPES):
        a100[c] = float("nan")
    agg = report_data.load(windows=pd.concat([windows, a100], ignore_index=True))
    assert agg.work_models == ("NVIDIA H200",)


def test_a_cap_below_the_boards_minimum_is_estimated_at_the_minimum(windows: pd.DataFrame) -> None:
    """The Prolog clamps a cap to the GPU's NVML minimum; the report's estimate did not, so a
    "20%" memory cap on an H200 was estimated at 140 W where the GPU runs at 200 W at least (found
    by review). Boards of known limits (``caps.KNOWN_LIMITS_W``) are clamped; others are not."""
    labels = est.rule_job_labels(windows).assign(label="memory")
    at_min = report_data.load(windows=windows, labels=labels, caps={"memory": "200W"})
    got = report_data.load(windows=windows, labels=labels, caps={"memory": "20%"})
    assert got.savings.saved_kwh == pytest.approx(at_min.savings.saved_kwh, rel=1e-9)
    w = est.attach_labels(windows.assign(job_id=windows["job_id"].astype(object)), labels)
    assert est.estimate_savings(w, {"memory": "20%"}).saved_kwh == pytest.approx(at_min.savings.saved_kwh)
    assert est.window_saved_j(w, {"memory": "20%"}).sum() / 3.6e6 == pytest.approx(at_min.savings.saved_kwh)
    unknown = windows.assign(gpu_model="NVIDIA L4")  # no known range: the policy's watts
    below = report_data.load(windows=unknown, labels=labels, caps={"memory": "20%"})
    assert below.savings.saved_kwh > at_min.savings.saved_kwh


def test_an_empty_model_name_is_named_as_no_model_name(windows: pd.DataFrame) -> None:
    """An import from a dcgm-exporter without the ``modelName`` label writes an empty model name,
    which the page named as "" ("Left out...:  (0.02 kWh)")."""
    agg = report_data.load(windows=windows.assign(gpu_model=""))
    assert list(agg.work_unrated_kwh) == ["(no model name)"]
    half = windows.assign(gpu_model=[None if i % 2 else "" for i in range(len(windows))])
    both = report_data.load(windows=half).work_unrated_kwh  # null and empty: one sum
    assert both["(no model name)"] == pytest.approx(agg.work_unrated_kwh["(no model name)"], rel=1e-9)


def test_a_nan_limit_in_a_file_is_a_missing_limit_as_in_the_reference(
        windows: pd.DataFrame, tmp_path: Path) -> None:
    """A Parquet file may hold NaN (or an infinity), not null, where a writer other than the daemon
    had no limit.
    DuckDB orders NaN above every number, so the SQL took it as a limit ("60%" of NaN, a cap
    that never bites: nothing saved) where the pandas reference takes NaN as missing and caps the
    window as its board (found by the session review). Both now read it as missing."""
    import numpy as np
    import pyarrow as pa

    t = pa.Table.from_pandas(windows, preserve_index=False)
    i = t.schema.get_field_index("power_limit_w")
    limit = np.full(t.num_rows, np.nan)  # NaN, not null; an infinity on some rows, 700 W on others:
    limit[1::3], limit[2::3] = np.inf, 700.0  # the file's statistics then hold numbers (see limit_sql)
    t = t.set_column(i, "power_limit_w", pa.array(limit))
    got, ref, labels, caps = _file_savings_and_reference(windows, t, tmp_path)
    assert ref.saved_kwh > 0 and got.savings.saved_kwh == pytest.approx(ref.saved_kwh, rel=1e-9)
    at_700 = report_data.load(windows=windows.assign(power_limit_w=700.0), labels=labels, caps=caps)
    assert got.savings.saved_kwh == pytest.approx(at_700.savings.saved_kwh, rel=1e-9)


def test_a_nan_sm_activity_in_a_file_leaves_the_window_out_of_the_work_estimate(
        windows: pd.DataFrame, tmp_path: Path) -> None:
    """A window whose ``sm_util_pct`` is NaN (not null) in a Parquet file has no GPM reading: the
    pandas reference leaves it out of the useful-work estimate; the SQL tested ``IS NOT NULL``,
    which NaN passes, and counted its energy as GPM energy (found by the session review)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    t = pa.Table.from_pandas(windows, preserve_index=False)
    sm = t.column("sm_util_pct").to_numpy(zero_copy_only=False).astype(float)
    sm[::2] = np.nan  # every other window: NaN, not null
    t = t.set_column(t.schema.get_field_index("sm_util_pct"), "sm_util_pct", pa.array(sm))
    path = tmp_path / "part-0.parquet"
    pq.write_table(t, path)
    w = pd.read_parquet(path)
    labels = est.rule_job_labels(windows)
    got = report_data.load(files=[path], labels=labels)
    ref = est.work_per_energy(est.attach_labels(w.assign(job_id=w["job_id"].astype(object)), labels))
    assert not ref.empty
    pd.testing.assert_frame_equal(got.work_per_energy, ref, check_names=False, rtol=1e-9)


def test_a_nan_share_ratio_in_a_file_counts_the_whole_gpu_as_in_the_reference(
        windows: pd.DataFrame, tmp_path: Path) -> None:
    """``share_sql`` took a share between 0 and 1 as it is, else 1; DuckDB decided "between 0 and
    1" from the Parquet statistics, which leave NaN out, so a NaN share passed, and one NaN row
    made its label's whole TFLOP NaN (found by the session review). pandas' ``share_series``
    reads NaN as 1, and so does the SQL now."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    share = np.where(np.arange(len(windows)) % 5 == 0, np.nan, 1.0)  # NaN among numbers in [0, 1]
    t = pa.Table.from_pandas(windows, preserve_index=False).append_column("share_ratio", pa.array(share))
    path = tmp_path / "part-0.parquet"
    pq.write_table(t, path)
    got = report_data.load(files=[path])
    whole = report_data.load(windows=windows)
    assert got.work_per_energy["tflop"].notna().all()
    pd.testing.assert_frame_equal(got.work_per_energy, whole.work_per_energy, check_names=False, rtol=1e-9)


def test_a_nan_mean_power_in_a_file_is_a_missing_one_as_in_the_reference(
        windows: pd.DataFrame, tmp_path: Path) -> None:
    """A NaN ``power_avg_w`` among numbers passed the SQL's ``> 0`` (decided from the Parquet
    statistics, which leave NaN out) and its capped energy was the energy x least(1, NaN): nothing
    saved, where pandas reads NaN as missing and caps energy / length (found by the session review)."""
    import numpy as np
    import pyarrow as pa

    t = pa.Table.from_pandas(windows, preserve_index=False)
    p = t.column("power_avg_w").to_numpy(zero_copy_only=False).astype(float)
    p[::3] = np.nan
    t = t.set_column(t.schema.get_field_index("power_avg_w"), "power_avg_w", pa.array(p))
    got, ref, _, _ = _file_savings_and_reference(windows, t, tmp_path)
    assert got.savings.saved_kwh == pytest.approx(ref.saved_kwh, rel=1e-9)


def _file_savings_and_reference(windows: pd.DataFrame, table: Any, tmp_path: Path
                                ) -> tuple[Any, est.SavingsResult, pd.DataFrame, dict[str, str]]:
    """``table`` written as one Parquet file, every job memory-bound under a 60% cap: the report's
    load of the file (SQL) and the pandas reference's savings over the same file read back."""
    import pyarrow.parquet as pq

    path = tmp_path / "part-0.parquet"
    pq.write_table(table, path)
    labels = est.rule_job_labels(windows).assign(label="memory")
    caps = {"memory": "60%"}
    got = report_data.load(files=[path], labels=labels, caps=caps)
    w = pd.read_parquet(path)
    ref = est.estimate_savings(est.attach_labels(w.assign(job_id=w["job_id"].astype(object)), labels), caps)
    return got, ref, labels, caps


@pytest.mark.parametrize("basis", ["util", "mig"])
def test_a_cap_on_a_shared_gpu_is_held_against_the_gpus_power_not_the_jobs_share(
        windows: pd.DataFrame, basis: str) -> None:
    """A cap is a limit of the physical GPU, while a shared (or MIG) GPU's row holds the job's
    share of its power (telemetry/splitter.py). The savings estimate held the cap against that
    share: two memory-bound jobs splitting a 600 W H200 drew "150 W" and "450 W" under a 420 W
    cap, so the first saved nothing and the second a third of what the GPU saves (found by a
    fresh-eyes review of shared GPUs). Each row now saves its share of what the GPU saves, so the
    split day saves what the whole GPU does, in the SQL and in the pandas reference."""
    caps = {"memory": "60%"}
    whole_labels = est.rule_job_labels(windows).assign(label="memory")
    whole = report_data.load(windows=windows, labels=whole_labels, caps=caps)
    split_w = _split_rows(windows, basis, (0.25, 0.75))
    labels = est.rule_job_labels(split_w).assign(label="memory")
    split = report_data.load(windows=split_w, labels=labels, caps=caps)
    assert whole.savings.saved_kwh > 0
    assert split.savings.saved_kwh == pytest.approx(whole.savings.saved_kwh, rel=1e-9)
    ww = est.attach_labels(split_w.assign(job_id=split_w["job_id"].astype(object)), labels)
    assert est.estimate_savings(ww, caps).saved_kwh == pytest.approx(whole.savings.saved_kwh, rel=1e-9)
    assert est.window_saved_j(ww, caps).sum() / 3.6e6 == pytest.approx(whole.savings.saved_kwh, rel=1e-9)
    # without a mean power the row's energy over its length is its share too
    no_p = split_w.assign(power_avg_w=float("nan"))
    whole_no_p = report_data.load(windows=windows.assign(power_avg_w=float("nan")), labels=whole_labels,
                                  caps=caps)
    got = report_data.load(windows=no_p, labels=labels, caps=caps)
    assert whole_no_p.savings.saved_kwh > 0
    assert got.savings.saved_kwh == pytest.approx(whole_no_p.savings.saved_kwh, rel=1e-9)


def test_the_what_if_of_a_report_over_days_covers_every_day(tmp_path: Path, h200_telemetry: Path) -> None:
    """``wattclass report --days 2 --policy P``: the page covers both days, but its what-if section
    ran ``simulate`` over the last day alone (found by a fresh-eyes review of reports over days:
    a month's report set one day's kWh saved beside the month's energy). It covers the span now."""
    import html
    import re

    from wattclass.cli import main
    from wattclass.policy import load_policy
    from wattclass.savings.simulate import simulate

    t = pd.read_parquet(h200_telemetry)
    for k, d in enumerate(("2026-11-01", "2026-11-02")):
        folder = tmp_path / "telemetry" / f"date={d}" / "host=n1"
        folder.mkdir(parents=True)
        shift = pd.Timestamp(d, tz="UTC") - t["ts_start"].min().floor("D")
        t.assign(ts_start=t["ts_start"] + shift, ts_end=t["ts_end"] + shift,
                 job_id=t["job_id"].astype(str) + f"-{k}").to_parquet(folder / "00.parquet")
    policy = tmp_path / "policy.toml"
    policy.write_text('[caps]\nmemory = "60%"\nidle = "40%"\n')
    out = tmp_path / "r.html"
    assert main(["report", "--data-root", str(tmp_path), "--days", "2", "--policy", str(policy),
                 "--out", str(out)]) == 0
    text = html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", out.read_text())))
    both = simulate(tmp_path, load_policy(policy), "2026-11-01", "2026-11-02").totals
    one = simulate(tmp_path, load_policy(policy), "2026-11-02", "2026-11-02").totals
    assert f"{both['energy_kwh']:.1f}" != f"{one['energy_kwh']:.1f}"
    assert (f"Every job of 2026-11-01..2026-11-02 re-run under {policy}" in text
            and f"of {both['energy_kwh']:.1f} kWh" in text), text[text.find("What-if"):][:400]
