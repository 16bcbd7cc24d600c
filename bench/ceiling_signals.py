"""Round 8 of issue 13: is the twin ceiling a property of the model's 15 inputs or of NVML without GPM?

Called by ``python bench/eval_ceiling.py --fingerprint nvml-all`` with the model-input and the
all-signals fingerprints (bench/nvml_signals.py) of the same jobs. Every check was fixed before
the bound was looked at:

- Bounds (eval_ceiling.twin_bound: noise floor from same-workload re-runs *in the same space*,
  twins closer than its quantile q, maximum matching) at q = 0.10 / 0.25 / 0.50 in: the model
  inputs; all signals; all signals plus the model inputs; all signals PCA-whitened (the components
  that explain 95% of the variance, each scaled to unit variance: what "many near-duplicate dims"
  would do to the Euclidean distance is undone); all signals less each field group
  (nvml_signals.GROUPS), and each group alone. Each with k-NN leave-one-out accuracy.
- LightGBM leave one fold out on compute- and memory-bound jobs against their GPM truth, on the
  model-input job means, on all signals and on both. A fold is a recording folder, or the folders
  that share a workload family merged into one (``family_disjoint_folds``: ``raw`` with
  ``collected``, ``sweep`` with ``sweep-heldout``), so no family of a held-out job is in training
  (``lgbm_loso`` refuses folds that a family crosses). Fixed parameters (``LGBM_PARAMS``), no
  tuning; threshold 0.5; the raw (unscaled) features, so nothing of the held-out fold enters
  training. (The first run held out single folders; a review found that 11 families cross
  raw/collected and 11 sweep/sweep-heldout, so up to 162 of the 904 held-out jobs had their family
  in training. Re-run with these folds.)
- Twins that survive: the model-input twin pairs at q = 0.25 that are still twins over all
  signals (at that space's own q = 0.25), per workload family.
- Which signals separate the pairs that separate: per feature, |difference| over the feature's
  RMS difference between re-runs (its own noise floor); the share of separated pairs where that
  ratio exceeds 2, against the same share over the pairs that stay twins. And the LightGBM gain
  of a model fitted on all compute and memory jobs.

Added after the first run had shown that the all-signals bound came out *below* the model-input
one (labelled ``post_hoc`` in the output; each is truth-free or a reference, none is a bound
chosen for its value):

- ``noise_scaled`` spaces: each quantile-scaled feature divided by its own RMS difference between
  re-runs (floored at ``NOISE_FLOOR_QUANTILE`` of the positive ones), so a feature counts by how
  far a pair differs *in units of its re-run noise*: the Euclidean metric of equal weights lets
  the noisy statistics of 8-12 one-second samples (stds, autocorrelations, correlations) inflate
  the re-run distance. Truth-free: only the re-run pairs set the scale.
- LightGBM with stratified 10-fold random cross-validation (every kind of work seen in
  training, siblings included): the optimistic reference for "is the information there at all".
- Per-family LOSO accuracy of the all-signals LightGBM.
- What a signal adds: LightGBM leave one fold out on the model inputs plus one field group
  (``GROUPS``) or one finer set (``ADDITIONS``), and on all signals less one group; the finer
  sets and the headline runs over three seeds (``SEEDS``), whose spread says which gains are noise.
- The same twin survival and separators in the noise-scaled spaces.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

QUANTILES: tuple[float, ...] = (0.10, 0.25, 0.50)
#: The survival and separation checks' quantile (round 7's headline figure).
PAIR_QUANTILE = 0.25
PCA_VARIANCE = 0.95
#: A feature's re-run RMS difference is floored at this quantile of the positive ones (a feature
#: whose few re-runs never differ would otherwise weigh infinitely).
NOISE_FLOOR_QUANTILE = 0.1
#: LightGBM seeds of the post-hoc "what does a signal add" checks (their spread is the noise).
SEEDS: tuple[int, ...] = (0, 1, 2)
#: Post hoc: finer sets of all-signals features, each added to the model inputs (leave one fold
#: out): which signal the daemon would have to record.
ADDITIONS: dict[str, tuple[str, ...]] = {
    "power_1s_shape": ("power_q10", "power_q50", "power_q90", "power_step", "power_acf1"),
    "power_instant": ("power_inst_mean", "power_inst_std", "power_inst_q10", "power_inst_q50",
                      "power_inst_q90", "power_inst_step", "power_inst_acf1", "ripple_mean", "ripple_std"),
    "power_energy_counter": ("power_energy_mean", "power_energy_std", "power_energy_q10", "power_energy_q50",
                             "power_energy_q90", "power_energy_step", "power_energy_acf1"),
    "util_gpu_dynamics": ("util_gpu_std", "util_gpu_q10", "util_gpu_q90", "util_gpu_step", "util_gpu_acf1"),
    "util_mem_dynamics": ("util_mem_q10", "util_mem_q90", "util_mem_step", "util_mem_acf1"),
    "correlations": ("corr_util_gpu_power", "corr_util_mem_power", "corr_sm_clock_power",
                     "corr_util_gpu_util_mem", "corr_sm_clock_util_mem", "corr_power_util_gpu_lag1",
                     "corr_power_util_mem_lag1"),
    "job_ratios": ("power_per_util_gpu", "power_per_util_mem", "util_mem_per_util_gpu",
                   "clock_drop_per_power"),
    "fb_used": ("fb_used_mean", "fb_used_std", "fb_used_q10", "fb_used_q50", "fb_used_q90", "fb_used_step",
                "fb_growth_ratio"),
}
SEPARATION_RATIO = 2.0
LGBM_PARAMS: dict[str, Any] = {
    "objective": "binary", "n_estimators": 300, "learning_rate": 0.05, "num_leaves": 15,
    "min_child_samples": 10, "subsample": 0.8, "subsample_freq": 1, "colsample_bytree": 0.8,
    "random_state": 0, "n_jobs": 1, "verbose": -1, "deterministic": True,
}



def _lightgbm() -> Any:
    """LightGBM with its scikit-learn API (``LGBMClassifier``), also in a process where wattclass
    already imported it without (classifier/lgbload.py: the nightly's light import; a test run
    that trained a model earlier would otherwise have no ``LGBMClassifier``)."""
    from wattclass.classifier.lgbload import full

    return full()

def whitened(z: np.ndarray, variance: float = PCA_VARIANCE) -> np.ndarray:
    """``z`` (jobs x dims) on its principal components that explain ``variance`` of the total, each
    scaled to unit variance (unsupervised: no truth)."""
    c = z - z.mean(axis=0)
    u, s, _ = np.linalg.svd(c, full_matrices=False)
    ev = s**2
    k = int(np.searchsorted(np.cumsum(ev) / ev.sum(), variance) + 1)
    return np.asarray(u[:, :k] * np.sqrt(len(z) - 1), dtype=np.float64)


def space_summary(z: np.ndarray, truth: np.ndarray, configs: Sequence[str | None], k: int) -> dict[str, Any]:
    from eval_ceiling import knn_loo_accuracy, twin_bound

    from wattclass.classifier.ambiguity import distances

    d = distances(z, z)
    out: dict[str, Any] = {"dimensions": int(z.shape[1]),
                           "knn_loo_accuracy": round(knn_loo_accuracy(d, truth, k), 4)}
    for q in QUANTILES:
        b = twin_bound(z, truth, list(configs), q, d)
        out[f"q{q:.2f}"] = {"twin_distance": round(b["tau"], 3), "twin_edges": len(b["edges"]),
                            "disjoint_twin_pairs": len(b["matched"]), "accuracy_bound": round(b["bound"], 4)}
    return out


def repeat_rms(z: np.ndarray, configs: Sequence[str | None]) -> tuple[np.ndarray, int]:
    """Per feature: the RMS difference between re-runs of one workload configuration, and the pairs."""
    cfg = np.asarray([c if c is not None else f"\0{i}" for i, c in enumerate(configs)], dtype=object)
    sq = np.zeros(z.shape[1])
    n = 0
    for c in np.unique(cfg):
        idx = np.flatnonzero(cfg == c)
        for i in range(len(idx)):
            for j in range(i + 1, len(idx)):
                sq += (z[idx[i]] - z[idx[j]]) ** 2
                n += 1
    return np.sqrt(sq / max(n, 1)), n


def noise_scaled(z: np.ndarray, configs: Sequence[str | None]) -> np.ndarray:
    """``z`` with each feature in units of its re-run RMS difference (floored); constant ones dropped."""
    rms, _ = repeat_rms(z, configs)
    keep = np.ptp(z, axis=0) > 0
    pos = rms[keep & (rms > 0)]
    floor = float(np.quantile(pos, NOISE_FLOOR_QUANTILE)) if len(pos) else 1.0
    return np.asarray(z[:, keep] / np.maximum(rms[keep], floor), dtype=np.float64)


def lgbm_random_cv(X: np.ndarray, y: np.ndarray, folds: int = 10) -> float:
    """Stratified random k-fold accuracy (every kind of work seen): an optimistic reference."""
    lgb = _lightgbm()
    from sklearn.model_selection import StratifiedKFold

    pred = np.full(len(y), -1)
    for tr, te in StratifiedKFold(folds, shuffle=True, random_state=0).split(X, y):
        pred[te] = lgb.LGBMClassifier(**LGBM_PARAMS).fit(X[tr], y[tr]).predict(X[te])
    return round(float((pred == y).mean()), 4)


def family_disjoint_folds(folder: np.ndarray, family: np.ndarray) -> np.ndarray:
    """Per job, its fold: its recording folder, merged with every folder it shares a workload family
    with (transitively), named by the merged folders joined with ``+`` in sorted order. Holding out a
    fold then never leaves a held-out job's family in training."""
    parent = {str(f): str(f) for f in folder.tolist()}

    def root(f: str) -> str:
        while parent[f] != f:
            parent[f] = parent[parent[f]]
            f = parent[f]
        return f

    first: dict[str, str] = {}
    for f, fam in zip(folder.tolist(), family.tolist(), strict=True):
        other = first.setdefault(str(fam), str(f))
        parent[root(str(f))] = root(other)
    members: dict[str, list[str]] = {}
    for f in parent:
        members.setdefault(root(f), []).append(f)
    name = {f: "+".join(sorted(m)) for m in members.values() for f in m}
    return np.array([name[str(f)] for f in folder.tolist()], dtype=object)


