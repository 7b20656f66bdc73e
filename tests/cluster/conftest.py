"""In-process cluster members on a real ZooKeeper: fixtures and the ``Cluster`` helper.

* ``shared_zookeeper``: one server for the whole run (tests that do not hurt
  ZooKeeper); each test gets its own chroot from ``cluster_url``, so tests
  never see each other's clusters.
* ``zookeeper`` (``tests/_zookeeper.py``): a server of the test's own, for
  tests that restart or kill it.
* ``Cluster``: starts members with ``RecordingHooks``, waits for conditions
  (``until``: re-checked on every event any member emits, under a deadline;
  no sleeps), and checks on every ownership a member confirms that no two
  nodes ever confirmed one container at one epoch.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Final

import pytest
from kazoo.client import KazooClient

from headrace.cluster.layout import NodeInfo
from headrace.cluster.member import ClusterEvent, ClusterMember, OwnershipChanged
from headrace.store.disk.layout import SegmentMapping
from tests._zookeeper import ZooKeeper, zookeeper, zookeeper_installed

__all__ = ["Cluster", "RecordingHooks", "expire_session", "zookeeper"]

WAIT_S: Final = 20.0
"""Bound on every wait for the cluster to settle (ZooKeeper round trips on 2 busy cores)."""
SESSION_TIMEOUT_S: Final = 4.0
"""Members' session timeout: ZooKeeper's longest at 200 ms ticks, so a ZooKeeper
restart (about a second) stays well inside it."""


class RecordingHooks:
    """Container hooks that record their calls; ``hold_release`` makes releases wait."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, object]] = []
        self.hold_release = asyncio.Event()
        self.hold_release.set()
        self.on_release: Callable[[int], None] | None = None

    async def acquire(self, container: int, epoch: int) -> None:
        self.calls.append(("acquire", container, epoch))

    async def release(self, container: int, to: NodeInfo | None) -> None:
        self.calls.append(("release", container, None if to is None else to.node_id))
        if to is not None and self.on_release is not None:
            self.on_release(container)
        await self.hold_release.wait()


class Cluster:
    """Members of one cluster in this process, all on the test's loop."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.members: dict[str, ClusterMember] = {}
        self.hooks: dict[str, RecordingHooks] = {}
        self.confirmed: dict[tuple[int, int], str] = {}
        self.violations: list[str] = []
        self._changed = asyncio.Event()

    async def add(
        self,
        node_id: str,
        *,
        container_count: int | None = None,
        segment_mapping: SegmentMapping | None = None,
    ) -> ClusterMember:
        hooks = RecordingHooks()
        member = ClusterMember(
            self.url,
            NodeInfo(node_id, "127.0.0.1", {"controller": 9090, "segment_store": 12345}),
            container_count=container_count,
            hooks=hooks,
            segment_mapping=segment_mapping,
            session_timeout_s=SESSION_TIMEOUT_S,
            start_timeout_s=WAIT_S,
        )
        member.add_listener(lambda event: self._seen(member, event))
        await member.start()
        self.members[node_id] = member
        self.hooks[node_id] = hooks
        return member

    def _seen(self, member: ClusterMember, event: ClusterEvent) -> None:
        if isinstance(event, OwnershipChanged):
            for container in event.owned:
                key = (container, member.epoch(container))
                other = self.confirmed.setdefault(key, member.node_id)
                if other != member.node_id:
                    self.violations.append(
                        f"container {key[0]} epoch {key[1]}: {other} and {member.node_id}"
                    )
        self._changed.set()

    async def until(self, predicate: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
        """Wait until ``predicate()`` holds, re-checking after every member event."""
        async with asyncio.timeout(timeout_s):
            while not predicate():
                self._changed.clear()
                await self._changed.wait()

    async def remove(self, node_id: str) -> None:
        """Close a member: its session ends, as when its process is killed."""
        member = self.members.pop(node_id)
        await member.aclose()

    def live(self) -> list[ClusterMember]:
        return list(self.members.values())

    def owned_counts(self) -> dict[str, int]:
        return {node: len(m.owned()) for node, m in self.members.items()}

    def settled(self, count: int) -> bool:
        """Every container owned by exactly one live member, and every member agrees."""
        owners = [[m for m in self.live() if m.owns(c)] for c in range(count)]
        if any(len(o) != 1 for o in owners):
            return False
        return all(
            _node_id(m.owner(c)) == owners[c][0].node_id and m.epoch(c) == owners[c][0].epoch(c)
            for m in self.live()
            for c in range(count)
        )

    def leaders(self) -> set[str | None]:
        return {m.leader() for m in self.live()}

    async def aclose(self) -> None:
        await asyncio.gather(*(m.aclose() for m in self.members.values()))
        self.members.clear()


def _node_id(node: NodeInfo | None) -> str | None:
    return None if node is None else node.node_id


def expire_session(member: ClusterMember, server: ZooKeeper) -> None:
    """Make ZooKeeper expire ``member``'s session, as a long pause past the timeout would.

    A second client attaches to the session (its id and password) and closes
    it; ZooKeeper ends the session, and the member learns it is expired the
    next time it talks to the server (the way Curator and kazoo's own test
    harness expire sessions, without waiting out a timeout).
    """
    zk = member._zk
    assert zk is not None
    client_id = zk._client.client_id
    assert client_id is not None, "the member is not connected"
    thief = KazooClient(server.hosts, client_id=client_id, timeout=SESSION_TIMEOUT_S)
    thief.start_async().wait(WAIT_S)
    assert thief.connected
    thief.stop()
    thief.close()


@pytest.fixture(scope="session")
def shared_zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeper]:
    """One ZooKeeper for every test that does not stop it; clusters differ by chroot."""
    assert zookeeper_installed(), "ZooKeeper is missing: make test installs it (apt zookeeper)"
    server = ZooKeeper(tmp_path_factory.mktemp("shared-zookeeper"))
    server.start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def cluster_url(shared_zookeeper: ZooKeeper) -> str:
    return shared_zookeeper.url(f"/test-{uuid.uuid4().hex[:12]}")


@pytest.fixture
async def cluster(cluster_url: str) -> AsyncIterator[Cluster]:
    """A cluster on the shared ZooKeeper; checks the one-owner-per-epoch rule at the end."""
    group = Cluster(cluster_url)
    try:
        yield group
    finally:
        await group.aclose()
    assert group.violations == []


@pytest.fixture
async def own_cluster(zookeeper: ZooKeeper) -> AsyncIterator[tuple[Cluster, ZooKeeper]]:
    """A cluster on a ZooKeeper of the test's own, for tests that restart or kill it."""
    group = Cluster(zookeeper.url("/headrace"))
    try:
        yield group, zookeeper
    finally:
        await group.aclose()
    assert group.violations == []
