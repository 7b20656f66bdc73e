"""Test-only: the real ``pravega_client`` writing (and reading) for the fault suite.

Usage: ``python pravega_child.py MODE CONTROLLER_URI SCOPE STREAM TAG``.

``write``: writes events ``<TAG>:<n>`` (n = 0, 1, ...) in batches of
``BATCH``; after each ``flush()`` returned it prints ``A <n>`` (every event
below ``n`` is acknowledged). Runs until its stdin reaches end of file; an
exception from the client is printed as ``E <text>`` and ends the process.

``load``: the same writes, and after each batch a reader of a reader group
reads what is there; at end of stdin prints one JSON line (written, read,
duplicates, errors) and exits.

Either mode exits with ``os._exit``: a normal interpreter exit with a live
client sometimes crashes inside the client after the results were printed.
"""

from __future__ import annotations

import json
import os
import select
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pravega_client as pc

if __name__ == "__main__":  # run as a script: make ``tests`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.pravega_binding import read_slice, run

BATCH = 50
"""Events per flush: each flush is one acknowledgement the parent can count."""

INFLIGHT = 1000
KEYS = 8


def _stdin_closed() -> bool:
    readable, _, _ = select.select([sys.stdin], [], [], 0)
    return bool(readable) and sys.stdin.buffer.read1(1) == b""


def _setup(uri: str, scope: str, stream: str) -> Any:
    manager = pc.StreamManager(uri, False, False)
    manager.create_scope(scope)
    manager.create_stream(scope, stream, 2)
    return manager


def _tagged(tag: str) -> Callable[[int], bytes]:
    """The default event maker: event ``i`` is ``<tag>:<i>``."""
    return lambda i: f"{tag}:{i}".encode()


def _write_batch(writer: Any, n: int, batch: int, keys: int, event: Callable[[int], bytes]) -> int:
    """Write events ``n`` .. ``n + batch - 1`` and flush (acknowledged); the next ``n``."""
    for i in range(n, n + batch):
        writer.write_event_bytes(event(i), routing_key=f"k{i % keys}")
    writer.flush()
    return n + batch


def write(
    uri: str,
    scope: str,
    stream: str,
    tag: str,
    *,
    event: Callable[[int], bytes] | None = None,
    batch: int = BATCH,
    inflight: int = INFLIGHT,
    keys: int = KEYS,
) -> None:
    """The ``write`` mode; ``event`` makes event ``i`` (default ``<tag>:<i>``), so other
    children (``tests/store/large_event_child.py``) reuse the loop with their own events."""
    manager = _setup(uri, scope, stream)
    writer = manager.create_writer(scope, stream, inflight)
    make = event if event is not None else _tagged(tag)
    n = 0
    print("R", flush=True)
    while not _stdin_closed():
        n = _write_batch(writer, n, batch, keys, make)
        print(f"A {n}", flush=True)


async def _load(uri: str, scope: str, stream: str, tag: str) -> dict[str, Any]:
    manager = _setup(uri, scope, stream)
    writer = manager.create_writer(scope, stream, INFLIGHT)
    group = manager.create_reader_group(f"rg{tag}", scope, stream)
    reader = group.create_reader("r1")
    seen: set[bytes] = set()
    duplicates = 0
    n = 0
    while not _stdin_closed():
        n = _write_batch(writer, n, BATCH, KEYS, _tagged(tag))
        for data in await read_slice(reader):
            duplicates += data in seen
            seen.add(data)
    return {"written": n, "read": len(seen), "duplicates": duplicates}


def main() -> None:
    mode, uri, scope, stream, tag = sys.argv[1:6]
    try:
        if mode == "write":
            write(uri, scope, stream, tag)
        else:
            print(json.dumps(run(_load(uri, scope, stream, tag))), flush=True)
    except BaseException as exc:  # the parent reports what the client raised
        text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        print("E " + text.replace("\n", " | "), flush=True)
        os._exit(1)
    os._exit(0)


if __name__ == "__main__":
    main()
