"""ClusterMember on a real ZooKeeper: membership, leadership, placement, moves, fencing.

Members run in this process on the test's loop, each with its own ZooKeeper
session; ``Cluster`` (conftest) waits on their events and checks, on every
ownership any member confirms, that no two nodes ever own one container at
one epoch.
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Final

import pytest
from kazoo.protocol.states import KazooState

from headrace.cluster._zk import ZkSession
from headrace.cluster.errors import ClusterError, NodeIdInUse, ZooKeeperUnavailable
from headrace.cluster.layout import (
    ContainerRecord,
    ContainerState,
    NodeInfo,
    container_path,
    decode_container,
    encode,
    parse_cluster_url,
)
from headrace.cluster.member import ClusterMember, OwnershipChanged
from headrace.store.disk.layout import SegmentMapping, container_of
from tests._server import free_port, server_env
from tests._zookeeper import ZooKeeper
from tests.cluster.conftest import SESSION_TIMEOUT_S, WAIT_S, Cluster, expire_session

CHILD_SESSION_S: Final = 2.0
"""The killed child's session timeout: how long its successor waits."""
CLAIM_ATTEMPTS: Final = 25
"""Claims each racing session tries."""


def _balanced(cluster: Cluster, count: int, expected: list[int]) -> bool:
    return cluster.settled(count) and sorted(cluster.owned_counts().values()) == expected


async def test_members_see_each_other_with_their_endpoints(cluster: Cluster) -> None:
    a = await cluster.add("a")
    await cluster.add("b")
    await cluster.add("c")
    await cluster.until(lambda: all(set(m.nodes()) == {"a", "b", "c"} for m in cluster.live()))
    info = a.nodes()["c"]
    assert (info.host, dict(info.ports)) == (
        "127.0.0.1",
        {"controller": 9090, "segment_store": 12345},
    )
    assert info.address("segment_store") == ("127.0.0.1", 12345)
    assert info.address("tank") is None
    await cluster.remove("b")
    await cluster.until(lambda: all(set(m.nodes()) == {"a", "c"} for m in cluster.live()))


async def test_one_leader_and_a_new_one_when_its_session_closes(cluster: Cluster) -> None:
    for name in ("a", "b", "c"):
        await cluster.add(name)
    await cluster.until(lambda: len(cluster.leaders()) == 1 and None not in cluster.leaders())
    (leader,) = cluster.leaders()
    assert leader is not None
    assert [m.node_id for m in cluster.live() if m.is_leader] == [leader]
    await cluster.remove(leader)
    await cluster.until(
        lambda: len(cluster.leaders()) == 1 and cluster.leaders() not in ({None}, {leader})
    )
    (successor,) = cluster.leaders()
    assert [m.node_id for m in cluster.live() if m.is_leader] == [successor]


async def test_initial_placement_spreads_every_container_over_three_members(
    cluster: Cluster,
) -> None:
    await asyncio.gather(*(cluster.add(name) for name in ("a", "b", "c")))
    await cluster.until(lambda: _balanced(cluster, 16, [5, 5, 6]))
    for name, member in cluster.members.items():
        for container in member.owned():
            record = member.record(container)
            assert (record.owner, record.state) == (name, ContainerState.OWNED)
            # the hook got the epoch the node owns the container at
            assert ("acquire", container, record.epoch) in cluster.hooks[name].calls
    assert cluster.members["a"].cluster.container_count == 16


async def test_a_fourth_member_gets_containers_one_move_at_a_time(cluster: Cluster) -> None:
    for name in ("a", "b", "c"):
        await cluster.add(name)
    await cluster.until(lambda: _balanced(cluster, 16, [5, 5, 6]))
    moving: set[int] = set()
    most_at_once = 0

    def released(container: int) -> None:
        nonlocal most_at_once
        moving.add(container)
        most_at_once = max(most_at_once, len(moving))

    def arrived(event: object) -> None:
        if isinstance(event, OwnershipChanged):
            moving.difference_update(event.owned)

    for hooks in cluster.hooks.values():
        hooks.on_release = released
    seen = {name: len(hooks.calls) for name, hooks in cluster.hooks.items()}
    d = await cluster.add("d")
    d.add_listener(arrived)
    await cluster.until(lambda: _balanced(cluster, 16, [4, 4, 4, 4]))
    assert most_at_once == 1
    moved = [
        c for n, h in cluster.hooks.items() if n != "d" for _, c, to in h.calls[seen[n] :] if to
    ]
    assert sorted(moved) == sorted(d.owned())  # exactly the four that moved, each once
    for container in d.owned():
        assert cluster.hooks["d"].calls.count(("acquire", container, d.epoch(container))) == 1
        assert d.epoch(container) == cluster.members["a"].epoch(container) >= 2


