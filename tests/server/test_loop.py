"""The generic connection loop and accept loop, over real loopback sockets.

A tiny line protocol stands in for a front door: ``wait NAME`` parks until
``go NAME`` arrives (on any connection), ``echo TEXT`` answers at once,
``bad`` is a protocol error. Everything here is about the loop, not the protocol.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest

from headrace.errors import RemoteProtocolError
from headrace.server._context import Listener, ListenerSettings
from headrace.server._listen import start_tcp_listener
from headrace.server._loop import ConnectionHandler, ConnectionLimits

WAIT_S = 10.0  # bound on every wait in these tests


class LineHandler(ConnectionHandler):
    name = "lines"

    def __init__(self, gates: dict[str, asyncio.Event], closed: list[str]) -> None:
        self._buffer = b""
        self._out = bytearray()
        self._gates = gates
        self._closed = closed

    def feed(self, data: bytes) -> Iterator[object]:
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            if line == b"bad":
                raise RemoteProtocolError("bad line", reply_hint=b"error: bad line\n")
            yield line.decode()

    def sequential(self, event: object) -> bool:
        return str(event).startswith("seq ")

    async def handle(self, event: object) -> None:
        verb, _, arg = str(event).partition(" ")
        if verb == "wait":
            await self._gates.setdefault(arg, asyncio.Event()).wait()
            self._out += f"done {arg}\n".encode()
        elif verb == "go":
            self._gates.setdefault(arg, asyncio.Event()).set()
            self._out += f"went {arg}\n".encode()
        elif verb == "seq":
            name, _, gate = arg.partition(" ")
            if gate:
                await self._gates.setdefault(gate, asyncio.Event()).wait()
            self._out += f"seq {name}\n".encode()
        elif verb == "crash":
            raise ValueError("handler bug")
        else:
            self._out += f"echo {arg}\n".encode()

    def data_to_send(self) -> bytes:
        data, self._out = bytes(self._out), bytearray()
        return data

    def on_protocol_error(self, exc: RemoteProtocolError) -> None:
        assert isinstance(exc.reply_hint, bytes)
        self._out += exc.reply_hint

    def on_start(self) -> None:
        self._out += b"hello\n"

    async def on_close(self) -> None:
        self._closed.append("closed")


class InlineLineHandler(LineHandler):
    """Every event starts in the read loop (``inline``); ``fut NAME`` awaits a future
    shared by every waiter of that name (as appends await a sync round's future)."""

    futures: dict[str, asyncio.Future[None]] = {}

    def inline(self, event: object) -> bool:
        return True

    async def handle(self, event: object) -> None:
        verb, _, arg = str(event).partition(" ")
        if verb == "fut":
            future = self.futures.get(arg)
            if future is None:
                future = self.futures[arg] = asyncio.get_running_loop().create_future()
            await future
            self._out += f"resolved {arg}\n".encode()
        elif verb == "resolve":
            self.futures.setdefault(arg, asyncio.get_running_loop().create_future())
            self.futures[arg].set_result(None)
            self._out += f"resolving {arg}\n".encode()
        else:
            await super().handle(event)


@pytest.fixture
async def gates() -> dict[str, asyncio.Event]:
    return {}


@pytest.fixture
async def closed() -> list[str]:
    return []


@pytest.fixture(params=[LineHandler, InlineLineHandler], ids=["tasks", "inline"])
async def listener(
    request: pytest.FixtureRequest, gates: dict[str, asyncio.Event], closed: list[str]
) -> AsyncIterator[Listener]:
    """Every loop behaviour holds whether events start in tasks or in the read loop."""
    kind: type[LineHandler] = request.param
    InlineLineHandler.futures = {}
    listener = await start_tcp_listener(
        "lines", "127.0.0.1", 0, lambda: kind(gates, closed), max_connections=3
    )
    yield listener
    await listener.aclose()


async def _connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), WAIT_S)
    assert await _line(reader) == "hello"
    return reader, writer


async def _line(reader: asyncio.StreamReader) -> str:
    return (await asyncio.wait_for(reader.readline(), WAIT_S)).decode().rstrip("\n")


