"""Build the model's training set from any list of v1 telemetry files (GPM gives the labels).

Each telemetry *source* (a file or a data root given on the command line) is a namespace for job
ids: two recordings that both number their jobs from 5001 stay distinct jobs (key
``<source>:<job_id>``), while the hourly files of one data root still join into one job each.
Long jobs are thinned to at most ``max_windows_per_job`` evenly spaced windows so the set stays
small and balanced.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from wattclass.classifier import rules
from wattclass.classifier.features import column_f64, durations_s, feature_matrix, window_features
from wattclass.classifier.model import TrainingSet
from wattclass.classifier.reader import iter_tables, telemetry_files
from wattclass.classifier.replay import materialize


def window_rule_codes(table: pa.Table) -> np.ndarray:
    """The GPM window rule over a conformed telemetry table (NO_GPM where GPM is null)."""
    return rules.window_labels(
        column_f64(table, "sm_util_pct"),
        column_f64(table, "dram_bw_util_pct"),
        [column_f64(table, c) for c in rules.COMPUTE_UNITS],
    )


def labelled_windows(table: pa.Table, prefix: str) -> TrainingSet:
    """Windows of ``table`` that belong to a job and have GPM, as a TrainingSet."""
    codes = window_rule_codes(table)
    job = table.column("job_id")
    has_job = pc.is_valid(job).to_numpy(zero_copy_only=False)
    keep = has_job & (codes >= 0)
    if not keep.any():
        return TrainingSet.concat([])
    X = feature_matrix(window_features(table))[keep]
    jobs = np.asarray(job.to_numpy(zero_copy_only=False), dtype=object)[keep]
    group = np.asarray([f"{prefix}:{j}" for j in jobs], dtype=object)
    return TrainingSet(X, codes[keep], group, [prefix], durations_s(table)[keep])


def thin(ts: TrainingSet, max_windows_per_job: int) -> TrainingSet:
    """Keep at most ``max_windows_per_job`` evenly spaced windows of each job."""
    if max_windows_per_job <= 0 or len(ts) == 0:
        return ts
    _, inv, cnt = np.unique(ts.group, return_inverse=True, return_counts=True)
    order = np.argsort(inv, kind="stable")
    rank = np.empty(len(ts), dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(cnt)[:-1]])
    rank[order] = np.arange(len(ts)) - np.repeat(starts, cnt)
    n = cnt[inv]
    step = np.maximum(n / max_windows_per_job, 1.0)
    keep = (n <= max_windows_per_job) | (np.floor(rank / step) != np.floor((rank - 1) / step))
    return ts.subset(keep)


def training_set(
    sources: Sequence[Path], max_windows_per_job: int = 64, date: str | None = None
) -> TrainingSet:
    """Labelled windows from every source: a v1 Parquet file, a data root, or a raw probe
    recording (replayed through the telemetry daemon into a temporary data root first)."""
    with tempfile.TemporaryDirectory(prefix="wattclass-replay-") as tmp:
        parts: list[TrainingSet] = []
        for src in materialize(sources, Path(tmp)):
            prefix = Path(src).stem if Path(src).is_file() else Path(src).name
            files = telemetry_files([Path(src)], date=date)
            parts.extend(labelled_windows(t, prefix) for _, t in iter_tables(files))
    return thin(TrainingSet.concat(parts), max_windows_per_job)


def h200_data_dir() -> Path:
    """``wattclass/data/h200`` (in a checkout or an installed package)."""
    data = Path(__file__).resolve().parent.parent / "wattclass" / "data" / "h200"
    if not data.is_dir():  # installed (non-editable): wattclass/data sits next to the classifier
        import wattclass

        data = Path(wattclass.__file__).resolve().parent / "data" / "h200"
    return data


#: Raw recordings the default model is trained on (folders under wattclass/data/h200).
BUNDLED_RECORDINGS: tuple[str, ...] = ("raw", "collected")


def bundled_training_sources() -> list[Path]:
    """The real H200 recordings shipped in the package: the default model is trained on these.

    ``raw`` (21 development jobs, 5001-5021, ~34 s each) and ``collected`` (66 jobs, 6000-6165,
    13 s each, two recording sessions), both raw 1 Hz probe recordings that ``training_set``
    replays through the telemetry daemon. ``live-nvml`` (the same 66 jobs written live by the
    NVML daemon) is *not* a training source: it would count those jobs twice; it is kept for the
    replay-vs-live check in bench/eval_classifier.py. Rebuild the default model with
    ``wattclass model train --out classifier/models --version V``.
    """
    data = h200_data_dir()
    return [data / name for name in BUNDLED_RECORDINGS if (data / name).is_dir()]
