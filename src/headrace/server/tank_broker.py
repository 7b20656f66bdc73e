"""The TANK storage model: topics and partitions over store segments, sequence
numbers, produce and consume, with no connection or wire code in it.

The broker front door (``server/tank.py``) turns requests into calls here and
what comes back (or what is raised) into TANK's codes; every connection of a
server shares one ``TankBroker``. Protocol and what headrace does where TANK
leaves room: ``docs/protocols/tank.md`` (``tank.md#...`` below names its anchors).

Storage (``docs/architecture.md#tank-topics``)
-----------------------------------------------
A topic is a stream in scope ``tank`` (``--tank-scope``); partition *n* is
the stream's segment *n* of epoch 0. Topic names allow ``_`` and stream names
do not (they allow ``.``, which topic names do not), so ``_`` in a topic name
is ``.`` in its stream name and back. Each produced bundle is one event in
Pravega framing (``>ii`` type 0, length, then the bundle exactly as it came
over the wire), so keys, timestamps and compression survive, and every other
front door reads the same events.

Sequence numbers are not stored in ordinary bundles: a bundle's first seq num
is the previous bundle's last + 1, counting from 1 at offset 0. Two kinds of
bundle carry their own: sparse bundles (in their header) and bundles produced
with ``ProduceWithSeqnum`` and an explicit first seq num. For the latter an
**anchor** (segment offset -> first seq num) is written to the table segment
``_system/tank/<scope>/seqnums`` before the bundle is appended, so a restart
numbers them as they were acknowledged (an anchor whose bundle never made it
is past the segment's end at the next load, and is removed). The same table
also gets a **checkpoint** anchor every ``CHECKPOINT_INTERVAL_BYTES``, so a
restart scans only the tail of a partition, and a partition whose head was
truncated still knows its numbers. In memory each partition keeps a sparse
index (offset, first seq num of the bundle there) every ``INDEX_INTERVAL_BYTES``;
a lookup walks forward from the nearest entry. A partition's state is loaded
on first use, not at start-up.

Acknowledgement (``docs/architecture.md#invariant-durable-acks``): ``append``
returns once the store's append returned, i.e. once the bundle is durable;
only then do the partition's high-water mark move and parked consumes wake.
Appends to one partition are numbered and issued in order, each at the tail
of the one before (``tail_length``, ``tail_hwm``), and use ``expected_offset``,
so a foreign append to the segment is detected instead of corrupting the
numbering. They do not wait for each other's sync: a producer that pipelines
gets one sync for every bundle issued meanwhile. Whatever must wait first
(loading, an anchor, a reload after a foreign append) holds the partition's
lock with no append in flight; appends arriving meanwhile join the
partition's backlog and are issued in arrival order when it lets go.

Consume (tank.md#consume): ``read`` plans what one partition of a consume
gets. Chunks hold whole bundles, start at the bundle containing the wanted seq
num and grow to at least ``fetch_size``; seq num 0 is the first available,
2^64-1 the tail. A consume finding every partition at its end parks
(``wait_for_appends``), woken by appends through any front door.

Any other stream (``docs/interop.md#tank``): a topic named ``SCOPE.STREAM``
(split at the first dot; TANK topic names have no dot) is the stream
``SCOPE/STREAM``, whichever front door wrote it. Its partition *n* is the
stream's segment number *n*: epoch 0's segments first, then each scaling's
successors in the order they were created, so partition ids never change and
a scaled stream gains partitions. Each stored event is one message, numbered
from 1 in its segment (the same walk, index and checkpoints as bundles, each
event standing for a bundle of one message); a consume gets each event as a
one-message bundle (no key, timestamp 0: Pravega events carry neither), built
as the chunk is read. A produce into such a stream stores each message as an
ordinary event (its key and timestamp are not kept). Bytes that are not
events (a byte stream's) are messages of ``RAW_PIECE_BYTES`` each, cut from
the first of them on; the last, shorter piece shows once the segment is
sealed (a message never grows once a consumer may have seen it).

Only bundles go into a topic's stream: the broker has the store refuse any
other append under its scope (``check_appends``), whatever front door it
comes through. An event that is not a bundle all the same (written before,
or behind the server's back) is skipped by every walk and counted
(``headrace_skipped_events_total``); the bytes a walk found to be whole,
valid bundles are remembered per partition (``_Verified``), so each stored
bundle is checked in full once, not at every consume.

What the model refuses it raises as a ``Refused`` error; what the store or
the controller fails with it lets through. The front door's one error table
turns both into TANK's codes.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import re
import struct
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Final

from headrace.controller.errors import ScopeExists
from headrace.controller.model import ControllerModel
from headrace.controller.naming import is_valid_name, segment_id, segment_name
from headrace.controller.records import ScalingPolicy, ScalingType, SegmentRecord, StreamConfig
from headrace.errors import (
    BadOffset,
    HeadraceError,
    RemoteProtocolError,
    SegmentExists,
    SegmentTruncated,
    StoreError,
)
from headrace.protocols import tank as t
from headrace.protocols.pravega import EVENT_HEADER
from headrace.protocols.records import event_time_ms
from headrace.protocols.tank.codec import encode_varint
from headrace.server._inline import step_now
from headrace.store.api import MAX_APPEND_BYTES, MAX_READ_BYTES, SegmentStore, TimeIndexed
from headrace.types import TableKey, TableUpdate

__all__ = [
    "CHECKPOINT_INTERVAL_BYTES",
    "DEFAULT_SCOPE",
    "INDEX_INTERVAL_BYTES",
    "MAX_CONCURRENT_CHUNK_READS",
    "VIEW_MIN_BYTES",
    "YIELD_EVERY_BYTES",
    "Chunk",
    "InvalidBundle",
    "InvalidSeqNums",
    "InvalidTopic",
    "InvalidTopicConfig",
    "OutOfRange",
    "Partition",
    "Refused",
    "TankBroker",
    "Waiter",
    "is_valid_topic",
    "stream_name",
    "stream_of",
    "topic_name",
]

log = logging.getLogger(__name__)

DEFAULT_SCOPE = "tank"
"""The scope holding TANK topics (architecture.md#tank-topics); ``--tank-scope`` changes
it."""

INDEX_INTERVAL_BYTES = 64 * 1024
"""In-memory sparse index granularity: a lookup walks at most this much of a
partition beyond the entry it starts from (TANK's default is 4 KiB of file; our
walk reads a whole block at once, so a coarser index costs little)."""

MAX_INDEX_ENTRIES = 65536
"""In-memory index entries per partition (about 5 MiB): past it every other entry is
dropped, so a very large partition gets a coarser index rather than more memory."""

CHECKPOINT_INTERVAL_BYTES = 16 * 1024 * 1024
"""A persisted anchor every this many bytes: a restart scans at most this much of
a partition's tail, at the cost of one table update per 16 MiB produced."""

SCAN_READ_BYTES = 1024 * 1024
"""Bytes asked of the store per read while walking bundles."""

VIEW_MIN_BYTES = 64 * 1024
"""Bundles at least this large go into a consume response as views of the bytes
read from the store, written to the socket without being copied into the chunk
or the frame; smaller ones are copied together (one write for many)."""

MAX_CONCURRENT_CHUNK_READS: Final = 4
"""Consume responses the whole server builds at once, over every connection.
Reading data on disk returns without suspending, so each response being built
takes the event loop for a while at every step; many at once (a crowd of
consumers arriving together) would hold ``/health`` and every other connection
behind all of them. More consumers wait their turn, in order."""

YIELD_EVERY_BYTES: Final = 1024 * 1024
"""A consume response being built gives the event loop back after every this
many bytes read (about one large bundle): the store's reads of data on disk
return without suspending, so a large response would otherwise hold every
other connection (and ``/health``) for as long as it takes to read it."""

RAW_PIECE_BYTES: Final = 4096
"""Bytes of one message cut from a byte stream's data for a TANK consumer: small
enough that a live byte stream's consumer trails its writer by less than this,
large enough that the framing added (a one-message bundle each) stays small."""

MAX_VERIFIED_RANGES = 1024
"""Byte ranges of a partition known to hold only valid bundles (``_Verified``);
past it the shortest is forgotten (its bundles are then checked again)."""

MAX_TOPIC_NAME_CHARS = 64
"""TANK's own limit on topic names (tank.md#create-topic)."""

EVENT_TYPE = 0
"""The type field of Pravega's event framing (``EVENT_HEADER``) for an event."""

MAX_BUNDLE_BYTES = MAX_APPEND_BYTES - EVENT_HEADER.size
"""The largest bundle one event (one store append) can hold."""

BUNDLE_HEADER_MAX_BYTES = 19
"""flags:u8, msg_count varint (<= 5), first:u64, last-first-1 varint (<= 5): tank.md#bundles."""

_EVENT_AS_BUNDLE: Final = t.BundleHeader(t.BundleCodec.NONE, 1, None, None, 1)
"""What the walk sees of an event of a stream that is not a TANK topic: a bundle of one
message (``size_bytes`` is not used by the walk)."""

_TOPIC_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
_ANCHOR_OFFSET_BYTES = 8  # big-endian u64 after the segment name, so keys sort by offset
_ANCHOR_VALUE = struct.Struct("<Q")  # first seq num of the bundle at that offset
_TABLE_PAGE_COUNT = 1000
_LISTED_STREAMS_MAX = 100_000


def is_valid_topic(topic: str) -> bool:
    """TANK's rule (tank.md#create-topic): 1-64 of ``[A-Za-z0-9_-]``, not starting with ``-`` or
    ``_``."""
    return len(topic) <= MAX_TOPIC_NAME_CHARS and _TOPIC_NAME.fullmatch(topic) is not None


def stream_of(topic: str) -> tuple[str, str] | None:
    """The ``(scope, stream)`` a dotted topic ``SCOPE.STREAM`` names (split at the first
    dot), or None for a topic without a dot (a TANK topic) or names that are no
    scope's or stream's (``docs/interop.md#tank``)."""
    scope, dot, stream = topic.partition(".")
    if not dot or not is_valid_name(scope) or not is_valid_name(stream):
        return None
    return scope, stream


_AFTER_ANY_TIME: Final = 2**63
"""Above any time: ``(offset, _AFTER_ANY_TIME)`` sorts after the index entry at ``offset``."""


def _event_bundle(payload: memoryview, offset: int, times: list[tuple[int, int]]) -> bytes:
    """An event of a stream that is not a TANK topic, as the one-message bundle a
    consumer gets: no key (the stored event has none), and as its timestamp the
    event's own time (a JSON document's ``@timestamp``) or the time it was
    appended (``times``: the segment's time-index entries from at or below
    ``offset``); 0 for an event stored before its segment had an index."""
    value = bytes(payload)
    ms = event_time_ms(value)
    if ms is None:
        i = bisect.bisect_right(times, (offset, _AFTER_ANY_TIME)) - 1
        ms = times[i][1] if i >= 0 else 0
    return t.encode_bundle([t.BundleMessage(value, timestamp_ms=ms)], compress=False)


def stream_name(topic: str) -> str:
    """The stream holding ``topic``: ``_`` becomes ``.`` (stream names have no ``_``)."""
    return topic.replace("_", ".")


def topic_name(stream: str) -> str:
    """The topic a stream of the TANK scope appears as (the inverse of ``stream_name``)."""
    return stream.replace(".", "_")


# --------------------------------------------------------------------------- refusals


class Refused(HeadraceError):
    """A request the model refuses: the client's doing, not a failure, so it is
    answered with a TANK code and not logged. Nothing was stored for it."""


class InvalidBundle(Refused):
    """A produced bundle is malformed (tank.md#bundles), empty, larger than one
    event holds (``MAX_BUNDLE_BYTES``) or unpacks to more than
    ``MAX_STORED_UNPACKED_BYTES``."""


class InvalidSeqNums(Refused):
    """A bundle's explicit or sparse seq nums are not above the high-water mark,
    or its last one is the tail (tank.md#produce-semantics)."""


class InvalidTopic(Refused):
    """A topic to create has a name TANK does not allow, or no partitions."""


class InvalidTopicConfig(Refused):
    """A topic to create has a config that does not parse (tank.md#create-topic)."""


# --------------------------------------------------------------------------- partitions


@dataclass(slots=True)
class _Bundle:
    """One stored bundle met while walking a partition."""

    offset: int  # of its event header in the segment
    end: int  # offset just past the event
    first: int
    last: int
    sparse: bool
    payload: memoryview  # the bundle bytes


class Waiter:
    """A parked consume: woken once ``min_bytes`` were appended to its partitions,
    when its time is up, or when its connection goes.

    ``wake`` is the one future the consume awaits; TANK produces resolve it
    (``appended``), and so does the store for appends through any other front
    door (``store.watch``), its timer (``expire``) and the connection's end
    (``close``). A consume woken by something that does not finish it arms a
    new one. That is the whole cost of a parked consume: no task, no ``Event``.
    """

    __slots__ = ("closed", "expired", "got_bytes", "min_bytes", "wake")

    def __init__(self, min_bytes: int) -> None:
        self.min_bytes = min_bytes
        self.got_bytes = 0
        self.closed = False
        self.expired = False
        self.wake: asyncio.Future[None] | None = None

    @property
    def satisfied(self) -> bool:
        """Something was appended, and at least ``min_bytes`` (0 waits for the first append)."""
        return self.got_bytes >= max(self.min_bytes, 1)

    @property
    def done(self) -> bool:
        return self.closed or self.expired or self.satisfied

    def arm(self) -> asyncio.Future[None]:
        self.wake = asyncio.get_running_loop().create_future()
        return self.wake

    def _resolve(self) -> None:
        if self.wake is not None and not self.wake.done():
            self.wake.set_result(None)

    def appended(self, entry_bytes: int) -> None:
        self.got_bytes += entry_bytes
        if self.satisfied:
            self._resolve()

    def expire(self) -> None:
        self.expired = True
        self._resolve()

    def close(self) -> None:
        self.closed = True
        self._resolve()


class _Verified:
    """Byte ranges of a partition whose events are all valid bundles (checked in full
    once, by a walk or at produce): sorted, disjoint, merged when they touch."""

    __slots__ = ("ends", "starts")

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []

    def end_of(self, offset: int) -> int:
        """The end of the range holding ``offset``; ``offset`` itself if none does."""
        i = bisect.bisect_right(self.starts, offset) - 1
        if i >= 0 and self.ends[i] > offset:
            return self.ends[i]
        return offset

    def add(self, start: int, end: int) -> int:
        """Note ``[start, end)`` as checked; the end of the range now holding it."""
        starts, ends = self.starts, self.ends
        i = bisect.bisect_right(starts, start) - 1
        if i >= 0 and ends[i] >= start:
            ends[i] = max(ends[i], end)
        else:
            i += 1
            starts.insert(i, start)
            ends.insert(i, end)
        while i + 1 < len(starts) and starts[i + 1] <= ends[i]:
            ends[i] = max(ends[i], ends[i + 1])
            del starts[i + 1], ends[i + 1]
        covered = ends[i]
        if len(starts) > MAX_VERIFIED_RANGES:
            shortest = min(range(len(starts)), key=lambda j: ends[j] - starts[j])
            del starts[shortest], ends[shortest]
        return covered


class Partition:
    """What the broker knows about one partition (one segment); ``foreign`` when the
    segment holds events, not bundles (a stream that is not a TANK topic)."""

    def __init__(self, segment: str, foreign: bool = False) -> None:
        self.segment = segment
        self.foreign = foreign
        self.sealed = False  # as of the last load: a byte stream's last piece then shows
        self.lock = asyncio.Lock()  # serialises loading and the appends that wait first
        self.loaded = False
        self.length = 0  # end of the last bundle known (durable)
        self.tail_length = 0  # end of the last bundle issued (durable or in flight)
        self.tail_hwm = 0  # last seq num issued
        self.exclusive = 0  # callers holding or waiting for the lock: appends join the backlog
        self.in_flight = 0  # appends issued, not yet durable (or failed)
        self._settled: asyncio.Future[None] | None = None
        self.backlog: deque[_Pending] = deque()
        """Appends that arrived while the partition could not take them at once
        (not loaded, or the lock held), in arrival order (``TankBroker._drain``)."""
        self.first_seq = 0  # first available seq num; 0 when empty
        self.hwm = 0  # last assigned seq num; 0 when empty
        self.origin_seq = 1  # seq num a non-sparse, unanchored bundle at the start gets
        self.start = 0  # first readable offset
        self.anchors: dict[int, int] = {}  # offset -> first seq num, from the table
        self.index_offsets: list[int] = []
        self.index_seqs: list[int] = []
        self.checkpoint_offset = -CHECKPOINT_INTERVAL_BYTES
        self.waiters: set[Waiter] = set()
        self.verified = _Verified()

    async def settled(self) -> None:
        """Wait until no append issued to the partition is in flight."""
        while self.in_flight:
            if self._settled is None or self._settled.done():
                self._settled = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._settled)

    def landed(self) -> None:
        """An append issued is durable, or failed."""
        self.in_flight -= 1
        if not self.in_flight and self._settled is not None:
            if not self._settled.done():
                self._settled.set_result(None)
            self._settled = None

    def unlocked(self) -> None:
        """A caller that held or waited for the lock is done."""
        self.exclusive -= 1

    def note(self, offset: int, first: int) -> None:
        """Add an index entry for the bundle at ``offset`` unless one is near before it."""
        i = bisect.bisect_left(self.index_offsets, offset)
        if i < len(self.index_offsets) and self.index_offsets[i] == offset:
            return
        if i and offset - self.index_offsets[i - 1] < INDEX_INTERVAL_BYTES:
            return
        self.index_offsets.insert(i, offset)
        self.index_seqs.insert(i, first)
        if len(self.index_offsets) > MAX_INDEX_ENTRIES:  # thin out: twice as coarse
            self.index_offsets = self.index_offsets[::2]
            self.index_seqs = self.index_seqs[::2]

    def floor(self, seq_num: int) -> tuple[int, int]:
        """Where to start walking to find ``seq_num``: (offset, next seq num)."""
        i = bisect.bisect_right(self.index_seqs, seq_num) - 1
        if i < 0:
            return self.start, self.origin_seq
        return self.index_offsets[i], self.index_seqs[i]