async def _close(writer: asyncio.StreamWriter) -> None:
    writer.close()
    await writer.wait_closed()


async def test_parked_event_does_not_stall_later_ones(listener: Listener) -> None:
    reader, writer = await _connect(listener.port)
    writer.write(b"wait a\necho 1\necho 2\ngo a\n")
    got = [await _line(reader) for _ in range(4)]
    assert got[:2] == ["echo 1", "echo 2"]
    assert sorted(got[2:]) == ["done a", "went a"]
    await _close(writer)


async def test_sequential_events_keep_their_order(listener: Listener) -> None:
    reader, writer = await _connect(listener.port)
    writer.write(b"seq first g\nseq second\necho x\n")
    assert await _line(reader) == "echo x"  # not sequential: runs at once
    other_reader, other_writer = await _connect(listener.port)
    other_writer.write(b"go g\n")
    assert await _line(other_reader) == "went g"
    assert [await _line(reader), await _line(reader)] == ["seq first", "seq second"]
    await _close(writer)
    await _close(other_writer)


async def test_protocol_error_gets_reply_then_close_and_spares_others(
    listener: Listener, closed: list[str]
) -> None:
    reader, writer = await _connect(listener.port)
    other_reader, other_writer = await _connect(listener.port)
    writer.write(b"echo before\nbad\necho after\n")
    replies = {await _line(reader), await _line(reader)}
    assert replies == {"echo before", "error: bad line"}
    assert await asyncio.wait_for(reader.read(), WAIT_S) == b""  # closed, 'after' never ran
    other_writer.write(b"echo still here\n")
    assert await _line(other_reader) == "echo still here"
    await _close(writer)
    await _close(other_writer)
    assert "closed" in closed


async def test_handler_exception_closes_only_that_connection(listener: Listener) -> None:
    reader, writer = await _connect(listener.port)
    other_reader, other_writer = await _connect(listener.port)
    writer.write(b"crash\n")
    assert await asyncio.wait_for(reader.read(), WAIT_S) == b""
    other_writer.write(b"echo ok\n")
    assert await _line(other_reader) == "echo ok"
    await _close(writer)
    await _close(other_writer)


async def test_half_closed_client_still_gets_its_replies(listener: Listener) -> None:
    reader, writer = await _connect(listener.port)
    writer.write(b"echo one\necho two\n")
    writer.write_eof()
    assert await asyncio.wait_for(reader.read(), WAIT_S) == b"echo one\necho two\n"
    await _close(writer)


async def test_connections_over_the_limit_are_refused(listener: Listener) -> None:
    held = [await _connect(listener.port) for _ in range(3)]
    reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
    assert await asyncio.wait_for(reader.read(), WAIT_S) == b""
    await _close(writer)
    for _, w in held:
        await _close(w)


async def test_closing_the_listener_ends_parked_connections(
    gates: dict[str, asyncio.Event], closed: list[str]
) -> None:
    listener = await start_tcp_listener("lines", "127.0.0.1", 0, lambda: LineHandler(gates, closed))
    reader, writer = await _connect(listener.port)
    writer.write(b"wait never\n")
    writer.write(b"echo parked\n")
    assert await _line(reader) == "echo parked"
    await asyncio.wait_for(listener.aclose(), WAIT_S)
    assert await asyncio.wait_for(reader.read(), WAIT_S) == b""
    assert closed == ["closed"]
    await _close(writer)


class BusyHandler(LineHandler):
    """``hold`` makes the connection busy, ``release`` makes it idle again."""

    def __init__(self, asked: asyncio.Event) -> None:
        super().__init__({}, [])
        self.holding = False
        self.asked_count = 0
        self._asked = asked

    async def handle(self, event: object) -> None:
        if event == "hold":
            self.holding = True
        elif event == "release":
            self.holding = False
        await super().handle(event)

    def busy(self) -> bool:
        self.asked_count += 1
        if self.asked_count >= 3:
            self._asked.set()
        return self.holding


