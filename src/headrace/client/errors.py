"""Errors the client raises for server replies, on top of ``headrace.errors``.

Everything here is a :class:`~headrace.errors.ServerError` (a
:class:`~headrace.errors.ClientError`) carrying the reply command it was made
from, so callers branch on the class and read data from attributes::

    ServerError
    └── ReplyError(reply)                       any unexpected or error reply
        ├── NoSuchSegmentError(segment)
        ├── SegmentIsSealedError(segment)
        ├── SegmentIsTruncatedError(segment, start_offset)
        ├── ConditionalCheckFailedError
        ├── TableKeyVersionError(segment)       TableKeyBadVersion / TableKeyDoesNotExist
        └── WrongHostError(segment, correct_host)   retriable
    StreamNotFoundError(scope, stream)          the controller has no such stream
    TlsCertificateError                         the server's certificate did not verify

``ControllerError`` (``headrace.errors``, importable from here too) is a
controller status other than success; its ``status`` is the status's name.

``ConnectionLost`` and ``RequestTimeout`` (``headrace.errors``) are the
retriable transport errors.
"""

from __future__ import annotations

from headrace.errors import ClientError, ControllerError, ServerError
from headrace.protocols import pravega as p

__all__ = [
    "ConditionalCheckFailedError",
    "ControllerError",
    "NoSuchSegmentError",
    "ReplyError",
    "SegmentIsSealedError",
    "SegmentIsTruncatedError",
    "StreamNotFoundError",
    "TableKeyVersionError",
    "TlsCertificateError",
    "WrongHostError",
    "error_for_reply",
]


class ReplyError(ServerError):
    """The segment store answered with an error, or with a reply we did not expect."""

    def __init__(self, reply: p.Command, message: str = "") -> None:
        super().__init__(type(reply).__name__, message or _describe(reply))
        self.reply = reply


class NoSuchSegmentError(ReplyError):
    def __init__(self, reply: p.NoSuchSegment) -> None:
        super().__init__(reply, f"segment {reply.segment!r} does not exist")
        self.segment = reply.segment


class SegmentIsSealedError(ReplyError):
    def __init__(self, reply: p.SegmentIsSealed) -> None:
        super().__init__(reply, f"segment {reply.segment!r} is sealed")
        self.segment = reply.segment


class SegmentIsTruncatedError(ReplyError):
    def __init__(self, reply: p.SegmentIsTruncated) -> None:
        super().__init__(
            reply, f"segment {reply.segment!r} is truncated; it starts at {reply.start_offset}"
        )
        self.segment = reply.segment
        self.start_offset = reply.start_offset


class ConditionalCheckFailedError(ReplyError):
    """A conditional append found another segment length than it expected."""


class TableKeyVersionError(ReplyError):
    """A conditional table update or removal found another version (or no key)."""

    def __init__(self, reply: p.TableKeyBadVersion | p.TableKeyDoesNotExist) -> None:
        super().__init__(reply, f"table {reply.segment!r}: {type(reply).__name__}")
        self.segment = reply.segment


class WrongHostError(ReplyError):
    retriable = True

    def __init__(self, reply: p.WrongHost) -> None:
        super().__init__(reply, f"segment {reply.segment!r} is served by {reply.correct_host!r}")
        self.segment = reply.segment
        self.correct_host = reply.correct_host


class StreamNotFoundError(ServerError):
    """The controller answered ``NOT_FOUND`` for a call about ``scope/stream``."""

    def __init__(self, scope: str, stream: str, message: str) -> None:
        super().__init__("NOT_FOUND", message)
        self.scope = scope
        self.stream = stream


class TlsCertificateError(ClientError):
    """The server's TLS certificate did not verify (unknown CA, wrong name, expired).

    Not retriable: trying again meets the same certificate. Give the client the
    server's CA (``TlsOptions(ca_file=...)``) or the name on the certificate.
    """


def _describe(reply: p.Command) -> str:
    text = repr(reply)
    return text if len(text) <= 300 else text[:297] + "..."


def error_for_reply(reply: p.Command) -> ReplyError:
    """The exception that stands for an error (or unexpected) reply."""
    if isinstance(reply, p.NoSuchSegment):
        return NoSuchSegmentError(reply)
    if isinstance(reply, p.SegmentIsSealed):
        return SegmentIsSealedError(reply)
    if isinstance(reply, p.SegmentIsTruncated):
        return SegmentIsTruncatedError(reply)
    if isinstance(reply, p.ConditionalCheckFailed):
        return ConditionalCheckFailedError(reply)
    if isinstance(reply, p.TableKeyBadVersion | p.TableKeyDoesNotExist):
        return TableKeyVersionError(reply)
    if isinstance(reply, p.WrongHost):
        return WrongHostError(reply)
    return ReplyError(reply)
