"""``wattclass demo``: the whole flow offline, on real H200 data bundled in the package.

A sysadmin must see wattclass work in a minute on a laptop with no GPU and no Slurm. The demo:

1. builds a small cluster (nodes x GPUs, a few hundred jobs, several users) spliced from the
   recorded H200 workloads (``wattclass.demo.cluster``);
2. replays each node through the REAL telemetry daemon (``wattclass telemetry run --backend
   replay:DIR --once --host NODE``) into Parquet under ``<out>/data/telemetry``;
3. runs the nightly classification (``wattclass nightly --jobs-file ... --policy
   deploy/policy.example.toml``): label store, model registry, the Lua label table;
4. decides each NEW submission with ``wattclass.plugin.decide`` -- the Python mirror of
   job_submit.lua, kept identical by tests/test_plugin_decide.py -- reading the label table the
   nightly run wrote, exactly as the hook reads it;
5. calibrates a simulated GPU (``wattclass calibrate`` on the file-state backend, whose GPUs respond
   to caps) and runs the what-if (``wattclass simulate``, default model and the calibration);
6. adds a generated canary period with KNOWN injected effects to the label store and measures them
   (``wattclass effects``): the report shows the recovered effect next to the injected one;
7. writes the report (``wattclass report --policy``: per-user and per-account tables, caps,
   the what-if);
8. shows the day's largest job at a glance (``wattclass job JOBID``, seff/jobstats style).

Steps 2, 3 and 5 go through the components' CLI entry points in-process, so the demo exercises
the same option names a site types. A failed step stops the steps that need its output and the
demo says which, instead of failing halfway.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from wattclass.errors import ConfigError, WattclassError

#: File that marks a folder as demo output, so a rerun may clear it (and nothing else).
MARKER = ".wattclass-demo"
#: The demo's own outputs inside ``--out`` (cleared on a rerun).
_OWNED = ("cluster", "data", "spool", "labels.tsv", "report.html", "summary.json", "gpus.json",
          "gpus.json.lock", "caps", "response.json", "canary_truth.json")


@dataclass
class Progress:
    """One line per step: ``[2/5] Replaying telemetry ... done in 3.1 s: 8 Parquet files``."""

    total: int
    stream: TextIO = field(default_factory=lambda: sys.stdout)
    clock: Callable[[], float] = time.monotonic
    n: int = 0

    def run(self, title: str, fn: Callable[[], str]) -> tuple[str, str]:
        """Run one step; returns (status, detail) with status ok | failed."""
        self.n += 1
        self.stream.write(f"[{self.n}/{self.total}] {title} ... ")
        self.stream.flush()
        t0 = self.clock()
        try:
            detail = fn()
        except WattclassError as exc:
            self.stream.write(f"FAILED: {exc}\n")
            return "failed", str(exc)
        self.stream.write(f"done in {self.clock() - t0:.1f} s: {detail}\n")
        return "ok", detail

    def tick(self, text: str) -> None:
        """Show progress inside a long step (e.g. each node replayed)."""
        self.stream.write(text)
        self.stream.flush()

    def skip(self, title: str, why: str) -> None:
        self.n += 1
        self.stream.write(f"[{self.n}/{self.total}] {title} ... skipped ({why})\n")


@contextlib.contextmanager
def _keep_signal_handlers() -> Iterator[None]:
    """The daemon's CLI installs SIGTERM/SIGINT/SIGHUP handlers for its own loop; restore ours after."""
    from wattclass.telemetry.stopsignal import STOP_SIGNALS

    saved = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in saved.items():
            signal.signal(s, h)


