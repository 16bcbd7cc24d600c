"""The numbers behind the report: per-job aggregates, useful-work and savings ESTIMATES.

Kept apart from plotting and HTML so each estimate is a small pure function a test can check and
a reader can audit. Every estimate names its assumptions in a constant the report prints, so the
HTML never states more than was measured.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from wattclass.report import peaks
from wattclass.report.limits import clamp_series, limit_series

LABEL_ORDER: tuple[str, ...] = ("compute", "memory", "mixed", "idle", "unlabelled", "no job")

#: The example policy's caps (deploy/policy.example.toml, docs/design.md): the savings estimate's
#: caps when no policy or decisions are given.
DEFAULT_CAPS: dict[str, str] = {"compute": "100%", "memory": "60%", "mixed": "85%", "idle": "40%"}

#: Published anchor for the slowdown of a memory-bound job under a cap (Samsi et al.: a 250->175 W
#: cap on LLaMA inference cost 6-7% latency and saved 23% energy).
ANCHOR_SLOWDOWN = 0.07


def window_seconds(w: pd.DataFrame) -> pd.Series:
    """Length of each window in seconds (from its bounds; windows may be short at job edges)."""
    return (w["ts_end"] - w["ts_start"]).dt.total_seconds().clip(lower=0)


def rule_job_labels(w: pd.DataFrame) -> pd.DataFrame:
    """Job labels by the classifier's GPM rule (``wattclass.classifier.rules``) on these windows.

    Used when no label store is given; a job with any window the rule cannot call (no GPM, or a
    compute pipe not measured) is left out (unlabelled), as the engine leaves it to the model.
    Returns job_id, label, confidence, source="rule".
    """
    from wattclass.classifier import rules

    cols = ["job_id", "label", "confidence", "source"]
    jw = w[w["job_id"].notna()]
    if jw.empty:
        return pd.DataFrame(columns=cols)
    codes = rules.window_labels(
        jw["sm_util_pct"].astype(float).to_numpy(),
        jw["dram_bw_util_pct"].astype(float).to_numpy(),
        [jw[c].astype(float).to_numpy() for c in rules.COMPUTE_UNITS],
    )
    frame = pd.DataFrame({"job_id": jw["job_id"].astype(str).to_numpy(), "c": codes})
    # the rule labels a job only where it can call every window (as the engine: labeling.decide);
    # a window without GPM or with a compute pipe not measured leaves the job unlabelled here
    gapped = set(frame.loc[frame["c"] < 0, "job_id"])
    counts = (
        frame[~frame["job_id"].isin(gapped)]
        .query("c >= 0")
        .pivot_table(index="job_id", columns="c", aggfunc="size", fill_value=0)
        .reindex(columns=[rules.IDLE, rules.COMPUTE, rules.MEMORY], fill_value=0)
    )
    if counts.empty:
        return pd.DataFrame(columns=cols)
    ni, nc, nm = (counts[k].to_numpy() for k in (rules.IDLE, rules.COMPUTE, rules.MEMORY))
    lab = rules.job_labels(ni, nc, nm)
    conf = rules.job_confidence(ni, nc, nm, lab)
    return pd.DataFrame({"job_id": counts.index.astype(str), "label": rules.label_names(lab),
                         "confidence": np.round(conf, 3), "source": "rule"}, columns=cols)


def attach_labels(w: pd.DataFrame, labels: pd.DataFrame | None) -> pd.DataFrame:
    """Telemetry windows with a ``label`` column: the job's label, ``unlabelled`` or ``no job``."""
    out = w.copy()
    lab = pd.Series(dtype=object) if labels is None else labels.set_index("job_id")["label"]
    out["label"] = out["job_id"].map(lab)
    out.loc[out["label"].isna() & out["job_id"].notna(), "label"] = "unlabelled"
    out.loc[out["job_id"].isna(), "label"] = "no job"
    return out


def job_table(w: pd.DataFrame, labels: pd.DataFrame | None) -> pd.DataFrame:
    """Per job measured totals (energy, GPU-hours, windows) joined with its label."""
    jw = w[w["job_id"].notna()].assign(_s=window_seconds(w))
    g = jw.groupby("job_id", sort=True)
    jobs = pd.DataFrame(
        {
            "user": g["user"].first(),
            "n_windows": g.size(),
            "energy_j": g["energy_j"].sum(),
            "gpu_hours": g["_s"].sum() / 3600.0,
        }
    ).reset_index()
    if labels is not None and len(labels):
        keep = [c for c in ("job_id", "label", "confidence", "source") if c in labels.columns]
        jobs = jobs.merge(labels[keep], on="job_id", how="left")
    for c in ("label", "confidence", "source"):
        if c not in jobs.columns:
            jobs[c] = None
    jobs["label"] = jobs["label"].fillna("unlabelled")
    return jobs


