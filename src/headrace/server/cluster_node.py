"""This server as one node of a cluster (``--cluster``): its ``ClusterMember`` and hooks.

``ServerApp`` builds a ``ClusterNode`` before its listeners (so each door is
given it in the ``ListenerContext``) and starts it once every listener is
bound, so ``/nodes/<id>`` names the ports actually open. The doors ask it
who owns a segment (``owner_of``): this node, another node (its endpoint),
or nobody right now. Until the member confirmed a container in the current
ZooKeeper session, this node serves none of it (``docs/cluster.md#fencing``).

Hooks (``docs/cluster.md#moves``): a container moves with its data.
``release`` detaches it from the disk store (what is in flight finishes, a
checkpoint is written, its files are closed and no longer change) before the
record says ``RELEASED``; the transfer door (``container_transfer.py``) then
serves those files to the node the container was released to. ``acquire``
opens the container: this node's own copy when this node was its last owner
(a restart, a re-claim after a lost session) or when nobody ever owned it;
otherwise the copy fetched from its last owner, checked and installed in
place of whatever this node had (``DiskStore.attach``). A store other than
the disk store (tests, embedding) is only flushed on release.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from headrace.cluster.errors import ClusterError
from headrace.cluster.layout import ContainerState, NodeInfo
from headrace.cluster.member import (
    ClusterEvent,
    ClusterMember,
    ContainersChanged,
    NodesChanged,
    OwnershipChanged,
)
from headrace.cluster.remote import Endpoint
from headrace.cluster.replication import (
    REPLICATION_DOOR,
    ContainerFollower,
    ContainerLeader,
    ReplicationDoor,
    ReplicationRefused,
)
from headrace.errors import ProtocolError, StoreError
from headrace.server.config import ClusterConfig
from headrace.server.container_transfer import TRANSFER_DOOR, TransferServer, fetch_container
from headrace.store.api import SegmentStore
from headrace.store.disk import DiskStore

__all__ = ["FOLLOW_RETRY_S", "HERE", "ClusterNode", "Owner", "Replicas", "StoreHooks"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Owner:
    """Who serves a segment now, as this node sees it.

    ``local``: this node (confirmed in the current session). Otherwise
    ``node`` is the live owner, or None when nobody serves it right now
    (a move in course, a dead owner, or a fenced node).
    """

    local: bool
    node: NodeInfo | None = None

    def address(self, door: str) -> tuple[str, int] | None:
        """The owner's ``(host, port)`` for ``door``; None if unknown or closed."""
        return None if self.node is None else self.node.address(door)


FOLLOW_RETRY_S: Final = 0.5
"""Pause before a follower subscribes again after its connection to the
leader ended (the leader restarting, a new leader not serving yet)."""

HERE: Final[Endpoint] = ("", 0)
"""The endpoint ``route`` names for this node itself (``RoutedStore``'s ``here``):
no address, so it never equals another node's."""

_LOCAL = Owner(local=True)
_NOBODY = Owner(local=False)


