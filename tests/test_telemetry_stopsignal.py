"""The daemon's stop event takes no lock in the signal handler (telemetry/stopsignal.py).

A SIGTERM that lands while the main thread holds a ``threading.Event``'s internal lock (entering
or leaving ``Event.wait``) used to deadlock the daemon in ``Event.set()``: it logged "flushing and
stopping" and never exited (once in eight CI runs).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from wattclass.telemetry.stopsignal import SignalStop


def test_a_signal_while_the_events_lock_is_held_is_recorded_and_seen_by_the_next_wait(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stop = SignalStop()
    # the moment of the deadlock: this thread holds the event's lock (inside Event.wait) when the
    # handler runs; Event.set() would ask for the same lock here and never return
    with stop._cond:  # the lock Event.wait holds
        stop.on_signal(signal.SIGTERM, None)
        assert stop.signum == signal.SIGTERM
    with caplog.at_level(logging.INFO, logger="wattclass.telemetry.cli"):
        assert stop.wait(60.0) is True  # returns at once: the signal is already there
        assert stop.is_set() and stop.wait(0.0)
    assert [r.getMessage() for r in caplog.records] == ["signal 15: flushing and stopping"]


def test_a_signal_during_a_long_wait_ends_it() -> None:
    stop = SignalStop()
    ended: list[bool] = []
    waiter = threading.Thread(target=lambda: ended.append(stop.wait(120.0)))
    waiter.start()
    stop.on_signal(signal.SIGINT, None)  # from outside the wait, as a handler would
    waiter.join(timeout=60)
    assert not waiter.is_alive() and ended == [True]


def test_plain_waits_time_out_and_clear_forgets_an_unseen_signal() -> None:
    stop = SignalStop()
    assert stop.wait(0.01) is False and not stop.is_set()
    stop.on_signal(signal.SIGTERM, None)
    stop.clear()
    assert stop.signum is None and stop.wait(0.01) is False
    stop.set()  # set directly (not from a handler) works as for any Event
    assert stop.wait(0.0) is True


CHILD = textwrap.dedent("""
    import signal, sys, time
    from wattclass.telemetry.stopsignal import SignalStop
    stop = SignalStop()
    seen = [0]
    def handler(signum, frame):
        stop.on_signal(signum, frame)
        seen[0] += 1
    signal.signal(signal.SIGUSR1, handler)
    print("ready", flush=True)
    end = time.monotonic() + float(sys.argv[1])
    while time.monotonic() < end:  # the daemon's loop, compressed: short waits, stop and go
        if stop.wait(0.00001):
            stop.clear()
    # the storm may go on while this process ends: Python's finalization puts a Python handler
    # back to SIG_DFL, and a SIGUSR1 then killed the child (-10, once in a CI run); ignored stays
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    print(seen[0], flush=True)
""")


def test_a_loop_of_short_waits_survives_a_storm_of_signals() -> None:
    """A plain Event in this loop (``stop.set()`` in the handler) hangs within a few hundred
    signals; SignalStop never blocks in the handler."""
    _storm(CHILD)


def _storm(code: str) -> None:
    child = subprocess.Popen([sys.executable, "-c", code, "2.0"], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        sent = 0
        while child.poll() is None and sent < 4000:
            os.kill(child.pid, signal.SIGUSR1)
            sent += 1
            time.sleep(0.0003)
        out, _ = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0
    assert int(out.strip()) > 0  # it did take signals


# -- the wakeup pipe (``install``): the daemon's main-thread wait ends on the signal itself ------

PIPE_CHILD = textwrap.dedent("""
    import os, signal, sys, threading, time
    from wattclass.telemetry.stopsignal import SignalStop
    SignalStop.SLICE_S = 3600.0  # a slice could never end these waits: only the pipe can
    stop = SignalStop()
    stop.install([signal.SIGUSR1])
    how = sys.argv[1]
    if how == "signal":
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGUSR1)).start()
    else:
        threading.Timer(0.2, stop.set).start()
    t0 = time.monotonic()
    ended = stop.wait(float(sys.argv[2]))
    waited = time.monotonic() - t0
    stop.clear()
    short = stop.wait(0.05)  # after clear: a plain timed wait again, nothing pending
    r, w = stop._pipe
    stop.uninstall()
    def closed(fd):
        try:
            os.fstat(fd)
        except OSError:
            return True
        return False
    print(ended, round(waited, 3), short, closed(r) and closed(w), signal.set_wakeup_fd(-1), flush=True)
