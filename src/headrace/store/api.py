"""The storage contract: the one API every protocol front door writes through.

Two implementations keep this contract, ``MemoryStore`` (the reference, no
durability) and ``DiskStore`` (durable, group-committed); one conformance
suite (``tests/store/contract.py``) runs against both. The semantics follow
Pravega's segment store, because the Pravega wire protocol maps onto these
calls almost one to one (``docs/protocols/pravega.md#commands``).

Rules every implementation keeps:

* **Acknowledged means durable.** A mutating call returns only after its
  effect would survive a crash (under the store's durability setting).
* **Reads see only durable bytes.** ``read`` and ``info().length`` never
  expose bytes that a crash could still take away, so a reader never
  processes an event that later vanishes.
* **Nothing half-done.** A call that raises a ``StoreError`` changed nothing,
  except ``OwnerUnavailable`` (a forwarding store lost the owner before it
  answered: the call may or may not have happened there).
* **Names are data.** Any ``str`` up to ``MAX_NAME_BYTES`` of UTF-8 is a valid
  segment name; names never become file paths.
* The store is used from one asyncio event loop; calls may interleave freely.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable
from uuid import UUID

from headrace.types import (
    AppendResult,
    ReadResult,
    RegionRead,
    SegmentInfo,
    SegmentKind,
    TableDelta,
    TableEntry,
    TableInfo,
    TableKey,
    TablePage,
    TableUpdate,
    WriterAppend,
)

__all__ = [
    "MAX_APPEND_BYTES",
    "MAX_NAME_BYTES",
    "MAX_READ_BYTES",
    "MAX_SEGMENT_ATTRIBUTES",
    "MAX_TABLE_BATCH_BYTES",
    "MAX_TABLE_KEY_BYTES",
    "MAX_TABLE_VALUE_BYTES",
    "MAX_WAIT_S",
    "AppendCheck",
    "FsyncPolicy",
    "SegmentStore",
    "TimeIndexed",
    "offset_at_time",
]

MAX_NAME_BYTES = 65535
"""Longest segment name in UTF-8 bytes: the wire protocols carry names with a u16 length."""

MAX_APPEND_BYTES = 16 * 1024 * 1024
"""Largest single append. Pravega clients send at most 8 MiB (+ framing) per block;
twice that leaves room for any client while bounding the memory one append holds."""

MAX_READ_BYTES = 16 * 1024 * 1024
"""Largest single read, whatever the caller asks for; callers loop for more."""

MAX_TABLE_KEY_BYTES = 8192
"""Longest table key: Pravega's own limit (``TableStore.MAXIMUM_KEY_LENGTH``)."""

MAX_TABLE_VALUE_BYTES = 1024 * 1024 - 8192
"""Longest table value: Pravega's own limit (1 MiB minus the key limit)."""

MAX_TABLE_BATCH_BYTES = 16 * 1024 * 1024
"""Largest encoded table batch: one batch is one append, so ``MAX_APPEND_BYTES``."""

MAX_WAIT_S = 60.0
"""Longest a long-poll wait may park; protocol adapters use much shorter holds."""

MAX_SEGMENT_ATTRIBUTES = 4096
"""Attributes one segment keeps (the default; the stores take
``max_segment_attributes``). Every Pravega writer leaves its writer id behind as
an attribute, so without a bound a segment's metadata (and every snapshot)
grows with the number of writers that ever wrote to it. Past the bound the
least recently set attribute is dropped. 4096 is Pravega's own bound on the
attributes a segment keeps in memory (``extended.attribute.cached.count.max``);
at 24 bytes each it caps a segment's attributes at 96 KiB of snapshot."""


AppendCheck = Callable[[bytes | memoryview], str | None]
"""Looks at the data of an append: None lets it through, a reason refuses it."""


