"""``wattclass telemetry run`` (the node daemon) and ``wattclass telemetry inspect``."""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import threading
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add this component's subcommands to ``wattclass``."""
    p = sub.add_parser("telemetry", help="node telemetry daemon: GPU polls -> 10 s windows -> Parquet")
    tsub = p.add_subparsers(dest="telemetry_command", metavar="ACTION")

    run = tsub.add_parser(
        "run",
        help="poll every GPU each second and write exact per-job windows to Parquet",
        description=(
            "Poll every GPU each --poll seconds, close a window per GPU and job every --period "
            "seconds (aligned to the clock), append each closed window to a write-ahead log "
            "(fsynced) and roll the log into Parquet under DATA_ROOT/telemetry/date=.../host=.../ "
            "every --roll-seconds and at exit. SIGTERM/SIGINT flush and exit 0."
        ),
    )
    run.add_argument("--backend", default="nvml", help="nvml (default) | replay:DIR | filestate:PATH")
    run.add_argument("--data-root", required=True, type=Path, help="where Parquet files go")
    run.add_argument("--period", type=float, default=10.0, help="window length, seconds (default 10)")
    run.add_argument("--poll", type=float, default=1.0, help="poll interval, seconds (default 1)")
    run.add_argument("--host", default=None, help="host name in the rows (default: this host's name)")
    run.add_argument("--spool", type=Path, default=None,
                     help="folder of Prolog-written GPU->job files (default /run/wattclass/jobs "
                          "if it exists); without a file the GPU's process list is used")
    run.add_argument("--wal-dir", type=Path, default=None,
                     help="write-ahead log folder, on local disk (default DATA_ROOT/wal/HOST)")
    run.add_argument("--roll-seconds", type=float, default=3600.0,
                     help="roll the WAL into Parquet this often (default 3600)")
    run.add_argument("--once", action="store_true",
                     help="replay: play the whole recording as fast as possible, flush, exit")
    run.add_argument("--speed", type=float, default=1.0, help="replay speed in real-time mode (default 1)")
    run.add_argument("--metrics-port", type=int, default=None,
                     help="serve Prometheus metrics (energy, power, labels, daemon health) on this port")
    run.add_argument("--metrics-bind", default=None, metavar="ADDR",
                     help="address the metrics endpoint listens on (default 127.0.0.1: it names each "
                     "GPU's job and user, which Slurm's PrivateData hides; give 0.0.0.0 or the node's "
                     "address only where Prometheus scrapes over a trusted network, docs/admin.md)")
    run.add_argument("--proc-root", type=Path, default=Path("/proc"), help=argparse.SUPPRESS)
    run.set_defaults(func=cmd_run)

    insp = tsub.add_parser("inspect", help="summarise telemetry Parquet: rows, GPUs, jobs, energy")
    insp.add_argument("path", type=Path, help="a Parquet file or a folder of them (e.g. DATA_ROOT/telemetry)")
    insp.add_argument("--json", action="store_true", help="print JSON")
    insp.set_defaults(func=cmd_inspect)
    p.set_defaults(func=lambda a: (p.print_help(), 2)[1])


