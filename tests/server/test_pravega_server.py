"""The Pravega segment-store front door over real loopback sockets.

A small raw client (our own sans-I/O ``PravegaConnection`` in the client role)
talks to ``start_segment_store`` on a ``ServerApp`` whose store is the disk
store in a temporary directory (or a memory store where durability is not the
point). Every wait is bounded by ``WAIT_S``; nothing sleeps to synchronise.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from headrace.protocols import pravega as p
from headrace.server._context import Listener
from headrace.server.app import ServerApp
from headrace.server.config import DEFAULT_PORTS, ServerConfig
from headrace.server.listeners import STARTERS
from headrace.server.pravega import (
    MAX_READ_REPLY_BYTES,
    MAX_UNSENT_REPLY_BYTES,
    READ_HOLD_S,
    PravegaHandler,
    serve_segment_store,
    start_segment_store,
)
from headrace.store.api import MAX_TABLE_VALUE_BYTES, SegmentStore
from headrace.store.memory import MemoryStore
from headrace.types import NOT_EXISTS, NULL_ATTRIBUTE_VALUE, TableUpdate

WAIT_S = 10.0  # bound on every wait in these tests
NULL = NULL_ATTRIBUTE_VALUE
SEG = "sc/st/0.#epoch.0"


class Raw:
    """One client connection: send commands, receive replies, with deadlines."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.conn = p.PravegaConnection(p.Role.CLIENT)

    @classmethod
    async def connect(cls, port: int) -> Raw:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), WAIT_S)
        raw = cls(reader, writer)
        await raw.flush()
        hello = await raw.recv()
        assert hello == p.Hello(p.WIRE_VERSION, p.OLDEST_COMPATIBLE_VERSION)
        return raw

    async def flush(self) -> None:
        self.writer.write(self.conn.data_to_send())
        await self.writer.drain()

    async def send(self, *cmds: p.Command) -> None:
        for cmd in cmds:
            self.conn.send(cmd)
        await self.flush()

    async def recv(self) -> p.Command:
        while True:
            event = self.conn.next_event()
            if event is not None:
                assert isinstance(event, p.Command), event
                return event
            data = await asyncio.wait_for(self.reader.read(1 << 20), WAIT_S)
            self.conn.receive_data(data)

    async def request(self, cmd: p.Command) -> p.Command:
        await self.send(cmd)
        return await self.recv()

    async def closed_by_server(self) -> bool:
        """Whether the server closes the connection (EOF) within the deadline."""
        while True:
            data = await asyncio.wait_for(self.reader.read(1 << 20), WAIT_S)
            if not data:
                return True

    async def aclose(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()


class Server:
    def __init__(self, app: ServerApp, listener: Listener) -> None:
        self.app = app
        self.listener = listener
        self.port = listener.port

    @property
    def store(self) -> SegmentStore:
        return self.app.store

    async def aclose(self) -> None:
        await self.listener.aclose()
        await self.app.aclose()


def _config(data_dir: Path) -> ServerConfig:
    return ServerConfig(data_dir=data_dir, ports=dict.fromkeys(DEFAULT_PORTS, 0))


async def _start(data_dir: Path, store: SegmentStore | None = None) -> Server:
    app = ServerApp(_config(data_dir), store=store)
    await app.start()  # every port is 0: this only opens the store
    listener = await start_segment_store(app.listener_context, "127.0.0.1", 0)
    return Server(app, listener)


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Server]:
    srv = await _start(tmp_path / "data")
    yield srv
    await srv.aclose()


@pytest.fixture
async def fast_hold(tmp_path: Path) -> AsyncIterator[tuple[MemoryStore, Listener]]:
    """A memory store behind a listener whose tail reads are held for 0.3 s only."""
    store = MemoryStore()
    listener = await serve_segment_store(store, "127.0.0.1", 0, read_hold_s=0.3)
    yield store, listener
    await listener.aclose()
    await store.close()


def _events(*payloads: bytes) -> bytes:
    return b"".join(p.encode_event(x) for x in payloads)


def _abe(w: uuid.UUID, data: bytes, n: int, last: int, rid: int) -> p.AppendBlockEnd:
    return p.AppendBlockEnd(w, len(data), data, n, last, rid)


async def _read_all(store: SegmentStore, name: str) -> bytes:
    info = await store.info(name)
    return (await store.read(name, info.start_offset, info.length)).data


# ------------------------------------------------------------------------ registration, handshake


def test_listener_is_in_the_starters_table() -> None:
    assert STARTERS["segment_store"] is start_segment_store


async def test_incompatible_hello_gets_our_hello_then_close(server: Server) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(p.encode_command(p.Hello(4, 2)))
    reply = await asyncio.wait_for(reader.read(), WAIT_S)  # everything until EOF
    assert reply == p.encode_command(p.Hello(17, 5))
    writer.close()


async def test_keep_alive_is_echoed(server: Server) -> None:
    raw = await Raw.connect(server.port)
    assert await raw.request(p.KeepAlive()) == p.KeepAlive()
    await raw.aclose()


async def test_unsupported_request_gets_operation_unsupported(server: Server) -> None:
    raw = await Raw.connect(server.port)
    reply = await raw.request(p.LocateOffset(3, SEG, 0))
    assert reply == p.OperationUnsupported(3, "LocateOffset", "")
    assert await raw.request(p.KeepAlive()) == p.KeepAlive()  # still open
    await raw.aclose()


# --------------------------------------------------------------------------- appends


async def test_setup_append_on_missing_segment_echoes_name(server: Server) -> None:
    raw = await Raw.connect(server.port)
    name = "sc/st/7.#epoch.3#transaction.0000000000000000000000000000002a"
    w = uuid.uuid4()
    assert await raw.request(p.SetupAppend(9, w, name)) == p.NoSuchSegment(9, name, "", -1)
    await raw.aclose()


