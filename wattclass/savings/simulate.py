"""What-if: every past job's energy saved and runtime added had the policy's caps applied.

1. Scan the telemetry of the date range with DuckDB, reading only the columns the model needs, and
   aggregate per job first: energy, GPU-hours, power (each window weighted by its length: a 0.1 s
   segment at a job edge is not worth a 10 s window; on a shared GPU the physical GPU's mean
   power, the job's ``power_avg_w`` over its ``share_ratio``, as its maximum power and the cap are
   the GPU's), GPM activity and the GPM rule's window
   counts (the classifier's window rule: the nightly scan's SQL of it, ``classifier.rowsql``).
   Rows the nightly rejects (``classifier.validity``: a null key, a backwards window, an energy
   that is negative, NaN or infinite, an impossible power) are left out, as the nightly leaves
   them out, and counted per reason (``totals["rejected_rows"]``): one infinite energy would
   otherwise make every sum infinite.
2. Label each job: the label store's label where the nightly run stored one; else the GPM rule on
   the job's own windows (the classifier's rule, same thresholds); else ``unlabelled``.
3. Look up the policy's cap for the label (exempt accounts, partitions and users, from the
   store's Slurm fields, are left uncapped); on a GPU the job shared, the highest cap of its jobs
   (``shared_gpu_caps``); and apply the response model (``response``): the default per-job model
   or a site calibration, with the job's demand at most the limit it ran under (``demand_w``).
4. Sum kWh saved and GPU-hours added (mid and band) per label, user and account.

The band sums each job's lo and hi: it treats the model error as shared by all jobs (one curve
wrong for all), the honest reading for a model error, wider than independent per-job noise.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from wattclass.argtypes import is_iso_date
from wattclass.caps import cap_watts, known_range_w
from wattclass.classifier import rowsql, rules
from wattclass.classifier.reader import partition_dates, telemetry_files, telemetry_root
from wattclass.errors import DataError
from wattclass.fsutil import require_trusted_files
from wattclass.logsafe import clip
from wattclass.policy import Policy
from wattclass.savings.response import (
    SiteResponse,
    clock_bound_share,
    default_effect,
    default_limit_w,
)
from wattclass.schema import TELEMETRY_V1, column_names, first_schema_reads_all

GROUPS: tuple[str, ...] = ("label", "user", "account")
log = logging.getLogger(__name__)


class NoJobWindows(DataError):
    """The range holds no valid job window (a quiet or maintenance day): nothing to simulate.
    Its own class so that the report leaves out only its what-if section, not the whole page."""


@dataclass
class SimResult:
    """Per-job results and the summaries per label, user and account."""

    jobs: pd.DataFrame
    by: dict[str, pd.DataFrame]
    totals: dict[str, Any]
    model: str
    files: int


def telemetry_paths(data_root: Path, date_from: str | None, date_to: str | None) -> list[Path]:
    root = telemetry_root(Path(data_root))
    if not root.is_dir():
        raise DataError(f"{data_root}: no telemetry folder")
    days = [d for d in partition_dates(root)  # not a date=...bak copy: the nightly never reads one
            if not (date_from and d < date_from) and not (date_to and d > date_to)]
    return telemetry_files([root / f"date={d}" for d in days])  # the nightly's listing of a day


def _sql(present: set[str], union: bool, dedup: bool = False) -> str:
    """The per-job aggregate of the files given as the query's one parameter (a list of paths); a
    column absent from every file reads as NULL. ``union``: files may differ in columns (read every
    file's schema: slower on tens of thousands of files).

    The files are the checked list (``require_trusted_files``), never a glob: a glob read what the
    check never saw (DuckDB's ``*`` matches ``.hidden.parquet``, a symlink among them), which the
    nightly does not read either. ``hive_partitioning = false``: with DuckDB's default a path's
    ``host=`` folder replaced each row's ``host``, so a file copied into another folder
    (``host=n1.bak``) was a second host, its windows never de-duplicated and its energy summed
    twice.

    The inner query computes each window's busiest compute pipe and rule code once (DuckDB does not
    share the repeated ``greatest`` between aggregates: this halves the CPU time). Grouped by job and
    reject code (``rowsql._reject_sql``; 0 = valid): the caller keeps code 0 and counts the others,
    in the same scan (a job's rejected rows are a second, rare group). The same scan gives each
    file's first and last window start per host (rows with ``by_file`` = 1: ``rowsql.files_meet``);
    ``dedup``: two files may hold the same windows, whose copies then get ``rowsql.DUPLICATE``
    (left out and counted, as the nightly counts each window once)."""
    def col(c: str) -> str:
        return f'"{c}"' if c in present else "NULL"

    # the classifier's rule SQL (classifier.rowsql): inputs in the inner query, the chain on their names
    x = rowsql.rule_inputs_sql(frozenset(rules.RULE_COLUMNS) - present)
    code = rowsql.rule_chain_sql(rowsql.RuleInputs(sm="sm", dram="dram", comp="c", gap="gap"))
    # each row's day from its file's name (its date= folder; rowsql.FILENAME_DAY_SQL)
    reject = rowsql._reject_sql(frozenset(TELEMETRY_V1.names) - present, rowsql.FILENAME_DAY_SQL)
    if dedup:
        reject = rowsql.dedup_code_sql(reject, "filename")
    opts = ", hive_partitioning = false" + (", union_by_name = true" if union else "") \
        + (", file_row_number = true" if dedup else "")
    return f"""
SELECT GROUPING(job_id) AS by_file, job_id, bad, host, fname, max(ts_start) AS last_start,
  max("user") AS "user", max(gpu_model) AS gpu_model,
  sum(energy_j) AS energy_j, sum(ms) / 3.6e6 AS gpu_hours,
  sum(pmax * ms) / sum(CASE WHEN pmax IS NOT NULL THEN ms END) AS need_w,
  sum(pavg * ms) / sum(CASE WHEN pavg IS NOT NULL THEN ms END) AS avg_w, max(plim) AS limit_w,
  sum(CASE WHEN code >= 0 THEN c * ms END) / sum(CASE WHEN code >= 0 AND c IS NOT NULL THEN ms END) / 100.0
    AS compute_act,
  sum(CASE WHEN code >= 0 THEN dram * ms END)
    / sum(CASE WHEN code >= 0 AND dram IS NOT NULL THEN ms END) / 100.0 AS dram_act,
  count(CASE WHEN code = {rules.IDLE} THEN 1 END) AS n_idle,
  count(CASE WHEN code = {rules.COMPUTE} THEN 1 END) AS n_comp,
  count(CASE WHEN code = {rules.MEMORY} THEN 1 END) AS n_mem,
  count(CASE WHEN code = {rules.PIPE_GAP} THEN 1 END) AS n_gap, count(*) AS n_windows,
  min(ts_start) AS "start", max(ts_end) AS "end", max(sh) AS on_shared
FROM (
  SELECT job_id, host, fname, {col("user")} AS "user", {col("gpu_model")} AS gpu_model, energy_j,
    epoch_ms(ts_end) - epoch_ms(ts_start) AS ms, ts_start, ts_end, {col("power_max_w")} AS pmax,
    {col("power_avg_w")} / coalesce(nullif({col("share_ratio")}, 0), 1) AS pavg,
    {col("power_limit_w")} AS plim, c, dram,
    {code} AS code, bad, {_shared_row_sql(present)} AS sh
  FROM (SELECT *, file_index AS fname, {reject} AS bad, {x.comp} AS c, {x.dram} AS dram, {x.sm} AS sm,
          ({x.gap}) AS gap
        FROM read_parquet($files{opts})
        WHERE job_id IS NOT NULL)
)
GROUP BY GROUPING SETS ((job_id, bad), (host, fname))
"""


def _shared_row_sql(present: set[str]) -> str:
    """1 for a row of a GPU several jobs hold (``shared_jobs`` > 1) or of a MIG instance (its
    power limit is its parent's), else 0; 0 where a file has neither column (older writers)."""
    conds = []
    if "shared_jobs" in present:
        conds.append("coalesce(CAST(shared_jobs AS DOUBLE), 0) > 1")
    if "parent_gpu_uuid" in present:
        conds.append("parent_gpu_uuid IS NOT NULL")
    return f"CAST(({' OR '.join(conds)}) AS INTEGER)" if conds else "0"


def _neighbours(con: Any, params: dict[str, Any], present: set[str], union: bool) -> dict[str, set[str]]:
    """Per job that shared a physical GPU (a shared GPU, or MIG instances of one GPU): the other
    jobs whose rows cover the same window start on that GPU, at any time of its run. The rows of
    one window of a shared or MIG GPU are the split of one segment (telemetry/splitter.py), so
    they share ``ts_start``."""
    gpu = "coalesce(parent_gpu_uuid, gpu_uuid)" if "parent_gpu_uuid" in present else "gpu_uuid"
    opts = ", hive_partitioning = false" + (", union_by_name = true" if union else "")
    rows = con.execute(
        f"SELECT list(DISTINCT CAST(job_id AS VARCHAR)) AS jobs FROM read_parquet($files{opts}) "
        f"WHERE job_id IS NOT NULL AND {_shared_row_sql(present)} = 1 "
        f"GROUP BY host, {gpu}, ts_start HAVING count(DISTINCT job_id) > 1", params).fetchall()
    out: dict[str, set[str]] = {}
    for (jobs,) in rows:
        for j in jobs:
            out.setdefault(j, set()).update(k for k in jobs if k != j)
    return out


class _UnreadableEnd(Exception):
    """The first or last file's footer did not read (``_aggregate``): check every file."""


def _aggregate(files: list[Path], threads: int | None) -> pd.DataFrame:
    """``_sql``'s per-job rows (``bad`` per row code) of ``files``: the one-schema fast path, else
    by column name, again with the exact de-duplication where two files' windows meet on a host;
    a file DuckDB cannot read raises ``duckdb.Error``."""
    import duckdb

    plan = first_schema_reads_all(files)  # why not just the first file's: wattclass.schema
    present = set(plan.seen)
    missing = [c for c in ("ts_start", "ts_end", "job_id", "energy_j") if c not in present]
    if missing and (plan.first is None or column_names(files[-1]) is None):
        raise _UnreadableEnd  # the columns were not seen because a footer did not read
    if missing:
        raise DataError(f"{files[0]}: telemetry lacks column(s) {', '.join(missing)}")
    con = duckdb.connect()
    try:
        if threads:
            con.execute(f"SET threads = {int(threads)}")
        params = {"files": [str(f) for f in files]}
        union = not plan.exact
        try:  # the fleet's files normally share one schema: the fast path
            df = con.execute(_sql(present, union=union), params).df()
        except duckdb.Error:  # some file lacks a column: read every schema
            union = True
            df = con.execute(_sql(present, union=union), params).df()
        by_file = df.loc[df["by_file"] == 1]
        if len(by_file) and rowsql.files_meet(by_file):
            # two files that may hold the same windows: each window counted once, as the nightly
            # counts it (both copies' energy was summed)
            df = con.execute(_sql(present, union=union, dedup=True), params).df()
        out: pd.DataFrame = df.loc[df["by_file"] == 0].drop(
            columns=["by_file", "host", "fname", "last_start"])
        shared = out["on_shared"].fillna(0).to_numpy(np.int64) > 0
        nb = _neighbours(con, params, present, union) if shared.any() else {}
    finally:
        con.close()
    ids = out["job_id"].astype(str)
    out = out.drop(columns="on_shared")
    out["neighbours"] = [tuple(sorted(nb.get(j, ()))) for j in ids]
    return out


def scan_jobs(data_root: Path, date_from: str | None = None, date_to: str | None = None,
              threads: int | None = None, rejected: dict[str, int] | None = None,
              files: list[Path] | None = None, skipped: list[tuple[Path, str]] | None = None
              ) -> pd.DataFrame:
    """Per-job aggregates (module docstring, step 1), by DuckDB reading only the needed columns, of
    the valid rows; ``rejected`` (if given) gets the rows left out per reason, as the nightly's
    summary names them. ``files``: ``telemetry_paths`` of the same range if the caller listed them
    already (a month of 1,000 GPUs is 90,000 files).

    A file Parquet cannot read (empty, cut short by a copy, not Parquet) is left out with a
    warning naming it, and added to ``skipped`` (file, why), as the nightly, the report and
    ``wattclass job`` leave it out: one such file failed the whole what-if, and with it
    ``wattclass report --policy``. Its footers are checked only after a read failed."""
    import duckdb

    if files is None:
        files = telemetry_paths(data_root, date_from, date_to)
    files = require_trusted_files(files)
    if not files:
        return pd.DataFrame()
    try:
        df = _aggregate(files, threads)
    except (duckdb.Error, _UnreadableEnd) as exc:
        from wattclass.report.data import readable_files

        why = (str(exc).splitlines() or [type(exc).__name__])[0][:300]
        good, bad_files = readable_files(files)
        if not bad_files:
            raise DataError(f"{data_root}: cannot scan telemetry: {why}") from exc
        for f, reason in bad_files:
            log.warning("simulate: skipping telemetry file %s (unreadable): %s", clip(f), clip(reason))
        if skipped is not None:
            skipped.extend(bad_files)
        if not good:
            raise DataError(f"{data_root}: no readable telemetry file ({len(bad_files)} unreadable, e.g. "
                            f"{clip(bad_files[0][0])}: {clip(bad_files[0][1])})") from exc
        try:
            df = _aggregate(good, threads)
        except (duckdb.Error, _UnreadableEnd) as exc2:
            raise DataError(f"{data_root}: cannot scan telemetry: "
                            f"{(str(exc2).splitlines() or [type(exc2).__name__])[0][:300]}") from exc2
    bad = df["bad"].to_numpy(np.int64)
    left_out = df.loc[bad > 0].groupby("bad")["n_windows"].sum()
    counts = rowsql.reject_counts(dict(zip(left_out.index.astype(int).tolist(), left_out.tolist(),
                                           strict=True)))
    if counts:
        log.warning("simulate: %d impossible telemetry row(s) left out, as the nightly leaves them out: %s",
                    sum(counts.values()), "; ".join(f"{k}: {v}" for k, v in counts.items()))
    if rejected is not None:
        rejected.update(counts)
    dups = int(df.loc[bad < 0, "n_windows"].sum())
    if dups:
        log.warning("simulate: %d duplicate telemetry window(s) (the same GPU, job and window start in two "
                    "files) counted once, as the nightly counts them", dups)
    df = pd.DataFrame(df.loc[bad == 0].drop(columns="bad").reset_index(drop=True))
    df["job_id"] = df["job_id"].astype(str)
    for c in ("n_idle", "n_comp", "n_mem", "n_gap", "n_windows"):
        df[c] = df[c].astype(np.int64)
    return df


def attach_labels(jobs: pd.DataFrame, store_labels: pd.DataFrame | None) -> pd.DataFrame:
    """Label, source, account and job name per job (module docstring, step 2)."""
    out = jobs.copy()
    ni, nc, nm = (out[c].to_numpy(np.int64) for c in ("n_idle", "n_comp", "n_mem"))
    # the rule labels a job only where it called every window, as the nightly does (labeling.decide):
    # a window without GPM, or with a compute pipe missing (PIPE_GAP), leaves the job to the model
    has = ((ni + nc + nm) > 0) & ((ni + nc + nm) == out["n_windows"].to_numpy(np.int64))
    names = np.asarray(rules.label_names(rules.job_labels(ni, nc, nm)), dtype=object)
    out["label"] = pd.Series(names, index=out.index).where(has)
    out["label_source"] = pd.Series("rule(sim)", index=out.index).where(has)
    out["account"], out["name"], out["partition"] = None, None, None
    if store_labels is not None and len(store_labels):
        s = store_labels.drop_duplicates("job_id", keep="last").set_index("job_id")
        idx = out["job_id"]
        lab = idx.map(s["label"]) if "label" in s.columns else pd.Series(None, index=out.index)
        known = lab.notna()
        out.loc[known, "label"] = lab[known]
        out.loc[known, "label_source"] = "store"
        for c in ("account", "name", "partition"):
            if c in s.columns:
                out[c] = idx.map(s[c]).astype(object)
        if "user" in s.columns:
            out["user"] = out["user"].where(out["user"].notna(), idx.map(s["user"]))
    out["label"] = out["label"].fillna("unlabelled")
    out["label_source"] = out["label_source"].fillna("none")
    out["user"] = out["user"].fillna("(unknown)")
    out["account"] = out["account"].fillna("(unknown)")
    return out


def demand_w(need_w: npt.NDArray[np.float64], limit_w: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """The power a job asks for under a cap: its mean window maximum, at most the limit it ran under.

    Why: the 1 s readings overshoot the enforced limit (the bundled H200 jobs' mean window maximum
    reaches 890 W at a 700 W limit; half of the demo's jobs are above 700 W), but the job's measured
    runtime and energy are those under that limit. A cap at or above it changes nothing, so a
    ``compute = "100%"`` cap must cost no time and save no energy; with the raw maximum it "bit"
    every such job (the example policy's what-if added GPU-hours to compute jobs it leaves alone).
    A job without a recorded limit keeps its maximum.
    """
    ok = np.isfinite(need_w) & np.isfinite(limit_w) & (limit_w > 0)
    return np.where(ok, np.minimum(need_w, np.where(ok, limit_w, 0.0)), need_w)


def apply_policy(jobs: pd.DataFrame, policy: Policy, response: SiteResponse | None) -> pd.DataFrame:
    """Per job: cap in watts and the effect (module docstring, step 3)."""
    out = jobs.copy()
    n = len(out)
    default_w = np.array([default_limit_w(m, lim) or np.nan for m, lim in
                          zip(out["gpu_model"], out["limit_w"], strict=True)], dtype=float)
    models = out["gpu_model"].to_numpy(dtype=object)
    cap_w = np.full(n, np.nan)
    cap_text = np.full(n, None, dtype=object)
    # as the hooks exempt them: the partition too (a policy's "debug" partition was simulated as
    # capped, its jobs' savings and slowdown counted although the Prolog never caps them)
    exempt = (out["user"].isin(policy.exempt_users) | out["account"].isin(policy.exempt_accounts)
              | out["partition"].isin(policy.exempt_partitions))
    for label, cap in policy.caps.items():
        m = (out["label"] == label).to_numpy() & ~exempt.to_numpy() & np.isfinite(default_w)
        cap_w[m] = [cap_watts(cap, d, *known_range_w(g))
                    for d, g in zip(default_w[m], models[m], strict=True)]
        cap_text[m] = cap.text()
    own_w = cap_w
    if "neighbours" in out.columns:
        cap_w = shared_gpu_caps(out["job_id"].astype(str).tolist(), own_w, out["neighbours"].tolist())
    out["cap_raised_by_neighbours"] = np.isfinite(own_w) & ~(cap_w <= own_w)
    out["default_w"], out["cap_w"], out["cap"] = default_w, cap_w, cap_text
    need = demand_w(out["need_w"].to_numpy(float), out["limit_w"].to_numpy(float))
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


def shared_gpu_caps(job_ids: list[str], cap_w: npt.NDArray[np.float64], neighbours: list[tuple[str, ...]]
                    ) -> npt.NDArray[np.float64]:
    """The limit each job would run under: on a GPU it shared, the highest cap of its jobs, NaN
    (none) where one of them has no cap (no label the policy caps, exempt, or not in the scan).

    Why: power limits exist per physical GPU, and the Prolog enforces the highest cap the jobs on
    it allow, a job without a cap holding the GPU at its limit (docs/shared-gpus.md); each job at
    its own label's cap counted savings of a memory-bound job beside a compute-bound one that no
    enforced limit gives. A job is held at its neighbours' highest cap over its whole run, also
    where it shared the GPU for part of it: the what-if errs toward saving less."""
    where = {j: i for i, j in enumerate(job_ids)}
    out = cap_w.copy()
    for i, others in enumerate(neighbours):
        if not others or not np.isfinite(cap_w[i]):
            continue
        caps = [cap_w[where[j]] if j in where else np.nan for j in others]
        out[i] = np.nan if not np.isfinite(caps).all() else max(cap_w[i], *caps)
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
        if d is not None and not is_iso_date(d):
            raise DataError(f"{what}: expected YYYY-MM-DD, got {d!r}")
    files = telemetry_paths(data_root, date_from, date_to)
    rejected: dict[str, int] = {}
    skipped: list[tuple[Path, str]] = []
    jobs = scan_jobs(data_root, date_from, date_to, rejected=rejected, files=files, skipped=skipped)
    if jobs.empty:
        span = f" between {date_from or '...'} and {date_to or '...'}" if date_from or date_to else ""
        # every row rejected (a clock step's day) said only "no job windows": say why
        why = (f" ({sum(rejected.values())} impossible row(s) left out, as the nightly leaves them out: "
               + "; ".join(f"{k}: {v}" for k, v in rejected.items()) + ")") if rejected else ""
        raise NoJobWindows(f"{data_root}: no job windows in telemetry{span}{why}")
    labels = ClassifierStore(data_root).label_history(date_from)
    jobs = apply_policy(attach_labels(jobs, labels), policy, response)
    totals: dict[str, Any] = {c: float(jobs[c].sum()) for c in ("kwh_saved", "kwh_saved_lo", "kwh_saved_hi",
                                                                 "gpu_hours_added", "gpu_hours_added_lo",
                                                                 "gpu_hours_added_hi", "gpu_hours")}
    totals["energy_kwh"] = float(jobs["energy_j"].sum() / 3.6e6)
    totals["jobs"] = len(jobs)
    totals["capped_jobs"] = int(jobs["cap"].notna().sum())
    totals["caps_raised_by_neighbours"] = int(jobs["cap_raised_by_neighbours"].sum())
    totals["rejected_rows"] = rejected
    totals["skipped_files"] = {str(f): why for f, why in skipped}
    return SimResult(jobs, {g: summarise(jobs, g) for g in GROUPS}, totals,
                     "default (own telemetry + published curves)" if response is None
                     else f"site calibration {response.source} ({response.gpu_model})",
                     len(files) - len(skipped))