@dataclass(slots=True)
class Chunk:
    """Whole bundles of one partition for a consume (tank.md#chunks); empty (no
    parts) when the response had no room left: the client asks again from ``base``."""

    base: int  # the first bundle's first seq num
    sparse: bool  # the first bundle carries its own seq nums
    parts: list[bytes | bytearray | memoryview]
    """The chunk's bytes in order: runs of small entries copied together, large
    bundles as views of the bytes read from the store (sent without a copy)."""
    size_bytes: int = 0


@dataclass(frozen=True, slots=True)
class OutOfRange:
    """A consume asked for a seq num the partition does not hold (tank.md#consume)."""

    first: int  # first available seq num
    last: int  # high-water mark


class _Pending:
    """An append in a partition's backlog; ``stored`` gets what to await for its sync
    once it is issued (or the error that refused it)."""

    __slots__ = ("bundle", "explicit_first", "header", "retried", "stored")

    def __init__(self, bundle: bytes, header: t.BundleHeader, explicit_first: int) -> None:
        self.bundle = bundle
        self.header = header
        self.explicit_first = explicit_first
        self.retried = False
        self.stored: asyncio.Future[Awaitable[None]] = asyncio.get_running_loop().create_future()

    def issued(self, stored: Awaitable[None]) -> None:
        if self.stored.done():  # its caller was cancelled: the append goes on
            return
        self.stored.set_result(stored)

    def fail(self, exc: Exception) -> None:
        if not self.stored.done():
            self.stored.set_exception(exc)


