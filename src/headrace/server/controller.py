"""The Pravega controller listener: ``ControllerServer`` on the app's store.

Registers itself as the ``controller`` listener (default port 9090). The
segment-store endpoint that ``getURI`` returns is the app's own segment-store
listener (``config.host`` and ``config.ports["segment_store"]``): the combined
server is its own segment store.
"""

from __future__ import annotations

from headrace.controller.service import ControllerServer
from headrace.server.app import LISTENER_STARTERS, Listener, ServerApp

__all__ = ["start_controller"]


async def start_controller(app: ServerApp, host: str, port: int) -> Listener:
    """Serve the controller over gRPC on (host, port) with ``app.store``.

    The listener's ``aclose`` stops the gRPC server gracefully (RPCs in flight
    finish) and then the transaction sweep.

    Raises:
        OSError: the address could not be bound.
    """
    segment_store = (app.config.host, app.config.ports.get("segment_store", 0))
    retention_interval_s = app.config.retention_interval_s
    server = await ControllerServer.start(
        app.store,
        host=host,
        port=port,
        segment_store=segment_store,
        retention_interval_s=retention_interval_s,
        auto_scale_interval_s=app.config.auto_scale_interval_s,
        model=app.controller,
    )
    return Listener("controller", server.port, server.aclose)


LISTENER_STARTERS["controller"] = start_controller
