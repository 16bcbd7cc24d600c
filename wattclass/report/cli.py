"""``wattclass report`` on the command line; the work is in ``wattclass.report.build``.

Kept apart from the report code so that registering the subcommand imports neither pandas nor
matplotlib: every ``wattclass`` command builds the whole parser, the node daemon included, and
the daemon must stay light (issue 15).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from wattclass.argtypes import existing_dir, iso_date


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add ``wattclass report``."""
    p = sub.add_parser(
        "report",
        help="write the daily report (one self-contained HTML file)",
        description="Plots of energy, labels, power, estimated useful work, model accuracy, policy "
        "decisions and estimated savings, from a data root, as one HTML file with inline images.",
    )
    p.add_argument("--data-root", type=Path, required=True, help="root holding telemetry/date=.../host=.../")
    p.add_argument("--date", type=iso_date, help="day to report (YYYY-MM-DD; default: the most recent day)")
    p.add_argument("--days", type=int, default=1,
                   help="report this many days ending at --date (default 1; e.g. 30 for a month)")
    p.add_argument("--out", type=Path, default=Path("report.html"), help="HTML file to write")
    p.add_argument(
        "--labels",
        type=Path,
        help="job labels CSV/Parquet (default: the nightly label store "
        "<root>/classifier/labels/date=D/, else the GPM rule on the telemetry)",
    )
    p.add_argument("--label-column", default="label", help="column of --labels holding the label")
    p.add_argument(
        "--metrics",
        type=Path,
        help="model registry.json, model.json or metrics JSON "
        "(default: <root>/classifier/models/registry.json, the model in use)",
    )
    p.add_argument(
        "--decisions", type=Path, help="policy decisions CSV/Parquet (default: <root>/decisions.csv)"
    )
    p.add_argument("--title", help="page title")
    p.add_argument(
        "--policy",
        type=Path,
        help="policy TOML: its caps for the savings estimate and the capped shares (default: the caps "
        "seen in the decisions, else the example policy deploy/policy.example.toml), and the what-if "
        "section (wattclass simulate over the reported days)",
    )
    p.add_argument("--response", type=Path, help="with --policy: a site calibration (wattclass calibrate)")
    p.add_argument("--effects-truth", type=Path,
                   help="JSON {\"label/cap\": [runtime, energy]} of injected effects, shown next to the "
                   "measured ones (generated histories, the demo)")
    p.set_defaults(func=_cmd_report)
    register_job(sub)


def _cmd_report(args: argparse.Namespace) -> int:
    from wattclass.errors import ConfigError
    from wattclass.fsutil import check_output_file
    from wattclass.report.build import load_inputs, load_whatif_effects, write_report

    existing_dir(args.data_root, "--data-root")  # a typo is a usage error (2), as for the nightly
    check_output_file(args.out, "--out")
    if args.response is not None and args.policy is None:  # it was read by nothing, silently
        raise ConfigError(f"--response {args.response}: needs --policy (the calibration is used only by "
                          "the what-if section, which runs the policy's caps)")
    inputs = load_inputs(
        args.data_root, args.date, args.labels, args.label_column, args.metrics, args.decisions, args.days
    )
    inputs.whatif_effects = load_whatif_effects(args.data_root, inputs.date, args.policy, args.response,
                                                args.effects_truth, inputs.provenance, inputs.first_date)
    path = write_report(inputs, args.out, args.title, args.policy)
    print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB)")
    return 0


def register_job(sub: argparse._SubParsersAction[Any]) -> None:
    """Add ``wattclass job``."""
    p = sub.add_parser(
        "job",
        help="one job at a glance: label, energy, GPU-hours, power, cap and decision, a hint",
        description="Summarise one job from a data root (seff/jobstats style): the label (confidence, "
        "source, inputs), measured energy, GPU-hours, mean power per GPU, the power cap it ran under "
        "(W and %), the policy decision and its reason, and a one-line hint for the job's owner.",
    )
    p.add_argument("job_id", metavar="JOBID", help="Slurm job id (array tasks as 123_4)")
    p.add_argument("--data-root", type=Path, default=Path("."), help="data root (default .)")
    p.add_argument("--date", type=iso_date, help="YYYY-MM-DD to search when the job is in neither the "
                   "label store nor the job records (otherwise every day is scanned)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_cmd_job)


def _cmd_job(args: argparse.Namespace) -> int:
    import dataclasses

    from wattclass.output import emit
    from wattclass.report.job import human, summarise

    existing_dir(args.data_root, "--data-root")
    s = summarise(args.data_root, str(args.job_id).strip(), args.date)
    emit(dataclasses.asdict(s), args.json, human)
    return 0
