"""HTTP/1.1 and WebSocket for the HTTP port, sans-I/O: ``h11`` and ``wsproto`` behind one object.

Theory of operation. ``HttpConnection`` is the server side of one
connection to the HTTP port. Until a WebSocket upgrade it is an HTTP/1.1
connection run by ``h11`` (the request parser and the keep-alive state
machine: bodies framed by ``Content-Length`` or chunked, ``Connection:
close``, HTTP/1.0); after one it is a WebSocket run by ``wsproto`` (RFC 6455
frames, no extensions, no subprotocols). The server adapter feeds bytes
(``receive_data``), takes events (``events``), answers them (``respond``,
``accept_websocket``, ``send_message``, ``close_websocket``) and writes
``data_to_send``.

* **One request at a time.** ``events`` yields a ``Request`` once it is
  complete, head and body; the caller answers it before taking the next
  event, so pipelined requests are answered in order and a request's body
  is never read as a request. Bodies are read and thrown away (no route
  takes one), and refused with 413 beyond ``MAX_BODY_BYTES``.
* **Connection: close** (or HTTP/1.0 without keep-alive, or an error
  reply) ends the connection after its response: ``must_close`` turns
  true and no byte after that request is parsed.
* **Limits.** A request head is at most ``MAX_HEADER_BYTES`` (431 beyond);
  a WebSocket message at most ``max_message_bytes`` (close 1009 beyond).
  The time a client may take for a request (``HEADER_TIMEOUT_S``) is kept
  by the server, which owns the clock.
* **Errors.** Anything the peer gets wrong raises ``RemoteProtocolError``
  whose ``reply_hint`` is the HTTP status (before an upgrade) or the
  WebSocket close code (after); ``reply_to_error`` queues that reply.

The origin check of a WebSocket upgrade (``origin_allowed``) is a pure
function of the request's ``Origin`` and ``Host`` headers and the allowed
origins, so it lives here too; the policy (which origins) is the server's.
"""

from __future__ import annotations

import contextlib
import http
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

import h11
from wsproto.connection import Connection as WsConnection
from wsproto.connection import ConnectionState, ConnectionType
from wsproto.events import BytesMessage, CloseConnection, Ping, TextMessage
from wsproto.utilities import generate_accept_token

from headrace.errors import RemoteProtocolError

__all__ = [
    "ANY_ORIGIN",
    "CLOSE_MESSAGE_TOO_BIG",
    "CLOSE_NORMAL",
    "CLOSE_PROTOCOL_ERROR",
    "HEADER_TIMEOUT_S",
    "MAX_BODY_BYTES",
    "MAX_HEADER_BYTES",
    "Closed",
    "HttpConnection",
    "Message",
    "Request",
    "normalize_origin",
    "origin_allowed",
]

MAX_HEADER_BYTES: Final = 16 * 1024
"""Largest request head: browsers send under 2 KiB; 16 KiB leaves room for
cookies without letting a peer buffer megabytes before it is refused (431)."""

MAX_BODY_BYTES: Final = 64 * 1024
"""Largest request body read (and thrown away): no route takes a body, so a
small one is tolerated for clients that always send one, and a larger one is
refused with 413 and the connection closed rather than read."""

HEADER_TIMEOUT_S: Final = 10.0
"""Longest a client may take to send a whole request (head and its small
body), counted from its connection or from the previous response. A real
client sends a request in one packet; a connection that holds a half-sent
request, or an idle keep-alive, is closed after this, so idle connections
cannot hold the port's connection slots (``--http-header-timeout``)."""

CLOSE_NORMAL: Final = 1000
CLOSE_PROTOCOL_ERROR: Final = 1002
CLOSE_MESSAGE_TOO_BIG: Final = 1009
"""WebSocket close codes (RFC 6455 §7.4.1)."""

ANY_ORIGIN: Final = "*"
"""In the allowed origins: every origin may open a WebSocket."""

_DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


