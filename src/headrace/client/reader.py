"""Reader groups and ``EventReader``: a stream's segments shared out among readers.

State (our own layout, kept in one table segment)
--------------------------------------------------
A reader group ``G`` in scope ``S`` keeps its state in the table segment
``S/G_hrgroup/0.#epoch.0`` (:func:`group_table_name`). It is deliberately not
the Rust client's ``S/G_kvtable`` layout (CBOR maps written by its
synchronizer): sharing that layout would tie us to another client's internal
format for little gain, and the different suffix keeps a Rust group and ours
of the same name apart. Keys are UTF-8, values JSON:

=========================  ====================================================
key                        value
=========================  ====================================================
``config``                 ``{"streams": ["S/st", ...]}``
``segment/<name>``         ``{"offset": int, "owner": str | null, "done": bool}``:
                           the read position of one segment (bytes consumed by
                           the group: the next event starts there), its current
                           reader, and whether it was read to its sealed end
``reader/<name>``          ``{"seen_ms": int}``: a reader's last heartbeat
=========================  ====================================================

Every scope also has an index of its groups, the table segment
``S/_hrgroups/0.#epoch.0`` (:func:`group_index_name`; a name no group can
have): key the group's name, value ``{"streams": [...]}``. ``create`` adds
the group, ``delete`` removes it, :func:`list_groups` reads it.

Every change is a conditional table update on the version read just before
(optimistic concurrency): two readers can never both own a segment.

Theory of operation
-------------------
``ReaderGroup.create`` writes ``config`` and one ``segment/`` entry per head
segment (or tail: offsets = current lengths). Each :class:`EventReader`
``sync()`` s the state every ``SYNC_INTERVAL_S`` (and when it has nothing to
read): it heartbeats, stores the positions of its segments, and balances:
with ``n`` unfinished segments and ``r`` live readers each reader should own
``ceil(n / r)``; a reader below that claims unowned segments or segments of
readers not seen for ``READER_TIMEOUT_S``; a reader above it releases the
extra ones (with their positions). A segment read to its sealed end is marked
``done`` and its successors (from the controller) get entries once all their
predecessors are done, so per-key order holds across scaling.

Delivery: ``read_next`` advances a segment's position past the event it
returns; ``release``/``aclose`` and every sync store positions, so a segment
handed from one reader to another gracefully continues exactly after the
last event returned (each event once). A reader that dies without closing is
replaced after ``READER_TIMEOUT_S`` from its last stored positions: events it
returned after its last sync are delivered again (at least once).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from headrace.errors import ControllerError, ServerError
from headrace.protocols import pravega as p
from headrace.protocols.records import stored_bytes

from .controller import Segment
from .errors import NoSuchSegmentError, SegmentIsTruncatedError, TableKeyVersionError
from .records import _EventBuffer

if TYPE_CHECKING:
    from .pravega import PravegaClient

__all__ = [
    "READER_TIMEOUT_S",
    "SYNC_INTERVAL_S",
    "EventRead",
    "EventReader",
    "ReaderGroup",
    "group_index_name",
    "group_table_name",
    "list_groups",
]

SYNC_INTERVAL_S = 1.0
"""How often a busy reader stores its positions and rebalances: the window of
events re-delivered after a crash, traded against table writes."""

READER_TIMEOUT_S = 30.0
"""A reader not heard of for this long is considered dead and its segments are
taken over (from their stored positions)."""

MAX_PREFETCH_BYTES = 4 * 1024 * 1024
"""Bytes read ahead per owned segment before the reader waits for the application."""

_TABLE_STREAM_SUFFIX = "_hrgroup"


_INDEX_STREAM = "_hrgroups"
"""The pseudo-stream of a scope's index of groups (the controller's ``GROUP_INDEX_STREAM``)."""


def group_table_name(scope: str, group: str) -> str:
    """The table segment holding reader group ``group``'s state."""
    return f"{scope}/{group}{_TABLE_STREAM_SUFFIX}/0.#epoch.0"


def group_index_name(scope: str) -> str:
    """The table segment listing the reader groups of ``scope``."""
    return f"{scope}/{_INDEX_STREAM}/0.#epoch.0"


