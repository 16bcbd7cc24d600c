"""The nightly run: one day's telemetry -> job labels -> label store, model registry, label table.

Steps (each output written atomically; a crash leaves every file either old or new):
1. stream the day's telemetry files (``reader``) and label every job (``labeling``) with the
   registry's current model, keeping a small random sample of GPM-labelled windows;
2. join Slurm job records (name, account, partition, times) through a ``SlurmClient``;
3. store the day's labels (``labels/date=D``; re-running a day replaces it);
4. if jobs were labelled by the GPM rule, retrain on all stored samples plus the bundled H200 set
   and promote the candidate only if ``should_promote`` says its grouped-CV accuracy on the *new*
   jobs is not lower than the current model's accuracy on the same jobs (the current model has
   never seen them; the candidate's figure is out-of-fold) -- an apples-to-apples gate;
5. rebuild the submission label table from the label history (``table.build_entries``);
6. with a canary in the history (``arm`` from admin_comment), estimate and store the effect of each
   label's cap: capped vs control runs of the same job key (``effects``);
7. summarise jobs, GPU-hours and energy per label; store and return the summary.

A day without telemetry (or without any job windows) changes nothing but the summary; its status
says which (``no telemetry`` / ``no jobs``), and ``wattclass nightly`` exits 7 on the first unless
``--allow-empty``: a broken pipeline must not look like a quiet night. Likewise a day whose every
job window its Slurm records contradict (``job windows rejected``, exit 3); where they contradict
most of them, the night goes on and logs an ERROR (``job_check`` in the summary).

Robustness (issue 9): the run holds ``<data_root>/classifier/wattclass.lock`` from start to end, so two runs
never interleave their writes (a second one waits up to ``lock_timeout_s``, then LockBusyError);
bad telemetry files and rows are skipped and counted by the rules in ``validity``; the user of a
job is the one in Slurm's job record, never the one in telemetry (a process's environment is not
proof of who ran it): a job without a record keeps no user, so it adds no user-keyed table entry
(its telemetry user stays in ``telemetry_user`` for audits). The records are read beside the scan
(a thread from the moment its query starts: ``sacct`` at a large site takes seconds), and the
scan checks each job window against its job's record after its query (host, start..end, user;
``classifier/jobcheck.py``), rejecting, counting and logging the windows the record contradicts.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from wattclass.admincomment import format_comment, parse_admin_comment
from wattclass.classifier import rules
from wattclass.classifier.dasktrain import train_model_dask
from wattclass.classifier.effects import effects_from_history
from wattclass.classifier.engine import (
    AFTER_SCAN_MODULES,
    SAMPLE_PER_JOB,
    label_files_dask,
    label_files_local,
)
from wattclass.classifier.jobcheck import index_records, job_records_table
from wattclass.classifier.labeling import LabelResult
from wattclass.classifier.model import (
    SET_OUT_GROUPINGS,
    TrainingSet,
    WindowModel,
    beside,
    cross_validate,
    should_promote,
    train_model,
)
from wattclass.classifier.reader import telemetry_files
from wattclass.classifier.store import ClassifierStore, ModelRegistry, utc_day_bounds
from wattclass.classifier.table import HISTORY_DAYS, build_entries, policy_at_write
from wattclass.classifier.training import cached_training_set, thin
from wattclass.classifier.validity import REJECT_JOB_HOST, REJECT_JOB_TIME, REJECT_JOB_USER
from wattclass.errors import ConfigError, SlurmError
from wattclass.labeltable import table_write_lock, write_label_table
from wattclass.lockfile import FolderLock
from wattclass.slurm.client import SlurmClient

if TYPE_CHECKING:
    import pyarrow as pa
    from distributed import Client

log = logging.getLogger("wattclass.classifier")

#: Bound the retraining cost whatever the cluster size. SAMPLE_PER_JOB (engine): GPM windows
#: sampled per job for retraining.
MAX_WINDOWS_PER_JOB = 16
MAX_TRAIN_JOBS = 1500
#: The canary comparison looks back this far: long enough for repeats, short enough for drift.
EFFECT_DAYS = 60


@dataclass
class NightlyOptions:
    data_root: Path
    date: str
    table_out: Path
    policy: Mapping[str, Any] | None = None
    #: Reads the policy file again for the table write (``table.policy_at_write``).
    policy_reload: Callable[[], Mapping[str, Any]] | None = None
    retrain: bool = True
    base_training: tuple[Path, ...] = ()
    seed: int = 0
    workers: int = 0  # threads of the DuckDB scan; 0: every core
    engine: str = "local"  # "local" (processes on this machine) or "dask" (see classifier.engine)
    scheduler: str | None = None  # dask: address of a running scheduler
    dask_config: Path | None = None  # dask: cluster TOML (classifier/scaleout.py); neither: a LocalCluster
    lock_timeout_s: float = 0.0  # wait this long for another run's lock on the classifier folder
    table_group: int | None = None  # gid that may read the label table (0640); None: 0644


class _Once:
    """A loader called at most once, from any thread; later calls return its result.

    ``close`` (a run ending in an error) waits for a load under way and refuses later ones, so
    the background thread never writes the registry after the run let go of its lock. A load
    that failed is not tried again (its error is raised to every later caller): the run ends on
    it, and a retry from the background thread could outlive the run's lock."""

    def __init__(self, load: Callable[[], WindowModel]) -> None:
        self._load = load
        self._lock = threading.Lock()
        self._model: WindowModel | None = None
        self._error: BaseException | None = None
        self._closed = False

    def __call__(self) -> WindowModel:
        with self._lock:
            if self._closed:
                raise RuntimeError("the nightly run ended; its model is no longer loaded")
            if self._error is not None:
                raise self._error
            if self._model is None:
                try:
                    self._model = self._load()
                except BaseException as exc:
                    self._error = exc
                    raise
            return self._model

    def close(self) -> None:
        with self._lock:
            self._closed = True


