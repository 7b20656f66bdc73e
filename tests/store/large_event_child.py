"""Test-only: the real ``pravega_client`` writing large events (``test_append_ref_server.py``).

Usage: ``python large_event_child.py write CONTROLLER_URI SCOPE STREAM TAG``
(the command line of ``tests/faults/pravega_child.py``, so the fault suite's
``PravegaWriters`` can run it).

Writes events ``<TAG>:<n>|`` followed by ``event_filler(TAG, n)``, sizes
cycling through ``EVENT_SIZES`` (10 KiB to 300 KiB: the client sends them in
blocks, each block one store append, and a block with a 300 KiB event passes
``REF_APPEND_BYTES``, so it is written once, to the data file, and logged by
reference), ``BATCH`` per ``flush()``; after
each ``flush()`` returned prints ``A <n>`` (every event below ``n`` is
acknowledged). Runs until its stdin reaches end of file; a client exception
is printed as ``E <text>`` and ends the process. Exits with ``os._exit``
(a normal exit with a live client sometimes crashes inside the client).
"""

from __future__ import annotations

import hashlib
import os
import sys
import traceback
from pathlib import Path

if __name__ == "__main__":  # run as a script: make ``tests`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.faults import pravega_child

EVENT_SIZES = (10 * 1024, 64 * 1024, 300 * 1024)
BATCH = 6
"""Events per flush: two of each size, about 750 KiB per acknowledgement."""
INFLIGHT = 100
KEYS = 4


def event_filler(tag: str, n: int) -> bytes:
    """The bytes after an event's ``<tag>:<n>|`` prefix: derived from both, so a
    stored event whose bytes were mixed up with another's does not check."""
    size = EVENT_SIZES[n % len(EVENT_SIZES)]
    block = hashlib.blake2b(f"{tag}:{n}".encode(), digest_size=64).digest()
    return (block * (size // len(block) + 1))[:size]


def write(uri: str, scope: str, stream: str, tag: str) -> None:
    pravega_child.write(
        uri,
        scope,
        stream,
        tag,
        event=lambda i: f"{tag}:{i}|".encode() + event_filler(tag, i),
        batch=BATCH,
        inflight=INFLIGHT,
        keys=KEYS,
    )


def main() -> None:
    mode, uri, scope, stream, tag = sys.argv[1:6]
    assert mode == "write", mode
    try:
        write(uri, scope, stream, tag)
    except BaseException as exc:  # the parent reports what the client raised
        text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        print("E " + text.replace("\n", " | "), flush=True)
        os._exit(1)
    os._exit(0)


if __name__ == "__main__":
    main()
