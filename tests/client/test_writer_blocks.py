"""The writer's block bookkeeping without a server: events packed into blocks,
split on partial acknowledgement, taken back out for resending or moving."""

from __future__ import annotations

import asyncio

from headrace.client.writer import COPY_EVENT_BYTES, _Block
from headrace.protocols import pravega as p

BIG = b"B" * (COPY_EVENT_BYTES + 1)
"""An event kept by reference in its block, not copied into the block's buffer."""


def _block(payloads: list[bytes], first: int) -> _Block:
    blk = _Block(first, 0, [])
    for i, x in enumerate(payloads):
        blk.append(x, first + i, i / 10)
    return blk


def test_pieces_are_the_framed_events_back_to_back() -> None:
    payloads = [b"a", BIG, b"cc", BIG + b"2", BIG + b"3", b"d"]
    blk = _block(payloads, 1)
    expected = b"".join(p.encode_event(x) for x in payloads)
    assert b"".join(blk.pieces()) == expected
    assert blk.size == len(expected)
    assert (blk.first_number, blk.last_number) == (1, 6)
    # The big events are the caller's objects, not copies.
    assert sum(1 for part in blk.pieces() if part is BIG) == 1
    assert [e.framed for e in blk.events()] == [p.encode_event(x) for x in payloads]


def test_a_mutable_big_event_is_copied_once() -> None:
    event = bytearray(BIG)
    blk = _block([event], 1)
    event[0:1] = b"X"  # the caller reuses its buffer after write()
    assert blk.data() == p.encode_event(BIG)


async def test_split_keeps_numbers_positions_bytes_and_futures() -> None:
    loop = asyncio.get_running_loop()
    blk = _block([b"a", b"bb", b"ccc", b"dddd"], 10)
    futs = {n: loop.create_future() for n in (11, 13)}
    blk.futures = dict(futs)
    head = blk.split(11)
    assert [e.framed for e in head.events()] == [p.encode_event(b"a"), p.encode_event(b"bb")]
    assert (head.first_number, head.last_number, head.positions) == (10, 11, [0.0, 0.1])
    assert head.futures == {11: futs[11]}
    assert head.size == len(p.encode_event(b"a") + p.encode_event(b"bb"))
    rest = blk.events()
    assert [(e.number, e.framed[8:], e.position, e.future) for e in rest] == [
        (12, b"ccc", 0.2, None),
        (13, b"dddd", 0.3, futs[13]),
    ]
    assert blk.data() == p.encode_event(b"ccc") + p.encode_event(b"dddd")
    assert blk.size == len(blk.data())


def test_split_between_big_events() -> None:
    payloads = [BIG, b"x", BIG + b"y", b"z"]
    blk = _block(payloads, 1)
    head = blk.split(2)
    assert head.data() == p.encode_event(BIG) + p.encode_event(b"x")
    assert blk.data() == p.encode_event(BIG + b"y") + p.encode_event(b"z")
    assert (blk.first_number, blk.last_number, blk.size) == (3, 4, len(blk.data()))
    blk.append(BIG, 5, 0.5)  # the rest of a split block still takes events
    assert [e.framed[8:] for e in blk.events()] == [BIG + b"y", b"z", BIG]
