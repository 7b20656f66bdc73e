"""The request pipeline of one connection: how its events are run through the handler.

Each event runs in its own task, so one parked read (a long-poll at the
tail) never stalls appends on the same connection. Tasks start in arrival
order and a handler's first step runs before any later task's, so a handler
that issues its store call before its first ``await`` keeps the wire order
(the store fixes an append's offset when it is issued). Events whose
handler says they are ``sequential`` wait for the sequential event before
them to finish; unless both are ``pipelined`` (TANK produces): then the
later one starts as soon as its turn comes, behind the earlier one's first
step, and the handler keeps their order itself. So a connection's pipelined
appends are all issued at once and one sync serves them all, where waiting
for each to finish would cost one sync each. An ``inline`` event (a Pravega
append, a TANK produce) skips the task: its first step runs at once, in the
receive callback (``start_inline``), and a task carries on only if it suspends.

At most ``max_pending`` events of a connection run at once. The events of a
read that reached the limit wait in a backlog (the listener's receive buffer
is shared, so they are all taken from it at once) and reading pauses until
the backlog has started. A protocol error after backlogged events is
reported once they have started. When an event finishes, its replies are
flushed: at once when it was the last one running, else once the callbacks
ready now have run, so replies due together share one write.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from headrace.errors import RemoteProtocolError
from headrace.server._inline import start_inline

if TYPE_CHECKING:
    from headrace.server._loop import ConnectionHandler, ConnectionObserver
    from headrace.server._reader import Reader
    from headrace.server._writer import Writer

__all__ = ["Pipeline"]


class Pipeline:
    """Starts a connection's events in order, a bounded number at a time.

    Args:
        loop: the running loop.
        reader: pauses reading while a backlog waits.
        writer: flushes the replies of each event that finishes.
        max_pending: events handled at once (``ConnectionLimits.max_pending_requests``).
        counts: the connection's counts; each event adds one to ``"requests"``.
        observer: where requests are counted for the metrics (None: nowhere).
        protocol_error: what the connection does when the peer broke the protocol.
        handler_failed: what it does when handling an event raised.
    """

    __slots__ = (
        "_backlog",
        "_backlog_error",
        "_backlog_scheduled",
        "_counts",
        "_drop_backlog",
        "_handler",
        "_handler_failed",
        "_loop",
        "_max_pending",
        "_observer",
        "_pending",
        "_previous",
        "_previous_after",
        "_previous_pipelined",
        "_protocol_error",
        "_reader",
        "_tasks",
        "_unstarted",
        "_writer",
    )

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        reader: Reader,
        writer: Writer,
        *,
        max_pending: int,
        counts: dict[str, int],
        observer: ConnectionObserver | None,
        protocol_error: Callable[[RemoteProtocolError], None],
        handler_failed: Callable[[object, Exception], None],
    ) -> None:
        self._loop = loop
        self._reader = reader
        self._writer = writer
        self._max_pending = max_pending
        self._counts = counts
        self._observer = observer
        self._protocol_error = protocol_error
        self._handler_failed = handler_failed
        self._handler: ConnectionHandler | None = None
        self._pending = 0  # events being handled
        self._tasks: set[asyncio.Task[None]] = set()
        self._previous: asyncio.Task[None] | None = None  # the last sequential event's task
        self._previous_pipelined = False  # it is ``pipelined``
        self._previous_after: asyncio.Task[None] | None = None  # the task it waited for
        self._unstarted = False  # a task made for an event has not run its first step yet
        self._backlog: collections.deque[object] = collections.deque()
        self._backlog_error: RemoteProtocolError | None = None
        self._backlog_scheduled = False
        self._drop_backlog = False  # reading stopped, not at EOF: backlogged events never run

    def start(self, handler: ConnectionHandler) -> None:
        self._handler = handler

    def feed(self, data: bytes | memoryview | None, nbytes: int = 0) -> None:
        """Feed received bytes (``b""``: EOF; None: ``nbytes`` into the handler's
        ``frame_buffer``) to the handler and start the events."""
        handler = self._handler
        assert handler is not None
        try:
            if data is None:
                events = iter(handler.frame_received(nbytes))
            else:
                # A view, typed as the handlers' ``bytes`` (they only copy it into
                # their sans-I/O buffers; see "Reading" in ``_loop``).
                events = iter(handler.feed(cast("bytes", data)))
            for event in events:
                self._counts["requests"] += 1
                if self._observer is not None:
                    self._observer.request_received()
                if self._pending >= self._max_pending or self._backlog:
                    # The limit is reached: take every event of these bytes now (the
                    # receive buffer is shared) and read nothing more until they ran.
                    self._backlog.append(event)
                    if data != b"":  # not at EOF
                        self._reader.pause("backlog")
                    continue
                self._dispatch(event)
        except RemoteProtocolError as exc:
            if self._backlog:
                self._backlog_error = exc  # after the events before it
            else:
                self._protocol_error(exc)

    def stop(self, *, at_eof: bool) -> None:
        """Reading stopped. At EOF backlogged events still run (a client that
        half-closes after its last request gets its replies); else they never do."""
        self._drop_backlog = not at_eof

    @property
    def running(self) -> bool:
        """Whether events are being handled or wait in the backlog."""
        return bool(self._tasks or self._backlog)

    async def progress(self) -> None:
        """Wait until an event's task finishes (with only a backlog: one round)."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), return_when=asyncio.FIRST_COMPLETED)
        elif self._backlog:
            await asyncio.sleep(0)  # _run_backlog is scheduled

    async def cancel(self) -> bool:
        """Cancel the events still being handled, wait for them, drop the backlog.

        Returns:
            Whether the waiting task was cancelled meanwhile.
        """
        cancelled = False
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            try:
                await asyncio.gather(*self._tasks, return_exceptions=True)
            except asyncio.CancelledError:
                cancelled = True
        self._backlog.clear()
        return cancelled

    def _dispatch(self, event: object) -> None:
        """Start handling ``event``: inline when allowed, else in a task of its own."""
        assert self._handler is not None
        self._pending += 1
        sequential = self._handler.sequential(event)
        pipelined = False
        after: asyncio.Task[None] | None = None
        if sequential:
            pipelined = self._handler.pipelined(event)
            if pipelined and self._previous_pipelined:
                # Started in order behind the one before, the handler keeps their
                # order itself: wait only for what that one waits for.
                after = self._previous_after
            else:
                after = self._previous
            if _finished(after):
                after = None
        task: asyncio.Task[None] | None
        if after is None and not self._unstarted and self._handler.inline(event):
            # Nothing it must follow is left undone: start it here, in order.
            task = start_inline(self._run(event, None))
        else:
            task = self._loop.create_task(self._run(event, after))
            if not self._unstarted:
                # Scheduled after the task's first step: until it runs, later
                # events must not start inline ahead of that step.
                self._unstarted = True
                self._loop.call_soon(self._all_started)
        if task is not None:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if sequential:
            self._previous = task
            self._previous_pipelined = pipelined
            self._previous_after = after

    def _all_started(self) -> None:
        self._unstarted = False

    async def _run(self, event: object, after: asyncio.Task[None] | None) -> None:
        handler = self._handler
        assert handler is not None
        try:
            if after is not None:
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await asyncio.shield(after)
            await handler.handle(event)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._handler_failed(event, exc)
        finally:
            self._pending -= 1
            if self._backlog and not self._backlog_scheduled:
                self._backlog_scheduled = True
                self._loop.call_soon(self._run_backlog)
            if self._pending == 0:
                self._writer.flush()
            else:
                self._writer.flush_soon()

    def _run_backlog(self) -> None:
        """Start backlogged events while there is room; read again once none is left."""
        self._backlog_scheduled = False
        if self._drop_backlog:
            self._backlog.clear()
            return
        while self._backlog and self._pending < self._max_pending:
            self._dispatch(self._backlog.popleft())
        if self._backlog:
            return  # the next event to finish calls again
        if self._backlog_error is not None:
            exc, self._backlog_error = self._backlog_error, None
            self._protocol_error(exc)
        elif self._reader.receiving:
            self._reader.resume("backlog")


def _finished(task: asyncio.Task[None] | None) -> bool:
    return task is None or task.done()
