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

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from wattclass.errors import DataError
from wattclass.report import estimates as est
from wattclass.report import fleetbins, limits, peaks

#: At most this many time buckets per GPU in the power timeline (a month of 10 s windows is
#: 259,200 points per GPU; the plot is 1,100 pixels wide).
TIMELINE_POINTS = 1500
log = logging.getLogger(__name__)


def _lit(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


@dataclass
class ReportData:
    """What the report's sections read; all small (per job, per label, per GPU-bucket)."""

    jobs: pd.DataFrame  # job_id, user, n_windows, energy_j, gpu_hours, label, confidence, source, saved_j
    by_label: pd.DataFrame  # index label: energy_kwh, gpu_hours, kwh_per_gpu_hour
    work_per_energy: pd.DataFrame  # index label: tflop, energy_kj, tflops_per_kw
    savings: est.SavingsResult
    timeline: pd.DataFrame  # host, gpu_index, ts_start, power_avg_w, label (bucketed; empty above max_gpus)
    t0: pd.Timestamp
    t1: pd.Timestamp
    n_hosts: int
    n_gpus: int
    n_windows: int
    labels_computed: bool  # labels came from the GPM rule here (no label store)
    fleet: pd.DataFrame  # above max_gpus GPUs: bin (int), label, energy_j: the fleet's energy per time bin
    fleet_bin_s: float  # the width of one fleet bin (s)
    fleet_t0: pd.Timestamp  # where fleet bin 0 starts (a multiple of fleet_bin_s on the UTC clock)
    #: rows left out as the nightly leaves them out, per ``classifier.validity`` reason (none: {})
    rejected_rows: dict[str, int] = field(default_factory=dict)
    #: copies of a window from another file (a file copied, an import over the daemon's span),
    #: counted once as the nightly counts them (``_Source``)
    duplicate_windows: int = 0
    #: telemetry files Parquet could not read, skipped: path -> why (``load``)
    skipped_files: dict[str, str] = field(default_factory=dict)
    #: GPU model names whose peak rates the useful-work estimate used (``peaks``), and the GPM
    #: energy (kWh) of boards whose rates it does not know, by model name: left out, not guessed
    work_models: tuple[str, ...] = ()
    work_unrated_kwh: dict[str, float] = field(default_factory=dict)


class _Source:
    """A DuckDB connection with a ``w`` view over the valid windows (Parquet files or a DataFrame)
    and ``w_all`` over every window.

    ``w`` leaves out the rows the nightly rejects (``classifier.validity``'s rules as the scan's
    SQL, ``rowsql._reject_sql``: a null key, a backwards window, a negative, NaN or infinite
    energy, an impossible power, a window outside its file's date= day): one infinite energy
    would otherwise make the page's totals inf. ``reject`` is that per-row code (0 = valid);
    ``code`` is it with the copies of a window left out as DUPLICATE where two files may hold the
    same windows (``dedup``, ``rowsql.dedup_code_sql``; ``_load`` finds such files), as the
    nightly counts each window once; ``w_all`` carries it as ``_code``, and the main aggregate
    groups by it, so the left-out rows are counted in the same scan."""

    def __init__(self, files: Sequence[Path] | None = None, windows: pd.DataFrame | None = None,
                 threads: int = 0, by_name: bool = False, dedup: bool = False) -> None:
        import duckdb

        self.con = duckdb.connect(config={"threads": threads or len(os.sched_getaffinity(0))})
        self.files = list(files or []) if windows is None else []
        self.from_windows = windows is not None
        if windows is not None:
            w = windows.copy()
            w["job_id"] = w["job_id"].astype(object).where(w["job_id"].notna(), None)
            w.loc[w["job_id"].notna(), "job_id"] = w.loc[w["job_id"].notna(), "job_id"].astype(str)
            self.con.register("w_df", w)
        else:
            if not files:
                raise DataError("report: no telemetry files to read")
            lst = "[" + ", ".join(_lit(str(f)) for f in files) + "]"
            # By position with the first file's schema unless files differ (``by_name``): matching
            # columns by name means reading every file's footer first (6.6 s for 3,000 files).
            # file_index, filename: the row's file, whose date= partition the row must lie in (rowsql)
            self.con.execute(f"CREATE VIEW w_read AS SELECT *, file_index, filename FROM read_parquet({lst}, "
                             f"hive_partitioning = false, union_by_name = {str(by_name).lower()}"
                             f"{', file_row_number = true' if dedup else ''})")
        self.by_name = by_name
        from wattclass.classifier import rowsql
        from wattclass.schema import TELEMETRY_V1

        read = "w_df" if windows is not None else "w_read"
        self.read = read
        self.columns = {r[0] for r in self.con.execute(f"DESCRIBE {read}").fetchall()}
        day = rowsql.partition_day_sql(self.files) if self.files else None
        self.reject = rowsql._reject_sql(frozenset(TELEMETRY_V1.names) - self.columns, day)
        # Two files that may hold the same windows (a copied file, an import over the daemon's
        # span; ``_load`` finds them): each window counted once, as the nightly counts it (their
        # energy was counted twice). ``code``: the row's reject code, or DUPLICATE for a copy.
        self.dedup = dedup and bool(self.files)
        self.code = rowsql.dedup_code_sql(self.reject, "filename") if self.dedup else self.reject
        self.con.execute(f"CREATE VIEW w_all AS SELECT *, {self.code} AS _code FROM {read}")
        self.con.execute("CREATE VIEW w AS SELECT * FROM w_all WHERE _code = 0")

    def col(self, name: str, sql_type: str = "DOUBLE") -> str:
        """``name`` (optionally ``alias.name``) cast to ``sql_type``; NULL where no file has it."""
        bare = name.rpartition(".")[2]
        return f"CAST({name} AS {sql_type})" if bare in self.columns else f"CAST(NULL AS {sql_type})"

    def df(self, sql: str) -> pd.DataFrame:
        return self.con.execute(sql).df()

    def close(self) -> None:
        self.con.close()


def _pavg(src: _Source) -> str:
    """The window's ``power_avg_w``, NULL where NaN, as pandas reads NaN (``estimates``): a NaN among
    numbers in a Parquet file passed ``> 0`` (DuckDB decides it from the statistics, which leave
    NaN out), so its capped energy was energy x least(1, NaN), nothing saved, and its mean power
    NaN instead of energy / length."""
    from wattclass.classifier import rowsql

    col = src.col("power_avg_w")
    return f"(CASE WHEN {rowsql.is_nan_sql(col)} THEN NULL ELSE {col} END)"


def _secs(src: _Source) -> str:
    return "greatest(epoch_ms(ts_end) - epoch_ms(ts_start), 0) / 1000.0"


def _power(src: _Source, pavg: str) -> str:
    """The window's mean power: ``pavg`` (``_pavg``), else its energy over its length."""
    return f"coalesce({pavg}, {src.col('energy_j')} / nullif({_secs(src)}, 0))"


def load(
    files: Sequence[Path] | None = None,
    windows: pd.DataFrame | None = None,
    labels: pd.DataFrame | None = None,
    caps: Mapping[str, str] | None = None,
    slowdown: float = est.ANCHOR_SLOWDOWN,
    max_gpus: int = 16,
) -> ReportData:
    """Aggregate the windows (``files`` or a ``windows`` DataFrame) for the report."""
    import duckdb

    from wattclass.fsutil import require_trusted_files

    if files is not None and windows is None:
        files = require_trusted_files(files)  # a FIFO would block the scan; see wattclass.fsutil
    try:
        return _load_from(files, windows, labels, caps, slowdown, max_gpus)
    except duckdb.Error as exc:  # IOException, InvalidInputException, and a bare Error for some footers
        first = str(exc).splitlines()[0][:500]
        if windows is not None or files is None:
            raise DataError(f"report: cannot read the telemetry: {first}") from exc
        # A file Parquet cannot read (empty, cut short, not Parquet) failed the whole page with a
        # traceback: skip it by name, as the nightly does (validity: one host's problem), and
        # say so on the page. Only here are the footers read one by one.
        good, bad = readable_files(files)
        if not bad:
            raise DataError(f"report: cannot read the telemetry: {first}") from exc
        for f, why in bad:
            log.warning("report: skipping telemetry file %s (unreadable): %s", f, why)
        if not good:
            raise DataError(f"report: no readable telemetry file ({bad[0][0]}: {bad[0][1]})") from exc
        data = _load_from(good, None, labels, caps, slowdown, max_gpus)
        data.skipped_files = {str(f): why for f, why in bad}
        return data


def readable_files(files: Sequence[Path]) -> tuple[list[Path], list[tuple[Path, str]]]:
    """``files`` whose Parquet footer reads, and the others with why."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    good: list[Path] = []
    bad: list[tuple[Path, str]] = []
    for f in files:
        try:
            pq.read_schema(f)
            good.append(f)
        except (OSError, pa.ArrowException) as exc:
            bad.append((f, str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__))
    return good, bad


def _load_from(files: Sequence[Path] | None, windows: pd.DataFrame | None, labels: pd.DataFrame | None,
               caps: Mapping[str, str] | None, slowdown: float, max_gpus: int) -> ReportData:
    """``load`` over files known to be trusted; a file DuckDB cannot read raises DuckDB's error."""
    import duckdb

    from wattclass.schema import first_schema_reads_all

    # by column name where the files differ: a GPU without GPM writes no GPM columns, and read
    # with such a first file's schema, the other files' GPM columns would be dropped
    src = _Source(files, windows, by_name=files is not None and windows is None
                  and not first_schema_reads_all(list(files)).exact)
    try:
        try:
            try:
                return _load(src, labels, caps, slowdown, max_gpus)
            except (duckdb.InvalidInputException, duckdb.BinderException, duckdb.ConversionException):
                if windows is not None:
                    raise
                src.close()
                src = _Source(files, windows, by_name=True)  # files differ (e.g. GPUs without GPM columns)
                return _load(src, labels, caps, slowdown, max_gpus)
        except _FilesMeet:  # two files may hold the same windows: again, each window counted once
            by_name = src.by_name
            src.close()
            src = _Source(files, windows, by_name=by_name, dedup=True)
            return _load(src, labels, caps, slowdown, max_gpus)
    finally:
        src.close()


class _FilesMeet(Exception):
    """``_load``'s scan found two files of one host whose window-start ranges meet."""


def _rule_code(src: _Source) -> str:
    """The GPM window rule's code per window: the nightly scan's SQL (``classifier.rowsql``), so the
    report's rule labels are the engine's; a GPM column that no file has reads as not measured."""
    from wattclass.classifier import rowsql, rules

    dropped = frozenset(c for c in rules.RULE_COLUMNS if c not in src.columns)
    return rowsql.rule_code_sql(dropped, column=src.col)


# long: one scan's GROUPING SETS and their split into jobs, GPUs, rejected rows and the span
def _load(src: _Source, labels: pd.DataFrame | None, caps: Mapping[str, str] | None, slowdown: float,
          max_gpus: int) -> ReportData:
    """One scan: per job (the no-job windows as one group) and per GPU, with GROUPING SETS.

    Everything per label is a sum over jobs, so the labels (from the store, or from the rule
    counts of this very scan) are applied afterwards; the savings model's capped energy is summed
    per job for each capped label's cap, and picked by the job's label.
    """
    from wattclass.classifier import rowsql, rules

    caps = dict(est.DEFAULT_CAPS if caps is None else caps)
    secs, energy, code = _secs(src), src.col("energy_j"), _rule_code(src)
    pavg = _pavg(src)
    power = _power(src, pavg)
    gpm = " AND ".join([f"isfinite({src.col('sm_util_pct')})",  # NaN: no GPM reading (estimated_tflops)
                        *(f"isfinite({src.col(c)})" for c in peaks.PIPES), f"{energy} > 0"])
    # each pipe's activity share where the window has GPM: weighed by the board's peak rates per
    # GPU model after the scan (``peaks.register_rates``); a shared GPU's row counts its share of
    # the GPU's work (``peaks.share_sql``), a MIG row is a board of its own that has no rates
    pipes = ", ".join(f"CASE WHEN {gpm} THEN {src.col(c)} / 100.0 END AS _p{i}"
                      for i, c in enumerate(peaks.PIPES))
    share_s = f"_s * {peaks.share_sql(src.col('share_ratio'))}"  # _s: the length computed once
    model = peaks.rated_model_sql(src.col("gpu_model", "VARCHAR"), src.col("share_basis", "VARCHAR"))
    cap_aggs: list[tuple[str, str]] = []
    for lab in est.CAPPED_LABELS:
        cw = limits.cap_sql(caps.get(lab), src.col("power_limit_w"), src.col("gpu_model", "VARCHAR"))
        if cw is None:
            continue
        cap_aggs.append((lab, cw))
    # a MIG instance's row counts on its physical GPU (its gpu_uuid is the instance's)
    uuid = f"coalesce({src.col('parent_gpu_uuid', 'VARCHAR')}, {src.col('gpu_uuid', 'VARCHAR')})"
    # over files, the same scan gives each file's window-start range per host (rowsql.files_meet)
    by_file = bool(src.files) and not src.dedup
    grain_s = fleetbins.grain_s(src)
    fb = fleetbins.bin_sql(grain_s) if grain_s else "0"
    # Each window's values are computed once (the rule code, the GPM work, the capped energy), then
    # summed per job, GPU, file, reject code and fleet bin: the finest grouping that every table
    # of the page is a sum of, a few hundred thousand rows a day. The per-job, per-GPU and per-file
    # tables are then GROUPING SETS over that small table. GROUPING SETS straight over the windows
    # evaluated every aggregate once per set, and the fleet view needed a second pass over every
    # file: a month of 1,000 GPUs took 10 minutes on 2 cores (issue 15).
    # each cap's watts once per row, in a projection below (its CASE, repeated in the capped energy,
    # cost more than the rest of the savings model)
    share = peaks.share_sql(src.col("share_ratio"))
    cap_cols = "".join(f", {limits.capped_energy_sql(pavg, power, f'_cw_{lab}', secs, energy, share)} "
                       f"AS _nj_{lab}" for lab, _ in cap_aggs)
    read = (f"(SELECT *{''.join(f', {cw} AS _cw_{lab}' for lab, cw in cap_aggs)} FROM {src.read})"
            if cap_aggs else src.read)
    src.con.execute(
        "CREATE OR REPLACE TEMP TABLE fine AS "
        "SELECT CAST(job_id AS VARCHAR) AS job_id, host, gpu_uuid, gpu_model, "
        f"{'file_index' if by_file else '0'} AS file_index, "
        "_bad, _fb, first(user) AS user, count(*) AS n_windows, sum(_e) AS energy_j, sum(_s) AS secs, "
        "min(ts_start) AS t0, max(ts_start) AS _last_start, max(ts_end) AS t1, "
        f"count(*) FILTER (WHERE _r = {rules.IDLE}) AS r_idle, "
        f"count(*) FILTER (WHERE _r = {rules.COMPUTE}) AS r_compute, "
        f"count(*) FILTER (WHERE _r = {rules.MEMORY}) AS r_memory, "
        f"count(*) FILTER (WHERE _r = {rules.PIPE_GAP}) AS r_gap, "
        + "".join(f"sum(_p{i} * _ss) AS pipe_s{i}, " for i in range(len(peaks.PIPES)))
        + "sum(_e) FILTER (WHERE _p0 IS NOT NULL) AS gpm_energy_j"
        + "".join(f", sum(_nj_{lab}) AS new_j_{lab}, sum(greatest(_e - _nj_{lab}, 0)) AS saved_j_{lab}"
                  for lab, _ in cap_aggs)
        + f" FROM (SELECT job_id, host, {uuid} AS gpu_uuid, {'file_index, ' if by_file else ''}"
        # the reject code in the same projection as the window's length and bin: DuckDB then
        # computes each row's epoch_ms (costly on TIMESTAMPTZ) once for all of them
        f"{src.code} AS _bad, "
        f"{fb} AS _fb, {src.col('user', 'VARCHAR')} AS user, ts_start, ts_end, {secs} AS _s, "
        f"{share_s} AS _ss, {energy} AS _e, "
        f"{code} AS _r, {model} AS gpu_model, "
        + f"{pipes}{cap_cols} FROM {read}) "
        "GROUP BY ALL")
    rated, unrated_kwh = peaks.register_rates(src.con)
    sums = ("sum(n_windows) AS n_windows, sum(energy_j) AS energy_j, sum(secs) AS secs, min(t0) AS t0, "
            "max(t1) AS t1, sum(r_idle) AS r_idle, sum(r_compute) AS r_compute, sum(r_memory) AS r_memory, "
            f"sum(r_gap) AS r_gap, sum({peaks.TFLOP_SQL}) AS tflop, "
            "sum(gpm_energy_j) FILTER (WHERE r0 IS NOT NULL) AS gpm_energy_j"
            + "".join(f", sum(new_j_{lab}) AS new_j_{lab}, sum(saved_j_{lab}) AS saved_j_{lab}"
                      for lab, _ in cap_aggs))
    g = src.df(
        f"SELECT GROUPING(job_id) AS by_gpu, {'GROUPING(file_index)' if by_file else '1'} AS _not_file, "
        f"_bad, job_id, host, max(_last_start) AS _last_start, gpu_uuid, first(user) AS user, {sums} "
        "FROM fine LEFT JOIN _peaks USING (gpu_model) "
        f"GROUP BY GROUPING SETS ((job_id, _bad), (host, gpu_uuid, _bad)"
        f"{', (host, file_index)' if by_file else ''})")
    files = g.loc[g["_not_file"] == 0, ["host", "t0", "_last_start"]]
    if by_file and rowsql.files_meet(files.set_axis(["host", "start", "last_start"], axis=1)):
        raise _FilesMeet
    g = g.loc[g["_not_file"] == 1].drop(columns=["_not_file", "_last_start"])
    # rows the nightly rejects: counted (each once, in its job's set), then out of every number
    bad = g["_bad"].to_numpy(np.int64)
    left_out = g.loc[(bad > 0) & (g["by_gpu"] == 0).to_numpy()].groupby("_bad")["n_windows"].sum()
    rejected = rowsql.reject_counts(dict(zip(left_out.index.astype(int).tolist(), left_out.tolist(),
                                             strict=True)))
    if rejected:
        log.warning("report: %d impossible telemetry row(s) left out, as the nightly leaves them out: %s",
                    sum(rejected.values()), "; ".join(f"{k}: {v}" for k, v in rejected.items()))
    dups = int(g.loc[(bad < 0) & (g["by_gpu"] == 0).to_numpy(), "n_windows"].sum())
    if dups:
        log.warning("report: %d duplicate telemetry window(s) (the same GPU, job and window start in "
                    "two files) counted once, as the nightly counts them", dups)
    g = g.loc[bad == 0].drop(columns="_bad")
    per_gpu = g[g["by_gpu"] == 1]
    if per_gpu.empty or int(per_gpu["n_windows"].sum()) == 0:
        why = f" ({sum(rejected.values())} impossible row(s) left out)" if rejected else ""
        raise DataError(f"report: the telemetry has no windows{why}")
    per_job = g[g["by_gpu"] == 0]
    idle = per_job[per_job["job_id"].isna()]
    jobs = per_job[per_job["job_id"].notna()].sort_values("job_id").reset_index(drop=True)
    computed = labels is None
    jobs = _with_labels(jobs, labels)
    rows = pd.concat([jobs.assign(_l=jobs["label"]), idle.assign(_l="no job")], ignore_index=True)
    lg = rows.groupby("_l")
    t = pd.DataFrame({"energy_kwh": lg["energy_j"].sum() / 3.6e6, "gpu_hours": lg["secs"].sum() / 3600.0})
    t["kwh_per_gpu_hour"] = t["energy_kwh"] / t["gpu_hours"].replace(0, np.nan)
    order = [x for x in est.LABEL_ORDER if x in t.index] + sorted(set(t.index) - set(est.LABEL_ORDER))
    t = t.loc[order]
    t.index.name = None
    wpe = peaks.work_table(lg[["tflop", "gpm_energy_j"]].sum(min_count=1))
    sav_rows = []
    for lab in est.CAPPED_LABELS:
        if f"new_j_{lab}" in jobs.columns:
            sel = jobs[jobs["label"] == lab]
            if len(sel):
                sav_rows.append({"label": lab, "saved_kwh": float(sel[f"saved_j_{lab}"].sum()) / 3.6e6,
                                 "new_j": float(sel[f"new_j_{lab}"].sum())})
    sav = pd.DataFrame(sav_rows, columns=["label", "saved_kwh", "new_j"]).set_index("label")
    savings = _savings(t, sav, caps, slowdown)
    gpus = per_gpu[["host"]].drop_duplicates()
    t0, t1 = pd.Timestamp(per_gpu["t0"].min()), pd.Timestamp(per_gpu["t1"].max())
    n_windows = int(per_gpu["n_windows"].sum())
    fleet, bin_s, fleet_t0 = pd.DataFrame(columns=["bin", "label", "energy_j"]), 0.0, t0
    timeline = pd.DataFrame(columns=["host", "gpu_index", "ts_start", "power_avg_w", "label"])
    if len(per_gpu) > max_gpus:  # the page shows the fleet's power, not a strip per GPU (sections)
        fleet, bin_s, fleet_t0 = fleetbins.fleet(src, jobs, grain_s, t0, t1)
    else:
        timeline = _timeline(src, jobs, max_gpus, t0, t1)
    return ReportData(
        jobs=_job_savings(jobs), by_label=t, work_per_energy=wpe, savings=savings, timeline=timeline,
        t0=t0, t1=t1,
        n_hosts=len(gpus), n_gpus=len(per_gpu),
        n_windows=n_windows, labels_computed=computed, fleet=fleet, fleet_bin_s=bin_s, fleet_t0=fleet_t0,
        rejected_rows=rejected,
        duplicate_windows=dups,
        work_models=rated,
        work_unrated_kwh=unrated_kwh,
    )


def _job_savings(jobs: pd.DataFrame) -> pd.DataFrame:
    """The per-job table with ``saved_j``: the savings model's estimate under the job's own label's
    cap, so per-user and per-account tables are sums of these rows (no window needed)."""
    jobs = jobs.copy()
    jobs["saved_j"] = 0.0
    for lab in est.CAPPED_LABELS:
        if f"saved_j_{lab}" in jobs.columns:
            m = jobs["label"] == lab
            jobs.loc[m, "saved_j"] = jobs.loc[m, f"saved_j_{lab}"].fillna(0.0)
    return jobs[["job_id", "user", "n_windows", "energy_j", "gpu_hours", "label", "confidence", "source",
                 "saved_j"]]


def _with_labels(jobs: pd.DataFrame, labels: pd.DataFrame | None) -> pd.DataFrame:
    """Jobs with label/confidence/source: the store's, else the GPM rule on this scan's counts."""
    from wattclass.classifier import rules

    if labels is None:
        # the rule labels a job only where it can call every window (as the engine: labeling.decide);
        # a window without GPM or with a compute pipe not measured leaves the job to the model
        called = jobs["r_idle"] + jobs["r_compute"] + jobs["r_memory"]
        has = (called > 0) & (called == jobs["n_windows"])
        j = jobs[has]
        lab = rules.job_labels(j["r_idle"], j["r_compute"], j["r_memory"])
        conf = rules.job_confidence(j["r_idle"], j["r_compute"], j["r_memory"], lab)
        labels = pd.DataFrame({"job_id": j["job_id"].astype(str).to_numpy(), "label": rules.label_names(lab),
                               "confidence": np.round(conf, 3), "source": "rule"})
    keep = [c for c in ("job_id", "label", "confidence", "source") if c in labels.columns]
    # one label per job, the last (as report.load reads a store): a job named twice had its row,
    # and so its energy, doubled, and the fleet view's job -> label map failed
    labels = labels[keep].drop_duplicates("job_id", keep="last")
    jobs = jobs.merge(labels, on="job_id", how="left")
    for c in ("label", "confidence", "source"):
        if c not in jobs.columns:
            jobs[c] = None
    jobs["label"] = jobs["label"].fillna("unlabelled")
    jobs["gpu_hours"] = jobs["secs"] / 3600.0
    return jobs


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
                             saved_kwh_slow=float(t["saved_kwh_slow"].sum()), caps=dict(caps),
                             slowdown=slowdown)