@runtime_checkable
class SegmentStore(Protocol):
    """Segments and table segments, with Pravega's semantics.

    Every method may raise ``StoreClosed`` once ``close`` has begun, and
    ``LimitExceeded`` for arguments over the module's limits.
    """

    # ------------------------------------------------------------------ segments

    async def create_segment(self, name: str, *, kind: SegmentKind = SegmentKind.STREAM) -> None:
        """Create an empty, unsealed segment.

        Raises:
            SegmentExists: a segment (of either kind) has this name.
        """
        ...

    async def append(
        self,
        name: str,
        data: bytes | memoryview,
        *,
        expected_offset: int | None = None,
        writer: WriterAppend | None = None,
    ) -> AppendResult:
        """Append ``data`` to a stream segment and return once it is durable.

        ``data`` may be a ``memoryview`` (a front door hands over the received
        frame without copying it); the store may hold on to it until the bytes
        are written, so the caller must never change it afterwards.

        With ``writer``, the writer's last event number is kept as the segment
        attribute ``writer.writer_id``, in the same durable step as the data; if
        ``writer.event_number`` is not above the stored number the append is a
        retry of one already stored: nothing is written and the result says
        ``duplicate=True``. With ``expected_offset``, the append happens only if
        the segment length (counting appends still in flight) equals it.

        A segment keeps at most ``max_segment_attributes`` attributes (writer
        numbers and those set by ``update_attribute`` alike): setting one makes
        it the most recently used, and past the bound the least recently set
        one is dropped (it reads as ``NULL_ATTRIBUTE_VALUE`` again). So a
        writer idle while that many others wrote to the segment loses its
        dedup: its next append is stored whatever its number.

        Raises:
            SegmentNotFound, SegmentTypeMismatch (a table segment),
            SegmentSealed, BadOffset (``expected_offset`` did not match),
            AppendRefused (a ``check_appends`` check refused the data).
        """
        ...

    async def read(self, name: str, offset: int, max_bytes: int) -> ReadResult:
        """Read up to ``max_bytes`` durable bytes starting exactly at ``offset``.

        Returns at once, possibly with no data (at the tail). Works on both kinds.

        Raises:
            SegmentNotFound, SegmentTruncated (``offset`` below the start offset),
            BadOffset (``offset`` beyond the length; ``expected`` is the offset).
        """
        ...

    async def read_region(
        self, name: str, offset: int, max_bytes: int, *, min_region_bytes: int = 0
    ) -> ReadResult | RegionRead:
        """``read``, but when the bytes lie in one file, say where instead of copying them.

        The same checks, errors, flags and visibility as ``read`` (only durable
        bytes, never past the length ``read`` would see), the same number of
        bytes. The answer is a ``RegionRead`` (the caller closes its region)
        when the implementation keeps those bytes contiguously in one file and
        there are at least ``min_region_bytes`` of them (small reads are
        cheaper copied); otherwise a ``ReadResult``. An implementation without
        files (``MemoryStore``) always answers with a ``ReadResult``.

        Raises:
            SegmentNotFound, SegmentTruncated, BadOffset: as ``read``.
        """
        ...

    async def wait_for_data(self, name: str, offset: int, timeout_s: float) -> bool:
        """Wait until the segment has durable bytes at ``offset`` or is sealed.

        Returns True at once if that is already so, False if ``timeout_s``
        (capped at ``MAX_WAIT_S``) ran out first. Woken by appends and seals.

        Raises:
            SegmentNotFound (also if deleted while waiting).
        """
        ...

    def watch(self, name: str, offset: int, wake: asyncio.Future[None]) -> bool:
        """Register ``wake`` to be resolved at the segment's next change.

        What ``wait_for_data`` is built on, for callers that wait on several
        segments or on something else too with one future (a TANK consume
        parked on many partitions, an RS-IO subscription on many segments).
        Returns False and registers nothing if the segment is ready already
        (durable bytes at ``offset``, or sealed); otherwise ``wake`` gets
        ``set_result(None)`` at the next append, seal, merge or delete of the
        segment, or when the store closes, and True is returned. A woken
        caller checks again (the change may fall short of ``offset``); one
        that stops waiting otherwise calls ``unwatch``.

        Raises:
            SegmentNotFound, StoreClosed.
        """
        ...

    def unwatch(self, name: str, wake: asyncio.Future[None]) -> None:
        """Forget ``wake`` as a watcher of ``name``; a no-op if it was woken already."""
        ...

    async def info(self, name: str) -> SegmentInfo:
        """Metadata of a segment of either kind.

        Raises:
            SegmentNotFound.
        """
        ...

    async def seal(self, name: str) -> int:
        """Seal a segment (idempotent) and return its final length.

        Raises:
            SegmentNotFound.
        """
        ...

    async def truncate(self, name: str, offset: int) -> None:
        """Move the start offset to ``offset``; bytes below it become unreadable.

        ``start_offset <= offset <= length`` is required (equal to the current
        start is a harmless success). Allowed on sealed segments.

        Raises:
            SegmentNotFound, BadOffset (outside that range; ``actual`` is the length).
        """
        ...

    async def delete(self, name: str) -> None:
        """Delete a segment of either kind and everything it holds.

        Raises:
            SegmentNotFound.
        """
        ...

    async def merge(self, target: str, source: str) -> int:
        """Seal ``source`` if needed, append its bytes to ``target`` atomically,
        delete ``source``, and return ``target``'s new length (transaction commit).

        Merging a source that was already merged into ``target`` is a success
        that returns ``target``'s current length.

        Raises:
            SegmentNotFound (either one), SegmentSealed (target),
            SegmentTypeMismatch (either is a table), AppendRefused (``target``
            is under a ``check_appends`` prefix and ``source`` is not).
        """
        ...

    def check_appends(self, prefix: str, check: AppendCheck) -> None:
        """Have every append to a segment whose name starts with ``prefix`` pass ``check``.

        A front door that gives the segments under a prefix a format (TANK:
        every event of its scope is a bundle) keeps every other door to it
        this way, in one place. ``check(data)`` runs before anything is
        written; a reason refuses the append with ``AppendRefused``. A merge
        into such a segment from a segment outside the prefix is refused too
        (the source's appends were not checked). One check per prefix; a
        later call replaces it.
        """
        ...

    async def get_attribute(self, name: str, attribute_id: UUID) -> int:
        """An attribute's value, ``NULL_ATTRIBUTE_VALUE`` if never set.

        Raises:
            SegmentNotFound.
        """
        ...

    async def update_attribute(
        self, name: str, attribute_id: UUID, new_value: int, expected_value: int
    ) -> bool:
        """Compare-and-set: store ``new_value`` iff the current value
        (``NULL_ATTRIBUTE_VALUE`` if unset) equals ``expected_value``.

        Returns whether the update happened. Allowed on sealed segments.

        Raises:
            SegmentNotFound.
        """
        ...

    async def list_segments(self) -> list[str]:
        """Names of every segment of either kind, sorted."""
        ...

    # ------------------------------------------------------------------ tables

    async def create_table(self, name: str) -> None:
        """Create an empty table segment.

        Raises:
            SegmentExists.
        """
        ...

    async def delete_table(self, name: str, *, must_be_empty: bool = False) -> None:
        """Delete a table segment.

        Raises:
            SegmentNotFound, SegmentTypeMismatch, TableNotEmpty (``must_be_empty``).
        """
        ...

    async def update_table(
        self,
        name: str,
        updates: Sequence[TableUpdate],
        *,
        expected_length: int | None = None,
    ) -> list[int]:
        """Apply a batch of puts all-or-nothing and return the new versions in order.

        Every condition is checked against the table as it was before the
        batch (a key may appear several times); a key's new version is the
        offset of the record that wrote it.

        Raises:
            SegmentNotFound, SegmentTypeMismatch, TableKeyNotFound (a version >= 0
            for an absent key), TableKeyBadVersion (any other mismatch),
            BadOffset (``expected_length`` given and not the table's length).
        """
        ...

    async def remove_table_keys(
        self,
        name: str,
        keys: Sequence[TableKey],
        *,
        expected_length: int | None = None,
    ) -> None:
        """Remove keys all-or-nothing. An unconditional removal of an absent key
        is a success; otherwise the rules of ``update_table`` apply.
        """
        ...

    async def get_table_entries(self, name: str, keys: Sequence[bytes]) -> list[TableEntry | None]:
        """Current entries for ``keys`` in request order; ``None`` for absent keys."""
        ...

    async def iterate_table_keys(
        self, name: str, *, continuation_token: bytes = b"", max_count: int
    ) -> TablePage[TableKey]:
        """Up to ``max_count`` keys in byte order after the token (empty = from the start)."""
        ...

    async def iterate_table_entries(
        self, name: str, *, continuation_token: bytes = b"", max_count: int
    ) -> TablePage[TableEntry]:
        """Up to ``max_count`` entries in key byte order after the token."""
        ...

    async def read_table_delta(self, name: str, from_position: int, max_count: int) -> TableDelta:
        """Walk the table's record log from ``from_position`` (see ``TableDelta``).

        Raises:
            SegmentNotFound, SegmentTypeMismatch, BadOffset (not a record boundary).
        """
        ...

    async def table_info(self, name: str) -> TableInfo:
        """Length and live entry count of a table segment."""
        ...

    # ------------------------------------------------------------------ lifecycle

    @property
    def failure(self) -> str | None:
        """Why the store stopped taking writes (an I/O error, a full disk), or None.

        Read-only and cheap: for health checks. Once set it stays set until the
        store is reopened.
        """
        ...

    async def flush(self) -> None:
        """Make everything acknowledged so far durable now (a no-op under ``fsync=always``)."""
        ...

    async def close(self) -> None:
        """Finish in-flight operations, sync, release files. Idempotent."""
        ...