async def test_append_block_end_is_acked_with_the_spec_bytes(server: Server) -> None:
    # Two events "ab", "xyz" (event numbers 1..2), request id 7.
    await server.store.create_segment(SEG)
    raw = await Raw.connect(server.port)
    w = uuid.UUID("00112233445566778899aabbccddeeff")
    assert await raw.request(p.SetupAppend(6, w, SEG)) == p.AppendSetup(6, SEG, w, NULL)
    await raw.send(_abe(w, _events(b"ab", b"xyz"), 2, 2, 7))
    raw_reply = await asyncio.wait_for(raw.reader.readexactly(56), WAIT_S)
    assert raw_reply == bytes.fromhex(
        "00000007 00000030"
        "00112233445566778899aabbccddeeff"
        "0000000000000002"
        "8000000000000000"
        "0000000000000007"
        "0000000000000015"
    )
    assert await _read_all(server.store, SEG) == _events(b"ab", b"xyz")
    await raw.aclose()


async def test_pipelined_appends_are_acked_in_order_and_stored_in_order(server: Server) -> None:
    await server.store.create_segment(SEG)
    raw = await Raw.connect(server.port)
    w = uuid.uuid4()
    await raw.request(p.SetupAppend(1, w, SEG))
    batches = [_events(f"e{i}".encode() * (i + 1)) for i in range(20)]
    await raw.send(*(_abe(w, b, 1, i + 1, 100 + i) for i, b in enumerate(batches)))
    acks = [await raw.recv() for _ in batches]
    assert [a.event_number for a in acks if isinstance(a, p.DataAppended)] == list(range(1, 21))
    prev = [a.previous_event_number for a in acks if isinstance(a, p.DataAppended)]
    assert prev == [NULL, *range(1, 20)]
    assert [a.request_id_or_default for a in acks] == list(range(100, 120))
    assert await _read_all(server.store, SEG) == b"".join(batches)
    await raw.aclose()


async def test_legacy_append_block_with_partial_event(server: Server) -> None:
    await server.store.create_segment(SEG)
    raw = await Raw.connect(server.port)
    w = uuid.uuid4()
    await raw.request(p.SetupAppend(1, w, SEG))
    whole = _events(b"one", b"two")
    third = p.encode_event(b"three-split")
    block = whole + struct.pack(">ii", p.CommandType.PARTIAL_EVENT, 5) + third[:5]
    raw.writer.write(p.encode_command(p.AppendBlock(w, block)))
    raw.writer.write(p.encode_command(p.AppendBlockEnd(w, len(whole), third[5:], 3, 3, 2)))
    await raw.writer.drain()
    ack = await raw.recv()
    assert ack == p.DataAppended(w, 3, NULL, 2, len(whole) + len(third))
    assert await _read_all(server.store, SEG) == whole + third
    await raw.aclose()


async def test_dedup_survives_restart(tmp_path: Path) -> None:
    srv = await _start(tmp_path / "data")
    await srv.store.create_segment(SEG)
    raw = await Raw.connect(srv.port)
    w = uuid.uuid4()
    await raw.request(p.SetupAppend(1, w, SEG))
    data = _events(b"a", b"b", b"c")
    assert await raw.request(_abe(w, data, 3, 3, 2)) == p.DataAppended(w, 3, NULL, 2, len(data))
    await raw.aclose()
    await srv.aclose()

    srv = await _start(tmp_path / "data")
    raw = await Raw.connect(srv.port)
    assert await raw.request(p.SetupAppend(3, w, SEG)) == p.AppendSetup(3, SEG, w, 3)
    # A retry of events 1..3 (the client lost the ack) is acknowledged, not stored again.
    assert await raw.request(_abe(w, data, 3, 3, 4)) == p.DataAppended(w, 3, 3, 4, len(data))
    more = _events(b"d")
    assert await raw.request(_abe(w, more, 1, 4, 5)) == p.DataAppended(
        w, 4, 3, 5, len(data) + len(more)
    )
    assert await _read_all(srv.store, SEG) == data + more
    await raw.aclose()
    await srv.aclose()


async def test_many_writers_share_one_connection(server: Server) -> None:
    names = [f"sc/st/{i}.#epoch.0" for i in range(4)]
    writers = [uuid.uuid4() for _ in names]
    for name in names:
        await server.store.create_segment(name)
    raw = await Raw.connect(server.port)
    for i, (w, name) in enumerate(zip(writers, names, strict=True)):
        assert await raw.request(p.SetupAppend(i, w, name)) == p.AppendSetup(i, name, w, NULL)
    rid = 100
    for n in range(1, 4):
        for w, name in zip(writers, names, strict=True):
            await raw.send(_abe(w, _events(f"{name}:{n}".encode()), 1, n, rid))
            rid += 1
    acks = [await raw.recv() for _ in range(12)]
    for w in writers:
        mine = [a.event_number for a in acks if isinstance(a, p.DataAppended) and a.writer_id == w]
        assert mine == [1, 2, 3]
    for name in names:
        assert await _read_all(server.store, name) == _events(
            *(f"{name}:{n}".encode() for n in range(1, 4))
        )
    await raw.aclose()


async def test_conditional_append_failure_keeps_the_connection(server: Server) -> None:
    await server.store.create_segment(SEG)
    raw = await Raw.connect(server.port)
    w = uuid.uuid4()
    await raw.request(p.SetupAppend(1, w, SEG))
    ok = await raw.request(p.ConditionalBlockEnd(w, 1, 0, b"hello", 2))
    assert ok == p.DataAppended(w, 1, NULL, 2, 5)
    failed = await raw.request(p.ConditionalBlockEnd(w, 2, 0, b"again", 3))
    assert failed == p.ConditionalCheckFailed(w, 2, 3)
    ok = await raw.request(p.ConditionalBlockEnd(w, 3, 5, b" world", 4))
    assert ok == p.DataAppended(w, 3, 1, 4, 11)
    # ConditionalAppend (Java) stores the Event framing too.
    ok = await raw.request(p.ConditionalAppend(w, 4, 11, p.Event(b"x"), 5))
    assert ok == p.DataAppended(w, 4, 3, 5, 11 + 9)
    assert await _read_all(server.store, SEG) == b"hello world" + p.encode_event(b"x")
    await raw.aclose()


