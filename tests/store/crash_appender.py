"""Child process of the kill -9 crash test (``test_crash.py``); also its record codec.

Run as ``python crash_appender.py DATA_DIR STATE_JSON``. It opens a
``DiskStore`` under the state's ``fsync`` policy (default ``always``) and
``checkpoint_wal_bytes`` (if given: small WALs checkpoint, and get killed
while checkpointing, often) and ``ref_append_bytes`` (if given), creates the
crash-test segments if they are missing, and runs ``APPENDERS_PER_SEGMENT``
concurrent appenders on each segment until it is killed. Every append is
made of self-describing records (below), so whatever ends up in a segment can
be parsed and checked.

Protocol on stdout (one line per event, each written with a single
``os.write`` and only after the awaited store call returned):

* ``START`` just before ``DiskStore.open`` (imports are done),
* ``OPEN`` once the store is open (recovery is done),
* ``READY`` once segments exist and every appender knows where to resume,
* ``A seg app first count size offset length prev dup kind`` for every
  acknowledged append; ``kind`` is ``n`` (first send), ``r`` (a retry sent
  after the first send was acknowledged), ``c`` (one of two identical sends
  issued concurrently) or ``s`` (a resend, after a restart, of the append the
  writer had in flight when it was killed).

Appenders with an odd id are *writers*: their appends carry a
``WriterAppend`` (a writer id per appender and segment, event number = the
last sequence number in the append), so retries are deduplicated. A writer
resumes after a restart from the state file's ``writer_next`` (one past its
last *acknowledged* sequence number, as a real client resends what it has not
seen acknowledged). Plain appenders resume from what is stored.

Record layout (all integers big-endian)::

    magic         4s   b"HRCR"
    segment       u16  index into SEGMENT_NAMES
    appender      u16  appender id within the segment
    seq           u64  the appender's sequence number of this record
    first_seq     u64  sequence number of the first record of the same append
    count         u16  number of records in that append
    payload_size  u32  bytes of payload after the header
    crc           u32  CRC-32 of the header fields above and the payload
    payload       payload_size bytes, derived from (segment, appender, seq)
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import random
import struct
import sys
import uuid
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from headrace.store.api import SegmentStore

__all__ = [
    "APPENDERS_PER_SEGMENT",
    "RECORD_HEADER",
    "SEGMENT_NAMES",
    "ParsedRecord",
    "RecordError",
    "encode_append",
    "is_writer",
    "parse_segment",
    "plan_append",
    "writer_id",
]

SEGMENT_NAMES = (
    "crash/stream-0/0.#epoch.0",
    "crash/../stream 1/ü/1",
    "crash\\stream-2\x00/2",
)
"""Segment names; deliberately path-hostile (names never become paths)."""

APPENDERS_PER_SEGMENT = 4
"""Concurrent appenders per segment; odd ids are writers (deduplicated)."""

RECORD_MAGIC = b"HRCR"
RECORD_HEADER = struct.Struct(">4sHHQQHII")
assert RECORD_HEADER.size == 34
_CRC_PREFIX = struct.Struct(">4sHHQQHI")  # the header without its crc field
assert _CRC_PREFIX.size == RECORD_HEADER.size - 4

MAX_RECORDS_PER_APPEND = 3
"""Appends hold 1 to 3 records, so a torn append would show as a partial group."""

WRITER_NAMESPACE = uuid.UUID("6f1c53a4-5a0e-4cc4-9a9a-3c0b6f0e7d21")

RETRY_PROBABILITY = 0.15
"""Share of writer appends sent once more after the acknowledgement."""

CONCURRENT_DUPLICATE_PROBABILITY = 0.05
"""Share of writer appends sent twice at the same time."""

READ_CHUNK_BYTES = 4 * 1024 * 1024
"""Bytes per read when scanning a segment to resume."""


class RecordError(Exception):
    """A segment's bytes do not parse as a sequence of whole, intact records."""


@dataclass(frozen=True, slots=True)
class ParsedRecord:
    offset: int
    segment: int
    appender: int
    seq: int
    first_seq: int
    count: int
    size_bytes: int  # header + payload


