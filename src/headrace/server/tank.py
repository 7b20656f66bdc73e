"""The TANK broker front door: TANK requests in, store calls, TANK responses out.

Protocol, and what headrace does where TANK leaves room:
``docs/protocols/tank.md`` (``tank.md#...`` below names its anchors). The
connection loop (``_loop.py``) runs each request as its own task; this module
adds what a front door may add (``docs/architecture.md#front-doors``): ``TankHandler`` (the sans-I/O
``TankConnection`` and one dispatch table, ``DISPATCH``), the shared
``TankBroker`` (topics, partitions, sequence numbers, parked consumes) and
``start_tank``, registered as the ``tank`` listener.

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

Acknowledgement (``docs/architecture.md#invariant-durable-acks``): a produce is answered after the
store's
append returned, i.e. once the bundle is durable; only then do the partition's
high-water mark move and parked consumes wake. Appends to one partition are
serialised (its lock) and use ``expected_offset``, so a foreign append to the
segment is detected instead of corrupting the numbering.

Consume (tank.md#consume): chunks hold whole bundles, start at the bundle containing
the wanted seq num and grow to at least ``fetch_size``; seq num 0 is the first
available, 2^64-1 the tail; a consume finding every partition at its end
parks (woken by appends until ``min_bytes`` arrived, bounded by the request's
``max_wait_ms``, at most one hour). Only error codes TANK defines are sent;
a store error is an I/O fault, or what ``STORE_ERROR_CODES`` says.

Auth (``server/authz.py``): with auth on, a client is the user its TLS
certificate names, and each request needs that user's grant on the topic's
stream. TANK has no "not allowed" code, so a refusal is the nearest the
protocol has: produce without READ_UPDATE gets the topic-level ``READ_ONLY``
(0xfe), create topic without READ_UPDATE on the scope gets ``READ_ONLY`` (5),
and consume, discover partitions and reload conf without READ answer as for
an unknown topic (a topic the client may not read is not shown to exist);
discover topics and status list only readable topics.

A connection's consume responses in the making, queued and with its writer
add up to at most ``MAX_QUEUED_CHUNK_BYTES``: room is taken before the store is
read, so a client that does not read gets nothing more read for it.

Only bundles go into a topic's stream: the broker has the store refuse any
other append under its scope (``check_appends``), whatever front door it
comes through. An event that is not a bundle all the same (written before,
or behind the server's back) is skipped by every walk and counted
(``headrace_skipped_events_total``); the bytes a walk found to be whole,
valid bundles are remembered per partition (``_Verified``), so each stored
bundle is checked in full once, not at every consume.
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
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Final, NamedTuple

from headrace.controller.errors import ControllerError, ScopeExists, StreamExists, TooMany
from headrace.controller.model import ControllerModel
from headrace.controller.naming import is_valid_name, segment_id, segment_name
from headrace.controller.records import ScalingPolicy, ScalingType, StreamConfig
from headrace.errors import (
    BadOffset,
    ConfigError,
    OwnerUnavailable,
    RemoteProtocolError,
    SegmentExists,
    SegmentTruncated,
    StoreError,
)
from headrace.protocols import tank as t
from headrace.protocols.pravega import EVENT_HEADER
from headrace.protocols.pravega.auth import Permission, scope_resource, stream_resource
from headrace.protocols.tank.codec import encode_varint
from headrace.server._listen import start_tcp_listener
from headrace.server._loop import ConnectionHandler, OutputPiece
from headrace.server.app import LISTENER_STARTERS, Listener, ServerApp
from headrace.server.authz import ConnectionAccess, DoorAuth
from headrace.store.api import MAX_APPEND_BYTES, MAX_READ_BYTES, SegmentStore
from headrace.types import FileRegion, TableKey, TableUpdate

__all__ = [
    "CHECKPOINT_INTERVAL_BYTES",
    "DEFAULT_SCOPE",
    "DISPATCH",
    "HEARTBEAT_INTERVAL_S",
    "INDEX_INTERVAL_BYTES",
    "MAX_RESPONSE_CHUNK_BYTES",
    "TankBroker",
    "TankHandler",
    "start_tank",
    "stream_name",
    "topic_name",
]

log = logging.getLogger(__name__)


class _Codes(NamedTuple):
    """What a produce, a consume and a partition discovery answer a store error with."""

    produce: t.ProduceError
    consume: t.ConsumeError
    discover: t.DiscoverPartitionsError


STORE_ERROR_CODES: Final[dict[type[StoreError], _Codes]] = {
    OwnerUnavailable: _Codes(
        t.ProduceError.NO_LEADER, t.ConsumeError.NO_LEADER, t.DiscoverPartitionsError.NO_LEADER
    ),
}
"""Store error -> its TANK codes: a partition whose owner (another node) cannot be
reached now has no leader, the cluster code a client retries on. Any other
store error is an I/O fault (``_FAULT``)."""

_FAULT: Final = _Codes(
    t.ProduceError.IO_FAULT, t.ConsumeError.SYSTEM_ERROR, t.DiscoverPartitionsError.SYSTEM_ERROR
)


def _codes(exc: StoreError) -> _Codes:
    return STORE_ERROR_CODES.get(type(exc), _FAULT)


DEFAULT_SCOPE = "tank"
"""The scope holding TANK topics (architecture.md#tank-topics); ``--tank-scope`` changes
it."""

HEARTBEAT_INTERVAL_S = 30.0
"""A Ping goes to every connection this often. TANK v4 sends none after the greeting,
but every client skips Pings (tank.md#greeting), and a periodic frame lets a client (and any
NAT or proxy on the way) see that an idle connection is alive."""

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

MAX_RESPONSE_CHUNK_BYTES = 64 * 1024 * 1024
"""Chunk bytes in one consume response, all partitions together: one partition's
largest fetch (tank.md#consume), a quarter of the 256 MiB frame limit. Partitions past it
(or past the connection's room, ``MAX_QUEUED_CHUNK_BYTES``) get an empty chunk and
the client asks again; a partition reached within it gets at least one bundle, so
a response overshoots by one bundle at most."""

VIEW_MIN_BYTES = 64 * 1024
"""Bundles at least this large go into a consume response as views of the bytes
read from the store, written to the socket without being copied into the chunk
or the frame; smaller ones are copied together (one write for many)."""

MAX_CONSUME_READS_PER_CONNECTION = 2
"""Consume responses one connection may have in the making at once (parked
consumes do not count), however many it pipelines."""

MAX_QUEUED_CHUNK_BYTES = 8 * 1024 * 1024
"""Chunk bytes of one connection's consume responses in the making, queued, or
taken by its writer and maybe not yet sent (its last two takes: the writer takes
more only once the socket drained). A consume takes its budget from this room
before it reads the store and waits while there is none, so a client that does
not read holds at most this (plus one bundle) however many consumes it
pipelines. Eight times the usual fetch (4 MiB) keeps a pipelining consumer
busy; a larger fetch is answered in steps of at most this."""

MIN_CONSUME_ROOM_BYTES: Final = 1024 * 1024
"""Least room a consume response gets when the server's budget of buffered
bytes (``--max-total-buffered-bytes``) is nearly spent: many consumers then
read in small steps instead of each taking ``MAX_QUEUED_CHUNK_BYTES``."""

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

MAX_VERIFIED_RANGES = 1024
"""Byte ranges of a partition known to hold only valid bundles (``_Verified``);
past it the shortest is forgotten (its bundles are then checked again)."""

MAX_TOPIC_NAME_CHARS = 64
"""TANK's own limit on topic names (tank.md#create-topic)."""

BROKER_VERSION = 400
"""What Status reports: the TANK version whose protocol we speak (4.0, tank.md#status)."""

EVENT_TYPE = 0
"""The type field of Pravega's event framing (``EVENT_HEADER``) for an event."""

MAX_BUNDLE_BYTES = MAX_APPEND_BYTES - EVENT_HEADER.size
"""The largest bundle one event (one store append) can hold."""

BUNDLE_HEADER_MAX_BYTES = 19
"""flags:u8, msg_count varint (<= 5), first:u64, last-first-1 varint (<= 5): tank.md#bundles."""

_TOPIC_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
_ANCHOR_OFFSET_BYTES = 8  # big-endian u64 after the segment name, so keys sort by offset
_ANCHOR_VALUE = struct.Struct("<Q")  # first seq num of the bundle at that offset
_TABLE_PAGE_COUNT = 1000
_LISTED_STREAMS_MAX = 100_000


def is_valid_topic(topic: str) -> bool:
    """TANK's rule (tank.md#create-topic): 1-64 of ``[A-Za-z0-9_-]``, not starting with ``-`` or
    ``_``."""
    return len(topic) <= MAX_TOPIC_NAME_CHARS and _TOPIC_NAME.fullmatch(topic) is not None


def stream_name(topic: str) -> str:
    """The stream holding ``topic``: ``_`` becomes ``.`` (stream names have no ``_``)."""
    return topic.replace("_", ".")


def topic_name(stream: str) -> str:
    """The topic a stream of the TANK scope appears as (the inverse of ``stream_name``)."""
    return stream.replace(".", "_")


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


class _Waiter:
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


class _Partition:
    """What the broker knows about one partition (one segment)."""

    def __init__(self, segment: str) -> None:
        self.segment = segment
        self.lock = asyncio.Lock()  # serialises loading and appends
        self.loaded = False
        self.length = 0  # end of the last bundle known (durable)
        self.first_seq = 0  # first available seq num; 0 when empty
        self.hwm = 0  # last assigned seq num; 0 when empty
        self.origin_seq = 1  # seq num a non-sparse, unanchored bundle at the start gets
        self.start = 0  # first readable offset
        self.anchors: dict[int, int] = {}  # offset -> first seq num, from the table
        self.index_offsets: list[int] = []
        self.index_seqs: list[int] = []
        self.checkpoint_offset = -CHECKPOINT_INTERVAL_BYTES
        self.waiters: set[_Waiter] = set()
        self.verified = _Verified()

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
class _Chunk:
    base: int
    sparse: bool
    parts: list[bytes | bytearray | memoryview]
    """The chunk's bytes in order: runs of small entries copied together, large
    bundles as views of the bytes read from the store (sent without a copy)."""
    size_bytes: int = 0


@dataclass(frozen=True, slots=True)
class _PartsResult(t.ConsumePartitionResult):
    """A partition result whose chunk is ``parts`` (``chunk`` stays empty): the
    handler sends them as they are (``TankConnection.send_split``)."""

    parts: tuple[bytes | bytearray | memoryview, ...] = ()
    size_bytes: int = 0


def _chunk_size(result: t.ConsumePartitionResult) -> int:
    return result.size_bytes if isinstance(result, _PartsResult) else len(result.chunk)


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
        self._partitions: dict[str, _Partition] = {}
        self._stored_anchors: dict[str, dict[int, int]] = {}
        self._own_frames: set[int] = set()
        """``id`` of the frames our own appends are storing (checked at produce already)."""
        self._read_slots = asyncio.Semaphore(MAX_CONCURRENT_CHUNK_READS)

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

    def partitions_count(self, topic: str) -> int | None:
        """How many partitions ``topic`` has; None if there is no such topic."""
        stream = self._stream(topic)
        if stream is None:
            return None
        return len(self.controller.epoch_segments(self.scope, stream, 0))

    def is_read_only(self, topic: str) -> bool:
        stream = self._stream(topic)
        return stream is not None and self.controller.is_sealed(self.scope, stream)

    def topics(self) -> list[tuple[str, int, bool]]:
        """(topic, partitions, enabled) for every stream of the scope that is a topic."""
        found = []
        for stream in self.controller.list_streams(self.scope, limit=_LISTED_STREAMS_MAX):
            topic = topic_name(stream)
            if is_valid_topic(topic):
                count = len(self.controller.epoch_segments(self.scope, stream, 0))
                found.append((topic, count, not self.controller.is_sealed(self.scope, stream)))
        return found

    async def create_topic(self, topic: str, partitions: int, config: bytes) -> t.CreateTopicResult:
        if not is_valid_topic(topic) or partitions < 1:
            return t.CreateTopicResult.INVALID_REQUEST
        if not _config_is_valid(config):
            return t.CreateTopicResult.INVALID_CONFIG
        scaling = ScalingPolicy(ScalingType.FIXED_NUM_SEGMENTS, min_num_segments=partitions)
        try:
            await self.controller.create_stream(
                self.scope, stream_name(topic), StreamConfig(scaling=scaling)
            )
        except StreamExists:
            return t.CreateTopicResult.ALREADY_EXISTS
        except TooMany:
            return t.CreateTopicResult.SYSTEM_ERROR
        except ControllerError:  # InvalidArgument: more partitions than a stream may have
            return t.CreateTopicResult.INVALID_REQUEST
        except StoreError:
            log.exception("tank: creating topic %s failed", topic)
            return t.CreateTopicResult.SYSTEM_ERROR
        return t.CreateTopicResult.CREATED

    # ------------------------------------------------------------------ partition state

    async def partition(self, topic: str, partition_id: int) -> _Partition:
        """The loaded state of an existing partition (check ``partitions_count`` first)."""
        name = segment_name(self.scope, stream_name(topic), segment_id(0, partition_id))
        part = self._partitions.get(name)
        if part is None:
            part = self._partitions[name] = _Partition(name)
        if not part.loaded:
            async with part.lock:
                if not part.loaded:
                    await self._load(part)
        return part

    @property
    def open_partitions(self) -> int:
        return sum(1 for part in self._partitions.values() if part.loaded)

    async def _load(self, part: _Partition) -> None:
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
        part.length = info.length
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
        part.loaded = True
        self.open_time_us += int((time.perf_counter() - began) * 1e6)

    async def _origin_after_truncation(
        self, part: _Partition, known_seqs: dict[int, int], previous_hwm: int
    ) -> int:
        """The seq num the first ordinary bundle after a truncated head gets: counted
        back from the first bundle whose seq num is known (an anchor, an entry of the
        index we had before a reload, or a sparse bundle), or else from the
        high-water mark we had before a reload."""
        count = 0
        async for offset, end, payload in self._events(part.segment, part.start, part.length):
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
        self, segment: str, offset: int, end: int
    ) -> AsyncIterator[tuple[int, int, memoryview]]:
        """Yield (offset, end, payload) of each event in ``[offset, end)``."""
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
        self, part: _Partition, offset: int, end: int, payload: memoryview
    ) -> t.BundleHeader | None:
        """The header of the event at ``offset`` if it is a valid bundle, else None
        (counted as skipped). Checked in full unless ``part.verified`` covers it, so
        every walk over the same bytes sees the same bundles, and the numbering holds."""
        if part.verified.end_of(offset) >= end:
            return _header(payload)
        header = _validate_bundle(payload)
        if header is None:
            self.skipped()
            return None
        part.verified.add(offset, end)
        return header

    async def _walk(
        self, part: _Partition, offset: int, next_seq: int, end: int
    ) -> AsyncIterator[_Bundle]:
        """Yield the bundles in ``[offset, end)`` with their seq nums; ``next_seq`` is
        what the bundle at ``offset`` gets unless it is sparse or anchored. Events
        that are not bundles (stored behind the broker's back) are skipped."""
        verified_end = part.verified.end_of(offset)
        async for position, event_end, payload in self._events(part.segment, offset, end):
            if event_end <= verified_end:
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
    ) -> t.ProduceError:
        """Validate one produced bundle, store it durably and number its messages."""
        header = _validate_bundle(bundle)
        if header is None:
            return t.ProduceError.INVALID_SEQ_NUMS  # the C++ client's "invalid request"
        try:
            part = await self.partition(topic, partition_id)
            async with part.lock:
                for _ in range(2):  # once more after someone else appended to the segment
                    if not part.loaded:
                        await self._load(part)
                    error = await self._append_locked(part, bundle, header, explicit_first)
                    if error is not None:
                        return error
        except StoreError as exc:  # the segment could not be read (or is gone)
            log.warning("tank: producing to %s/%d failed: %s", topic, partition_id, exc)
            return _codes(exc).produce
        return t.ProduceError.IO_FAULT

    async def _append_locked(
        self, part: _Partition, bundle: bytes, header: t.BundleHeader, explicit_first: int
    ) -> t.ProduceError | None:
        """Append a valid bundle under the partition lock; None if the segment had
        grown behind our back (another front door appended): reload and try again."""
        if header.sparse:
            assert header.first_seq_num is not None and header.last_seq_num is not None
            first, last = header.first_seq_num, header.last_seq_num
        else:
            first = explicit_first or part.hwm + 1
            last = first + header.msg_count - 1
        if (header.sparse or explicit_first) and first <= part.hwm:
            # seq nums never go backwards (tank.md#produce-semantics)
            return t.ProduceError.INVALID_SEQ_NUMS
        if last >= t.SEQ_NUM_TAIL:
            return t.ProduceError.INVALID_SEQ_NUMS
        offset = part.length
        walk_would_give = part.hwm + 1 if part.hwm else part.origin_seq
        anchored = not header.sparse and first != walk_would_give
        if anchored:
            try:
                await self._put_anchor(part, offset, first)
            except StoreError as exc:
                log.exception("tank: anchoring a bundle of %s failed", part.segment)
                return _codes(exc).produce
        frame = EVENT_HEADER.pack(EVENT_TYPE, len(bundle)) + bundle
        self._own_frames.add(id(frame))  # validated above: the store's check lets it by
        try:
            result = await self.store.append(part.segment, frame, expected_offset=offset)
        except StoreError as exc:
            part.loaded = False  # the next use rebuilds the numbering from the store
            if anchored:
                with contextlib.suppress(StoreError):
                    key = TableKey(_anchor_key(part.segment, offset))
                    await self.store.remove_table_keys(self.table, [key])
            if isinstance(exc, BadOffset):
                log.info("tank: %s was appended to through another protocol", part.segment)
                return None
            log.warning("tank: appending to %s failed: %s", part.segment, exc)
            return _codes(exc).produce
        finally:
            self._own_frames.discard(id(frame))
        # Durable: only now do the numbers move and parked consumes wake.
        part.verified.add(offset, result.length)
        if anchored:
            part.anchors[offset] = first
        if not part.first_seq:
            part.first_seq = first
        part.hwm = last
        part.length = result.length
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
        return t.ProduceError.OK

    async def catch_up(self, part: _Partition) -> int:
        """Re-read a partition whose segment grew through another front door (a
        Pravega writer, the segment store); return the seq nums it gained.

        Under the partition's lock, so a TANK append in progress finishes first
        (its own growth is not foreign). Raises StoreError.
        """
        async with part.lock:
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

    async def _put_anchor(self, part: _Partition, offset: int, first: int) -> None:
        update = TableUpdate(_anchor_key(part.segment, offset), _ANCHOR_VALUE.pack(first))
        await self.store.update_table(self.table, [update])

    # ------------------------------------------------------------------ consume

    async def read_chunk(
        self,
        part: _Partition,
        start: tuple[int, int],
        seq_num: int,
        fetch_size: int,
        budget: int,
    ) -> _Chunk | None:
        """Whole bundles from the one containing ``seq_num`` (or the next one after a
        gap), walking from ``start`` = (offset, next seq num); at least ``fetch_size``
        bytes if there are that many, within ``budget`` (but always one bundle)."""
        try:
            async with self._read_slots:
                return await self._read_chunk(part, start, seq_num, fetch_size, budget)
        except SegmentTruncated:
            part.loaded = False  # truncated behind our back: the next use re-reads it
            raise

    async def _read_chunk(
        self,
        part: _Partition,
        start: tuple[int, int],
        seq_num: int,
        fetch_size: int,
        budget: int,
    ) -> _Chunk | None:
        end, hwm = part.length, part.hwm
        out = bytearray()  # small entries, copied together
        size = 0
        chunk: _Chunk | None = None
        previous_last = 0
        yielded = 0
        async for bundle in self._walk(part, start[0], start[1], end):
            part.note(bundle.offset, bundle.first)
            if chunk is None:
                if bundle.last < seq_num:
                    continue
                chunk = _Chunk(bundle.first, bundle.sparse, [])
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
            entry = encode_varint(len(bundle.payload))
            if size and size + len(entry) + len(bundle.payload) > budget:
                break
            out += entry
            if len(bundle.payload) >= VIEW_MIN_BYTES:
                chunk.parts += (out, bundle.payload)
                out = bytearray()
            else:
                out += bundle.payload
            size += len(entry) + len(bundle.payload)
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


