"""The HTTP port's connection object, bytes in, events out (h11 and wsproto behind it)."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st
from wsproto.connection import Connection as WsConnection
from wsproto.connection import ConnectionType
from wsproto.events import BytesMessage, CloseConnection, Ping, Pong

from headrace.errors import RemoteProtocolError
from headrace.protocols.http import (
    CLOSE_MESSAGE_TOO_BIG,
    CLOSE_PROTOCOL_ERROR,
    MAX_BODY_BYTES,
    Closed,
    HttpConnection,
    Message,
    Request,
    normalize_origin,
    origin_allowed,
)

UPGRADE = (
    b"GET /rsio HTTP/1.1\r\nHost: server.example.com\r\nUpgrade: websocket\r\n"
    b"Connection: keep-alive, Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    b"Sec-WebSocket-Version: 13\r\n\r\n"
)


def _answer_all(conn: HttpConnection, data: bytes) -> list[Request]:
    """Feed ``data``; answer each request 200 with its path; the requests seen."""
    conn.receive_data(data)
    seen = []
    for event in conn.events():
        assert isinstance(event, Request)
        seen.append(event)
        conn.respond(200, event.path.encode())
    return seen


def _upgraded() -> tuple[HttpConnection, WsConnection]:
    conn = HttpConnection(max_message_bytes=1000)
    conn.receive_data(UPGRADE)
    request = next(conn.events())  # answered before the next event is taken
    assert isinstance(request, Request) and request.is_websocket_upgrade()
    conn.accept_websocket(request)
    assert conn.data_to_send().startswith(b"HTTP/1.1 101 ")
    return conn, WsConnection(ConnectionType.CLIENT)


def test_upgrade_is_answered_with_the_rfc_accept_key() -> None:
    conn = HttpConnection()
    conn.receive_data(UPGRADE)
    request = next(conn.events())
    assert isinstance(request, Request)
    conn.accept_websocket(request)
    # RFC 6455 §1.3
    assert b"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n" in conn.data_to_send()
    assert conn.websocket


def test_an_unanswered_request_is_a_bug_of_the_caller() -> None:
    conn = HttpConnection()
    conn.receive_data(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
    with pytest.raises(RuntimeError):
        list(conn.events())


def test_pipelined_requests_are_answered_in_order() -> None:
    conn = HttpConnection()
    seen = _answer_all(
        conn, b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    assert [r.path for r in seen] == ["/a", "/b"]
    out = conn.data_to_send()
    assert out.count(b"HTTP/1.1 200 OK") == 2 and out.index(b"/a") < out.index(b"/b")
    assert not conn.must_close


def test_nothing_after_connection_close_is_parsed() -> None:
    conn = HttpConnection()
    seen = _answer_all(
        conn,
        b"GET /a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        b"GET /b HTTP/1.1\r\nHost: x\r\n\r\ngarbage that is not HTTP\r\n\r\n",
    )
    assert [r.path for r in seen] == ["/a"]
    assert conn.must_close
    assert b"connection: close" in conn.data_to_send().lower()


def test_head_gets_the_headers_without_the_body() -> None:
    conn = HttpConnection()
    seen = _answer_all(conn, b"HEAD /abc HTTP/1.1\r\nHost: x\r\n\r\n")
    assert [r.method for r in seen] == ["HEAD"]
    out = conn.data_to_send()
    assert b"Content-Length: 4\r\n" in out and out.endswith(b"\r\n\r\n")


def test_http_1_0_closes_after_its_response() -> None:
    conn = HttpConnection()
    assert len(_answer_all(conn, b"GET /a HTTP/1.0\r\n\r\n")) == 1
    assert conn.must_close


def test_a_body_is_read_and_dropped_never_parsed() -> None:
    smuggled = b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
    conn = HttpConnection()
    seen = _answer_all(
        conn,
        b"POST /a HTTP/1.1\r\nHost: x\r\n"
        + f"Content-Length: {len(smuggled)}\r\n\r\n".encode()
        + smuggled
        + b"POST /b HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        + f"{len(smuggled):x}\r\n".encode()
        + smuggled
        + b"\r\n0\r\n\r\n",
    )
    assert [(r.method, r.path) for r in seen] == [("POST", "/a"), ("POST", "/b")]


@pytest.mark.parametrize(
    "head",
    [
        f"Content-Length: {MAX_BODY_BYTES + 1}\r\n\r\n".encode(),
        b"Transfer-Encoding: chunked\r\n\r\n" + f"{MAX_BODY_BYTES + 1:x}\r\n".encode(),
    ],
    ids=["content-length", "chunked"],
)
def test_a_large_body_is_refused_with_413(head: bytes) -> None:
    conn = HttpConnection()
    conn.receive_data(b"POST /a HTTP/1.1\r\nHost: x\r\n" + head + bytes(MAX_BODY_BYTES + 1))
    with pytest.raises(RemoteProtocolError) as info:
        list(conn.events())
    assert info.value.reply_hint == 413
    conn.reply_to_error(info.value)
    out = conn.data_to_send()
    assert out.startswith(b"HTTP/1.1 413 ") and b"connection: close" in out.lower()
    assert conn.must_close


def test_incomplete_head_waits_and_oversized_head_is_refused_with_431() -> None:
    conn = HttpConnection()
    conn.receive_data(b"GET / HTTP/1.1\r\nHost: x\r\n")
    assert list(conn.events()) == [] and conn.request_started
    conn.receive_data(b"X: " + b"a" * 20_000)
    with pytest.raises(RemoteProtocolError) as info:
        list(conn.events())
    assert info.value.reply_hint == 431


def test_garbage_gets_400_and_a_one_line_reason() -> None:
    conn = HttpConnection()
    conn.receive_data(b"garbage\r\n\r\n")
    with pytest.raises(RemoteProtocolError) as info:
        list(conn.events())
    conn.reply_to_error(info.value)
    out = conn.data_to_send()
    assert out.startswith(b"HTTP/1.1 400 ")
    assert out.partition(b"\r\n\r\n")[2].count(b"\n") == 1


def test_messages_join_fragments_and_pings_are_answered() -> None:
    conn, client = _upgraded()
    data = client.send(BytesMessage(b"abc", message_finished=False))
    data += client.send(Ping(b"p"))
    data += client.send(BytesMessage(b"de"))
    conn.receive_data(data)
    assert list(conn.events()) == [Message(b"abcde")]
    client.receive_data(conn.data_to_send())
    assert list(client.events()) == [Pong(b"p")]


def test_close_is_reported_then_answered() -> None:
    conn, client = _upgraded()
    conn.receive_data(client.send(CloseConnection(1000)))
    assert list(conn.events()) == [Closed(1000)]
    conn.close_websocket(1000)
    assert conn.must_close
    client.receive_data(conn.data_to_send())
    assert [type(e) for e in client.events()] == [CloseConnection]


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        (bytes([0x82, 0x03]) + b"abc", CLOSE_PROTOCOL_ERROR),  # not masked
        (bytes([0xC2, 0x80]) + bytes(4), CLOSE_PROTOCOL_ERROR),  # RSV1 without an extension
        (bytes([0x83, 0x80]) + bytes(4), CLOSE_PROTOCOL_ERROR),  # reserved opcode
        (bytes([0x09, 0x80]) + bytes(4), CLOSE_PROTOCOL_ERROR),  # fragmented ping
        (bytes([0x82, 0xFE, 0x04, 0x00]) + bytes(4 + 1024), CLOSE_MESSAGE_TOO_BIG),
    ],
    ids=["unmasked", "rsv", "reserved-opcode", "fragmented-control", "too-big"],
)
def test_framing_errors_name_the_close_code(frame: bytes, code: int) -> None:
    conn, _ = _upgraded()
    conn.receive_data(frame)
    with pytest.raises(RemoteProtocolError) as info:
        list(conn.events())
    assert info.value.reply_hint == code
    conn.reply_to_error(info.value)
    assert conn.data_to_send()[:1] == b"\x88"  # a close frame


@given(st.lists(st.binary(max_size=300), max_size=5), st.data())
def test_arbitrary_chunking_gives_the_same_messages(
    payloads: list[bytes], data: st.DataObject
) -> None:
    conn, client = _upgraded()
    stream = b"".join(client.send(BytesMessage(p)) for p in payloads)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    got: list[object] = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        conn.receive_data(stream[start:end])
        got += list(conn.events())
    assert got == [Message(p) for p in payloads]


@given(st.binary(max_size=200))
def test_arbitrary_bytes_give_requests_or_a_remote_error(data: bytes) -> None:
    conn = HttpConnection()
    with contextlib.suppress(RemoteProtocolError):  # anything else is a bug
        _answer_all(conn, data)


@pytest.mark.parametrize(
    ("origin", "host", "allowed", "ok"),
    [
        (None, "127.0.0.1:9100", (), True),  # not a browser
        ("http://127.0.0.1:9100", "127.0.0.1:9100", (), True),
        ("http://LOCALHOST", "localhost:80", (), True),  # default port, any case
        ("https://h.example", "h.example", (), True),
        ("http://[::1]:9100", "[::1]:9100", (), True),
        ("http://evil.example", "127.0.0.1:9100", (), False),
        ("http://127.0.0.1:9101", "127.0.0.1:9100", (), False),  # another port
        ("null", "127.0.0.1:9100", (), False),
        ("https://c.example", "127.0.0.1:9100", ("https://c.example",), True),
        ("http://c.example", "127.0.0.1:9100", ("https://c.example",), False),  # scheme
        ("http://evil.example", "127.0.0.1:9100", ("*",), True),
    ],
)
def test_origin_check(origin: str | None, host: str, allowed: tuple[str, ...], ok: bool) -> None:
    assert origin_allowed(origin, host, allowed) is ok


def test_origins_are_normalized_and_garbage_refused() -> None:
    assert normalize_origin("HTTPS://C.Example:443/") == "https://c.example"
    assert normalize_origin("http://c.example:8080") == "http://c.example:8080"
    for bad in ("c.example", "ftp://c.example", "http://c.example/path", "http://u@c.example"):
        with pytest.raises(ValueError):
            normalize_origin(bad)


@given(st.binary(max_size=300))
def test_arbitrary_frames_give_events_or_a_remote_error(data: bytes) -> None:
    conn, _ = _upgraded()
    conn.receive_data(data)
    try:
        for event in conn.events():
            assert isinstance(event, Message | Closed)
    except RemoteProtocolError as exc:
        assert isinstance(exc.reply_hint, int)


_HEADER_LINES = st.sampled_from(
    [
        b"Host: x",
        b"Connection: close",
        b"Connection: keep-alive",
        b"Connection: Upgrade",
        b"Upgrade: websocket",
        b"Upgrade: h2c",
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
        b"Sec-WebSocket-Version: 13",
        b"Content-Length: 5",
        b"Content-Length: 0",
        b"Transfer-Encoding: chunked",
        b"Expect: 100-continue",
        b"Origin: http://evil.example",
    ]
)
_REQUESTS = st.builds(
    lambda method, target, version, lines, body: (
        method
        + b" "
        + target
        + b" HTTP/"
        + version
        + b"\r\n"
        + b"".join(line + b"\r\n" for line in lines)
        + b"\r\n"
        + body
    ),
    st.sampled_from([b"GET", b"HEAD", b"POST", b"PUT", b"OPTIONS", b"CONNECT", b"DELETE"]),
    st.sampled_from([b"/health", b"/rsio", b"/", b"*", b"a:1", b"/x?y=z"]),
    st.sampled_from([b"1.0", b"1.1"]),
    st.lists(_HEADER_LINES, max_size=6),
    st.sampled_from([b"", b"hello", b"5\r\nhello\r\n0\r\n\r\n", b"\x82\x80abcd"]),
)


@given(st.lists(_REQUESTS, min_size=1, max_size=4), st.integers(1, 64))
def test_request_like_bytes_give_requests_or_a_remote_error(
    requests: list[bytes], chunk: int
) -> None:
    """Whatever the requests say, answering them raises nothing but RemoteProtocolError."""
    conn = HttpConnection()
    stream = b"".join(requests)
    with contextlib.suppress(RemoteProtocolError):
        for start in range(0, len(stream), chunk):
            conn.receive_data(stream[start : start + chunk])
            for event in conn.events():
                if isinstance(event, Request) and event.is_websocket_upgrade():
                    conn.accept_websocket(event)
                elif isinstance(event, Request):
                    conn.respond(404, b"nope\n")
            if conn.must_close:
                break