""")


@pytest.mark.parametrize(("how", "timeout"), [("signal", "120"), ("set", "120"), ("set", "1e300")])
def test_an_installed_stop_ends_a_main_thread_wait_at_once_through_its_pipe(how: str, timeout: str) -> None:
    """(1e300 s: longer than poll's milliseconds can say; the wait polls a day at a time.)"""
    out = subprocess.run([sys.executable, "-c", PIPE_CHILD, how, timeout], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    ended, waited, short, closed, wakeup_fd = out.stdout.split()
    assert ended == "True"
    # ended by the pipe, not by a slice (an hour) nor by the wait's own timeout (120 s)
    assert float(waited) < 30.0
    assert short == "False"
    assert closed == "True" and wakeup_fd == "-1"  # uninstall gave back the wakeup fd, closed both ends


def test_a_second_install_is_refused() -> None:
    code = textwrap.dedent("""
        import signal
        from wattclass.telemetry.stopsignal import SignalStop
        stop = SignalStop()
        stop.install([signal.SIGUSR1])
        try:
            stop.install([signal.SIGUSR1])
        except RuntimeError as exc:
            print(exc)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "already installed" in out.stdout, out.stderr


def test_install_off_the_main_thread_is_refused_and_leaves_no_fd() -> None:
    stop = SignalStop()
    before = set(os.listdir("/proc/self/fd"))
    errors: list[BaseException] = []

    def install() -> None:
        try:
            stop.install([signal.SIGUSR1])
        except ValueError as exc:
            errors.append(exc)

    t = threading.Thread(target=install)
    t.start()
    t.join()
    assert len(errors) == 1 and stop._pipe is None
    assert set(os.listdir("/proc/self/fd")) == before
    assert stop.wait(0.01) is False  # still a working (sliced) event


def test_a_loop_of_short_waits_on_the_pipe_survives_a_storm_of_signals() -> None:
    """The storm above, with the handler and the wakeup pipe set by ``install``."""
    code = CHILD.replace("signal.signal(signal.SIGUSR1, handler)",
                         "stop.install([signal.SIGUSR1]); signal.signal(signal.SIGUSR1, handler)")
    _storm(code)


def test_a_daemon_refused_by_the_lock_gives_back_the_wakeup_fd_and_closes_its_pipe(
    tmp_path: Path, h200_raw: Path
) -> None:
    """Review finding: ``install`` came before the lock and the metrics server, outside the
    ``try`` whose ``finally`` uninstalls, so a second daemon ("locked by pid N", exit 6) run
    in-process (the demo's ``run_cli``) left its pipe open and the process's wakeup fd on it."""
    from wattclass.cli import main
    from wattclass.lockfile import FolderLock
    from wattclass.telemetry.stopsignal import STOP_SIGNALS

    root = tmp_path / "d"
    saved = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    before = set(os.listdir("/proc/self/fd"))
    old = signal.set_wakeup_fd(-1)
    try:
        with FolderLock(root / "wal" / "n1", "first daemon"):
            rc = main(["-q", "telemetry", "run", "--backend", f"replay:{h200_raw}", "--data-root", str(root),
                       "--host", "n1", "--once"])
        assert rc == 6
        assert signal.set_wakeup_fd(-1) == -1  # given back
        assert set(os.listdir("/proc/self/fd")) == before  # no pipe end left open
    finally:
        signal.set_wakeup_fd(old)
        for s, h in saved.items():
            signal.signal(s, h)
