"""Errors of the controller model: data-carrying, one class per outcome a reply names.

The gRPC service turns each into a status value of the reply message (or a
gRPC status code for replies that have no status field) in exactly one
place: ``service.py``'s error tables. ::

    HeadraceError
    └── ControllerError                    (``headrace.errors``: the client raises it too)
        ├── InvalidName(kind, name)
        ├── InvalidArgument(message)
        ├── ScopeNotFound(scope)
        ├── ScopeExists(scope)
        ├── ScopeNotEmpty(scope)
        ├── StreamNotFound(scope, stream)
        ├── StreamExists(scope, stream)
        ├── StreamNotSealed(scope, stream)
        ├── StreamSealed(scope, stream)
        ├── SegmentNotInStream(scope, stream, segment_id)
        ├── TxnNotFound(scope, stream, txn)
        ├── TxnNotOpen(scope, stream, txn, state)
        ├── LeaseTooLarge(lease_ms, limit_ms)
        ├── ScalePreconditionFailed(message)
        ├── TooMany(what, limit)
        ├── ReaderGroupNotFound(scope, group)
        ├── ReaderGroupMismatch(scope, group, message)
        ├── SubscriberNotFound(scope, stream, subscriber)
        ├── GenerationMismatch(subscriber, expected, got)
        ├── TableNotFound(scope, table)        (a key-value table)
        └── TableExists(scope, table)
"""

from __future__ import annotations

from headrace.errors import ControllerError

__all__ = [
    "ControllerError",
    "GenerationMismatch",
    "InvalidArgument",
    "InvalidName",
    "LeaseTooLarge",
    "ReaderGroupMismatch",
    "ReaderGroupNotFound",
    "ScalePreconditionFailed",
    "ScopeExists",
    "ScopeNotEmpty",
    "ScopeNotFound",
    "SegmentNotInStream",
    "StreamExists",
    "StreamNotFound",
    "StreamNotSealed",
    "StreamSealed",
    "SubscriberNotFound",
    "TableExists",
    "TableNotFound",
    "TooMany",
    "TxnNotFound",
    "TxnNotOpen",
]


class InvalidName(ControllerError):
    def __init__(self, kind: str, name: str) -> None:
        super().__init__(f"invalid {kind} name {name!r}: use [A-Za-z0-9.-], at most 255 chars")
        self.kind = kind
        self.name = name


class InvalidArgument(ControllerError):
    """A request field is out of range (a segment count, key ranges, a stream cut...)."""


class ScopeNotFound(ControllerError):
    def __init__(self, scope: str) -> None:
        super().__init__(f"scope {scope!r} does not exist")
        self.scope = scope


class ScopeExists(ControllerError):
    def __init__(self, scope: str) -> None:
        super().__init__(f"scope {scope!r} already exists")
        self.scope = scope


class ScopeNotEmpty(ControllerError):
    def __init__(self, scope: str) -> None:
        super().__init__(f"scope {scope!r} still has streams")
        self.scope = scope


class StreamNotFound(ControllerError):
    def __init__(self, scope: str, stream: str) -> None:
        super().__init__(f"stream {scope}/{stream} does not exist")
        self.scope = scope
        self.stream = stream


class StreamExists(ControllerError):
    def __init__(self, scope: str, stream: str) -> None:
        super().__init__(f"stream {scope}/{stream} already exists")
        self.scope = scope
        self.stream = stream


class StreamNotSealed(ControllerError):
    def __init__(self, scope: str, stream: str) -> None:
        super().__init__(f"stream {scope}/{stream} must be sealed first")
        self.scope = scope
        self.stream = stream


class StreamSealed(ControllerError):
    def __init__(self, scope: str, stream: str) -> None:
        super().__init__(f"stream {scope}/{stream} is sealed")
        self.scope = scope
        self.stream = stream


class SegmentNotInStream(ControllerError):
    def __init__(self, scope: str, stream: str, segment_id: int) -> None:
        super().__init__(f"stream {scope}/{stream} has no segment with id {segment_id}")
        self.scope = scope
        self.stream = stream
        self.segment_id = segment_id


class TxnNotFound(ControllerError):
    def __init__(self, scope: str, stream: str, txn: str) -> None:
        super().__init__(f"stream {scope}/{stream} has no transaction {txn}")
        self.scope = scope
        self.stream = stream
        self.txn = txn


class TxnNotOpen(ControllerError):
    """Commit of an aborted transaction, or abort of a committed one."""

    def __init__(self, scope: str, stream: str, txn: str, state: str) -> None:
        super().__init__(f"transaction {txn} of {scope}/{stream} is {state}")
        self.scope = scope
        self.stream = stream
        self.txn = txn
        self.state = state


class LeaseTooLarge(ControllerError):
    def __init__(self, lease_ms: int, limit_ms: int) -> None:
        super().__init__(f"transaction lease {lease_ms} ms exceeds the limit of {limit_ms} ms")
        self.lease_ms = lease_ms
        self.limit_ms = limit_ms


class ScalePreconditionFailed(ControllerError):
    """A scale request names segments that are not active, or ranges that do not fit."""


class TooMany(ControllerError):
    def __init__(self, what: str, limit: int) -> None:
        super().__init__(f"too many {what}: the limit is {limit}")
        self.what = what
        self.limit = limit


class ReaderGroupNotFound(ControllerError):
    def __init__(self, scope: str, group: str) -> None:
        super().__init__(f"reader group {scope}/{group} does not exist")
        self.scope = scope
        self.group = group


class ReaderGroupMismatch(ControllerError):
    """An update names another generation or id than the group has (INVALID_CONFIG)."""

    def __init__(self, scope: str, group: str, message: str) -> None:
        super().__init__(f"reader group {scope}/{group}: {message}")
        self.scope = scope
        self.group = group


class SubscriberNotFound(ControllerError):
    def __init__(self, scope: str, stream: str, subscriber: str) -> None:
        super().__init__(f"stream {scope}/{stream} has no subscriber {subscriber!r}")
        self.scope = scope
        self.stream = stream
        self.subscriber = subscriber


class GenerationMismatch(ControllerError):
    def __init__(self, subscriber: str, expected: int, got: int) -> None:
        super().__init__(f"subscriber {subscriber!r} is at generation {expected}, not {got}")
        self.subscriber = subscriber
        self.expected = expected
        self.got = got


class TableNotFound(ControllerError):
    """No key-value table of that name in the scope."""

    def __init__(self, scope: str, table: str) -> None:
        super().__init__(f"key-value table {scope}/{table} does not exist")
        self.scope = scope
        self.table = table


class TableExists(ControllerError):
    def __init__(self, scope: str, table: str) -> None:
        super().__init__(f"key-value table {scope}/{table} already exists")
        self.scope = scope
        self.table = table
