"""The headrace exception hierarchy: one root, data-carrying leaves.

Every error headrace raises on purpose derives from :class:`HeadraceError`.
Attributes are data (names, offsets, versions) so that the protocol adapters
can translate them into wire replies without parsing text; each boundary
translates in exactly one place (the server's error tables, the client's
``map_exceptions``)::

    HeadraceError
    ├── ProtocolError
    │   ├── LocalProtocolError        we (or our caller) broke the protocol: a bug
    │   ├── RemoteProtocolError       the peer broke it; carries ``reply_hint``
    │   │   └── AccessDenied          auth refused the peer; the connection closes
    │   └── FrameTooLarge             a frame over a named limit (remote's fault)
    ├── StoreError
    │   ├── SegmentNotFound(name)
    │   ├── SegmentExists(name)
    │   ├── SegmentSealed(name, length)
    │   ├── SegmentTruncated(name, start_offset)
    │   ├── BadOffset(name, expected, actual)
    │   ├── SegmentTypeMismatch(name, expected_kind)
    │   ├── TableKeyNotFound(name, key)
    │   ├── TableKeyBadVersion(name, key, expected, actual)
    │   ├── TableNotEmpty(name)
    │   ├── LimitExceeded(what, limit, got)
    │   ├── AppendRefused(name, reason)
    │   ├── CorruptionError(path, position, reason)
    │   ├── StorageFull
    │   ├── StoreClosed
    │   └── OwnerUnavailable(name)    the segment's owner (another node) did not answer; retriable
    ├── ClientError (``retriable`` class attribute)
    │   ├── ConnectionLost
    │   ├── RequestTimeout
    │   └── ServerError(code)
    ├── ControllerError(status)       a controller refused a request
    └── ConfigError
"""

from __future__ import annotations

__all__ = [
    "AccessDenied",
    "AppendRefused",
    "BadOffset",
    "ClientError",
    "ConfigError",
    "ConnectionLost",
    "ControllerError",
    "CorruptionError",
    "FrameTooLarge",
    "HeadraceError",
    "LimitExceeded",
    "LocalProtocolError",
    "OwnerUnavailable",
    "ProtocolError",
    "RemoteProtocolError",
    "RequestTimeout",
    "SegmentExists",
    "SegmentNotFound",
    "SegmentSealed",
    "SegmentTruncated",
    "SegmentTypeMismatch",
    "ServerError",
    "StorageFull",
    "StoreClosed",
    "StoreError",
    "TableKeyBadVersion",
    "TableKeyNotFound",
    "TableNotEmpty",
]


class HeadraceError(Exception):
    """Root of every error headrace raises deliberately."""


# --------------------------------------------------------------------------- protocol


class ProtocolError(HeadraceError):
    """A protocol rule was broken; see the two subclasses for whose fault it is."""


class LocalProtocolError(ProtocolError):
    """We, or the code calling us, tried to do something the protocol forbids (a bug)."""


class RemoteProtocolError(ProtocolError):
    """The peer sent something the protocol forbids.

    Args:
        message: what was wrong, for the log.
        reply_hint: the protocol-specific reply to send before closing, if the
            protocol has one (an error frame, a status code); ``None`` means
            "log and close".
    """

    close_reason = "protocol_error"
    """Why the connection closes, in its access line and ``headrace_errors_total``."""

    def __init__(self, message: str, *, reply_hint: object | None = None) -> None:
        super().__init__(message)
        self.reply_hint = reply_hint


class AccessDenied(RemoteProtocolError):
    """Auth refused the peer, on a protocol whose only answer is to close (Lumberjack)."""

    close_reason = "access_denied"


class FrameTooLarge(RemoteProtocolError):
    """A frame announced a size above the connection's limit."""

    def __init__(self, limit_bytes: int, got_bytes: int, *, reply_hint: object | None = None):
        super().__init__(
            f"frame of {got_bytes} bytes exceeds the limit of {limit_bytes} bytes",
            reply_hint=reply_hint,
        )
        self.limit_bytes = limit_bytes
        self.got_bytes = got_bytes


# --------------------------------------------------------------------------- store


class StoreError(HeadraceError):
    """A store operation could not be carried out; nothing was changed."""


class SegmentNotFound(StoreError):
    def __init__(self, name: str) -> None:
        super().__init__(f"segment {name!r} does not exist")
        self.name = name


class SegmentExists(StoreError):
    def __init__(self, name: str) -> None:
        super().__init__(f"segment {name!r} already exists")
        self.name = name


class SegmentSealed(StoreError):
    """The segment is sealed; ``length`` is its final length."""

    def __init__(self, name: str, length: int) -> None:
        super().__init__(f"segment {name!r} is sealed at length {length}")
        self.name = name
        self.length = length


