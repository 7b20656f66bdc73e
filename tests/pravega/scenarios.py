"""Test-only: real ``pravega_client`` scenarios against ``headrace serve``, one per process.

Usage: ``python scenarios.py SCENARIO CONTROLLER_URI [ARG ...]``. Prints one
JSON object (the last line of stdout) with what the client saw; the parent
test asserts on it. Run only in a child process with a hard timeout: the
real client's calls block, hold the GIL, and retry for about a minute
against a dead server.

Events are text ``<key>:<sequence>`` so the parent can check exactly-once
delivery and per-key order without shipping every payload back.

Reads go through ``tests.pravega_binding`` (``run`` and ``read_slice``): a
blocking call made while one of the client's threads is still completing an
async read stalls for the client's 30 s request timeout (see that module).
Readers are not put offline at the end: the process exits at once instead
(``os._exit`` after the JSON line), because a normal interpreter exit with
live readers sometimes crashes inside the client (SIGSEGV) after the results
were printed.
"""

from __future__ import annotations

import hashlib
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

READ_DEADLINE_S = 120.0
"""Longest a scenario keeps reading before it reports what it has."""

IDLE_SLICES = 3
"""Empty slices in a row (each waits up to 1 s) after which a drained reader
group is taken to hold nothing more."""

INFLIGHT = 1000
"""``max_inflight_events`` for bulk writers: the writer batches while acks
are outstanding instead of waiting for each one."""


def _manager(uri: str) -> Any:
    return pc.StreamManager(uri, False, False)


async def _drain(
    readers: list[Any],
    want: int | None,
    *,
    extra: bool = False,
    counts: list[int] | None = None,
) -> list[bytes]:
    """Read from ``readers`` in turn (one process must not run two readers of
    a group concurrently) until ``want`` events arrived, or, with ``want``
    None, until every reader came back empty ``IDLE_SLICES`` times in a row.
    With ``extra``, go on after ``want`` until every reader came back empty
    once, so that events beyond ``want`` (duplicates) would be seen too.
    ``counts``, if given, receives the number of events each reader read."""
    got: list[bytes] = []
    per_reader = [0] * len(readers)
    deadline = time.monotonic() + READ_DEADLINE_S
    idle = 0
    while time.monotonic() < deadline:
        if want is not None and len(got) >= want and (not extra or idle >= len(readers)):
            break
        if want is None and idle >= IDLE_SLICES * len(readers):
            break
        for i, reader in enumerate(readers):
            events = await read_slice(reader)
            got += events
            per_reader[i] += len(events)
            idle = 0 if events else idle + 1
    if counts is not None:
        counts[:] = per_reader
    return got


def _sequence_check(events: list[bytes]) -> dict[str, Any]:
    """Exactly-once and per-key order of ``<key>:<n>`` events, in read order."""
    last: dict[str, int] = {}
    out_of_order = 0
    seen: set[bytes] = set()
    duplicates = 0
    for raw in events:
        if raw in seen:
            duplicates += 1
        seen.add(raw)
        key, _, n = raw.decode().partition(":")
        if int(n) <= last.get(key, -1):
            out_of_order += 1
        last[key] = int(n)
    return {
        "read": len(events),
        "distinct": len(seen),
        "duplicates": duplicates,
        "out_of_order": out_of_order,
        "keys": len(last),
    }


def _write_keyed(m: Any, scope: str, stream: str, count: int, keys: int, first: int = 0) -> float:
    writer = m.create_writer(scope, stream, INFLIGHT)
    start = time.monotonic()
    for i in range(first, first + count):
        key = f"k{i % keys:03d}"
        writer.write_event(f"{key}:{i}", routing_key=key)
    writer.flush()
    return time.monotonic() - start


# --------------------------------------------------------------------------- scenarios


