"""Pravega's naming rules for scopes, streams and segments (pure functions).

Segment ids, segment names and transaction ids and names are built by the
clients too, so those rules live with the controller API's vocabulary
(``headrace.protocols.pravega.controller``); they are importable from here.
The rules below are the server's own:

* transient segment name ``<parent>#transient.<writer hex>.<random hex>``:
  where a writer puts one event over 8 MiB before merging it into the parent.

User scope and stream names follow Java's rule ``[A-Za-z0-9.-]+``; names
starting with ``_`` are reserved for internal use (``_system``) and are
refused, as Java refuses them from users. Table segments of reader groups
and key-value tables live in pseudo-streams named ``<name>_kvtable`` (the
Rust client) or ``<name>_hrgroup`` (our client's reader groups), which are
never created through the controller but are named in delegation tokens.
Segments under ``INTERNAL_PREFIX`` (the controller's metadata tables, TANK's
sequence-number tables) belong to the server alone.

Pravega's own internal streams are the exception to the ``_`` rule: the
state stream of reader group ``G``, ``_RG<G>`` (``reader_group_stream``),
which ``createReaderGroup`` creates, and a stream's watermark stream
``_MARK<stream>``. ``is_internal_stream_name`` recognises them; the
controller creates them itself and refuses them from ``createStream``,
while the calls that read a stream (segments, delegation tokens) accept them.
"""

from __future__ import annotations

import re

from headrace.protocols.pravega.controller import (
    MAX_SEGMENT_NUMBER,
    TxnId,
    segment_epoch,
    segment_id,
    segment_name,
    segment_number,
    transaction_segment_name,
)

__all__ = [
    "GROUP_INDEX_STREAM",
    "INTERNAL_PREFIX",
    "INTERNAL_STREAM_PREFIXES",
    "MARK_STREAM_PREFIX",
    "MAX_NAME_CHARS",
    "MAX_SEGMENT_NUMBER",
    "READER_GROUP_STREAM_PREFIX",
    "TRANSIENT_INFIX",
    "TxnId",
    "is_internal_segment",
    "is_internal_stream_name",
    "is_valid_name",
    "is_valid_stream_name",
    "is_valid_token_stream",
    "reader_group_stream",
    "segment_epoch",
    "segment_id",
    "segment_name",
    "segment_number",
    "transaction_segment_name",
]

MAX_NAME_CHARS = 255
"""Longest scope or stream name: names are parts of segment names and table keys;
255 (a file-name limit on most systems) is far above any name seen in practice."""

INTERNAL_PREFIX = "_system/"
"""Segments whose names start with this are the server's own (metadata tables);
no user scope can produce it, since user names cannot start with ``_``."""

TRANSIENT_INFIX = "#transient."
"""Marks a transient segment: ``<parent>#transient.<writer hex>.<random hex>``
(Java's naming, pravega.md#large-events)."""

PSEUDO_STREAM_SUFFIXES = ("_kvtable", "_hrgroup")
"""Suffixes of the pseudo-streams holding table segments (see above)."""

GROUP_INDEX_STREAM = "_hrgroups"
"""The pseudo-stream of a scope's index of reader groups (the client's
``group_index_name``): no user stream, table or group name starts with ``_``."""

READER_GROUP_STREAM_PREFIX = "_RG"
"""Prefix of a reader group's state stream (Java's ``NameUtils.READER_GROUP_STREAM_PREFIX``)."""

MARK_STREAM_PREFIX = "_MARK"
"""Prefix of a stream's watermark stream (Java's ``NameUtils.MARK_PREFIX``)."""

INTERNAL_STREAM_PREFIXES = (READER_GROUP_STREAM_PREFIX, MARK_STREAM_PREFIX)
"""Prefixes of the internal streams Pravega's clients name (see above)."""

_NAME = re.compile(r"[A-Za-z0-9.\-]+")
_TABLE_NAME = re.compile(r"[A-Za-z0-9.\-][A-Za-z0-9.\-_]*")


def is_valid_name(name: str) -> bool:
    """A user scope or stream name (Java's ``NameUtils`` rule), at most ``MAX_NAME_CHARS``."""
    return len(name) <= MAX_NAME_CHARS and _NAME.fullmatch(name) is not None


def is_internal_stream_name(name: str) -> bool:
    """``_RG<group>`` or ``_MARK<stream>`` with a valid user name after the prefix,
    at most ``MAX_NAME_CHARS`` in all."""
    return len(name) <= MAX_NAME_CHARS and any(
        name.startswith(prefix) and is_valid_name(name[len(prefix) :])
        for prefix in INTERNAL_STREAM_PREFIXES
    )


def is_valid_stream_name(name: str) -> bool:
    """A stream the controller may hold: a user name or an internal stream name."""
    return is_valid_name(name) or is_internal_stream_name(name)


def reader_group_stream(group: str) -> str:
    """The state stream of reader group ``group``: ``_RG<group>``."""
    return f"{READER_GROUP_STREAM_PREFIX}{group}"


def is_valid_token_stream(name: str) -> bool:
    """A stream a delegation token may name: a user stream name, or a table's
    pseudo-stream ``<name>_kvtable`` / ``<name>_hrgroup`` (``<name>`` may hold
    ``_`` after its first character: reader group names are the client's).

    Never ``*`` or ``/``: a token's resource is matched as a pattern."""
    if len(name) > MAX_NAME_CHARS:
        return False
    if _NAME.fullmatch(name) is not None or name == GROUP_INDEX_STREAM:
        return True
    if is_internal_stream_name(name):
        return True
    return any(
        name.endswith(suffix) and _TABLE_NAME.fullmatch(name[: -len(suffix)]) is not None
        for suffix in PSEUDO_STREAM_SUFFIXES
    )


def is_internal_segment(name: str) -> bool:
    """Whether ``name`` is one of the server's own segments (``INTERNAL_PREFIX``)."""
    return name.startswith(INTERNAL_PREFIX)
