"""The read side of one connection: where received bytes land, and the limits on them.

``Reader``: the kernel copies received bytes into the listener's one receive
buffer, shared by its connections (each read is fed to its handler before
the next), so an idle connection holds no buffer of its own. A handler
holding a large frame received in part may offer the rest of that frame's
buffer instead (``frame_buffer``): the kernel then writes the frame's
remaining bytes where they will be decoded. Reading pauses while any reason
holds it back (a backlog of events, the spent memory budget) and stops for
good when the connection ends.

``Watchdog``: the limits on what the peer sends and when. A frame still
arriving may hold at most ``max_frame_bytes`` and must be complete within
``partial_frame_timeout_s`` of its first byte; a connection that sends
nothing for the idle timeout is closed (unless its handler is ``busy``), and
so is one that sent no whole request within ``first_request_timeout_s`` of
opening, where its front door sets one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from headrace.server._loop import ConnectionHandler, ConnectionLimits

__all__ = ["Reader", "Watchdog"]

log = logging.getLogger("headrace.server._loop")
"""The loop's logger: a connection's lines come from one logger, whichever part logs."""


class Reader:
    """Where a connection's received bytes land, and whether it reads.

    Args:
        receive_buffer: the listener's shared receive buffer.
    """

    __slots__ = (
        "_direct",
        "_early",
        "_handler",
        "_paused_for",
        "_shared",
        "_transport",
        "early_eof",
        "receiving",
    )

    def __init__(self, receive_buffer: memoryview) -> None:
        self._shared = receive_buffer
        self._handler: ConnectionHandler | None = None
        self._transport: asyncio.Transport | None = None
        self.receiving = False  # the handler is set up and takes bytes
        self._direct = False  # the last get_buffer gave the handler's frame_buffer
        self._paused_for: set[str] = set()  # why reading is paused: "backlog", "budget"
        self._early = bytearray()  # bytes received before the handler started (TLS)
        self.early_eof = False  # the peer closed its side before the handler started

    def start(self, handler: ConnectionHandler, transport: asyncio.Transport) -> bytes:
        """Feed ``handler`` from ``transport`` from now on; the bytes that came before."""
        self._handler = handler
        self._transport = transport
        self.receiving = True
        if not self._early:
            return b""
        early, self._early = bytes(self._early), bytearray()
        return early

    def stop(self) -> None:
        """Take no more bytes."""
        self.receiving = False

    def get_buffer(self) -> memoryview:
        """Where the kernel should put the next bytes it receives."""
        handler = self._handler
        if handler is not None and self.receiving:
            direct = handler.frame_buffer()
            if direct is not None:
                self._direct = True
                return direct
        self._direct = False
        return self._shared

    def landed(self, nbytes: int) -> memoryview | None:
        """The ``nbytes`` just received, or None when they went to the handler's
        ``frame_buffer``. The view is valid until the next receive."""
        if self._direct:
            self._direct = False
            return None
        return self._shared[:nbytes]

    def keep_early(self, nbytes: int) -> None:
        """TLS: the peer's first bytes can arrive in the round between the end of
        the handshake and the handler's start; they are kept for it."""
        self._early += self._shared[:nbytes]

    def pause(self, why: str) -> None:
        """Stop reading for ``why`` (until ``resume(why)``; reasons add up)."""
        if not self._paused_for and self._transport is not None:
            self._transport.pause_reading()
        self._paused_for.add(why)

    def resume(self, why: str) -> None:
        """``why`` no longer holds reading back; read again if nothing else does."""
        if why not in self._paused_for:
            return
        self._paused_for.discard(why)
        if not self._paused_for and self.receiving and self._transport is not None:
            self._transport.resume_reading()


