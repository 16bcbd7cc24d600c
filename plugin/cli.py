"""``wattclass policy ...`` and ``wattclass plugin ...`` subcommands.

Heavy or hook-specific imports happen inside handlers so ``wattclass --help`` stays quick.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from wattclass.output import emit


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add ``policy`` and ``plugin`` to ``wattclass``."""
    pol = sub.add_parser("policy", help="check and explain the power policy")
    psub = pol.add_subparsers(dest="policy_command", metavar="ACTION", required=True)
    chk = psub.add_parser("check", help="validate a policy file")
    chk.add_argument("file", type=Path)
    chk.add_argument("--json", action="store_true")
    chk.set_defaults(func=_policy_check)
    exp = psub.add_parser("explain", help="what would happen to a job and why")
    exp.add_argument("--policy", type=Path, required=True, help="policy TOML")
    exp.add_argument("--table", type=Path, required=True, help="label table (labels.tsv)")
    exp.add_argument("--user", required=True)
    exp.add_argument("--name", required=True, help="job name")
    exp.add_argument("--account")
    exp.add_argument("--partition", help="the job's -p (comma list); without it, pass the cluster's default "
                     "partition here, as Slurm resolves it")
    exp.add_argument("--constraint", help="the job's own --constraint, if any")
    exp.add_argument("--no-gpu", action="store_true", help="the job asks for no GPU (it gets no decision)")
    lim = exp.add_mutually_exclusive_group()
    lim.add_argument("--gpu-model", help="show the cap in watts on this GPU model (H200, H100, A100)")
    lim.add_argument("--limits", metavar="DEFAULT,MIN,MAX", help="show the cap in watts on a GPU with "
                     "these NVML power limits, e.g. 700,200,700")
    exp.add_argument("--data-root", type=Path,
                     help="cite the cap's effect measured by the canary on this cluster (wattclass effects)")
    exp.add_argument("--json", action="store_true")
    exp.set_defaults(func=_policy_explain)
    app = psub.add_parser("apply", help="write the policy into the label table now, keeping its keys "
                          "(a rollback that needs no nightly run)")
    app.add_argument("--policy", type=Path, required=True, help="policy TOML")
    app.add_argument("--table", type=Path, required=True, help="label table job_submit.lua reads")
    app.add_argument("--json", action="store_true")
    app.set_defaults(func=_policy_apply)

    plug = sub.add_parser("plugin", help="Slurm hooks: prolog, epilog, reconcile, install files")
    gsub = plug.add_subparsers(dest="plugin_command", metavar="ACTION", required=True)
    from wattclass.plugin.prolog import add_arguments

    for hook, text in (("prolog", "apply the job's power cap (slurmd Prolog)"),
                       ("epilog", "restore the job's GPUs (slurmd Epilog)"),
                       ("reconcile", "restore defaults on GPUs no job holds (boot, daemon start)")):
        hp = gsub.add_parser(hook, help=text)
        add_arguments(hp)
        hp.set_defaults(func=_hook, hook=hook)
    chk_node = gsub.add_parser("check", help="verify an installed node: a checklist, exit 1 on any failure")
    from wattclass.plugin.check import add_arguments as add_check_arguments

    add_check_arguments(chk_node)
    chk_node.set_defaults(func=_plugin_check)
    lua = gsub.add_parser("install-lua", help="write job_submit.lua reading a given label table")
    lua.add_argument("--table", type=Path, default=Path("/etc/slurm/wattclass/labels.tsv"))
    lua.add_argument("--dest", type=Path, required=True, help="e.g. /etc/slurm/job_submit.lua")
    lua.set_defaults(func=_install_lua)
    hk = gsub.add_parser("install-hooks", help="write the Prolog/Epilog wrappers")
    hk.add_argument("--dest", type=Path, required=True, help="folder, e.g. /etc/slurm/wattclass")
    hk.add_argument("--python", default=sys.executable,
                    help="absolute path of the interpreter wattclass is installed in (default: this one, "
                    "e.g. /opt/wattclass/bin/python)")
    hk.add_argument("--hook-args", default="--backend nvml --log /var/log/wattclass/plugin.log",
                    help="arguments for `python -m wattclass.plugin.prolog HOOK`")
    hk.set_defaults(func=_install_hooks)