def many_events(uri: str, count: str, scope: str = "many") -> dict[str, Any]:
    """(2) ``count`` events, 100 keys, 4 segments; a group of 2 readers reads them.

    The first reader of a group takes every segment; the group hands half of
    them to the second reader at its next rebalance (about 10 s later). So
    events trickle in (8 per round) while both readers poll, until both have
    read some; then the rest is written in bulk and read by both."""
    total = int(count)
    m = _manager(uri)
    m.create_scope(scope)
    m.create_stream(scope, "st", 4)
    rg = m.create_reader_group("rg", scope, "st")
    readers = [rg.create_reader("r1"), rg.create_reader("r2")]
    writer = m.create_writer(scope, "st", INFLIGHT)

    def write(first: int, n: int) -> None:
        for i in range(first, first + n):
            key = f"k{i % 100:03d}"
            writer.write_event(f"{key}:{i}", routing_key=key)
        writer.flush()

    written = 0

    async def share() -> tuple[list[bytes], list[int]]:
        nonlocal written
        got: list[bytes] = []
        per_reader = [0] * len(readers)
        deadline = time.monotonic() + READ_DEADLINE_S
        while min(per_reader) == 0 and written < total and time.monotonic() < deadline:
            n = min(8, total - written)
            write(written, n)
            written += n
            for i, reader in enumerate(readers):
                events = await read_slice(reader)
                got += events
                per_reader[i] += len(events)
        return got, per_reader

    shared, first_counts = run(share())
    start = time.monotonic()
    write(written, total - written)
    write_s = time.monotonic() - start
    start = time.monotonic()
    counts: list[int] = []
    rest = run(_drain(readers, total - len(shared), extra=True, counts=counts))
    read_s = time.monotonic() - start
    per_reader = [a + b for a, b in zip(first_counts, counts, strict=True)]
    return {
        **_sequence_check(shared + rest),
        "per_reader": per_reader,
        "bulk_per_reader": counts,
        "write_s": write_s,
        "read_s": read_s,
    }


def write_only(uri: str, count: str, scope: str) -> dict[str, Any]:
    """(4, first half) write and flush; every event returned here was acknowledged."""
    m = _manager(uri)
    m.create_scope(scope)
    m.create_stream(scope, "st", 4)
    write_s = _write_keyed(m, scope, "st", int(count), 100)
    return {"acknowledged": int(count), "write_s": write_s}


def write_through_restart(uri: str, count: str, scope: str) -> dict[str, Any]:
    """(4, harder) write while the parent kills and restarts the server: prints
    ``progress <n>`` lines so the parent knows when to strike; the writer
    reconnects, SetupAppend tells it what was stored, and it resends the rest."""
    m = _manager(uri)
    m.create_scope(scope)
    m.create_stream(scope, "st", 4)
    writer = m.create_writer(scope, "st", INFLIGHT)
    start = time.monotonic()
    for i in range(int(count)):
        key = f"k{i % 100:03d}"
        writer.write_event(f"{key}:{i}", routing_key=key)
        if i % 1000 == 999:
            print(f"progress {i + 1}", flush=True)
    writer.flush()
    return {"acknowledged": int(count), "write_s": time.monotonic() - start}


def write_more(uri: str, first: str, count: str, scope: str) -> dict[str, Any]:
    """(4, after the restart) a new writer appends to the existing stream."""
    m = _manager(uri)
    _write_keyed(m, scope, "st", int(count), 100, first=int(first))
    return {"acknowledged": int(count)}


def read_all(uri: str, scope: str, count: str) -> dict[str, Any]:
    """(4, second half) a new reader group reads everything the stream holds:
    ``count`` events are expected, and reading goes on until the readers are
    idle, so that any event beyond them shows."""
    m = _manager(uri)
    rg = m.create_reader_group(f"rg{int(time.time() * 1000)}", scope, "st")
    readers = [rg.create_reader("r1"), rg.create_reader("r2")]
    events = run(_drain(readers, int(count), extra=True))
    return {**_sequence_check(events), "max": max(int(e.split(b":")[1]) for e in events)}


def from_tail(uri: str) -> dict[str, Any]:
    """(3) a reader group created at the tail sees only later events."""
    m = _manager(uri)
    m.create_scope("tail")
    m.create_stream("tail", "st", 2)
    writer = m.create_writer("tail", "st")
    for i in range(20):
        writer.write_event(f"before:{i}", routing_key=f"k{i % 4}")
    writer.flush()
    rg = m.create_reader_group("rg", "tail", "st", True)
    reader = rg.create_reader("r1")
    for i in range(20):
        writer.write_event(f"after:{i}", routing_key=f"k{i % 4}")
    writer.flush()
    events = run(_drain([reader], 20, extra=True))
    return {"events": sorted(e.decode() for e in events)}


def sizes(uri: str) -> dict[str, Any]:
    """(8) events of 1 byte, 1 MiB and 9 MiB (the transient-segment path) round-trip."""
    m = _manager(uri)
    m.create_scope("sizes")
    m.create_stream("sizes", "st", 1)
    writer = m.create_writer("sizes", "st")
    payloads = [b"x", bytes(range(256)) * 4096, bytes(reversed(range(256))) * (9 * 4096)]
    for payload in payloads:
        writer.write_event_bytes(payload)
    writer.write_event_bytes(b"last")
    writer.flush()
    rg = m.create_reader_group("rg", "sizes", "st")
    reader = rg.create_reader("r1")
    events = run(_drain([reader], 4))
    return {
        "sent": [[len(x), hashlib.sha256(x).hexdigest()] for x in [*payloads, b"last"]],
        "read": [[len(x), hashlib.sha256(x).hexdigest()] for x in events],
    }


