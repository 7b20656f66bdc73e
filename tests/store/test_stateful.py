"""DiskStore against the MemoryStore model, under random operation sequences.

A hypothesis state machine applies the same operation to both stores and
requires the same outcome: equal results, or errors of the same type with
the same data. At random points the DiskStore is closed and reopened from its
directory, or replaced by a copy of its directory taken while it was open (a
crash image: recovery replays the write-ahead log). After every step the
whole contents of both stores (segment list, metadata without the clock,
bytes, attributes, table entries, a full delta walk of each table) must
agree. Arguments are drawn relative to the model's current state (lengths,
start offsets, key versions), so conditional operations both succeed and
fail often.

One event loop, owned by the machine, drives both stores; each run gets a
fresh temporary directory.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import tempfile
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from headrace.errors import SegmentNotFound, StoreError
from headrace.store import DiskStore, MemoryStore, SegmentStore
from headrace.store.api import FsyncPolicy
from headrace.types import (
    NO_VERSION,
    NOT_EXISTS,
    NULL_ATTRIBUTE_VALUE,
    SegmentInfo,
    SegmentKind,
    TableKey,
    TableUpdate,
    WriterAppend,
)

STREAM_NAMES = ("a", "../x", "nul\x00")
TABLE_NAMES = ("é/🙂", "")
NAMES = (*STREAM_NAMES, *TABLE_NAMES)
"""Small pools, so that operations keep meeting the same segments; hostile on purpose.
Stream rules mostly pick stream names and table rules table names, and each
sometimes picks any name, to meet the other kind (and missing segments)."""

KEYS = (b"", b"k1", b"k2", b"\x00", b"\xff\xfe")
WRITERS = (UUID(int=1), UUID(int=2))
ATTRIBUTE_IDS = (*WRITERS, UUID("6f1c2b9e-0d5a-4e47-9a1e-2f3b4c5d6e7f"))

name_st = st.sampled_from(NAMES)
stream_st = st.sampled_from(STREAM_NAMES) | name_st
table_st = st.sampled_from(TABLE_NAMES) | name_st
key_st = st.sampled_from(KEYS)
# An offset as (base, delta): the base is read from the model when the rule runs.
# Weighted towards the exact base, so that conditions hold about as often as they fail.
offset_st = st.tuples(
    st.sampled_from(["start", "length", "length", "zero"]), st.sampled_from([0, 0, 0, -1, 1, 2])
)
version_st = st.sampled_from([NO_VERSION, NO_VERSION, "current", "current", NOT_EXISTS, 7])
expected_length_st = st.sampled_from([None, None, "length", 5])
value_st = st.binary(max_size=12)

Outcome = tuple[object, ...]


def _info(info: SegmentInfo) -> SegmentInfo:
    """Metadata without the wall clock, attributes as a plain dict."""
    return dataclasses.replace(info, last_modified_ms=0, attributes=dict(info.attributes))


def _same(value: object) -> object:
    return value


def _error(e: StoreError) -> Outcome:
    return ("error", type(e), tuple(sorted(vars(e).items())))


async def _read_all(store: SegmentStore, name: str, offset: int) -> bytes:
    parts: list[bytes] = []
    while True:
        result = await store.read(name, offset, 1 << 16)
        if not result.data:
            return b"".join(parts)
        parts.append(result.data)
        offset += len(result.data)


async def _iterate(store: SegmentStore, name: str, max_count: int, entries: bool) -> list[object]:
    """Every page of an iteration, up to the empty page that ends it."""
    pages: list[object] = []
    token = b""
    for _ in range(2 * len(KEYS) + 2):
        page: Any
        if entries:
            page = await store.iterate_table_entries(
                name, continuation_token=token, max_count=max_count
            )
        else:
            page = await store.iterate_table_keys(
                name, continuation_token=token, max_count=max_count
            )
        pages.append(page.items)
        if not page.items:
            return pages
        token = page.continuation_token
    raise AssertionError(f"iteration of {name!r} did not end: {pages!r}")


async def _delta_walk(store: SegmentStore, name: str, max_count: int) -> list[object]:
    """Delta reads the way the Rust synchronizer does them: from 0 until an empty reply."""
    replies: list[object] = []
    position = 0
    for _ in range(200):
        delta = await store.read_table_delta(name, position, max_count)
        replies.append(delta)
        if not delta.entries:
            return replies
        assert delta.last_position > position, delta
        position = delta.last_position
    raise AssertionError(f"delta walk of {name!r} did not end")


async def _snapshot(store: SegmentStore) -> list[object]:
    """Everything a store holds, in a comparable form."""
    contents: list[object] = []
    for name in await store.list_segments():
        info = await store.info(name)
        contents.append((name, _info(info), await _read_all(store, name, info.start_offset)))
        if info.kind is SegmentKind.TABLE:
            contents.append(await store.table_info(name))
            contents.append(await _iterate(store, name, 100, entries=True))
            contents.append(await _delta_walk(store, name, 3))
    return contents


class StoreMachine(RuleBasedStateMachine):
    """The same operations on a DiskStore and a MemoryStore; outcomes must agree."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.tmp = tempfile.TemporaryDirectory(prefix="headrace-stateful-")
        self.path = Path(self.tmp.name) / "data"
        self.copies = 0
        self.model: SegmentStore = MemoryStore()
        self.disk: SegmentStore = self._run(DiskStore.open(self.path, fsync=FsyncPolicy.ALWAYS))

    def teardown(self) -> None:
        try:
            self._run(self.disk.close())
            self._run(self.model.close())
        finally:
            self.loop.close()
            self.tmp.cleanup()

    # ------------------------------------------------------------------ helpers

    def _run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return self.loop.run_until_complete(coro)

    def _outcome(
        self, coro: Coroutine[Any, Any, Any], normalise: Callable[[Any], object]
    ) -> Outcome:
        try:
            return ("ok", normalise(self._run(coro)))
        except StoreError as e:
            return _error(e)

    def _both(
        self,
        op: Callable[[SegmentStore], Coroutine[Any, Any, Any]],
        normalise: Callable[[Any], object] = _same,
    ) -> Outcome:
        expected = self._outcome(op(self.model), normalise)
        actual = self._outcome(op(self.disk), normalise)
        assert actual == expected, f"DiskStore gave {actual!r}, MemoryStore gave {expected!r}"
        return expected

    def _model_info(self, name: str) -> SegmentInfo | None:
        try:
            info: SegmentInfo = self._run(self.model.info(name))
        except SegmentNotFound:
            return None
        return info

    def _offset(self, name: str, choice: tuple[str, int]) -> int:
        base, delta = choice
        info = self._model_info(name)
        if info is None or base == "zero":
            return max(0, delta)
        return (info.start_offset if base == "start" else info.length) + delta

    def _version(self, name: str, key: bytes, choice: int | str) -> int:
        """Resolve ``"current"`` to the key's version in the model (``NOT_EXISTS`` if absent)."""
        if choice != "current":
            assert isinstance(choice, int)
            return choice
        info = self._model_info(name)
        if info is None or info.kind is not SegmentKind.TABLE:
            return NOT_EXISTS
        [entry] = self._run(self.model.get_table_entries(name, [key]))
        return NOT_EXISTS if entry is None else entry.version

    # ------------------------------------------------------------------ segments

    @initialize(missing=st.sets(name_st, max_size=2))
    def create_most(self, missing: set[str]) -> None:
        """Start with most names in use, so that most rules meet a segment of their kind."""
        for name in NAMES:
            if name not in missing:
                kind = SegmentKind.TABLE if name in TABLE_NAMES else SegmentKind.STREAM
                self._both(lambda s, name=name, kind=kind: s.create_segment(name, kind=kind))

    @rule(name=stream_st, kind=st.sampled_from(list(SegmentKind)))
    def create_segment(self, name: str, kind: SegmentKind) -> None:
        self._both(lambda s: s.create_segment(name, kind=kind))

    @rule(name=stream_st, data=st.binary(min_size=1, max_size=24))
    def append(self, name: str, data: bytes) -> None:
        self._both(lambda s: s.append(name, data))

    @rule(
        name=stream_st,
        data=st.binary(max_size=24),
        expected=st.none() | offset_st,
        writer=st.none() | st.tuples(st.sampled_from(WRITERS), st.integers(-1, 6)),
    )
    def append_conditional(
        self,
        name: str,
        data: bytes,
        expected: tuple[str, int] | None,
        writer: tuple[UUID, int] | None,
    ) -> None:
        expected_offset = None if expected is None else self._offset(name, expected)
        w = None if writer is None else WriterAppend(*writer)
        self._both(lambda s: s.append(name, data, expected_offset=expected_offset, writer=w))

    @rule(name=stream_st, at=offset_st, max_bytes=st.integers(0, 40))
    def read(self, name: str, at: tuple[str, int], max_bytes: int) -> None:
        offset = self._offset(name, at)
        self._both(lambda s: s.read(name, offset, max_bytes))

    @rule(name=stream_st, at=offset_st)
    def wait_for_data_now(self, name: str, at: tuple[str, int]) -> None:
        offset = self._offset(name, at)
        self._both(lambda s: s.wait_for_data(name, offset, 0))

    @rule(name=stream_st)
    def info(self, name: str) -> None:
        self._both(lambda s: s.info(name), _info)

    @rule(name=stream_st)
    def seal(self, name: str) -> None:
        self._both(lambda s: s.seal(name))

    @rule(name=stream_st, at=offset_st)
    def truncate(self, name: str, at: tuple[str, int]) -> None:
        offset = self._offset(name, at)
        self._both(lambda s: s.truncate(name, offset))

    @rule(name=stream_st, recreate=st.booleans())
    def delete(self, name: str, recreate: bool) -> None:
        """Delete a segment of either kind, and maybe create it again, empty."""
        info = self._model_info(name)
        self._both(lambda s: s.delete(name))
        if recreate and info is not None:
            self._both(lambda s: s.create_segment(name, kind=info.kind))

    @rule(into=stream_st, source=stream_st)
    def merge(self, into: str, source: str) -> None:
        self._both(lambda s: s.merge(into, source))

    @rule(name=stream_st, attribute_id=st.sampled_from(ATTRIBUTE_IDS))
    def get_attribute(self, name: str, attribute_id: UUID) -> None:
        self._both(lambda s: s.get_attribute(name, attribute_id))

    @rule(
        name=stream_st,
        attribute_id=st.sampled_from(ATTRIBUTE_IDS),
        new_value=st.integers(-2, 8) | st.just(NULL_ATTRIBUTE_VALUE),
        expected=st.just("current") | st.integers(-1, 8) | st.just(NULL_ATTRIBUTE_VALUE),
    )
    def update_attribute(
        self, name: str, attribute_id: UUID, new_value: int, expected: int | str
    ) -> None:
        if expected == "current":
            info = self._model_info(name)
            attributes = {} if info is None else info.attributes
            expected = attributes.get(attribute_id, NULL_ATTRIBUTE_VALUE)
        assert isinstance(expected, int)
        value = expected
        self._both(lambda s: s.update_attribute(name, attribute_id, new_value, value))

    @rule()
    def list_segments(self) -> None:
        self._both(lambda s: s.list_segments())

    # ------------------------------------------------------------------ tables

    @rule(name=table_st)
    def create_table(self, name: str) -> None:
        self._both(lambda s: s.create_table(name))

    @rule(name=table_st, must_be_empty=st.booleans())
    def delete_table(self, name: str, must_be_empty: bool) -> None:
        self._both(lambda s: s.delete_table(name, must_be_empty=must_be_empty))

    def _expected_length(self, name: str, choice: str | int | None) -> int | None:
        if choice == "length":
            return self._offset(name, ("length", 0))
        assert choice is None or isinstance(choice, int)
        return choice

    @rule(
        name=table_st,
        updates=st.lists(st.tuples(key_st, value_st, version_st), max_size=4),
        expected_length=expected_length_st,
    )
    def update_table(
        self,
        name: str,
        updates: list[tuple[bytes, bytes, int | str]],
        expected_length: str | int | None,
    ) -> None:
        batch = [TableUpdate(k, v, self._version(name, k, c)) for k, v, c in updates]
        length = self._expected_length(name, expected_length)
        self._both(lambda s: s.update_table(name, batch, expected_length=length))

    @rule(
        name=table_st,
        keys=st.lists(st.tuples(key_st, version_st), max_size=4),
        expected_length=expected_length_st,
    )
    def remove_table_keys(
        self,
        name: str,
        keys: list[tuple[bytes, int | str]],
        expected_length: str | int | None,
    ) -> None:
        batch = [TableKey(k, self._version(name, k, c)) for k, c in keys]
        length = self._expected_length(name, expected_length)
        self._both(lambda s: s.remove_table_keys(name, batch, expected_length=length))

    @rule(name=table_st, keys=st.lists(key_st, max_size=4))
    def get_table_entries(self, name: str, keys: list[bytes]) -> None:
        self._both(lambda s: s.get_table_entries(name, keys))

    @rule(name=table_st, max_count=st.integers(1, 4), entries=st.booleans())
    def iterate_table(self, name: str, max_count: int, entries: bool) -> None:
        self._both(lambda s: _iterate(s, name, max_count, entries))

    @rule(
        name=table_st,
        position=st.one_of(
            st.sampled_from([0, -1, "length"]), st.tuples(key_st), st.integers(0, 120)
        ),
        max_count=st.integers(1, 4),
    )
    def read_table_delta(
        self, name: str, position: int | str | tuple[bytes], max_count: int
    ) -> None:
        if position == "length":
            position = self._offset(name, ("length", 0))
        elif isinstance(position, tuple):  # a record boundary, if the key is present
            position = max(0, self._version(name, position[0], "current"))
        assert isinstance(position, int)
        from_position = position
        self._both(lambda s: s.read_table_delta(name, from_position, max_count))

    @rule(name=table_st)
    def table_info(self, name: str) -> None:
        self._both(lambda s: s.table_info(name))

    # ------------------------------------------------------------------ lifecycle

    @rule()
    def flush(self) -> None:
        self._both(lambda s: s.flush())

    @rule()
    def reopen(self) -> None:
        """Close the DiskStore and open it again from its directory."""
        self._run(self.disk.close())
        self.disk = self._run(DiskStore.open(self.path, fsync=FsyncPolicy.ALWAYS))

    @rule()
    def recover_from_copy(self) -> None:
        """Open a copy of the data directory taken between two steps: what a crash
        at that moment leaves behind (everything acknowledged, nothing closed)."""
        self.copies += 1
        copy = Path(self.tmp.name) / f"crash-{self.copies}"
        shutil.copytree(self.path, copy)
        self._run(self.disk.close())
        self.path = copy
        self.disk = self._run(DiskStore.open(self.path, fsync=FsyncPolicy.ALWAYS))

    @invariant()
    def contents_agree(self) -> None:
        self._both(_snapshot)


TestStoreMachine = pytest.mark.slow(StoreMachine.TestCase)
TestStoreMachine.settings = settings(
    max_examples=100,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
