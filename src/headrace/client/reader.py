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
``config``                 ``{"streams": ["S/st", ...], "id": str,
                           "generation": int, "retention": int}``: the streams,
                           and the group's id, generation and retention type
                           in the controller (absent for an unregistered group)
``segment/<name>``         ``{"offset": int, "owner": str | null, "done": bool,
                           "next": [int, ...]}``: the read position of one
                           segment (bytes consumed by the group: the next event
                           starts there), its current reader, whether it was
                           read to its sealed end, and then the ids of its
                           successors (``next``)
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

The controller (``createReaderGroup``)
-----------------------------------------
``create`` also registers the group with the controller, as Pravega's own
clients do: the controller keeps its configuration (streams and starting
cuts, retention type, id, generation) and creates its state stream
``_RG<group>``; ``delete`` deletes it there too. A group whose retention
type is MANUAL or AUTOMATIC is a *subscriber* of its streams: retention
never truncates a stream past the last stream cut the group reported
(``checkpoint``; an AUTOMATIC group's readers report one every
``checkpoint_interval_s``). A group of retention type NONE works without the
controller's record (a server that answers ``UNIMPLEMENTED``, a user allowed
only on the streams).

Positions: ``stream_cuts`` turns the stored positions into one stream cut per
stream (the unfinished segments at their positions, plus finished ones whose
successors the group has not reached yet, or that have none, at their end), which ``create``
accepts back as ``start`` to begin a new group where an old one was.
``checkpoint`` returns the same cuts and, for a subscriber, reports them.
Readers store their positions every ``SYNC_INTERVAL_S``, so a cut lags the
events returned by at most that.

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
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from headrace.errors import ControllerError, ServerError
from headrace.protocols import pravega as p
from headrace.protocols.pravega.controller import GroupRetention, ReaderGroupConfig

from .controller import Segment
from .errors import NoSuchSegmentError, SegmentIsTruncatedError, TableKeyVersionError
from .records import _EventBuffer

if TYPE_CHECKING:
    from .pravega import PravegaClient

