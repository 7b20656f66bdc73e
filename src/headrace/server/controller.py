"""The Pravega controller listener: ``ControllerServer`` on the app's store.

``start_controller`` is the ``controller`` door's starter (default port 9090).
Each controller listener is its own gRPC server on the one controller model
(the first one runs the periodic jobs). The segment-store endpoint that
``getURI`` returns is the app's own segment-store listener of the same scheme
as the controller listener the call came in on (``segment_store_for``): a
client that reached a TLS controller gets the TLS segment store, one on a
plain controller the plain one; the combined server is its own segment store.
Its host is the segment-store listener's ``?advertise=``, else
``--advertise-host``, else the host it binds. A TLS listener serves gRPC over
TLS; the Pravega client then uses the ``getURI`` host as the TLS server name,
so it must be a DNS name on the certificate.
With ``--cluster``, ``getURI`` answers the segment store of the node owning
the segment's container, and ``getControllerServerList`` every live node's
controller (``ClusterNode``). The same port serves ``headrace cluster``'s
service (``cluster_admin.py``), with or without ``--cluster``.

gRPC owns the controller's connections, so the connection loop's counters do
not see them; an interceptor counts its calls as ``controller`` requests.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc  # type: ignore[import-untyped]

from headrace.cluster.metadata import ClusterModel
from headrace.controller.auth import TokenIssuer
from headrace.controller.service import ClusterRoutes, ControllerAuth, ControllerServer
from headrace.server._context import Listener, ListenerContext
from headrace.server._loop import ConnectionObserver
from headrace.server.cluster_admin import ClusterAdminService
from headrace.server.config import ListenerSpec, ServerConfig
from headrace.server.controller_proxy import ControllerProxy, LeaderSwitch
from headrace.server.tls import grpc_server_credentials

__all__ = ["segment_store_for", "start_controller"]


class _LeaderChannel:
    """The gRPC channel to the leader's controller, opened again when the leader moves."""

    def __init__(self, address: Callable[[], tuple[str, int] | None]) -> None:
        self._address = address
        self._channel: Any = None
        self._target: tuple[str, int] | None = None
        self._old: list[Any] = []

    def __call__(self) -> Any:
        target = self._address()
        if target is None:
            return None
        if target != self._target:
            if self._channel is not None:
                self._old.append(self._channel)  # calls in flight on it finish
            self._channel = grpc.aio.insecure_channel(f"{target[0]}:{target[1]}")
            self._target = target
        return self._channel

    async def aclose(self) -> None:
        channels = [*self._old, *([] if self._channel is None else [self._channel])]
        self._old, self._channel, self._target = [], None, None
        for channel in channels:
            await channel.close()


class _CountCalls(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Counts each RPC as one request of the ``controller`` listener."""

    def __init__(self, observer: ConnectionObserver) -> None:
        self._observer = observer

    async def intercept_service(
        self, continuation: Callable[[Any], Awaitable[Any]], handler_call_details: Any
    ) -> Any:
        self._observer.request_received()
        return await continuation(handler_call_details)


def segment_store_for(config: ServerConfig, tls: bool) -> tuple[str, int]:
    """The segment-store (host, port) a controller listener hands out in ``getURI``.

    The first segment-store listener of the same scheme (``tls``), else the
    first of any (a client then fails against it, as it would with no segment
    store); (host, 0) without one. Its host is the listener's advertised one,
    else ``--advertise-host``, else the host it binds.
    """
    stores = [spec for spec in config.listener_plan() if spec.door == "segment_store"]
    same: list[ListenerSpec] = [spec for spec in stores if spec.tls == tls]
    if not stores:
        return (config.advertise_host or config.host, 0)
    chosen = (same or stores)[0]
    return (chosen.advertise_host or config.advertise_host or chosen.host, chosen.port)


def _auth(ctx: ListenerContext, name: str) -> ControllerAuth | None:
    """Credential checks and the token signer (the key is shared with the
    segment store through the data directory); None with auth off. The
    password checks, and their failed-login buckets, are the app's, shared
    with RS-IO's ``auth`` extension; refusals count as ``controller``'s.
    """
    auth, doors = ctx.config.auth, ctx.door_auth
    if auth is None or doors is None:
        return None
    return ControllerAuth(
        doors.authenticator,
        TokenIssuer(doors.token_key, auth.token_ttl_s),
        refused=lambda reason: doors.refused(name, reason),
    )


async def start_controller(ctx: ListenerContext, host: str, port: int) -> Listener:
    """Serve the controller over gRPC on (host, port) with ``ctx.store``.

    The listener's ``aclose`` stops the gRPC server gracefully (RPCs in flight
    finish) and then the transaction sweep.

    Raises:
        OSError: the address could not be bound.
    """
    config = ctx.config
    name = ctx.listener_name("controller")
    credentials = None
    # ctx.ssl_context() checks the files and the key before gRPC gets them;
    # it is None for a plain listener.
    if config.tls is not None and ctx.ssl_context() is not None:
        credentials = grpc_server_credentials(config.tls)
    segment_store = segment_store_for(config, credentials is not None)
    spec = ctx.listener
    advertise_host = config.advertise_host
    if spec is not None and spec.advertise_host is not None:
        advertise_host = spec.advertise_host
    retention_interval_s = config.retention_interval_s
    settings = ctx.settings
    auth = _auth(ctx, name)
    observer = settings.observer_for(name) if settings.observer_for else None
    leader = None
    model = ctx.controller
    if ctx.cluster is not None and isinstance(model, ClusterModel):
        # Metadata has one writer, the leader: a follower forwards every call.
        channel = _LeaderChannel(ctx.cluster.leader_controller)
        proxy = ControllerProxy(channel)
        leading = lambda: model.leading  # noqa: E731
        leader = (lambda handler: LeaderSwitch(handler, proxy, leading), channel)
    server = await ControllerServer.start(
        ctx.store,
        host=host,
        port=port,
        segment_store=segment_store,
        retention_interval_s=retention_interval_s,
        auto_scale_interval_s=config.auto_scale_interval_s,
        watermark_interval_s=config.watermark_interval_s,
        model=ctx.controller,
        interceptors=[] if observer is None else [_CountCalls(observer)],
        credentials=credentials,
        advertise_host=advertise_host,
        auth=auth,
        routes=None
        if ctx.cluster is None
        else ClusterRoutes(ctx.cluster.locate, ctx.cluster.controllers),
        wrap_handler=None if leader is None else leader[0],
        handlers=[ClusterAdminService(ctx.cluster, auth).handler],
        jobs=name == "controller",  # the door's first listener runs the periodic jobs
    )
    if leader is None:
        return Listener(name, server.port, server.aclose)
    channel = leader[1]

    async def aclose() -> None:
        await server.aclose()
        await channel.aclose()

    return Listener(name, server.port, aclose)