def check_family_disjoint(fold: np.ndarray, family: np.ndarray) -> None:
    """Raise if a workload family has jobs in more than one fold (a held-out job's family in training)."""
    seen: dict[str, set[str]] = {}
    for f, fam in zip(fold.tolist(), family.tolist(), strict=True):
        seen.setdefault(str(fam), set()).add(str(f))
    crossing = {fam: sorted(fs) for fam, fs in sorted(seen.items()) if len(fs) > 1}
    if crossing:
        shown = "; ".join(f"{fam} in {', '.join(fs)}" for fam, fs in list(crossing.items())[:5])
        raise ValueError(f"{len(crossing)} workload families cross folds ({shown}): held out, their jobs' "
                         "family would be in training")


def lgbm_loso(X: np.ndarray, y: np.ndarray, fold: np.ndarray, family: np.ndarray, names: Sequence[str],
              seed: int = 0) -> dict[str, Any]:
    """Leave-one-fold-out LightGBM, compute (1) vs memory (0): pooled, per-fold and per-family
    accuracy. ``fold`` must not split a family (``check_family_disjoint``; ``family_disjoint_folds``
    builds such folds from recording folders)."""
    lgb = _lightgbm()

    check_family_disjoint(fold, family)
    pred = np.full(len(y), -1)
    per: dict[str, Any] = {}
    for f in sorted(set(fold.tolist())):
        te = fold == f
        m = lgb.LGBMClassifier(**{**LGBM_PARAMS, "random_state": seed})
        m.fit(X[~te], y[~te])
        pred[te] = m.predict(X[te])
        right = int((pred[te] == y[te]).sum())
        per[str(f)] = {"jobs": int(te.sum()), "right": right, "accuracy": round(right / int(te.sum()), 4)}
    ok = pred == y
    fams = {str(f): {"jobs": int((family == f).sum()), "right": int(ok[family == f].sum())}
            for f in sorted(set(family.tolist()))}
    return {
        "features": len(names), "jobs": len(y), "accuracy": round(float(ok.mean()), 4),
        "compute_called_memory": int(((y == 1) & (pred == 0)).sum()), "compute_jobs": int((y == 1).sum()),
        "memory_called_compute": int(((y == 0) & (pred == 1)).sum()), "memory_jobs": int((y == 0).sum()),
        "per_fold": per,
        "per_family": dict(sorted(fams.items(), key=lambda kv: kv[1]["right"] - kv[1]["jobs"]))}


