"""The same routing key lands in the same segment whichever client wrote it.

The real ``pravega`` client (Rust, in a child process) and our ``EventWriter``
each write events whose payload is their routing key to a multi-segment
stream on a real ``headrace serve``; reading every segment back shows which
segment each key went to, and ``routing.py`` must have predicted exactly that.
"""

from __future__ import annotations

import json

from headrace.client import PravegaClient, ScalingPolicy, Segment, StreamConfig
from headrace.protocols import pravega as p
from headrace.protocols.pravega.routing import KeyRanges
from tests._real_pravega import run_scenario

from .conftest import Server

SEGMENTS = 5
ASCII_KEYS = [f"key-{i}" for i in range(300)] + ["", "a", "hello", "EventRouter", "x" * 40]
NON_ASCII_KEYS = ["é", "ключ", "鍵", "naïve-κλειδί", "\U0001f600 grin", "ü" * 9]


async def _events_by_segment(client: PravegaClient, scope: str, stream: str) -> dict[str, Segment]:
    """Each event payload -> the segment it is stored in."""
    found: dict[str, Segment] = {}
    for r in await client.controller.get_current_segments(scope, stream):
        stat = await client.segments.stat(r.segment)
        offset, data = 0, b""
        while offset < stat.length:
            got = await client.segments.read(r.segment, offset)
            data += got.data
            offset += len(got.data)
        for payload in p.decode_events(data):
            found[payload.decode("utf-8")] = r.segment
    return found


async def _ranges(client: PravegaClient, scope: str, stream: str) -> KeyRanges[Segment]:
    ranges = await client.controller.get_current_segments(scope, stream)
    return KeyRanges.from_ranges([(r.segment, r.min_key, r.max_key) for r in ranges])


async def test_real_client_keys_land_where_routing_predicts(server: Server) -> None:
    keys = ASCII_KEYS + NON_ASCII_KEYS
    r = run_scenario("write_keyed", server.uri, "rt1", "st", str(SEGMENTS), json.dumps(keys))
    assert r == {"written": len(keys)}
    async with PravegaClient(server.uri) as client:
        ranges = await _ranges(client, "rt1", "st")
        found = await _events_by_segment(client, "rt1", "st")
    assert set(found) == set(keys)
    assert len(set(found.values())) == SEGMENTS  # the keys really spread out
    for key in ASCII_KEYS:
        assert found[key] == ranges.segment_for_key(key), key
        assert found[key] == ranges.segment_for_key(key, rust_client_compat=True), key
    # Non-ASCII keys: the Rust client hashes a zero-padded buffer (see routing.py).
    for key in NON_ASCII_KEYS:
        assert found[key] == ranges.segment_for_key(key, rust_client_compat=True), key
    differs = [k for k in NON_ASCII_KEYS if ranges.segment_for_key(k) != found[k]]
    assert differs, "the Java and Rust hashes are expected to differ on some non-ASCII key"


async def test_our_writer_routes_like_the_real_client(server: Server) -> None:
    run_scenario("write_keyed", server.uri, "rt2", "theirs", str(SEGMENTS), json.dumps(ASCII_KEYS))
    async with PravegaClient(server.uri) as client:
        config = StreamConfig(ScalingPolicy.fixed(SEGMENTS))
        assert await client.controller.create_stream("rt2", "ours", config)
        async with await client.create_writer("rt2", "ours") as writer:
            for key in ASCII_KEYS:
                await writer.write(key.encode(), routing_key=key)
            await writer.flush()
        ours = await _events_by_segment(client, "rt2", "ours")
        theirs = await _events_by_segment(client, "rt2", "theirs")
    assert set(ours) == set(theirs) == set(ASCII_KEYS)
    for key in ASCII_KEYS:
        assert ours[key].number == theirs[key].number, key
