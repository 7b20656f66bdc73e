"""A blocking Pravega segment-store connection for tests that hurt a real server.

``RawPravega`` speaks the wire protocol over one socket with the sans-I/O
``PravegaConnection`` (client role): ``request`` sends a command and waits,
bounded, for the next reply. ``large_frame_header`` is the first 8 bytes of
an append block announcing ``size_bytes`` of payload, for clients that
announce a large frame and then send only some of it (or none).
"""

from __future__ import annotations

import socket
import struct
import time
import uuid
from typing import Final, Self

from headrace.protocols import pravega as p

WAIT_S: Final = 10.0
"""Bound on one reply."""


def large_frame_header(size_bytes: int) -> bytes:
    """A wire frame header: type AppendBlock, ``size_bytes`` of payload to follow."""
    return struct.pack(">ii", p.CommandType.APPEND_BLOCK, size_bytes)


class RawPravega:
    """One client connection to a segment store, Hello already exchanged."""

    def __init__(self, port: int, *, timeout_s: float = WAIT_S) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
        self.timeout_s = timeout_s
        self.conn = p.PravegaConnection(p.Role.CLIENT)
        self.flush()
        hello = self.recv()
        assert isinstance(hello, p.Hello), hello

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def flush(self) -> None:
        self.sock.sendall(self.conn.data_to_send())

    def send(self, *commands: p.Command) -> None:
        for command in commands:
            self.conn.send(command)
        self.flush()

    def recv(self) -> p.Command:
        deadline = time.monotonic() + self.timeout_s
        while True:
            event = self.conn.next_event()
            if event is not None:
                assert isinstance(event, p.Command), event
                return event
            self.sock.settimeout(max(deadline - time.monotonic(), 0.001))
            data = self.sock.recv(1 << 20)
            if not data:
                raise ConnectionError("the server closed the connection")
            self.conn.receive_data(data)

    def request(self, command: p.Command) -> p.Command:
        self.send(command)
        return self.recv()

    def append(self, segment: str, payload: bytes) -> p.Command:
        """Set a new writer up on ``segment`` and append ``payload`` as one event;
        the reply to the append (``DataAppended`` when stored)."""
        writer = uuid.uuid4()
        setup = self.request(p.SetupAppend(1, writer, segment, ""))
        assert isinstance(setup, p.AppendSetup), setup
        data = p.encode_event(payload)
        return self.request(p.AppendBlockEnd(writer, len(data), data, 1, 1, 2))
