"""Coverage of the canary effect estimator over many seeds (tests/test_effects.py runs a few).

For each seed: generate a canary history with the issue's injected effects (memory at 60%: runtime
x1.02, energy x0.75; compute at 85%: runtime x1.08, energy x0.93), estimate, and record whether each
95% interval covers the truth and how wide it is. Also runs harder settings: few repeats per key,
few keys, and inputs that drift. Prints one JSON document.

  python bench/eval_effects.py --seeds 200
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from wattclass.classifier.canary_history import DEFAULT_TRUTH, generate_history
from wattclass.classifier.effects import effects_from_history

SETTINGS: dict[str, dict[str, float]] = {
    "default (24 keys x ~12 jobs, canary 30%, noise 6%)": {},
    "few repeats (24 keys x ~4 jobs)": {"jobs_per_key": 4},
    "few keys (6 keys x ~12 jobs)": {"keys_per_effect": 6},
    "canary 10%": {"fraction": 0.1},
    "drifting inputs (+50% input size over the period)": {"drift": 0.4},
}


def run(seeds: int, **kw: float) -> dict[str, object]:
    cover: dict[str, list[bool]] = {}
    width: dict[str, list[float]] = {}
    missing = 0
    for seed in range(seeds):
        eff = effects_from_history(generate_history(seed=seed, **kw), seed=seed)  # type: ignore[arg-type]
        for r in eff.itertuples():
            truth = DEFAULT_TRUTH[(r.label, r.cap)]
            for name, t in (("runtime", truth[0]), ("energy", truth[1])):
                lo, hi = getattr(r, f"{name}_ratio_lo"), getattr(r, f"{name}_ratio_hi")
                key = f"{r.label}@{r.cap} {name}"
                if np.isnan(lo):
                    missing += 1
                    continue
                cover.setdefault(key, []).append(bool(lo <= t <= hi))
                width.setdefault(key, []).append(float(hi - lo))
    return {"coverage": {k: round(float(np.mean(v)), 3) for k, v in cover.items()},
            "median_width": {k: round(float(np.median(v)), 4) for k, v in width.items()},
            "no_interval": missing}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=200)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    out = {name: run(args.seeds, **kw) for name, kw in SETTINGS.items()}
    doc = {"seeds": args.seeds, "nominal": 0.95, "settings": out,
           "wall_s": round(time.perf_counter() - t0, 1),
           "load_avg": [round(x, 2) for x in os.getloadavg()],
           "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime())}
    json.dump(doc, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
