"""A controller that forwards every gRPC call to another node's controller.

In a cluster the controller metadata has one writer, the leader's model
(``docs/cluster.md#serving``); the other nodes' controllers pass each call on
to it. ``ControllerProxy`` is a grpc generic handler that does so without
decoding anything: the request's bytes go to the same method on the target
channel, the reply's bytes come back, and an error status (code and
details) is passed through as it came. Credentials (the ``authorization``
metadata) go along, so the leader checks them as if the client had called
it. While there is no target (no leader now), calls get ``UNAVAILABLE``,
which the Pravega clients retry.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final

import grpc  # type: ignore[import-untyped]

from headrace.controller.rpc import METHODS, SERVICE_NAME

__all__ = ["FORWARDED_METADATA", "ControllerProxy", "LeaderSwitch"]

FORWARDED_METADATA: Final = frozenset({"authorization"})
"""Request metadata passed on to the target: the caller's credentials. Nothing
else (grpc's own keys are set by the channel)."""

Target = Callable[[], Any]
"""Returns the ``grpc.aio.Channel`` of the controller to forward to, or None."""


class ControllerProxy:
    """A grpc generic handler forwarding every controller RPC to ``target()``."""

    def __init__(self, target: Target) -> None:
        self._target = target
        self._handler = grpc.method_handlers_generic_handler(
            SERVICE_NAME,
            {
                name: grpc.unary_unary_rpc_method_handler(self._forwarder(rpc.path))
                for name, rpc in METHODS.items()
            },
        )

    @property
    def handler(self) -> Any:
        """What ``grpc.aio.Server.add_generic_rpc_handlers`` takes."""
        return self._handler

    def _forwarder(self, path: str) -> Callable[[bytes, Any], Awaitable[bytes]]:
        async def forward(request: bytes, context: Any) -> bytes:
            channel = self._target()
            if channel is None:
                await context.abort(
                    grpc.StatusCode.UNAVAILABLE, "no controller leads the cluster now"
                )
            metadata = tuple(
                (key, value)
                for key, value in context.invocation_metadata() or ()
                if key in FORWARDED_METADATA
            )
            call = channel.unary_unary(path)  # no (de)serializers: bytes as they are
            try:
                reply: bytes = await call(
                    request, metadata=metadata, timeout=context.time_remaining()
                )
            except grpc.aio.AioRpcError as exc:
                await context.abort(exc.code(), exc.details() or "")
            return reply

        return forward


class LeaderSwitch(grpc.GenericRpcHandler):  # type: ignore[misc]
    """A node's controller in a cluster: its own service while it leads, the
    proxy to the leader otherwise, decided per call.

    Args:
        local: the generic handler of this node's controller service.
        proxy: the ``ControllerProxy`` forwarding to the leader.
        leading: whether this node leads and has loaded the metadata now.
    """

    def __init__(self, local: Any, proxy: ControllerProxy, leading: Callable[[], bool]) -> None:
        self._local = local
        self._proxy = proxy.handler
        self._leading = leading

    def service(self, handler_call_details: Any) -> Any:
        handler = self._local if self._leading() else self._proxy
        return handler.service(handler_call_details)
