"""ServerApp: the running server process: one store, the configured listeners.

``headrace serve`` builds a ``ServerConfig``, then ``ServerApp`` opens the
disk store, starts every enabled listener, and on stop (SIGTERM/SIGINT)
closes the listeners first (no new work), then the store (which finishes the
appends in flight, syncs and closes its files). Tests and ``headrace demo``
embed it the same way.

Each listener of ``ServerConfig.listener_plan`` (the port flags' and the
``--listener`` entries) is started by its door's row of ``listeners.STARTERS``
(door name, as in ``config.DOORS`` -> starter). The HTTP listeners start
first, so ``/health`` answers 503 while the others start. Every starter gets
the same ``ListenerContext`` (the store, the controller model, the
configuration, TLS, auth, the metrics, and the configured limits and shared
bounds, ``ListenerSettings``) but for two fields: ``listener``, the one it
starts, and ``ssl_context``, which is None for a plain listener, so a door
serves TLS exactly when its listener's scheme is ``tls``.

Cluster. With ``--cluster`` the app builds a ``ClusterNode``
(``cluster_node.py``) before the listeners, so each gets it in the context,
starts it once every listener is bound (announcing the bound ports of each
door's first listener, by the door's name), and
leaves the cluster first when it stops (``docs/cluster.md#serving``).

Shared bounds. Every listener's connections charge one ``MemoryBudget``
(``--max-total-buffered-bytes``). Descriptors: at start the soft open-file
limit is raised to the hard one, and the limit is shared out
(``plan_descriptors``): a reserve for the process itself, the store's open
data files and file regions, and the rest for connections of all listeners
together (``ConnectionSlots``); a limit too low for that stops the start
with a ``ConfigError`` naming it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import logging
import os
import resource
import socket
import ssl
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, cast

from headrace.controller.auth import TokenIssuer, load_cluster_secret
from headrace.controller.model import ControllerModel
from headrace.controller.service import NODE_AUTH_PREFIX
from headrace.errors import ConfigError
from headrace.protocols.pravega.auth import ROOT, Permission
from headrace.server._budget import MemoryBudget
from headrace.server._context import Listener, ListenerContext, ListenerSettings
from headrace.server._loop import ConnectionSlots
from headrace.server.authz import DoorAuth
from headrace.server.config import DEFAULT_PORTS, ClusterConfig, ServerConfig
from headrace.server.listeners import STARTERS
from headrace.server.metrics import MeteredDiskStore, ServerMetrics, TimedFileOps
from headrace.server.tls import server_ssl_context
from headrace.store.api import SegmentStore
from headrace.store.disk import DiskStore
from headrace.store.disk.container import MAX_OPEN_DATA_FILES, MIN_OPEN_DATA_FILES
from headrace.store.disk.store import MAX_OPEN_REGIONS

if TYPE_CHECKING:  # the cluster modules load kazoo: only with --cluster
    from headrace.cluster.routing import RoutedStore
    from headrace.server.cluster_node import ClusterNode

__all__ = [
    "FD_RESERVE",
    "DescriptorPlan",
    "ServerApp",
    "listen_error",
    "plan_descriptors",
    "raise_open_file_limit",
]

log = logging.getLogger(__name__)

FD_RESERVE: Final = 128
"""Descriptors kept for everything but connections and data files: standard
streams, the event loop's selector and wake-up pipe, the listening sockets,
the store's lock and WAL files, a checkpoint's files, the gRPC server's own
poller and connections, TLS and password files."""

MIN_OPEN_REGIONS: Final = 8
"""The fewest file regions (zero-copy reads) the store may hand out at once."""

MIN_CONNECTIONS: Final = 16
"""The fewest connections a server must be able to hold to start at all."""

UNLIMITED_OPEN_FILES: Final = 65536
"""The soft limit asked for where the hard limit is unlimited (the kernel
caps the number anyway)."""


@dataclass(frozen=True, slots=True)
class DescriptorPlan:
    """How the open-file limit is shared out (see ``plan_descriptors``)."""

    limit: int
    data_files_per_container: int
    regions: int
    connections: int


def raise_open_file_limit() -> int:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard one; the soft limit now in force.

    The usual soft limit (1024) is a default for interactive shells; a server
    holding thousands of connections and data files needs what the hard limit
    allows, and raising the soft one needs no privilege.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = UNLIMITED_OPEN_FILES if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-file limit from %d to %d: %s", soft, wanted, exc)
    return UNLIMITED_OPEN_FILES if soft == resource.RLIM_INFINITY else soft


def plan_descriptors(limit: int, container_count: int) -> DescriptorPlan:
    """Share ``limit`` descriptors out: ``FD_RESERVE`` for the process, a quarter
    of the rest (at most ``MAX_OPEN_DATA_FILES`` each) for the containers' open
    data files, an eighth (at most ``MAX_OPEN_REGIONS``) for file regions, and
    what is left for connections of every listener together.

    Raises:
        ConfigError: the limit leaves fewer than ``MIN_CONNECTIONS`` connections.
    """
    room = limit - FD_RESERVE
    per_container = room // (4 * container_count) if container_count else 0
    data_files = max(MIN_OPEN_DATA_FILES, min(MAX_OPEN_DATA_FILES, per_container))
    regions = max(MIN_OPEN_REGIONS, min(MAX_OPEN_REGIONS, room // 8))
    connections = room - data_files * container_count - regions
    if connections < MIN_CONNECTIONS:
        needed = FD_RESERVE + MIN_OPEN_DATA_FILES * container_count + MIN_OPEN_REGIONS
        raise ConfigError(
            f"the open-file limit is {limit}: headrace needs at least "
            f"{needed + MIN_CONNECTIONS} (raise it with ulimit -n)"
        )
    return DescriptorPlan(limit, data_files, regions, connections)


_BIND_REASONS: Final = {
    errno.EADDRINUSE: ("address already in use", "stop what uses the port, or choose another"),
    errno.EACCES: ("permission denied: ports below 1024 need privileges", "choose another"),
    errno.EADDRNOTAVAIL: ("no such address on this machine", "check --host, or choose another"),
}
"""errno -> (cause, fix) for the usual reasons a port cannot be bound."""


def listen_error(
    name: str, host: str, port: int, exc: OSError, *, flag: str | None = None
) -> ConfigError:
    """One line for a listener that could not bind: which listener, why, and the flag
    (``flag``: the option that placed it, default its port flag).

    gRPC (the controller) does not say why a bind failed, so the reason is
    found by binding a plain socket to the same address.
    """
    code = exc.errno
    if code is None:
        try:
            with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
                probe.bind((host, port))
        except OSError as again:
            code = again.errno
    reason, fix = _BIND_REASONS.get(
        code or 0, (os.strerror(code) if code else str(exc), "choose another")
    )
    if flag is None:
        flag = f"--{name.replace('_', '-')}-port"
        off = " (0 turns the listener off)"
    else:
        off = ""
    return ConfigError(
        f"the {name} listener cannot listen on {host}:{port} ({reason}): "
        f"{fix} port with {flag}{off}"
    )


def _no_tls() -> ssl.SSLContext | None:
    """The ``ssl_context`` of a plain listener's context."""
    return None


