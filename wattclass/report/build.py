# long: data loading, sections and the CLI of the report in one module; to be split
"""``wattclass report``: the page a site looks at every morning, as ONE self-contained HTML file.

Self-contained (PNG images inline as base64 data URIs, inline CSS, no scripts, no external
assets) so it can be mailed, attached to a ticket or opened from a shared folder on a machine
with no network. Structure:

- ``render_report(...)``: a pure function of DataFrames/dicts -> HTML (what tests and the demo call);
- ``load_inputs(...)``: finds telemetry, labels, model metrics and policy decisions under a data root;
- ``register(sub)``: the CLI.

Every estimate (useful work, energy saved) is labelled as an estimate with its assumptions; a
missing input (no model yet, no decisions) renders as a short "not available: why" note.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import html
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from wattclass.errors import ConfigError, DataError

LABEL_COLUMNS = ("job_id", "user", "label", "confidence", "source", "n_windows", "energy_j", "gpu_hours")


# ---------------------------------------------------------------------------------------------
# Loading


@dataclass
class ReportInputs:
    """Everything the report is made of, plus where each piece came from (printed in the report)."""

    windows: pd.DataFrame
    labels: pd.DataFrame | None = None
    metrics: dict[str, Any] | None = None
    decisions: pd.DataFrame | None = None
    provenance: dict[str, str] = field(default_factory=dict)
    date: str | None = None
    whatif_effects_html: str | None = None  # wattclass.report.whatif (issue 12)


def telemetry_dates(root: Path) -> list[str]:
    """The ``date=YYYY-MM-DD`` partitions under ``<root>/telemetry``, oldest first."""
    base = Path(root) / "telemetry"
    return sorted(p.name.removeprefix("date=") for p in base.glob("date=*") if p.is_dir())


def read_telemetry_files(files: list[Path]) -> pd.DataFrame:
    """Read v1 telemetry Parquet files into one DataFrame (each conformed to the v1 schema)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from wattclass.schema import conform

    tables = []
    for f in files:
        try:
            t = pq.read_table(f)
        except (OSError, pa.ArrowException) as exc:
            raise DataError(f"{f}: cannot read telemetry Parquet: {exc}") from exc
        tables.append(conform(t, f))
    if not tables:
        raise DataError("no telemetry files to read")
    df = pa.concat_tables(tables).to_pandas()
    df["job_id"] = df["job_id"].astype(object).where(df["job_id"].notna(), None)
    out: pd.DataFrame = df
    return out


def load_telemetry(root: Path, date: str | None = None) -> tuple[pd.DataFrame, str]:
    """Telemetry of one day under ``<root>/telemetry/date=YYYY-MM-DD/host=*/*.parquet``.

    Without ``date``, the most recent day present.
    """
    root = Path(root)
    dates = telemetry_dates(root)
    if not dates:
        raise DataError(f"{root / 'telemetry'}: no date=YYYY-MM-DD telemetry partitions found")
    if date is None:
        date = dates[-1]
    else:
        try:
            dt.date.fromisoformat(date)
        except ValueError as exc:
            raise ConfigError(f"--date {date!r}: expected YYYY-MM-DD") from exc
        if date not in dates:
            raise DataError(f"{root / 'telemetry'}: no telemetry for {date} (have {', '.join(dates)})")
    files = sorted((root / "telemetry" / f"date={date}").glob("host=*/*.parquet"))
    if not files:
        raise DataError(f"{root / 'telemetry' / f'date={date}'}: no host=*/*.parquet files")
    return read_telemetry_files(files), date


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


