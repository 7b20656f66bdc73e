"""When the writer sends a block: full blocks at once, the block still filling only
when nothing is in flight (``MAX_BLOCKS_IN_FLIGHT``).

Against a scripted segment store that holds its ``DataAppended`` replies until
the test lets them go, so "in flight" is decided by the test, not by timing;
the controller is a stand-in with the three calls the writer makes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from headrace.client._conn import ConnectionPool
from headrace.client.controller import Segment, SegmentRange
from headrace.client.writer import MAX_BLOCK_EVENTS, EventWriter
from headrace.protocols import pravega as p

WAIT_S = 10.0
"""Bound on every wait for the store to see an append."""

SEGMENT = Segment("sc", "st", 0)


@dataclass
class HeldStore:
    """A segment store that answers ``SetupAppend`` at once and holds every ack."""

    appends: list[p.AppendData] = field(default_factory=list)
    arrived: asyncio.Condition = field(default_factory=asyncio.Condition)
    _held: list[p.AppendData] = field(default_factory=list)
    _conn: p.PravegaConnection | None = None
    _writer: asyncio.StreamWriter | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = self._conn = p.PravegaConnection(p.Role.SERVER)
        self._writer = writer
        try:
            while data := await reader.read(65536):
                conn.receive_data(data)
                for event in conn.events():
                    if isinstance(event, p.SetupAppend):
                        conn.send(
                            p.AppendSetup(event.request_id, event.segment, event.writer_id, -1)
                        )
                    elif isinstance(event, p.AppendData):
                        self._held.append(event)
                        async with self.arrived:
                            self.appends.append(event)
                            self.arrived.notify_all()
                writer.write(conn.data_to_send())
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def until(self, count: int) -> None:
        async with asyncio.timeout(WAIT_S), self.arrived:
            await self.arrived.wait_for(lambda: len(self.appends) >= count)

    def release(self) -> None:
        """Acknowledge every append held so far."""
        assert self._conn is not None and self._writer is not None
        for ev in self._held:
            self._conn.send_data_appended(ev.writer_id, ev.last_event_number, -1, ev.request_id, 0)
        self._held.clear()
        self._writer.write(self._conn.data_to_send())


class OneSegmentController:
    """The controller calls an ``EventWriter`` makes, for one segment on ``endpoint``."""

    def __init__(self, endpoint: tuple[str, int]) -> None:
        self.endpoint = endpoint

    async def get_current_segments(self, scope: str, stream: str) -> list[SegmentRange]:
        return [SegmentRange(SEGMENT, 0.0, 1.0)]

    async def get_uri(self, segment: Segment) -> tuple[str, int]:
        return self.endpoint

    async def delegation_token(self, scope: str, stream: str) -> str:
        return ""


@contextlib.asynccontextmanager
async def _held_writer(**options: int) -> AsyncIterator[tuple[HeldStore, EventWriter]]:
    store = HeldStore()
    server = await asyncio.start_server(store.handle, "127.0.0.1", 0)
    pool = ConnectionPool()
    controller = OneSegmentController(server.sockets[0].getsockname()[:2])
    writer = EventWriter(controller, pool, "sc", "st", **options)  # type: ignore[arg-type]
    await writer.open()
    try:
        yield store, writer
    finally:
        store.release()
        await writer.aclose()
        await pool.aclose()
        server.close()
        await server.wait_closed()


@pytest.fixture
async def held() -> AsyncIterator[tuple[HeldStore, EventWriter]]:
    async with _held_writer() as pair:
        yield pair


async def _turns(count: int = 5) -> None:
    """Let every task that is ready run (no I/O involved): the writer's sender."""
    for _ in range(count):
        await asyncio.sleep(0)


async def test_a_filling_block_waits_for_the_append_in_flight(
    held: tuple[HeldStore, EventWriter],
) -> None:
    store, writer = held
    await writer.write(b"first")
    await store.until(1)  # nothing was in flight: it went at once
    for i in range(5):
        await writer.write(b"next %d" % i)
    await _turns()
    assert writer.stats["blocks_sent"] == 1  # the five wait in one block
    store.release()
    await store.until(2)
    assert [a.event_count for a in store.appends] == [1, 5]
    store.release()
    await writer.flush()


async def test_full_blocks_go_while_another_is_in_flight(
    held: tuple[HeldStore, EventWriter],
) -> None:
    store, writer = held
    await writer.write(b"first")
    await store.until(1)
    for _ in range(2 * MAX_BLOCK_EVENTS + 1):  # two full blocks and one event more
        await writer.write(b"x")
    await store.until(3)  # both full blocks, with the first still unacknowledged
    assert [a.event_count for a in store.appends] == [1, MAX_BLOCK_EVENTS, MAX_BLOCK_EVENTS]
    await _turns()
    assert writer.stats["blocks_sent"] == 3  # the last event waits
    store.release()
    await store.until(4)
    assert store.appends[3].event_count == 1
    store.release()
    await writer.flush()


async def test_blocks_at_the_in_flight_limit_go_as_acks_make_room() -> None:
    async with _held_writer(max_blocks_in_flight=2) as (store, writer):
        await writer.write(b"first")
        await store.until(1)
        for _ in range(3 * MAX_BLOCK_EVENTS + 1):  # three full blocks and one event more
            await writer.write(b"x")
        await store.until(2)
        await _turns()
        assert writer.stats["blocks_sent"] == 2  # the limit: two full blocks wait
        store.release()
        await store.until(4)  # the acks made room for both
        await _turns()
        assert writer.stats["blocks_sent"] == 4  # the open block waits for theirs
        store.release()
        await store.until(5)
        assert [a.event_count for a in store.appends] == [1, *[MAX_BLOCK_EVENTS] * 3, 1]
        store.release()
        await writer.flush()
