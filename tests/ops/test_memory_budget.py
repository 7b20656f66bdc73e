"""Memory a peer can make the server hold: large frame headers, and the server-wide budget.

A frame header is not a promise: a segment-store frame header announcing
16 MiB must not make the server allocate 16 MiB (the buffer grows as the
frame's bytes arrive). And however many connections each stay within their
own limits, the bytes they make the server hold together are bounded by
``--max-total-buffered-bytes``: once it is spent, connections holding bytes
stop reading until it frees, while connections that hold nothing (a
``/health`` probe, a small append) are served as usual. Real ``headrace
serve`` processes, real sockets; memory is read from ``/proc/PID/status``.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from headrace.protocols import pravega as p
from tests.ops.conftest import WAIT_S, Serve, free_port, listener_args
from tests.raw_pravega import RawPravega, large_frame_header

MIB = 1024 * 1024
FRAME_BYTES = 16 * MIB - 100
"""What the attackers announce: just under the segment store's frame limit."""
SEGMENT = "budget/test/0.#epoch.0"


def rss_bytes(pid: int) -> int:
    """The process's resident memory (``VmRSS``)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def health_s(serve: Serve) -> float:
    """How long ``/health`` takes to answer 200."""
    started = time.monotonic()
    status, _ = serve.get("/health")
    assert status == 200
    return time.monotonic() - started


def wait_for(condition: Any, what: str, timeout_s: float = WAIT_S) -> None:
    """Poll ``condition()`` under a deadline (the server's state, read from outside)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def received(serve: Serve) -> float:
    return serve.metric("headrace_received_bytes_total", protocol="segment_store")


def send_until_stalled(sock: socket.socket, data: bytes, stall_s: float = 1.0) -> int:
    """Send ``data`` until all is out or the peer takes nothing for ``stall_s``; how much went."""
    sock.settimeout(stall_s)
    sent = 0
    try:
        while sent < len(data):
            sent += sock.send(data[sent : sent + MIB])
    except TimeoutError:
        pass
    return sent


@pytest.fixture
def pravega(start_serve: Any) -> Iterator[Serve]:
    serve = start_serve(*listener_args(segment_store=free_port(), http=free_port()))
    with RawPravega(serve.ports["segment_store"]) as raw:
        assert raw.request(p.CreateSegment(1, SEGMENT, 0, 0)) == p.SegmentCreated(1, SEGMENT)
    yield serve


def test_a_large_frame_header_allocates_nothing_until_the_frame_arrives(pravega: Serve) -> None:
    assert pravega.process is not None
    pid = pravega.process.pid
    before = rss_bytes(pid)
    count = 24
    socks = []
    try:
        for _ in range(count):
            raw = RawPravega(pravega.ports["segment_store"])
            socks.append(raw)
            raw.sock.sendall(large_frame_header(FRAME_BYTES) + b"a" * 1000)
        expected = received(pravega) + count * 1000
        for raw in socks:  # more of each frame: now the server receives it in place
            raw.sock.sendall(b"b" * 1000)
        wait_for(lambda: received(pravega) >= expected, "the frames' bytes to be read")
        grown = rss_bytes(pid) - before
        # Each connection holds a buffer for the bytes that arrived and a little
        # more, not the 16 MiB its header announced (384 MiB for all of them).
        assert grown < 64 * MIB, f"{grown / MIB:.0f} MiB for {count} announced frames"
        assert health_s(pravega) < 1.0
        with RawPravega(pravega.ports["segment_store"]) as raw:  # others still append
            assert isinstance(raw.append(SEGMENT, b"x" * 100), p.DataAppended)
    finally:
        for raw in socks:
            raw.close()


def test_the_budget_stops_reading_once_spent_and_resumes_when_it_frees(start_serve: Any) -> None:
    budget = 32 * MIB
    serve = start_serve(
        *listener_args(segment_store=free_port(), http=free_port()),
        "--max-total-buffered-bytes",
        str(budget),
        "--max-frame-bytes",
        str(17 * MIB),
    )
    assert serve.process is not None
    with RawPravega(serve.ports["segment_store"]) as raw:
        assert raw.request(p.CreateSegment(1, SEGMENT, 0, 0)) == p.SegmentCreated(1, SEGMENT)
    before = rss_bytes(serve.process.pid)
    count, each = 10, 8 * MIB  # 80 MiB of frames that never finish, against 32 MiB
    attackers = [RawPravega(serve.ports["segment_store"]) for _ in range(count)]
    try:
        for raw in attackers:
            send_until_stalled(raw.sock, large_frame_header(FRAME_BYTES) + b"a" * each, 0.5)
        wait_for(lambda: serve.metric("headrace_read_pauses_total") >= 1, "a pause")
        held = serve.metric("headrace_buffered_bytes")
        assert budget < held < 2 * budget, held
        assert serve.metric("headrace_buffered_bytes_limit") == budget
        assert rss_bytes(serve.process.pid) - before < 3 * budget
        # A connection that holds nothing is served while the budget is spent.
        assert health_s(serve) < 1.0
        with RawPravega(serve.ports["segment_store"]) as raw:
            assert isinstance(raw.append(SEGMENT, b"x" * 1000), p.DataAppended)
        # Half the attackers leave: the budget frees and the others read again.
        read_before = received(serve)
        for raw in attackers[: count // 2]:
            raw.close()
        wait_for(lambda: received(serve) > read_before, "paused connections to read again")
        wait_for(
            lambda: serve.metric("headrace_buffered_bytes") <= budget + 8 * MIB,
            "the budget to free",
        )
    finally:
        for raw in attackers:
            raw.close()
    wait_for(lambda: serve.metric("headrace_buffered_bytes") == 0, "every byte released")
