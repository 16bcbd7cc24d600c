"""``wattclass simulate`` and ``wattclass calibrate``."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

from wattclass.argtypes import existing_dir, iso_date, non_negative_int, positive_float, positive_int
from wattclass.errors import ConfigError
from wattclass.logsafe import clip
from wattclass.output import emit


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add ``simulate`` and ``calibrate`` to ``wattclass``."""
    from wattclass.gpu import SPEC_HELP
    from wattclass.plugin.prolog import DEFAULT_STATE

    s = sub.add_parser(
        "simulate", help="what-if: energy saved and runtime added had the policy capped past jobs",
        description="For every past job in the telemetry: the energy saved and the runtime added under "
        "the policy's caps, from the job's own measurements (power vs cap, GPM activity) and published "
        "power-cap response curves, or a site calibration (--response). Totals per label, user and "
        "account, with a band (lo/hi).")
    s.add_argument("--data-root", type=Path, required=True)
    s.add_argument("--policy", type=Path, required=True, help="policy TOML (its caps and exemptions)")
    s.add_argument("--from", dest="date_from", type=iso_date, help="first day YYYY-MM-DD (default: all)")
    s.add_argument("--to", dest="date_to", type=iso_date, help="last day YYYY-MM-DD (default: all)")
    s.add_argument("--response", type=Path, help="site calibration file from `wattclass calibrate`")
    s.add_argument("--top", type=positive_int, default=10, help="rows per user/account table (default 10)")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_simulate)

    c = sub.add_parser(
        "calibrate", help="measure each cap's cost and saving on this node's idle GPU (root)",
        description="Runs representative kernels (GEMM, memory stream, mix; or your command) at each cap, "
        "measures wall time and energy, ALWAYS restores the original limit (a cap record lets "
        "`wattclass plugin reconcile` restore it even after kill -9) and writes the response file "
        "`wattclass simulate --response` reads.")
    c.add_argument("--gpu", type=non_negative_int, required=True, help="GPU index")
    c.add_argument("--caps", default="100,85,70,60,50",
                   help="percent of the default limit (default %(default)s)")
    c.add_argument("--workload", default="builtin",
                   help="builtin (PyTorch kernels; simulated ones on a filestate backend) or a command "
                   "run without a shell, timed by wall clock")
    c.add_argument("--backend", default="nvml", help=f"GPU backend: {SPEC_HELP} (default nvml)")
    c.add_argument("--state-dir", type=Path, default=DEFAULT_STATE,
                   help="cap records (the Prolog's; reconcile restores from them)")
    c.add_argument("--repeats", type=positive_int, default=2,
                   help="measured runs per kernel and cap (default 2)")
    c.add_argument("--kernel-seconds", type=positive_float, default=2.0,
                   help="builtin kernels: seconds of work per run at full power (default 2)")
    c.add_argument("--force", action="store_true", help="run even if the GPU has processes")
    c.add_argument("--dry-run", action="store_true",
                   help="every kernel at the current limit; nothing is set (checks the measurement path)")
    c.add_argument("--out", type=Path, required=True, help="response file to write (JSON)")
    c.set_defaults(func=cmd_calibrate)


