"""The store conformance suite: every rule of ``headrace.store.api``, once.

``StoreContract`` holds the behaviour tests; each backend subclasses it in a
``test_<backend>.py`` and provides a ``store`` fixture (an open
``SegmentStore``). The class name has no ``Test`` prefix, so pytest collects
it only through those subclasses (eventsourcing's ``tests/persistence.py``).

Waits are synchronised with tasks and the event loop, never with timed
sleeps: ``_park`` yields to the loop until a waiting task has had every
chance to run, and every wait has a bounded timeout so a broken store fails
instead of hanging.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable
from uuid import UUID

import pytest

from headrace.errors import (
    BadOffset,
    LimitExceeded,
    SegmentExists,
    SegmentNotFound,
    SegmentSealed,
    SegmentTruncated,
    SegmentTypeMismatch,
    StoreClosed,
    TableKeyBadVersion,
    TableKeyNotFound,
    TableNotEmpty,
)
from headrace.store.api import (
    MAX_APPEND_BYTES,
    MAX_NAME_BYTES,
    MAX_SEGMENT_ATTRIBUTES,
    MAX_TABLE_BATCH_BYTES,
    MAX_TABLE_KEY_BYTES,
    MAX_TABLE_VALUE_BYTES,
    MAX_WAIT_S,
    SegmentStore,
    TimeIndexed,
)
from headrace.types import (
    NO_VERSION,
    NOT_EXISTS,
    NULL_ATTRIBUTE_VALUE,
    AppendResult,
    ReadResult,
    RegionRead,
    SegmentKind,
    TableDelta,
    TableEntry,
    TableInfo,
    TableKey,
    TableUpdate,
    WriterAppend,
)

__all__ = ["ODD_NAMES", "StoreContract"]

W1 = UUID(int=1)
W2 = UUID(int=2)
A1 = UUID("6f1c2b9e-0d5a-4e47-9a1e-2f3b4c5d6e7f")

WAIT_LIMIT_S = 10.0
"""Upper bound on any wait a test expects to end; far above any healthy store's latency."""

