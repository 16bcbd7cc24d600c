"""The report's inputs: telemetry, labels, model metrics, policy decisions found under a data root.

Kept apart from rendering so the report works whatever the source (a test's DataFrame, the demo,
a site's own label file), and each missing input is a None the sections explain. Telemetry is
only listed here: ``report.data`` aggregates the files in DuckDB, no window goes into pandas.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from wattclass.argtypes import is_iso_date
from wattclass.errors import ConfigError, DataError
from wattclass.labeltable import LABELS
from wattclass.logsafe import clip

LABEL_COLUMNS = ("job_id", "user", "label", "confidence", "source", "n_windows", "energy_j", "gpu_hours")


@dataclass
class ReportInputs:
    """Everything the report is made of, plus where each piece came from (printed in the report)."""

    files: list[Path]  # telemetry Parquet files (aggregated by report.data, never loaded whole)
    labels: pd.DataFrame | None = None
    metrics: dict[str, Any] | None = None
    decisions: pd.DataFrame | None = None
    provenance: dict[str, str] = field(default_factory=dict)
    date: str | None = None
    job_records: pd.DataFrame | None = None  # Slurm records (job_id, user, account...) of the day
    whatif_effects: dict[str, Any] | None = None  # wattclass.report.whatif (issue 12)
    first_date: str | None = None  # the span's first day read (``date`` with one day)


def telemetry_dates(root: Path) -> list[str]:
    """The ``date=YYYY-MM-DD`` partitions under ``<root>/telemetry``, oldest first."""
    from wattclass.classifier.reader import partition_dates

    return partition_dates(Path(root) / "telemetry")


def telemetry_day_files(root: Path, date: str | None = None, days: int = 1
                        ) -> tuple[list[Path], str, list[str]]:
    """Telemetry files of ``days`` days ending at ``date`` (default: the most recent day present)
    under ``<root>/telemetry/date=YYYY-MM-DD/host=*/*.parquet``; returns (files, date, days read).

    Only listed, never read here: ``report.data`` aggregates them in DuckDB (a month of 1,000
    GPUs is 259 M windows, issue 15)."""
    if days < 1:
        raise ConfigError(f"--days must be at least 1, got {days}")
    root = Path(root)
    dates = telemetry_dates(root)
    if not dates:
        raise DataError(f"{root / 'telemetry'}: no date=YYYY-MM-DD telemetry partitions found")
    if date is None:
        date = dates[-1]
    else:
        if not is_iso_date(date):
            raise ConfigError(f"--date {date!r}: expected YYYY-MM-DD")
        if date not in dates:
            raise DataError(f"{root / 'telemetry'}: no telemetry for {date} (have {', '.join(dates)})")
    end = dt.date.fromisoformat(date)
    wanted = [(end - dt.timedelta(days=k)).isoformat() for k in range(days - 1, -1, -1)]
    read = [d for d in wanted if d in dates]
    files = [f for d in read for f in sorted((root / "telemetry" / f"date={d}").glob("host=*/*.parquet"))
             if not f.name.startswith(".")]
    if not files:
        raise DataError(f"{root / 'telemetry' / f'date={date}'}: no host=*/*.parquet files")
    return files, date, read


def read_table_file(path: Path, what: str) -> pd.DataFrame:
    """A CSV or Parquet file as a DataFrame (job_id as text), with errors naming the file."""
    path = Path(path)
    try:
        is_parquet = path.suffix == ".parquet"
        df = pd.read_parquet(path) if is_parquet else pd.read_csv(path, dtype={"job_id": str})
    except FileNotFoundError as exc:
        raise DataError(f"{path}: {what} file not found") from exc
    except Exception as exc:  # pandas raises many types for unreadable files
        raise DataError(f"{path}: cannot read {what} file: {exc}") from exc
    if "job_id" in df.columns:
        df["job_id"] = df["job_id"].astype(str)
    return df


#: The labels a label file may hold (``unlabelled``: known to have none; a blank cell is the same).
KNOWN_LABELS: tuple[str, ...] = (*LABELS, "unlabelled")


def normalise_labels(df: pd.DataFrame, source: str, label_column: str = "label") -> pd.DataFrame:
    """Check a label table has job_id and the label column; rename the latter to ``label``.

    Labels are read without case or surrounding blanks ("Memory " is memory); any other value is
    a DataError naming the file, the value and a job holding it. Why: a label the report does
    not know ("Memory", a typo, a class of another tool) was kept as a label of its own, so its
    jobs got no cap in the savings estimate and their energy left its total without a word."""
    for col in ("job_id", label_column):
        if col not in df.columns:
            raise DataError(f"{source}: labels are missing column {col}")
    df = df.rename(columns={label_column: "label"}) if label_column != "label" else df
    df = df.dropna(subset=["label"]).copy()
    df["label"] = df["label"].astype(str).str.strip().str.lower()
    df = df.loc[df["label"] != ""]
    bad = df.loc[~df["label"].isin(KNOWN_LABELS)]
    if len(bad):
        first = bad.iloc[0]
        raise DataError(f"{source}: label {clip(str(first['label']))!r} of job {clip(str(first['job_id']))} "
                        f"(and {len(bad) - 1} more row(s)) is none of {', '.join(KNOWN_LABELS)}")
    return df.drop_duplicates("job_id", keep="last")