async def list_groups(client: PravegaClient, scope: str) -> dict[str, list[str]]:
    """The reader groups of ``scope`` (those made since groups are indexed), each
    with its streams."""
    try:
        rows = await client.segments.table_entries(
            Segment(scope, _INDEX_STREAM, 0), group_index_name(scope)
        )
    except NoSuchSegmentError:
        return {}
    return {k.decode(): list(json.loads(v).get("streams", [])) for k, v, _ in rows}


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True, slots=True)
class EventRead:
    """An event returned by :meth:`EventReader.read_next`."""

    segment: str
    offset: int
    data: bytes


class ReaderGroup:
    """A named group of readers sharing the segments of one or more streams."""

    def __init__(
        self,
        client: PravegaClient,
        scope: str,
        name: str,
        *,
        reader_timeout_s: float = READER_TIMEOUT_S,
        sync_interval_s: float = SYNC_INTERVAL_S,
    ) -> None:
        self._client = client
        self.scope = scope
        self.name = name
        self.reader_timeout_s = reader_timeout_s
        """How long this process's readers wait before taking over a silent reader's segments."""
        self.sync_interval_s = sync_interval_s
        self.table = group_table_name(scope, name)
        self._anchor = Segment(scope, f"{name}{_TABLE_STREAM_SUFFIX}", 0)

    @classmethod
    async def create(
        cls,
        client: PravegaClient,
        scope: str,
        name: str,
        streams: Sequence[str],
        *,
        from_tail: bool = False,
        reader_timeout_s: float = READER_TIMEOUT_S,
        sync_interval_s: float = SYNC_INTERVAL_S,
    ) -> ReaderGroup:
        """Create the group (or open it if it exists) over ``streams`` (``"stream"`` or
        ``"scope/stream"``), starting at their heads (or tails)."""
        group = cls(
            client,
            scope,
            name,
            reader_timeout_s=reader_timeout_s,
            sync_interval_s=sync_interval_s,
        )
        segs = client.segments
        await segs.create_table(group._anchor, group.table)
        qualified = [s if "/" in s else f"{scope}/{s}" for s in streams]
        entries: list[tuple[bytes, bytes, int]] = [
            (b"config", json.dumps({"streams": qualified}).encode(), p.NOT_EXISTS)
        ]
        for q in qualified:
            sc, st = q.split("/")
            if from_tail:
                start = {
                    r.segment: (await segs.stat(r.segment)).length
                    for r in await client.controller.get_current_segments(sc, st)
                }
            else:
                start = await client.controller.get_head_segments(sc, st)
            for segment, offset in start.items():
                entries.append((_seg_key(segment), _seg_value(offset, None, False), p.NOT_EXISTS))
        with contextlib.suppress(TableKeyVersionError):  # it exists: open it as it is
            await segs.table_update(group._anchor, group.table, entries)
        # The index only serves listings: a user not allowed to write it (auth
        # grants naming single streams) still gets a working group.
        with contextlib.suppress(ServerError, ControllerError):
            index = Segment(scope, _INDEX_STREAM, 0)
            await segs.create_table(index, group_index_name(scope))
            with contextlib.suppress(TableKeyVersionError):  # indexed already
                await segs.table_update(
                    index,
                    group_index_name(scope),
                    [(name.encode(), json.dumps({"streams": qualified}).encode(), p.NOT_EXISTS)],
                )
        return group

    async def create_reader(self, name: str) -> EventReader:
        """Join the group as reader ``name`` and take a fair share of its segments."""
        reader = EventReader(self._client, self, name)
        await reader.sync()
        return reader

    async def delete(self) -> bool:
        """Delete the group's state (and its index entry); ``False`` if it did not exist."""
        segs = self._client.segments
        with contextlib.suppress(ServerError, ControllerError):
            await segs.table_remove(
                Segment(self.scope, _INDEX_STREAM, 0),
                group_index_name(self.scope),
                [(self.name.encode(), p.NO_VERSION)],
            )
        return await segs.delete_table(self._anchor, self.table)

    async def state(self) -> dict[str, tuple[dict[str, Any], int]]:
        """Every key of the group's table with its decoded value and version."""
        rows = await self._client.segments.table_entries(self._anchor, self.table)
        return {k.decode(): (json.loads(v), ver) for k, v, ver in rows}

    async def positions(self) -> dict[str, int]:
        """The group's stored read position of every segment it knows (a stream cut)."""
        state = await self.state()
        return {
            k.removeprefix("segment/"): v["offset"]
            for k, (v, _) in state.items()
            if k.startswith("segment/")
        }


