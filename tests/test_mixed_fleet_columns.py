"""A fleet of mixed GPUs: files without GPM columns around files with them.

A GPU without GPM writes no GPM columns. The engine, ``wattclass report`` and ``wattclass simulate``
read a day's files with the first file's schema when they can; when the first and the last file
(the first and last host by name) came from GPUs without GPM, the GPM hosts' columns in between
were dropped without a word and their jobs went to the model instead of the rule
(``wattclass.schema.first_schema_reads_all``). Review finding, 2026-11-30.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from wattclass.schema import GPM_COLUMNS, conform, first_schema_reads_all

DAY = "2026-11-28"


def _windows(host: str, job: str, n: int, gpm: bool, sm: list[float] | None = None) -> pa.Table:
    """``n`` windows of one job on one GPU; memory-bound by GPM (DRAM 80%, every pipe under 20%)."""
    t0 = pd.Timestamp(f"{DAY}T01:00:00Z")
    cols: dict[str, object] = {
        "ts_start": pa.array(t0 + pd.to_timedelta(np.arange(n) * 10, unit="s")),
        "ts_end": pa.array(t0 + pd.to_timedelta(np.arange(n) * 10 + 10, unit="s")),
        "host": [host] * n, "gpu_index": pa.array(np.zeros(n, np.int16)), "gpu_uuid": [f"GPU-{host}"] * n,
        "gpu_model": ["NVIDIA H200" if gpm else "NVIDIA A100"] * n, "job_id": [job] * n, "user": ["u"] * n,
        "energy_j": np.full(n, 4000.0), "power_avg_w": np.full(n, 400.0), "power_max_w": np.full(n, 420.0),
        "power_limit_w": np.full(n, 700.0),
    }
    table = conform(pa.table(cols))
    if not gpm:
        return table.drop_columns(list(GPM_COLUMNS))
    gpm_vals = {"sm_util_pct": sm or [60.0] * n, "dram_bw_util_pct": [80.0] * n, "tensor_util_pct": [5.0] * n,
                "fp64_util_pct": [0.0] * n, "fp32_util_pct": [10.0] * n, "fp16_util_pct": [0.0] * n,
                "int_util_pct": [15.0] * n}
    for c, v in gpm_vals.items():
        table = table.set_column(table.schema.get_field_index(c), c, pa.array(v, pa.float32()))
    return table


def _fleet(root: Path) -> list[Path]:
    """Hosts a (no GPM), b (GPM: one memory-bound job), c (no GPM), in path order."""
    out = []
    for host, job, gpm in (("a", "101", False), ("b", "202", True), ("c", "303", False)):
        d = root / "telemetry" / f"date={DAY}" / f"host={host}"
        d.mkdir(parents=True)
        pq.write_table(_windows(host, job, 6, gpm), d / "01.parquet")
        out.append(d / "01.parquet")
    return out


def test_a_gpm_host_between_hosts_without_gpm_is_seen(tmp_path: Path) -> None:
    files = _fleet(tmp_path)
    plan = first_schema_reads_all(files)
    assert not plan.exact and set(GPM_COLUMNS) <= plan.seen


def test_files_that_all_have_every_column_need_only_the_ends(tmp_path: Path) -> None:
    files = []
    for host in "abc":
        d = tmp_path / f"host={host}"
        d.mkdir()
        pq.write_table(_windows(host, "1", 2, gpm=True), d / "01.parquet")
        files.append(d / "01.parquet")
    assert first_schema_reads_all(files).exact
    # the first file has every column: a middle file lacking some fails the fast read instead
    pq.write_table(_windows("b", "1", 2, gpm=False), files[1])
    assert first_schema_reads_all(files).exact
    # a first and last without GPM: every folder's ends are opened, and the middle one differs
    for f in (files[0], files[2]):
        pq.write_table(_windows("a", "1", 2, gpm=False), f)
    pq.write_table(_windows("b", "1", 2, gpm=True), files[1])
    assert not first_schema_reads_all(files).exact
    pq.write_table(_windows("b", "1", 2, gpm=False), files[1])
    assert first_schema_reads_all(files).exact  # all alike, none with GPM


def test_the_engine_labels_the_gpm_hosts_job_by_the_rule(tmp_path: Path) -> None:
    from wattclass.classifier.engine import label_files_local
    from wattclass.classifier.reader import telemetry_files

    files = _fleet(tmp_path)
    assert telemetry_files([tmp_path], date=DAY) == files
    res = label_files_local(files, None, "auto", workers=1)
    got = res.labels.set_index("job_id")
    assert got.loc["202", "label"] == "memory" and got.loc["202", "source"] == "rule"


def test_report_and_simulate_label_the_gpm_hosts_job_by_the_rule(tmp_path: Path) -> None:
    from wattclass.report import data as report_data
    from wattclass.savings.simulate import attach_labels, scan_jobs

    files = _fleet(tmp_path)
    rep = report_data.load(files=files).jobs.set_index("job_id")
    assert rep.loc["202", "label"] == "memory"
    assert set(rep.loc[["101", "303"], "label"]) == {"unlabelled"}
    sim = attach_labels(scan_jobs(tmp_path), None).set_index("job_id")
    assert sim.loc["202", "label"] == "memory" and sim.loc["202", "label_source"] == "rule(sim)"
    assert set(sim.loc[["101", "303"], "label"]) == {"unlabelled"}


def test_simulate_leaves_a_job_with_a_window_without_gpm_to_the_model(tmp_path: Path) -> None:
    """Three memory-bound windows and one whose SM reading is missing: the nightly sends the job to
    the model (every window must have a rule code), so ``simulate`` must not cap it by the rule
    either, as the report does not."""
    from wattclass.report import data as report_data
    from wattclass.savings.simulate import attach_labels, scan_jobs

    d = tmp_path / "telemetry" / f"date={DAY}" / "host=b"
    d.mkdir(parents=True)
    table = _windows("b", "7", 4, gpm=True)
    sm = pa.array([60.0, 60.0, None, 60.0], pa.float32())
    table = table.set_column(table.schema.get_field_index("sm_util_pct"), "sm_util_pct", sm)
    pq.write_table(table, d / "01.parquet")
    sim = attach_labels(scan_jobs(tmp_path), None).set_index("job_id")
    assert sim.loc["7", "n_mem"] == 3 and sim.loc["7", "n_windows"] == 4
    assert sim.loc["7", "label"] == "unlabelled" and sim.loc["7", "label_source"] == "none"
    rep = report_data.load(files=[d / "01.parquet"]).jobs.set_index("job_id")
    assert rep.loc["7", "label"] == "unlabelled"
    # the same job with every window measured is the rule's
    pq.write_table(_windows("b", "7", 4, gpm=True), d / "01.parquet")
    assert attach_labels(scan_jobs(tmp_path), None).set_index("job_id").loc["7", "label"] == "memory"



@pytest.mark.parametrize(("a", "b"), list(itertools.product(
    [(gpm, number) for gpm in (True, False) for number in (True, False)], repeat=2)))
def test_a_file_whose_job_ids_are_numbers_is_read_whatever_its_neighbours(
        tmp_path: Path, a: tuple[bool, bool], b: tuple[bool, bool]) -> None:
    """The schema's ``job_id`` is text; another writer's file may hold plain Slurm ids as integers.
    Such a file was read or skipped ("bad column type") by the order and columns of the other
    files of the day (the passes read a set of files with the first one's types), and a file
    without GPM holding integers beside one holding text failed the nightly with a pyarrow
    traceback (ArrowInvalid: "Incompatible data types for corresponding join field keys"): the
    scan read the two as text, the model pass the file without GPM alone, as int64 (found by a
    fresh-eyes review of other writers' files). Every pass now reads the job id as text."""
    from wattclass.classifier.engine import label_files_local
    from wattclass.classifier.model import default_model_dir, load_model

    files = []
    for (gpm, number), host, job in ((a, "a", "101"), (b, "b", "202")):
        t = _windows(host, job, 6, gpm)
        if number:
            ids = pa.array([int(job)] * 6, pa.int64())
            t = t.set_column(t.schema.get_field_index("job_id"), "job_id", ids)
        f = tmp_path / "telemetry" / f"date={DAY}" / f"host={host}" / "01.parquet"
        f.parent.mkdir(parents=True)
        pq.write_table(t, f)
        files.append(f)
    res = label_files_local(files, load_model(default_model_dir()), "auto", workers=1)
    assert sorted(res.labels["job_id"]) == ["101", "202"] and not res.report.skipped_files
    got = res.labels.set_index("job_id")
    for (gpm, _), job in ((a, "101"), (b, "202")):
        assert (got.loc[job, "source"] == "rule") == gpm
