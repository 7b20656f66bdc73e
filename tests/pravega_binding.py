"""Test-only: driving the real ``pravega`` client's async reads without stalling it.

The binding's blocking calls (``write_event``, ``flush``, ``release_segment``,
``create_stream``, ...) hold the GIL while they wait for the client's tokio
worker threads. Its only read call, ``get_segment_slice_async``, completes
the Python future from a worker thread through the event loop's
``call_soon_threadsafe``. That call queues the callback, then writes a byte to
the loop's self-pipe, releasing the GIL around the write, and needs the GIL
back to return. The loop thread wakes, runs the callback, and the script goes
on into a blocking call with the GIL held. The worker then waits for the GIL
inside one of its tasks until that blocking call returns, and the call may
be waiting for a task stuck behind that worker. That is a stall until the
client's 30 s request timeout, and under a short token TTL a retry with an
expired token the client never refreshes (seen in
``tests/pravega/test_auth_real_client.py`` under CPU load: the server sent
the AppendSetup within a millisecond; the client never read it).

So scripts read through ``read_slice`` inside ``run``. The loop counts the
worker threads inside ``call_soon_threadsafe``, and ``read_slice`` waits,
with the GIL released and bounded, until none is left before it calls
``release_segment`` and returns to code that may block.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Final, TypeVar

SETTLE_TIMEOUT_S: Final = 30.0
"""Bound on waiting for the client's worker threads to leave ``call_soon_threadsafe``
(they need only the GIL to do so)."""

T = TypeVar("T")


class SettlingLoop(asyncio.SelectorEventLoop):
    """An event loop that knows when no thread is inside ``call_soon_threadsafe``."""

    def __init__(self) -> None:
        super().__init__()
        self._inside = 0
        self._changed = threading.Condition()

    def call_soon_threadsafe(  # type: ignore[override]
        self, callback: Callable[..., object], *args: Any, context: Any = None
    ) -> asyncio.Handle:
        with self._changed:
            self._inside += 1
        try:
            return super().call_soon_threadsafe(callback, *args, context=context)
        finally:
            with self._changed:
                self._inside -= 1
                self._changed.notify_all()

    def settle(self, timeout_s: float = SETTLE_TIMEOUT_S) -> None:
        """Wait, GIL released, until no other thread is inside ``call_soon_threadsafe``.

        Raises:
            TimeoutError: a thread stayed inside for ``timeout_s``.
        """
        with self._changed:
            if not self._changed.wait_for(lambda: self._inside == 0, timeout_s):
                raise TimeoutError(f"a client thread stayed in call_soon_threadsafe {timeout_s} s")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on a ``SettlingLoop``, settled before the loop closes."""
    with asyncio.Runner(loop_factory=SettlingLoop) as runner:
        result = runner.run(coro)
        loop = runner.get_loop()
        assert isinstance(loop, SettlingLoop)
        loop.settle()
        return result


async def read_slice(reader: Any) -> list[bytes]:
    """The events of the reader's next segment slice (empty after the client's
    wait of about a second), the slice released; for use under ``run``."""
    slice_ = await reader.get_segment_slice_async()
    loop = asyncio.get_running_loop()
    if not isinstance(loop, SettlingLoop):
        raise TypeError("read_slice must run under tests.pravega_binding.run")
    loop.settle()
    events = [bytes(event.data()) for event in slice_]
    reader.release_segment(slice_)
    return events
