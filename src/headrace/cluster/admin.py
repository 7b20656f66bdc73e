"""What ``headrace cluster status|drain|undrain`` ask of a node, answered from its view.

``status`` turns a member's view (its last read of ZooKeeper) into the
JSON-able report of ``protocols/cluster_admin.py``: every node the cluster
knows (live, draining, or named by a container record), every container's
record, and the leader. Any node answers; each answers from its own view,
which follows ZooKeeper within its watches' round trip.

``drain`` and ``undrain`` write or remove ``/drain/<id>`` through the member
(``docs/cluster.md#drain``); the leader does the moving. A node id the
cluster does not know is refused (``UnknownNode``), so a typo does not leave
a drain record behind for a node that may join later.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, Final

from headrace.cluster._zk import CONNECTION_ERRORS
from headrace.cluster.errors import ClusterError
from headrace.cluster.layout import ContainerState, check_node_id
from headrace.cluster.member import ClusterMember
from headrace.errors import ConfigError

__all__ = [
    "MAX_LISTED_NODES",
    "MAX_NODE_ID_CHARS",
    "ZOOKEEPER_CALL_TIMEOUT_S",
    "UnknownNode",
    "drain",
    "held_by",
    "known_nodes",
    "status",
    "undrain",
]

ZOOKEEPER_CALL_TIMEOUT_S: Final = 10.0
"""Bound on one drain or undrain write: ZooKeeper answers in milliseconds, and a
node without its session would otherwise hold the caller until it is back."""


MAX_LISTED_NODES: Final = 32
"""Known node ids an ``UnknownNode`` message lists: enough to spot a typo,
and the message stays one short line whatever the cluster's size."""


MAX_NODE_ID_CHARS: Final = 64
"""A node id is at most 64 characters (``layout.check_node_id``): a longer one
asked for is quoted that far, not whole, in the refusal."""


class UnknownNode(ClusterError):
    """A node id that is neither live, nor draining, nor named by any container."""

    def __init__(self, node_id: str, known: list[str]) -> None:
        listed = ", ".join(known[:MAX_LISTED_NODES]) or "none"
        if len(known) > MAX_LISTED_NODES:
            listed += f" and {len(known) - MAX_LISTED_NODES} more"
        shown = node_id[:MAX_NODE_ID_CHARS] + ("..." if len(node_id) > MAX_NODE_ID_CHARS else "")
        super().__init__(f"no node {shown!r} in the cluster (known nodes: {listed})")
        self.node_id = node_id


def known_nodes(member: ClusterMember) -> set[str]:
    """Ids of every node the member's view names: live, draining, owner or target."""
    known = set(member.nodes()) | set(member.draining())
    for record in member.records().values():
        known.update(n for n in (record.owner, record.target) if n is not None)
    return known


def held_by(member: ClusterMember, node_id: str) -> list[int]:
    """Containers ``node_id`` owns, hands over or is being handed, as the view has it.

    A released container names its last owner until the next one claims it,
    so a drain is over once this is empty (``docs/cluster.md#moves``).
    """
    return sorted(
        c for c, record in member.records().items() if node_id in (record.owner, record.target)
    )


def status(member: ClusterMember) -> dict[str, object]:
    """The member's view of the whole cluster (the ``Status`` reply)."""
    live = member.nodes()
    draining = member.draining()
    leader = member.leader()
    nodes = []
    for node_id in sorted(known_nodes(member)):
        info = live.get(node_id)
        nodes.append(
            {
                "id": node_id,
                "host": None if info is None else info.host,
                "ports": {} if info is None else dict(sorted(info.ports.items())),
                "alive": info is not None,
                "draining": node_id in draining,
                "leader": node_id == leader,
            }
        )
    containers = []
    live = member.nodes()
    under = offline = 0
    for number in range(member.container_count):
        record = member.record(number)
        held = record.owner is not None and record.state is not ContainerState.RELEASED
        entry: dict[str, object] = {
            "container": number,
            "owner": record.owner,
            "state": record.state.value,
            "epoch": record.epoch,
            "target": record.target,
            "copies": list(record.replicas) if record.replicas else [record.owner] if held else [],
        }
        if record.replicas:  # a replicated container (docs/replication.md)
            entry["in_sync"] = list(record.in_sync)
            under += len(record.in_sync) < member.cluster.replication_factor
        if record.state is not ContainerState.OWNED or record.owner not in live:
            offline += 1
        containers.append(entry)
    return {
        "nodes": nodes,
        "containers": containers,
        "leader": leader,
        "replication_factor": member.cluster.replication_factor,
        "min_in_sync": member.cluster.min_in_sync,
        "under_replicated": under,
        "offline": offline,
    }


def _checked(member: ClusterMember, node_id: str) -> str:
    try:
        check_node_id(node_id)
    except ConfigError as exc:
        raise UnknownNode(node_id, sorted(known_nodes(member))) from exc
    if node_id not in known_nodes(member):
        raise UnknownNode(node_id, sorted(known_nodes(member)))
    return node_id


async def drain(member: ClusterMember, node_id: str) -> dict[str, object]:
    """Write ``/drain/<node_id>``: the leader moves every container off it.

    Raises:
        UnknownNode: the cluster does not know ``node_id``.
        ClusterError: ZooKeeper did not take the write (no session, or too slow).
    """
    _checked(member, node_id)
    already = node_id in member.draining()
    await _bounded(member.drain(node_id), "drain")
    return {
        "node": node_id,
        "draining": True,
        "already": already,
        "containers": held_by(member, node_id),
    }


async def undrain(member: ClusterMember, node_id: str) -> dict[str, object]:
    """Remove ``/drain/<node_id>``: the node is eligible again and gets its share back.

    Raises:
        UnknownNode: the cluster does not know ``node_id``.
        ClusterError: ZooKeeper did not take the write.
    """
    _checked(member, node_id)
    already = node_id not in member.draining()
    await _bounded(member.undrain(node_id), "undrain")
    return {
        "node": node_id,
        "draining": False,
        "already": already,
        "containers": held_by(member, node_id),
    }


async def _bounded(call: Coroutine[Any, Any, None], what: str) -> None:
    try:
        async with asyncio.timeout(ZOOKEEPER_CALL_TIMEOUT_S):
            await call
    except TimeoutError as exc:
        raise ClusterError(
            f"{what}: ZooKeeper did not answer within {ZOOKEEPER_CALL_TIMEOUT_S:g} s"
        ) from exc
    except CONNECTION_ERRORS as exc:
        raise ClusterError(f"{what}: no ZooKeeper session ({type(exc).__name__})") from exc