def byte_stream(uri: str) -> dict[str, Any]:
    """(5) write, flush, seek, readinto, truncate, head and tail offsets."""
    m = _manager(uri)
    m.create_scope("bytes")
    m.create_stream("bytes", "st", 1)
    bs = m.create_byte_stream("bytes", "st")
    r: dict[str, Any] = {}
    bs.write(b"hello ")
    bs.write(b"byte world")
    bs.flush()
    r["tail"] = bs.current_tail_offset()
    r["head"] = bs.current_head_offset()
    r["seek_end"] = bs.seek(0, 2)
    bs.seek(0, 0)
    buf = bytearray(16)
    r["read_all"] = bytes(buf[: bs.readinto(buf)]).decode()
    r["tell"] = bs.tell()
    bs.seek(6, 0)
    buf = bytearray(4)
    r["read_at_6"] = bytes(buf[: bs.readinto(buf)]).decode()
    bs.truncate(6)
    r["head_after_truncate"] = bs.current_head_offset()
    bs.seek(11, 0)
    buf = bytearray(16)
    r["read_after_truncate"] = bytes(buf[: bs.readinto(buf)]).decode()
    bs.write(b"!")
    bs.flush()
    r["tail_after_append"] = bs.current_tail_offset()
    # A second ByteStream starts its writes at offset 0: the conditional append fails.
    other = m.create_byte_stream("bytes", "st")
    other.write(b"clash")
    r["second_writer"] = _outcome(other.flush)
    return r


def transactions(uri: str) -> dict[str, Any]:
    """(6) a committed transaction's events appear together; an aborted one's never."""
    m = _manager(uri)
    m.create_scope("txn")
    m.create_stream("txn", "st", 1)
    writer = m.create_writer("txn", "st")
    txw = m.create_transaction_writer("txn", "st", 42)
    for i in range(5):
        writer.write_event(f"plain:{i}")
    txn = txw.begin_txn()
    for i in range(5):
        txn.write_event(f"txn:{i}")
    for i in range(5, 10):
        writer.write_event(f"plain:{i}")
    writer.flush()
    r: dict[str, Any] = {"open_before_commit": txn.is_open()}
    txn.commit()
    r["open_after_commit"] = txn.is_open()
    aborted = txw.begin_txn()
    for i in range(3):
        aborted.write_event(f"aborted:{i}")
    aborted.abort()
    writer.write_event("plain:10")
    writer.flush()
    rg = m.create_reader_group("rg", "txn", "st")
    reader = rg.create_reader("r1")
    events = run(_drain([reader], None))
    r["events"] = [e.decode() for e in events]
    return r


def abort_right_after_write(uri: str, rounds: str) -> dict[str, Any]:
    """Transactions aborted right after their first event, so the abort races
    the transaction writer's ``SetupAppend``; then a committed one, read back
    through a reader group (the parent checks this process's stderr for a
    client panic)."""
    m = _manager(uri)
    m.create_scope("race")
    m.create_stream("race", "st", 2)
    txw = m.create_transaction_writer("race", "st", 43)
    for i in range(int(rounds)):
        txn = txw.begin_txn()
        txn.write_event(f"aborted:{i}", routing_key=f"k{i}")
        txn.abort()
    txn = txw.begin_txn()
    for i in range(4):
        txn.write_event(f"kept:{i}", routing_key=f"k{i}")
    txn.commit()
    reader = m.create_reader_group("rg", "race", "st").create_reader("r1")
    events = run(_drain([reader], 4))
    return {"events": sorted(e.decode() for e in events)}


def reads_between_blocking_calls(uri: str, rounds: str) -> dict[str, Any]:
    """Rounds of: write an event and flush, write one more with a new writer
    (a ``SetupAppend`` on a pooled connection), read a slice. Without
    ``read_slice``'s settling, some rounds stall for the client's 30 s
    request timeout (see ``tests.pravega_binding``); the parent checks that
    none does and that every event is read once."""
    m = _manager(uri)
    m.create_scope("mix")
    m.create_stream("mix", "st", 2)
    writer = m.create_writer("mix", "st")
    reader = m.create_reader_group("rg", "mix", "st").create_reader("r1")
    slowest = 0.0

    async def go() -> list[bytes]:
        nonlocal slowest
        got: list[bytes] = []
        for i in range(int(rounds)):
            started = time.monotonic()
            writer.write_event(f"k{i % 3}:{i}", routing_key=f"k{i % 3}")
            writer.flush()
            fresh = m.create_writer("mix", "st")
            fresh.write_event(f"new:{i}", routing_key="new")
            fresh.flush()
            got += await read_slice(reader)
            slowest = max(slowest, time.monotonic() - started)
        return got + await _drain([reader], None)

    events = run(go())
    return {
        "events": len(events),
        "distinct": len(set(events)),
        "slowest_round_s": slowest,
    }