class FsyncPolicy(enum.StrEnum):
    """When the disk store forces data to stable storage (``--fsync``).

    ``ALWAYS``: an append is acknowledged only after an fsync that covers it;
    concurrent appends share fsyncs (group commit). Nothing acknowledged is
    lost on power failure. The default.

    ``INTERVAL``: appends are acknowledged once written to the OS; an fsync
    runs every ``fsync_interval_s``. A power failure (not a process crash) can
    lose up to that interval of acknowledged data.

    ``NEVER``: fsync only at checkpoints and on close. A process crash loses
    nothing (the OS has the bytes); a power failure can lose anything since
    the last checkpoint. For benchmarks and throw-away data.
    """

    ALWAYS = "always"
    INTERVAL = "interval"
    NEVER = "never"


@runtime_checkable
class TimeIndexed(Protocol):
    """A store that keeps each stream segment's append-time index.

    Both ``MemoryStore`` and ``DiskStore`` do (``store/_timeindex.py``;
    on disk in the snapshot, ``docs/storage-format.md#time-index``). An
    event's append time is the time of the last index entry at or below its
    offset; events stored before the segment had an index (a data dir of an
    older format) have none and count as older than any time.
    """

    async def offset_at_time(self, name: str, time_ms: int) -> int:
        """The offset of the first event appended at or after ``time_ms``: the
        durable length if none was, never below the start offset.

        Raises:
            SegmentNotFound, SegmentTypeMismatch (a table segment).
        """
        ...

    async def append_times(self, name: str, offset: int, end: int) -> list[tuple[int, int]]:
        """``(offset, time_ms)`` index entries that give the append time of every
        event in ``[offset, end)``: the last at or below ``offset`` (if any) and
        each one inside, in order.

        Raises:
            SegmentNotFound, SegmentTypeMismatch (a table segment).
        """
        ...


async def offset_at_time(store: SegmentStore, name: str, time_ms: int) -> int | None:
    """``store.offset_at_time`` if the store keeps time indexes (the two stores,
    and a cluster node's ``RoutedStore``, which asks each segment's owner),
    else None."""
    if isinstance(store, TimeIndexed):
        return await store.offset_at_time(name, time_ms)
    return None