def _policy_check(args: argparse.Namespace) -> int:
    from wattclass.policy import load_policy

    pol = load_policy(args.file)
    data = {"file": str(args.file), "valid": True, **pol.table_dict(),
            "thresholds": pol.effective_thresholds(), "canary_fraction": pol.canary_fraction}
    emit(data, args.json, lambda d: f"{d['file']}: valid (mode {d['mode']}, min_confidence "
         f"{d['min_confidence']}, {len(d['decisions'])} labels with decisions)\n"
         f"{_thresholds_line(d['thresholds'], d['min_confidence_by_label'])}\n"
         f"{_canary_line(d['mode'], d['canary_fraction'])}")
    return 0


def _canary_line(mode: str, fraction: float) -> str:
    """What ``[canary] fraction`` does under ``mode``: its meaning flips (docs/admin.md, rollout)."""
    if fraction <= 0:
        return "canary: none (rollout steps 4-5 set [canary] fraction to measure the caps' effect)"
    share = f"{fraction * 100:g}% of capped decisions"
    if mode == "enforce":
        return f"canary: {share} left uncapped (control arm); the rest capped"
    return f"canary: {share} capped for real (canary arm); the rest only logged"


def _policy_apply(args: argparse.Namespace) -> int:
    """Rewrite the table's policy from the file now, keeping its keys and its group and mode
    as the nightly writes them (0640 root:group where others could not read it, else 0644).

    Why: a rollback (mode -> shadow) waited for a whole nightly run, which leaves the old table
    in place when the day has no usable telemetry (exit 7), every window is rejected (3) or the
    lock is held (6): every new job stayed enforced. The keys are kept as they are; the features
    offered stay those the table offered (the last night's sinfo answer), none without a policy.
    Written under the table's write lock, as the nightly writes it (``table_write_lock``)."""
    import datetime as dt
    import os

    from wattclass.labeltable import parse_table_parts, table_write_lock, write_label_table
    from wattclass.policy import load_policy

    pol = load_policy(args.policy)  # a policy that fails its checks changes nothing
    _read_table(args.table)  # named errors before anything is made there (the lock file too)
    with table_write_lock(args.table):  # a nightly run's table write waits, and reads the policy after
        # read again: a run that held the lock has just written new keys, which are kept
        entries, old, _ = parse_table_parts(_read_table(args.table), str(args.table))
        old = old or {}
        new = pol.table_dict(set(old.get("features_available") or {}))
        st = os.stat(args.table)
        group = None if st.st_mode & 0o004 else st.st_gid  # as written: 0640 root:group, or 0644
        dropped = write_label_table(args.table, entries, new, generated_at=dt.datetime.now(dt.UTC),
                                    group=group)
    data = {"table": str(args.table), "policy": str(args.policy), "mode_before": old.get("mode"),
            "mode": new["mode"], "changed": _policy_differences(old, new), "entries": len(entries) - dropped}
    emit(data, args.json, lambda d: f"{d['table']}: policy from {d['policy']} written, mode "
         f"{d['mode_before'] or '-'} -> {d['mode']} (changed: {', '.join(d['changed']) or 'nothing'}); "
         f"{d['entries']} keys kept. Jobs submitted from now on are decided with it; jobs submitted "
         "before keep their admin_comment (docs/admin.md, rollback)")
    return 0


def _read_table(path: Path) -> str:
    """The label table's text (trusted: root's, no link), or ConfigError naming ``--table``."""
    from wattclass.errors import ConfigError
    from wattclass.fsutil import read_trusted_text

    try:
        return read_trusted_text(path)
    except FileNotFoundError:  # was a traceback; nothing to keep the keys of, so nothing is made
        raise ConfigError(f"--table {path}: no label table there (the nightly run writes it; "
                          "give the path job_submit.lua reads)") from None
    except OSError as exc:  # a name too long, a folder root may not search: one line, not a traceback
        raise ConfigError(f"--table {path}: cannot read it: {exc.strerror}") from None


def _thresholds_line(thresholds: dict[str, float], by_label: dict[str, float]) -> str:
    """``thresholds: compute 0.8, memory 0.9 (own), ...``: the confidence each label needs to act."""
    own = " (min_confidence_by_label)"
    return "confidence needed to act: " + ", ".join(
        f"{label} {value:g}{own if label in by_label else ''}" for label, value in thresholds.items())


_REASONS = {
    "no_table": "no usable label table: the job is left as submitted",
    "exempt_user": "the user is exempt",
    "exempt_account": "the account is exempt",
    "exempt_partition": "every partition the job may run in is exempt",
    "no_gpu_request": "the job asks for no GPU: no cap, no placement",
    "unknown_job": "no label for this user + name, user or account",
    "low_confidence": "the label's confidence is below its label's min_confidence",
    "no_decision": "the policy has no cap or features for this label",
}