class Watchdog:
    """Closes a connection whose peer sends too much, too slowly, or nothing.

    One timer handle each, not one per read: the idle timer is not moved by
    every read; when it fires early it looks at the last read and sets
    itself again.

    Args:
        loop: the running loop.
        reader: whether the connection still reads (a timer that fires after
            it stopped does nothing).
        limits: ``max_frame_bytes`` and ``partial_frame_timeout_s``.
        idle_timeout_s: longest the peer may send nothing.
        opened_at: when the connection opened (the loop's clock).
        first_request_timeout_s: longest until a whole request (None: no limit).
        counts: the connection's counts (``"requests"`` so far).
        end: ends the connection with a reason.
    """

    __slots__ = (
        "_counts",
        "_end",
        "_first_request_by",
        "_first_request_timeout_s",
        "_first_request_timer",
        "_handler",
        "_idle_s",
        "_idle_timer",
        "_limits",
        "_loop",
        "_partial_timer",
        "_peer",
        "_reader",
        "last_received",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        reader: Reader,
        limits: ConnectionLimits,
        *,
        idle_timeout_s: float,
        opened_at: float,
        first_request_timeout_s: float | None,
        counts: dict[str, int],
        end: Callable[[str], None],
    ) -> None:
        self._loop = loop
        self._reader = reader
        self._limits = limits
        self._idle_s = idle_timeout_s
        self._first_request_timeout_s = first_request_timeout_s
        self._first_request_by = (
            None if first_request_timeout_s is None else opened_at + first_request_timeout_s
        )
        self._counts = counts
        self._end = end
        self._handler: ConnectionHandler | None = None
        self._peer: object = None
        self.last_received = opened_at
        """When the peer last sent bytes (or a wait of ours ended): the idle clock."""
        self._idle_timer: asyncio.TimerHandle | None = None
        self._partial_timer: asyncio.TimerHandle | None = None  # runs while a frame arrives
        self._first_request_timer: asyncio.TimerHandle | None = None

    def start(self, handler: ConnectionHandler, peer: object) -> None:
        """The handler takes bytes: the idle and first-request clocks run."""
        self._handler = handler
        self._peer = peer
        self._idle_timer = self._loop.call_at(self.last_received + self._idle_s, self._idle)
        if self._first_request_by is not None:
            self._first_request_timer = self._loop.call_at(
                self._first_request_by, self._no_first_request
            )

    def stop(self) -> None:
        for timer in (self._idle_timer, self._partial_timer, self._first_request_timer):
            if timer is not None:
                timer.cancel()

    def received(self) -> None:
        """Bytes were fed to the handler: look at the first request and the frame arriving."""
        if self._first_request_timer is not None and self._counts["requests"]:
            self._first_request_timer.cancel()
            self._first_request_timer = None
        handler = self._handler
        assert handler is not None
        partial = handler.partial_frame_bytes()
        if partial > self._limits.max_frame_bytes:
            log.warning(
                "%s %s: a frame over %d bytes; closing",
                handler.name,
                self._peer,
                self._limits.max_frame_bytes,
            )
            self._end("frame_too_large")
        elif partial == 0:
            if self._partial_timer is not None:
                self._partial_timer.cancel()
                self._partial_timer = None
        elif self._partial_timer is None:
            self._partial_timer = self._loop.call_later(
                self._limits.partial_frame_timeout_s, self._partial_frame_timeout
            )

    def _idle(self) -> None:
        handler = self._handler
        if not self._reader.receiving or handler is None:
            return
        now = self._loop.time()
        idle_at = self.last_received + self._idle_s
        if now < idle_at:
            self._idle_timer = self._loop.call_at(idle_at, self._idle)
            return
        if handler.busy():
            self.last_received = now
            self._idle_timer = self._loop.call_at(now + self._idle_s, self._idle)
            return
        log.info("%s %s: idle for %.0f s; closing", handler.name, self._peer, self._idle_s)
        self._end("idle")

    def _partial_frame_timeout(self) -> None:
        handler = self._handler
        if not self._reader.receiving or handler is None:
            return
        log.info(
            "%s %s: a frame took over %.0f s to arrive; closing",
            handler.name,
            self._peer,
            self._limits.partial_frame_timeout_s,
        )
        self._end("partial_frame_timeout")

    def _no_first_request(self) -> None:
        handler = self._handler
        if not self._reader.receiving or handler is None or self._counts["requests"]:
            return
        log.info(
            "%s %s: no request within %.1f s; closing",
            handler.name,
            self._peer,
            self._first_request_timeout_s,
        )
        self._end("first_request_timeout")
