"""Every connection limit, against a real server with small limits (and the loop in-process).

The limits (``headrace.server._loop.ConnectionLimits``): connections per
listener, bytes of a frame still arriving, reply bytes a peer has not taken,
requests handled at once, idle time, and the time a frame may take to arrive.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from headrace.server._context import ListenerSettings
from headrace.server._listen import start_tcp_listener
from headrace.server._loop import ConnectionLimits
from tests.ops.conftest import WAIT_S, Serve, free_port, listener_args
from tests.server.test_loop import LineHandler

IDLE_TIMEOUT_S = 3.0
PARTIAL_FRAME_TIMEOUT_S = 1.0
TRICKLE_INTERVAL_S = 0.2  # a byte this often: never idle, never a whole frame


@pytest.fixture
def limited(start_serve: Any) -> Iterator[Serve]:
    yield start_serve(
        *listener_args(http=free_port(), tank=free_port()),
        "--log-format",
        "json",
        "--max-connections",
        "2",
        "--max-frame-bytes",
        "1000",
        "--max-buffered-bytes",
        "65536",
        "--idle-timeout",
        str(IDLE_TIMEOUT_S),
        "--partial-frame-timeout",
        str(PARTIAL_FRAME_TIMEOUT_S),
    )


def _closed_by_server(sock: socket.socket, timeout_s: float = WAIT_S) -> bool:
    """Read until EOF (True) or ``timeout_s`` passes (False)."""
    sock.settimeout(timeout_s)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    return True


def test_connections_beyond_the_limit_are_closed_at_once(limited: Serve) -> None:
    port = limited.ports["tank"]
    with (
        socket.create_connection(("127.0.0.1", port)) as first,
        socket.create_connection(("127.0.0.1", port)) as second,
    ):
        for sock in (first, second):  # both served: the broker's greeting arrives
            sock.settimeout(WAIT_S)
            assert sock.recv(64)
        with socket.create_connection(("127.0.0.1", port)) as third:
            assert _closed_by_server(third)  # refused, not idled out: see the access line
    limited.wait_for_access(protocol="tank", reason="refused")
    assert limited.metric("headrace_errors_total", protocol="tank", kind="refused") == 1


def test_a_frame_over_max_frame_bytes_is_refused(limited: Serve) -> None:
    with socket.create_connection(("127.0.0.1", limited.ports["http"])) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nX-Padding: " + b"a" * 2000)  # no end of head
        assert _closed_by_server(sock)
    limited.wait_for_access(protocol="http", reason="frame_too_large")
    assert limited.metric("headrace_errors_total", protocol="http", kind="frame_too_large") == 1


def test_a_client_trickling_a_frame_is_dropped_at_the_partial_frame_deadline(
    limited: Serve,
) -> None:
    with socket.create_connection(("127.0.0.1", limited.ports["http"])) as sock:
        started = time.monotonic()
        sock.settimeout(TRICKLE_INTERVAL_S)
        closed = False
        while not closed and time.monotonic() - started < WAIT_S:
            try:
                sock.sendall(b"a")  # one byte of a request head that never ends
                closed = sock.recv(1) == b""
            except TimeoutError:
                continue  # still open: the pause between bytes is the recv timeout
            except (BrokenPipeError, ConnectionResetError):
                closed = True
        elapsed = time.monotonic() - started
    assert closed, "the trickling client was not dropped"
    assert PARTIAL_FRAME_TIMEOUT_S <= elapsed < IDLE_TIMEOUT_S + 1
    record = limited.wait_for_access(protocol="http", reason="partial_frame_timeout")
    assert record["bytes_in"] >= 2


def test_an_idle_connection_is_closed(limited: Serve) -> None:
    with socket.create_connection(("127.0.0.1", limited.ports["http"])) as sock:
        started = time.monotonic()
        assert _closed_by_server(sock, IDLE_TIMEOUT_S + WAIT_S)
        assert time.monotonic() - started >= IDLE_TIMEOUT_S - 0.1
    limited.wait_for_access(protocol="http", reason="idle")


def test_a_peer_that_does_not_read_its_replies_is_dropped(limited: Serve) -> None:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the kernel holds little
    try:
        sock.connect(("127.0.0.1", limited.ports["http"]))
        request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
        sock.settimeout(WAIT_S)
        try:
            for _ in range(50):  # ~250 KiB of replies per round, never read
                sock.sendall(request * 50)
        except (BrokenPipeError, ConnectionResetError):
            pass  # dropped while we were still sending
    finally:
        sock.close()
    limited.wait_for_access(protocol="http", reason="not_reading")
    assert limited.metric("headrace_errors_total", protocol="http", kind="not_reading") == 1


async def _lines(reader: asyncio.StreamReader, count: int) -> list[str]:
    return [(await reader.readline()).decode().strip() for _ in range(count)]


@pytest.mark.parametrize("max_pending", [1, 8])
async def test_reading_pauses_at_max_pending_requests(max_pending: int) -> None:
    gates: dict[str, asyncio.Event] = {}
    listener = await start_tcp_listener(
        "lines",
        "127.0.0.1",
        0,
        lambda: LineHandler(gates, []),
        settings=ListenerSettings(ConnectionLimits(max_pending_requests=max_pending)),
    )
    reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
    other_reader, other = await asyncio.open_connection("127.0.0.1", listener.port)
    try:
        for r in (reader, other_reader):
            assert await asyncio.wait_for(_lines(r, 1), WAIT_S) == ["hello"]  # the greeting
        writer.write(b"wait g\necho x\n")  # the wait occupies one slot until g opens
        if max_pending > 1:  # room for the echo: it is answered while the wait waits
            assert await asyncio.wait_for(_lines(reader, 1), WAIT_S) == ["echo x"]
        other.write(b"go g\n")
        assert await asyncio.wait_for(_lines(other_reader, 1), WAIT_S) == ["went g"]
        expected = ["done g", "echo x"] if max_pending == 1 else ["done g"]
        assert await asyncio.wait_for(_lines(reader, len(expected)), WAIT_S) == expected
    finally:
        for w in (writer, other):
            w.close()
            await w.wait_closed()
        await listener.aclose()


FIRST_BYTE = {
    "lumberjack": b"2",  # protocol version 2
    "rsio": b"\x05",  # varint length of a 5-byte frame
    "http": b"G",  # of GET (a byte no request starts with gets 400 at once)
}


@pytest.fixture(scope="module")
def every_front_door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    ports = {name: free_port() for name in ("segment_store", "tank", "lumberjack", "rsio", "http")}
    serve = Serve(
        tmp_path_factory.mktemp("front-doors"),
        [
            *listener_args(**ports),
            "--log-format",
            "json",
            "--partial-frame-timeout",
            str(PARTIAL_FRAME_TIMEOUT_S),
        ],
        None,
    )
    yield serve
    serve.stop()


@pytest.mark.parametrize("listener", ["segment_store", "tank", "lumberjack", "rsio", "http"])
def test_every_front_door_drops_a_frame_that_never_completes(
    every_front_door: Serve, listener: str
) -> None:
    with socket.create_connection(("127.0.0.1", every_front_door.ports[listener])) as sock:
        started = time.monotonic()
        sock.sendall(FIRST_BYTE.get(listener, b"\x00"))  # the first byte of a frame
        assert _closed_by_server(sock)
        assert time.monotonic() - started >= PARTIAL_FRAME_TIMEOUT_S - 0.1
    every_front_door.wait_for_access(protocol=listener, reason="partial_frame_timeout")