#: The table policy's parts a decision depends on (explain compares the file's with the table's).
_TABLE_POLICY_KEYS = ("mode", "min_confidence", "min_confidence_by_label", "decisions", "canary_threshold",
                      "exempt")


def _policy_differences(in_table: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The ``_TABLE_POLICY_KEYS`` in which a table's embedded policy (as parsed) and a policy's
    ``table_dict`` differ. The table leaves out the lines of unset values, so their defaults fill in."""
    written = {"canary_threshold": 0, "min_confidence_by_label": {}, **in_table}
    return [k for k in _TABLE_POLICY_KEYS if written.get(k) != new.get(k)]


def _why_decided(status: str, admin_comment: str | None) -> str:
    """What the Prolog does with a decided job, in words.

    Why not the mode alone: with a ``[canary]`` the arm decides (shadow's canary is capped for
    real, enforce's is the uncapped control), and this is the line an admin reads to judge the
    rollout; ``Comment.capped_for_real`` is the Prolog's own test.
    """
    from wattclass.admincomment import parse_admin_comment

    comment = parse_admin_comment(admin_comment)
    if comment is None or comment.cap is None:
        return f"{status} mode: no cap for this label, the GPUs are not capped"
    if comment.arm == "capped":
        return f"{status} mode, capped arm of the canary: the Prolog caps the job's GPUs"
    if comment.arm == "control":
        return (f"{status} mode, control arm of the canary: decided and logged, the GPUs are not capped"
                + (" (measures what the caps cost)" if status == "enforce" else ""))
    if comment.capped_for_real():
        return "enforce mode: the Prolog caps the job's GPUs"
    return "shadow mode: decided and logged, the GPUs are not capped"


def _policy_explain(args: argparse.Namespace) -> int:
    from wattclass.labeltable import read_label_table
    from wattclass.plugin.decide import decide
    from wattclass.policy import load_policy

    if args.data_root is not None:  # a typo'd root answered "no canary data" for the effect
        from wattclass.argtypes import existing_dir

        existing_dir(args.data_root, "--data-root")
    pol = load_policy(args.policy)
    table = dict(read_label_table(args.table))
    in_use = table.get("policy") or {}
    # The policy file is the sysadmin's current intent; the table's embedded copy may be older.
    table["policy"] = pol.table_dict(in_use.get("features_available") if in_use else None)
    differs = _policy_differences(in_use, table["policy"])
    d = decide(table, args.user, args.name, args.account, args.partition, args.constraint,
               gpu_request=not args.no_gpu)
    why = (_why_decided(d.status, d.admin_comment) if d.status in ("shadow", "enforce")
           else _REASONS.get(d.reason, d.reason))
    data: dict[str, Any] = {**d._asdict(), "why": why, "cap_w": None,
                            "measured_effect": None, "thresholds": pol.effective_thresholds(),
                            "min_confidence_by_label": dict(pol.min_confidence_by_label),
                            "table_policy_differs": differs, "table_mode": in_use.get("mode")}
    if args.gpu_model or args.limits:
        from wattclass.caps import cap_watts, known_limits, parse_cap, parse_limits

        dflt, lo, hi = known_limits(args.gpu_model) if args.gpu_model else parse_limits(args.limits)
        data["gpu_limits_w"] = {"default": dflt, "min": lo, "max": hi, "model": args.gpu_model}
        if d.cap:
            data["cap_w"] = cap_watts(parse_cap(d.cap, "the table's cap"), dflt, lo, hi)
    if args.data_root is not None and d.label and d.cap:
        from wattclass.classifier.cli import load_effects
        from wattclass.classifier.effects import lookup

        eff, origin = load_effects(args.data_root)
        row = lookup(eff, d.label, d.cap)
        data["measured_effect"] = None if row is None else {**row, "origin": origin}

    emit(data, args.json, lambda x: _explain_text(x, args))
    return 0


def _explain_text(x: dict[str, Any], args: argparse.Namespace) -> str:
    """``policy explain``'s lines for a person (``--json`` prints ``x`` itself)."""
    lines = [f"decision: {x['status']} ({x['why']})"]
    if x["table_policy_differs"]:
        lines.append(f"note: this follows {args.policy}; job_submit.lua decides with the policy in "
                     f"{args.table} (mode {x['table_mode'] or '-'}), which differs in "
                     f"{', '.join(x['table_policy_differs'])} until a nightly run or "
                     "`wattclass policy apply` rewrites it")
    if x["label"]:
        own = "min_confidence_by_label" if x["label"] in x["min_confidence_by_label"] else \
            "min_confidence"
        lines.append(f"label: {x['label']} confidence {x['confidence']:.2f} from {x['key']} key "
                     f"(source {x['source']}); {x['label']} needs {x['min_confidence']:g} ({own})")
    if x["cap"]:
        lines.append(f"cap: {x['cap']} (per GPU, of its default limit when a %, clamped to min/max)")
    if x["cap_w"] is not None:
        lim = x["gpu_limits_w"]
        on = lim["model"] or "this GPU"
        lines.append(f"on {on} (default {lim['default']:g} W, min {lim['min']:g} W, "
                     f"max {lim['max']:g} W): {x['cap']} sets {x['cap_w']:g} W")
    if x["admin_comment"]:
        lines.append(f"admin_comment: {x['admin_comment']}")
    lines.append(f"features added: {x['features'] or 'none'}")
    if "arm=" in (x["admin_comment"] or ""):
        arm = x["admin_comment"].rsplit("arm=", 1)[1]
        lines.append(f"canary arm: {arm} (decided from user + UTC day of submission; this run's "
                     f"arm may differ) -> {'capped' if arm == 'capped' else 'NOT capped'} by the Prolog")
    lines.append(_thresholds_line(x["thresholds"], x["min_confidence_by_label"]))
    m = x["measured_effect"]
    if m is not None:
        def ci(k: str) -> str:
            lo, hi = m.get(f"{k}_lo"), m.get(f"{k}_hi")
            band = "" if lo is None or lo != lo else f" [{lo:.3f}, {hi:.3f}]"
            return f"x{m[k]:.3f}{band}"

        lines.append(f"measured on this cluster ({m['origin']}): at {m['cap']} {m['label']} jobs ran "
                     f"{ci('runtime_ratio')} as long and used {ci('energy_ratio')} the energy "
                     f"({m['n_capped']} capped vs {m['n_control']} control runs of {m['n_keys']} "
                     "job keys, 95% intervals)")
    elif args.data_root is not None and x["cap"]:
        lines.append("measured effect: none yet for this label and cap (no canary data)")
    return "\n".join(lines)


def _plugin_check(args: argparse.Namespace) -> int:
    from wattclass.plugin.check import main

    return main(args)


def _hook(args: argparse.Namespace) -> int:
    from wattclass.plugin.prolog import run_hook, setup_log

    setup_log(args.log, stderr=False)  # the CLI already logs to stderr
    return run_hook(args.hook, args)


def _install_lua(args: argparse.Namespace) -> int:
    from wattclass.fsutil import atomic_write_text, check_output_file
    from wattclass.plugin.install import render_job_submit

    # a folder (or a file above the path) was an IsADirectoryError/NotADirectoryError traceback
    check_output_file(args.dest, "--dest")
    _refuse_untrusted_dest(Path(args.dest).parent)
    atomic_write_text(args.dest, render_job_submit(args.table), mode=0o644)
    print(f"wrote {args.dest} (label table {args.table})")
    return 0


def _refuse_untrusted_dest(folder: Path) -> None:
    """ConfigError unless only root can change ``folder`` (or, not made yet, the folder it will be
    made in) and every folder above it. Why: slurmd runs the wrappers as root and slurmctld loads
    job_submit.lua; written where a user can rename or replace them, they run that user's code.
    ``plugin check`` refuses them too, but only if run: the install said "wrote" and went on."""
    from wattclass.fsutil import nearest_existing, refuse_untrusted_dir

    refuse_untrusted_dir(nearest_existing(folder), creates=True)


def _install_hooks(args: argparse.Namespace) -> int:
    from wattclass.fsutil import atomic_write_text, check_output_dir
    from wattclass.plugin.install import render_hook

    check_output_dir(args.dest, "--dest")  # a file there was a NotADirectoryError traceback
    _refuse_untrusted_dest(args.dest)
    for kind in ("prolog", "epilog"):
        dest = args.dest / f"{kind}.sh"
        atomic_write_text(dest, render_hook(kind, args.python, args.hook_args.split()), mode=0o755)
        print(f"wrote {dest}")
    return 0
