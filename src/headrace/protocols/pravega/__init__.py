"""Pravega segment-store wire protocol, sans-I/O (``docs/protocols/pravega.md``).

* ``commands``: :class:`CommandType` and one frozen dataclass per wire command;
* ``codec``: :func:`encode_command` / :func:`decode_command` and the framing limits;
* ``states``: the two transition tables (client stream, server stream);
* ``connection``: :class:`PravegaConnection`, per-writer append sessions, limits.

Only the names below are public; import them from here.
"""

from __future__ import annotations

from .codec import (
    EVENT_HEADER,
    HEADER_SIZE_BYTES,
    MAX_FRAME_BYTES,
    MAX_REPLY_TEXT_BYTES,
    MAX_STRING_BYTES,
    QUOTED_NAME_CHARS,
    decode_command,
    decode_events,
    decode_frame,
    decode_payload,
    encode_command,
    encode_event,
    encode_split,
    iter_events,
    reply_text,
)
from .commands import *  # noqa: F403 - the command vocabulary is public by design
from .commands import __all__ as _commands_all
from .connection import (
    MAX_BUFFERED_BYTES,
    MAX_WRITERS_PER_CONNECTION,
    OLDEST_COMPATIBLE_VERSION,
    WIRE_VERSION,
    AppendData,
    ConnectionClosed,
    ConnectionEvent,
    PravegaConnection,
    WriterSession,
)
from .states import Role, StreamState

__all__ = [
    "EVENT_HEADER",
    "HEADER_SIZE_BYTES",
    "MAX_BUFFERED_BYTES",
    "MAX_FRAME_BYTES",
    "MAX_REPLY_TEXT_BYTES",
    "MAX_STRING_BYTES",
    "MAX_WRITERS_PER_CONNECTION",
    "OLDEST_COMPATIBLE_VERSION",
    "QUOTED_NAME_CHARS",
    "WIRE_VERSION",
    "AppendData",
    "ConnectionClosed",
    "ConnectionEvent",
    "PravegaConnection",
    "Role",
    "StreamState",
    "WriterSession",
    "decode_command",
    "decode_events",
    "decode_frame",
    "decode_payload",
    "encode_command",
    "encode_event",
    "encode_split",
    "iter_events",
    "reply_text",
    *_commands_all,
]
