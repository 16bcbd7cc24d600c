"""The report's sections: one function each, in page order (``SECTIONS``).

A section function takes the ``ReportData`` (every input, plus the aggregates several sections
share, computed once) and returns the variables of its template,
``templates/sections/<function name>.html.j2``; or None to leave the section out. To add a section:
write the function, list it in ``SECTIONS``, add the template. Numbers are computed here, words
and layout live in the template.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from wattclass.report import data, peaks, plots
from wattclass.report import estimates as est
from wattclass.report.render import conf, kwh, num, pct, table

Vars = dict[str, Any]


@dataclass
class ReportData:
    """Inputs and shared aggregates. ``agg``: the DuckDB aggregates of the windows (``report.data``;
    no window is in pandas); ``jobs``: its per-job table, with ``account`` where known."""

    agg: data.ReportData
    labels: pd.DataFrame | None
    jobs: pd.DataFrame
    metrics: Mapping[str, Any] | None
    decisions: pd.DataFrame | None
    caps: dict[str, str] | None  # per label, from the policy or the decisions; None: the example policy
    caps_source: str
    provenance: dict[str, str] = field(default_factory=dict)
    max_gpus: int = 16
    top_n: int = 15
    whatif_effects: Mapping[str, Any] | None = None  # wattclass.report.whatif (issue 12)

    @property
    def by_label(self) -> pd.DataFrame:
        return self.agg.by_label

    @property
    def savings(self) -> est.SavingsResult:
        return self.agg.savings

    @property
    def n_gpus(self) -> int:
        return self.agg.n_gpus


# -- sections, in page order -------------------------------------------------------------------


def summary(d: ReportData) -> Vars:
    """The cards at the top: measured energy, GPU-hours, jobs, memory-bound share, saving."""
    bl, sav = d.by_label, d.savings
    total = float(bl["energy_kwh"].sum())
    mem = float(bl["energy_kwh"].get("memory", 0.0)) / total if total > 0 else 0.0
    return {
        "cards": [
            (kwh(total), "GPU energy (measured)"),
            (f"{bl['gpu_hours'].sum():,.1f}", "GPU-hours"),
            (f"{len(d.jobs)}", "jobs"),
            (pct(mem), "of energy in memory-bound jobs"),
            (
                kwh(sav.saved_kwh),
                f"estimated saving ({pct(sav.saved_kwh / max(sav.total_kwh, 1e-9))} of job energy)",
            ),
        ]
    }


def energy_by_label(d: ReportData) -> Vars:
    return {
        "png": plots.energy_and_hours(d.by_label),
        "table": table(
            d.by_label.rename(
                columns={
                    "energy_kwh": "energy (kWh)",
                    "gpu_hours": "GPU-hours",
                    "kwh_per_gpu_hour": "kWh per GPU-hour",
                }
            ),
            index="label",
        ),
    }


def _group_table(d: ReportData, key: str, capped: set[str]) -> pd.DataFrame:
    """Per ``key`` (user or account): energy, GPU-hours, jobs, share by label, capped share, saving.

    Sums over the per-job table (each job's windows carry its label; its estimated saving is
    ``saved_j``), so only job windows count. The top ``top_n`` by energy are listed, the rest
    folded into one row, so the table stays one screen at 1,000 GPUs.
    """
    j = d.jobs.copy()
    j["_key"] = j[key].astype(object).where(j[key].notna(), "(unknown)").astype(str)
    top = j.groupby("_key")["energy_j"].sum().sort_values(ascending=False, kind="stable")
    keep = list(top.index[: d.top_n])
    n_rest = len(top) - len(keep)
    if n_rest > 0:
        j.loc[~j["_key"].isin(keep), "_key"] = f"({n_rest} others)"
        keep.append(f"({n_rest} others)")
    rows = []
    for k in keep:
        g = j[j["_key"] == k]
        e = float(g["energy_j"].sum())
        by_lab = g.groupby("label")["energy_j"].sum()
        rows.append(
            {
                key: k,
                "jobs": g["job_id"].nunique(),
                "energy (kWh)": e / 3.6e6,
                "GPU-hours": float(g["gpu_hours"].sum()),
                **{f"{lab} share": pct(float(by_lab.get(lab, 0.0)) / e if e > 0 else 0.0)
                   for lab in ("compute", "memory", "mixed", "idle")},
                "capped share": pct(
                    float(g.loc[g["label"].isin(capped), "energy_j"].sum()) / e if e > 0 else 0.0
                ),
                "est. saving (kWh)": float(g["saved_j"].sum()) / 3.6e6,
            }
        )
    return pd.DataFrame(rows)


def users_accounts(d: ReportData) -> Vars:
    """Per-user and per-account tables: who used the energy, in which kind of jobs, what caps save."""
    caps = d.savings.caps
    capped = {lab for lab, c in caps.items() if lab in est.CAPPED_LABELS and c not in (None, "-", "100%")}
    users = _group_table(d, "user", capped)
    have_acct = "account" in d.jobs.columns and d.jobs["account"].notna().any()
    accounts = _group_table(d, "account", capped) if have_acct else None
    return {
        "users": table(users),
        "accounts": table(accounts) if accounts is not None else None,
        "capped": sorted(capped),
        "caps_source": d.caps_source,
        "top_n": d.top_n,
    }


def power_over_time(d: ReportData) -> Vars:
    """Per-GPU strips for a small cluster; above ``max_gpus`` the fleet's power stacked by label."""
    a = d.agg
    strips = a.n_gpus <= d.max_gpus
    return {
        "n_gpus": a.n_gpus,
        "strips": strips,
        "png": plots.power_timeline(a.timeline, d.max_gpus)
        if strips
        else plots.fleet_power(a.fleet, a.fleet_t0, a.fleet_bin_s),
    }


