"""Test-only: the real ``pravega_client`` over TLS against ``headrace serve``, in a child process.

Usage: ``python tls_scenario.py CONTROLLER_URI SCOPE VERIFY``, ``VERIFY`` being
``verify`` (check the server's certificate against the CAs in the directory
named by the ``pravega_client_tls_cert_path`` environment variable) or
``no-verify`` (``disable_cert_verification=True``). Creates ``SCOPE/tls``,
writes three events, reads them back through a reader group and prints one
JSON line with what it saw. Run only with a hard timeout (the client's calls
hold the GIL and retry for about a minute); exits with ``os._exit`` so that no
client thread outlives the result (see ``tests/pravega/scenarios.py``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pravega_client as pc

if __name__ == "__main__":  # run as a script: make ``tests`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.pravega_binding import read_slice, run

EVENTS = [b"tls-0", b"tls-1", b"tls-2"]
READ_DEADLINE_S = 60.0
"""Longest the reader keeps asking for slices before it reports what it has."""


async def _read_all(reader: Any) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + READ_DEADLINE_S
    while len(got) < len(EVENTS) and time.monotonic() < deadline:
        got += await read_slice(reader)
    return got


def main(uri: str, scope: str, verify: str) -> dict[str, Any]:
    manager = pc.StreamManager(uri, False, True, verify == "no-verify")
    result: dict[str, Any] = {
        "scope_created": manager.create_scope(scope),
        "stream_created": manager.create_stream(scope, "tls", 1),
    }
    writer = manager.create_writer(scope, "tls")
    for event in EVENTS:
        writer.write_event_bytes(event)
    writer.flush()
    group = manager.create_reader_group("tlsgroup", scope, "tls")
    reader = group.create_reader("tlsreader")
    result["read"] = [event.decode() for event in run(_read_all(reader))]
    return result


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:4])), flush=True)
    os._exit(0)