class TankBroker:
    """The broker state every TANK connection of one server shares.

    Args:
        store: where the bundles and the seq-num table live.
        controller: creates and lists the streams behind topics.
        scope: the scope holding TANK topics.
    """

    def __init__(
        self, store: SegmentStore, controller: ControllerModel, scope: str = DEFAULT_SCOPE
    ) -> None:
        self.store = store
        self.controller = controller
        self.scope = scope
        self.table = f"_system/tank/{scope}/seqnums"
        self.started_s = int(time.time())
        self.open_time_us = 0
        self.skipped: Callable[[], None] = lambda: None
        """Called for each event a walk skips because it is not a bundle (a metric)."""
        self._partitions: dict[str, Partition] = {}
        self._slow: set[asyncio.Task[None]] = set()
        """Appends that took a partition's lock (``_drain``), kept until done."""
        self._by_topic: dict[tuple[str, int], Partition] = {}
        """The same, by (topic, partition id): no segment name to build per append."""
        self._stored_anchors: dict[str, dict[int, int]] = {}
        self._own_frames: set[int] = set()
        """``id`` of the frames our own appends are storing (checked at produce already)."""
        self._read_slots = asyncio.Semaphore(MAX_CONCURRENT_CHUNK_READS)
        self._foreign_segments: dict[tuple[str, str], tuple[int, list[SegmentRecord]]] = {}
        """(scope, stream) -> (epoch, every segment by number): the partitions of a
        stream that is not a TANK topic, as of that epoch."""

    async def start(self) -> None:
        """Create the scope and the seq-num table if needed; read the table; have
        the store refuse appends to the scope's streams that are not bundles."""
        self.store.check_appends(f"{self.scope}/", self.check_append)
        with contextlib.suppress(ScopeExists):
            await self.controller.create_scope(self.scope)
        with contextlib.suppress(SegmentExists):
            await self.store.create_table(self.table)
        token = b""
        while True:
            page = await self.store.iterate_table_entries(
                self.table, continuation_token=token, max_count=_TABLE_PAGE_COUNT
            )
            if not page.items:
                break
            for entry in page.items:
                name = entry.key[: -_ANCHOR_OFFSET_BYTES - 1].decode()
                offset = int.from_bytes(entry.key[-_ANCHOR_OFFSET_BYTES:], "big")
                (seq,) = _ANCHOR_VALUE.unpack(entry.value)
                self._stored_anchors.setdefault(name, {})[offset] = seq
            token = page.continuation_token

    # ------------------------------------------------------------------ topics

    def _stream(self, topic: str) -> str | None:
        if not is_valid_topic(topic):
            return None
        stream = stream_name(topic)
        return stream if self.controller.stream_exists(self.scope, stream) else None

    def locate(self, topic: str) -> tuple[str, str] | None:
        """The existing ``(scope, stream)`` behind ``topic``: a TANK topic's stream in
        the TANK scope, or the stream a dotted topic names; None if there is none."""
        named = stream_of(topic)
        if named is None:
            stream = self._stream(topic)
            return None if stream is None else (self.scope, stream)
        return named if self.controller.stream_exists(*named) else None

    def _segments_of(self, scope: str, stream: str) -> list[SegmentRecord]:
        """Every segment ``scope/stream`` ever had, by number: its partitions."""
        epoch = self.controller.current_epoch(scope, stream)
        cached = self._foreign_segments.get((scope, stream))
        if cached is not None and cached[0] == epoch:
            return cached[1]
        found: dict[int, SegmentRecord] = {}
        for e in range(epoch + 1):
            for seg in self.controller.epoch_segments(scope, stream, e):
                found.setdefault(seg.number, seg)
        segments = [found[n] for n in sorted(found)]
        self._foreign_segments[(scope, stream)] = (epoch, segments)
        return segments

    def partitions_count(self, topic: str) -> int | None:
        """How many partitions ``topic`` has; None if there is no such topic."""
        if "." in topic:
            located = self.locate(topic)
            if located is None:
                return None
            if located[0] != self.scope:
                return len(self._segments_of(*located))
            return len(self.controller.epoch_segments(*located, 0))
        stream = self._stream(topic)
        if stream is None:
            return None
        return len(self.controller.epoch_segments(self.scope, stream, 0))

    async def known_partitions(self, topic: str) -> int | None:
        """``partitions_count`` after the controller looked again, for a topic it
        did not know: a cluster follower's view of topics created through other
        nodes may lag (``docs/cluster.md#doors``); elsewhere the second look
        changes nothing. Callers ask ``partitions_count`` first."""
        if is_valid_topic(topic) or stream_of(topic) is not None:
            await self.controller.refresh()
        return self.partitions_count(topic)

    def is_read_only(self, topic: str) -> bool:
        located = self.locate(topic)
        return located is not None and self.controller.is_sealed(*located)

    def topics(self) -> list[tuple[str, int, bool]]:
        """(topic, partitions, enabled) for every stream of the scope that is a topic."""
        found = []
        for stream in self.controller.list_streams(self.scope, limit=_LISTED_STREAMS_MAX):
            topic = topic_name(stream)
            if is_valid_topic(topic):
                count = len(self.controller.epoch_segments(self.scope, stream, 0))
                found.append((topic, count, not self.controller.is_sealed(self.scope, stream)))
        return found

    async def create_topic(self, topic: str, partitions: int, config: bytes) -> None:
        """Create ``topic``'s stream with ``partitions`` segments; ``config`` is
        checked, then ignored (``_config_is_valid``).

        Raises:
            InvalidTopic: the name is not a topic name, or ``partitions`` < 1.
            InvalidTopicConfig: ``config`` does not parse.
            ControllerError: the controller refused the stream (``StreamExists``,
                ``TooMany``, ``InvalidArgument`` for more partitions than a
                stream may have).
            StoreError: the store failed.
        """
        if not is_valid_topic(topic) or partitions < 1:
            raise InvalidTopic(f"topic {topic!r} with {partitions} partitions")
        if not _config_is_valid(config):
            raise InvalidTopicConfig(f"config of topic {topic!r}")
        scaling = ScalingPolicy(ScalingType.FIXED_NUM_SEGMENTS, min_num_segments=partitions)
        await self.controller.create_stream(
            self.scope, stream_name(topic), StreamConfig(scaling=scaling)
        )

    # ------------------------------------------------------------------ partition state

    async def partition(self, topic: str, partition_id: int) -> Partition:
        """The loaded state of an existing partition (check ``partitions_count`` first)."""
        part = self._partition(topic, partition_id)
        if not part.loaded:
            async with self._exclusive(part):
                if not part.loaded:
                    await self._load(part)
        return part

    def _partition(self, topic: str, partition_id: int) -> Partition:
        """The state of an existing partition, loaded or not."""
        part = self._by_topic.get((topic, partition_id))
        if part is not None:
            return part
        foreign = False
        if "." in topic:  # SCOPE.STREAM: partition n is the stream's segment number n
            located = self.locate(topic)
            assert located is not None
            if located[0] != self.scope:
                foreign = True
                seg = self._segments_of(*located)[partition_id]
                name = segment_name(*located, seg.id)
            else:
                name = segment_name(*located, segment_id(0, partition_id))
        else:
            name = segment_name(self.scope, stream_name(topic), segment_id(0, partition_id))
        part = self._partitions.get(name)
        if part is None:
            part = self._partitions[name] = Partition(name, foreign)
        if not foreign:  # a foreign stream's partitions are looked up again (it may be recreated)
            self._by_topic[(topic, partition_id)] = part
        return part

    @contextlib.asynccontextmanager
    async def _exclusive(self, part: Partition) -> AsyncIterator[None]:
        """Hold the partition's lock with no append in flight: appends that
        arrive meanwhile queue on the lock instead of being issued (``append``)."""
        part.exclusive += 1
        try:
            async with part.lock:
                await part.settled()
                yield
        finally:
            part.unlocked()
            self._drain(part)

    @property
    def open_partitions(self) -> int:
        return sum(1 for part in self._partitions.values() if part.loaded)

    async def _load(self, part: Partition) -> None:
        """Rebuild a partition's numbering from the store and the anchors table."""
        began = time.perf_counter()
        info = await self.store.info(part.segment)
        stored = self._stored_anchors.pop(part.segment, None)
        # On a reload, the index we had also knows where bundles start.
        indexed = dict(zip(part.index_offsets, part.index_seqs, strict=True))
        previous_hwm = part.hwm if part.length else 0
        if stored is None:  # a reload: the anchors we already had
            stored = dict(part.anchors)
        stale = [o for o in stored if o >= info.length]
        if stale:  # anchors written for appends that never became durable
            try:
                await self.store.remove_table_keys(
                    self.table, [TableKey(_anchor_key(part.segment, o)) for o in stale]
                )
            except StoreError as exc:
                # A failed write fails the store: no append can reach those
                # offsets before a restart, whose load removes them. Reads go on.
                log.warning("tank: removing stale anchors of %s failed: %s", part.segment, exc)
        part.anchors = {o: s for o, s in stored.items() if info.start_offset <= o < info.length}
        part.start = info.start_offset
        part.length = part.tail_length = info.length
        part.sealed = info.sealed
        part.index_offsets, part.index_seqs = [], []
        part.first_seq = part.hwm = 0
        if part.start == 0:
            part.origin_seq = 1
        else:
            known = {o: q for o, q in indexed.items() if o >= part.start} | part.anchors
            part.origin_seq = await self._origin_after_truncation(part, known, previous_hwm)
        for offset in sorted(part.anchors):
            part.note(offset, part.anchors[offset])
        if part.anchors:
            part.checkpoint_offset = max(part.anchors)
        # The first bundle gives the first available seq num, the last the high-water mark.
        async for bundle in self._walk(part, part.start, part.origin_seq, part.length):
            part.first_seq = bundle.first
            part.note(bundle.offset, bundle.first)
            break
        last: _Bundle | None = None
        if part.first_seq:
            offset, next_seq = part.floor(2**64)  # the last index entry
            async for bundle in self._walk(part, offset, next_seq, part.length):
                part.note(bundle.offset, bundle.first)
                last = bundle
        if part.foreign:  # a byte stream's last piece may wait for more bytes (or the seal)
            part.length = last.end if last is not None else part.start
        if last is not None:
            part.hwm = last.last
            if last.offset > part.checkpoint_offset:
                # Anchor the tail, so that a truncation while we are down still
                # finds a known seq num after it.
                part.checkpoint_offset = last.offset
                try:
                    await self._put_anchor(part, last.offset, last.first)
                except StoreError as exc:  # only a restart's speed depends on it
                    log.warning("tank: anchoring the tail of %s failed: %s", part.segment, exc)
        part.tail_hwm = part.hwm
        part.loaded = True
        self.open_time_us += int((time.perf_counter() - began) * 1e6)

    async def _origin_after_truncation(
        self, part: Partition, known_seqs: dict[int, int], previous_hwm: int
    ) -> int:
        """The seq num the first ordinary bundle after a truncated head gets: counted
        back from the first bundle whose seq num is known (an anchor, an entry of the
        index we had before a reload, or a sparse bundle), or else from the
        high-water mark we had before a reload."""
        count = 0
        events = self._events(part.segment, part.start, part.length, pieces=part.foreign)
        async for offset, end, payload in events:
            header = self._bundle_header(part, offset, end, payload)
            if header is None:
                continue
            known = header.first_seq_num if header.sparse else known_seqs.get(offset)
            if known is not None:
                return known - count
            count += header.msg_count
        if previous_hwm >= count:
            return previous_hwm - count + 1
        if count:
            log.warning(
                "tank: %s was truncated and has no anchor; numbering its %d messages from 1",
                part.segment,
                count,
            )
        return 1

    async def _events(
        self, segment: str, offset: int, end: int, *, pieces: bool = False, sealed: bool = True
    ) -> AsyncIterator[tuple[int, int, memoryview]]:
        """Yield (offset, end, payload) of each event in ``[offset, end)``; with
        ``pieces``, bytes that are not events then as ``_raw_pieces``."""
        view = memoryview(b"")
        base = offset
        position = offset
        while position < end:
            rel = position - base
            need = EVENT_HEADER.size
            if len(view) - rel >= need:
                kind, length = EVENT_HEADER.unpack_from(view, rel)
                need += max(length, 0)
            if len(view) - rel < need:
                count = min(max(need, SCAN_READ_BYTES), end - position)
                view = await self._read(segment, position, count)
                base, rel = position, 0
                if len(view) < EVENT_HEADER.size:
                    return
            kind, length = EVENT_HEADER.unpack_from(view, rel)
            if kind != EVENT_TYPE or length < 0 or position + EVENT_HEADER.size + length > end:
                if pieces:
                    async for piece in self._raw_pieces(segment, position, end, sealed):
                        yield piece
                    return
                log.warning("tank: %s has no event at offset %d; stopping there", segment, position)
                return
            if len(view) - rel < EVENT_HEADER.size + length:
                view = await self._read(segment, position, EVENT_HEADER.size + length)
                base, rel = position, 0
                if len(view) < EVENT_HEADER.size + length:
                    return
            start = rel + EVENT_HEADER.size
            next_position = position + EVENT_HEADER.size + length
            yield position, next_position, view[start : start + length]
            position = next_position

    async def _raw_pieces(
        self, segment: str, offset: int, end: int, sealed: bool
    ) -> AsyncIterator[tuple[int, int, memoryview]]:
        """A byte stream's bytes from ``offset`` as ``RAW_PIECE_BYTES`` pieces; the last,
        shorter one only if the segment is ``sealed`` (it could still grow)."""
        position = offset
        while position < end:
            stop = position + RAW_PIECE_BYTES
            if stop > end:
                if not sealed:
                    return
                stop = end
            view = await self._read(segment, position, stop - position)
            if len(view) < stop - position:
                return
            yield position, stop, view
            position = stop

    async def _read(self, segment: str, offset: int, count: int) -> memoryview:
        """Read ``count`` bytes at ``offset`` (fewer only if the segment ends first)."""
        parts: list[bytes] = []
        got = 0
        while got < count:
            result = await self.store.read(segment, offset + got, min(count - got, MAX_READ_BYTES))
            if not result.data:
                break
            parts.append(result.data)
            got += len(result.data)
        return memoryview(parts[0] if len(parts) == 1 else b"".join(parts))

    def _bundle_header(
        self, part: Partition, offset: int, end: int, payload: memoryview
    ) -> t.BundleHeader | None:
        """The header of the event at ``offset`` if it is a valid bundle, else None
        (counted as skipped). Checked in full unless ``part.verified`` covers it, so
        every walk over the same bytes sees the same bundles, and the numbering holds.
        An event of a stream that is not a TANK topic is one message."""
        if part.foreign:
            return _EVENT_AS_BUNDLE
        if part.verified.end_of(offset) >= end:
            return _header(payload)
        header = _validate_bundle(payload)
        if header is None:
            self.skipped()
            return None
        part.verified.add(offset, end)
        return header

    async def _walk(
        self, part: Partition, offset: int, next_seq: int, end: int
    ) -> AsyncIterator[_Bundle]:
        """Yield the bundles in ``[offset, end)`` with their seq nums; ``next_seq`` is
        what the bundle at ``offset`` gets unless it is sparse or anchored. Events
        that are not bundles (stored behind the broker's back) are skipped."""
        verified_end = part.verified.end_of(offset)
        events = self._events(part.segment, offset, end, pieces=part.foreign, sealed=part.sealed)
        async for position, event_end, payload in events:
            if part.foreign:
                header: t.BundleHeader | None = _EVENT_AS_BUNDLE
            elif event_end <= verified_end:
                header = _header(payload)
            else:
                header = self._bundle_header(part, position, event_end, payload)
                verified_end = part.verified.end_of(position)
            if header is None:
                continue
            if header.sparse:
                assert header.first_seq_num is not None and header.last_seq_num is not None
                first, last = header.first_seq_num, header.last_seq_num
            else:
                first = part.anchors.get(position, next_seq)
                last = first + header.msg_count - 1
            next_seq = last + 1
            yield _Bundle(position, event_end, first, last, header.sparse, payload)

    # ------------------------------------------------------------------ produce

    async def append(
        self, topic: str, partition_id: int, bundle: bytes, explicit_first: int
    ) -> None:
        """Validate one produced bundle, store it durably and number its messages.

        An append that needs nothing first (the partition is loaded, no anchor
        to write, no caller holds its lock) is numbered and issued to the store
        in this coroutine's first step and then waits for its sync without
        holding anything: appends behind it are issued meanwhile, so one sync
        serves them all. Any other joins the partition's backlog, issued in
        arrival order (``_drain``) by whoever releases the lock.

        Raises:
            InvalidBundle, InvalidSeqNums: nothing was stored.
            StoreError: the segment could not be read (or is gone), or the
                append failed (``BadOffset`` if the segment grew behind our
                back again after a reload).
        """
        header = _validate_bundle(bundle)
        if header is None:
            raise InvalidBundle(f"a bundle of {len(bundle)} bytes")
        part = self._partition(topic, partition_id)
        if part.foreign:  # rare: one at a time, under the partition's lock
            async with self._exclusive(part):
                if not part.loaded:
                    await self._load(part)
                await self._append_events(part, bundle, header, explicit_first)
            return
        if part.loaded and not part.exclusive and not part.backlog:
            first, last, anchored = _numbers(part, header, explicit_first)
            if not anchored:
                try:
                    await self._store(part, bundle, first, last, anchored=False)
                    return
                except BadOffset:  # refused as issued: nothing stored; reload below
                    log.info("tank: %s was appended to through another protocol", part.segment)
        pending = _Pending(bundle, header, explicit_first)
        part.backlog.append(pending)
        self._drain(part)
        stored = await pending.stored
        await stored

    def _drain(self, part: Partition) -> None:
        """Issue the partition's backlog in order, now, while nothing holds its
        lock; hand the first append that must wait (a load, an anchor, a reload
        after a foreign append) to a task that takes the lock, and stop there.
        Each append gets what to await for its sync (``_Pending.stored``)."""
        backlog = part.backlog
        while backlog and not part.exclusive:
            pending = backlog[0]
            if part.loaded:
                try:
                    first, last, anchored = _numbers(part, pending.header, pending.explicit_first)
                except InvalidSeqNums as exc:
                    backlog.popleft()
                    pending.fail(exc)
                    continue
                if not anchored:
                    backlog.popleft()
                    bundle = pending.bundle
                    stored = step_now(self._store(part, bundle, first, last, anchored=False))
                    if not part.loaded and not pending.retried:  # refused as issued
                        log.info("tank: %s was appended to through another protocol", part.segment)
                        pending.retried = True
                        backlog.appendleft(pending)
                        continue
                    pending.issued(stored)
                    continue
            backlog.popleft()
            part.exclusive += 1  # appends arriving meanwhile join the backlog
            task = asyncio.create_task(self._append_locked(part, pending))
            self._slow.add(task)
            task.add_done_callback(self._slow.discard)
            return

    async def _append_locked(self, part: Partition, pending: _Pending) -> None:
        """Store ``pending`` under the partition's lock (``exclusive`` already
        counted): load the partition, write its anchor, issue it; then release
        the lock and issue the backlog that queued meanwhile."""
        try:
            async with part.lock:
                await part.settled()
                for again in (True, False):  # once more after someone else appended
                    if not part.loaded:
                        await self._load(part)
                    header, explicit_first = pending.header, pending.explicit_first
                    first, last, anchored = _numbers(part, header, explicit_first)
                    if anchored:
                        await self._put_anchor(part, part.tail_length, first)
                    storing = self._store(part, pending.bundle, first, last, anchored=anchored)
                    stored = step_now(storing)
                    if isinstance(stored, asyncio.Future) or part.loaded or not again:
                        break
                    log.info("tank: %s was appended to through another protocol", part.segment)
            pending.issued(stored)
        except Exception as exc:  # the append's caller gets it
            pending.fail(exc)
        finally:
            part.unlocked()
            self._drain(part)

    async def _store(
        self, part: Partition, bundle: bytes, first: int, last: int, *, anchored: bool
    ) -> None:
        """Append a valid, numbered bundle at the partition's tail (its anchor
        written first if ``anchored``). Issued in the first step. A failed append
        leaves the partition to be reloaded at its next use; ``BadOffset`` says
        the segment had grown behind our back (another front door appended)."""
        offset = part.tail_length
        frame = EVENT_HEADER.pack(EVENT_TYPE, len(bundle)) + bundle
        self._own_frames.add(id(frame))  # validated above: the store's check lets it by
        # The tail moves as the append is issued (the store fixes its offset in
        # the call's first step), so the next append is numbered after it.
        part.tail_length = offset + len(frame)
        part.tail_hwm = last
        part.in_flight += 1
        try:
            result = await self.store.append(part.segment, frame, expected_offset=offset)
        except StoreError:
            part.loaded = False  # the next use rebuilds the numbering from the store
            if anchored:
                with contextlib.suppress(StoreError):
                    key = TableKey(_anchor_key(part.segment, offset))
                    await self.store.remove_table_keys(self.table, [key])
            raise
        finally:
            self._own_frames.discard(id(frame))
            part.landed()
        # Durable: only now do the numbers move and parked consumes wake. Appends
        # of one partition become durable in the order issued; max() keeps the
        # numbers monotonic whatever order their callers resume in.
        part.verified.add(offset, result.length)
        if anchored:
            part.anchors[offset] = first
        if not part.first_seq or offset == part.start:  # the first bundle may resume last
            part.first_seq = first
        part.hwm = max(part.hwm, last)
        part.length = max(part.length, result.length)
        part.note(offset, first)
        entry_bytes = len(encode_varint(len(bundle))) + len(bundle)
        for waiter in list(part.waiters):
            waiter.appended(entry_bytes)
        if offset - part.checkpoint_offset >= CHECKPOINT_INTERVAL_BYTES:
            part.checkpoint_offset = offset
            try:
                await self._put_anchor(part, offset, first)
            except StoreError as exc:  # only a restart's speed depends on it
                log.warning("tank: checkpoint of %s failed: %s", part.segment, exc)

    async def _append_events(
        self, part: Partition, bundle: bytes, header: t.BundleHeader, explicit_first: int
    ) -> None:
        """``append`` for a stream that is not a TANK topic: each message of
        the bundle becomes one ordinary event (its key and timestamp are not kept),
        numbered after the partition's last; one store append for them all."""
        if header.sparse or explicit_first:
            raise InvalidSeqNums(f"{part.segment} numbers its events itself")
        messages = t.decode_bundle(bundle, 1, max_unpacked_bytes=t.MAX_STORED_UNPACKED_BYTES)
        frame = b"".join(
            EVENT_HEADER.pack(EVENT_TYPE, len(m.content)) + m.content for m in messages
        )
        if len(frame) > MAX_APPEND_BYTES:
            raise InvalidBundle(f"a bundle whose events take {len(frame)} bytes")
        first = part.hwm + 1 if part.hwm else part.origin_seq
        offset = part.length
        try:
            result = await self.store.append(part.segment, frame, expected_offset=offset)
        except StoreError:
            part.loaded = False  # the next use rebuilds the numbering from the store
            raise
        if not part.first_seq:
            part.first_seq = first
        part.hwm = part.tail_hwm = first + len(messages) - 1
        part.length = part.tail_length = result.length
        part.note(offset, first)
        entry_bytes = len(encode_varint(len(bundle))) + len(bundle)
        for waiter in list(part.waiters):
            waiter.appended(entry_bytes)

    async def catch_up(self, part: Partition) -> int:
        """Re-read a partition whose segment grew through another front door (a
        Pravega writer, the segment store); return the seq nums it gained.

        Under the partition's lock, so a TANK append in progress finishes first
        (its own growth is not foreign). Raises StoreError.
        """
        async with self._exclusive(part):
            before = part.hwm
            if part.loaded:
                info = await self.store.info(part.segment)
                if info.length <= part.length:
                    return 0
                log.info("tank: %s was appended to through another protocol", part.segment)
            await self._load(part)
            return max(part.hwm - before, 0)

    def check_append(self, data: bytes | memoryview) -> str | None:
        """The store's check of every append to the scope's streams (``check_appends``):
        whole Pravega events, each a valid bundle, or the reason it is refused.

        Whatever front door an append comes through (a Pravega writer, an RS-IO
        offer, a Lumberjack target in the scope), a TANK topic then holds only
        what a TANK consumer can read.
        """
        if id(data) in self._own_frames:
            return None
        view = memoryview(data)
        position = 0
        while position < len(view):
            if len(view) - position < EVENT_HEADER.size:
                return f"bytes at {position} of the append are not a whole event"
            kind, length = EVENT_HEADER.unpack_from(view, position)
            start = position + EVENT_HEADER.size
            if kind != EVENT_TYPE or length < 0 or start + length > len(view):
                return f"bytes at {position} of the append are not a whole event"
            if _validate_bundle(view[start : start + length]) is None:
                return (
                    f"event at {position} of the append is not a TANK bundle "
                    f"(a topic of scope {self.scope!r} holds only bundles)"
                )
            position = start + length
        return None

    async def _put_anchor(self, part: Partition, offset: int, first: int) -> None:
        update = TableUpdate(_anchor_key(part.segment, offset), _ANCHOR_VALUE.pack(first))
        await self.store.update_table(self.table, [update])

    # ------------------------------------------------------------------ consume

    async def read(
        self, topic: str, partition_id: int, seq_num: int, fetch_size: int, budget: int
    ) -> tuple[Partition, Chunk | OutOfRange | None]:
        """What a consume of one partition from ``seq_num`` gets (tank.md#broker-consume),
        with the partition (whose ``hwm`` the answer carries):

        * None: the partition is at its end there (seq num 2^64-1, the high-water
          mark + 1, or 0 while it is empty), so the consume may park;
        * ``OutOfRange``: the partition does not hold ``seq_num``;
        * a ``Chunk`` (``read_chunk``), empty when ``budget`` is spent.

        Once more if the partition's head was truncated meanwhile. Check
        ``partitions_count`` first. Raises StoreError.
        """
        part = await self.partition(topic, partition_id)
        if part.foreign and part.hwm + 1 < seq_num < t.SEQ_NUM_TAIL:
            await self.catch_up(part)  # written through other doors since it was loaded
        try:
            return part, await self._read_from(part, seq_num, fetch_size, budget)
        except SegmentTruncated:
            part = await self.partition(topic, partition_id)  # reloads
            return part, await self._read_from(part, seq_num, fetch_size, budget)

    async def _read_from(
        self, part: Partition, seq_num: int, fetch_size: int, budget: int
    ) -> Chunk | OutOfRange | None:
        first, last = part.first_seq, part.hwm
        if seq_num == t.SEQ_NUM_TAIL or seq_num == last + 1 or (seq_num == 0 and not last):
            return None
        if seq_num == 0:
            seq_num = first
        if seq_num < first or seq_num > last + 1:
            return OutOfRange(first, last)
        if budget <= 0:  # the response is full: an empty chunk, the client asks again
            return Chunk(seq_num, False, [])
        return await self.read_chunk(part, part.floor(seq_num), seq_num, fetch_size, budget)

    async def read_new(
        self, part: Partition, length: int, hwm: int, fetch_size: int, budget: int
    ) -> Chunk | None:
        """The bundles appended to ``part`` past ``length``, where a consume parked
        when its high-water mark was ``hwm``, as ``read_chunk`` gives them; None if
        there are none or ``budget`` is spent. Raises StoreError."""
        if part.length <= length or budget <= 0:
            return None
        start = (length, hwm + 1 if hwm else part.origin_seq)
        return await self.read_chunk(part, start, start[1], fetch_size, budget)

    async def wait_for_appends(self, waiter: Waiter, ends: list[tuple[Partition, int]]) -> None:
        """Park ``waiter`` on partitions, each given with the segment offset up to
        which its bytes are known, until it is done: enough bytes appended through
        any front door, its time up, or its connection gone (``Waiter``)."""
        watched = {id(part): (part, length) for part, length in ends}
        for part, _ in watched.values():
            part.waiters.add(waiter)
        store = self.store
        try:
            while not waiter.done:
                wake = waiter.arm()
                grown, registered = self._watch_foreign(watched, wake)
                if grown:
                    await self._catch_up(watched, grown, waiter)
                    continue
                try:
                    await wake
                finally:
                    for segment in registered:  # no-ops for the segment that woke it
                        store.unwatch(segment, wake)
        finally:
            for part, _ in ends:
                part.waiters.discard(waiter)

    def _watch_foreign(
        self, watched: dict[int, tuple[Partition, int]], wake: asyncio.Future[None]
    ) -> tuple[list[Partition], list[str]]:
        """Have the store resolve ``wake`` when a watched partition's segment changes.

        Returns the partitions that have bytes past what is known already
        (then nothing stays registered) and the segments ``wake`` watches.

        TANK's own produces wake parked consumes directly (``_append_locked``);
        bytes appended by anything else (a Pravega writer writing bundles into
        the topic's stream) only show in the store, which notifies whatever
        protocol appended. A partition the store cannot watch (deleted, store
        closed) is dropped: the consume answers on its timer.
        """
        store = self.store
        grown: list[Partition] = []
        registered: list[str] = []
        for key, (part, offset) in list(watched.items()):
            try:
                if store.watch(part.segment, offset, wake):
                    registered.append(part.segment)
                else:
                    grown.append(part)
            except StoreError as exc:
                log.debug("tank: watching %s stopped: %s", part.segment, exc)
                del watched[key]
        if grown:
            for segment in registered:
                store.unwatch(segment, wake)
            registered.clear()
        return grown, registered

    async def _catch_up(
        self,
        watched: dict[int, tuple[Partition, int]],
        grown: list[Partition],
        waiter: Waiter,
    ) -> None:
        """Index what reached ``grown`` partitions through another front door and
        count it towards ``min_bytes``. Events that are not bundles give no
        messages and do not count; a partition that did not grow (sealed) is
        no longer watched."""
        for part in grown:
            key = id(part)
            offset = watched[key][1]
            try:
                gained = await self.catch_up(part)
            except StoreError as exc:  # deleted, closed: the consume answers on its timer
                log.debug("tank: watching %s stopped: %s", part.segment, exc)
                del watched[key]
                continue
            if gained:
                waiter.appended(max(part.length - offset, 1))
            elif part.length <= offset:
                del watched[key]  # sealed: nothing more will come
                continue
            watched[key] = (part, part.length)

    async def read_chunk(
        self,
        part: Partition,
        start: tuple[int, int],
        seq_num: int,
        fetch_size: int,
        budget: int,
    ) -> Chunk | None:
        """Whole bundles from the one containing ``seq_num`` (or the next one after a
        gap), walking from ``start`` = (offset, next seq num); at least ``fetch_size``
        bytes if there are that many, within ``budget`` (but always one bundle)."""
        try:
            async with self._read_slots:
                return await self._read_chunk(part, start, seq_num, fetch_size, budget)
        except SegmentTruncated:
            part.loaded = False  # truncated behind our back: the next use re-reads it
            raise

    async def _append_times(self, segment: str, offset: int, end: int) -> list[tuple[int, int]]:
        """The time-index entries giving the append times of ``[offset, end)``
        (none from a store without a time index)."""
        store = self.store
        if not isinstance(store, TimeIndexed):
            return []
        return await store.append_times(segment, offset, end)

    async def _read_chunk(
        self,
        part: Partition,
        start: tuple[int, int],
        seq_num: int,
        fetch_size: int,
        budget: int,
    ) -> Chunk | None:
        end, hwm = part.length, part.hwm
        times: list[tuple[int, int]] | None = None  # a foreign chunk's append times
        out = bytearray()  # small entries, copied together
        size = 0
        chunk: Chunk | None = None
        previous_last = 0
        yielded = 0
        async for bundle in self._walk(part, start[0], start[1], end):
            part.note(bundle.offset, bundle.first)
            if chunk is None:
                if bundle.last < seq_num:
                    continue
                chunk = Chunk(bundle.first, bundle.sparse, [])
            elif size >= fetch_size:
                break
            elif not bundle.sparse and bundle.first != previous_last + 1:
                # An anchored bundle (ProduceWithSeqnum) after a gap: a client numbers
                # a chunk's ordinary bundles consecutively, so it starts the next chunk
                # (as a new segment file would in TANK).
                break
            if bundle.first > hwm:
                break
            previous_last = bundle.last
            payload: bytes | memoryview = bundle.payload
            if part.foreign:
                if times is None:  # one look at the time index for the whole chunk
                    times = await self._append_times(part.segment, bundle.offset, end)
                payload = _event_bundle(bundle.payload, bundle.offset, times)
            entry = encode_varint(len(payload))
            if size and size + len(entry) + len(payload) > budget:
                break
            out += entry
            if len(payload) >= VIEW_MIN_BYTES:
                chunk.parts += (out, payload)
                out = bytearray()
            else:
                out += payload
            size += len(entry) + len(payload)
            if size >= yielded + YIELD_EVERY_BYTES:  # let other connections in
                yielded = size
                await asyncio.sleep(0)
        if chunk is None or not size:
            return None
        if out:
            chunk.parts.append(out)
        chunk.size_bytes = size
        return chunk


