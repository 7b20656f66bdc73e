"""This server as one node of a cluster (``--cluster``): its ``ClusterMember`` and hooks.

``ServerApp`` builds a ``ClusterNode`` before its listeners (so each door is
given it in the ``ListenerContext``) and starts it once every listener is
bound, so ``/nodes/<id>`` names the ports actually open. The doors ask it
who owns a segment (``owner_of``): this node, another node (its endpoint),
or nobody right now. Until the member confirmed a container in the current
ZooKeeper session, this node serves none of it (``docs/cluster.md#fencing``).

Hooks (``docs/cluster.md#moves``): with one copy of each container and the
data staying on this node's disk, ``acquire`` has nothing to open (the disk
store holds every container of this node already) and ``release`` flushes
the local store, so what was acknowledged is durable before the record says
the container is released.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Final

from headrace.cluster.layout import NodeInfo
from headrace.cluster.member import ClusterMember
from headrace.cluster.remote import Endpoint
from headrace.server.config import ClusterConfig
from headrace.store.api import SegmentStore
from headrace.store.disk import DiskStore

__all__ = ["HERE", "ClusterNode", "Owner", "StoreHooks"]

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


HERE: Final[Endpoint] = ("", 0)
"""The endpoint ``route`` names for this node itself (``RoutedStore``'s ``here``):
no address, so it never equals another node's."""

_LOCAL = Owner(local=True)
_NOBODY = Owner(local=False)


class StoreHooks:
    """Container hooks of a node whose containers' data stays on its own disk."""

    def __init__(self, store: SegmentStore) -> None:
        self._store = store

    async def acquire(self, container: int, epoch: int) -> None:
        log.info("cluster: serving container %d at epoch %d", container, epoch)

    async def release(self, container: int, to: NodeInfo | None) -> None:
        await self._store.flush()
        log.info(
            "cluster: released container %d%s",
            container,
            "" if to is None else f" to {to.node_id}",
        )


class ClusterNode:
    """One node's membership, as the server's doors use it.

    Args:
        config: ``--cluster``, ``--node-id``, ``--container-count``.
        store: the local store (flushed on release).
        advertise_host: the host every door of this node is announced at.
    """

    def __init__(self, config: ClusterConfig, store: SegmentStore, advertise_host: str) -> None:
        self.config = config
        self.node_id = config.node_id
        self._store = store
        self._advertise_host = advertise_host
        self._member: ClusterMember | None = None

    @property
    def member(self) -> ClusterMember | None:
        """The running member; None before ``start`` finished and after ``aclose``."""
        return self._member

    async def start(self, ports: dict[str, int]) -> None:
        """Join the cluster announcing ``ports`` (door name -> bound port).

        Raises:
            ClusterError: no ZooKeeper, the node id in use, or not a cluster.
        """
        member = ClusterMember(
            self.config.url,
            NodeInfo(self.node_id, self._advertise_host, dict(ports)),
            container_count=self.config.container_count,
            hooks=StoreHooks(self._store),
            segment_mapping=self._store.mapping if isinstance(self._store, DiskStore) else None,
        )
        await member.start()
        self._member = member
        log.info(
            "cluster: joined %s as %s (%d containers, leader %s)",
            self.config.url,
            self.node_id,
            member.container_count,
            member.leader(),
        )

    async def aclose(self) -> None:
        """Leave the cluster (this node's containers stay with it)."""
        member, self._member = self._member, None
        if member is not None:
            await member.aclose()

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
        }