async def test_append_to_sealed_segment_gets_segment_is_sealed(server: Server) -> None:
    await server.store.create_segment(SEG)
    await server.store.append(SEG, b"12345")
    raw = await Raw.connect(server.port)
    w = uuid.uuid4()
    assert await raw.request(p.SetupAppend(1, w, SEG)) == p.AppendSetup(1, SEG, w, NULL)
    await server.store.seal(SEG)
    reply = await raw.request(_abe(w, _events(b"late"), 1, 1, 2))
    assert reply == p.SegmentIsSealed(2, SEG, "", 5)
    await raw.aclose()


async def test_large_event_through_a_transient_segment(server: Server) -> None:
    await server.store.create_segment(SEG)
    raw = await Raw.connect(server.port)
    w = uuid.uuid4()
    created = await raw.request(p.CreateTransientSegment(1, w, SEG))
    assert isinstance(created, p.SegmentCreated) and created.request_id == 1
    transient = created.segment
    assert transient.startswith(f"{SEG}#transient.{w.hex}.")
    assert await raw.request(p.SetupAppend(2, w, transient)) == p.AppendSetup(2, transient, w, NULL)
    event = p.encode_event(bytes(range(256)) * 40)  # chunked in 4 KiB pieces
    chunk = 4096
    for n, start in enumerate(range(0, len(event), chunk)):
        piece = event[start : start + chunk]
        reply = await raw.request(p.ConditionalBlockEnd(w, n, start, piece, 10 + n))
        assert reply == p.DataAppended(w, n, n - 1 if n else NULL, 10 + n, start + len(piece))
    merged = await raw.request(p.MergeSegments(50, SEG, transient))
    assert merged == p.SegmentsMerged(50, SEG, transient, len(event))
    assert await _read_all(server.store, SEG) == event
    assert transient not in await server.store.list_segments()
    missing = await raw.request(p.CreateTransientSegment(51, w, "sc/st/9.#epoch.0"))
    assert missing == p.NoSuchSegment(51, "sc/st/9.#epoch.0", "", -1)
    await raw.aclose()


# --------------------------------------------------------------------------- reads


async def test_read_returns_exactly_the_requested_offset(server: Server) -> None:
    await server.store.create_segment(SEG)
    await server.store.append(SEG, b"0123456789")
    raw = await Raw.connect(server.port)
    assert await raw.request(p.ReadSegment(SEG, 1, 5, "", 1)) == p.SegmentRead(
        SEG, 1, False, False, b"12345678", 1
    )
    assert await raw.request(p.ReadSegment(SEG, 4, 1 << 20, "", 2)) == p.SegmentRead(
        SEG, 4, True, False, b"456789", 2
    )
    # Asked for less than 8 bytes: Java serves max(8, suggested).
    assert await raw.request(p.ReadSegment(SEG, 0, 0, "", 3)) == p.SegmentRead(
        SEG, 0, False, False, b"01234567", 3
    )
    await raw.aclose()


async def test_read_reply_is_capped(server: Server) -> None:
    await server.store.create_segment(SEG)
    await server.store.append(SEG, b"x" * (3 * 1024 * 1024))
    raw = await Raw.connect(server.port)
    reply = await raw.request(p.ReadSegment(SEG, 0, 8 * 1024 * 1024, "", 1))
    assert isinstance(reply, p.SegmentRead)
    assert len(reply.data) == MAX_READ_REPLY_BYTES and reply.offset == 0 and not reply.at_tail
    await raw.aclose()


HELD_WINDOW_S = 0.5
"""How long the reads beyond what fits must stay unanswered (a bounded check
that something does not happen; a slow machine can only make it pass wrongly)."""


async def test_replies_a_client_does_not_read_are_bounded() -> None:
    store = MemoryStore()
    await store.create_segment(SEG)
    await store.append(SEG, b"x" * MAX_READ_REPLY_BYTES)
    handler = PravegaHandler(store)
    reads = [p.ReadSegment(SEG, 0, MAX_READ_REPLY_BYTES, "", rid) for rid in range(10)]
    frames = p.encode_command(p.Hello(15, 5)) + b"".join(map(p.encode_command, reads))
    events = list(handler.feed(frames))[1:]
    handler.data_to_send()  # our Hello
    tasks = {asyncio.create_task(handler.handle(e)) for e in events}
    fits = MAX_UNSENT_REPLY_BYTES // MAX_READ_REPLY_BYTES
    # Nothing is taken by a writer: only what fits is queued, the rest waits.
    done: set[asyncio.Task[None]] = set()
    waiting = tasks
    while len(done) < fits:  # bounded: each round must finish one more
        finished, waiting = await asyncio.wait(
            waiting, timeout=WAIT_S, return_when="FIRST_COMPLETED"
        )
        assert finished, f"only {len(done)} of the {fits} replies that fit were queued"
        done |= finished
    late, _ = await asyncio.wait(waiting, timeout=HELD_WINDOW_S)
    assert not late and len(done) == fits and len(waiting) == len(reads) - fits
    queued = handler.data_to_send()
    assert MAX_UNSENT_REPLY_BYTES <= len(queued) < MAX_UNSENT_REPLY_BYTES + 4096
    # Taking the bytes lets the next ones in, still bounded.
    while waiting:
        done, waiting = await asyncio.wait(waiting, timeout=WAIT_S, return_when="FIRST_COMPLETED")
        assert done
        assert len(handler.data_to_send()) < MAX_UNSENT_REPLY_BYTES + 4096
    await store.close()


