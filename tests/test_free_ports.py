"""The tests' port picker: distinct ports, each free when drawn (CI once gave two daemons one port)."""

from __future__ import annotations

import socket

import free_ports
import pytest
from free_ports import free_port


def test_ports_are_distinct_free_and_below_the_ephemeral_range() -> None:
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    assert all(20000 <= p < 32000 for p in ports)
    with socket.socket() as s:  # each is bindable now (nothing listens on it)
        s.bind(("127.0.0.1", ports[-1]))


class _Draws:
    """Stands in for the random draw: hands out the given ports in order."""

    def __init__(self, *ports: int) -> None:
        self.ports = list(ports)

    def randrange(self, low: int, high: int) -> int:
        return self.ports.pop(0)


def test_a_port_in_use_or_already_given_is_never_drawn(monkeypatch: pytest.MonkeyPatch) -> None:
    given = free_port()
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        held.listen()
        monkeypatch.setattr(free_ports, "_draw", _Draws(taken, given, 24999))
        monkeypatch.setattr(free_ports, "_given", {given})
        assert free_port() == 24999