def by_label(w: pd.DataFrame) -> pd.DataFrame:
    """Energy (kWh), GPU-hours and kWh per GPU-hour (= mean kW) per label, in LABEL_ORDER."""
    ww = w.assign(_s=window_seconds(w))
    g = ww.groupby("label")
    t = pd.DataFrame({"energy_kwh": g["energy_j"].sum() / 3.6e6, "gpu_hours": g["_s"].sum() / 3600.0})
    t["kwh_per_gpu_hour"] = t["energy_kwh"] / t["gpu_hours"].replace(0, np.nan)
    order = [x for x in LABEL_ORDER if x in t.index] + sorted(set(t.index) - set(LABEL_ORDER))
    return t.loc[order]


def estimated_tflops(w: pd.DataFrame) -> pd.Series:
    """ESTIMATED achieved TFLOP/s per window: sum over pipes of activity x the pipe's peak rate on
    the window's board (``peaks.board_peaks`` of its gpu_model).

    NA where the window has no GPM data, or its board is not in ``peaks.PEAK_TFLOPS`` (left out,
    not guessed). This is an upper-bound style estimate: pipe activity is the share of cycles a
    pipe was busy, not the share of its peak throughput reached.
    """
    from wattclass.report.peaks import MIG_SUFFIX, PIPES, board_peaks, share_series

    if "gpu_model" not in w.columns or not set(PIPES) <= set(w.columns):
        return pd.Series(np.nan, index=w.index)
    models = w["gpu_model"].astype(object)
    if "share_basis" in w.columns:  # as report.data's scan: a MIG row is rated as no board
        mig = w["share_basis"].eq("mig").to_numpy(bool)
        models = models.where(~mig, models.fillna("").astype(str) + " " + MIG_SUFFIX)
    known = {m: r for m in models.dropna().unique() if (r := board_peaks(m)) is not None}
    rates = pd.DataFrame.from_dict(known, orient="index", columns=list(PIPES)).reindex(models.to_numpy())
    activity = w[list(PIPES)].astype(float).to_numpy() / 100.0
    tf = pd.Series((activity * rates.to_numpy(dtype=float)).sum(axis=1), index=w.index) * share_series(w)
    finite = np.asarray(np.isfinite(activity).all(axis=1), dtype=bool)
    sm_ok = np.isfinite(w["sm_util_pct"].astype(float).to_numpy())  # NaN: no GPM reading (report.data too)
    return tf.where(sm_ok & finite & rates.notna().all(axis=1).to_numpy())


def work_per_energy(w: pd.DataFrame) -> pd.DataFrame:
    """Per label: estimated TFLOP per kJ (= TFLOP/s per kW) over windows with GPM data on a board
    of known peak rates."""
    ww = w.assign(_s=window_seconds(w), _tf=estimated_tflops(w))
    ww = ww[ww["_tf"].notna() & (ww["energy_j"] > 0)]
    if ww.empty:
        return pd.DataFrame(columns=["tflop", "energy_kj", "tflops_per_kw"])
    ww = ww.assign(_tflop=ww["_tf"] * ww["_s"])
    g = ww.groupby("label")
    t = pd.DataFrame({"tflop": g["_tflop"].sum(), "energy_kj": g["energy_j"].sum() / 1e3})
    t["tflops_per_kw"] = t["tflop"] / t["energy_kj"]
    order = [x for x in LABEL_ORDER if x in t.index]
    return t.loc[order]


def cap_watts(cap: object, default_limit_w: float) -> float | None:
    """A policy cap (``"60%"`` of the default limit, or watts) in watts; None if unparsable."""
    if cap is None or (isinstance(cap, float) and np.isnan(cap)):
        return None
    s = str(cap).strip()
    try:
        if s.endswith("%"):
            return float(s[:-1]) / 100.0 * default_limit_w
        return float(s.removesuffix("W").removesuffix("w"))
    except ValueError:
        return None


@dataclass(frozen=True)
class SavingsResult:
    table: pd.DataFrame  # per label: energy_kwh, cap, saved_kwh (no slowdown), saved_kwh_slow
    total_kwh: float
    saved_kwh: float
    saved_kwh_slow: float
    caps: dict[str, str]
    slowdown: float


#: Labels the savings model applies a cap to; others are counted as zero saving (see report text).
CAPPED_LABELS = ("memory", "idle")


