"""``wattclass job JOBID``: one job at a glance, in the spirit of seff and jobstats.

What a user or an admin asks about one job: its label (with confidence and where it came from),
the energy it used (measured), GPU-hours and mean power per GPU, the cap it ran under (watts and
% of the GPU's limit) with the decision and its reason, and one line of advice for its owner.

Fast on a big store because it reads little: the job's dates and hosts come from the nightly
label store (or the Slurm job records the fleet generator and the JobsFileClient use), then
DuckDB reads only the needed columns of those partitions (and of the hours the job ran, where
files are hourly) with a filter on the job id. Figures: docs/benchmarks.md.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from wattclass.classifier import rules
from wattclass.classifier.reader import partition_dates
from wattclass.errors import DataError
from wattclass.logsafe import clip
from wattclass.report.jobwindows import (
    counted_windows,
    discover_hosts,
    read_job_windows,
    telemetry_files,
)

log = logging.getLogger(__name__)



def _default_limit_w(w: pd.DataFrame) -> float | None:
    """The default power limit of the job's GPUs, from their model (``caps.KNOWN_LIMITS_W``);
    None when the model is unknown or the job ran on several models: the % is then not shown
    rather than guessed (it used to assume an H200's 700 W for every GPU)."""
    from wattclass.caps import known_limits
    from wattclass.errors import ConfigError

    if "gpu_model" not in w.columns:
        return None
    models = {str(m) for m in w["gpu_model"].dropna().unique()}
    if len(models) != 1:
        return None
    try:
        return known_limits(models.pop())[0]
    except ConfigError:
        return None


@dataclass
class JobSummary:
    job_id: str
    user: str | None = None
    account: str | None = None
    name: str | None = None
    start: str | None = None
    end: str | None = None
    label: str | None = None
    confidence: float | None = None
    source: str | None = None
    inputs: str | None = None
    n_gpus: int = 0
    hosts: list[str] = field(default_factory=list)
    energy_kwh: float = 0.0
    gpu_hours: float = 0.0
    mean_power_w_per_gpu: float | None = None
    cap_w: float | None = None
    cap_pct: float | None = None
    decision: str = ""
    reason: str = ""
    hint: str = ""
    files_read: int = 0
    #: the job's windows left out as the nightly leaves them out, per reason (``jobwindows.counted_windows``)
    windows_left_out: dict[str, int] = field(default_factory=dict)


# -- finding the job ---------------------------------------------------------------------------


def _label_row(root: Path, job_id: str) -> dict[str, Any] | None:
    """The job's newest row in the nightly label store (job_id filter pushed into each file)."""
    import pyarrow.dataset as ds

    files = sorted((root / "classifier" / "labels").glob("date=*/labels.parquet"))
    if not files:
        return None
    import pyarrow as pa
    import pyarrow.parquet as pq

    # Days written by other versions (or the canary's generated history) differ in columns: the
    # union of every day's schema, not the first file's, or a later day's confidence is lost.
    schemas = []
    for f in list(files):
        try:
            schemas.append(pq.read_schema(f))
        except (OSError, pa.ArrowException) as exc:  # a torn day was a traceback: skip it by name
            log.warning("job: skipping unreadable label store file %s: %s", f, str(exc).splitlines()[0][:200])
            files.remove(f)
    if not files:
        return None
    # days written before the decision column: their rows know nothing of the decision, though the
    # union of the days' columns gives them a null one (read as "no decision", ``summarise``)
    undecided = {f.parent.name.removeprefix("date=") for f, sc in zip(files, schemas, strict=True)
                 if "decision_comment" not in sc.names}
    try:
        schema = pa.unify_schemas(schemas, promote_options="permissive")
        t = ds.dataset([str(f) for f in files], schema=schema, format="parquet").to_table(
            filter=ds.field("job_id") == job_id)
        row = _whole_job(t.to_pandas() if t.num_rows else None)
    except (OSError, pa.ArrowException):
        # days whose columns do not merge (a confidence written as text, job ids as integers)
        # were a traceback: the days one by one
        row = _whole_job(_rows_day_by_day(files, job_id, "label store file"))
    if row is not None and str(row.get("date")) in undecided:
        row.pop("decision_comment", None)
    return row


def _whole_job(rows: pd.DataFrame | None) -> dict[str, Any] | None:
    """The job's newest label store row, with the start, end and hosts of all its rows.

    Why: a job that ran across midnight has windows in two ``date=`` partitions and a row of each
    night, each with that night's first and last window: the newest row alone sent the telemetry
    read to the days after midnight, and the job's energy and GPU-hours were those of that part."""
    if rows is None or rows.empty:
        return None
    out = dict(rows.iloc[-1])
    if len(rows) > 1:
        for col, pick in (("start", "min"), ("end", "max")):
            if col in rows.columns:
                t = pd.to_datetime(rows[col], utc=True, errors="coerce")
                v = getattr(t, pick)()
                out[col] = None if pd.isna(v) else v
        if "hosts" in rows.columns:
            hosts = {h for txt in rows["hosts"] if isinstance(txt, str) and txt for h in txt.split(",")}
            out["hosts"] = ",".join(sorted(hosts)) if hosts else out.get("hosts")
    return out


def _job_record(root: Path, job_id: str) -> dict[str, Any] | None:
    """The job's Slurm record from ``<root>/jobs/date=*/jobs.parquet`` (fleet / JobsFileClient)."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    files = sorted((root / "jobs").glob("date=*/jobs.parquet"))
    if not files:
        return None
    try:
        t = ds.dataset([str(f) for f in files], format="parquet").to_table(
            filter=ds.field("job_id") == job_id)
        return dict(t.to_pandas().iloc[-1]) if t.num_rows else None
    except (OSError, pa.ArrowException):
        pass
    # A day's file that is torn, or whose job ids are integers (JobsFileClient reads those too),
    # failed the whole command with a traceback: read the days one by one.
    rows = _rows_day_by_day(files, job_id, "job records")
    return None if rows is None else dict(rows.iloc[-1])


def _rows_day_by_day(files: Sequence[Path], job_id: str, what: str) -> pd.DataFrame | None:
    """The rows of ``job_id`` in ``files`` (days, oldest first; None: none), each read on its own and
    ids compared as text; a file that cannot be read is skipped with a WARNING naming it (``what``)."""
    import pyarrow as pa

    found: list[pd.DataFrame] = []
    for f in files:
        try:
            df = pd.read_parquet(f)
        except (OSError, ValueError, pa.ArrowException) as exc:
            why = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
            log.warning("job: skipping unreadable %s %s: %s", what, f, why)
            continue
        if "job_id" in df.columns:
            hit = df[df["job_id"].astype(str) == job_id]
            if len(hit):
                found.append(hit)
    return pd.concat(found, ignore_index=True) if found else None


def _ts(v: Any) -> pd.Timestamp | None:
    if v is None or (isinstance(v, float) and math.isnan(v)) or pd.isna(v):
        return None
    t = pd.Timestamp(v)
    return t.tz_localize("UTC") if t.tzinfo is None else t.tz_convert("UTC")


def _rule_label(w: pd.DataFrame) -> tuple[str | None, float | None, str]:
    codes = rules.window_labels(w["sm_util_pct"].astype(float), w["dram_bw_util_pct"].astype(float),
                                [w[c].astype(float) for c in rules.COMPUTE_UNITS])
    if (codes < 0).any() or len(codes) == 0:
        return None, None, "some windows lack GPM (or a compute pipe): the nightly model labels this job"
    n = [float((codes == k).sum()) for k in (rules.IDLE, rules.COMPUTE, rules.MEMORY)]
    lab = rules.job_labels([n[0]], [n[1]], [n[2]])
    conf = rules.job_confidence([n[0]], [n[1]], [n[2]], lab)
    return str(rules.label_names(lab)[0]), float(conf[0]), "gpm (computed now; no label store entry)"


def _decision(comment_text: Any, label: str | None, known: bool = True) -> tuple[str, str, Any]:
    """``known``: a job record or label store row said what the admin_comment holds; without one
    the decision is unknown here, not absent (``sacct -j ID -o AdminComment%80`` has it)."""
    from wattclass.admincomment import parse_admin_comment

    c = parse_admin_comment(comment_text if isinstance(comment_text, str) else None)
    if c is None and not known:
        return ("none", "its admin_comment is not known under this data root (no jobs file; the label "
                "store keeps wattclass decisions from the nightly run after the job): `sacct -j JOBID -o "
                "AdminComment%80` shows it", None)
    if c is None:
        return ("none", "no wattclass decision in the job's admin_comment: no label was known for this "
                "user/job name at submission, or wattclass's job_submit is not enabled", None)
    if c.cap is None:
        return ("none", f"submitted as {c.label} (confidence {c.confidence:.2f}, {c.source}): the policy "
                "does not cap this label", c)
    if c.arm == "control":
        return ("control", f"canary control: cap {c.cap.text()} decided for {c.label} but this job ran "
                "uncapped so the cap's effect can be measured", c)
    if not c.capped_for_real():
        return ("shadow", f"cap {c.cap.text()} decided for {c.label} (confidence {c.confidence:.2f}) but the "
                "policy is in shadow mode: logged, not applied", c)
    return ("cap", f"cap {c.cap.text()} for {c.label} (confidence {c.confidence:.2f}, {c.source})", c)


def _hint(s: JobSummary) -> str:
    e = s.energy_kwh
    if s.label == "memory":
        if s.decision == "cap":
            return (f"Memory-bound: your GPUs waited on HBM, so a {s.cap_pct:.0f}% cap cost little time; "
                    "nothing to change.")
        return ("Memory-bound: the GPUs drew high power while waiting on memory bandwidth; larger "
                "batches or fused kernels raise arithmetic intensity, and a power cap would cost "
                "little time.")
    if s.label == "compute":
        return "Compute-bound: the GPUs' arithmetic units were busy; this job uses its GPUs well."
    if s.label == "idle":
        return (f"Mostly idle: {s.gpu_hours:.1f} GPU-hours and {e:.2f} kWh with little GPU work; request "
                "fewer GPUs or release them when the work ends.")
    if s.label == "mixed":
        return ("Mixed phases (compute and memory-bound): profile the memory-bound phase, it is where "
                "energy goes with little progress.")
    return "No label yet: the nightly run labels jobs after they end."


def summarise(root: Path, job_id: str, date: str | None = None) -> JobSummary:
    """Everything ``wattclass job`` prints, read from a data root."""
    root = Path(root)
    s = JobSummary(job_id=job_id)
    lab = _label_row(root, job_id)
    rec = _job_record(root, job_id)
    start = _ts((lab or {}).get("start")) or _ts((rec or {}).get("start"))
    end = _ts((lab or {}).get("end")) or _ts((rec or {}).get("end"))
    hosts_txt = (lab or {}).get("hosts")
    hosts = sorted(str(hosts_txt).split(",")) if isinstance(hosts_txt, str) and hosts_txt else None
    if hosts is None and start is not None:
        hosts = discover_hosts(root, start, job_id)
    if start is None and date is None and not (root / "telemetry").is_dir():
        raise DataError(f"{root}: no telemetry/ folder")
    if start is not None and end is None:
        # Still running when the records were written: read day by day from its start and stop at
        # the first later day without its windows (not the whole store).
        files, parts, day = [], [], start.normalize()
        newest = max(partition_dates(root / "telemetry"), default="")
        while day.strftime("%Y-%m-%d") <= newest:
            fs = telemetry_files(root, max(start, day), day + pd.Timedelta(days=1), hosts)
            part = read_job_windows(fs, job_id)
            files += fs
            if part.empty and day > start.normalize():
                break
            parts.append(part)
            day += pd.Timedelta(days=1)
        w = pd.concat(parts, ignore_index=True) if parts else read_job_windows([], job_id)
    else:
        files = telemetry_files(root, start, end, hosts, [date] if date else None)
        w = read_job_windows(files, job_id)
    s.files_read = len(files)
    w, s.windows_left_out = counted_windows(w)
    if w.empty and lab is None and rec is None:
        where = f"on {date}" if date else "in the label store, the job records or the telemetry"
        raise DataError(f"job {job_id}: not found {where} under {root}")
    for k in ("user", "account", "name"):
        v = (rec or {}).get(k) if (rec or {}).get(k) is not None else (lab or {}).get(k)
        setattr(s, k, None if v is None or (isinstance(v, float) and math.isnan(v)) else str(v))
    if s.user is None and not w.empty and w["user"].notna().any():
        s.user = str(w["user"].dropna().iloc[0])
    if not w.empty:
        ts0, ts1 = pd.to_datetime(w["ts_start"], utc=True), pd.to_datetime(w["ts_end"], utc=True)
        start, end = start or ts0.min(), end or ts1.max()
        secs = (ts1 - ts0).dt.total_seconds().clip(lower=0)
        s.n_gpus = int(w["gpu_uuid"].nunique())
        s.hosts = sorted(w["host"].unique().tolist())
        s.energy_kwh = float(w["energy_j"].sum()) / 3.6e6
        s.gpu_hours = float(secs.sum()) / 3600.0
        s.mean_power_w_per_gpu = float(w["energy_j"].sum()) / float(secs.sum()) if secs.sum() > 0 else None
    s.start = start.isoformat() if start is not None else None
    s.end = end.isoformat() if end is not None else None
    if lab is not None and lab.get("label") is not None:
        s.label, s.source = str(lab["label"]), str(lab.get("source"))
        s.confidence = float(lab["confidence"]) if lab.get("confidence") is not None else None
        s.inputs = str(lab["inputs"]) if isinstance(lab.get("inputs"), str) else None
    elif not w.empty:
        s.label, s.confidence, s.inputs = _rule_label(w)
        s.source = "rule" if s.label else None
    # The jobs file's admin_comment, else the label store's copy of its decision (sites reading
    # sacct keep no jobs file); a store row from before that column, or none, knows nothing of it.
    comment_text = (rec or {}).get("admin_comment")
    if not isinstance(comment_text, str):
        comment_text = (lab or {}).get("decision_comment")
    # A store row has a user only from its job's record (the nightly's join), so with the column
    # there and a user, the record had no wattclass decision.
    joined = lab is not None and "decision_comment" in lab and isinstance(lab.get("user"), str)
    known = rec is not None or isinstance(comment_text, str) or joined
    s.decision, s.reason, comment = _decision(comment_text, s.label, known)
    if not w.empty and w["power_limit_w"].notna().any():
        s.cap_w = float(w["power_limit_w"].median())
        pct_cap = comment is not None and comment.cap is not None and comment.cap.unit == "%"
        if pct_cap and s.decision == "cap":
            s.cap_pct = float(comment.cap.value)
        else:
            default_w = _default_limit_w(w)
            s.cap_pct = 100.0 * s.cap_w / default_w if s.cap_w and default_w else None
    s.hint = _hint(s)
    return s


def human(d: dict[str, Any]) -> str:
    def f(v: Any, fmt: str, unit: str = "") -> str:
        return "-" if v is None else f"{v:{fmt}}{unit}"

    # Names, users, accounts and the admin_comment's reason are Slurm users' (or records') text:
    # on a terminal, control characters are escaped (no ESC sequences, no forged lines), as in logs.
    # --json keeps them exact. Slurm keeps job names to 1024 bytes; nothing here is cut shorter.
    d = {k: clip(v, 4096) if isinstance(v, str) else [clip(x, 4096) for x in v] if isinstance(v, list) else v
         for k, v in d.items()}
    hosts = d["hosts"]
    where = f" ({', '.join(hosts[:4])}{', ...' if len(hosts) > 4 else ''})" if hosts else ""
    lines = [
        f"Job ID: {d['job_id']}",
        f"User/Account: {d['user'] or '-'}/{d['account'] or '-'}"
        + (f"   Name: {d['name']}" if d["name"] else ""),
        f"Ran: {d['start'] or '-'} .. {d['end'] or '-'}",
        f"GPUs: {d['n_gpus']} on {len(hosts)} node(s){where}",
        f"Label: {d['label'] or '-'}   confidence {f(d['confidence'], '.2f')}   source {d['source'] or '-'}",
    ]
    if d.get("inputs"):
        lines.append(f"  from: {d['inputs']}")
    lines += [
        f"Energy: {d['energy_kwh']:.3f} kWh (measured)   GPU-hours: {d['gpu_hours']:.2f}   "
        f"mean power per GPU: {f(d['mean_power_w_per_gpu'], '.0f', ' W')}",
        f"Power cap: {f(d['cap_w'], '.0f', ' W')} ({f(d['cap_pct'], '.0f', '%')} of the GPU's limit)",
        f"Decision: {d['decision']}: {d['reason']}",
        f"Hint: {d['hint']}",
    ]
    return "\n".join(lines)


# -- CLI -----------------------------------------------------------------------------------------