@dataclass(frozen=True, slots=True)
class Request:
    """A complete HTTP request (its body, if any, was read and thrown away).

    Header names are lower-cased; a repeated header's values are joined by ``, ``.
    """

    method: str
    target: str
    headers: dict[str, str]

    @property
    def path(self) -> str:
        return self.target.partition("?")[0]

    def is_websocket_upgrade(self) -> bool:
        """A version-13 WebSocket opening handshake (RFC 6455 §4.2.1)."""
        connection = {t.strip().lower() for t in self.headers.get("connection", "").split(",")}
        return (
            self.method == "GET"
            and "upgrade" in connection
            and self.headers.get("upgrade", "").lower() == "websocket"
            and self.headers.get("sec-websocket-version") == "13"
            and bool(self.headers.get("sec-websocket-key"))
        )


@dataclass(frozen=True, slots=True)
class Message:
    """A complete WebSocket data message (its fragments joined)."""

    payload: bytes
    text: bool = False


@dataclass(frozen=True, slots=True)
class Closed:
    """The peer closed the WebSocket (answer with ``close_websocket``)."""

    code: int


class HttpConnection:
    """The server side of one HTTP port connection (see the module docstring).

    Args:
        max_header_bytes: largest request head (431 beyond).
        max_body_bytes: largest request body (413 beyond).
        max_message_bytes: largest WebSocket message, fragments joined (1009 beyond).
    """

    def __init__(
        self,
        *,
        max_header_bytes: int = MAX_HEADER_BYTES,
        max_body_bytes: int = MAX_BODY_BYTES,
        max_message_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        self._h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=max_header_bytes)
        self._max_body_bytes = max_body_bytes
        self._max_message_bytes = max_message_bytes
        self._ws: WsConnection | None = None
        self._out = bytearray()
        self._request: Request | None = None
        self._head_only = False  # the request being answered is a HEAD: no body goes out
        self._body_bytes = 0
        self._message: bytearray | None = None
        self._message_text = False

    # -- state

    @property
    def websocket(self) -> bool:
        """Whether the connection was upgraded to a WebSocket."""
        return self._ws is not None

    @property
    def must_close(self) -> bool:
        """Whether the connection is over once the queued bytes are sent: a
        response that ends it (``Connection: close``, HTTP/1.0, an error) or a
        finished WebSocket closing handshake."""
        if self._ws is not None:
            return self._ws.state is ConnectionState.CLOSED
        return h11.MUST_CLOSE in (self._h11.our_state, self._h11.their_state) or (
            self._h11.our_state is h11.CLOSED
        )

    @property
    def request_started(self) -> bool:
        """Whether bytes of a request not yet complete have arrived."""
        if self._ws is not None:
            return False
        return self._h11.their_state is h11.SEND_BODY or bool(self._h11.trailing_data[0])

    def partial_bytes(self) -> int:
        """Bytes of a request head, or of a WebSocket message, received in part (0: none)."""
        if self._ws is None:
            return len(self._h11.trailing_data[0])  # under MAX_HEADER_BYTES between reads
        return 0 if self._message is None else len(self._message)

    # -- receiving

    def receive_data(self, data: bytes) -> None:
        """Feed received bytes; ``b""`` is EOF (then ``events`` ends)."""
        if self._ws is None:
            if self._h11.their_state is not h11.ERROR:
                self._h11.receive_data(bytes(data))
        elif self._ws.state is not ConnectionState.CLOSED and data:
            self._ws.receive_data(bytes(data))

    def events(self) -> Iterator[Request | Message | Closed]:
        """Every complete event the bytes so far give.

        Answer each ``Request`` before taking the next event: the next one is
        parsed only after the answer (and none after one that ends the
        connection).

        Raises:
            RemoteProtocolError: the peer broke HTTP (``reply_hint`` the status)
                or WebSocket framing (``reply_hint`` the close code).
        """
        while True:
            if self._ws is not None:
                yield from self._ws_events()
                return
            if self.must_close:
                return  # nothing after the request that ended the connection is read
            event = self._next_http_event()
            if event is h11.NEED_DATA or event is h11.PAUSED:
                return
            if isinstance(event, h11.Request):
                self._start_request(event)
            elif isinstance(event, h11.Data):
                self._body_bytes += len(event.data)
                if self._body_bytes > self._max_body_bytes:
                    raise _too_large(self._max_body_bytes)
            elif isinstance(event, h11.EndOfMessage):
                request, self._request = self._request, None
                assert request is not None
                yield request
                answered: object = self._h11.our_state  # the caller changed it
                if answered is h11.SEND_RESPONSE:
                    raise RuntimeError("a request was not answered before the next event")
            else:  # ConnectionClosed: EOF between requests
                return

    def _next_http_event(self) -> h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED]:
        try:
            return self._h11.next_event()
        except h11.RemoteProtocolError as exc:
            raise RemoteProtocolError(str(exc), reply_hint=exc.error_status_hint) from None

    def _start_request(self, event: h11.Request) -> None:
        headers: dict[str, str] = {}
        for name, value in event.headers:
            key, text = name.decode("latin-1"), value.decode("latin-1")
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
        self._request = Request(
            event.method.decode("latin-1"), event.target.decode("latin-1"), headers
        )
        self._body_bytes = 0
        self._head_only = event.method == b"HEAD"
        length = headers.get("content-length", "0")
        if length.isdigit() and int(length) > self._max_body_bytes:
            raise _too_large(self._max_body_bytes)

    def _ws_events(self) -> Iterator[Message | Closed]:
        ws = self._ws
        assert ws is not None
        for event in ws.events():
            if isinstance(event, BytesMessage | TextMessage):
                if self._message is None:
                    self._message = bytearray()
                    self._message_text = isinstance(event, TextMessage)
                data = event.data
                self._message += data.encode() if isinstance(data, str) else data
                if len(self._message) > self._max_message_bytes:
                    raise RemoteProtocolError(
                        f"WebSocket message over {self._max_message_bytes} bytes",
                        reply_hint=CLOSE_MESSAGE_TOO_BIG,
                    )
                if event.message_finished:
                    message = Message(bytes(self._message), self._message_text)
                    self._message = None
                    yield message
            elif isinstance(event, Ping):
                self._out += ws.send(event.response())
            elif isinstance(event, CloseConnection):
                if ws.state is ConnectionState.OPEN:  # a framing error, not the peer's close
                    raise RemoteProtocolError(
                        f"WebSocket: {event.reason}", reply_hint=int(event.code)
                    )
                yield Closed(int(event.code))
                return
            # a pong answers nothing we sent

    # -- sending

    def respond(
        self,
        status: int,
        body: bytes = b"",
        content_type: str = "text/plain; charset=utf-8",
        *,
        headers: tuple[tuple[str, str], ...] = (),
        close: bool = False,
    ) -> None:
        """Answer the current request with a complete response.

        ``close``: end the connection after it (``must_close``).
        """
        fields = [
            ("Content-Type", content_type),
            ("Content-Length", str(len(body))),
            *headers,
        ]
        if close:
            fields.append(("Connection", "close"))
        self._send_response(status, fields, body)

    def _send_response(self, status: int, fields: list[tuple[str, str]], body: bytes) -> None:
        h = self._h11
        reason = http.HTTPStatus(status).phrase.encode("ascii")
        self._out += h.send(h11.Response(status_code=status, headers=fields, reason=reason)) or b""
        if body and not self._head_only:  # HEAD: the headers of the GET, no body
            self._out += h.send(h11.Data(data=body)) or b""
        self._out += h.send(h11.EndOfMessage()) or b""
        if h.our_state is h11.DONE and h.their_state is h11.DONE:
            h.start_next_cycle()

    def accept_websocket(self, request: Request) -> None:
        """Answer the upgrade ``request`` with 101; the connection is a WebSocket from here."""
        key = request.headers["sec-websocket-key"].encode("latin-1")
        fields = [
            ("Upgrade", "websocket"),
            ("Connection", "Upgrade"),
            ("Sec-WebSocket-Accept", generate_accept_token(key).decode("ascii")),
        ]
        response = h11.InformationalResponse(
            status_code=101, headers=fields, reason=b"Switching Protocols"
        )
        self._out += self._h11.send(response) or b""
        trailing, closed = self._h11.trailing_data
        self._ws = WsConnection(ConnectionType.SERVER, trailing_data=trailing)
        if closed:
            self._ws.receive_data(None)

    def send_message(self, payload: bytes) -> None:
        """Queue one binary message (dropped once the WebSocket is closing)."""
        ws = self._ws
        assert ws is not None
        if ws.state is ConnectionState.OPEN:
            self._out += ws.send(BytesMessage(data=payload))

    def close_websocket(self, code: int = CLOSE_NORMAL) -> None:
        """Queue a close frame: ours, or the answer to the peer's ``Closed``."""
        ws = self._ws
        assert ws is not None
        if ws.state in (ConnectionState.OPEN, ConnectionState.REMOTE_CLOSING):
            self._out += ws.send(CloseConnection(code=code))

    def reply_to_error(self, exc: RemoteProtocolError) -> None:
        """Queue the answer to ``exc`` from ``events``: an error response that
        closes the connection, or a close frame."""
        hint = exc.reply_hint if isinstance(exc.reply_hint, int) else None
        if self._ws is not None:
            self.close_websocket(hint or CLOSE_PROTOCOL_ERROR)
            return
        status = hint if hint is not None and 400 <= hint < 600 else 400
        body = f"{status} {http.HTTPStatus(status).phrase}: {exc}\n".encode()
        fields = [
            ("Content-Type", "text/plain; charset=utf-8"),
            ("Content-Length", str(len(body))),
            ("Connection", "close"),
        ]
        # In a state that takes no response (none can be sent), the connection just closes.
        with contextlib.suppress(h11.LocalProtocolError):
            self._send_response(status, fields, body)

    def output_pending(self) -> bool:
        """Whether bytes are queued for the peer (a pong, say)."""
        return bool(self._out)

    def data_to_send(self) -> bytes:
        """Bytes queued for the peer (and forget them)."""
        out = bytes(self._out)
        self._out.clear()
        return out


