"""The server's bulk decoding agrees with the frame-by-frame path, on any input.

``LumberjackConnection(Role.SERVER)`` decodes runs of data frames in bulk
(``_fast.BulkDecoder.decode_available``, ``_server_run``); ``bulk=False`` keeps
the frame-by-frame path (one ``next_frame`` and one state-machine step per
frame), which the rest of the suite pins down. Hypothesis feeds both the same
valid and invalid byte streams, cut the same way, and requires the same
batches (events, ack points, where batches are cut), the same parsed
documents, and the same error type and message at the same call.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.errors import RemoteProtocolError
from headrace.protocols.lumberjack import (
    Ack,
    Batch,
    ConnectionEvent,
    Limits,
    LumberjackConnection,
    ProtocolVersion,
    Role,
    document_parser,
    parse_json_object,
)
from headrace.protocols.lumberjack.codec import DocumentParser
from tests.protocols.lumberjack.test_properties import (
    SMALL_LIMITS,
    client_streams,
    json_objects,
    split,
)

V1, V2 = int(ProtocolVersion.V1), int(ProtocolVersion.V2)
TINY_LIMITS = Limits(
    max_frame_bytes=96,
    max_decompressed_bytes=160,
    max_compressed_depth=1,
    max_data_pairs=2,
    max_key_bytes=8,
    max_value_bytes=16,
    max_window_count=3,
    max_pending_windows=2,
)
limits_choice = st.sampled_from([Limits(), SMALL_LIMITS, TINY_LIMITS])

BAD_DOCUMENTS = [
    b"",
    b"[1]",
    b'"text"',
    b"42",
    b"null",
    b'{"a":NaN}',
    b'{"a":Infinity}',
    b'{"a":1} x',
    b"\xef\xbb\xbf{}",
    b'{"a":',
    b"\xff{}",
    b'{"a":"\xc3"}',
    b'{"a":"\x01"}',
    b"[" * 2000 + b"]" * 2000,
    b'{"a":' * 2000 + b"1" + b"}" * 2000,
]
ODD_GOOD_DOCUMENTS = [
    b' {"a":1} ',
    b'{"a":1e400}',
    b'{"n":' + b"9" * 5000 + b"}",
    b'{"a":"\\ud800"}',
    b'{"a":1,"a":2}',
    b"{}",
    b'{"host":{"name":"h"}}',
]


def _j(version: int, seq: int, payload: bytes) -> bytes:
    return bytes([version, ord("J")]) + struct.pack(">II", seq, len(payload)) + payload


def _d(version: int, seq: int, pairs: list[tuple[bytes, bytes]]) -> bytes:
    body = b"".join(struct.pack(">I", len(k)) + k + struct.pack(">I", len(v)) + v for k, v in pairs)
    return bytes([version, ord("D")]) + struct.pack(">II", seq, len(pairs)) + body


def _u32_frame(version: int, kind: bytes, value: int) -> bytes:
    return bytes([version]) + kind + struct.pack(">I", value)


def _c(version: int, inner: bytes, damage: int) -> bytes:
    body = zlib.compress(inner, 3)
    if damage == 1:
        body = body[:-3]  # truncated stream
    elif damage == 2:
        body += b"xx"  # bytes after the stream
    return bytes([version, ord("C")]) + struct.pack(">I", len(body)) + body


seqs = st.integers(min_value=0, max_value=6) | st.integers(min_value=0, max_value=0xFFFFFFFF)
documents = st.one_of(
    json_objects.map(lambda d: json.dumps(d, ensure_ascii=False).encode()),
    st.sampled_from(BAD_DOCUMENTS + ODD_GOOD_DOCUMENTS),
    st.binary(max_size=12),
)


@st.composite
def frame_bytes(draw: st.DrawFn, depth: int = 0) -> bytes:
    """One frame, valid or not, usually of the stream's version (``V2`` or ``V1``)."""
    version = draw(st.sampled_from([V2, V2, V2, V1, V1, 0x33, 0x16]))
    kind = draw(st.sampled_from("JJJJDDWWCAx" if depth < 2 else "JJDWAx"))
    if kind == "J":
        return _j(version, draw(seqs), draw(documents))
    if kind == "D":
        pairs = st.tuples(st.binary(max_size=10), st.binary(max_size=20))
        return _d(version, draw(seqs), draw(st.lists(pairs, max_size=3)))
    if kind == "W":
        return _u32_frame(version, b"W", draw(st.integers(min_value=0, max_value=5)))
    if kind == "A":
        return _u32_frame(version, b"A", draw(seqs))
    if kind == "C":
        inner = b"".join(draw(st.lists(frame_bytes(depth + 1), max_size=6)))
        if draw(st.booleans()):
            inner += draw(st.binary(max_size=3))  # maybe a partial frame at the end
        return _c(version, inner, draw(st.sampled_from([0, 0, 0, 1, 2])))
    return draw(st.binary(min_size=1, max_size=8))


