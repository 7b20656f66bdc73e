"""ServerApp: the running server process: one store, the configured listeners.

``headrace serve`` builds a ``ServerConfig``, then ``ServerApp`` opens the
disk store, starts every enabled listener, and on stop (SIGTERM/SIGINT)
closes the listeners first (no new work), then the store (which finishes the
appends in flight, syncs and closes its files). Tests and ``headrace demo``
embed it the same way.

Listeners arrive protocol by protocol: each front door registers a starter
in ``LISTENER_STARTERS`` under its stable listener name (see
``config.DEFAULT_PORTS``). The HTTP listener starts first, so ``/health``
answers 503 while the others start; each listener gets the configured
limits and its metrics through ``_loop.LISTENER_SETTINGS``.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable

from headrace.controller.model import ControllerModel
from headrace.server._loop import LISTENER_SETTINGS, ListenerSettings
from headrace.server.authz import DoorAuth
from headrace.server.config import ServerConfig
from headrace.server.metrics import MeteredDiskStore, ServerMetrics, TimedFileOps
from headrace.server.tls import server_ssl_context
from headrace.store.api import SegmentStore

__all__ = ["LISTENER_STARTERS", "Listener", "ServerApp"]

log = logging.getLogger(__name__)


class Listener:
    """A started front door: its bound port and how to stop it."""

    def __init__(self, name: str, port: int, close: Callable[[], Awaitable[None]]) -> None:
        self.name = name
        self.port = port
        self._close = close

    async def aclose(self) -> None:
        await self._close()


ListenerStarter = Callable[["ServerApp", str, int], Awaitable[Listener]]
"""Start one listener on (host, port) serving the app's store; port 0 is never passed."""

LISTENER_STARTERS: dict[str, ListenerStarter] = {}


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
        self._listeners: list[Listener] = []
        self._stopping = asyncio.Event()
        self._closed = False
        self._ssl_context: ssl.SSLContext | None = None
        self.door_auth: DoorAuth | None = None
        """Users, grants and refusal counts shared by every front door; None: auth off."""
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
    def store_or_none(self) -> SegmentStore | None:
        """The store once started (for metrics, which may be read at any time)."""
        return self._store

    @property
    def controller_or_none(self) -> ControllerModel | None:
        return self._controller

    def health(self) -> tuple[bool, dict[str, object]]:
        """Whether every configured listener is up and the store takes writes, and
        a JSON-able report: each listener, and the store (``ok`` or why it stopped)."""
        running = self.ports
        listeners = {
            name: {"port": running.get(name, port), "up": name in running}
            for name, port in self.config.enabled_listeners().items()
            if name in _known_listeners()
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
        """The listeners that are running, with the ports they are bound to."""
        return {listener.name: listener.port for listener in self._listeners}

    async def start(self) -> None:
        """Open the store and start every enabled listener that this version has."""
        import headrace.server.listeners  # noqa: F401  (registers the starters; lazy: they import us)

        self.metrics.watch_gc()  # undone by aclose, which a failed start also runs
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
            if self.config.auth is not None:
                # A bad password file or key stops the start whichever listeners run.
                self.door_auth = DoorAuth(
                    self.config.auth, self.config.data_dir, self.metrics.auth_refused
                )
            self._controller = await ControllerModel.open(self._store)
            enabled = self.config.enabled_listeners()
            order = sorted(enabled, key=lambda name: name != "http")  # http first, for /health
            settings = ListenerSettings(self.config.limits, self.metrics.listener)
            for name in order:
                starter = LISTENER_STARTERS.get(name)
                if starter is None:
                    log.info("listener %s is not available in this version; skipped", name)
                    continue
                token = LISTENER_SETTINGS.set(settings)
                try:
                    listener = await starter(self, self.config.host, enabled[name])
                finally:
                    LISTENER_SETTINGS.reset(token)
                self._listeners.append(listener)
                log.info("%s listening on %s:%d", name, self.config.host, listener.port)
        except BaseException:
            await self.aclose()
            raise

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
        listeners, self._listeners = self._listeners, []
        for listener in reversed(listeners):
            try:
                await listener.aclose()
            except Exception:
                log.exception("closing listener %s failed", listener.name)
        if self._store is not None:
            await self._store.close()


def _known_listeners() -> set[str]:
    """Listener names this version can start (the others are skipped, not awaited)."""
    import headrace.server.listeners  # noqa: F401  (registers the starters)

    return set(LISTENER_STARTERS)