async def test_busy_connection_outlives_the_idle_timeout() -> None:
    asked = asyncio.Event()
    listener = await start_tcp_listener(
        "lines", "127.0.0.1", 0, lambda: BusyHandler(asked), idle_timeout_s=0.05
    )
    try:
        reader, writer = await _connect(listener.port)
        writer.write(b"hold\n")
        assert await _line(reader) == "echo "
        await asyncio.wait_for(asked.wait(), WAIT_S)  # three idle periods went by
        writer.write(b"echo still open\n")
        assert await _line(reader) == "echo still open"
        writer.write(b"release\n")
        assert await _line(reader) == "echo "
        # Idle and not busy: the next timeout closes it.
        assert await asyncio.wait_for(reader.read(), WAIT_S) == b""
        await _close(writer)
    finally:
        await listener.aclose()


async def test_inline_events_sharing_one_future_all_finish() -> None:
    """Several events started in the read loop park on the same future and all
    resume, in order, when it resolves (each must be handed to its task at once)."""
    InlineLineHandler.futures = {}
    listener = await start_tcp_listener("lines", "127.0.0.1", 0, lambda: InlineLineHandler({}, []))
    reader, writer = await _connect(listener.port)
    writer.write(b"fut r\nfut r\nfut r\necho meanwhile\n")
    assert await _line(reader) == "echo meanwhile"
    writer.write(b"resolve r\n")
    assert [await _line(reader) for _ in range(4)] == [
        "resolving r",
        "resolved r",
        "resolved r",
        "resolved r",
    ]
    await _close(writer)
    await listener.aclose()


async def test_inline_event_parked_on_a_future_is_cancelled_at_close() -> None:
    """Closing the listener cancels an inline event parked on a future: the future
    is cancelled (as a task's would be), the connection closes, on_close runs."""
    InlineLineHandler.futures = {}
    closed: list[str] = []
    listener = await start_tcp_listener(
        "lines", "127.0.0.1", 0, lambda: InlineLineHandler({}, closed)
    )
    reader, writer = await _connect(listener.port)
    writer.write(b"fut never\necho parked\n")
    assert await _line(reader) == "echo parked"
    await asyncio.wait_for(listener.aclose(), WAIT_S)
    assert await asyncio.wait_for(reader.read(), WAIT_S) == b""
    assert closed == ["closed"]
    assert InlineLineHandler.futures["never"].cancelled()
    await _close(writer)


class LazyLineHandler(LineHandler):
    """Cuts lines out of the fed bytes only as each is asked for: a feed that still
    holds the loop's receive buffer (shared by the listener's connections) while
    its events are being started, as Lumberjack's chunked feed does."""

    def feed(self, data: bytes) -> Iterator[object]:
        view = memoryview(data)
        start = 0
        while (end := bytes(view[start:]).find(b"\n")) >= 0:
            if self._buffer:
                line, self._buffer = self._buffer + bytes(view[start : start + end]), b""
            else:
                line = bytes(view[start : start + end])
            start += end + 1
            yield line.decode()  # the next line is cut from the view only after this
        self._buffer += bytes(view[start:])


async def test_a_backlog_never_sees_another_connections_bytes() -> None:
    """At the pending-event limit the loop takes a read's remaining events at once
    (before any other connection's bytes can land in the shared receive buffer),
    so events held back until a slot frees are still the bytes their peer sent."""
    gates: dict[str, asyncio.Event] = {}
    listener = await start_tcp_listener(
        "lines",
        "127.0.0.1",
        0,
        lambda: LazyLineHandler(gates, []),
        settings=ListenerSettings(ConnectionLimits(max_pending_requests=1)),
    )
    try:
        first, first_writer = await _connect(listener.port)
        second, second_writer = await _connect(listener.port)
        # The wait holds the first connection's one slot; its echoes wait in the backlog.
        first_writer.write(b"wait g\n" + b"".join(b"echo first-%d\n" % i for i in range(50)))
        second_writer.write(b"".join(b"echo other-%d\n" % i for i in range(50)) + b"go g\n")
        assert [await _line(second) for _ in range(51)] == [
            *(f"echo other-{i}" for i in range(50)),
            "went g",
        ]
        assert [await _line(first) for _ in range(51)] == [
            "done g",
            *(f"echo first-{i}" for i in range(50)),
        ]
        await _close(first_writer)
        await _close(second_writer)
    finally:
        await listener.aclose()