class SegmentTruncated(StoreError):
    """A read below the segment's start offset; ``start_offset`` is the first readable byte."""

    def __init__(self, name: str, start_offset: int) -> None:
        super().__init__(f"segment {name!r} is truncated; it starts at offset {start_offset}")
        self.name = name
        self.start_offset = start_offset


class BadOffset(StoreError):
    """An offset did not match: a conditional append or a table batch saw another length.

    ``expected`` is what the caller asked for, ``actual`` is what the store has.
    """

    def __init__(self, name: str, expected: int, actual: int) -> None:
        super().__init__(f"segment {name!r}: expected offset {expected}, actual {actual}")
        self.name = name
        self.expected = expected
        self.actual = actual


class SegmentTypeMismatch(StoreError):
    """A table operation on a plain segment or the other way round."""

    def __init__(self, name: str, expected_kind: str) -> None:
        super().__init__(f"segment {name!r} is not a {expected_kind} segment")
        self.name = name
        self.expected_kind = expected_kind


class TableKeyNotFound(StoreError):
    """A conditional table operation named a key that is absent."""

    def __init__(self, name: str, key: bytes) -> None:
        super().__init__(f"table {name!r}: key {key!r} does not exist")
        self.name = name
        self.key = key


class TableKeyBadVersion(StoreError):
    """A conditional table operation expected another version of a key.

    ``actual`` is the key's current version, or -1 if the key is absent.
    """

    def __init__(self, name: str, key: bytes, expected: int, actual: int) -> None:
        super().__init__(f"table {name!r}: key {key!r} has version {actual}, expected {expected}")
        self.name = name
        self.key = key
        self.expected = expected
        self.actual = actual


class TableNotEmpty(StoreError):
    def __init__(self, name: str) -> None:
        super().__init__(f"table {name!r} is not empty")
        self.name = name


class LimitExceeded(StoreError):
    """An argument is over a named limit (key size, value size, name length...)."""

    def __init__(self, what: str, limit: int, got: int) -> None:
        super().__init__(f"{what}: {got} exceeds the limit of {limit}")
        self.what = what
        self.limit = limit
        self.got = got


class AppendRefused(StoreError):
    """The data may not be stored in that segment (``SegmentStore.check_appends``)."""

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"segment {name!r} refuses the append: {reason}")
        self.name = name
        self.reason = reason


class CorruptionError(StoreError):
    """Stored bytes failed a check; ``position`` is a file position inside ``path``."""

    def __init__(self, path: str, position: int, reason: str) -> None:
        super().__init__(f"{path} at position {position}: {reason}")
        self.path = path
        self.position = position
        self.reason = reason


class StorageFull(StoreError):
    """The disk has no room for the write; nothing was acknowledged."""


class StoreClosed(StoreError):
    """The store was closed (or failed an fsync and stopped accepting writes)."""


class OwnerUnavailable(StoreError):
    """The node that owns the segment could not be reached, or stopped answering.

    Raised by the cluster's forwarding stores (``headrace.cluster``) when the
    connection to the owner fails, is lost or goes silent, when the owner
    says it no longer owns the segment, or when no node owns it right now.
    The one exception to "nothing half-done": a call in flight when the
    connection broke may or may not have happened at the owner (it was
    never acknowledged). Retriable: asking again, once the owner is back or
    another node owns the segment, can succeed.
    """

    retriable = True

    def __init__(self, name: str, reason: str) -> None:
        super().__init__(f"segment {name!r}: owner unavailable: {reason}")
        self.name = name
        self.reason = reason


# --------------------------------------------------------------------------- client


class ClientError(HeadraceError):
    """An error seen by a client; ``retriable`` says whether trying again can help."""

    retriable: bool = False


class ConnectionLost(ClientError):
    retriable = True


class RequestTimeout(ClientError):
    retriable = True


class ServerError(ClientError):
    def __init__(self, code: object, message: str = "") -> None:
        super().__init__(f"server replied {code}: {message}" if message else f"server: {code}")
        self.code = code
        self.detail = message
        """The server's own words (without the code), for a message to a person."""


# --------------------------------------------------------------------------- controller


class ControllerError(HeadraceError):
    """A controller refused a request; no metadata was changed.

    One class for both ends of the controller API. Our controller raises its
    subclasses (``headrace.controller.errors``, one per reason) and its
    service turns each into the reply's status; a client raises this class
    for a reply whose status is not success, with the status's name in
    ``status`` (``STREAM_NOT_FOUND``...; empty where the reason is a
    subclass). Not retriable: asking again meets the same refusal.
    """

    retriable: bool = False

    def __init__(self, message: str, *, status: str = "") -> None:
        super().__init__(message)
        self.status = status


# --------------------------------------------------------------------------- config


class ConfigError(HeadraceError):
    """A configuration value is missing, malformed or out of range."""
