"""The Lumberjack front door in process (``ServerApp`` over a ``MemoryStore``), for
what a subprocess cannot arrange: a store that stalls, and a stream scaled
under the front door's feet. Every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from headrace.protocols.lumberjack import (
    Ack,
    ConnectionClosed,
    Data,
    Frame,
    JsonData,
    LumberjackConnection,
    ProtocolVersion,
    Role,
    WindowSize,
)
from headrace.server.app import ServerApp
from headrace.server.config import ServerConfig
from headrace.server.lumberjack import PARTIAL_ACK_BYTES
from headrace.server.lumberjack_config import LumberjackConfig
from headrace.store.api import MAX_APPEND_BYTES
from headrace.store.memory import MemoryStore
from headrace.types import AppendResult, WriterAppend
from tests.lumberjack.harness import EVENT_HEADER, free_port

WAIT_S = 10.0


class GatedStore(MemoryStore):
    """A MemoryStore whose stream appends wait while ``open`` is clear."""

    def __init__(self) -> None:
        super().__init__()
        self.open = asyncio.Event()
        self.open.set()

    async def append(
        self,
        name: str,
        data: bytes,
        *,
        expected_offset: int | None = None,
        writer: WriterAppend | None = None,
    ) -> AppendResult:
        await self.open.wait()
        return await super().append(name, data, expected_offset=expected_offset, writer=writer)


async def _start(tmp_path: Path, store: MemoryStore, **lumberjack: float) -> ServerApp:
    ports = {name: 0 for name in ServerConfig().ports}
    ports["lumberjack"] = free_port()
    config = ServerConfig(
        data_dir=tmp_path / "unused",
        ports=ports,
        lumberjack=replace(LumberjackConfig(), **lumberjack),
    )
    app = ServerApp(config, store=store)
    await app.start()
    return app


@pytest.fixture
async def store() -> AsyncIterator[GatedStore]:
    yield GatedStore()


class Client:
    """An asyncio v2 client on the sans-I/O client role."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        version: ProtocolVersion = ProtocolVersion.V2,
    ) -> None:
        self.reader, self.writer = reader, writer
        self.conn = LumberjackConnection(Role.CLIENT, version=version)
        self.acks: list[int] = []
        self.closed = False

    @classmethod
    async def connect(cls, port: int, version: ProtocolVersion = ProtocolVersion.V2) -> Client:
        return cls(*await asyncio.open_connection("127.0.0.1", port), version)

    async def send(self, *frames: Frame) -> None:
        for frame in frames:
            self.conn.send(frame)
        self.writer.write(self.conn.data_to_send())
        await self.writer.drain()

    async def send_window(self, first_seq: int, docs: list[dict[str, object]]) -> None:
        self.conn.send(WindowSize(len(docs)))
        for i, doc in enumerate(docs):
            self.conn.send(JsonData(first_seq + i, json.dumps(doc).encode()))
        self.writer.write(self.conn.data_to_send())
        await self.writer.drain()

    async def next_ack(self) -> int | None:
        """The next ack, or None once the server has closed the connection."""
        while True:
            if self.acks:
                return self.acks.pop(0)
            if self.closed:
                return None
            try:
                data = await asyncio.wait_for(self.reader.read(65536), WAIT_S)
            except ConnectionResetError:  # an aborted connection may end with a reset
                data = b""
            self.conn.receive_data(data)
            for event in self.conn.events():
                if isinstance(event, Ack):
                    self.acks.append(event.seq)
                elif isinstance(event, ConnectionClosed):
                    self.closed = True

    async def aclose(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


def _events(data: bytes) -> list[dict[str, object]]:
    out = []
    position = 0
    while position < len(data):
        _, size = EVENT_HEADER.unpack_from(data, position)
        start = position + EVENT_HEADER.size
        out.append(json.loads(data[start : start + size]))
        position = start + size
    return out


async def _stored(store: MemoryStore) -> dict[str, list[dict[str, object]]]:
    out = {}
    for name in await store.list_segments():
        if name.startswith("logs/beats/"):
            info = await store.info(name)
            data = b""
            while len(data) < info.length:  # a read returns at most MAX_READ_BYTES
                data += (await store.read(name, len(data), info.length - len(data))).data
            out[name] = _events(data)
    return out


async def test_keepalives_while_the_store_is_slow_then_close_after_max_ack_wait(
    tmp_path: Path, store: GatedStore, caplog: pytest.LogCaptureFixture
) -> None:
    app = await _start(tmp_path, store, keepalive_interval_s=0.1, max_ack_wait_s=1.5)
    try:
        client = await Client.connect(app.ports["lumberjack"])
        await client.send_window(1, [{"message": "fast", "host": "a"}])
        assert await client.next_ack() == 1
        store.open.clear()  # the store stalls
        await client.send_window(2, [{"message": "slow", "host": "a"}])
        keepalives = [await client.next_ack() for _ in range(3)]
        assert keepalives == [0, 0, 0]  # the window is being stored: Beats keep waiting
        while (ack := await client.next_ack()) == 0:
            pass
        assert ack is None, "the window was acked although the store never finished"
        assert "not durable after" in caplog.text
        await client.aclose()
        store.open.set()
        # other connections are served once the store moves again
        other = await Client.connect(app.ports["lumberjack"])
        await other.send_window(7, [{"message": "later", "host": "a"}])
        assert await other.next_ack() == 7
        await other.aclose()
    finally:
        store.open.set()
        await app.aclose()


class TurnstileStore(MemoryStore):
    """A MemoryStore whose stream appends to the Lumberjack stream pass one per
    ``turns.release()``: a disk that stores one part at a time, when told."""

    def __init__(self) -> None:
        super().__init__()
        self.turns = asyncio.Semaphore(0)

    async def append(
        self,
        name: str,
        data: bytes,
        *,
        expected_offset: int | None = None,
        writer: WriterAppend | None = None,
    ) -> AppendResult:
        if name.startswith("logs/beats/"):
            await asyncio.wait_for(self.turns.acquire(), WAIT_S)
        return await super().append(name, data, expected_offset=expected_offset, writer=writer)


async def test_a_large_v2_window_gets_partial_acks_as_its_parts_become_durable(
    tmp_path: Path,
) -> None:
    store = TurnstileStore()
    app = await _start(tmp_path, store)
    try:
        client = await Client.connect(app.ports["lumberjack"])
        pad = "p" * PARTIAL_ACK_BYTES  # each event is a part of its own
        await client.send_window(1, [{"i": i, "pad": pad} for i in range(3)])
        acks = []
        for _ in range(3):
            store.turns.release()  # one more part may become durable
            while (ack := await client.next_ack()) == 0:
                pass  # a keepalive
            acks.append(ack)
        assert acks == [1, 2, 3]  # the window's progress, then its ack
        await client.aclose()
        docs = [d for docs in (await _stored(store)).values() for d in docs]
    finally:
        await app.aclose()
    assert [d["i"] for d in docs] == [0, 1, 2]  # keyless: one segment, wire order


async def test_a_scaled_stream_gets_the_next_windows_in_its_new_segments(
    tmp_path: Path, store: GatedStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    app = await _start(tmp_path, store)
    hosts = [f"host-{i}" for i in range(20)]
    try:
        client = await Client.connect(app.ports["lumberjack"])
        await client.send_window(1, [{"w": 1, "host": h} for h in hosts])
        assert await client.next_ack() == 20
        old = app.controller.current_segments("logs", "beats")
        assert len(old) == 4
        await app.controller.scale("logs", "beats", [s.id for s in old], [(0.0, 0.5), (0.5, 1.0)])
        await client.send_window(21, [{"w": 2, "host": h} for h in hosts])
        assert await client.next_ack() == 40
        assert "re-routing" in caplog.text  # the appends hit the sealed segments first
        await client.aclose()
        stored = await _stored(store)
    finally:
        await app.aclose()
    first = {name for name, docs in stored.items() if any(d["w"] == 1 for d in docs)}
    second = {name for name, docs in stored.items() if any(d["w"] == 2 for d in docs)}
    assert all(name.endswith(".#epoch.0") for name in first)
    assert second and all(name.endswith(".#epoch.1") for name in second)
    assert sorted(str(d["host"]) + str(d["w"]) for docs in stored.values() for d in docs) == sorted(
        h + w for h in hosts for w in ("1", "2")
    )


async def test_events_without_a_routing_key_go_together_round_robin(
    tmp_path: Path, store: GatedStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    app = await _start(tmp_path, store)
    try:
        client = await Client.connect(app.ports["lumberjack"])
        for window in range(4):
            await client.send_window(1, [{"w": window, "i": i} for i in range(5)])
            assert await client.next_ack() == 5
        await client.aclose()
        stored = await _stored(store)
    finally:
        await app.aclose()
    # each window whole in one segment, in order; four windows over four segments
    placement = {}
    for name, docs in stored.items():
        for window in {int(str(d["w"])) for d in docs}:
            assert [d["i"] for d in docs if d["w"] == window] == list(range(5))
            placement[window] = name
    assert sorted(placement) == [0, 1, 2, 3]
    assert len(set(placement.values())) == 4


async def test_a_window_larger_than_one_append_is_split_at_event_boundaries(
    tmp_path: Path, store: GatedStore
) -> None:
    appended: list[int] = []
    original = store.append

    async def counting_append(name: str, data: bytes, **kwargs: object) -> AppendResult:
        if name.startswith("logs/beats/"):
            appended.append(len(data))
        return await original(name, data, **kwargs)  # type: ignore[arg-type]

    store.append = counting_append  # type: ignore[method-assign]
    app = await _start(tmp_path, store)
    big = 7 * 1024 * 1024  # three of them exceed the store's 16 MiB append limit
    try:
        client = await Client.connect(app.ports["lumberjack"])
        await client.send_window(1, [{"i": i, "pad": str(i) * big} for i in range(3)])
        # Each event is a part of its own (over PARTIAL_ACK_BYTES): partial acks first.
        assert [await client.next_ack() for _ in range(3)] == [1, 2, 3]
        await client.aclose()
        stored = await _stored(store)
    finally:
        await app.aclose()
    assert len(appended) == 3 and max(appended) <= MAX_APPEND_BYTES
    docs = [d for docs in stored.values() for d in docs]
    assert [d["i"] for d in docs] == [0, 1, 2]  # keyless: one segment, wire order
    assert all(d["pad"] == str(d["i"]) * big for d in docs)


async def _wait_stored(store: MemoryStore, count: int) -> list[dict[str, object]]:
    """Poll the store (bounded) until ``count`` events are stored."""
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while True:
        docs = [d for docs in (await _stored(store)).values() for d in docs]
        if len(docs) >= count or asyncio.get_running_loop().time() > deadline:
            return docs
        await asyncio.sleep(0.02)


def _line(seq: int) -> Data:
    return Data(seq, ((b"line", f"line {seq}".encode()),))


async def test_a_trickling_w_once_window_is_stored_after_the_linger_and_acked_when_whole(
    tmp_path: Path, store: GatedStore
) -> None:
    app = await _start(tmp_path, store, window_linger_s=0.2)
    try:
        client = await Client.connect(app.ports["lumberjack"], ProtocolVersion.V1)
        await client.send(WindowSize(10), *(_line(seq) for seq in range(1, 4)))
        docs = await _wait_stored(store, 3)  # readable long before the window fills
        assert [d["line"] for d in docs] == [f"line {seq}" for seq in range(1, 4)]
        assert client.acks == [] and not client.closed  # v1: nothing partial is acked
        await client.send(*(_line(seq) for seq in range(4, 11)))
        assert await client.next_ack() == 10
        docs = await _wait_stored(store, 10)
        assert [d["line"] for d in docs] == [f"line {seq}" for seq in range(1, 11)]  # once
        # The client goes away in the middle of the next (implicit) window:
        # what lingered is kept.
        await client.send(WindowSize(10), _line(11), _line(12))
        assert len(await _wait_stored(store, 12)) == 12
        await client.aclose()
    finally:
        await app.aclose()


async def test_without_linger_an_incomplete_window_is_never_stored(
    tmp_path: Path, store: GatedStore
) -> None:
    app = await _start(tmp_path, store, window_linger_s=0, keepalive_interval_s=0.05)
    try:
        client = await Client.connect(app.ports["lumberjack"])
        await client.send_window(1, [{"i": 0}])
        assert await client.next_ack() == 1
        await client.send(WindowSize(5), JsonData(2, b'{"i":1}'))
        for _ in range(5):  # keepalives: the server's clock ran well past any linger
            assert await client.next_ack() == 0
        assert [d["i"] for d in await _wait_stored(store, 1)] == [0]
        await client.aclose()
    finally:
        await app.aclose()
