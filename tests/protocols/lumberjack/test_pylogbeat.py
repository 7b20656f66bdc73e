"""The real pylogbeat client (PyPI, 2.1.0) against our server connection over loopback.

A test-only socket loop drives ``LumberjackConnection``; the client runs in a
thread. Skipped when pylogbeat is not installed (a dev dependency).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from typing import Any

import pytest

from headrace.errors import RemoteProtocolError
from headrace.protocols.lumberjack import (
    Ack,
    Batch,
    ConnectionClosed,
    ConnectionEvent,
    LumberjackConnection,
    ProtocolVersion,
    Role,
)

pylogbeat = pytest.importorskip("pylogbeat")

TIMEOUT_S = 10.0


def serve_one(
    listener: socket.socket, on_batch: Callable[[Batch, LumberjackConnection, socket.socket], None]
) -> tuple[list[ConnectionEvent], bytes]:
    """Accept one connection and run it to EOF; returns the events and the raw bytes."""
    server = LumberjackConnection(Role.SERVER)
    events: list[ConnectionEvent] = []
    received = bytearray()
    sock, _ = listener.accept()
    with sock:
        sock.settimeout(TIMEOUT_S)
        while not events or not isinstance(events[-1], ConnectionClosed):
            data = sock.recv(65536)
            received += data
            server.receive_data(data)
            for event in server.events():
                events.append(event)
                if isinstance(event, Batch):
                    on_batch(event, server, sock)
    return events, bytes(received)


def run_client(port: int, script: Callable[[Any], None], errors: list[BaseException]) -> None:
    try:
        client = pylogbeat.PyLogBeatClient("127.0.0.1", port, timeout=TIMEOUT_S)
        with client:
            script(client)
    except BaseException as exc:  # reported by the test thread
        errors.append(exc)


def exchange(
    script: Callable[[Any], None],
    on_batch: Callable[[Batch, LumberjackConnection, socket.socket], None],
) -> tuple[list[ConnectionEvent], bytes]:
    errors: list[BaseException] = []
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(TIMEOUT_S)
        port = listener.getsockname()[1]
        thread = threading.Thread(target=run_client, args=(port, script, errors))
        thread.start()
        try:
            events, received = serve_one(listener, on_batch)
        finally:
            thread.join(TIMEOUT_S)
    assert not thread.is_alive()
    if errors:
        raise errors[0]
    return events, received


def ack_when_durable(batch: Batch, server: LumberjackConnection, sock: socket.socket) -> None:
    # A real server stores batch.events first; here they are "durable" at once.
    if batch.ack_seq is not None:
        server.send(Ack(batch.ack_seq))
        sock.sendall(server.data_to_send())  # one 6-byte frame per write


def test_pylogbeat_windows_acks_and_empty_sends() -> None:
    def script(client: Any) -> None:
        client.send([])  # fresh client: W=0 + empty C
        client.send([{"message": "hello"}, {"message": "world"}])
        client.send([])  # must get ack 2 back (rule 6)
        client.send(['{"x": 1}', b'{"y": 2}'])  # seq 3, 4

    events, received = exchange(script, ack_when_durable)
    batches = [e for e in events if isinstance(e, Batch)]
    assert [([ev.seq for ev in b.events], b.ack_seq) for b in batches] == [
        ([], 0),
        ([1, 2], 2),
        ([], 2),
        ([3, 4], 4),
    ]
    assert {b.version for b in batches} == {ProtocolVersion.V2}
    assert [ev.payload for b in batches for ev in b.events] == [
        b'{"message": "hello"}',
        b'{"message": "world"}',
        b'{"x": 1}',
        b'{"y": 2}',
    ]
    assert events[-1] == ConnectionClosed()
    # The bytes pylogbeat 2.1.0 sends and the empty C frame, as captured.
    assert bytes.fromhex("325700000000324300000008789c030000000001") in received
    assert (
        bytes.fromhex(
            "325700000002324300000031"
            "789c33f2626060600462916aa5dcd4e2e2c4f454252b05a58cd49c9c7ca55a23902c13866c79"
            "7e514e8a522d00900e0ede"
        )
        in received
    )


def test_pylogbeat_accepts_keepalives_and_partial_acks() -> None:
    def script(client: Any) -> None:
        client.send([{"n": 1}, {"n": 2}, {"n": 3}])

    def slow_ack(batch: Batch, server: LumberjackConnection, sock: socket.socket) -> None:
        assert batch.ack_seq == 3
        for seq in (0, 1, 0, 2, 3):  # keepalive, partial, keepalive, partial, final
            server.send(Ack(seq))
            sock.sendall(server.data_to_send())

    events, _ = exchange(script, slow_ack)
    assert events[-1] == ConnectionClosed()


def test_pylogbeat_non_json_element_closes_the_connection_without_ack() -> None:
    errors: list[BaseException] = []

    def script(client: Any) -> None:
        client.send(["plain text, not JSON"])

    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(TIMEOUT_S)
        thread = threading.Thread(
            target=run_client, args=(listener.getsockname()[1], script, errors)
        )
        thread.start()
        try:
            with pytest.raises(RemoteProtocolError, match="invalid JSON"):
                serve_one(listener, ack_when_durable)  # closes the socket on the way out
        finally:
            thread.join(TIMEOUT_S)
    assert not thread.is_alive()
    assert len(errors) == 1
    assert isinstance(errors[0], pylogbeat.ConnectionException)
    assert "0x00" in str(errors[0])  # pylogbeat's words for "the server closed"
