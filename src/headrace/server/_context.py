"""What a front door is given to start, and what it gives back.

``ServerApp`` (``app.py``) builds one ``ListenerContext`` once its store and
controller are open and passes it to each starter of ``listeners.STARTERS``;
a starter returns a ``Listener``. Both sides import this module and neither
imports the other's, so the front doors never import ``app.py``.
"""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from headrace.controller.model import ControllerModel
from headrace.server._budget import MemoryBudget
from headrace.server._loop import (
    ConnectionLimits,
    ConnectionObserver,
    ConnectionSlots,
)
from headrace.server.authz import DoorAuth
from headrace.server.config import ListenerSpec, ServerConfig
from headrace.server.metrics import ServerMetrics
from headrace.store.api import SegmentStore

if TYPE_CHECKING:  # the cluster modules load kazoo: only with --cluster
    from headrace.server.cluster_node import ClusterNode

__all__ = ["Listener", "ListenerContext", "ListenerSettings", "ListenerStarter"]


class Listener:
    """A started front door: its bound port and how to stop it."""

    def __init__(self, name: str, port: int, close: Callable[[], Awaitable[None]]) -> None:
        self.name = name
        self.port = port
        self._close = close

    async def aclose(self) -> None:
        await self._close()


@dataclass(frozen=True, slots=True)
class ListenerSettings:
    """Limits and metrics of a TCP listener's connections (``start_tcp_listener``)."""

    limits: ConnectionLimits = field(default_factory=ConnectionLimits)
    observer_for: Callable[[str], ConnectionObserver] | None = None
    """Listener name -> its observer; None: nothing is counted."""
    budget: MemoryBudget | None = None
    """The server's budget of buffered bytes; None: no bound on the sum."""
    slots: ConnectionSlots | None = None
    """Connections of every listener, against the open-file limit; None: no bound."""


@dataclass(frozen=True, slots=True)
class ListenerContext:
    """The running server as its front doors see it, shared by every listener."""

    config: ServerConfig
    store: SegmentStore
    controller: ControllerModel
    """Scopes, streams and transactions, shared by every front door that creates streams."""
    metrics: ServerMetrics
    door_auth: DoorAuth | None
    """Users, grants and refusal counts; None: auth off."""
    node_key: bytes | None
    """The key node tokens are signed with (``--cluster-secret-file``, or the token
    key with auth on); None: no connection may act as a node."""
    ssl_context: Callable[[], ssl.SSLContext | None]
    """The one server ``SSLContext`` of every TLS listener; None without ``--tls-cert``.
    Built on first call, so a bad certificate stops the start at the first TLS listener."""
    health: Callable[[], tuple[bool, dict[str, object]]]
    """Whether every listener is up and the store takes writes, and the report (``/health``)."""
    settings: ListenerSettings
    """The configured limits, the metrics, and the bounds shared by every listener."""
    cluster: ClusterNode | None = None
    """This node's membership (``--cluster``); None: a single node serving every segment."""
    local_store: SegmentStore | None = None
    """In a cluster, this node's own store, which its segment store serves (``store``
    then reaches every segment at its owner); None: ``store`` is the node's own."""
    listener: ListenerSpec | None = None
    """The listener being started (``ServerApp`` gives each its own context,
    whose ``ssl_context`` is None for a plain one); None: the app's shared
    context, which a listener started apart (tests) takes."""
    door_state: dict[str, object] = field(default_factory=dict)
    """What every listener of a door shares, by door name (the TANK broker): the
    same dict in each listener's context, filled by the door's first listener."""

    @property
    def own_store(self) -> SegmentStore:
        """The store holding this node's own segments (the segment store's)."""
        return self.store if self.local_store is None else self.local_store

    def listener_name(self, door: str) -> str:
        """The name this listener counts, logs and is trusted under; ``door``
        outside a ``ServerApp``'s start."""
        return door if self.listener is None else self.listener.name


ListenerStarter = Callable[[ListenerContext, str, int], Awaitable[Listener]]
"""Start one listener on (host, port) with the context (whose ``listener`` says
which, and whose ``ssl_context`` whether over TLS); port 0 is never passed."""
