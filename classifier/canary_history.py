"""A generated canary history with KNOWN injected effects, in the label store's columns.

Why: the effect estimator (``effects``) must be shown to recover effects it did not see; a real
site's truth is unknown. Used by tests/test_effects.py, bench/eval_effects.py (coverage over many
seeds) and the demo (its report shows the recovered effect next to the injected one).

Model: keys (user + job name) with a label and the policy's cap for it; each key has its own
typical runtime (log-normal across keys) and power; each job draws the arm at random with the
canary fraction (shadow mode: the canary is capped) and multiplies runtime and energy by per-job
noise (log-normal, ``noise`` sd, correlated between the two as a longer run also uses more energy)
and, if capped, by the injected ratios. ``drift`` adds a per-key trend in the input size over the
period (the failure mode the docs describe).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping

import numpy as np
import pandas as pd

#: The issue's example: memory-bound at 60%: runtime x1.02, energy x0.75; compute-bound at 85%:
#: runtime x1.08, energy x0.93.
DEFAULT_TRUTH: dict[tuple[str, str], tuple[float, float]] = {
    ("memory", "60%"): (1.02, 0.75),
    ("compute", "85%"): (1.08, 0.93),
}


def generate_history(
    truth: Mapping[tuple[str, str], tuple[float, float]] = DEFAULT_TRUTH,
    keys_per_effect: int = 24,
    jobs_per_key: int = 12,
    fraction: float = 0.3,
    noise: float = 0.06,
    drift: float = 0.0,
    seed: int = 0,
    start: dt.datetime = dt.datetime(2026, 11, 1, tzinfo=dt.UTC),
    days: int = 21,
) -> pd.DataFrame:
    """Label-store rows (job_id, user, name, account, label, decision_label, cap, arm, energy_j,
    gpu_hours, start, end, slurm_start, slurm_end, date) for a canary period; see module docstring."""
    rng = np.random.default_rng(seed)
    rows = []
    jid = 1_000_000
    for e_i, ((label, cap), (rt_ratio, en_ratio)) in enumerate(sorted(truth.items())):
        for k in range(keys_per_effect):
            user = f"u{e_i}{k % 7}"
            name = f"{label}_job{k}.sh"
            base_rt_s = float(np.exp(rng.normal(np.log(3600), 0.8)))
            base_w = float(rng.uniform(250, 650))
            gpus = int(rng.choice([1, 2, 4, 8]))
            n = max(2, int(rng.poisson(jobs_per_key)))
            for j in range(n):
                t0 = start + dt.timedelta(seconds=float(rng.uniform(0, days * 86400)))
                phase = (t0 - start).total_seconds() / (days * 86400)
                capped = bool(rng.random() < fraction)
                z = rng.normal(0, noise)
                size = np.exp(drift * phase) if drift else 1.0
                rt = base_rt_s * size * np.exp(z) * (rt_ratio if capped else 1.0)
                en = base_w * gpus * base_rt_s * size * np.exp(z + rng.normal(0, noise / 2)) * \
                    (en_ratio if capped else 1.0)
                t1 = t0 + dt.timedelta(seconds=float(rt))
                rows.append({
                    "job_id": str(jid), "user": user, "name": name, "account": f"acct{e_i}",
                    "label": label, "decision_label": label, "cap": cap,
                    "arm": "capped" if capped else "control", "energy_j": float(en),
                    "gpu_hours": gpus * rt / 3600.0, "start": t0, "end": t1, "slurm_start": t0,
                    "slurm_end": t1, "date": t1.strftime("%Y-%m-%d"),
                })
                jid += 1
                del j
    return pd.DataFrame(rows)
