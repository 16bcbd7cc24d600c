"""bench/eval_families.py's scoring: error kinds apart, unsure counted as not correct, coverage."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "eval_families.py"


@pytest.fixture(scope="module")
def ev():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("eval_families", SCRIPT)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_summary_separates_costly_and_cheap_errors_and_counts_unsure(ev) -> None:  # type: ignore[no-untyped-def]
    # truth/pred codes: idle 0, compute 1, memory 2, mixed 3
    keys = np.array(["a:1", "a:2", "a:3", "b:1", "b:2", "b:3"], dtype=object)
    truth = np.array([1, 1, 2, 2, 1, 0], dtype=np.int8)
    pred = np.array([1, 2, 1, 2, 2, 0], dtype=np.int8)
    conf = np.array([0.9, 0.95, 0.5, 0.7, 0.6, 0.99])
    res = {"keys": keys, "truth": truth, "pred": pred, "raw": conf, "conf": conf}
    fams = {"a:1": "f1", "a:2": "f1", "a:3": "f1", "b:1": "f2", "b:2": "f2", "b:3": "f2"}
    out = ev.summarize(res, fams, 0.8)
    a = out["all"]
    assert a["accuracy"] == pytest.approx(3 / 6)
    # unsure (conf < 0.8) is not correct even where the label was right (b:1)
    assert a["accuracy_unsure_wrong"] == pytest.approx(2 / 6)
    assert a["coverage"] == pytest.approx(3 / 6)
    assert (a["compute_called_memory"], a["compute_called_memory_acted"], a["compute_jobs"]) == (2, 1, 3)
    assert (a["memory_called_compute"], a["memory_called_compute_acted"], a["memory_jobs"]) == (1, 0, 2)
    assert out["families"]["f1"]["jobs"] == 3 and out["families"]["f2"]["compute_called_memory"] == 1
    assert len(out["wrong"]) == 3