async def test_a_client_that_takes_no_replies_is_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("headrace.server.pravega.MAX_REPLY_WAIT_S", 0.2)
    store = MemoryStore()
    await store.create_segment(SEG)
    await store.append(SEG, b"x" * MAX_READ_REPLY_BYTES)
    handler = PravegaHandler(store)
    fits = MAX_UNSENT_REPLY_BYTES // MAX_READ_REPLY_BYTES
    reads = [p.ReadSegment(SEG, 0, MAX_READ_REPLY_BYTES, "", rid) for rid in range(fits + 1)]
    frames = p.encode_command(p.Hello(15, 5)) + b"".join(map(p.encode_command, reads))
    events = list(handler.feed(frames))[1:]
    for event in events[:fits]:
        await handler.handle(event)
    with pytest.raises(TimeoutError, match="took no replies"):
        await asyncio.wait_for(handler.handle(events[-1]), WAIT_S)
    await store.close()


async def test_table_replies_larger_than_their_room_still_go_out() -> None:
    """A table read takes its room (``TABLE_READ_ROOM_BYTES``) before it is issued;
    a reply larger than that, or than the whole room, waits until the writer took
    everything queued, and then goes out: such replies never wait for each other."""
    store = MemoryStore()
    table = "sc/_tables/big"
    await store.create_table(table)
    value = b"v" * MAX_TABLE_VALUE_BYTES
    keys = [b"k%d" % i for i in range(10)]  # ~10 MiB a reply: over the whole room
    await store.update_table(table, [TableUpdate(k, value, NOT_EXISTS) for k in keys])
    handler = PravegaHandler(store)
    table_keys = tuple(p.TableKey(k, p.NO_VERSION) for k in keys)
    reads = [p.ReadTable(rid, table, "", table_keys) for rid in range(5)]
    frames = p.encode_command(p.Hello(15, 5)) + b"".join(map(p.encode_command, reads))
    events = list(handler.feed(frames))[1:]
    handler.data_to_send()  # our Hello
    waiting = {asyncio.create_task(handler.handle(e)) for e in events}
    answered = []
    while waiting:  # bounded: each round must let one more reply out
        done, waiting = await asyncio.wait(waiting, timeout=WAIT_S, return_when="FIRST_COMPLETED")
        assert done, f"{len(answered)} of {len(reads)} table replies went out"
        client = p.PravegaConnection(p.Role.CLIENT)
        client.receive_data(p.encode_command(p.Hello(15, 5)) + handler.data_to_send())
        answered += [r for r in client.events() if isinstance(r, p.TableRead)]
    assert sorted(r.request_id for r in answered) == list(range(len(reads)))
    assert all(len(r.entries.entries) == len(keys) for r in answered)
    await store.close()


async def test_the_handler_stores_no_append_its_setup_did_not_cover() -> None:
    """Behind the connection's own rule (no session before AppendSetup), the
    handler checks each append against the segment its writer's accepted
    SetupAppend named: an append for another segment, or from a writer whose
    setup it never accepted, is refused with AuthTokenCheckFailed, not stored."""
    store = MemoryStore()
    other = "sc/other/0.#epoch.0"
    for name in (SEG, other):
        await store.create_segment(name)
    handler = PravegaHandler(store)
    w, stranger = uuid.uuid4(), uuid.uuid4()
    frames = p.encode_command(p.Hello(15, 5)) + p.encode_command(p.SetupAppend(1, w, SEG))
    for event in handler.feed(frames):
        await handler.handle(event)
    data = _events(b"x")
    for append in [
        p.AppendData(w, other, data, 1, 1, 2),
        p.AppendData(stranger, SEG, data, 1, 1, 3),
    ]:
        await handler.handle(append)
    await handler.handle(p.AppendData(w, SEG, data, 1, 1, 4))
    client = p.PravegaConnection(p.Role.CLIENT)
    client.receive_data(handler.data_to_send())
    replies = [e for e in client.events() if not isinstance(e, p.Hello)]
    failed = p.AuthTokenCheckFailed.TOKEN_CHECK_FAILED
    assert [(type(r).__name__, r.request_id_or_default) for r in replies] == [
        ("AppendSetup", 1),
        ("AuthTokenCheckFailed", 2),
        ("AuthTokenCheckFailed", 3),
        ("DataAppended", 4),
    ]
    assert {r.error_code for r in replies if isinstance(r, p.AuthTokenCheckFailed)} == {failed}
    assert await _read_all(store, SEG) == data
    assert (await store.info(other)).length == 0
    await store.close()


async def test_read_errors_and_end_of_segment(server: Server) -> None:
    await server.store.create_segment(SEG)
    await server.store.append(SEG, b"0123456789")
    await server.store.truncate(SEG, 4)
    raw = await Raw.connect(server.port)
    assert await raw.request(p.ReadSegment(SEG, 2, 100, "", 1)) == p.SegmentIsTruncated(
        1, SEG, 4, "", 2
    )
    missing = "sc/other/0.#epoch.0"
    assert await raw.request(p.ReadSegment(missing, 5, 100, "", 2)) == p.NoSuchSegment(
        2, missing, "", 5
    )
    await server.store.seal(SEG)
    assert await raw.request(p.ReadSegment(SEG, 6, 100, "", 3)) == p.SegmentRead(
        SEG, 6, True, True, b"6789", 3
    )
    assert await raw.request(p.ReadSegment(SEG, 10, 100, "", 4)) == p.SegmentRead(
        SEG, 10, True, True, b"", 4
    )
    await raw.aclose()


