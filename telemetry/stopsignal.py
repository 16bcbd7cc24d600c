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
the event is set outside the handler by the next ``is_set`` or ``wait`` of the main loop.

How a wait learns of a signal that arrives during it: Python resumes an interrupted wait after
the handler has run, so something must end it. With ``install`` (the daemon's main thread) the
wait is a ``poll`` on a pipe that the interpreter itself writes a byte to when a signal comes
(``signal.set_wakeup_fd``) and ``set`` writes to from any thread: one system call per wait, and
the wait ends the moment a signal or ``set`` comes. Without it (another thread, or no
``install``), waits are cut into slices of at most ``SLICE_S`` and a signal is seen within that
time. Why not slices always: the daemon waits once a second for its whole life, and there the two
``Condition`` waits of a sliced second cost more CPU than a one-GPU node's whole poll of NVML
(issue 15; docs/benchmarks.md, "The daemon's wait between polls").
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import select
import signal
import threading
import time
from collections.abc import Iterable
from types import FrameType

log = logging.getLogger("wattclass.telemetry.cli")

#: What stops the daemon with a flush: systemd's stop, Ctrl-C, a closed terminal or `kill -HUP`.
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


#: The longest one ``poll`` of ``SignalStop.wait`` (s): a longer wait polls again.
_POLL_MAX_S = 86400.0


class SignalStop(threading.Event):
    """A ``threading.Event`` that ``on_signal`` can trip from a signal handler."""

    #: Longest a wait runs before it looks for a signal that arrived during it (s), where it
    #: cannot wait on the wakeup pipe (module docstring).
    SLICE_S = 0.5

    def __init__(self) -> None:
        super().__init__()
        self.signum: int | None = None
        self._pipe: tuple[int, int] | None = None  # (read end, write end) once installed
        self._poller: select.poll | None = None  # poll, not select: no limit of 1024 on the fd
        self._old_wakeup_fd = -1
        # ``set`` (any thread) never writes to a pipe end ``uninstall`` closed, whose number a new
        # file may have taken; no signal handler takes it
        self._pipe_lock = threading.Lock()

    def install(self, signals: Iterable[signal.Signals]) -> None:
        """Make ``on_signal`` the handler of ``signals`` and let waits end on the wakeup pipe.

        Main thread only (Python's rule for both). Undo with ``uninstall``."""
        if self._pipe is not None:
            raise RuntimeError("SignalStop.install: already installed")
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        try:
            self._old_wakeup_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except ValueError:  # not the main thread: the handlers cannot be set either
            os.close(r)
            os.close(w)
            raise
        self._pipe = (r, w)
        self._poller = select.poll()
        self._poller.register(r, select.POLLIN)
        for sig in signals:
            signal.signal(sig, self.on_signal)

    def uninstall(self) -> None:
        """Give the wakeup fd back and close the pipe (the handlers stay: the caller decides)."""
        if self._pipe is None:
            return
        signal.set_wakeup_fd(self._old_wakeup_fd)
        with self._pipe_lock:
            r, w = self._pipe
            self._pipe = self._poller = None
            os.close(r)
            os.close(w)

    def on_signal(self, signum: int, _frame: FrameType | None) -> None:
        """The handler for ``signal.signal``: records the signal and returns, nothing else."""
        self.signum = signum

    def is_set(self) -> bool:
        signum = self.signum
        if signum is not None and not super().is_set():
            log.info("signal %d: flushing and stopping", signum)
            super().set()
        return super().is_set()

    def set(self) -> None:
        super().set()
        with self._pipe_lock:
            if self._pipe is not None:  # ends a wait on the pipe (a full pipe ends it as well)
                with contextlib.suppress(BlockingIOError):
                    os.write(self._pipe[1], b"\0")

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        pipe, poller = self._pipe, self._poller
        if threading.current_thread() is not threading.main_thread():
            pipe = poller = None
        while not self.is_set():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            if pipe is None or poller is None:
                super().wait(self.SLICE_S if left is None else min(self.SLICE_S, left))
            # at most a day a call (poll's milliseconds are a C int; the loop waits on)
            elif poller.poll(math.ceil((_POLL_MAX_S if left is None else min(left, _POLL_MAX_S)) * 1e3)):
                with contextlib.suppress(BlockingIOError):  # a signal, or ``set``: look again
                    os.read(pipe[0], 512)
        return self.is_set()

    def clear(self) -> None:
        """Also forgets a signal not yet seen by ``is_set`` or ``wait``."""
        self.signum = None
        super().clear()
