"""Scenarios run with the real ``pravega`` client (``pravega_client``), one per process.

Usage: ``python real_client.py SCENARIO CONTROLLER_URI ARGS...``; the last line
printed is a JSON object. Run by ``conftest.Server.run_real_client`` under a
hard timeout: the client's blocking calls hold the GIL and retry for about a
minute when something is wrong, so they must never run in the test process.
The process leaves with ``os._exit(0)`` right after printing; the parent
judges the JSON, not the exit code.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pravega_client

if __name__ == "__main__":  # run as a script: make ``tests`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.pravega_binding import read_slice, run

READ_DEADLINE_S = 30.0


def write_keyed(uri: str, scope: str, stream: str, segments: str, keys_json: str) -> dict[str, Any]:
    """Create ``scope/stream`` with ``segments`` segments (if needed); write each key as an
    event whose payload is the key itself, routed by that key."""
    m = pravega_client.StreamManager(uri)
    m.create_scope(scope)
    m.create_stream(scope, stream, int(segments))
    writer = m.create_writer(scope, stream)
    keys: list[str] = json.loads(keys_json)
    for key in keys:
        writer.write_event_bytes(key.encode("utf-8"), routing_key=key)
    writer.flush()
    return {"written": len(keys)}


def read_group(uri: str, scope: str, stream: str, group: str, count: str) -> dict[str, Any]:
    """Read ``count`` events with a new one-reader group; payloads as latin-1 strings."""
    m = pravega_client.StreamManager(uri)
    rg = m.create_reader_group(group, scope, stream)
    reader = rg.create_reader("r1")
    want = int(count)

    async def read() -> list[str]:
        got: list[str] = []
        deadline = time.monotonic() + READ_DEADLINE_S
        while len(got) < want and time.monotonic() < deadline:
            got.extend(event.decode("latin-1") for event in await read_slice(reader))
        return got

    # No reader_offline(): the process leaves with os._exit instead.
    return {"events": run(read())}


SCENARIOS = {"write_keyed": write_keyed, "read_group": read_group}

if __name__ == "__main__":
    name, *args = sys.argv[1:]
    print(json.dumps(SCENARIOS[name](*args)), flush=True)
    # Skip interpreter teardown: the client sometimes crashes (SIGSEGV) while
    # Python finalises its objects under the client's threads.
    os._exit(0)
