"""``wattclass telemetry run`` (the node daemon), ``import`` (from dcgm-exporter via Prometheus) and
``inspect``."""

from __future__ import annotations

import argparse
import logging
import signal
import socket
from pathlib import Path
from typing import Any

from wattclass.argtypes import host_name, positive_float, positive_int

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add this component's subcommands to ``wattclass``."""
    p = sub.add_parser("telemetry", help="node telemetry daemon: GPU polls -> 10 s windows -> Parquet")
    tsub = p.add_subparsers(dest="telemetry_command", metavar="ACTION")
    _register_run(tsub)
    _register_import(tsub)
    insp = tsub.add_parser("inspect", help="summarise telemetry Parquet: rows, GPUs, jobs, energy")
    insp.add_argument("path", type=Path, help="a Parquet file or a folder of them (e.g. DATA_ROOT/telemetry)")
    insp.add_argument("--json", action="store_true", help="print JSON")
    insp.set_defaults(func=cmd_inspect)
    p.set_defaults(func=lambda a: (p.print_help(), 2)[1])


def _register_run(tsub: argparse._SubParsersAction[Any]) -> None:
    run = tsub.add_parser(
        "run",
        help="poll every GPU each second and write exact per-job windows to Parquet",
        description=(
            "Poll every GPU each --poll seconds, close a window per GPU and job every --period "
            "seconds (aligned to the clock), append each closed window to a write-ahead log "
            "(fsynced) and roll the log into Parquet under DATA_ROOT/telemetry/date=.../host=.../ "
            "every --roll-seconds and at exit. SIGTERM/SIGINT/SIGHUP flush and exit 0 (1 if windows could "
            "not be persisted, disk full). The WAL folder is locked: a second daemon on it exits 6."
        ),
    )
    run.add_argument("--backend", default="nvml", help="nvml (default) | replay:DIR | filestate:PATH")
    run.add_argument("--data-root", required=True, type=Path, help="where Parquet files go")
    run.add_argument("--period", type=positive_float, default=10.0,
                     help="window length, seconds (default 10)")
    run.add_argument("--poll", type=positive_float, default=1.0,
                     help="poll interval, seconds (default 1)")
    run.add_argument("--host", type=host_name, default=None,
                     help="host name in the rows (default: this host's name)")
    run.add_argument("--spool", type=Path, default=None,
                     help="folder of Prolog-written GPU->job files (default /run/wattclass/jobs "
                          "if it exists); without a file the GPU's process list is used")
    run.add_argument("--wal-dir", type=Path, default=None,
                     help="write-ahead log folder, on local disk (default DATA_ROOT/wal/HOST)")
    run.add_argument("--roll-seconds", type=positive_float, default=3600.0,
                     help="roll the WAL into Parquet this often (default 3600)")
    run.add_argument("--energy-every-windows", type=positive_int, default=None, metavar="N",
                     help="read the energy counter (the one costly NVML call) at every N-th window "
                          "close; windows in between wait up to N-1 windows for it and share its delta "
                          "by integrated power (default 3; docs/benchmarks.md, \"Energy split at job "
                          "changes\")")
    run.add_argument("--once", action="store_true",
                     help="replay: play the whole recording as fast as possible, flush, exit")
    run.add_argument("--speed", type=positive_float, default=1.0,
                     help="replay speed in real-time mode (default 1)")
    run.add_argument("--metrics-port", type=int, default=None,
                     help="serve Prometheus metrics (energy, power, labels, daemon health) on this port")
    run.add_argument("--metrics-bind", default=None, metavar="ADDR",
                     help="address the metrics endpoint listens on (default 127.0.0.1: it names each "
                     "GPU's job and user, which Slurm's PrivateData hides; give 0.0.0.0 or the node's "
                     "address only where Prometheus scrapes over a trusted network, docs/admin.md)")
    run.add_argument("--proc-root", type=Path, default=Path("/proc"), help=argparse.SUPPRESS)
    run.set_defaults(func=cmd_run)


