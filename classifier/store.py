"""What the nightly run keeps under ``<data_root>/classifier/``: labels, samples, models, summaries.

    labels/date=YYYY-MM-DD/labels.parquet      one row per job labelled that day
    training/date=YYYY-MM-DD/windows.parquet   sampled GPM-labelled windows (features, rule class,
                                               roofline margin, length dur_s)
    models/registry.json, models/<version>/    every trained model with its metrics; ``current``
    summaries/date=YYYY-MM-DD.json             the night's summary
    effects/date=YYYY-MM-DD/effects.parquet    canary effects per label and cap, as of that night
    cache/base-training-<key>.npz              the bundled recordings as training windows
                                               (training.cached_training_set; safe to delete)

One file per date, replaced atomically: re-running a night replaces that night (idempotent) and
"appending" a night never rewrites others. The registry starts with the packaged default model.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from wattclass.classifier.features import FEATURES
from wattclass.classifier.model import TrainingSet, WindowModel, default_model_dir, load_model
from wattclass.errors import DataError
from wattclass.fsutil import atomic_write_text, atomic_writer

log = logging.getLogger(__name__)


class ClassifierStore:
    """Paths and atomic reads/writes for one data root."""

    def __init__(self, data_root: Path) -> None:
        self.root = Path(data_root) / "classifier"

    # ---- labels
    def labels_path(self, date: str) -> Path:
        return self.root / "labels" / f"date={date}" / "labels.parquet"

    def write_labels(self, date: str, labels: pd.DataFrame) -> Path:
        path = self.labels_path(date)
        _write_parquet(path, pa.Table.from_pandas(labels.assign(date=date), preserve_index=False))
        return path

    def label_history(self, since: str | None = None) -> pd.DataFrame:
        """All stored labels (dates >= ``since``), oldest first; unreadable days are skipped."""
        frames = []
        for p in sorted((self.root / "labels").glob("date=*/labels.parquet")):
            if since is not None and p.parent.name.removeprefix("date=") < since:
                continue
            try:
                frames.append(pd.read_parquet(p))
            except (OSError, pa.ArrowException) as exc:
                # its jobs leave the label table's history: say so, naming the day's file
                log.warning("label store: skipping unreadable %s: %s", p, str(exc).splitlines()[0][:200])
                continue
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    # ---- training samples
    def write_sample(self, date: str, ts: TrainingSet) -> None:
        margin = ts.margin if ts.margin is not None else np.full(len(ts), np.nan)
        dur = ts.dur if ts.dur is not None else np.full(len(ts), np.nan)
        t = pa.table({**{f: ts.X[:, i] for i, f in enumerate(FEATURES)},
                      "window_class": ts.y, "group": ts.group.astype(str),
                      "roofline_margin": np.asarray(margin, dtype=np.float64),
                      "dur_s": np.asarray(dur, dtype=np.float64)})
        _write_parquet(self.root / "training" / f"date={date}" / "windows.parquet", t)

    def samples(self) -> TrainingSet:
        parts = []
        for p in sorted((self.root / "training").glob("date=*/windows.parquet")):
            try:
                t = pq.read_table(p)
            except (OSError, pa.ArrowException) as exc:
                log.warning("training samples: skipping unreadable %s: %s", p, str(exc).splitlines()[0][:200])
                continue
            # A feature added after the sample was written is unknown there: NaN (LightGBM's missing).
            nan = np.full(t.num_rows, np.nan)
            X = np.column_stack([t.column(f).to_numpy() if f in t.column_names else nan
                                 for f in FEATURES]).astype(np.float32)
            y = t.column("window_class").to_numpy().astype(np.int8)
            group = np.asarray(t.column("group").to_pylist(), dtype=object)
            # samples written before the roofline-margin model: no margin (NaN, not trained on)
            margin = (t.column("roofline_margin").to_numpy(zero_copy_only=False).astype(np.float64)
                      if "roofline_margin" in t.column_names else nan)
            # samples written before window lengths were kept: unknown (NaN, a whole window)
            dur = (t.column("dur_s").to_numpy(zero_copy_only=False).astype(np.float64)
                   if "dur_s" in t.column_names else nan)
            parts.append(TrainingSet(X, y, group, [p.parent.name], dur=dur, margin=margin))
        return TrainingSet.concat(parts)

    # ---- canary effects
    def write_effects(self, date: str, effects: pd.DataFrame) -> Path:
        path = self.root / "effects" / f"date={date}" / "effects.parquet"
        _write_parquet(path, pa.Table.from_pandas(effects.assign(date=date), preserve_index=False))
        return path

    def latest_effects(self) -> pd.DataFrame | None:
        """The newest night's stored effects, or None if no night stored any."""
        for p in sorted((self.root / "effects").glob("date=*/effects.parquet"), reverse=True):
            try:
                return pd.read_parquet(p)
            except (OSError, pa.ArrowException) as exc:
                raise DataError(f"{p}: unreadable effects file: {exc}") from exc
        return None

    # ---- summaries
    def write_summary(self, date: str, summary: dict[str, Any]) -> Path:
        path = self.root / "summaries" / f"date={date}.json"
        atomic_write_text(path, json.dumps(summary, indent=2, sort_keys=True, default=str) + "\n")
        return path