class Replicas:
    """This node's leaders and followers of replicated containers (``docs/replication.md``).

    A container whose record names replicas is led by its owner, which copies
    its records to the other replicas (``ContainerLeader``, served on this
    node's replication door); every other replica follows it
    (``ContainerFollower``), re-subscribing whenever the record names a new
    owner or the connection ends, and refusing any epoch older than the record's.
    """

    def __init__(
        self,
        store: DiskStore,
        node_id: str,
        member: Callable[[], ClusterMember | None],
        node_key: bytes | None,
        lag_max_s: float,
    ) -> None:
        self._store = store
        self._node_id = node_id
        self._member = member
        self._node_key = node_key
        self._lag_max_s = lag_max_s
        self.door = ReplicationDoor(node_key)
        self._followers: dict[int, tuple[str, ContainerFollower, asyncio.Task[None]]] = {}

    def replicated(self, container: int) -> bool:
        """Whether ``container``'s record names copies this node holds."""
        member = self._member()
        return member is not None and self._node_id in member.record(container).replicas

    async def lead(self, container: int, epoch: int) -> None:
        """Lead ``container`` at ``epoch`` from this node's own copy (the acquire hook)."""
        member = self._member()
        assert member is not None
        await self._stop_following(container)
        self.stop_leading(container)
        if not self._store.is_attached(container):
            await self._store.attach(container)
        record = member.record(container)
        leader = ContainerLeader(
            self._store,
            container,
            epoch=epoch,
            node_id=self._node_id,
            in_sync=frozenset(record.in_sync),
            min_in_sync=member.cluster.min_in_sync,
            write_in_sync=functools.partial(member.write_in_sync, container, epoch),
            lag_max_s=self._lag_max_s,
            live=lambda: member.nodes().keys(),
        )
        await leader.start()
        self.door.leaders[container] = leader

    def stop_leading(self, container: int) -> None:
        leader = self.door.leaders.pop(container, None)
        if leader is not None:
            leader.stop()

    def on_event(self, event: ClusterEvent) -> None:
        """Stop leading what this node no longer owns; follow what it should."""
        member = self._member()
        if member is None:
            return
        if isinstance(event, OwnershipChanged):
            for container in list(self.door.leaders):
                record = member.record(container)
                mine = record.owner == self._node_id and record.state is ContainerState.OWNED
                claiming = (
                    record.state is ContainerState.RELEASED and record.target == self._node_id
                )
                if container not in event.owned and (event.fenced or not (mine or claiming)):
                    self.stop_leading(container)  # not between its acquire and its claim
        if isinstance(event, ContainersChanged | NodesChanged | OwnershipChanged):
            self.sync_followers(member)

    def sync_followers(self, member: ClusterMember) -> None:
        nodes = member.nodes()
        for container, record in member.records().items():
            follows = (
                self._node_id in record.replicas
                and record.owner != self._node_id
                and record.state is ContainerState.OWNED
                and record.owner in nodes
                and member.live
            )
            current = self._followers.get(container)
            if follows and current is not None and current[0] == record.owner:
                current[1].fence(record.epoch)
                continue
            if current is not None:
                current[2].cancel()
                del self._followers[container]
            if follows and record.owner is not None:
                follower = ContainerFollower(
                    self._store,
                    container,
                    node_id=self._node_id,
                    epoch=record.epoch,
                    node_key=self._node_key,
                )
                task = asyncio.create_task(
                    self._follow(member, container, record.owner, follower),
                    name=f"follow container {container}",
                )
                self._followers[container] = (record.owner, follower, task)

    async def _follow(
        self, member: ClusterMember, container: int, leader: str, follower: ContainerFollower
    ) -> None:
        said: str | None = None
        while True:
            node = member.nodes().get(leader)
            address = None if node is None else node.address(REPLICATION_DOOR)
            try:
                if address is None:
                    raise ClusterError(f"{leader} announces no {REPLICATION_DOOR} door")
                await follower.run(*address)
            except (
                ReplicationRefused,
                ClusterError,
                ProtocolError,
                StoreError,
                OSError,
                TimeoutError,
                asyncio.IncompleteReadError,
            ) as exc:
                text = str(exc) or type(exc).__name__
                if text != said:  # once per reason, not once per retry
                    log.warning(
                        "cluster: following container %d at %s: %s", container, leader, text
                    )
                    said = text
            await asyncio.sleep(FOLLOW_RETRY_S)

    async def _stop_following(self, container: int) -> None:
        current = self._followers.pop(container, None)
        if current is not None:
            current[2].cancel()
            await asyncio.gather(current[2], return_exceptions=True)

    def report(self) -> dict[str, object]:
        """Per container: this node's role, epoch, in-sync copies and lag (``/health``)."""
        containers: dict[str, object] = {}
        for container, leader in sorted(self.door.leaders.items()):
            end = leader.end
            containers[str(container)] = {
                "role": "leader",
                "epoch": leader.epoch,
                "in_sync": sorted(leader.in_sync),
                "commit": leader.commit,
                "end": end,
                "follower_lag_records": {
                    node: end - f.position for node, f in sorted(leader.followers.items())
                },
                "replicated_bytes": leader.replicated_bytes,
            }
        for container, (leader_id, follower, _) in sorted(self._followers.items()):
            containers[str(container)] = {
                "role": "follower",
                "leader": leader_id,
                "epoch": follower.epoch,
                "durable": follower.durable,
                "commit": follower.commit,
                "replicated_bytes": follower.replicated_bytes,
            }
        return containers

    async def aclose(self) -> None:
        for container in list(self._followers):
            await self._stop_following(container)
        for container in list(self.door.leaders):
            self.stop_leading(container)
        await self.door.aclose()


