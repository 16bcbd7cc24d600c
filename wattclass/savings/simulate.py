"""What-if: every past job's energy saved and runtime added had the policy's caps applied.

1. Scan the telemetry of the date range, reading only the columns the model needs, and aggregate
   per job first (pyarrow group-by per batch, partial sums merged): energy, GPU-seconds, power,
   GPM activity and the GPM rule's window counts.
2. Label each job: the label store's label where the nightly run stored one; else the GPM rule on
   the job's own windows (the classifier's rule, same thresholds); else ``unlabelled``.
3. Look up the policy's cap for the label (exempt accounts/users from the store's Slurm fields
   are left uncapped) and apply the response model (``response``): the default per-job model or a
   site calibration.
4. Sum kWh saved and GPU-hours added (mid and band) per label, user and account.

The band sums each job's lo and hi: it treats the model error as shared by all jobs (one curve
wrong for all), the honest reading for a model error, wider than independent per-job noise.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from wattclass.caps import cap_watts
from wattclass.classifier import rules
from wattclass.classifier.reader import telemetry_root
from wattclass.errors import DataError
from wattclass.policy import Policy
from wattclass.savings.response import (
    SiteResponse,
    clock_bound_share,
    default_effect,
    default_limit_w,
)

#: Columns read from telemetry (nothing else is decoded).
SCAN_COLUMNS: tuple[str, ...] = (
    "ts_start", "ts_end", "job_id", "user", "gpu_model", "energy_j", "power_avg_w", "power_max_w",
    "power_limit_w", *rules.RULE_COLUMNS,
)
GROUPS: tuple[str, ...] = ("label", "user", "account")


@dataclass
class SimResult:
    """Per-job results and the summaries per label, user and account."""

    jobs: pd.DataFrame
    by: dict[str, pd.DataFrame]
    totals: dict[str, float]
    model: str
    files: int


def telemetry_paths(data_root: Path, date_from: str | None, date_to: str | None) -> list[Path]:
    root = telemetry_root(Path(data_root))
    if not root.is_dir():
        raise DataError(f"{data_root}: no telemetry folder")
    out = []
    for d in sorted(root.glob("date=*")):
        day = d.name.removeprefix("date=")
        if (date_from and day < date_from) or (date_to and day > date_to):
            continue
        out.extend(f for f in sorted(d.rglob("*.parquet")) if not f.name.startswith("."))
    return out


def _batch_agg(t: pa.Table) -> pa.Table:
    """One batch -> partial per-job sums (merged later; sums and counts, never means)."""
    t = t.filter(pc.is_valid(t["job_id"]))
    if t.num_rows == 0:
        return pa.table({})
    t0 = pc.cast(t["ts_start"], pa.int64())
    t1 = pc.cast(t["ts_end"], pa.int64())
    secs = pc.divide(pc.cast(pc.subtract(t1, t0), pa.float64()), 1000.0)
    codes = rules.window_labels(
        t["sm_util_pct"].to_numpy(zero_copy_only=False).astype(float),
        t["dram_bw_util_pct"].to_numpy(zero_copy_only=False).astype(float),
        [t[c].to_numpy(zero_copy_only=False).astype(float) for c in rules.COMPUTE_UNITS])
    comp = np.fmax.reduce([t[c].to_numpy(zero_copy_only=False).astype(float) for c in rules.COMPUTE_UNITS])
    dram = t["dram_bw_util_pct"].to_numpy(zero_copy_only=False).astype(float)
    gpm = np.isfinite(comp) & np.isfinite(dram)
    cols = {
        "job_id": t["job_id"], "user": t["user"], "gpu_model": t["gpu_model"],
        "energy_j": t["energy_j"], "secs": secs, "pmax": t["power_max_w"], "pavg": t["power_avg_w"],
        "plim": t["power_limit_w"], "t0": t0, "t1": t1,
        "comp": np.where(gpm, comp, 0.0), "dram": np.where(gpm, dram, 0.0), "n_gpm": gpm.astype(np.int64),
        "n_idle": (codes == rules.IDLE).astype(np.int64), "n_comp": (codes == rules.COMPUTE).astype(np.int64),
        "n_mem": (codes == rules.MEMORY).astype(np.int64), "n": np.ones(t.num_rows, np.int64),
    }
    tt = pa.table(cols)
    return tt.group_by("job_id").aggregate([
        ("user", "max"), ("gpu_model", "max"), ("energy_j", "sum"), ("secs", "sum"), ("pmax", "sum"),
        ("pavg", "sum"), ("plim", "max"), ("t0", "min"), ("t1", "max"), ("comp", "sum"), ("dram", "sum"),
        ("n_gpm", "sum"), ("n_idle", "sum"), ("n_comp", "sum"), ("n_mem", "sum"), ("n", "sum")])


def scan_jobs(files: list[Path]) -> pd.DataFrame:
    """Per-job aggregates over ``files`` (see module docstring, step 1)."""
    if not files:
        return pd.DataFrame()
    dataset = ds.dataset([str(f) for f in files], format="parquet")
    missing = [c for c in ("ts_start", "ts_end", "job_id", "energy_j") if c not in dataset.schema.names]
    if missing:
        raise DataError(f"{files[0].parent}: telemetry lacks column(s) {', '.join(missing)}")
    cols = [c for c in SCAN_COLUMNS if c in dataset.schema.names]
    parts = []
    for batch in dataset.to_batches(columns=cols, batch_size=1 << 20):
        t = pa.Table.from_batches([batch])
        for c in SCAN_COLUMNS:
            if c not in t.column_names:
                t = t.append_column(c, pa.nulls(t.num_rows, pa.float64() if c != "user" else pa.string()))
        p = _batch_agg(t)
        if p.num_rows:
            parts.append(p)
    if not parts:
        return pd.DataFrame()
    merged = pa.concat_tables(parts).group_by("job_id").aggregate([
        ("user_max", "max"), ("gpu_model_max", "max"), ("energy_j_sum", "sum"), ("secs_sum", "sum"),
        ("pmax_sum", "sum"), ("pavg_sum", "sum"), ("plim_max", "max"), ("t0_min", "min"), ("t1_max", "max"),
        ("comp_sum", "sum"), ("dram_sum", "sum"), ("n_gpm_sum", "sum"), ("n_idle_sum", "sum"),
        ("n_comp_sum", "sum"), ("n_mem_sum", "sum"), ("n_sum", "sum")])
    df = merged.to_pandas()
    df.columns = [c.rsplit("_", 2)[0] if c != "job_id" else c for c in df.columns]  # "x_sum_sum" -> "x"
    n = df["n"].astype(float)
    ngpm = df["n_gpm"].astype(float)
    return pd.DataFrame({
        "job_id": df["job_id"].astype(str), "user": df["user"], "gpu_model": df["gpu_model"],
        "energy_j": df["energy_j"].astype(float), "gpu_hours": df["secs"].astype(float) / 3600.0,
        "need_w": df["pmax"].astype(float) / n, "avg_w": df["pavg"].astype(float) / n,
        "limit_w": df["plim"].astype(float),
        "compute_act": np.where(ngpm > 0, df["comp"] / ngpm.replace(0, 1) / 100.0, np.nan),
        "dram_act": np.where(ngpm > 0, df["dram"] / ngpm.replace(0, 1) / 100.0, np.nan),
        "n_idle": df["n_idle"], "n_comp": df["n_comp"], "n_mem": df["n_mem"],
        "start": pd.to_datetime(df["t0"], unit="ms", utc=True), "end": pd.to_datetime(df["t1"], unit="ms",
                                                                                        utc=True),
    })


def attach_labels(jobs: pd.DataFrame, store_labels: pd.DataFrame | None) -> pd.DataFrame:
    """Label, source, account and job name per job (module docstring, step 2)."""
    out = jobs.copy()
    ni, nc, nm = (out[c].to_numpy(np.int64) for c in ("n_idle", "n_comp", "n_mem"))
    has = (ni + nc + nm) > 0
    rule = np.where(has, np.asarray(rules.label_names(rules.job_labels(ni, nc, nm)), dtype=object), None)
    out["label"], out["label_source"] = rule, np.where(has, "rule(sim)", None)
    out["account"], out["name"] = None, None
    if store_labels is not None and len(store_labels):
        s = store_labels.drop_duplicates("job_id", keep="last").set_index("job_id")
        idx = out["job_id"]
        lab = idx.map(s["label"]) if "label" in s.columns else pd.Series(None, index=out.index)
        known = lab.notna()
        out.loc[known, "label"] = lab[known]
        out.loc[known, "label_source"] = "store"
        for c in ("account", "name"):
            if c in s.columns:
                out[c] = idx.map(s[c]).astype(object)
        if "user" in s.columns:
            out["user"] = out["user"].where(out["user"].notna(), idx.map(s["user"]))
    out["label"] = out["label"].fillna("unlabelled")
    out["label_source"] = out["label_source"].fillna("none")
    out["user"] = out["user"].fillna("(unknown)")
    out["account"] = out["account"].fillna("(unknown)")
    return out


def apply_policy(jobs: pd.DataFrame, policy: Policy, response: SiteResponse | None) -> pd.DataFrame:
    """Per job: cap in watts and the effect (module docstring, step 3)."""
    out = jobs.copy()
    n = len(out)
    default_w = np.array([default_limit_w(m, lim) or np.nan for m, lim in
                          zip(out["gpu_model"], out["limit_w"], strict=True)], dtype=float)
    cap_w = np.full(n, np.nan)
    cap_text = np.full(n, None, dtype=object)
    exempt = out["user"].isin(policy.exempt_users) | out["account"].isin(policy.exempt_accounts)
    for label, cap in policy.caps.items():
        m = (out["label"] == label).to_numpy() & ~exempt.to_numpy() & np.isfinite(default_w)
        cap_w[m] = [cap_watts(cap, d, None, None) for d in default_w[m]]
        cap_text[m] = cap.text()
    out["default_w"], out["cap_w"], out["cap"] = default_w, cap_w, cap_text
    need = out["need_w"].to_numpy(float)
    if response is None:
        s, band = clock_bound_share(out["compute_act"].to_numpy(float), out["dram_act"].to_numpy(float),
                                    out["label"].to_numpy())
        eff = default_effect(cap_w, need, out["avg_w"].to_numpy(float), default_w, s, band)
        out["clock_bound_share"] = s
    else:
        eff = response.effect(out["label"].to_numpy(), cap_w, need)
    e = out["energy_j"].to_numpy(float)
    h = out["gpu_hours"].to_numpy(float)
    out["runtime_ratio"], out["energy_ratio"] = eff.runtime, eff.energy
    out["kwh_saved"] = e * (1 - eff.energy) / 3.6e6
    out["kwh_saved_lo"] = e * (1 - eff.energy_hi) / 3.6e6  # least saved
    out["kwh_saved_hi"] = e * (1 - eff.energy_lo) / 3.6e6
    out["gpu_hours_added"] = h * (eff.runtime - 1)
    out["gpu_hours_added_lo"] = h * (eff.runtime_lo - 1)
    out["gpu_hours_added_hi"] = h * (eff.runtime_hi - 1)
    return out


SUM_COLUMNS: tuple[str, ...] = ("energy_kwh", "gpu_hours", "kwh_saved", "kwh_saved_lo", "kwh_saved_hi",
                                "gpu_hours_added", "gpu_hours_added_lo", "gpu_hours_added_hi")


def summarise(jobs: pd.DataFrame, by: str) -> pd.DataFrame:
    j = jobs.assign(energy_kwh=jobs["energy_j"] / 3.6e6, capped=jobs["cap"].notna())
    g = j.groupby(by, sort=True)
    t = g[list(SUM_COLUMNS)].sum()
    t.insert(0, "jobs", g.size())
    t.insert(1, "capped_jobs", g["capped"].sum())
    return t.sort_values("kwh_saved", ascending=False).reset_index()


def simulate(data_root: Path, policy: Policy, date_from: str | None = None, date_to: str | None = None,
             response: SiteResponse | None = None) -> SimResult:
    """Run the what-if (module docstring)."""
    from wattclass.classifier.store import ClassifierStore

    for d, what in ((date_from, "--from"), (date_to, "--to")):
        if d is not None:
            try:
                dt.date.fromisoformat(d)
            except ValueError as exc:
                raise DataError(f"{what}: expected YYYY-MM-DD, got {d!r}") from exc
    files = telemetry_paths(data_root, date_from, date_to)
    jobs = scan_jobs(files)
    if jobs.empty:
        span = f" between {date_from or '...'} and {date_to or '...'}" if date_from or date_to else ""
        raise DataError(f"{data_root}: no job windows in telemetry{span}")
    labels = ClassifierStore(data_root).label_history(date_from)
    jobs = apply_policy(attach_labels(jobs, labels), policy, response)
    totals: dict[str, Any] = {c: float(jobs[c].sum()) for c in ("kwh_saved", "kwh_saved_lo", "kwh_saved_hi",
                                                                 "gpu_hours_added", "gpu_hours_added_lo",
                                                                 "gpu_hours_added_hi", "gpu_hours")}
    totals["energy_kwh"] = float(jobs["energy_j"].sum() / 3.6e6)
    totals["jobs"] = len(jobs)
    totals["capped_jobs"] = int(jobs["cap"].notna().sum())
    return SimResult(jobs, {g: summarise(jobs, g) for g in GROUPS}, totals,
                     "default (own telemetry + published curves)" if response is None
                     else f"site calibration {response.source} ({response.gpu_model})", len(files))
