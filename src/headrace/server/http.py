"""The HTTP port (9100): ``/health``, ``/metrics``, and RS-IO over WebSocket at ``/rsio``.

Routes (HTTP/1.1, keep-alive):

| request | answer |
| --- | --- |
| ``GET /health`` | ``200`` when every configured listener is up, else ``503``; JSON body |
| ``GET /metrics`` | ``200``, every metric in the Prometheus text format (``metrics.py``) |
| ``GET /rsio`` with a WebSocket upgrade | ``101``, then RS-IO (B.4 message transport) |
| anything else | ``404`` (``405`` for a method other than GET on a known path) |

RS-IO over WebSocket: one binary message is one RS-IO message with no length
prefix (spec B.4); a text message is a protocol error. :class:`HttpHandler`
turns into a thin shim around the TCP front door's ``RsioHandler`` once the
upgrade is done: each received message gets its varint length prefix and goes
to the handler's ``feed``; each frame the handler queues leaves as one binary
message without its prefix. Pings are answered; a close is answered with a
close. An RS-IO protocol error sends the connection's ``goodbye`` and a close
(1002); a WebSocket framing error sends the close only.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

from headrace.errors import RemoteProtocolError
from headrace.protocols.rsio import DEFAULT_MAX_FRAME_BYTES, Goodbye
from headrace.protocols.rsio.codec import decode_varint, encode_varint
from headrace.protocols.websocket import (
    CLOSE_NORMAL,
    CLOSE_PROTOCOL_ERROR,
    Close,
    FrameReader,
    HttpRequest,
    Message,
    Opcode,
    Ping,
    encode_frame,
    handshake_response,
    http_response,
    parse_request,
)
from headrace.server._listen import start_tcp_listener
from headrace.server._loop import ConnectionHandler
from headrace.server.app import LISTENER_STARTERS, Listener, ServerApp
from headrace.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from headrace.server.rsio import RsioHandler

__all__ = ["HttpHandler", "start_http"]

log = logging.getLogger(__name__)

RSIO_PATH = "/rsio"

_STATUS_REASONS = {400: "Bad Request", 431: "Request Header Fields Too Large"}


class HttpHandler(ConnectionHandler):
    """One connection to the HTTP port: requests until a WebSocket upgrade to RS-IO."""

    name = "http"

    def __init__(self, app: ServerApp) -> None:
        self._app = app
        self._buffer = bytearray()
        self._out = bytearray()
        self._rsio: RsioHandler | None = None
        self._frames: FrameReader | None = None
        self._closing = False

    # -- the loop's interface

    def feed(self, data: bytes) -> Iterator[object]:
        eof = not data
        if self._rsio is None:
            self._buffer += data
            while self._rsio is None and (parsed := parse_request(self._buffer)) is not None:
                request, used = parsed
                del self._buffer[:used]
                self._route(request)
                yield request  # counted as a request by the loop; answered already
            if self._rsio is None:
                return
            data, self._buffer = bytes(self._buffer), bytearray()
        assert self._rsio is not None and self._frames is not None
        if eof:
            yield from self._rsio.feed(b"")
            return
        if self._closing:
            return
        for frame in self._frames.receive_data(data):
            match frame:
                case Message(Opcode.BINARY, payload):
                    yield from self._rsio.feed(encode_varint(len(payload)) + payload)
                case Message():
                    raise RemoteProtocolError(
                        "WebSocket text message (RS-IO takes binary messages only)",
                        reply_hint=Goodbye("WebSocket text message"),
                    )
                case Ping(payload):
                    self._out += encode_frame(Opcode.PONG, payload)
                    self.wake_writer()
                case Close(code, _):
                    self._closing = True
                    self._out += _messages(self._rsio.data_to_send())  # the close goes last
                    self._out += encode_frame(
                        Opcode.CLOSE, (code or CLOSE_NORMAL).to_bytes(2, "big")
                    )
                    self.wake_writer()
                    yield from self._rsio.feed(b"")  # the peer is gone, as at EOF
                    return

    async def handle(self, event: object) -> None:
        if self._rsio is not None and not isinstance(event, HttpRequest):
            await self._rsio.handle(event)

    def data_to_send(self) -> bytes:
        # HTTP responses (the 101 first of all) and pongs, then RS-IO messages. A close
        # frame is only ever queued after the RS-IO messages before it were moved here.
        out = bytes(self._out)
        self._out.clear()
        if self._rsio is not None:
            out += _messages(self._rsio.data_to_send())
        return out

    def on_protocol_error(self, exc: RemoteProtocolError) -> None:
        if self._rsio is None:
            status = exc.reply_hint if isinstance(exc.reply_hint, int) else 400
            self._out += http_response(status, _STATUS_REASONS.get(status, "Bad Request"))
            return
        if isinstance(exc.reply_hint, Goodbye):
            self._rsio.on_protocol_error(exc)
            code = CLOSE_PROTOCOL_ERROR
        else:
            code = exc.reply_hint if isinstance(exc.reply_hint, int) else CLOSE_PROTOCOL_ERROR
        self._closing = True
        tail = _messages(self._rsio.data_to_send())  # the goodbye goes before the close
        self._out = (
            bytearray(tail) + self._out + encode_frame(Opcode.CLOSE, code.to_bytes(2, "big"))
        )

    def partial_frame_bytes(self) -> int:
        if self._rsio is None:
            return len(self._buffer)  # an unfinished request head
        return 0

    def busy(self) -> bool:
        return self._rsio is not None and self._rsio.busy()

    async def on_close(self) -> None:
        if self._rsio is not None:
            await self._rsio.on_close()

    # -- requests

    def _route(self, request: HttpRequest) -> None:
        if request.path in ("/health", "/metrics") and request.method != "GET":
            self._out += http_response(405, "Method Not Allowed")
        elif request.path == "/health":
            ok, report = self._app.health()
            body = json.dumps(report, sort_keys=True).encode() + b"\n"
            status, reason = (200, "OK") if ok else (503, "Service Unavailable")
            self._out += http_response(status, reason, body, "application/json")
        elif request.path == "/metrics":
            body = self._app.metrics.exposition()
            self._out += http_response(200, "OK", body, METRICS_CONTENT_TYPE)
        elif request.path == RSIO_PATH:
            if not request.is_websocket_upgrade():
                self._out += http_response(
                    426, "Upgrade Required", b"RS-IO: open a WebSocket here\n"
                )
            else:
                self._out += handshake_response(request)
                self._rsio = RsioHandler(self._app, listener=self.name)
                self._rsio.wake_writer = self.wake_writer
                self._rsio.peer, self._rsio.peer_cert = self.peer, self.peer_cert  # who, for auth
                # RS-IO frames fit a 16 MiB message; the length prefix adds at most 10 bytes.
                self._frames = FrameReader(masked=True, max_message_bytes=DEFAULT_MAX_FRAME_BYTES)
        else:
            self._out += http_response(404, "Not Found")
        self.wake_writer()


def _messages(stream: bytes) -> bytes:
    """Length-prefixed RS-IO frames (always whole ones) as WebSocket binary messages."""
    out = bytearray()
    position = 0
    while position < len(stream):
        length, start = decode_varint(stream, position)
        out += encode_frame(Opcode.BINARY, stream[start : start + length])
        position = start + length
    return bytes(out)


async def start_http(app: ServerApp, host: str, port: int) -> Listener:
    """Serve the HTTP port on (host, port): HTTPS when a certificate is configured."""
    return await start_tcp_listener(
        "http", host, port, lambda: HttpHandler(app), ssl_context=app.ssl_context()
    )


LISTENER_STARTERS["http"] = start_http