class StoreHooks:
    """Container hooks that move a container's data with it (module docstring).

    Args:
        store: the node's store.
        node_id: this node's id.
        member: returns the running member (the records say who owned a container last).
        node_key: the key this node signs its node tokens with (None: none).
    """

    def __init__(
        self,
        store: SegmentStore,
        node_id: str,
        member: Callable[[], ClusterMember | None],
        node_key: bytes | None = None,
        replicas: Replicas | None = None,
    ) -> None:
        self._store = store
        self._node_id = node_id
        self._member = member
        self._node_key = node_key
        self._replicas = replicas
        self.released: set[int] = set()
        """Containers this node released to another node, their copy still here."""

    async def acquire(self, container: int, epoch: int) -> None:
        store, member = self._store, self._member()
        self.released.discard(container)
        replicas = self._replicas
        if replicas is not None and replicas.replicated(container):
            await replicas.lead(container, epoch)  # its own copy: no data moves
            log.info("cluster: leading container %d at epoch %d", container, epoch)
            return
        if isinstance(store, DiskStore) and member is not None:
            _check_counts(store, member)
            previous = member.record(container).owner
            if previous is None or previous == self._node_id:
                await store.attach(container)  # this node's own copy (or nothing yet)
            else:
                source = member.nodes().get(previous)
                if source is None:
                    raise ClusterError(
                        f"container {container}: its last owner {previous} is not live, "
                        "and only it has the data"
                    )
                await fetch_container(store, container, source, self._node_id, self._node_key)
        log.info("cluster: serving container %d at epoch %d", container, epoch)

    async def release(self, container: int, to: NodeInfo | None) -> None:
        store = self._store
        replicas = self._replicas
        if replicas is not None and replicas.replicated(container):
            replicas.stop_leading(container)  # the copy stays here, and follows
            log.info("cluster: no longer leading container %d", container)
            return
        if isinstance(store, DiskStore):
            await store.detach(container)
            if to is not None:
                self.released.add(container)
        else:
            await store.flush()
        log.info(
            "cluster: released container %d%s",
            container,
            "" if to is None else f" to {to.node_id}",
        )


def moved_away(member: ClusterMember, container: int) -> bool:
    """Whether ``container``'s record names another owner than this node, and
    nothing brings it here: this node's copy of it will never be served again."""
    record = member.record(container)
    if record.owner is None or record.owner == member.node_id:
        return False
    return record.target != member.node_id and not member.owns(container)


def _check_counts(store: DiskStore, member: ClusterMember) -> None:
    """The disk store's containers must be the cluster's, or a move would carry
    other segments than the ones the cluster routes there."""
    if store.container_count != member.container_count:
        raise ClusterError(
            f"the data dir has {store.container_count} containers and the cluster "
            f"{member.container_count}: start this node on a new data dir with "
            f"--container-count {member.container_count}"
        )


