"""Controller metadata records and their stored form (pure: no store, no I/O).

Layout in the store (each a table segment; keys and values are UTF-8)::

    _system/controller/scopes        key "<scope>"                  value ScopeRecord JSON
    _system/controller/streams       key "<scope>/<stream>"         value StreamRecord JSON
    _system/controller/transactions  key "<scope>/<stream>/<32hex>" value TxnRecord JSON
    _system/controller/retention     key "<scope>/<stream>/<ms:020>" value RetentionCut JSON
    _system/controller/kvtables      key "<scope>/<table>"          value KeyValueTableRecord JSON

Reader groups and subscribers have two more tables (``groups.py``).

JSON keeps the records readable with any table dump, and every field has a
default so that records written by an older version still load. ``/`` can
not occur in scope or stream names, so the keys are unambiguous. The
configuration and transaction types are the controller API's
(``headrace.protocols.pravega.controller``); a transaction's state is stored
by name, in lower case (``"open"``).

A stream's segments are its whole history: every segment it ever had, with
the epoch that created it and the epoch that replaced it (``sealed_epoch``,
``None`` while the segment is active). A segment is *in* epoch ``e`` when
``created_epoch <= e < sealed_epoch``. Sealing the whole stream does not
open an epoch: it sets ``state`` to ``sealed`` and leaves the last epoch's
segments as they are.

A rolling commit (a transaction committed after the epoch it was opened in
ended, Pravega's rolling transaction) adds two epochs at once: epoch ``A+1``
holds copies of the transaction's epoch's segments (same numbers and key
ranges, new ids), into which the transactions are merged, sealed at once;
epoch ``A+2`` holds copies of epoch ``A``'s segments and becomes the active
one. While such a commit is under way ``rolling`` records it, so that a
restart finishes it.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any

from headrace.controller.groups import READER_GROUPS_TABLE, SUBSCRIBERS_TABLE
from headrace.protocols.pravega.controller import (
    INT64_MAX,
    KeyValueTableConfig,
    RetentionPolicy,
    RetentionType,
    ScalingPolicy,
    ScalingType,
    StreamConfig,
    TxnId,
    TxnState,
    segment_id,
)

__all__ = [
    "KVTABLES_TABLE",
    "METADATA_TABLES",
    "RETENTION_TABLE",
    "SCOPES_TABLE",
    "STREAMS_TABLE",
    "TRANSACTIONS_TABLE",
    "KeyValueTableConfig",
    "KeyValueTableRecord",
    "RetentionCut",
    "RetentionPolicy",
    "RetentionType",
    "RollingTxn",
    "ScalingPolicy",
    "ScalingType",
    "ScopeRecord",
    "SegmentRecord",
    "StreamConfig",
    "StreamRecord",
    "StreamState",
    "TxnRecord",
    "TxnState",
    "cut_key",
    "decode_cut",
    "decode_kvtable",
    "decode_scope",
    "decode_stream",
    "decode_txn",
    "encode_cut",
    "encode_kvtable",
    "encode_scope",
    "encode_stream",
    "encode_txn",
    "stream_key",
    "txn_key",
]

SCOPES_TABLE = "_system/controller/scopes"
STREAMS_TABLE = "_system/controller/streams"
TRANSACTIONS_TABLE = "_system/controller/transactions"
RETENTION_TABLE = "_system/controller/retention"
KVTABLES_TABLE = "_system/controller/kvtables"
METADATA_TABLES = (
    SCOPES_TABLE,
    STREAMS_TABLE,
    TRANSACTIONS_TABLE,
    RETENTION_TABLE,
    READER_GROUPS_TABLE,
    SUBSCRIBERS_TABLE,
    KVTABLES_TABLE,
)
"""Every table of the controller's metadata, in the order they are loaded."""


class StreamState(enum.StrEnum):
    ACTIVE = "active"
    SEALED = "sealed"


@dataclass(frozen=True, slots=True)
class ScopeRecord:
    created_ms: int


@dataclass(frozen=True, slots=True)
class SegmentRecord:
    """One segment of a stream's history; ``[min_key, max_key)`` is its key range."""

    number: int
    created_epoch: int
    min_key: float
    max_key: float
    sealed_epoch: int | None = None

    @property
    def id(self) -> int:
        return segment_id(self.created_epoch, self.number)

    def in_epoch(self, epoch: int) -> bool:
        return self.created_epoch <= epoch and (
            self.sealed_epoch is None or epoch < self.sealed_epoch
        )

    def overlaps(self, other: SegmentRecord) -> bool:
        return self.min_key < other.max_key and other.min_key < self.max_key


@dataclass(frozen=True, slots=True)
class RollingTxn:
    """A rolling commit under way: the transactions of ``txn_epoch`` (``txns``)
    are being merged into copies of that epoch's segments in epoch
    ``active_epoch + 1``; epoch ``active_epoch + 2`` copies the active segments."""

    txn_epoch: int
    active_epoch: int
    txns: tuple[TxnId, ...]