async def test_a_move_waits_for_the_release_hook(cluster: Cluster) -> None:
    a = await cluster.add("a", container_count=2)
    await cluster.until(lambda: cluster.settled(2))
    cluster.hooks["a"].hold_release.clear()
    b = await cluster.add("b")
    await cluster.until(lambda: any(call[0] == "release" for call in cluster.hooks["a"].calls))
    (_, container, to) = next(c for c in cluster.hooks["a"].calls if c[0] == "release")
    assert to == "b"
    # the owner stopped serving it at once; nobody else has it while the hook runs
    assert not a.owns(container) and not b.owns(container)
    assert a.record(container).state is ContainerState.MOVING
    assert not [c for c in cluster.hooks["b"].calls if c[0] == "acquire"]
    cluster.hooks["a"].hold_release.set()
    await cluster.until(lambda: b.owns(container) and cluster.settled(2))
    assert b.epoch(container) == 2


async def test_drain_moves_every_container_away_and_undrain_brings_some_back(
    cluster: Cluster,
) -> None:
    a = await cluster.add("a")
    for name in ("b", "c"):
        await cluster.add(name)
    await cluster.until(lambda: _balanced(cluster, 16, [5, 5, 6]))
    await a.drain("b")
    await cluster.until(lambda: cluster.settled(16) and cluster.owned_counts()["b"] == 0)
    assert sorted(cluster.owned_counts().values()) == [0, 8, 8]
    assert all(m.draining() == {"b"} for m in cluster.live())
    await a.undrain("b")
    await cluster.until(lambda: _balanced(cluster, 16, [5, 5, 6]))


async def test_a_killed_owner_keeps_its_containers_until_it_returns(cluster: Cluster) -> None:
    for name in ("a", "b", "c"):
        await cluster.add(name)
    await cluster.until(lambda: _balanced(cluster, 16, [5, 5, 6]))
    a = cluster.members["a"]
    stranded = sorted(cluster.members["c"].owned())
    epochs = {c: a.epoch(c) for c in stranded}
    await cluster.remove("c")
    await cluster.until(lambda: all(a.owner(c) is None for c in stranded))
    # a new member makes the leader place again: still nothing of c's moves
    await cluster.add("d")
    await cluster.until(lambda: _balanced_without(cluster, stranded))
    for container in stranded:
        record = a.record(container)
        assert (record.owner, record.state, record.epoch) == (
            "c",
            ContainerState.OWNED,
            epochs[container],
        )
    back = await cluster.add("c")
    await cluster.until(lambda: set(stranded) <= back.owned())
    for container in stranded:
        assert back.epoch(container) == epochs[container] + 1  # re-claimed at a new epoch
        assert ("acquire", container, epochs[container] + 1) in cluster.hooks["c"].calls


def _balanced_without(cluster: Cluster, stranded: list[int]) -> bool:
    rest = [c for c in range(16) if c not in stranded]
    counts = sorted(cluster.owned_counts().values())
    owners = [sum(m.owns(c) for m in cluster.live()) for c in rest]
    return owners == [1] * len(rest) and counts[-1] - counts[0] <= 1


async def test_session_expiry_fences_then_reclaims_at_a_new_epoch(
    own_cluster: tuple[Cluster, ZooKeeper],
) -> None:
    cluster, server = own_cluster
    a = await cluster.add("a")
    b = await cluster.add("b")
    await cluster.until(lambda: _balanced(cluster, 16, [8, 8]))
    held = sorted(a.owned())
    epochs = {c: a.epoch(c) for c in held}
    events: list[OwnershipChanged] = []
    a.add_listener(lambda e: events.append(e) if isinstance(e, OwnershipChanged) else None)
    expire_session(a, server)
    await cluster.until(lambda: any(e.fenced for e in events))
    assert events[0] == OwnershipChanged(frozenset(), fenced=True)
    await cluster.until(lambda: set(held) <= a.owned() and cluster.settled(16))
    for container in held:
        assert a.epoch(container) == b.epoch(container) == epochs[container] + 1
    assert set(b.nodes()) == {"a", "b"}


