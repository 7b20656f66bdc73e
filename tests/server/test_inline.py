"""``start_inline``: a coroutine's first step in the caller, the rest as its own task would run.

The connection loop starts every ``inline`` event with it (``server/_pipeline.py``);
these pin down that a coroutine driven this way sees what it would see in a Task
of its own: the same results, exceptions, cancellation and wake-up rounds.
"""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from headrace.server._inline import start_inline, step_now

WAIT_S = 10.0  # bound on every wait in these tests


async def test_a_coroutine_that_never_suspends_runs_in_the_call_without_a_task() -> None:
    done: list[str] = []

    async def quick() -> None:
        done.append("ran")

    assert start_inline(quick()) is None
    assert done == ["ran"]


async def test_the_first_step_runs_in_the_caller_and_a_task_carries_on() -> None:
    steps: list[str] = []
    future: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def parked() -> None:
        steps.append("first")
        steps.append(await future)

    task = start_inline(parked())
    assert task is not None
    assert steps == ["first"]
    future.set_result("resumed")
    await asyncio.wait_for(task, WAIT_S)
    assert steps == ["first", "resumed"]


async def test_it_resumes_in_the_round_its_own_task_would() -> None:
    """Resolved in one round, both have run before the next: an inline event is
    not a round behind the tasks that wait for the same store round."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[None] = loop.create_future()
    order: list[str] = []

    async def wait(name: str) -> None:
        await future
        order.append(name)

    own = loop.create_task(wait("task"))
    await asyncio.sleep(0)  # the task's first step: it now waits for the future
    inline = start_inline(wait("inline"))
    assert inline is not None
    future.set_result(None)
    await asyncio.sleep(0)
    assert sorted(order) == ["inline", "task"]
    await asyncio.wait_for(asyncio.gather(own, inline), WAIT_S)


async def test_a_future_shared_by_inline_coroutines_resumes_them_all() -> None:
    """The future each one yields is marked taken at once, as a Task marks it, so
    the next coroutine may await the same future (appends awaiting one sync)."""
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    done: list[int] = []

    async def wait(number: int) -> None:
        await future
        done.append(number)

    tasks = [start_inline(wait(number)) for number in range(3)]
    future.set_result(None)
    await asyncio.wait_for(asyncio.gather(*[task for task in tasks if task is not None]), WAIT_S)
    assert done == [0, 1, 2]


async def test_an_exception_in_the_awaited_future_reaches_the_coroutine() -> None:
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    seen: list[str] = []

    async def wait() -> None:
        try:
            await future
        except ValueError as exc:
            seen.append(str(exc))

    task = start_inline(wait())
    assert task is not None
    future.set_exception(ValueError("store failed"))
    await asyncio.wait_for(task, WAIT_S)
    assert seen == ["store failed"]


async def test_an_exception_after_suspending_is_the_tasks() -> None:
    async def fail() -> None:
        await asyncio.sleep(0)
        raise ValueError("handler bug")

    task = start_inline(fail())
    assert task is not None
    with pytest.raises(ValueError, match="handler bug"):
        await asyncio.wait_for(task, WAIT_S)


async def test_cancelling_the_task_cancels_the_coroutine_where_it_waits() -> None:
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    seen: list[str] = []

    async def wait() -> None:
        try:
            await future
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    task = start_inline(wait())
    assert task is not None
    await asyncio.sleep(0)  # the task waits for the future now
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, WAIT_S)
    assert seen == ["cancelled"]
    assert future.cancelled()


async def test_a_bare_yield_is_one_round() -> None:
    steps: list[int] = []

    async def rounds() -> None:
        for step in range(3):
            steps.append(step)
            await asyncio.sleep(0)

    task = start_inline(rounds())
    assert task is not None
    assert steps == [0]
    await asyncio.wait_for(task, WAIT_S)
    assert steps == [0, 1, 2]


async def test_the_first_step_runs_in_the_callers_task_and_context() -> None:
    """Why an ``inline`` handler must not use ``current_task`` or ``asyncio.timeout``
    before it first suspends: that step is not in a task of its own."""
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")
    var.set("caller's")
    seen: list[object] = []

    async def look() -> None:
        seen.append(asyncio.current_task())
        seen.append(var.get())

    assert start_inline(look()) is None
    assert seen == [asyncio.current_task(), "caller's"]


async def test_step_now_issues_in_call_order_and_gives_each_outcome() -> None:
    issued: list[int] = []
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def append(n: int, park: bool) -> int:
        issued.append(n)  # the first step: what fixes the order
        if park:
            await gate
        if n == 3:
            raise ValueError("refused")
        return n * 10

    waits = [step_now(append(1, True)), step_now(append(2, False)), step_now(append(3, False))]
    assert issued == [1, 2, 3]  # all issued before anything else ran
    assert await waits[1] == 20  # finished in its first step: no task
    with pytest.raises(ValueError, match="refused"):
        await waits[2]
    gate.set_result(None)
    assert await asyncio.wait_for(waits[0], WAIT_S) == 10