def _timeline(src: _Source, jobs: pd.DataFrame, max_gpus: int, t0: pd.Timestamp, t1: pd.Timestamp
              ) -> pd.DataFrame:
    """Mean power per GPU and time bucket (the first ``max_gpus`` GPUs), with the label that held
    the bucket longest; buckets are one window long unless that would exceed TIMELINE_POINTS.

    Only drawn for a cluster of at most ``max_gpus`` GPUs (above, the fleet view), so this second
    pass reads few windows."""
    gi = src.col("gpu_index", "INTEGER")
    gpus = src.df(f"SELECT DISTINCT host, {gi} AS gpu_index FROM w ORDER BY 1, 2")
    first = gpus.head(max_gpus)
    bucket_s = max(1, int(np.ceil((t1 - t0).total_seconds() / TIMELINE_POINTS)))
    src.con.register("tl_gpus", first)
    src.con.register("job_labels", jobs[["job_id", "label"]])
    secs = _secs(src)
    power = _power(src, _pavg(src))
    df = src.df(
        f"WITH lw AS (SELECT v.*, CASE WHEN v.job_id IS NULL THEN 'no job' "
        "ELSE coalesce(l.label, 'unlabelled') END AS label FROM w v LEFT JOIN job_labels l "
        "ON CAST(v.job_id AS VARCHAR) = l.job_id "
        f"JOIN tl_gpus g ON v.host = g.host AND {src.col('v.gpu_index', 'INTEGER')} = g.gpu_index), "
        # per label first, so the bucket's label is the one that held it longest (the longest
        # single window's was arbitrary between windows of equal length), ties by name
        f"bl AS (SELECT host, {src.col('gpu_index', 'INTEGER')} AS gpu_index, "
        f"to_timestamp(floor(epoch(ts_start) / {bucket_s}) * {bucket_s}) AS ts_start, label, "
        # a GPU split between jobs or MIG instances writes a row per job with its share of the
        # power: the rows' time counts by share, or the GPU's power was the mean of its shares
        f"sum({power} * {secs}) AS power_s, sum({secs} * {peaks.share_sql(src.col('share_ratio'))}) AS secs "
        "FROM lw GROUP BY ALL) "
        "SELECT host, gpu_index, ts_start, sum(power_s) / nullif(sum(secs), 0) AS power_avg_w, "
        "first(label ORDER BY secs DESC, label) AS label "
        "FROM bl GROUP BY ALL ORDER BY host, gpu_index, ts_start")
    df["ts_start"] = pd.to_datetime(df["ts_start"], utc=True)
    return df