def normalise_labels(df: pd.DataFrame, source: str, label_column: str = "label") -> pd.DataFrame:
    """Check a label table has job_id and the label column; rename the latter to ``label``."""
    for col in ("job_id", label_column):
        if col not in df.columns:
            raise DataError(f"{source}: labels are missing column {col}")
    df = df.rename(columns={label_column: "label"}) if label_column != "label" else df
    df = df.dropna(subset=["label"]).copy()
    df["label"] = df["label"].astype(str)
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
) -> ReportInputs:
    """Gather the report's inputs from a data root; explicit files win over the root's layout."""
    root = Path(root)
    windows, day = load_telemetry(root, date)
    prov = {"telemetry": f"{root / 'telemetry' / f'date={day}'} ({len(windows)} windows)"}

    labels = None
    if labels_file is not None:
        labels = normalise_labels(read_table_file(labels_file, "labels"), str(labels_file), label_column)
        prov["labels"] = str(labels_file)
    else:
        # The classifier's label store: <root>/classifier/labels/date=D/labels.parquet (nightly).
        lpath = root / "classifier" / "labels" / f"date={day}" / "labels.parquet"
        if lpath.is_file():
            labels = normalise_labels(read_table_file(lpath, "labels"), str(lpath), "label")
            prov["labels"] = f"{lpath} (nightly label store)"
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
    return ReportInputs(windows, labels, metrics, decisions, prov, day)


