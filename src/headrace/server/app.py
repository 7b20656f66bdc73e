"""ServerApp: the running server process: one store, the configured listeners.

``headrace serve`` builds a ``ServerConfig``, then ``ServerApp`` opens the
disk store, starts every enabled listener, and on stop (SIGTERM/SIGINT)
closes the listeners first (no new work), then the store (which finishes the
appends in flight, syncs and closes its files). Tests and ``headrace demo``
embed it the same way.

Listeners arrive protocol by protocol: each front door registers a starter
in ``LISTENER_STARTERS`` under its stable listener name (see
``config.DEFAULT_PORTS``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from headrace.controller.model import ControllerModel
from headrace.server.config import ServerConfig
from headrace.store.api import SegmentStore
from headrace.store.disk import DiskStore

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
    def ports(self) -> dict[str, int]:
        """The listeners that are running, with the ports they are bound to."""
        return {listener.name: listener.port for listener in self._listeners}

    async def start(self) -> None:
        """Open the store and start every enabled listener that this version has."""
        import headrace.server.listeners  # noqa: F401  (registers the starters; lazy: they import us)

        if self._store is None:
            self._store = await DiskStore.open(
                self.config.data_dir,
                fsync=self.config.fsync,
                fsync_interval_s=self.config.fsync_interval_s,
                container_count=self.config.container_count,
            )
        try:
            self._controller = await ControllerModel.open(self._store)
            for name, port in self.config.enabled_listeners().items():
                starter = LISTENER_STARTERS.get(name)
                if starter is None:
                    log.info("listener %s is not available in this version; skipped", name)
                    continue
                listener = await starter(self, self.config.host, port)
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
        listeners, self._listeners = self._listeners, []
        for listener in reversed(listeners):
            try:
                await listener.aclose()
            except Exception:
                log.exception("closing listener %s failed", listener.name)
        if self._store is not None:
            await self._store.close()