def lgbm_loso_seeds(X: np.ndarray, y: np.ndarray, fold: np.ndarray, family: np.ndarray) -> dict[str, float]:
    """``lgbm_loso`` pooled accuracy over SEEDS (row and column subsampling): mean, min, max."""
    acc = [lgbm_loso(X, y, fold, family, [], seed=s_)["accuracy"] for s_ in SEEDS]
    return {"mean": round(float(np.mean(acc)), 4), "min": min(acc), "max": max(acc)}


def _without(res: dict[str, Any], fold: str) -> float:
    """Pooled accuracy of a ``lgbm_loso`` result less one fold's jobs; a fold it does not have is an
    error (a misspelt name would otherwise return the pooled accuracy unchanged)."""
    per = res["per_fold"]
    if fold not in per:
        raise ValueError(f"no fold {fold!r} (folds: {', '.join(sorted(per))})")
    right = sum(v["right"] for f, v in per.items() if f != fold)
    jobs = sum(v["jobs"] for f, v in per.items() if f != fold)
    return round(right / max(jobs, 1), 4)


def twin_survival(zm: np.ndarray, za: np.ndarray, truth: np.ndarray, cfg: list[str | None],
                  keys: np.ndarray, families: dict[str, str]) -> dict[str, Any]:
    """Which twin pairs of space ``zm`` (at PAIR_QUANTILE of its re-run distances) are still twins
    in ``za`` (at its own), per workload family; ``_surviving``/``_separated``: the pairs."""
    from eval_ceiling import twin_bound

    bm = twin_bound(zm, truth, cfg, PAIR_QUANTILE)
    ba = twin_bound(za, truth, cfg, PAIR_QUANTILE)
    all_edges, model_edges = set(ba["edges"]), set(bm["edges"])
    surv = [e for e in bm["edges"] if e in all_edges]
    sep = [e for e in bm["edges"] if e not in all_edges]
    fam = [families.get(str(x), "?") for x in keys]
    by_fam: dict[str, dict[str, int]] = {}
    for e in bm["edges"]:
        for f in {fam[e[0]], fam[e[1]]}:
            row = by_fam.setdefault(f, {"model_input_pairs": 0, "surviving": 0})
            row["model_input_pairs"] += 1
            row["surviving"] += int(e in all_edges)
    new_fam: dict[str, int] = {}
    for e in ba["edges"]:
        if e not in model_edges:
            for f in {fam[e[0]], fam[e[1]]}:
                new_fam[f] = new_fam.get(f, 0) + 1
    return {"quantile": PAIR_QUANTILE, "model_input_pairs": len(bm["edges"]), "surviving": len(surv),
            "separated": len(sep), "new_pairs_over_all_signals": len(ba["edges"]) - len(surv),
            "by_family": dict(sorted(by_fam.items(), key=lambda kv: -kv[1]["model_input_pairs"])),
            "new_pairs_by_family": dict(sorted(new_fam.items(), key=lambda kv: -kv[1])),
            "_surviving": surv, "_separated": sep}