def _clean(v: Any) -> Any:
    """JSON-safe: a NaN or infinite number as null (standard JSON has neither; Python's json would
    write ``NaN``/``Infinity``, which other parsers refuse), nested dicts and lists likewise."""
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_clean(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def cmd_simulate(args: argparse.Namespace) -> int:
    from wattclass.policy import load_policy
    from wattclass.savings.response import load_response
    from wattclass.savings.simulate import GROUPS, simulate

    existing_dir(args.data_root, "--data-root")  # a typo is a usage error (2), as for the nightly
    if args.date_from and args.date_to and args.date_from > args.date_to:  # ISO days order as text
        raise ConfigError(f"--from {args.date_from} is after --to {args.date_to}")
    policy = load_policy(args.policy)
    response = load_response(args.response) if args.response else None
    res = simulate(args.data_root, policy, args.date_from, args.date_to, response)
    data = _clean({"model": res.model, "files": res.files, "policy": str(args.policy), "totals": res.totals,
                   **{f"by_{g}": res.by[g].to_dict("records") for g in GROUPS}})
    # standard JSON or nothing: a non-finite number left after _clean is a bug, not output
    json.dumps(data, allow_nan=False, default=str)

    def human(d: dict[str, Any]) -> str:
        t = d["totals"]
        lines = [f"what-if under {d['policy']} ({d['model']}; {d['files']} telemetry files)",
                 f"{t['jobs']} jobs, {t['capped_jobs']} capped by the policy: "
                 f"{t['kwh_saved']:.1f} kWh saved [{t['kwh_saved_lo']:.1f}, {t['kwh_saved_hi']:.1f}] of "
                 f"{t['energy_kwh']:.1f} kWh; {t['gpu_hours_added']:.2f} GPU-hours added "
                 f"[{t['gpu_hours_added_lo']:.2f}, {t['gpu_hours_added_hi']:.2f}] to {t['gpu_hours']:.1f}"]
        if t.get("caps_raised_by_neighbours"):
            lines.append(f"{t['caps_raised_by_neighbours']} job(s) on shared GPUs simulated at a "
                         "neighbour's higher cap or none (a GPU runs at the highest cap its jobs allow)")
        if t.get("rejected_rows"):
            lines.append(f"{sum(t['rejected_rows'].values())} impossible telemetry row(s) left out (as the "
                         "nightly does): " + "; ".join(f"{k}: {v}" for k, v in t["rejected_rows"].items()))
        if t.get("skipped_files"):
            lines.append(f"{len(t['skipped_files'])} unreadable telemetry file(s) left out (as the nightly "
                         "does): " + "; ".join(f"{clip(f)}: {clip(why)}"
                                               for f, why in list(t["skipped_files"].items())[:3]))
        for g in GROUPS:
            rows = d[f"by_{g}"][: args.top if g != "label" else None]
            lines += ["", f"{'by ' + g:<14} {'jobs':>6} {'capped':>6} {'kWh':>9} {'kWh saved [lo, hi]':>26} "
                      f"{'GPU-h added [lo, hi]':>26}"]
            for r in rows:
                lines.append(
                    f"{str(r[g])[:14]:<14} {r['jobs']:>6} {r['capped_jobs']:>6} {r['energy_kwh']:>9.1f} "
                    f"{r['kwh_saved']:>8.1f} [{r['kwh_saved_lo']:>6.1f}, {r['kwh_saved_hi']:>6.1f}] "
                    f"{r['gpu_hours_added']:>8.2f} [{r['gpu_hours_added_lo']:>6.2f}, "
                    f"{r['gpu_hours_added_hi']:>6.2f}]")
        return "\n".join(lines)

    emit(data, args.json, human)
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from wattclass.fsutil import check_output_file
    from wattclass.gpu import open_backend
    from wattclass.savings.calibrate import (
        CalibrateOptions,
        calibrate,
        command_workload,
        parse_caps,
        simulated_workloads,
        torch_workloads,
        write_response,
    )

    check_output_file(args.out, "--out")  # before minutes of measuring, not after them
    caps = parse_caps(args.caps)
    if args.backend == "nvml" and not args.dry_run and os.geteuid() != 0:
        raise ConfigError("calibrate sets power limits: run it as root (or use --dry-run)")
    opts = CalibrateOptions(gpu=args.gpu, caps=caps, state_dir=args.state_dir, dry_run=args.dry_run,
                            repeats=args.repeats, force=args.force)
    with open_backend(args.backend) as backend:
        if args.workload != "builtin":
            workloads = [command_workload(args.workload, args.gpu)]
        elif hasattr(backend, "run_simulated"):
            workloads = simulated_workloads(backend, args.gpu)
        else:
            workloads = torch_workloads(args.gpu, args.kernel_seconds)
        doc = calibrate(backend, opts, workloads, on_step=lambda m: print(m, file=sys.stderr, flush=True))
    write_response(doc, args.out)
    print(f"wrote {args.out} ({'dry run, nothing set' if args.dry_run else 'limit restored to '}"
          f"{'' if args.dry_run else str(doc['original_w']) + ' W'})")
    return 0
