"""Read a stream with the real ``pravega`` client (``pravega_client``), in a child process.

Usage: ``python pravega_read.py CONTROLLER_URI SCOPE STREAM COUNT``; prints one
JSON line ``{"events": [...payloads as latin-1...]}``. The client's blocking
calls hold the GIL and retry for a long time when something is wrong, so the
test runs this under a hard timeout instead of in its own process.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pravega_client

if __name__ == "__main__":  # run as a script: make ``tests`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.pravega_binding import read_slice, run

READ_DEADLINE_S = 30.0


def main(uri: str, scope: str, stream: str, count: str) -> None:
    manager = pravega_client.StreamManager(uri)
    group = manager.create_reader_group(f"lj{int(time.time() * 1000)}", scope, stream)
    reader = group.create_reader("r1")
    want = int(count)

    async def read() -> list[str]:
        got: list[str] = []
        deadline = time.monotonic() + READ_DEADLINE_S
        while len(got) < want and time.monotonic() < deadline:
            got.extend(event.decode("latin-1") for event in await read_slice(reader))
        return got

    events = run(read())
    print(json.dumps({"events": events}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
    # Leave at once, the reader still online: a normal interpreter exit with a
    # live reader sometimes crashes inside the client after the results were
    # printed (as tests/pravega/scenarios.py found).
    os._exit(0)