def _newest(paths: list[Path]) -> Path | None:
    paths = [p for p in paths if p.is_file()]
    return max(paths, key=lambda p: p.stat().st_mtime) if paths else None


def read_model_metrics(path: Path) -> dict[str, Any]:
    """Model metrics from the classifier's registry.json (the ``current`` model's entry), a
    model.json (its ``metrics``) or a plain metrics JSON; the result has ``version`` when known."""
    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: model metrics are not valid JSON: {exc}") from exc
    except OSError as exc:
        raise DataError(f"{path}: cannot read model metrics: {exc}") from exc
    if not isinstance(data, dict):
        raise DataError(f"{path}: model metrics must be a JSON object")
    if "versions" in data:  # registry
        cur = data.get("current")
        entry = next((v for v in data["versions"] if v.get("version") == cur), None)
        if entry is None:
            raise DataError(f"{path}: registry's current model {cur!r} has no entry in versions")
        out = dict(entry.get("metrics") or {})
        out["version"] = cur
        newest = data["versions"][-1]
        if newest.get("version") != cur and newest.get("gate"):
            out["rejected"] = {"version": newest["version"], **newest["gate"]}
        if entry.get("gate"):
            out["gate"] = entry["gate"]
        return out
    if isinstance(data.get("metrics"), dict):  # a model.json
        return {**data["metrics"], "version": data.get("model_version")}
    return data


def load_inputs(
    root: Path,
    date: str | None = None,
    labels_file: Path | None = None,
    label_column: str = "label",
    metrics_file: Path | None = None,
    decisions_file: Path | None = None,
    days: int = 1,
) -> ReportInputs:
    """Gather the report's inputs from a data root; explicit files win over the root's layout.

    ``days`` days ending at ``date``; labels and job records come from every day read (a job's
    latest row wins).
    """
    root = Path(root)
    files, day, read = telemetry_day_files(root, date, days)
    span = read[0] if len(read) == 1 else f"{read[0]}..{read[-1]}"
    prov = {"telemetry": f"{root / 'telemetry'} date={span} ({len(files)} files)"}

    labels = None
    if labels_file is not None:
        labels = normalise_labels(read_table_file(labels_file, "labels"), str(labels_file), label_column)
        prov["labels"] = str(labels_file)
    else:
        # The classifier's label store: <root>/classifier/labels/date=D/labels.parquet (nightly).
        found = [root / "classifier" / "labels" / f"date={d}" / "labels.parquet" for d in read]
        found = [p for p in found if p.is_file()]
        if found:
            parts = [normalise_labels(read_table_file(p, "labels"), str(p), "label") for p in found]
            labels = pd.concat(parts, ignore_index=True).drop_duplicates("job_id", keep="last")
            prov["labels"] = f"{found[0] if len(found) == 1 else f'{len(found)} days'} (nightly label store)"
    if metrics_file is not None and not Path(metrics_file).is_file():
        raise DataError(f"{metrics_file}: model metrics file not found")
    mfile = metrics_file or root / "classifier" / "models" / "registry.json"
    metrics = None
    if Path(mfile).is_file():
        metrics = read_model_metrics(Path(mfile))
        prov["model metrics"] = f"{mfile} (model {metrics.get('version', '?')})"
    decisions = None
    dfile = decisions_file or _newest(
        [
            root / "decisions.csv",
            root / "decisions.parquet",
            *(root / "decisions").glob("*.csv"),
            *(root / "decisions").glob("*.parquet"),
        ]
    )
    if dfile is not None:
        decisions = read_table_file(dfile, "decisions")
        prov["policy decisions"] = str(dfile)
    records = None
    rfiles = []
    for d in read:
        for rfile in (root / "jobs" / f"date={d}" / "jobs.parquet", root / "jobs" / f"date={d}" / "jobs.csv"):
            if rfile.is_file():
                rfiles.append(rfile)
                break
    if rfiles:
        recs = [read_table_file(f, "job records") for f in rfiles]
        records = pd.concat(recs, ignore_index=True)
        if "job_id" in records.columns:
            records = records.drop_duplicates("job_id", keep="last")
        prov["job records"] = f"{rfiles[0] if len(rfiles) == 1 else f'{len(rfiles)} days'} (accounts)"
    return ReportInputs(files, labels, metrics, decisions, prov, day, records, first_date=read[0])
