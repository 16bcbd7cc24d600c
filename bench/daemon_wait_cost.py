"""Benchmark: the CPU one wait between two daemon polls costs, by how the wait is made (issue 15).

The node daemon waits about a second between polls for its whole life, so on a one-GPU node a
wait's own CPU counts against the same 1 ms per GPU per second as the poll. Each way of waiting
runs ``--waits`` times at ``--period`` seconds on a fixed grid in a fresh process, one after the
other, in ``--rounds`` rounds; the figure is process CPU per wait (user + system, from
``time.process_time``; a wait that wakes costs the kernel's and the interpreter's wakeup too):

* ``sleep``: ``time.sleep`` (the floor: cannot be ended by a stop);
* ``event``: one ``threading.Event.wait``;
* ``signalstop-sliced``: ``SignalStop.wait`` without ``install`` (0.5 s slices, the daemon's wait
  before the wakeup pipe);
* ``signalstop-pipe``: ``SignalStop.wait`` after ``install`` (one ``select`` on the wakeup pipe,
  the daemon's wait now).

  python bench/daemon_wait_cost.py --waits 40 --rounds 2
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from typing import Any

from benchstamp import emit

MODES = ("sleep", "event", "signalstop-sliced", "signalstop-pipe")

CHILD = """
import signal, sys, threading, time
from wattclass.telemetry.stopsignal import SignalStop
mode, n, period = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
stop, event = SignalStop(), threading.Event()
if mode == "signalstop-pipe":
    stop.install([signal.SIGTERM])
wait = {"sleep": time.sleep, "event": event.wait, "signalstop-sliced": stop.wait,
        "signalstop-pipe": stop.wait}[mode]
t = time.time()
c0 = time.process_time()
for _ in range(n):
    t += period
    wait(max(0.0, t - time.time()))
print((time.process_time() - c0) / n)
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--waits", type=int, default=40)
    ap.add_argument("--period", type=float, default=1.0, help="seconds between polls (the daemon's: 1)")
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    runs: dict[str, list[float]] = {m: [] for m in MODES}
    for _ in range(a.rounds):
        for mode in MODES:
            out = subprocess.run([sys.executable, "-c", CHILD, mode, str(a.waits), str(a.period)],
                                 capture_output=True, text=True, check=True)
            runs[mode].append(float(out.stdout) * 1e6)
    result: dict[str, Any] = {
        "benchmark": "CPU per wait between daemon polls", "waits": a.waits, "period_s": a.period,
        "rounds": a.rounds,
        "cpu_us_per_wait": {m: {"median": round(statistics.median(v), 1), "runs": [round(x, 1) for x in v]}
                            for m, v in runs.items()},
    }
    return emit(result)


if __name__ == "__main__":
    sys.exit(main())