def _register_import(tsub: argparse._SubParsersAction[Any]) -> None:
    imp = tsub.add_parser(
        "import",
        help="import dcgm-exporter series from Prometheus as telemetry windows (no node daemon)",
        description=(
            "Read the DCGM series a dcgm-exporter produced through Prometheus's HTTP API and write "
            "telemetry v1 windows under DATA_ROOT/telemetry/date=.../host=.../prom-START-END.parquet, "
            "the layout the daemon writes, so the nightly run and the report work unchanged. Energy is "
            "the delta of DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION; the job is the --job-label of each "
            "scrape (dcgm-exporter's hpc_job with --hpc-job-mapping-dir). Import whole days with shared "
            "bounds: re-importing a span replaces its files. Counters to enable: "
            "deploy/dcgm-exporter-counters.csv."
        ),
    )
    imp.add_argument("--prometheus", required=True, metavar="URL", help="e.g. http://prometheus:9090")
    imp.add_argument("--start", required=True, help="ISO 8601 (UTC unless an offset is given) or epoch s")
    imp.add_argument("--end", required=True, help="ISO 8601 or epoch seconds")
    imp.add_argument("--data-root", required=True, type=Path, help="where Parquet files go")
    imp.add_argument("--job-label", default="hpc_job",
                     help="series label holding the Slurm job id (default hpc_job, dcgm-exporter's)")
    imp.add_argument("--user-label", default=None,
                     help="series label holding the user, if the site adds one (else the nightly run "
                          "takes users from Slurm)")
    imp.add_argument("--period", type=float, default=10.0, help="window length, seconds (default 10)")
    imp.add_argument("--chunk", type=float, default=3600.0,
                     help="seconds fetched per query (default 3600; lower it if Prometheus refuses "
                          "a query for too many samples)")
    imp.add_argument("--json", action="store_true", help="print the summary as JSON")
    imp.set_defaults(func=cmd_import)


def cmd_run(args: argparse.Namespace) -> int:
    from wattclass.errors import ConfigError
    from wattclass.gpu import open_backend
    from wattclass.jobmap import DEFAULT_SPOOL
    from wattclass.telemetry.daemon import Daemon, DaemonConfig
    from wattclass.telemetry.metrics import DEFAULT_BIND, DEFAULT_GPU_STALE_S, LatestWindows, serve

    spec = str(args.backend)
    options: dict[str, object] = {}
    if args.metrics_bind is not None and args.metrics_port is None:
        raise ConfigError("--metrics-bind needs --metrics-port")
    if args.metrics_port is not None and not 1 <= args.metrics_port <= 65535:
        raise ConfigError(f"--metrics-port {args.metrics_port}: expected a TCP port, 1-65535")
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
    if args.energy_every_windows is not None:
        cfg.energy_every_windows = args.energy_every_windows
    cfg.check()  # --period below --poll refused before the data root is made
    from wattclass.telemetry.stopsignal import STOP_SIGNALS, SignalStop

    stop = SignalStop()  # a handler must not set a threading.Event: telemetry/stopsignal.py
    # Fail on an unwritable data root before touching the GPUs; a file given for a folder is named
    # by its option, exit 2 (--wal-dir FILE was a FileExistsError traceback at the lock).
    from wattclass.fsutil import check_output_dir, ensure_writable_dir

    if args.wal_dir is not None:
        check_output_dir(args.wal_dir, "--wal-dir")
    if spool is not None and spool.exists() and not spool.is_dir():  # read as "no job files" before
        raise ConfigError(f"--spool {spool}: not a folder")
    ensure_writable_dir(Path(cfg.data_root) / "telemetry", "data root")
    backend = open_backend(spec, **options)
    # windows reach the exporter in batches, one per energy read: a GPU is stale after 3 missed
    stale_s = max(DEFAULT_GPU_STALE_S, 3 * cfg.period_s * cfg.energy_every_windows)
    collector = LatestWindows(gpu_stale_s=stale_s) if args.metrics_port is not None else None
    with backend:
        daemon = Daemon(backend, cfg, collector=collector, stop=stop)

        # SIGHUP too: a closed terminal flushes like a stop, not a death; the wait between polls
        # ends on the signal's wakeup byte (telemetry/stopsignal.py)
        stop.install(STOP_SIGNALS)
        try:  # uninstall on every way out: a refused lock or port run in-process (the demo) too
            daemon.lock.acquire()  # a second daemon says "locked by pid N", not "port in use"
            if collector is not None:
                bind = args.metrics_bind or DEFAULT_BIND
                try:
                    serve(int(args.metrics_port), collector, bind)
                except OSError as exc:  # port taken, an address not on this host, a name not found
                    daemon.lock.release()
                    raise ConfigError(f"--metrics-port {args.metrics_port} on --metrics-bind {bind}: "
                                      f"cannot listen: {exc.strerror or exc}") from exc
                log.info("metrics on http://%s:%d/metrics", bind, args.metrics_port)
            try:
                rc = daemon.run()
            finally:
                # Flushed: later signals change nothing. Python's exit would give them their
                # default action back, and a late SIGTERM would kill the process and with it the
                # exit code that says whether windows were lost (review finding).
                for sig in STOP_SIGNALS:
                    signal.signal(sig, signal.SIG_IGN)
        finally:
            stop.uninstall()
    s = daemon.stats
    log.info("done: %d rows, %.1f J, %d GPU error(s)", s.rows, s.energy_j, s.gpu_errors)
    return rc