def retention_by_size(uri: str) -> dict[str, Any]:
    """(7) size retention truncates old data at event boundaries while a reader
    that keeps up reads on, and a reader group created later starts at the head.

    Events are 100 bytes framed as 108: ``ev<5 digits>`` padded with dots.
    The policy keeps 2000 bytes; rounds of 30 events are written until the
    head has moved twice (polled through a byte stream on the same stream)."""
    m = _manager(uri)
    m.create_scope("ret")
    m.create_stream_with_policy(
        "ret",
        "st",
        pc.StreamScalingPolicy.fixed_scaling_policy(1),
        pc.StreamRetentionPolicy.by_size(2000),
        None,
    )
    writer = m.create_writer("ret", "st")
    live = m.create_reader_group("live", "ret", "st").create_reader("r1")
    probe = m.create_byte_stream("ret", "st")
    heads: list[int] = []
    live_events: list[bytes] = []
    written = 0
    deadline = time.monotonic() + READ_DEADLINE_S
    while len(heads) < 2 and time.monotonic() < deadline:
        for _ in range(30):
            writer.write_event(f"ev{written:05d}".ljust(100, "."))
            written += 1
        writer.flush()
        live_events += run(_drain([live], written - len(live_events)))
        head = probe.current_head_offset()
        wait_until = time.monotonic() + 1.0
        while head == (heads[-1] if heads else 0) and time.monotonic() < wait_until:
            time.sleep(0.05)  # polling the head under a deadline, not synchronisation
            head = probe.current_head_offset()
        if head != (heads[-1] if heads else 0):
            heads.append(head)
    late = m.create_reader_group("late", "ret", "st").create_reader("r1")
    late_events = run(_drain([late], None))
    expected = [f"ev{i:05d}".ljust(100, ".").encode() for i in range(written)]
    return {
        "written": written,
        "heads": heads,
        "tail": probe.current_tail_offset(),
        "live_complete": live_events == expected,
        "late_first": late_events[0][:7].decode() if late_events else None,
        "late_is_suffix": late_events == expected[len(expected) - len(late_events) :],
        "late_count": len(late_events),
    }


def sealed(uri: str) -> dict[str, Any]:
    """After sealing, a reader that was at the tail gets no more events (end of
    segment, no successors) and later writes fail."""
    m = _manager(uri)
    m.create_scope("seal")
    m.create_stream("seal", "st", 2)
    writer = m.create_writer("seal", "st")
    for i in range(10):
        writer.write_event(f"k{i % 4}:{i}", routing_key=f"k{i % 4}")
    writer.flush()
    reader = m.create_reader_group("rg", "seal", "st").create_reader("r1")
    events = run(_drain([reader], 10))
    r: dict[str, Any] = {"before": len(events), "seal": m.seal_stream("seal", "st")}
    r["after"] = len(run(_drain([reader], None)))
    r["late_write"] = _outcome(
        lambda: (writer.write_event("late", routing_key="k1"), writer.flush())
    )
    return r


def _outcome(fn: Callable[[], Any]) -> str:
    try:
        fn()
    except Exception as exc:
        return type(exc).__name__
    return "ok"


SCENARIOS: dict[str, Callable[..., dict[str, Any]]] = {
    "many_events": many_events,
    "write_only": write_only,
    "write_more": write_more,
    "write_through_restart": write_through_restart,
    "read_all": read_all,
    "from_tail": from_tail,
    "sizes": sizes,
    "byte_stream": byte_stream,
    "transactions": transactions,
    "abort_right_after_write": abort_right_after_write,
    "reads_between_blocking_calls": reads_between_blocking_calls,
    "retention_by_size": retention_by_size,
    "sealed": sealed,
}

if __name__ == "__main__":
    name, uri, *args = sys.argv[1:]
    print(json.dumps(SCENARIOS[name](uri, *args)), flush=True)
    # Skip interpreter teardown: with readers still live the client sometimes
    # crashes (SIGSEGV) while Python finalises its objects under its threads.
    os._exit(0)
