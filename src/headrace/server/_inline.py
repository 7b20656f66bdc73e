"""Starting a coroutine in the caller, and a task only if it suspends: ``start_inline``.

The connection loop starts an ``inline`` event (a Pravega append) in the
receive callback itself, so an append the store acknowledges without
waiting is read, handled and answered in one callback, with no task made.
This is what Python 3.12's eager tasks do; see ``start_inline`` for why
the loop steps the coroutine by hand instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Coroutine, Generator
from typing import Any, Generic, TypeVar

__all__ = ["start_inline", "step_now"]

T = TypeVar("T")


def start_inline(coro: Coroutine[object, None, None]) -> asyncio.Task[None] | None:
    """Run ``coro``'s first step now; None if it finished, else a task that runs the rest.

    What a Task does with a coroutine, minus the round it waits before the
    first step. The first step runs in the caller's task and context, so a
    coroutine started here must use neither ``asyncio.current_task`` nor
    ``asyncio.timeout`` before it first suspends.

    Why by hand: eager tasks (``asyncio.eager_task_factory``) appeared in
    Python 3.12 and the project supports 3.11, which has nothing like them.
    One code path serves every version; on 3.12 an eager task would also
    allocate a Task for every append the store acknowledges at once, which
    this does not. The stepping reaches into one asyncio internal, the
    ``_asyncio_future_blocking`` flag of a yielded future (see ``_drive``).
    """
    try:
        yielded = coro.send(None)
    except StopIteration:
        return None
    _taken(yielded)
    return asyncio.create_task(_drive(coro, yielded))


def step_now(coro: Coroutine[Any, None, T]) -> Awaitable[T]:
    """Run ``coro``'s first step now; an awaitable of its outcome.

    For a coroutine whose first step fixes an order (a store append issues
    its record there): several of them started one after the other are
    issued in that order, where ``asyncio.gather`` would start each a loop
    round later, after whatever the caller does next. The same rules as
    ``start_inline`` hold for what the first step may use.
    """
    try:
        yielded = coro.send(None)
    except StopIteration as stop:
        return _Done(stop.value, None)
    except Exception as exc:
        return _Done(None, exc)
    _taken(yielded)
    return asyncio.create_task(_drive(coro, yielded))


class _Done(Generic[T]):
    """The outcome of a coroutine that finished in its first step, to await."""

    __slots__ = ("_error", "_value")

    def __init__(self, value: Any, error: Exception | None) -> None:
        self._value = value
        self._error = error

    def __await__(self) -> Generator[Any, None, T]:
        if self._error is not None:
            raise self._error
        value: T = self._value
        return value
        yield  # a generator, as ``__await__`` must return


def _taken(yielded: object) -> None:
    """Mark a future a coroutine yielded as taken by its driver, as a Task does at once:
    a future still marked refuses the next coroutine that awaits it."""
    if isinstance(yielded, asyncio.Future):
        yielded._asyncio_future_blocking = False


async def _drive(coro: Coroutine[Any, None, T], yielded: object) -> T:
    """Drive ``coro`` on from what its last step yielded, as its Task would.

    A future it yielded is awaited here (its outcome stays in it: the
    coroutine reads it when resumed), so this task wakes in the same round
    the coroutine's own task would, and cancelling this task cancels that
    future, as a Task does. A bare ``yield`` (``sleep(0)``) is one round.
    """
    while True:
        thrown: BaseException | None = None
        if yielded is None:
            try:
                await asyncio.sleep(0)
            except asyncio.CancelledError as exc:
                thrown = exc
        elif isinstance(yielded, asyncio.Future):
            try:
                await yielded
            except asyncio.CancelledError as exc:
                # The future itself cancelled (by this task's cancel or another
                # waiter's): the coroutine sees it when resumed. Cancelled with the
                # future already done: throw it in, as a Task does.
                if not yielded.cancelled():
                    thrown = exc
            except Exception:  # the coroutine reads it from the future
                pass
        else:  # what a Task does with a stray yield
            thrown = RuntimeError(f"a coroutine run inline yielded {yielded!r}")
        try:
            yielded = coro.send(None) if thrown is None else coro.throw(thrown)
        except StopIteration as stop:
            result: T = stop.value
            return result
        _taken(yielded)