def _anchor_key(segment: str, offset: int) -> bytes:
    return segment.encode() + b"\x00" + offset.to_bytes(_ANCHOR_OFFSET_BYTES, "big")


def _header(payload: memoryview) -> t.BundleHeader | None:
    """The bundle header of a stored event, or None if the event is not a bundle."""
    try:
        return t.decode_bundle_header(payload[:BUNDLE_HEADER_MAX_BYTES])
    except RemoteProtocolError:
        return None


def _numbers(part: Partition, header: t.BundleHeader, explicit_first: int) -> tuple[int, int, bool]:
    """A bundle's first and last seq nums at the partition's tail, and whether
    they need an anchor (a restart's walk would number them otherwise).

    Raises:
        InvalidSeqNums: they would not be above the last one issued.
    """
    if header.sparse:
        assert header.first_seq_num is not None and header.last_seq_num is not None
        first, last = header.first_seq_num, header.last_seq_num
    else:
        first = explicit_first or part.tail_hwm + 1
        last = first + header.msg_count - 1
    if (header.sparse or explicit_first) and first <= part.tail_hwm:
        # seq nums never go backwards (tank.md#produce-semantics)
        raise InvalidSeqNums(f"{first} is not above the high-water mark {part.tail_hwm}")
    if last >= t.SEQ_NUM_TAIL:
        raise InvalidSeqNums(f"last seq num {last} is the tail")
    walk_would_give = part.tail_hwm + 1 if part.tail_hwm else part.origin_seq
    return first, last, not header.sparse and first != walk_would_give