def cmd_import(args: argparse.Namespace) -> int:
    from wattclass.fsutil import check_output_dir
    from wattclass.output import emit
    from wattclass.telemetry.prometheus.importer import import_range, parse_time

    check_output_dir(args.data_root, "--data-root")  # before the fetch, not at the first file written
    res = import_range(args.prometheus, parse_time(args.start, "--start"), parse_time(args.end, "--end"),
                       args.data_root, args.job_label, args.user_label, args.period, args.chunk)
    data = {"files": [str(f) for f in res.files], "rows": res.rows, "gpus": res.gpus,
            "jobs": len(res.jobs), "energy_j": round(res.energy_j, 3), "missing_fields": res.missing,
            "mig_series_left_out": res.mig}

    def human(d: dict[str, Any]) -> str:
        lines = [f"{d['gpus']} GPU(s), {d['jobs']} job(s), {d['rows']} window rows, "
                 f"{d['energy_j'] / 3.6e6:.3f} kWh -> {len(d['files'])} file(s)"]
        lines += [f"  {f}" for f in d["files"]]
        for gpu, fields in d["missing_fields"].items():
            lines.append(f"  {gpu}: not exported: {', '.join(fields)}")
        for gpu, n in d["mig_series_left_out"].items():
            lines.append(f"  {gpu}: {n} MIG instance series left out (not split per instance)")
        return "\n".join(lines)

    emit(data, args.json, human)
    return 0


def summarize(path: Path) -> dict[str, Any]:
    """Rows, GPUs, jobs and energy of a telemetry file or folder."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from wattclass.errors import DataError
    from wattclass.schema import conform

    if not path.exists():
        raise DataError(f"{path}: no such file or folder")
    if path.is_dir() and (path / "telemetry").is_dir():
        # a data root: its telemetry, not the nightly's label store and samples beside it
        path = path / "telemetry"
    files = [path] if path.is_file() else sorted(
        p for p in path.rglob("*.parquet") if not p.name.startswith(".")
    )
    if not files:
        raise DataError(f"{path}: no Parquet files")
    # File by file, so that an unreadable file or a column of another type names its file (one
    # dataset over all of them was a traceback: the first file's types were forced on the rest).
    tables = []
    for f in files:
        try:
            tables.append(conform(pq.read_table(f), f))
        except (OSError, pa.ArrowException) as exc:
            raise DataError(f"{f}: not a readable Parquet file: {str(exc).splitlines()[0][:300]}") from exc
    table = pa.concat_tables(tables)
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
