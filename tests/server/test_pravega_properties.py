"""Property: pipelined appends from several writers on one connection are stored
in wire order and acknowledged once each, in each writer's event-number order,
however the store's completions are reordered and however little append room
(``max_append_bytes_in_flight``) the connection has.

The handler is driven the way the connection loop drives it (one task per
event, started in arrival order) over a store whose appends are issued at
once (the offset is fixed when the call is made, as in the disk store) but
complete after a number of event-loop turns chosen by hypothesis.
"""

from __future__ import annotations

import asyncio
import uuid

from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.protocols import pravega as p
from headrace.server.pravega import PravegaHandler
from headrace.store.memory import MemoryStore
from headrace.types import AppendResult, WriterAppend
from tests._hypothesis import examples

SEGMENTS = ["sc/st/0.#epoch.0", "sc/st/1.#epoch.0"]


class ReorderingStore(MemoryStore):
    """A memory store whose appends return after ``turns.pop(0)`` loop turns."""

    def __init__(self, turns: list[int]) -> None:
        super().__init__()
        self.turns = turns
        self.in_flight_bytes = 0
        self.max_in_flight_bytes = 0

    async def append(
        self,
        name: str,
        data: bytes,
        *,
        expected_offset: int | None = None,
        writer: WriterAppend | None = None,
    ) -> AppendResult:
        result = await super().append(name, data, expected_offset=expected_offset, writer=writer)
        for _ in range(self.turns.pop(0) if self.turns else 0):
            await asyncio.sleep(0)  # a loop turn, so that later appends may finish first
        return result


appends = st.lists(
    st.tuples(st.integers(0, 3), st.integers(1, 3), st.binary(max_size=20)),
    min_size=1,
    max_size=30,
)


@settings(max_examples=examples(80), deadline=None)
@given(
    plan=appends,
    turns=st.lists(st.integers(0, 8), min_size=30, max_size=30),
    room=st.sampled_from([40, 100, 1 << 20]),  # bytes of appends in flight per connection
)
def test_pipelined_appends_keep_wire_order_and_ack_order(
    plan: list[tuple[int, int, bytes]], turns: list[int], room: int
) -> None:
    asyncio.run(_check(plan, turns, room))


async def _check(plan: list[tuple[int, int, bytes]], turns: list[int], room: int) -> None:
    store = ReorderingStore(list(turns))
    for name in SEGMENTS:
        await store.create_segment(name)
    handler = PravegaHandler(store, max_append_bytes_in_flight=room)
    writers = [uuid.UUID(int=i + 1) for i in range(4)]
    setups = [p.Hello(15, 5)]
    setups += [p.SetupAppend(i, w, SEGMENTS[i % 2]) for i, w in enumerate(writers)]
    for event in handler.feed(b"".join(map(p.encode_command, setups))):
        await handler.handle(event)  # accepted before the writers append, as clients wait
    frames: list[p.Command] = []
    next_number = dict.fromkeys(writers, 0)
    expected_data = {name: b"" for name in SEGMENTS}
    expected_acks: dict[uuid.UUID, list[int]] = {w: [] for w in writers}
    for rid, (index, count, payload) in enumerate(plan, start=100):
        w = writers[index]
        data = b"".join(p.encode_event(payload + bytes([k])) for k in range(count))
        next_number[w] += count
        frames.append(p.AppendBlockEnd(w, len(data), data, count, next_number[w], rid))
        expected_data[SEGMENTS[index % 2]] += data
        expected_acks[w].append(next_number[w])

    # As the loop does it: one task per event, created in arrival order.
    events = list(handler.feed(b"".join(map(p.encode_command, frames))))
    tasks = [asyncio.create_task(handler.handle(event)) for event in events]
    await asyncio.gather(*tasks)

    client = p.PravegaConnection(p.Role.CLIENT)
    client.receive_data(handler.data_to_send())
    replies = list(client.events())
    acks = [r for r in replies if isinstance(r, p.DataAppended)]
    assert len(acks) == len(plan)
    for w in writers:
        mine = [a for a in acks if a.writer_id == w]
        assert [a.event_number for a in mine] == expected_acks[w]
        previous = [a.previous_event_number for a in mine]
        assert previous == [p.NULL_ATTRIBUTE_VALUE, *expected_acks[w]][: len(mine)]
    for name in SEGMENTS:
        info = await store.info(name)
        assert (await store.read(name, 0, info.length)).data == expected_data[name]
    biggest = max(len(f.data) for f in frames if isinstance(f, p.AppendBlockEnd))
    assert store.max_in_flight_bytes <= max(room, biggest)
    await store.close()
