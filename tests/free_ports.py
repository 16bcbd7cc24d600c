"""Loopback ports for the daemons the tests start (slurmctld, slurmd, mariadbd, slurmdbd, Prometheus).

Why not ``bind(("127.0.0.1", 0))`` and hand back what the kernel chose: the socket is closed before
the daemon binds, so the kernel may hand the same port out again. One cluster asks for up to six
ports in a row; CI once got the same port for slurmctld and a slurmd, and slurmctld died with
"Address already in use". Ports here are drawn from below the kernel's ephemeral range (where
outgoing connections of other tests take theirs), are free when drawn, and are never handed out
twice by one test process.
"""

from __future__ import annotations

import random
import socket

_LOW, _HIGH = 20000, 32000  # below Linux's default ephemeral range, 32768-60999
_given: set[int] = set()
_draw = random.Random()


def free_port() -> int:
    """A loopback TCP port nothing listens on now, not handed out before in this process."""
    for _ in range(1000):
        port = _draw.randrange(_LOW, _HIGH)
        if port in _given:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _given.add(port)
        return port
    raise RuntimeError(f"no free loopback port in {_LOW}-{_HIGH} after 1000 draws")
