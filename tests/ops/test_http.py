"""The HTTP port's framing and WebSocket origin check against a real ``headrace serve``.

Raw sockets, so the tests see exactly which responses come back and when
the server closes: ``Connection: close`` ends the connection after its
response, a request body is never read as a request, half-sent requests
are closed after ``--http-header-timeout``, and a ``/rsio`` upgrade from a
foreign web page gets 403.
"""

from __future__ import annotations

import asyncio
import base64
import os
import re
import time
from typing import Any

from headrace.server.http import WAITING_SHARE
from tests.ops.conftest import WAIT_S, free_port, listener_args

HALF_REQUESTS = 64
"""Half-sent requests held open at once: as many as may wait for a request."""
SHORT_HEADER_TIMEOUT_S = 0.5
"""``--http-header-timeout`` in the timeout test, so it runs in about a second."""


async def _exchange(port: int, data: bytes) -> tuple[bytes, bool]:
    """Send ``data``, read until the server closes or ``WAIT_S`` passes;
    what came back, and whether the server closed the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    got = b""
    closed = False
    try:
        writer.write(data)
        deadline = time.monotonic() + WAIT_S
        while (left := deadline - time.monotonic()) > 0:
            try:
                chunk = await asyncio.wait_for(reader.read(65536), left)
            except TimeoutError:
                break
            if not chunk:
                closed = True
                break
            got += chunk
    finally:
        writer.close()
    return got, closed


def _statuses(data: bytes) -> list[int]:
    return [int(code) for code in re.findall(rb"^HTTP/1\.1 (\d{3}) ", data, re.MULTILINE)]


def _upgrade(port: int, origin: str | None = None) -> bytes:
    key = base64.b64encode(os.urandom(16)).decode()
    return (
        f"GET /rsio HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
        + ("" if origin is None else f"Origin: {origin}\r\n")
        + "\r\n"
    ).encode()


async def _upgrade_status(port: int, origin: str | None) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(_upgrade(port, origin))
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
        status = int(head.split()[1])
        body = b""
        if status != 101:
            length = int(re.findall(rb"(?i)content-length: (\d+)", head)[0])
            body = await asyncio.wait_for(reader.readexactly(length), WAIT_S)
        return status, body
    finally:
        writer.close()


def test_pipelined_requests_after_connection_close_are_not_answered(start_serve: Any) -> None:
    serve = start_serve(*listener_args(http=free_port()))
    port = serve.ports["http"]
    got, closed = asyncio.run(
        _exchange(
            port,
            b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
            b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n",
        )
    )
    assert _statuses(got) == [200], got[:500]
    assert b"# HELP" not in got  # /metrics was not answered
    assert closed, "the server kept the connection open after Connection: close"


def test_request_body_is_read_not_executed_as_a_request(start_serve: Any) -> None:
    serve = start_serve(*listener_args(http=free_port()))
    port = serve.ports["http"]
    smuggled = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
    got, closed = asyncio.run(
        _exchange(
            port,
            b"POST /health HTTP/1.1\r\nHost: x\r\n"
            + f"Content-Length: {len(smuggled)}\r\n\r\n".encode()
            + smuggled
            + b"GET /nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )
    )
    assert _statuses(got) == [405, 404], got[:500]
    assert b"# HELP" not in got
    assert closed

    # A body over MAX_BODY_BYTES is refused, not read; the connection closes.
    got, closed = asyncio.run(
        _exchange(port, b"POST /health HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\n\r\n")
    )
    assert _statuses(got) == [413] and closed, got[:500]


async def _half_requests(port: int, count: int) -> list[bool]:
    """Open ``count`` connections that each send half a request head; whether
    the server closed each one within ``WAIT_S``."""
    streams = [await asyncio.open_connection("127.0.0.1", port) for _ in range(count)]
    try:
        for _, writer in streams:
            writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # no blank line: never ends

        async def closed(reader: asyncio.StreamReader) -> bool:
            try:
                return await asyncio.wait_for(reader.read(65536), WAIT_S) == b""
            except (TimeoutError, ConnectionError):
                return False

        return list(await asyncio.gather(*(closed(reader) for reader, _ in streams)))
    finally:
        for _, writer in streams:
            writer.close()


def test_idle_half_requests_are_closed_after_the_header_timeout(start_serve: Any) -> None:
    serve = start_serve(
        *listener_args(http=free_port()),
        "--http-header-timeout",
        str(SHORT_HEADER_TIMEOUT_S),
        "--max-connections",
        str(int(HALF_REQUESTS / WAITING_SHARE)),
        "--log-format",
        "json",
    )
    port = serve.ports["http"]
    closed = asyncio.run(_half_requests(port, HALF_REQUESTS))
    assert all(closed), f"{closed.count(False)} half-sent requests still held open"
    status, body = serve.get("/health")
    assert status == 200, body
    record = serve.wait_for_access(protocol="http", reason="header_timeout")
    assert record["requests"] == 0
    assert serve.metric("headrace_errors_total", protocol="http", kind="header_timeout") == (
        HALF_REQUESTS
    )


async def _closed(reader: asyncio.StreamReader, timeout_s: float) -> bool:
    """Whether the server closes the connection within ``timeout_s``."""
    try:
        return await asyncio.wait_for(reader.read(65536), timeout_s) == b""
    except ConnectionResetError:
        return True  # closed before the server read the half request
    except TimeoutError:
        return False


async def _evictions(port: int, count: int, waiting: int) -> tuple[list[bool], bytes]:
    """Open ``count`` half-sent requests one after another; once the oldest
    beyond ``waiting`` are closed, ask for /health while the rest are held.
    Which were closed by then, and the /health answer."""
    streams = []
    try:
        for _ in range(count):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n")
            await writer.drain()
            streams.append((reader, writer))
        evicted = [await _closed(reader, WAIT_S) for reader, _ in streams[: count - waiting]]
        health, _ = await _exchange(
            port, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        rest = await asyncio.gather(*(_closed(r, 1.0) for r, _ in streams[count - waiting :]))
        return evicted + list(rest), health
    finally:
        for _, writer in streams:
            writer.close()


def test_half_requests_past_the_waiting_share_evict_the_oldest(start_serve: Any) -> None:
    max_connections = 8
    serve = start_serve(
        *listener_args(http=free_port()),
        "--max-connections",
        str(max_connections),
        "--http-header-timeout",
        "600",  # no timeout here: only eviction frees a slot
        "--log-format",
        "json",
    )
    waiting = int(max_connections * WAITING_SHARE)
    closed, health = asyncio.run(_evictions(serve.ports["http"], max_connections, waiting))
    assert _statuses(health) == [200], health[:300]  # every slot was asked for; one answered
    # The oldest were closed to make room (the one waiting longest for /health too),
    # the newest are still held: their header timeout is far off.
    assert closed == [True] * (max_connections - waiting + 1) + [False] * (waiting - 1), closed
    serve.wait_for_access(protocol="http", reason="evicted")


def test_websocket_upgrade_from_a_foreign_origin_is_refused(start_serve: Any) -> None:
    serve = start_serve(*listener_args(http=free_port()))
    port = serve.ports["http"]

    status, body = asyncio.run(_upgrade_status(port, "http://evil.example"))
    assert status == 403
    assert body.count(b"\n") == 1 and b"http://evil.example" in body
    assert serve.metric("headrace_websocket_refused_total", reason="origin") == 1

    assert asyncio.run(_upgrade_status(port, f"http://127.0.0.1:{port}"))[0] == 101  # same origin
    assert asyncio.run(_upgrade_status(port, None))[0] == 101  # not a browser
    assert asyncio.run(_upgrade_status(port, "null"))[0] == 403  # a sandboxed page or a file
    assert serve.metric("headrace_websocket_refused_total", reason="origin") == 2


def test_allowed_origins_may_open_websockets(start_serve: Any) -> None:
    allowed = "https://console.example.com"
    serve = start_serve(*listener_args(http=free_port()), "--http-allowed-origins", allowed)
    port = serve.ports["http"]
    assert asyncio.run(_upgrade_status(port, allowed))[0] == 101
    assert asyncio.run(_upgrade_status(port, "https://console.example.com:443"))[0] == 101
    assert asyncio.run(_upgrade_status(port, "https://other.example.com"))[0] == 403
    assert asyncio.run(_upgrade_status(port, f"http://127.0.0.1:{port}"))[0] == 101