def _validate_bundle(bundle: bytes | memoryview) -> t.BundleHeader | None:
    """The header of a well-formed bundle; None for a malformed one (tank.md#bundles), or one
    whose messages unpack to more than ``MAX_STORED_UNPACKED_BYTES``."""
    if not 0 < len(bundle) <= MAX_BUNDLE_BYTES:
        return None
    try:
        # every message, decompressed: nothing malformed is stored
        return t.validate_bundle(bundle, max_unpacked_bytes=t.MAX_STORED_UNPACKED_BYTES)
    except RemoteProtocolError:
        return None


_SIZE_SUFFIXES = {"b": 1, "k": 2**10, "kb": 2**10, "m": 2**20, "mb": 2**20, "g": 2**30}
_SIZE_SUFFIXES |= {"gb": 2**30, "t": 2**40, "tb": 2**40}
_DURATION_SUFFIXES = {"s": 1, "sec": 1, "min": 60, "h": 3600, "hour": 3600, "d": 86400}
_DURATION_SUFFIXES |= {"day": 86400, "w": 604800, "week": 604800, "mon": 2592000}
_DURATION_SUFFIXES |= {"month": 2592000, "y": 31536000, "year": 31536000}
_SIZE_KEYS = {
    "log.segment.bytes",
    "log.index.interval.bytes",
    "log.index.size.max.bytes",
    "log.retention.bytes",
}
_DURATION_KEYS = {"log.roll.jitter.secs", "log.roll.secs", "log.retention.secs", "flush.secs"}
_COUNT_KEYS = {"retention.segments.count", "flush.messages"}
_VALUE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([a-z]*)")


def _config_is_valid(config: bytes) -> bool:
    """Whether a CreateTopic config parses (tank.md#create-topic). Values are checked, then
    ignored: headrace streams have no segment files to roll or flush."""
    try:
        text = config.decode()
    except UnicodeDecodeError:
        return False
    for raw in text.split("\n"):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        key, sep, value = (part.strip() for part in line.partition("="))
        if not sep:
            return False
        value = value.lower()
        if key == "log.cleanup.policy":
            if value not in ("delete", "cleanup"):
                return False
            continue
        if key == "log.cleaner.min.cleanable.ratio":
            try:
                float(value)
            except ValueError:
                return False
            continue
        if key in _SIZE_KEYS | _DURATION_KEYS | _COUNT_KEYS:
            match = _VALUE.fullmatch(value)
            if match is None:
                return False
            suffix = match.group(2)
            allowed = _SIZE_SUFFIXES if key in _SIZE_KEYS else _DURATION_SUFFIXES
            if suffix and (key in _COUNT_KEYS or suffix not in allowed):
                return False
        # Unknown keys are ignored, as TANK does.
    return True
