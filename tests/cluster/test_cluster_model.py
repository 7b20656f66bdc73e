"""``ClusterModel`` over one store shared by two models: one leads, one follows.

The follower's mirror reloads when the tables grew; the changes it cannot
send to a leader are refused as retriable; the periodic jobs run only on
the leader; a follower promoted to leader loads the tables and writes them.
The gRPC forwarding to a leader's controller is tested with real nodes in
``test_metadata.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from headrace.cluster.metadata import ClusterModel
from headrace.controller.records import KeyValueTableConfig, StreamConfig
from headrace.errors import OwnerUnavailable
from headrace.store.memory import MemoryStore

WAIT_S = 10.0


class Node:
    """A model with a switch saying whether its node leads, and its ``run`` task."""

    def __init__(self, store: MemoryStore) -> None:
        self.leads = False
        self.model = ClusterModel(store, leader_controller=lambda: None)
        self.task = asyncio.create_task(self.model.run(lambda: self.leads))

    async def until(self, check: object) -> None:
        async def poll() -> None:
            while not check():  # type: ignore[operator]
                self.model.wake()
                await asyncio.sleep(0.01)

        await asyncio.wait_for(poll(), WAIT_S)

    async def aclose(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.model.aclose()


@pytest.fixture
async def pair() -> AsyncIterator[tuple[Node, Node]]:
    store = MemoryStore()
    leader, follower = Node(store), Node(store)
    try:
        yield leader, follower
    finally:
        await leader.aclose()
        await follower.aclose()


async def test_a_follower_sees_what_the_leader_wrote(pair: tuple[Node, Node]) -> None:
    leader, follower = pair
    leader.leads = True
    await leader.until(lambda: leader.model.leading)
    await follower.until(lambda: follower.model.loaded)
    assert not follower.model.leading
    await leader.model.create_scope("sc")
    await leader.model.create_stream("sc", "st", StreamConfig())
    await follower.until(lambda: follower.model.stream_exists("sc", "st"))
    assert [s.id for s in follower.model.current_segments("sc", "st")] == [0]


async def test_refresh_reloads_at_once(pair: tuple[Node, Node]) -> None:
    leader, follower = pair
    leader.leads = True
    await leader.until(lambda: leader.model.leading)
    await leader.model.create_scope("now")
    await follower.model.refresh()
    assert follower.model.scope_exists("now")


async def test_a_follower_without_a_leader_refuses_changes_as_retriable(
    pair: tuple[Node, Node],
) -> None:
    _, follower = pair
    with pytest.raises(OwnerUnavailable) as info:
        await follower.model.create_scope("x")
    assert info.value.retriable
    with pytest.raises(OwnerUnavailable):
        await follower.model.seal_stream("x", "y")
    assert (await follower.model.sweep()).aborted == 0
    assert await follower.model.enforce_retention() == 0
    assert await follower.model.auto_scale() == 0


async def test_leadership_moves_and_the_new_leader_writes(pair: tuple[Node, Node]) -> None:
    first, second = pair
    first.leads = True
    await first.until(lambda: first.model.leading)
    await first.model.create_scope("kept")
    first.leads = False
    await first.until(lambda: not first.model.leading)
    second.leads = True
    await second.until(lambda: second.model.leading)
    assert second.model.scope_exists("kept")
    await second.model.create_scope("added")
    await first.until(lambda: first.model.scope_exists("added"))


async def test_key_value_tables_are_written_by_the_leader_and_seen_by_a_follower(
    pair: tuple[Node, Node],
) -> None:
    leader, follower = pair
    leader.leads = True
    await leader.until(lambda: leader.model.leading)
    await follower.until(lambda: follower.model.loaded)
    config = KeyValueTableConfig(partition_count=2, primary_key_length=4)
    with pytest.raises(OwnerUnavailable):
        await follower.model.create_kvtable("sc", "kv", config)
    await leader.model.create_scope("sc")
    await leader.model.create_kvtable("sc", "kv", config)
    await follower.until(
        lambda: (
            follower.model.scope_exists("sc")
            and follower.model.list_kvtables("sc", limit=10) == ["kv"]
        )
    )
    assert follower.model.kvtable_config("sc", "kv") == config
    with pytest.raises(OwnerUnavailable):
        await follower.model.delete_kvtable("sc", "kv")
