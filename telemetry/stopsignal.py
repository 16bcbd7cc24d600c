"""The daemon's stop event, tripped by SIGTERM/SIGINT without taking a lock in the signal handler.

Why: Python runs a signal handler in the main thread, between two bytecodes, wherever that thread
is. The daemon's main thread spends its life in ``threading.Event.wait`` (between polls), and
``Event.wait`` holds the event's internal lock, which is not reentrant, while it enters and leaves
the wait. A handler that calls ``Event.set()`` at that moment asks the same thread for the same
lock and blocks forever: the daemon logged "signal 15: flushing and stopping" and never exited
(seen once in eight CI runs; reproduced by signalling a loop of short waits, which hangs within
seconds). Under systemd the unit would then be killed at ``TimeoutStopSec``, and the windows not
yet in the write-ahead log lost.

So the handler only stores the signal number (a plain attribute store: no lock, no logging), and
the event is set outside the handler by the next ``is_set`` or ``wait`` of the main loop. Waits
are cut into slices of at most ``SLICE_S`` so a signal that arrives during one is seen within
that time (a poll waits at most one poll period anyway).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from types import FrameType

log = logging.getLogger("wattclass.telemetry.cli")

#: What stops the daemon with a flush: systemd's stop, Ctrl-C, a closed terminal or `kill -HUP`.
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class SignalStop(threading.Event):
    """A ``threading.Event`` that ``on_signal`` can trip from a signal handler."""

    #: Longest a wait runs before it looks for a signal that arrived during it (s).
    SLICE_S = 0.5

    def __init__(self) -> None:
        super().__init__()
        self.signum: int | None = None

    def on_signal(self, signum: int, _frame: FrameType | None) -> None:
        """The handler for ``signal.signal``: records the signal and returns, nothing else."""
        self.signum = signum

    def is_set(self) -> bool:
        signum = self.signum
        if signum is not None and not super().is_set():
            log.info("signal %d: flushing and stopping", signum)
            super().set()
        return super().is_set()

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.is_set():
            left = self.SLICE_S if deadline is None else min(self.SLICE_S, deadline - time.monotonic())
            if left <= 0:
                break
            super().wait(left)
        return self.is_set()

    def clear(self) -> None:
        """Also forgets a signal not yet seen by ``is_set`` or ``wait``."""
        self.signum = None
        super().clear()
