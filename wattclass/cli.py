"""The ``wattclass`` command: one entry point, one subcommand per capability.

Each component registers its own subcommands (``register(subparsers)`` in its ``cli`` module),
so this file stays a dispatcher. Handlers return an exit code; project errors become one line
on stderr and the error's own exit code:

  0 success, 1 runtime failure, 2 invalid configuration or usage, 3 unusable input data,
  4 GPU/NVML failure, 5 Slurm failure, 6 another process holds the lock (second telemetry
  daemon on a WAL folder, second nightly run on a classifier folder), 7 no data (nightly: a day
  without telemetry, unless --allow-empty), 130 interrupted.

One BLAS thread for the command: unless the environment says otherwise, ``OPENBLAS_NUM_THREADS``
is set to 1 when this module loads, before any command imports NumPy or SciPy. Why (issue 15):
OpenBLAS starts its thread pool when its library loads, and the pool's threads spin waiting for
work (docs/benchmarks.md, issue 15 fifth round), CPU the nightly and the node daemon spend for
nothing; wattclass's linear algebra is tiny and every fit already ran on one BLAS thread
(``classifier.model._OneBlasThread``), so no result changes. Only the ``wattclass`` command (and
what it starts) sees it: a program that imports wattclass as a library keeps its own BLAS setup.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before NumPy loads (module docstring)

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from wattclass import __version__
from wattclass.errors import WattclassError

#: Modules that contribute subcommands, in the order they appear in --help.
COMMAND_MODULES: tuple[str, ...] = (
    "wattclass.demo.run",
    "wattclass.telemetry.cli",
    "wattclass.classifier.cli",
    "wattclass.plugin.cli",
    "wattclass.report.cli",
    "wattclass.savings.cli",
    "wattclass.fleet.generate",
)

#: The subcommands each module registers. ``main`` imports only the module of the command it
#: runs: importing all of them (NumPy, pyarrow, tqdm, the plugin's modules...) cost 0.1 s of
#: every command (issue 15). tests/test_cli_commands.py checks this map against the modules.
COMMANDS: dict[str, str] = {
    "demo": "wattclass.demo.run",
    "telemetry": "wattclass.telemetry.cli",
    "classify": "wattclass.classifier.cli", "effects": "wattclass.classifier.cli",
    "model": "wattclass.classifier.cli", "nightly": "wattclass.classifier.cli",
    "plugin": "wattclass.plugin.cli", "policy": "wattclass.plugin.cli",
    "job": "wattclass.report.cli", "report": "wattclass.report.cli",
    "calibrate": "wattclass.savings.cli", "simulate": "wattclass.savings.cli",
    "fleet": "wattclass.fleet.generate",
}

log = logging.getLogger("wattclass")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``wattclass`` parser; with a known ``command``, only its module's subcommands."""
    parser = argparse.ArgumentParser(
        prog="wattclass",
        description=(
            "Make a Slurm GPU cluster spend less energy for the same work: measure each job's GPUs, "
            "label jobs compute- or memory-bound, and cap GPU power where a cap costs little time."
        ),
        epilog="Exit codes: 0 ok, 1 failure, 2 bad configuration/usage, 3 bad input data, "
        "4 GPU/NVML error, 5 Slurm error, 6 lock held by another process (second daemon or "
        "nightly run), 7 no data (nightly day without telemetry), 130 interrupted.",
    )
    parser.add_argument("--version", action="version", version=f"wattclass {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)"
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = [COMMANDS[command]] if command in COMMANDS else COMMAND_MODULES
    for name in modules:
        importlib.import_module(name).register(sub)
    return parser


def _command_of(argv: Sequence[str]) -> str | None:
    """The subcommand named in ``argv`` (the first word that is not a global option), if any."""
    for arg in argv:
        if not arg.startswith("-"):
            return arg
        if arg in ("-h", "--help", "--version"):
            return None
    return None


def setup_logging(verbose: int, quiet: bool) -> None:
    level = logging.WARNING if quiet else logging.INFO if verbose == 0 else logging.DEBUG
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


_EXIT_COLLECTION_SKIPPED = False


def skip_collection_at_exit() -> None:
    """At interpreter exit, leave the objects still alive to the operating system uncollected.

    Why (issue 15): Python's shutdown runs the cyclic garbage collector over every object left
    before it frees the modules; with pandas, SciPy and LightGBM loaded that took 0.1-0.15 s of
    one core at the end of every ``nightly`` and ``classify`` (a 1,000-GPU night is 3-4 s).
    ``gc.freeze()`` in an exit handler moves them out of the collector's reach. What ran before
    is unchanged: exit handlers still run (logging's flush among them), and wattclass closes
    every file it writes itself (atomic writers), so no output waits on a collection; only a
    finaliser of an object caught in a reference cycle no longer runs at exit."""
    global _EXIT_COLLECTION_SKIPPED
    if not _EXIT_COLLECTION_SKIPPED:
        import atexit
        import gc

        atexit.register(gc.freeze)
        _EXIT_COLLECTION_SKIPPED = True


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its exit code (module docstring). A usage error (an unknown option, a value
    an option's ``type=`` refuses: wattclass/argtypes.py) is argparse's message and 2, returned
    like a ConfigError's rather than raised as SystemExit, so a caller in-process (the demo, the
    tests) sees every refusal the same way; ``--help`` and ``--version`` return 0."""
    skip_collection_at_exit()
    parser = build_parser(_command_of(sys.argv[1:] if argv is None else argv))
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse has printed the usage and the error, or the help
        return exc.code if isinstance(exc.code, int) else 2
    setup_logging(args.verbose, args.quiet)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        return int(func(args) or 0)
    except WattclassError as exc:
        print(f"wattclass: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("wattclass: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`wattclass job 7 | head`): stop quietly, as command-line tools do,
        # with the shell's status for SIGPIPE. stdout goes to /dev/null so that the interpreter's
        # flush at exit does not raise a second time.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
