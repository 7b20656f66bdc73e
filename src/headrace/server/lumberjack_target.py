"""Where Lumberjack events go: the target stream, routing, and the writing side.

The Lumberjack front door (``server/lumberjack.py``) collects whole windows
and acks them in order; this module decides where each event of a window
goes and writes it there (``docs/protocols/lumberjack.md#server``):

* **The target stream** of a listener (``--lumberjack-stream``) is created on
  first use, with fixed scaling and ``STREAM_SEGMENT_COUNT`` segments, and its
  open segments are loaded as key ranges.
* **Stream templates.** ``--lumberjack-stream logs/{[@metadata][beat]}`` names
  each event's stream from its fields (``StreamTemplate``). Which stream an
  event goes to is decided when its batch arrives (``stream_names``), so the
  door checks the client's access to exactly those streams before storing;
  an event the template cannot name a stream for, one for a missing stream
  with ``create_streams`` off, one naming a stream of the TANK scope, or one
  past ``MAX_ROUTED_STREAMS`` goes to the default stream.
* **Connection metadata.** With ``metadata`` on, each event gets an
  ``@metadata`` object with the client's address and TLS peer
  (``add_metadata``), overriding what the client put under those names.
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
import re
from collections.abc import Mapping, Sequence
from typing import Final

import msgspec

from headrace.controller.errors import ScopeExists, StreamExists
from headrace.controller.naming import segment_name
from headrace.controller.records import ScalingPolicy, ScalingType, StreamConfig
from headrace.errors import SegmentNotFound, SegmentSealed
from headrace.protocols.lumberjack import Batch, document_parser
from headrace.protocols.lumberjack.codec import DocumentParser, parse_json_object
from headrace.protocols.pravega.codec import EVENT_HEADER
from headrace.protocols.pravega.routing import KeyRanges, routing_key_position
from headrace.server._context import ListenerContext
from headrace.server.lumberjack_config import (
    MAX_ROUTED_STREAMS,
    STREAM_SEGMENT_COUNT,
    LumberjackConfig,
    parse_field_path,
)
from headrace.store.api import MAX_APPEND_BYTES, SegmentStore

__all__ = [
    "MAX_DOCUMENT_PARSERS",
    "METADATA_FIELD",
    "ROUTE_REFRESH_ATTEMPTS",
    "LumberjackTarget",
    "add_metadata",
    "connection_metadata",
]

log = logging.getLogger(__name__)

ROUTE_REFRESH_ATTEMPTS: Final = 3
"""Times a window is re-routed when a segment was sealed under it (the stream
was scaled through the controller) before the connection gives up."""

MAX_DOCUMENT_PARSERS: Final = 16
"""Document parsers kept, one per distinct set of routing fields (listeners' configs)."""

METADATA_FIELD: Final = "@metadata"
"""Logstash's field for what the input knows about an event's connection."""

_ROUTING_CACHE_SIZE: Final = 4096
"""Routing keys whose hash position is remembered: shippers' host names repeat."""


@functools.lru_cache(maxsize=_ROUTING_CACHE_SIZE)
def _key_position(key: str) -> float:
    """Where ``key`` falls in the key space, as every Pravega client computes it."""
    return routing_key_position(key)


class _Stream:
    """One target stream: created on first use, its open segments as key ranges."""

    def __init__(self, app: ListenerContext, scope: str, stream: str) -> None:
        self._app = app
        self.scope = scope
        self.stream = stream
        self.ranges: KeyRanges[str] | None = None
        self._lock = asyncio.Lock()
        self._keyless = itertools.count()

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
            self.ranges = KeyRanges.from_ranges(
                (segment_name(self.scope, self.stream, seg.id), seg.min_key, seg.max_key)
                for seg in segments
            )
            return self.ranges

    def keyless_index(self, segment_count: int, turn: int | None = None) -> int:
        """The segment for a window's events that have no routing key (round-robin;
        ``turn``: the one ``next_turn`` gave, for a window written in parts)."""
        if turn is None:
            turn = next(self._keyless)
        return turn % segment_count


class LumberjackTarget:
    """Where one listener's events go: its stream or template, routed by key range.

    Args:
        app: the running server (its store and shared controller model).
        config: the Lumberjack configuration (stream or template, routing-key fields).
        name: the listener name, for log lines.
    """

    def __init__(self, app: ListenerContext, config: LumberjackConfig, name: str) -> None:
        self._app = app
        self.name = name
        self.scope, self.stream = config.scope_and_stream
        """The one target stream, or a template's default stream."""
        self._default_name = f"{self.scope}/{self.stream}"
        self._template = config.template
        self._create = config.create_streams
        self._tank_scope = app.config.tank_scope
        self._streams: dict[str, _Stream] = {
            self._default_name: _Stream(app, self.scope, self.stream)
        }
        self._fallbacks_logged: set[str] = set()
        self._turns = itertools.count()
        self._paths = tuple(parse_field_path(spec) for spec in config.routing_key_fields)
        self._template_paths = () if self._template is None else self._template.fields
        self.metadata = config.metadata
        read = [path[0] for path in self._paths + self._template_paths]
        if self.metadata:
            read.append(METADATA_FIELD)
        self.parse = _document_parser(tuple(dict.fromkeys(read)))
        """The ``J`` document parser of the listener's connections: only the
        top-level keys that routing, the template and ``@metadata`` read are
        built (``document_parser``)."""

    @property
    def store(self) -> SegmentStore:
        return self._app.store

    @property
    def templated(self) -> bool:
        """Whether events are routed to streams by a template."""
        return self._template is not None

    @property
    def ranges(self) -> KeyRanges[str] | None:
        """The default stream's open segments as key ranges, or None until loaded."""
        return self._streams[self._default_name].ranges

    async def refresh(self) -> KeyRanges[str]:
        """Create the default (or only) stream if needed and load its open segments."""
        return await self._streams[self._default_name].refresh()

    def next_turn(self) -> int:
        """A window's turn of the round-robin, for all its parts (``write``)."""
        return next(self._turns)

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

    def stream_names(self, batch: Batch) -> list[str] | None:
        """The ``scope/stream`` of each event of ``batch``; None: all to the one stream.

        Decided here, when the batch arrives, so the door can check access
        to exactly these streams; creating them waits for ``write``.
        """
        template = self._template
        if template is None:
            return None
        paths = self._template_paths
        names: list[str] = []
        decided: dict[tuple[str | None, ...], str] = {}
        for document, payload in zip(batch.documents, batch.payloads, strict=True):
            values = tuple(_field_text(document, payload, path) for path in paths)
            name = decided.get(values)
            if name is None:
                name = decided[values] = self._decide(template.render(values), values)
            names.append(name)
        return names

    def _decide(self, name: str | None, values: tuple[str | None, ...]) -> str:
        """The stream for a rendered name: itself, or the default stream (logged once)."""
        if name is None:
            return self._fallback("no stream for field values " + repr(values)[:200])
        if name in self._streams:
            return name
        scope, _, stream = name.partition("/")
        if scope == self._tank_scope:
            return self._fallback(f"{name} is in the TANK scope")
        if len(self._streams) >= MAX_ROUTED_STREAMS:
            return self._fallback(
                f"{name}: the template already routes to {MAX_ROUTED_STREAMS} streams"
            )
        if not self._create and not self._app.controller.stream_exists(scope, stream):
            return self._fallback(f"{name} does not exist (--lumberjack-create-streams off)")
        self._streams[name] = _Stream(self._app, scope, stream)
        return name

    def _fallback(self, why: str) -> str:
        """The default stream, saying why once per reason (bounded)."""
        if why not in self._fallbacks_logged and len(self._fallbacks_logged) < MAX_ROUTED_STREAMS:
            self._fallbacks_logged.add(why)
            log.warning("%s: events go to %s: %s", self.name, self._default_name, why)
        return self._default_name

    # ------------------------------------------------------------------ writing

    async def write(
        self,
        payloads: list[bytes],
        keys: list[str | None],
        issued: asyncio.Future[None],
        streams: list[str] | None = None,
        turn: int | None = None,
    ) -> None:
        """Store events ``payloads`` (routed by ``keys``, into ``streams``, or
        the one stream when None): one append per target segment, in order,
        re-routed when a segment is sealed or deleted under them.

        ``issued`` is resolved once the first appends are issued, so that the
        next window's appends follow them (per segment, stored order is wire
        order). ``turn``: the window's ``next_turn`` when it is written in parts,
        so that its events without a key all go to one segment.

        Raises:
            RuntimeError: the target segments kept being sealed or deleted.
            StoreError, ControllerError: as the store or controller raised them.
        """
        pending: dict[_Stream, list[int]] = {}
        if streams is None:
            pending[self._streams[self._default_name]] = list(range(len(payloads)))
        else:
            for i, name in enumerate(streams):
                pending.setdefault(self._streams[name], []).append(i)
        attempt = 0
        store = self._app.store
        while pending:
            runs: list[tuple[_Stream, str, list[int], bytes]] = []
            for target, indices in pending.items():
                ranges = target.ranges
                if ranges is None:
                    ranges = await target.refresh()
                runs += [
                    (target, name, members, data)
                    for name, members, data in _runs(target, payloads, keys, indices, ranges, turn)
                ]
            appends = [asyncio.ensure_future(store.append(name, data)) for _, name, _, data in runs]
            if not issued.done():
                issued.set_result(None)
            results = await asyncio.gather(*appends, return_exceptions=True)
            pending = {}
            for (target, name, indices, _), result in zip(runs, results, strict=True):
                if isinstance(result, SegmentSealed | SegmentNotFound):
                    # Nothing of this run was written: the stream was scaled or
                    # deleted under us. Route its events again.
                    log.info(
                        "%s: target segment %s is gone (%s); re-routing", self.name, name, result
                    )
                    pending.setdefault(target, []).extend(indices)
                elif isinstance(result, BaseException):
                    raise result
            if pending:
                attempt += 1
                if attempt > ROUTE_REFRESH_ATTEMPTS:
                    gone = ", ".join(f"{t.scope}/{t.stream}" for t in pending)
                    raise RuntimeError(f"target segments of {gone} keep being sealed or deleted")
                for target, indices in pending.items():
                    indices.sort()
                    await target.refresh()


def _runs(
    target: _Stream,
    payloads: list[bytes],
    keys: list[str | None],
    indices: list[int],
    ranges: KeyRanges[str],
    turn: int | None = None,
) -> list[tuple[str, list[int], bytes]]:
    """Events ``indices`` grouped per target segment of ``target``, framed.

    Each segment gets one run (more only past ``MAX_APPEND_BYTES``), its
    events in wire order. Events without a key share one segment, chosen
    round-robin per window (``turn``: the window's, for one written in parts).
    """
    segments = ranges.segments
    keyless = segments[target.keyless_index(len(segments), turn)]
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


def _field_text(
    document: Mapping[str, object], payload: bytes, path: tuple[str, ...]
) -> str | None:
    """A template field's value as text: a string as is, a number or boolean as
    written, a named object (ECS ``host``) by its name; absent, ``null`` or
    any other value: None."""
    value: object = document
    for part in path:
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    if type(value) is str:
        return value
    if isinstance(value, dict):
        name = value.get("name")
        return name if type(name) is str else None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if value is None or isinstance(value, list):
        return None
    return _value_key(payload, path)  # a number too large for the first parse


def connection_metadata(
    peer: object, tls: bool, peer_cert: Mapping[str, object] | None
) -> dict[str, object]:
    """What Logstash's beats input records of a connection, under ``@metadata``.

    ``ip_address``: the client's address. ``tls_peer`` (TLS listeners only):
    ``status`` ``verified`` with the certificate's ``subject`` (RFC 4514, as
    Java's ``X500Principal`` writes it) when the client presented one that
    was verified, else ``unverified``.
    """
    meta: dict[str, object] = {}
    if isinstance(peer, tuple) and peer:
        meta["ip_address"] = str(peer[0])
    if tls:
        if peer_cert:
            meta["tls_peer"] = {"status": "verified", "subject": certificate_subject(peer_cert)}
        else:
            meta["tls_peer"] = {"status": "unverified"}
    return meta


_ATTRIBUTE_NAMES: Final = {
    "commonName": "CN",
    "countryName": "C",
    "localityName": "L",
    "stateOrProvinceName": "ST",
    "organizationName": "O",
    "organizationalUnitName": "OU",
    "streetAddress": "STREET",
    "domainComponent": "DC",
    "userId": "UID",
}
"""RFC 4514's short names of the attributes Python's ``getpeercert`` spells out."""


def certificate_subject(peer_cert: Mapping[str, object]) -> str:
    """The subject of a verified certificate as an RFC 4514 string (most specific first)."""
    rdns = peer_cert.get("subject") or ()
    parts: list[str] = []
    for rdn in reversed(list(rdns)):  # type: ignore[call-overload]
        parts.append(
            "+".join(
                f"{_ATTRIBUTE_NAMES.get(str(name), str(name))}={_escape_dn(str(value))}"
                for name, value in rdn
            )
        )
    return ",".join(parts)


def _escape_dn(value: str) -> str:
    """An attribute value escaped as RFC 4514 requires."""
    out = "".join("\\" + c if c in ',+"\\<>;' else c for c in value)
    if out.startswith(("#", " ")):
        out = "\\" + out
    if out.endswith(" ") and not out.endswith("\\ "):
        out = out[:-1] + "\\ "
    return out


_ENCODE: Final = msgspec.json.Encoder().encode


_KEY: Final = b'"@metadata"'
_OBJECT_START: Final = re.compile(rb"\s*:\s*\{\s*")
"""After the ``@metadata`` key: the colon and the opening brace of its object."""


def add_metadata(
    payload: bytes, document: Mapping[str, object], meta: dict[str, object], meta_json: bytes
) -> bytes:
    """``payload`` with the connection's ``meta`` in its ``@metadata`` object.

    An event without ``@metadata`` gets it as its first key, the rest of its
    bytes as sent. One whose ``@metadata`` object (every Beat sends its name
    and version there) holds none of ``meta``'s keys gets them spliced in as
    that object's first keys when its key is written once, plainly, in the
    payload; otherwise the event is parsed whole and written again with
    ``meta``'s keys replacing the client's own (a client cannot pass for
    another address). Numbers too large for that parse keep the event as
    sent. ``meta_json`` is ``meta`` encoded, done once per connection.
    """
    if METADATA_FIELD not in document:
        at = payload.index(b"{") + 1
        rest = payload[at:].lstrip()
        if rest.startswith(b"}"):
            return b'{"@metadata":' + meta_json + b"}"
        return b'{"@metadata":' + meta_json + b"," + rest
    own = document[METADATA_FIELD]
    if isinstance(own, dict) and not own.keys() & meta.keys() and payload.count(_KEY) == 1:
        key = payload.index(_KEY)
        opening = _OBJECT_START.match(payload, key + len(_KEY))
        if opening is not None and payload[key - 1 : key] != b"\\":
            end = opening.end()
            inner = meta_json[1:-1]
            if not inner:
                return payload
            if payload[end : end + 1] != b"}":
                inner += b","
            return payload[:end] + inner + payload[end:]
    try:
        whole = dict(parse_json_object(payload))
        own = whole[METADATA_FIELD]
        merged = dict(own) if isinstance(own, dict) else {}
        merged.update(meta)
        whole[METADATA_FIELD] = merged
        return _ENCODE(whole)
    except (TypeError, ValueError, msgspec.EncodeError):
        try:
            loaded = json.loads(payload)
            own = loaded.get(METADATA_FIELD)
            merged = dict(own) if isinstance(own, dict) else {}
            merged.update(meta)
            loaded[METADATA_FIELD] = merged
            return json.dumps(loaded, ensure_ascii=False, separators=(",", ":")).encode()
        except ValueError:
            return payload


def _frame(payloads: Sequence[bytes], indices: list[int]) -> bytes:
    """The events ``indices`` of ``payloads`` in Pravega event framing, concatenated."""
    parts: list[bytes] = []
    for i in indices:
        parts.append(EVENT_HEADER.pack(0, len(payloads[i])))
        parts.append(payloads[i])
    return b"".join(parts)
