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
import itertools
import shutil
import tempfile
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from headrace.errors import SegmentNotFound, StoreError
from headrace.store import DiskStore, MemoryStore, SegmentStore
from headrace.store.api import FsyncPolicy
from headrace.store.disk.checkpoint import CHECKPOINT_WAL_BYTES
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
value_st = st.binary(max_size=12)
# An offset as (base, delta): the base is read from the model when the rule runs.
# Weighted towards the exact base, so that conditions hold about as often as they fail.
offset_st = st.tuples(
    st.sampled_from(["start", "length", "length", "zero"]), st.sampled_from([0, 0, 0, -1, 1, 2])
)
version_st = st.sampled_from([NO_VERSION, NO_VERSION, "current", "current", NOT_EXISTS, 7])
expected_length_st = st.sampled_from([None, None, "length", 5])
kind_st = st.sampled_from(list(SegmentKind))
writer_st = st.tuples(st.sampled_from(WRITERS), st.integers(-1, 6))
attribute_value_st = st.integers(-2, 8) | st.just(NULL_ATTRIBUTE_VALUE)
expected_attribute_st = st.just("current") | st.integers(-1, 8) | st.just(NULL_ATTRIBUTE_VALUE)
updates_st = st.lists(st.tuples(key_st, value_st, version_st), max_size=4)
removals_st = st.lists(st.tuples(key_st, version_st), max_size=4)

concurrent_op_st = st.one_of(
    st.tuples(
        st.just("append"),
        stream_st,
        st.binary(min_size=1, max_size=8),
        st.none() | offset_st,
        st.none() | writer_st,
    ),
    st.tuples(st.just("update_table"), table_st, updates_st, expected_length_st),
    st.tuples(st.just("remove_table_keys"), table_st, removals_st, expected_length_st),
    st.tuples(
        st.just("update_attribute"),
        stream_st,
        st.sampled_from(ATTRIBUTE_IDS),
        attribute_value_st,
        expected_attribute_st,
    ),
    st.tuples(st.just("seal"), stream_st),
    st.tuples(st.just("truncate"), stream_st, offset_st),
    st.tuples(st.just("read"), stream_st, offset_st, st.integers(0, 40)),
    st.tuples(st.just("get_table_entries"), table_st, st.lists(key_st, max_size=3)),
    st.tuples(st.just("info"), name_st),
    st.tuples(st.just("create"), name_st, kind_st),
    st.tuples(st.just("delete"), name_st),
)
"""Operations for the concurrency rule, as (op_* method suffix, arguments...)."""

Outcome = tuple[object, ...]
Op = Callable[[SegmentStore], Coroutine[Any, Any, Any]]


def _info(info: SegmentInfo) -> SegmentInfo:
    """Metadata without the wall clock, attributes as a plain dict."""
    return dataclasses.replace(info, last_modified_ms=0, attributes=dict(info.attributes))


