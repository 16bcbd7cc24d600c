"""Subcommands: ``classify``, ``nightly`` and ``model train``."""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from wattclass import argtypes
from wattclass.errors import ConfigError, DataError
from wattclass.progress import FileProgress

log = logging.getLogger("wattclass.classifier")


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add this component's subcommands to ``wattclass``."""
    p = sub.add_parser("classify", help="label jobs in telemetry (GPM rule, else LightGBM model)",
                       description="One row per job: job_id, user, label, confidence, source, n_windows, "
                       "energy_j, gpu_hours, hosts, start, end. The rule labels jobs whose every window "
                       "has GPM; the model labels the rest.")
    p.add_argument("--telemetry", type=Path, nargs="+", required=True,
                   help="Parquet file(s) or data root(s) with telemetry/date=/host= folders")
    p.add_argument("--out", type=Path, required=True, help="labels Parquet file to write")
    p.add_argument("--source", choices=("auto", "rule", "model"), default="auto",
                   help="auto: rule where GPM exists, model elsewhere (default); rule/model: force one")
    p.add_argument("--model", type=Path, default=None, help="model folder (default: the packaged model)")
    p.add_argument("--date", type=argtypes.iso_date, default=None,
                   help="only the date=YYYY-MM-DD partition of a data root")
    p.add_argument("--drop-gpm", action="store_true", help="ignore the GPM columns (as on GPUs without GPM)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_classify)

    _register_nightly(sub)
    _register_effects(sub)
    _register_model(sub)


def _register_nightly(sub: argparse._SubParsersAction[Any]) -> None:
    n = sub.add_parser("nightly", help="label a day's jobs, retrain, write the submission label table")
    n.add_argument("--data-root", type=Path, required=True)
    n.add_argument("--date", type=argtypes.iso_date, help="YYYY-MM-DD (UTC; default: yesterday)")
    n.add_argument("--jobs-file", type=Path, default=None,
                   help="offline job records (CSV with quoted text fields, or Parquet); default: "
                   "DATA_ROOT/jobs/date=D/jobs.parquet if it exists, else ask Slurm (sacct/squeue)")
    n.add_argument("--policy", type=Path, default=None, help="policy TOML to embed in the table")
    n.add_argument("--table-out", type=Path, default=None,
                   help="label table path (default: DATA_ROOT/classifier/label_table.tsv)")
    n.add_argument("--table-group", default="auto", metavar="GROUP",
                   help="group that may read the label table, which holds users' job names: the "
                   "table is then 0640 root:GROUP (slurmctld's group, e.g. slurm). 'auto' (default): "
                   "the group 'slurm' if it exists, else 'none'; 'none': 0644, readable by every user")
    n.add_argument("--no-retrain", action="store_true", help="label only; never train a new model")
    n.add_argument("--workers", type=argtypes.non_negative_int, default=0,
                   help="threads of the DuckDB scan (default 0: every core)")
    n.add_argument("--engine", choices=("local", "dask"), default="local",
                   help="local: this machine (default); dask: feature stage and training on dask.distributed")
    n.add_argument("--scheduler", default=None, help="with --engine dask: a running scheduler's address")
    n.add_argument("--dask-config", type=Path, default=None,
                   help="with --engine dask: cluster TOML (deploy/dask-slurm.example.toml); "
                   "neither this nor --scheduler: a LocalCluster")
    n.add_argument("--lock-timeout", type=argtypes.non_negative_float, default=0.0, metavar="SECONDS",
                   help="if another nightly run holds DATA_ROOT/classifier, wait this long for it "
                   "(default 0: exit 6 at once)")
    n.add_argument("--allow-empty", action="store_true",
                   help="exit 0 on a day without usable telemetry (default: exit 7, so a broken "
                   "pipeline fails the timer's unit)")
    n.add_argument("--json", action="store_true")
    n.set_defaults(func=cmd_nightly)


def _register_effects(sub: argparse._SubParsersAction[Any]) -> None:
    ef = sub.add_parser("effects", help="measured effect of each cap: canary (capped) vs control runs",
                        description="One row per label and cap: label, cap, n_capped, n_control, n_keys, "
                        "runtime_ratio (lo, hi), energy_ratio (lo, hi): capped over uncapped runs of one "
                        "job key (user + job name), 95% intervals by a bootstrap over keys. Reads what the "
                        "nightly run stored; --recompute estimates from the label store now.")
    ef.add_argument("--data-root", type=Path, required=True)
    ef.add_argument("--recompute", action="store_true",
                    help="estimate from the stored labels now instead of reading the last night's result")
    ef.add_argument("--json", action="store_true")
    ef.set_defaults(func=cmd_effects)


def _register_model(sub: argparse._SubParsersAction[Any]) -> None:
    m = sub.add_parser("model", help="train and inspect classifier models")
    msub = m.add_subparsers(dest="model_command", metavar="ACTION")
    t = msub.add_parser("train", help="train a model from v1 telemetry (GPM gives the labels)")
    t.add_argument("--telemetry", type=Path, nargs="*", default=None,
                   help="v1 Parquet files / data roots (default: the bundled real H200 recordings)")
    t.add_argument("--raw", type=Path, nargs="*", default=None,
                   help="raw probe recordings (DIR with *_samples_1hz.parquet), replayed through the "
                   "telemetry daemon into a temporary data root before training")
    t.add_argument("--out", type=Path, required=True, help="model folder to write (model.txt + model.json)")
    t.add_argument("--version", default=None, help="model version string (default: h200-<date>)")
    t.add_argument("--created", default=None,
                   help="creation stamp stored in model.json (default: none, so rebuilds are identical)")
    t.add_argument("--folds", type=argtypes.int_at_least(2), default=5,
                   help="cross-validation folds, at least 2 (default 5)")
    t.add_argument("--kind", default=None, help="roofline-margin (default) or lightgbm-window-multiclass")
    t.add_argument("--aggregation", default=None, help="job aggregation: length-weighted (default) or counts")
    t.add_argument("--round2-recipe", action="store_true",
                   help="issue 13 round 2's recipe (h200-20261130-lenweight, shipped until round 6): compute "
                   "weight 1, no ambiguity check unless --ambiguity says so, no evidence cap and, without "
                   "--raw/--telemetry, its six recordings (training.ROUND2_RECORDINGS)")
    t.add_argument("--calibration", choices=("family", "source"), default="family",
                   help="how the CV the calibration maps are fitted on is grouped: family (whole workload "
                   "families, --folds folds; default) or source (one fold per recording folder: the error "
                   "on a whole set of new kinds of work; a nightly then keeps this model's maps)")
    t.add_argument("--ambiguity", default=None, metavar="MODE:VALUE[:LOWERING]",
                   help="add the ambiguity check (issue 13 round 6; classifier/ambiguity.py): lower a job's "
                   "confidence where training jobs of both labels sit next to it. radius:Q (neighbours "
                   "closer than the Q quantile of the training jobs' same-workload repeat distances; needs "
                   "recordings with runs.csv) or knn:K; LOWERING cap (default: min(confidence, purity)) or "
                   "scale (confidence x purity); none: no check. Default: radius:0.15:cap (round 6, "
                   "in every shipped model since), none with --round2-recipe")
    t.add_argument("--json", action="store_true")
    t.set_defaults(func=cmd_model_train)
    s = msub.add_parser("show", help="print a model's metadata")
    s.add_argument("dir", type=Path, nargs="?", default=None)
    s.set_defaults(func=cmd_model_show)
    m.set_defaults(func=lambda a: (m.print_help(), 2)[1])


def _load(model_dir: Path | None, required: bool) -> Any:
    from wattclass.classifier.model import default_model_dir, load_model

    d = model_dir or default_model_dir()
    try:
        return load_model(d)
    except DataError:
        if required or model_dir is not None:
            raise
        log.warning("no usable default model in %s: labelling with the GPM rule only", d)
        return None


def cmd_classify(args: argparse.Namespace) -> int:
    from wattclass.classifier.engine import label_files_local
    from wattclass.classifier.labeling import write_labels
    from wattclass.classifier.reader import telemetry_files
    from wattclass.output import emit
    from wattclass.schema import GPM_COLUMNS

    model: Any = None
    if args.source != "rule":
        # The default model is loaded (LightGBM imported) only if a window needs it; a model named
        # with --model is checked before the scan, as the user asked for that one.
        model = (_load(args.model, required=args.source == "model") if args.model or args.source == "model"
                 else lambda: _load(None, required=False))
    from wattclass.fsutil import check_output_file

    check_output_file(args.out, "--out")
    files = telemetry_files(args.telemetry, date=args.date)
    if not files:
        raise DataError(f"no telemetry Parquet files under {', '.join(map(str, args.telemetry))}")
    progress = FileProgress()
    progress.set_total(len(files))
    drop = GPM_COLUMNS if args.drop_gpm else ()
    res = label_files_local(files, model, args.source, drop_columns=drop, on_file=progress)
    if res.n_files == 0 and res.report.skipped_files:
        reasons = "; ".join(f"{p}: {why}" for p, why in sorted(res.report.skipped_files.items())[:5])
        raise DataError(f"no usable telemetry file ({reasons})")
    write_labels(res.labels, args.out)
    data = {
        "out": str(args.out), "files": res.n_files, "windows": res.n_windows, "jobs": len(res.labels),
        "by_label": res.labels["label"].value_counts(dropna=False).rename(index=str).to_dict(),
        "by_source": res.labels["source"].value_counts().to_dict(), **res.report.summary(),
        "labels": res.labels.drop(columns=["start", "end"]).to_dict("records") if args.json else None,
    }

    def human(d: dict[str, Any]) -> str:
        lines = [f"{d['jobs']} jobs from {d['windows']} windows in {d['files']} file(s) -> {d['out']}"]
        with_cols = res.labels[["job_id", "user", "label", "confidence", "source", "n_windows",
                                "energy_j", "gpu_hours"]]
        lines.append(with_cols.to_string(index=False))
        return "\n".join(lines)

    emit(data, args.json, human)
    return 0


def _node_features(wanted: set[str]) -> set[str] | None:
    """The features that exist on some node (sinfo), for the table's placement: job_submit.lua
    adds a policy's feature only if the table offers it, and sbatch rejects a job asking for a
    feature no node has (a typo in the policy failed every such job in enforce mode: review
    finding). None where the policy has no features; with the nodes unknown (no Slurm on this
    host), none is offered, logged: placement waits for a night that can ask, caps are unchanged."""
    if not wanted:
        return None
    try:
        from wattclass.slurm.commands import CommandSlurmClient

        have = CommandSlurmClient().node_features()
    except Exception as exc:  # no Slurm commands here, slurmctld down, ...
        log.warning("placement features %s not offered tonight: the nodes' features are unknown (%s)",
                    ", ".join(sorted(wanted)), str(exc)[:200])
        return set()
    if wanted - have:
        log.warning("placement feature(s) %s exist on no node (sinfo): not offered to job_submit.lua",
                    ", ".join(sorted(wanted - have)))
    return have


def _table_policy(path: Path) -> dict[str, Any]:
    """The policy file at ``path`` as the table's policy, its features those some node has."""
    from wattclass.policy import load_policy

    pol = load_policy(path)
    return pol.table_dict(_node_features(pol.feature_names()))


def _slurm_client(jobs_file: Path | None) -> Any:
    from wattclass.slurm.client import JobsFileClient

    if jobs_file is not None:
        return JobsFileClient(jobs_file)
    try:
        from wattclass.slurm.commands import open_slurm_client

        return open_slurm_client()
    except Exception as exc:  # no module yet, no Slurm on this host, ...
        log.warning("Slurm is not reachable (%s): using telemetry's own job ids and users", exc)
        return None


def table_group_id(spec: str) -> int | None:
    """The gid for ``--table-group``: a group name or number, 'auto' or 'none'."""
    import grp

    if spec == "none":
        return None
    if spec == "auto":
        try:
            return grp.getgrnam("slurm").gr_gid
        except KeyError:
            log.warning("no group 'slurm' here: the label table is written 0644, so every user can "
                        "read the job names in it; pass --table-group with slurmctld's group")
            return None
    if spec.isdigit():
        return int(spec)
    try:
        return grp.getgrnam(spec).gr_gid
    except KeyError as exc:
        raise ConfigError(f"--table-group {spec!r}: no such group") from exc


def cmd_nightly(args: argparse.Namespace) -> int:
    from wattclass.classifier.nightly import JOB_WINDOWS_REJECTED, NightlyOptions, run_nightly
    from wattclass.classifier.training import bundled_training_sources
    from wattclass.output import emit

    date = args.date or (dt.datetime.now(dt.UTC).date() - dt.timedelta(days=1)).isoformat()
    # The night reads the data root; a typo there was created (classifier/, a lock, the packaged
    # model and a summary) and the night ended "no telemetry", as if the cluster had been idle.
    argtypes.existing_dir(args.data_root, "--data-root")
    if args.dask_config is not None:  # refused before the lock is taken in the data root
        argtypes.existing_file(args.dask_config, "--dask-config")
    policy = reload = None
    if args.policy is not None:  # a policy that fails its checks stops the night here
        policy = _table_policy(args.policy)
        reload = functools.partial(_table_policy, args.policy)  # again at the table write
    from wattclass.fsutil import check_output_file

    table_out = check_output_file(args.table_out or args.data_root / "classifier" / "label_table.tsv",
                                  "--table-out")
    opts = NightlyOptions(data_root=args.data_root, date=date, table_out=table_out, policy=policy,
                          policy_reload=reload,
                          retrain=not args.no_retrain, base_training=tuple(bundled_training_sources()),
                          workers=args.workers, engine=args.engine, scheduler=args.scheduler,
                          dask_config=args.dask_config, lock_timeout_s=args.lock_timeout,
                          table_group=table_group_id(args.table_group))
    if args.engine != "dask" and (args.scheduler or args.dask_config):
        raise ConfigError("--scheduler and --dask-config need --engine dask")
    jobs_file = args.jobs_file
    default_jobs = args.data_root / "jobs" / f"date={date}" / "jobs.parquet"
    if jobs_file is None and default_jobs.is_file():
        log.info("using job records from %s", default_jobs)
        jobs_file = default_jobs
    slurm = _slurm_client(jobs_file)
    progress = FileProgress()
    summary = run_nightly(opts, slurm, on_file=progress, files_total=progress.set_total)
    emit(summary, args.json, _human_summary)
    if summary.get("status") == "no telemetry" and not args.allow_empty:
        from wattclass.errors import NoDataError

        log.error("%s (exit %d; --allow-empty accepts such a day)", summary["message"], NoDataError.exit_code)
        return NoDataError.exit_code
    if summary.get("status") == JOB_WINDOWS_REJECTED:
        log.error("%s (exit %d)", summary["message"], DataError.exit_code)
        return DataError.exit_code
    return 0


def _human_summary(s: dict[str, Any]) -> str:
    if s.get("status") != "ok":
        return f"{s['date']}: {s.get('message', 'no data')}"
    lines = [f"{s['date']}: {s['jobs']} jobs, {s['windows']} windows in {s['files_read']} file(s), "
             f"model {s['model']}, {s['seconds']} s, job records: {s.get('slurm_backend') or 'none'}"]
    skipped = s.get("skipped_files", {})
    if skipped.get("count") or s.get("duplicate_windows") or s.get("rejected_rows", {}).get("count"):
        lines.append(f"  input: {skipped.get('count', 0)} file(s) skipped "
                     f"({', '.join(f'{k} {v}' for k, v in skipped.get('by_reason', {}).items()) or '-'}), "
                     f"{s.get('duplicate_windows', 0)} duplicate window(s), "
                     f"{s.get('rejected_rows', {}).get('count', 0)} impossible row(s) rejected")
    lines.append(f"  {'label':<11}{'jobs':>7}{'GPU-hours':>12}{'energy kWh':>12}")
    for lab, v in s["by_label"].items():
        if v["jobs"]:
            lines.append(f"  {lab:<11}{v['jobs']:>7}{v['gpu_hours']:>12.2f}{v['energy_kwh']:>12.2f}")
    r = s.get("retrain", {})
    if r.get("retrained"):
        verdict = "promoted" if r["promoted"] else "kept current model"
        lines.append(f"  retrained {r['version']}: accuracy on {r['new_jobs']} new jobs "
                     f"{r['candidate_accuracy']:.3f} vs {r['incumbent_accuracy']:.3f} -> {verdict}")
    else:
        lines.append(f"  no retraining: {r.get('reason', '')}")
    lines.append(f"  label table: {s['table']['path']} ({s['table']['entries']} entries)")
    return "\n".join(lines)


def cmd_model_train(args: argparse.Namespace) -> int:
    from wattclass.classifier.ambiguity import DEFAULT_SPEC as AMBIGUITY_DEFAULT
    from wattclass.classifier.model import (
        AGGREGATIONS,
        DEFAULT_AGGREGATION,
        DEFAULT_COMPUTE_WEIGHT,
        DEFAULT_KIND,
        FIT_CAP,
        MODEL_KINDS,
        source_folds,
        train_model,
    )
    from wattclass.classifier.replay import is_recording
    from wattclass.classifier.training import (
        MAX_WINDOWS_PER_JOB,
        ROUND2_RECORDINGS,
        bundled_training_sources,
        h200_data_dir,
        job_families,
        thin,
        training_set,
    )
    from wattclass.fsutil import check_output_dir
    from wattclass.output import emit

    check_output_dir(args.out, "--out")  # before the training, not after it
    kind = args.kind or DEFAULT_KIND
    if kind not in MODEL_KINDS:
        raise DataError(f"--kind {kind}: unknown model kind (known: {', '.join(MODEL_KINDS)})")
    aggregation = args.aggregation or DEFAULT_AGGREGATION
    if aggregation not in AGGREGATIONS:
        raise DataError(f"--aggregation {aggregation}: unknown job aggregation "
                        f"(known: {', '.join(AGGREGATIONS)})")
    for r in args.raw or []:
        if not is_recording(r):
            raise DataError(f"--raw {r}: not a probe recording (no *_samples_1hz.parquet files)")
    for t in args.telemetry or []:  # a path that is not there trained on nothing and blamed the model kind
        if not Path(t).exists():
            raise DataError(f"--telemetry {t}: no such file or folder")
    given = [*(args.telemetry or []), *(args.raw or [])]
    # issue 13 round 4 changed only the training data and the compute weight (and failed its rule on
    # fresh4): the flag pins the round-2 recipe whatever the defaults become
    recipe_sources = [h200_data_dir() / name for name in ROUND2_RECORDINGS] if args.round2_recipe else None
    sources = given or recipe_sources or bundled_training_sources()
    weight = 1.0 if args.round2_recipe else DEFAULT_COMPUTE_WEIGHT
    # round 6 (the shipped model) adds the ambiguity check by default; the round-2 recipe pins none
    wanted = args.ambiguity or ("none" if args.round2_recipe else AMBIGUITY_DEFAULT)
    spec = None if wanted == "none" else parse_ambiguity(wanted)
    # every window of every job (the check's fingerprints are over whole jobs); the model trains on
    # the same thinned windows as ever (training_set's default)
    full = training_set(sources, max_windows_per_job=0)
    ts = thin(full, MAX_WINDOWS_PER_JOB)
    version = args.version or f"h200-{dt.datetime.now(dt.UTC):%Y%m%d}"
    # Recordings name each job's workload family: CV (metrics, calibration) then holds out whole
    # families, so confidences reflect work the model never saw. Other sources: grouped by job.
    families = job_families(sources) or None
    n_folds, groups = args.folds, None
    if args.calibration == "source":  # leave one recording folder out (issue 13 round 5)
        groups, n_folds = source_folds(ts.group)
    # the round-2 recipe had no evidence cap (issue 13 round 10 added it), as eval_families' flag
    model = train_model(ts, version, n_folds=n_folds, created=args.created, families=families, kind=kind,
                        aggregation=aggregation, compute_weight=weight, fold_groups=groups,
                        evidence_cap=None if args.round2_recipe else FIT_CAP)
    if spec is not None:
        _add_ambiguity(model, full, sources, spec, asked=bool(args.ambiguity))
    model.save(args.out)
    data = {"out": str(args.out), "version": version, "sources": [str(s) for s in sources],
            "metrics": model.meta["metrics"], "training_data": model.meta["training_data"]}

    def human(d: dict[str, Any]) -> str:
        m = d["metrics"]
        return (f"model {d['version']} -> {d['out']}: {m['n_jobs']} jobs, {m['n_windows']} windows; "
                f"grouped {m['n_folds']}-fold CV job accuracy {m['accuracy']:.3f}, ECE {m['ece']:.3f}")

    emit(data, args.json, human)
    return 0


def _add_ambiguity(model: Any, full: Any, sources: Sequence[Path], spec: tuple[str, float, str],
                   asked: bool) -> None:
    """Fit the ambiguity check on every window of the training jobs (whole-job fingerprints) and
    attach it. The default check needs repeat runs named in the recordings' runs.csv for its radius:
    where the sources have none it is left out with a warning; asked for by flag, that is an error."""
    from wattclass.classifier.ambiguity import fit_ambiguity, training_fingerprints
    from wattclass.classifier.training import workload_configs

    keys, truth, fp = training_fingerprints(full)
    configs = workload_configs(sources)
    try:
        model.set_ambiguity(fit_ambiguity(fp, truth, spec[0], spec[1], spec[2],
                                          configs=[configs.get(str(k)) for k in keys]))
    except DataError as exc:
        if asked:
            raise
        log.warning("model trained without the ambiguity check: %s", exc)


def parse_ambiguity(spec: str) -> tuple[str, float, str]:
    """``--ambiguity MODE:VALUE[:LOWERING]`` -> (mode, value, lowering); a DataError names the flag."""
    from wattclass.classifier.ambiguity import LOWERINGS, MODES, check_value

    parts = spec.split(":")
    if len(parts) not in (2, 3) or parts[0] not in MODES or (len(parts) == 3 and parts[2] not in LOWERINGS):
        raise DataError(f"--ambiguity {spec[:60]!r}: expected MODE:VALUE[:LOWERING] with MODE one of "
                        f"{', '.join(MODES)} and LOWERING one of {', '.join(LOWERINGS)}, "
                        "e.g. radius:0.15:cap")
    try:
        value = float(parts[1])
        check_value(parts[0], value)  # before the training, not after it
    except ValueError:
        raise DataError(f"--ambiguity {spec[:60]!r}: {parts[1][:20]!r} is not a number") from None
    except DataError as exc:
        raise DataError(f"--ambiguity {spec[:60]!r}: {exc}") from None
    return parts[0], value, parts[2] if len(parts) == 3 else "cap"


def cmd_model_show(args: argparse.Namespace) -> int:
    import json

    from wattclass.classifier.model import default_model_dir, load_model

    model = load_model(args.dir or default_model_dir())
    print(json.dumps(model.meta, indent=2, sort_keys=True))
    return 0


def load_effects(data_root: Path, recompute: bool = False) -> tuple[Any, str]:
    """(effects DataFrame, where it came from): the last night's, else estimated from the labels now."""
    from wattclass.classifier.effects import effects_from_history
    from wattclass.classifier.store import ClassifierStore

    store = ClassifierStore(data_root)
    stored = None if recompute else store.latest_effects()
    if stored is not None:
        date = str(stored["date"].iloc[0]) if "date" in stored.columns and len(stored) else "?"
        return stored.drop(columns=["date"], errors="ignore"), f"stored by the nightly run of {date}"
    return effects_from_history(store.label_history()), "estimated now from the label store"


def cmd_effects(args: argparse.Namespace) -> int:
    import math

    from wattclass.classifier.effects import EFFECT_COLUMNS
    from wattclass.output import emit

    argtypes.existing_dir(args.data_root, "--data-root")
    if not (Path(args.data_root) / "classifier").is_dir():
        raise DataError(f"{args.data_root}: no classifier store (run `wattclass nightly` first)")
    eff, origin = load_effects(args.data_root, args.recompute)
    rows = [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
            for r in eff[list(EFFECT_COLUMNS)].to_dict("records")]

    def human(rs: list[dict[str, Any]]) -> str:
        if not rs:
            return (f"no canary effects ({origin}): no job in the label store has arm=capped/control; "
                    "set [canary] fraction in the policy")

        def ci(r: dict[str, Any], k: str) -> str:
            if r[k] is None:
                return "n/a"
            lo, hi = r[f"{k}_lo"], r[f"{k}_hi"]
            band = f" [{lo:.3f}, {hi:.3f}]" if lo is not None else " [too few keys]"
            return f"{r[k]:.3f}{band}"

        head = f"{'label':<8} {'cap':>6} {'n_capped':>8} {'n_control':>9} {'keys':>5}  " \
               f"{'runtime_ratio [95% CI]':<26} energy_ratio [95% CI]"
        lines = [f"canary effects ({origin})", head]
        for r in rs:
            lines.append(f"{r['label']:<8} {r['cap']:>6} {r['n_capped']:>8} {r['n_control']:>9} "
                         f"{r['n_keys']:>5}  {ci(r, 'runtime_ratio'):<26} {ci(r, 'energy_ratio')}")
        return "\n".join(lines)

    emit(rows, args.json, human)
    return 0
