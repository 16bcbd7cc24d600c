"""The report's data layer: every number the report shows, aggregated in DuckDB.

Why: the report used to load every window into pandas (one day of 1,000 GPUs: 8.64 M rows, 96 s
and 10.8 GB); a month of 1,000 GPUs is 259 M windows (issue 15). Here DuckDB scans only the
columns each aggregate needs, straight from the Parquet files (or from a DataFrame of windows,
for tests and the demo), and hands the report small tables: per job, per label, per GPU and
time bucket (the power timeline), plus the span, node and GPU counts. Memory is bounded by the
number of jobs, not windows.

The numbers are those of ``wattclass.report.estimates`` (the window-level reference, kept for
its tests and assumptions): energy and GPU-hours per label, estimated TFLOP per kJ over windows
with GPM, the cap savings model (memory-bound and idle jobs draw min(power, cap) for the same
time, or ``slowdown`` longer), per-job totals; tests/test_report_data.py checks they agree.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from wattclass.errors import DataError
from wattclass.report import estimates as est

#: At most this many time buckets per GPU in the power timeline (a month of 10 s windows is
#: 259,200 points per GPU; the plot is 1,100 pixels wide).
TIMELINE_POINTS = 1500


def _lit(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


@dataclass
class ReportData:
    """What the report's sections read; all small (per job, per label, per GPU-bucket)."""

    jobs: pd.DataFrame  # job_id, user, n_windows, energy_j, gpu_hours, label, confidence, source
    by_label: pd.DataFrame  # index label: energy_kwh, gpu_hours, kwh_per_gpu_hour
    work_per_energy: pd.DataFrame  # index label: tflop, energy_kj, tflops_per_kw
    savings: est.SavingsResult
    timeline: pd.DataFrame  # host, gpu_index, ts_start, power_avg_w, label (first GPUs, bucketed)
    t0: pd.Timestamp
    t1: pd.Timestamp
    n_hosts: int
    n_gpus: int
    n_gpus_timeline_of: int
    n_windows: int
    labels_computed: bool  # labels came from the GPM rule here (no label store)


class _Source:
    """A DuckDB connection with a ``w`` view over the windows (Parquet files or a DataFrame)."""

    def __init__(self, files: Sequence[Path] | None = None, windows: pd.DataFrame | None = None,
                 threads: int = 0) -> None:
        import duckdb

        self.con = duckdb.connect(config={"threads": threads or len(os.sched_getaffinity(0))})
        if windows is not None:
            w = windows.copy()
            w["job_id"] = w["job_id"].astype(object).where(w["job_id"].notna(), None)
            w.loc[w["job_id"].notna(), "job_id"] = w.loc[w["job_id"].notna(), "job_id"].astype(str)
            self.con.register("w_df", w)
            self.con.execute("CREATE VIEW w AS SELECT * FROM w_df")
        else:
            if not files:
                raise DataError("report: no telemetry files to read")
            lst = "[" + ", ".join(_lit(str(f)) for f in files) + "]"
            self.con.execute(f"CREATE VIEW w AS SELECT * FROM read_parquet({lst}, hive_partitioning = false, "
                             "union_by_name = true)")
        self.columns = {r[0] for r in self.con.execute("DESCRIBE w").fetchall()}

    def col(self, name: str, sql_type: str = "DOUBLE") -> str:
        """``name`` (optionally ``alias.name``) cast to ``sql_type``; NULL where no file has it."""
        bare = name.rpartition(".")[2]
        return f"CAST({name} AS {sql_type})" if bare in self.columns else f"CAST(NULL AS {sql_type})"

    def df(self, sql: str) -> pd.DataFrame:
        return self.con.execute(sql).df()

    def close(self) -> None:
        self.con.close()


def _secs(src: _Source) -> str:
    return "greatest(epoch_ms(ts_end) - epoch_ms(ts_start), 0) / 1000.0"


def load(
    files: Sequence[Path] | None = None,
    windows: pd.DataFrame | None = None,
    labels: pd.DataFrame | None = None,
    caps: Mapping[str, str] | None = None,
    slowdown: float = est.ANCHOR_SLOWDOWN,
    max_gpus: int = 16,
) -> ReportData:
    """Aggregate the windows (``files`` or a ``windows`` DataFrame) for the report."""
    src = _Source(files, windows)
    try:
        return _load(src, labels, caps, slowdown, max_gpus)
    finally:
        src.close()


def _rule_code(src: _Source) -> str:
    from wattclass.classifier import rules

    def v(c: str) -> str:
        x = src.col(c)
        return f"(CASE WHEN isnan({x}) THEN NULL ELSE {x} END)"

    comp = "greatest(" + ", ".join(v(u) for u in rules.COMPUTE_UNITS) + ")"
    sm, dram = v("sm_util_pct"), v("dram_bw_util_pct")
    return (f"(CASE WHEN {sm} IS NULL OR {dram} IS NULL OR {comp} IS NULL THEN {rules.NO_GPM} "
            f"WHEN {sm} < {rules.SM_ACTIVE_PCT} THEN {rules.IDLE} WHEN {comp} >= {dram} THEN {rules.COMPUTE} "
            f"ELSE {rules.MEMORY} END)")


