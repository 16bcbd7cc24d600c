"""Issue 13 round 10: the shipped recipe on 30 s runs of families it never trained on, and the same
runs cut to their first 10 s.

Why: every never-seen test set of rounds 2-9 held jobs of 8-12 s (one or two 10 s windows) and
landed at 0.68-0.92 job accuracy without GPM; real jobs last longer. Comparing a long run with the
same run cut to 10 s isolates the length effect: the work, the GPU and the truth are the same, only
the number of seconds the model sees differs. The protocol was registered before any long run was
recorded (docs/measurements/issue13-preregistration-round10-2026-12-01.md) and nothing here is
tuned on the long runs:

1. The families of the long runs (runs.csv ``family``), sorted by name, are dealt round robin into
   5 folds (``family_folds``).
2. Per fold, the shipped recipe (``wattclass model train``'s: DEFAULT_KIND, DEFAULT_AGGREGATION,
   the fixed compute weight, the ambiguity check DEFAULT_SPEC with the fold's training jobs as its
   reference) is trained once on the folders of the shipped model (but the long runs) less every job of the
   fold's families, calibration nested (bench/eval_families.py ``predict_unseen``), and scores
   (a) the long runs of those families at full length, (b) the same runs cut to their first 10 s,
   (c) the short runs of those families in those folders (the usual leave-family-out).
3. Reported for (a), (b), (c) apart: eval_families' ``summarize`` (job accuracy, unsure counted
   wrong, coverage, compute called memory and memory called compute, acted on at min_confidence
   0.8, ECE), compute called memory acted on with the memory threshold at 0.9 and 0.95, and per
   family right/jobs.
4. (d), *seen* work: the shipped model (classifier/models) as it is on (a).

Truth: the docs/design.md job rule over all of a job's windows, from GPM. A cut run keeps the truth
of its full run (the job is the same; only what the model sees changes); the runs whose first 10 s
alone would have another truth are listed (``truth_changed_by_cut``).

Cut (``cut_recording``): a copy of the recording whose runs.csv ends every run at its start + 10 s
less the replay's grace (gpu/replay.py JOB_GRACE_S: a job holds its GPU until end + grace), so the
replay through the telemetry daemon gives the job only the samples of its first 10 s; the later
samples belong to no job and reach no window. Windows are made by the same replay as always.

    python bench/eval_long_families.py --long wattclass/data/h200/long-families [--json]

Deterministic (LightGBM's fixed seed, one thread; the inner folds' seed 0): two runs give the same
JSON but for ``machine``, ``measured_at`` and ``runtime_s``. Five trainings, each with its nested
calibration: about 9 s on 2 shared cores for the 45 runs of long-families (2026-12-01).
"""

from __future__ import annotations

import argparse
import csv
import io
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from benchstamp import emit  # noqa: E402
from eval_families import (  # noqa: E402
    predict_unseen,
    saved_model,
    set_evidence_recipe,
    summarize,
    table_header,
    table_line,
)

FOLDS = 5
CUT_S = 10.0
MIN_CONFIDENCE = 0.8
#: The policy's per-label threshold for memory calls (``[min_confidence_by_label] memory``).
MEMORY_THRESHOLDS = (0.9, 0.95)
SHIPPED_MODEL = BENCH.parent / "classifier" / "models"
#: Report parts, in order: (key, what it is).
PARTS = (
    ("a", "long runs, full length"),
    ("b", f"long runs, first {CUT_S:g} s"),
    ("c", "short runs of those families (training folders)"),
    ("d", "SEEN: shipped model as it is, long runs full"),
)


def cut_recording(src: Path, dst: Path, seconds: float) -> Path:
    """Copy the probe recording ``src`` into the new folder ``dst`` with every run ended so that
    only the samples of its first ``seconds`` belong to it (``end`` = min(end, start + seconds -
    JOB_GRACE_S)); caps and samples are copied as they are. Returns ``dst``."""
    from wattclass.classifier.replay import is_recording
    from wattclass.errors import DataError
    from wattclass.gpu.replay import JOB_GRACE_S

    if seconds <= JOB_GRACE_S:
        raise DataError(f"cut to {seconds:g} s: must be longer than the replay's grace {JOB_GRACE_S:g} s")
    if not is_recording(src):
        raise DataError(f"{src}: not a probe recording (no *_samples_1hz.parquet files)")
    dst.mkdir(parents=True)
    for f in sorted(Path(src).iterdir()):
        if f.name.endswith("_runs.csv"):
            _write_cut_runs(f, dst / f.name, seconds - JOB_GRACE_S)
        elif f.is_file():
            shutil.copyfile(f, dst / f.name)
    return dst