def separators(za: np.ndarray, cfg: list[str | None], survival: dict[str, Any], names: Sequence[str],
               groups: np.ndarray, unit_noise: bool = False) -> dict[str, Any]:
    """Per feature: the share of separated pairs, and of surviving ones, that differ by more than
    SEPARATION_RATIO times the feature's re-run RMS difference (``unit_noise``: ``za`` is already in
    those units); the top 15 by the gap between the two shares, and the mean share per group."""
    noise = np.ones(za.shape[1]) if unit_noise else repeat_rms(za, cfg)[0]

    def share_over(pairs: list[tuple[int, int]]) -> np.ndarray:
        if not pairs:
            return np.full(za.shape[1], np.nan)
        diff = np.abs(np.array([za[u] - za[v] for u, v in pairs]))
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = np.where(noise > 0, diff / np.where(noise > 0, noise, 1.0),
                             np.where(diff > 0, np.inf, 0.0))
        return np.asarray((ratio > SEPARATION_RATIO).mean(axis=0), dtype=np.float64)

    s_sep, s_surv = share_over(survival["_separated"]), share_over(survival["_surviving"])
    order = np.argsort(-(np.nan_to_num(s_sep) - np.nan_to_num(s_surv)))
    top = [{"feature": names[j], "group": str(groups[j]),
            "share_of_separated_pairs": round(float(s_sep[j]), 3),
            "share_of_surviving_pairs": round(float(s_surv[j]), 3),
            "repeat_rms_difference": round(float(noise[j]), 3)} for j in order[:15]]
    by_group = {str(g): round(float(np.nanmean(s_sep[groups == g])), 3)
                for g in sorted(set(groups.tolist())) if survival["_separated"]}
    return {"top": top, "separated_pairs_share_by_group": by_group}


