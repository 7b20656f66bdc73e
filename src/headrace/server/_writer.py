"""The write side of one connection: the one path replies take to the peer.

A handler queues replies; its ``output`` hands them over as a list of
pieces, written in order. Bytes are written to the transport (runs of small
pieces joined into one write, large ones as they are, never copied); a
``FileRegion`` goes out with ``sendfile`` from the store's data file on a
plain TCP connection, or is read and written on a TLS one. Every region is
closed once sent or when the connection ends before it could be.

``flush`` takes the handler's output and writes it at once when nothing is
in the way: no region among it, the writer task idle, nothing queued before
it. Otherwise the pieces join the queue and the writer task sends them:
what may wait (a region, the drain) is done there, in the same order. The
task also drains the transport, so a peer that does not read is slowed, and
closes a connection whose peer leaves more than ``max_buffered_bytes``
untaken. Replies due together go out in one write: ``hold`` keeps them back
until the end of a receive callback (``release``), and ``flush_soon`` until
the callbacks ready now have run.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from headrace.types import FileRegion

if TYPE_CHECKING:
    from headrace.server._loop import ConnectionHandler, OutputPiece

__all__ = ["CLOSE_FLUSH_TIMEOUT_S", "JOIN_BELOW_BYTES", "Writer"]

log = logging.getLogger("headrace.server._loop")
"""The loop's logger: a connection's lines come from one logger, whichever part logs."""

JOIN_BELOW_BYTES = 64 * 1024
"""Adjacent output pieces smaller than this are joined into one write (one
syscall); larger ones are written as they are, so a megabyte of read data is
never copied to be framed."""

CLOSE_FLUSH_TIMEOUT_S = 10.0
"""How long closing waits for queued replies to reach a peer that is not reading."""


class Writer:
    """Replies from one handler to one transport, in order, within the peer's pace.

    Args:
        loop: the running loop.
        max_buffered_bytes: reply bytes the peer may leave untaken before the
            connection is closed (``ConnectionLimits.max_buffered_bytes``).
        sent: counts bytes handed to the socket.
        recharge: tells the budget what the connection holds (after a write).
        end: ends the connection with a reason, aborting its transport.
    """

    __slots__ = (
        "_busy",
        "_closing",
        "_drain_waiter",
        "_end",
        "_flush_scheduled",
        "_handler",
        "_held",
        "_holding",
        "_loop",
        "_lost",
        "_max_buffered_bytes",
        "_paused",
        "_peer",
        "_queue",
        "_recharge",
        "_sent",
        "_task",
        "_transport",
        "_woken",
        "wake",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        max_buffered_bytes: int,
        sent: Callable[[int], None],
        recharge: Callable[[], None],
        end: Callable[[str], None],
    ) -> None:
        self._loop = loop
        self._max_buffered_bytes = max_buffered_bytes
        self._sent = sent
        self._recharge = recharge
        self._end = end
        self._handler: ConnectionHandler | None = None
        self._transport: asyncio.Transport | None = None
        self._peer: object = None
        self._woken = asyncio.Event()
        self.wake: Callable[[], None] = self._woken.set
        """Wakes the writer task: the handler's ``wake_writer``."""
        self._task: asyncio.Task[None] | None = None
        self._queue: list[OutputPiece] = []  # taken from the handler, for the task to send
        self._busy = False  # the task is sending or draining
        self._closing = False
        self._holding = False  # in a receive callback: replies wait for its end
        self._held = False  # a reply waits for the end of the receive callback
        self._flush_scheduled = False
        self._paused = False  # the transport's buffer is over its high-water mark
        self._drain_waiter: asyncio.Future[None] | None = None
        self._lost = False

    def start(self, handler: ConnectionHandler, transport: asyncio.Transport, peer: object) -> None:
        """Write ``handler``'s replies to ``transport`` (what it queued so far first)."""
        self._handler = handler
        self._transport = transport
        self._peer = peer
        self.wake()
        self._task = self._loop.create_task(self._run(), name=f"{handler.name}-writer")

    # ------------------------------------------------------------ when to write

    def hold(self) -> None:
        """Keep replies back until ``release``: the replies to every request of
        one read go out in one write (one syscall), at the end of the read."""
        self._holding = True

    def release(self) -> None:
        self._holding = False
        if self._held:
            self._held = False
            self.flush()

    def flush_soon(self) -> None:
        """``flush`` once the callbacks ready now have run, so that events
        finishing together (appends acknowledged by one sync) share one write."""
        if self._holding:
            self._held = True
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush_now)

    def _flush_now(self) -> None:
        self._flush_scheduled = False
        self.flush()

    def flush(self) -> None:
        """Write what the handler queued, straight to the transport when nothing is in the way.

        Saves the round in which the writer task would wake for a small reply.
        The task still does everything that may wait or fail: file regions,
        draining, and the ``max_buffered_bytes`` check (woken whenever the
        transport holds bytes the peer has not taken).
        """
        if self._holding:
            self._held = True
            return
        transport = self._transport
        handler = self._handler
        if transport is None or handler is None:
            return
        if self._busy or self._closing or self._queue:
            self._woken.set()
            return
        pieces = handler.output()
        if not pieces:
            return
        if transport.is_closing() or any(isinstance(piece, FileRegion) for piece in pieces):
            self._queue.extend(pieces)
            self._woken.set()
            return
        self._write(pieces)  # type: ignore[arg-type]  # no FileRegion: checked above
        if transport.get_write_buffer_size():
            self._woken.set()
        self._recharge()

    # ------------------------------------------------------------ the transport's flow control

    def pause(self) -> None:
        """The transport's buffer went over its high-water mark."""
        self._paused = True

    def resume(self) -> None:
        """The transport's buffer went under its low-water mark."""
        self._paused = False
        self._recharge()
        waiter, self._drain_waiter = self._drain_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def lost(self) -> None:
        """The connection was lost: a drain waiting ends with an error."""
        self._lost = True
        waiter, self._drain_waiter = self._drain_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(ConnectionResetError("the connection was lost"))

    async def _drain(self) -> None:
        """Wait until the transport's buffer is below its high-water mark.

        Raises:
            ConnectionResetError: the connection was lost.
        """
        if self._lost:
            raise ConnectionResetError("the connection was lost")
        if not self._paused:
            return
        waiter = self._drain_waiter = self._loop.create_future()
        await waiter

    # ------------------------------------------------------------ the writer task

    async def close(self, cancelled: bool) -> bool:
        """Send what is queued (unless ``cancelled``: the listener shuts down), then stop.

        Returns:
            Whether the closing task was cancelled, before or meanwhile.
        """
        self._closing = True
        self._woken.set()
        task = self._task
        if task is not None:
            if not cancelled:
                try:
                    await asyncio.wait_for(asyncio.shield(task), CLOSE_FLUSH_TIMEOUT_S)
                except asyncio.CancelledError:
                    cancelled = True
                except Exception:  # the task logged it; a timeout: give up the flush
                    pass
            task.cancel()
        return cancelled

    async def _run(self) -> None:
        transport = self._transport
        handler = self._handler
        assert transport is not None and handler is not None
        while True:
            await self._woken.wait()
            self._woken.clear()
            self._busy = True
            data = handler.output()
            if self._queue:
                data = self._queue + data
                self._queue.clear()
            if data or transport.get_write_buffer_size():
                try:
                    await self._send(data)
                    self._recharge()
                    if transport.get_write_buffer_size() > self._max_buffered_bytes:
                        log.warning(
                            "%s %s: more than %d reply bytes not taken; closing",
                            handler.name,
                            self._peer,
                            self._max_buffered_bytes,
                        )
                        self._end("not_reading")
                        return
                    await self._drain()
                    self._recharge()
                except ConnectionError as exc:
                    log.info(
                        "%s %s: the peer went away while sending: %s", handler.name, self._peer, exc
                    )
                    self._end("connection_error")
                    return
            self._busy = False
            if self._closing:
                if not data:
                    return
                self._woken.set()  # look again: writing may have let more replies in

    # ------------------------------------------------------------ sending pieces

    async def _send(self, pieces: list[OutputPiece]) -> None:
        """Write the pieces in order; close every region among them, sent or not."""
        try:
            run: list[bytes | bytearray | memoryview] = []
            for piece in pieces:
                if not isinstance(piece, FileRegion):
                    run.append(piece)
                    continue
                self._write(run)
                run = []
                await self._send_region(piece)
                piece.close()
            self._write(run)
        finally:
            for piece in pieces:
                if isinstance(piece, FileRegion):
                    piece.close()

    def _write(self, pieces: Iterable[bytes | bytearray | memoryview]) -> None:
        """Write pieces, joining runs of small ones into one write (one syscall)."""
        transport = self._transport
        assert transport is not None
        small: list[bytes | bytearray | memoryview] = []
        for piece in pieces:
            if len(piece) < JOIN_BELOW_BYTES:
                small.append(piece)
                continue
            if small:
                data = small[0] if len(small) == 1 else b"".join(small)
                transport.write(data)
                self._sent(len(data))
                small = []
            transport.write(piece)
            self._sent(len(piece))
        if small:
            data = small[0] if len(small) == 1 else b"".join(small)
            transport.write(data)
            self._sent(len(data))

    async def _send_region(self, region: FileRegion) -> None:
        """Write a file region: ``sendfile`` at once if the transport's buffer is
        empty, then ``loop.sendfile`` (which waits for it to empty) for the rest.

        Raises:
            ConnectionError: the peer went away (also in the middle).
        """
        transport = self._transport
        handler = self._handler
        assert transport is not None and handler is not None
        if not handler.sendfile_ok:
            data = region.read()  # TLS: the bytes must pass through the cipher
            transport.write(data)
            self._sent(len(data))
            return
        if transport.is_closing():
            raise ConnectionResetError("the connection closed before a region was sent")
        sock = transport.get_extra_info("socket")
        position, left = region.position, region.size_bytes
        if transport.get_write_buffer_size() == 0:
            try:
                count = os.sendfile(sock.fileno(), region.fd, position, left)
            except BlockingIOError:
                count = 0
            except OSError as exc:
                raise ConnectionResetError(f"sendfile failed: {exc}") from exc
            position += count
            left -= count
            self._sent(count)
        if not left:
            return
        # A file object over the region's own fd (no I/O here): loop.sendfile wants one.
        with open(region.fd, "rb", buffering=0, closefd=False) as file:  # noqa: ASYNC230
            file.seek(position)
            try:
                count = await self._loop.sendfile(transport, file, position, left, fallback=False)
            except (OSError, RuntimeError) as exc:  # RuntimeError: the transport closed
                self._sent(max(file.tell() - position, 0))  # what went out before the error
                raise ConnectionResetError(f"sendfile stopped: {exc}") from exc
        self._sent(count)