class _Beside:
    """``load()`` in a thread of its own once ``start()`` is called (by the scan as its query
    starts); ``result()`` starts it if nobody did, waits for it, and returns what it returned or
    raises what it raised (to every caller).

    Why (issue 15): the Slurm records of a day are a query to slurmdbd (``sacct`` at a site of
    tens of thousands of jobs takes seconds) that the scan needs only after its query; read
    beside the query, they cost the night no wall time. Started as the query starts, not before:
    the client's Python (JSON parsing, the record index) would otherwise take the GIL from the
    Python that lists, checks and binds the files (the preload's lesson, ``Scanner._execute``).
    A daemon thread: a run ending in an error does not wait for a client that hangs (each has its
    own timeout)."""

    def __init__(self, load: Callable[[], pd.DataFrame | None], name: str) -> None:
        self._load = load
        self._value: pd.DataFrame | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._lock = threading.Lock()
        self._started = False

    def start(self) -> None:
        with self._lock:
            if not self._started:
                self._started = True
                self._thread.start()

    def _run(self) -> None:
        try:
            self._value = self._load()
        except BaseException as exc:  # raised to the caller of result(), in the run's thread
            self._error = exc

    def result(self) -> pd.DataFrame | None:
        self.start()
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value


def _records(slurm: SlurmClient | None, date: str) -> pd.DataFrame | None:
    """The job records of the day and the week before (``jobcheck.index_records``), or None
    (no Slurm, or unavailable: logged, and the night goes on without them)."""
    if slurm is None:
        return None
    start, end = utc_day_bounds(date)
    try:
        recs = slurm.jobs_frame(start - dt.timedelta(days=7), end)
    except (SlurmError, OSError) as exc:
        log.warning("Slurm job records unavailable (%s): job windows are not checked against them, and "
                    "jobs keep no user, account or name, so they add no user- or account-keyed table "
                    "entry tonight", exc)
        return None
    return index_records(recs) if not recs.empty else None