async def test_a_member_owns_nothing_while_its_proof_of_life_is_older_than_the_lease(
    cluster: Cluster,
) -> None:
    """What a process resumed after a pause sees before kazoo's thread noticed
    anything: the connection still looks up, but the last proof that the
    session lives is older than the lease, so the session may be gone. It
    serves nothing until a heartbeat renews the proof; the paused process
    itself is in ``test_faults.py``."""
    a = await cluster.add("a", container_count=2)
    await cluster.until(lambda: cluster.settled(2))
    zk = a._zk
    assert zk is not None and zk.live and a.owned() == {0, 1}
    assert 0 < zk._lease_s < SESSION_TIMEOUT_S  # a part of the negotiated timeout
    zk._proof -= zk._lease_s  # as if the process had stood still for a lease
    assert zk.connected and not zk.live
    assert not a.owns(0) and a.owned() == frozenset()
    deadline = time.monotonic() + WAIT_S
    while not a.owns(0):  # the next heartbeat renews it
        assert time.monotonic() < deadline, "the lease was not renewed"
        await asyncio.sleep(0.05)
    assert a.owned() == {0, 1}


async def test_a_connection_back_within_the_lease_keeps_every_container(
    cluster: Cluster,
) -> None:
    """A suspended session lives on at ZooKeeper for its timeout, and nobody can
    take this node's containers before it expires: the node serves them while
    its lease lasts, and a connection back in time changes nothing (no fence,
    no new epoch). kazoo's state changes are played here as its thread would."""
    a = await cluster.add("a", container_count=2)
    await cluster.until(lambda: cluster.settled(2))
    zk = a._zk
    assert zk is not None
    epochs = {c: a.epoch(c) for c in (0, 1)}
    events: list[OwnershipChanged] = []
    a.add_listener(lambda e: events.append(e) if isinstance(e, OwnershipChanged) else None)
    zk._state_changed(KazooState.SUSPENDED)
    await asyncio.sleep(0)  # the loop hears of it
    assert not zk.connected and zk.live
    assert a.owned() == {0, 1}
    zk._state_changed(KazooState.CONNECTED)  # back before the lease ran out
    await cluster.until(lambda: a.live and a.owned() == {0, 1})
    a._lease_check()  # what the suspension's timer does when the lease it saw ends
    assert a.owned() == {0, 1} and not any(e.fenced for e in events)
    assert {c: a.epoch(c) for c in (0, 1)} == epochs


async def test_a_connection_not_back_within_the_lease_fences_then_reclaims(
    cluster: Cluster,
) -> None:
    a = await cluster.add("a", container_count=2)
    await cluster.until(lambda: cluster.settled(2))
    zk = a._zk
    assert zk is not None
    epochs = {c: a.epoch(c) for c in (0, 1)}
    events: list[OwnershipChanged] = []
    a.add_listener(lambda e: events.append(e) if isinstance(e, OwnershipChanged) else None)
    zk._state_changed(KazooState.SUSPENDED)
    await cluster.until(lambda: any(e.fenced for e in events))  # once the lease ran out
    assert a.owned() == frozenset() and not zk.live
    zk._state_changed(KazooState.CONNECTED)  # the same session, after the fence
    await cluster.until(lambda: all(a.epoch(c) == e + 1 for c, e in epochs.items()))
    deadline = time.monotonic() + WAIT_S
    while a.owned() != {0, 1}:  # re-claimed; owned once a heartbeat renews the lease
        assert time.monotonic() < deadline, a.owned()
        await asyncio.sleep(0.05)


async def test_zookeeper_restart_keeps_members_and_their_containers(
    own_cluster: tuple[Cluster, ZooKeeper],
) -> None:
    cluster, server = own_cluster
    for name in ("a", "b", "c"):
        await cluster.add(name)
    await cluster.until(lambda: _balanced(cluster, 16, [5, 5, 6]))
    before = {name: sorted(m.owned()) for name, m in cluster.members.items()}
    epochs = {c: cluster.members["a"].epoch(c) for c in range(16)}
    (leader,) = cluster.leaders()
    fenced: set[str] = set()
    for name, member in cluster.members.items():
        member.add_listener(
            lambda e, name=name: (
                fenced.add(name) if isinstance(e, OwnershipChanged) and e.fenced else None
            )
        )
    server.kill()
    await cluster.until(lambda: fenced == {"a", "b", "c"})
    assert all(not m.owned() for m in cluster.live())  # nobody serves without ZooKeeper
    server.start()
    await cluster.until(
        lambda: (
            cluster.settled(16)
            and all(cluster.members["a"].epoch(c) == epochs[c] + 1 for c in range(16))
        )
    )
    assert {name: sorted(m.owned()) for name, m in cluster.members.items()} == before
    assert cluster.leaders() == {leader}  # the same sessions: the leader's znode survived