async def test_tail_read_parks_until_an_append_arrives(server: Server) -> None:
    await server.store.create_segment(SEG)
    reader = await Raw.connect(server.port)
    await reader.send(p.ReadSegment(SEG, 0, 1 << 20, "", 1))
    # While the read is parked, the same connection serves a writer and other requests.
    w = uuid.uuid4()
    assert await reader.request(p.KeepAlive()) == p.KeepAlive()
    assert await reader.request(p.SetupAppend(2, w, SEG)) == p.AppendSetup(2, SEG, w, NULL)
    # Another connection appends; the parked read wakes with that data.
    writer = await Raw.connect(server.port)
    w2 = uuid.uuid4()
    await writer.request(p.SetupAppend(3, w2, SEG))
    data = _events(b"woken")
    assert await writer.request(_abe(w2, data, 1, 1, 4)) == p.DataAppended(
        w2, 1, NULL, 4, len(data)
    )
    assert await reader.recv() == p.SegmentRead(SEG, 0, True, False, data, 1)
    await reader.aclose()
    await writer.aclose()


async def test_tail_read_gets_an_empty_reply_after_the_hold(
    fast_hold: tuple[MemoryStore, Listener],
) -> None:
    store, listener = fast_hold
    await store.create_segment(SEG)
    raw = await Raw.connect(listener.port)
    start = time.monotonic()
    reply = await raw.request(p.ReadSegment(SEG, 0, 1 << 20, "", 1))
    assert reply == p.SegmentRead(SEG, 0, True, False, b"", 1)
    assert time.monotonic() - start >= 0.25  # parked, not answered at once
    # A read past the tail parks too, and wakes once the segment reaches it.
    await raw.send(p.ReadSegment(SEG, 3, 100, "", 2))
    await store.append(SEG, b"abcdef")
    assert await raw.recv() == p.SegmentRead(SEG, 3, True, False, b"def", 2)
    await raw.aclose()


async def test_client_leaving_releases_its_parked_reads(server: Server) -> None:
    await server.store.create_segment(SEG)
    raw = await Raw.connect(server.port)
    await raw.send(p.ReadSegment(SEG, 0, 100, "", 1))
    assert await raw.request(p.KeepAlive()) == p.KeepAlive()  # the read is parked
    raw.writer.write_eof()
    # The server closes at once, not after the rest of the 10 s hold.
    assert await asyncio.wait_for(raw.reader.read(), READ_HOLD_S / 3) == b""
    await raw.aclose()


async def test_tail_read_wakes_when_the_segment_is_sealed(server: Server) -> None:
    await server.store.create_segment(SEG)
    raw = await Raw.connect(server.port)
    await raw.send(p.ReadSegment(SEG, 0, 100, "", 1))
    assert await raw.request(p.KeepAlive()) == p.KeepAlive()  # the read is parked
    await server.store.seal(SEG)
    assert await raw.recv() == p.SegmentRead(SEG, 0, True, True, b"", 1)
    await raw.aclose()


# --------------------------------------------------------------------------- segment management


async def test_segment_info_and_missing_form(server: Server) -> None:
    await server.store.create_segment(SEG)
    await server.store.append(SEG, b"0123456789")
    await server.store.truncate(SEG, 2)
    raw = await Raw.connect(server.port)
    info = await raw.request(p.GetStreamSegmentInfo(1, SEG))
    assert isinstance(info, p.StreamSegmentInfo)
    assert (info.request_id, info.segment_name, info.exists, info.is_sealed) == (
        1,
        SEG,
        True,
        False,
    )
    assert (info.is_deleted, info.write_offset, info.start_offset) == (False, 10, 2)
    assert abs(info.last_modified - time.time() * 1000) < 60_000
    missing = await raw.request(p.GetStreamSegmentInfo(2, "nope"))
    assert missing == p.StreamSegmentInfo(2, "nope", False, True, True, 0, 0, 0)
    await raw.aclose()


async def test_create_seal_truncate_delete_policy(server: Server) -> None:
    raw = await Raw.connect(server.port)
    assert await raw.request(p.CreateSegment(1, SEG, 0, 0)) == p.SegmentCreated(1, SEG)
    assert await raw.request(p.CreateSegment(2, SEG, 0, 0)) == p.SegmentAlreadyExists(2, SEG, "")
    assert await raw.request(p.UpdateSegmentPolicy(3, SEG, 10, 1)) == p.SegmentPolicyUpdated(3, SEG)
    await server.store.append(SEG, b"0123456789")
    assert await raw.request(p.TruncateSegment(4, SEG, 4)) == p.SegmentTruncated(4, SEG)
    assert await raw.request(p.TruncateSegment(5, SEG, 11)) == p.SegmentIsTruncated(
        5, SEG, 10, "", 11
    )
    assert await raw.request(p.SealSegment(6, SEG)) == p.SegmentSealed(6, SEG)
    assert await raw.request(p.SealSegment(7, SEG)) == p.SegmentSealed(7, SEG)
    info = await server.store.info(SEG)
    assert (info.sealed, info.start_offset, info.length) == (True, 4, 10)
    assert await raw.request(p.DeleteSegment(8, SEG)) == p.SegmentDeleted(8, SEG)
    assert await raw.request(p.DeleteSegment(9, SEG)) == p.NoSuchSegment(9, SEG, "", -1)
    assert await raw.request(p.SealSegment(10, SEG)) == p.NoSuchSegment(10, SEG, "", -1)
    await raw.aclose()


