"""Helpers for the web console's tests: a real ``headrace serve`` with traffic, and
HTTP requests to its API, with or without TLS and credentials."""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.request
from typing import Any

from headrace.client import PravegaClient, ScalingPolicy, StreamConfig
from headrace.client.reader import ReaderGroup
from headrace.client.tank import TankClient
from headrace.protocols.tank import BundleMessage
from tests.ops.conftest import WAIT_S
from tests.ops.conftest import start_serve as start_serve  # the fixture, for these tests too

__all__ = ["api", "group_scenario", "produce", "start_serve"]


def api(
    base: str,
    path: str,
    *,
    method: str = "GET",
    user: str | None = None,
    password: str = "",
    headers: dict[str, str] | None = None,
    cafile: str | None = None,
) -> tuple[int, dict[str, Any], dict[str, str]]:
    """(status, JSON body, headers) of one request to the server at ``base``."""
    request = urllib.request.Request(base + path, method=method, headers=dict(headers or {}))
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    context = None if cafile is None else ssl.create_default_context(cafile=cafile)
    try:
        with urllib.request.urlopen(request, timeout=WAIT_S, context=context) as response:
            return response.status, json.loads(response.read()), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), dict(exc.headers)


async def produce(
    port: int, counts: dict[str, int], *, prefix: str = "event", ssl_context: Any = None
) -> None:
    """Create each TANK topic and produce that many one-message bundles to it."""
    async with await TankClient.connect("127.0.0.1", port, ssl_context=ssl_context) as client:
        for topic, bundles in counts.items():
            await client.create_topic(topic, 1)
            for n in range(bundles):
                await client.produce(topic, 0, [BundleMessage(f"{prefix} {topic} {n}".encode())])


async def group_scenario(controller: str, events: int, read: int) -> int:
    """Write ``events`` to g/s, make reader group g/grp, read ``read`` of them; the
    bytes the events take in the stream."""
    async with PravegaClient(controller) as client:
        await client.controller.create_scope("g")
        await client.controller.create_stream("g", "s", StreamConfig(ScalingPolicy.fixed(1)))
        async with await client.create_writer("g", "s") as writer:
            for n in range(events):
                await writer.write(f"event {n:04}".encode())
            await writer.flush()
        group = await ReaderGroup.create(client, "g", "grp", ["s"])
        async with await group.create_reader("r1") as reader:
            for _ in range(read):
                assert await reader.read_next(timeout_s=WAIT_S) is not None
    return events * (8 + len(b"event 0000"))