@dataclass(frozen=True, slots=True)
class StreamRecord:
    """A stream: its configuration, state, segment history and counters.

    ``epoch_times_ms[e]`` is when epoch ``e`` began. ``head_cut`` is the stream
    cut of the last ``truncateStream`` (segment id -> offset), empty if none.
    """

    scope: str
    stream: str
    created_ms: int
    config: StreamConfig
    state: StreamState
    epoch: int
    next_number: int
    segments: tuple[SegmentRecord, ...]
    epoch_times_ms: tuple[int, ...]
    next_txn: int = 1
    head_cut: dict[int, int] = field(default_factory=dict)
    rolling: RollingTxn | None = None
    _by_id: dict[int, SegmentRecord] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_id", {seg.id: seg for seg in self.segments})

    def segment(self, sid: int) -> SegmentRecord | None:
        return self._by_id.get(sid)

    def epoch_segments(self, epoch: int) -> list[SegmentRecord]:
        """The segments of ``epoch`` ordered by key range."""
        return sorted((s for s in self.segments if s.in_epoch(epoch)), key=lambda s: s.min_key)

    def active_segments(self) -> list[SegmentRecord]:
        """The current epoch's segments; none once the stream is sealed."""
        if self.state is StreamState.SEALED:
            return []
        return self.epoch_segments(self.epoch)


@dataclass(frozen=True, slots=True)
class TxnRecord:
    """A transaction: its id, the parent segments it writes to, state and lease.

    The lease deadline is not stored (a ping would cost a durable write): the
    model keeps deadlines in memory and grants every open transaction a fresh
    lease when it loads the metadata after a restart.
    """

    txn: TxnId
    epoch: int
    parents: tuple[int, ...]
    state: TxnState
    lease_ms: int
    created_ms: int
    closed_ms: int = 0
    writer_id: str = ""
    commit_timestamp: int = 0


@dataclass(frozen=True, slots=True)
class RetentionCut:
    """A stream cut recorded for retention: the active segments' lengths at ``time_ms``.

    Segment lengths are event boundaries (writers append whole events), so a
    recorded cut is a safe place to truncate an event stream.
    """

    time_ms: int
    cut: dict[int, int]


@dataclass(frozen=True, slots=True)
class KeyValueTableRecord:
    """A key-value table: its shape. Its partitions are the table segments
    ``<scope>/<table>_kvtable/<n>.#epoch.0``, n < ``config.partition_count``,
    each owning the key range ``[n/count, (n+1)/count)``."""

    created_ms: int
    config: KeyValueTableConfig


# --------------------------------------------------------------------------- keys


def stream_key(scope: str, stream: str) -> bytes:
    return f"{scope}/{stream}".encode()


def txn_key(scope: str, stream: str, txn: TxnId) -> bytes:
    return f"{scope}/{stream}/{txn.hex}".encode()


def cut_key(scope: str, stream: str, time_ms: int) -> bytes:
    return f"{scope}/{stream}/{time_ms:020d}".encode()


# --------------------------------------------------------------------------- JSON


