"""Pravega's naming and id rules for segments and transactions (pure functions).

Every rule here is fixed by the real client, which builds the same strings
and ids itself (``docs/protocols/pravega-controller.md#naming``):

* segment id (int64) = ``epoch << 32 | segment_number``, both parts >= 0,
  where ``epoch`` is the epoch that **created** the segment;
* qualified segment name ``<scope>/<stream>/<number>.#epoch.<epoch>``;
* transaction segment name ``<parent name>#transaction.<32 hex digits>``:
  the 16 hex digits of ``TxnId.highBits`` then of ``lowBits``, lower case,
  two's complement;
* transaction id: ``highBits = epoch << 32``, ``lowBits`` = a per-stream
  counter that stays below 2**63 (the client sign-extends ``lowBits``, so a
  negative value would corrupt the id it rebuilds).

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
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "INTERNAL_PREFIX",
    "MAX_NAME_CHARS",
    "MAX_SEGMENT_NUMBER",
    "TRANSIENT_INFIX",
    "TxnId",
    "is_internal_segment",
    "is_valid_name",
    "is_valid_token_stream",
    "segment_epoch",
    "segment_id",
    "segment_name",
    "segment_number",
    "transaction_segment_name",
]

MAX_NAME_CHARS = 255
"""Longest scope or stream name: names are parts of segment names and table keys;
255 (a file-name limit on most systems) is far above any name seen in practice."""

MAX_SEGMENT_NUMBER = 2**31 - 1
"""Segment numbers and epochs are the two non-negative int32 halves of an int64 id."""

INTERNAL_PREFIX = "_system/"
"""Segments whose names start with this are the server's own (metadata tables);
no user scope can produce it, since user names cannot start with ``_``."""

TRANSIENT_INFIX = "#transient."
"""Marks a transient segment: ``<parent>#transient.<writer hex>.<random hex>``
(Java's naming, pravega.md#large-events)."""

PSEUDO_STREAM_SUFFIXES = ("_kvtable", "_hrgroup")
"""Suffixes of the pseudo-streams holding table segments (see above)."""

_INT64_MASK = 2**64 - 1
_NAME = re.compile(r"[A-Za-z0-9.\-]+")
_TABLE_NAME = re.compile(r"[A-Za-z0-9.\-][A-Za-z0-9.\-_]*")


def is_valid_name(name: str) -> bool:
    """A user scope or stream name (Java's ``NameUtils`` rule), at most ``MAX_NAME_CHARS``."""
    return len(name) <= MAX_NAME_CHARS and _NAME.fullmatch(name) is not None


def is_valid_token_stream(name: str) -> bool:
    """A stream a delegation token may name: a user stream name, or a table's
    pseudo-stream ``<name>_kvtable`` / ``<name>_hrgroup`` (``<name>`` may hold
    ``_`` after its first character: reader group names are the client's).

    Never ``*`` or ``/``: a token's resource is matched as a pattern."""
    if len(name) > MAX_NAME_CHARS:
        return False
    if _NAME.fullmatch(name) is not None:
        return True
    return any(
        name.endswith(suffix) and _TABLE_NAME.fullmatch(name[: -len(suffix)]) is not None
        for suffix in PSEUDO_STREAM_SUFFIXES
    )


def is_internal_segment(name: str) -> bool:
    """Whether ``name`` is one of the server's own segments (``INTERNAL_PREFIX``)."""
    return name.startswith(INTERNAL_PREFIX)


def segment_id(epoch: int, number: int) -> int:
    """The 64-bit segment id of segment ``number`` created in ``epoch``."""
    assert 0 <= epoch <= MAX_SEGMENT_NUMBER and 0 <= number <= MAX_SEGMENT_NUMBER
    return epoch << 32 | number


def segment_number(sid: int) -> int:
    return sid & 0xFFFFFFFF


def segment_epoch(sid: int) -> int:
    return sid >> 32


def segment_name(scope: str, stream: str, sid: int) -> str:
    """``<scope>/<stream>/<number>.#epoch.<epoch>``, e.g. ``sc/st/0.#epoch.0``."""
    return f"{scope}/{stream}/{segment_number(sid)}.#epoch.{segment_epoch(sid)}"


@dataclass(frozen=True, slots=True, order=True)
class TxnId:
    """A transaction id as the two signed int64 halves carried by ``TxnId`` messages."""

    high_bits: int
    low_bits: int

    @classmethod
    def new(cls, epoch: int, counter: int) -> TxnId:
        assert 0 <= epoch <= MAX_SEGMENT_NUMBER and 0 <= counter < 2**63
        return cls(epoch << 32, counter)

    @property
    def epoch(self) -> int:
        """The epoch the transaction was created in (id bits 127..96)."""
        return (self.high_bits & _INT64_MASK) >> 32

    @property
    def hex(self) -> str:
        """32 lower-case hex digits, two's complement of each half."""
        return f"{self.high_bits & _INT64_MASK:016x}{self.low_bits & _INT64_MASK:016x}"


def transaction_segment_name(parent: str, txn: TxnId) -> str:
    """``<parent>#transaction.<32 hex>``: where a transaction's events for ``parent`` go."""
    return f"{parent}#transaction.{txn.hex}"