def _load(src: _Source, labels: pd.DataFrame | None, caps: Mapping[str, str] | None, slowdown: float,
          max_gpus: int) -> ReportData:
    from wattclass.classifier import rules

    secs = _secs(src)
    energy = src.col("energy_j")
    facts = src.df("SELECT count(*) AS n, min(ts_start) AS t0, max(ts_end) AS t1, count(DISTINCT host) AS hosts, "
                   f"count(DISTINCT (host, {src.col('gpu_uuid', 'VARCHAR')})) AS gpus FROM w")
    if int(facts["n"].iloc[0]) == 0:
        raise DataError("report: the telemetry has no windows")
    code = _rule_code(src)
    jobs = src.df(
        f"SELECT CAST(job_id AS VARCHAR) AS job_id, first({src.col('user', 'VARCHAR')}) AS user, "
        f"count(*) AS n_windows, sum({energy}) AS energy_j, sum({secs}) / 3600.0 AS gpu_hours, "
        f"count(*) FILTER (WHERE {code} = {rules.IDLE}) AS r_idle, "
        f"count(*) FILTER (WHERE {code} = {rules.COMPUTE}) AS r_compute, "
        f"count(*) FILTER (WHERE {code} = {rules.MEMORY}) AS r_memory "
        "FROM w WHERE job_id IS NOT NULL GROUP BY job_id ORDER BY job_id")
    computed = labels is None
    if labels is None:
        has = (jobs["r_idle"] + jobs["r_compute"] + jobs["r_memory"]) > 0
        j = jobs[has]
        lab = rules.job_labels(j["r_idle"], j["r_compute"], j["r_memory"])
        conf = rules.job_confidence(j["r_idle"], j["r_compute"], j["r_memory"], lab)
        labels = pd.DataFrame({"job_id": j["job_id"].astype(str).to_numpy(), "label": rules.label_names(lab),
                               "confidence": np.round(conf, 3), "source": "rule"})
    jobs = jobs.drop(columns=["r_idle", "r_compute", "r_memory"])
    keep = [c for c in ("job_id", "label", "confidence", "source") if c in labels.columns]
    jobs = jobs.merge(labels[keep], on="job_id", how="left")
    for c in ("label", "confidence", "source"):
        if c not in jobs.columns:
            jobs[c] = None
    jobs["label"] = jobs["label"].fillna("unlabelled")
    src.con.register("job_labels", jobs[["job_id", "label"]])
    caps = dict(est.DEFAULT_CAPS if caps is None else caps)
    cap_rows = []
    for lab_name, cap in caps.items():
        s = str(cap).strip()
        pct = watts = None
        try:
            if s.endswith("%"):
                pct = float(s[:-1]) / 100.0
            else:
                watts = float(s.removesuffix("W").removesuffix("w"))
        except ValueError:
            pass
        cap_rows.append({"label": lab_name, "cap_pct": pct, "cap_w": watts,
                         "applies": lab_name in est.CAPPED_LABELS})
    src.con.register("caps", pd.DataFrame(cap_rows, columns=["label", "cap_pct", "cap_w", "applies"]))
    tflops = " + ".join(f"{src.col(c)} / 100.0 * {rate}" for c, rate in est.H200_PEAK_TFLOPS.items())
    limit = f"coalesce({src.col('power_limit_w')}, 700.0)"
    power = f"coalesce({src.col('power_avg_w')}, {energy} / nullif({secs}, 0))"
    lw = ("WITH lw AS (SELECT w.*, CASE WHEN w.job_id IS NULL THEN 'no job' "
          "ELSE coalesce(l.label, 'unlabelled') END AS label FROM w LEFT JOIN job_labels l "
          "ON CAST(w.job_id AS VARCHAR) = l.job_id) ")
    per_label = src.df(
        lw + f"SELECT label, sum({energy}) / 3.6e6 AS energy_kwh, sum({secs}) / 3600.0 AS gpu_hours, "
        f"sum(({tflops}) * {secs}) FILTER (WHERE {src.col('sm_util_pct')} IS NOT NULL "
        f"AND ({tflops}) IS NOT NULL "
        f"AND {energy} > 0) AS tflop, "
        f"sum({energy}) FILTER (WHERE {src.col('sm_util_pct')} IS NOT NULL AND ({tflops}) IS NOT NULL "
        f"AND {energy} > 0) / 1e3 AS gpm_energy_kj FROM lw GROUP BY label")
    sav = src.df(
        lw + ", cw AS (SELECT lw.label, " + energy + " AS e, " + secs + " AS s, " + power + " AS p, "
        f"CASE WHEN c.cap_pct IS NOT NULL THEN c.cap_pct * {limit} ELSE c.cap_w END AS cap_w "
        "FROM lw JOIN caps c ON lw.label = c.label WHERE lw.job_id IS NOT NULL AND c.applies), "
        "nw AS (SELECT label, e, coalesce(least(p, cap_w) * s, e) AS new_j FROM cw) "
        "SELECT label, sum(greatest(e - new_j, 0)) / 3.6e6 AS saved_kwh, sum(new_j) AS new_j "
        "FROM nw GROUP BY label")
    bl = per_label.set_index("label")
    t = pd.DataFrame({"energy_kwh": bl["energy_kwh"], "gpu_hours": bl["gpu_hours"]})
    t["kwh_per_gpu_hour"] = t["energy_kwh"] / t["gpu_hours"].replace(0, np.nan)
    order = [x for x in est.LABEL_ORDER if x in t.index] + sorted(set(t.index) - set(est.LABEL_ORDER))
    t = t.loc[order]
    wpe = bl[bl["tflop"].notna() & (bl["gpm_energy_kj"] > 0)]
    wpe = pd.DataFrame({"tflop": wpe["tflop"], "energy_kj": wpe["gpm_energy_kj"]})
    wpe["tflops_per_kw"] = wpe["tflop"] / wpe["energy_kj"]
    wpe = wpe.loc[[x for x in est.LABEL_ORDER if x in wpe.index]]
    savings = _savings(t, sav.set_index("label"), caps, slowdown)
    timeline, n_all = _timeline(src, jobs, max_gpus, facts)
    return ReportData(
        jobs=jobs, by_label=t, work_per_energy=wpe, savings=savings, timeline=timeline,
        t0=pd.Timestamp(facts["t0"].iloc[0]), t1=pd.Timestamp(facts["t1"].iloc[0]),
        n_hosts=int(facts["hosts"].iloc[0]), n_gpus=int(facts["gpus"].iloc[0]), n_gpus_timeline_of=n_all,
        n_windows=int(facts["n"].iloc[0]), labels_computed=computed,
    )