async def test_concurrent_members_never_own_a_container_at_the_same_epoch(
    cluster: Cluster,
) -> None:
    """Members start together, drains move containers back and forth; ``Cluster`` checks."""
    members = await asyncio.gather(*(cluster.add(n, container_count=8) for n in "abcd"))
    await cluster.until(lambda: _balanced(cluster, 8, [2, 2, 2, 2]))
    for node in ("a", "b", "c", "a"):
        await members[1].drain(node)
        await cluster.until(
            lambda node=node: cluster.settled(8) and not cluster.members[node].owned()
        )
        await members[2].undrain(node)
    await cluster.until(lambda: _balanced(cluster, 8, [2, 2, 2, 2]))
    assert len(cluster.confirmed) >= 8 + 6  # every first claim, and moves on top


async def test_container_of_is_the_disk_stores_function(cluster: Cluster) -> None:
    member = await cluster.add("a", container_count=7)
    assert member.cluster.mapping is SegmentMapping.GROUPED
    names = (
        "scope/stream/0.#epoch.0",
        "scope/stream/0.#epoch.0#transaction.00000001000000000000000000000002",
        "_system/controller/streams",
        "_system/_tables/x",
        "tank/t/3",
        "ü/∂",
    )
    for name in names:
        assert member.container_of(name) == container_of(name, 7, SegmentMapping.GROUPED)


async def test_a_node_whose_data_dir_maps_otherwise_is_refused(cluster: Cluster) -> None:
    """A data dir of the plain hash cannot serve a grouped cluster's containers
    (its transaction segments are elsewhere): the node refuses to join, in one line."""
    await cluster.add("a")
    stray = ClusterMember(
        cluster.url,
        NodeInfo("b", "127.0.0.1"),
        segment_mapping=SegmentMapping.HASH,
        start_timeout_s=WAIT_S,
    )
    with pytest.raises(ClusterError, match="'grouped' mapping and this node's data dir by 'hash'"):
        await stray.start()
    assert "b" not in cluster.members["a"].nodes()


async def test_a_cluster_takes_its_first_nodes_mapping(cluster_url: str) -> None:
    """A data dir of the plain hash creating a cluster makes a hash cluster,
    which it and other hash nodes join; grouped nodes do not."""
    group = Cluster(cluster_url)
    try:
        a = await group.add("a", segment_mapping=SegmentMapping.HASH)
        assert a.cluster.mapping is SegmentMapping.HASH
        assert a.container_of("_system/controller/streams") == container_of(
            "_system/controller/streams", a.container_count, SegmentMapping.HASH
        )
        await group.add("b", segment_mapping=SegmentMapping.HASH)
        with pytest.raises(ClusterError, match="'hash' mapping"):
            await group.add("c", segment_mapping=SegmentMapping.GROUPED)
    finally:
        await group.aclose()


async def test_a_joiner_keeps_the_clusters_container_count(cluster: Cluster) -> None:
    await cluster.add("a", container_count=5)
    b = await cluster.add("b", container_count=9)
    assert b.container_count == 5
    await cluster.until(lambda: _balanced(cluster, 5, [2, 3]))


async def test_a_second_node_with_the_same_id_is_refused(cluster: Cluster) -> None:
    await cluster.add("a")
    twin = ClusterMember(cluster.url, NodeInfo("a", "127.0.0.1"), start_timeout_s=1.0)
    with pytest.raises(NodeIdInUse, match="node id 'a' is registered by another live session"):
        await twin.start()


async def test_no_zookeeper_is_one_clear_error() -> None:
    url = f"zk://127.0.0.1:{free_port()}/headrace"
    member = ClusterMember(url, NodeInfo("a", "127.0.0.1"), start_timeout_s=1.0)
    with pytest.raises(ZooKeeperUnavailable, match=r"cannot reach ZooKeeper at 127\.0\.0\.1:\d+"):
        await member.start()
    assert WAIT_S > 1.0