def _write_cut_runs(runs: Path, out: Path, keep_s: float) -> None:
    """``runs`` with each row's ``end`` at most ``start + keep_s``; other columns untouched."""
    from wattclass.errors import DataError
    from wattclass.fsutil import atomic_writer

    with runs.open(newline="") as fh:
        reader = csv.DictReader(fh)
        fields = list(reader.fieldnames or [])
        rows = list(reader)
    missing = [c for c in ("start", "end") if c not in fields]
    if missing:
        raise DataError(f"{runs}: missing column(s) {', '.join(missing)}")
    for i, row in enumerate(rows, start=2):
        try:
            start, end = float(row["start"]), float(row["end"])
        except (TypeError, ValueError):
            raise DataError(f"{runs} line {i}: start/end not numbers "
                            f"({row['start']!r}, {row['end']!r})") from None
        row["end"] = repr(min(end, start + keep_s))
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    with atomic_writer(out) as fh:
        fh.write(text.getvalue().encode())


def family_folds(families: Iterable[str], n_folds: int = FOLDS) -> list[tuple[str, ...]]:
    """The distinct ``families``, sorted by name, dealt round robin into ``n_folds`` folds."""
    names = sorted(set(families))
    if len(names) < n_folds:
        raise SystemExit(f"{len(names)} families of long runs: too few for {n_folds} folds")
    return [tuple(names[i::n_folds]) for i in range(n_folds)]


def _fold_ambiguity(train: Any, configs: dict[str, str]) -> dict[str, Any] | None:
    """The recipe's ambiguity check (DEFAULT_SPEC) with the fold's training jobs as its reference;
    None (no check) where they name no repeat runs, as ``model train`` leaves it out then."""
    from wattclass.classifier.ambiguity import DEFAULT_SPEC, fit_ambiguity, training_fingerprints
    from wattclass.classifier.cli import parse_ambiguity
    from wattclass.errors import DataError

    mode, value, lowering = parse_ambiguity(DEFAULT_SPEC)
    keys, truth, fp = training_fingerprints(train)
    try:
        return fit_ambiguity(fp, truth, mode, value, lowering, configs=[configs.get(str(k)) for k in keys])
    except DataError as exc:
        print(f"fold trained without the ambiguity check: {exc}", file=sys.stderr)
        return None


