"""Hypothesis properties of the Pravega codec and connection.

1. Every command round-trips: ``decode(encode(cmd)) == cmd``, for every type.
2. Feeding a byte stream in arbitrary chunks gives the same commands.
3. Arbitrary bytes give commands or ``RemoteProtocolError``, never another exception.
"""

from __future__ import annotations

import struct
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headrace.errors import RemoteProtocolError
from headrace.protocols._buffer import ReceiveBuffer
from headrace.protocols.pravega import (
    NO_VERSION,
    ChunkInfo,
    Command,
    CommandType,
    ConditionalAttributeUpdate,
    Event,
    Hello,
    PravegaConnection,
    Role,
    SegmentsBatchMerged,
    TableEntries,
    TableIteratorArgs,
    TableKey,
    TableValue,
    decode_command,
    decode_frame,
    encode_command,
)
from headrace.protocols.pravega.codec import _LAYOUTS, _Kind

I8 = st.integers(-(2**7), 2**7 - 1)
I32 = st.integers(-(2**31), 2**31 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)
TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)
BLOB = st.binary(max_size=40)

table_keys = st.one_of(
    st.builds(TableKey, st.binary(min_size=1, max_size=12), I64),
    st.just(TableKey(b"", NO_VERSION)),  # the only encodable empty key
)
table_entries = st.builds(
    TableEntries,
    st.lists(st.tuples(table_keys, st.builds(TableValue, BLOB)), max_size=3).map(tuple),
)

KIND_STRATEGIES: dict[_Kind, st.SearchStrategy[Any]] = {
    _Kind.BYTE: I8,
    _Kind.BOOL: st.booleans(),
    _Kind.I32: I32,
    _Kind.I64: I64,
    _Kind.UUID: st.uuids(),
    _Kind.STR: TEXT,
    _Kind.BYTES: BLOB,
    _Kind.REST: BLOB,
    _Kind.DATA: BLOB,
    _Kind.DATA_REST: BLOB,
    _Kind.PADDING: st.integers(0, 40),
    _Kind.EVENT: st.builds(Event, BLOB),
    _Kind.TABLE_KEYS: st.lists(table_keys, max_size=3).map(tuple),
    _Kind.TABLE_ENTRIES: table_entries,
    _Kind.I64_LIST: st.lists(I64, max_size=3).map(tuple),
    _Kind.STR_LIST: st.lists(TEXT, max_size=3).map(tuple),
    _Kind.ATTRIBUTE_UPDATES: st.lists(
        st.builds(ConditionalAttributeUpdate, st.uuids(), I8, I64, I64), max_size=3
    ).map(tuple),
    _Kind.CHUNKS: st.lists(
        st.builds(ChunkInfo, I64, I64, I64, TEXT, st.booleans()), max_size=3
    ).map(tuple),
    _Kind.ITERATOR_ARGS: st.builds(TableIteratorArgs, BLOB, BLOB, BLOB, BLOB),
}


def command_strategy(cls: type[Command], layout: tuple[Any, ...]) -> st.SearchStrategy[Command]:
    return st.builds(cls, *(KIND_STRATEGIES[kind] for _name, kind, _opt, _default in layout))


batch_merged = st.integers(0, 3).flatmap(
    lambda n: st.builds(
        SegmentsBatchMerged,
        I64,
        TEXT,
        st.lists(TEXT, min_size=n, max_size=n).map(tuple),
        st.lists(I64, min_size=n, max_size=n).map(tuple),
    )
)

commands: st.SearchStrategy[Command] = st.one_of(
    batch_merged, *(command_strategy(cls, layout) for cls, layout in _LAYOUTS.values())
)


# Frames of valid commands mixed with non-empty runs of arbitrary bytes.
byte_parts = st.lists(
    st.one_of(commands.map(encode_command), st.binary(min_size=1, max_size=30)), max_size=6
)


def test_strategies_cover_every_type_code() -> None:
    assert set(_LAYOUTS) | {CommandType.SEGMENTS_BATCH_MERGED} == set(CommandType)


@given(commands)
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_encode_decode_round_trip(cmd: Command) -> None:
    encoded = encode_command(cmd)
    assert struct.unpack(">ii", encoded[:8]) == (cmd.type, len(encoded) - 8)
    assert decode_frame(encoded) == cmd


def decode_all(chunks: list[bytes]) -> list[Command]:
    buffer = ReceiveBuffer(1 << 20)
    out: list[Command] = []
    for chunk in chunks:
        buffer.feed(chunk)
        while (cmd := decode_command(buffer)) is not None:
            out.append(cmd)
    assert not buffer
    return out


@given(st.lists(commands, max_size=8), st.data())
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_arbitrary_chunking_gives_the_same_commands(
    cmds: list[Command], data: st.DataObject
) -> None:
    stream = b"".join(encode_command(cmd) for cmd in cmds)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=12)))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True)]
    assert decode_all(chunks) == cmds


@given(st.binary(max_size=200))
def test_arbitrary_bytes_give_commands_or_remote_error(data: bytes) -> None:
    buffer = ReceiveBuffer(1 << 20)
    buffer.feed(data)
    try:
        while decode_command(buffer) is not None:
            pass
    except RemoteProtocolError:
        pass


@given(st.sampled_from(sorted(CommandType)), st.binary(max_size=120))
def test_arbitrary_payload_of_known_type_gives_command_or_remote_error(
    type_code: int, payload: bytes
) -> None:
    try:
        cmd = decode_frame(struct.pack(">ii", type_code, len(payload)) + payload)
    except RemoteProtocolError:
        return
    assert cmd.type == type_code


@given(
    st.lists(
        st.one_of(commands.map(encode_command), st.binary(min_size=1, max_size=30)), max_size=6
    )
)
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_server_connection_gives_events_or_remote_error(parts: list[bytes]) -> None:
    server = PravegaConnection(Role.SERVER)
    server.receive_data(encode_command(Hello(15, 5)))
    try:
        for part in parts:
            server.receive_data(part)
            list(server.events())
        server.receive_data(b"")
        list(server.events())
    except RemoteProtocolError:
        pass


@given(
    st.lists(
        st.one_of(commands.map(encode_command), st.binary(min_size=1, max_size=30)), max_size=6
    )
)
@settings(suppress_health_check=[HealthCheck.too_slow])
def test_client_connection_gives_events_or_remote_error(parts: list[bytes]) -> None:
    client = PravegaConnection(Role.CLIENT)
    client.receive_data(encode_command(Hello(17, 5)))
    try:
        for part in parts:
            client.receive_data(part)
            list(client.events())
    except RemoteProtocolError:
        pass