def _seg_key(segment: Segment | str) -> bytes:
    return f"segment/{segment}".encode()


def _seg_value(offset: int, owner: str | None, done: bool) -> bytes:
    return json.dumps({"offset": offset, "owner": owner, "done": done}).encode()


class _Feed:
    """Read-ahead of one owned segment: a fetch task filling a queue of events."""

    def __init__(self, reader: EventReader, segment: Segment, offset: int, version: int) -> None:
        self.segment = segment
        self.position = offset  # after the last event handed out
        self.version = version  # table version of our entry
        self.stored_position = offset
        self.events: deque[tuple[int, bytes]] = deque()
        self.buffered_bytes = 0
        self.ended = False  # the fetch reached the sealed end (or the segment is gone)
        self._reader = reader
        self._room = asyncio.Event()
        self._room.set()
        self.task = asyncio.create_task(self._fetch(offset), name=f"feed {segment.name}")

    async def _fetch(self, offset: int) -> None:
        segs = self._reader._client.segments
        buf = _EventBuffer(offset)
        try:
            while True:
                while self.buffered_bytes >= MAX_PREFETCH_BYTES:
                    self._room.clear()
                    await self._room.wait()
                try:
                    got = await segs.read_view(self.segment, buf.offset + len(buf.buffer))
                except (SegmentIsTruncatedError, NoSuchSegmentError):
                    self.ended = True
                    break
                for off, payload in buf.feed(got.data):
                    self.events.append((off, payload))
                    self.buffered_bytes += len(payload)
                if got.data or got.end_of_segment:
                    self._reader._wake.set()
                if got.end_of_segment:
                    self.ended = True
                    break
        finally:
            self._reader._wake.set()

    def pop(self) -> tuple[int, bytes]:
        off, payload = self.events.popleft()
        self.buffered_bytes -= len(payload)
        self.position = off + stored_bytes(payload)  # a byte stream's raw bytes: no header
        if not self._room.is_set():
            self._room.set()
        return off, payload

    async def stop(self) -> None:
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self.task


