"""TANK's first-request timeout (tank.md#first-request-timeout): a connection that
sends no request is closed; one that has sent a request is not, however long it then waits.

The limit is TANK's 16 s by default; the server here runs with
``--tank-first-request-timeout`` set to ``LIMIT_S`` so the test takes seconds.
Every wait is a socket read with a deadline.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from headrace.protocols.tank import FIRST_REQUEST_TIMEOUT_S, DiscoverTopics, encode
from headrace.server.config import build_config
from tests.tank.conftest import TankServer, running_server

LIMIT_S = 0.5
READ_TIMEOUT_S = 10.0
"""Bound on every read: far above ``LIMIT_S``, so a server that never closes fails."""
GREETING = bytes.fromhex("03 00000000")  # a Ping frame, sent on accept (tank.md#greeting)
DISCOVER_TOPICS = 0x0B


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TankServer]:
    args = ("--tank-first-request-timeout", str(LIMIT_S))
    data_dir = tmp_path_factory.mktemp("first-request") / "data"
    with running_server(data_dir, extra_args=args, verbose=True) as server:
        yield server


def _read_frame(sock: socket.socket) -> bytes:
    """One whole frame (message id, u32 size, payload); AssertionError on EOF."""
    data = b""
    while len(data) < 5 or len(data) < 5 + int.from_bytes(data[1:5], "little"):
        chunk = sock.recv(65536)
        assert chunk, f"closed after {data.hex()}"
        data += chunk
    return data


def _closed_after(sock: socket.socket) -> float:
    """Seconds until the server closes ``sock`` (EOF or reset); only Pings may come first."""
    started = time.monotonic()
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            return time.monotonic() - started
        assert set(chunk[::5]) <= {0x03}, f"unexpected bytes before the close: {chunk.hex()}"


def test_the_default_is_tanks_sixteen_seconds() -> None:
    assert build_config({}).tank_first_request_timeout_s == FIRST_REQUEST_TIMEOUT_S == 16.0
    assert build_config({"tank_first_request_timeout": 2}).tank_first_request_timeout_s == 2.0


def test_a_connection_that_sends_nothing_is_closed(limited: TankServer) -> None:
    with socket.create_connection(("127.0.0.1", limited.port), timeout=READ_TIMEOUT_S) as sock:
        opened = time.monotonic()
        assert _read_frame(sock) == GREETING
        _closed_after(sock)
        assert time.monotonic() - opened >= LIMIT_S - 0.05
    line = limited.wait_for_line("reason=first_request_timeout", READ_TIMEOUT_S)
    assert "requests=0" in line


def test_a_connection_with_half_a_request_is_closed(limited: TankServer) -> None:
    request = encode(DiscoverTopics(request_id=1))
    with socket.create_connection(("127.0.0.1", limited.port), timeout=READ_TIMEOUT_S) as sock:
        opened = time.monotonic()
        sock.sendall(request[:-1])  # all but the last byte: no whole request
        assert _read_frame(sock) == GREETING
        _closed_after(sock)
        assert time.monotonic() - opened >= LIMIT_S - 0.05


def test_a_connection_that_sent_a_request_stays_open(limited: TankServer) -> None:
    with socket.create_connection(("127.0.0.1", limited.port), timeout=READ_TIMEOUT_S) as sock:
        assert _read_frame(sock) == GREETING
        sock.sendall(encode(DiscoverTopics(request_id=1)))
        assert _read_frame(sock)[0] == DISCOVER_TOPICS
        # Nothing comes and nothing closes for several times the limit ...
        sock.settimeout(LIMIT_S * 4)
        with pytest.raises(TimeoutError):
            data = sock.recv(65536)
            assert data, "closed after its first request"
        # ... and the connection still serves.
        sock.settimeout(READ_TIMEOUT_S)
        sock.sendall(encode(DiscoverTopics(request_id=2)))
        response = _read_frame(sock)
        assert response[0] == DISCOVER_TOPICS
        assert response[5:9] == (2).to_bytes(4, "little")


def test_the_limit_is_tanks_own_without_the_option(tmp_path: Path) -> None:
    """The default server does not close a silent connection before 16 s (a
    bounded look well short of it: the limit is not the loop's idle one, nor 0)."""
    with (
        running_server(tmp_path / "data") as server,
        socket.create_connection(("127.0.0.1", server.port), timeout=READ_TIMEOUT_S) as sock,
    ):
        assert _read_frame(sock) == GREETING
        sock.settimeout(LIMIT_S * 4)
        with pytest.raises(TimeoutError):
            data = sock.recv(65536)
            assert data, "closed before TANK's 16 s"
