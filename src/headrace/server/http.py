"""The HTTP port (9100): ``/health``, ``/metrics``, the web console, and RS-IO at ``/rsio``.

Routes (HTTP/1.1, keep-alive; the framing is ``h11``'s, the WebSocket
``wsproto``'s, both behind ``protocols/http.py``):

| request | answer |
| --- | --- |
| ``GET /health`` | ``200`` when every listener is up and the store takes writes, else ``503`` |
| ``GET /metrics`` | ``200``, every metric in the Prometheus text format (``metrics.py``) |
| ``GET /rsio``, a WebSocket upgrade | ``101``, then RS-IO; ``403`` from a foreign origin |
| ``GET /``, ``GET /console/...`` | the web console's page, script and style (``console.py``) |
| ``/api/...`` | the console's JSON API (``console.py``), answered by a task |
| anything else | ``404`` (``405`` for a method other than GET on a known path) |

Every route but the API is answered as its request is parsed. An API
request may wait (a password check runs in a worker thread), so it is
answered by the request's task (``handle``); requests pipelined behind it
are parsed only once it is answered, so answers keep the requests' order.

Connections: a client has ``--http-header-timeout`` (``HEADER_TIMEOUT_S``)
from its connection, or from its previous response, to send a whole request;
past it the connection is closed, so half-sent requests and idle keep-alives
give their connection slot back. And at most ``WAITING_SHARE`` of the
listener's ``--max-connections`` may wait for a request at once: past it the
connection that has waited longest is closed (``reason=evicted``), so a flood
of half-sent requests cannot take every slot even while the timeout runs.
``Connection: close`` closes the connection once its response is sent;
nothing after that request is read.

Origins: a browser page of any site can open a WebSocket to any address
(the same-origin policy does not cover WebSockets), so an upgrade whose
``Origin`` is neither the server's own (its host and port are the ``Host``
header's) nor in ``--http-allowed-origins`` is refused with 403, logged and
counted (``headrace_websocket_refused_total``). An upgrade without
``Origin`` comes from a program, not a page, and is let in.

RS-IO over WebSocket: one binary message is one RS-IO message with no length
prefix (rsio.md#framing); a text message is a protocol error. :class:`HttpHandler`
turns into a thin shim around the TCP front door's ``RsioHandler`` once the
upgrade is done: each received message gets its varint length prefix and goes
to the handler's ``feed``; each frame the handler queues leaves as one binary
message without its prefix. Pings are answered; a close is answered with a
close. An RS-IO protocol error sends the connection's ``goodbye`` and a close
(1002); a WebSocket framing error sends the close only.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict
from collections.abc import Iterator
from typing import Final

from headrace.errors import RemoteProtocolError
from headrace.protocols.http import (
    CLOSE_PROTOCOL_ERROR,
    Closed,
    HttpConnection,
    Message,
    Request,
    origin_allowed,
)
from headrace.protocols.rsio import DEFAULT_MAX_FRAME_BYTES, Goodbye
from headrace.protocols.rsio.codec import decode_varint, encode_varint
from headrace.server._context import Listener, ListenerContext
from headrace.server._listen import start_tcp_listener
from headrace.server._loop import ConnectionHandler
from headrace.server.console import SECURITY_HEADERS, Console
from headrace.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from headrace.server.rsio import RsioHandler

__all__ = ["HttpHandler", "start_http"]

log = logging.getLogger(__name__)

RSIO_PATH = "/rsio"

MAX_LOGGED_ORIGIN_CHARS: Final = 200
"""An ``Origin`` header quoted in a log line or a 403 is cut to this."""

WAITING_SHARE: Final = 0.5
"""Share of the listener's ``--max-connections`` that may wait for a request at
once; past it the longest-waiting one is closed. A flood of half-sent requests
then holds at most half the slots, and the rest stay for clients that send
whole requests and for WebSockets."""


class _Waiting:
    """The HTTP connections waiting for a request, longest-waiting first (one per
    listener); the oldest is closed when there are more than ``limit``."""

    def __init__(self, limit: int) -> None:
        self._limit = max(1, limit)
        self._order: OrderedDict[HttpHandler, None] = OrderedDict()

    def wait(self, handler: HttpHandler) -> None:
        """``handler`` waits for a request from now on (again, after a response)."""
        self._order[handler] = None
        self._order.move_to_end(handler)
        while len(self._order) > self._limit:
            oldest, _ = self._order.popitem(last=False)
            oldest.evict()

    def done(self, handler: HttpHandler) -> None:
        """``handler`` waits no more (upgraded, or closing)."""
        self._order.pop(handler, None)


class HttpHandler(ConnectionHandler):
    """One connection to the HTTP port: requests until a WebSocket upgrade to RS-IO."""

    name = "http"

    def __init__(
        self,
        app: ListenerContext,
        waiting: _Waiting | None = None,
        console: Console | None = None,
    ) -> None:
        self.name = app.listener_name("http")
        self._app = app
        self._waiting = waiting
        self._console = console if console is not None else Console(app)
        self._api: Request | None = None  # the API request being answered by a task
        # RS-IO frames fit a 16 MiB message; the length prefix adds at most 10 bytes.
        self._conn = HttpConnection(max_message_bytes=DEFAULT_MAX_FRAME_BYTES)
        self._rsio: RsioHandler | None = None
        self._closing = False
        self._header_timeout_s = app.config.http_header_timeout_s
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None

    # -- the loop's interface

    def on_start(self) -> None:
        self._arm()

    def feed(self, data: bytes) -> Iterator[object]:
        if self._closing:
            return
        if not data:  # EOF: every complete request was answered as it came
            if self._rsio is not None:
                yield from self._rsio.feed(b"")
            return
        self._conn.receive_data(data)
        for event in self._conn.events():
            match event:
                case Request() if Console.is_api(event.path):
                    self._api = event
                    self._cancel_timer()  # the answer is bounded; the timeout restarts after it
                    yield event  # answered by its task; later requests wait until then
                    return
                case Request():
                    self._route(event)
                    yield event  # counted as a request by the loop; answered already
                    if self._conn.must_close:
                        self._end()
                        return
                case Message(payload, text=False):
                    assert self._rsio is not None
                    yield from self._rsio.feed(encode_varint(len(payload)) + payload)
                case Message():
                    raise RemoteProtocolError(
                        "WebSocket text message (RS-IO takes binary messages only)",
                        reply_hint=Goodbye("WebSocket text message"),
                    )
                case Closed(code):
                    assert self._rsio is not None
                    self._move_rsio_output()  # the close goes last
                    self._conn.close_websocket(code)
                    self.wake_writer()
                    self._end()
                    yield from self._rsio.feed(b"")  # the peer is gone, as at EOF
                    return
        if self._conn.output_pending():
            self.wake_writer()  # pongs

    async def handle(self, event: object) -> None:
        if event is self._api and isinstance(event, Request):
            await self._answer_api(event)
        elif self._rsio is not None and not isinstance(event, Request):
            await self._rsio.handle(event)

    def data_to_send(self) -> bytes:
        # HTTP responses (the 101 first of all) and pongs, then RS-IO messages. A close
        # frame is only ever queued after the RS-IO messages before it were moved here.
        self._move_rsio_output()
        return self._conn.data_to_send()

    def on_protocol_error(self, exc: RemoteProtocolError) -> None:
        self._closing = True
        self._cancel_timer()
        if self._rsio is not None and isinstance(exc.reply_hint, Goodbye):
            self._rsio.on_protocol_error(exc)  # the goodbye goes before the close
            self._move_rsio_output()
            self._conn.close_websocket(CLOSE_PROTOCOL_ERROR)
            return
        self._move_rsio_output()
        self._conn.reply_to_error(exc)

    def partial_frame_bytes(self) -> int:
        return self._conn.partial_bytes()

    def busy(self) -> bool:
        return self._rsio is not None and self._rsio.busy()

    async def on_close(self) -> None:
        self._cancel_timer()
        if self._rsio is not None:
            await self._rsio.on_close()

    # -- requests

    def _route(self, request: Request) -> None:
        conn = self._conn
        if request.path in ("/health", "/metrics") and request.method != "GET":
            conn.respond(405, b"405 Method Not Allowed\n", headers=(("Allow", "GET"),))
        elif request.path == "/health":
            ok, report = self._app.health()
            body = json.dumps(report, sort_keys=True).encode() + b"\n"
            conn.respond(200 if ok else 503, body, "application/json")
        elif request.path == "/metrics":
            conn.respond(200, self._app.metrics.exposition(), METRICS_CONTENT_TYPE)
        elif request.path in self._console.static:
            if request.method not in ("GET", "HEAD"):
                conn.respond(405, b"405 Method Not Allowed\n", headers=(("Allow", "GET"),))
            else:
                static = self._console.static[request.path]
                conn.respond(200, static.body, static.content_type, headers=SECURITY_HEADERS)
        elif request.path == RSIO_PATH:
            if not request.is_websocket_upgrade():
                conn.respond(
                    426, b"RS-IO: open a WebSocket here\n", headers=(("Upgrade", "websocket"),)
                )
            elif not self._origin_ok(request):
                origin = request.headers.get("origin", "")[:MAX_LOGGED_ORIGIN_CHARS]
                conn.respond(
                    403,
                    f"origin {origin} may not open /rsio "
                    "(same origin or --http-allowed-origins only)\n".encode(),
                    close=True,
                )
            else:
                conn.accept_websocket(request)
                self._cancel_timer()  # RS-IO's own limits apply from here
                self._rsio = RsioHandler(self._app, listener=self.name)
                self._rsio.wake_writer = self.wake_writer
                self._rsio.peer, self._rsio.peer_cert = self.peer, self.peer_cert  # who, for auth
        else:
            conn.respond(404, b"404 Not Found\n")
        self._arm()
        self.wake_writer()

    async def _answer_api(self, request: Request) -> None:
        """Answer API requests, the first one and those pipelined behind it, in order."""
        pending: Request | None = request
        while pending is not None:
            answer = await self._console.answer(
                pending.method, pending.target, pending.headers, self.peer, self.peer_cert
            )
            self._api = None
            if self._closing:
                return
            self._conn.respond(
                answer.status,
                answer.body,
                "application/json",
                headers=SECURITY_HEADERS + answer.headers,
            )
            self.wake_writer()
            if self._conn.must_close:
                self._end()
                return
            self._arm()
            pending = self._next_pipelined()

    def _next_pipelined(self) -> Request | None:
        """Answer the requests that arrived while an API request was answered, up to
        the next API request (returned, for its answer), or until more data is needed."""
        try:
            for event in self._conn.events():
                assert isinstance(event, Request)  # no WebSocket before an upgrade's answer
                if Console.is_api(event.path):
                    self._api = event
                    self._cancel_timer()
                    return event
                self._route(event)
                if self._conn.must_close:
                    self._end()
                    return None
                if self._rsio is not None:
                    return None  # upgraded: the next bytes in are the WebSocket's
        except RemoteProtocolError as exc:
            log.info("http: a pipelined request broke HTTP: %s", exc)
            self.on_protocol_error(exc)
            self.wake_writer()
            self.close_connection("protocol_error")
        return None

    def _origin_ok(self, request: Request) -> bool:
        origin = request.headers.get("origin")
        allowed = self._app.config.http_allowed_origins
        if origin_allowed(origin, request.headers.get("host"), allowed):
            return True
        self._app.metrics.websocket_refused.labels("origin").inc()
        log.warning(
            "http: refused a WebSocket upgrade from origin %r (host %r)",
            (origin or "")[:MAX_LOGGED_ORIGIN_CHARS],
            request.headers.get("host", "")[:MAX_LOGGED_ORIGIN_CHARS],
        )
        return False

    def _move_rsio_output(self) -> None:
        """RS-IO's queued frames (always whole ones) into WebSocket binary messages."""
        if self._rsio is None:
            return
        stream = self._rsio.data_to_send()
        position = 0
        while position < len(stream):
            length, start = decode_varint(stream, position)
            self._conn.send_message(stream[start : start + length])
            position = start + length

    def _end(self) -> None:
        """The protocol is done with the connection: close it once the replies are out."""
        self._closing = True
        self._cancel_timer()
        self.close_connection("done")

    # -- the header timeout

    def _arm(self) -> None:
        """Give the next request ``--http-header-timeout`` from now."""
        if self._closing or self._rsio is not None:
            return
        if self._waiting is not None:
            self._waiting.wait(self)
        loop = asyncio.get_running_loop()
        self._deadline = loop.time() + self._header_timeout_s
        if self._timer is None:
            self._timer = loop.call_at(self._deadline, self._expire)

    def _expire(self) -> None:
        self._timer = None
        if self._closing or self._rsio is not None:
            return
        loop = asyncio.get_running_loop()
        if loop.time() < self._deadline:  # a response moved the deadline on
            self._timer = loop.call_at(self._deadline, self._expire)
            return
        self._closing = True
        if self._waiting is not None:
            self._waiting.done(self)
        started = self._conn.request_started
        log.info(
            "http: %s within %.1f s; closing",
            "a request not complete" if started else "no request",
            self._header_timeout_s,
        )
        self.close_connection("header_timeout" if started else "idle")

    def evict(self) -> None:
        """Close this connection to make room (``_Waiting``)."""
        if self._closing or self._rsio is not None:
            return
        self._closing = True
        self._cancel_timer()
        log.info("http: too many connections waiting for a request; closing the oldest")
        self.close_connection("evicted")

    def _cancel_timer(self) -> None:
        if self._waiting is not None:
            self._waiting.done(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


async def start_http(ctx: ListenerContext, host: str, port: int) -> Listener:
    """Serve the HTTP port on (host, port): HTTPS when a certificate is configured."""
    waiting = _Waiting(int(ctx.settings.limits.max_connections * WAITING_SHARE))
    console = Console(ctx)
    return await start_tcp_listener(
        ctx.listener_name("http"),
        host,
        port,
        lambda: HttpHandler(ctx, waiting, console),
        settings=ctx.settings,
        ssl_context=ctx.ssl_context(),
    )