def _dumps(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()


def encode_scope(rec: ScopeRecord) -> bytes:
    return _dumps({"created_ms": rec.created_ms})


def decode_scope(data: bytes) -> ScopeRecord:
    obj = json.loads(data)
    return ScopeRecord(created_ms=int(obj.get("created_ms", 0)))


def _encode_config(cfg: StreamConfig) -> dict[str, Any]:
    return {
        "scaling": {
            "type": int(cfg.scaling.scale_type),
            "target_rate": cfg.scaling.target_rate,
            "scale_factor": cfg.scaling.scale_factor,
            "min_segments": cfg.scaling.min_num_segments,
        },
        "retention": {
            "type": int(cfg.retention.retention_type),
            "param": cfg.retention.retention_param,
            "max": cfg.retention.retention_max,
        },
        "tags": list(cfg.tags),
    }


def _decode_config(obj: dict[str, Any]) -> StreamConfig:
    sc = obj.get("scaling", {})
    rt = obj.get("retention", {})
    return StreamConfig(
        scaling=ScalingPolicy(
            scale_type=ScalingType(sc.get("type", 0)),
            target_rate=int(sc.get("target_rate", 0)),
            scale_factor=int(sc.get("scale_factor", 0)),
            min_num_segments=int(sc.get("min_segments", 1)),
        ),
        retention=RetentionPolicy(
            retention_type=RetentionType(rt.get("type", 0)),
            retention_param=int(rt.get("param", 0)),
            retention_max=int(rt.get("max", INT64_MAX)),
        ),
        tags=tuple(str(t) for t in obj.get("tags", ())),
    )


def encode_stream(rec: StreamRecord) -> bytes:
    return _dumps(
        {
            "scope": rec.scope,
            "stream": rec.stream,
            "created_ms": rec.created_ms,
            "config": _encode_config(rec.config),
            "state": rec.state.value,
            "epoch": rec.epoch,
            "next_number": rec.next_number,
            "segments": [
                [s.number, s.created_epoch, s.min_key, s.max_key, s.sealed_epoch]
                for s in rec.segments
            ],
            "epoch_times_ms": list(rec.epoch_times_ms),
            "next_txn": rec.next_txn,
            "head_cut": [[sid, off] for sid, off in sorted(rec.head_cut.items())],
            **({} if rec.rolling is None else {"rolling": _encode_rolling(rec.rolling)}),
        }
    )


def _encode_rolling(roll: RollingTxn) -> dict[str, Any]:
    return {
        "txn_epoch": roll.txn_epoch,
        "active_epoch": roll.active_epoch,
        "txns": [[t.high_bits, t.low_bits] for t in roll.txns],
    }


def _decode_rolling(obj: dict[str, Any] | None) -> RollingTxn | None:
    if obj is None:
        return None
    return RollingTxn(
        txn_epoch=int(obj["txn_epoch"]),
        active_epoch=int(obj["active_epoch"]),
        txns=tuple(TxnId(int(h), int(lo)) for h, lo in obj.get("txns", ())),
    )


def decode_stream(data: bytes) -> StreamRecord:
    obj = json.loads(data)
    return StreamRecord(
        scope=obj["scope"],
        stream=obj["stream"],
        created_ms=int(obj.get("created_ms", 0)),
        config=_decode_config(obj.get("config", {})),
        state=StreamState(obj.get("state", "active")),
        epoch=int(obj.get("epoch", 0)),
        next_number=int(obj["next_number"]),
        segments=tuple(
            SegmentRecord(int(n), int(e), float(lo), float(hi), None if se is None else int(se))
            for n, e, lo, hi, se in obj["segments"]
        ),
        epoch_times_ms=tuple(int(t) for t in obj.get("epoch_times_ms", ())),
        next_txn=int(obj.get("next_txn", 1)),
        head_cut={int(sid): int(off) for sid, off in obj.get("head_cut", ())},
        rolling=_decode_rolling(obj.get("rolling")),
    )


def encode_txn(rec: TxnRecord) -> bytes:
    return _dumps(
        {
            "high": rec.txn.high_bits,
            "low": rec.txn.low_bits,
            "epoch": rec.epoch,
            "parents": list(rec.parents),
            "state": rec.state.name.lower(),
            "lease_ms": rec.lease_ms,
            "created_ms": rec.created_ms,
            "closed_ms": rec.closed_ms,
            "writer_id": rec.writer_id,
            "commit_timestamp": rec.commit_timestamp,
        }
    )


def decode_txn(data: bytes) -> TxnRecord:
    obj = json.loads(data)
    return TxnRecord(
        txn=TxnId(int(obj["high"]), int(obj["low"])),
        epoch=int(obj["epoch"]),
        parents=tuple(int(p) for p in obj["parents"]),
        state=TxnState[str(obj["state"]).upper()],
        lease_ms=int(obj.get("lease_ms", 0)),
        created_ms=int(obj.get("created_ms", 0)),
        closed_ms=int(obj.get("closed_ms", 0)),
        writer_id=str(obj.get("writer_id", "")),
        commit_timestamp=int(obj.get("commit_timestamp", 0)),
    )


def encode_cut(rec: RetentionCut) -> bytes:
    return _dumps({"time_ms": rec.time_ms, "cut": [[k, v] for k, v in sorted(rec.cut.items())]})


def decode_cut(data: bytes) -> RetentionCut:
    obj = json.loads(data)
    return RetentionCut(
        time_ms=int(obj["time_ms"]), cut={int(k): int(v) for k, v in obj.get("cut", ())}
    )


def encode_kvtable(rec: KeyValueTableRecord) -> bytes:
    cfg = rec.config
    return _dumps(
        {
            "created_ms": rec.created_ms,
            "partitions": cfg.partition_count,
            "primary_key_length": cfg.primary_key_length,
            "secondary_key_length": cfg.secondary_key_length,
            "rollover_size_bytes": cfg.rollover_size_bytes,
        }
    )


def decode_kvtable(data: bytes) -> KeyValueTableRecord:
    obj = json.loads(data)
    return KeyValueTableRecord(
        created_ms=int(obj.get("created_ms", 0)),
        config=KeyValueTableConfig(
            partition_count=int(obj["partitions"]),
            primary_key_length=int(obj.get("primary_key_length", 1)),
            secondary_key_length=int(obj.get("secondary_key_length", 0)),
            rollover_size_bytes=int(obj.get("rollover_size_bytes", 0)),
        ),
    )
