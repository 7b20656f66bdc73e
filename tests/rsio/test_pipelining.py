"""Interleaved traffic on one RS-IO connection: every event is handled ``inline``.

The server handles each RS-IO event in the read loop (no task per event).
Two offers and two subscriptions share one connection here, so one read
holds elements of both offers, demand for both subscriptions and their
acknowledgements, in whatever mix the client sent them: each offer must be
stored exactly once and in its order, and each subscription must receive its
stream's events in order, exactly as when each runs alone.
"""

from __future__ import annotations

import asyncio

from headrace.client import PravegaClient
from headrace.client.rsio import RsioClient

from .conftest import WAIT_S, Server, new_stream, write_events

OFFERED = 20_000
SUBSCRIBED = 5_000


async def _collect(sub: object) -> list[bytes]:
    return [e async for e in sub]  # type: ignore[attr-defined]


async def test_offers_and_subscriptions_interleaved_on_one_connection(
    server: Server, pravega: PravegaClient
) -> None:
    offer_streams = [await new_stream(pravega) for _ in range(2)]
    read_streams = [await new_stream(pravega, segments=2) for _ in range(2)]
    stored = [[b"offer%d-%06d" % (n, i) for i in range(OFFERED)] for n in range(2)]
    written = [[b"read%d-%05d" % (n, i) for i in range(SUBSCRIBED)] for n in range(2)]
    for (scope, stream), events in zip(read_streams, written, strict=True):
        await write_events(pravega, scope, stream, events, key="one key: one segment, in order")
        await pravega.controller.seal_stream(scope, stream)
    client = await RsioClient.connect("127.0.0.1", server.rsio_port)
    try:
        offers = [
            client.offer(f"{scope}/{stream}", elements)
            for (scope, stream), elements in zip(offer_streams, stored, strict=True)
        ]
        reads = [
            _collect(client.subscribe(f"{scope}/{stream}", batch=batch))
            for (scope, stream), batch in zip(read_streams, (7, 1000), strict=True)
        ]
        results = await asyncio.wait_for(asyncio.gather(*offers, *reads), 60)
    finally:
        await client.goodbye()
    assert results[:2] == [OFFERED, OFFERED]
    assert results[2:] == written
    check = await RsioClient.connect("127.0.0.1", server.rsio_port)
    try:
        for (scope, stream), elements in zip(offer_streams, stored, strict=True):
            await pravega.controller.seal_stream(scope, stream)
            got = await asyncio.wait_for(_collect(check.subscribe(f"{scope}/{stream}")), WAIT_S)
            assert got == elements
    finally:
        await check.goodbye()