__all__ = [
    "CHECKPOINT_INTERVAL_S",
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

CHECKPOINT_INTERVAL_S = 30.0
"""How often the readers of an AUTOMATIC group report its stream cuts to the
controller (Java's default automatic checkpoint interval)."""

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
        self.retention = GroupRetention.NONE
        """Whether the group is a subscriber of its streams (see the module docstring)."""
        self.group_id = ""
        """The group's id in the controller; empty while it has no record there."""
        self.generation = 0
        self.checkpoint_interval_s = CHECKPOINT_INTERVAL_S
        self._next_checkpoint = 0.0

    @classmethod
    async def create(
        cls,
        client: PravegaClient,
        scope: str,
        name: str,
        streams: Sequence[str],
        *,
        from_tail: bool = False,
        start: Mapping[str, Mapping[int, int]] | None = None,
        retention: GroupRetention = GroupRetention.NONE,
        checkpoint_interval_s: float = CHECKPOINT_INTERVAL_S,
        reader_timeout_s: float = READER_TIMEOUT_S,
        sync_interval_s: float = SYNC_INTERVAL_S,
    ) -> ReaderGroup:
        """Create the group (or open it if it exists) over ``streams`` (``"stream"`` or
        ``"scope/stream"``), starting at their heads (or tails), or where ``start``
        says for the streams it names (``"scope/stream"`` -> a stream cut, as
        ``stream_cuts`` returns). The group is registered with the controller
        (``createReaderGroup``) with ``retention`` as its retention type.

        Raises:
            ControllerError, ServerError: the controller refused to register a
                subscribing group (for NONE, a refusal leaves the group working
                without the controller's record).
        """
        group = cls(
            client,
            scope,
            name,
            reader_timeout_s=reader_timeout_s,
            sync_interval_s=sync_interval_s,
        )
        group.checkpoint_interval_s = checkpoint_interval_s
        segs = client.segments
        qualified = [s if "/" in s else f"{scope}/{s}" for s in streams]
        starts = {q: dict((start or {}).get(q, {})) for q in qualified}
        heads: dict[str, dict[Segment, int]] = {}
        for q in qualified:
            sc, st = q.split("/")
            if starts[q]:
                heads[q] = {Segment(sc, st, sid): off for sid, off in starts[q].items()}
            elif from_tail:
                heads[q] = {
                    r.segment: (await segs.stat(r.segment)).length
                    for r in await client.controller.get_current_segments(sc, st)
                }
            else:
                heads[q] = await client.controller.get_head_segments(sc, st)
        config = ReaderGroupConfig(
            scope,
            name,
            start={q: {seg.segment_id: off for seg, off in h.items()} for q, h in heads.items()},
            retention=retention,
            checkpoint_ms=int(checkpoint_interval_s * 1000),
        )
        try:
            registered: ReaderGroupConfig | None = await client.controller.create_reader_group(
                config
            )
        except (ServerError, ControllerError) as exc:
            if retention is not GroupRetention.NONE or not _unregistrable(exc):
                raise
            registered = None
        await segs.create_table(group._anchor, group.table)
        settings: dict[str, Any] = {"streams": qualified}
        if registered is not None:
            group._registered(registered)
            settings.update(
                id=registered.group_id,
                generation=registered.generation,
                retention=int(registered.retention),
            )
        entries: list[tuple[bytes, bytes, int]] = [
            (b"config", json.dumps(settings).encode(), p.NOT_EXISTS)
        ]
        for h in heads.values():
            for segment, offset in h.items():
                entries.append((_seg_key(segment), _seg_value(offset, None, False), p.NOT_EXISTS))
        try:
            await segs.table_update(group._anchor, group.table, entries)
        except TableKeyVersionError:  # it exists: open it as it is
            if registered is None:
                await group._load_settings()
            else:
                await group._store_settings()
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

    def _registered(self, config: ReaderGroupConfig) -> None:
        self.group_id = config.group_id
        self.generation = config.generation
        self.retention = config.retention

    async def _load_settings(self) -> None:
        """Take the controller id, generation and retention type the table holds."""
        state = await self.state()
        settings = state.get("config", ({}, 0))[0]
        self.group_id = str(settings.get("id", ""))
        self.generation = int(settings.get("generation", 0))
        self.retention = GroupRetention(int(settings.get("retention", 0)))

    async def _store_settings(self) -> None:
        """Record the controller's id, generation and retention type in an existing
        table made without them (a group older than its controller record)."""
        state = await self.state()
        settings, version = state.get("config", ({}, p.NOT_EXISTS))
        if settings.get("id") == self.group_id:
            return
        settings = {
            **settings,
            "id": self.group_id,
            "generation": self.generation,
            "retention": int(self.retention),
        }
        with contextlib.suppress(TableKeyVersionError):  # another process did it
            await self._client.segments.table_update(
                self._anchor, self.table, [(b"config", json.dumps(settings).encode(), version)]
            )

    async def stream_cuts(self) -> dict[str, dict[int, int]]:
        """Where the group is: per stream (``"scope/stream"``) a stream cut
        (segment id -> offset) from the positions its readers stored (a stream
        read to its sealed end: its last segments at their ends)."""
        state = await self.state()
        present = {
            Segment.parse(k.removeprefix("segment/")).segment_id
            for k in state
            if k.startswith("segment/")
        }
        cuts: dict[str, dict[int, int]] = {}
        for k, (v, _) in state.items():
            if not k.startswith("segment/"):
                continue
            seg = Segment.parse(k.removeprefix("segment/"))
            # A finished segment stays in the cut (at its end) until the group
            # reached its successors; the last ones of a sealed stream stay.
            following = set(v.get("next", ()))
            if v["done"] and following and following <= present:
                continue
            cuts.setdefault(f"{seg.scope}/{seg.stream}", {})[seg.segment_id] = v["offset"]
        return cuts

    async def checkpoint(self) -> dict[str, dict[int, int]]:
        """The group's stream cuts (``stream_cuts``); a subscribing group also
        reports them to the controller (``updateSubscriberStreamCut``), so that
        retention may truncate its streams up to there. A cut behind one already
        reported (another process of the group was quicker) is not an error.

        Raises:
            ControllerError: the controller refused a cut for another reason.
        """
        cuts = await self.stream_cuts()
        if self.retention is GroupRetention.NONE or not self.group_id:
            return cuts
        subscriber = f"{self.scope}/{self.name}"
        for stream_name, cut in sorted(cuts.items()):
            sc, _, st = stream_name.partition("/")
            try:
                await self._client.controller.update_subscriber_stream_cut(
                    sc, st, subscriber, self.group_id, self.generation, cut
                )
            except ControllerError as exc:
                if exc.status != "STREAM_CUT_NOT_VALID":
                    raise
        return cuts

    async def _auto_checkpoint(self) -> None:
        """An AUTOMATIC group's periodic report (called from its readers' syncs)."""
        now = time.monotonic()
        if self.retention is not GroupRetention.AUTOMATIC or now < self._next_checkpoint:
            return
        self._next_checkpoint = now + self.checkpoint_interval_s
        with contextlib.suppress(ControllerError, ServerError):
            await self.checkpoint()

    async def create_reader(self, name: str) -> EventReader:
        """Join the group as reader ``name`` and take a fair share of its segments."""
        reader = EventReader(self._client, self, name)
        await reader.sync()
        return reader

    async def delete(self) -> bool:
        """Delete the group's state (and its index entry, and its record in the
        controller); ``False`` if it did not exist."""
        segs = self._client.segments
        if not self.group_id:
            with contextlib.suppress(ServerError, ControllerError, NoSuchSegmentError):
                await self._load_settings()
        if self.group_id:
            with contextlib.suppress(ServerError, ControllerError):
                await self._client.controller.delete_reader_group(
                    self.scope, self.name, self.group_id
                )
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


_UNREGISTRABLE_CODES = frozenset({"UNIMPLEMENTED", "PERMISSION_DENIED"})
"""gRPC codes with which a controller refuses to keep a group's record while the
group itself still works: a server without the RPC, a user allowed only on the
streams (the group's record needs a grant on its state stream)."""


def _unregistrable(exc: Exception) -> bool:
    """Whether a refusal of ``createReaderGroup`` leaves a NONE group usable: the
    codes above, or a group name the controller's rule refuses (``_`` in it)."""
    if isinstance(exc, ServerError):
        return getattr(exc.code, "name", exc.code) in _UNREGISTRABLE_CODES
    return isinstance(exc, ControllerError) and exc.status == "INVALID_RG_NAME"


def _seg_key(segment: Segment | str) -> bytes:
    return f"segment/{segment}".encode()


def _seg_value(offset: int, owner: str | None, done: bool, successors: Sequence[int] = ()) -> bytes:
    value: dict[str, Any] = {"offset": offset, "owner": owner, "done": done}
    if done:
        value["next"] = list(successors)
    return json.dumps(value).encode()


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
        self.position = off + 8 + len(payload)
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
        self._exhausted = False

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
        await self.group._auto_checkpoint()
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
        present = {k.removeprefix("segment/") for k in state if k.startswith("segment/")}
        ids = {Segment.parse(n).segment_id for n in present}
        # Read to the end: every segment done, and every successor of one reached
        # (a finished segment records its successors; one without that record
        # might still have some, so it never counts as the end).
        self._exhausted = bool(present) and all(
            v["done"] and "next" in v and set(v["next"]) <= ids
            for k, (v, _) in state.items()
            if k.startswith("segment/")
        )
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

    def __aiter__(self) -> AsyncIterator[EventRead]:
        return self._events()

    async def _events(self) -> AsyncIterator[EventRead]:
        """Every event, as ``read_next`` returns them, until the reader is closed or
        the group has read every stream to its sealed end."""
        while not self._closed:
            event = await self.read_next()
            if event is not None:
                yield event
            elif self._exhausted and not self._feeds:
                return

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
        successors = await self._client.controller.get_successors(seg)
        following = sorted(rng.segment.segment_id for rng in successors)
        await self._put(
            _seg_key(seg), _seg_value(feed.position, None, True, following), feed.version
        )
        await self._drop(seg)
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
