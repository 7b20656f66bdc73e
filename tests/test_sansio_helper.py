"""The in-memory connection pair (``tests/_sansio.py``) that the protocol tests share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from headrace.protocols.pravega import (
    OLDEST_COMPATIBLE_VERSION,
    WIRE_VERSION,
    Hello,
    KeepAlive,
    PravegaConnection,
    Role,
)
from tests._sansio import PUMP_ROUNDS, ConnectionPair


def test_pump_moves_bytes_both_ways_until_quiet() -> None:
    pair = ConnectionPair(PravegaConnection(Role.CLIENT), PravegaConnection(Role.SERVER))
    hello = Hello(WIRE_VERSION, OLDEST_COMPATIBLE_VERSION)
    assert pair.pump() == ([hello], [hello])
    pair.client.send(KeepAlive())
    assert pair.pump() == ([KeepAlive()], [KeepAlive()])  # the server echoes a KeepAlive
    assert pair.pump() == ([], [])


class Echo:
    """A connection that answers every byte it receives with one byte."""

    def __init__(self, first: bytes = b"") -> None:
        self.queued = first

    def send(self, message: object, /) -> None:
        self.queued += b"x"

    def data_to_send(self) -> bytes:
        data, self.queued = self.queued, b""
        return data

    def receive_data(self, data: bytes, /) -> None:
        self.queued += b"x" * len(data)

    def events(self) -> Iterator[object]:
        return iter(())


def test_pump_gives_up_on_connections_that_never_go_quiet() -> None:
    pair = ConnectionPair(Echo(b"x"), Echo())
    with pytest.raises(AssertionError, match=f"after {PUMP_ROUNDS} rounds"):
        pair.pump()
