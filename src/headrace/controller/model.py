"""The controller model: scopes, streams, epochs, transactions, over the store API.

Theory of operation
-------------------
All metadata lives in table segments of the store (layout in
``records.py`` and, for reader groups and subscribers, ``groups.py``) and is
mirrored in memory: ``ControllerModel.open`` loads the
tables once, and every change is written to its table first (a conditional
update against the version the mirror holds) and applied to the mirror after
the store acknowledged it. Reads never touch the tables. The model must
therefore be the only writer of ``_system/controller/*``; a version mismatch
means it is not, and surfaces as the store's ``TableKeyBadVersion``.

The model also does the segment work the real Pravega controller asks the
segment store for over the wire: it creates stream and transaction segments,
seals, merges and deletes them with direct store calls.

Crash safety: each operation orders its durable steps so that a restart can
finish or ignore a half-done operation:

* create stream / transaction: segments first (a leftover segment with the
  same name is an orphan and is replaced), then the record;
* seal stream and scale: the record first, then the seals; ``open`` re-seals
  what the record says is sealed;
* commit / abort: ``COMMITTING`` / ``ABORTING`` is recorded first, then the
  merges / seals (both idempotent), then the final state; ``open``
  finishes any transaction left in between;
* rolling commit (a transaction opened in an epoch that has ended, see
  ``records.py``): the stream record names the commit (``rolling``) first;
  then the copies of the segments are created (kept if they exist: they can
  only be this commit's), the transactions merged into them (a missing
  transaction segment was merged already) and the copies sealed; then the
  record gains the two epochs and loses ``rolling``, the old active segments
  are sealed and the transactions recorded ``COMMITTED``. ``open`` resumes a
  recorded rolling commit, and takes an older epoch's ``COMMITTING``
  transaction whose segments are all gone as committed (the record of its
  rolling commit was written, its own final state not yet). An aborted transaction's sealed
  segments are deleted by ``sweep`` once ``ABORTED_SEGMENT_GRACE_MS`` passed
  since the abort (deletion is idempotent; after a restart the sweep tries
  again for every aborted record it still holds);
* delete stream: segments first (missing ones are fine), then the record;
* create key-value table: its table segments first (one that exists already is
  kept: an earlier attempt's, or a table the client made without the
  controller), then the record; delete: segments first, then the record.

Concurrency: one asyncio lock per stream serialises changes to that stream
and its transactions; a membership lock serialises creating and deleting
scopes and streams. Both are held across store calls. A commit takes the
stream lock twice, once to record ``COMMITTING`` and once to commit every
transaction then ``COMMITTING``: commits that arrive together (a Spark job's
tasks) share one rolling commit instead of adding two epochs each.

Scaling never waits for transactions (as in Pravega): a transaction keeps
writing to its own segments after its parents were sealed, and its commit
rolls it into the current epoch.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from uuid import UUID, uuid4

from headrace.controller.errors import (
    GenerationMismatch,
    InvalidArgument,
    InvalidName,
    LeaseTooLarge,
    ReaderGroupMismatch,
    ReaderGroupNotFound,
    ScalePreconditionFailed,
    ScopeExists,
    ScopeNotEmpty,
    ScopeNotFound,
    SegmentNotInStream,
    StreamExists,
    StreamNotFound,
    StreamNotSealed,
    StreamSealed,
    SubscriberNotFound,
    TableExists,
    TableNotFound,
    TooMany,
    TxnNotFound,
    TxnNotOpen,
)
from headrace.controller.groups import (
    READER_GROUPS_TABLE,
    SUBSCRIBERS_TABLE,
    GroupRetention,
    ReaderGroupRecord,
    SubscriberRecord,
    decode_group,
    decode_subscriber,
    encode_group,
    encode_subscriber,
    group_key,
    scoped_name,
    split_subscriber_key,
    subscriber_key,
)
from headrace.controller.naming import (
    MAX_NAME_CHARS,
    MAX_SEGMENT_NUMBER,
    READER_GROUP_STREAM_PREFIX,
    TRANSIENT_INFIX,
    TxnId,
    is_valid_name,
    reader_group_stream,
    segment_id,
    segment_name,
    segment_number,
    transaction_segment_name,
)
from headrace.controller.records import (
    KVTABLES_TABLE,
    METADATA_TABLES,
    RETENTION_TABLE,
    SCOPES_TABLE,
    STREAMS_TABLE,
    TRANSACTIONS_TABLE,
    KeyValueTableConfig,
    KeyValueTableRecord,
    RetentionCut,
    RetentionPolicy,
    RetentionType,
    RollingTxn,
    ScalingPolicy,
    ScalingType,
    ScopeRecord,
    SegmentRecord,
    StreamConfig,
    StreamRecord,
    StreamState,
    TxnRecord,
    TxnState,
    cut_key,
    decode_cut,
    decode_kvtable,
    decode_scope,
    decode_stream,
    decode_txn,
    encode_cut,
    encode_kvtable,
    encode_scope,
    encode_stream,
    encode_txn,
    stream_key,
    txn_key,
)
from headrace.controller.watermarks import (
    WRITER_TIMEOUT_MS,
    MarkResult,
    WriterMarks,
    event_frame,
    mark_stream,
)
from headrace.errors import SegmentExists, SegmentNotFound
from headrace.protocols.pravega.controller import INT64_MAX, kvtable_segment_name
from headrace.store.api import MAX_TABLE_KEY_BYTES, SegmentStore, offset_at_time
from headrace.types import NOT_EXISTS, TableKey, TableUpdate

__all__ = [
    "ABORTED_SEGMENT_GRACE_MS",
    "AUTO_SCALE_COLD_SAMPLES",
    "AUTO_SCALE_HOT_SAMPLES",
    "COMPLETED_TXN_KEEP_MS",
    "LEASE_SLACK_FACTOR",
    "MAX_GROUP_STREAMS",
    "MAX_KEY_VALUE_TABLES",
    "MAX_OPEN_TXNS_PER_STREAM",
    "MAX_READER_GROUPS",
    "MAX_RETENTION_CUTS",
    "MAX_SCOPES",
    "MAX_SEGMENTS_PER_EPOCH",
    "MAX_STREAMS",
    "MAX_TABLE_PARTITIONS",
    "MAX_TAGS",
    "MAX_TAG_CHARS",
    "MAX_TXN_LEASE_MS",
    "ROLLING_COMMIT_WINDOW_S",
    "TRANSIENT_SEGMENT_MAX_IDLE_MS",
    "ControllerModel",
    "HeadSegment",
    "Successor",
    "SweepResult",
]

log = logging.getLogger(__name__)

MAX_SCOPES = 10_000
"""Scopes are held in memory and listed by sorting; ten thousand is far beyond use."""

MAX_STREAMS = 100_000
"""Streams (all scopes together) held in memory; each costs one small record."""

MAX_KEY_VALUE_TABLES = 10_000
"""Key-value tables (all scopes together) held in memory; each costs one small
record and ``partitionCount`` table segments."""

MAX_TABLE_PARTITIONS = 1_000
"""Partitions (table segments) of one key-value table: a client opens a
connection per partition, as a writer does per segment of an epoch."""

MAX_SEGMENTS_PER_EPOCH = 1_000
"""Segments one epoch may have: every writer opens a connection per segment,
and every transaction creates one segment per active segment."""

MAX_TAGS = 128
"""Tags per stream, Java's limit (``StreamConfiguration`` allows 128)."""

MAX_TAG_CHARS = 256
"""Characters per tag, Java's limit."""

MAX_OPEN_TXNS_PER_STREAM = 1_000
"""Open transactions per stream: each holds one store segment per parent segment."""

MAX_TXN_LEASE_MS = 600_000
"""Longest lease a transaction may ask for (Java's default maximum, 10 minutes).
The Python client asks for 90 s."""

LEASE_SLACK_FACTOR = 2
"""An open transaction is aborted only when ``LEASE_SLACK_FACTOR`` leases passed
without a ping: the Rust pinger sleeps a full lease between rounds."""

ABORTED_SEGMENT_GRACE_MS = 60_000
"""How long an aborted transaction's segments stay, sealed, before ``sweep``
deletes them (Java also deletes them asynchronously). A transaction writer
whose ``SetupAppend`` or append races the abort gets ``SegmentIsSealed``,
which the client handles; ``NoSuchSegment`` would send the Rust writer into a
retry loop that ends in a panic ("must have connection"). A minute is twice
the client's 30 s request timeout, so a late request has been answered or
abandoned by then. Must stay below ``COMPLETED_TXN_KEEP_MS``."""

TRANSIENT_SEGMENT_MAX_IDLE_MS = 600_000
"""A transient segment (``<parent>#transient.…``, a large event on its way)
that has not changed for this long is deleted by ``sweep``: its writer died
before the merge. A live writer fills one in a few appends and merges it at
once; ten minutes is far above twenty client request timeouts."""

COMPLETED_TXN_KEEP_MS = 3_600_000
"""How long a committed or aborted transaction's record is kept so that late
pings and state checks still get COMMITTED/ABORTED (an hour)."""

MAX_RETENTION_CUTS = 100
"""Retention cuts kept per stream; past this the older half is thinned to every
other cut, so the history stays covered at a coarser grain."""

RETENTION_CUTS_PER_WINDOW = 20
"""Cuts recorded per time-retention window: truncation lands within 5 % of the
asked-for age."""

AUTO_SCALE_HOT_SAMPLES = 3
"""Consecutive samples above the target rate before a segment is split: a burst
is not a trend (with the 10 s default period, 30 s of sustained load)."""

AUTO_SCALE_COLD_SAMPLES = 30
"""Consecutive samples under half the target before two neighbours merge: merging
is cheap to get wrong and slow to undo, so it waits longer (5 minutes)."""

ROLLING_COMMIT_WINDOW_S = 0.2
"""How long a commit that must roll waits for other commits of the same stream
before it starts: each rolling commit adds two epochs and copies every segment
of two epochs, so the commits a Spark driver sends together for a batch's
tasks should share one. A rolling commit happens at most once per older epoch
that still has transactions; a fifth of a second on it is nothing next to a
transaction's lease."""

MAX_READER_GROUPS = 10_000
"""Reader groups (all scopes together) held in memory; each also owns a
one-segment state stream, which counts against ``MAX_STREAMS``."""

MAX_GROUP_STREAMS = 1_000
"""Streams one reader group may read: each is a stream cut in the group's
record and, for a subscribing group, one subscriber record to write."""

TABLE_PAGE_COUNT = 1_000
"""Entries read per page while loading the metadata tables."""

StreamKey = tuple[str, str]


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclasses.dataclass(frozen=True, slots=True)
class HeadSegment:
    """A segment of a stream cut with the offset to read it from."""

    segment: SegmentRecord
    offset: int