class ClusterNode:
    """One node's membership, as the server's doors use it.

    Args:
        config: ``--cluster``, ``--node-id``, ``--container-count``.
        store: the local store (its containers move with the cluster's).
        advertise_host: the host every door of this node is announced at.
        listen_host: the host the transfer door binds (``--host``).
        node_key: the key node tokens are signed and checked with (None: none).
    """

    def __init__(
        self,
        config: ClusterConfig,
        store: SegmentStore,
        advertise_host: str,
        *,
        listen_host: str = "127.0.0.1",
        node_key: bytes | None = None,
    ) -> None:
        self.config = config
        self.node_id = config.node_id
        self._store = store
        self._advertise_host = advertise_host
        self._listen_host = listen_host
        self._node_key = node_key
        self._member: ClusterMember | None = None
        self._joining: ClusterMember | None = None
        self._transfer: TransferServer | None = None
        self.replicas: Replicas | None = None
        self._discarding: dict[int, asyncio.Task[bool]] = {}

    @property
    def member(self) -> ClusterMember | None:
        """The running member; None before ``start`` finished and after ``aclose``."""
        return self._member

    async def start(self, ports: dict[str, int]) -> None:
        """Join the cluster announcing ``ports`` (door name -> bound port).

        With a disk store, this node's transfer door is bound first and
        announced with the others.

        Raises:
            ClusterError: no ZooKeeper, the node id in use, not a cluster, or a
                data dir whose container count is not the cluster's.
        """
        ports = dict(ports)
        store = self._store
        if isinstance(store, DiskStore):
            self._transfer = TransferServer(store, self._current_member, self._node_key)
            await self._transfer.start(self._listen_host)
            ports[TRANSFER_DOOR] = self._transfer.port
            self.replicas = Replicas(
                store,
                self.node_id,
                self._current_member,
                self._node_key,
                self.config.replica_lag_max_s,
            )
            await self.replicas.door.start(self._listen_host)
            ports[REPLICATION_DOOR] = self.replicas.door.port
        hooks = StoreHooks(store, self.node_id, self._current_member, self._node_key, self.replicas)
        member = ClusterMember(
            self.config.url,
            NodeInfo(self.node_id, self._advertise_host, ports),
            container_count=self.config.container_count,
            hooks=hooks,
            segment_mapping=store.mapping if isinstance(store, DiskStore) else None,
            replication_factor=self.config.replication_factor,
            min_in_sync=self.config.min_in_sync,
        )
        if isinstance(store, DiskStore):
            member.add_listener(lambda event: self._discard_moved(store, member, hooks, event))
        if self.replicas is not None:
            member.add_listener(self.replicas.on_event)
        self._joining = member
        try:
            await member.start()
            if isinstance(store, DiskStore):
                _check_counts(store, member)
        except BaseException:
            self._joining = None
            await member.aclose()
            await self._close_transfer()
            raise
        self._member = member
        if self.replicas is not None:
            self.replicas.sync_followers(member)
        log.info(
            "cluster: joined %s as %s (%d containers, leader %s)",
            self.config.url,
            self.node_id,
            member.container_count,
            member.leader(),
        )

    def _discard_moved(
        self, store: DiskStore, member: ClusterMember, hooks: StoreHooks, event: ClusterEvent
    ) -> None:
        """Empty the copies of containers this node released once their new owner
        took them (``DiskStore.discard``): the disk is freed, and no restart can
        open an old copy."""
        if not isinstance(event, ContainersChanged):
            return
        for container in sorted(event.containers & hooks.released):
            if container in self._discarding or not moved_away(member, container):
                continue
            hooks.released.discard(container)
            task = asyncio.create_task(
                store.discard(container, functools.partial(moved_away, member, container))
            )
            self._discarding[container] = task
            task.add_done_callback(functools.partial(self._discarded, container))

    def _discarded(self, container: int, task: asyncio.Task[bool]) -> None:
        self._discarding.pop(container, None)
        if not task.cancelled() and task.exception() is not None:
            log.error(
                "cluster: could not empty container %d after it moved: %s",
                container,
                task.exception(),
            )

    def _current_member(self) -> ClusterMember | None:
        """The member, from the moment it starts joining (its hooks run before
        ``start`` returns)."""
        return self._member or self._joining

    async def aclose(self) -> None:
        """Leave the cluster (this node's containers stay with it)."""
        member, self._member = self._member, None
        self._joining = None
        if member is not None:
            await member.aclose()
        for task in list(self._discarding.values()):
            await asyncio.wait([task])  # a discard runs to its end: it is a file swap
        await self._close_transfer()

    async def _close_transfer(self) -> None:
        replicas, self.replicas = self.replicas, None
        if replicas is not None:
            await replicas.aclose()
        transfer, self._transfer = self._transfer, None
        if transfer is not None:
            await transfer.aclose()

    def owner_of(self, segment: str) -> Owner:
        """Who serves ``segment`` now (a cheap lookup, any number of times per request)."""
        member = self._member
        if member is None:
            return _NOBODY
        container = member.container_of(segment)
        if member.owns(container):
            return _LOCAL
        if not member.live:
            return _NOBODY  # fenced: the owner it last read may be fenced or gone too
        node = member.owner(container)
        if node is None or node.node_id == self.node_id:
            return _NOBODY  # moving, its node dead, or this node fenced
        return Owner(local=False, node=node)

    def locate(self, segment: str) -> tuple[str, int] | None:
        """The segment-store ``(host, port)`` serving ``segment`` now; None: nobody."""
        owner = self.owner_of(segment)
        if owner.local:
            member = self._member
            assert member is not None
            return member.node.address("segment_store")
        return owner.address("segment_store")

    def route(self, segment: str) -> Endpoint | None:
        """``RoutedStore``'s lookup: ``HERE`` for this node, the owner's
        segment-store endpoint, or None while nobody serves ``segment``."""
        owner = self.owner_of(segment)
        return HERE if owner.local else owner.address("segment_store")

    def leader_controller(self) -> tuple[str, int] | None:
        """The cluster leader's controller ``(host, port)``; None while there is
        none, or when it is this node (which then serves metadata itself)."""
        member = self._member
        leader = None if member is None else member.leader()
        if member is None or leader is None or leader == self.node_id:
            return None
        node = member.nodes().get(leader)
        return None if node is None else node.address("controller")

    def controllers(self) -> list[tuple[str, int]]:
        """Every live node's controller ``(host, port)``, by node id."""
        member = self._member
        if member is None:
            return []
        nodes = member.nodes()
        found = (nodes[n].address("controller") for n in sorted(nodes))
        return [address for address in found if address is not None]

    def report(self) -> dict[str, object]:
        """This node's view, JSON-able (``/health``)."""
        member = self._member
        if member is None:
            return {"node": self.node_id, "joined": False}
        return {
            "node": self.node_id,
            "joined": True,
            "leader": member.leader(),
            "is_leader": member.is_leader,
            "containers": member.container_count,
            "owned": sorted(member.owned()),
            "nodes": sorted(member.nodes()),
            "replication_factor": member.cluster.replication_factor,
            "min_in_sync": member.cluster.min_in_sync,
            "replicas": {} if self.replicas is None else self.replicas.report(),
        }