class EventReader:
    """One reader of a group. Get events with :meth:`read_next`; leave with :meth:`aclose`."""

    def __init__(self, client: PravegaClient, group: ReaderGroup, name: str) -> None:
        self._client = client
        self.group = group
        self.name = name
        self._feeds: dict[Segment, _Feed] = {}
        self._order: deque[Segment] = deque()
        self._wake = asyncio.Event()
        self._next_sync = 0.0
        self._closed = False
        self._reader_key = f"reader/{name}".encode()

    @property
    def segments(self) -> list[Segment]:
        """The segments this reader owns now."""
        return list(self._feeds)

    async def read_next(self, timeout_s: float = 1.0) -> EventRead | None:
        """The next event of any owned segment, or ``None`` if none came within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while not self._closed:
            if time.monotonic() >= self._next_sync:
                await self.sync()
            self._wake.clear()
            for _ in range(len(self._order)):
                seg = self._order[0]
                self._order.rotate(-1)
                feed = self._feeds[seg]
                if feed.events:
                    off, payload = feed.pop()
                    return EventRead(seg.name, off, payload)
            finished = [f for f in self._feeds.values() if f.ended and not f.events]
            for feed in finished:
                await self._finish(feed)
            if finished:
                continue
            now = time.monotonic()
            if now >= deadline:
                return None
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(deadline, self._next_sync) - now):
                    await self._wake.wait()
        return None

    # ------------------------------------------------------------------ state sync

    async def _entries(self) -> dict[str, tuple[dict[str, Any], int]]:
        return await self.group.state()

    async def _put(self, key: bytes, value: bytes, version: int) -> int | None:
        """Conditional put; the new version, or ``None`` if someone else changed the key."""
        try:
            (new,) = await self._client.segments.table_update(
                self.group._anchor, self.group.table, [(key, value, version)]
            )
        except TableKeyVersionError:
            return None
        return new

    async def sync(self) -> None:
        """Heartbeat, store positions, and take or give segments for a fair share."""
        self._next_sync = time.monotonic() + self.group.sync_interval_s
        segs = self._client.segments
        await segs.table_update(
            self.group._anchor,
            self.group.table,
            [
                (
                    f"reader/{self.name}".encode(),
                    json.dumps({"seen_ms": _now_ms()}).encode(),
                    p.NO_VERSION,
                )
            ],
        )
        await self._store_positions()
        state = await self._entries()
        now = _now_ms()
        alive = {
            k.removeprefix("reader/")
            for k, (v, _) in state.items()
            if k.startswith("reader/") and now - v["seen_ms"] < self.group.reader_timeout_s * 1000
        }
        alive.add(self.name)
        unfinished = {
            k.removeprefix("segment/"): (v, ver)
            for k, (v, ver) in state.items()
            if k.startswith("segment/") and not v["done"]
        }
        share = math.ceil(len(unfinished) / len(alive)) if unfinished else 0
        # Give back what is over the fair share: a reader that joined takes it.
        mine = list(self._feeds)
        for seg in mine[: max(0, len(mine) - share)]:
            await self._release(seg)
        # Take orphaned segments up to the fair share.
        for name, (v, ver) in sorted(unfinished.items()):
            if len(self._feeds) >= share:
                break
            owner = v["owner"]
            if owner is not None and owner in alive:
                continue
            seg = Segment.parse(name)
            if seg in self._feeds:
                continue
            new = await self._put(_seg_key(name), _seg_value(v["offset"], self.name, False), ver)
            if new is not None:
                self._feeds[seg] = _Feed(self, seg, v["offset"], new)
                self._order.append(seg)

    async def _store_positions(self) -> None:
        for seg, feed in list(self._feeds.items()):
            if feed.position == feed.stored_position:
                continue
            new = await self._put(
                _seg_key(seg), _seg_value(feed.position, self.name, False), feed.version
            )
            if new is None:
                await self._drop(seg)  # taken over (we were thought dead)
            else:
                feed.version, feed.stored_position = new, feed.position

    async def _drop(self, seg: Segment) -> None:
        feed = self._feeds.pop(seg)
        self._order.remove(seg)
        await feed.stop()

    async def _release(self, seg: Segment) -> None:
        feed = self._feeds[seg]
        await self._put(_seg_key(seg), _seg_value(feed.position, None, False), feed.version)
        await self._drop(seg)

    async def release(self) -> None:
        """Give back every owned segment now, with its position (others take them over)."""
        for seg in list(self._feeds):
            await self._release(seg)

    async def _finish(self, feed: _Feed) -> None:
        """A segment read to its sealed end: mark it done; open successors when ready."""
        seg = feed.segment
        await self._put(_seg_key(seg), _seg_value(feed.position, None, True), feed.version)
        await self._drop(seg)
        successors = await self._client.controller.get_successors(seg)
        if not successors:
            return
        state = await self._entries()
        done = {
            Segment.parse(k.removeprefix("segment/")).segment_id
            for k, (v, _) in state.items()
            if k.startswith("segment/") and v["done"]
        }
        for rng, preds in successors.items():
            if set(preds) <= done:
                with contextlib.suppress(TableKeyVersionError):
                    await self._client.segments.table_update(
                        self.group._anchor,
                        self.group.table,
                        [(_seg_key(rng.segment), _seg_value(0, None, False), p.NOT_EXISTS)],
                    )
        self._next_sync = 0.0  # pick them up at once

    async def aclose(self) -> None:
        """Leave the group: positions stored, segments released, reader entry removed."""
        if self._closed:
            return
        self._closed = True
        for seg in list(self._feeds):
            await self._release(seg)
        await self._client.segments.table_remove(
            self.group._anchor, self.group.table, [(self._reader_key, p.NO_VERSION)]
        )

    async def __aenter__(self) -> EventReader:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
