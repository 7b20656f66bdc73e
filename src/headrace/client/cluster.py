"""Client of the cluster administration service (``headrace cluster ...``).

Calls ``headrace.cluster.v1.Cluster`` (``protocols/cluster_admin.py``) on any
node's controller port: ``status`` (that node's view of the nodes, the
containers and the leader), ``drain`` and ``undrain``. The channel is set up
as ``ControllerClient``'s (the same URI forms, TLS options and credentials).

Every refusal becomes a ``ClusterAdminError`` whose message is one line
saying what to do; an unreachable controller a ``ConnectionLost``, a call
past its deadline a ``RequestTimeout``. Calls are not retried: an operator
sees at once that the address is wrong.
"""

from __future__ import annotations

from typing import Final

import grpc  # type: ignore[import-untyped]
import grpc.aio  # type: ignore[import-untyped]

from headrace.errors import ClientError, ConnectionLost, RequestTimeout
from headrace.protocols import cluster_admin as wire
from headrace.protocols.pravega.auth import basic_header

from .controller import parse_controller_uri
from .tls import TlsOptions, uri_wants_tls

__all__ = ["ADMIN_TIMEOUT_S", "ClusterAdminClient", "ClusterAdminError"]

ADMIN_TIMEOUT_S: Final = 15.0
"""Deadline of one call: a status is read from memory and a drain is one
ZooKeeper write (bounded at 10 s on the node)."""


class ClusterAdminError(ClientError):
    """The node refused the call; ``code`` is the gRPC status name."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


_HINTS: Final = {
    "UNAUTHENTICATED": "give --user and --password-file of a user of the server",
    "PERMISSION_DENIED": "--user must be an administrator (READ_UPDATE on prn::/*); "
    "give another --user and --password-file",
    "UNIMPLEMENTED": "this server has no cluster administration service",
}
"""What the user can do about a refusal, by gRPC status name."""


def _one_line(text: str) -> str:
    return " ".join(text.split())


class ClusterAdminClient:
    """An asyncio client of one node's cluster administration service.

    Args:
        uri: the node's controller, ``tcp://host:port`` (``tls://`` for TLS).
        tls: TLS settings; given, the channel uses TLS whatever the scheme.
        credentials: ``(user, password)`` for a server with auth on.
        timeout_s: deadline of each call.

    Raises:
        ValueError: a URI without a host and port, or of an unknown scheme.
    """

    def __init__(
        self,
        uri: str,
        *,
        tls: TlsOptions | None = None,
        credentials: tuple[str, str] | None = None,
        timeout_s: float = ADMIN_TIMEOUT_S,
    ) -> None:
        self._target = parse_controller_uri(uri)
        self._timeout_s = timeout_s
        self._metadata: tuple[tuple[str, str], ...] = (
            () if credentials is None else (("authorization", basic_header(*credentials)),)
        )
        if tls is None and uri_wants_tls(uri):
            tls = TlsOptions()
        options = [("grpc.max_receive_message_length", wire.MAX_MESSAGE_BYTES)]
        if tls is None:
            self._channel = grpc.aio.insecure_channel(self._target, options=options)
        else:
            self._channel = grpc.aio.secure_channel(
                self._target, tls.grpc_credentials(), options=options
            )

    async def aclose(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> ClusterAdminClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def status(self) -> dict[str, object]:
        """The node's view: ``{"nodes": [...], "containers": [...], "leader": ...}``."""
        reply = await self._call(wire.STATUS, {})
        for key in ("nodes", "containers", "leader"):
            if key not in reply:
                raise ClusterAdminError("INTERNAL", f"the status reply has no {key!r}")
        return reply

    async def drain(self, node_id: str) -> dict[str, object]:
        """Ask the cluster to move every container off ``node_id``."""
        return await self._call(wire.DRAIN, {"node": node_id})

    async def undrain(self, node_id: str) -> dict[str, object]:
        """Make ``node_id`` eligible for containers again."""
        return await self._call(wire.UNDRAIN, {"node": node_id})

    async def _call(self, method: str, request: dict[str, object]) -> dict[str, object]:
        call = self._channel.unary_unary(wire.method_path(method))  # bytes in, bytes out
        try:
            reply: bytes = await call(
                wire.encode(request), timeout=self._timeout_s, metadata=self._metadata
            )
        except grpc.aio.AioRpcError as exc:
            raise self._error(method, exc) from None
        try:
            return wire.decode(reply)
        except wire.MessageError as exc:
            raise ClusterAdminError("INTERNAL", f"{method}: {exc}") from None

    def _error(self, method: str, exc: grpc.aio.AioRpcError) -> ClientError:
        code = exc.code()
        details = _one_line(exc.details() or "")
        if code == grpc.StatusCode.UNAVAILABLE:  # no connection, or the node has no session
            return ConnectionLost(f"controller {self._target}: {details}")
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return RequestTimeout(
                f"controller {self._target}: {method} did not answer within {self._timeout_s:g} s"
            )
        hint = _HINTS.get(code.name)
        return ClusterAdminError(code.name, f"{details} ({hint})" if hint else details)
