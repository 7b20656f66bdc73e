"""The writer's block bookkeeping without a server: events packed into blocks,
split on partial acknowledgement, taken back out for resending or moving."""

from __future__ import annotations

import asyncio

from headrace.client.writer import _Block
from headrace.protocols import pravega as p


def _block(payloads: list[bytes], first: int) -> _Block:
    blk = _Block(bytearray(), first, first + len(payloads) - 1, [])
    for i, x in enumerate(payloads):
        blk.data += p.encode_event(x)
        blk.positions.append(i / 10)
    return blk


async def test_split_keeps_numbers_positions_bytes_and_futures() -> None:
    loop = asyncio.get_running_loop()
    blk = _block([b"a", b"bb", b"ccc", b"dddd"], 10)
    futs = {n: loop.create_future() for n in (11, 13)}
    blk.futures = dict(futs)
    head = blk.split(11)
    assert [e.framed for e in head.events()] == [p.encode_event(b"a"), p.encode_event(b"bb")]
    assert (head.first_number, head.last_number, head.positions) == (10, 11, [0.0, 0.1])
    assert head.futures == {11: futs[11]}
    rest = blk.events()
    assert [(e.number, e.framed[8:], e.position, e.future) for e in rest] == [
        (12, b"ccc", 0.2, None),
        (13, b"dddd", 0.3, futs[13]),
    ]
    assert bytes(blk.data) == p.encode_event(b"ccc") + p.encode_event(b"dddd")