@dataclasses.dataclass(frozen=True, slots=True)
class Successor:
    """A successor of a sealed segment and the ids of all its predecessors."""

    segment: SegmentRecord
    predecessors: tuple[int, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class _Load:
    """One load sample of a segment (memory only: a restart starts sampling anew)."""

    time_ms: int
    length: int
    writers: Mapping[UUID, int]
    rate: float
    hot: int
    cold: int


@dataclasses.dataclass(frozen=True, slots=True)
class SweepResult:
    aborted: int
    purged: int
    aborted_segments_deleted: int = 0
    """Aborted transactions whose segments were deleted after the grace period."""
    transients_deleted: int = 0
    """Abandoned transient segments deleted."""


class ControllerModel:
    """Controller metadata and its segment work over one ``SegmentStore``.

    Build it with ``await ControllerModel.open(store)``.

    Args:
        store: the store holding both the metadata tables and the segments.
        clock_ms: wall clock in milliseconds (tests pass a fake).
    """

    def __init__(self, store: SegmentStore, *, clock_ms: Callable[[], int] = wall_clock_ms) -> None:
        self._store = store
        self._clock_ms = clock_ms
        self._scopes: dict[str, tuple[ScopeRecord, int]] = {}
        self._streams: dict[StreamKey, tuple[StreamRecord, int]] = {}
        self._txns: dict[StreamKey, dict[TxnId, tuple[TxnRecord, int]]] = {}
        self._deadlines: dict[tuple[str, str, TxnId], int] = {}
        # Aborted transactions whose segments the sweep deleted since ``open``
        # (not persisted: after a restart the sweep deletes again, idempotently).
        self._cleaned: set[tuple[str, str, TxnId]] = set()
        self._cuts: dict[StreamKey, list[tuple[RetentionCut, int]]] = {}
        self._kvtables: dict[StreamKey, tuple[KeyValueTableRecord, int]] = {}
        self._loads: dict[StreamKey, dict[int, _Load]] = {}
        self._groups: dict[tuple[str, str], tuple[ReaderGroupRecord, int]] = {}
        self._subscribers: dict[StreamKey, dict[str, tuple[SubscriberRecord, int]]] = {}
        self._membership = asyncio.Lock()
        self._stream_locks: dict[StreamKey, asyncio.Lock] = {}
        self.rolling_commit_window_s = ROLLING_COMMIT_WINDOW_S
        """How long a commit that must roll waits for others (tests that scale
        and commit in a loop set 0: a yield then gathers what is scheduled)."""
        self.watermarks = WriterMarks()
        """Pravega writers' time marks (``controller/watermarks.py``); kept in
        memory: writers note their time again at every flush."""

    @classmethod
    async def open(
        cls, store: SegmentStore, *, clock_ms: Callable[[], int] = wall_clock_ms
    ) -> ControllerModel:
        """Load the metadata tables (creating them on first use) and finish any
        operation a crash interrupted."""
        model = cls(store, clock_ms=clock_ms)
        await model._load()
        await model._repair()
        return model

    async def refresh(self) -> None:
        """Bring the mirror up to date with the tables. The only writer's mirror
        always is; a cluster follower's reloads (``cluster/metadata.py``). A door
        calls it before it answers that something does not exist."""

    # ------------------------------------------------------------------ scopes

    async def create_scope(self, scope: str) -> None:
        """Raises: InvalidName, ScopeExists, TooMany."""
        if not is_valid_name(scope):
            raise InvalidName("scope", scope)
        async with self._membership:
            if scope in self._scopes:
                raise ScopeExists(scope)
            if len(self._scopes) >= MAX_SCOPES:
                raise TooMany("scopes", MAX_SCOPES)
            rec = ScopeRecord(created_ms=self._clock_ms())
            version = await self._put(SCOPES_TABLE, scope.encode(), encode_scope(rec), None)
            self._scopes[scope] = (rec, version)

    async def delete_scope(self, scope: str) -> None:
        """Raises: ScopeNotFound, ScopeNotEmpty (streams remain)."""
        async with self._membership:
            entry = self._scopes.get(scope)
            if entry is None:
                raise ScopeNotFound(scope)
            if any(key[0] == scope for key in (*self._streams, *self._kvtables)):
                raise ScopeNotEmpty(scope)
            await self._remove(SCOPES_TABLE, scope.encode(), entry[1])
            del self._scopes[scope]

    def scope_exists(self, scope: str) -> bool:
        return scope in self._scopes

    def list_scopes(self, *, after: str = "", limit: int) -> list[str]:
        """Scope names in order, the first ``limit`` of those sorting after ``after``."""
        return _page(self._scopes, after, limit)

    # ------------------------------------------------------------------ streams

    async def create_stream(self, scope: str, stream: str, config: StreamConfig) -> None:
        """Create a stream with ``min_num_segments`` segments in epoch 0, ids 0..n-1,
        key ranges ``[i/n, (i+1)/n)``. Auto-scaling policies are recorded; the
        segment count changes only by ``scale`` or ``update_stream``.

        Raises:
            InvalidName, InvalidArgument, ScopeNotFound, StreamExists, TooMany.
        """
        if not is_valid_name(stream):
            raise InvalidName("stream", stream)
        async with self._membership:
            await self._create_stream(scope, stream, _checked_config(config))

    async def _create_stream(self, scope: str, stream: str, config: StreamConfig) -> None:
        """``create_stream`` with the membership lock held and the name and
        configuration checked (internal streams come here directly)."""
        count = config.scaling.min_num_segments
        if scope not in self._scopes:
            raise ScopeNotFound(scope)
        if (scope, stream) in self._streams:
            raise StreamExists(scope, stream)
        if len(self._streams) >= MAX_STREAMS:
            raise TooMany("streams", MAX_STREAMS)
        segments = tuple(
            SegmentRecord(i, 0, i / count, 1.0 if i == count - 1 else (i + 1) / count)
            for i in range(count)
        )
        for seg in segments:
            await self._create_fresh_segment(segment_name(scope, stream, seg.id))
        now = self._clock_ms()
        rec = StreamRecord(
            scope=scope,
            stream=stream,
            created_ms=now,
            config=config,
            state=StreamState.ACTIVE,
            epoch=0,
            next_number=count,
            segments=segments,
            epoch_times_ms=(now,),
        )
        version = await self._put(STREAMS_TABLE, stream_key(scope, stream), encode_stream(rec))
        self._streams[(scope, stream)] = (rec, version)

    async def update_stream(self, scope: str, stream: str, config: StreamConfig) -> None:
        """Replace the stream's configuration (scaling policy, retention, tags).

        Like Java, a fixed policy with another segment count, or a minimum above
        the active count, rescales the stream to equal key ranges.

        Raises: InvalidArgument, ScopeNotFound, StreamNotFound.
        """
        config = _checked_config(config)
        async with self._stream_lock(scope, stream):
            rec = self._stream(scope, stream)
            rec = await self._save_stream(dataclasses.replace(rec, config=config))
            # As Java's UpdateStreamTask does: a fixed policy whose count differs
            # from the active segment count, or any policy whose minimum is above
            # it, rescales the stream to that many equal key ranges (open
            # transactions commit by rolling afterwards).
            target = config.scaling.min_num_segments
            active = rec.active_segments()
            fixed = config.scaling.scale_type is ScalingType.FIXED_NUM_SEGMENTS
            rescale = len(active) != target if fixed else len(active) < target
            if rec.state is StreamState.ACTIVE and rescale:
                ranges = [
                    (i / target, 1.0 if i == target - 1 else (i + 1) / target)
                    for i in range(target)
                ]
                await self._scale(rec, [seg.id for seg in active], ranges)

    def stream_config(self, scope: str, stream: str) -> StreamConfig:
        """Raises: ScopeNotFound, StreamNotFound."""
        return self._stream(scope, stream).config

    def stream_exists(self, scope: str, stream: str) -> bool:
        return (scope, stream) in self._streams

    def is_sealed(self, scope: str, stream: str) -> bool:
        return self._stream(scope, stream).state is StreamState.SEALED

    def list_streams(
        self, scope: str, *, after: str = "", limit: int, tag: str | None = None
    ) -> list[str]:
        """Stream names of ``scope`` in order (only those with ``tag`` if given).

        Raises: ScopeNotFound.
        """
        if scope not in self._scopes:
            raise ScopeNotFound(scope)
        names = {
            st: None
            for (sc, st), (rec, _) in self._streams.items()
            if sc == scope and (tag is None or tag in rec.config.tags)
        }
        return _page(names, after, limit)

    async def seal_stream(self, scope: str, stream: str) -> None:
        """Seal every active segment; open transactions are aborted first and
        committing ones finished. Idempotent. Afterwards there are no current
        segments and no successors.

        Raises: ScopeNotFound, StreamNotFound.
        """
        async with self._stream_lock(scope, stream):
            rec = self._stream(scope, stream)
            for txn_rec, _ in list(self._txns.get((scope, stream), {}).values()):
                if txn_rec.state is TxnState.OPEN:
                    await self._abort(rec, txn_rec)
            if rec.state is not StreamState.SEALED:
                rec = await self._commit_pending(rec)
            active = rec.active_segments()
            if rec.state is not StreamState.SEALED:
                await self._save_stream(dataclasses.replace(rec, state=StreamState.SEALED))
            for seg in active:
                await self._seal_segment(segment_name(scope, stream, seg.id))

    async def delete_stream(self, scope: str, stream: str) -> None:
        """Delete a sealed stream, its segments and its transactions.

        Raises: StreamNotFound, StreamNotSealed.
        """
        async with self._membership, self._stream_lock(scope, stream):
            entry = self._streams.get((scope, stream))
            if entry is None:
                raise StreamNotFound(scope, stream)
            rec, version = entry
            if rec.state is not StreamState.SEALED:
                raise StreamNotSealed(scope, stream)
            txns = self._txns.get((scope, stream), {})
            for txn_rec, txn_version in list(txns.values()):
                if txn_rec.state is not TxnState.COMMITTED:
                    await self._delete_txn_segments(rec, txn_rec)
                self._cleaned.discard((scope, stream, txn_rec.txn))
                await self._remove(
                    TRANSACTIONS_TABLE, txn_key(scope, stream, txn_rec.txn), txn_version
                )
                self._deadlines.pop((scope, stream, txn_rec.txn), None)
            for seg in rec.segments:
                await self._delete_segment(segment_name(scope, stream, seg.id))
            await self._drop_cuts(scope, stream, lambda _: True)
            await self._drop_subscribers(scope, stream, lambda _: True)
            await self._remove(STREAMS_TABLE, stream_key(scope, stream), version)
            del self._streams[(scope, stream)]
            self._txns.pop((scope, stream), None)
            self._stream_locks.pop((scope, stream), None)

    # ------------------------------------------------------------------ key-value tables

    async def create_kvtable(self, scope: str, table: str, config: KeyValueTableConfig) -> None:
        """Create a key-value table: ``partition_count`` table segments, partition
        ``n`` owning the key range ``[n/count, (n+1)/count)``.

        Raises:
            InvalidName, InvalidArgument (a shape Java refuses), ScopeNotFound,
            TableExists, TooMany.
        """
        if not is_valid_name(table):
            raise InvalidName("key-value table", table)
        _check_kvtable_config(config)
        async with self._membership:
            if scope not in self._scopes:
                raise ScopeNotFound(scope)
            if (scope, table) in self._kvtables:
                raise TableExists(scope, table)
            if len(self._kvtables) >= MAX_KEY_VALUE_TABLES:
                raise TooMany("key-value tables", MAX_KEY_VALUE_TABLES)
            for n in range(config.partition_count):
                with contextlib.suppress(SegmentExists):
                    await self._store.create_table(kvtable_segment_name(scope, table, n))
            rec = KeyValueTableRecord(created_ms=self._clock_ms(), config=config)
            version = await self._put(KVTABLES_TABLE, stream_key(scope, table), encode_kvtable(rec))
            self._kvtables[(scope, table)] = (rec, version)

    async def delete_kvtable(self, scope: str, table: str) -> None:
        """Delete a key-value table and its data.

        Raises: TableNotFound.
        """
        async with self._membership:
            entry = self._kvtables.get((scope, table))
            if entry is None:
                raise TableNotFound(scope, table)
            rec, version = entry
            for n in range(rec.config.partition_count):
                with contextlib.suppress(SegmentNotFound):
                    await self._store.delete(kvtable_segment_name(scope, table, n))
            await self._remove(KVTABLES_TABLE, stream_key(scope, table), version)
            del self._kvtables[(scope, table)]

    def kvtable_config(self, scope: str, table: str) -> KeyValueTableConfig:
        """Raises: ScopeNotFound, TableNotFound."""
        return self._kvtable(scope, table).config

    def kvtable_partitions(self, scope: str, table: str) -> list[SegmentRecord]:
        """The table's partitions as epoch-0 segments of its pseudo-stream, by key range.

        Raises: ScopeNotFound, TableNotFound.
        """
        count = self._kvtable(scope, table).config.partition_count
        return [
            SegmentRecord(n, 0, n / count, 1.0 if n == count - 1 else (n + 1) / count)
            for n in range(count)
        ]

    def list_kvtables(self, scope: str, *, after: str = "", limit: int) -> list[str]:
        """Key-value table names of ``scope`` in order.

        Raises: ScopeNotFound.
        """
        if scope not in self._scopes:
            raise ScopeNotFound(scope)
        return _page((t for s, t in self._kvtables if s == scope), after, limit)

    def _kvtable(self, scope: str, table: str) -> KeyValueTableRecord:
        entry = self._kvtables.get((scope, table))
        if entry is None:
            if scope not in self._scopes:
                raise ScopeNotFound(scope)
            raise TableNotFound(scope, table)
        return entry[0]

    # ------------------------------------------------------------------ segments

    def current_segments(self, scope: str, stream: str) -> list[SegmentRecord]:
        """The active segments by key range; empty once the stream is sealed.

        Raises: ScopeNotFound, StreamNotFound.
        """
        return self._stream(scope, stream).active_segments()

    def epoch_segments(self, scope: str, stream: str, epoch: int) -> list[SegmentRecord]:
        """The segments of ``epoch`` (also after sealing).

        Raises: ScopeNotFound, StreamNotFound, InvalidArgument (no such epoch).
        """
        rec = self._stream(scope, stream)
        if not 0 <= epoch <= rec.epoch:
            raise InvalidArgument(f"stream {scope}/{stream} has no epoch {epoch}")
        return rec.epoch_segments(epoch)

    def current_epoch(self, scope: str, stream: str) -> int:
        return self._stream(scope, stream).epoch

    async def head_segments(self, scope: str, stream: str) -> list[HeadSegment]:
        """Where reading from the head starts: the truncation cut if there is one,
        else epoch 0; each offset raised to the segment's start offset in the store.

        Raises: ScopeNotFound, StreamNotFound.
        """
        rec = self._stream(scope, stream)
        if rec.head_cut:
            cut = [(rec.segment(sid), off) for sid, off in rec.head_cut.items()]
            pairs = sorted(
                ((seg, off) for seg, off in cut if seg is not None), key=lambda p: p[0].min_key
            )
        else:
            pairs = [(seg, 0) for seg in rec.epoch_segments(0)]
        return [
            HeadSegment(seg, await self._start_offset(scope, stream, seg, off))
            for seg, off in pairs
        ]

    async def segments_at(self, scope: str, stream: str, timestamp_ms: int) -> list[HeadSegment]:
        """The segments of the epoch that was current at ``timestamp_ms`` (the head
        for ``timestamp_ms <= 0`` or for a time before the head cut), each at the
        first event appended at or after ``timestamp_ms`` (its time index;
        ``store.api.TimeIndexed``), or at its start where the store keeps none.

        Raises: ScopeNotFound, StreamNotFound.
        """
        rec = self._stream(scope, stream)
        if timestamp_ms <= 0:
            return await self.head_segments(scope, stream)
        epoch = 0
        for e, began in enumerate(rec.epoch_times_ms):
            if began <= timestamp_ms:
                epoch = e
        segs = rec.epoch_segments(epoch)
        if rec.head_cut and any(_before_cut(rec, seg, rec.head_cut) for seg in segs):
            return await self.head_segments(scope, stream)
        return [
            HeadSegment(
                seg,
                await self._offset_at(
                    scope,
                    stream,
                    seg,
                    await self._start_offset(scope, stream, seg, rec.head_cut.get(seg.id, 0)),
                    timestamp_ms,
                ),
            )
            for seg in segs
        ]

    # ------------------------------------------------------------------ watermarks

    def note_writer_time(
        self, scope: str, stream: str, writer: str, time_ms: int, position: Mapping[int, int]
    ) -> int:
        """Record a Pravega writer's time mark; a ``MarkResult`` status (a
        position naming a segment of another stream is ``INVALID_POSITION``).

        Raises: ScopeNotFound, StreamNotFound.
        """
        rec = self._stream(scope, stream)
        if any(rec.segment(sid) is None or off < 0 for sid, off in position.items()):
            return MarkResult.INVALID_POSITION
        return self.watermarks.note(scope, stream, writer, time_ms, position, self._clock_ms())

    def remove_writer(self, scope: str, stream: str, writer: str) -> bool:
        """Forget a writer's mark; whether it had one. Raises: StreamNotFound."""
        self._stream(scope, stream)
        return self.watermarks.remove(scope, stream, writer)

    async def emit_watermarks(self) -> int:
        """Append each stream's next watermark to its ``_MARK`` stream (created
        at the first one); how many were appended."""
        emitted = 0
        now = self._clock_ms()
        for scope, stream in list(self.watermarks.marks):
            entry = self._streams.get((scope, stream))
            if entry is None:
                self.watermarks.forget_stream(scope, stream)
                continue
            rec = entry[0]
            ranges = {seg.id: (seg.min_key, seg.max_key) for seg in rec.segments}
            after = {
                seg.id: [s.segment.id for s in self.successors(scope, stream, seg.id)]
                for seg in rec.segments
                if seg.sealed_epoch is not None
            }
            mark = self.watermarks.next_watermark(
                scope, stream, now, WRITER_TIMEOUT_MS, ranges, after
            )
            if mark is None:
                continue
            target = mark_stream(stream)
            async with self._membership:
                if (scope, target) not in self._streams:
                    await self._create_stream(scope, target, _checked_config(StreamConfig()))
            await self._store.append(segment_name(scope, target, 0), event_frame(mark))
            emitted += 1
        return emitted

    async def _offset_at(
        self, scope: str, stream: str, seg: SegmentRecord, start: int, timestamp_ms: int
    ) -> int:
        try:
            found = await offset_at_time(
                self._store, segment_name(scope, stream, seg.id), timestamp_ms
            )
        except SegmentNotFound:
            return start
        return start if found is None else max(start, found)

    def successors(self, scope: str, stream: str, sid: int) -> list[Successor]:
        """The segments that replaced ``sid`` in a scale, each with all its
        predecessors; empty for an active segment and for the last segments of a
        sealed stream.

        Raises: ScopeNotFound, StreamNotFound, SegmentNotInStream.
        """
        rec = self._stream(scope, stream)
        seg = rec.segment(sid)
        if seg is None:
            raise SegmentNotInStream(scope, stream, sid)
        if seg.sealed_epoch is None:
            return []
        epoch = seg.sealed_epoch
        result = []
        for succ in rec.segments:
            if succ.created_epoch == epoch and succ.overlaps(seg):
                preds = tuple(
                    p.id for p in rec.segments if p.sealed_epoch == epoch and p.overlaps(succ)
                )
                result.append(Successor(succ, preds))
        return sorted(result, key=lambda s: s.segment.min_key)

    def is_segment_open(self, scope: str, stream: str, sid: int) -> bool:
        """Whether ``sid`` is one of the stream's active segments (False for unknown
        streams and segments)."""
        entry = self._streams.get((scope, stream))
        if entry is None:
            return False
        return any(seg.id == sid for seg in entry[0].active_segments())

    def is_stream_cut_valid(self, scope: str, stream: str, cut: Mapping[int, int]) -> bool:
        """A cut is valid when its segments belong to the stream, their key ranges
        partition [0, 1), and its offsets are not negative."""
        entry = self._streams.get((scope, stream))
        if entry is None:
            return False
        return _cut_segments(entry[0], cut) is not None

    def segments_between(
        self, scope: str, stream: str, from_cut: Mapping[int, int], to_cut: Mapping[int, int]
    ) -> list[SegmentRecord]:
        """Segments from ``from_cut`` (empty: the head) up to ``to_cut`` (empty: the tail).

        Raises: ScopeNotFound, StreamNotFound, InvalidArgument (an invalid cut).
        """
        rec = self._stream(scope, stream)
        start = dict(from_cut) or dict(rec.head_cut)
        for cut in (start, to_cut):
            if cut and _cut_segments(rec, cut) is None:
                raise InvalidArgument(f"not a valid stream cut of {scope}/{stream}")
        return sorted(
            (
                seg
                for seg in rec.segments
                if not (start and _before_cut(rec, seg, start))
                and not (to_cut and _after_cut(rec, seg, to_cut))
            ),
            key=lambda s: (s.created_epoch, s.min_key),
        )

    async def scale(
        self,
        scope: str,
        stream: str,
        sealed: Sequence[int],
        new_ranges: Sequence[tuple[float, float]],
    ) -> tuple[int, list[SegmentRecord]]:
        """Replace the ``sealed`` active segments by new ones with ``new_ranges``,
        which must cover exactly the same keys. Runs to completion; returns the
        epoch the scale started from and the new segments.

        Open transactions do not stop a scale: their commit rolls them into
        the current epoch (``commit_txn``).

        Raises:
            ScopeNotFound, StreamNotFound, ScalePreconditionFailed (sealed stream,
            segments not active, ranges that do not fit), TooMany.
        """
        async with self._stream_lock(scope, stream):
            return await self._scale(self._stream(scope, stream), sealed, new_ranges)

    async def _scale(
        self,
        rec: StreamRecord,
        sealed: Sequence[int],
        new_ranges: Sequence[tuple[float, float]],
    ) -> tuple[int, list[SegmentRecord]]:
        """``scale`` with the stream lock held."""
        scope, stream = rec.scope, rec.stream
        if rec.state is StreamState.SEALED:
            raise ScalePreconditionFailed(f"stream {scope}/{stream} is sealed")
        active = {seg.id: seg for seg in rec.active_segments()}
        if not sealed or len(set(sealed)) != len(sealed) or any(s not in active for s in sealed):
            raise ScalePreconditionFailed("the segments to seal must be distinct active segments")
        old = sorted((active[s] for s in sealed), key=lambda s: s.min_key)
        ranges = sorted(new_ranges)
        if not _ranges_replace(old, ranges):
            raise ScalePreconditionFailed(
                "the new key ranges must be contiguous and cover exactly the sealed segments"
            )
        if len(active) - len(old) + len(ranges) > MAX_SEGMENTS_PER_EPOCH:
            raise TooMany("segments in an epoch", MAX_SEGMENTS_PER_EPOCH)
        epoch = rec.epoch + 1
        if epoch > MAX_SEGMENT_NUMBER or rec.next_number + len(ranges) > MAX_SEGMENT_NUMBER:
            raise TooMany("epochs or segment numbers", MAX_SEGMENT_NUMBER)
        new = [
            SegmentRecord(rec.next_number + i, epoch, lo, hi) for i, (lo, hi) in enumerate(ranges)
        ]
        for seg in new:
            await self._create_fresh_segment(segment_name(scope, stream, seg.id))
        sealed_ids = {seg.id for seg in old}
        segments = tuple(
            dataclasses.replace(seg, sealed_epoch=epoch) if seg.id in sealed_ids else seg
            for seg in rec.segments
        ) + tuple(new)
        await self._save_stream(
            dataclasses.replace(
                rec,
                epoch=epoch,
                next_number=rec.next_number + len(new),
                segments=segments,
                epoch_times_ms=(*rec.epoch_times_ms, self._clock_ms()),
            )
        )
        for seg in old:
            await self._seal_segment(segment_name(scope, stream, seg.id))
        return rec.epoch, new

    async def truncate_stream(self, scope: str, stream: str, cut: Mapping[int, int]) -> None:
        """Truncate the stream at ``cut``: segments in the cut get their start offset
        moved to the cut's offset, segments wholly before it are deleted.

        Raises: ScopeNotFound, StreamNotFound, InvalidArgument (invalid cut, or an
        offset beyond a segment's length).
        """
        async with self._stream_lock(scope, stream):
            rec = self._stream(scope, stream)
            if _cut_segments(rec, cut) is None:
                raise InvalidArgument(f"not a valid stream cut of {scope}/{stream}")
            for sid, off in cut.items():
                try:
                    info = await self._store.info(segment_name(scope, stream, sid))
                except SegmentNotFound:
                    raise InvalidArgument(f"segment {sid} of {scope}/{stream} is gone") from None
                if off > info.length:
                    raise InvalidArgument(f"offset {off} is beyond segment {sid}'s length")
            rec = await self._truncate(rec, cut)
            await self._drop_cuts(scope, stream, lambda c: not _ahead(rec, c.cut))

    async def enforce_retention(self) -> int:
        """Apply every stream's retention policy once; returns how many streams
        were truncated. Run periodically.

        For each stream with a policy, the active segments' lengths are recorded
        as a retention cut (time retention: at most ``RETENTION_CUTS_PER_WINDOW``
        per window), then the stream is truncated at the newest recorded cut that
        still keeps the policy's minimum: ``retentionParam`` bytes after it
        (SIZE) or a cut at least ``retentionParam`` ms old (TIME). Truncation
        only happens at recorded cuts, which are event boundaries, so it never
        splits an event; a stream may hold somewhat more than the minimum.
        A stream with subscribers is truncated no further than they are, within
        ``retentionMax`` (``_retain_for_subscribers``).
        """
        truncated = 0
        for key in list(self._streams):
            entry = self._streams.get(key)
            if entry is None or entry[0].config.retention.retention_type is RetentionType.UNKNOWN:
                continue
            async with self._stream_lock(*key):
                entry = self._streams.get(key)
                if entry is not None and await self._apply_retention(entry[0]):
                    truncated += 1
        return truncated

    def retention_cuts(self, scope: str, stream: str) -> list[RetentionCut]:
        """The recorded retention cuts, oldest first (for tests and tools)."""
        return [c for c, _ in self._cuts.get((scope, stream), [])]

    # ------------------------------------------------------------------ reader groups

    async def create_reader_group(self, template: ReaderGroupRecord) -> ReaderGroupRecord:
        """Create reader group ``template.group`` in ``template.scope`` as Java's
        ``createReaderGroup`` does: its state stream ``_RG<group>`` (one fixed
        segment), a subscriber record on every stream it reads when its
        retention type is not NONE, then its record at generation 0 with
        ``template.group_id`` (a new UUID when empty). A group that exists
        already is returned as it is (the call is idempotent).

        A subscriber's first stream cut is the group's starting cut (the
        stream's head when unbounded), so retention keeps what the group has
        yet to read from the moment it exists.

        Raises:
            InvalidName, ScopeNotFound, StreamNotFound (a stream it reads),
            InvalidArgument (no streams, an invalid cut), TooMany.
        """
        scope, group = template.scope, template.group
        if not is_valid_name(group) or len(reader_group_stream(group)) > MAX_NAME_CHARS:
            raise InvalidName("reader group", group)
        async with self._membership:
            if scope not in self._scopes:
                raise ScopeNotFound(scope)
            entry = self._groups.get((scope, group))
            if entry is not None:
                return entry[0]
            if len(self._groups) >= MAX_READER_GROUPS:
                raise TooMany("reader groups", MAX_READER_GROUPS)
            self._check_group_cuts(template)
            rec = dataclasses.replace(
                template,
                group_id=template.group_id or str(uuid4()),
                generation=0,
                created_ms=self._clock_ms(),
            )
            state = (scope, reader_group_stream(group))
            if state not in self._streams:
                await self._create_stream(scope, state[1], _GROUP_STREAM_CONFIG)
            await self._subscribe(rec)
            key = group_key(scope, group)
            version = await self._put(READER_GROUPS_TABLE, key, encode_group(rec))
            self._groups[(scope, group)] = (rec, version)
            return rec

    def reader_group(self, scope: str, group: str) -> ReaderGroupRecord:
        """Raises: ReaderGroupNotFound."""
        entry = self._groups.get((scope, group))
        if entry is None:
            raise ReaderGroupNotFound(scope, group)
        return entry[0]

    async def update_reader_group(self, new: ReaderGroupRecord) -> int:
        """Replace a group's configuration; returns its new generation.

        ``new.generation`` and ``new.group_id`` must be the group's (Java
        answers INVALID_CONFIG otherwise). Streams it no longer reads, or all
        of them when it stops subscribing, lose its subscriber record; streams
        it starts reading as a subscriber get one (from their starting cut);
        the others keep their cut under the new generation.

        Raises:
            ReaderGroupNotFound, ReaderGroupMismatch, StreamNotFound,
            InvalidArgument, TooMany.
        """
        scope, group = new.scope, new.group
        async with self._membership:
            old = self.reader_group(scope, group)
            if new.generation != old.generation:
                raise ReaderGroupMismatch(
                    scope, group, f"generation {new.generation} is not {old.generation}"
                )
            if new.group_id != old.group_id:
                raise ReaderGroupMismatch(scope, group, f"id {new.group_id!r} is not the group's")
            self._check_group_cuts(new)
            rec = dataclasses.replace(new, generation=old.generation + 1, created_ms=old.created_ms)
            keep = set(rec.start_cuts) if rec.retention is not GroupRetention.NONE else set()
            name = scoped_name(scope, group)
            for stream_name in old.start_cuts:
                if stream_name not in keep:
                    sc, st = stream_name.split("/", 1)
                    async with self._stream_lock(sc, st):
                        await self._drop_subscribers(sc, st, lambda sub: sub.subscriber == name)
            await self._subscribe(rec)
            _, version = self._groups[(scope, group)]
            version = await self._put(
                READER_GROUPS_TABLE, group_key(scope, group), encode_group(rec), version
            )
            self._groups[(scope, group)] = (rec, version)
            return rec.generation

    async def delete_reader_group(self, scope: str, group: str, group_id: str) -> None:
        """Delete a group: its subscriber records, its record, then its state
        stream (sealed and deleted). ``group_id`` must be the group's.

        Raises: ReaderGroupNotFound (also for another id).
        """
        async with self._membership:
            rec = self.reader_group(scope, group)
            if group_id != rec.group_id:
                raise ReaderGroupNotFound(scope, group)
            name = scoped_name(scope, group)
            for sc, st in rec.streams:
                async with self._stream_lock(sc, st):
                    await self._drop_subscribers(sc, st, lambda sub: sub.subscriber == name)
            _, version = self._groups[(scope, group)]
            await self._remove(READER_GROUPS_TABLE, group_key(scope, group), version)
            del self._groups[(scope, group)]
        await self._drop_group_stream(scope, reader_group_stream(group))

    def list_reader_groups(self, scope: str) -> list[str]:
        """The names of ``scope``'s reader groups, in order."""
        return sorted(g for sc, g in self._groups if sc == scope)

    def list_subscribers(self, scope: str, stream: str) -> list[str]:
        """The subscribing groups of a stream (``<scope>/<group>``), in order.

        Raises: ScopeNotFound, StreamNotFound.
        """
        self._stream(scope, stream)
        return sorted(self._subscribers.get((scope, stream), {}))

    def subscriber_cut(self, scope: str, stream: str, subscriber: str) -> dict[int, int]:
        """The stream cut ``subscriber`` last reported on a stream (for tests and tools).

        Raises: ScopeNotFound, StreamNotFound, SubscriberNotFound.
        """
        self._stream(scope, stream)
        entry = self._subscribers.get((scope, stream), {}).get(subscriber)
        if entry is None:
            raise SubscriberNotFound(scope, stream, subscriber)
        return dict(entry[0].cut)

    async def update_subscriber_cut(
        self,
        scope: str,
        stream: str,
        subscriber: str,
        group_id: str,
        generation: int,
        cut: Mapping[int, int],
    ) -> None:
        """Record where subscriber ``subscriber`` (``<scope>/<group>``) is in a stream:
        retention does not truncate the stream past it. As in Java, a cut behind
        the recorded one is refused (a subscriber only moves forward).

        Raises:
            ScopeNotFound, StreamNotFound, SubscriberNotFound (also for another
            group id), GenerationMismatch, InvalidArgument (an invalid cut, or
            one behind the recorded cut).
        """
        async with self._stream_lock(scope, stream):
            rec = self._stream(scope, stream)
            subs = self._subscribers.get((scope, stream), {})
            entry = subs.get(subscriber)
            group_scope, _, group = subscriber.partition("/")
            owner = self._groups.get((group_scope, group))
            if entry is None or owner is None or owner[0].group_id != group_id:
                raise SubscriberNotFound(scope, stream, subscriber)
            sub, version = entry
            if sub.generation != generation:
                raise GenerationMismatch(subscriber, sub.generation, generation)
            if _cut_segments(rec, cut) is None:
                raise InvalidArgument(f"not a valid stream cut of {scope}/{stream}")
            for sid, off in cut.items():
                _, length = await self._extent(segment_name(scope, stream, sid))
                if off > length:
                    raise InvalidArgument(f"offset {off} is beyond segment {sid}'s length")
            if sub.cut and not _not_after(rec, sub.cut, cut):
                raise InvalidArgument(f"the cut is behind {subscriber!r}'s recorded cut")
            new = dataclasses.replace(sub, cut=dict(cut))
            version = await self._put(
                SUBSCRIBERS_TABLE,
                subscriber_key(scope, stream, subscriber),
                encode_subscriber(new),
                version,
            )
            subs[subscriber] = (new, version)

    def _check_group_cuts(self, rec: ReaderGroupRecord) -> None:
        """Raises: InvalidArgument, StreamNotFound, TooMany (see ``create_reader_group``)."""
        if not rec.start_cuts:
            raise InvalidArgument("a reader group reads at least one stream")
        if len(rec.start_cuts) > MAX_GROUP_STREAMS:
            raise TooMany("streams in a reader group", MAX_GROUP_STREAMS)
        if not set(rec.end_cuts) <= set(rec.start_cuts):
            raise InvalidArgument("an ending stream cut names a stream the group does not read")
        for cuts in (rec.start_cuts, rec.end_cuts):
            for name, cut in cuts.items():
                sc, _, st = name.partition("/")
                entry = self._streams.get((sc, st))
                if entry is None:
                    raise StreamNotFound(sc, st)
                if cut and _cut_segments(entry[0], cut) is None:
                    raise InvalidArgument(f"not a valid stream cut of {name}")

    async def _subscribe(self, rec: ReaderGroupRecord) -> None:
        """Give a subscribing group a subscriber record at its generation on every
        stream it reads: new ones start at the group's starting cut (or the head)."""
        if rec.retention is GroupRetention.NONE:
            return
        name = scoped_name(rec.scope, rec.group)
        for stream_name, start in sorted(rec.start_cuts.items()):
            sc, _, st = stream_name.partition("/")
            async with self._stream_lock(sc, st):
                await self._subscribe_one(sc, st, name, rec.generation, start)

    async def _subscribe_one(
        self, sc: str, st: str, name: str, generation: int, start: Mapping[int, int]
    ) -> None:
        """``_subscribe`` for one stream, with its lock held."""
        subs = self._subscribers.setdefault((sc, st), {})
        entry = subs.get(name)
        if entry is not None:
            sub = dataclasses.replace(entry[0], generation=generation)
        else:
            cut = dict(start) or {h.segment.id: h.offset for h in await self.head_segments(sc, st)}
            sub = SubscriberRecord(name, generation, cut)
        version = await self._put(
            SUBSCRIBERS_TABLE,
            subscriber_key(sc, st, name),
            encode_subscriber(sub),
            None if entry is None else entry[1],
        )
        subs[name] = (sub, version)

    async def _drop_subscribers(
        self, scope: str, stream: str, which: Callable[[SubscriberRecord], bool]
    ) -> None:
        subs = self._subscribers.get((scope, stream), {})
        for name, (sub, version) in list(subs.items()):
            if which(sub):
                await self._remove(SUBSCRIBERS_TABLE, subscriber_key(scope, stream, name), version)
                del subs[name]
        if not subs:
            self._subscribers.pop((scope, stream), None)

    async def _drop_group_stream(self, scope: str, stream: str) -> None:
        """Seal and delete a group's state stream (gone already is fine)."""
        if (scope, stream) not in self._streams:
            return
        await self.seal_stream(scope, stream)
        with contextlib.suppress(StreamNotFound, ScopeNotFound):
            await self.delete_stream(scope, stream)

    # ------------------------------------------------------------------ auto-scaling

    async def auto_scale(self) -> int:
        """Sample the load of every auto-scaling stream once and scale where the
        policy says so; returns how many scales were done. Run periodically.

        The rate of a segment is measured between two calls: bytes from its
        length, events from its writers' last event numbers (the attributes the
        append path keeps). A segment above ``targetRate`` (KiB/s or events/s)
        for ``AUTO_SCALE_HOT_SAMPLES`` calls in a row is split into
        ``max(2, scaleFactor)`` equal parts; two neighbours both under half
        the target for ``AUTO_SCALE_COLD_SAMPLES`` calls in a row are merged,
        never below ``minNumSegments``. At most one scale per stream per call;
        open transactions do not hold it back (they commit by rolling).
        """
        scaled = 0
        for key in list(self._streams):
            entry = self._streams.get(key)
            if (
                entry is None
                or entry[0].config.scaling.scale_type is ScalingType.FIXED_NUM_SEGMENTS
            ):
                self._loads.pop(key, None)
                continue
            async with self._stream_lock(*key):
                entry = self._streams.get(key)
                if entry is not None and await self._auto_scale(entry[0]):
                    scaled += 1
        return scaled

    async def _auto_scale(self, rec: StreamRecord) -> bool:
        key = (rec.scope, rec.stream)
        if rec.state is not StreamState.ACTIVE:
            self._loads.pop(key, None)
            return False
        policy = rec.config.scaling
        target = max(1, policy.target_rate)
        if policy.scale_type is ScalingType.BY_RATE_IN_KBYTES_PER_SEC:
            target *= 1024
        now = self._clock_ms()
        previous = self._loads.get(key, {})
        loads: dict[int, _Load] = {}
        for seg in rec.active_segments():
            loads[seg.id] = await self._sample(rec, seg, now, previous.get(seg.id), target)
        self._loads[key] = loads
        active = rec.active_segments()
        hot = [s for s in active if loads[s.id].hot >= AUTO_SCALE_HOT_SAMPLES]
        parts = max(2, policy.scale_factor)
        if hot and len(active) - 1 + parts <= MAX_SEGMENTS_PER_EPOCH:
            seg = max(hot, key=lambda s: loads[s.id].rate)
            width = seg.max_key - seg.min_key
            bounds = [seg.min_key + width * i / parts for i in range(parts)] + [seg.max_key]
            ranges = list(itertools.pairwise(bounds))
            log.info("auto-scale: splitting %s/%s segment %d in %d", *key, seg.id, parts)
            await self._scale(rec, [seg.id], ranges)
            self._loads.pop(key, None)
            return True
        if len(active) > policy.min_num_segments:
            for a, b in itertools.pairwise(active):
                if min(loads[a.id].cold, loads[b.id].cold) >= AUTO_SCALE_COLD_SAMPLES:
                    log.info("auto-scale: merging %s/%s segments %d and %d", *key, a.id, b.id)
                    await self._scale(rec, [a.id, b.id], [(a.min_key, b.max_key)])
                    self._loads.pop(key, None)
                    return True
        return False

    async def _sample(
        self,
        rec: StreamRecord,
        seg: SegmentRecord,
        now: int,
        before: _Load | None,
        target: int,
    ) -> _Load:
        try:
            info = await self._store.info(segment_name(rec.scope, rec.stream, seg.id))
        except SegmentNotFound:
            return _Load(now, 0, {}, 0.0, 0, 0)
        writers = {w: n for w, n in info.attributes.items() if n >= 0}
        if before is None or now <= before.time_ms:
            return _Load(now, info.length, writers, 0.0, 0, 0)
        seconds = (now - before.time_ms) / 1000
        if rec.config.scaling.scale_type is ScalingType.BY_RATE_IN_KBYTES_PER_SEC:
            amount = info.length - before.length
        else:
            amount = sum(n - before.writers.get(w, 0) for w, n in writers.items())
        rate = max(0, amount) / seconds
        return _Load(
            now,
            info.length,
            writers,
            rate,
            before.hot + 1 if rate > target else 0,
            before.cold + 1 if rate < target / 2 else 0,
        )

    def segment_loads(self, scope: str, stream: str) -> dict[int, float]:
        """The last sampled rate of each active segment (for tests and tools)."""
        return {sid: load.rate for sid, load in self._loads.get((scope, stream), {}).items()}

    # ------------------------------------------------------------------ transactions

    async def create_txn(
        self, scope: str, stream: str, lease_ms: int
    ) -> tuple[TxnRecord, list[SegmentRecord]]:
        """Open a transaction with one transaction segment per active segment.

        Raises:
            ScopeNotFound, StreamNotFound, StreamSealed, InvalidArgument (lease
            not positive), LeaseTooLarge, TooMany (open transactions).
        """
        _check_lease(lease_ms)
        async with self._stream_lock(scope, stream):
            rec = self._stream(scope, stream)
            if rec.state is StreamState.SEALED:
                raise StreamSealed(scope, stream)
            txns = self._txns.setdefault((scope, stream), {})
            if sum(t.state is TxnState.OPEN for t, _ in txns.values()) >= MAX_OPEN_TXNS_PER_STREAM:
                raise TooMany("open transactions", MAX_OPEN_TXNS_PER_STREAM)
            txn = TxnId.new(rec.epoch, rec.next_txn)
            # The counter goes first: a crash after it can only skip an id.
            rec = await self._save_stream(dataclasses.replace(rec, next_txn=rec.next_txn + 1))
            active = rec.active_segments()
            for seg in active:
                parent = segment_name(scope, stream, seg.id)
                await self._create_fresh_segment(transaction_segment_name(parent, txn))
            now = self._clock_ms()
            txn_rec = TxnRecord(
                txn=txn,
                epoch=rec.epoch,
                parents=tuple(seg.id for seg in active),
                state=TxnState.OPEN,
                lease_ms=lease_ms,
                created_ms=now,
            )
            version = await self._put(
                TRANSACTIONS_TABLE, txn_key(scope, stream, txn), encode_txn(txn_rec)
            )
            txns[txn] = (txn_rec, version)
            self._deadlines[(scope, stream, txn)] = now + LEASE_SLACK_FACTOR * lease_ms
            return txn_rec, active

    async def commit_txn(
        self, scope: str, stream: str, txn: TxnId, *, writer_id: str = "", timestamp: int = 0
    ) -> None:
        """Merge every transaction segment into its parent; each merge is atomic,
        so a transaction's events land contiguously in each segment. Committing a
        committed transaction is a success.

        A transaction opened in an epoch that a scale has ended commits by
        rolling (``_roll``): its events come after everything written to the
        active segments before the commit, and before everything written after.

        Raises: ScopeNotFound, StreamNotFound, TxnNotFound, TxnNotOpen (aborted),
            TooMany (no epoch numbers left for a rolling commit).
        """
        async with self._stream_lock(scope, stream):
            rec = self._stream(scope, stream)
            txn_rec = self._txn(scope, stream, txn)
            rolls = txn_rec.epoch < rec.epoch
            if txn_rec.state in (TxnState.ABORTING, TxnState.ABORTED):
                raise TxnNotOpen(scope, stream, txn.hex, txn_rec.state.name.lower())
            if txn_rec.state is TxnState.COMMITTED:
                return
            if txn_rec.state is TxnState.OPEN:
                await self._save_txn(
                    scope,
                    stream,
                    dataclasses.replace(
                        txn_rec,
                        state=TxnState.COMMITTING,
                        writer_id=writer_id,
                        commit_timestamp=timestamp,
                    ),
                )
        # A second turn: commits queued behind this one have recorded COMMITTING
        # meanwhile, and are done together (one rolling commit for all of an epoch).
        # One that must roll gives the others sent with it time to arrive; any
        # other yields once, so that commits already scheduled get in line first.
        await asyncio.sleep(self.rolling_commit_window_s if rolls else 0)
        async with self._stream_lock(scope, stream):
            rec = self._stream(scope, stream)
            if self._txn(scope, stream, txn).state is TxnState.COMMITTING:
                await self._commit_pending(rec)

    async def abort_txn(self, scope: str, stream: str, txn: TxnId) -> None:
        """Seal the transaction's segments (``sweep`` deletes them after
        ``ABORTED_SEGMENT_GRACE_MS``); aborting an aborted one is a success.

        Raises: ScopeNotFound, StreamNotFound, TxnNotFound, TxnNotOpen (committed).
        """
        async with self._stream_lock(scope, stream):
            rec = self._stream(scope, stream)
            txn_rec = self._txn(scope, stream, txn)
            if txn_rec.state in (TxnState.COMMITTING, TxnState.COMMITTED):
                raise TxnNotOpen(scope, stream, txn.hex, txn_rec.state.name.lower())
            if txn_rec.state is not TxnState.ABORTED:
                await self._abort(rec, txn_rec)

    def ping_txn(self, scope: str, stream: str, txn: TxnId, lease_ms: int) -> TxnState:
        """Extend an open transaction's lease; returns the transaction's state
        (the lease is untouched unless it is OPEN).

        Raises: ScopeNotFound, StreamNotFound, TxnNotFound, InvalidArgument, LeaseTooLarge.
        """
        self._stream(scope, stream)
        txn_rec = self._txn(scope, stream, txn)
        if txn_rec.state is TxnState.OPEN:
            _check_lease(lease_ms)
            self._deadlines[(scope, stream, txn)] = self._clock_ms() + LEASE_SLACK_FACTOR * lease_ms
        return txn_rec.state

    def txn_state(self, scope: str, stream: str, txn: TxnId) -> TxnState:
        """Raises: ScopeNotFound, StreamNotFound, TxnNotFound."""
        self._stream(scope, stream)
        return self._txn(scope, stream, txn).state

    def txn_segments(self, scope: str, stream: str, txn: TxnId) -> list[str]:
        """Names of the transaction's segments (for tests and tools)."""
        self._stream(scope, stream)
        txn_rec = self._txn(scope, stream, txn)
        return [
            transaction_segment_name(segment_name(scope, stream, p), txn) for p in txn_rec.parents
        ]

    async def sweep(self) -> SweepResult:
        """Abort open transactions whose lease ran out (with slack), delete the
        segments of transactions aborted more than ``ABORTED_SEGMENT_GRACE_MS``
        ago, forget finished ones older than ``COMPLETED_TXN_KEEP_MS``, and
        delete transient segments idle for ``TRANSIENT_SEGMENT_MAX_IDLE_MS``.
        Run periodically."""
        now = self._clock_ms()
        aborted = purged = cleaned = 0
        for (scope, stream), txns in list(self._txns.items()):
            for txn, (txn_rec, _) in list(txns.items()):
                expired_open = (
                    txn_rec.state is TxnState.OPEN
                    and self._deadlines.get((scope, stream, txn), now + 1) <= now
                )
                finished_old = (
                    txn_rec.state in (TxnState.COMMITTED, TxnState.ABORTED)
                    and txn_rec.closed_ms + COMPLETED_TXN_KEEP_MS <= now
                )
                aborted_unclean = (
                    txn_rec.state is TxnState.ABORTED
                    and txn_rec.closed_ms + ABORTED_SEGMENT_GRACE_MS <= now
                    and (scope, stream, txn) not in self._cleaned
                )
                if not (expired_open or finished_old or aborted_unclean):
                    continue
                async with self._stream_lock(scope, stream):
                    entry = self._streams.get((scope, stream))
                    current = self._txns.get((scope, stream), {}).get(txn)
                    if entry is None or current is None or current[0].state != txn_rec.state:
                        continue  # changed while we waited for the lock
                    if expired_open:
                        log.info(
                            "transaction %s of %s/%s: lease expired; aborting",
                            txn.hex,
                            scope,
                            stream,
                        )
                        await self._abort(entry[0], current[0])
                        aborted += 1
                        continue
                    if aborted_unclean:
                        await self._delete_txn_segments(entry[0], current[0])
                        self._cleaned.add((scope, stream, txn))
                        cleaned += 1
                    if finished_old:
                        await self._remove(
                            TRANSACTIONS_TABLE, txn_key(scope, stream, txn), current[1]
                        )
                        del self._txns[(scope, stream)][txn]
                        self._cleaned.discard((scope, stream, txn))
                        purged += 1
        transients = await self._sweep_transients(now)
        return SweepResult(
            aborted=aborted,
            purged=purged,
            aborted_segments_deleted=cleaned,
            transients_deleted=transients,
        )

    async def _sweep_transients(self, now: int) -> int:
        """Delete transient segments not changed for ``TRANSIENT_SEGMENT_MAX_IDLE_MS``.
        The store's segment list is the record, so a restart loses nothing."""
        deleted = 0
        for name in await self._store.list_segments():
            if TRANSIENT_INFIX not in name:
                continue
            try:
                info = await self._store.info(name)
                if info.last_modified_ms + TRANSIENT_SEGMENT_MAX_IDLE_MS > now:
                    continue
                await self._store.delete(name)
            except SegmentNotFound:
                continue  # merged or deleted meanwhile
            log.info("transient segment %s abandoned; deleted", name)
            deleted += 1
        return deleted

    # ------------------------------------------------------------------ internals

    def _stream(self, scope: str, stream: str) -> StreamRecord:
        entry = self._streams.get((scope, stream))
        if entry is None:
            if scope not in self._scopes:
                raise ScopeNotFound(scope)
            raise StreamNotFound(scope, stream)
        return entry[0]

    def _txn(self, scope: str, stream: str, txn: TxnId) -> TxnRecord:
        entry = self._txns.get((scope, stream), {}).get(txn)
        if entry is None:
            raise TxnNotFound(scope, stream, txn.hex)
        return entry[0]

    def _stream_lock(self, scope: str, stream: str) -> asyncio.Lock:
        lock = self._stream_locks.get((scope, stream))
        if lock is None:
            lock = self._stream_locks[(scope, stream)] = asyncio.Lock()
        return lock

    async def _put(self, table: str, key: bytes, value: bytes, version: int | None = None) -> int:
        """Write one record; ``version`` None means the key must be new."""
        expected = NOT_EXISTS if version is None else version
        [new_version] = await self._store.update_table(table, [TableUpdate(key, value, expected)])
        return new_version

    async def _remove(self, table: str, key: bytes, version: int) -> None:
        await self._store.remove_table_keys(table, [TableKey(key, version)])

    async def _save_stream(self, rec: StreamRecord) -> StreamRecord:
        key = (rec.scope, rec.stream)
        _, version = self._streams[key]
        new_version = await self._put(
            STREAMS_TABLE, stream_key(rec.scope, rec.stream), encode_stream(rec), version
        )
        self._streams[key] = (rec, new_version)
        return rec

    async def _save_txn(self, scope: str, stream: str, txn_rec: TxnRecord) -> TxnRecord:
        txns = self._txns[(scope, stream)]
        _, version = txns[txn_rec.txn]
        new_version = await self._put(
            TRANSACTIONS_TABLE, txn_key(scope, stream, txn_rec.txn), encode_txn(txn_rec), version
        )
        txns[txn_rec.txn] = (txn_rec, new_version)
        return txn_rec

    async def _commit_pending(self, rec: StreamRecord) -> StreamRecord:
        """Commit every ``COMMITTING`` transaction of the stream (and finish a
        recorded rolling commit): those of the active epoch by merging into
        their parents, those of older epochs by one rolling commit per epoch,
        oldest first. Returns the stream record as it is afterwards."""
        if rec.rolling is not None:
            rec = await self._roll(rec, rec.rolling)
        key = (rec.scope, rec.stream)
        committing = [
            t for t, _ in self._txns.get(key, {}).values() if t.state is TxnState.COMMITTING
        ]
        for txn_rec in committing:
            if txn_rec.epoch == rec.epoch:
                await self._finish_commit(rec, txn_rec)
        older: dict[int, list[TxnId]] = {}
        for txn_rec in committing:
            if txn_rec.epoch == rec.epoch:
                continue
            if await self._merged_already(rec, txn_rec):
                await self._committed(rec, txn_rec)
            else:
                older.setdefault(txn_rec.epoch, []).append(txn_rec.txn)
        for epoch in sorted(older):
            if rec.epoch + 2 > MAX_SEGMENT_NUMBER:
                raise TooMany("epochs", MAX_SEGMENT_NUMBER)
            roll = RollingTxn(txn_epoch=epoch, active_epoch=rec.epoch, txns=tuple(older[epoch]))
            rec = await self._save_stream(dataclasses.replace(rec, rolling=roll))
            rec = await self._roll(rec, roll)
        return rec

    async def _merged_already(self, rec: StreamRecord, txn_rec: TxnRecord) -> bool:
        """Whether every segment of an older epoch's committing transaction is
        gone: only its rolling commit merges them, so that commit got as far as
        recording its epochs (see the module docstring)."""
        for parent_id in txn_rec.parents:
            parent = segment_name(rec.scope, rec.stream, parent_id)
            try:
                await self._store.info(transaction_segment_name(parent, txn_rec.txn))
            except SegmentNotFound:
                continue
            return False
        return True

    async def _roll(self, rec: StreamRecord, roll: RollingTxn) -> StreamRecord:
        """Carry out the rolling commit ``roll``, which ``rec.rolling`` records.

        Epoch ``A+1`` (``A`` = ``roll.active_epoch``) gets a copy of each segment
        of the transactions' epoch, the transactions are merged into the copies
        and the copies sealed; epoch ``A+2`` gets a copy of each segment of
        epoch ``A`` and becomes the active epoch, and ``A``'s segments are
        sealed. A reader of a key thus reads ``A``'s segment to its end, then the
        transactions' events, then what came after. Idempotent up to the
        record's save, so a restart can run it again (``_repair``).
        """
        scope, stream = rec.scope, rec.stream
        copy_epoch, active_epoch = roll.active_epoch + 1, roll.active_epoch + 2
        sources = rec.epoch_segments(roll.txn_epoch)
        actives = rec.epoch_segments(roll.active_epoch)
        copies = [
            SegmentRecord(s.number, copy_epoch, s.min_key, s.max_key, sealed_epoch=active_epoch)
            for s in sources
        ]
        successors = [SegmentRecord(s.number, active_epoch, s.min_key, s.max_key) for s in actives]
        for seg in (*copies, *successors):
            with contextlib.suppress(SegmentExists):
                await self._store.create_segment(segment_name(scope, stream, seg.id))
        txns = self._txns.get((scope, stream), {})
        committing = [txns[t][0] for t in roll.txns if t in txns]
        for txn_rec in committing:
            for parent_id in txn_rec.parents:
                parent = segment_name(scope, stream, parent_id)
                target = segment_name(
                    scope, stream, segment_id(copy_epoch, segment_number(parent_id))
                )
                with contextlib.suppress(SegmentNotFound):  # merged before a restart
                    await self._store.merge(target, transaction_segment_name(parent, txn_rec.txn))
        for seg in copies:
            await self._seal_segment(segment_name(scope, stream, seg.id))
        active_ids = {s.id for s in actives}
        now = self._clock_ms()
        rec = await self._save_stream(
            dataclasses.replace(
                rec,
                epoch=active_epoch,
                segments=tuple(
                    dataclasses.replace(s, sealed_epoch=copy_epoch) if s.id in active_ids else s
                    for s in rec.segments
                )
                + tuple(copies)
                + tuple(successors),
                epoch_times_ms=(*rec.epoch_times_ms, now, now),
                rolling=None,
            )
        )
        for seg in actives:
            await self._seal_segment(segment_name(scope, stream, seg.id))
        for txn_rec in committing:
            await self._committed(rec, txn_rec)
        log.info(
            "rolling commit of %d transactions of %s/%s from epoch %d into epoch %d",
            len(committing),
            scope,
            stream,
            roll.txn_epoch,
            copy_epoch,
        )
        return rec

    async def _committed(self, rec: StreamRecord, txn_rec: TxnRecord) -> None:
        """Record a transaction whose segments are merged as ``COMMITTED``."""
        await self._save_txn(
            rec.scope,
            rec.stream,
            dataclasses.replace(txn_rec, state=TxnState.COMMITTED, closed_ms=self._clock_ms()),
        )
        self._deadlines.pop((rec.scope, rec.stream, txn_rec.txn), None)

    async def _finish_commit(self, rec: StreamRecord, txn_rec: TxnRecord) -> None:
        for parent_id in txn_rec.parents:
            parent = segment_name(rec.scope, rec.stream, parent_id)
            source = transaction_segment_name(parent, txn_rec.txn)
            try:
                await self._store.merge(parent, source)
            except SegmentNotFound as exc:
                # Merged before a restart and forgotten by the store since: done.
                log.info("commit of %s: %s; treating as merged", txn_rec.txn.hex, exc)
        await self._committed(rec, txn_rec)

    async def _abort(self, rec: StreamRecord, txn_rec: TxnRecord) -> None:
        if txn_rec.state is TxnState.OPEN:
            txn_rec = await self._save_txn(
                rec.scope, rec.stream, dataclasses.replace(txn_rec, state=TxnState.ABORTING)
            )
        for parent_id in txn_rec.parents:
            parent = segment_name(rec.scope, rec.stream, parent_id)
            await self._seal_segment(transaction_segment_name(parent, txn_rec.txn))
        await self._save_txn(
            rec.scope,
            rec.stream,
            dataclasses.replace(txn_rec, state=TxnState.ABORTED, closed_ms=self._clock_ms()),
        )
        self._deadlines.pop((rec.scope, rec.stream, txn_rec.txn), None)

    async def _delete_txn_segments(self, rec: StreamRecord, txn_rec: TxnRecord) -> None:
        for parent_id in txn_rec.parents:
            parent = segment_name(rec.scope, rec.stream, parent_id)
            await self._delete_segment(transaction_segment_name(parent, txn_rec.txn))

    async def _create_fresh_segment(self, name: str) -> None:
        """Create ``name``; an existing segment of that name is an orphan of an
        interrupted operation (no record points at it) and is replaced."""
        try:
            await self._store.create_segment(name)
        except SegmentExists:
            log.warning("segment %s left over from an interrupted operation; replacing it", name)
            await self._store.delete(name)
            await self._store.create_segment(name)

    async def _seal_segment(self, name: str) -> None:
        try:
            await self._store.seal(name)
        except SegmentNotFound:
            log.warning("segment %s is missing; nothing to seal", name)

    async def _delete_segment(self, name: str) -> None:
        with contextlib.suppress(SegmentNotFound):
            await self._store.delete(name)

    async def _start_offset(self, scope: str, stream: str, seg: SegmentRecord, offset: int) -> int:
        try:
            info = await self._store.info(segment_name(scope, stream, seg.id))
        except SegmentNotFound:
            return offset
        return max(offset, info.start_offset)

    async def _truncate(self, rec: StreamRecord, cut: Mapping[int, int]) -> StreamRecord:
        """Record ``cut`` as the head, then make the store match it."""
        rec = await self._save_stream(dataclasses.replace(rec, head_cut=dict(cut)))
        await self._apply_head(rec)
        return rec

    async def _apply_head(self, rec: StreamRecord) -> None:
        """Truncate the head cut's segments to it and delete the segments before it
        (idempotent: a restart runs it again for every stream with a head cut)."""
        cut = rec.head_cut
        for sid, off in cut.items():
            name = segment_name(rec.scope, rec.stream, sid)
            start, length = await self._extent(name)
            if start < off <= length:
                await self._store.truncate(name, off)
        for seg in rec.segments:
            if _before_cut(rec, seg, cut):
                await self._delete_segment(segment_name(rec.scope, rec.stream, seg.id))

    async def _extent(self, name: str) -> tuple[int, int]:
        """(start offset, length) of a segment; (0, 0) once it is gone."""
        try:
            info = await self._store.info(name)
        except SegmentNotFound:
            return 0, 0
        return info.start_offset, info.length

    async def _apply_retention(self, rec: StreamRecord) -> bool:
        policy = rec.config.retention
        now = self._clock_ms()
        key = (rec.scope, rec.stream)
        cuts = self._cuts.setdefault(key, [])
        if rec.state is StreamState.ACTIVE:
            spacing = 0
            if policy.retention_type is RetentionType.TIME:
                spacing = policy.retention_param // RETENTION_CUTS_PER_WINDOW
            last = cuts[-1][0].time_ms if cuts else None
            if last is None or (now > last and now - last >= spacing):
                tail = {}
                for seg in rec.active_segments():
                    _, tail[seg.id] = await self._extent(
                        segment_name(rec.scope, rec.stream, seg.id)
                    )
                await self._add_cut(rec, RetentionCut(now, tail))
        subscribed = [
            sub.cut
            for sub, _ in self._subscribers.get(key, {}).values()
            if sub.cut and _cut_segments(rec, sub.cut) is not None
        ]
        if subscribed:
            return await self._retain_for_subscribers(rec, subscribed, now)
        target: RetentionCut | None = None
        if policy.retention_type is RetentionType.TIME:
            for c, _ in cuts:
                if c.time_ms <= now - policy.retention_param:
                    target = c
        else:
            extents = {
                seg.id: await self._extent(segment_name(rec.scope, rec.stream, seg.id))
                for seg in rec.segments
            }
            if _bytes_after(rec, rec.head_cut, extents) > policy.retention_param:
                for c, _ in cuts:
                    if _bytes_after(rec, c.cut, extents) >= policy.retention_param:
                        target = c
        if target is None or not _ahead(rec, target.cut):
            return False
        log.info(
            "retention: truncating %s/%s at the cut of %d ms", rec.scope, rec.stream, target.time_ms
        )
        rec = await self._truncate(rec, target.cut)
        await self._drop_cuts(rec.scope, rec.stream, lambda c: c.time_ms <= target.time_ms)
        return True

    async def _retain_for_subscribers(
        self, rec: StreamRecord, subscribed: list[dict[int, int]], now: int
    ) -> bool:
        """Retention of a stream with subscribers (Java's consumption-based
        retention): truncate at the furthest cut that keeps the policy's minimum
        and lies at or behind every subscriber's cut (recorded cuts and the
        subscribers' own cuts are the candidates); but if what that keeps is
        more than ``retentionMax`` allows, truncate at the oldest recorded cut
        within both bounds, subscribers or not (a lagging group loses data,
        as in Java). With the default maximum nothing a subscriber has yet to
        read is ever truncated."""
        policy = rec.config.retention
        cuts = [c for c, _ in self._cuts.get((rec.scope, rec.stream), [])]
        extents = {
            seg.id: await self._extent(segment_name(rec.scope, rec.stream, seg.id))
            for seg in rec.segments
        }

        def kept(cut: Mapping[int, int]) -> int:
            return _bytes_after(rec, cut, extents)

        def within(c: RetentionCut, bound: int) -> bool:
            if policy.retention_type is RetentionType.TIME:
                return now - c.time_ms >= bound
            return kept(c.cut) >= bound

        keeping_min = [c for c in cuts if within(c, policy.retention_param)]
        candidates = [c.cut for c in keeping_min]
        if keeping_min:
            newest = keeping_min[-1].cut
            candidates += [sub for sub in subscribed if _not_after(rec, sub, newest)]
        allowed = [c for c in candidates if all(_not_after(rec, c, sub) for sub in subscribed)]
        chosen: dict[int, int] | None = min(allowed, key=kept) if allowed else None
        if policy.retention_max < INT64_MAX:
            retained = kept(chosen if chosen is not None else rec.head_cut)
            if policy.retention_type is RetentionType.TIME:
                older = [c for c in cuts if now - c.time_ms > policy.retention_max]
                over = any(kept(c.cut) < retained for c in older)
                bounded = [
                    c for c in keeping_min if now - c.time_ms <= policy.retention_max
                ] or older[-1:]
            else:
                over = retained > policy.retention_max
                bounded = [c for c in keeping_min if kept(c.cut) <= policy.retention_max]
            if over and bounded and kept(bounded[0].cut) < retained:
                chosen = bounded[0].cut
        if chosen is None or not _ahead(rec, chosen) or kept(chosen) >= kept(rec.head_cut):
            return False  # nothing to drop
        log.info("retention: truncating %s/%s behind its subscribers", rec.scope, rec.stream)
        rec = await self._truncate(rec, chosen)
        await self._drop_cuts(rec.scope, rec.stream, lambda c: not _ahead(rec, c.cut))
        return True

    async def _add_cut(self, rec: StreamRecord, cut: RetentionCut) -> None:
        cuts = self._cuts.setdefault((rec.scope, rec.stream), [])
        version = await self._put(
            RETENTION_TABLE, cut_key(rec.scope, rec.stream, cut.time_ms), encode_cut(cut)
        )
        cuts.append((cut, version))
        if len(cuts) > MAX_RETENTION_CUTS:
            older = {id(c) for c, _ in cuts[: len(cuts) // 2][1::2]}
            await self._drop_cuts(rec.scope, rec.stream, lambda c: id(c) in older)

    async def _drop_cuts(
        self, scope: str, stream: str, which: Callable[[RetentionCut], bool]
    ) -> None:
        cuts = self._cuts.get((scope, stream), [])
        for cut, version in list(cuts):
            if which(cut):
                await self._remove(RETENTION_TABLE, cut_key(scope, stream, cut.time_ms), version)
                cuts.remove((cut, version))

    async def _load(self, *, create: bool = True) -> None:
        """Fill the mirror from the tables; ``create``: make missing tables (the
        writer does), else a missing table reads as empty (a reader does)."""
        for table in METADATA_TABLES:
            if create:
                with contextlib.suppress(SegmentExists):
                    await self._store.create_table(table)
            else:
                try:
                    await self._store.table_info(table)
                except SegmentNotFound:
                    return  # nothing written yet: the writer creates every table first
        async for key, value, version in self._entries(SCOPES_TABLE):
            self._scopes[key.decode()] = (decode_scope(value), version)
        async for _, value, version in self._entries(STREAMS_TABLE):
            rec = decode_stream(value)
            self._streams[(rec.scope, rec.stream)] = (rec, version)
        async for key, value, version in self._entries(RETENTION_TABLE):
            scope, stream, _ = key.decode().split("/")
            self._cuts.setdefault((scope, stream), []).append((decode_cut(value), version))
        for cuts in self._cuts.values():
            cuts.sort(key=lambda pair: pair[0].time_ms)
        async for key, value, version in self._entries(KVTABLES_TABLE):
            scope, table = key.decode().split("/")
            self._kvtables[(scope, table)] = (decode_kvtable(value), version)
        async for key, value, version in self._entries(TRANSACTIONS_TABLE):
            scope, stream, _ = key.decode().split("/")
            txn_rec = decode_txn(value)
            self._txns.setdefault((scope, stream), {})[txn_rec.txn] = (txn_rec, version)
        async for _, value, version in self._entries(READER_GROUPS_TABLE):
            group = decode_group(value)
            self._groups[(group.scope, group.group)] = (group, version)
        async for key, value, version in self._entries(SUBSCRIBERS_TABLE):
            scope, stream, name = split_subscriber_key(key)
            self._subscribers.setdefault((scope, stream), {})[name] = (
                decode_subscriber(value),
                version,
            )

    def _adopt(self, other: ControllerModel) -> None:
        """Take ``other``'s mirror (loaded from the same tables) as this one's, in one step."""
        self._scopes = other._scopes
        self._streams = other._streams
        self._txns = other._txns
        self._deadlines = other._deadlines
        self._cleaned = other._cleaned
        self._cuts = other._cuts
        self._kvtables = other._kvtables
        self._groups = other._groups
        self._subscribers = other._subscribers
        self._loads = {}

    async def _entries(self, table: str) -> AsyncIterator[tuple[bytes, bytes, int]]:
        token = b""
        while True:
            page = await self._store.iterate_table_entries(
                table, continuation_token=token, max_count=TABLE_PAGE_COUNT
            )
            if not page.items:
                return
            for entry in page.items:
                yield entry.key, entry.value, entry.version
            token = page.continuation_token

    async def _repair(self) -> None:
        """Finish what a crash interrupted (see the module docstring)."""
        now = self._clock_ms()
        for rec, _ in list(self._streams.values()):
            # The last scale sealed segments of the current epoch's start; a
            # rolling commit those of the epoch before it too.
            pending = [
                s
                for s in rec.segments
                if s.sealed_epoch is not None and s.sealed_epoch >= rec.epoch - 1
            ]
            if rec.state is StreamState.SEALED:
                pending += rec.epoch_segments(rec.epoch)
            for seg in pending:
                await self._seal_segment(segment_name(rec.scope, rec.stream, seg.id))
            if rec.head_cut:
                await self._apply_head(rec)
        for scope, stream in list(self._cuts):
            if (scope, stream) not in self._streams:  # the stream's deletion was interrupted
                await self._drop_cuts(scope, stream, lambda _: True)
                del self._cuts[(scope, stream)]
        await self._repair_groups()
        committing: set[StreamKey] = {
            key for key, (rec, _) in self._streams.items() if rec.rolling is not None
        }
        for (scope, stream), txns in list(self._txns.items()):
            entry = self._streams.get((scope, stream))
            for txn, (txn_rec, version) in list(txns.items()):
                if entry is None:  # the stream's deletion was interrupted
                    await self._remove(TRANSACTIONS_TABLE, txn_key(scope, stream, txn), version)
                    del txns[txn]
                elif txn_rec.state is TxnState.COMMITTING:
                    committing.add((scope, stream))
                elif txn_rec.state is TxnState.ABORTING:
                    await self._abort(entry[0], txn_rec)
                elif txn_rec.state is TxnState.OPEN:
                    self._deadlines[(scope, stream, txn)] = (
                        now + LEASE_SLACK_FACTOR * txn_rec.lease_ms
                    )
        for key in sorted(committing):
            await self._commit_pending(self._streams[key][0])

    async def _repair_groups(self) -> None:
        """Undo what a crash left of a reader group's creation or deletion: a
        subscriber record without its group (or one the group no longer
        subscribes with), a state stream ``_RG<group>`` without its group.
        A creation that is retried makes them again."""
        wanted = {
            (stream_name, scoped_name(rec.scope, rec.group))
            for rec, _ in self._groups.values()
            if rec.retention is not GroupRetention.NONE
            for stream_name in rec.start_cuts
        }
        for scope, stream in list(self._subscribers):
            stream_name = scoped_name(scope, stream)

            def orphan(sub: SubscriberRecord, name: str = stream_name) -> bool:
                return (name, sub.subscriber) not in wanted

            await self._drop_subscribers(scope, stream, orphan)
        for scope, stream in list(self._streams):
            group = stream.removeprefix(READER_GROUP_STREAM_PREFIX)
            if group != stream and (scope, group) not in self._groups:
                log.warning("state stream %s/%s has no reader group; deleting it", scope, stream)
                await self._drop_group_stream(scope, stream)


def _not_after(rec: StreamRecord, cut: Mapping[int, int], bound: Mapping[int, int]) -> bool:
    """Whether truncating at ``cut`` keeps everything from ``bound`` on: no
    segment of ``bound`` is cut short or deleted by it, and none of ``cut``
    lies past ``bound``."""
    for sid, off in bound.items():
        seg = rec.segment(sid)
        if seg is None:
            continue
        if sid in cut:
            if cut[sid] > off:
                return False
        elif _before_cut(rec, seg, cut):
            return False
    for sid in cut:
        seg = rec.segment(sid)
        if seg is None or (sid not in bound and not _before_cut(rec, seg, bound)):
            return False
    return True


def _page(names: Iterable[str], after: str, limit: int) -> list[str]:
    return sorted(n for n in names if n > after)[:limit]


_GROUP_STREAM_CONFIG = StreamConfig(
    scaling=ScalingPolicy(ScalingType.FIXED_NUM_SEGMENTS, 0, 0, 1), retention=RetentionPolicy()
)
"""A reader group's state stream: one fixed segment, as Java creates it."""


def _checked_config(config: StreamConfig) -> StreamConfig:
    """Validate a stream configuration; a segment count of 0 (unset) means 1."""
    count = config.scaling.min_num_segments
    if count < 0 or count > MAX_SEGMENTS_PER_EPOCH:
        raise InvalidArgument(f"minNumSegments must be in 1..{MAX_SEGMENTS_PER_EPOCH}, got {count}")
    if count == 0:
        config = dataclasses.replace(
            config, scaling=dataclasses.replace(config.scaling, min_num_segments=1)
        )
    if len(config.tags) > MAX_TAGS:
        raise InvalidArgument(f"at most {MAX_TAGS} tags per stream, got {len(config.tags)}")
    for tag in config.tags:
        if not tag or len(tag) > MAX_TAG_CHARS:
            raise InvalidArgument(f"tags must have 1..{MAX_TAG_CHARS} characters")
    if config.retention.retention_param < 0:
        raise InvalidArgument("retentionParam must not be negative")
    if config.retention.retention_max == 0:  # unset in the message: no upper bound
        config = dataclasses.replace(
            config, retention=dataclasses.replace(config.retention, retention_max=INT64_MAX)
        )
    if config.retention.retention_max < config.retention.retention_param:
        raise InvalidArgument("retentionMax must not be below retentionParam")
    return dataclasses.replace(config, tags=tuple(dict.fromkeys(config.tags)))


def _check_kvtable_config(config: KeyValueTableConfig) -> None:
    """Java's ``KeyValueTableConfiguration`` rules, plus the partition limit."""
    if not 1 <= config.partition_count <= MAX_TABLE_PARTITIONS:
        raise InvalidArgument(
            f"partitionCount must be in 1..{MAX_TABLE_PARTITIONS}, got {config.partition_count}"
        )
    if config.primary_key_length <= 0 or config.secondary_key_length < 0:
        raise InvalidArgument(
            "primaryKeyLength must be positive and secondaryKeyLength not negative"
        )
    if config.key_length > MAX_TABLE_KEY_BYTES:
        raise InvalidArgument(
            f"primaryKeyLength + secondaryKeyLength must be at most {MAX_TABLE_KEY_BYTES}"
        )
    if config.rollover_size_bytes < 0:
        raise InvalidArgument("rolloverSizeBytes must not be negative")


def _check_lease(lease_ms: int) -> None:
    if lease_ms <= 0:
        raise InvalidArgument(f"transaction lease must be positive, got {lease_ms} ms")
    if lease_ms > MAX_TXN_LEASE_MS:
        raise LeaseTooLarge(lease_ms, MAX_TXN_LEASE_MS)


def _ranges_replace(old: Sequence[SegmentRecord], ranges: Sequence[tuple[float, float]]) -> bool:
    """Whether ``ranges`` (sorted) tile exactly the key space of ``old`` (sorted)."""
    if not ranges:
        return False
    for prev, nxt in itertools.pairwise(old):
        if prev.max_key != nxt.min_key:
            return False
    for (_, hi), (lo, _) in itertools.pairwise(ranges):
        if hi != lo:
            return False
    if any(not 0.0 <= lo < hi <= 1.0 for lo, hi in ranges):
        return False
    return ranges[0][0] == old[0].min_key and ranges[-1][1] == old[-1].max_key


def _cut_segments(rec: StreamRecord, cut: Mapping[int, int]) -> list[SegmentRecord] | None:
    """The cut's segments by key range if the cut is valid for ``rec``, else None."""
    if len(cut) > MAX_SEGMENTS_PER_EPOCH:
        return None  # bigger than any epoch may be: refused before any work is done
    segs = []
    for sid, off in cut.items():
        seg = rec.segment(sid)
        if seg is None or off < 0:
            return None
        segs.append(seg)
    segs.sort(key=lambda s: s.min_key)
    if not segs or segs[0].min_key != 0.0 or segs[-1].max_key != 1.0:
        return None
    for prev, nxt in itertools.pairwise(segs):
        if prev.max_key != nxt.min_key:
            return None
    return segs


def _overlapping(
    rec: StreamRecord, seg: SegmentRecord, cut: Mapping[int, int]
) -> list[SegmentRecord]:
    found = (rec.segment(sid) for sid in cut)
    return [c for c in found if c is not None and c.overlaps(seg)]


def _before_cut(rec: StreamRecord, seg: SegmentRecord, cut: Mapping[int, int]) -> bool:
    """``seg`` lies wholly before ``cut``: it was replaced before any cut segment
    over its keys existed."""
    if seg.id in cut or seg.sealed_epoch is None:
        return False
    over = _overlapping(rec, seg, cut)
    return bool(over) and all(c.created_epoch >= seg.sealed_epoch for c in over)


def _after_cut(rec: StreamRecord, seg: SegmentRecord, cut: Mapping[int, int]) -> bool:
    """``seg`` lies wholly after ``cut``: every cut segment over its keys had been
    replaced when ``seg`` was created."""
    if seg.id in cut:
        return False
    over = _overlapping(rec, seg, cut)
    return bool(over) and all(
        c.sealed_epoch is not None and c.sealed_epoch <= seg.created_epoch for c in over
    )


def _bytes_after(
    rec: StreamRecord, cut: Mapping[int, int], extents: Mapping[int, tuple[int, int]]
) -> int:
    """Readable bytes from ``cut`` (empty: the start) to the tail, from segment
    (start offset, length) pairs."""
    total = 0
    for seg in rec.segments:
        start, length = extents.get(seg.id, (0, 0))
        if seg.id in cut:
            total += length - max(start, cut[seg.id])
        elif not (cut and _before_cut(rec, seg, cut)):
            total += length - start
    return total


def _ahead(rec: StreamRecord, cut: Mapping[int, int]) -> bool:
    """Whether truncating at ``cut`` would move the stream's head forward."""
    head = rec.head_cut
    if dict(cut) == head:
        return False
    for sid, off in cut.items():
        seg = rec.segment(sid)
        if seg is None:
            return False
        if head and (_before_cut(rec, seg, head) or off < head.get(sid, off)):
            return False
    return True