ODD_NAMES = [
    "",
    ".",
    "..",
    "../x",
    "../../etc/passwd",
    "/abs/path",
    "a/b",
    "a%2Fb",
    "a_b",
    "A_B",
    "a\\b",
    "nul\x00inside",
    "\x00",
    "CON",
    "con",
    "name.",
    "name ",
    " name",
    "scope/stream/0.#epoch.0",
    "seg#transient.0123456789abcdef0123456789abcdef.fedcba9876543210fedcba9876543210",
    "é",
    "e\u0301",  # 'é' decomposed: must not be normalised into the name above
    "\ufeffbom",
    "lone\ud800surrogate",
    "🙂" * (MAX_NAME_BYTES // 4),  # 65532 bytes of UTF-8
    "x" * MAX_NAME_BYTES,
]
"""Names that are valid segment names, pairwise distinct, and hostile to naive path mapping."""


async def _park(task: asyncio.Task[object]) -> None:
    """Yield to the loop until ``task`` has run as far as it can without outside help."""
    for _ in range(20):
        await asyncio.sleep(0)  # a bare yield, not a timed sleep
    assert not task.done(), "the waiter returned before anything woke it"


async def _read_all(store: SegmentStore, name: str, offset: int = 0) -> bytes:
    parts: list[bytes] = []
    while True:
        result = await store.read(name, offset, 1 << 20)
        if not result.data:
            return b"".join(parts)
        parts.append(result.data)
        offset += len(result.data)


async def _next_ms() -> int:
    """The wall clock's next millisecond, once it came (appends before this call
    are then stamped strictly earlier than the value returned)."""
    now = time.time_ns() // 1_000_000
    deadline = time.monotonic() + WAIT_LIMIT_S
    while time.time_ns() // 1_000_000 <= now:
        assert time.monotonic() < deadline, "the wall clock stands still"
        await asyncio.sleep(0.0005)  # lets the clock tick; nothing else is waited for
    return time.time_ns() // 1_000_000


def _as_read(result: ReadResult | RegionRead) -> ReadResult:
    """A ``read_region`` answer as the ``ReadResult`` it stands for (closes a region)."""
    if isinstance(result, ReadResult):
        return result
    with result.region as region:
        assert region.size_bytes > 0
        return ReadResult(result.offset, region.read(), result.at_tail, result.end_of_segment)


class StoreContract:
    """Behaviour every ``SegmentStore`` must have; subclasses provide ``store``."""

    # ================================================================== create

    async def test_create_segment_is_empty_and_unsealed(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        info = await store.info("s")
        assert info.name == "s"
        assert info.kind is SegmentKind.STREAM
        assert (info.start_offset, info.length, info.sealed) == (0, 0, False)
        assert dict(info.attributes) == {}
        assert await store.read("s", 0, 100) == ReadResult(0, b"", True, False)

    async def test_create_table_segment_kind(self, store: SegmentStore) -> None:
        await store.create_segment("t1", kind=SegmentKind.TABLE)
        await store.create_table("t2")
        for name in ("t1", "t2"):
            info = await store.info(name)
            assert (info.kind, info.length, info.sealed) == (SegmentKind.TABLE, 0, False)
            assert await store.table_info(name) == TableInfo(name, 0, 0, 0)

    @pytest.mark.parametrize("first", list(SegmentKind))
    @pytest.mark.parametrize("second", list(SegmentKind))
    async def test_create_existing_name_raises_segment_exists(
        self, store: SegmentStore, first: SegmentKind, second: SegmentKind
    ) -> None:
        await store.create_segment("s", kind=first)
        if first is SegmentKind.STREAM:
            await store.append("s", b"keep")
        with pytest.raises(SegmentExists) as caught:
            await store.create_segment("s", kind=second)
        assert caught.value.name == "s"
        with pytest.raises(SegmentExists):
            await store.create_table("s")
        info = await store.info("s")
        assert info.kind is first
        assert info.length == (4 if first is SegmentKind.STREAM else 0)

    async def test_create_after_delete_starts_fresh(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        await store.append("s", b"old", writer=WriterAppend(W1, 5))
        await store.seal("s")
        await store.delete("s")
        await store.create_segment("s")
        info = await store.info("s")
        assert (info.length, info.sealed, dict(info.attributes)) == (0, False, {})
        assert await store.get_attribute("s", W1) == NULL_ATTRIBUTE_VALUE
        result = await store.append("s", b"new", writer=WriterAppend(W1, 1))
        assert result == AppendResult(0, 3, NULL_ATTRIBUTE_VALUE, False)

    async def test_table_recreated_after_delete_is_empty(self, store: SegmentStore) -> None:
        await store.create_table("t")
        await store.update_table("t", [TableUpdate(b"k", b"v")])
        await store.delete_table("t")
        await store.create_table("t")
        assert await store.get_table_entries("t", [b"k"]) == [None]
        assert await store.table_info("t") == TableInfo("t", 0, 0, 0)
        assert await store.update_table("t", [TableUpdate(b"k", b"v", NOT_EXISTS)]) == [0]

    # ================================================================== names

    async def test_odd_names_are_distinct_segments(self, store: SegmentStore) -> None:
        for i, name in enumerate(ODD_NAMES):
            await store.create_segment(name)
            await store.append(name, f"data-{i}".encode())
        assert await store.list_segments() == sorted(ODD_NAMES)
        for i, name in enumerate(ODD_NAMES):
            assert (await store.info(name)).name == name
            assert await _read_all(store, name) == f"data-{i}".encode()

    async def test_odd_names_work_as_tables(self, store: SegmentStore) -> None:
        for i, name in enumerate(ODD_NAMES[:12]):
            await store.create_table(name)
            await store.update_table(name, [TableUpdate(b"k", str(i).encode())])
        for i, name in enumerate(ODD_NAMES[:12]):
            entry = await store.get_table_entries(name, [b"k"])
            assert entry == [TableEntry(b"k", str(i).encode(), 0)]

    async def test_name_at_byte_limit_is_accepted(self, store: SegmentStore) -> None:
        name = "é" * (MAX_NAME_BYTES // 2) + "x"  # 2-byte characters: exactly the limit
        assert len(name.encode()) == MAX_NAME_BYTES
        await store.create_segment(name)
        assert await store.list_segments() == [name]

    @pytest.mark.parametrize(
        "name",
        ["x" * (MAX_NAME_BYTES + 1), "é" * (MAX_NAME_BYTES // 2 + 1), "🙂" * 16384],
        ids=["ascii", "two-byte", "four-byte"],
    )
    async def test_name_over_byte_limit_raises_limit_exceeded(
        self, store: SegmentStore, name: str
    ) -> None:
        with pytest.raises(LimitExceeded) as caught:
            await store.create_segment(name)
        assert caught.value.limit == MAX_NAME_BYTES
        assert caught.value.got == len(name.encode())
        with pytest.raises(LimitExceeded):
            await store.create_table(name)
        assert await store.list_segments() == []

    # ================================================================== append

    async def test_append_returns_offsets_and_lengths(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        assert await store.append("s", b"abc") == AppendResult(0, 3, NULL_ATTRIBUTE_VALUE, False)
        assert await store.append("s", b"defgh") == AppendResult(3, 8, NULL_ATTRIBUTE_VALUE, False)
        assert (await store.info("s")).length == 8
        assert await _read_all(store, "s") == b"abcdefgh"

    async def test_append_empty_data_changes_nothing(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        await store.append("s", b"ab")
        result = await store.append("s", b"")
        assert (result.offset, result.length, result.duplicate) == (2, 2, False)
        assert await _read_all(store, "s") == b"ab"

    async def test_append_expected_offset_match(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        assert (await store.append("s", b"abc", expected_offset=0)).length == 3
        assert await store.append("s", b"de", expected_offset=3) == AppendResult(3, 5)

    @pytest.mark.parametrize("expected", [0, 2, 4, 100])
    async def test_append_expected_offset_mismatch_raises_bad_offset(
        self, store: SegmentStore, expected: int
    ) -> None:
        await store.create_segment("s")
        await store.append("s", b"abc")
        with pytest.raises(BadOffset) as caught:
            await store.append("s", b"zz", expected_offset=expected)
        assert (caught.value.name, caught.value.expected, caught.value.actual) == (
            "s",
            expected,
            3,
        )
        assert await _read_all(store, "s") == b"abc"

    async def test_append_writer_records_event_number(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        first = await store.append("s", b"e1", writer=WriterAppend(W1, 1))
        assert first == AppendResult(0, 2, NULL_ATTRIBUTE_VALUE, False)
        assert await store.get_attribute("s", W1) == 1
        second = await store.append("s", b"e2e3", writer=WriterAppend(W1, 3))
        assert second == AppendResult(2, 6, 1, False)
        assert await store.get_attribute("s", W1) == 3
        assert dict((await store.info("s")).attributes) == {W1: 3}

    @pytest.mark.parametrize("retry_number", [3, 2, 0, -5])
    async def test_append_writer_retry_is_duplicate(
        self, store: SegmentStore, retry_number: int
    ) -> None:
        await store.create_segment("s")
        await store.append("s", b"e1", writer=WriterAppend(W1, 1))
        await store.append("s", b"e23", writer=WriterAppend(W1, 3))
        retry = await store.append("s", b"e23", writer=WriterAppend(W1, retry_number))
        assert retry == AppendResult(5, 5, 3, True)
        assert await _read_all(store, "s") == b"e1e23"
        assert await store.get_attribute("s", W1) == 3

    async def test_append_writers_are_independent(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        await store.append("s", b"a", writer=WriterAppend(W1, 10))
        result = await store.append("s", b"b", writer=WriterAppend(W2, 1))
        assert result == AppendResult(1, 2, NULL_ATTRIBUTE_VALUE, False)
        assert dict((await store.info("s")).attributes) == {W1: 10, W2: 1}

    async def test_append_writer_after_plain_appends(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        await store.append("s", b"plain")
        result = await store.append("s", b"w", writer=WriterAppend(W1, 1))
        assert result == AppendResult(5, 6, NULL_ATTRIBUTE_VALUE, False)

    async def test_append_writer_with_bad_offset_changes_nothing(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        await store.append("s", b"abc", writer=WriterAppend(W1, 1))
        with pytest.raises(BadOffset):
            await store.append("s", b"d", expected_offset=1, writer=WriterAppend(W1, 2))
        assert await store.get_attribute("s", W1) == 1
        assert await _read_all(store, "s") == b"abc"
        ok = await store.append("s", b"d", expected_offset=3, writer=WriterAppend(W1, 2))
        assert ok == AppendResult(3, 4, 1, False)

    async def test_append_writer_attribute_shared_with_update_attribute(
        self, store: SegmentStore
    ) -> None:
        await store.create_segment("s")
        assert await store.update_attribute("s", W1, 7, NULL_ATTRIBUTE_VALUE)
        dup = await store.append("s", b"x", writer=WriterAppend(W1, 7))
        assert dup == AppendResult(0, 0, 7, True)
        fresh = await store.append("s", b"x", writer=WriterAppend(W1, 8))
        assert fresh == AppendResult(0, 1, 7, False)

    async def test_attributes_past_the_bound_drop_the_least_recently_set(
        self, store: SegmentStore
    ) -> None:
        """A segment keeps MAX_SEGMENT_ATTRIBUTES attributes, writer numbers and
        update_attribute's alike; the least recently set go first, and a writer
        whose number was dropped has lost its dedup (its retry is stored)."""
        await store.create_segment("s")
        assert await store.update_attribute("s", A1, 5, NULL_ATTRIBUTE_VALUE)  # oldest
        await store.append("s", b"1", writer=WriterAppend(W1, 1))
        await store.append("s", b"2", writer=WriterAppend(W2, 1))
        await store.append("s", b"1", writer=WriterAppend(W1, 2))  # W1 used again: now newest
        fresh = [UUID(int=0x1000 + i) for i in range(MAX_SEGMENT_ATTRIBUTES - 1)]
        await asyncio.gather(*(store.append("s", b"f", writer=WriterAppend(w, 1)) for w in fresh))
        attributes = dict((await store.info("s")).attributes)
        assert len(attributes) == MAX_SEGMENT_ATTRIBUTES
        assert A1 not in attributes and W2 not in attributes  # the two set longest ago
        assert await store.get_attribute("s", A1) == NULL_ATTRIBUTE_VALUE
        assert await store.get_attribute("s", W1) == 2
        assert all(attributes[w] == 1 for w in fresh)
        retry = await store.append("s", b"2", writer=WriterAppend(W2, 1))
        assert not retry.duplicate  # the documented cost of the bound
        assert await store.get_attribute("s", W2) == 1
        assert await store.get_attribute("s", W1) == NULL_ATTRIBUTE_VALUE  # set before fresh
        assert await store.get_attribute("s", fresh[0]) == 1

    async def test_append_to_sealed_raises_segment_sealed(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        await store.append("s", b"abc")
        await store.seal("s")
        with pytest.raises(SegmentSealed) as caught:
            await store.append("s", b"d")
        assert (caught.value.name, caught.value.length) == ("s", 3)
        with pytest.raises(SegmentSealed):
            await store.append("s", b"d", expected_offset=3, writer=WriterAppend(W1, 1))
        assert await store.get_attribute("s", W1) == NULL_ATTRIBUTE_VALUE
        assert (await store.info("s")).length == 3

    async def test_append_to_missing_raises_segment_not_found(self, store: SegmentStore) -> None:
        with pytest.raises(SegmentNotFound) as caught:
            await store.append("nope", b"x")
        assert caught.value.name == "nope"
        assert await store.list_segments() == []

    async def test_append_to_table_raises_type_mismatch(self, store: SegmentStore) -> None:
        await store.create_table("t")
        with pytest.raises(SegmentTypeMismatch) as caught:
            await store.append("t", b"raw bytes")
        assert caught.value.name == "t"
        assert await store.table_info("t") == TableInfo("t", 0, 0, 0)

    async def test_append_over_limit_raises_limit_exceeded(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        with pytest.raises(LimitExceeded) as caught:
            await store.append("s", bytes(MAX_APPEND_BYTES + 1))
        assert (caught.value.limit, caught.value.got) == (MAX_APPEND_BYTES, MAX_APPEND_BYTES + 1)
        assert (await store.info("s")).length == 0

    async def test_append_at_limit_is_accepted(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        data = bytes(range(256)) * (MAX_APPEND_BYTES // 256)
        assert await store.append("s", data) == AppendResult(0, MAX_APPEND_BYTES)
        assert await _read_all(store, "s") == data

    async def test_concurrent_appends_are_contiguous(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        chunks = [bytes([i]) * (i + 1) for i in range(40)]
        results = await asyncio.gather(*(store.append("s", c) for c in chunks))
        total = sum(len(c) for c in chunks)
        ranges = sorted((r.offset, r.offset + len(c)) for r, c in zip(results, chunks, strict=True))
        assert ranges[0][0] == 0 and ranges[-1][1] == total
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
        data = await _read_all(store, "s")
        assert len(data) == total
        for r, c in zip(results, chunks, strict=True):
            assert data[r.offset : r.offset + len(c)] == c
            assert r.length >= r.offset + len(c)

    async def test_concurrent_conditional_appends_exactly_one_wins(
        self, store: SegmentStore
    ) -> None:
        await store.create_segment("s")
        await store.append("s", b"base")
        outcomes = await asyncio.gather(
            *(store.append("s", bytes([i]), expected_offset=4) for i in range(10)),
            return_exceptions=True,
        )
        wins = [o for o in outcomes if isinstance(o, AppendResult)]
        assert len(wins) == 1 and wins[0].offset == 4
        assert all(isinstance(o, BadOffset) for o in outcomes if o is not wins[0])
        assert (await store.info("s")).length == 5

    async def test_concurrent_writer_retries_store_once(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        outcomes = await asyncio.gather(
            *(store.append("s", b"event", writer=WriterAppend(W1, 1)) for _ in range(5))
        )
        assert sum(not o.duplicate for o in outcomes) == 1
        assert await _read_all(store, "s") == b"event"

    async def test_many_segments_keep_their_data(self, store: SegmentStore) -> None:
        names = [f"scope/stream/{i}" for i in range(300)]  # more than a handful of open files
        await asyncio.gather(*(store.create_segment(n) for n in names))
        await asyncio.gather(*(store.append(n, n.encode()) for n in names))
        await asyncio.gather(*(store.append(n, b"|2") for n in names[::7]))
        for i, name in enumerate(names):
            assert await _read_all(store, name) == name.encode() + (b"|2" if i % 7 == 0 else b"")
        assert await store.list_segments() == sorted(names)

    async def test_large_appends_read_back_at_any_offset(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        pattern = bytes(range(251))  # a prime length: no two blocks look alike
        sizes = [(1 << 20) - 3, 7, (1 << 20) + 11, 1 << 19]
        data = (pattern * (sum(sizes) // len(pattern) + 1))[: sum(sizes)]
        offset = 0
        for size in sizes:
            result = await store.append("s", data[offset : offset + size])
            assert (result.offset, result.length) == (offset, offset + size)
            offset += size
        for start in (0, 1, (1 << 20) - 4, (1 << 20) - 3, (1 << 20) + 1, len(data) - 5):
            result = await store.read("s", start, 1 << 20)
            assert result.offset == start
            assert result.data == data[start : start + len(result.data)]
            assert len(result.data) == min(1 << 20, len(data) - start)
        await store.truncate("s", (1 << 20) + 2)
        assert await _read_all(store, "s", (1 << 20) + 2) == data[(1 << 20) + 2 :]

    # ================================================================== read

    async def test_read_starts_exactly_at_offset(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        await store.append("s", b"0123456789")
        assert await store.read("s", 3, 4) == ReadResult(3, b"3456", False, False)
        assert await store.read("s", 0, 10) == ReadResult(0, b"0123456789", True, False)
        assert await store.read("s", 7, 100) == ReadResult(7, b"789", True, False)
        assert await store.read("s", 9, 1) == ReadResult(9, b"9", True, False)

    async def test_read_across_appends(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        for part in (b"ab", b"cde", b"f"):
            await store.append("s", part)
        assert (await store.read("s", 1, 4)).data == b"bcde"

    async def test_read_zero_max_bytes_returns_no_data(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        await store.append("s", b"abc")
        result = await store.read("s", 1, 0)
        assert (result.offset, result.data, result.end_of_segment) == (1, b"", False)

    async def test_read_at_tail_returns_empty(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        await store.append("s", b"abc")
        assert await store.read("s", 3, 10) == ReadResult(3, b"", True, False)

    async def test_read_sealed_flags_end_of_segment(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        await store.append("s", b"abcdef")
        await store.seal("s")
        assert await store.read("s", 0, 2) == ReadResult(0, b"ab", False, False)
        assert await store.read("s", 2, 100) == ReadResult(2, b"cdef", True, True)
        assert await store.read("s", 6, 100) == ReadResult(6, b"", True, True)

    async def test_read_below_start_raises_truncated(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        await store.append("s", b"abcdef")
        await store.truncate("s", 4)
        for offset in (0, 3):
            with pytest.raises(SegmentTruncated) as caught:
                await store.read("s", offset, 10)
            assert (caught.value.name, caught.value.start_offset) == ("s", 4)
        assert await store.read("s", 4, 10) == ReadResult(4, b"ef", True, False)

    @pytest.mark.parametrize("offset", [4, 5, 1 << 40])
    async def test_read_beyond_length_raises_bad_offset(
        self, store: SegmentStore, offset: int
    ) -> None:
        await store.create_segment("s")
        await store.append("s", b"abc")
        with pytest.raises(BadOffset) as caught:
            await store.read("s", offset, 10)
        assert (caught.value.name, caught.value.expected, caught.value.actual) == ("s", offset, 3)

    async def test_read_missing_raises_not_found(self, store: SegmentStore) -> None:
        with pytest.raises(SegmentNotFound):
            await store.read("nope", 0, 10)

    async def test_read_table_segment_returns_its_records(self, store: SegmentStore) -> None:
        await store.create_table("t")
        await store.update_table("t", [TableUpdate(b"key1", b"value1")])
        data = await _read_all(store, "t")
        assert len(data) == 27 == (await store.table_info("t")).length
        assert b"key1value1" in data

    # ================================================================== read_region

    @pytest.mark.parametrize("min_region_bytes", [0, 1, 1 << 20])
    async def test_read_region_is_read_at_any_offset(
        self, store: SegmentStore, min_region_bytes: int
    ) -> None:
        await store.create_segment("s")
        pattern = bytes(range(251))
        data = (pattern * 9000)[: (1 << 21) + 13]
        for start in range(0, len(data), 700_001):  # odd sizes: blocks end mid-append
            await store.append("s", data[start : start + 700_001])
        for offset, max_bytes in [
            (0, 5),
            (3, 1 << 20),
            ((1 << 20) - 7, 1 << 20),  # across a 1 MiB boundary
            ((1 << 20) + 1, 3),
            (len(data) - 9, 100),
            (len(data), 100),  # at the tail: nothing
            (17, 0),
        ]:
            expected = await store.read("s", offset, max_bytes)
            got = await store.read_region("s", offset, max_bytes, min_region_bytes=min_region_bytes)
            assert _as_read(got) == expected, (offset, max_bytes)
            assert expected.data == data[offset : offset + len(expected.data)]

    async def test_read_region_flags_match_read(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        await store.append("s", b"abcdef")
        await store.seal("s")
        assert _as_read(await store.read_region("s", 0, 2)) == ReadResult(0, b"ab", False, False)
        assert _as_read(await store.read_region("s", 2, 9)) == ReadResult(2, b"cdef", True, True)
        assert _as_read(await store.read_region("s", 6, 9)) == ReadResult(6, b"", True, True)

    async def test_read_region_errors_match_read(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        await store.append("s", b"abcdef")
        await store.truncate("s", 4)
        with pytest.raises(SegmentTruncated):
            await store.read_region("s", 3, 10)
        with pytest.raises(BadOffset) as caught:
            await store.read_region("s", 7, 10)
        assert (caught.value.expected, caught.value.actual) == (7, 6)
        with pytest.raises(SegmentNotFound):
            await store.read_region("nope", 0, 10)

    async def test_read_region_of_table_segment(self, store: SegmentStore) -> None:
        await store.create_table("t")
        await store.update_table("t", [TableUpdate(b"key1", b"value1")])
        assert _as_read(await store.read_region("t", 0, 100)) == await store.read("t", 0, 100)

    async def test_read_region_stays_readable_after_delete(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        await store.append("s", b"x" * 5000 + b"y" * 5000)
        result = await store.read_region("s", 4990, 20)
        await store.delete("s")
        assert _as_read(result).data == b"x" * 10 + b"y" * 10

    async def test_read_region_never_shows_appends_in_flight(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        await store.append("s", b"a" * 4096)
        appending = asyncio.ensure_future(store.append("s", b"b" * 4096))
        await asyncio.sleep(0)  # the append is issued (and, on disk, waits for its sync)
        expected = await store.read("s", 0, 1 << 20)
        assert _as_read(await store.read_region("s", 0, 1 << 20)) == expected
        await asyncio.wait_for(appending, WAIT_LIMIT_S)
        assert _as_read(await store.read_region("s", 0, 1 << 20)).data == b"a" * 4096 + b"b" * 4096

    # ================================================================== wait_for_data

    async def test_wait_returns_at_once_when_data_present(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        await store.append("s", b"abc")
        assert await store.wait_for_data("s", 0, 0) is True
        assert await store.wait_for_data("s", 2, 0) is True

    async def test_wait_returns_at_once_when_sealed(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        await store.append("s", b"abc")
        await store.seal("s")
        assert await store.wait_for_data("s", 3, 0) is True

    async def test_wait_times_out_returning_false(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        await store.append("s", b"abc")
        assert await store.wait_for_data("s", 3, 0) is False
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await store.wait_for_data("s", 3, 0.05) is False
        assert loop.time() - started >= 0.04

    async def test_wait_wakes_on_append(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        waiter = asyncio.create_task(store.wait_for_data("s", 0, WAIT_LIMIT_S))
        await _park(waiter)
        await store.append("s", b"x")
        assert await asyncio.wait_for(waiter, WAIT_LIMIT_S) is True

    async def test_wait_ignores_appends_short_of_offset(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        waiter = asyncio.create_task(store.wait_for_data("s", 5, WAIT_LIMIT_S))
        await _park(waiter)
        await store.append("s", b"abc")  # length 3: offset 5 still has no byte
        await _park(waiter)
        await store.append("s", b"def")
        assert await asyncio.wait_for(waiter, WAIT_LIMIT_S) is True

    async def test_wait_wakes_every_waiter(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        waiters = [asyncio.create_task(store.wait_for_data("s", 0, WAIT_LIMIT_S)) for _ in range(3)]
        for waiter in waiters:
            await _park(waiter)
        await store.append("s", b"x")
        assert await asyncio.wait_for(asyncio.gather(*waiters), WAIT_LIMIT_S) == [True] * 3

    async def test_wait_wakes_on_seal(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        await store.append("s", b"abc")
        waiter = asyncio.create_task(store.wait_for_data("s", 3, WAIT_LIMIT_S))
        await _park(waiter)
        await store.seal("s")
        assert await asyncio.wait_for(waiter, WAIT_LIMIT_S) is True

    async def test_wait_wakes_on_merge_into_target(self, store: SegmentStore) -> None:
        await store.create_segment("t")
        await store.create_segment("src")
        await store.append("src", b"abc")
        waiter = asyncio.create_task(store.wait_for_data("t", 0, WAIT_LIMIT_S))
        await _park(waiter)
        await store.merge("t", "src")
        assert await asyncio.wait_for(waiter, WAIT_LIMIT_S) is True

    async def test_wait_raises_when_deleted_while_waiting(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        waiter = asyncio.create_task(store.wait_for_data("s", 0, WAIT_LIMIT_S))
        await _park(waiter)
        await store.delete("s")
        with pytest.raises(SegmentNotFound):
            await asyncio.wait_for(waiter, WAIT_LIMIT_S)

    async def test_wait_raises_when_merged_away_while_waiting(self, store: SegmentStore) -> None:
        await store.create_segment("t")
        await store.create_segment("src")
        waiter = asyncio.create_task(store.wait_for_data("src", 0, WAIT_LIMIT_S))
        await _park(waiter)
        await store.merge("t", "src")
        with pytest.raises(SegmentNotFound):
            await asyncio.wait_for(waiter, WAIT_LIMIT_S)

    async def test_wait_raises_store_closed_when_closed_while_waiting(
        self, store: SegmentStore
    ) -> None:
        await store.create_segment("s")
        waiter = asyncio.create_task(store.wait_for_data("s", 0, MAX_WAIT_S))
        await _park(waiter)
        await store.close()
        done, _ = await asyncio.wait({waiter}, timeout=WAIT_LIMIT_S)
        assert waiter in done, "close left a long-poll wait parked"
        with pytest.raises(StoreClosed):
            waiter.result()

    async def test_wait_on_missing_raises_not_found(self, store: SegmentStore) -> None:
        with pytest.raises(SegmentNotFound):
            await store.wait_for_data("nope", 0, 1.0)

    # ================================================================== info

    async def test_info_reports_every_field(self, store: SegmentStore) -> None:
        before_ms = time.time_ns() // 1_000_000
        await store.create_segment("s")
        await store.append("s", b"0123456789", writer=WriterAppend(W1, 4))
        await store.update_attribute("s", A1, 99, NULL_ATTRIBUTE_VALUE)
        await store.truncate("s", 2)
        await store.seal("s")
        after_ms = time.time_ns() // 1_000_000
        info = await store.info("s")
        assert info.name == "s"
        assert info.kind is SegmentKind.STREAM
        assert (info.start_offset, info.length, info.sealed) == (2, 10, True)
        assert dict(info.attributes) == {W1: 4, A1: 99}
        assert before_ms - 1000 <= info.last_modified_ms <= after_ms + 1000

    async def test_info_last_modified_moves_forward(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        created = (await store.info("s")).last_modified_ms
        await store.append("s", b"x")
        appended = (await store.info("s")).last_modified_ms
        assert appended >= created

    async def test_info_attributes_are_a_snapshot(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        await store.update_attribute("s", A1, 1, NULL_ATTRIBUTE_VALUE)
        info = await store.info("s")
        await store.update_attribute("s", A1, 2, 1)
        await store.update_attribute("s", W1, 3, NULL_ATTRIBUTE_VALUE)
        assert dict(info.attributes) == {A1: 1}
        assert dict((await store.info("s")).attributes) == {A1: 2, W1: 3}

    async def test_info_missing_raises_not_found(self, store: SegmentStore) -> None:
        with pytest.raises(SegmentNotFound) as caught:
            await store.info("nope")
        assert caught.value.name == "nope"

    # ================================================================== seal

    async def test_seal_returns_length_and_is_idempotent(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        await store.append("s", b"abcd")
        assert await store.seal("s") == 4
        assert await store.seal("s") == 4
        info = await store.info("s")
        assert (info.sealed, info.length) == (True, 4)

    async def test_seal_empty_segment(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        assert await store.seal("s") == 0
        assert await store.read("s", 0, 10) == ReadResult(0, b"", True, True)

    async def test_seal_missing_raises_not_found(self, store: SegmentStore) -> None:
        with pytest.raises(SegmentNotFound):
            await store.seal("nope")

    # ================================================================== truncate

    async def test_truncate_moves_start_offset(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        await store.append("s", b"0123456789")
        await store.truncate("s", 3)
        info = await store.info("s")
        assert (info.start_offset, info.length) == (3, 10)
        assert await _read_all(store, "s", 3) == b"3456789"

    async def test_truncate_to_current_start_is_harmless(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        await store.truncate("s", 0)
        await store.append("s", b"0123456789")
        await store.truncate("s", 3)
        await store.truncate("s", 3)
        assert (await store.info("s")).start_offset == 3
        assert await _read_all(store, "s", 3) == b"3456789"

    async def test_truncate_to_length_leaves_nothing_readable(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        await store.append("s", b"abc")
        await store.truncate("s", 3)
        assert await store.read("s", 3, 10) == ReadResult(3, b"", True, False)
        with pytest.raises(SegmentTruncated):
            await store.read("s", 2, 10)

    async def test_truncate_keeps_offsets_of_later_appends(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        await store.append("s", b"abc")
        await store.truncate("s", 2)
        assert await store.append("s", b"de") == AppendResult(3, 5)
        assert await store.read("s", 2, 10) == ReadResult(2, b"cde", True, False)
        await store.truncate("s", 4)
        assert await store.read("s", 4, 10) == ReadResult(4, b"e", True, False)

    @pytest.mark.parametrize("offset", [2, 11, -1])
    async def test_truncate_out_of_range_raises_bad_offset(
        self, store: SegmentStore, offset: int
    ) -> None:
        await store.create_segment("s")
        await store.append("s", b"0123456789")
        await store.truncate("s", 3)
        with pytest.raises(BadOffset) as caught:
            await store.truncate("s", offset)
        assert (caught.value.name, caught.value.expected, caught.value.actual) == ("s", offset, 10)
        assert (await store.info("s")).start_offset == 3

    async def test_truncate_sealed_is_allowed(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        await store.append("s", b"abcdef")
        await store.seal("s")
        await store.truncate("s", 4)
        info = await store.info("s")
        assert (info.start_offset, info.length, info.sealed) == (4, 6, True)
        assert await store.read("s", 4, 10) == ReadResult(4, b"ef", True, True)

    async def test_truncate_table_raises_type_mismatch(self, store: SegmentStore) -> None:
        await store.create_table("t")
        await store.update_table("t", [TableUpdate(b"k", b"v")])
        with pytest.raises(SegmentTypeMismatch):
            await store.truncate("t", 0)
        assert (await store.table_info("t")).start_offset == 0

    async def test_truncate_missing_raises_not_found(self, store: SegmentStore) -> None:
        with pytest.raises(SegmentNotFound):
            await store.truncate("nope", 0)

    # ================================================================== delete

    async def test_delete_removes_segment(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        await store.create_segment("other")
        await store.append("s", b"abc")
        await store.delete("s")
        assert await store.list_segments() == ["other"]
        with pytest.raises(SegmentNotFound):
            await store.info("s")
        with pytest.raises(SegmentNotFound):
            await store.read("s", 0, 10)
        with pytest.raises(SegmentNotFound):
            await store.get_attribute("s", W1)
        with pytest.raises(SegmentNotFound):
            await store.delete("s")

    async def test_delete_sealed_and_table_segments(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        await store.seal("s")
        await store.create_table("t")
        await store.update_table("t", [TableUpdate(b"k", b"v")])
        await store.delete("s")
        await store.delete("t")
        assert await store.list_segments() == []
        with pytest.raises(SegmentNotFound):
            await store.get_table_entries("t", [b"k"])

    async def test_delete_missing_raises_not_found(self, store: SegmentStore) -> None:
        with pytest.raises(SegmentNotFound) as caught:
            await store.delete("nope")
        assert caught.value.name == "nope"

    # ================================================================== merge

    async def test_merge_moves_bytes_and_deletes_source(self, store: SegmentStore) -> None:
        await store.create_segment("target")
        await store.create_segment("txn")
        await store.append("target", b"abc")
        await store.append("txn", b"defg")
        assert await store.merge("target", "txn") == 7
        assert await _read_all(store, "target") == b"abcdefg"
        assert await store.list_segments() == ["target"]
        with pytest.raises(SegmentNotFound):
            await store.info("txn")
        info = await store.info("target")
        assert (info.length, info.sealed) == (7, False)
        assert await store.append("target", b"h") == AppendResult(7, 8)

    async def test_merge_sealed_source(self, store: SegmentStore) -> None:
        await store.create_segment("target")
        await store.create_segment("txn")
        await store.append("txn", b"xy")
        await store.seal("txn")
        assert await store.merge("target", "txn") == 2
        assert await _read_all(store, "target") == b"xy"

    async def test_merge_empty_source(self, store: SegmentStore) -> None:
        await store.create_segment("target")
        await store.create_segment("txn")
        await store.append("target", b"abc")
        assert await store.merge("target", "txn") == 3
        assert await store.list_segments() == ["target"]

    async def test_merge_moves_only_readable_bytes_of_truncated_source(
        self, store: SegmentStore
    ) -> None:
        await store.create_segment("target")
        await store.create_segment("txn")
        await store.append("txn", b"0123456789")
        await store.truncate("txn", 6)
        assert await store.merge("target", "txn") == 4
        assert await _read_all(store, "target") == b"6789"

    async def test_merge_keeps_target_attributes(self, store: SegmentStore) -> None:
        await store.create_segment("target")
        await store.create_segment("txn")
        await store.append("target", b"a", writer=WriterAppend(W1, 3))
        await store.append("txn", b"b")
        await store.merge("target", "txn")
        assert await store.get_attribute("target", W1) == 3

    async def test_merge_retry_returns_current_length(self, store: SegmentStore) -> None:
        await store.create_segment("target")
        await store.create_segment("txn")
        await store.append("txn", b"abc")
        assert await store.merge("target", "txn") == 3
        assert await store.merge("target", "txn") == 3
        await store.append("target", b"de")
        assert await store.merge("target", "txn") == 5
        assert await _read_all(store, "target") == b"abcde"

    async def test_merge_into_sealed_target_raises_and_changes_nothing(
        self, store: SegmentStore
    ) -> None:
        await store.create_segment("target")
        await store.create_segment("txn")
        await store.append("target", b"abc")
        await store.append("txn", b"de")
        await store.seal("target")
        with pytest.raises(SegmentSealed) as caught:
            await store.merge("target", "txn")
        assert (caught.value.name, caught.value.length) == ("target", 3)
        source = await store.info("txn")
        assert (source.length, source.sealed) == (2, False)
        assert await store.append("txn", b"f") == AppendResult(2, 3)
        assert await _read_all(store, "target") == b"abc"

    async def test_merge_missing_source_raises_not_found(self, store: SegmentStore) -> None:
        await store.create_segment("target")
        with pytest.raises(SegmentNotFound) as caught:
            await store.merge("target", "txn")
        assert caught.value.name == "txn"

    async def test_merge_missing_target_raises_not_found(self, store: SegmentStore) -> None:
        await store.create_segment("txn")
        await store.append("txn", b"abc")
        with pytest.raises(SegmentNotFound) as caught:
            await store.merge("target", "txn")
        assert caught.value.name == "target"
        info = await store.info("txn")
        assert (info.length, info.sealed) == (3, False)

    @pytest.mark.parametrize("table_side", ["target", "source"])
    async def test_merge_with_table_raises_type_mismatch(
        self, store: SegmentStore, table_side: str
    ) -> None:
        for name in ("target", "source"):
            if name == table_side:
                await store.create_table(name)
                await store.update_table(name, [TableUpdate(b"k", b"v")])
            else:
                await store.create_segment(name)
                await store.append(name, b"abc")
        with pytest.raises(SegmentTypeMismatch) as caught:
            await store.merge("target", "source")
        assert caught.value.name == table_side
        assert await store.list_segments() == ["source", "target"]
        assert not (await store.info("source")).sealed

    async def test_merge_source_name_reusable(self, store: SegmentStore) -> None:
        await store.create_segment("target")
        await store.create_segment("txn")
        await store.append("txn", b"one")
        await store.merge("target", "txn")
        await store.create_segment("txn")
        await store.append("txn", b"two")
        assert await store.merge("target", "txn") == 6
        assert await _read_all(store, "target") == b"onetwo"

    async def test_merge_large_truncated_source(self, store: SegmentStore) -> None:
        await store.create_segment("target")
        await store.create_segment("txn")
        await store.append("target", b"abc")
        pattern = bytes(range(251))
        source = (pattern * 12_000)[: (5 << 19) + 7]  # 2.5 MiB and a little
        await store.append("txn", source[: 1 << 20])
        await store.append("txn", source[1 << 20 :])
        await store.truncate("txn", (1 << 20) + 5)
        moved = source[(1 << 20) + 5 :]
        assert await store.merge("target", "txn") == 3 + len(moved)
        assert await _read_all(store, "target") == b"abc" + moved

    # ================================================================== append times

    async def test_offset_at_time_finds_the_first_append_at_or_after_a_time(
        self, store: SegmentStore
    ) -> None:
        assert isinstance(store, TimeIndexed)
        await store.create_segment("s")
        first = await store.append("s", b"aa")
        t1 = await _next_ms()
        second = await store.append("s", b"bbb")
        await store.append("s", b"c")  # may share the second's millisecond
        t2 = await _next_ms()
        third = await store.append("s", b"dddd")
        times = await store.append_times("s", 0, third.length)
        assert [o for o, _ in times][:2] == [first.offset, second.offset]
        assert times[-1][0] == third.offset
        assert [t for _, t in times] == sorted(t for _, t in times)
        assert times[0][1] < t1 <= times[1][1] < t2 <= times[-1][1]
        assert await store.offset_at_time("s", 0) == first.offset
        assert await store.offset_at_time("s", times[0][1]) == first.offset
        assert await store.offset_at_time("s", t1) == second.offset
        assert await store.offset_at_time("s", t2) == third.offset
        assert await store.offset_at_time("s", times[-1][1] + 1) == third.length
        assert await store.append_times("s", second.offset + 1, second.length) == [times[1]]
        await store.truncate("s", second.length)
        assert await store.offset_at_time("s", 0) == second.length
        await store.create_segment("txn")
        await store.append("txn", b"moved")
        t3 = await _next_ms()
        await store.merge("s", "txn")
        assert await store.offset_at_time("s", t3) == third.length
        await store.create_table("t")
        with pytest.raises(SegmentTypeMismatch):
            await store.offset_at_time("t", 0)
        with pytest.raises(SegmentNotFound):
            await store.append_times("nope", 0, 1)

    # ================================================================== attributes

    async def test_attribute_defaults_to_null(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        assert await store.get_attribute("s", A1) == NULL_ATTRIBUTE_VALUE

    async def test_attribute_compare_and_set(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        assert await store.update_attribute("s", A1, 5, NULL_ATTRIBUTE_VALUE) is True
        assert await store.get_attribute("s", A1) == 5
        assert await store.update_attribute("s", A1, 6, 5) is True
        assert await store.get_attribute("s", A1) == 6
        assert await store.update_attribute("s", A1, -(2**63) + 1, 6) is True
        assert await store.get_attribute("s", A1) == -(2**63) + 1
        assert await store.update_attribute("s", A1, 2**63 - 1, -(2**63) + 1) is True
        assert await store.get_attribute("s", A1) == 2**63 - 1

    @pytest.mark.parametrize("expected", [NULL_ATTRIBUTE_VALUE, 4, 6, 0])
    async def test_attribute_compare_and_set_failure_changes_nothing(
        self, store: SegmentStore, expected: int
    ) -> None:
        await store.create_segment("s")
        await store.update_attribute("s", A1, 5, NULL_ATTRIBUTE_VALUE)
        assert await store.update_attribute("s", A1, 100, expected) is False
        assert await store.get_attribute("s", A1) == 5

    async def test_attribute_unset_requires_null_expected(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        assert await store.update_attribute("s", A1, 1, 0) is False
        assert await store.get_attribute("s", A1) == NULL_ATTRIBUTE_VALUE

    async def test_attribute_reset_to_null(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        await store.update_attribute("s", A1, 5, NULL_ATTRIBUTE_VALUE)
        assert await store.update_attribute("s", A1, NULL_ATTRIBUTE_VALUE, 5) is True
        assert await store.get_attribute("s", A1) == NULL_ATTRIBUTE_VALUE
        assert await store.update_attribute("s", A1, 7, NULL_ATTRIBUTE_VALUE) is True

    async def test_attributes_are_per_segment(self, store: SegmentStore) -> None:
        await store.create_segment("a")
        await store.create_segment("b")
        await store.update_attribute("a", A1, 1, NULL_ATTRIBUTE_VALUE)
        assert await store.get_attribute("b", A1) == NULL_ATTRIBUTE_VALUE

    async def test_attribute_update_on_sealed_is_allowed(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        await store.seal("s")
        assert await store.update_attribute("s", A1, 1, NULL_ATTRIBUTE_VALUE) is True
        assert await store.get_attribute("s", A1) == 1

    async def test_attribute_on_missing_raises_not_found(self, store: SegmentStore) -> None:
        with pytest.raises(SegmentNotFound):
            await store.get_attribute("nope", A1)
        with pytest.raises(SegmentNotFound):
            await store.update_attribute("nope", A1, 1, NULL_ATTRIBUTE_VALUE)

    # ================================================================== list_segments

    async def test_list_segments_sorted_both_kinds(self, store: SegmentStore) -> None:
        assert await store.list_segments() == []
        names = ["b", "a", "B", "é", "a/b", "\x00", "aa"]
        for i, name in enumerate(names):
            if i % 2:
                await store.create_table(name)
            else:
                await store.create_segment(name)
        assert await store.list_segments() == sorted(names)

    # ================================================================== tables: lifecycle

    async def test_delete_table(self, store: SegmentStore) -> None:
        await store.create_table("t")
        await store.update_table("t", [TableUpdate(b"k", b"v")])
        await store.delete_table("t")
        assert await store.list_segments() == []
        with pytest.raises(SegmentNotFound):
            await store.table_info("t")

    async def test_delete_table_must_be_empty(self, store: SegmentStore) -> None:
        await store.create_table("t")
        await store.update_table("t", [TableUpdate(b"k", b"v")])
        with pytest.raises(TableNotEmpty) as caught:
            await store.delete_table("t", must_be_empty=True)
        assert caught.value.name == "t"
        assert await store.get_table_entries("t", [b"k"]) == [TableEntry(b"k", b"v", 0)]
        await store.remove_table_keys("t", [TableKey(b"k")])
        await store.delete_table("t", must_be_empty=True)
        assert await store.list_segments() == []

    async def test_delete_empty_table_must_be_empty(self, store: SegmentStore) -> None:
        await store.create_table("t")
        await store.delete_table("t", must_be_empty=True)
        assert await store.list_segments() == []

    async def test_delete_table_missing_raises_not_found(self, store: SegmentStore) -> None:
        with pytest.raises(SegmentNotFound):
            await store.delete_table("t")

    async def test_delete_table_on_stream_raises_type_mismatch(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        with pytest.raises(SegmentTypeMismatch):
            await store.delete_table("s")
        assert await store.list_segments() == ["s"]

    @pytest.mark.parametrize(
        "operation",
        [
            "update_table",
            "remove_table_keys",
            "get_table_entries",
            "iterate_table_keys",
            "iterate_table_entries",
            "read_table_delta",
            "table_info",
        ],
    )
    async def test_table_operations_on_stream_raise_type_mismatch(
        self, store: SegmentStore, operation: str
    ) -> None:
        await store.create_segment("s")
        await store.append("s", b"not records")
        calls: dict[str, Callable[[], Awaitable[object]]] = {
            "update_table": lambda: store.update_table("s", [TableUpdate(b"k", b"v")]),
            "remove_table_keys": lambda: store.remove_table_keys("s", [TableKey(b"k")]),
            "get_table_entries": lambda: store.get_table_entries("s", [b"k"]),
            "iterate_table_keys": lambda: store.iterate_table_keys("s", max_count=10),
            "iterate_table_entries": lambda: store.iterate_table_entries("s", max_count=10),
            "read_table_delta": lambda: store.read_table_delta("s", 0, 10),
            "table_info": lambda: store.table_info("s"),
        }
        with pytest.raises(SegmentTypeMismatch) as caught:
            await calls[operation]()
        assert caught.value.name == "s"
        assert await _read_all(store, "s") == b"not records"

    @pytest.mark.parametrize(
        "operation",
        [
            "update_table",
            "remove_table_keys",
            "get_table_entries",
            "iterate_table_keys",
            "iterate_table_entries",
            "read_table_delta",
            "table_info",
        ],
    )
    async def test_table_operations_on_missing_raise_not_found(
        self, store: SegmentStore, operation: str
    ) -> None:
        calls: dict[str, Callable[[], Awaitable[object]]] = {
            "update_table": lambda: store.update_table("t", [TableUpdate(b"k", b"v")]),
            "remove_table_keys": lambda: store.remove_table_keys("t", [TableKey(b"k")]),
            "get_table_entries": lambda: store.get_table_entries("t", [b"k"]),
            "iterate_table_keys": lambda: store.iterate_table_keys("t", max_count=10),
            "iterate_table_entries": lambda: store.iterate_table_entries("t", max_count=10),
            "read_table_delta": lambda: store.read_table_delta("t", 0, 10),
            "table_info": lambda: store.table_info("t"),
        }
        with pytest.raises(SegmentNotFound):
            await calls[operation]()
        assert await store.list_segments() == []

    # ================================================================== tables: updates

    async def test_update_versions_are_record_offsets(self, store: SegmentStore) -> None:
        await store.create_table("t")
        assert await store.update_table("t", [TableUpdate(b"key1", b"value1")]) == [0]
        assert await store.update_table("t", [TableUpdate(b"key2", b"value2")]) == [27]
        assert await store.get_table_entries("t", [b"key1", b"key2"]) == [
            TableEntry(b"key1", b"value1", 0),
            TableEntry(b"key2", b"value2", 27),
        ]
        assert await store.table_info("t") == TableInfo("t", 0, 54, 2)
        assert (await store.info("t")).length == 54

    async def test_update_batch_versions_in_request_order(self, store: SegmentStore) -> None:
        await store.create_table("t")
        versions = await store.update_table(
            "t", [TableUpdate(b"key1", b"value1"), TableUpdate(b"key2", b"value2")]
        )
        assert versions == [0, 27]
        versions = await store.update_table(
            "t", [TableUpdate(b"zz", b""), TableUpdate(b"a", b"1234")]
        )
        assert versions == [54, 54 + 17 + 2]
        assert await store.table_info("t") == TableInfo("t", 0, 54 + 19 + 22, 4)

    async def test_update_empty_batch_returns_no_versions(self, store: SegmentStore) -> None:
        await store.create_table("t")
        assert await store.update_table("t", []) == []
        assert await store.table_info("t") == TableInfo("t", 0, 0, 0)

    async def test_update_unconditional_overwrites(self, store: SegmentStore) -> None:
        await store.create_table("t")
        await store.update_table("t", [TableUpdate(b"k", b"v1")])
        assert await store.update_table("t", [TableUpdate(b"k", b"v2", NO_VERSION)]) == [20]
        assert await store.get_table_entries("t", [b"k"]) == [TableEntry(b"k", b"v2", 20)]
        assert (await store.table_info("t")).entry_count == 1

    async def test_update_not_exists_on_absent_key(self, store: SegmentStore) -> None:
        await store.create_table("t")
        assert await store.update_table("t", [TableUpdate(b"k", b"v", NOT_EXISTS)]) == [0]

    async def test_update_not_exists_on_present_key_raises_bad_version(
        self, store: SegmentStore
    ) -> None:
        await store.create_table("t")
        await store.update_table("t", [TableUpdate(b"other", b"x"), TableUpdate(b"k", b"v")])
        with pytest.raises(TableKeyBadVersion) as caught:
            await store.update_table("t", [TableUpdate(b"k", b"w", NOT_EXISTS)])
        err = caught.value
        assert (err.name, err.key, err.expected, err.actual) == ("t", b"k", NOT_EXISTS, 23)
        assert await store.get_table_entries("t", [b"k"]) == [TableEntry(b"k", b"v", 23)]

    async def test_update_exact_version_matches(self, store: SegmentStore) -> None:
        await store.create_table("t")
        [v1] = await store.update_table("t", [TableUpdate(b"k", b"v1")])
        [v2] = await store.update_table("t", [TableUpdate(b"k", b"v2", v1)])
        assert v2 > v1
        [v3] = await store.update_table("t", [TableUpdate(b"k", b"v3", v2)])
        assert await store.get_table_entries("t", [b"k"]) == [TableEntry(b"k", b"v3", v3)]

    async def test_update_stale_version_raises_bad_version(self, store: SegmentStore) -> None:
        await store.create_table("t")
        [v1] = await store.update_table("t", [TableUpdate(b"k", b"v1")])
        [v2] = await store.update_table("t", [TableUpdate(b"k", b"v2", v1)])
        with pytest.raises(TableKeyBadVersion) as caught:
            await store.update_table("t", [TableUpdate(b"k", b"v3", v1)])
        err = caught.value
        assert (err.key, err.expected, err.actual) == (b"k", v1, v2)
        assert await store.get_table_entries("t", [b"k"]) == [TableEntry(b"k", b"v2", v2)]

    async def test_update_version_for_absent_key_raises_key_not_found(
        self, store: SegmentStore
    ) -> None:
        await store.create_table("t")
        await store.update_table("t", [TableUpdate(b"other", b"x")])
        for version in (0, 5, 1 << 40):
            with pytest.raises(TableKeyNotFound) as caught:
                await store.update_table("t", [TableUpdate(b"k", b"v", version)])
            assert (caught.value.name, caught.value.key) == ("t", b"k")
        assert await store.get_table_entries("t", [b"k"]) == [None]

    async def test_update_removed_key_with_old_version_raises_key_not_found(
        self, store: SegmentStore
    ) -> None:
        await store.create_table("t")
        [v1] = await store.update_table("t", [TableUpdate(b"k", b"v")])
        await store.remove_table_keys("t", [TableKey(b"k")])
        with pytest.raises(TableKeyNotFound):
            await store.update_table("t", [TableUpdate(b"k", b"v2", v1)])

    async def test_update_batch_is_all_or_nothing(self, store: SegmentStore) -> None:
        await store.create_table("t")
        await store.update_table("t", [TableUpdate(b"a", b"1")])
        before = await store.table_info("t")
        with pytest.raises(TableKeyNotFound):
            await store.update_table(
                "t",
                [
                    TableUpdate(b"b", b"2"),
                    TableUpdate(b"a", b"changed", 0),
                    TableUpdate(b"c", b"3", 7),
                ],
            )
        with pytest.raises(TableKeyBadVersion):
            await store.update_table(
                "t", [TableUpdate(b"b", b"2", NOT_EXISTS), TableUpdate(b"a", b"x", NOT_EXISTS)]
            )
        assert await store.table_info("t") == before
        assert await store.get_table_entries("t", [b"a", b"b", b"c"]) == [
            TableEntry(b"a", b"1", 0),
            None,
            None,
        ]

    async def test_update_same_key_twice_checked_against_pre_batch_state(
        self, store: SegmentStore
    ) -> None:
        await store.create_table("t")
        # Both occurrences see the key absent, so both NOT_EXISTS conditions pass.
        versions = await store.update_table(
            "t", [TableUpdate(b"k", b"first", NOT_EXISTS), TableUpdate(b"k", b"second", NOT_EXISTS)]
        )
        assert versions == [0, 23]
        assert await store.get_table_entries("t", [b"k"]) == [TableEntry(b"k", b"second", 23)]
        assert (await store.table_info("t")).entry_count == 1
        # Both occurrences carry the pre-batch version (the Rust synchronizer does this).
        versions = await store.update_table(
            "t", [TableUpdate(b"k", b"third", 23), TableUpdate(b"k", b"fourth", 23)]
        )
        assert versions == [47, 70]
        assert await store.get_table_entries("t", [b"k"]) == [TableEntry(b"k", b"fourth", 70)]

    async def test_update_same_key_twice_second_with_in_batch_version_fails(
        self, store: SegmentStore
    ) -> None:
        await store.create_table("t")
        [v0] = await store.update_table("t", [TableUpdate(b"k", b"v")])
        with pytest.raises(TableKeyBadVersion) as caught:
            # The first entry would be written at offset 19, but conditions are
            # checked against the pre-batch state, where the version is 0.
            await store.update_table(
                "t", [TableUpdate(b"k", b"a", v0), TableUpdate(b"k", b"b", 19)]
            )
        assert (caught.value.expected, caught.value.actual) == (19, v0)
        assert await store.get_table_entries("t", [b"k"]) == [TableEntry(b"k", b"v", v0)]
        with pytest.raises(TableKeyNotFound):
            await store.update_table(
                "t", [TableUpdate(b"new", b"a", NOT_EXISTS), TableUpdate(b"new", b"b", 19)]
            )
        assert await store.table_info("t") == TableInfo("t", 0, 19, 1)

    async def test_update_expected_length(self, store: SegmentStore) -> None:
        await store.create_table("t")
        assert await store.update_table("t", [TableUpdate(b"a", b"1")], expected_length=0) == [0]
        assert await store.update_table("t", [TableUpdate(b"b", b"2")], expected_length=19) == [19]

    @pytest.mark.parametrize("expected_length", [0, 18, 20, 1000])
    async def test_update_expected_length_mismatch_raises_bad_offset(
        self, store: SegmentStore, expected_length: int
    ) -> None:
        await store.create_table("t")
        await store.update_table("t", [TableUpdate(b"a", b"1")])
        with pytest.raises(BadOffset) as caught:
            await store.update_table(
                "t", [TableUpdate(b"b", b"2")], expected_length=expected_length
            )
        assert (caught.value.expected, caught.value.actual) == (expected_length, 19)
        with pytest.raises(BadOffset):
            await store.update_table("t", [], expected_length=expected_length)
        assert await store.table_info("t") == TableInfo("t", 0, 19, 1)

    async def test_concurrent_not_exists_updates_exactly_one_wins(
        self, store: SegmentStore
    ) -> None:
        await store.create_table("t")
        outcomes = await asyncio.gather(
            *(
                store.update_table("t", [TableUpdate(b"k", bytes([i]), NOT_EXISTS)])
                for i in range(8)
            ),
            return_exceptions=True,
        )
        wins = [o for o in outcomes if isinstance(o, list)]
        assert wins == [[0]]
        assert sum(isinstance(o, TableKeyBadVersion) for o in outcomes) == 7
        assert (await store.table_info("t")).length == 19

    async def test_concurrent_unconditional_updates_all_apply(self, store: SegmentStore) -> None:
        await store.create_table("t")
        outcomes = await asyncio.gather(
            *(store.update_table("t", [TableUpdate(bytes([i]), b"v")]) for i in range(8))
        )
        assert sorted(v for [v] in outcomes) == [19 * i for i in range(8)]
        entries = await store.get_table_entries("t", [bytes([i]) for i in range(8)])
        assert [e.version if e else None for e in entries] == [v for [v] in outcomes]

    # ================================================================== tables: removals

    async def test_remove_unconditional(self, store: SegmentStore) -> None:
        await store.create_table("t")
        await store.update_table("t", [TableUpdate(b"a", b"1"), TableUpdate(b"b", b"2")])
        await store.remove_table_keys("t", [TableKey(b"a")])
        assert await store.get_table_entries("t", [b"a", b"b"]) == [
            None,
            TableEntry(b"b", b"2", 19),
        ]
        info = await store.table_info("t")
        assert info.entry_count == 1
        assert info.length == 38 + 18  # a removal record is 17 + len(key) bytes

    async def test_remove_unconditional_absent_key_succeeds(self, store: SegmentStore) -> None:
        await store.create_table("t")
        await store.update_table("t", [TableUpdate(b"a", b"1")])
        await store.remove_table_keys("t", [TableKey(b"ghost"), TableKey(b"a", NO_VERSION)])
        assert await store.get_table_entries("t", [b"a", b"ghost"]) == [None, None]
        assert (await store.table_info("t")).entry_count == 0

    async def test_remove_empty_batch(self, store: SegmentStore) -> None:
        await store.create_table("t")
        await store.remove_table_keys("t", [])
        assert await store.table_info("t") == TableInfo("t", 0, 0, 0)

    async def test_remove_conditional_exact_version(self, store: SegmentStore) -> None:
        await store.create_table("t")
        [v] = await store.update_table("t", [TableUpdate(b"a", b"1")])
        await store.remove_table_keys("t", [TableKey(b"a", v)])
        assert await store.get_table_entries("t", [b"a"]) == [None]

    async def test_remove_conditional_wrong_version_raises_bad_version(
        self, store: SegmentStore
    ) -> None:
        await store.create_table("t")
        await store.update_table("t", [TableUpdate(b"a", b"1")])
        [v] = await store.update_table("t", [TableUpdate(b"a", b"2")])
        with pytest.raises(TableKeyBadVersion) as caught:
            await store.remove_table_keys("t", [TableKey(b"a", 0)])
        assert (caught.value.key, caught.value.expected, caught.value.actual) == (b"a", 0, v)
        with pytest.raises(TableKeyBadVersion):
            await store.remove_table_keys("t", [TableKey(b"a", NOT_EXISTS)])
        assert await store.get_table_entries("t", [b"a"]) == [TableEntry(b"a", b"2", v)]

    async def test_remove_conditional_absent_raises_key_not_found(
        self, store: SegmentStore
    ) -> None:
        await store.create_table("t")
        with pytest.raises(TableKeyNotFound) as caught:
            await store.remove_table_keys("t", [TableKey(b"ghost", 0)])
        assert caught.value.key == b"ghost"
        assert await store.table_info("t") == TableInfo("t", 0, 0, 0)

    async def test_remove_batch_is_all_or_nothing(self, store: SegmentStore) -> None:
        await store.create_table("t")
        await store.update_table("t", [TableUpdate(b"a", b"1"), TableUpdate(b"b", b"2")])
        before = await store.table_info("t")
        with pytest.raises(TableKeyBadVersion):
            await store.remove_table_keys("t", [TableKey(b"a", 0), TableKey(b"b", 0)])
        assert await store.table_info("t") == before
        assert await store.get_table_entries("t", [b"a", b"b"]) == [
            TableEntry(b"a", b"1", 0),
            TableEntry(b"b", b"2", 19),
        ]

    async def test_remove_expected_length(self, store: SegmentStore) -> None:
        await store.create_table("t")
        await store.update_table("t", [TableUpdate(b"a", b"1")])
        with pytest.raises(BadOffset) as caught:
            await store.remove_table_keys("t", [TableKey(b"a")], expected_length=0)
        assert (caught.value.expected, caught.value.actual) == (0, 19)
        assert (await store.table_info("t")).entry_count == 1
        await store.remove_table_keys("t", [TableKey(b"a")], expected_length=19)
        assert (await store.table_info("t")).entry_count == 0

    # ================================================================== tables: reads

    async def test_get_table_entries_in_request_order(self, store: SegmentStore) -> None:
        await store.create_table("t")
        await store.update_table("t", [TableUpdate(b"b", b"2"), TableUpdate(b"a", b"1")])
        assert await store.get_table_entries("t", [b"a", b"x", b"b", b"a"]) == [
            TableEntry(b"a", b"1", 19),
            None,
            TableEntry(b"b", b"2", 0),
            TableEntry(b"a", b"1", 19),
        ]
        assert await store.get_table_entries("t", []) == []

    async def test_empty_key_and_value(self, store: SegmentStore) -> None:
        await store.create_table("t")
        assert await store.update_table("t", [TableUpdate(b"", b"")]) == [0]
        assert await store.get_table_entries("t", [b""]) == [TableEntry(b"", b"", 0)]
        assert await store.table_info("t") == TableInfo("t", 0, 17, 1)

    async def test_binary_keys_and_values(self, store: SegmentStore) -> None:
        await store.create_table("t")
        key = bytes(range(256))
        value = bytes(range(255, -1, -1)) * 3
        [v] = await store.update_table("t", [TableUpdate(key, value)])
        assert await store.get_table_entries("t", [key]) == [TableEntry(key, value, v)]

    async def _fill_table(self, store: SegmentStore, keys: list[bytes]) -> dict[bytes, int]:
        await store.create_table("t")
        versions = await store.update_table("t", [TableUpdate(k, b"v:" + k) for k in keys])
        return dict(zip(keys, versions, strict=True))

    UNSORTED_KEYS = [b"b", b"\xff", b"a", b"\x00", b"ab", b"a\x00", b"B", b"\x7f\xff", b"aa"]

    @pytest.mark.parametrize("max_count", [1, 2, 4, 100])
    async def test_iterate_keys_in_byte_order(self, store: SegmentStore, max_count: int) -> None:
        versions = await self._fill_table(store, self.UNSORTED_KEYS)
        seen: list[TableKey] = []
        token = b""
        for _ in range(len(self.UNSORTED_KEYS) + 2):
            page = await store.iterate_table_keys(
                "t", continuation_token=token, max_count=max_count
            )
            assert len(page.items) <= max_count
            if not page.items:
                break
            seen.extend(page.items)
            token = page.continuation_token
        else:
            pytest.fail("iteration did not end with an empty page")
        assert seen == [TableKey(k, versions[k]) for k in sorted(self.UNSORTED_KEYS)]

    @pytest.mark.parametrize("max_count", [1, 3, 100])
    async def test_iterate_entries_in_byte_order(self, store: SegmentStore, max_count: int) -> None:
        versions = await self._fill_table(store, self.UNSORTED_KEYS)
        seen: list[TableEntry] = []
        token = b""
        for _ in range(len(self.UNSORTED_KEYS) + 2):
            page = await store.iterate_table_entries(
                "t", continuation_token=token, max_count=max_count
            )
            assert len(page.items) <= max_count
            if not page.items:
                break
            seen.extend(page.items)
            token = page.continuation_token
        else:
            pytest.fail("iteration did not end with an empty page")
        expected = [TableEntry(k, b"v:" + k, versions[k]) for k in sorted(self.UNSORTED_KEYS)]
        assert seen == expected

    async def test_iterate_empty_table(self, store: SegmentStore) -> None:
        await store.create_table("t")
        assert (await store.iterate_table_keys("t", max_count=10)).items == []
        assert (await store.iterate_table_entries("t", max_count=10)).items == []

    async def test_iterate_pages_exactly_max_count(self, store: SegmentStore) -> None:
        await self._fill_table(store, [bytes([i]) for i in range(10)])
        page = await store.iterate_table_keys("t", max_count=4)
        assert [k.key for k in page.items] == [bytes([i]) for i in range(4)]
        page = await store.iterate_table_keys(
            "t", continuation_token=page.continuation_token, max_count=4
        )
        assert [k.key for k in page.items] == [bytes([i]) for i in range(4, 8)]

    async def test_iterate_with_empty_key_ends(self, store: SegmentStore) -> None:
        await self._fill_table(store, [b"", b"a"])
        keys: list[bytes] = []
        token = b""
        for _ in range(5):
            page = await store.iterate_table_keys("t", continuation_token=token, max_count=1)
            if not page.items:
                break
            keys.extend(k.key for k in page.items)
            token = page.continuation_token
        assert keys == [b"", b"a"]

    async def test_iterate_continues_after_changes(self, store: SegmentStore) -> None:
        await self._fill_table(store, [b"a", b"b", b"c", b"d"])
        page = await store.iterate_table_entries("t", max_count=2)
        assert [e.key for e in page.items] == [b"a", b"b"]
        await store.remove_table_keys("t", [TableKey(b"b"), TableKey(b"c")])
        await store.update_table("t", [TableUpdate(b"a2", b"new"), TableUpdate(b"e", b"new")])
        rest = await store.iterate_table_entries(
            "t", continuation_token=page.continuation_token, max_count=10
        )
        assert [e.key for e in rest.items] == [b"d", b"e"]

    async def test_iterate_skips_removed_keys(self, store: SegmentStore) -> None:
        await self._fill_table(store, [b"a", b"b", b"c"])
        await store.remove_table_keys("t", [TableKey(b"b")])
        page = await store.iterate_table_keys("t", max_count=10)
        assert [k.key for k in page.items] == [b"a", b"c"]

    # ================================================================== tables: delta reads

    async def test_delta_of_empty_table(self, store: SegmentStore) -> None:
        await store.create_table("t")
        assert await store.read_table_delta("t", 0, 10) == TableDelta([], 0, True, False)

    async def test_delta_reports_latest_update_per_key(self, store: SegmentStore) -> None:
        await store.create_table("t")
        await store.update_table("t", [TableUpdate(b"key1", b"value1")])  # 0..27
        await store.update_table("t", [TableUpdate(b"key2", b"value2")])  # 27..54
        await store.update_table("t", [TableUpdate(b"key1", b"valueX")])  # 54..81
        delta = await store.read_table_delta("t", 0, 100)
        assert sorted(delta.entries, key=lambda e: e.key) == [
            TableEntry(b"key1", b"valueX", 54),
            TableEntry(b"key2", b"value2", 27),
        ]
        assert (delta.last_position, delta.reached_end, delta.should_clear) == (81, True, False)

    async def test_delta_from_middle_position(self, store: SegmentStore) -> None:
        await store.create_table("t")
        await store.update_table("t", [TableUpdate(b"key1", b"value1")])
        await store.update_table("t", [TableUpdate(b"key2", b"value2")])
        delta = await store.read_table_delta("t", 27, 100)
        assert delta == TableDelta([TableEntry(b"key2", b"value2", 27)], 54, True, False)

    async def test_delta_at_end_is_empty(self, store: SegmentStore) -> None:
        await store.create_table("t")
        await store.update_table("t", [TableUpdate(b"key1", b"value1")])
        assert await store.read_table_delta("t", 27, 100) == TableDelta([], 27, True, False)

    async def test_delta_removal_drops_earlier_update_and_is_not_reported(
        self, store: SegmentStore
    ) -> None:
        await store.create_table("t")
        await store.update_table("t", [TableUpdate(b"a", b"1"), TableUpdate(b"b", b"2")])
        await store.remove_table_keys("t", [TableKey(b"a")])  # 38..56
        delta = await store.read_table_delta("t", 0, 100)
        assert delta == TableDelta([TableEntry(b"b", b"2", 19)], 56, True, False)

    async def test_delta_of_only_removals_advances(self, store: SegmentStore) -> None:
        await store.create_table("t")
        await store.update_table("t", [TableUpdate(b"a", b"1")])
        await store.remove_table_keys("t", [TableKey(b"a")])
        delta = await store.read_table_delta("t", 19, 100)
        assert delta == TableDelta([], 37, True, False)

    async def test_delta_update_after_removal_survives(self, store: SegmentStore) -> None:
        await store.create_table("t")
        await store.update_table("t", [TableUpdate(b"a", b"1")])  # 0..19
        await store.remove_table_keys("t", [TableKey(b"a")])  # 19..37
        await store.update_table("t", [TableUpdate(b"a", b"2")])  # 37..56
        delta = await store.read_table_delta("t", 0, 100)
        assert delta == TableDelta([TableEntry(b"a", b"2", 37)], 56, True, False)

    async def test_delta_paging_advances_until_empty(self, store: SegmentStore) -> None:
        await store.create_table("t")
        expected: dict[bytes, TableEntry] = {}
        for i in range(7):
            key = b"k%d" % (i % 5)
            [v] = await store.update_table("t", [TableUpdate(key, b"v%d" % i)])
            expected[key] = TableEntry(key, b"v%d" % i, v)
        await store.remove_table_keys("t", [TableKey(b"k3")])
        del expected[b"k3"]
        length = (await store.table_info("t")).length

        # Follow the Rust synchronizer: from 0, repeat from last_position until empty.
        seen: dict[bytes, TableEntry] = {}
        position = 0
        for _ in range(20):
            delta = await store.read_table_delta("t", position, 2)
            assert len(delta.entries) <= 2
            assert delta.should_clear is False
            assert delta.reached_end == (delta.last_position == length)
            if not delta.entries:
                break
            assert delta.last_position > position
            for entry in delta.entries:
                seen[entry.key] = entry
            position = delta.last_position
        else:
            pytest.fail("delta reads did not end with an empty reply")
        assert delta.reached_end is True
        # Removals are not reported, so a key removed later may linger in what a
        # reader saw; every surviving key has its latest entry.
        for key, entry in expected.items():
            assert seen[key] == entry

    async def test_delta_max_count_limits_entries(self, store: SegmentStore) -> None:
        await store.create_table("t")
        versions = await store.update_table(
            "t", [TableUpdate(b"a", b"1"), TableUpdate(b"b", b"2"), TableUpdate(b"c", b"3")]
        )
        delta = await store.read_table_delta("t", 0, 1)
        assert delta == TableDelta([TableEntry(b"a", b"1", 0)], versions[1], False, False)
        delta = await store.read_table_delta("t", versions[1], 1)
        assert delta == TableDelta([TableEntry(b"b", b"2", 19)], versions[2], False, False)

    @pytest.mark.parametrize("position", [1, 17, 26, 28, 55, 1000])
    async def test_delta_from_non_boundary_raises_bad_offset(
        self, store: SegmentStore, position: int
    ) -> None:
        await store.create_table("t")
        await store.update_table("t", [TableUpdate(b"key1", b"value1")])
        await store.update_table("t", [TableUpdate(b"key2", b"value2")])
        with pytest.raises(BadOffset) as caught:
            await store.read_table_delta("t", position, 10)
        assert caught.value.expected == position

    async def test_delta_before_start_says_should_clear(self, store: SegmentStore) -> None:
        await store.create_table("t")
        await store.update_table("t", [TableUpdate(b"key1", b"value1")])
        delta = await store.read_table_delta("t", -1, 10)
        assert delta == TableDelta([TableEntry(b"key1", b"value1", 0)], 27, True, True)

    async def test_large_table_iterates_and_delta_reads_completely(
        self, store: SegmentStore
    ) -> None:
        await store.create_table("t")
        value = bytes(range(256)) * (MAX_TABLE_VALUE_BYTES // 256 - 1)
        keys = [b"key-%02d" % i for i in range(7)]  # about 7 MiB of records
        versions = {}
        for key in keys:
            [versions[key]] = await store.update_table("t", [TableUpdate(key, value + key)])
        length = (await store.table_info("t")).length

        entries: list[TableEntry] = []
        token = b""
        for _ in range(len(keys) + 1):
            page = await store.iterate_table_entries("t", continuation_token=token, max_count=100)
            if not page.items:
                break
            entries.extend(page.items)
            token = page.continuation_token
        else:
            pytest.fail("iteration did not end with an empty page")
        assert entries == [TableEntry(k, value + k, versions[k]) for k in keys]

        seen: list[TableEntry] = []
        position = 0
        for _ in range(len(keys) + 1):
            delta = await store.read_table_delta("t", position, 100)
            if not delta.entries:
                break
            assert delta.last_position > position
            seen.extend(delta.entries)
            position = delta.last_position
        else:
            pytest.fail("delta reads did not end with an empty reply")
        assert (delta.last_position, delta.reached_end) == (length, True)
        assert seen == entries

    # ================================================================== tables: info

    async def test_table_info(self, store: SegmentStore) -> None:
        await store.create_table("t")
        await store.update_table("t", [TableUpdate(b"a", b"1"), TableUpdate(b"b", b"22")])
        await store.remove_table_keys("t", [TableKey(b"a")])
        assert await store.table_info("t") == TableInfo("t", 0, 19 + 20 + 18, 1)
        info = await store.info("t")
        assert (info.kind, info.start_offset, info.length) == (SegmentKind.TABLE, 0, 57)

    # ================================================================== tables: limits

    async def test_table_key_at_limit_is_accepted(self, store: SegmentStore) -> None:
        await store.create_table("t")
        key = b"k" * MAX_TABLE_KEY_BYTES
        await store.update_table("t", [TableUpdate(key, b"v")])
        await store.remove_table_keys("t", [TableKey(key)])
        assert (await store.table_info("t")).entry_count == 0

    async def test_table_key_over_limit_raises_limit_exceeded(self, store: SegmentStore) -> None:
        await store.create_table("t")
        key = b"k" * (MAX_TABLE_KEY_BYTES + 1)
        with pytest.raises(LimitExceeded) as caught:
            await store.update_table("t", [TableUpdate(b"ok", b"v"), TableUpdate(key, b"v")])
        assert (caught.value.limit, caught.value.got) == (MAX_TABLE_KEY_BYTES, len(key))
        with pytest.raises(LimitExceeded):
            await store.remove_table_keys("t", [TableKey(key)])
        assert await store.table_info("t") == TableInfo("t", 0, 0, 0)

    async def test_table_value_limits(self, store: SegmentStore) -> None:
        await store.create_table("t")
        big = bytes(MAX_TABLE_VALUE_BYTES + 1)
        with pytest.raises(LimitExceeded) as caught:
            await store.update_table("t", [TableUpdate(b"k", big)])
        assert (caught.value.limit, caught.value.got) == (MAX_TABLE_VALUE_BYTES, len(big))
        assert await store.table_info("t") == TableInfo("t", 0, 0, 0)
        [v] = await store.update_table("t", [TableUpdate(b"k", big[:-1])])
        assert await store.get_table_entries("t", [b"k"]) == [TableEntry(b"k", big[:-1], v)]

    async def test_table_batch_over_limit_raises_limit_exceeded(self, store: SegmentStore) -> None:
        await store.create_table("t")
        value = bytes(MAX_TABLE_VALUE_BYTES)
        count = MAX_TABLE_BATCH_BYTES // MAX_TABLE_VALUE_BYTES + 1
        updates = [TableUpdate(b"%d" % i, value) for i in range(count)]
        with pytest.raises(LimitExceeded):
            await store.update_table("t", updates)
        assert await store.table_info("t") == TableInfo("t", 0, 0, 0)

    # ================================================================== flush / close

    async def test_flush_keeps_everything_readable(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        await store.append("s", b"abc")
        await store.create_table("t")
        await store.update_table("t", [TableUpdate(b"k", b"v")])
        await store.flush()
        assert await _read_all(store, "s") == b"abc"
        assert await store.get_table_entries("t", [b"k"]) == [TableEntry(b"k", b"v", 0)]

    async def test_close_is_idempotent(self, store: SegmentStore) -> None:
        await store.create_segment("s")
        await store.close()
        await store.close()
        with pytest.raises(StoreClosed):
            await store.list_segments()

    @pytest.mark.parametrize(
        "operation",
        [
            "create_segment",
            "create_table",
            "append",
            "read",
            "wait_for_data",
            "info",
            "seal",
            "truncate",
            "delete",
            "merge",
            "get_attribute",
            "update_attribute",
            "list_segments",
            "delete_table",
            "update_table",
            "remove_table_keys",
            "get_table_entries",
            "iterate_table_keys",
            "iterate_table_entries",
            "read_table_delta",
            "table_info",
            "flush",
        ],
    )
    async def test_operations_after_close_raise_store_closed(
        self, store: SegmentStore, operation: str
    ) -> None:
        await store.create_segment("s")
        await store.append("s", b"abc")
        await store.create_segment("src")
        await store.create_table("t")
        await store.update_table("t", [TableUpdate(b"k", b"v")])
        await store.close()
        calls: dict[str, Callable[[], Awaitable[object]]] = {
            "create_segment": lambda: store.create_segment("new"),
            "create_table": lambda: store.create_table("new"),
            "append": lambda: store.append("s", b"x"),
            "read": lambda: store.read("s", 0, 10),
            "wait_for_data": lambda: store.wait_for_data("s", 0, 1.0),
            "info": lambda: store.info("s"),
            "seal": lambda: store.seal("s"),
            "truncate": lambda: store.truncate("s", 1),
            "delete": lambda: store.delete("s"),
            "merge": lambda: store.merge("s", "src"),
            "get_attribute": lambda: store.get_attribute("s", A1),
            "update_attribute": lambda: store.update_attribute("s", A1, 1, NULL_ATTRIBUTE_VALUE),
            "list_segments": store.list_segments,
            "delete_table": lambda: store.delete_table("t"),
            "update_table": lambda: store.update_table("t", [TableUpdate(b"k", b"w")]),
            "remove_table_keys": lambda: store.remove_table_keys("t", [TableKey(b"k")]),
            "get_table_entries": lambda: store.get_table_entries("t", [b"k"]),
            "iterate_table_keys": lambda: store.iterate_table_keys("t", max_count=10),
            "iterate_table_entries": lambda: store.iterate_table_entries("t", max_count=10),
            "read_table_delta": lambda: store.read_table_delta("t", 0, 10),
            "table_info": lambda: store.table_info("t"),
            "flush": store.flush,
        }
        with pytest.raises(StoreClosed):
            await calls[operation]()
