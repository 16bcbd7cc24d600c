"""Replay a job history in time order: how often does the submission table predict a new job's label?

The history is GENERATED (no real multi-month Slurm history is available): users with a few job
names each; every (user, name) has a habitual label that it keeps with probability 0.7-1.0 per job,
and a quarter of them change habit once during the period. Each night the table is rebuilt from
all earlier jobs with the real ``build_entries`` (recency- and confidence-weighted vote); each new
job is looked up as job_submit.lua does (user+name, then user, then account; entries below
``--min-confidence`` skipped) and compared with the label the job later gets.

    python bench/eval_submission_table.py [--days 60] [--users 80] [--min-confidence 0.8]
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys

import numpy as np
import pandas as pd

LABELS = ("compute", "memory", "mixed", "idle")
PRIOR = np.array([0.35, 0.45, 0.1, 0.1])


def generate(days: int, users: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    start = dt.datetime(2026, 9, 1, tzinfo=dt.UTC)
    habits = {}
    for u in range(users):
        for k in range(int(rng.integers(1, 5))):
            first = int(rng.choice(4, p=PRIOR))
            second = int(rng.choice(4, p=PRIOR))
            switch = int(rng.integers(days // 4, days)) if rng.random() < 0.25 else days + 1
            habits[(u, k)] = (first, second, switch, rng.uniform(0.7, 1.0))
    rows = []
    for d in range(days):
        for u in range(users):
            names = [k for (uu, k) in habits if uu == u]
            for _ in range(int(rng.poisson(2.0))):
                k = names[int(rng.integers(len(names)))]
                first, second, switch, keep = habits[(u, k)]
                habit = first if d < switch else second
                lab = habit if rng.random() < keep else int(rng.choice(4, p=PRIOR))
                t = start + dt.timedelta(days=d, seconds=float(rng.uniform(0, 86400)))
                rows.append({"user": f"u{u:03d}", "name": f"job{k}", "account": f"acct{u % 12:02d}",
                             "label": LABELS[lab], "confidence": float(rng.uniform(0.85, 1.0)),
                             "source": "rule", "end": t, "day": d})
    return pd.DataFrame(rows).sort_values("end", ignore_index=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--days", type=int, default=60)
    ap.add_argument("--users", type=int, default=80)
    ap.add_argument("--min-confidence", type=float, default=0.8)
    ap.add_argument("--seed", type=int, default=3)
    a = ap.parse_args()
    from wattclass.classifier.table import build_entries, index_entries, lookup

    hist = generate(a.days, a.users, a.seed)
    stats = {"jobs": 0, "covered": 0, "matched": 0}
    per_level: dict[str, list[int]] = {}
    any_match = any_cov = 0
    for d in range(1, a.days):
        past = hist[hist["day"] < d]
        today = hist[hist["day"] == d]
        now = dt.datetime(2026, 9, 1, tzinfo=dt.UTC) + dt.timedelta(days=d)
        idx = index_entries(build_entries(past, now))
        for r in today.itertuples():
            stats["jobs"] += 1
            e = lookup(idx, r.user, r.name, r.account, a.min_confidence)
            e0 = lookup(idx, r.user, r.name, r.account, 0.0)
            if e0 is not None:
                any_cov += 1
                any_match += e0.label == r.label
            if e is None:
                continue
            stats["covered"] += 1
            ok = e.label == r.label
            stats["matched"] += ok
            lv = per_level.setdefault(e.level, [0, 0])
            lv[0] += 1
            lv[1] += ok
    n, c, m = stats["jobs"], stats["covered"], stats["matched"]
    base = hist["label"].value_counts(normalize=True).max()
    print(f"GENERATED history: {len(hist)} jobs, {a.users} users, {a.days} days (seed {a.seed}); "
          "replayed in time order")
    print(f"table label used (confidence >= {a.min_confidence}): {c}/{n} new jobs ({c / n:.1%})")
    print(f"  matched the job's later label: {m}/{c} ({m / max(c, 1):.1%})")
    for lv, (k, ok) in sorted(per_level.items()):
        print(f"    via {lv:<9}: {ok}/{k} ({ok / k:.1%})")
    print(f"any table entry (no confidence floor): {any_cov}/{n} covered, "
          f"{any_match / max(any_cov, 1):.1%} matched")
    print(f"baseline (always the most common label): {base:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
