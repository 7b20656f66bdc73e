"""``Batch``: events held as columns, still a frozen value of version, events and ack."""

from __future__ import annotations

import copy
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headrace.protocols.lumberjack import Batch, Event, ProtocolVersion

V1, V2 = ProtocolVersion.V1, ProtocolVersion.V2

_events = st.lists(
    st.builds(Event, st.integers(min_value=0, max_value=2**32 - 1), st.binary(max_size=20)),
    max_size=8,
).map(tuple)


@given(_events, st.none() | st.integers(min_value=0, max_value=2**32 - 1))
def test_both_constructors_make_the_same_batch(events: tuple[Event, ...], ack: int | None) -> None:
    seqs = tuple(e.seq for e in events)
    payloads = tuple(e.payload for e in events)
    columns = Batch.of_columns(V2, seqs, payloads, ack, ({"a": 1},) * len(events))
    objects = Batch(V2, events, ack)
    assert columns == objects  # documents are not part of equality
    assert hash(columns) == hash(objects)
    assert columns.events == objects.events == events
    assert columns.events is columns.events  # built once
    assert (objects.seqs, objects.payloads) == (seqs, payloads)
    assert repr(columns) == repr(objects)


def test_batches_differ_by_version_events_and_ack() -> None:
    one = Batch(V1, (Event(1, b"x"),), 1)
    assert one != Batch(V2, (Event(1, b"x"),), 1)
    assert one != Batch(V1, (Event(2, b"x"),), 1)
    assert one != Batch(V1, (Event(1, b"y"),), 1)
    assert one != Batch(V1, (Event(1, b"x"),), None)
    assert one != (V1, (Event(1, b"x"),), 1)


def test_a_batch_is_immutable() -> None:
    batch = Batch.of_columns(V2, (1,), (b"x",), None)
    with pytest.raises(AttributeError, match="immutable"):
        batch.ack_seq = 1  # type: ignore[misc]
    with pytest.raises(AttributeError, match="immutable"):
        del batch.payloads  # type: ignore[misc]
    assert batch.ack_seq is None


def test_columns_of_different_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="2 seqs for 1 payloads"):
        Batch.of_columns(V2, (1, 2), (b"x",), None)


def test_a_batch_copies_pickles_and_matches_like_the_dataclass_it_was() -> None:
    batch = Batch.of_columns(V1, (3, 4), (b"a", b"b"), 4, ({"k": "v"}, {}))
    for twin in (copy.copy(batch), copy.deepcopy(batch), pickle.loads(pickle.dumps(batch))):
        assert twin == batch
        assert twin.documents == batch.documents
    match batch:
        case Batch(version, events, ack):
            assert (version, events, ack) == (V1, (Event(3, b"a"), Event(4, b"b")), 4)
        case _:
            pytest.fail("no match")