class ServerApp:
    """One headrace server: a store and its listeners.

    Args:
        config: validated configuration.
        store: an already open store to serve instead of opening the disk store
            named by the configuration (tests, embedding); the app closes it.
    """

    def __init__(self, config: ServerConfig, *, store: SegmentStore | None = None) -> None:
        config.validate()
        self.config = config
        self._store = store
        self._controller: ControllerModel | None = None
        self._context: ListenerContext | None = None
        self._listeners: list[Listener] = []
        self._cluster: ClusterNode | None = None
        self._routed: RoutedStore | None = None
        self._metadata_task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._closed = False
        self._ssl_context: ssl.SSLContext | None = None
        self.budget = MemoryBudget(config.max_total_buffered_bytes)
        """Bytes buffered by every connection of every listener (read by the metrics)."""
        self.slots = ConnectionSlots()
        """Connections of every listener, bounded by the open-file limit at start."""
        self.door_auth: DoorAuth | None = None
        """Users, grants and refusal counts shared by every front door; None: auth off."""
        self.node_key: bytes | None = None
        """The key node tokens are checked with: the cluster secret, else with auth
        on the token key; None: no connection can prove it is another node."""
        self.metrics = ServerMetrics()
        self.metrics.attach(self)

    @property
    def store(self) -> SegmentStore:
        if self._store is None:
            raise RuntimeError("the server has not been started")
        return self._store

    @property
    def controller(self) -> ControllerModel:
        """Scopes, streams and transactions, shared by every front door that
        creates streams (the gRPC controller, TANK topics, Lumberjack targets)."""
        if self._controller is None:
            raise RuntimeError("the server has not been started")
        return self._controller

    @property
    def listener_context(self) -> ListenerContext:
        """What every listener was given at start (a listener started apart, in
        tests, takes the same)."""
        if self._context is None:
            raise RuntimeError("the server has not been started")
        return self._context

    @property
    def store_or_none(self) -> SegmentStore | None:
        """The store once started (for metrics, which may be read at any time)."""
        return self._store

    @property
    def controller_or_none(self) -> ControllerModel | None:
        return self._controller

    @property
    def cluster(self) -> ClusterNode | None:
        """This node's membership with ``--cluster`` (None without, or before start)."""
        return self._cluster

    def health(self) -> tuple[bool, dict[str, object]]:
        """Whether every configured listener is up and the store takes writes, and
        a JSON-able report: each listener, and the store (``ok`` or why it stopped)."""
        running = self.ports
        listeners = {
            name: {"port": running.get(name, port), "up": name in running}
            for name, port in self.config.enabled_listeners().items()
        }
        failure = None if self._store is None else self._store.failure
        ok = (
            not self._closed
            and failure is None
            and all(entry["up"] for entry in listeners.values())
        )
        report: dict[str, object] = {
            "status": "ok" if ok else "unavailable",
            "listeners": listeners,
            "store": failure or "ok",
        }
        if self._cluster is not None:
            view = self._cluster.report()
            model = self._controller
            if model is not None and hasattr(model, "leading"):  # a ClusterModel
                leading, loaded = model.leading, model.loaded  # type: ignore[attr-defined]
                view["metadata"] = "leading" if leading else "following" if loaded else "loading"
            report["cluster"] = view
        return ok, report

    def ssl_context(self) -> ssl.SSLContext | None:
        """The one server ``SSLContext`` of every TLS listener; None without ``--tls-cert``.

        Built once, on first use, so every listener shares it (and a bad
        certificate stops the start at the first listener, with a ``ConfigError``).
        """
        if self.config.tls is None:
            return None
        if self._ssl_context is None:
            self._ssl_context = server_ssl_context(self.config.tls)
        return self._ssl_context

    @property
    def ports(self) -> dict[str, int]:
        """The listeners that are running, with the ports they are bound to (a
        door's first listener under the door's name: ``controller``,
        ``segment_store``...; the cluster announces those)."""
        return {listener.name: listener.port for listener in self._listeners}

    async def start(self) -> None:
        """Open the store and start every enabled listener."""
        self.metrics.watch_gc()  # undone by aclose, which a failed start also runs
        open_files = raise_open_file_limit()
        if self._store is None:
            store = await MeteredDiskStore.open(
                self.config.data_dir,
                fsync=self.config.fsync,
                fsync_interval_s=self.config.fsync_interval_s,
                container_count=self.config.container_count,
                file_ops=TimedFileOps(self.metrics.fsync_seconds.observe),
                max_segment_attributes=self.config.max_segment_attributes,
            )
            assert isinstance(store, MeteredDiskStore)  # DiskStore.open builds ``cls``
            store.metrics = self.metrics
            self._store = store
        try:
            store_now = self._store
            containers = store_now.container_count if isinstance(store_now, DiskStore) else 0
            plan = plan_descriptors(open_files, containers)
            if isinstance(store_now, DiskStore):
                store_now.limit_open_files(plan.data_files_per_container, plan.regions)
            self.slots.max_connections = plan.connections
            log.info(
                "open-file limit %d: %d data files per container, %d file regions, "
                "%d connections in all",
                plan.limit,
                plan.data_files_per_container,
                plan.regions,
                plan.connections,
            )
            secret_file = self.config.cluster_secret_file
            self.node_key = None if secret_file is None else load_cluster_secret(secret_file)
            if self.config.cluster is not None and self.node_key is None:
                from headrace.cluster.secret import cluster_secret  # loads kazoo

                self.node_key = await cluster_secret(self.config.cluster.url)
            if self.config.auth is not None:
                # A bad password file or key stops the start whichever listeners run.
                self.door_auth = DoorAuth(
                    self.config.auth,
                    self.config.data_dir,
                    self.metrics.auth_refused,
                    token_key=self.node_key,
                )
                self.node_key = self.door_auth.token_key
            doors_store: SegmentStore = self._store
            if self.config.cluster is None:
                self._controller = await ControllerModel.open(self._store)
            else:
                doors_store = self._join_cluster(self.config.cluster)
            # http first, for /health
            order = sorted(self.config.listener_plan(), key=lambda spec: spec.door != "http")
            self._context = context = ListenerContext(
                config=self.config,
                store=doors_store,
                controller=self.controller,
                metrics=self.metrics,
                door_auth=self.door_auth,
                node_key=self.node_key,
                ssl_context=self.ssl_context,
                health=self.health,
                settings=ListenerSettings(
                    self.config.limits, self.metrics.listener, self.budget, self.slots
                ),
                cluster=self._cluster,
                local_store=None if doors_store is self._store else self._store,
            )
            explicit = {spec.door for spec in self.config.listeners}
            for spec in order:
                own = dataclasses.replace(
                    context, listener=spec, ssl_context=self.ssl_context if spec.tls else _no_tls
                )
                try:
                    listener = await STARTERS[spec.door](own, spec.host, spec.port)
                except OSError as exc:
                    door = spec.door.replace("_", "-")
                    flag = f"--listener {door}=..." if spec.door in explicit else None
                    raise listen_error(spec.name, spec.host, spec.port, exc, flag=flag) from exc
                listener.name = spec.name
                self._listeners.append(listener)
                log.info(
                    "%s listening on %s (%s)",
                    spec.name,
                    dataclasses.replace(spec, port=listener.port).address(),
                    spec.scheme,
                )
            if self._cluster is not None:
                # Announced once every door is bound, with the ports it got: each
                # door's first listener, under the door's name.
                first = {n: p for n, p in self.ports.items() if n in DEFAULT_PORTS}
                await self._cluster.start(first)
                self._follow_leader()
        except BaseException:
            await self.aclose()
            raise

    def _join_cluster(self, cluster: ClusterConfig) -> SegmentStore:
        """Build this node's membership and the store and model its doors share:
        every segment at its owner (``RoutedStore``), the metadata written by the
        leader alone (``ClusterModel``, ``docs/cluster.md#metadata``)."""
        from headrace.cluster.metadata import ClusterModel
        from headrace.cluster.routing import RoutedStore
        from headrace.server.cluster_node import HERE, ClusterNode  # loads kazoo

        assert self._store is not None
        node = self._cluster = ClusterNode(
            cluster,
            self._store,
            self.config.advertise_host or self.config.host,
            listen_host=self.config.host,
            node_key=self.node_key,
        )
        self._routed = RoutedStore(
            self._store,
            node.route,
            here=HERE,
            token_key=self.node_key,
            forwarder_id=uuid.uuid5(uuid.NAMESPACE_URL, f"headrace-node:{node.node_id}"),
        )
        # RoutedStore.append hands back the owner's own coroutine: a SegmentStore.
        routed = cast(SegmentStore, self._routed)
        self._controller = ClusterModel(
            routed, leader_controller=node.leader_controller, authorization=self._node_bearer()
        )
        return routed

    def _node_bearer(self) -> Callable[[], str] | None:
        """With auth on, the ``authorization`` of this node's own calls to the
        leader's controller: a fresh node token each time; None with auth off."""
        doors, node = self.door_auth, self._cluster
        if doors is None or node is None:
            return None
        issuer = TokenIssuer(doors.token_key)
        name = node.node_id
        return lambda: (
            NODE_AUTH_PREFIX + issuer.issue(name, ROOT, Permission.READ_UPDATE, node=True)
        )

    def _follow_leader(self) -> None:
        """Start keeping the metadata model's mode as the election says."""
        from headrace.cluster.metadata import ClusterModel

        node, model = self._cluster, self._controller
        assert node is not None and node.member is not None and isinstance(model, ClusterModel)
        member = node.member
        member.add_listener(lambda _event: model.wake())
        self._metadata_task = asyncio.create_task(
            model.run(lambda: member.is_leader), name="cluster metadata"
        )

    def request_stop(self) -> None:
        """Ask ``serve_until_stopped`` to return (safe from a signal handler)."""
        self._stopping.set()

    async def serve_until_stopped(self) -> None:
        await self._stopping.wait()

    async def aclose(self) -> None:
        """Stop listeners, then close the store (finishing in-flight appends). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.metrics.unwatch_gc()
        task, self._metadata_task = self._metadata_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._cluster is not None:
            # Leave first: other nodes stop sending clients here.
            try:
                await self._cluster.aclose()
            except Exception:
                log.exception("leaving the cluster failed")
        listeners, self._listeners = self._listeners, []
        for listener in reversed(listeners):
            try:
                await listener.aclose()
            except Exception:
                log.exception("closing listener %s failed", listener.name)
        model = self._controller
        if model is not None and hasattr(model, "leading"):  # a ClusterModel
            await model.aclose()  # type: ignore[attr-defined]
        if self._routed is not None:
            await self._routed.close()  # and the local store
        elif self._store is not None:
            await self._store.close()
