"""Container replication between two disk stores over the replication door (loopback TCP).

Each test has a leader store and a follower store in data dirs of their own:
the leader's ``ContainerLeader`` ships records through its ``ReplicationDoor``
and a ``ContainerFollower`` copies them. Appends go through the store
contract, as every door's do, so what is proven here holds for all doors:
acknowledged only once every in-sync copy holds the record durably, never
readable before, a deposed leader never acknowledged, fewer than
``min_in_sync`` copies refused with a retriable error.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from uuid import uuid4

import pytest

from headrace.cluster.replication import (
    ContainerFollower,
    ContainerLeader,
    ReplicationDoor,
    ReplicationRefused,
)
from headrace.errors import OwnerUnavailable
from headrace.protocols.replication import RefuseCode
from headrace.store.api import FsyncPolicy
from headrace.store.disk import DiskStore
from headrace.store.disk.layout import container_of
from headrace.types import WriterAppend

COUNT = 2
CONTAINER = 0
KEY = os.urandom(32)
DEADLINE_S = 10.0


def names(count: int = 3) -> list[str]:
    """Stream segment names in ``CONTAINER``."""
    found: list[str] = []
    i = 0
    while len(found) < count:
        name = f"scope/stream{i}/0.#epoch.0"
        if container_of(name, COUNT) == CONTAINER:
            found.append(name)
        i += 1
    return found


async def until(condition: Callable[[], bool], what: str) -> None:
    """Wait for ``condition`` (checked every loop turn or so), at most ``DEADLINE_S``."""
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


@dataclass
class Pair:
    leader_store: DiskStore
    follower_store: DiskStore
    door: ReplicationDoor
    now: list[float]

    async def leader(
        self, epoch: int = 1, *, min_in_sync: int = 2, **kw: object
    ) -> ContainerLeader:
        leader = ContainerLeader(
            self.leader_store,
            CONTAINER,
            epoch=epoch,
            node_id="a",
            in_sync=frozenset({"a", "b"}),
            min_in_sync=min_in_sync,
            clock=lambda: self.now[0],
            **kw,  # type: ignore[arg-type]
        )
        self.door.leaders[CONTAINER] = leader
        await leader.start()
        return leader

    def follower(self, epoch: int = 1, key: bytes = KEY) -> ContainerFollower:
        return ContainerFollower(
            self.follower_store, CONTAINER, node_id="b", epoch=epoch, node_key=key
        )

    def follow(self, follower: ContainerFollower) -> asyncio.Task[None]:
        return asyncio.create_task(follower.run("127.0.0.1", self.door.port))


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[Pair]:
    stores = [
        await DiskStore.open(tmp_path / n, container_count=COUNT, fsync=FsyncPolicy.ALWAYS)
        for n in ("a", "b")
    ]
    door = ReplicationDoor(KEY)
    await door.start("127.0.0.1")
    try:
        yield Pair(stores[0], stores[1], door, [100.0])
    finally:
        for leader in door.leaders.values():
            leader.stop()
        await door.aclose()
        for store in stores:
            await store.close()


async def test_an_append_is_acknowledged_and_readable_only_once_the_follower_holds_it(
    pair: Pair,
) -> None:
    leader = await pair.leader()
    name, other = names(2)
    creating = asyncio.create_task(pair.leader_store.create_segment(name))
    await until(lambda: leader.gate.local_seq >= 1, "the create durable on the leader")
    assert not creating.done(), "acknowledged with one copy of two"

    follower = pair.follower()
    following = pair.follow(follower)
    await asyncio.wait_for(creating, DEADLINE_S)
    writer = WriterAppend(uuid4(), 1)
    await pair.leader_store.append(name, b"event-1", writer=writer)
    appended = await pair.leader_store.append(name, b"event-2")
    assert appended.length == 14
    await pair.leader_store.create_segment(other)
    assert follower.durable >= leader.commit >= 4

    # Every record reached the follower's copy: promoted, it serves them all,
    # and a writer resending an event it stored is told it is a duplicate.
    following.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await following
    await pair.follower_store.lead(CONTAINER, None)
    read = await pair.follower_store.read(name, 0, 100)
    assert read.data == b"event-1event-2"
    assert await pair.follower_store.list_segments() == sorted([name, other])
    again = await pair.follower_store.append(name, b"event-1", writer=writer)
    assert again.duplicate


async def test_nothing_above_the_commit_point_is_readable_and_tail_reads_wake_on_commit(
    pair: Pair,
) -> None:
    leader = await pair.leader()
    follower = pair.follower()
    following = pair.follow(follower)
    (name,) = names(1)
    await pair.leader_store.create_segment(name)
    await pair.leader_store.append(name, b"one")
    following.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await following

    appending = asyncio.create_task(pair.leader_store.append(name, b"two"))
    waiting = asyncio.create_task(pair.leader_store.wait_for_data(name, 3, 5.0))
    await until(lambda: leader.gate.local_seq >= 3, "the append durable on the leader")
    assert (await pair.leader_store.read(name, 0, 100)).data == b"one"
    assert not waiting.done() and not appending.done()

    # A follower restarted: it resumes from its copy and the epoch history saved with it.
    following = pair.follow(pair.follower())
    await asyncio.wait_for(appending, DEADLINE_S)
    await asyncio.wait_for(waiting, DEADLINE_S)
    assert (await pair.leader_store.read(name, 0, 100)).data == b"onetwo"
    following.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await following


async def test_a_deposed_leader_gets_no_acknowledgement(pair: Pair) -> None:
    leader = await pair.leader(epoch=1)
    follower = pair.follower(epoch=1)
    following = pair.follow(follower)
    (name,) = names(1)
    await pair.leader_store.create_segment(name)

    # ZooKeeper gave the container to another leader at epoch 2: the follower
    # refuses epoch 1's records from then on.
    follower.fence(2)
    appending = asyncio.create_task(pair.leader_store.append(name, b"lost"))
    with pytest.raises(ReplicationRefused) as refused:
        await asyncio.wait_for(following, DEADLINE_S)
    assert refused.value.code is RefuseCode.STALE_EPOCH
    assert not appending.done()
    # ...and it cannot subscribe again to the old leader.
    with pytest.raises(ReplicationRefused) as again:
        await asyncio.wait_for(pair.follow(pair.follower(epoch=2)), DEADLINE_S)
    assert again.value.code is RefuseCode.STALE_EPOCH
    # The old leader learns it lost the record: the append fails, retriable.
    leader.stop()
    with pytest.raises(OwnerUnavailable):
        await asyncio.wait_for(appending, DEADLINE_S)
    with pytest.raises(OwnerUnavailable):
        await pair.leader_store.append(name, b"after")


async def test_a_lagging_follower_leaves_the_in_sync_set_and_rejoins_once_caught_up(
    pair: Pair,
) -> None:
    written: list[frozenset[str]] = []

    async def write_in_sync(members: frozenset[str]) -> bool:
        written.append(members)
        return True

    leader = await pair.leader(min_in_sync=1, write_in_sync=write_in_sync, lag_max_s=5.0)
    (name,) = names(1)
    appending = asyncio.create_task(pair.leader_store.create_segment(name))
    await until(lambda: leader.gate.local_seq >= 1, "the create durable on the leader")
    await leader.check_in_sync()
    assert not appending.done() and not written

    pair.now[0] += 6.0  # past the lag bound without a word from the follower
    await leader.check_in_sync()
    assert written == [frozenset({"a"})]
    await asyncio.wait_for(appending, DEADLINE_S)  # min in-sync 1: the leader alone
    await pair.leader_store.append(name, b"x" * 1000)

    follower = pair.follower()
    following = pair.follow(follower)
    await until(lambda: follower.durable >= leader.end, "the follower caught up")
    await until(lambda: leader.positions.get("b", 0) >= leader.end, "its ack")
    await leader.check_in_sync()
    assert written[-1] == frozenset({"a", "b"})
    await pair.leader_store.append(name, b"y")
    assert leader.commit == leader.end == follower.durable
    following.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await following


async def test_fewer_than_min_in_sync_copies_refuse_appends_and_reads_go_on(pair: Pair) -> None:
    async def write_in_sync(members: frozenset[str]) -> bool:
        return True

    leader = await pair.leader(min_in_sync=2, write_in_sync=write_in_sync, lag_max_s=5.0)
    following = pair.follow(pair.follower())
    (name,) = names(1)
    await pair.leader_store.create_segment(name)
    await pair.leader_store.append(name, b"kept")
    following.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await following
    # A follower that holds everything stays in sync; one that misses a record
    # for longer than the lag bound leaves.
    await leader.check_in_sync()
    assert leader.in_sync == {"a", "b"}
    stuck = asyncio.create_task(pair.leader_store.append(name, b"stuck"))
    await until(lambda: leader.gate.local_seq >= 3, "the append durable on the leader")
    await leader.check_in_sync()
    pair.now[0] += 6.0
    await leader.check_in_sync()
    assert leader.in_sync == {"a"}
    with pytest.raises(OwnerUnavailable) as refused:
        await pair.leader_store.append(name, b"refused")
    assert refused.value.retriable
    assert (await pair.leader_store.read(name, 0, 100)).data == b"kept"
    assert not stuck.done()
    leader.stop()
    with pytest.raises(OwnerUnavailable):
        await stuck


async def test_a_subscription_without_a_node_token_is_refused(pair: Pair) -> None:
    await pair.leader()
    with pytest.raises(ReplicationRefused) as refused:
        await asyncio.wait_for(pair.follow(pair.follower(key=os.urandom(32))), DEADLINE_S)
    assert refused.value.code is RefuseCode.NOT_AUTHORIZED


async def test_failover_to_the_in_sync_follower_keeps_every_acknowledged_record(
    pair: Pair,
) -> None:
    old = await pair.leader(epoch=1)
    follower = pair.follower(epoch=1)
    following = pair.follow(follower)
    (name,) = names(1)
    writer = WriterAppend(uuid4(), 1)
    await pair.leader_store.create_segment(name)
    await pair.leader_store.append(name, b"acked-1", writer=writer)
    await pair.leader_store.append(name, b"acked-2", writer=WriterAppend(writer.writer_id, 2))

    # The old leader's session ends with an append in flight that the follower
    # never wrote; ZooKeeper makes the follower leader at epoch 2.
    following.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await following
    in_flight = asyncio.create_task(pair.leader_store.append(name, b"never-acked"))
    await until(lambda: old.gate.local_seq >= 4, "the in-flight append durable on the old leader")
    old.stop()
    with pytest.raises(OwnerUnavailable):
        await asyncio.wait_for(in_flight, DEADLINE_S)

    new_door = ReplicationDoor(KEY)
    await new_door.start("127.0.0.1")
    try:
        new = ContainerLeader(
            pair.follower_store,
            CONTAINER,
            epoch=2,
            node_id="b",
            in_sync=frozenset({"b"}),
            min_in_sync=1,
        )
        new_door.leaders[CONTAINER] = new
        await new.start()
        assert new.history[-1].epoch == 2
        assert (await pair.follower_store.read(name, 0, 100)).data == b"acked-1acked-2"
        # The writer resends after the failover: stored once.
        again = await pair.follower_store.append(
            name, b"acked-2", writer=WriterAppend(writer.writer_id, 2)
        )
        assert again.duplicate
        await pair.follower_store.append(name, b"new-1", writer=WriterAppend(writer.writer_id, 3))

        # The old leader comes back as a follower: its log holds a record of
        # epoch 1 the new leader never had. It cuts it (copied aside, as a torn
        # tail) and copies the new leader's records instead.
        rejoin = ContainerFollower(pair.leader_store, CONTAINER, node_id="a", epoch=2, node_key=KEY)
        rejoining = asyncio.create_task(rejoin.run("127.0.0.1", new_door.port))
        await until(lambda: new.positions.get("a") == new.end == 4, "the old leader caught up")
        rejoining.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await rejoining
        await pair.leader_store.lead(CONTAINER, None)
        assert (await pair.leader_store.read(name, 0, 100)).data == b"acked-1acked-2new-1"
        wal_dir = pair.leader_store.container_paths(CONTAINER).wal_dir
        assert any(".broken-" in path.name for path in wal_dir.iterdir())
        assert await pair.leader_store.replica_epochs(CONTAINER) == ((1, 1), (2, 4))
    finally:
        for leader in new_door.leaders.values():
            leader.stop()
        await new_door.aclose()


async def test_an_in_sync_member_back_without_every_committed_record_leaves_the_set(
    pair: Pair, tmp_path: Path
) -> None:
    written: list[frozenset[str]] = []

    async def write_in_sync(members: frozenset[str]) -> bool:
        written.append(members)
        return True

    leader = await pair.leader(min_in_sync=1, write_in_sync=write_in_sync)
    following = pair.follow(pair.follower())
    (name,) = names(1)
    await pair.leader_store.create_segment(name)
    await pair.leader_store.append(name, b"committed")
    following.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await following
    assert leader.in_sync == {"a", "b"} and not written

    # "b" comes back on a wiped data dir: it subscribes with an empty log.
    wiped = await DiskStore.open(tmp_path / "wiped", container_count=COUNT)
    try:
        back = ContainerFollower(wiped, CONTAINER, node_id="b", epoch=1, node_key=KEY)
        rejoining = asyncio.create_task(back.run("127.0.0.1", pair.door.port))
        await until(lambda: written == [frozenset({"a"})], "it left the in-sync set")
        assert leader.in_sync == {"a"}
        # It catches up from the leader, then joins again.
        await until(lambda: leader.positions.get("b") == leader.end, "it caught up")
        await leader.check_in_sync()
        assert written[-1] == frozenset({"a", "b"})
        rejoining.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await rejoining
    finally:
        await wiped.close()