async def _attempt(coro: Coroutine[Any, Any, Any]) -> Outcome:
    """An operation's outcome: its result, or its error's type and data."""
    try:
        return ("ok", await coro)
    except StoreError as e:
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
        self.checkpoint_wal_bytes = CHECKPOINT_WAL_BYTES
        self.merges: list[tuple[str, str]] = []
        """(target, source) of every successful merge, for retries."""
        self.history: list[Op] = []
        """Every operation applied to the model, in order (to rebuild it)."""
        self.model: SegmentStore = MemoryStore()
        self.disk: SegmentStore = self._run(self._open())

    async def _open(self) -> DiskStore:
        return await DiskStore.open(
            self.path, fsync=FsyncPolicy.ALWAYS, checkpoint_wal_bytes=self.checkpoint_wal_bytes
        )

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

    def _outcome(self, coro: Coroutine[Any, Any, Any]) -> Outcome:
        outcome: Outcome = self._run(_attempt(coro))
        return outcome

    def _both(self, op: Op, *, record: bool = True) -> Outcome:
        """Run ``op`` on the model, then on the DiskStore; the outcomes must be equal."""
        expected = self._outcome(op(self.model))
        actual = self._outcome(op(self.disk))
        assert actual == expected, f"DiskStore gave {actual!r}, MemoryStore gave {expected!r}"
        if record:
            self.history.append(op)
        return expected

    def _replayed_model(self) -> MemoryStore:
        """A fresh model brought to the current state by replaying the history."""
        model = MemoryStore()
        for op in self.history:
            self._outcome(op(model))
        return model

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

    def _expected_length(self, name: str, choice: str | int | None) -> int | None:
        if choice == "length":
            return self._offset(name, ("length", 0))
        assert choice is None or isinstance(choice, int)
        return choice

    # ------------------------------------------------------------------ operations
    # Each op_* resolves its arguments against the model now and returns the
    # operation as a function of the store, so it can run on both stores, be
    # replayed, or be run concurrently.

    def op_create(self, name: str, kind: SegmentKind) -> Op:
        return lambda s: s.create_segment(name, kind=kind)

    def op_append(
        self,
        name: str,
        data: bytes,
        expected: tuple[str, int] | None = None,
        writer: tuple[UUID, int] | None = None,
    ) -> Op:
        expected_offset = None if expected is None else self._offset(name, expected)
        w = None if writer is None else WriterAppend(*writer)
        return lambda s: s.append(name, data, expected_offset=expected_offset, writer=w)

    def op_read(self, name: str, at: tuple[str, int], max_bytes: int) -> Op:
        offset = self._offset(name, at)
        return lambda s: s.read(name, offset, max_bytes)

    def op_info(self, name: str) -> Op:
        async def info(s: SegmentStore) -> SegmentInfo:
            return _info(await s.info(name))

        return info

    def op_seal(self, name: str) -> Op:
        return lambda s: s.seal(name)

    def op_truncate(self, name: str, at: tuple[str, int]) -> Op:
        offset = self._offset(name, at)
        return lambda s: s.truncate(name, offset)

    def op_delete(self, name: str) -> Op:
        return lambda s: s.delete(name)

    def op_update_attribute(
        self, name: str, attribute_id: UUID, new_value: int, expected: int | str
    ) -> Op:
        if expected == "current":
            info = self._model_info(name)
            attributes = {} if info is None else info.attributes
            expected = attributes.get(attribute_id, NULL_ATTRIBUTE_VALUE)
        assert isinstance(expected, int)
        value = expected
        return lambda s: s.update_attribute(name, attribute_id, new_value, value)

    def op_update_table(
        self,
        name: str,
        updates: list[tuple[bytes, bytes, int | str]],
        expected_length: str | int | None,
    ) -> Op:
        batch = [TableUpdate(k, v, self._version(name, k, c)) for k, v, c in updates]
        length = self._expected_length(name, expected_length)
        return lambda s: s.update_table(name, batch, expected_length=length)

    def op_remove_table_keys(
        self,
        name: str,
        keys: list[tuple[bytes, int | str]],
        expected_length: str | int | None,
    ) -> Op:
        batch = [TableKey(k, self._version(name, k, c)) for k, c in keys]
        length = self._expected_length(name, expected_length)
        return lambda s: s.remove_table_keys(name, batch, expected_length=length)

    def op_get_table_entries(self, name: str, keys: list[bytes]) -> Op:
        return lambda s: s.get_table_entries(name, keys)

    # ------------------------------------------------------------------ segments

    @initialize(missing=st.sets(name_st, max_size=2))
    def create_most(self, missing: set[str]) -> None:
        """Start with most names in use, so that most rules meet a segment of their kind."""
        for name in NAMES:
            if name not in missing:
                kind = SegmentKind.TABLE if name in TABLE_NAMES else SegmentKind.STREAM
                self._both(self.op_create(name, kind))

    @rule(name=stream_st, kind=kind_st)
    def create_segment(self, name: str, kind: SegmentKind) -> None:
        self._both(self.op_create(name, kind))

    @rule(name=stream_st, data=st.binary(min_size=1, max_size=24))
    def append(self, name: str, data: bytes) -> None:
        self._both(self.op_append(name, data))

    @rule(
        name=stream_st,
        data=st.binary(max_size=24),
        expected=st.none() | offset_st,
        writer=st.none() | writer_st,
    )
    def append_conditional(
        self,
        name: str,
        data: bytes,
        expected: tuple[str, int] | None,
        writer: tuple[UUID, int] | None,
    ) -> None:
        self._both(self.op_append(name, data, expected, writer))

    @rule(name=stream_st, at=offset_st, max_bytes=st.integers(0, 40))
    def read(self, name: str, at: tuple[str, int], max_bytes: int) -> None:
        self._both(self.op_read(name, at, max_bytes))

    @rule(name=stream_st, at=offset_st)
    def wait_for_data_now(self, name: str, at: tuple[str, int]) -> None:
        offset = self._offset(name, at)
        self._both(lambda s: s.wait_for_data(name, offset, 0))

    @rule(name=stream_st)
    def info(self, name: str) -> None:
        self._both(self.op_info(name))

    @rule(name=stream_st)
    def seal(self, name: str) -> None:
        self._both(self.op_seal(name))

    @rule(name=stream_st, at=offset_st)
    def truncate(self, name: str, at: tuple[str, int]) -> None:
        self._both(self.op_truncate(name, at))

    @rule(name=stream_st, recreate=st.booleans())
    def delete(self, name: str, recreate: bool) -> None:
        """Delete a segment of either kind, and maybe create it again, empty."""
        info = self._model_info(name)
        self._both(self.op_delete(name))
        if recreate and info is not None:
            self._both(self.op_create(name, info.kind))

    @rule(into=stream_st, source=stream_st)
    def merge(self, into: str, source: str) -> None:
        if self._both(lambda s: s.merge(into, source))[0] == "ok":
            self.merges.append((into, source))

    @precondition(lambda self: self.merges)
    @rule(data=st.data())
    def retry_merge(self, data: st.DataObject) -> None:
        """Repeat an earlier successful merge, as a client retrying after a lost reply
        (perhaps across a restart) would: it succeeds with the target's length."""
        into, source = data.draw(st.sampled_from(self.merges))
        self._both(lambda s: s.merge(into, source))

    @rule(name=stream_st, attribute_id=st.sampled_from(ATTRIBUTE_IDS))
    def get_attribute(self, name: str, attribute_id: UUID) -> None:
        self._both(lambda s: s.get_attribute(name, attribute_id))

    @rule(
        name=stream_st,
        attribute_id=st.sampled_from(ATTRIBUTE_IDS),
        new_value=attribute_value_st,
        expected=expected_attribute_st,
    )
    def update_attribute(
        self, name: str, attribute_id: UUID, new_value: int, expected: int | str
    ) -> None:
        self._both(self.op_update_attribute(name, attribute_id, new_value, expected))

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

    @rule(name=table_st, updates=updates_st, expected_length=expected_length_st)
    def update_table(
        self,
        name: str,
        updates: list[tuple[bytes, bytes, int | str]],
        expected_length: str | int | None,
    ) -> None:
        self._both(self.op_update_table(name, updates, expected_length))

    @rule(name=table_st, keys=removals_st, expected_length=expected_length_st)
    def remove_table_keys(
        self,
        name: str,
        keys: list[tuple[bytes, int | str]],
        expected_length: str | int | None,
    ) -> None:
        self._both(self.op_remove_table_keys(name, keys, expected_length))

    @rule(name=table_st, keys=st.lists(key_st, max_size=4))
    def get_table_entries(self, name: str, keys: list[bytes]) -> None:
        self._both(self.op_get_table_entries(name, keys))

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

    # ------------------------------------------------------------------ concurrency

    @rule(ops=st.lists(concurrent_op_st, min_size=2, max_size=4))
    def concurrently(self, ops: list[tuple[Any, ...]]) -> None:
        """Run a few operations at once on the DiskStore. Its outcomes, and the
        contents it ends with, must be those of the operations run one after
        another in some order (linearizability)."""
        built: list[Op] = [getattr(self, "op_" + op[0])(*op[1:]) for op in ops]

        async def run_all() -> list[Outcome]:
            return list(await asyncio.gather(*(_attempt(op(self.disk)) for op in built)))

        actual: list[Outcome] = self._run(run_all())
        contents = self._outcome(_snapshot(self.disk))
        for order in itertools.permutations(range(len(built))):  # issue order first
            model = self._replayed_model()
            outcomes: list[Outcome] = [()] * len(built)
            for i in order:
                outcomes[i] = self._outcome(built[i](model))
            if outcomes == actual and self._outcome(_snapshot(model)) == contents:
                self._run(self.model.close())
                self.model = model
                self.history.extend(built[i] for i in order)
                return
            self._run(model.close())
        raise AssertionError(f"no sequential order of {ops!r} gives DiskStore's {actual!r}")

    # ------------------------------------------------------------------ lifecycle

    @rule()
    def flush(self) -> None:
        self._both(lambda s: s.flush())

    @rule(checkpoint_wal_bytes=st.sampled_from([CHECKPOINT_WAL_BYTES, 1024, 1]))
    def reopen(self, checkpoint_wal_bytes: int) -> None:
        """Close the DiskStore and open it again from its directory, with checkpoints
        at the usual WAL size, or so small that they run during the following steps."""
        self._run(self.disk.close())
        self.checkpoint_wal_bytes = checkpoint_wal_bytes
        self.disk = self._run(self._open())

    @precondition(lambda self: self.checkpoint_wal_bytes == CHECKPOINT_WAL_BYTES)
    @rule()
    def recover_from_copy(self) -> None:
        """Open a copy of the data directory taken between two steps: what a crash
        at that moment leaves behind (everything acknowledged, nothing closed).
        Only while no background checkpoint can be changing files under the copy."""
        self.copies += 1
        copy = Path(self.tmp.name) / f"crash-{self.copies}"
        shutil.copytree(self.path, copy)
        self._run(self.disk.close())
        self.path = copy
        self.disk = self._run(self._open())

    @invariant()
    def contents_agree(self) -> None:
        self._both(_snapshot, record=False)


TestStoreMachine = pytest.mark.slow(StoreMachine.TestCase)
TestStoreMachine.settings = settings(
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