def work_per_energy(d: ReportData) -> Vars:
    wpe = d.agg.work_per_energy
    # GPM energy on boards of unknown peak rates: left out of the estimate, named, not guessed
    unrated = "; ".join(f"{m} ({kwh:.3g} kWh)" for m, kwh in sorted(d.agg.work_unrated_kwh.items()))
    if wpe.empty:
        return {"png": None, "table": None, "peaks": "", "unrated": unrated}
    return {
        "png": plots.work_per_energy(wpe),
        "peaks": peaks.describe(d.agg.work_models),
        "unrated": unrated,
        "table": table(
            wpe.rename(
                columns={
                    "tflop": "est. TFLOP",
                    "energy_kj": "energy (kJ)",
                    "tflops_per_kw": "est. TFLOP/s per kW",
                }
            ),
            index="label",
        ),
    }


def model(d: ReportData) -> Vars:
    m = d.metrics or {}
    facts = []
    for key, name in (
        ("accuracy", "held-out job accuracy"),
        ("ece", "calibration error (ECE)"),
        ("n_jobs", "jobs evaluated"),
        ("n_folds", "CV folds"),
        ("version", "model in use"),
    ):
        v = m.get(key)
        if v is not None:
            facts.append((f"{v:.3f}" if isinstance(v, float) else str(v), name))
    cm = m.get("confusion", m.get("confusion_matrix"))
    classes = m.get("labels", m.get("classes"))
    gate, rejected = m.get("gate"), m.get("rejected")

    def acc(g: Mapping[str, Any], k: str) -> str:
        v = g.get(k)
        return f"{v:.3f}" if isinstance(v, int | float) else "?"

    return {
        "have": bool(d.metrics),
        "facts": facts,
        "png": plots.confusion(cm, classes) if cm is not None and classes else None,
        "rejected": {
            **rejected,
            "cand": acc(rejected, "candidate_accuracy"),
            "inc": acc(rejected, "incumbent_accuracy"),
        }
        if rejected
        else None,
        "gate": {
            "cand": acc(gate, "candidate_accuracy"),
            "inc": acc(gate, "incumbent_accuracy"),
            "new_jobs": gate.get("new_jobs", "?"),
            "incumbent": str(gate.get("incumbent", "the previous model")),
        }
        if gate and not rejected
        else None,
    }


