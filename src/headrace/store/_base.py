"""What both store implementations share: tables, long-poll waits, kind checks.

An implementation provides the segment primitives (the abstract methods
below); this base class builds the table-segment API on top of them, so table
semantics are written once and a table is durable exactly when its segment
is. Table mutations of one table are serialised by a per-table lock, because a
batch is validated against the table's state and then appended at exactly
the offset it was validated against.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol
from uuid import UUID

from headrace.errors import (
    AppendRefused,
    BadOffset,
    LimitExceeded,
    SegmentSealed,
    SegmentTypeMismatch,
    TableNotEmpty,
)
from headrace.store._timeindex import TimeIndex
from headrace.store.api import (
    MAX_APPEND_BYTES,
    MAX_READ_BYTES,
    MAX_TABLE_BATCH_BYTES,
    MAX_TABLE_KEY_BYTES,
    MAX_TABLE_VALUE_BYTES,
    MAX_WAIT_S,
    AppendCheck,
)
from headrace.store.tables import (
    TableIndex,
    check_removals,
    check_updates,
    decode_records,
    encode_removals,
    encode_updates,
)
from headrace.types import (
    NULL_ATTRIBUTE_VALUE,
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

__all__ = ["AppendTarget", "BaseStore", "SegmentState", "check_append"]

TABLE_READ_MAX_BYTES = 2 * 1024 * 1024
"""Most bytes one table iteration page or delta read returns (Pravega's 2 MiB reply cap)."""

TOKEN_PREFIX = b"k"
"""A continuation token is this byte followed by the last key returned. The prefix
keeps the empty key (a valid key) apart from the empty token, which means "from
the start"; without it a table holding the empty key iterates forever."""


def _resolve(wake: asyncio.Future[None]) -> None:
    """A waiter's timer: wake it (it sees its deadline passed)."""
    if not wake.done():
        wake.set_result(None)


async def _refused(error: AppendRefused) -> AppendResult:
    """An append ``check_appends`` refused: raised when awaited, like any store error."""
    raise error


def _key_after_token(token: bytes) -> bytes | None:
    return token[len(TOKEN_PREFIX) :] if token else None


def _token(keys: list[bytes], continuation_token: bytes) -> bytes:
    return TOKEN_PREFIX + keys[-1] if keys else continuation_token


@dataclass(frozen=True, slots=True)
class SegmentState:
    """The cheap, synchronous view of a segment the base class needs."""

    kind: SegmentKind
    start_offset: int
    length: int
    sealed: bool


class AppendTarget(Protocol):
    """What ``check_append`` reads of a segment, in either implementation."""

    @property
    def kind(self) -> SegmentKind: ...
    @property
    def length(self) -> int: ...
    @property
    def sealed(self) -> bool: ...
    @property
    def attributes(self) -> Mapping[UUID, int]: ...


def check_append(
    name: str,
    s: AppendTarget,
    size: int,
    expected_offset: int | None,
    writer: WriterAppend | None,
    kind: SegmentKind,
) -> tuple[int, bool]:
    """The checks every append passes before it is written, in Pravega's order.

    Returns the writer's previous event number and whether this append is a
    retry of one already stored (then nothing may be written). Raises the
    store error the append gets otherwise. One function, so that both stores
    refuse and deduplicate alike.
    """
    if s.kind is not kind:
        raise SegmentTypeMismatch(name, kind.value)
    if size > MAX_APPEND_BYTES:
        raise LimitExceeded("append bytes", MAX_APPEND_BYTES, size)
    if s.sealed:
        raise SegmentSealed(name, s.length)
    previous = NULL_ATTRIBUTE_VALUE
    if writer is not None:
        previous = s.attributes.get(writer.writer_id, NULL_ATTRIBUTE_VALUE)
        if writer.event_number <= previous:
            return previous, True
    if expected_offset is not None and expected_offset != s.length:
        raise BadOffset(name, expected_offset, s.length)
    return previous, False


@dataclass(slots=True)
class _Table:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    index: TableIndex | None = None


class BaseStore(abc.ABC):
    """Table segments and waits over abstract segment primitives."""

    def __init__(self) -> None:
        self._tables: dict[str, _Table] = {}
        self._watchers: dict[str, dict[asyncio.Future[None], None]] = {}
        """Per segment, the futures to resolve at its next change (``watch``); a dict
        for its insertion order and O(1) removal when a wait times out."""
        self._append_checks: dict[str, AppendCheck] = {}
        """``check_appends``: name prefix -> the check of every append under it."""

    @property
    def failure(self) -> str | None:
        """Why the store stopped taking writes, or None (``SegmentStore.failure``)."""
        return None

    # ------------------------------------------------------------------ primitives

    @abc.abstractmethod
    def _state(self, name: str) -> SegmentState:
        """The segment's durable state. Raises SegmentNotFound."""

    @abc.abstractmethod
    def _time_index(self, name: str) -> TimeIndex:
        """The segment's append-time index. Raises SegmentNotFound."""

    @abc.abstractmethod
    async def _create(self, name: str, kind: SegmentKind) -> None: ...

    @abc.abstractmethod
    async def _append(
        self,
        name: str,
        data: bytes | memoryview,
        expected_offset: int | None,
        writer: WriterAppend | None,
        kind: SegmentKind,
    ) -> AppendResult:
        """Append to a segment that must be of ``kind`` (checked by the implementation,
        atomically with the append)."""

    @abc.abstractmethod
    async def _delete(self, name: str) -> None: ...

    @abc.abstractmethod
    async def read(self, name: str, offset: int, max_bytes: int) -> ReadResult: ...

    async def read_region(
        self, name: str, offset: int, max_bytes: int, *, min_region_bytes: int = 0
    ) -> ReadResult | RegionRead:
        """Bytes, unless the implementation keeps segments in files (``DiskStore``)."""
        return await self.read(name, offset, max_bytes)

    @abc.abstractmethod
    async def info(self, name: str) -> SegmentInfo: ...

    @abc.abstractmethod
    async def seal(self, name: str) -> int: ...

    @abc.abstractmethod
    async def _truncate(self, name: str, offset: int) -> None: ...

    @abc.abstractmethod
    async def merge(self, target: str, source: str) -> int: ...

    @abc.abstractmethod
    async def get_attribute(self, name: str, attribute_id: UUID) -> int: ...

    @abc.abstractmethod
    async def update_attribute(
        self, name: str, attribute_id: UUID, new_value: int, expected_value: int
    ) -> bool: ...

    @abc.abstractmethod
    async def list_segments(self) -> list[str]: ...

    @abc.abstractmethod
    async def flush(self) -> None: ...

    @abc.abstractmethod
    async def close(self) -> None: ...

    # ------------------------------------------------------------------ append times

    async def offset_at_time(self, name: str, time_ms: int) -> int:
        """Where the events appended at or after ``time_ms`` begin (``TimeIndexed``)."""
        state = self._state(name)
        if state.kind is not SegmentKind.STREAM:
            raise SegmentTypeMismatch(name, SegmentKind.STREAM.value)
        found = self._time_index(name).offset_at(time_ms)
        if found is None:
            return state.length
        return min(max(found, state.start_offset), state.length)

    async def append_times(self, name: str, offset: int, end: int) -> list[tuple[int, int]]:
        """The time index entries covering ``[offset, end)`` (``TimeIndexed``)."""
        state = self._state(name)
        if state.kind is not SegmentKind.STREAM:
            raise SegmentTypeMismatch(name, SegmentKind.STREAM.value)
        return self._time_index(name).covering(offset, min(end, state.length))

    # ------------------------------------------------------------------ change notification

    def _notify(self, name: str) -> None:
        """Wake every watcher of ``name`` (``watch``, ``wait_for_data``): call after
        the durable length grows, after a seal, and after a delete or merge.

        On the append path: one dict lookup when nobody waits, one
        ``set_result`` per parked waiter otherwise."""
        watchers = self._watchers.pop(name, None)
        if watchers:
            for wake in watchers:
                if not wake.done():
                    wake.set_result(None)

    def _wake_all(self) -> None:
        """Wake every watcher of every segment: call when the store closes, so
        parked waits raise ``StoreClosed`` at once instead of holding shutdown
        for up to ``MAX_WAIT_S``."""
        every, self._watchers = self._watchers, {}
        for watchers in every.values():
            for wake in watchers:
                if not wake.done():
                    wake.set_result(None)

    def watch(self, name: str, offset: int, wake: asyncio.Future[None]) -> bool:
        """Resolve ``wake`` at the segment's next change, unless it is ready now.

        Ready means what ``wait_for_data`` waits for: durable bytes at
        ``offset``, or sealed; then nothing is registered and False is
        returned. Otherwise ``wake`` gets ``set_result(None)`` at the next
        append, seal, merge or delete of the segment or when the store
        closes, whichever comes first, and True is returned. A woken caller
        checks again (the change may be short of ``offset``); one that stops
        waiting first (timer, cancellation) calls ``unwatch``. One future may
        watch several segments (a subscription at the tail of each).

        This is the whole cost of a parked reader: an entry in a dict, and
        the caller's future and timer. No task, no ``Event``.

        Raises:
            SegmentNotFound, StoreClosed.
        """
        state = self._state(name)
        if state.sealed or state.length > offset:
            return False
        self._add_watcher(name, wake)
        return True

    def _add_watcher(self, name: str, wake: asyncio.Future[None]) -> None:
        watchers = self._watchers.get(name)
        if watchers is None:
            watchers = self._watchers[name] = {}
        watchers[wake] = None

    def unwatch(self, name: str, wake: asyncio.Future[None]) -> None:
        """Forget ``wake`` as a watcher of ``name`` (no-op if it was woken or never watched)."""
        watchers = self._watchers.get(name)
        if watchers is not None:
            watchers.pop(wake, None)
            if not watchers:
                del self._watchers[name]

    async def wait_for_data(self, name: str, offset: int, timeout_s: float) -> bool:
        state = self._state(name)
        if state.sealed or state.length > offset:
            return True
        timeout_s = min(timeout_s, MAX_WAIT_S)
        if not timeout_s > 0:
            return False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            wake: asyncio.Future[None] = loop.create_future()
            self._add_watcher(name, wake)  # not ready: checked just before
            timer = loop.call_at(deadline, _resolve, wake)
            try:
                await wake
            finally:
                timer.cancel()
                self.unwatch(name, wake)
            state = self._state(name)
            if state.sealed and state.length <= offset:
                # Woken by a seal with nothing new: a merge seals its source
                # first and hides it a step later (DiskStore), and a waiter on
                # the source must see the merge (SegmentNotFound), not the seal.
                # One more loop round lets that step run; a seal comes once.
                await asyncio.sleep(0)
                self._state(name)
                return True
            if state.length > offset:
                return True
            if loop.time() >= deadline:
                return False

    # ------------------------------------------------------------------ segments

    async def create_segment(self, name: str, *, kind: SegmentKind = SegmentKind.STREAM) -> None:
        await self._create(name, kind)
        self._tables.pop(name, None)

    def append(
        self,
        name: str,
        data: bytes | memoryview,
        *,
        expected_offset: int | None = None,
        writer: WriterAppend | None = None,
    ) -> Coroutine[Any, Any, AppendResult]:
        """The implementation's ``_append`` itself (awaited by the caller): no
        coroutine of its own in between, one frame less per append."""
        if self._append_checks:
            for prefix, check in self._append_checks.items():
                if name.startswith(prefix):
                    reason = check(data)
                    if reason is not None:
                        return _refused(AppendRefused(name, reason))
        return self._append(name, data, expected_offset, writer, SegmentKind.STREAM)

    def check_appends(self, prefix: str, check: AppendCheck) -> None:
        self._append_checks[prefix] = check

    def _check_merge(self, target: str, source: str) -> None:
        """Refuse a merge that would bring unchecked bytes under a ``check_appends`` prefix.

        Raises:
            AppendRefused.
        """
        for prefix in self._append_checks:
            if target.startswith(prefix) and not source.startswith(prefix):
                raise AppendRefused(target, f"a merge from {source!r}, outside {prefix!r}")

    async def delete(self, name: str) -> None:
        await self._delete(name)
        self._tables.pop(name, None)
        self._notify(name)

    async def truncate(self, name: str, offset: int) -> None:
        if self._state(name).kind is not SegmentKind.STREAM:
            raise SegmentTypeMismatch(name, SegmentKind.STREAM.value)
        await self._truncate(name, offset)

    # ------------------------------------------------------------------ tables

    def _table_state(self, name: str) -> SegmentState:
        state = self._state(name)
        if state.kind is not SegmentKind.TABLE:
            raise SegmentTypeMismatch(name, SegmentKind.TABLE.value)
        return state

    async def _read_range(self, name: str, start: int, end: int) -> bytes:
        """Exactly the durable bytes [start, end) of a segment."""
        parts: list[bytes] = []
        offset = start
        while offset < end:
            result = await self.read(name, offset, min(end - offset, MAX_READ_BYTES))
            if not result.data:
                raise BadOffset(name, end, offset)
            parts.append(result.data)
            offset += len(result.data)
        return b"".join(parts)

    async def _table(self, name: str) -> tuple[_Table, TableIndex]:
        """The table's lock holder and an index that is current with its segment."""
        state = self._table_state(name)
        table = self._tables.get(name)
        if table is None:
            table = self._tables[name] = _Table()
        if table.index is None or table.index.length != state.length:
            index = TableIndex(start_offset=state.start_offset, length=state.start_offset)
            data = await self._read_range(name, state.start_offset, state.length)
            for record in decode_records(data, state.start_offset, path=name):
                index.apply(record)
            table.index = index
        return table, table.index

    async def create_table(self, name: str) -> None:
        await self.create_segment(name, kind=SegmentKind.TABLE)

    async def delete_table(self, name: str, *, must_be_empty: bool = False) -> None:
        table, index = await self._table(name)
        async with table.lock:
            if must_be_empty and len(index.entries):
                raise TableNotEmpty(name)
            await self.delete(name)

    @staticmethod
    def _check_length(name: str, index: TableIndex, expected_length: int | None) -> None:
        if expected_length is not None and expected_length != index.length:
            raise BadOffset(name, expected_length, index.length)

    async def _append_records(
        self, name: str, index: TableIndex, data: bytes, expected_length: int | None
    ) -> None:
        self._check_length(name, index, expected_length)
        if len(data) > MAX_TABLE_BATCH_BYTES:
            raise LimitExceeded("table batch bytes", MAX_TABLE_BATCH_BYTES, len(data))
        base = index.length
        await self._append(name, data, base, None, SegmentKind.TABLE)
        for record in decode_records(data, base, path=name):
            index.apply(record)

    async def update_table(
        self,
        name: str,
        updates: Sequence[TableUpdate],
        *,
        expected_length: int | None = None,
    ) -> list[int]:
        table, _ = await self._table(name)
        async with table.lock:
            _, index = await self._table(name)
            check_updates(name, index, updates, MAX_TABLE_KEY_BYTES, MAX_TABLE_VALUE_BYTES)
            self._check_length(name, index, expected_length)
            if not updates:
                return []
            data, versions = encode_updates(updates, index.length)
            await self._append_records(name, index, data, expected_length)
            return versions

    async def remove_table_keys(
        self,
        name: str,
        keys: Sequence[TableKey],
        *,
        expected_length: int | None = None,
    ) -> None:
        table, _ = await self._table(name)
        async with table.lock:
            _, index = await self._table(name)
            check_removals(name, index, keys, MAX_TABLE_KEY_BYTES)
            self._check_length(name, index, expected_length)
            if not keys:
                return
            data = encode_removals([k.key for k in keys], index.length)
            await self._append_records(name, index, data, expected_length)

    async def get_table_entries(self, name: str, keys: Sequence[bytes]) -> list[TableEntry | None]:
        _, index = await self._table(name)
        return [index.get(key) for key in keys]

    async def iterate_table_keys(
        self, name: str, *, continuation_token: bytes = b"", max_count: int
    ) -> TablePage[TableKey]:
        _, index = await self._table(name)
        keys = index.keys_after(
            _key_after_token(continuation_token), max_count, TABLE_READ_MAX_BYTES
        )
        items = [TableKey(k, index.entries[k][0]) for k in keys]
        return TablePage(items, _token(keys, continuation_token))

    async def iterate_table_entries(
        self, name: str, *, continuation_token: bytes = b"", max_count: int
    ) -> TablePage[TableEntry]:
        _, index = await self._table(name)
        keys = index.keys_after(
            _key_after_token(continuation_token), max_count, TABLE_READ_MAX_BYTES
        )
        items = [TableEntry(k, index.entries[k][1], index.entries[k][0]) for k in keys]
        return TablePage(items, _token(keys, continuation_token))

    async def read_table_delta(self, name: str, from_position: int, max_count: int) -> TableDelta:
        _, index = await self._table(name)
        should_clear = from_position < index.start_offset
        position = index.start_offset if should_clear else from_position
        if position > index.length or not index.is_record_boundary(position):
            raise BadOffset(name, from_position, index.length)
        # Walk whole records, at least one, at most about TABLE_READ_MAX_BYTES.
        end = index.boundary_at_or_before(position + TABLE_READ_MAX_BYTES)
        if end == position and position < index.length:
            i = index.record_offsets.index(position)
            end = index.record_offsets[i + 1] if i + 1 < len(index.record_offsets) else index.length
        data = await self._read_range(name, position, end)
        latest: dict[bytes, TableEntry] = {}
        last = position
        for record in decode_records(data, position, path=name):
            if record.value is None:
                latest.pop(record.key, None)
            else:
                latest.pop(record.key, None)  # keep reply order = order of latest write
                latest[record.key] = TableEntry(record.key, record.value, record.offset)
            last = record.end
            if len(latest) >= max_count:
                break
        return TableDelta(list(latest.values()), last, last == index.length, should_clear)

    async def table_info(self, name: str) -> TableInfo:
        _, index = await self._table(name)
        return TableInfo(name, index.start_offset, index.length, len(index.entries))
