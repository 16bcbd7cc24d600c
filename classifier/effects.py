"""The measured effect of a cap: canary (capped) vs control (uncapped) runs of the same job key.

With ``[canary] fraction`` in the policy, job_submit.lua puts each capped decision in an arm at
random (``wattclass.admincomment.canary_arm``) and records it in admin_comment; the nightly run
copies it into the label store (columns ``decision_label``, ``cap``, ``arm``). This module turns
that history into one row per decision label and cap: the runtime ratio and the energy ratio of
capped over uncapped runs, each with a confidence interval.

Method (a paired, cluster-level design):

1. Job key = user + job name (user alone when the name is unknown): the unit that repeats the same
   work. Jobs whose runtime or energy is missing or not positive are dropped.
2. Per key with jobs in BOTH arms: ``d = mean(log x | capped) - mean(log x | control)`` for x =
   runtime (Slurm elapsed, else telemetry span) and energy (telemetry kWh). Keys with one arm
   carry no within-key contrast and are left out (they are counted in n_capped/n_control only if
   they pair).
3. Effect = weighted mean of the key contrasts, weight ``n_cap * n_ctl / (n_cap + n_ctl)`` (the
   inverse of the contrast's variance under equal job noise); ratio = exp(effect).
4. Interval: bootstrap over KEYS (resample keys with replacement, recompute 3), because jobs of one
   key are not independent. With few keys the plain percentile bootstrap is too narrow (its spread
   is the plug-in variance, biased by (K-1)/K, and its tails are normal-ish), so the interval is
   ``effect +- t(K-1, 0.975) * sd_boot * sqrt(K / (K-1))``: a bootstrap standard error with a
   small-sample t critical value. tests/test_effects.py and bench/eval_effects.py measure coverage.

Assumptions: the arm is random given the key (true by construction: a hash of the user and the
UTC day of submission, docs/savings.md); a key's work is the same from run to run up to noise
that does not depend on the arm; the effect is the same for all keys of a label and cap (else the
estimate is a key-weighted average).
Where it fails: few keys with both arms (wide or no interval: at least MIN_KEYS are required);
inputs that drift (a key whose input grows during the canary adds variance, and bias if the arms
are unbalanced in time); labels that are wrong (a compute job labelled memory dilutes the memory
effect); caps the GPU clamps (the measured cap is the clamped one, not the policy's text).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

EFFECT_COLUMNS: tuple[str, ...] = (
    "label", "cap", "n_capped", "n_control", "n_keys",
    "runtime_ratio", "runtime_ratio_lo", "runtime_ratio_hi",
    "energy_ratio", "energy_ratio_lo", "energy_ratio_hi",
)
#: Fewer keys with both arms than this: the ratio is reported, the interval is not (NaN).
MIN_KEYS = 3
N_BOOT = 2000
LEVEL = 0.95


def job_key(user: pd.Series, name: pd.Series) -> pd.Series:
    """user + "/" + name, or the user alone where the name is unknown."""
    u = user.astype(object).where(user.notna(), "?").astype(str)
    has_name = name.notna() & (name.astype(object).astype(str) != "")
    return u.where(~has_name, u + "/" + name.astype(object).astype(str))


def runtime_seconds(history: pd.DataFrame) -> pd.Series:
    """Slurm's elapsed time where known, else the telemetry span of the job."""
    def span(a: str, b: str) -> pd.Series:
        if a not in history.columns or b not in history.columns:
            return pd.Series(np.nan, index=history.index)
        s = pd.to_datetime(history[a], utc=True, errors="coerce")
        e = pd.to_datetime(history[b], utc=True, errors="coerce")
        return (e - s).dt.total_seconds()

    slurm = span("slurm_start", "slurm_end")
    return slurm.where(slurm > 0, span("start", "end"))


def _whole_jobs(history: pd.DataFrame) -> pd.DataFrame:
    """One row per job: per column its newest non-null value, with the energy of all its rows and the
    first start and last end of them.

    Why: the label store has a row per job per night, each with that night's windows only; a job
    that ran across midnight kept only its newest row, the part after midnight (its energy, and its
    telemetry span where Slurm's times are unknown), while the runtime came from Slurm's whole
    span. A night without Slurm records (no arm) still holds part of the job's energy."""
    history = history.reset_index(drop=True)
    ids = history["job_id"].astype(str).rename("_job")
    out = history.groupby(ids, sort=False).last()  # per column the newest value that is not null
    energy = pd.to_numeric(history["energy_j"], errors="coerce")
    out["energy_j"] = energy.groupby(ids, sort=False).sum(min_count=1)
    for col, pick in (("start", "min"), ("end", "max")):
        if col in history.columns:
            t = pd.to_datetime(history[col], utc=True, errors="coerce")
            out[col] = getattr(t.groupby(ids, sort=False), pick)()
    return out.reset_index(drop=True)


