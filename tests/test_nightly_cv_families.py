"""The nightly candidate's cross-validation holds out whole job keys (user/name), not single jobs:
its calibration maps and promotion gate then say how it does on work it has not trained on."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from wattclass.classifier import model as M
from wattclass.classifier.nightly import cv_families
from wattclass.classifier.store import ClassifierStore
from wattclass.classifier.training import h200_data_dir, job_families


def _labels(store: ClassifierStore, date: str, rows: list[tuple[str, str | None, str | None]]) -> None:
    store.write_labels(date, pd.DataFrame(rows, columns=["job_id", "user", "name"]).assign(label="memory"))


def test_site_jobs_are_grouped_by_user_and_name_across_days(tmp_path: Path) -> None:
    store = ClassifierStore(tmp_path)
    _labels(store, "2026-11-28", [("1", "ann", "train"), ("2", "bob", "sim"), ("3", "ann", None)])
    _labels(store, "2026-11-29", [("7", "ann", "train"), ("8", "bob", "sim2"), ("9", "ann", "")])
    raw = h200_data_dir() / "raw"
    groups = np.asarray(["2026-11-28:1", "2026-11-28:2", "2026-11-28:3", "2026-11-29:7", "2026-11-29:8",
                         "2026-11-29:9", "2026-11-29:404", "raw:5001"], dtype=object)
    fam = cv_families(store, (raw,), groups)
    assert fam["2026-11-28:1"] == fam["2026-11-29:7"] == "site:ann/train"  # the same workload, two days
    assert fam["2026-11-28:2"] != fam["2026-11-29:8"]
    assert fam["2026-11-28:3"] == fam["2026-11-29:9"] == "site:ann"  # no name: the user's unnamed jobs
    assert "2026-11-29:404" not in fam  # no stored label: its own family
    assert fam["raw:5001"] == "h200:" + job_families([raw])["raw:5001"]


def test_folds_keep_a_job_keys_runs_together(tmp_path: Path) -> None:
    store = ClassifierStore(tmp_path)
    rows = [(str(i), f"u{i % 3}", f"job{i % 4}") for i in range(40)]
    _labels(store, "2026-11-29", rows)
    groups = np.asarray([f"2026-11-29:{i}" for i in range(40)], dtype=object)
    fam = cv_families(store, (), groups)
    folds = M.family_folds(groups, fam, 5)
    by_key: dict[str, set[int]] = {}
    for g, f in zip(groups, folds, strict=True):
        by_key.setdefault(fam[g], set()).add(int(f))
    assert len(by_key) == 12 and all(len(v) == 1 for v in by_key.values())
    assert len(set(folds.tolist())) == 5
