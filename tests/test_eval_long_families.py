"""bench/eval_long_families.py's two pieces of protocol: a run cut to its first N s, and the fold split."""

from __future__ import annotations

import csv
import importlib.util
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "bench" / "eval_long_families.py"
#: One part of the long-twins recording: a single 40 s run (conv_transpose_s43_002).
LONG_PART = REPO / "wattclass" / "data" / "h200" / "long-twins"
PART = "long_s43_gpu0"


@pytest.fixture(scope="module")
def ev() -> ModuleType:
    spec = importlib.util.spec_from_file_location("eval_long_families", SCRIPT)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["eval_long_families"] = mod
    spec.loader.exec_module(mod)
    return mod


def _one_run_recording(dst: Path) -> Path:
    dst.mkdir()
    for f in LONG_PART.glob(f"{PART}_*"):
        shutil.copyfile(f, dst / f.name)
    return dst


def _rows(runs: Path) -> list[dict[str, str]]:
    with runs.open(newline="") as fh:
        return list(csv.DictReader(fh))


def _job_windows(root: Path) -> dict[str, Any]:
    """job id -> (window ts_end in epoch seconds, window lengths) of a replayed data root."""
    from wattclass.classifier.features import durations_s
    from wattclass.classifier.reader import iter_tables, telemetry_files

    out: dict[str, Any] = {}
    for _, t in iter_tables(telemetry_files([root])):
        job = np.asarray(t.column("job_id").to_pylist(), dtype=object)
        end_s = t.column("ts_end").to_numpy().astype("datetime64[ns]").astype(np.int64) / 1e9
        dur = durations_s(t)
        for j in {j for j in job if j is not None}:
            m = job == j
            out[j] = (end_s[m], dur[m])
    return out


def test_cut_run_reaches_only_its_first_seconds(ev: ModuleType, tmp_path: Path) -> None:
    from wattclass.classifier.replay import materialize

    full = _one_run_recording(tmp_path / "full")
    cut = ev.cut_recording(full, tmp_path / "full-first10s", 10.0)
    (row,) = _rows(full / f"{PART}_runs.csv")
    (cut_row,) = _rows(cut / f"{PART}_runs.csv")
    start, end = float(row["start"]), float(row["end"])
    assert end - start > 30  # the run is long: the cut has something to remove
    # only the end moved; every other column (job id, family, params) is the run's
    assert {k: v for k, v in cut_row.items() if k != "end"} == {k: v for k, v in row.items() if k != "end"}
    assert float(cut_row["end"]) < start + 10.0

    full_root, cut_root = materialize([full, cut], tmp_path / "replayed")
    job = row["job_id"]
    full_end, full_dur = _job_windows(full_root)[job]
    cut_windows = _job_windows(cut_root)
    assert set(cut_windows) == {job}  # the samples after the cut belong to no job
    cut_end, cut_dur = cut_windows[job]
    assert len(cut_end) < len(full_end)
    assert full_end.max() > start + 10.0
    assert cut_end.max() <= start + 10.0
    assert 9.0 <= cut_dur.sum() <= 10.0 + 1e-6 < full_dur.sum()


def test_cut_keeps_runs_shorter_than_the_cut(ev: ModuleType, tmp_path: Path) -> None:
    full = _one_run_recording(tmp_path / "full")
    cut = ev.cut_recording(full, tmp_path / "cut", 600.0)
    end = _rows(full / f"{PART}_runs.csv")[0]["end"]
    assert float(_rows(cut / f"{PART}_runs.csv")[0]["end"]) == float(end)


def test_cut_names_the_file_of_a_bad_run(ev: ModuleType, tmp_path: Path) -> None:
    from wattclass.errors import DataError

    full = _one_run_recording(tmp_path / "full")
    runs = full / f"{PART}_runs.csv"
    runs.write_text(runs.read_text().replace(_rows(runs)[0]["start"], "soon"))
    with pytest.raises(DataError, match=f"{PART}_runs.csv line 2"):
        ev.cut_recording(full, tmp_path / "cut", 10.0)


def test_every_family_lands_in_exactly_one_fold(ev: ModuleType) -> None:
    fams = [f"fam{i:02d}" for i in range(12)][::-1] * 3  # repeats, unsorted
    folds = ev.family_folds(fams, 5)
    assert len(folds) == 5
    dealt = [f for fold in folds for f in fold]
    assert sorted(dealt) == sorted(set(fams)) and len(dealt) == len(set(dealt))
    assert folds[0] == ("fam00", "fam05", "fam10")  # sorted names, round robin
    assert folds[4] == ("fam04", "fam09")


def test_too_few_families_for_the_folds(ev: ModuleType) -> None:
    with pytest.raises(SystemExit, match="too few"):
        ev.family_folds(["a", "b", "a"], 5)
