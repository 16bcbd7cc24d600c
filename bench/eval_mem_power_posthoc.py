"""Post hoc (not registered): why the HBM's own power did not help in issue 13 round 13.

``bench/eval_mem_power.py`` is the analysis registered before the data existed and stays as it
ran. This script holds the figures the write-up gives afterwards to explain its result, computed
over the same jobs (every run of the folders; GPM truth as there), so that each is reproducible:
how far the HBM's mean power follows the memory-controller utilisation and board power the daemon
already records (Pearson r, and R^2 of a least-squares fit on util_mem alone and with board
power), and the spread of the HBM power share per GPM truth (why a cut on it fails).

  python bench/eval_mem_power_posthoc.py [--raw FOLDER ...]     # prints one JSON document
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from benchstamp import emit
from eval_mem_power import DEFAULT_FOLDER, HBM_POWER_COLUMN, job_truth
from nvml_signals import job_selection, part_runs

F64 = npt.NDArray[np.float64]


def _r2(y: F64, *xs: F64) -> float:
    """R^2 of the least-squares fit of ``y`` on ``xs`` with an intercept."""
    x = np.column_stack([np.ones_like(y), *xs])
    coef = np.linalg.lstsq(x, y, rcond=None)[0]
    return float(1.0 - ((y - x @ coef) ** 2).sum() / ((y - y.mean()) ** 2).sum())


def job_means(sources: Sequence[Path]) -> dict[str, tuple[float, float, float]]:
    """Per job (nvml_signals' keys and samples): mean HBM power (W), board power (W), util_mem (%)."""
    out: dict[str, tuple[float, float, float]] = {}
    for pr in part_runs(sources, ("ts", "power_mw", HBM_POWER_COLUMN, "util_mem")):
        for key, start, end in pr.runs:
            sel = job_selection(pr.samples["ts"], start, end)
            out[key] = (float(np.nanmean(pr.samples[HBM_POWER_COLUMN][sel])) / 1e3,
                        float(np.nanmean(pr.samples["power_mw"][sel])) / 1e3,
                        float(np.nanmean(pr.samples["util_mem"][sel])))
    return out


def posthoc(sources: Sequence[Path]) -> dict[str, Any]:
    from wattclass.classifier import rules

    means = job_means(sources)
    keys, truth, _ = job_truth(sources)
    hbm, board, util_mem = (np.array([means[str(k)][i] for k in keys]) for i in range(3))
    share = hbm / board
    spread = {}
    for code, lab in enumerate(rules.JOB_LABELS):
        s = share[truth == code]
        if len(s):
            q10, q50, q90 = (round(float(v), 3) for v in np.quantile(s, [0.1, 0.5, 0.9]))
            spread[lab] = {"jobs": len(s), "share_q10": q10, "share_median": q50, "share_q90": q90}
    return {"sources": [str(s) for s in sources], "jobs": len(keys),
            "pearson_r_hbm_power_util_mem": round(float(np.corrcoef(hbm, util_mem)[0, 1]), 3),
            "pearson_r_hbm_power_board_power": round(float(np.corrcoef(hbm, board)[0, 1]), 3),
            "r2_hbm_power_on_util_mem": round(_r2(hbm, util_mem), 3),
            "r2_hbm_power_on_util_mem_and_board_power": round(_r2(hbm, util_mem, board), 3),
            "hbm_power_share_by_truth": spread}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--raw", type=Path, nargs="+", default=None, metavar="FOLDER")
    a = ap.parse_args()
    from wattclass.classifier.training import h200_data_dir

    return emit(posthoc(a.raw or [h200_data_dir() / DEFAULT_FOLDER]))


if __name__ == "__main__":
    raise SystemExit(main())
