"""The ambiguity check's variants on pooled leave-one-set-out, development data only (issue 13 round 6).

Why: round 6's candidate is the shipped model unchanged plus a check (classifier/ambiguity.py)
that lowers a job's confidence where the model's own training jobs of both labels sit next to
it. Its form is chosen here, on the ten development folders, before the test set is scored
(docs/measurements/issue13-preregistration-round6-2026-11-30.md).

Protocol: ``bench/eval_families.py --loso --round2-recipe --train-folders <the shipped model's six>``
(each of the seven test-like folders held out whole in turn, the recipe trained on the six folders
less it, calibration nested); the held-out predictions are those of eval_families' ``loso``. Per
fold, the check's reference is the *training* jobs of that fold (the six folders less the held-out
one): their fingerprints, quantile grids and repeat radius; the held-out set is never in it. The
held-out jobs' labels stay; their calibrated confidence is lowered by each variant; the pooled
figures are eval_families' ``summarize``.

    python bench/eval_ambiguity.py [--cache /tmp/amb-loso.npz] [--json]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from benchstamp import emit

SHIPPED_FOLDERS = ("raw", "collected", "sweep", "sweep-heldout", "ridge", "ridge2")
#: (name, mode, value, lowering): every variant tried (the first three added after the first run,
#: whose variants all made too many right calls unsure: smaller radii).
VARIANTS: tuple[tuple[str, str, float, str], ...] = (
    ("radius-q0.1-cap", "radius", 0.1, "cap"),
    ("radius-q0.15-cap", "radius", 0.15, "cap"),
    ("radius-q0.2-cap", "radius", 0.2, "cap"),
    ("radius-q0.25-cap", "radius", 0.25, "cap"),
    ("radius-q0.5-cap", "radius", 0.5, "cap"),
    ("radius-q0.5-scale", "radius", 0.5, "scale"),
    ("radius-q0.75-cap", "radius", 0.75, "cap"),
    ("knn-5-cap", "knn", 5, "cap"),
    ("knn-10-cap", "knn", 10, "cap"),
    ("knn-10-scale", "knn", 10, "scale"),
    ("knn-20-cap", "knn", 20, "cap"),
)
KEYS = ("accuracy", "accuracy_unsure_wrong", "coverage", "selective_accuracy", "compute_called_memory",
        "compute_called_memory_acted", "memory_called_compute", "memory_called_compute_acted", "ece")


def loso_predictions(ts: Any, families: dict[str, str], cache: Path | None) -> dict[str, Any]:
    """eval_families' pooled LOSO of the shipped recipe (read from ``cache`` when it is there)."""
    from eval_families import loso

    if cache is not None and cache.exists():
        z = np.load(cache, allow_pickle=True)
        return {k: z[k] for k in ("keys", "truth", "pred", "raw", "conf")} | {"compute_weights": {}}
    res = loso(ts, families, "roofline-margin", train_folders=SHIPPED_FOLDERS, aggregation="length-weighted",
               compute_weight=1.0)
    if cache is not None:
        np.savez(cache, **{k: res[k] for k in ("keys", "truth", "pred", "raw", "conf")})
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", type=Path, default=None,
                    help="npz of the LOSO predictions: written after the run, read instead of it when "
                         "present")
    ap.add_argument("--min-confidence", type=float, default=0.8)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from eval_families import DEVELOPMENT_FOLDERS, LOSO_SETS, summarize

    from wattclass.classifier import margin as margin_module
    from wattclass.classifier import model as model_module
    from wattclass.classifier.ambiguity import fit_ambiguity, lower_confidence, training_fingerprints
    from wattclass.classifier.replay import materialize
    from wattclass.classifier.training import h200_data_dir, job_families, training_set, workload_configs

    # the round-2 recipe (eval_families --round2-recipe)
    margin_module.RIDGE_ALPHA = 3.0
    margin_module.MARGIN_INPUTS = margin_module.MARGIN_INPUTS_R2
    margin_module.SPREAD_MAP = False
    model_module.DEFAULT_CAP_EVIDENCE = False  # round 6 had no evidence cap (round 10)
    sources = [h200_data_dir() / n for n in DEVELOPMENT_FOLDERS]
    families = job_families(sources)
    configs = workload_configs(sources)
    with tempfile.TemporaryDirectory(prefix="wattclass-amb-") as tmp:
        ts = training_set(materialize(sources, Path(tmp)), max_windows_per_job=0)
    res = loso_predictions(ts, families, a.cache)
    keys, truth, fp = training_fingerprints(ts)
    src = np.asarray([str(k).split(":", 1)[0] for k in keys], dtype=object)
    index = {k: i for i, k in enumerate(keys)}
    tested = np.asarray([index[k] for k in res["keys"]], dtype=np.int64)
    held_of = src[tested]

    rows: dict[str, Any] = {"shipped recipe": summarize(res, families, a.min_confidence, by_set=True)}
    fits: dict[str, Any] = {}
    for name, mode, value, lowering in VARIANTS:
        conf = np.array(res["conf"], dtype=np.float64)
        fits[name] = {}
        for held in LOSO_SETS:
            ref = np.isin(src, SHIPPED_FOLDERS) & (src != held)
            amb = fit_ambiguity(fp[ref], truth[ref], mode, value, lowering,
                                configs=[configs.get(str(k)) for k in keys[ref]])
            m = held_of == held
            conf[m] = lower_confidence(amb, conf[m], fp[tested[m]], res["pred"][m])
            fits[name][held] = {"reference_jobs": len(amb["reference"]), "radius": amb.get("radius")}
        assert (conf <= np.asarray(res["conf"]) + 1e-12).all()
        rows[name] = summarize({**res, "conf": conf}, families, a.min_confidence, by_set=True)
    out = {"protocol": "pooled LOSO, shipped recipe trained on the six folders less the held-out one; "
                       "ambiguity reference = that fold's training jobs",
           "variants": {n: {k: r["all"][k] for k in KEYS} | {"sets": {s: {k: b[k] for k in KEYS}
                                                                       for s, b in r["sets"].items()}}
                        for n, r in rows.items()},
           "fits": fits}
    if a.json:
        return emit(out)
    print(f"{'variant':<18} {'acc':>6} {'acc(u=x)':>8} {'cover':>6} {'selacc':>6} {'C->M(act)':>10} "
          f"{'M->C(act)':>10} {'ECE':>6}")
    for n, r in out["variants"].items():
        print(f"{n:<18} {r['accuracy']:>6.3f} {r['accuracy_unsure_wrong']:>8.3f} {r['coverage']:>6.3f} "
              f"{r['selective_accuracy']:>6.3f} {r['compute_called_memory']:>4} "
              f"({r['compute_called_memory_acted']})"
              f"  {r['memory_called_compute']:>4} ({r['memory_called_compute_acted']:>2}) {r['ece']:>6.3f}")
    for n, f in fits.items():
        print(n, {h: (v["reference_jobs"], v["radius"]) for h, v in f.items()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
