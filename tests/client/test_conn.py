"""SegmentStoreConnection against a scripted in-process server (no headrace serve).

The fake server speaks the protocol through ``PravegaConnection(Role.SERVER)``
and answers each request with what the test's ``answer`` function returns.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from uuid import uuid4

import pytest

from headrace.client._conn import (
    READ_CHUNK_BYTES,
    ConnectionPool,
    RetryPolicy,
    SegmentStoreConnection,
    connect_with_retry,
    map_exceptions,
    next_request_id,
)
from headrace.errors import ConnectionLost, RequestTimeout
from headrace.protocols import pravega as p

Answer = Callable[[object], list[p.Command] | None]

WAIT_S = 10.0
"""Bound on a wait for a reply of the fake server (it answers at once)."""


class FakeServer:
    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.received: list[object] = []
        self.got_request = asyncio.Event()  # set on each request received
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> tuple[str, int]:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        host, port = self.server.sockets[0].getsockname()[:2]
        return host, port

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        conn = p.PravegaConnection(p.Role.SERVER)
        try:
            while data := await reader.read(65536):
                conn.receive_data(data)
                for event in conn.events():
                    self.received.append(event)
                    self.got_request.set()
                    for reply in self.answer(event) or []:
                        conn.send(reply)
                writer.write(conn.data_to_send())
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def drop_connections(self) -> None:
        for w in self.writers:
            w.close()
        self.writers.clear()

    async def aclose(self) -> None:
        await self.drop_connections()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


@pytest.fixture
async def fake() -> AsyncIterator[FakeServer]:
    server = FakeServer(lambda e: None)
    yield server
    await server.aclose()


def _info_reply(event: object) -> list[p.Command] | None:
    if isinstance(event, p.GetStreamSegmentInfo):
        return [p.StreamSegmentInfo(event.request_id, event.segment_name, True, False, False, 0, 7)]
    return None


async def test_replies_matched_by_request_id_out_of_order(fake: FakeServer) -> None:
    held: list[p.GetStreamSegmentInfo] = []

    def answer(event: object) -> list[p.Command] | None:
        if isinstance(event, p.GetStreamSegmentInfo):
            held.append(event)
            if len(held) == 2:  # answer the second first
                return [
                    p.StreamSegmentInfo(e.request_id, e.segment_name, True, False, False, 0, i)
                    for i, e in reversed(list(enumerate(held)))
                ]
        return None

    fake.answer = answer
    conn = await SegmentStoreConnection.connect(*await fake.start())
    a = asyncio.create_task(conn.request(p.GetStreamSegmentInfo(next_request_id(), "a")))
    b = asyncio.create_task(conn.request(p.GetStreamSegmentInfo(next_request_id(), "b")))
    ra, rb = await a, await b
    assert isinstance(ra, p.StreamSegmentInfo) and ra.segment_name == "a" and ra.write_offset == 0
    assert isinstance(rb, p.StreamSegmentInfo) and rb.segment_name == "b" and rb.write_offset == 1
    await conn.aclose()


async def test_request_timeout_keeps_connection_and_drops_late_reply(fake: FakeServer) -> None:
    conn = await SegmentStoreConnection.connect(*await fake.start())  # never answers
    with pytest.raises(RequestTimeout):
        await conn.request(p.GetStreamSegmentInfo(next_request_id(), "x"), timeout_s=0.05)
    assert not conn.is_closed
    fake.answer = _info_reply
    reply = await conn.request(p.GetStreamSegmentInfo(next_request_id(), "y"))
    assert isinstance(reply, p.StreamSegmentInfo) and reply.segment_name == "y"
    await conn.aclose()


async def test_connection_lost_fails_pending_requests_and_tells_writers(fake: FakeServer) -> None:
    conn = await SegmentStoreConnection.connect(*await fake.start())
    lost: list[BaseException] = []

    class Listener:
        def reply(self, cmd: p.Command) -> None:
            raise AssertionError("no reply expected")

        def connection_lost(self, exc: BaseException) -> None:
            lost.append(exc)

    conn.attach_writer(uuid4(), Listener())
    fake.got_request.clear()  # (the Hello set it)
    pending = asyncio.create_task(conn.request(p.GetStreamSegmentInfo(next_request_id(), "x")))
    await fake.got_request.wait()  # the server holds the request (and never answers)
    await fake.drop_connections()
    with pytest.raises(ConnectionLost):
        await pending
    await conn.wait_closed()
    assert conn.is_closed and len(lost) == 1
    with pytest.raises(ConnectionLost):
        await conn.request(p.GetStreamSegmentInfo(next_request_id(), "again"))
    await conn.aclose()


async def test_writer_replies_routed_by_writer_id_and_append_request_id(fake: FakeServer) -> None:
    writer_id = uuid4()

    def answer(event: object) -> list[p.Command] | None:
        if isinstance(event, p.SetupAppend):
            return [p.AppendSetup(event.request_id, event.segment, event.writer_id, 41)]
        if isinstance(event, p.AppendData):
            return [p.SegmentIsSealed(event.request_id, event.segment)]
        return None

    fake.answer = answer
    conn = await SegmentStoreConnection.connect(*await fake.start())
    got: asyncio.Queue[p.Command] = asyncio.Queue()

    class Listener:
        def reply(self, cmd: p.Command) -> None:
            got.put_nowait(cmd)

        def connection_lost(self, exc: BaseException) -> None:
            pass

    conn.attach_writer(writer_id, Listener())
    rid = next_request_id()
    conn.send_append(writer_id, rid, p.SetupAppend(rid, writer_id, "sc/st/0.#epoch.0"))
    setup = await got.get()
    assert isinstance(setup, p.AppendSetup) and setup.last_event_number == 41
    rid = next_request_id()
    data = p.encode_event(b"x")
    conn.send_append(writer_id, rid, p.AppendBlockEnd(writer_id, len(data), data, 1, 42, rid))
    sealed = await got.get()  # no writer id in it: routed by the append's request id
    assert isinstance(sealed, p.SegmentIsSealed) and sealed.request_id == rid
    conn.detach_writer(writer_id)
    await conn.aclose()


async def test_an_error_reply_is_the_last_its_append_routes(fake: FakeServer) -> None:
    """An error reply ends an append: the connection forgets the append's request
    id then, as it does after DataAppended (a long-lived connection whose appends
    keep failing keeps no route per failed append)."""
    writer_id = uuid4()

    def answer(event: object) -> list[p.Command] | None:
        if isinstance(event, p.SetupAppend):
            return [p.AppendSetup(event.request_id, event.segment, event.writer_id, 0)]
        if isinstance(event, p.AppendData):  # a stray second reply for the same append
            return [p.SegmentIsSealed(event.request_id, event.segment)] * 2
        return _info_reply(event)

    fake.answer = answer
    conn = await SegmentStoreConnection.connect(*await fake.start())
    got: asyncio.Queue[p.Command] = asyncio.Queue()

    class Listener:
        def reply(self, cmd: p.Command) -> None:
            got.put_nowait(cmd)

        def connection_lost(self, exc: BaseException) -> None:
            pass

    conn.attach_writer(writer_id, Listener())
    rid = next_request_id()
    conn.send_append(writer_id, rid, p.SetupAppend(rid, writer_id, "sc/st/0.#epoch.0"))
    assert isinstance(await asyncio.wait_for(got.get(), WAIT_S), p.AppendSetup)
    rid = next_request_id()
    data = p.encode_event(b"x")
    conn.send_append(writer_id, rid, p.AppendBlockEnd(writer_id, len(data), data, 1, 1, rid))
    assert isinstance(await asyncio.wait_for(got.get(), WAIT_S), p.SegmentIsSealed)
    # The fake answers in order: once this reply is in, the stray one came before it.
    await conn.request(p.GetStreamSegmentInfo(next_request_id(), "barrier"))
    assert got.empty()
    await conn.aclose()


async def test_hello_with_incompatible_version_is_connection_lost() -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(100)
        writer.write(p.encode_command(p.Hello(2, 1)))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    with pytest.raises(ConnectionLost):
        await SegmentStoreConnection.connect("127.0.0.1", port)
    server.close()
    await server.wait_closed()


async def test_connect_refused_retries_then_gives_up() -> None:
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()  # nothing listens there now
    policy = RetryPolicy(initial_delay_s=0.001, max_delay_s=0.002, max_attempts=3)
    with pytest.raises(ConnectionLost):
        await connect_with_retry(("127.0.0.1", port), policy)
    assert len(list(policy.delays())) == 2


async def test_pool_reuses_and_reopens(fake: FakeServer) -> None:
    fake.answer = _info_reply
    endpoint = await fake.start()
    pool = ConnectionPool()
    first = await pool.get(endpoint)
    assert await pool.get(endpoint) is first
    await fake.drop_connections()
    await first.wait_closed()
    second = await pool.get(endpoint)
    assert second is not first
    reply = await second.request(p.GetStreamSegmentInfo(next_request_id(), "z"))
    assert isinstance(reply, p.StreamSegmentInfo)
    await pool.aclose()
    with pytest.raises(ConnectionLost):
        await pool.get(endpoint)


def test_map_exceptions_translates_os_errors_and_timeouts() -> None:
    with pytest.raises(ConnectionLost), map_exceptions("op"):
        raise ConnectionResetError("reset")
    with pytest.raises(RequestTimeout), map_exceptions("op"):
        raise TimeoutError
    assert ConnectionLost.retriable and RequestTimeout.retriable


# ---------------------------------------------------------------------- receiving frames


async def _scripted(send: Callable[[asyncio.StreamWriter], Awaitable[None]]) -> asyncio.Server:
    """A server that answers the Hello, then runs ``send`` (raw bytes, however cut)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = p.PravegaConnection(p.Role.SERVER)
        while conn.peer_hello is None:
            data = await reader.read(65536)
            if not data:
                return
            conn.receive_data(data)
            list(conn.events())
        writer.write(conn.data_to_send())
        try:
            await send(writer)
        finally:
            writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0)


