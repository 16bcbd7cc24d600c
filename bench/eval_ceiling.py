"""How well can *any* classifier on the NVML inputs do? Opposite-label twins in the H200 jobs (issue 13).

Why: five rounds of modelling left the GPM-less label at 0.70-0.92 on never-seen kinds of work, and
each round's misses were memory-bound jobs whose NVML readings sit among compute-bound ones. This
script asks whether that is the model's fault or the inputs': it looks for pairs of jobs whose NVML
readings are as close as two runs of the *same* workload, yet whose GPM truth is opposite (one
compute-bound, one memory-bound). No classifier that reads only these inputs can be right on both
of such a pair in a way that survives a re-run: the difference it would have to rely on is smaller
than the difference between two runs of one job.

Method (fixed before looking at the result; nothing is fitted to the truth):
- Every job of the recordings (default: all ten development folders under wattclass/data/h200),
  replayed through the telemetry daemon as training does; GPM truth by the docs/design.md job rule.
- Fingerprint per job: for each model input (classifier/features.py FEATURES, all NVML-derived),
  its mean over the job's windows weighted by window length (every input the shipped model sees,
  as the job-level numbers it aggregates; ``classifier.ambiguity.training_fingerprints``). Each
  input then taken as its quantile among all jobs (``scaled``), so every input counts alike
  whatever its unit or tail.
- Noise floor: the distances between jobs that ran the same workload with the same parameters
  (runs.csv ``family``/``job`` and ``params``): how far two runs of one job land apart.
- Twins: a compute-bound and a memory-bound job closer than the noise floor's quantile ``q``
  (default: the median repeat distance, so half of all same-job re-runs are farther apart than
  a twin pair). A maximum matching of the twin graph counts disjoint pairs; each costs at least
  one error to a classifier that gives two jobs closer than that the same label (one that does
  not relies on differences smaller than a re-run's), so ``1 - matched / jobs`` bounds such a
  classifier's accuracy on this set of jobs (compute/memory truth; idle and mixed are not paired).
- Beside it, k-nearest-neighbour accuracy, leave-one-out over all jobs in the same space: a
  flexible classifier that has seen every other kind of work (an optimistic reference, not a bound).

``--fingerprint nvml-all`` (issue 13 round 8) takes the same bound over every non-GPM NVML field
of the raw 1 Hz samples instead (bench/nvml_signals.py: 84 normalised per-job statistics, fixed
before its bound was looked at), and adds bench/ceiling_signals.py's checks: the bound in several
variants of that space, a LightGBM on it against the GPM truth with one fold of recording folders
held out at a time (folders that share a workload family are one fold), which model-input twins
survive and which signals separate the rest.

    python bench/eval_ceiling.py [--quantile 0.5] [--fingerprint model-inputs|nvml-all] [--raw DIR...]
                                  [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from benchstamp import emit


def scaled(fp: np.ndarray) -> np.ndarray:
    """Each input as its empirical quantile over all jobs (0..1; ties share their mean rank; missing
    -> 0.5): every input counts alike whatever its unit or tail, and an input that is the same for
    most jobs (the power-cap share, 0 for any job below the limit) adds nothing between them."""
    from scipy.stats import rankdata

    z = np.full(fp.shape, 0.5)
    for j in range(fp.shape[1]):
        ok = np.isfinite(fp[:, j])
        if ok.sum() > 1:
            z[ok, j] = (rankdata(fp[ok, j]) - 1.0) / (ok.sum() - 1.0)
    return z


def errors_on_twins(path: Path, twins: set[str], known: set[str]) -> dict[str, Any]:
    """Of an eval_families.py --json result's wrong jobs (its ``wrong`` lines, "key [family] ..."),
    how many are in a twin pair, against how many of the jobs it scored are."""
    res = json.loads(Path(path).read_text())
    wrong = {line.split()[0] for line in res.get("wrong", [])}
    scored_n = int(res.get("all", {}).get("jobs", 0))
    unknown = sorted(wrong - known)
    if unknown:
        raise SystemExit(f"--errors {path}: jobs not among the recordings here: {', '.join(unknown[:5])}")
    sets = res.get("held_out_sets") or []
    scored = {k for k in known if k.split(":")[0] in sets} if sets else set()
    return {"file": str(path), "wrong": len(wrong), "wrong_in_twin_pairs": len(wrong & twins),
            "scored": scored_n, "scored_in_twin_pairs": len(scored & twins) if scored else None}


def max_matching(edges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """A maximum matching of a bipartite graph given as (left, right) pairs (Kuhn's algorithm)."""
    adj: dict[int, list[int]] = {}
    for u, v in edges:
        adj.setdefault(u, []).append(v)
    match_r: dict[int, int] = {}

    def augment(u: int, seen: set[int]) -> bool:
        for v in adj[u]:
            if v in seen:
                continue
            seen.add(v)
            if v not in match_r or augment(match_r[v], seen):
                match_r[v] = u
                return True
        return False

    for u in adj:
        augment(u, set())
    return sorted((u, v) for v, u in match_r.items())


def twin_bound(z: np.ndarray, truth: np.ndarray, configs: list[str | None], quantile: float,
               d: np.ndarray | None = None) -> dict[str, Any]:
    """The noise floor, the twin graph and its maximum matching in one fingerprint space ``z``:
    ``repeat_distances`` (same-workload pairs), ``tau`` (their ``quantile``), ``edges`` (compute,
    memory) job pairs closer than ``tau``, ``matched`` (disjoint pairs), ``bound`` (1 - matched / jobs)."""
    from wattclass.classifier import rules
    from wattclass.classifier.ambiguity import distances, repeat_distances

    if d is None:
        d = distances(z, z)
    rep_d = repeat_distances(z, configs)
    if len(rep_d) == 0:
        raise SystemExit("no two jobs ran the same workload with the same parameters: no noise floor")
    tau = float(np.quantile(rep_d, quantile))
    comp = np.flatnonzero(truth == rules.J_COMPUTE)
    mem = np.flatnonzero(truth == rules.J_MEMORY)
    close = d[np.ix_(comp, mem)] <= tau
    edges = [(int(comp[i]), int(mem[j])) for i, j in zip(*np.nonzero(close), strict=True)]
    matched = max_matching(edges)
    return {"repeat_distances": rep_d, "tau": tau, "edges": edges, "matched": matched,
            "bound": 1.0 - len(matched) / max(len(truth), 1)}


def knn_loo_accuracy(d: np.ndarray, truth: np.ndarray, k: int) -> float:
    """k-NN leave-one-out accuracy over all jobs (an optimistic reference: every other kind of work
    is "seen"); ties go to the lower label code."""
    from wattclass.classifier import rules

    n = len(truth)
    dd = d + np.diag(np.full(n, np.inf))
    nn = np.argsort(dd, axis=1)[:, :k]
    votes = np.zeros((n, len(rules.JOB_LABELS)))
    for j in range(k):
        votes[np.arange(n), truth[nn[:, j]].astype(np.int64)] += 1
    return float((votes.argmax(axis=1) == truth).mean())


def aligned_signals(keys: np.ndarray, skeys: list[str], sfp: np.ndarray) -> np.ndarray:
    """The all-signals fingerprints (``nvml_signals.signal_fingerprints``) in ``keys``' order; every
    job of the training set must have one."""
    pos = {k: i for i, k in enumerate(skeys)}
    missing = [str(k) for k in keys if str(k) not in pos]
    if missing:
        raise SystemExit(f"jobs without raw 1 Hz samples (runs.csv rows): {', '.join(missing[:5])}")
    return sfp[[pos[str(k)] for k in keys]]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--raw", type=Path, nargs="*", default=None,
                    help="raw probe recordings (default: the ten development folders)")
    ap.add_argument("--quantile", type=float, default=0.5,
                    help="twins are closer than this quantile of the same-workload repeat distances")
    ap.add_argument("--fingerprint", choices=("model-inputs", "nvml-all"), default="model-inputs",
                    help="model-inputs: the 15 model inputs' job means; nvml-all: every non-GPM 1 Hz signal "
                         "(bench/nvml_signals.py), with the round-8 checks (bench/ceiling_signals.py)")
    ap.add_argument("--k", type=int, default=5, help="neighbours of the k-NN reference")
    ap.add_argument("--examples", type=int, default=12, help="twin pairs listed")
    ap.add_argument("--errors", type=Path, default=None,
                    help="an eval_families.py --json result: how many of its wrong jobs are in a twin pair")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if not 0.0 < a.quantile <= 1.0:
        raise SystemExit(f"--quantile: must be in (0, 1], got {a.quantile:g}")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from eval_families import DEVELOPMENT_FOLDERS

    from wattclass.classifier import rules
    from wattclass.classifier.ambiguity import distances, training_fingerprints
    from wattclass.classifier.features import FEATURES
    from wattclass.classifier.training import h200_data_dir, job_families, training_set, workload_configs

    sources = a.raw or [h200_data_dir() / n for n in DEVELOPMENT_FOLDERS]
    ts = training_set(sources, max_windows_per_job=0)
    families = job_families(sources)
    configs = workload_configs(sources)
    keys, truth, fp_model = training_fingerprints(ts)
    cfg = [configs.get(str(k)) for k in keys]
    if a.fingerprint == "nvml-all":
        from nvml_signals import FEATURE_NAMES, signal_fingerprints

        fp = aligned_signals(keys, *signal_fingerprints(sources))
        cols = list(FEATURE_NAMES)
    else:
        fp, cols = fp_model, list(FEATURES)
    z = scaled(fp)
    d = distances(z, z)
    b = twin_bound(z, truth, cfg, a.quantile, d)
    rep_d, tau, edges, matched = b["repeat_distances"], b["tau"], b["edges"], b["matched"]
    n = len(keys)
    cm = int(((truth == rules.J_COMPUTE) | (truth == rules.J_MEMORY)).sum())
    twin_jobs = np.unique([x for e in edges for x in e])
    knn_acc = knn_loo_accuracy(d, truth, a.k)

    fam = np.array([families.get(str(k), "?") for k in keys], dtype=object)
    by_fam: dict[str, int] = {}
    for x in twin_jobs:
        by_fam[str(fam[x])] = by_fam.get(str(fam[x]), 0) + 1
    shown = sorted(matched, key=lambda e: d[e])[: a.examples]
    out: dict[str, Any] = {
        "sources": [str(s) for s in sources],
        "jobs": n,
        "truth_counts": {lab: int((truth == i).sum()) for i, lab in enumerate(rules.JOB_LABELS)},
        "repeat_pairs": len(rep_d),
        "repeat_distance_quantiles": {str(q): round(float(np.quantile(rep_d, q)), 3)
                                      for q in (0.1, 0.25, 0.5, 0.75, 0.9)},
        "quantile": a.quantile,
        "twin_distance": round(tau, 3),
        "twin_edges": len(edges),
        "jobs_in_a_twin_pair": len(twin_jobs),
        "disjoint_twin_pairs": len(matched),
        "accuracy_bound_all_jobs": round(1.0 - len(matched) / n, 4),
        "accuracy_bound_compute_memory_jobs": round(1.0 - len(matched) / max(cm, 1), 4),
        "knn_loo_accuracy": round(knn_acc, 4),
        "k": a.k,
        "twin_jobs_by_family": dict(sorted(by_fam.items(), key=lambda kv: -kv[1])),
        "examples": [{
            "compute": str(keys[u]), "compute_family": str(fam[u]),
            "memory": str(keys[v]), "memory_family": str(fam[v]),
            "distance": round(float(d[u, v]), 3),
            "compute_inputs": {c: round(float(fp[u, i]), 3) for i, c in enumerate(cols)},
            "memory_inputs": {c: round(float(fp[v, i]), 3) for i, c in enumerate(cols)},
        } for u, v in shown],
    }
    if a.fingerprint != "model-inputs":
        out = {"fingerprint": a.fingerprint, "dimensions": len(cols), **out}
    if a.fingerprint == "nvml-all":
        from ceiling_signals import round8

        out["round8"] = round8(keys, truth, fp_model, fp, cfg, families, a.k)
    if a.errors is not None:
        out["errors"] = errors_on_twins(a.errors, {str(keys[x]) for x in twin_jobs}, {str(k) for k in keys})
    if a.json:
        return emit(out)
    if a.fingerprint != "model-inputs":
        print(f"fingerprint {a.fingerprint}: {len(cols)} dimensions")
    print(f"{n} jobs ({out['truth_counts']}); {len(rep_d)} same-workload pairs, repeat distance "
          f"quantiles {out['repeat_distance_quantiles']}")
    print(f"twins (compute vs memory truth, distance <= {tau:.3f}, the repeats' q={a.quantile:g}): "
          f"{len(edges)} pairs over {len(twin_jobs)} jobs; {len(matched)} disjoint")
    print(f"accuracy bound, classifier blind below the twin distance: {out['accuracy_bound_all_jobs']:.3f} "
          f"(all jobs), {out['accuracy_bound_compute_memory_jobs']:.3f} (compute and memory jobs)")
    print(f"k-NN (k={a.k}) leave-one-out, every other job seen: {knn_acc:.3f}")
    top = list(out["twin_jobs_by_family"].items())[:15]
    print("twin jobs by family:", ", ".join(f"{k} {v}" for k, v in top))
    if "round8" in out:
        from ceiling_signals import print_round8

        print_round8(out["round8"])
    if "errors" in out:
        e = out["errors"]
        print(f"{a.errors.name}: {e['wrong_in_twin_pairs']} of {e['wrong']} wrong jobs are in a twin pair "
              f"({e['scored_in_twin_pairs']} of its {e['scored']} scored jobs are)")
    for e in out["examples"]:
        print(f"  {e['compute']} [{e['compute_family']}] ~ {e['memory']} [{e['memory_family']}] "
              f"d={e['distance']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
