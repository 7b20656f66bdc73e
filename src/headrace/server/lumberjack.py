"""The Lumberjack front door: Beats, logstash-forwarder and pylogbeat write here.

Serves the ``lumberjack`` door: by the port flags, two listeners, ``lumberjack``
(plain, default port 5044) and ``lumberjack_tls`` (default 5045, started only
when ``--tls-cert/--tls-key`` are configured; ``--tls-ca`` asks clients for a
certificate); or those ``--listener lumberjack=...`` names. All speak v1
and v2; the sans-I/O ``LumberjackConnection`` does the protocol, the generic
``run_connection`` loop does the I/O, ``server/lumberjack_target.py`` decides
where events go, and this module when windows are stored and acks leave
(``docs/architecture.md#front-doors``, ``architecture.md#invariant-durable-acks``).

Theory of operation
-------------------
* **Windows are stored whole.** ``feed`` collects the events of the open
  window in memory (bounded by ``max_pending_bytes``) and hands the window to
  ``handle`` only when it closes. A connection that breaks mid-window has
  stored nothing of that window, so the client's resend stores it once.
  The one exception is the *window linger*: an open window that receives
  nothing for ``window_linger_s`` has its events so far stored (unacked), for
  "W once" clients that trickle events and never resend (``_linger``).
* **Where events go** is the listener's ``LumberjackTarget``
  (``server/lumberjack_target.py``): the target stream, the routing key of
  each event, and one append per target segment for each window.
* **Acks in order, only when durable.** Windows are stored concurrently (up to
  ``MAX_WINDOWS_IN_FLIGHT``; reading pauses beyond it), but each window issues
  its appends only after the previous window issued its own, so per segment
  the stored order is the wire order. A window's ack (its last seq, in the
  connection's version, one 6-byte frame) is queued once it and every window
  before it are durable.
* **v2 keepalives and partial acks.** While anything awaits an ack on a v2
  connection, an ``Ack(0)`` goes out whenever nothing was written for
  ``keepalive_interval_s``. A window over ``PARTIAL_ACK_BYTES`` is stored in
  parts, one after the other, and each part but the last is acked (the seq
  of its last event) once it and everything before it is durable.
  A window that waits longer than ``max_ack_wait_s`` for the store closes the
  connection without its ack (the client resends elsewhere).
* **Bad input** (``RemoteProtocolError`` from the codec, or a limit here)
  closes this connection with a log line; the open window is dropped unacked.
* **An unreachable owner** (``OwnerUnavailable``: in a cluster, the target
  segment's owner did not answer, or nobody owns it now) is retriable: the
  window is not acked, the acks already due go out and the connection
  closes (``reason=unavailable``); the client sends the window again.
* **Auth** (``server/authz.py``): with auth on, the client must be a user
  (known by its TLS client certificate) holding READ_UPDATE on the target
  stream, checked at its first bytes and at every window; otherwise the
  connection is closed with one log line (``reason=access_denied``) and
  nothing of it is stored. Lumberjack has no error reply.

What is and is not deduplicated is written down in ``docs/protocols/lumberjack.md``
("Storage and guarantees").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final

from headrace.errors import AccessDenied, OwnerUnavailable, RemoteProtocolError
from headrace.protocols.lumberjack import (
    RECEIVE_SLACK_BYTES,
    Ack,
    Batch,
    Limits,
    LumberjackConnection,
    ProtocolVersion,
    Role,
    encode_frame,
)
from headrace.protocols.pravega.auth import Permission, stream_resource
from headrace.server._context import Listener, ListenerContext
from headrace.server._listen import start_tcp_listener
from headrace.server._loop import ConnectionHandler
from headrace.server.authz import ConnectionAccess, DoorAuth, peer_address
from headrace.server.lumberjack_config import MAX_WINDOWS_IN_FLIGHT, LumberjackConfig
from headrace.server.lumberjack_target import (
    LumberjackTarget,
    add_metadata,
    connection_metadata,
)

__all__ = [
    "MAX_EVENT_BYTES",
    "PARTIAL_ACK_BYTES",
    "LumberjackHandler",
    "start_lumberjack",
]

log = logging.getLogger(__name__)

UNAVAILABLE: Final = "unavailable"
"""Access-line reason of a connection closed because a target segment's owner
(another node) could not be reached: retriable, the client sends again."""

PARTIAL_ACK_BYTES: Final = 1024 * 1024
"""A v2 window holding more event bytes than this is stored in parts of about
this size, each issued once the one before is durable and acknowledged then with
a partial ack (the seq of its last event): a Beat waiting on a slow disk sees
its window progress, and after a failure resends only what was not acked.
Windows below it (libbeat's 2048 events of a few hundred bytes) are one part,
stored with one append per target segment."""

MAX_EVENT_BYTES: Final = 8 * 1024 * 1024
"""Largest event payload stored: Pravega's own event size limit, so that every
stored event is readable by Pravega readers. Filebeat cuts lines at 10 MiB by
default, but its events are rarely above a few KiB; a larger one closes the
connection (logged) rather than writing what a reader would refuse."""

# --------------------------------------------------------------------------- windows


@dataclass(slots=True, eq=False)
class _Window:
    """A closed window (or a ``W`` = 0 ack point) on its way to the store, or the
    lingering part of an open window (``ack_seq`` None: stored, never acked)."""

    ack_seq: int | None
    payloads: list[bytes]
    keys: list[str | None]
    streams: list[str] | None
    """Each event's ``scope/stream`` (a template's routing); None: the one stream."""
    size_bytes: int
    after: asyncio.Future[None] | None
    """Resolved when the previous window has issued its appends."""
    issued: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    durable: bool = False
    parts: list[tuple[int, int]] = field(default_factory=list)
    """v2 windows over ``PARTIAL_ACK_BYTES``: (end index, seq of that event) of
    each part but the last; empty: stored in one go."""
    partial_seq: int = 0
    """Seq of the last event of the parts durable so far (0: none)."""
    partial_sent: int = 0
    """The last partial ack sent for this window."""


# --------------------------------------------------------------------------- handler


class LumberjackHandler(ConnectionHandler):
    """One Lumberjack connection: collects windows, stores them, acks in order.

    Args:
        target: where the listener's events go (stream, routing, appends).
        config: the limits.
        name: the listener name, for log lines.
        auth: who may write (``server/authz.py``); None: auth off.
        tls: whether the listener is a TLS one (for ``@metadata``).
    """

    def __init__(
        self,
        target: LumberjackTarget,
        config: LumberjackConfig,
        name: str,
        *,
        auth: DoorAuth | None = None,
        tls: bool = False,
    ) -> None:
        self.name = name
        self._target = target
        self._config = config
        self._auth = auth
        self._access: ConnectionAccess | None = None
        self._conn = LumberjackConnection(
            Role.SERVER,
            limits=Limits(
                max_frame_bytes=config.max_frame_bytes,
                max_decompressed_bytes=config.max_decompressed_bytes,
                max_window_count=config.max_window_count,
            ),
            parse=target.parse,
        )
        self._open_payloads: list[bytes] = []
        self._open_keys: list[str | None] = []
        self._open_streams: list[str] | None = [] if target.templated else None
        self._open_bytes = 0
        self._tls = tls
        self._metadata: tuple[dict[str, object], bytes] | None = None
        self._open_parts: list[tuple[int, int]] = []  # the open window's parts so far
        self._part_bytes = 0  # event bytes of the open window since its last part
        self._pending_bytes = 0  # event bytes received and not yet acked
        self._windows: deque[_Window] = deque()  # closed, not yet acked, in order
        self._last_issued: asyncio.Future[None] | None = None
        self._last_write_s = 0.0
        self._keepalive: asyncio.Task[None] | None = None
        self._failed = False  # a protocol error: the connection is closing
        self._late_acks = b""  # acks encoded after the failure
        self._last_data_s = 0.0  # when bytes last arrived (for the window linger)
        self._parts: set[asyncio.Task[None]] = set()  # lingering parts being stored
        self._broken: Exception | None = None  # storing a lingering part failed
        self._timer_wake = asyncio.Event()  # an open window got its first events

    # ------------------------------------------------------------------ receiving

    def partial_frame_bytes(self) -> int:
        return self._conn.buffered_bytes

    def feed(self, data: bytes) -> Iterator[_Window]:
        """Received bytes in; each window that closes out, ready to store.

        Raises:
            RemoteProtocolError: the peer broke the protocol or a limit.
        """
        if self._broken is not None:
            raise RemoteProtocolError(
                f"storing part of an incomplete window failed ({self._broken}); closing"
            )
        if self._access is None and data:
            self._check_access()  # before a byte of the peer's is taken in
        if data:
            self._last_data_s = asyncio.get_running_loop().time()
        view = memoryview(data)
        chunks = [
            view[i : i + RECEIVE_SLACK_BYTES] for i in range(0, len(view), RECEIVE_SLACK_BYTES)
        ]
        try:
            for chunk in chunks or [view]:
                self._conn.receive_data(chunk)
                for event in self._conn.events():
                    if isinstance(event, Batch):
                        window = self._take(event)
                        if window is not None:
                            yield window
        except RemoteProtocolError:
            self._failed = True
            raise

    def _take(self, batch: Batch) -> _Window | None:
        payloads = batch.payloads
        if payloads and not self._open_payloads:
            self._timer_wake.set()  # the linger clock starts
        size = sum(map(len, payloads))
        if payloads and (
            max(map(len, payloads)) > MAX_EVENT_BYTES
            or self._pending_bytes + size > self._config.max_pending_bytes
        ):
            self._refuse(batch.seqs, payloads)
        self._pending_bytes += size
        self._open_bytes += size
        if self._conn.version is ProtocolVersion.V2:
            if self._part_bytes + size >= PARTIAL_ACK_BYTES:
                self._cut_parts(batch)
            else:
                self._part_bytes += size
        target = self._target
        self._open_keys += target.routing_keys(batch)
        if self._open_streams is not None:
            self._open_streams += target.stream_names(batch) or ()
        if target.metadata and payloads:
            meta, meta_json = self._connection_metadata()
            self._open_payloads += [
                add_metadata(payload, document, meta, meta_json)
                for payload, document in zip(payloads, batch.documents, strict=True)
            ]
        else:
            self._open_payloads += payloads
        if batch.ack_seq is None:
            return None
        self._check_access()  # the grants may have changed since the last window
        window = _Window(
            batch.ack_seq,
            self._open_payloads,
            self._open_keys,
            self._open_streams,
            self._open_bytes,
            after=self._last_issued,
        )
        if self._open_parts and self._open_parts[-1][0] >= len(window.payloads):
            self._open_parts.pop()  # a part ending with the window is its last part
        window.parts = self._open_parts
        self._last_issued = window.issued
        self._open_payloads, self._open_keys, self._open_bytes = [], [], 0
        if self._open_streams is not None:
            self._open_streams = []
        self._open_parts, self._part_bytes = [], 0
        self._windows.append(window)
        return window

    def _connection_metadata(self) -> tuple[dict[str, object], bytes]:
        """The ``@metadata`` of this connection's events, and its JSON (made once)."""
        if self._metadata is None:
            meta = connection_metadata(self.peer, self._tls, self.peer_cert)
            self._metadata = meta, json.dumps(meta, separators=(",", ":")).encode()
        return self._metadata

    def _cut_parts(self, batch: Batch) -> None:
        """Note where the open window's parts end, for ``batch``'s events (taken
        next): a part ends at the event that brings it to ``PARTIAL_ACK_BYTES``."""
        index = len(self._open_payloads)
        part_bytes = self._part_bytes
        for seq, payload in zip(batch.seqs, batch.payloads, strict=True):
            index += 1
            part_bytes += len(payload)
            if part_bytes >= PARTIAL_ACK_BYTES:
                self._open_parts.append((index, seq))
                part_bytes = 0
        self._part_bytes = part_bytes

    def _check_access(self) -> None:
        """Raise ``AccessDenied`` unless the client may write to the target
        stream, or with a template, to each stream of the open window."""
        if self._access is None:
            self._access = ConnectionAccess.of(self._auth, self.name, self.peer, self.peer_cert)
        if self._open_streams is None:
            streams: set[str] = {f"{self._target.scope}/{self._target.stream}"}
        else:
            streams = set(self._open_streams)  # none yet: the client is only identified
        for name in sorted(streams):
            scope, _, stream = name.partition("/")
            refusal = self._access.check(stream_resource(scope, stream), Permission.READ_UPDATE)
            if refusal is not None:
                raise AccessDenied(refusal)

    def _refuse(self, seqs: tuple[int, ...], payloads: tuple[bytes, ...]) -> None:
        """Raise the error for the first event over a limit (the event or pending bytes)."""
        pending = self._pending_bytes
        for seq, payload in zip(seqs, payloads, strict=True):
            size = len(payload)
            if size > MAX_EVENT_BYTES:
                raise RemoteProtocolError(
                    f"event seq {seq} of {size} bytes exceeds the "
                    f"{MAX_EVENT_BYTES}-byte event limit"
                )
            pending += size
            if pending > self._config.max_pending_bytes:
                raise RemoteProtocolError(
                    f"more than {self._config.max_pending_bytes} bytes of events await an ack "
                    "on this connection (window too large for max_pending_bytes)"
                )
        raise AssertionError("no event over a limit")  # pragma: no cover

    # ------------------------------------------------------------------ storing

    async def handle(self, event: object) -> None:
        assert isinstance(event, _Window)
        window = event
        try:
            try:
                async with asyncio.timeout(self._config.max_ack_wait_s):  # no task of its own
                    await self._store(window)
            except TimeoutError:
                raise TimeoutError(
                    f"window (ack {window.ack_seq}) not durable after "
                    f"{self._config.max_ack_wait_s:.0f} s; closing without its ack"
                ) from None
            except OwnerUnavailable as exc:
                # Retriable: the acks already due go out, then the connection
                # closes without this window's (nor any later one's); the
                # client sends them again, here or to another node.
                log.warning(
                    "%s %s: window (ack %s) not acknowledged: %s; closing, the client resends",
                    self.name,
                    peer_address(self.peer),
                    window.ack_seq,
                    exc,
                )
                self.close_connection(UNAVAILABLE)
                return
        finally:
            if not window.issued.done():
                window.issued.set_result(None)
        window.durable = True
        self._ack_ready()

    async def _store(self, window: _Window) -> None:
        if window.after is not None:
            await window.after
        if not window.parts:
            await self._target.write(window.payloads, window.keys, window.issued, window.streams)
            return
        turn = self._target.next_turn()
        streams = window.streams
        start = 0
        for end, seq in window.parts:  # each durable before the next is issued
            issued = asyncio.get_running_loop().create_future()
            payloads, keys = window.payloads[start:end], window.keys[start:end]
            part = None if streams is None else streams[start:end]
            await self._target.write(payloads, keys, issued, part, turn)
            start = end
            window.partial_seq = seq
            self._ack_ready()
            self.wake_writer()
        payloads, keys = window.payloads[start:], window.keys[start:]
        rest = None if streams is None else streams[start:]
        await self._target.write(payloads, keys, window.issued, rest, turn)

    # ------------------------------------------------------------------ acking

    def _ack_ready(self) -> None:
        """Queue the acks of every durable window at the head of the FIFO."""
        while self._windows and self._windows[0].durable:
            window = self._windows.popleft()
            self._pending_bytes -= window.size_bytes
            if window.ack_seq is None:
                continue  # a lingering part: its window's ack comes later
            if self._failed:
                # The windows that closed before the bad input are whole and
                # stored: ack them before closing (fewer resends). The failed
                # connection object refuses sends, so encode the frame here.
                assert self._conn.version is not None
                self._late_acks += encode_frame(self._conn.version, Ack(window.ack_seq))
            else:
                self._conn.send(Ack(window.ack_seq))
            self._last_write_s = asyncio.get_running_loop().time()
        if not self._windows or self._failed:
            return
        head = self._windows[0]  # the oldest window awaiting its ack
        if head.partial_seq > head.partial_sent:
            head.partial_sent = head.partial_seq
            self._conn.send(Ack(head.partial_seq))  # every event up to it is durable
            self._last_write_s = asyncio.get_running_loop().time()

    def data_to_send(self) -> bytes:
        data = self._conn.data_to_send() + self._late_acks
        self._late_acks = b""
        return data

    def on_start(self) -> None:
        now = asyncio.get_running_loop().time()
        self._last_write_s = self._last_data_s = now
        self._keepalive = asyncio.create_task(self._timer_loop(), name=f"{self.name}-timer")

    async def _timer_loop(self) -> None:
        """The connection's clock: v2 keepalives and the window linger.

        * v2: ``Ack(0)`` after ``keepalive_interval_s`` without a write while
          anything awaits an ack.
        * An open window with events that received nothing for
          ``window_linger_s`` has those events stored (``_linger``).
        """
        loop = asyncio.get_running_loop()
        interval = self._config.keepalive_interval_s
        linger_s = self._config.window_linger_s
        while True:
            now = loop.time()
            lingering = bool(linger_s and self._open_payloads and not self._failed)
            deadline = self._last_write_s + interval
            if lingering:
                deadline = min(deadline, self._last_data_s + linger_s)
            if deadline > now:
                self._timer_wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._timer_wake.wait(), deadline - now)
                continue
            if lingering and now >= self._last_data_s + linger_s:
                self._linger()
            if now >= self._last_write_s + interval:
                if (
                    self._conn.version is ProtocolVersion.V2
                    and self._conn.awaiting_ack
                    and not self._failed
                    and self._broken is None
                ):
                    self._conn.send(Ack(0))
                    self.wake_writer()
                self._last_write_s = now

    def _linger(self) -> None:
        """Store the open window's events so far; its ack still waits for the rest."""
        part = _Window(
            None,
            self._open_payloads,
            self._open_keys,
            self._open_streams,
            self._open_bytes,
            after=self._last_issued,
        )
        self._last_issued = part.issued
        self._open_payloads, self._open_keys, self._open_bytes = [], [], 0
        if self._open_streams is not None:
            self._open_streams = []
        self._open_parts, self._part_bytes = [], 0  # what lingers is stored in one go
        self._windows.append(part)
        task = asyncio.create_task(self._store_part(part), name=f"{self.name}-linger")
        self._parts.add(task)
        task.add_done_callback(self._parts.discard)
        log.debug("%s: storing %d events of an incomplete window", self.name, len(part.payloads))

    async def _store_part(self, part: _Window) -> None:
        try:
            await asyncio.wait_for(self._store(part), self._config.max_ack_wait_s)
        except Exception as exc:
            # Never durable: no later window of this connection is acked, and
            # the next bytes from the client close the connection.
            log.warning(
                "%s: storing %d events of an incomplete window failed: %r",
                self.name,
                len(part.payloads),
                exc,
            )
            self._broken = exc
            return
        finally:
            if not part.issued.done():
                part.issued.set_result(None)
        part.durable = True
        self._ack_ready()
        self.wake_writer()

    async def on_close(self) -> None:
        if self._keepalive is not None:
            self._keepalive.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._keepalive
        if self._parts:
            # Lingering parts are kept even if the client went away: finish them.
            _, late = await asyncio.wait(set(self._parts), timeout=self._config.max_ack_wait_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        for window in self._windows:
            if not window.issued.done():
                window.issued.set_result(None)


# --------------------------------------------------------------------------- listeners


async def _start(ctx: ListenerContext, name: str, host: str, port: int, *, tls: bool) -> Listener:
    config = ctx.config.lumberjack
    ssl_context = None
    if tls:
        ssl_context = ctx.ssl_context()
        if ssl_context is None:
            raise RuntimeError(f"the {name} listener needs --tls-cert and --tls-key")
    target = LumberjackTarget(ctx, config, name)
    return await start_tcp_listener(
        name,
        host,
        port,
        lambda: LumberjackHandler(target, config, name, auth=ctx.door_auth, tls=tls),
        settings=ctx.settings,
        ssl_context=ssl_context,
        idle_timeout_s=config.idle_timeout_s,
        max_pending_events=MAX_WINDOWS_IN_FLIGHT,
    )


async def start_lumberjack(ctx: ListenerContext, host: str, port: int) -> Listener:
    """Serve Lumberjack v1/v2 on (host, port) into the configured target stream:
    over TLS when the listener is a ``tls`` one (``lumberjack_tls``, or a
    ``--listener lumberjack=tls://...``), else in plaintext (a listener started
    apart, with the app's shared context, is plain).

    Raises:
        ConfigError: the certificate or key cannot be loaded.
    """
    spec = ctx.listener
    tls = spec is not None and spec.tls
    return await _start(ctx, ctx.listener_name("lumberjack"), host, port, tls=tls)
