"""Replay of byte streams the real client (PyPI ``pravega`` 0.3.8) sent.

Captured against a throw-away server built on ``PravegaConnection`` (headrace
controller + an in-memory store); the client wrote three events, read them
back through a reader group (whose state lives in a table segment), and wrote
and read a byte stream. ``*.c2s.bin`` is everything one client connection
sent; ``event_writer.s2c.bin`` is what our server answered on that connection.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from headrace.protocols._buffer import ReceiveBuffer
from headrace.protocols.pravega import (
    NULL_ATTRIBUTE_VALUE,
    AppendBlockEnd,
    AppendData,
    AppendSetup,
    Command,
    ConnectionClosed,
    CreateTableSegment,
    DataAppended,
    Hello,
    PravegaConnection,
    Role,
    SetupAppend,
    decode_command,
    decode_events,
    encode_command,
)

CAPTURES = Path(__file__).parent / "captures"


def load(name: str) -> bytes:
    return (CAPTURES / name).read_bytes()


def decode_stream(data: bytes) -> list[Command]:
    buffer = ReceiveBuffer(1 << 20)
    buffer.feed(data)
    out = []
    while (cmd := decode_command(buffer)) is not None:
        out.append(cmd)
    assert not buffer
    return out


def replay_as_server(data: bytes, chunk_size: int) -> list[object]:
    """The events of a server connection fed ``data`` in chunks; it accepts every
    SetupAppend (as the server that was captured did), so the appends come through."""
    server = PravegaConnection(Role.SERVER)
    events: list[object] = []

    def take() -> None:
        for event in server.events():
            events.append(event)
            if isinstance(event, SetupAppend):
                last = NULL_ATTRIBUTE_VALUE
                server.send(AppendSetup(event.request_id, event.segment, event.writer_id, last))

    for start in range(0, len(data), chunk_size):
        server.receive_data(data[start : start + chunk_size])
        take()
    server.receive_data(b"")
    take()
    return events


@pytest.mark.parametrize(
    "name", ["event_writer.c2s.bin", "reader_group.c2s.bin", "byte_stream.c2s.bin"]
)
def test_capture_reencodes_byte_for_byte(name: str) -> None:
    data = load(name)
    cmds = decode_stream(data)
    assert cmds[0] == Hello(15, 5)
    for cmd in cmds:
        frame = encode_command(cmd)
        if isinstance(cmd, CreateTableSegment):
            # We write every optional field; the Rust client leaves out these
            # three (sorted, key_length, rollover: 13 bytes). Nothing else differs.
            frame = rust_create_table_segment(frame)
        assert data.startswith(frame)
        data = data[len(frame) :]
    assert data == b""


def rust_create_table_segment(frame: bytes) -> bytes:
    optional_bytes = 1 + 4 + 8
    length = int.from_bytes(frame[4:8], "big") - optional_bytes
    return frame[:4] + length.to_bytes(4, "big") + frame[8:-optional_bytes]


@pytest.mark.parametrize("chunk_size", [1, 7, 64, 1 << 16])
def test_event_writer_capture_gives_append_data(chunk_size: int) -> None:
    events = replay_as_server(load("event_writer.c2s.bin"), chunk_size)
    names = [type(e).__name__ for e in events]
    assert names == [
        "Hello",
        "SetupAppend",
        "AppendData",
        "AppendData",
        "AppendData",
        "ConnectionClosed",
    ]
    appends = [e for e in events if isinstance(e, AppendData)]
    assert [decode_events(a.data) for a in appends] == [[b"ab"], [b"xyz"], [b"q"]]
    assert [a.last_event_number for a in appends] == [1, 2, 3]
    assert {a.segment for a in appends} == {"sc/st/0.#epoch.0"}


@pytest.mark.parametrize("chunk_size", [1, 100, 1 << 16])
def test_reader_group_capture_is_accepted(chunk_size: int) -> None:
    events = replay_as_server(load("reader_group.c2s.bin"), chunk_size)
    assert isinstance(events[-1], ConnectionClosed)
    assert [type(e).__name__ for e in events[:3]] == [
        "Hello",
        "CreateTableSegment",
        "UpdateTableEntries",
    ]


def test_byte_stream_capture_is_a_conditional_append() -> None:
    events = replay_as_server(load("byte_stream.c2s.bin"), 1 << 16)
    (append,) = [e for e in events if isinstance(e, AppendData)]
    assert (append.data, append.expected_offset, append.last_event_number) == (b"hello", 0, 1)


def test_server_replies_replay_on_a_client_connection() -> None:
    client = PravegaConnection(Role.CLIENT)
    client.receive_data(load("event_writer.s2c.bin"))
    events = list(client.events())
    assert events[0] == Hello(17, 5)
    acks = [e for e in events if isinstance(e, DataAppended)]
    assert [a.event_number for a in acks] == [1, 2, 3]
    sent = [c for c in decode_stream(load("event_writer.c2s.bin")) if isinstance(c, AppendBlockEnd)]
    assert [a.request_id for a in acks] == [c.request_id for c in sent]