@st.composite
def mixed_streams(draw: st.DrawFn) -> bytes:
    """Windows of mostly valid frames with some invalid ones among them."""
    return b"".join(draw(st.lists(frame_bytes(), max_size=14)))


def _plain(value: object) -> object:
    """A parsed document with every number as one placeholder (numbers left as
    written have no equality; the others are converted)."""
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if hasattr(value, "text") or (isinstance(value, int | float) and not isinstance(value, bool)):
        return "<number>"
    return value


def _parsed(parse: object, payload: bytes) -> tuple[str, object]:
    assert callable(parse)
    try:
        return "ok", _plain(parse(payload))
    except RemoteProtocolError as exc:
        return "error", str(exc)


mangled_documents = st.one_of(
    documents,
    json_objects.map(lambda d: json.dumps(d, ensure_ascii=True).encode()),
    st.builds(
        lambda doc, at, noise: doc[:at] + noise + doc[at:],
        documents,
        st.integers(min_value=0, max_value=40),
        st.sampled_from(
            [
                b"\\",
                b'"',
                b"}",
                b"{",
                b"\x00",
                b"\xed\xa0\x80",
                b"1e999",
                b" ",
                b"\\ud800",
                b"\\udc00",
            ]
        ),
    ),
)
"""Documents as sent, ASCII-escaped, and with a byte that breaks them inserted anywhere."""