def fold_predictions(ts: Any, pool: np.ndarray, tested: np.ndarray, families: dict[str, str],
                     configs: dict[str, str], folds: list[tuple[str, ...]],
                     ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One training per fold on the windows of ``pool`` outside the fold's families; predictions
    of the jobs of those families among ``pool | tested``. Returns the per-job results (keys, GPM
    truth, label, raw confidence, calibrated confidence without and with the ambiguity check, fold)
    and per fold (training jobs, ambiguity radius)."""
    from wattclass.classifier.ambiguity import job_fingerprints, lower_confidence
    from wattclass.classifier.model import (
        DEFAULT_AGGREGATION,
        DEFAULT_COMPUTE_WEIGHT,
        DEFAULT_COST_AWARE,
        DEFAULT_KIND,
    )

    fam = np.asarray([families.get(g, g) for g in ts.group], dtype=object)
    cols: dict[str, list[Any]] = {k: [] for k in ("keys", "truth", "pred", "raw", "conf_plain", "conf",
                                                  "fold")}
    info: list[dict[str, Any]] = []
    for i, fold in enumerate(folds):
        held = np.isin(fam, list(fold))
        train, test = ts.subset(pool & ~held), ts.subset(held & (pool | tested))
        keys, truth = test.job_truth()
        k, pred, raw, conf, _ = predict_unseen(train, test, families, DEFAULT_KIND,
                                               cost_aware=DEFAULT_COST_AWARE, aggregation=DEFAULT_AGGREGATION,
                                               compute_weight=DEFAULT_COMPUTE_WEIGHT, calibration="family")
        fkeys, fp = job_fingerprints(test.X, test.group, test.dur)
        assert (k == keys).all() and (fkeys == keys).all()
        amb = _fold_ambiguity(train, configs)
        for name, v in zip(cols, (keys, truth, pred, raw, conf, lower_confidence(amb, conf, fp, pred),
                                  np.full(len(keys), i)), strict=True):
            cols[name].append(v)
        info.append({"families": list(fold), "training_jobs": len(np.unique(train.group)),
                     "ambiguity_radius": None if amb is None else amb.get("radius")})
    return {k: np.concatenate(v) for k, v in cols.items()}, info


def part_results(res: dict[str, Any], folders: Iterable[str], conf: str = "conf") -> dict[str, Any]:
    """The jobs of ``res`` from some recording folders (job keys ``<folder>:<id>``), in the form
    eval_families' ``summarize`` reads, confidences from column ``conf``."""
    m = _in_part(res["keys"], folders)
    return {"keys": res["keys"][m], "truth": res["truth"][m], "pred": res["pred"][m], "raw": res["raw"][m],
            "conf": res[conf][m], "compute_weights": {}}


def _in_part(keys: np.ndarray, folders: Iterable[str]) -> np.ndarray:
    wanted = set(folders)
    return np.asarray([str(k).split(":", 1)[0] in wanted for k in keys], dtype=bool)


def with_full_truth(cut: dict[str, Any], full: dict[str, Any], long_name: str,
                    ) -> tuple[dict[str, Any], list[str]]:
    """The cut runs scored against their full runs' truth; the runs whose truth the cut changed."""
    from wattclass.classifier.rules import JOB_LABELS

    truth_of = dict(zip(full["keys"], full["truth"], strict=True))
    full_keys = [f"{long_name}:{str(k).split(':', 1)[1]}" for k in cut["keys"]]
    lost = [k for k in full_keys if k not in truth_of]
    if lost:
        raise SystemExit(f"cut runs without a full run: {', '.join(lost[:5])}")
    truth = np.asarray([truth_of[k] for k in full_keys], dtype=np.int8)
    changed = [f"{k}: {JOB_LABELS[a]} -> {JOB_LABELS[b]} in the first {CUT_S:g} s"
               for k, a, b in zip(full_keys, truth, cut["truth"], strict=True) if a != b]
    return {**cut, "truth": truth}, changed


def score(res: dict[str, Any], families: dict[str, str]) -> dict[str, Any]:
    """``summarize`` at min_confidence 0.8, the ``all`` block with each memory threshold, and per
    family right/jobs."""
    out = summarize(res, families, MIN_CONFIDENCE)
    out["memory_thresholds"] = {f"{t:g}": summarize(res, families, MIN_CONFIDENCE, {"memory": t})["all"]
                                for t in MEMORY_THRESHOLDS}
    right = res["pred"] == res["truth"]
    fam = np.asarray([families.get(k, k) for k in res["keys"]], dtype=object)
    out["right_jobs"] = {f: [int(right[fam == f].sum()), int((fam == f).sum())] for f in sorted(set(fam))}
    return out


def shipped_folders() -> tuple[str, ...]:
    """The shipped model's training folders, checked against the bundled list."""
    from wattclass.classifier.model import load_model
    from wattclass.classifier.training import BUNDLED_RECORDINGS

    saved = load_model(SHIPPED_MODEL)
    sources = sorted(saved.meta.get("training_data", {}).get("sources", []))
    if sources != sorted(BUNDLED_RECORDINGS):
        raise SystemExit(f"{SHIPPED_MODEL}: trained on {sources}, not on BUNDLED_RECORDINGS "
                         f"{sorted(BUNDLED_RECORDINGS)}: which folders?")
    return BUNDLED_RECORDINGS


def evaluate(given: Path) -> dict[str, Any]:
    """Every figure of the protocol for the long runs of the recording ``given``."""
    from wattclass.classifier.model import load_model
    from wattclass.classifier.replay import is_recording
    from wattclass.classifier.training import h200_data_dir, job_families, training_set, workload_configs

    long_dir = given.resolve()  # job keys are named after the folder, as the replay names it
    if not is_recording(long_dir):
        raise SystemExit(f"--long {given}: not a probe recording (no *_samples_1hz.parquet files)")
    long_name = long_dir.resolve().name
    # the long runs joined training after their registered score (round 10): never train on them here
    names = tuple(n for n in shipped_folders() if n != long_name)
    cut_name = f"{long_name}-first{CUT_S:g}s"
    train_sources = [h200_data_dir() / n for n in names]
    with tempfile.TemporaryDirectory(prefix="wattclass-longfam-") as tmp:
        cut_dir = cut_recording(long_dir, Path(tmp) / cut_name, CUT_S)
        sources = [*train_sources, long_dir, cut_dir]
        families = job_families(sources)
        configs = workload_configs(train_sources)
        ts = training_set(sources, max_windows_per_job=0)
    src = np.asarray([str(g).split(":", 1)[0] for g in ts.group], dtype=object)
    pool, is_long = np.isin(src, list(names)), src == long_name
    long_keys = np.unique(ts.group[is_long])
    folds = family_folds(families.get(k, k) for k in long_keys)
    res, fold_info = fold_predictions(ts, pool, is_long | (src == cut_name), families, configs, folds)
    parts, plain = {}, {}
    for conf, into in (("conf", parts), ("conf_plain", plain)):
        into["a"] = part_results(res, (long_name,), conf)
        into["b"], changed = with_full_truth(part_results(res, (cut_name,), conf), into["a"], long_name)
        into["c"] = part_results(res, names, conf)
    parts["d"] = saved_model(SHIPPED_MODEL, ts.subset(is_long))
    shipped = load_model(SHIPPED_MODEL)
    return {
        "protocol": "docs/measurements/issue13-preregistration-round10-2026-12-01.md",
        "long": str(given), "long_jobs": len(long_keys), "cut_s": CUT_S,
        "training_folders": list(names), "shipped_model": str(SHIPPED_MODEL),
        "shipped_model_version": shipped.version, "shipped_model_evidence_cap": shipped.evidence_cap,
        "min_confidence": MIN_CONFIDENCE, "memory_thresholds": list(MEMORY_THRESHOLDS),
        "folds": [{**f, "jobs": {p: int((res["fold"][_in_part(res["keys"], pre)] == i).sum())
                                 for p, pre in (("a", (long_name,)), ("b", (cut_name,)), ("c", names))}}
                  for i, f in enumerate(fold_info)],
        "parts": {p: {"what": what, **score(parts[p], families)} for p, what in PARTS},
        "without_ambiguity_check": {p: score(plain[p], families)["all"] for p in ("a", "b", "c")},
        "truth_changed_by_cut": changed,
    }


def print_report(out: dict[str, Any]) -> None:
    """The readable table: one row per part, the memory thresholds, per family right/jobs."""
    print(f"issue 13 round 10 ({out['protocol']}): {out['long']}, {out['long_jobs']} long runs, "
          f"{len(out['folds'])} folds of families; min_confidence {out['min_confidence']:g}")
    for i, f in enumerate(out["folds"]):
        print(f"  fold {i}: {len(f['families'])} families, trained on {f['training_jobs']} jobs, "
              f"tested a/b/c {f['jobs']['a']}/{f['jobs']['b']}/{f['jobs']['c']}: {', '.join(f['families'])}")
    print(table_header("part"))
    for p, what in PARTS:
        print(table_line(f"({p})", out["parts"][p]["all"]) + f"  {what}")
    print("\ncompute called memory, acted on, with the memory threshold at "
          + ", ".join(f"{t:g}" for t in out["memory_thresholds"]) + ":")
    for p, _ in PARTS:
        th = out["parts"][p]["memory_thresholds"]
        print(f"  ({p}) " + "  ".join(f"{t}: {b['compute_called_memory_acted']}/{b['compute_jobs']} "
                                      f"(unsure=wrong {b['accuracy_unsure_wrong']:.3f})"
                                      for t, b in th.items()))
    print("\nwithout the ambiguity check (accuracy / unsure=wrong / ECE): " + "; ".join(
        f"({p}) {b['accuracy']:.3f} / {b['accuracy_unsure_wrong']:.3f} / {b['ece']:.3f}"
        for p, b in out["without_ambiguity_check"].items()))
    a, b = out["parts"]["a"]["right_jobs"], out["parts"]["b"]["right_jobs"]
    print(f"\n{'family':<20} {'(a) right/jobs':>14} {'(b) right/jobs':>14}")
    for f in sorted(a):
        ra, rb = a[f], b.get(f, [0, 0])
        print(f"{f:<20} {ra[0]:>9}/{ra[1]:<4} {rb[0]:>9}/{rb[1]:<4}")
    changed = out["truth_changed_by_cut"]
    print(f"\nruns whose first {out['cut_s']:g} s alone have another truth (scored on the full run's): "
          f"{len(changed)}" + (": " + "; ".join(changed) if changed else ""))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--long", type=Path, required=True,
                    help="the long runs (probe recording, e.g. wattclass/data/h200/long-families)")
    ap.add_argument("--evidence-cap", action=argparse.BooleanOptionalAction, default=True,
                    help="the round-10 recipe's evidence cap (classifier/model.py EVIDENCE_QUANTILE); "
                         "--no-evidence-cap: the registered run's recipe (h200-20261130-fresh6's)")
    ap.add_argument("--json", action="store_true", help="every figure as JSON (with the machine and time)")
    ap.add_argument("--evidence-quantile", type=float, default=None,
                    help="the cap's quantile of the training jobs' evidence (default: EVIDENCE_QUANTILE)")
    a = ap.parse_args()
    quantile = set_evidence_recipe(a.evidence_cap, a.evidence_quantile)  # read in predict_unseen
    t0 = time.monotonic()
    out = evaluate(a.long)
    out["evidence_cap"] = quantile
    out["runtime_s"] = round(time.monotonic() - t0, 1)
    if a.json:
        return emit(out)
    print_report(out)
    print(f"\n{out['runtime_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
