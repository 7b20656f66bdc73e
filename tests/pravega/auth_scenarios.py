"""Test-only: real ``pravega_client`` scenarios with ``auth_enabled=True``, one per process.

Usage: ``python auth_scenarios.py SCENARIO CONTROLLER_URI [ARG ...]`` with the
client's credentials in its own environment variables
(``pravega_client_auth_method=Basic``, ``pravega_client_auth_username``,
``pravega_client_auth_password``). Prints one JSON object (the last line of
stdout); the parent asserts on it. Run only in a child process with a hard
timeout (see ``scenarios.py``): with bad credentials the client retries
UNAUTHENTICATED for about a minute.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pravega_client as pc

if __name__ == "__main__":  # run as a script: make ``tests`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.pravega_binding import read_slice, run

READ_DEADLINE_S = 60.0
"""Longest a scenario keeps reading before it reports what it has."""

LARGE_EVENT_BYTES = 9 * 1024 * 1024
"""Over the client's 8 MiB append limit: the large-event path (pravega.md#large-events)."""


def _manager(uri: str) -> Any:
    return pc.StreamManager(uri, True, False)  # auth_enabled=True, tls_enabled=False


async def _read_bytes(reader: Any, want: int) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + READ_DEADLINE_S
    while len(got) < want and time.monotonic() < deadline:
        got += await read_slice(reader)
    return got


async def _read(reader: Any, want: int) -> list[str]:
    return [event.decode() for event in await _read_bytes(reader, want)]


def write_read(uri: str, scope: str, count: str) -> dict[str, Any]:
    """Create scope/stream, write ``count`` events and read them back in a reader group."""
    n = int(count)
    m = _manager(uri)
    created = [m.create_scope(scope), m.create_stream(scope, "st", 2)]
    writer = m.create_writer(scope, "st")
    for i in range(n):
        writer.write_event(f"e{i}", routing_key=f"k{i % 7}")
    writer.flush()
    rg = m.create_reader_group("rg", scope, "st")
    reader = rg.create_reader("r1")
    got = run(_read(reader, n))
    # Over 8 MiB: CreateTransientSegment, appends to it and MergeSegments, each with the token.
    m.create_stream(scope, "big", 1)
    large = m.create_writer(scope, "big")
    large.write_event_bytes(b"L" * LARGE_EVENT_BYTES)
    large.flush()
    big = run(_read_bytes(m.create_reader_group("rgbig", scope, "big").create_reader("r"), 1))
    return {
        "created": created,
        "read": sorted(got, key=lambda e: int(e[1:])),
        "large": [len(e) for e in big],
    }


def read_only(uri: str, scope: str, count: str) -> dict[str, Any]:
    """Read ``count`` events of scope/st in a new reader group, then try to
    create a stream (which the reader may not)."""
    m = _manager(uri)
    rg = m.create_reader_group("rg2", scope, "st")
    reader = rg.create_reader("r1")
    got = run(_read(reader, int(count)))
    started = time.monotonic()
    try:
        m.create_stream(scope, "other", 1)
        refusal = ""
    except Exception as exc:  # the binding raises ValueError with the gRPC status
        refusal = f"{type(exc).__name__}: {exc}"
    return {
        "read": len(got),
        "create_stream_refusal": refusal,
        "refused_after_s": time.monotonic() - started,
    }


def outlive_token(uri: str, scope: str, wait_s: str) -> dict[str, Any]:
    """Write and read, wait ``wait_s`` (longer than the server's token TTL),
    then write with the same and a new writer and read on: the client must
    refresh its tokens by itself."""
    m = _manager(uri)
    m.create_scope(scope)
    m.create_stream(scope, "st", 1)
    writer = m.create_writer(scope, "st")
    writer.write_event("before")
    writer.flush()
    reader = m.create_reader_group("rg", scope, "st").create_reader("r1")
    first = run(_read(reader, 1))
    time.sleep(float(wait_s))  # let every token the client holds expire (the point of the test)
    writer.write_event("after-same-writer")
    writer.flush()
    fresh = m.create_writer(scope, "st")
    fresh.write_event("after-new-writer")
    fresh.flush()
    return {"first": first, "later": run(_read(reader, 2))}


SCENARIOS: dict[str, Callable[..., dict[str, Any]]] = {
    "write_read": write_read,
    "read_only": read_only,
    "outlive_token": outlive_token,
}


if __name__ == "__main__":
    name, uri, *args = sys.argv[1:]
    print(json.dumps(SCENARIOS[name](uri, *args)), flush=True)
    os._exit(0)  # skip interpreter teardown under the client's threads (see scenarios.py)