def decision_keys(decisions: pd.DataFrame) -> pd.Series:
    """One text per decision: ``shadow: cap 60%`` or ``none: low_confidence``."""
    status = decisions["status"].astype(str)
    reason = decisions["reason"].astype(str)
    cap = decisions["cap"] if "cap" in decisions.columns else pd.Series(None, index=decisions.index)
    capped = cap.notna() & (cap.astype(str) != "") & (status != "none")
    return (status + ": " + ("cap " + cap.astype(str)).where(capped, reason)).rename("decision")


def decisions(d: ReportData) -> Vars:
    dec = d.decisions
    if (dec is None or dec.empty) and d.caps_source.startswith("from the policy "):
        caps = pd.DataFrame({"label": list(d.savings.caps), "cap": list(d.savings.caps.values())})
        return {"state": "policy", "source": d.caps_source, "table": table(caps)}
    if dec is None or dec.empty:
        return {"state": "missing"}
    if not {"status", "reason"} <= set(dec.columns):
        return {"state": "bad"}
    key = decision_keys(dec)
    counts = key.value_counts().sort_index()
    mode = "shadow" if (dec["status"] == "shadow").any() else "enforce"
    ct = None
    if "label" in dec.columns:
        ct = table(pd.crosstab(dec["label"].fillna("(no label)").rename("label"), key), index="label")
    return {"state": "ok", "n": len(dec), "mode": mode, "png": plots.decisions(counts), "table": ct}


def savings(d: ReportData) -> Vars:
    sav = d.savings
    return {
        "png": plots.savings(sav.table, sav.slowdown),
        "caps_txt": ", ".join(f"{k} {v}" for k, v in sav.caps.items()),
        "caps_source": d.caps_source,
        "slowdown": pct(sav.slowdown),
        "saved": kwh(sav.saved_kwh),
        "saved_slow": kwh(sav.saved_kwh_slow),
        "total": kwh(sav.total_kwh),
        "table": table(
            sav.table.rename(
                columns={
                    "energy_kwh": "energy (kWh)",
                    "saved_kwh": "saved, no slowdown",
                    "saved_kwh_slow": f"saved, {pct(sav.slowdown)} slower",
                }
            ),
            index="label",
        ),
    }


def whatif_effects(d: ReportData) -> Vars | None:
    """The what-if (``--policy``) and measured canary effects (variables: wattclass.report.whatif)."""
    return dict(d.whatif_effects) if d.whatif_effects is not None else None


def top_jobs(d: ReportData) -> Vars:
    top = d.jobs.sort_values("energy_j", ascending=False).head(d.top_n).copy()
    top["energy (kWh)"] = top["energy_j"] / 3.6e6
    top["source"] = top["source"].astype(object).where(top["source"].notna(), "-")
    cols = ["job_id", "user", "label", "confidence", "source", "n_windows", "gpu_hours", "energy (kWh)"]
    return {
        "table": table(
            top[cols].rename(columns={"gpu_hours": "GPU-hours", "n_windows": "windows"}),
            formats={"confidence": conf},
        )
    }


def inputs(d: ReportData) -> Vars:
    return {"provenance": d.provenance}


#: The page, top to bottom. A section is a function here + templates/sections/<name>.html.j2.
SECTIONS: tuple[Callable[[ReportData], Vars | None], ...] = (
    summary,
    energy_by_label,
    users_accounts,
    power_over_time,
    work_per_energy,
    model,
    decisions,
    savings,
    whatif_effects,
    top_jobs,
    inputs,
)


def subtitle(d: ReportData) -> str:
    a = d.agg
    return (
        f"{a.t0:%Y-%m-%d %H:%M} – {a.t1:%Y-%m-%d %H:%M} UTC, {a.n_hosts} node(s), {a.n_gpus} GPU(s), "
        f"{len(d.jobs)} job(s). Generated {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC."
    )


__all__ = ["SECTIONS", "ReportData", "decision_keys", "num", "subtitle"]
