"""The cluster's ZooKeeper layout: every znode path and record encoding, in one place.

Pure: no ZooKeeper client here, only names and bytes (``docs/cluster.md#layout``).
Under the chroot of the ``--cluster`` URL::

    /cluster            ClusterRecord     persistent; written once, by the first node
    /nodes/<id>         NodeInfo          ephemeral: gone when the node's session ends
    /containers/<n>     ContainerRecord   persistent; changed only by version-conditional writes
    /leader             LeaderRecord      ephemeral: the node that places containers
    /drain/<id>         DrainRecord       persistent: move every container off node <id>

Every record is one UTF-8 JSON object with ``"v": RECORD_VERSION``; a reader
refuses a record of another version, or one that breaks the rules below, with
``BadRecord`` (never a guess). The first node creates ``/cluster``, ``/nodes``,
``/drain``, ``/containers`` and every ``/containers/<n>`` in one transaction,
so a cluster is either wholly there or not at all.

A container record's ``state`` (``docs/cluster.md#moves``):

* ``OWNED``: ``owner`` serves it at ``epoch``.
* ``MOVING``: the leader asked ``owner`` to hand it to ``target``; the owner
  still holds it until it has released it.
* ``RELEASED``: nobody serves it; ``target`` claims it next, writing ``OWNED``
  with ``epoch + 1``. ``owner`` is the last owner (None and epoch 0 for a
  container that never had one).

Each change of owner bumps ``epoch``, by a write conditional on the version
that was read, so two nodes can never own one container at one epoch.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from headrace.cluster.errors import BadRecord
from headrace.errors import ConfigError
from headrace.store.disk.layout import SegmentMapping

__all__ = [
    "CLUSTER_PATH",
    "CONTAINERS_PATH",
    "DEFAULT_CHROOT",
    "DEFAULT_CLUSTER_CONTAINERS",
    "DEFAULT_ZOOKEEPER_PORT",
    "DRAIN_PATH",
    "LEADER_PATH",
    "MAPPING_NAMES",
    "MAX_CLUSTER_CONTAINERS",
    "MAX_REPLICATION_FACTOR",
    "NODES_PATH",
    "RECORD_VERSION",
    "UNOWNED",
    "ClusterRecord",
    "ClusterUrl",
    "ContainerRecord",
    "ContainerState",
    "LeaderRecord",
    "NodeInfo",
    "check_node_id",
    "container_path",
    "decode_cluster",
    "decode_container",
    "decode_leader",
    "decode_node",
    "drain_path",
    "encode",
    "node_path",
    "parse_cluster_url",
]

CLUSTER_PATH: Final = "/cluster"
NODES_PATH: Final = "/nodes"
CONTAINERS_PATH: Final = "/containers"
LEADER_PATH: Final = "/leader"
DRAIN_PATH: Final = "/drain"

RECORD_VERSION: Final = 1
"""The ``"v"`` of every record this code writes and the only one it reads."""

MAX_RECORD_BYTES: Final = 16 * 1024
"""Largest record decoded: the biggest (a node's door table) is a few hundred
bytes; ZooKeeper itself would accept 1 MiB (``jute.maxbuffer``)."""

DEFAULT_CLUSTER_CONTAINERS: Final = 16
"""Containers of a new cluster: enough to spread over a handful of nodes
(one container is the unit that moves), few enough to watch cheaply."""

MAX_CLUSTER_CONTAINERS: Final = 1024
"""Containers a cluster may have: the creating transaction (one znode each)
stays far below ZooKeeper's 1 MiB request limit, and each node watches every
container record. Pravega clusters run tens to hundreds."""

DEFAULT_CHROOT: Final = "/headrace"
"""Where a ``zk://`` URL without a path keeps the cluster."""

DEFAULT_ZOOKEEPER_PORT: Final = 2181
"""ZooKeeper's client port, for a host given without one."""

MAX_ZOOKEEPER_HOSTS: Final = 16
"""Hosts one URL may name: ensembles have 3, 5 or 7 servers."""

MAX_REPLICATION_FACTOR: Final = 7
"""Copies a container may have: ZooKeeper-coordinated logs keep 3 or 5; each
copy is a follower connection and a full copy of the container's data."""

MAX_DOORS: Final = 32
"""Doors one node record may list (a node has seven listeners)."""

_NODE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
"""A node id is a znode name: no ``/``, never ``.`` or ``..``, at most 64 characters."""
_ZNODE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$")
_DOOR = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
_HOST = re.compile(r"^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9][A-Za-z0-9.-]{0,252})$")


def check_node_id(node_id: str) -> str:
    """``node_id`` if it is a valid node id (it becomes a znode name).

    Raises:
        ConfigError: the id could escape ``/nodes`` or is not 1-64 of ``[A-Za-z0-9._-]``.
    """
    if not _NODE_ID.match(node_id):
        raise ConfigError(
            f"--node-id {node_id!r}: use 1 to 64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return node_id


def node_path(node_id: str) -> str:
    return f"{NODES_PATH}/{check_node_id(node_id)}"


def drain_path(node_id: str) -> str:
    return f"{DRAIN_PATH}/{check_node_id(node_id)}"


def container_path(container: int) -> str:
    assert 0 <= container < MAX_CLUSTER_CONTAINERS
    return f"{CONTAINERS_PATH}/{container}"


# --------------------------------------------------------------------------- the URL


@dataclass(frozen=True, slots=True)
class ClusterUrl:
    """``zk://host:port[,host:port...]/chroot``: the ensemble and the cluster's root znode."""

    hosts: tuple[tuple[str, int], ...]
    chroot: str

    @property
    def connect_string(self) -> str:
        """``host:port,host:port`` as ZooKeeper clients take it (IPv6 hosts in brackets)."""
        return ",".join(f"{host}:{port}" for host, port in self.hosts)

    def __str__(self) -> str:
        return f"zk://{self.connect_string}{self.chroot}"


def parse_cluster_url(text: str) -> ClusterUrl:
    """Parse ``--cluster``: ``zk://`` then hosts (port default 2181) then an optional chroot.

    Raises:
        ConfigError: one line naming what is wrong.
    """
    scheme, sep, rest = text.partition("://")
    if not sep or scheme.lower() != "zk":
        raise ConfigError(f"--cluster {text!r}: expected zk://host:port[,host:port...]/chroot")
    authority, slash, path = rest.partition("/")
    chroot = "/" + path.rstrip("/") if slash and path.strip("/") else DEFAULT_CHROOT
    for name in chroot.split("/")[1:]:
        if not _ZNODE_NAME.match(name) or name == "zookeeper":
            raise ConfigError(
                f"--cluster {text!r}: chroot part {name!r} must be 1 to 64 letters, digits, "
                "'.', '_' or '-' (and not 'zookeeper')"
            )
    entries = authority.split(",")
    if not authority or len(entries) > MAX_ZOOKEEPER_HOSTS:
        raise ConfigError(
            f"--cluster {text!r}: name 1 to {MAX_ZOOKEEPER_HOSTS} ZooKeeper hosts as host:port"
        )
    hosts: list[tuple[str, int]] = []
    for entry in entries:
        split = entry.rfind("]") + 1 if entry.startswith("[") else entry.find(":")
        host, port_part = (entry, "") if split == -1 else (entry[:split], entry[split:])
        port_text = port_part.removeprefix(":") if port_part else str(DEFAULT_ZOOKEEPER_PORT)
        if (
            not _HOST.match(host)
            or (port_part and not port_part.startswith(":"))
            or not re.fullmatch("[0-9]{1,5}", port_text)
            or not 1 <= int(port_text) <= 65535
        ):
            raise ConfigError(f"--cluster {text!r}: {entry!r} is not host:port")
        hosts.append((host, int(port_text)))
    return ClusterUrl(tuple(hosts), chroot)


# --------------------------------------------------------------------------- records


class ContainerState(enum.Enum):
    """Where a container is in the move handshake (``docs/cluster.md#moves``)."""

    OWNED = "OWNED"
    MOVING = "MOVING"
    RELEASED = "RELEASED"


MAPPING_NAMES: Final = {SegmentMapping.HASH: "hash", SegmentMapping.GROUPED: "grouped"}
"""How ``/cluster`` names each segment mapping (``store/disk/layout.py``)."""


@dataclass(frozen=True, slots=True)
class ClusterRecord:
    """``/cluster``: fixed when the cluster is created."""

    container_count: int
    replication_factor: int = 1
    """Copies of each container (``docs/replication.md``); a new container is
    placed once that many nodes are eligible."""
    min_in_sync: int = 1
    """In-sync copies a container needs to acknowledge anything; with fewer,
    appends are refused (retriable) and reads go on."""
    mapping: SegmentMapping = SegmentMapping.GROUPED
    """How segment names give containers; every node's data dir must use the
    same. A record without ``"mapping"`` (written before it existed) is ``HASH``."""


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """``/nodes/<id>``: how to reach one live node's doors."""

    node_id: str
    host: str
    """The advertised host (``--advertise-host``, else ``--host``)."""
    ports: Mapping[str, int] = field(default_factory=dict)
    """Door name (``controller``, ``segment_store``, ``tank``...) to port; absent: door off."""

    def address(self, door: str) -> tuple[str, int] | None:
        """``(host, port)`` of ``door``, or None if the node does not open it."""
        port = self.ports.get(door)
        return None if port is None else (self.host, port)


@dataclass(frozen=True, slots=True)
class ContainerRecord:
    """``/containers/<n>``; see the module docstring for the states."""

    owner: str | None
    epoch: int
    state: ContainerState
    target: str | None = None
    replicas: tuple[str, ...] = ()
    """The nodes holding a copy (replicated clusters; empty: the owner's copy only)."""
    in_sync: tuple[str, ...] = ()
    """The replicas holding every committed record; the next leader is one of
    them. Changed only by the leader (and by a failover), conditionally."""

    @property
    def destination(self) -> str | None:
        """The node the container is with once the handshake in course ends."""
        return self.owner if self.state is ContainerState.OWNED else self.target


UNOWNED: Final = ContainerRecord(None, 0, ContainerState.RELEASED)
"""Every container's record when the cluster is created."""


@dataclass(frozen=True, slots=True)
class LeaderRecord:
    """``/leader``: the node that places containers."""

    node_id: str


def encode(record: ClusterRecord | NodeInfo | ContainerRecord | LeaderRecord | None) -> bytes:
    """The znode data of ``record`` (None: a ``/drain/<id>`` marker)."""
    body: dict[str, object]
    match record:
        case ClusterRecord():
            body = {
                "containers": record.container_count,
                "replication_factor": record.replication_factor,
                "min_in_sync": record.min_in_sync,
                "mapping": MAPPING_NAMES[record.mapping],
            }
        case NodeInfo():
            body = {"node": record.node_id, "host": record.host, "ports": dict(record.ports)}
        case ContainerRecord():
            body = {
                "owner": record.owner,
                "epoch": record.epoch,
                "state": record.state.value,
                "target": record.target,
            }
            if record.replicas:
                body["replicas"] = list(record.replicas)
                body["in_sync"] = list(record.in_sync)
        case LeaderRecord():
            body = {"node": record.node_id}
        case None:
            body = {}
    return json.dumps({"v": RECORD_VERSION, **body}, separators=(",", ":")).encode()


def _load(path: str, data: bytes, keys: set[str]) -> dict[str, object]:
    if len(data) > MAX_RECORD_BYTES:
        raise BadRecord(path, f"{len(data)} bytes, more than {MAX_RECORD_BYTES}")
    try:
        body = json.loads(data)
    except (UnicodeDecodeError, ValueError):
        raise BadRecord(path, "not a JSON object") from None
    if not isinstance(body, dict):
        raise BadRecord(path, "not a JSON object")
    if body.get("v") != RECORD_VERSION:
        raise BadRecord(path, f"record version {body.get('v')!r}; this node reads only 1")
    missing = keys - body.keys()
    if missing:
        raise BadRecord(path, f"no {sorted(missing)[0]!r}")
    return body


def _int(path: str, body: Mapping[str, object], key: str, low: int, high: int) -> int:
    value = body[key]
    if type(value) is not int or not low <= value <= high:
        raise BadRecord(path, f"{key} {value!r} is not an integer in {low}..{high}")
    return value


def _node_id(path: str, body: Mapping[str, object], key: str, *, optional: bool) -> str | None:
    value = body[key]
    if value is None and optional:
        return None
    if not isinstance(value, str) or not _NODE_ID.match(value):
        raise BadRecord(path, f"{key} {value!r} is not a node id")
    return value


def decode_cluster(data: bytes, path: str = CLUSTER_PATH) -> ClusterRecord:
    body = _load(path, data, {"containers", "replication_factor", "min_in_sync"})
    count = _int(path, body, "containers", 1, MAX_CLUSTER_CONTAINERS)
    factor = _int(path, body, "replication_factor", 1, MAX_REPLICATION_FACTOR)
    name = body.get("mapping", MAPPING_NAMES[SegmentMapping.HASH])
    mapping = next((m for m, n in MAPPING_NAMES.items() if n == name), None)
    if mapping is None:
        raise BadRecord(path, f"mapping {name!r} is not one of {sorted(MAPPING_NAMES.values())}")
    return ClusterRecord(count, factor, _int(path, body, "min_in_sync", 1, factor), mapping)


def decode_node(data: bytes, path: str) -> NodeInfo:
    body = _load(path, data, {"node", "host", "ports"})
    node_id = _node_id(path, body, "node", optional=False)
    assert node_id is not None
    host, ports = body["host"], body["ports"]
    if not isinstance(host, str) or not _HOST.match(host):
        raise BadRecord(path, f"host {host!r} is not a host name or address")
    if not isinstance(ports, dict) or len(ports) > MAX_DOORS:
        raise BadRecord(path, f"ports is not an object of at most {MAX_DOORS} doors")
    for door in ports:
        if not _DOOR.match(door):
            raise BadRecord(path, f"door name {door!r} is not [a-z][a-z0-9_]*")
        _int(path, ports, door, 1, 65535)
    return NodeInfo(node_id, host, dict(ports))


def decode_container(data: bytes, path: str) -> ContainerRecord:
    body = _load(path, data, {"owner", "epoch", "state", "target"})
    epoch = _int(path, body, "epoch", 0, 2**63 - 1)
    try:
        state = ContainerState(body["state"])
    except ValueError:
        raise BadRecord(
            path, f"state {body['state']!r} is not one of OWNED, MOVING, RELEASED"
        ) from None
    owner = _node_id(path, body, "owner", optional=True)
    target = _node_id(path, body, "target", optional=True)
    replicas = _node_ids(path, body, "replicas")
    in_sync = _node_ids(path, body, "in_sync")
    record = ContainerRecord(owner, epoch, state, target, replicas, in_sync)
    rule = _broken_rule(record)
    if rule:
        raise BadRecord(path, rule)
    return record


def _node_ids(path: str, body: Mapping[str, object], key: str) -> tuple[str, ...]:
    value = body.get(key, [])
    if not isinstance(value, list) or len(value) > MAX_REPLICATION_FACTOR:
        raise BadRecord(path, f"{key} is not a list of at most {MAX_REPLICATION_FACTOR} node ids")
    ids = tuple(_node_id(path, {key: item}, key, optional=False) or "" for item in value)
    if len(set(ids)) != len(ids):
        raise BadRecord(path, f"{key} names a node twice")
    return ids


def _broken_rule(record: ContainerRecord) -> str | None:
    """Why ``record`` cannot exist, or None: each state names exactly the nodes it needs."""
    if not set(record.in_sync) <= set(record.replicas):
        return "in_sync names a node that is not a replica"
    if (
        record.replicas
        and record.state is ContainerState.OWNED
        and record.owner not in record.in_sync
    ):
        return "a replicated container's owner must be in sync"
    if (record.owner is None) != (record.epoch == 0):
        return "owner and epoch disagree: epoch 0 exactly when there never was an owner"
    if record.state is ContainerState.OWNED and record.target is not None:
        return "an OWNED container has no target"
    if record.state is ContainerState.MOVING and (record.target in (None, record.owner)):
        return "a MOVING container needs a target other than its owner"
    if record.state is ContainerState.RELEASED and record.epoch > 0 and record.target is None:
        return "a released container that had an owner needs a target"
    return None


def decode_leader(data: bytes, path: str = LEADER_PATH) -> LeaderRecord:
    body = _load(path, data, {"node"})
    node_id = _node_id(path, body, "node", optional=False)
    assert node_id is not None
    return LeaderRecord(node_id)