async def test_merge_segments(server: Server) -> None:
    target, a, b = SEG, f"{SEG}#transaction.1", f"{SEG}#transaction.2"
    for name, data in ((target, b"T"), (a, b"AA"), (b, b"BBB")):
        await server.store.create_segment(name)
        await server.store.append(name, data)
    raw = await Raw.connect(server.port)
    assert await raw.request(p.MergeSegments(1, target, a)) == p.SegmentsMerged(1, target, a, 3)
    again = await raw.request(p.MergeSegments(2, target, a))  # already merged: still a success
    assert again == p.SegmentsMerged(2, target, a, 3)
    batch = await raw.request(p.MergeSegmentsBatch(3, target, (b,)))
    assert batch == p.SegmentsBatchMerged(3, target, (b,), (6,))
    assert await _read_all(server.store, target) == b"TAABBB"
    await server.store.create_segment(a + "x")
    await server.store.seal(target)
    assert await raw.request(p.MergeSegments(4, target, a + "x")) == p.SegmentIsSealed(
        4, target, "", 6
    )
    await raw.aclose()


async def test_segment_attributes(server: Server) -> None:
    await server.store.create_segment(SEG)
    raw = await Raw.connect(server.port)
    attr = uuid.uuid4()
    assert await raw.request(p.GetSegmentAttribute(1, SEG, attr)) == p.SegmentAttribute(1, NULL)
    assert await raw.request(
        p.UpdateSegmentAttribute(2, SEG, attr, 5, NULL)
    ) == p.SegmentAttributeUpdated(2, True)
    assert await raw.request(
        p.UpdateSegmentAttribute(3, SEG, attr, 6, 4)
    ) == p.SegmentAttributeUpdated(3, False)
    assert await raw.request(p.GetSegmentAttribute(4, SEG, attr)) == p.SegmentAttribute(4, 5)
    assert await raw.request(p.GetSegmentAttribute(5, "gone", attr)) == p.NoSuchSegment(
        5, "gone", "", -1
    )
    await raw.aclose()


# --------------------------------------------------------------------------- tables


def _entries(*items: tuple[bytes, bytes, int]) -> p.TableEntries:
    return p.TableEntries(tuple((p.TableKey(k, v), p.TableValue(val)) for k, val, v in items))


async def test_table_updates_versions_and_conditions(server: Server) -> None:
    table = "sc/rg_kvtable/0.#epoch.0"
    raw = await Raw.connect(server.port)
    assert await raw.request(p.CreateTableSegment(1, table)) == p.SegmentCreated(1, table)
    assert await raw.request(p.CreateTableSegment(2, table)) == p.SegmentAlreadyExists(2, table, "")
    new = _entries((b"key1", b"value1", p.NOT_EXISTS), (b"key2", b"value2", p.NOT_EXISTS))
    # Versions are record offsets (pravega.md#table-semantics): 0 and 17 + 4 + 6 = 27.
    assert await raw.request(p.UpdateTableEntries(3, table, "", new)) == p.TableEntriesUpdated(
        3, (0, 27)
    )
    assert await raw.request(p.UpdateTableEntries(4, table, "", new)) == p.TableKeyBadVersion(
        4, table, ""
    )
    absent = _entries((b"nokey", b"v", 5))
    assert await raw.request(p.UpdateTableEntries(5, table, "", absent)) == p.TableKeyDoesNotExist(
        5, table, ""
    )
    # The same key twice, each checked against the state before the batch.
    twice = _entries((b"key1", b"a", 0), (b"key1", b"b", 0))
    updated = await raw.request(p.UpdateTableEntries(6, table, "", twice))
    assert isinstance(updated, p.TableEntriesUpdated) and len(updated.versions) == 2
    assert 54 <= updated.versions[0] < updated.versions[1]
    stale_length = p.UpdateTableEntries(7, table, "", _entries((b"k3", b"v", p.NO_VERSION)), 1)
    reply = await raw.request(stale_length)
    assert isinstance(reply, p.SegmentIsTruncated) and (reply.segment, reply.offset) == (table, 1)
    read = await raw.request(
        p.ReadTable(8, table, "", (p.TableKey(b"key1"), p.TableKey(b"missing")))
    )
    assert read == p.TableRead(
        8, table, _entries((b"key1", b"b", updated.versions[1]), (b"missing", b"", -1))
    )
    await raw.aclose()


async def test_a_table_read_too_large_for_one_frame_is_refused(server: Server) -> None:
    """A ReadTable whose values would not fit one frame (the same 1 MiB value asked
    for twenty times) gets ErrorMessage(ILLEGAL_ARGUMENT) naming the limit, from
    values fetched a few keys at a time, and the connection goes on serving."""
    table = "sc/big_kvtable/0.#epoch.0"
    raw = await Raw.connect(server.port)
    assert await raw.request(p.CreateTableSegment(1, table)) == p.SegmentCreated(1, table)
    value = b"v" * MAX_TABLE_VALUE_BYTES
    put = _entries((b"big", value, p.NOT_EXISTS))
    assert isinstance(
        await raw.request(p.UpdateTableEntries(2, table, "", put)), p.TableEntriesUpdated
    )
    many = tuple(p.TableKey(b"big") for _ in range(20))
    reply = await raw.request(p.ReadTable(3, table, "", many))
    assert isinstance(reply, p.ErrorMessage), reply
    assert reply.error_code == p.ErrorMessage.ILLEGAL_ARGUMENT
    assert reply.request_id == 3 and "fewer keys" in reply.message
    one = await raw.request(p.ReadTable(4, table, "", many[:1]))
    assert isinstance(one, p.TableRead) and one.entries.entries[0][1].value == value
    await raw.aclose()