def cmd_run(args: argparse.Namespace) -> int:
    from wattclass.errors import ConfigError
    from wattclass.gpu import open_backend
    from wattclass.jobmap import DEFAULT_SPOOL
    from wattclass.telemetry.daemon import Daemon, DaemonConfig
    from wattclass.telemetry.metrics import DEFAULT_BIND, LatestWindows, serve

    spec = str(args.backend)
    options: dict[str, object] = {}
    if args.metrics_bind is not None and args.metrics_port is None:
        raise ConfigError("--metrics-bind needs --metrics-port")
    if spec.startswith("replay:"):
        options = {"realtime": not args.once, "speed": args.speed}
    elif args.once:
        raise ConfigError("--once only makes sense with --backend replay:DIR")
    spool = args.spool
    if spool is None and DEFAULT_SPOOL.is_dir():
        spool = DEFAULT_SPOOL
    cfg = DaemonConfig(
        data_root=args.data_root,
        host=args.host or socket.gethostname().split(".")[0],
        period_s=args.period,
        poll_s=args.poll,
        wal_dir=args.wal_dir,
        roll_s=args.roll_seconds,
        once=args.once,
        job_spool=spool,
        proc_root=args.proc_root,
    )
    stop = threading.Event()
    # Fail on an unwritable data root before touching the GPUs.
    from wattclass.fsutil import ensure_writable_dir

    ensure_writable_dir(Path(cfg.data_root) / "telemetry", "data root")
    backend = open_backend(spec, **options)
    collector = LatestWindows() if args.metrics_port is not None else None
    with backend:
        daemon = Daemon(backend, cfg, collector=collector, stop=stop)

        def on_signal(signum: int, _frame: object) -> None:
            log.info("signal %d: flushing and stopping", signum)
            stop.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        if collector is not None:
            bind = args.metrics_bind or DEFAULT_BIND
            serve(int(args.metrics_port), collector, bind)
            log.info("metrics on http://%s:%d/metrics", bind, args.metrics_port)
        rc = daemon.run()
    s = daemon.stats
    log.info("done: %d rows, %.1f J, %d GPU error(s)", s.rows, s.energy_j, s.gpu_errors)
    return rc


def summarize(path: Path) -> dict[str, Any]:
    """Rows, GPUs, jobs and energy of a telemetry file or folder."""
    import pyarrow.dataset as ds

    from wattclass.errors import DataError
    from wattclass.schema import conform

    if not path.exists():
        raise DataError(f"{path}: no such file or folder")
    files = [path] if path.is_file() else sorted(
        p for p in path.rglob("*.parquet") if not p.name.startswith(".")
    )
    if not files:
        raise DataError(f"{path}: no Parquet files")
    table = conform(ds.dataset([str(f) for f in files], format="parquet").to_table(), path)
    df = table.to_pandas()
    jobs = (
        df[df.job_id.notna()].groupby("job_id").agg(
            user=("user", "first"), windows=("energy_j", "size"), energy_j=("energy_j", "sum"),
            start=("ts_start", "min"), end=("ts_end", "max"))
    )
    return {
        "files": len(files),
        "rows": len(df),
        "gpus": sorted(df.gpu_uuid.unique().tolist()),
        "hosts": sorted(df.host.unique().tolist()),
        "energy_j": float(df.energy_j.sum()),
        "no_job_energy_j": float(df[df.job_id.isna()].energy_j.sum()),
        "start": str(df.ts_start.min()),
        "end": str(df.ts_end.max()),
        "jobs": {j: {"user": r.user, "windows": int(r.windows), "energy_j": round(float(r.energy_j), 3),
                     "start": str(r.start), "end": str(r.end)} for j, r in jobs.iterrows()},
    }


def cmd_inspect(args: argparse.Namespace) -> int:
    from wattclass.output import emit

    data = summarize(args.path)

    def human(d: dict[str, Any]) -> str:
        lines = [f"{d['files']} file(s), {d['rows']} rows, {len(d['gpus'])} GPU(s) "
                 f"on {', '.join(d['hosts'])}",
                 f"{d['start']} .. {d['end']}",
                 f"energy {d['energy_j'] / 3.6e6:.4f} kWh ({d['energy_j']:.0f} J), "
                 f"{d['no_job_energy_j']:.0f} J outside jobs",
                 f"{'job':>10} {'user':>8} {'windows':>8} {'energy_j':>12}"]
        for j, r in d["jobs"].items():
            lines.append(f"{j:>10} {r['user'] or '-':>8} {r['windows']:>8} {r['energy_j']:>12.1f}")
        return "\n".join(lines)

    emit(data, args.json, human)
    return 0