# --------------------------------------------------------------------------- connections


Handler = Callable[["TankHandler", t.Request], Awaitable[t.Response]]


class TankHandler(ConnectionHandler):
    """One TANK connection: a server ``TankConnection`` in front of the broker."""

    name = "tank"

    def __init__(
        self,
        broker: TankBroker,
        *,
        heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S,
        auth: DoorAuth | None = None,
    ):
        self._broker = broker
        self._auth = auth
        self._access: ConnectionAccess | None = None
        self._conn = t.TankConnection(t.Role.SERVER)  # queues the greeting Ping
        self._heartbeat_interval_s = heartbeat_interval_s
        self._heartbeat: asyncio.Task[None] | None = None
        self._parked: set[_Waiter] = set()
        # Bounded memory for consume responses: few built at once, and each
        # takes its room under MAX_QUEUED_CHUNK_BYTES before it reads.
        self._reading = asyncio.Semaphore(MAX_CONSUME_READS_PER_CONNECTION)
        self._reserved_bytes = 0  # budgets of the responses in the making
        self._queued_bytes = 0  # chunk bytes of responses queued, not yet taken
        self._taken_bytes: deque[int] = deque([0, 0], maxlen=2)  # the writer's last two takes
        self._taken = asyncio.Event()
        self._out: list[OutputPiece] = []
        """Consume responses sent as pieces, in order ahead of what the connection
        has queued since."""

    # ------------------------------------------------------------------ loop interface

    def feed(self, data: bytes) -> Iterator[object]:
        try:
            self._conn.receive_data(data)
        except RemoteProtocolError:
            yield from self._conn.events()  # frames before the bad one are still served
            raise
        for event in self._conn.events():
            if isinstance(event, t.ConnectionClosed):
                self._release_parked()
            yield event

    def partial_frame_bytes(self) -> int:
        return self._conn.buffered_bytes

    def sequential(self, event: object) -> bool:
        # Produces (and topic creation) keep wire order; consumes may park, so
        # they run beside everything else.
        return not isinstance(event, t.Consume)

    def inline(self, event: object) -> bool:
        # A produce issues its store append in its first step (the partition's
        # lock is free unless a produce to it is in flight) and, under fsync
        # never, is often answered without suspending: no task, no loop round.
        # Nothing before its first suspension uses ``current_task`` or a timeout.
        # Consumes may park and read: they keep their own task. Not once the
        # peer broke the protocol further on in what was received: those
        # requests go the way of tasks, which the closing connection cancels
        # before they store anything.
        return type(event) in _INLINE_REQUESTS and self._conn.state is not t.ConnectionState.ERROR

    async def handle(self, event: object) -> None:
        handler = DISPATCH.get(type(event))
        if handler is None:  # Ping (ignored, tank.md#message-ids), ConnectionClosed
            return
        assert isinstance(event, t.Request)
        response = await handler(self, event)
        if self._conn.state is t.ConnectionState.ERROR:
            return
        if not isinstance(response, t.ConsumeResponse):
            self._conn.send(response)
            return
        parts: dict[tuple[int, int], tuple[bytes | bytearray | memoryview, ...]] = {}
        for ti, topic in enumerate(response.topics):
            if isinstance(topic, t.ConsumeTopicResult):
                for pi, partition in enumerate(topic.partitions):
                    if isinstance(partition, _PartsResult):
                        parts[(ti, pi)] = partition.parts
        if parts:
            pieces = self._conn.send_split(response, parts)
            queued = self._conn.data_to_send()  # responses before this one go first
            if queued:
                self._out.append(queued)
            self._out += pieces
        else:
            self._conn.send(response)
        self._queued_bytes += _chunk_bytes(response)

    def output(self) -> list[OutputPiece]:
        self._taken_bytes.append(self._queued_bytes)
        self._queued_bytes = 0
        self._taken.set()
        pieces, self._out = self._out, []
        queued = self._conn.data_to_send()
        if queued:
            pieces.append(queued)
        return pieces

    def data_to_send(self) -> bytes:
        return b"".join(p for p in self.output() if not isinstance(p, FileRegion))

    def _unsent_chunk_bytes(self) -> int:
        """Chunk bytes of this connection that may still be in memory: responses in
        the making (their budgets), queued, or among the writer's last two takes (it
        takes more only after draining the socket, so the one before may be unsent)."""
        return self._reserved_bytes + self._queued_bytes + sum(self._taken_bytes)

    async def _take_room(self) -> int:
        """Wait for room under ``MAX_QUEUED_CHUNK_BYTES``, then reserve a response's
        budget from it (release it with ``_give_back``). A client that does not read
        gets nothing more read from the store for it."""
        while True:
            if self._unsent_chunk_bytes() >= MAX_QUEUED_CHUNK_BYTES:
                self._taken.clear()
                self.wake_writer()  # it takes again (and we count again) once it drained
                await self._taken.wait()
            elif self._server_budget_spent():
                await self._server_budget_freed()
            else:
                break
        budget = min(MAX_RESPONSE_CHUNK_BYTES, MAX_QUEUED_CHUNK_BYTES - self._unsent_chunk_bytes())
        server = self.budget
        if server is not None:  # what the whole server has left, but always a little
            free = server.capacity_bytes - server.in_use_bytes
            budget = min(budget, max(free, MIN_CONSUME_ROOM_BYTES))
        self._reserved_bytes += budget
        return budget

    def _server_budget_spent(self) -> bool:
        """Whether the server's budget of buffered bytes is spent while this
        connection still holds chunk bytes: then it waits for others (or its own
        client) to free some before it reads more. A connection holding nothing
        may always read a little, so every consumer makes progress."""
        server = self.budget
        return server is not None and server.spent and self._unsent_chunk_bytes() > 0

    async def _server_budget_freed(self) -> None:
        assert self.budget is not None
        freed = asyncio.Event()
        self.budget.wait(self, freed.set)
        self._taken.clear()
        self.wake_writer()
        # Either the server's total falls, or this connection's writer takes bytes.
        waits = {asyncio.ensure_future(freed.wait()), asyncio.ensure_future(self._taken.wait())}
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waits:
                waiter.cancel()
            self.budget.forget(self)  # no longer waiting, whichever came first

    def queued_bytes(self) -> int:
        # Responses built and queued, not yet taken by the writer (what it took
        # is the transport's, which the loop counts itself).
        return self._queued_bytes

    def _give_back(self, budget: int) -> None:
        """A response is built (``handle`` queues its bytes next) or given up."""
        self._reserved_bytes -= budget

    def on_protocol_error(self, exc: RemoteProtocolError) -> None:
        # TANK has no error reply for a malformed request: the broker closes (tank.md#framing).
        self._release_parked()

    def on_start(self) -> None:
        self._heartbeat = asyncio.create_task(self._beat(), name="tank-heartbeat")

    async def on_close(self) -> None:
        self._release_parked()
        if self.budget is not None:
            self.budget.forget(self)
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat

    async def _beat(self) -> None:
        beating = (t.ConnectionState.AWAITING_REQUEST, t.ConnectionState.OPEN)
        while True:
            await asyncio.sleep(self._heartbeat_interval_s)
            if self._conn.state not in beating:
                return
            self._conn.send(t.Ping())
            self.wake_writer()

    def _release_parked(self) -> None:
        """The peer is gone: parked consumes answer now instead of holding the connection."""
        for waiter in self._parked:
            waiter.close()

    # ------------------------------------------------------------------ auth

    @property
    def access(self) -> ConnectionAccess:
        """What the client may do (``server/authz.py``), known once the connection started."""
        if self._access is None:
            self._access = ConnectionAccess.of(self._auth, self.name, self.peer, self.peer_cert)
        return self._access

    def _allowed(self, topic: str | None, needed: Permission) -> bool:
        """Whether the client holds ``needed`` on ``topic``'s stream (None: on the
        TANK scope); a refusal is counted and logged. Free with auth off."""
        if self._auth is None:
            return True
        refusal = self.access.check(self._resource(topic), needed)
        if refusal is not None:
            self.access.note_refusal(refusal)
        return refusal is None

    def _resource(self, topic: str | None) -> str:
        scope = self._broker.scope
        if topic is None:
            return scope_resource(scope)
        return stream_resource(scope, stream_name(topic))

    def _readable_topics(self) -> list[tuple[str, int, bool]]:
        """The broker's topics that the client may read (all with auth off)."""
        topics = self._broker.topics()
        if self._auth is None:
            return topics
        access = self.access
        return [e for e in topics if access.may(self._resource(e[0]), Permission.READ)]

    # ------------------------------------------------------------------ produce

    async def produce(self, request: t.Request) -> t.Response:
        assert isinstance(request, t.Produce | t.ProduceWithSeqnum)
        broker = self._broker
        topics: list[t.ProduceTopicResult] = []
        counts: list[int] = []
        jobs: list[Awaitable[t.ProduceError]] = []
        for topic in request.topics:
            if not self._allowed(topic.name, Permission.READ_UPDATE):
                topics.append(t.ProduceTopicResult(topic.name, (), t.ProduceError.READ_ONLY))
                counts.append(0)
                continue
            count = broker.partitions_count(topic.name)
            if count is None or broker.is_read_only(topic.name):
                error = t.ProduceError.UNKNOWN_TOPIC if count is None else t.ProduceError.READ_ONLY
                topics.append(t.ProduceTopicResult(topic.name, (), error))
                counts.append(0)
                continue
            topics.append(t.ProduceTopicResult(topic.name, ()))
            counts.append(count)
            for p in topic.partitions:
                if p.partition_id < count:
                    bundle, first = p.bundle, p.first_seq_num
                    jobs.append(broker.append(topic.name, p.partition_id, bundle, first))
        # One partition (the common case) is awaited as it is: no gather, no task.
        # Several append side by side (one sync round for all under fsync always).
        outcomes = [await jobs[0]] if len(jobs) == 1 else await asyncio.gather(*jobs)
        errors = iter(outcomes)
        results = []
        for topic, result, count in zip(request.topics, topics, counts, strict=True):
            if result.error is not t.ProduceError.OK:
                results.append(result)
                continue
            partitions = tuple(
                t.ProducePartitionResult(
                    p.partition_id,
                    next(errors) if p.partition_id < count else t.ProduceError.UNKNOWN_PARTITION,
                )
                for p in topic.partitions
            )
            results.append(t.ProduceTopicResult(topic.name, partitions))
        return t.ProduceResponse(request.request_id, tuple(results))

    # ------------------------------------------------------------------ consume

    async def consume(self, request: t.Request) -> t.Response:
        assert isinstance(request, t.Consume)
        async with self._reading:
            room = await self._take_room()
            try:
                outcome = await self._consume_now(request, room)
            finally:
                self._give_back(room)
        if isinstance(outcome, t.ConsumeResponse):
            return outcome
        return await self._park(request, outcome)  # parks before its first pause

    async def _consume_now(
        self, request: t.Consume, room: int
    ) -> t.ConsumeResponse | dict[tuple[int, int], tuple[_Partition, int, int]]:
        """The response if it can be answered now, else the partitions to park on;
        its chunks add up to ``room`` at most (but one bundle)."""
        broker = self._broker
        while True:
            budget = room
            topics: list[t.ConsumeTopicResult | t.ConsumeUnknownTopic] = []
            at_end: dict[tuple[int, int], tuple[_Partition, int, int]] = {}
            answer_now = request.max_wait_ms == 0
            for ti, topic in enumerate(request.topics):
                readable = self._allowed(topic.name, Permission.READ)
                count = broker.partitions_count(topic.name) if readable else None
                if count is None:
                    topics.append(t.ConsumeUnknownTopic(topic.name, len(topic.partitions)))
                    answer_now = True
                    continue
                partitions: list[t.ConsumePartitionResult] = []
                for pi, wanted in enumerate(topic.partitions):
                    pid = wanted.partition_id
                    if pid >= count:
                        partitions.append(
                            t.ConsumePartitionResult(pid, t.ConsumeError.UNKNOWN_PARTITION)
                        )
                        answer_now = True
                        continue
                    try:
                        part, result = await self._read_partition(topic.name, wanted, budget)
                    except StoreError as exc:
                        log.warning("tank: reading %s/%d failed: %s", topic.name, pid, exc)
                        result = t.ConsumePartitionResult(pid, _codes(exc).consume)
                        answer_now = True
                    else:
                        budget -= _chunk_size(result) if result is not None else 0
                    if result is None:  # at the end: an empty entry unless it parks
                        at_end[(ti, pi)] = (part, part.length, part.hwm)
                        result = t.ConsumePartitionResult(
                            pid, base_seq_num=part.first_seq, high_water_mark=part.hwm
                        )
                    else:
                        answer_now = True
                    partitions.append(result)
                topics.append(t.ConsumeTopicResult(topic.name, tuple(partitions)))
            if answer_now or not at_end:
                return t.ConsumeResponse(request.request_id, tuple(topics))
            # Every partition is at its end. Nothing may have arrived while we
            # looked at the others; if something did, look again.
            if any(part.length != length for part, length, _ in at_end.values()):
                continue
            return at_end

    async def _read_partition(
        self, topic: str, wanted: t.ConsumePartition, budget: int
    ) -> tuple[_Partition, t.ConsumePartitionResult | None]:
        """``_read`` on the partition, once more if its head was truncated meanwhile."""
        part = await self._broker.partition(topic, wanted.partition_id)
        try:
            return part, await self._read(part, wanted, budget)
        except SegmentTruncated:
            part = await self._broker.partition(topic, wanted.partition_id)  # reloads
            return part, await self._read(part, wanted, budget)

    async def _read(
        self, part: _Partition, wanted: t.ConsumePartition, budget: int
    ) -> t.ConsumePartitionResult | None:
        """The partition's entry if it has data or an error; None if at its end (6.2)."""
        first, last = part.first_seq, part.hwm
        seq_num = wanted.seq_num
        if seq_num == t.SEQ_NUM_TAIL or seq_num == last + 1 or (seq_num == 0 and not last):
            return None
        if seq_num == 0:
            seq_num = first
        if seq_num < first or seq_num > last + 1:
            return t.ConsumePartitionResult(
                wanted.partition_id,
                t.ConsumeError.BOUNDARY_CHECK,
                high_water_mark=last,
                first_available_seq_num=first,
            )
        if budget <= 0:  # the response is full: an empty chunk, the client asks again
            return t.ConsumePartitionResult(
                wanted.partition_id, base_seq_num=seq_num, high_water_mark=last
            )
        fetch_size = min(wanted.fetch_size, t.MAX_FETCH_SIZE_BYTES)
        chunk = await self._broker.read_chunk(
            part, part.floor(seq_num), seq_num, fetch_size, budget
        )
        if chunk is None:
            return None
        return _chunk_result(wanted.partition_id, chunk, part.hwm)

    async def _park(
        self,
        request: t.Consume,
        at_end: dict[tuple[int, int], tuple[_Partition, int, int]],
    ) -> t.ConsumeResponse:
        loop = asyncio.get_running_loop()
        waiter = _Waiter(min(request.min_bytes, t.MAX_MIN_BYTES))
        # Each partition with the segment offset up to which its bytes are known.
        watched = {id(part): (part, length) for part, length, _ in at_end.values()}
        for part, _ in watched.values():
            part.waiters.add(waiter)
        self._parked.add(waiter)
        timer = loop.call_later(min(request.max_wait_ms, t.MAX_WAIT_MS) / 1000, waiter.expire)
        store = self._broker.store
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
            timer.cancel()
            self._parked.discard(waiter)
            for part, _, _ in at_end.values():
                part.waiters.discard(waiter)
        # every partition empty, base 0 (tank.md#long-polling)
        if waiter.closed or not waiter.satisfied:
            return await self._woken_response(request, at_end, empty=True, room=0)
        async with self._reading:
            room = await self._take_room()
            try:
                return await self._woken_response(request, at_end, empty=False, room=room)
            finally:
                self._give_back(room)

    def _watch_foreign(
        self, watched: dict[int, tuple[_Partition, int]], wake: asyncio.Future[None]
    ) -> tuple[list[_Partition], list[str]]:
        """Have the store resolve ``wake`` when a watched partition's segment changes.

        Returns the partitions that have bytes past what is known already
        (then nothing stays registered) and the segments ``wake`` watches.

        TANK's own produces wake parked consumes directly (``_append_locked``);
        bytes appended by anything else (a Pravega writer writing bundles into
        the topic's stream) only show in the store, which notifies whatever
        protocol appended. A partition the store cannot watch (deleted, store
        closed) is dropped: the consume answers on its timer.
        """
        store = self._broker.store
        grown: list[_Partition] = []
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
        watched: dict[int, tuple[_Partition, int]],
        grown: list[_Partition],
        waiter: _Waiter,
    ) -> None:
        """Index what reached ``grown`` partitions through another front door and
        count it towards ``min_bytes``. Events that are not bundles give no
        messages and do not count; a partition that did not grow (sealed) is
        no longer watched."""
        for part in grown:
            key = id(part)
            offset = watched[key][1]
            try:
                gained = await self._broker.catch_up(part)
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

    async def _woken_response(
        self,
        request: t.Consume,
        at_end: dict[tuple[int, int], tuple[_Partition, int, int]],
        empty: bool,
        room: int,
    ) -> t.ConsumeResponse:
        budget = room
        topics: list[t.ConsumeTopicResult | t.ConsumeUnknownTopic] = []
        for ti, topic in enumerate(request.topics):
            partitions = []
            for pi, wanted in enumerate(topic.partitions):
                part, length, hwm = at_end[(ti, pi)]
                chunk = None
                if not empty and part.length > length and budget > 0:
                    fetch_size = min(wanted.fetch_size, t.MAX_FETCH_SIZE_BYTES)
                    start = (length, hwm + 1 if hwm else part.origin_seq)
                    try:
                        chunk = await self._broker.read_chunk(
                            part, start, start[1], fetch_size, budget
                        )
                    except StoreError as exc:  # the client asks again
                        log.warning("tank: reading %s failed: %s", part.segment, exc)
                if chunk is None:
                    partitions.append(
                        t.ConsumePartitionResult(wanted.partition_id, high_water_mark=part.hwm)
                    )
                else:
                    budget -= chunk.size_bytes
                    partitions.append(_chunk_result(wanted.partition_id, chunk, part.hwm))
            topics.append(t.ConsumeTopicResult(topic.name, tuple(partitions)))
        return t.ConsumeResponse(request.request_id, tuple(topics))

    # ------------------------------------------------------------------ administration

    async def create_topic(self, request: t.Request) -> t.Response:
        assert isinstance(request, t.CreateTopic)
        if not self._allowed(None, Permission.READ_UPDATE):
            result = t.CreateTopicResult.READ_ONLY
            return t.CreateTopicResponse(request.request_id, request.topic, result)
        result = await self._broker.create_topic(
            request.topic, request.partitions_count, request.config
        )
        return t.CreateTopicResponse(request.request_id, request.topic, result)

    async def discover_partitions(self, request: t.Request) -> t.Response:
        assert isinstance(request, t.DiscoverPartitions)
        broker = self._broker
        readable = self._allowed(request.topic, Permission.READ)
        count = broker.partitions_count(request.topic) if readable else None
        if count is None:
            return t.DiscoverPartitionsResponse(request.request_id, request.topic, ())
        ids = request.partition_ids or tuple(range(count))
        entries = []
        for pid in ids:
            if pid >= count:  # only in the explicit-list form
                entries.append(t.PartitionSeqNums(error=t.DiscoverPartitionsError.SYSTEM_ERROR))
                continue
            try:
                part = await broker.partition(request.topic, pid)
            except StoreError as exc:
                log.warning("tank: loading %s/%d failed: %s", request.topic, pid, exc)
                entries.append(t.PartitionSeqNums(error=_codes(exc).discover))
                continue
            entries.append(t.PartitionSeqNums(part.first_seq, part.hwm))
        return t.DiscoverPartitionsResponse(request.request_id, request.topic, tuple(entries))

    async def reload_conf(self, request: t.Request) -> t.Response:
        assert isinstance(request, t.ReloadConf)
        readable = self._allowed(request.topic, Permission.READ)
        count = self._broker.partitions_count(request.topic) if readable else None
        if count is None:
            result = t.ReloadConfResult.UNKNOWN_TOPIC
        elif request.partition_id >= count:
            result = t.ReloadConfResult.UNKNOWN_PARTITION
        else:
            result = t.ReloadConfResult.RELOADED  # there are no config files to re-read
        return t.ReloadConfResponse(request.request_id, request.topic, request.partition_id, result)

    async def status(self, request: t.Request) -> t.Response:
        assert isinstance(request, t.Status)
        broker = self._broker
        topics = self._readable_topics()
        details = t.StatusDetails(
            open_partitions=broker.open_partitions,
            open_partitions_time_us=min(broker.open_time_us, 2**32 - 1),
            startup_ts_s=broker.started_s,
            version=BROKER_VERSION,
        )
        return t.StatusResponse(
            request.request_id,
            topics_count=len(topics),
            partitions_count=sum(count for _, count, _ in topics),
            details=details,
        )

    async def discover_topics(self, request: t.Request) -> t.Response:
        assert isinstance(request, t.DiscoverTopics)
        infos = tuple(
            t.TopicInfo(name, enabled, count) for name, count, enabled in self._readable_topics()
        )
        return t.DiscoverTopicsResponse(request.request_id, infos)

    async def discover_topology(self, request: t.Request) -> t.Response:
        assert isinstance(request, t.DiscoverTopology)
        # standalone (tank.md#discover-topology)
        return t.DiscoverTopologyResponse(request.request_id)


