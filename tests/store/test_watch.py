"""``watch``/``unwatch`` and the parked waits built on them, against both stores.

A parked reader is one future in the store's watcher table: these tests
check what resolves it (append, seal, merge, delete, close), that it is not
resolved by anything else, that one future can watch several segments, and
that a wait that ends by its timer or by cancellation leaves nothing behind
(the table is empty again), so thousands of timed-out long polls cost no
memory.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from headrace.errors import SegmentNotFound, StoreClosed
from headrace.store import DiskStore, MemoryStore
from headrace.store._base import BaseStore
from headrace.store.api import FsyncPolicy

WAIT_LIMIT_S = 10.0
"""Upper bound on any wait a test expects to end."""


@pytest.fixture(params=["memory", "disk-always", "disk-never"])
async def store(tmp_path: Path, request: pytest.FixtureRequest) -> AsyncIterator[BaseStore]:
    s: BaseStore
    if request.param == "memory":
        s = MemoryStore()
    else:
        policy = FsyncPolicy.ALWAYS if request.param == "disk-always" else FsyncPolicy.NEVER
        s = await DiskStore.open(tmp_path / "data", fsync=policy)
    yield s
    await s.close()


async def _settle() -> None:
    """Let every callback the last step scheduled run (bare yields, not a timed sleep)."""
    for _ in range(20):
        await asyncio.sleep(0)


def _future() -> asyncio.Future[None]:
    return asyncio.get_running_loop().create_future()


async def test_watch_refuses_a_ready_segment(store: BaseStore) -> None:
    await store.create_segment("s")
    await store.append("s", b"abc")
    assert store.watch("s", 2, _future()) is False  # a byte at offset 2
    assert store.watch("s", 3, _future()) is True  # the tail: registered
    await store.create_segment("sealed")
    await store.seal("sealed")
    assert store.watch("sealed", 0, _future()) is False


async def test_append_resolves_the_watcher(store: BaseStore) -> None:
    await store.create_segment("s")
    wake = _future()
    assert store.watch("s", 0, wake)
    await _settle()
    assert not wake.done(), "resolved before anything changed"
    await store.append("s", b"x")
    await asyncio.wait_for(wake, WAIT_LIMIT_S)
    assert store._watchers == {}  # woken watchers are dropped with the notification


async def test_an_append_elsewhere_does_not_resolve_it(store: BaseStore) -> None:
    await store.create_segment("s")
    await store.create_segment("other")
    wake = _future()
    assert store.watch("s", 0, wake)
    await store.append("other", b"x")
    await _settle()
    assert not wake.done()


async def test_unwatch_forgets_the_watcher(store: BaseStore) -> None:
    await store.create_segment("s")
    wake = _future()
    assert store.watch("s", 0, wake)
    store.unwatch("s", wake)
    assert store._watchers == {}
    await store.append("s", b"x")
    await _settle()
    assert not wake.done()
    store.unwatch("s", wake)  # twice, and on a segment it never watched: no-ops
    store.unwatch("nope", wake)


async def test_one_future_watches_several_segments(store: BaseStore) -> None:
    for name in ("a", "b", "c"):
        await store.create_segment(name)
    wake = _future()
    assert all(store.watch(name, 0, wake) for name in ("a", "b", "c"))
    await store.append("b", b"x")
    await asyncio.wait_for(wake, WAIT_LIMIT_S)
    for name in ("a", "c"):  # the caller unwatches the others, which must not fail
        store.unwatch(name, wake)
    assert store._watchers == {}


@pytest.mark.parametrize("change", ["seal", "delete", "merge_source", "merge_target"])
async def test_changes_resolve_the_watcher(store: BaseStore, change: str) -> None:
    await store.create_segment("s")
    await store.create_segment("t")
    watched = "t" if change == "merge_target" else "s"
    if change == "merge_target":
        await store.append("s", b"abc")
    wake = _future()
    assert store.watch(watched, 0, wake)
    if change == "seal":
        await store.seal("s")
    elif change == "delete":
        await store.delete("s")
    else:
        await store.merge("t", "s")
    await asyncio.wait_for(wake, WAIT_LIMIT_S)


async def test_close_resolves_every_watcher(store: BaseStore) -> None:
    await store.create_segment("s")
    await store.create_segment("t")
    wakes = [_future() for _ in range(3)]
    assert store.watch("s", 0, wakes[0])
    assert store.watch("s", 0, wakes[1])
    assert store.watch("t", 0, wakes[2])
    await store.close()
    await asyncio.wait_for(asyncio.gather(*wakes), WAIT_LIMIT_S)
    with pytest.raises(StoreClosed):
        store.watch("s", 0, _future())


async def test_watch_of_a_missing_segment_raises(store: BaseStore) -> None:
    with pytest.raises(SegmentNotFound):
        store.watch("nope", 0, _future())


async def test_timed_out_and_cancelled_waits_leave_no_watcher(store: BaseStore) -> None:
    await store.create_segment("s")
    results = await asyncio.gather(*(store.wait_for_data("s", 0, 0.01) for _ in range(100)))
    assert results == [False] * 100
    assert store._watchers == {}
    waiter = asyncio.create_task(store.wait_for_data("s", 0, WAIT_LIMIT_S))
    await _settle()
    assert store._watchers.keys() == {"s"}
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert store._watchers == {}


async def test_a_parked_wait_holds_one_future_and_no_task(store: BaseStore) -> None:
    """The cheap path: a parked ``wait_for_data`` adds no task of its own."""
    await store.create_segment("s")
    before = len(asyncio.all_tasks())
    waiters = [asyncio.create_task(store.wait_for_data("s", 0, WAIT_LIMIT_S)) for _ in range(50)]
    await _settle()
    assert len(asyncio.all_tasks()) == before + 50  # the waiters themselves, nothing more
    assert len(store._watchers["s"]) == 50
    await store.append("s", b"x")
    assert await asyncio.wait_for(asyncio.gather(*waiters), WAIT_LIMIT_S) == [True] * 50


async def test_a_woken_wait_short_of_its_offset_parks_again(store: BaseStore) -> None:
    await store.create_segment("s")
    waiter = asyncio.create_task(store.wait_for_data("s", 5, WAIT_LIMIT_S))
    await _settle()
    await store.append("s", b"abc")
    await _settle()
    assert not waiter.done()
    assert len(store._watchers["s"]) == 1  # parked again, once
    await store.append("s", b"def")
    assert await asyncio.wait_for(waiter, WAIT_LIMIT_S) is True
