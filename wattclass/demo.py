"""``wattclass demo``: the whole flow offline, on real H200 data bundled in the package.

A sysadmin must see wattclass work in a minute on a laptop with no GPU and no Slurm. The demo:

1. builds a small cluster (nodes x GPUs, a few hundred jobs, several users) spliced from the
   recorded H200 workloads (``wattclass.democluster``);
2. replays each node through the REAL telemetry daemon (``wattclass telemetry run --backend
   replay:DIR --once``) into Parquet under ``<out>/data``;
3. runs the nightly classification (``wattclass nightly``): labels, model, label table;
4. applies the policy to a batch of NEW submissions as the job_submit hook would decide;
5. writes the report (``wattclass report``);
6. prints where everything is.

Components are called through their CLI entry points (``wattclass.cli.main``), the loosest
coupling: a step whose component is not in this build is shown as unavailable and the steps that
need its output are skipped, so the demo says exactly what is missing instead of failing halfway.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from wattclass.errors import WattclassError


class StepUnavailable(Exception):
    """The component a step needs is not part of this build (its subcommand is not registered)."""


@dataclass
class Progress:
    """One line per step: ``[2/6] Replaying telemetry ... done in 3.1 s: 115200 samples``."""

    total: int
    stream: TextIO = field(default_factory=lambda: sys.stdout)
    clock: Callable[[], float] = time.monotonic
    n: int = 0

    def run(self, title: str, fn: Callable[[], str]) -> tuple[str, str]:
        """Run one step; returns (status, detail) with status ok | unavailable | failed."""
        self.n += 1
        self.stream.write(f"[{self.n}/{self.total}] {title} ... ")
        self.stream.flush()
        t0 = self.clock()
        try:
            detail = fn()
        except StepUnavailable as exc:
            self.stream.write(f"unavailable: {exc}\n")
            return "unavailable", str(exc)
        except WattclassError as exc:
            self.stream.write(f"FAILED: {exc}\n")
            return "failed", str(exc)
        self.stream.write(f"done in {self.clock() - t0:.1f} s: {detail}\n")
        return "ok", detail

    def skip(self, title: str, why: str) -> None:
        self.n += 1
        self.stream.write(f"[{self.n}/{self.total}] {title} ... skipped ({why})\n")


def available_commands() -> set[str]:
    """Subcommands registered in this build (components add theirs when they are installed)."""
    from wattclass.cli import build_parser

    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return set(action.choices)
    return set()


def run_cli(argv: Sequence[str]) -> str:
    """Run a wattclass subcommand in-process, capturing its output; raise on a non-zero exit."""
    from wattclass.cli import main

    if argv[0] not in available_commands():
        raise StepUnavailable(f"`wattclass {argv[0]}` is not in this build")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(list(argv))
        except SystemExit as exc:  # argparse usage errors
            rc = int(exc.code or 0)
    if rc != 0:
        raise WattclassError(f"`wattclass {' '.join(argv)}` exited {rc}: {err.getvalue().strip()[-500:]}")
    return out.getvalue().strip()


@dataclass(frozen=True)
class DemoPaths:
    """Where the demo writes; everything under one folder the user chose."""

    out: Path

    @property
    def cluster(self) -> Path:
        return self.out / "cluster"

    @property
    def data_root(self) -> Path:
        return self.out / "data"

    @property
    def label_table(self) -> Path:
        return self.out / "labels.lua"

    @property
    def decisions(self) -> Path:
        return self.data_root / "decisions.csv"

    @property
    def report(self) -> Path:
        return self.out / "report.html"


def run_demo(out: Path, stream: TextIO | None = None, spec: Any = None) -> dict[str, tuple[str, str]]:
    """Run every step; returns {step: (status, detail)}. See the module docstring."""
    from wattclass.democluster import ClusterManifest, ClusterSpec, build_cluster, bundled_raw_dir

    paths = DemoPaths(Path(out))
    progress = Progress(total=5, stream=stream or sys.stdout)
    results: dict[str, tuple[str, str]] = {}
    manifest: list[ClusterManifest] = []

    def cluster() -> str:
        m = build_cluster(bundled_raw_dir(), paths.cluster, spec or ClusterSpec())
        manifest.append(m)
        per_node = m.n_gpus // len(m.hosts)
        return f"{m.n_jobs} jobs on {len(m.hosts)} nodes x {per_node} GPUs, {m.n_samples} samples"

    results["cluster"] = progress.run("Building a demo cluster from the recorded H200 workloads", cluster)
    if results["cluster"][0] != "ok":
        return results
    m = manifest[0]

    def telemetry() -> str:
        # One daemon run per node over its replay folder. Wiring to finish after the telemetry
        # branch merges: the host name comes from the replay caps ("host") or a --host option.
        for host, node_dir in m.node_dirs.items():
            run_cli(
                [
                    "telemetry",
                    "run",
                    "--backend",
                    f"replay:{node_dir}",
                    "--data-root",
                    str(paths.data_root),
                    "--once",
                ]
            )
            del host
        files = list((paths.data_root / "telemetry").glob("date=*/host=*/*.parquet"))
        return f"{len(files)} Parquet files under {paths.data_root / 'telemetry'}"

    results["telemetry"] = progress.run("Replaying every node through the telemetry daemon", telemetry)

    if results["telemetry"][0] == "ok":

        def nightly() -> str:
            # Wiring to finish after the classifier branch merges (flag names are its contract).
            return run_cli(
                [
                    "nightly",
                    "--data-root",
                    str(paths.data_root),
                    "--jobs",
                    str(m.jobs_file),
                    "--label-table",
                    str(paths.label_table),
                ]
            ).splitlines()[-1:][0]

        results["nightly"] = progress.run("Nightly: labels, model, label table", nightly)
    else:
        progress.skip("Nightly: labels, model, label table", "needs telemetry")
        results["nightly"] = ("skipped", "needs telemetry")

    if results["nightly"][0] == "ok":

        def decide() -> str:
            # Wiring to finish after the plugin branch merges: decide each row of submissions.csv
            # against the label table and the example policy as job_submit.lua would, and write
            # job_id,label,decision,cap to paths.decisions (the report reads it).
            run_cli(
                [
                    "decide",
                    "--submissions",
                    str(m.submissions_file),
                    "--label-table",
                    str(paths.label_table),
                    "--out",
                    str(paths.decisions),
                ]
            )
            return f"decisions in {paths.decisions}"

        results["decide"] = progress.run("Policy decisions for new submissions", decide)
    else:
        progress.skip("Policy decisions for new submissions", "needs the label table")
        results["decide"] = ("skipped", "needs the label table")

    if results["telemetry"][0] == "ok":
        results["report"] = progress.run(
            "Writing the report",
            lambda: run_cli(["report", "--data-root", str(paths.data_root), "--out", str(paths.report)]),
        )
    else:
        progress.skip("Writing the report", "needs telemetry")
        results["report"] = ("skipped", "needs telemetry")
    return results


def _summary(paths: DemoPaths, results: dict[str, tuple[str, str]]) -> str:
    lines = ["", "Outputs:"]
    lines.append(f"  demo cluster (replay folders, jobs.csv): {paths.cluster}")
    if results.get("telemetry", ("",))[0] == "ok":
        lines.append(f"  telemetry (Parquet):                     {paths.data_root / 'telemetry'}")
    if results.get("nightly", ("",))[0] == "ok":
        lines.append(f"  label table (Lua, for job_submit.lua):   {paths.label_table}")
    if results.get("decide", ("",))[0] == "ok":
        lines.append(f"  policy decisions:                        {paths.decisions}")
    if results.get("report", ("",))[0] == "ok":
        lines.append(f"  report (open in a browser):              {paths.report}")
    missing = [k for k, (st, _) in results.items() if st != "ok"]
    if missing:
        lines.append(f"Incomplete: {', '.join(missing)} did not run (see above).")
    return "\n".join(lines)


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add ``wattclass demo``."""
    p = sub.add_parser(
        "demo",
        help="run the whole flow offline on bundled H200 data (no GPU, no Slurm)",
        description="Build a small cluster from real recorded H200 workloads, replay it through the "
        "telemetry daemon, classify, decide caps for new submissions and write the report.",
    )
    p.add_argument("--out", type=Path, default=Path("wattclass-demo"), help="folder for every output")
    p.set_defaults(func=_cmd_demo)


def _cmd_demo(args: argparse.Namespace) -> int:
    from wattclass.fsutil import ensure_writable_dir

    out = ensure_writable_dir(args.out, "--out")
    t0 = time.monotonic()
    results = run_demo(out)
    print(_summary(DemoPaths(out), results))
    print(f"Total {time.monotonic() - t0:.1f} s.")
    return 0 if all(st == "ok" for st, _ in results.values()) else 1