class ModelRegistry:
    """Model versions with their metrics; ``current`` is the promoted one used for labelling."""

    def __init__(self, data_root: Path, default_dir: Path | None = None) -> None:
        self.root = Path(data_root) / "classifier" / "models"
        self.default_dir = default_dir or default_model_dir()
        self.index_path = self.root / "registry.json"

    def index(self) -> dict[str, Any]:
        if not self.index_path.exists():
            return self._init()
        try:
            data: dict[str, Any] = json.loads(self.index_path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise DataError(f"{self.index_path}: unreadable model registry: {exc}") from exc
        return data

    def _init(self) -> dict[str, Any]:
        """Seed the registry with the packaged default model."""
        model = load_model(self.default_dir)
        shutil.copytree(self.default_dir, self.root / model.version, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.py"))
        index = {"current": model.version, "versions": [self._entry(model, promoted=True, gate=None)]}
        self._save(index)
        return index

    def _entry(self, model: WindowModel, promoted: bool, gate: dict[str, Any] | None) -> dict[str, Any]:
        return {
            "version": model.version,
            "created": model.meta.get("created"),
            "promoted": promoted,
            "metrics": model.meta.get("metrics"),
            "gate": gate,
            "training_data": model.meta.get("training_data"),
        }

    def _save(self, index: dict[str, Any]) -> None:
        atomic_write_text(self.index_path, json.dumps(index, indent=2, sort_keys=True) + "\n")

    def current(self) -> WindowModel:
        """The promoted model; after an upgrade that changed the feature list, or one that brought the
        evidence cap to a registry whose model has none, the packaged default.

        A model trained on other features cannot label this version's windows, and failing every
        night until someone intervenes is worse than the shipped model: it is registered, made
        current (gate ``{"reason": "features changed"}``) and a warning names the old version. A
        model without the evidence cap (issue 13 round 10) gives long jobs confidences its maps
        never saw (0.98-0.99 on costly errors), and its nightly candidates keep its recipe, so they
        never gain the cap: the packaged model replaces it the same way (gate ``{"reason":
        "evidence cap"}``); the old version stays in the registry.
        """
        index = self.index()
        path = self.root / index["current"]
        try:
            meta = json.loads((path / "model.json").read_text())
            features = meta.get("features")
            uncapped = "evidence_cap_windows" not in meta
        except (OSError, json.JSONDecodeError):
            features, uncapped = None, False  # load_model below reports it
        reason = ("features changed" if features is not None and list(features) != list(FEATURES)
                  else "evidence cap" if uncapped and self._default_is_capped() else None)
        if reason is not None:
            default = load_model(self.default_dir)
            why = ("was trained on another feature list (an older wattclass)" if reason == "features changed"
                   else "has no evidence cap (long jobs would get confidences its calibration never saw)")
            log.warning("model %s %s; using the packaged model %s instead", index["current"], why,
                        default.version)
            shutil.copytree(self.default_dir, self.root / default.version, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.py"))
            index["versions"] = [v for v in index["versions"] if v["version"] != default.version]
            index["versions"].append(self._entry(default, promoted=True, gate={"reason": reason}))
            index["current"] = default.version
            self._save(index)
        return load_model(self.root / index["current"])

    def _default_is_capped(self) -> bool:
        try:
            return "evidence_cap_windows" in json.loads((self.default_dir / "model.json").read_text())
        except (OSError, json.JSONDecodeError):
            return False

    def new_version(self, stem: str) -> str:
        taken = {v["version"] for v in self.index()["versions"]}
        version, k = stem, 1
        while version in taken or (self.root / version).exists():
            k += 1
            version = f"{stem}.{k}"
        return version

    def add(self, model: WindowModel, promoted: bool, gate: dict[str, Any] | None) -> None:
        """Store a model (promoted or not, so its metrics are kept); move ``current`` if promoted."""
        model.save(self.root / model.version)
        index = self.index()
        index["versions"].append(self._entry(model, promoted, gate))
        if promoted:
            index["current"] = model.version
        self._save(index)


def _write_parquet(path: Path, table: pa.Table) -> None:
    with atomic_writer(path) as fh:
        pq.write_table(table, fh, compression="zstd")


def utc_day_bounds(date: str) -> tuple[dt.datetime, dt.datetime]:
    day = dt.datetime.strptime(date, "%Y-%m-%d").replace(tzinfo=dt.UTC)
    return day, day + dt.timedelta(days=1)