# ---------------------------------------------------------------------------------------------
# Rendering

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1100px;
color:#222;line-height:1.45;padding:0 1rem}
h1{margin-bottom:.2rem} h2{margin-top:2.2rem;border-bottom:1px solid #ddd;padding-bottom:.2rem}
.sub{color:#666;margin-top:0}
.cards{display:flex;flex-wrap:wrap;gap:.8rem;margin:1rem 0}
.card{border:1px solid #ddd;border-radius:8px;padding:.6rem 1rem;min-width:9rem}
.card b{display:block;font-size:1.5rem}
.card span{color:#666;font-size:.85rem}
img{max-width:100%;height:auto;display:block;margin:.6rem 0}
table{border-collapse:collapse;font-size:.9rem;margin:.6rem 0}
td,th{border:1px solid #ddd;padding:.25rem .6rem;text-align:right}
th{background:#f5f5f5} td:first-child,th:first-child{text-align:left}
.na{background:#fff8e1;border-left:4px solid #e6a817;padding:.5rem .8rem}
.est{background:#eef5ff;border-left:4px solid #1f77b4;padding:.5rem .8rem}
small{color:#666}
"""


def _img(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _na(what: str, why: str) -> str:
    return f'<p class="na"><b>{html.escape(what)}: not available.</b> {html.escape(why)}</p>'


def _num(v: float) -> str:
    """A number with as many digits as a person needs: 12,345 / 12.35 / 0.0123."""
    a = abs(v)
    return f"{v:,.0f}" if a >= 100 else f"{v:.2f}" if a >= 1 or a == 0 else f"{v:.3g}"


def _table(df: pd.DataFrame) -> str:
    return df.to_html(escape=True, float_format=_num, border=0, na_rep="-")


def _kwh(v: float) -> str:
    """Energy for people: kWh, or Wh when under 1 kWh (a short test run)."""
    return f"{v:,.1f} kWh" if abs(v) >= 1 else f"{v * 1000:,.0f} Wh"


def _card(value: str, what: str) -> str:
    return f'<div class="card"><b>{html.escape(value)}</b><span>{html.escape(what)}</span></div>'


# long: the whole page in one f-string flow; to be split into one function per section
def render_report(
    windows: pd.DataFrame,
    labels: pd.DataFrame | None = None,
    metrics: Mapping[str, Any] | None = None,
    decisions: pd.DataFrame | None = None,
    *,
    title: str = "wattclass report",
    provenance: Mapping[str, str] | None = None,
    max_gpus: int = 16,
    whatif_effects_html: str | None = None,
) -> str:
    """The report as one HTML document. ``windows`` are telemetry v1 rows; see module docstring.

    Without ``labels`` the job labels are computed with the classifier's GPM rule
    (``wattclass.classifier.rules``) on the telemetry (windows without GPM do not count).
    """
    from wattclass.report import estimates as est
    from wattclass.report import plots

    if windows.empty:
        raise DataError("report: the telemetry has no windows")
    w = windows.copy()
    w["job_id"] = w["job_id"].astype(object).where(w["job_id"].notna(), None)
    w.loc[w["job_id"].notna(), "job_id"] = w.loc[w["job_id"].notna(), "job_id"].astype(str)
    prov = dict(provenance or {})
    if labels is None:
        labels = est.rule_job_labels(w)
        prov["labels"] = (
            "computed here with the GPM rule of wattclass.classifier.rules (no label store found)"
        )
    w = est.attach_labels(w, labels)
    jobs = est.job_table(w, labels)
    bl = est.by_label(w)
    t0, t1 = w["ts_start"].min(), w["ts_end"].max()
    n_gpus = len(w[["host", "gpu_uuid"]].drop_duplicates())
    caps = est.caps_from_decisions(decisions)
    sav = est.estimate_savings(w, caps)
    total_kwh = float(bl["energy_kwh"].sum())
    mem_share = float(bl["energy_kwh"].get("memory", 0.0)) / total_kwh if total_kwh > 0 else 0.0

    out: list[str] = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f'<p class="sub">{html.escape(f"{t0:%Y-%m-%d %H:%M} – {t1:%Y-%m-%d %H:%M} UTC")}, '
        f"{len(w['host'].unique())} node(s), {n_gpus} GPU(s), {len(jobs)} job(s). "
        f"Generated {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC.</p>",
        '<div class="cards">',
        _card(_kwh(bl["energy_kwh"].sum()), "GPU energy (measured)"),
        _card(f"{bl['gpu_hours'].sum():,.1f}", "GPU-hours"),
        _card(f"{len(jobs)}", "jobs"),
        _card(f"{mem_share:.0%}", "of energy in memory-bound jobs"),
        _card(
            _kwh(sav.saved_kwh),
            f"estimated saving ({sav.saved_kwh / max(sav.total_kwh, 1e-9):.0%} of job energy)",
        ),
        "</div>",
    ]

    # -- energy and GPU-hours by label
    out += [
        "<h2>Where the energy went</h2>",
        "<p>Measured: each window's energy is the GPU's own energy-counter delta. Windows of no job "
        "are the GPUs' idle time between jobs.</p>",
        _img(plots.energy_and_hours(bl), "Energy, GPU-hours and kWh per GPU-hour by label"),
        _table(
            bl.rename(
                columns={
                    "energy_kwh": "energy (kWh)",
                    "gpu_hours": "GPU-hours",
                    "kwh_per_gpu_hour": "kWh per GPU-hour",
                }
            )
        ),
    ]

    # -- timeline
    n_all = len(w[["host", "gpu_index"]].drop_duplicates())
    more = f" (first {max_gpus} of {n_all} GPUs)" if n_all > max_gpus else ""
    out += [
        f"<h2>Power per GPU over time{more}</h2>",
        "<p>Mean power of each window, coloured by the label of the job on the GPU.</p>",
        _img(plots.power_timeline(w, max_gpus), "Power timeline per GPU coloured by job label"),
    ]

    # -- useful work per energy
    out.append("<h2>Estimated useful work per energy</h2>")
    wpe = est.work_per_energy(w)
    if wpe.empty:
        out.append(
            _na("Useful work per energy", "the telemetry has no GPM metrics (GPM needs Hopper or later).")
        )
    else:
        peaks = ", ".join(f"{k.removesuffix('_util_pct')} {v:g}" for k, v in est.H200_PEAK_TFLOPS.items())
        out += [
            _img(plots.work_per_energy(wpe), "Estimated TFLOP/s per kW by label"),
            '<p class="est"><b>Estimate.</b> TFLOP/s = Σ over GPM pipes of (pipe activity × the '
            f"H200 SXM's peak dense rate for that pipe, TFLOP/s: {html.escape(peaks)}; NVIDIA H200 "
            "datasheet, sparsity figures halved). The tensor pipe is counted at the BF16/FP16 rate "
            "since GPM does not say which precision ran. Pipe activity is the share of cycles the pipe "
            "was busy, not the share of its peak reached, so this overestimates real throughput; "
            "compare labels with each other, not with benchmarks. Energy is measured.</p>",
            _table(
                wpe.rename(
                    columns={
                        "tflop": "est. TFLOP",
                        "energy_kj": "energy (kJ)",
                        "tflops_per_kw": "est. TFLOP/s per kW",
                    }
                )
            ),
        ]

    # -- model
    out.append("<h2>Model: held-out accuracy</h2>")
    out += _model_section(metrics, plots)

    # -- decisions
    out.append("<h2>Policy decisions</h2>")
    if decisions is None or decisions.empty:
        out.append(
            _na(
                "Policy decisions",
                "no decisions file was found (the demo writes decisions.csv; "
                "on a cluster, the job_submit hook logs them).",
            )
        )
    else:
        if not {"status", "reason"} <= set(decisions.columns):
            out.append(_na("Policy decisions", "the decisions file has no status and reason columns."))
        else:
            key = decision_keys(decisions)
            counts = key.value_counts().sort_index()
            mode = "shadow" if (decisions["status"] == "shadow").any() else "enforce"
            out += [
                f"<p>{len(decisions)} new submission(s) decided as job_submit.lua decides them "
                f"(the policy is in <b>{mode}</b> mode"
                + (": caps are logged and recorded, nothing is applied" if mode == "shadow" else "")
                + "). <i>none</i> means the job runs uncapped, with the reason.</p>",
                _img(plots.decisions(counts), "Jobs per policy decision and cap"),
            ]
            if "label" in decisions.columns:
                ct = pd.crosstab(decisions["label"].fillna("(no label)"), key)
                out.append(_table(ct))

    # -- savings
    caps_txt = ", ".join(f"{k} {v}" for k, v in sav.caps.items())
    out += [
        "<h2>Estimated energy saved</h2>",
        _img(plots.savings(sav.table, sav.slowdown), "Measured energy per label and estimated saving"),
        f'<p class="est"><b>Estimate, not a measurement.</b> Caps applied: {html.escape(caps_txt)} '
        f"({'from the policy decisions' if caps is not None else 'the example policy in docs/design.md'}; "
        "% of each window's enforced power limit). "
        "<b>Measured</b>: every window's energy and mean power, and the job labels. "
        "<b>Assumed</b>: (1) a memory-bound or idle job under a cap draws min(measured power, cap) "
        "and keeps its speed, since it waits on HBM bandwidth, not on SM clock (on the H200 recording "
        "memory-bound work ran at the full 1980 MHz and 560-700 W); (2) compute-bound and mixed jobs "
        "save nothing: their runtime grows about as their power drops; (3) the black marks show "
        f"memory-bound and idle jobs running {sav.slowdown:.0%} longer under the cap instead, the "
        "published anchor (Samsi et al.: a 250→175 W cap on LLaMA inference, 23% less energy for "
        "6-7% more latency). "
        f"Result: <b>{_kwh(sav.saved_kwh)}</b> of {_kwh(sav.total_kwh)} job energy with no "
        f"slowdown, <b>{_kwh(sav.saved_kwh_slow)}</b> with {sav.slowdown:.0%} slowdown.</p>",
        _table(
            sav.table.rename(
                columns={
                    "energy_kwh": "energy (kWh)",
                    "saved_kwh": "saved, no slowdown",
                    "saved_kwh_slow": f"saved, {sav.slowdown:.0%} slower",
                }
            )
        ),
    ]

    if whatif_effects_html:
        out.append(whatif_effects_html)

    # -- top jobs
    top = jobs.sort_values("energy_j", ascending=False).head(15).copy()
    top["energy (kWh)"] = top["energy_j"] / 3.6e6
    top[["confidence", "source"]] = (
        top[["confidence", "source"]].astype(object).where(top[["confidence", "source"]].notna(), "-")
    )
    out += [
        "<h2>Jobs that used the most energy</h2>",
        _table(
            top[
                ["job_id", "user", "label", "confidence", "source", "n_windows", "gpu_hours", "energy (kWh)"]
            ].set_index("job_id")
        ),
    ]

    out.append("<h2>Inputs</h2><ul>")
    out += [f"<li><b>{html.escape(k)}</b>: {html.escape(v)}</li>" for k, v in prov.items()]
    out += [
        "</ul><p><small>wattclass report. Images are inline; this file needs no network.</small></p>",
        "</body></html>",
    ]
    return "\n".join(out)


def decision_keys(decisions: pd.DataFrame) -> pd.Series:
    """One text per decision: ``shadow: cap 60%`` or ``none: low_confidence``."""
    status = decisions["status"].astype(str)
    reason = decisions["reason"].astype(str)
    cap = decisions["cap"] if "cap" in decisions.columns else pd.Series(None, index=decisions.index)
    capped = cap.notna() & (cap.astype(str) != "") & (status != "none")
    return status + ": " + ("cap " + cap.astype(str)).where(capped, reason)


def _model_section(metrics: Mapping[str, Any] | None, plots: Any) -> list[str]:
    if not metrics:
        return [
            _na(
                "Model accuracy",
                "no model metrics were found: the nightly run writes them after it "
                "trains a model (GPU without GPM need one; with GPM the rule gives the label).",
            )
        ]
    out: list[str] = []
    facts = []
    for key, name in (
        ("accuracy", "held-out job accuracy"),
        ("ece", "calibration error (ECE)"),
        ("n_jobs", "jobs evaluated"),
        ("n_folds", "CV folds"),
        ("version", "model in use"),
    ):
        v = metrics.get(key)
        if v is not None:
            facts.append(_card(f"{v:.3f}" if isinstance(v, float) else str(v), name))
    if facts:
        out += ['<div class="cards">', *facts, "</div>"]
    cm = metrics.get("confusion", metrics.get("confusion_matrix"))
    classes = metrics.get("labels", metrics.get("classes"))
    if cm is not None and classes:
        out.append(_img(plots.confusion(cm, classes), "Confusion matrix of the model on held-out jobs"))
        out.append(
            "<p>Grouped cross-validation: each job's windows are predicted by a model that never saw "
            "that job. Rows: the GPM rule's label (the truth where GPM exists); columns: the model's "
            "prediction from basic NVML counters only (what GPUs without GPM get). Jobs that repeat "
            "a workload seen in training are easier than a new workload.</p>"
        )
    else:
        out.append(_na("Confusion matrix", "the model metrics have no confusion matrix and labels."))
    gate = metrics.get("rejected")
    if gate:
        out.append(
            f"<p>Last night's candidate {html.escape(str(gate['version']))} was not promoted: accuracy "
            f"{gate.get('candidate_accuracy', float('nan')):.3f} on the night's new jobs vs "
            f"{gate.get('incumbent_accuracy', float('nan')):.3f} for the model in use.</p>"
        )
    elif metrics.get("gate"):
        g = metrics["gate"]
        out.append(
            f"<p>Promoted by last night's gate: accuracy {g.get('candidate_accuracy', float('nan')):.3f} "
            f"on {g.get('new_jobs', '?')} new jobs vs {g.get('incumbent_accuracy', float('nan')):.3f} for "
            f"{html.escape(str(g.get('incumbent', 'the previous model')))}.</p>"
        )
    return out


def write_report(inputs: ReportInputs, out: Path, title: str | None = None) -> Path:
    """Render ``inputs`` and write the HTML atomically to ``out``."""
    from wattclass.fsutil import atomic_write_text

    page = render_report(
        inputs.windows,
        inputs.labels,
        inputs.metrics,
        inputs.decisions,
        title=title or f"wattclass report {inputs.date or ''}".strip(),
        provenance=inputs.provenance,
        whatif_effects_html=inputs.whatif_effects_html,
    )
    atomic_write_text(Path(out), page)
    return Path(out)


# ---------------------------------------------------------------------------------------------
# CLI


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add ``wattclass report``."""
    p = sub.add_parser(
        "report",
        help="write the daily report (one self-contained HTML file)",
        description="Plots of energy, labels, power, estimated useful work, model accuracy, policy "
        "decisions and estimated savings, from a data root, as one HTML file with inline images.",
    )
    p.add_argument("--data-root", type=Path, required=True, help="root holding telemetry/date=.../host=.../")
    p.add_argument("--date", help="day to report (YYYY-MM-DD; default: the most recent day)")
    p.add_argument("--out", type=Path, default=Path("report.html"), help="HTML file to write")
    p.add_argument(
        "--labels",
        type=Path,
        help="job labels CSV/Parquet (default: the nightly label store "
        "<root>/classifier/labels/date=D/, else the GPM rule on the telemetry)",
    )
    p.add_argument("--label-column", default="label", help="column of --labels holding the label")
    p.add_argument(
        "--metrics",
        type=Path,
        help="model registry.json, model.json or metrics JSON "
        "(default: <root>/classifier/models/registry.json, the model in use)",
    )
    p.add_argument(
        "--decisions", type=Path, help="policy decisions CSV/Parquet (default: <root>/decisions.csv)"
    )
    p.add_argument("--title", help="page title")
    p.add_argument("--policy", type=Path,
                   help="policy TOML: adds the what-if section (wattclass simulate over the reported day)")
    p.add_argument("--response", type=Path, help="with --policy: a site calibration (wattclass calibrate)")
    p.add_argument("--effects-truth", type=Path,
                   help="JSON {\"label/cap\": [runtime, energy]} of injected effects, shown next to the "
                   "measured ones (generated histories, the demo)")
    p.set_defaults(func=_cmd_report)


def load_whatif_effects(root: Path, date: str | None, policy: Path | None, response: Path | None,
                        truth: Path | None, prov: dict[str, str]) -> str:
    """The what-if (if a policy is given) and the stored canary effects, as the section's HTML."""
    import json
    import math

    from wattclass.classifier.cli import load_effects
    from wattclass.report.whatif import whatif_effects_section

    whatif = None
    if policy is not None:
        from wattclass.policy import load_policy
        from wattclass.savings.response import load_response
        from wattclass.savings.simulate import simulate

        res = simulate(root, load_policy(policy), date, date, load_response(response) if response else None)
        whatif = {"span": f"{date}", "policy": str(policy), "model": res.model, "totals": res.totals,
                  "by_label": res.by["label"].to_dict("records")}
        prov["what-if"] = f"wattclass simulate --policy {policy}" + (
            f" --response {response}" if response else "")
    effects = None
    if (Path(root) / "classifier").is_dir():
        eff, origin = load_effects(root)
        if len(eff):
            effects = [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
                       for r in eff.to_dict("records")]
            prov["canary effects"] = origin
    truth_doc = None
    if truth is not None:
        try:
            truth_doc = json.loads(Path(truth).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise DataError(f"{truth}: cannot read the injected effects: {exc}") from exc
    return whatif_effects_section(whatif, effects, truth_doc)


def _cmd_report(args: argparse.Namespace) -> int:
    inputs = load_inputs(
        args.data_root, args.date, args.labels, args.label_column, args.metrics, args.decisions
    )
    inputs.whatif_effects_html = load_whatif_effects(args.data_root, inputs.date, args.policy, args.response,
                                                     args.effects_truth, inputs.provenance)
    path = write_report(inputs, args.out, args.title)
    print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB)")
    return 0