def _savings(by_label: pd.DataFrame, sav: pd.DataFrame, caps: Mapping[str, str], slowdown: float
             ) -> est.SavingsResult:
    rows: list[dict[str, Any]] = []
    for label in by_label.index:
        if label == "no job":
            continue
        e_kwh = float(by_label.loc[label, "energy_kwh"])
        saved = saved_slow = 0.0
        cap = caps.get(str(label))
        if label in sav.index:
            saved = float(sav.loc[label, "saved_kwh"])
            saved_slow = max(0.0, e_kwh - float(sav.loc[label, "new_j"]) * (1.0 + slowdown) / 3.6e6)
        rows.append({"label": label, "energy_kwh": e_kwh, "cap": cap if cap is not None else "-",
                     "saved_kwh": saved, "saved_kwh_slow": saved_slow})
    t = pd.DataFrame(rows, columns=["label", "energy_kwh", "cap", "saved_kwh", "saved_kwh_slow"])
    t = t.set_index("label")
    t = t.loc[[x for x in est.LABEL_ORDER if x in t.index]]
    return est.SavingsResult(table=t, total_kwh=float(t["energy_kwh"].sum()),
                             saved_kwh=float(t["saved_kwh"].sum()),
                             saved_kwh_slow=float(t["saved_kwh_slow"].sum()), caps=dict(caps), slowdown=slowdown)


def _timeline(src: _Source, jobs: pd.DataFrame, max_gpus: int, facts: pd.DataFrame
              ) -> tuple[pd.DataFrame, int]:
    """Mean power per GPU and time bucket (the first ``max_gpus`` GPUs), with the label that held
    the bucket longest; buckets are one window long unless that would exceed TIMELINE_POINTS."""
    gpus = src.df(f"SELECT DISTINCT host, {src.col('gpu_index', 'INTEGER')} AS gpu_index FROM w "
                  "ORDER BY 1, 2")
    first = gpus.head(max_gpus)
    span_s = (pd.Timestamp(facts["t1"].iloc[0]) - pd.Timestamp(facts["t0"].iloc[0])).total_seconds()
    bucket_s = max(1, int(np.ceil(span_s / TIMELINE_POINTS)))
    src.con.register("tl_gpus", first)
    secs = _secs(src)
    energy = src.col("energy_j")
    power = f"coalesce({src.col('power_avg_w')}, {energy} / nullif({secs}, 0))"
    df = src.df(
        "WITH lw AS (SELECT w.*, CASE WHEN w.job_id IS NULL THEN 'no job' "
        "ELSE coalesce(l.label, 'unlabelled') END AS label FROM w LEFT JOIN job_labels l "
        "ON CAST(w.job_id AS VARCHAR) = l.job_id "
        f"JOIN tl_gpus g ON w.host = g.host AND {src.col('w.gpu_index', 'INTEGER')} = g.gpu_index) "
        f"SELECT host, {src.col('gpu_index', 'INTEGER')} AS gpu_index, "
        f"to_timestamp(floor(epoch(ts_start) / {bucket_s}) * {bucket_s}) AS ts_start, "
        f"sum({power} * {secs}) / nullif(sum({secs}), 0) AS power_avg_w, arg_max(label, {secs}) AS label "
        "FROM lw GROUP BY ALL ORDER BY host, gpu_index, ts_start")
    df["ts_start"] = pd.to_datetime(df["ts_start"], utc=True)
    return df, len(gpus)