async def test_table_removals_and_delete(server: Server) -> None:
    table = "sc/t_kvtable/0.#epoch.0"
    raw = await Raw.connect(server.port)
    await raw.request(p.CreateTableSegment(1, table))
    v = await raw.request(p.UpdateTableEntries(2, table, "", _entries((b"a", b"1", p.NO_VERSION))))
    assert v == p.TableEntriesUpdated(2, (0,))
    assert await raw.request(
        p.RemoveTableKeys(3, table, "", (p.TableKey(b"a", 99),))
    ) == p.TableKeyBadVersion(3, table, "")
    assert await raw.request(
        p.RemoveTableKeys(4, table, "", (p.TableKey(b"zz", 0),))
    ) == p.TableKeyDoesNotExist(4, table, "")
    assert await raw.request(
        p.RemoveTableKeys(5, table, "", (p.TableKey(b"zz"),))  # unconditional, absent: fine
    ) == p.TableKeysRemoved(5, table)
    assert await raw.request(p.DeleteTableSegment(6, table, True)) == p.TableSegmentNotEmpty(
        6, table, ""
    )
    assert await raw.request(
        p.RemoveTableKeys(7, table, "", (p.TableKey(b"a", 0),))
    ) == p.TableKeysRemoved(7, table)
    info = await raw.request(p.GetTableSegmentInfo(8, table))
    assert isinstance(info, p.TableSegmentInfo) and info.entry_count == 0 and info.length > 0
    assert await raw.request(p.DeleteTableSegment(9, table, True)) == p.SegmentDeleted(9, table)
    assert await raw.request(p.DeleteTableSegment(10, table, False)) == p.NoSuchSegment(
        10, table, "", -1
    )
    # A table command on a plain segment is an illegal argument, not a crash.
    await server.store.create_segment(SEG)
    wrong = await raw.request(p.ReadTableEntriesDelta(11, SEG, "", 0, 10))
    assert isinstance(wrong, p.ErrorMessage) and wrong.segment == SEG
    assert wrong.error_code == p.ErrorMessage.ILLEGAL_ARGUMENT
    await raw.aclose()


INTERNAL_TABLE = "_system/tank/sc/seqnums"
INTERNAL_SEGMENT = "_system/other/0.#epoch.0"


def _changes(w: uuid.UUID) -> list[p.Command]:
    """One request of every kind that changes a segment, each naming an internal one."""
    key = (p.TableKey(b"sc/st", 0),)
    return [
        p.SetupAppend(1, w, INTERNAL_SEGMENT),
        p.CreateTransientSegment(2, w, INTERNAL_SEGMENT),
        p.CreateSegment(3, "_system/new/0.#epoch.0", 0, 0),
        p.SealSegment(4, INTERNAL_SEGMENT),
        p.DeleteSegment(5, INTERNAL_SEGMENT),
        p.UpdateSegmentPolicy(6, INTERNAL_SEGMENT, 10, 1),
        p.TruncateSegment(7, INTERNAL_SEGMENT, 1),
        p.MergeSegments(8, SEG, INTERNAL_SEGMENT),  # an internal source counts too
        p.MergeSegments(9, INTERNAL_SEGMENT, SEG),
        p.MergeSegmentsBatch(10, SEG, (f"{SEG}#transaction.1", INTERNAL_SEGMENT)),
        p.UpdateSegmentAttribute(11, INTERNAL_SEGMENT, uuid.uuid4(), 5, NULL),
        p.CreateTableSegment(12, "_system/controller/new"),
        p.DeleteTableSegment(13, INTERNAL_TABLE, False),
        p.UpdateTableEntries(14, INTERNAL_TABLE, "", _entries((b"sc/st", b"x", p.NO_VERSION))),
        p.RemoveTableKeys(15, INTERNAL_TABLE, "", key),
    ]


async def test_changes_to_internal_segments_get_operation_unsupported(server: Server) -> None:
    await server.store.create_table(INTERNAL_TABLE)
    [version] = await server.store.update_table(
        INTERNAL_TABLE, [TableUpdate(b"sc/st", b"metadata", NOT_EXISTS)]
    )
    await server.store.create_segment(INTERNAL_SEGMENT)
    await server.store.append(INTERNAL_SEGMENT, b"internal")
    await server.store.create_segment(SEG)
    before = sorted(await server.store.list_segments())
    raw = await Raw.connect(server.port)
    for cmd in _changes(uuid.uuid4()):
        reply = await raw.request(cmd)
        assert isinstance(reply, p.OperationUnsupported), (cmd, reply)
        assert reply.request_id == cmd.request_id
        assert reply.operation_name == f"{type(cmd).__name__} on an internal segment"
    # Nothing changed, and reads of internal segments are still answered.
    assert sorted(await server.store.list_segments()) == before
    assert await _read_all(server.store, INTERNAL_SEGMENT) == b"internal"
    assert await _read_all(server.store, SEG) == b""
    read = await raw.request(p.ReadTable(20, INTERNAL_TABLE, "", (p.TableKey(b"sc/st"),)))
    assert read == p.TableRead(20, INTERNAL_TABLE, _entries((b"sc/st", b"metadata", version)))
    info = await raw.request(p.GetStreamSegmentInfo(21, INTERNAL_SEGMENT))
    assert isinstance(info, p.StreamSegmentInfo) and (info.exists, info.write_offset) == (True, 8)
    await raw.aclose()


async def test_names_like_internal_ones_are_not_protected(server: Server) -> None:
    """Only the ``_system/`` prefix is the server's: user segments, reader-group
    tables, transaction and transient segments are served like any other."""
    raw = await Raw.connect(server.port)
    for rid, name in enumerate(["sc/_system/0.#epoch.0", "sc/st/0.#epoch.0#transaction.1"], 1):
        assert await raw.request(p.CreateSegment(rid, name, 0, 0)) == p.SegmentCreated(rid, name)
    table = "sc/rg1_kvtable/0.#epoch.0"
    assert await raw.request(p.CreateTableSegment(3, table)) == p.SegmentCreated(3, table)
    created = await raw.request(p.CreateTransientSegment(4, uuid.uuid4(), "sc/_system/0.#epoch.0"))
    assert isinstance(created, p.SegmentCreated) and "#transient." in created.segment
    await raw.aclose()