@contextlib.contextmanager
def _quiet_logs() -> Iterator[None]:
    """Components log progress at INFO; the demo shows its own progress, so only warnings pass."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        root.setLevel(level)


def run_cli(argv: Sequence[str]) -> str:
    """Run a wattclass subcommand in-process, capturing its output; raise on a non-zero exit."""
    from wattclass.cli import main

    out, err = io.StringIO(), io.StringIO()
    with (_keep_signal_handlers(), _quiet_logs(),
          contextlib.redirect_stdout(out), contextlib.redirect_stderr(err)):
        try:
            rc = main(["-q", *argv])
        except SystemExit as exc:  # argparse usage errors
            rc = int(exc.code or 0)
    if rc != 0:
        msg = err.getvalue().strip().removeprefix("wattclass: error: ")[-500:]
        raise WattclassError(f"`wattclass {' '.join(argv)}` exited {rc}: {msg}")
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
    def spool(self) -> Path:
        """An empty Prolog spool: replayed jobs come from the recording, never a real /run spool."""
        return self.out / "spool"

    @property
    def label_table(self) -> Path:
        return self.out / "labels.tsv"

    @property
    def decisions(self) -> Path:
        return self.data_root / "decisions.csv"

    @property
    def report(self) -> Path:
        return self.out / "report.html"

    @property
    def summary(self) -> Path:
        return self.out / "summary.json"

    @property
    def gpus(self) -> Path:
        """File-state GPUs that respond to caps (calibrate's simulated GPU)."""
        return self.out / "gpus.json"

    @property
    def response(self) -> Path:
        return self.out / "response.json"

    @property
    def canary_truth(self) -> Path:
        return self.out / "canary_truth.json"


def _policy_path() -> Path:
    """deploy/policy.example.toml, shipped inside the package (``wattclass.deploy``)."""
    import wattclass.deploy as deploy_pkg

    p = Path(deploy_pkg.__file__).resolve().parent / "policy.example.toml"
    if not p.is_file():
        raise ConfigError(f"{p}: the example policy is missing from this installation")
    return p


def prepare_out(out: Path) -> Path:
    """Make ``out`` ready: new or empty, or a previous demo's output (whose parts are cleared).

    Refuses any other non-empty folder, so a mistyped --out never deletes someone's files.
    """
    from wattclass.fsutil import check_output_dir, ensure_writable_dir

    out = check_output_dir(Path(out), "--out")  # a file there (or above) was a NotADirectoryError
    if out.exists() and any(out.iterdir()):
        if not (out / MARKER).is_file():
            raise ConfigError(f"--out {out}: folder is not empty and is not a previous demo's output")
        for name in _OWNED:
            p = out / name
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            elif p.exists() or p.is_symlink():
                p.unlink()
    out = ensure_writable_dir(out, "--out")
    (out / MARKER).write_text("written by `wattclass demo`; a rerun clears this folder's demo outputs\n")
    return out


def write_decisions(table_path: Path, submissions: Path, out: Path) -> Any:
    """Decide every row of ``submissions`` as job_submit.lua would with the table at ``table_path``.

    Returns the decisions DataFrame (also written to ``out`` as CSV).
    """
    import pandas as pd

    from wattclass.fsutil import atomic_write_text
    from wattclass.labeltable import read_label_table
    from wattclass.plugin.decide import decide

    table = read_label_table(table_path)
    subs = pd.read_csv(submissions, dtype=str, keep_default_na=False)
    rows = []
    for s in subs.to_dict("records"):
        d = decide(table, s["user"], s["name"], s.get("account") or None, s.get("partition") or None, None)
        rows.append({"job_id": s["job_id"], "user": s["user"], "name": s["name"],
                     "account": s.get("account"), "partition": s.get("partition"), **d._asdict()})
    df = pd.DataFrame(rows)
    atomic_write_text(out, df.to_csv(index=False))
    return df


# long: the five demo steps in order, each a short closure, so the flow reads as the README tells it
def run_demo(out: Path, stream: TextIO | None = None, spec: Any = None) -> dict[str, tuple[str, str]]:
    """Run every step; returns {step: (status, detail)}. See the module docstring."""
    from wattclass.demo.cluster import ClusterManifest, ClusterSpec, build_cluster, bundled_raw_dir

    paths = DemoPaths(Path(out))
    progress = Progress(total=8, stream=stream or sys.stdout)
    results: dict[str, tuple[str, str]] = {}
    manifest: list[ClusterManifest] = []
    nightly_summary: dict[str, Any] = {}

    def cluster() -> str:
        m = build_cluster(bundled_raw_dir(), paths.cluster, spec or ClusterSpec())
        manifest.append(m)
        per_node = m.n_gpus // len(m.hosts)
        users = len(set(_read_csv_column(m.jobs_file, "user")))
        return (f"{m.n_jobs} jobs of {users} users on {len(m.hosts)} nodes x {per_node} GPUs, "
                f"{m.n_samples} one-second samples")

    results["cluster"] = progress.run("Building a demo cluster from the recorded H200 workloads", cluster)
    if results["cluster"][0] != "ok":
        for title, key in (("Telemetry", "telemetry"), ("Nightly", "nightly"), ("Decisions", "decide"),
                           ("Calibration and what-if", "whatif"), ("Canary", "canary"), ("Report", "report"),
                           ("One job", "job")):
            progress.skip(title, "needs the cluster")
            results[key] = ("skipped", "needs the cluster")
        return results
    m = manifest[0]
    date = m.start.strftime("%Y-%m-%d")

    def telemetry() -> str:
        paths.spool.mkdir(parents=True, exist_ok=True)
        for host, node_dir in m.node_dirs.items():
            progress.tick(f"{host} ")
            run_cli(["telemetry", "run", "--backend", f"replay:{node_dir}", "--once", "--host", host,
                     "--data-root", str(paths.data_root), "--spool", str(paths.spool)])
        files = sorted((paths.data_root / "telemetry").glob("date=*/host=*/*.parquet"))
        if not files:
            raise WattclassError(f"{paths.data_root / 'telemetry'}: the daemon wrote no Parquet files")
        return f"{len(files)} Parquet files under {paths.data_root / 'telemetry'}"

    results["telemetry"] = progress.run("Replaying every node through the telemetry daemon", telemetry)

    def nightly() -> str:
        text = run_cli(["nightly", "--data-root", str(paths.data_root), "--date", date,
                        "--jobs-file", str(m.jobs_file), "--policy", str(_policy_path()),
                        "--table-out", str(paths.label_table), "--json"])
        s = json.loads(text)
        nightly_summary.update(s)
        if s.get("status") != "ok":
            raise WattclassError(f"nightly: {s.get('message', s.get('status'))}")
        by = ", ".join(f"{v['jobs']} {k}" for k, v in s["by_label"].items() if v["jobs"])
        src = ", ".join(f"{n} by {'the GPM rule' if k == 'rule' else k}"
                        for k, n in sorted(s.get("by_source", {}).items()))
        return f"{s['jobs']} jobs labelled ({by}; {src}); table of {s['table']['entries']} keys"

    if results["telemetry"][0] == "ok":
        results["nightly"] = progress.run("Nightly: labels, model, label table", nightly)
    else:
        progress.skip("Nightly: labels, model, label table", "needs telemetry")
        results["nightly"] = ("skipped", "needs telemetry")

    def decisions() -> str:
        df = write_decisions(paths.label_table, m.submissions_file, paths.decisions)
        counts = df["reason"].value_counts()
        return f"{len(df)} submissions: " + ", ".join(f"{n} {r}" for r, n in counts.items())

    if results["nightly"][0] == "ok":
        results["decide"] = progress.run("Policy decisions for new submissions (as job_submit.lua)",
                                         decisions)
    else:
        progress.skip("Policy decisions for new submissions", "needs the label table")
        results["decide"] = ("skipped", "needs the label table")

    def whatif() -> str:
        return calibrate_and_simulate(paths)

    def canary() -> str:
        return canary_period(paths, date)

    for key, title, fn, needs in (
            ("whatif", "Calibrating a simulated GPU; what-if of the policy", whatif, "telemetry"),
            ("canary", "Canary period with injected effects: measured effect", canary, "nightly")):
        if results[needs][0] == "ok":
            results[key] = progress.run(title, fn)
        else:
            progress.skip(title, f"needs {needs}")
            results[key] = ("skipped", f"needs {needs}")

    if results["telemetry"][0] == "ok":
        truth = ["--effects-truth", str(paths.canary_truth)] if paths.canary_truth.is_file() else []
        results["report"] = progress.run(
            "Writing the report",
            lambda: run_cli(["report", "--data-root", str(paths.data_root), "--date", date,
                             "--out", str(paths.report), "--title", "wattclass demo report",
                             "--policy", str(_policy_path()), *truth]),
        )
    else:
        progress.skip("Writing the report", "needs telemetry")
        results["report"] = ("skipped", "needs telemetry")

    def one_job() -> str:
        import pandas as pd

        labels = pd.read_parquet(paths.data_root / "classifier" / "labels" / f"date={date}")
        job_id = str(labels.sort_values("energy_j", ascending=False)["job_id"].iloc[0])
        text = run_cli(["job", job_id, "--data-root", str(paths.data_root)])
        return "wattclass job " + job_id + "\n" + "\n".join("      " + ln for ln in text.strip().splitlines())

    if results["nightly"][0] == "ok":
        results["job"] = progress.run("The day's largest job at a glance", one_job)
    else:
        progress.skip("The day's largest job at a glance", "needs the label store")
        results["job"] = ("skipped", "needs the label store")
    if nightly_summary:
        from wattclass.fsutil import atomic_write_text

        atomic_write_text(paths.summary, json.dumps(
            {"steps": {k: {"status": s, "detail": d} for k, (s, d) in results.items()},
             "nightly": nightly_summary}, indent=1, default=str) + "\n")
    return results


def calibrate_and_simulate(paths: DemoPaths) -> str:
    """``wattclass calibrate`` on a simulated GPU, then ``wattclass simulate`` with and without it."""
    from wattclass.gpu.filestate import FileStateBackend

    FileStateBackend.create(paths.gpus, n=1, simulate=True)
    run_cli(["calibrate", "--gpu", "0", "--backend", f"filestate:{paths.gpus}", "--caps", "100,85,70,60,50",
             "--state-dir", str(paths.out / "caps"), "--repeats", "1", "--out", str(paths.response)])
    base = ["simulate", "--data-root", str(paths.data_root), "--policy", str(_policy_path()), "--json"]
    model = json.loads(run_cli(base))["totals"]
    site = json.loads(run_cli([*base, "--response", str(paths.response)]))["totals"]
    return (f"response file {paths.response.name}; what-if of the example policy: "
            f"{model['kwh_saved']:.2f} kWh saved [{model['kwh_saved_lo']:.2f}, {model['kwh_saved_hi']:.2f}] "
            f"of {model['energy_kwh']:.2f} by the default model, {site['kwh_saved']:.2f} by the calibration")


def canary_period(paths: DemoPaths, date: str) -> str:
    """A generated canary period (known effects) in the label store, measured with ``wattclass effects``.

    The three weeks before the demo day; the truth goes to canary_truth.json for the report.
    """
    import datetime as dt

    from wattclass.classifier.canary_history import DEFAULT_TRUTH, generate_history
    from wattclass.classifier.store import ClassifierStore
    from wattclass.fsutil import atomic_write_text

    day = dt.datetime.fromisoformat(date).replace(tzinfo=dt.UTC)
    hist = generate_history(start=day - dt.timedelta(days=25), days=21, seed=11)
    store = ClassifierStore(paths.data_root)
    for d, part in hist.groupby("date"):
        if str(d) < date:
            store.write_labels(str(d), part.drop(columns=["date"]).assign(source="canary-demo"))
    rows = json.loads(run_cli(["effects", "--data-root", str(paths.data_root), "--recompute", "--json"]))
    import pandas as pd

    store.write_effects(date, pd.DataFrame(rows))  # as the nightly run stores them
    atomic_write_text(paths.canary_truth, json.dumps(
        {f"{lab}/{cap}": list(v) for (lab, cap), v in DEFAULT_TRUTH.items()}, indent=1) + "\n")
    def one(r: dict[str, Any]) -> str:
        rt, en = DEFAULT_TRUTH[(r["label"], r["cap"])]
        return (f"{r['label']} at {r['cap']}: runtime x{r['runtime_ratio']:.3f} (injected x{rt}), "
                f"energy x{r['energy_ratio']:.3f} (injected x{en})")

    return "; ".join(one(r) for r in rows)


def _read_csv_column(path: Path, col: str) -> list[str]:
    import pandas as pd

    return pd.read_csv(path, dtype=str, usecols=[col])[col].tolist()


def _summary(paths: DemoPaths, results: dict[str, tuple[str, str]]) -> str:
    ok = {k for k, (st, _) in results.items() if st == "ok"}
    lines = ["", "Outputs:"]
    rows = [
        ("cluster", "demo cluster (replay folders, jobs.csv, truth.csv)", paths.cluster),
        ("telemetry", "telemetry (Parquet, 10 s windows)", paths.data_root / "telemetry"),
        ("nightly", "labels, models, nightly summary", paths.data_root / "classifier"),
        ("nightly", "label table (data, read by job_submit.lua)", paths.label_table),
        ("decide", "policy decisions for new submissions", paths.decisions),
        ("whatif", "response file of the simulated GPU (calibrate)", paths.response),
        ("canary", "injected canary effects (truth)", paths.canary_truth),
        ("report", "report: open in a browser", paths.report),
    ]
    for step, what, where in rows:
        if step in ok:
            lines.append(f"  {what + ':':<52}{where}")
    if "nightly" in ok:
        lines.append(f"One job at a glance:  wattclass job JOBID --data-root {paths.data_root}")
        lines.append(f"Explain one decision: wattclass policy explain --policy {_policy_path()} "
                     f"--table {paths.label_table} --user alice --name train_llm.sh --account llm")
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
    p.add_argument("--out", type=Path, default=Path("wattclass-demo"),
                   help="folder for every output (default ./wattclass-demo; a rerun replaces it)")
    p.set_defaults(func=_cmd_demo)


def _cmd_demo(args: argparse.Namespace) -> int:
    out = prepare_out(args.out)
    t0 = time.monotonic()
    results = run_demo(out)
    print(_summary(DemoPaths(out), results))
    print(f"Total {time.monotonic() - t0:.1f} s.")
    return 0 if all(st == "ok" for st, _ in results.values()) else 1