def _segment_read(rid: int, size: int) -> p.SegmentRead:
    data = bytes(i % 251 for i in range(size))
    return p.SegmentRead("sc/st/0.#epoch.0", 0, False, False, data, rid)


async def test_large_and_small_replies_cut_anywhere_arrive_whole() -> None:
    """Replies written in pieces that cut headers and payloads at odd places; those
    larger than the chunk buffer come out as views of their frame (not copied)."""
    sizes = [300_001, 5, 2 * 1024 * 1024, 64 * 1024 - 1, 64 * 1024, 70_000, 0, 1_000_000]
    replies = [_segment_read(1000 + i, size) for i, size in enumerate(sizes)]
    stream = b"".join(p.encode_command(r) for r in replies)
    cuts = [3, 7, 8, 9, 65_535, 1, 131_072, 300_000, 2, 5, 1_048_576]

    async def send(writer: asyncio.StreamWriter) -> None:
        pos = i = 0
        while pos < len(stream):
            step = cuts[i % len(cuts)]
            writer.write(stream[pos : pos + step])
            await writer.drain()
            pos += step
            i += 1
        await asyncio.Event().wait()  # keep the connection open until the client closes

    server = await _scripted(send)
    port = server.sockets[0].getsockname()[1]
    conn = await SegmentStoreConnection.connect("127.0.0.1", port)
    got: dict[int, p.Command] = {}
    all_in = asyncio.Event()

    class Listener:
        def reply(self, cmd: p.Command) -> None:
            raise AssertionError("not a writer reply")

        def connection_lost(self, exc: BaseException) -> None:
            pass

    original = conn._dispatch

    def record(cmd: p.Command) -> None:
        got[getattr(cmd, "request_id")] = cmd  # noqa: B009
        if len(got) == len(replies):
            all_in.set()
        original(cmd)

    conn._dispatch = record  # type: ignore[method-assign]
    async with asyncio.timeout(30):
        await all_in.wait()
    for reply in replies:
        received = got[reply.request_id]
        assert isinstance(received, p.SegmentRead)
        assert received.data == reply.data
        if len(reply.data) > READ_CHUNK_BYTES:  # cannot be whole in the chunk buffer
            assert isinstance(received.data, memoryview)  # the frame's own buffer, not a copy
    assert not conn.is_closed
    await conn.aclose()
    server.close()


