"""Reader-group and subscriber records of the controller and their stored form (pure).

Layout in the store (table segments beside ``records.py``'s; UTF-8 keys, JSON values)::

    _system/controller/readergroups  key "<scope>/<group>"                value ReaderGroupRecord
    _system/controller/subscribers   key "<scope>/<stream>/<subscriber>"  value SubscriberRecord

A reader group's record is Java's ``ReaderGroupConfigRecord`` plus its id:
its configuration, the generation every update increments, and the stream
cuts it starts and ends at (by scoped stream name ``<scope>/<stream>``; an
empty cut is unbounded: the head, or the tail). A *subscriber* is a reader
group whose retention type is not NONE, recorded once per stream it reads
under its scoped name ``<scope>/<group>`` (Java's subscriber name), with the
stream cut it last reported (``updateSubscriberStreamCut``): retention never
truncates that stream past it (``model.py``). The subscriber name holds one
``/``; the key splits on the first two only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Final

from headrace.protocols.pravega.controller import GroupRetention

__all__ = [
    "READER_GROUPS_TABLE",
    "SUBSCRIBERS_TABLE",
    "GroupRetention",
    "ReaderGroupRecord",
    "SubscriberRecord",
    "decode_group",
    "decode_subscriber",
    "encode_group",
    "encode_subscriber",
    "group_key",
    "scoped_name",
    "split_subscriber_key",
    "subscriber_key",
]

READER_GROUPS_TABLE: Final = "_system/controller/readergroups"
SUBSCRIBERS_TABLE: Final = "_system/controller/subscribers"


Cut = dict[int, int]


@dataclass(frozen=True, slots=True)
class ReaderGroupRecord:
    """A reader group as ``createReaderGroup`` / ``updateReaderGroup`` left it."""

    scope: str
    group: str
    group_id: str
    generation: int
    refresh_ms: int
    checkpoint_ms: int
    max_outstanding_checkpoints: int
    retention: GroupRetention
    start_cuts: dict[str, Cut]
    end_cuts: dict[str, Cut] = field(default_factory=dict)
    created_ms: int = 0

    @property
    def streams(self) -> list[tuple[str, str]]:
        """The (scope, stream) pairs the group reads, in name order."""
        return [_split_scoped(name) for name in sorted(self.start_cuts)]


@dataclass(frozen=True, slots=True)
class SubscriberRecord:
    """One subscribing group on one stream and the cut it last reported."""

    subscriber: str
    generation: int
    cut: Cut


def scoped_name(scope: str, name: str) -> str:
    """``<scope>/<name>``: a scoped stream name, or a subscriber's name."""
    return f"{scope}/{name}"


def _split_scoped(name: str) -> tuple[str, str]:
    scope, _, rest = name.partition("/")
    return scope, rest


def group_key(scope: str, group: str) -> bytes:
    return f"{scope}/{group}".encode()


def subscriber_key(scope: str, stream: str, subscriber: str) -> bytes:
    return f"{scope}/{stream}/{subscriber}".encode()


def split_subscriber_key(key: bytes) -> tuple[str, str, str]:
    """(scope, stream, subscriber) of a subscriber key."""
    scope, stream, subscriber = key.decode().split("/", 2)
    return scope, stream, subscriber


def _dumps(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()


def _encode_cuts(cuts: dict[str, Cut]) -> dict[str, list[list[int]]]:
    return {name: [[k, v] for k, v in sorted(cut.items())] for name, cut in cuts.items()}


def _decode_cut(pairs: Any) -> Cut:
    return {int(k): int(v) for k, v in pairs}


def encode_group(rec: ReaderGroupRecord) -> bytes:
    return _dumps(
        {
            "scope": rec.scope,
            "group": rec.group,
            "id": rec.group_id,
            "generation": rec.generation,
            "refresh_ms": rec.refresh_ms,
            "checkpoint_ms": rec.checkpoint_ms,
            "max_outstanding_checkpoints": rec.max_outstanding_checkpoints,
            "retention": int(rec.retention),
            "start": _encode_cuts(rec.start_cuts),
            "end": _encode_cuts(rec.end_cuts),
            "created_ms": rec.created_ms,
        }
    )


def decode_group(data: bytes) -> ReaderGroupRecord:
    obj = json.loads(data)
    return ReaderGroupRecord(
        scope=str(obj["scope"]),
        group=str(obj["group"]),
        group_id=str(obj["id"]),
        generation=int(obj.get("generation", 0)),
        refresh_ms=int(obj.get("refresh_ms", 0)),
        checkpoint_ms=int(obj.get("checkpoint_ms", 0)),
        max_outstanding_checkpoints=int(obj.get("max_outstanding_checkpoints", 0)),
        retention=GroupRetention(int(obj.get("retention", 0))),
        start_cuts={str(k): _decode_cut(v) for k, v in obj.get("start", {}).items()},
        end_cuts={str(k): _decode_cut(v) for k, v in obj.get("end", {}).items()},
        created_ms=int(obj.get("created_ms", 0)),
    )


def encode_subscriber(rec: SubscriberRecord) -> bytes:
    return _dumps(
        {
            "subscriber": rec.subscriber,
            "generation": rec.generation,
            "cut": [[k, v] for k, v in sorted(rec.cut.items())],
        }
    )


def decode_subscriber(data: bytes) -> SubscriberRecord:
    obj = json.loads(data)
    return SubscriberRecord(
        subscriber=str(obj["subscriber"]),
        generation=int(obj.get("generation", 0)),
        cut=_decode_cut(obj.get("cut", ())),
    )