def _too_large(limit: int) -> RemoteProtocolError:
    return RemoteProtocolError(f"request body over {limit} bytes", reply_hint=413)


# --------------------------------------------------------------------------- origins


def normalize_origin(origin: str) -> str:
    """``scheme://host[:port]`` in lower case, the scheme's default port left out.

    Raises:
        ValueError: not an origin (no scheme or host, or a path, query or user).
    """
    try:
        parts = urlsplit(origin.strip())
        port = parts.port
    except ValueError:
        raise ValueError(f"{origin!r} is not an origin (scheme://host[:port])") from None
    scheme = parts.scheme.lower()
    if (
        scheme not in _DEFAULT_PORTS
        or not parts.hostname
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or parts.username is not None
    ):
        raise ValueError(f"{origin!r} is not an origin (scheme://host[:port])")
    host = parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"  # IPv6, as written in a URL
    return (
        f"{scheme}://{host}"
        if port in (None, _DEFAULT_PORTS[scheme])
        else (f"{scheme}://{host}:{port}")
    )


def origin_allowed(origin: str | None, host: str | None, allowed: tuple[str, ...]) -> bool:
    """Whether a WebSocket upgrade with these ``Origin`` and ``Host`` headers may proceed.

    No ``Origin``: not a browser (browsers always send one on a WebSocket
    upgrade), allowed. Else the origin must be the server's own (its host and
    port are the ``Host`` header's) or one of ``allowed`` (normalized by
    ``normalize_origin``; ``ANY_ORIGIN`` allows every origin).
    """
    if origin is None:
        return True
    if ANY_ORIGIN in allowed:
        return True
    try:
        normal = normalize_origin(origin)
    except ValueError:
        return False  # "null" (a sandboxed page, a file) and garbage alike
    if normal in allowed:
        return True
    if not host:
        return False
    scheme = normal.partition("://")[0]
    try:
        own = normalize_origin(f"{scheme}://{host.strip()}")
    except ValueError:
        return False
    return normal == own