def _join_slurm(labels: pd.DataFrame, recs: pd.DataFrame | None) -> pd.DataFrame:
    """Add the job records' fields (``recs``: ``_records``); ``user`` comes from the record only
    (None without one)."""
    out = labels.copy()
    out["telemetry_user"] = out["user"]
    out["user"] = None
    for c in ("name", "account", "partition", "slurm_start", "slurm_end", "decision_label", "cap", "arm",
              "decision_comment"):
        out[c] = None
    if recs is None or out.empty:
        return out
    idx = out["job_id"]
    for c in ("user", "name", "account", "partition"):
        out[c] = _nullable(idx.map(recs[c]))
    out["slurm_start"] = _nullable(idx.map(recs["start"]))
    out["slurm_end"] = _nullable(idx.map(recs["end"]))
    # What job_submit.lua decided (label, cap, canary arm), for the canary comparison.
    comments = idx.map(recs["admin_comment"]).map(
        lambda t: parse_admin_comment(t) if isinstance(t, str) else None)
    out["decision_label"] = _nullable(comments.map(lambda c: c.label if c else None))
    out["cap"] = _nullable(comments.map(lambda c: c.cap.text() if c and c.cap else None))
    out["arm"] = _nullable(comments.map(lambda c: c.arm if c else None))
    # The whole decision (mode too), for `wattclass job`: a site reading sacct keeps no jobs file.
    out["decision_comment"] = _nullable(comments.map(
        lambda c: format_comment(c.label, c.confidence, c.cap.text() if c.cap else None, c.source, c.mode,
                                 c.arm) if c else None))
    return out


def _nullable(s: pd.Series) -> pd.Series:
    return s.astype(object).where(s.notna(), None)


#: The summary's status of a night whose every job window its Slurm records rejected (``wattclass
#: nightly`` exits non-zero: the label table is left as it was, which must not look like a quiet night).
JOB_WINDOWS_REJECTED = "job windows rejected"
_JOB_REJECTS = (REJECT_JOB_HOST, REJECT_JOB_TIME, REJECT_JOB_USER)


def _check_attribution(summary: dict[str, Any], labels: pd.DataFrame) -> int:
    """Put the job-record check's rejects and their share of the job windows into the summary
    (``job_check``) and log an ERROR where they are the majority; returns their count.

    Why: a site-wide cause (the daemon's ``--host`` unlike Slurm's node names, a node clock far
    off, a jobs file of the wrong cluster) rejects every job window; per-job warnings alone,
    capped at a few lines, would read like a handful of suspicious jobs."""
    rej = summary.get("rejected_rows", {})
    n = sum(int(rej.get(k, 0)) for k in _JOB_REJECTS)
    kept = int(labels["n_windows"].sum()) if not labels.empty else 0
    share = n / (n + kept) if n + kept else 0.0
    summary["job_check"] = {"rejected_windows": n, "rejected_share": round(share, 4)}
    if n and share > 0.5:
        log.error("%d of %d job windows (%.0f%%) contradict their job's Slurm record (%s): a site-wide "
                  "cause? the telemetry daemon's host names unlike Slurm's node names (--host), node "
                  "clocks, a jobs file of another cluster or with local times (read as UTC)",
                  n, n + kept, 100 * share,
                  ", ".join(f"{k}: {rej[k]}" for k in _JOB_REJECTS if rej.get(k)))
    return n


def _all_rejected(store: ClassifierStore, date: str, summary: dict[str, Any], n: int,
                  t0: float) -> dict[str, Any]:
    """The summary of a night whose every job window (``n``) its Slurm records rejected, stored."""
    summary.update({"status": JOB_WINDOWS_REJECTED, "jobs": 0, "seconds": round(time.monotonic() - t0, 2),
                    "message": f"every job window of {date} ({n}) contradicts its job's Slurm record "
                    "(see rejected_rows); label store, model and label table left unchanged"})
    store.write_summary(date, summary)
    return summary


def _warn_dropped(summary: dict[str, Any]) -> None:
    dup, rej = summary.get("duplicate_windows", 0), summary.get("rejected_rows", {}).get("count", 0)
    if dup or rej:
        log.warning("%d duplicate window(s) dropped (%d of them with values unlike the copy kept), %d "
                    "row(s) rejected (see the summary)", dup, summary.get("conflicting_duplicates", 0), rej)


def summarise(labels: pd.DataFrame) -> dict[str, Any]:
    per_label: dict[str, Any] = {}
    for lab in (*rules.JOB_LABELS, None):
        m = labels["label"].isna() if lab is None else labels["label"] == lab
        per_label[lab or "unlabelled"] = {
            "jobs": int(m.sum()),
            "gpu_hours": round(float(labels.loc[m, "gpu_hours"].sum()), 3),
            "energy_kwh": round(float(labels.loc[m, "energy_j"].sum()) / 3.6e6, 3),
        }
    return per_label