def estimate_savings(
    w: pd.DataFrame, caps: Mapping[str, str] | None = None, slowdown: float = ANCHOR_SLOWDOWN
) -> SavingsResult:
    """Energy the policy's caps WOULD have saved on these windows (an estimate, not a measurement).

    Model: for memory-bound and idle jobs the GPU's power in each window becomes min(measured
    power, cap) and the runtime stays the same (``saved_kwh``), or grows by ``slowdown``
    (``saved_kwh_slow``). Compute-bound and mixed jobs count as zero saving: their runtime grows
    about as their power drops. The measured inputs are the per-window energy and power; the cap's
    effect on power and time is assumed.
    """
    caps = dict(DEFAULT_CAPS if caps is None else caps)
    ww = w[w["job_id"].notna()].assign(_s=window_seconds(w))
    limit = limit_series(ww)
    rows = []
    for label, g in ww.groupby("label"):
        e_kwh = float(g["energy_j"].sum()) / 3.6e6
        saved = saved_slow = 0.0
        cap = caps.get(str(label))
        if label in CAPPED_LABELS and cap is not None:
            cw = clamp_series(limit.loc[g.index].map(lambda lw, c=cap: cap_watts(c, lw)).astype(float),
                              _models(g))
            new_j = capped_energy_j(g, cw.astype(float), g["_s"])
            saved = float((g["energy_j"] - new_j).clip(lower=0).sum()) / 3.6e6
            saved_slow = max(0.0, e_kwh - float(new_j.sum()) * (1.0 + slowdown) / 3.6e6)
        rows.append(
            {
                "label": label,
                "energy_kwh": e_kwh,
                "cap": cap if cap is not None else "-",
                "saved_kwh": saved,
                "saved_kwh_slow": saved_slow,
            }
        )
    t = pd.DataFrame(rows, columns=["label", "energy_kwh", "cap", "saved_kwh", "saved_kwh_slow"]).set_index(
        "label"
    )
    t = t.loc[[x for x in LABEL_ORDER if x in t.index]]
    return SavingsResult(
        table=t,
        total_kwh=float(t["energy_kwh"].sum()),
        saved_kwh=float(t["saved_kwh"].sum()),
        saved_kwh_slow=float(t["saved_kwh_slow"].sum()),
        caps=caps,
        slowdown=slowdown,
    )


def window_saved_j(w: pd.DataFrame, caps: Mapping[str, str] | None = None) -> pd.Series:
    """Per window, the energy (J) the caps WOULD have saved with no slowdown; 0 where not capped.

    The same model as ``estimate_savings`` (memory-bound and idle windows draw min(power, cap)),
    per window so a report can sum it by user or account.
    """
    caps = dict(DEFAULT_CAPS if caps is None else caps)
    out = pd.Series(0.0, index=w.index)
    m = w["job_id"].notna() & w["label"].isin([lab for lab in CAPPED_LABELS if lab in caps])
    if not m.any():
        return out
    g = w[m]
    s = window_seconds(g)
    limit = limit_series(g)
    asked = pd.Series([cap_watts(caps[str(lab)], lw) for lab, lw in zip(g["label"], limit, strict=True)],
                      index=g.index, dtype=float)
    cw = clamp_series(asked, _models(g))
    new_j = capped_energy_j(g, cw, s)
    out[m] = (g["energy_j"] - new_j).clip(lower=0).astype(float)
    return out


def _models(g: pd.DataFrame) -> pd.Series:
    """The rows' GPU model names (None where the table has none)."""
    return g["gpu_model"] if "gpu_model" in g else pd.Series(None, index=g.index, dtype=object)


def capped_energy_j(g: pd.DataFrame, cap_w: pd.Series, secs: pd.Series) -> pd.Series:
    """Per window, its energy (J) had its power been held to ``cap_w``: the energy scaled by
    min(1, cap / power_avg_w), else (no average power) min(energy, cap x its length).

    Why scaled and not cap x length: a row's energy may cover more time than its length (the
    daemon gives a poll interval to the row its start poll lies in; classifier/validity.py
    ENERGY_SPAN_FLOOR_S), and ``power_avg_w`` is that energy over the time it covers. A 0.08 s
    row holding a second at 397 W under a 420 W cap saves nothing; cap x length said 367 J.
    ``report.data`` computes the same in SQL (``limits.capped_energy_sql``).

    On a GPU several jobs share (or a MIG instance) a row's energy and power are the job's share
    (``share_ratio``) while the cap limits the whole GPU: the cap is held against the GPU's power,
    the row's over its share, and the row keeps its share of the GPU's capped energy. Held
    against the share, a job drawing 150 W of a 600 W GPU saved nothing under a 420 W cap."""
    e = g["energy_j"].astype(float)
    p = g["power_avg_w"].astype(float) if "power_avg_w" in g else pd.Series(np.nan, index=g.index)
    share = peaks.share_series(g)
    share = share.where(share > 0, 1.0)
    gpu_p = p / share
    scaled: pd.Series = e * np.minimum(1.0, cap_w / gpu_p.where(gpu_p > 0))
    by_time = (np.minimum(gpu_p.fillna(e / secs.replace(0, np.nan) / share), cap_w) * secs * share).fillna(e)
    # a window whose limit is unknown (report.limits) is not capped: its energy stays
    return scaled.where(p.gt(0) & e.notna(), by_time).where(cap_w.notna(), e)


def caps_from_decisions(decisions: pd.DataFrame | None) -> dict[str, str] | None:
    """The cap the policy gave each label (most common per label), or None without decisions."""
    if decisions is None or decisions.empty or not {"label", "cap"} <= set(decisions.columns):
        return None
    d = decisions.dropna(subset=["label", "cap"])
    if d.empty:
        return None
    out = {str(k): str(g["cap"].astype(str).mode().iloc[0]) for k, g in d.groupby("label")}
    return {**DEFAULT_CAPS, **out}