def _chunk_bytes(response: t.ConsumeResponse) -> int:
    return sum(
        _chunk_size(p)
        for topic in response.topics
        if isinstance(topic, t.ConsumeTopicResult)
        for p in topic.partitions
    )


def _chunk_result(partition_id: int, chunk: _Chunk, hwm: int) -> t.ConsumePartitionResult:
    if chunk.sparse:  # the first bundle carries its own seq nums (tank.md#consume)
        return _PartsResult(
            partition_id,
            t.ConsumeError.SPARSE_BUNDLE,
            high_water_mark=hwm,
            parts=tuple(chunk.parts),
            size_bytes=chunk.size_bytes,
        )
    return _PartsResult(
        partition_id,
        base_seq_num=chunk.base,
        high_water_mark=hwm,
        parts=tuple(chunk.parts),
        size_bytes=chunk.size_bytes,
    )


DISPATCH: dict[type, Handler] = {
    t.Produce: TankHandler.produce,
    t.ProduceWithSeqnum: TankHandler.produce,
    t.Consume: TankHandler.consume,
    t.CreateTopic: TankHandler.create_topic,
    t.DiscoverPartitions: TankHandler.discover_partitions,
    t.ReloadConf: TankHandler.reload_conf,
    t.Status: TankHandler.status,
    t.DiscoverTopics: TankHandler.discover_topics,
    t.DiscoverTopology: TankHandler.discover_topology,
}
"""Request type -> the coroutine that answers it. Ping gets no reply (tank.md#message-ids)."""

_INLINE_REQUESTS: frozenset[type] = frozenset({t.Produce, t.ProduceWithSeqnum})
"""Requests whose handling starts in the read loop (``TankHandler.inline``)."""


async def start_tank(app: ServerApp, host: str, port: int) -> Listener:
    """Serve the TANK protocol on (host, port) over ``app.store``, over TLS when a
    certificate is configured (TANK has no credentials: with auth on, the
    client certificate says who the client is).

    Raises:
        OSError: the address could not be bound.
    """
    scope = app.config.tank_scope
    if not is_valid_name(scope):
        raise ConfigError(f"--tank-scope {scope!r} is not a valid scope name")
    broker = TankBroker(app.store, app.controller, scope)
    broker.skipped = app.metrics.skipped_events.labels("tank").inc
    await broker.start()
    return await start_tcp_listener(
        "tank",
        host,
        port,
        lambda: TankHandler(broker, auth=app.door_auth),
        first_request_timeout_s=app.config.tank_first_request_timeout_s,
        ssl_context=app.ssl_context(),
    )


LISTENER_STARTERS["tank"] = start_tank