def round8(keys: np.ndarray, truth: np.ndarray, fp_model: np.ndarray, fp_all: np.ndarray,
           configs: Sequence[str | None], families: dict[str, str], k: int) -> dict[str, Any]:
    lgb = _lightgbm()
    from eval_ceiling import scaled
    from nvml_signals import FEATURE_NAMES, GROUPS, feature_group

    from wattclass.classifier import rules
    from wattclass.classifier.features import FEATURES

    cfg = list(configs)
    zm, za = scaled(fp_model), scaled(fp_all)
    informative = [j for j in range(za.shape[1]) if np.ptp(za[:, j]) > 0]
    groups = np.array([feature_group(n) for n in FEATURE_NAMES])
    spaces: dict[str, Any] = {
        "model_inputs": space_summary(zm, truth, cfg, k),
        "nvml_all": space_summary(za, truth, cfg, k),
        "nvml_all_plus_model_inputs": space_summary(np.hstack([za, zm]), truth, cfg, k),
        "nvml_all_pca_whitened": space_summary(whitened(za[:, informative]), truth, cfg, k),
    }
    for g in GROUPS:
        spaces[f"nvml_all_without_{g}"] = space_summary(za[:, groups != g], truth, cfg, k)
        if (groups[informative] == g).any():
            spaces[f"only_{g}"] = space_summary(za[:, groups == g], truth, cfg, k)

    post_hoc = {
        "model_inputs_noise_scaled": space_summary(noise_scaled(zm, cfg), truth, cfg, k),
        "nvml_all_noise_scaled": space_summary(noise_scaled(za, cfg), truth, cfg, k),
        "nvml_all_plus_model_inputs_noise_scaled": space_summary(noise_scaled(np.hstack([za, zm]), cfg),
                                                                 truth, cfg, k),
    }

    cm = (truth == rules.J_COMPUTE) | (truth == rules.J_MEMORY)
    y = (truth[cm] == rules.J_COMPUTE).astype(np.int64)
    folder = np.array([str(x).split(":")[0] for x in keys], dtype=object)[cm]
    family = np.array([families.get(str(x), "?") for x in keys], dtype=object)[cm]
    fold = family_disjoint_folds(folder, family)
    folds = {str(f): sorted(set(folder[fold == f].tolist())) for f in sorted(set(fold.tolist()))}
    post_hoc["lgbm_random_10fold"] = {
        "model_inputs": lgbm_random_cv(fp_model[cm], y),
        "nvml_all": lgbm_random_cv(fp_all[cm], y),
        "nvml_all_plus_model_inputs": lgbm_random_cv(np.hstack([fp_all, fp_model])[cm], y),
    }
    loso = {
        "model_inputs": lgbm_loso(fp_model[cm], y, fold, family, FEATURES),
        "nvml_all": lgbm_loso(fp_all[cm], y, fold, family, FEATURE_NAMES),
        "nvml_all_plus_model_inputs": lgbm_loso(np.hstack([fp_all, fp_model])[cm], y, fold, family,
                                                [*FEATURE_NAMES, *FEATURES]),
    }
    full = lgb.LGBMClassifier(**{**LGBM_PARAMS, "importance_type": "gain"}).fit(fp_all[cm], y)
    gain = full.booster_.feature_importance(importance_type="gain")
    top_gain = [{"feature": FEATURE_NAMES[j], "gain_share": round(float(gain[j] / gain.sum()), 4)}
                for j in np.argsort(-gain)[:15]]

    surv_eq = twin_survival(zm, za, truth, cfg, keys, families)
    seps = separators(za, cfg, surv_eq, FEATURE_NAMES, groups)
    # Post hoc: the same in the noise-scaled spaces (features in units of their re-run noise).
    keep = np.ptp(za, axis=0) > 0
    surv_ns = twin_survival(noise_scaled(zm, cfg), noise_scaled(za, cfg), truth, cfg, keys, families)
    seps_ns = separators(noise_scaled(za, cfg), cfg, surv_ns, [n for n, k_ in zip(FEATURE_NAMES, keep,
                         strict=True) if k_], groups[keep], unit_noise=True)
    post_hoc["twin_survival_noise_scaled"] = {kk: v for kk, v in surv_ns.items() if not kk.startswith("_")}
    post_hoc["separators_noise_scaled"] = seps_ns
    # Post hoc: what each field group buys a LightGBM on the model inputs, leave one fold out.
    post_hoc["lgbm_loso_model_inputs_plus_group"] = {
        g: lgbm_loso(np.hstack([fp_model, fp_all[:, groups == g]])[cm], y, fold, family, FEATURES)["accuracy"]
        for g in GROUPS}
    post_hoc["lgbm_loso_nvml_all_without_group"] = {
        g: lgbm_loso(fp_all[:, groups != g][cm], y, fold, family, FEATURE_NAMES)["accuracy"] for g in GROUPS}
    seeds = {
        "model_inputs": lgbm_loso_seeds(fp_model[cm], y, fold, family),
        "nvml_all": lgbm_loso_seeds(fp_all[cm], y, fold, family),
        **{f"model_inputs_plus_{name}": lgbm_loso_seeds(
            np.hstack([fp_model, fp_all[:, [FEATURE_NAMES.index(c) for c in cols]]])[cm], y, fold, family)
           for name, cols in ADDITIONS.items()},
    }
    post_hoc["lgbm_loso_seeds"] = seeds
    post_hoc["lgbm_loso_seed_mean_gain_nvml_all_over_model_inputs"] = round(
        seeds["nvml_all"]["mean"] - seeds["model_inputs"]["mean"], 4)
    if "latency" in folds:
        for name in ("nvml_all", "model_inputs"):
            post_hoc[f"lgbm_loso_{name}_without_latency_fold_jobs"] = _without(loso[name], "latency")
    return {
        "dimensions": {"all": len(FEATURE_NAMES), "informative": len(informative),
                       "constant_over_all_jobs": [FEATURE_NAMES[j] for j in range(za.shape[1])
                                                  if j not in set(informative)],
                       "pca_components_95pct": spaces["nvml_all_pca_whitened"]["dimensions"]},
        "spaces": spaces,
        "post_hoc": post_hoc,
        "lgbm_folds": folds,
        "lgbm_leave_one_fold_out": loso,
        "lgbm_params": LGBM_PARAMS,
        "lgbm_top_gain_all_signals": top_gain,
        "twin_survival": {kk: v for kk, v in surv_eq.items() if not kk.startswith("_")},
        "separators": seps,
        "repeat_pairs": repeat_rms(za, cfg)[1],
    }