def canary_jobs(history: pd.DataFrame) -> pd.DataFrame:
    """The label store rows that belong to a canary arm, with key, runtime_s and energy_j."""
    need = {"arm", "decision_label", "cap", "energy_j", "user"}
    if history.empty or not need <= set(history.columns):
        return pd.DataFrame(columns=["label", "cap", "key", "arm", "runtime_s", "energy_j"])
    if "job_id" in history.columns:
        history = _whole_jobs(history)
    h = history[history["arm"].isin(["capped", "control"]) & history["cap"].notna()]
    name = h["name"] if "name" in h.columns else pd.Series(None, index=h.index, dtype=object)
    out = pd.DataFrame({
        "label": h["decision_label"].astype(str), "cap": h["cap"].astype(str),
        "key": job_key(h["user"], name), "arm": h["arm"].astype(str),
        "runtime_s": runtime_seconds(h).astype(float), "energy_j": h["energy_j"].astype(float),
    })
    ok = (out["runtime_s"] > 0) & (out["energy_j"] > 0)
    return out[ok].reset_index(drop=True)


def _contrasts(g: pd.DataFrame) -> pd.DataFrame:
    """Per key with both arms: n per arm, log-runtime and log-energy contrasts."""
    g = g.assign(lr=np.log(g["runtime_s"]), le=np.log(g["energy_j"]))
    agg = g.groupby(["key", "arm"]).agg(n=("lr", "size"), lr=("lr", "mean"), le=("le", "mean")).unstack("arm")
    if ("n", "capped") not in agg.columns or ("n", "control") not in agg.columns:
        return pd.DataFrame(columns=["n_cap", "n_ctl", "d_rt", "d_en"])
    agg = agg.dropna()
    return pd.DataFrame({
        "n_cap": agg[("n", "capped")].astype(int), "n_ctl": agg[("n", "control")].astype(int),
        "d_rt": agg[("lr", "capped")] - agg[("lr", "control")],
        "d_en": agg[("le", "capped")] - agg[("le", "control")],
    })


def _interval(d: np.ndarray, w: np.ndarray, counts: np.ndarray, level: float) -> tuple[float, float, float]:
    est = float((w * d).sum() / w.sum())
    k = len(d)
    if k < MIN_KEYS:
        return est, float("nan"), float("nan")
    # Student's t quantile as scipy.stats.t.ppf computes it (stdtrit), from scipy.special, which the
    # nightly loads beside its scan: scipy.stats would import scipy.optimize too, 0.6-0.9 s on the
    # night's critical path at a site with canaries (issue 15)
    from scipy.special import stdtrit

    cw = counts * w
    boot = (cw * d).sum(axis=1) / cw.sum(axis=1)
    se = float(np.std(boot, ddof=1)) * np.sqrt(k / (k - 1))
    half = float(stdtrit(k - 1, 0.5 + level / 2)) * se
    return est, est - half, est + half


def estimate_effects(jobs: pd.DataFrame, n_boot: int = N_BOOT, level: float = LEVEL,
                     seed: int = 0) -> pd.DataFrame:
    """One row per (label, cap) of ``canary_jobs`` output: EFFECT_COLUMNS (see module docstring)."""
    rows = []
    rng = np.random.default_rng(seed)
    for (label, cap), g in jobs.groupby(["label", "cap"], sort=True):
        c = _contrasts(g)
        row: dict[str, object] = {"label": label, "cap": cap, "n_capped": int(c["n_cap"].sum()),
                                  "n_control": int(c["n_ctl"].sum()), "n_keys": len(c)}
        if c.empty:
            row.update({k: float("nan") for k in EFFECT_COLUMNS[5:]})
            rows.append(row)
            continue
        w = (c["n_cap"] * c["n_ctl"] / (c["n_cap"] + c["n_ctl"])).to_numpy(float)
        counts = rng.multinomial(len(c), np.full(len(c), 1.0 / len(c)), size=n_boot)
        for name, col in (("runtime_ratio", "d_rt"), ("energy_ratio", "d_en")):
            est, lo, hi = _interval(c[col].to_numpy(float), w, counts, level)
            row.update({name: float(np.exp(est)), f"{name}_lo": float(np.exp(lo)),
                        f"{name}_hi": float(np.exp(hi))})
        rows.append(row)
    return pd.DataFrame(rows, columns=list(EFFECT_COLUMNS))


def effects_from_history(history: pd.DataFrame, seed: int = 0) -> pd.DataFrame:
    """``estimate_effects(canary_jobs(history))``: what the nightly stores."""
    return estimate_effects(canary_jobs(history), seed=seed)


def lookup(effects: pd.DataFrame, label: str, cap: str | None) -> dict[str, float] | None:
    """The stored effect row for a label and cap text, or None."""
    if effects is None or effects.empty or cap is None:
        return None
    m = effects[(effects["label"] == label) & (effects["cap"] == cap)]
    if m.empty:
        return None
    rec = m.iloc[-1].to_dict()
    return {k: rec[k] for k in EFFECT_COLUMNS}


__all__: Sequence[str] = ["EFFECT_COLUMNS", "canary_jobs", "effects_from_history", "estimate_effects",
                          "job_key", "lookup"]