def _retrain(store: ClassifierStore, registry: ModelRegistry, current: WindowModel, opts: NightlyOptions,
             sample: TrainingSet, client: Client | None = None) -> dict[str, Any]:
    """Train a candidate on everything we have and gate it against the current model."""
    new_prefix = f"{opts.date}:"
    base = cached_training_set(list(opts.base_training), MAX_WINDOWS_PER_JOB, store.root / "cache") \
        if opts.base_training else TrainingSet.concat([])
    stored = store.samples()
    ts = thin(TrainingSet.concat([base, stored]), MAX_WINDOWS_PER_JOB)
    keys = np.unique(ts.group)
    if len(keys) > MAX_TRAIN_JOBS:  # keep all of today's jobs up to the cap, then older ones
        rng = np.random.default_rng(opts.seed)
        is_today = np.char.startswith(keys.astype(str), new_prefix)
        new, old = keys[is_today], keys[~is_today]  # keys are unique and sorted: old = setdiff(keys, new)
        rng.shuffle(new)
        rng.shuffle(old)
        take_new = new[: MAX_TRAIN_JOBS // 2]
        chosen = np.concatenate([take_new, old[: MAX_TRAIN_JOBS - len(take_new)]])
        # a set lookup: np.isin on object arrays sorts them, tens of seconds at fleet scale
        ts = ts.subset(pd.Series(ts.group).isin(set(chosen.tolist())).to_numpy())
    is_new = np.char.startswith(ts.group.astype(str), new_prefix)
    if not is_new.any():
        return {"retrained": False, "reason": "no GPM-labelled windows sampled today"}
    # The candidate is of the incumbent's kind, aggregation and compute weight (issue 13 round 4):
    # a nightly never switches them by itself. Its calibration is fitted on out-of-fold
    # predictions weighed the same way, so it fits the model it is attached to.
    kind, aggregation = current.kind, current.aggregation
    weight = float(current.meta.get("compute_weight") or 1.0)
    # ... and its evidence cap (issue 13 round 10): refitted on tonight's sample, whose fleet jobs
    # hold up to SAMPLE_PER_JOB windows each, the cap would rise to their length and bring back the
    # long jobs' overconfidence it exists to stop
    cap = current.evidence_cap
    version = registry.new_version(f"nightly-{opts.date.replace('-', '')}")
    if client is None:
        # the candidate's fit does not depend on its cross-validation: both run at once
        cv, model = beside(
            lambda: cross_validate(ts, seed=opts.seed, kind=kind, aggregation=aggregation,
                                   compute_weight=weight, evidence_cap=cap),
            lambda: train_model(ts, version, evaluate=False, kind=kind, aggregation=aggregation,
                                compute_weight=weight, evidence_cap=cap))
    else:
        cv = cross_validate(ts, seed=opts.seed, kind=kind, aggregation=aggregation, compute_weight=weight,
                            evidence_cap=cap)
        model = train_model_dask(client, ts, version, kind=kind, aggregation=aggregation, evidence_cap=cap)
        model.meta["compute_weight"] = weight
    jobs = cv["jobs"]
    new_mask = np.char.startswith(np.asarray(jobs["key"], dtype=str), new_prefix)
    cand_acc = float((np.asarray(jobs["pred"])[new_mask] == np.asarray(jobs["truth"])[new_mask]).mean())
    new_ts = ts.subset(is_new)
    _, lab, _ = current.job_predictions(new_ts.X, new_ts.group, new_ts.dur)
    _, truth = new_ts.job_truth()
    inc_acc = float((lab == truth).mean())
    gate = {"new_jobs": int(new_mask.sum()), "candidate_accuracy": cand_acc, "incumbent_accuracy": inc_acc,
            "incumbent": current.version}
    promoted = should_promote({"accuracy": cand_acc}, {"accuracy": inc_acc})
    model.meta["calibration"] = cv["calibration"]
    if current.meta.get("cv_grouping") in SET_OUT_GROUPINGS and current.meta.get("calibration"):
        # The incumbent's maps were fitted with whole recording folders held out (issue 13 round 5):
        # they say how often the model is right on kinds of work it never saw. Tonight's sample has
        # no folders, and its job-grouped CV keeps a job's siblings on both sides, so maps fitted
        # on it are optimistic exactly there. The candidate keeps the incumbent's maps (same kind,
        # aggregation and weight); its own CV still gives the gate and the metrics.
        model.meta["calibration"] = current.meta["calibration"]
        model.meta["cv_grouping"] = current.meta["cv_grouping"]
    # The candidate keeps the incumbent's ambiguity check (issue 13 round 6) as it is: the check's
    # radius comes from repeat runs of one workload (runs.csv of the recordings), which tonight's
    # sample does not name; the sample holds at most SAMPLE_PER_JOB windows of a job, not the
    # whole job a fingerprint is; and where the two labels overlap in the inputs is a property of
    # the inputs, measured on the recordings, not of tonight's booster.
    model.set_ambiguity(current.ambiguity)
    model.meta["metrics"] = {k2: v for k2, v in cv.items()
                             if k2 not in ("jobs", "calibration", "evidence_cap_windows")}
    registry.add(model, promoted=promoted, gate=gate)
    return {"retrained": True, "version": version, "promoted": promoted, **gate,
            "cv_accuracy": cv["accuracy"], "cv_ece": cv["ece"], "train_jobs": cv["n_jobs"]}


def run_nightly(
    opts: NightlyOptions,
    slurm: SlurmClient | None,
    on_file: Callable[[int, Path], None] | None = None,
    files_total: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Run one night (see module docstring) and return its summary.

    With ``opts.engine == "dask"`` the feature stage runs as tasks on a dask.distributed cluster
    and the candidate model is trained with LightGBM's Dask estimator on the same cluster; the
    rest (small, per-job data) runs here. Labels equal the local engine's.
    """
    if opts.engine not in ("local", "dask"):
        raise ConfigError(f"unknown engine {opts.engine!r} (local or dask)")
    with FolderLock(Path(opts.data_root) / "classifier", "nightly run", timeout_s=opts.lock_timeout_s):
        if opts.engine == "local":
            return _run(opts, slurm, None, on_file, files_total)
        from wattclass.classifier.scaleout import open_client

        with open_client(scheduler=opts.scheduler, config=opts.dask_config) as client:
            return _run(opts, slurm, client, on_file, files_total)


def _scan(opts: NightlyOptions, files: list[Path], current: _Once, client: Client | None,
          on_file: Callable[[int, Path], None] | None, recs: _Beside) -> LabelResult:
    """Label the day's files (step 1), keeping the retraining sample; the model loads beside.
    Job windows are checked against their Slurm records (``recs``, being read beside the scan:
    the local engine takes them after its query; classifier/jobcheck.py)."""

    table: list[pa.Table | None] = []

    def records() -> pa.Table | None:  # once, whatever the chunks that ask
        if not table:
            r = recs.result()
            table.append(job_records_table(r) if r is not None else None)
        return table[0]

    kw: dict[str, Any] = {"on_file": on_file, "sample_per_job": SAMPLE_PER_JOB,
                          "sample_prefix": opts.date, "seed": opts.seed}
    try:
        if client is not None:
            return label_files_dask(client, files, current, "auto", jobs=records(), **kw)
        preload = (recs.start, *AFTER_SCAN_MODULES, current)  # the records first: they wait on Slurm
        return label_files_local(files, current, "auto", workers=opts.workers, preload=preload, jobs=records,
                                 **kw)
    except BaseException:
        current.close()
        raise


def _run(
    opts: NightlyOptions,
    slurm: SlurmClient | None,
    client: Client | None,
    on_file: Callable[[int, Path], None] | None,
    files_total: Callable[[int], None] | None,
) -> dict[str, Any]:
    t0 = time.monotonic()
    store = ClassifierStore(opts.data_root)
    files = telemetry_files([opts.data_root], date=opts.date)
    if files_total is not None:
        files_total(len(files))
    summary: dict[str, Any] = {"date": opts.date, "files": len(files), "engine": opts.engine,
                               "slurm_backend": slurm.name if slurm is not None else None}
    log.info("job records from %s", slurm.describe() if slurm is not None else "telemetry only (no Slurm)")
    registry = ModelRegistry(opts.data_root)
    # The registry's model (and LightGBM) loads beside the scan: the labels need it only for
    # windows without GPM, the retraining after the scan (issue 15: 0.2 s before a 2 s scan).
    current = _Once(registry.current)
    # The records beside the scan's query (started with it), after which the scan checks each job
    # window against its job's record (issue 15: sacct's seconds at a large site off the critical path).
    beside = _Beside(lambda: _records(slurm, opts.date), "wattclass-job-records") if files else None
    result = _scan(opts, files, current, client, on_file, beside) if beside is not None else None
    recs = beside.result() if beside is not None else None
    model = current()
    summary["model"] = model.version
    summary["feature_seconds"] = round(time.monotonic() - t0, 2)
    if result is not None:
        summary.update(result.report.summary())
        summary.update({"files_read": result.n_files, "windows": result.n_windows})
    attributed = _check_attribution(summary, result.labels) if result is not None and recs is not None else 0
    if result is not None and result.labels.empty and attributed:
        return _all_rejected(store, opts.date, summary, attributed, t0)
    if result is None or result.labels.empty:
        empty = result is None or result.n_windows == 0
        what = "no usable telemetry" if empty else "telemetry but no job windows"
        skipped = summary.get("skipped_files", {}).get("count", 0)
        summary.update({"status": "no telemetry" if empty else "no jobs",
                        "message": f"{what} for {opts.date} ({len(files)} file(s) found, {skipped} "
                        "skipped); label store, model and label table left unchanged", "jobs": 0,
                        "seconds": round(time.monotonic() - t0, 2)})
        store.write_summary(opts.date, summary)
        return summary
    _warn_dropped(summary)
    labels = _join_slurm(result.labels, recs)
    store.write_labels(opts.date, labels)
    problems = list(getattr(slurm, "problems", []))
    summary.update({"status": "ok", "jobs": len(labels), "by_label": summarise(labels),
                    "by_source": labels["source"].value_counts().to_dict(),
                    "job_records": {"jobs_without_record": int(labels["user"].isna().sum()),
                                    "record_problems": len(problems), "examples": problems[:10]}})
    n_rule = int(labels["source"].astype(str).str.startswith("rule").sum())  # "rule+shared" too
    if opts.retrain and n_rule and len(result.sample):
        store.write_sample(opts.date, result.sample)
        summary["retrain"] = _retrain(store, registry, model, opts, result.sample, client)
    else:
        summary["retrain"] = {"retrained": False, "reason": "no new GPM-labelled jobs" if not n_rule
                              else "retraining disabled or nothing sampled"}
    day_end = utc_day_bounds(opts.date)[1]
    since = (day_end - dt.timedelta(days=HISTORY_DAYS)).strftime("%Y-%m-%d")
    history = store.label_history(since)
    entries = build_entries(history, now=day_end)
    # Past labeltable's limits (entries, bytes, names) keys are dropped (logged; counted here).
    with table_write_lock(opts.table_out):  # not between a `policy apply`'s read and write
        dropped = write_label_table(opts.table_out, entries, policy_at_write(opts.policy, opts.policy_reload),
                                    generated_at=dt.datetime.now(dt.UTC), group=opts.table_group)
    summary["table"] = {"path": str(opts.table_out), "entries": len(entries) - dropped, "dropped": dropped,
                        "by_level": pd.Series([e.level for e in entries]).value_counts().to_dict()}
    effects_hist = store.label_history((day_end - dt.timedelta(days=EFFECT_DAYS)).strftime("%Y-%m-%d"))
    effects = effects_from_history(effects_hist, seed=opts.seed)
    if not effects.empty:
        store.write_effects(opts.date, effects)
    summary["effects"] = {"rows": len(effects), "canary_jobs": int(effects["n_capped"].sum()
                          + effects["n_control"].sum()) if len(effects) else 0}
    summary["seconds"] = round(time.monotonic() - t0, 2)
    store.write_summary(opts.date, summary)
    return summary
