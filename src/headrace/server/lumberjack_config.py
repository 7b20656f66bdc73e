"""Configuration of the Lumberjack front door: target stream, routing key, limits.

Kept apart from ``server/lumberjack.py`` so that ``config.ServerConfig`` can
hold it without importing the listener (which imports the app). Every limit
is a named constant with its reason; ``headrace serve`` flags override them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from headrace.controller.naming import is_valid_name
from headrace.errors import ConfigError
from headrace.protocols.lumberjack import (
    MAX_DECOMPRESSED_BYTES,
    MAX_FRAME_BYTES,
    MAX_WINDOW_COUNT,
)

__all__ = [
    "DEFAULT_ROUTING_KEY_FIELDS",
    "DEFAULT_STREAM",
    "IDLE_TIMEOUT_S",
    "KEEPALIVE_INTERVAL_S",
    "MAX_ACK_WAIT_S",
    "MAX_PENDING_BYTES",
    "MAX_ROUTED_STREAMS",
    "MAX_WINDOWS_IN_FLIGHT",
    "STREAM_SEGMENT_COUNT",
    "WINDOW_LINGER_S",
    "LumberjackConfig",
    "StreamTemplate",
    "parse_field_path",
]

DEFAULT_STREAM: Final = "logs/beats"
"""``scope/stream`` that Lumberjack events are written to."""

STREAM_SEGMENT_COUNT: Final = 4
"""Segments of the target stream when the front door creates it (fixed scaling
policy): enough to spread many shippers' hosts, few enough to keep windows in
few appends."""

DEFAULT_ROUTING_KEY_FIELDS: Final = ("host", "[beat][hostname]")
"""Fields tried in order for an event's routing key: logstash-forwarder and the
npm clients send ``host``; Beats before 6.3 send ``beat.hostname`` (later ones a
``host`` object, whose JSON text is then the key). No field: no key."""

KEEPALIVE_INTERVAL_S: Final = 5.0
"""v2 only: while a window awaits its ack, an ``Ack(0)`` goes out when nothing
was written for this long. Logstash's interval (lumberjack.md#keepalive); libbeat renews its
30 s ack timeout on each one."""

IDLE_TIMEOUT_S: Final = 60.0
"""A connection that sends nothing for this long is closed. Logstash's
``client_inactivity_timeout`` default; Beats reconnect when they next have
events. A client waiting for an ack is not idle from our side: the loop only
times reads while it has room for more windows."""

WINDOW_LINGER_S: Final = 10.0
"""An incomplete window that receives nothing for this long has its events so
far stored (not acked). Windows are otherwise stored whole when they close;
this is for "W once" clients (npm lumberjack-protocol, the Ruby client) that
trickle events into a window of 1000-5000 and never resend (lumberjack.md#durable-acks):
their events are readable within seconds and survive the connection. Clients
that send a window at once never pause 10 s inside it; one that stalls there
and then reconnects gets the stored part twice (at-least-once). 0 disables."""

MAX_ACK_WAIT_S: Final = 120.0
"""Longest a complete window may wait for the store before the connection is
closed without its ack. Keepalives would otherwise keep a Beat waiting forever
on a wedged store (elastic/beats#41534); closing lets it resend elsewhere."""

MAX_PENDING_BYTES: Final = 64 * 1024 * 1024
"""Event bytes one connection may hold that are not yet acked (the open window
plus windows being stored). Two pipelined libbeat windows of 2048 events are a
few MiB; a window that needs more is refused (connection closed, no ack)
instead of being buffered without bound."""

MAX_WINDOWS_IN_FLIGHT: Final = 4
"""Complete windows of one connection being stored at once; reading pauses
beyond it (TCP back-pressure). libbeat pipelines 2; a ``W`` = 0 ack point
counts as a window."""

MAX_ROUTED_STREAMS: Final = 256
"""Distinct streams one listener's template may route to. Each is a stream
the door may create and keeps open segments of; a client that names more
(a field holding a request id, say) has the rest of its events go to the
default stream, logged, instead of growing the server's tables without bound."""

_PLACEHOLDER = re.compile(r"%?\{([^{}]*)\}")
"""A template's ``{field}`` (Logstash's ``%{field}`` is taken too)."""

_NAME_CHARS = re.compile(r"[^A-Za-z0-9.-]+")
"""What a field's value may not bring into a stream name: runs of it become ``-``."""

_FIELD_PART = re.compile(r"\[([^\[\]]+)\]")


def parse_field_path(spec: str) -> tuple[str, ...]:
    """A routing-key field as a path of object keys.

    ``host`` is the top-level key ``host`` (dots are part of the name);
    ``[beat][hostname]`` is Logstash's field-reference syntax for a nested key.

    Raises:
        ConfigError: empty, or brackets that do not form ``[a][b]...``.
    """
    if not spec:
        raise ConfigError("an empty routing-key field name")
    if not spec.startswith("["):
        if "[" in spec or "]" in spec:
            raise ConfigError(f"routing-key field {spec!r}: write nested fields as [a][b]")
        return (spec,)
    parts = _FIELD_PART.findall(spec)
    if "".join(f"[{p}]" for p in parts) != spec:
        raise ConfigError(f"routing-key field {spec!r}: write nested fields as [a][b]")
    return tuple(parts)


@dataclass(frozen=True, slots=True)
class StreamTemplate:
    """``--lumberjack-stream`` with ``{field}`` placeholders: where each event goes.

    ``logs/{[@metadata][beat]}`` sends a Filebeat event to ``logs/filebeat``.
    A placeholder is a field path as for routing keys (``host``, or ``[a][b]``
    for nested keys). The value of a present field is used as text with every
    run of characters a name may not hold replaced by ``-`` (``my_app`` is
    ``my-app``); an event whose field is absent, empty or ``null``, or whose
    name comes out invalid, goes to the default stream.

    Attributes:
        parts: the template's literal text (str) and field paths (tuples), in order.
    """

    parts: tuple[str | tuple[str, ...], ...]

    @classmethod
    def parse(cls, spec: str) -> StreamTemplate:
        """The template of ``spec``; a spec without placeholders is one literal.

        Raises:
            ConfigError: a placeholder that is not a field path, or literal
                text that cannot be part of ``scope/stream``.
        """
        parts: list[str | tuple[str, ...]] = []
        at = 0
        for match in _PLACEHOLDER.finditer(spec):
            if match.start() > at:
                parts.append(spec[at : match.start()])
            try:
                parts.append(parse_field_path(match[1]))
            except ConfigError as exc:
                raise ConfigError(f"--lumberjack-stream {spec!r}: {exc}") from None
            at = match.end()
        if at < len(spec):
            parts.append(spec[at:])
        literal = "".join(part if isinstance(part, str) else "x" for part in parts)
        scope, slash, stream = literal.partition("/")
        shapeless = not (slash and scope and stream) or "/" in stream
        if shapeless or _NAME_CHARS.search(scope + stream):
            raise ConfigError(
                f"--lumberjack-stream {spec!r}: expected scope/stream, each of letters, "
                "digits, '.', '-' and {field} placeholders"
            )
        return cls(tuple(parts))

    @property
    def fields(self) -> tuple[tuple[str, ...], ...]:
        """The field paths the template reads, in order."""
        return tuple(part for part in self.parts if isinstance(part, tuple))

    def render(self, values: tuple[str | None, ...]) -> str | None:
        """``scope/stream`` with ``values`` (one per field, text or None) in
        place of the fields; None when a value is missing or the name is invalid."""
        out: list[str] = []
        index = 0
        for part in self.parts:
            if isinstance(part, str):
                out.append(part)
                continue
            value = values[index]
            index += 1
            if not value:
                return None
            cleaned = _NAME_CHARS.sub("-", value).strip("-")
            if not cleaned:
                return None
            out.append(cleaned)
        name = "".join(out)
        scope, _, stream = name.partition("/")
        if not (is_valid_name(scope) and is_valid_name(stream)):
            return None
        return name


@dataclass(frozen=True, slots=True)
class LumberjackConfig:
    """Where Lumberjack events go and the limits each connection runs under.

    Attributes:
        stream: target ``scope/stream``, created on first use with
            ``STREAM_SEGMENT_COUNT`` segments; or a template with ``{field}``
            placeholders (``StreamTemplate``) that routes each event.
        default_stream: where a template sends events it cannot name a
            stream for (and, with ``create_streams`` off, events for a stream
            that does not exist).
        create_streams: create missing target streams (the default stream
            is always created).
        metadata: add the connection's ``@metadata`` (peer address, TLS
            client) to each stored event, as Logstash's beats input does.
        routing_key_fields: fields tried in order for the routing key (see
            ``parse_field_path``); empty: every event goes without a key.
        keepalive_interval_s: ``KEEPALIVE_INTERVAL_S``.
        idle_timeout_s: ``IDLE_TIMEOUT_S``.
        max_ack_wait_s: ``MAX_ACK_WAIT_S``.
        window_linger_s: ``WINDOW_LINGER_S``; 0 stores windows only whole.
        max_window_count: largest ``W`` count (``codec.MAX_WINDOW_COUNT``).
        max_frame_bytes: largest frame (``codec.MAX_FRAME_BYTES``).
        max_decompressed_bytes: inflated bytes per ``C`` frame
            (``codec.MAX_DECOMPRESSED_BYTES``).
        max_pending_bytes: ``MAX_PENDING_BYTES``.
    """

    stream: str = DEFAULT_STREAM
    default_stream: str = DEFAULT_STREAM
    create_streams: bool = True
    metadata: bool = True
    routing_key_fields: tuple[str, ...] = DEFAULT_ROUTING_KEY_FIELDS
    keepalive_interval_s: float = KEEPALIVE_INTERVAL_S
    idle_timeout_s: float = IDLE_TIMEOUT_S
    max_ack_wait_s: float = MAX_ACK_WAIT_S
    window_linger_s: float = WINDOW_LINGER_S
    max_window_count: int = MAX_WINDOW_COUNT
    max_frame_bytes: int = MAX_FRAME_BYTES
    max_decompressed_bytes: int = MAX_DECOMPRESSED_BYTES
    max_pending_bytes: int = MAX_PENDING_BYTES

    @property
    def template(self) -> StreamTemplate | None:
        """The stream template, or None when ``stream`` names one stream."""
        template = StreamTemplate.parse(self.stream)
        return template if template.fields else None

    @property
    def scope_and_stream(self) -> tuple[str, str]:
        """The one target stream, or the default stream of a template."""
        name = self.stream if self.template is None else self.default_stream
        scope, _, stream = name.partition("/")
        return scope, stream

    def scopes(self) -> tuple[str, ...]:
        """Scopes events may go to; a template's own scope only if it is literal."""
        names = [self.scope_and_stream[0]]
        template = self.template
        if template is not None and isinstance(template.parts[0], str):
            head = template.parts[0]
            if "/" in head:
                names.append(head.partition("/")[0])
        return tuple(dict.fromkeys(names))

    def validate(self) -> None:
        """Raise ``ConfigError`` for any value out of range."""
        StreamTemplate.parse(self.stream)
        for flag, name in (
            ("--lumberjack-stream", self.stream),
            ("--lumberjack-default-stream", self.default_stream),
        ):
            if flag == "--lumberjack-stream" and self.template is not None:
                continue
            scope, _, stream = name.partition("/")
            if not (is_valid_name(scope) and is_valid_name(stream)):
                raise ConfigError(
                    f"{flag} {name!r}: expected scope/stream, each of letters, digits, '.' and '-'"
                )
        for spec in self.routing_key_fields:
            parse_field_path(spec)
        for name in ("keepalive_interval_s", "idle_timeout_s", "max_ack_wait_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"lumberjack {name} must be positive")
        if self.window_linger_s < 0:
            raise ConfigError("lumberjack window linger must not be negative")
        if not 1 <= self.max_window_count <= 2**32 - 1:
            raise ConfigError("lumberjack max window count must be in 1..2**32-1")
        for name in ("max_frame_bytes", "max_decompressed_bytes", "max_pending_bytes"):
            if getattr(self, name) < 1024:
                raise ConfigError(f"lumberjack {name} must be at least 1024")