def print_round8(r: dict[str, Any]) -> None:
    dims = r["dimensions"]
    print(f"all-signals fingerprint: {dims['all']} features, {dims['informative']} vary over the jobs, "
          f"{dims['pca_components_95pct']} principal components hold 95%")
    print("accuracy bound at q = 0.10 / 0.25 / 0.50 of the re-run distance, k-NN LOO:")
    for name, s in r["spaces"].items():
        b = " / ".join(f"{s[f'q{q:.2f}']['accuracy_bound']:.3f}" for q in QUANTILES)
        print(f"  {name:40s} {s['dimensions']:3d} dims  {b}  knn {s['knn_loo_accuracy']:.3f}")
    print("post hoc (added after the first run; see the docstring):")
    for name, s in r["post_hoc"].items():
        if name.startswith(("twin_survival", "separators")):
            continue
        if not isinstance(s, dict):
            print(f"  {name}: {s:.3f}")
            continue
        if name == "lgbm_loso_seeds":
            print(f"  {name} (mean [min, max] over seeds {SEEDS}):")
            for k_, v in s.items():
                print(f"    {k_:44s} {v['mean']:.3f} [{v['min']:.3f}, {v['max']:.3f}]")
            continue
        if name.startswith("lgbm"):
            print(f"  {name}: " + ", ".join(f"{k} {v:.3f}" for k, v in s.items()))
            continue
        b = " / ".join(f"{s[f'q{q:.2f}']['accuracy_bound']:.3f}" for q in QUANTILES)
        print(f"  {name:40s} {s['dimensions']:3d} dims  {b}  knn {s['knn_loo_accuracy']:.3f}")
    print(f"LightGBM leave one fold out ({len(r['lgbm_folds'])} folds sharing no family), compute vs memory:")
    for name, s in r["lgbm_leave_one_fold_out"].items():
        per = ", ".join(f"{f} {v['accuracy']:.2f}" for f, v in s["per_fold"].items())
        print(f"  {name:28s} {s['accuracy']:.3f} (C->M {s['compute_called_memory']}/{s['compute_jobs']}, "
              f"M->C {s['memory_called_compute']}/{s['memory_jobs']}); {per}")
    worst = list(r["lgbm_leave_one_fold_out"]["nvml_all"]["per_family"].items())[:12]
    print("  nvml_all, worst families:", ", ".join(f"{f} {v['right']}/{v['jobs']}" for f, v in worst))
    ph = r["post_hoc"]
    for t, sp, label in ((r["twin_survival"], r["separators"], "equal weights"),
                         (ph["twin_survival_noise_scaled"], ph["separators_noise_scaled"],
                          "noise-scaled, post hoc")):
        _print_survival(t, sp, label)
    print("LightGBM gain:", ", ".join(f"{g['feature']} {g['gain_share']:.2f}"
                                      for g in r["lgbm_top_gain_all_signals"][:8]))


def _print_survival(t: dict[str, Any], sp: dict[str, Any], label: str) -> None:
    print(f"[{label}] model-input twin pairs at q={t['quantile']}: {t['model_input_pairs']}, surviving "
          f"over all signals {t['surviving']}, separated {t['separated']}, "
          f"new {t['new_pairs_over_all_signals']}")
    print("  by family:", ", ".join(f"{f} {v['surviving']}/{v['model_input_pairs']}"
                                    for f, v in list(t["by_family"].items())[:20]))
    print("separators (share of separated pairs with |diff| > 2 repeat RMS, vs surviving pairs):")
    for s in sp["top"][:10]:
        print(f"  {s['feature']:32s} {s['share_of_separated_pairs']:.2f} "
              f"vs {s['share_of_surviving_pairs']:.2f}")
    print("  by group:", sp["separated_pairs_share_by_group"])
