"""The server-wide budget of buffered bytes, and one connection's account with it.

Every connection charges what it holds (a frame still arriving, replies its
handler holds, reply bytes its transport holds for the peer) to one
``MemoryBudget`` shared by every listener (``--max-total-buffered-bytes``).
Once the total is over the bound, a connection that holds bytes and receives
more stops reading until the total is back under it; one that holds nothing
never waits. A connection keeps its charge in a ``BudgetAccount``: it
measures what it holds after each receive and each write, and tells the
budget only when that changed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final

__all__ = ["BUDGET_RECHECK_S", "MAX_TOTAL_BUFFERED_BYTES", "BudgetAccount", "MemoryBudget"]

MAX_TOTAL_BUFFERED_BYTES: Final = 256 * 1024 * 1024
"""Bytes all connections of a server may hold together (frames still arriving,
replies not taken) before reading pauses. Every per-connection limit holds on
its own, but a thousand connections each within them add up to gigabytes; one
bound on the sum (Kafka's ``queued.max.request.bytes``) keeps the server under
1 GiB however many peers announce large frames or stop reading. Four frames
of ``_loop.MAX_FRAME_BYTES`` (sixteen of Pravega's largest), so large appends from
many writers still flow; it must be at least ``MAX_FRAME_BYTES``, or a frame
that large could never be received whole."""

BUDGET_RECHECK_S: Final = 0.1
"""How often a spent ``MemoryBudget`` looks again at what each connection holds
while connections wait for it: a transport's buffer drains into the socket
without a callback, so what a connection last reported can be stale."""


class MemoryBudget:
    """Bytes held by every connection of a server, against one bound.

    Connections report what they ``hold`` as it changes. A connection that
    holds bytes and receives more while the budget is ``spent`` stops
    reading and ``wait``s: every waiting connection is resumed, in the order
    they stopped, as soon as the total is back under the bound. While some
    wait, what every holder holds is looked at again each
    ``BUDGET_RECHECK_S`` (a transport's buffer drains without telling the
    loop). Pauses are counted for the metrics (``headrace_read_pauses_total``).

    Args:
        capacity_bytes: the bound (``MAX_TOTAL_BUFFERED_BYTES``).
    """

    __slots__ = (
        "_holders",
        "_recheck",
        "_resume_scheduled",
        "_waiting",
        "capacity_bytes",
        "in_use_bytes",
        "pauses",
    )

    def __init__(self, capacity_bytes: int = MAX_TOTAL_BUFFERED_BYTES) -> None:
        self.capacity_bytes = capacity_bytes
        self.in_use_bytes = 0
        self.pauses = 0
        self._holders: dict[object, tuple[int, Callable[[], None]]] = {}
        self._waiting: dict[object, Callable[[], None]] = {}
        self._resume_scheduled = False
        self._recheck: asyncio.TimerHandle | None = None

    @property
    def spent(self) -> bool:
        return self.in_use_bytes > self.capacity_bytes

    def hold(self, key: object, held_bytes: int, recheck: Callable[[], None]) -> None:
        """``key`` holds ``held_bytes`` now; ``recheck()`` makes it say so again."""
        entry = self._holders.pop(key, None)
        before = 0 if entry is None else entry[0]
        if held_bytes:
            self._holders[key] = (held_bytes, recheck)
        self.in_use_bytes += held_bytes - before
        if held_bytes < before and self._waiting and not self.spent:
            self._schedule_resume()

    def wait(self, key: object, resume: Callable[[], None]) -> None:
        """``key`` stopped reading; ``resume()`` once the budget is under its bound."""
        if key in self._waiting:
            return
        self.pauses += 1
        self._waiting[key] = resume
        if self._recheck is None:
            self._recheck = asyncio.get_running_loop().call_later(
                BUDGET_RECHECK_S, self._look_again
            )

    def forget(self, key: object) -> None:
        """``key`` went away: it holds nothing and is never resumed."""
        self._waiting.pop(key, None)
        self.hold(key, 0, _nothing)

    def _schedule_resume(self) -> None:
        if not self._resume_scheduled:
            self._resume_scheduled = True
            asyncio.get_running_loop().call_soon(self._resume)

    def _look_again(self) -> None:
        self._recheck = None
        if not self._waiting:
            return
        for _, recheck in list(self._holders.values()):
            recheck()
        if self.spent:
            self._recheck = asyncio.get_running_loop().call_later(
                BUDGET_RECHECK_S, self._look_again
            )
        else:
            self._schedule_resume()

    def _resume(self) -> None:
        self._resume_scheduled = False
        if self.spent:
            return  # spent again meanwhile: a later release (or look) resumes them
        waiting, self._waiting = self._waiting, {}
        for resume in waiting.values():
            resume()


def _nothing() -> None:
    return None


class BudgetAccount:
    """What one connection holds, as it last told its ``MemoryBudget``.

    ``update`` measures again (``measure()``) and tells the budget if the
    figure changed; the budget calls it too when it looks again at every
    holder. ``close`` takes the connection off the budget for good.

    Args:
        budget: the server's budget; None: no bound on the sum (nothing is told).
        measure: the bytes the connection holds now.
    """

    __slots__ = ("_closed", "_measure", "budget", "held_bytes")

    def __init__(self, budget: MemoryBudget | None, measure: Callable[[], int]) -> None:
        self.budget = budget
        self.held_bytes = 0  # what the budget was last told
        self._measure = measure
        self._closed = False  # it told the budget its end: it tells nothing more

    def update(self) -> None:
        """Tell the budget what the connection holds now, if that changed."""
        budget = self.budget
        if budget is None or self._closed:
            return
        held = self._measure()
        if held != self.held_bytes:
            self.held_bytes = held
            budget.hold(self, held, self.update)

    def wait(self, resume: Callable[[], None]) -> None:
        """The connection stopped reading; ``resume()`` once the budget is under its bound."""
        assert self.budget is not None
        self.budget.wait(self, resume)

    def close(self) -> None:
        """The connection is done: it holds nothing more and waits for nothing."""
        if self.budget is not None and not self._closed:
            self._closed = True
            self.held_bytes = 0
            self.budget.forget(self)