@pytest.mark.parametrize(
    "header",
    [
        struct.pack(">ii", p.CommandType.SEGMENT_READ, -5),  # negative length
        struct.pack(">ii", p.CommandType.SEGMENT_READ, p.MAX_FRAME_BYTES),  # over the limit
        struct.pack(">ii", 31_337, 1_000_000),  # no such type: refused before its payload
    ],
)
async def test_a_bad_frame_header_closes_the_connection(header: bytes) -> None:
    async def send(writer: asyncio.StreamWriter) -> None:
        writer.write(header + bytes(100))
        await writer.drain()
        await asyncio.Event().wait()  # the client must close, not wait for more bytes

    server = await _scripted(send)
    conn = await SegmentStoreConnection.connect("127.0.0.1", server.sockets[0].getsockname()[1])
    with pytest.raises(ConnectionLost, match="protocol error"):
        await conn.request(p.GetStreamSegmentInfo(next_request_id(), "x"), timeout_s=30)
    assert conn.is_closed
    await conn.aclose()
    server.close()


async def test_eof_inside_a_large_frame_fails_pending_requests() -> None:
    frame = p.encode_command(_segment_read(7, 500_000))

    async def send(writer: asyncio.StreamWriter) -> None:
        writer.write(frame[: len(frame) // 2])  # then close: the frame is never finished
        await writer.drain()

    server = await _scripted(send)
    conn = await SegmentStoreConnection.connect("127.0.0.1", server.sockets[0].getsockname()[1])
    with pytest.raises(ConnectionLost, match="closed inside a frame"):
        await conn.request(p.GetStreamSegmentInfo(next_request_id(), "x"), timeout_s=30)
    await conn.wait_closed()
    await conn.aclose()
    server.close()


# ---------------------------------------------------------------------- early read headers


@pytest.mark.parametrize("first_piece", [5, 9, 30, 100_000])
async def test_a_read_header_is_told_before_the_data_has_come(first_piece: int) -> None:
    """A large SegmentRead's fields reach ``watch_read_header`` while its data is
    still on the way: the server sends the rest only once the client was told
    (however the frame's first bytes are cut)."""
    reply = p.SegmentRead("sc/st/0.#epoch.0", 4096, False, False, bytes(2 * 1024 * 1024), 77)
    frame = p.encode_command(reply)
    told = asyncio.Event()
    armed = asyncio.Event()

    async def send(writer: asyncio.StreamWriter) -> None:
        async with asyncio.timeout(30):
            await armed.wait()
        writer.write(frame[:first_piece])
        await writer.drain()
        await asyncio.sleep(0)
        writer.write(frame[first_piece:100_000])
        await writer.drain()
        async with asyncio.timeout(30):
            await told.wait()
        writer.write(frame[100_000:])
        await writer.drain()
        await asyncio.Event().wait()

    server = await _scripted(send)
    conn = await SegmentStoreConnection.connect("127.0.0.1", server.sockets[0].getsockname()[1])
    calls: list[tuple[int, bool, bool]] = []
    waiting = asyncio.get_running_loop().create_future()
    conn._pending[77] = waiting

    def on_header(length: int, at_tail: bool, end_of_segment: bool) -> None:
        assert not waiting.done()  # told before the reply is whole
        calls.append((length, at_tail, end_of_segment))
        told.set()

    def not_this(length: int, at_tail: bool, end_of_segment: bool) -> None:
        raise AssertionError("another offset's watcher was called")

    conn.watch_read_header("sc/st/0.#epoch.0", 4096, on_header)
    conn.watch_read_header("sc/st/0.#epoch.0", 0, not_this)
    armed.set()
    async with asyncio.timeout(30):
        got = await waiting
    assert calls == [(2 * 1024 * 1024, False, False)]
    assert isinstance(got, p.SegmentRead) and got.data == reply.data
    conn.unwatch_read_header("sc/st/0.#epoch.0", 0, not_this)
    assert not conn._read_watchers
    await conn.aclose()
    server.close()


async def test_frame_buffers_are_reused_only_when_nothing_holds_them() -> None:
    """Large replies are received into pooled buffers; a reply whose data (or a
    slice of it) is still held keeps its bytes while later replies arrive."""
    count = 12
    replies = [
        p.SegmentRead("sc/st/0.#epoch.0", i, False, False, bytes([i]) * 1_000_000, 500 + i)
        for i in range(count)
    ]

    taken: asyncio.Queue[None] = asyncio.Queue()

    async def send(writer: asyncio.StreamWriter) -> None:
        for reply in replies:  # the next once the test is done with the last
            writer.write(p.encode_command(reply))
            await writer.drain()
            async with asyncio.timeout(30):
                await taken.get()
        await asyncio.Event().wait()

    server = await _scripted(send)
    conn = await SegmentStoreConnection.connect("127.0.0.1", server.sockets[0].getsockname()[1])
    loop = asyncio.get_running_loop()
    waiting = {r.request_id: loop.create_future() for r in replies}
    conn._pending.update(waiting)  # type: ignore[arg-type]
    kept: dict[int, memoryview] = {}
    async with asyncio.timeout(30):
        for i, reply in enumerate(replies):
            got = await waiting.pop(reply.request_id)
            del conn._pending[reply.request_id]  # as request() does once answered
            assert isinstance(got, p.SegmentRead) and isinstance(got.data, memoryview)
            assert got.data == reply.data
            if i in (0, 5):
                kept[i] = got.data  # the whole view
            elif i == 2:
                kept[i] = got.data[10:20]  # only a slice of it
            del got
            taken.put_nowait(None)
    for i, data in kept.items():
        assert bytes(data) == bytes([i]) * len(data), f"reply {i} changed under its view"
    held = {id(data.obj) for data in kept.values()}
    assert len(held) == 3  # three buffers, none handed out twice while held
    allocated, reused = conn.frame_buffers
    assert allocated + reused == count
    assert reused > 0  # the replies nobody kept went into earlier buffers
    await conn.aclose()
    server.close()
