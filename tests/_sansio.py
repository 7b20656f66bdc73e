"""Two sans-I/O connections wired back to back in memory (h11's ``ConnectionPair``).

Every protocol package's connection has the same verbs
(docs/architecture.md#naming): ``send``, ``data_to_send``, ``receive_data`` and
``events``. ``ConnectionPair`` joins a client and a server of any of them
(Pravega, TANK, Lumberjack, RS-IO), so the tests under ``tests/protocols/``
drive both ends without a socket:

* ``to_server(*messages)`` sends the messages from the client, hands every
  byte the client has queued to the server and returns the events the server
  gave; ``to_client`` is the same the other way.
* ``pump()`` moves the queued bytes both ways until neither side has any left
  and returns the events each side gave. It gives up after ``max_rounds``
  rounds: two connections that keep answering each other are a bug the test
  must see, not a loop to wait out.

Empty bytes are never handed over: to ``receive_data``, ``b""`` means end of
file, and a test closes a connection by saying so itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final, Generic, Protocol, TypeVar

PUMP_ROUNDS: Final = 100
"""Rounds ``pump`` takes at most: a request and its answers settle in a few."""


class SansIOConnection(Protocol):
    """The verbs every protocol package's connection has."""

    def send(self, message: Any, /) -> None: ...

    def data_to_send(self) -> bytes: ...

    def receive_data(self, data: bytes, /) -> None: ...

    def events(self) -> Iterator[Any]: ...


C = TypeVar("C", bound=SansIOConnection)


def _deliver(sender: SansIOConnection, receiver: SansIOConnection) -> tuple[bool, list[Any]]:
    """Hand ``sender``'s queued bytes (if any) to ``receiver``: whether there
    were any, and the events ``receiver`` has now."""
    data = sender.data_to_send()
    if data:
        receiver.receive_data(data)
    return bool(data), list(receiver.events())


class ConnectionPair(Generic[C]):
    """A client and a server connection talking in memory (see the module doc)."""

    def __init__(self, client: C, server: C) -> None:
        self.client = client
        self.server = server

    def to_server(self, *messages: Any) -> list[Any]:
        """Send ``messages`` from the client; the events the server gets."""
        for message in messages:
            self.client.send(message)
        return _deliver(self.client, self.server)[1]

    def to_client(self, *messages: Any) -> list[Any]:
        """Send ``messages`` from the server; the events the client gets."""
        for message in messages:
            self.server.send(message)
        return _deliver(self.server, self.client)[1]

    def pump(self, max_rounds: int = PUMP_ROUNDS) -> tuple[list[Any], list[Any]]:
        """Move bytes both ways until both sides are quiet; the events the
        server got and those the client got."""
        at_server: list[Any] = []
        at_client: list[Any] = []
        for _ in range(max_rounds):
            to_server, events = _deliver(self.client, self.server)
            at_server += events
            to_client, events = _deliver(self.server, self.client)
            at_client += events
            if not (to_server or to_client):
                return at_server, at_client
        raise AssertionError(f"still exchanging bytes after {max_rounds} rounds")
