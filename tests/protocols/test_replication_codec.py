"""The replication wire format (``protocols/replication.py``): every frame round-trips,
and malformed or oversized frames are refused with ``RemoteProtocolError``."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headrace.errors import FrameTooLarge, RemoteProtocolError
from headrace.protocols.replication import (
    MAX_FRAME_BYTES,
    MAX_HISTORY_ENTRIES,
    Ack,
    Command,
    FrameReader,
    Records,
    Refuse,
    RefuseCode,
    Start,
    Subscribe,
    encode,
)

U64 = st.integers(0, 2**64 - 1)
TEXT = st.text(max_size=50)

COMMANDS = st.one_of(
    st.builds(
        Subscribe,
        st.integers(0, 2**32 - 1),
        U64,
        U64,
        st.lists(st.tuples(U64, U64), max_size=5).map(tuple),
        TEXT,
        TEXT,
    ),
    st.builds(Start, U64, U64, U64),
    st.builds(Records, U64, U64, U64, st.integers(0, 2**32 - 1), st.binary(max_size=200)),
    st.builds(Ack, U64),
    st.builds(Refuse, st.sampled_from(RefuseCode), TEXT),
)


def roundtrip(command: Command) -> Command:
    raw = b"".join(encode(command))
    reader = FrameReader()
    kind, size = reader.body_size(raw[: reader.header_size])
    assert size == len(raw) - reader.header_size
    return reader.decode(kind, raw[reader.header_size :])


@given(COMMANDS)
def test_every_frame_round_trips(command: Command) -> None:
    decoded = roundtrip(command)
    if isinstance(decoded, Records):
        assert isinstance(command, Records)
        assert bytes(decoded.frames) == bytes(command.frames)
        assert decoded.epoch == command.epoch and decoded.first == command.first
    else:
        assert decoded == command


def test_malformed_frames_are_refused() -> None:
    reader = FrameReader()
    with pytest.raises(FrameTooLarge):
        reader.body_size(struct.pack(">IB", MAX_FRAME_BYTES, 3))
    with pytest.raises(RemoteProtocolError):
        reader.body_size(struct.pack(">IB", 0, 3))
    with pytest.raises(RemoteProtocolError, match="unknown frame type"):
        reader.decode(99, b"")
    with pytest.raises(RemoteProtocolError, match="cut short"):
        reader.decode(2, b"\x00" * 10)
    with pytest.raises(RemoteProtocolError, match="bytes after"):
        reader.decode(4, b"\x00" * 9)
    too_many = struct.pack(">IQQH", 0, 1, 1, MAX_HISTORY_ENTRIES + 1)
    with pytest.raises(RemoteProtocolError, match="epoch history"):
        reader.decode(1, too_many)
    bad_text = struct.pack(">IQQH", 0, 1, 1, 0) + b"\x00\x02\xff\xfe" + b"\x00\x00"
    with pytest.raises(RemoteProtocolError, match="UTF-8"):
        reader.decode(1, bad_text)
    with pytest.raises(RemoteProtocolError, match="empty REFUSE"):
        reader.decode(5, b"")
