"""Where Lumberjack events go: the target stream, routing, and the writing side.

The Lumberjack front door (``server/lumberjack.py``) collects whole windows
and acks them in order; this module decides where each event of a window
goes and writes it there (``docs/protocols/lumberjack.md#server``):

* **The target stream** of a listener (``--lumberjack-stream``) is created on
  first use, with fixed scaling and ``STREAM_SEGMENT_COUNT`` segments, and its
  open segments are loaded as key ranges.
* **Routing.** An event's routing key is the first configured field present
  in its document (``routing_keys``); the key picks a segment by Pravega's
  key hash. Events without a key go together to one segment chosen
  round-robin per window.
* **One append per target segment.** ``write`` frames each event as a
  Pravega event (``int32 0, int32 length, payload``) and writes each
  segment's part of a window with **one** append, so that part is atomic and
  in order. Parts over ``MAX_APPEND_BYTES`` are split at event boundaries. A
  part whose segment was sealed or deleted under it (the stream was scaled
  or deleted) wrote nothing and is routed again, up to
  ``ROUTE_REFRESH_ATTEMPTS`` times.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Final

from headrace.controller.errors import ScopeExists, StreamExists
from headrace.controller.naming import segment_name
from headrace.controller.records import ScalingPolicy, ScalingType, StreamConfig
from headrace.errors import SegmentNotFound, SegmentSealed
from headrace.protocols.lumberjack import Batch, document_parser
from headrace.protocols.lumberjack.codec import DocumentParser
from headrace.protocols.pravega.codec import EVENT_HEADER
from headrace.protocols.pravega.routing import KeyRanges, routing_key_position
from headrace.server._context import ListenerContext
from headrace.server.lumberjack_config import (
    STREAM_SEGMENT_COUNT,
    LumberjackConfig,
    parse_field_path,
)
from headrace.store.api import MAX_APPEND_BYTES, SegmentStore

__all__ = ["MAX_DOCUMENT_PARSERS", "ROUTE_REFRESH_ATTEMPTS", "LumberjackTarget"]

log = logging.getLogger(__name__)

ROUTE_REFRESH_ATTEMPTS: Final = 3
"""Times a window is re-routed when a segment was sealed under it (the stream
was scaled through the controller) before the connection gives up."""

MAX_DOCUMENT_PARSERS: Final = 16
"""Document parsers kept, one per distinct set of routing fields (listeners' configs)."""

_ROUTING_CACHE_SIZE: Final = 4096
"""Routing keys whose hash position is remembered: shippers' host names repeat."""


@functools.lru_cache(maxsize=_ROUTING_CACHE_SIZE)
def _key_position(key: str) -> float:
    """Where ``key`` falls in the key space, as every Pravega client computes it."""
    return routing_key_position(key)


class LumberjackTarget:
    """The target stream of one listener: created on first use, routed by key range.

    Args:
        app: the running server (its store and shared controller model).
        config: the Lumberjack configuration (stream, routing-key fields).
        name: the listener name, for log lines.
    """

    def __init__(self, app: ListenerContext, config: LumberjackConfig, name: str) -> None:
        self._app = app
        self.name = name
        self.scope, self.stream = config.scope_and_stream
        self._paths = tuple(parse_field_path(spec) for spec in config.routing_key_fields)
        self.parse = _document_parser(tuple(path[0] for path in self._paths))
        """The ``J`` document parser of the listener's connections: only the
        top-level keys that routing reads are built (``document_parser``)."""
        self._ranges: KeyRanges[str] | None = None
        self._lock = asyncio.Lock()
        self._keyless = itertools.count()

    @property
    def store(self) -> SegmentStore:
        return self._app.store

    @property
    def ranges(self) -> KeyRanges[str] | None:
        """The open segments as key ranges, or None until ``refresh`` has run."""
        return self._ranges

    async def refresh(self) -> KeyRanges[str]:
        """Create the stream if needed (fixed scaling, ``STREAM_SEGMENT_COUNT``
        segments) and load its open segments.

        Raises:
            ControllerError: the stream cannot be created or is sealed.
        """
        async with self._lock:
            controller = self._app.controller
            if not controller.stream_exists(self.scope, self.stream):
                if not controller.scope_exists(self.scope):
                    with contextlib.suppress(ScopeExists):  # another listener won the race
                        await controller.create_scope(self.scope)
                policy = ScalingPolicy(ScalingType.FIXED_NUM_SEGMENTS, 0, 0, STREAM_SEGMENT_COUNT)
                try:
                    await controller.create_stream(
                        self.scope, self.stream, StreamConfig(scaling=policy)
                    )
                    log.info("lumberjack: created stream %s/%s", self.scope, self.stream)
                except StreamExists:
                    pass
            segments = controller.current_segments(self.scope, self.stream)
            if not segments:
                raise RuntimeError(f"stream {self.scope}/{self.stream} is sealed")
            self._ranges = KeyRanges.from_ranges(
                (segment_name(self.scope, self.stream, seg.id), seg.min_key, seg.max_key)
                for seg in segments
            )
            return self._ranges

    def keyless_index(self, segment_count: int, turn: int | None = None) -> int:
        """The segment for a window's events that have no routing key (round-robin;
        ``turn``: the one ``next_turn`` gave, for a window written in parts)."""
        if turn is None:
            turn = next(self._keyless)
        return turn % segment_count

    def next_turn(self) -> int:
        """A window's turn of the round-robin, for all its parts (``write``)."""
        return next(self._keyless)

    # ------------------------------------------------------------------ routing

    def routing_keys(self, batch: Batch) -> list[str | None]:
        """The routing key of each event of ``batch`` (None: no configured field)."""
        paths = self._paths
        payloads = batch.payloads
        if not paths:
            return [None] * len(payloads)
        documents = batch.documents
        assert len(documents) == len(payloads)
        return [
            _routing_key(document, payload, paths)
            for document, payload in zip(documents, payloads, strict=True)
        ]

    # ------------------------------------------------------------------ writing

    async def write(
        self,
        payloads: list[bytes],
        keys: list[str | None],
        issued: asyncio.Future[None],
        turn: int | None = None,
    ) -> None:
        """Store events ``payloads`` (routed by ``keys``): one append per target
        segment, in order, re-routed when a segment is sealed or deleted under them.

        ``issued`` is resolved once the first appends are issued, so that the
        next window's appends follow them (per segment, stored order is wire
        order). ``turn``: the window's ``next_turn`` when it is written in parts,
        so that its events without a key all go to one segment.

        Raises:
            RuntimeError: the target segments kept being sealed or deleted.
            StoreError, ControllerError: as the store or controller raised them.
        """
        pending = list(range(len(payloads)))
        attempt = 0
        while pending:
            ranges = self._ranges
            if ranges is None:
                ranges = await self.refresh()
            runs = self._runs(payloads, keys, pending, ranges, turn)
            store = self._app.store
            appends = [asyncio.ensure_future(store.append(name, data)) for name, _, data in runs]
            if not issued.done():
                issued.set_result(None)
            results = await asyncio.gather(*appends, return_exceptions=True)
            pending = []
            for (name, indices, _), result in zip(runs, results, strict=True):
                if isinstance(result, SegmentSealed | SegmentNotFound):
                    # Nothing of this run was written: the stream was scaled or
                    # deleted under us. Route its events again.
                    log.info(
                        "%s: target segment %s is gone (%s); re-routing", self.name, name, result
                    )
                    pending.extend(indices)
                elif isinstance(result, BaseException):
                    raise result
            if pending:
                attempt += 1
                if attempt > ROUTE_REFRESH_ATTEMPTS:
                    raise RuntimeError(
                        f"target segments of {self.scope}/{self.stream} "
                        "keep being sealed or deleted"
                    )
                pending.sort()
                await self.refresh()

    def _runs(
        self,
        payloads: list[bytes],
        keys: list[str | None],
        indices: list[int],
        ranges: KeyRanges[str],
        turn: int | None = None,
    ) -> list[tuple[str, list[int], bytes]]:
        """Events ``indices`` grouped per target segment, framed.

        Each segment gets one run (more only past ``MAX_APPEND_BYTES``), its
        events in wire order. Events without a key share one segment, chosen
        round-robin per window.
        """
        segments = ranges.segments
        keyless = segments[self.keyless_index(len(segments), turn)]
        per_segment: dict[str, list[int]] = {}
        segment_of: dict[str | None, str] = {None: keyless}  # shippers' host names repeat
        for i in indices:
            key = keys[i]
            name = segment_of.get(key)
            if name is None:
                assert key is not None
                name = segment_of[key] = ranges.segment_for_position(_key_position(key))
            per_segment.setdefault(name, []).append(i)
        runs: list[tuple[str, list[int], bytes]] = []
        for name, members in per_segment.items():
            run: list[int] = []
            run_bytes = 0
            for i in members:
                size = EVENT_HEADER.size + len(payloads[i])
                if run and run_bytes + size > MAX_APPEND_BYTES:
                    runs.append((name, run, _frame(payloads, run)))
                    run, run_bytes = [], 0
                run.append(i)
                run_bytes += size
            runs.append((name, run, _frame(payloads, run)))
        return runs


@functools.lru_cache(maxsize=MAX_DOCUMENT_PARSERS)
def _document_parser(fields: tuple[str, ...]) -> DocumentParser:
    """The ``J`` document parser of a listener routing on ``fields`` (top-level keys):
    only they are built as objects (``document_parser``). One per set of fields, not
    per connection: each is a msgspec struct type and its decoder."""
    return document_parser(fields)


def _routing_key(
    document: Mapping[str, object], payload: bytes, paths: tuple[tuple[str, ...], ...]
) -> str | None:
    """The event's routing key: the first configured field present, as text.

    A string is the key as is. An object with a string ``name`` (the ECS
    ``host`` object of Beats 6.3 and later) gives that name. Any other value
    gives its compact JSON text with sorted keys. ``null`` counts as absent.

    ``document`` is the payload's top level as the codec parsed it (its one
    parse, ``Batch.documents``); a number there may be left as written, so the
    rare key that is neither a string nor a named object is taken from a
    second parse of ``payload`` (``_value_key``).
    """
    for path in paths:
        value: object = document
        for part in path:
            if not isinstance(value, dict) or part not in value:
                break
            value = value[part]
        else:
            if value is None:
                continue
            if type(value) is str:
                return value
            if isinstance(value, dict) and type(value.get("name")) is str:
                return str(value["name"])
            return _value_key(payload, path)
    return None


def _value_key(payload: bytes, path: tuple[str, ...]) -> str | None:
    """The key for a field whose value is not a string: its JSON text, sorted keys."""
    try:
        value = json.loads(payload)
    except ValueError:  # over Python's digit limit for int: no key (only the segment changes)
        return None
    for part in path:
        value = value[part]
    if isinstance(value, dict) and isinstance(value.get("name"), str):
        return str(value["name"])
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _frame(payloads: Sequence[bytes], indices: list[int]) -> bytes:
    """The events ``indices`` of ``payloads`` in Pravega event framing, concatenated."""
    parts: list[bytes] = []
    for i in indices:
        parts.append(EVENT_HEADER.pack(0, len(payloads[i])))
        parts.append(payloads[i])
    return b"".join(parts)