def writer_id(segment: int, appender: int) -> uuid.UUID:
    return uuid.uuid5(WRITER_NAMESPACE, f"{segment}/{appender}")


def is_writer(appender: int) -> bool:
    return appender % 2 == 1


def _payload(segment: int, appender: int, seq: int, size: int) -> bytes:
    block = hashlib.blake2b(f"{segment}/{appender}/{seq}".encode(), digest_size=64).digest()
    return (block * (size // len(block) + 1))[:size]


def _payload_size(rng: random.Random) -> int:
    roll = rng.random()
    if roll < 0.70:
        return rng.randrange(0, 300)
    if roll < 0.98:
        return rng.randrange(300, 8192)
    return rng.randrange(16 * 1024, 96 * 1024)


def plan_append(segment: int, appender: int, first_seq: int) -> list[int]:
    """Payload sizes of the records of the append starting at ``first_seq``.

    A pure function of its arguments, so a resent append is byte-identical.
    """
    rng = random.Random(f"plan/{segment}/{appender}/{first_seq}")
    count = rng.randint(1, MAX_RECORDS_PER_APPEND)
    return [_payload_size(rng) for _ in range(count)]


def encode_record(
    segment: int, appender: int, seq: int, first_seq: int, count: int, payload_size: int
) -> bytes:
    payload = _payload(segment, appender, seq, payload_size)
    prefix = _CRC_PREFIX.pack(RECORD_MAGIC, segment, appender, seq, first_seq, count, payload_size)
    crc = zlib.crc32(payload, zlib.crc32(prefix))
    return prefix + struct.pack(">I", crc) + payload


def encode_append(segment: int, appender: int, first_seq: int) -> tuple[bytes, int]:
    """The bytes of the append starting at ``first_seq`` and its record count."""
    sizes = plan_append(segment, appender, first_seq)
    count = len(sizes)
    data = b"".join(
        encode_record(segment, appender, first_seq + i, first_seq, count, size)
        for i, size in enumerate(sizes)
    )
    return data, count


def parse_segment(data: bytes, base_offset: int = 0) -> list[ParsedRecord]:
    """Parse a whole segment's bytes; raise ``RecordError`` on anything torn or foreign."""
    records: list[ParsedRecord] = []
    position = 0
    view = memoryview(data)
    while position < len(data):
        offset = base_offset + position
        if len(data) - position < RECORD_HEADER.size:
            raise RecordError(
                f"{len(data) - position} trailing bytes at offset {offset}: a torn record header"
            )
        magic, segment, appender, seq, first_seq, count, payload_size, crc = (
            RECORD_HEADER.unpack_from(data, position)
        )
        if magic != RECORD_MAGIC:
            raise RecordError(f"bad magic {magic!r} at offset {offset}")
        end = position + RECORD_HEADER.size + payload_size
        if end > len(data):
            raise RecordError(
                f"record at offset {offset} needs {end - position} bytes, "
                f"only {len(data) - position} are there: a torn record"
            )
        prefix = view[position : position + _CRC_PREFIX.size]
        payload = view[position + RECORD_HEADER.size : end]
        if zlib.crc32(payload, zlib.crc32(prefix)) != crc:
            raise RecordError(f"record at offset {offset} fails its CRC")
        if payload != _payload(segment, appender, seq, payload_size):
            raise RecordError(f"record at offset {offset} has a foreign payload")
        records.append(
            ParsedRecord(offset, segment, appender, seq, first_seq, count, end - position)
        )
        position = end
    return records


# ---------------------------------------------------------------------------- child


def _emit(line: str) -> None:
    # One write per line (< PIPE_BUF), so a kill never leaves half a line behind
    # a complete one; unbuffered, so what the parent reads was really said.
    os.write(1, (line + "\n").encode())


async def _read_all(store: SegmentStore, name: str) -> bytes:
    """A segment's readable bytes, from its start offset to its length."""
    info = await store.info(name)
    chunks = []
    offset = info.start_offset
    while offset < info.length:
        result = await store.read(name, offset, READ_CHUNK_BYTES)
        if not result.data:
            break
        chunks.append(result.data)
        offset += len(result.data)
    return b"".join(chunks)


async def _run(data_dir: Path, state: dict[str, object]) -> None:
    from headrace.errors import SegmentExists
    from headrace.store import DiskStore
    from headrace.store.api import FsyncPolicy
    from headrace.types import AppendResult, WriterAppend

    seed = int(str(state["seed"]))
    round_number = int(str(state["round"]))
    writer_next = state.get("writer_next", {})
    assert isinstance(writer_next, dict)

    options: dict[str, int] = {}
    if state.get("checkpoint_wal_bytes"):
        # Small WALs checkpoint often, so kills also land inside checkpoints.
        options["checkpoint_wal_bytes"] = int(str(state["checkpoint_wal_bytes"]))
    if state.get("ref_append_bytes"):
        # Most appends logged by reference (APPEND_REF), so kills land between
        # their data-file write, the data sync and the WAL write too.
        options["ref_append_bytes"] = int(str(state["ref_append_bytes"]))
    _emit("START")
    policy = FsyncPolicy(str(state.get("fsync", FsyncPolicy.ALWAYS.value)))
    store = await DiskStore.open(data_dir, fsync=policy, **options)
    _emit("OPEN")
    for name in SEGMENT_NAMES:
        with contextlib.suppress(SegmentExists):
            await store.create_segment(name)

    next_seq: dict[tuple[int, int], int] = {}
    for segment, name in enumerate(SEGMENT_NAMES):
        stored = parse_segment(await _read_all(store, name))
        for appender in range(APPENDERS_PER_SEGMENT):
            if is_writer(appender):
                next_seq[segment, appender] = int(writer_next.get(f"{segment}/{appender}", 0))
            else:
                seqs = [r.seq for r in stored if r.appender == appender]
                next_seq[segment, appender] = max(seqs) + 1 if seqs else 0
    _emit("READY")

    def report(
        segment: int, appender: int, first: int, count: int, size: int, r: AppendResult, kind: str
    ) -> None:
        _emit(
            f"A {segment} {appender} {first} {count} {size} {r.offset} {r.length} "
            f"{r.previous_event_number} {int(r.duplicate)} {kind}"
        )

    async def appender_task(segment: int, appender: int) -> None:
        name = SEGMENT_NAMES[segment]
        rng = random.Random(f"{seed}/{round_number}/{segment}/{appender}")
        seq = next_seq[segment, appender]
        resend = is_writer(appender) and seq > 0
        while True:
            data, count = encode_append(segment, appender, seq)
            writer = None
            if is_writer(appender):
                writer = WriterAppend(writer_id(segment, appender), seq + count - 1)
            roll = rng.random()
            if writer is not None and roll < CONCURRENT_DUPLICATE_PROBABILITY:
                first, second = await asyncio.gather(
                    store.append(name, data, writer=writer),
                    store.append(name, data, writer=writer),
                )
                report(segment, appender, seq, count, len(data), first, "c")
                report(segment, appender, seq, count, len(data), second, "c")
            else:
                result = await store.append(name, data, writer=writer)
                report(segment, appender, seq, count, len(data), result, "s" if resend else "n")
                if writer is not None and roll < RETRY_PROBABILITY:
                    again = await store.append(name, data, writer=writer)
                    report(segment, appender, seq, count, len(data), again, "r")
            resend = False
            seq += count
            # Under interval/never an append returns without suspending, so
            # yield to let the other appenders (and the committer) run.
            await asyncio.sleep(0)

    async with asyncio.TaskGroup() as group:
        for segment in range(len(SEGMENT_NAMES)):
            for appender in range(APPENDERS_PER_SEGMENT):
                group.create_task(appender_task(segment, appender))


def main(argv: list[str]) -> None:
    data_dir = Path(argv[1])
    state = json.loads(Path(argv[2]).read_text())
    asyncio.run(_run(data_dir, state))


if __name__ == "__main__":
    main(sys.argv)
