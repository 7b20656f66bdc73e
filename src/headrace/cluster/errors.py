"""Errors of the cluster layer: data-carrying, raised by ``member.py`` and ``layout.py``. ::

    HeadraceError
    ├── ConfigError                       (``headrace.errors``) a bad ``--cluster`` URL or node id
    └── ClusterError(message)             coordination could not go on
        ├── ZooKeeperUnavailable(hosts, timeout_s)
        ├── NodeIdInUse(node_id)
        └── BadRecord(path, reason)       a znode this version cannot read

A member that loses its ZooKeeper session does not raise: it fences itself
and reports that it owns nothing (``docs/cluster.md#fencing``).
"""

from __future__ import annotations

from headrace.errors import HeadraceError

__all__ = ["BadRecord", "ClusterError", "NodeIdInUse", "ZooKeeperUnavailable"]


class ClusterError(HeadraceError):
    """The cluster could not be joined or its records could not be read."""


class ZooKeeperUnavailable(ClusterError):
    """No server of the ensemble answered within ``timeout_s``."""

    def __init__(self, hosts: str, timeout_s: float) -> None:
        super().__init__(f"cannot reach ZooKeeper at {hosts} within {timeout_s:g} s")
        self.hosts = hosts
        self.timeout_s = timeout_s


class NodeIdInUse(ClusterError):
    """Another live session holds ``/nodes/<node_id>``: two nodes were given one id."""

    def __init__(self, node_id: str, waited_s: float) -> None:
        super().__init__(
            f"node id {node_id!r} is registered by another live session "
            f"(waited {waited_s:g} s for it to expire): give each node its own --node-id"
        )
        self.node_id = node_id
        self.waited_s = waited_s


class BadRecord(ClusterError):
    """A znode under the cluster's chroot holds what this version cannot decode."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"ZooKeeper record {path}: {reason}")
        self.path = path
        self.reason = reason