async def test_table_iteration_until_an_empty_page(server: Server) -> None:
    table = "sc/it_kvtable/0.#epoch.0"
    await server.store.create_table(table)
    raw = await Raw.connect(server.port)
    keys = [f"k{i:02d}".encode() for i in range(25)]
    await raw.request(
        p.UpdateTableEntries(1, table, "", _entries(*((k, k + b"!", p.NO_VERSION) for k in keys)))
    )
    seen_keys: list[bytes] = []
    token = b""
    for rid in range(2, 100):
        page = await raw.request(p.ReadTableKeys(rid, table, "", 10, p.TableIteratorArgs(token)))
        assert isinstance(page, p.TableKeysRead)
        if not page.keys:
            break
        seen_keys += [k.key for k in page.keys]
        token = page.continuation_token
    assert seen_keys == keys
    seen: list[tuple[bytes, bytes]] = []
    token = b""
    for rid in range(100, 200):
        entries_page = await raw.request(
            p.ReadTableEntries(rid, table, "", 7, p.TableIteratorArgs(token))
        )
        assert isinstance(entries_page, p.TableEntriesRead)
        if not entries_page.entries.entries:
            break
        seen += [(k.key, v.value) for k, v in entries_page.entries.entries]
        token = entries_page.continuation_token
    assert seen == [(k, k + b"!") for k in keys]
    await raw.aclose()


async def test_table_delta_reads_advance_until_empty(server: Server) -> None:
    table = "sc/d_kvtable/0.#epoch.0"
    await server.store.create_table(table)
    raw = await Raw.connect(server.port)
    for i in range(6):
        await raw.request(
            p.UpdateTableEntries(i, table, "", _entries((f"k{i}".encode(), b"v", p.NO_VERSION)))
        )
        if i == 2:  # removed in the same walk that sees its update
            await raw.request(p.RemoveTableKeys(9, table, "", (p.TableKey(b"k2"),)))
    position, seen, rid = 0, [], 10
    while True:
        delta = await raw.request(p.ReadTableEntriesDelta(rid, table, "", position, 2))
        rid += 1
        assert isinstance(delta, p.TableEntriesDeltaRead)
        if not delta.entries.entries:
            assert delta.reached_end and delta.last_position == position
            break
        assert delta.last_position > position  # always advances
        seen += [k.key for k, _ in delta.entries.entries]
        position = delta.last_position
    assert sorted(seen) == [b"k0", b"k1", b"k3", b"k4", b"k5"]  # the removed key is not reported
    missing = await raw.request(p.ReadTableEntriesDelta(99, "sc/none_kvtable/0.#epoch.0", "", 0, 2))
    assert missing == p.NoSuchSegment(99, "sc/none_kvtable/0.#epoch.0", "", -1)
    await raw.aclose()


# --------------------------------------------------------------------------- bad input


async def _healthy(port: int, store: SegmentStore, expected: bytes) -> None:
    """Another connection still works and the stored data is untouched."""
    raw = await Raw.connect(port)
    reply = await raw.request(p.ReadSegment(SEG, 0, 1 << 20, "", 77))
    assert reply == p.SegmentRead(SEG, 0, True, False, expected, 77)
    await raw.aclose()
    assert await _read_all(store, SEG) == expected


BAD_INPUTS = {
    "garbage": b"\x13\x37" * 40,
    "unknown type": struct.pack(">ii", 4242, 0),
    "frame over 16 MiB": struct.pack(">ii", p.CommandType.READ_SEGMENT, 0x01000000),
    "reply as request": p.encode_command(p.SegmentRead(SEG, 0, True, False, b"", 5)),
    "append before SetupAppend": p.encode_command(
        p.AppendBlockEnd(uuid.uuid4(), 10, _events(b"ab"), 1, 1, 5)
    ),
    "truncated frame": p.encode_command(p.ReadSegment(SEG, 0, 10, "", 5))[:-3],
    # Received in part into a buffer of its own (LARGE_FRAME_BYTES), then EOF.
    "truncated large frame": p.encode_command(
        p.AppendBlockEnd(uuid.uuid4(), 1, _events(b"L" * 300_000), 1, 1, 5)
    )[:-3],
    "event frame alone": p.encode_event(b"loose"),
}


@pytest.mark.parametrize("name", sorted(BAD_INPUTS))
async def test_bad_input_closes_only_that_connection(server: Server, name: str) -> None:
    await server.store.create_segment(SEG)
    stored = _events(b"keep", b"me")
    await server.store.append(SEG, stored)
    # A bystander with a writer session and a parked read on another connection.
    bystander = await Raw.connect(server.port)
    w = uuid.uuid4()
    await bystander.request(p.SetupAppend(1, w, SEG))
    await bystander.send(p.ReadSegment(SEG, len(stored), 100, "", 2))

    bad = await Raw.connect(server.port)
    bad.writer.write(BAD_INPUTS[name])
    if name.startswith("truncated"):
        bad.writer.write_eof()  # the frame never completes
    await bad.writer.drain()
    assert await bad.closed_by_server()
    await bad.aclose()

    await _healthy(server.port, server.store, stored)
    more = _events(b"after")
    await bystander.send(_abe(w, more, 1, 1, 3))
    replies = {type(await bystander.recv()) for _ in range(2)}
    assert replies == {p.DataAppended, p.SegmentRead}
    assert await _read_all(server.store, SEG) == stored + more
    await bystander.aclose()


async def test_request_before_hello_closes(server: Server) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(p.encode_command(p.KeepAlive()))
    assert await asyncio.wait_for(reader.read(), WAIT_S) == b""
    writer.close()


async def test_replies_queued_before_a_bad_frame_still_go_out(server: Server) -> None:
    raw = await Raw.connect(server.port)
    raw.writer.write(p.encode_command(p.KeepAlive()) + struct.pack(">ii", 4242, 0))
    await raw.writer.drain()
    assert await raw.recv() == p.KeepAlive()
    assert await raw.closed_by_server()
    await raw.aclose()
