"""``wattclass report``: the page a site looks at every morning, as ONE self-contained HTML file.

Self-contained (PNG images inline as base64 data URIs, inline CSS, no scripts, no external
assets) so it can be mailed, attached to a ticket or opened from a shared folder on a machine
with no network. Structure:

- ``load.py``: finds telemetry, labels, model metrics and policy decisions under a data root;
- ``data.py``: aggregates the telemetry in DuckDB (per job, per label, per GPU and time bucket):
  no window is loaded into pandas, so a month of 1,000 GPUs fits (issue 15);
- ``sections.py``: one function per section, in page order; ``templates/``: the HTML (Jinja2),
  one template per section, editable without reading Python;
- ``render_report(...)`` here: a pure function of telemetry files or DataFrames/dicts -> HTML
  (what tests and the demo call); the CLI is in ``wattclass.report.cli`` (registering it must not
  import pandas).

Every estimate (useful work, energy saved) is labelled as an estimate with its assumptions; a
missing input (no model yet, no decisions) renders as a short "not available: why" note.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from wattclass.errors import DataError
from wattclass.report.load import (
    LABEL_COLUMNS,
    ReportInputs,
    load_inputs,
    normalise_labels,
    read_model_metrics,
    read_table_file,
    telemetry_dates,
    telemetry_day_files,
)
from wattclass.report.sections import decision_keys

if TYPE_CHECKING:  # the data module (DuckDB) is imported where the report is built
    from wattclass.report.data import ReportData

__all__ = [
    "LABEL_COLUMNS",
    "ReportInputs",
    "decision_keys",
    "load_inputs",
    "normalise_labels",
    "read_model_metrics",
    "read_table_file",
    "render_report",
    "telemetry_dates",
    "telemetry_day_files",
    "write_report",
]


def _quality_notes(agg: ReportData) -> dict[str, str]:
    """The data-quality notes: the page's numbers leave these rows out, or count them once, as the
    nightly does."""
    notes: dict[str, str] = {}
    if agg.rejected_rows:
        why = "; ".join(f"{k}: {v:,}" for k, v in agg.rejected_rows.items())
        notes["impossible windows left out"] = (f"{sum(agg.rejected_rows.values()):,} ({why}), as the "
                                                "nightly run rejects them (classifier.validity)")
    if agg.skipped_files:
        first, why = next(iter(agg.skipped_files.items()))
        notes["unreadable files skipped"] = f"{len(agg.skipped_files):,} (e.g. {first}: {why})"
    if agg.duplicate_windows:
        notes["duplicate windows counted once"] = (f"{agg.duplicate_windows:,} (the same GPU, job and "
                                                   "window start in two files), as the nightly counts them")
    return notes


def render_report(
    telemetry: pd.DataFrame | Sequence[Path],
    labels: pd.DataFrame | None = None,
    metrics: Mapping[str, Any] | None = None,
    decisions: pd.DataFrame | None = None,
    *,
    title: str = "wattclass report",
    provenance: Mapping[str, str] | None = None,
    max_gpus: int = 16,
    caps: Mapping[str, str] | None = None,
    caps_source: str | None = None,
    job_records: pd.DataFrame | None = None,
    whatif_effects: Mapping[str, Any] | None = None,
) -> str:
    """The report as one HTML document. ``telemetry``: telemetry v1 Parquet files (what the CLI
    passes; aggregated in DuckDB by ``report.data``, never loaded whole) or a DataFrame of windows
    (tests, the demo; aggregated the same way).

    Without ``labels`` the job labels are computed with the classifier's GPM rule
    (``wattclass.classifier.rules``) on the telemetry (windows without GPM do not count).
    ``caps`` (label -> "60%"/"350W", e.g. from ``--policy``) win over caps read from the decisions;
    without either, the example policy's caps are used and the page says so. ``job_records``
    (Slurm records with ``account``) give the per-account table where the labels have no account.
    """
    from wattclass.report import data as report_data
    from wattclass.report import estimates as est
    from wattclass.report import render
    from wattclass.report import sections as sec

    if caps is not None:
        used_caps: dict[str, str] | None = {**est.DEFAULT_CAPS, **dict(caps)}
        src = caps_source or "from the policy"
    else:
        used_caps = est.caps_from_decisions(decisions)
        src = (
            "from the policy decisions"
            if used_caps is not None
            else "the example policy, deploy/policy.example.toml"
        )
    if isinstance(telemetry, pd.DataFrame):
        if telemetry.empty:
            raise DataError("report: the telemetry has no windows")
        agg = report_data.load(windows=telemetry, labels=labels, caps=used_caps, max_gpus=max_gpus)
    else:
        agg = report_data.load(files=[Path(f) for f in telemetry], labels=labels, caps=used_caps,
                               max_gpus=max_gpus)
    prov = {**(provenance or {}), **_quality_notes(agg)}
    if agg.labels_computed:
        prov["labels"] = (
            "computed here with the GPM rule of wattclass.classifier.rules (no label store found)"
        )
    jobs = agg.jobs.copy()
    acct_src = labels if labels is not None and "account" in labels.columns else job_records
    if acct_src is not None and {"job_id", "account"} <= set(acct_src.columns):
        acct = acct_src.astype({"job_id": str}).drop_duplicates("job_id", keep="last").set_index("job_id")
        jobs["account"] = jobs["job_id"].astype(str).map(acct["account"])
    data = sec.ReportData(
        agg=agg,
        labels=labels,
        jobs=jobs,
        metrics=metrics,
        decisions=decisions,
        caps=used_caps,
        caps_source=src,
        provenance=prov,
        max_gpus=max_gpus,
        whatif_effects=whatif_effects,
    )
    parts: list[tuple[str, Mapping[str, Any]]] = []
    for fn in sec.SECTIONS:
        v = fn(data)
        if v is not None:
            parts.append((fn.__name__, v))
    return render.render_page(title, sec.subtitle(data), parts)


def policy_caps(path: Path) -> tuple[dict[str, str], str]:
    """The caps per label of a policy TOML (``--policy``), and a note saying where they came from."""
    from wattclass.policy import load_policy

    pol = load_policy(Path(path))
    return {lab: cap.text() for lab, cap in pol.caps.items()}, f"from the policy {path} ({pol.mode} mode)"


def load_whatif_effects(root: Path, date: str | None, policy: Path | None, response: Path | None,
                        truth: Path | None, prov: dict[str, str], date_from: str | None = None
                        ) -> dict[str, Any]:
    """The what-if (if a policy is given) over ``date_from`` (default ``date``) to ``date``, the
    report's span, and the stored canary effects: the section's variables."""
    import json
    import math

    from wattclass.classifier.cli import load_effects
    from wattclass.report.whatif import whatif_effects_vars

    whatif = None
    whatif_why = ""
    if policy is not None:
        from wattclass.policy import load_policy
        from wattclass.savings.response import load_response
        from wattclass.savings.simulate import NoJobWindows, simulate

        pol, resp = load_policy(policy), load_response(response) if response else None
        first = date_from or date
        span = f"{first}..{date}" if first != date else f"{date}"
        try:
            res = simulate(root, pol, first, date, resp)
        except NoJobWindows:  # a quiet day: the rest of the page still stands
            whatif_why = f"no job windows in telemetry on {span}, nothing to re-run under {policy}"
        else:
            whatif = {"span": span, "policy": str(policy), "model": res.model, "totals": res.totals,
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
    return whatif_effects_vars(whatif, effects, truth_doc, whatif_why)


def write_report(
    inputs: ReportInputs, out: Path, title: str | None = None, policy: Path | None = None
) -> Path:
    """Render ``inputs`` and write the HTML atomically to ``out``; ``policy`` supplies the caps."""
    from wattclass.fsutil import atomic_write_text

    caps, caps_source = policy_caps(policy) if policy is not None else (None, None)
    if policy is not None:
        inputs.provenance["policy"] = str(policy)

    page = render_report(
        inputs.files,
        inputs.labels,
        inputs.metrics,
        inputs.decisions,
        title=title or f"wattclass report {inputs.date or ''}".strip(),
        provenance=inputs.provenance,
        caps=caps,
        caps_source=caps_source,
        job_records=inputs.job_records,
        whatif_effects=inputs.whatif_effects,
    )
    atomic_write_text(Path(out), page)
    return Path(out)


# ---------------------------------------------------------------------------------------------
# CLI
