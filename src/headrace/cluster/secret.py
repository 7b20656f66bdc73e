"""The cluster secret kept in ZooKeeper, for a cluster started without a secret file.

Nodes sign node tokens with the cluster secret, and the owner of an internal
segment (``_system/...``: the controller's tables) accepts a change to it
only with such a token (``docs/threat-model.md``). With
``--cluster-secret-file`` every node reads it from its file. Without one,
the first node to start makes a random secret and stores it at ``/secret``
under the cluster's chroot (create-if-absent, so two nodes starting together
agree on one), and every node reads it from there before it opens a door.
Anyone who can read the chroot can then act as a node: protect ZooKeeper
(its network, or its ACLs), or give every node the same secret file
(``docs/cluster.md#secret``).
"""

from __future__ import annotations

import secrets
from typing import Final

from headrace.cluster._zk import ZkSession
from headrace.cluster.errors import ClusterError
from headrace.cluster.layout import ClusterUrl
from headrace.controller.auth import MAX_CLUSTER_SECRET_BYTES, TOKEN_KEY_BYTES

__all__ = ["SECRET_PATH", "SECRET_TIMEOUT_S", "cluster_secret"]

SECRET_PATH: Final = "/secret"
"""The znode, under the chroot, holding the secret's bytes."""

SECRET_TIMEOUT_S: Final = 30.0
"""Bound on reaching ZooKeeper for the secret (the node's start waits on it)."""

SECRET_SESSION_S: Final = 10.0
"""Session timeout of the short session that reads the secret."""


async def cluster_secret(url: ClusterUrl) -> bytes:
    """The cluster's secret from ZooKeeper, made now if this node is the first.

    Raises:
        ZooKeeperUnavailable: no ZooKeeper server answered in time.
        ClusterError: ``/secret`` holds something that is not a secret.
    """
    session = ZkSession(url, SECRET_SESSION_S, lambda _state: None, lambda _path: None)
    await session.connect(SECRET_TIMEOUT_S)
    try:
        await session.create(SECRET_PATH, secrets.token_bytes(TOKEN_KEY_BYTES))
        found = await session.get(SECRET_PATH, watch=False)
    finally:
        await session.close()
    if found is None or not TOKEN_KEY_BYTES <= len(found[0]) <= MAX_CLUSTER_SECRET_BYTES:
        raise ClusterError(f"{url.chroot}{SECRET_PATH} in ZooKeeper is not a cluster secret")
    return found[0]
