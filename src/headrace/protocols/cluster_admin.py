"""The cluster administration service: names and messages, shared by server and client.

A gRPC service of headrace's own, served on the controller port beside the
Pravega controller service (``docs/cluster.md#cli``). Its messages are UTF-8
JSON objects carried as the raw bytes of unary calls, so neither side needs
generated code:

==========  ===========================  ==========================================
method      request                      reply
==========  ===========================  ==========================================
``Status``  ``{}``                       ``{"nodes": [...], "containers": [...],
                                         "leader": ID|null}``
``Drain``   ``{"node": ID}``             ``{"node": ID, "draining": true,
                                         "already": BOOL, "containers": [N...]}``
``Undrain`` ``{"node": ID}``             ``{"node": ID, "draining": false,
                                         "already": BOOL, "containers": [N...]}``
==========  ===========================  ==========================================

A node in ``nodes``: ``{"id", "host", "ports": {door: port}, "alive",
"draining", "leader"}``; ``host`` and ``ports`` are null and ``{}`` for a node
that is not alive. A container: ``{"container", "owner", "state", "epoch",
"target", "copies"}``; ``copies`` lists the nodes holding its data (the
owner alone with one copy, every replica of a replicated container,
which also has ``in_sync``). ``containers`` in a drain reply are
the ones the node held when it was asked.

Errors are gRPC statuses with a one-line detail: ``FAILED_PRECONDITION``
from a server that is no cluster node (``NOT_A_CLUSTER_NODE``),
``NOT_FOUND`` for a node id the cluster does not know, ``INVALID_ARGUMENT``
for a malformed request, ``UNAVAILABLE`` while the node has no ZooKeeper
session, and with auth on ``UNAUTHENTICATED`` / ``PERMISSION_DENIED``.
"""

from __future__ import annotations

import json
from typing import Final

__all__ = [
    "DRAIN",
    "MAX_MESSAGE_BYTES",
    "METHODS",
    "NOT_A_CLUSTER_NODE",
    "SERVICE_NAME",
    "STATUS",
    "UNDRAIN",
    "MessageError",
    "decode",
    "encode",
    "method_path",
    "node_request",
]

SERVICE_NAME: Final = "headrace.cluster.v1.Cluster"
"""The gRPC service name (``/headrace.cluster.v1.Cluster/<method>``)."""

STATUS: Final = "Status"
DRAIN: Final = "Drain"
UNDRAIN: Final = "Undrain"
METHODS: Final = (STATUS, DRAIN, UNDRAIN)

MAX_MESSAGE_BYTES: Final = 4 * 1024 * 1024
"""Largest message either side decodes: a status of the largest cluster (1024
containers, some hundred bytes each) is a few hundred KiB; a request is a
node id."""

NOT_A_CLUSTER_NODE: Final = "this server is not a cluster node (started without --cluster)"
"""The detail of ``FAILED_PRECONDITION`` from a server started without ``--cluster``."""


class MessageError(ValueError):
    """Bytes that are not a message of this service."""


def method_path(method: str) -> str:
    """``/headrace.cluster.v1.Cluster/<method>``."""
    return f"/{SERVICE_NAME}/{method}"


def encode(message: dict[str, object]) -> bytes:
    """A message as compact UTF-8 JSON."""
    return json.dumps(message, separators=(",", ":"), sort_keys=True).encode()


def decode(data: bytes) -> dict[str, object]:
    """A message from its bytes.

    Raises:
        MessageError: too long, not UTF-8 JSON, or not an object.
    """
    if len(data) > MAX_MESSAGE_BYTES:
        raise MessageError(f"message of {len(data)} bytes (at most {MAX_MESSAGE_BYTES})")
    try:
        value = json.loads(data.decode("utf-8")) if data else {}
    except (UnicodeDecodeError, ValueError) as exc:
        raise MessageError(f"not a JSON message: {exc}") from exc
    if not isinstance(value, dict):
        raise MessageError("a message is a JSON object")
    return value


def node_request(data: bytes) -> str:
    """The node id a ``Drain`` or ``Undrain`` request names.

    Raises:
        MessageError: no ``node`` string in it.
    """
    node = decode(data).get("node")
    if not isinstance(node, str) or not node:
        raise MessageError('the request needs "node": a node id')
    return node