async def test_a_restarted_node_waits_for_its_killed_session_then_reclaims(
    cluster: Cluster,
) -> None:
    """kill -9 leaves the session to expire; the next run of the node waits for it."""
    a = await cluster.add("a", container_count=4)
    child = await asyncio.create_subprocess_exec(
        *[sys.executable, "-m", "tests.cluster.member_child"],
        *[cluster.url, "c", str(CHILD_SESSION_S)],
        env=server_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        assert child.stdout is not None
        assert await asyncio.wait_for(child.stdout.readline(), WAIT_S) == b"ready\n"
        await cluster.until(lambda: _owned_by(a, "c", 4) == 2 and len(a.owned()) == 2)
        held = sorted(c for c in range(4) if a.record(c).owner == "c")
        epochs = {c: a.epoch(c) for c in held}
        child.kill()
        await asyncio.wait_for(child.wait(), WAIT_S)
        killed_at = time.monotonic()
        back = await cluster.add("c")  # waits for the old session to expire
        assert time.monotonic() - killed_at >= CHILD_SESSION_S / 2  # a ping interval at most early
        await cluster.until(lambda: set(held) <= back.owned() and cluster.settled(4))
        assert {c: back.epoch(c) for c in held} == {c: epochs[c] + 1 for c in held}
    finally:
        if child.returncode is None:
            child.kill()
            await asyncio.wait_for(child.wait(), WAIT_S)


def _owned_by(member: ClusterMember, node_id: str, count: int) -> int:
    return sum(
        member.record(c).owner == node_id and member.owner(c) is not None for c in range(count)
    )


async def test_concurrent_conditional_claims_never_give_one_epoch_two_owners(
    cluster: Cluster,
) -> None:
    """Eight sessions race to claim one container by version-conditional writes."""
    await cluster.add("a", container_count=1)
    url = parse_cluster_url(cluster.url)
    sessions = [ZkSession(url, SESSION_TIMEOUT_S, lambda _: None, lambda _: None) for _ in range(8)]
    await asyncio.gather(*(s.connect(WAIT_S) for s in sessions))
    await cluster.remove("a")  # nobody else writes the record now
    wins: list[tuple[int, str]] = []

    async def contend(session: ZkSession, node_id: str) -> None:
        for _ in range(CLAIM_ATTEMPTS):
            found = await session.get(container_path(0), watch=False)
            assert found is not None
            record = decode_container(found[0], container_path(0))
            claimed = ContainerRecord(node_id, record.epoch + 1, ContainerState.OWNED)
            if await session.set_if(container_path(0), encode(claimed), found[1].version):
                wins.append((claimed.epoch, node_id))

    try:
        await asyncio.gather(*(contend(s, f"n{i}") for i, s in enumerate(sessions)))
        found = await sessions[0].get(container_path(0), watch=False)
    finally:
        await asyncio.gather(*(s.close() for s in sessions))
    assert found is not None
    final = decode_container(found[0], container_path(0))
    epochs = sorted(epoch for epoch, _ in wins)
    first = epochs[0]
    assert epochs == list(range(first, first + len(wins)))  # each epoch won exactly once
    assert final.epoch == epochs[-1] and (final.epoch, final.owner) in wins
    assert len({node for _, node in wins}) > 1  # they really raced


async def test_an_unreadable_container_record_is_left_alone_and_logged_once(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    url = parse_cluster_url(cluster.url)
    writer = ZkSession(url, SESSION_TIMEOUT_S, lambda _: None, lambda _: None)
    await writer.connect(WAIT_S)
    try:
        a = await cluster.add("a", container_count=3)
        await cluster.until(lambda: cluster.settled(3))
        found = await writer.get(container_path(1), watch=False)
        assert found is not None
        assert await writer.set_if(container_path(1), b'{"v": 9}', found[1].version)
        await cluster.until(lambda: 1 not in a.owned())  # what it cannot read, it cannot own
        b = await cluster.add("b")  # b reads the bad record from the start
        # the leader balances the other two and leaves container 1 alone
        await cluster.until(lambda: len(b.owned()) == 1 and len(a.owned()) == 1)
        assert 1 not in b.owned() and a.owner(1) is None
        bad = [r for r in caplog.records if "/containers/1" in r.getMessage()]
        assert len(bad) == 2  # one line from each member, not one per retry
        assert "record version 9" in bad[0].getMessage()
        found = await writer.get(container_path(1), watch=False)
        assert found is not None
        fixed = ContainerRecord("a", 1, ContainerState.OWNED)
        assert await writer.set_if(container_path(1), encode(fixed), found[1].version)
        # a takes it back, at a new epoch
        await cluster.until(lambda: 1 in a.owned() and a.epoch(1) == b.epoch(1) == 2)
        assert b.owner(1) == a.node
    finally:
        await writer.close()