class _Unconverted:
    """A number as ``json`` reads it with ``parse_int``/``parse_float``: as written."""

    def __init__(self, text: str) -> None:
        self.text = text


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _lone_surrogates_replaced(value: object) -> object:
    """``value`` with each lone surrogate (which ``json`` keeps) as U+FFFD."""
    if isinstance(value, str):
        return "".join("\ufffd" if "\ud800" <= char <= "\udfff" else char for char in value)
    if isinstance(value, Mapping):
        return {
            _lone_surrogates_replaced(key): _lone_surrogates_replaced(item)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [_lone_surrogates_replaced(item) for item in value]
    return value


def _by_python_json(payload: bytes) -> tuple[str, object]:
    """The standard library's reading of a ``J`` document, the yardstick of
    acceptance: UTF-8 JSON whose top level is an object, numbers of any size,
    no ``NaN``/``Infinity``, lone surrogate escapes read (as U+FFFD here)."""
    try:
        value = json.loads(
            payload.decode("utf-8"),
            parse_constant=_no_constant,
            parse_int=_Unconverted,
            parse_float=_Unconverted,
        )
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError included
        return "error", None
    if not isinstance(value, dict):
        return "error", None
    return "ok", _plain(_lone_surrogates_replaced(value))


@given(mangled_documents)
@settings(deadline=None)
def test_the_parser_accepts_what_python_json_accepts(payload: bytes) -> None:
    """The one parser (msgspec) accepts the documents ``json`` accepts, and reads
    them the same; what it refuses is a ``RemoteProtocolError``."""
    kind, value = _parsed(parse_json_object, payload)
    assert (kind, value if kind == "ok" else None) == _by_python_json(payload)


def _outcome(
    chunks: list[bytes], limits: Limits, bulk: bool, parse: DocumentParser = parse_json_object
) -> tuple[list[ConnectionEvent], list[object], tuple[type, str] | None, int]:
    """Events, their documents, the error (type, text) and the pending windows left."""
    server = LumberjackConnection(Role.SERVER, limits=limits, bulk=bulk, parse=parse)
    events: list[ConnectionEvent] = []
    error: tuple[type, str] | None = None
    try:
        for chunk in [*(c for c in chunks if c), b""]:
            server.receive_data(chunk)
            for event in server.events():
                events.append(event)
                if isinstance(event, Batch) and event.ack_seq is not None:
                    server.send(Ack(event.ack_seq))
    except RemoteProtocolError as exc:
        error = (type(exc), str(exc))
    docs: list[object] = []
    for event in events:
        if isinstance(event, Batch):
            assert len(event.documents) == len(event.events)
            docs.append([_plain(d) for d in event.documents])
    return events, docs, error, server.pending_window_count


def _same(chunks: list[bytes], limits: Limits) -> None:
    assert _outcome(chunks, limits, bulk=True) == _outcome(chunks, limits, bulk=False)


@given(client_streams(), st.lists(st.integers(min_value=0, max_value=2000), max_size=12))
@settings(deadline=None)
def test_bulk_and_frame_by_frame_agree_on_valid_streams(
    stream: tuple[ProtocolVersion, bytes], cuts: list[int]
) -> None:
    _, data = stream
    _same(split(data, cuts), Limits())
    events, docs, error, _ = _outcome([data], Limits(), bulk=True)
    assert error is None
    for event, batch_docs in zip((e for e in events if isinstance(e, Batch)), docs, strict=True):
        # every document is its payload's one parse
        assert batch_docs == [_plain(parse_json_object(e.payload)) for e in event.events]


@given(
    mixed_streams(),
    st.lists(st.integers(min_value=0, max_value=400), max_size=6),
    limits_choice,
)
@settings(deadline=None)
def test_bulk_and_frame_by_frame_agree_on_any_stream(
    data: bytes, cuts: list[int], limits: Limits
) -> None:
    _same([data], limits)
    _same(split(data, cuts), limits)


@given(st.lists(frame_bytes(), min_size=1, max_size=10), limits_choice)
@settings(deadline=None)
def test_bulk_and_frame_by_frame_agree_inside_one_compressed_frame(
    frames: list[bytes], limits: Limits
) -> None:
    window = _u32_frame(V2, b"W", 4)
    _same([window + _c(V2, b"".join(frames), 0)], limits)
    _same([_c(V2, b"".join(frames), 0)], limits)  # no window first


def test_many_small_frames_in_one_read_give_the_same_windows() -> None:
    """W and J frames alternating, a megabyte per read: one window per J, either way."""
    stream = b"".join(_u32_frame(V2, b"W", 1) + _j(V2, i, b'{"i":%d}' % i) for i in range(30_000))
    chunks = [stream[at : at + (1 << 20)] for at in range(0, len(stream), 1 << 20)]
    limits = Limits(max_pending_windows=30_000)
    _same(chunks, limits)
    events, _, error, pending = _outcome(chunks, limits, bulk=True)
    batches = [e for e in events if isinstance(e, Batch)]
    assert error is None and pending == 0
    assert [(b.events[0].seq, b.ack_seq) for b in batches] == [(i, i) for i in range(30_000)]


# --------------------------------------------------------------------------- document_parser

FIELDS = ("a", "host", "n", "", "@metadata")
"""Keys the documents above use (``a``, ``host``, ``n``), the empty key (which
generated objects often have), and one they do not."""

field_sets = st.lists(st.sampled_from(FIELDS) | st.text(max_size=2), max_size=3).map(tuple)


def _projected(parsed: tuple[str, object], fields: tuple[str, ...]) -> tuple[str, object]:
    kind, value = parsed
    if kind != "ok":
        return parsed
    assert isinstance(value, dict)
    return kind, {name: value[name] for name in dict.fromkeys(fields) if name in value}


payloads = st.one_of(
    mangled_documents,
    st.builds(
        lambda key, value: b'{"' + key + b'":' + value + b',"x":"\xff"}',
        st.sampled_from([b"a", b"host", b"n"]),
        st.sampled_from([b'"v"', b'{"name":"h"}', b"1e400", b"9" * 5000, b'"\\ud800"']),
    ),
)


@given(payloads, field_sets)
@settings(deadline=None)
def test_document_parser_keeps_the_fields_of_the_whole_parse(
    payload: bytes, fields: tuple[str, ...]
) -> None:
    """The same documents accepted, the same errors, the fields' values as the whole
    parse gives them."""
    expected = _projected(_parsed(parse_json_object, payload), fields)
    assert _parsed(document_parser(fields), payload) == expected


@given(
    mixed_streams(),
    st.lists(st.integers(min_value=0, max_value=400), max_size=6),
    limits_choice,
    field_sets,
)
@settings(deadline=None)
def test_a_connection_parsing_some_fields_accepts_and_refuses_the_same(
    data: bytes, cuts: list[int], limits: Limits, fields: tuple[str, ...]
) -> None:
    """The same events, error and windows left, bulk or frame by frame."""
    parse = document_parser(fields)
    for bulk in (True, False):
        whole = _outcome(split(data, cuts), limits, bulk=bulk)
        some = _outcome(split(data, cuts), limits, bulk=bulk, parse=parse)
        assert (some[0], some[2], some[3]) == (whole[0], whole[2], whole[3])


@given(
    client_streams(),
    st.lists(st.integers(min_value=0, max_value=2000), max_size=12),
    field_sets,
    st.booleans(),
)
@settings(deadline=None)
def test_a_connection_parsing_some_fields_keeps_them_for_each_j_document(
    stream: tuple[ProtocolVersion, bytes], cuts: list[int], fields: tuple[str, ...], bulk: bool
) -> None:
    """A ``J`` document's entry holds the fields present; a ``D`` frame's stays whole."""
    version, data = stream
    events, docs, error, _ = _outcome(split(data, cuts), Limits(), bulk, document_parser(fields))
    assert error is None
    batches = [e for e in events if isinstance(e, Batch)]
    for batch, batch_docs in zip(batches, docs, strict=True):
        for event, doc in zip(batch.events, batch_docs, strict=True):
            full = _plain(parse_json_object(event.payload))
            assert isinstance(full, dict)
            if version is ProtocolVersion.V2:
                assert doc == {k: full[k] for k in dict.fromkeys(fields) if k in full}
            else:
                assert doc == full


def test_document_parser_builds_only_the_fields() -> None:
    payload = b'{"host":{"name":"web-1"},"message":"x","n":[1,2]}'
    assert document_parser(("host", "@metadata"))(payload) == {"host": {"name": "web-1"}}
    assert document_parser(())(payload) == {}
    with pytest.raises(RemoteProtocolError, match="not UTF-8"):
        document_parser(("host",))(b'{"host":"a","message":"\xff"}')
