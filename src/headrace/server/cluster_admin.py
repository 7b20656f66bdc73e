"""The cluster administration service on the controller port (``headrace cluster ...``).

A grpc generic handler for ``headrace.cluster.v1.Cluster``
(``protocols/cluster_admin.py``): ``Status``, ``Drain`` and ``Undrain``,
JSON bytes in and out. The controller listener registers it on its own gRPC
server beside the Pravega controller service, so an operator needs only the
address clients already use (``docs/cluster.md#cli``).

A node answers from its own view (``cluster/admin.py``). A server started
without ``--cluster`` answers ``FAILED_PRECONDITION`` with
``NOT_A_CLUSTER_NODE``; a node whose member is not running (starting or
stopping) answers ``UNAVAILABLE``.

With auth on, credentials are checked as the controller checks them (the
``authorization`` metadata, the same password file and failed-login
buckets): ``Status`` needs any valid user, ``Drain`` and ``Undrain`` an
administrator (``READ_UPDATE`` on ``prn::/``, as the controller requires for
what it does not classify). Refusals count as the controller's.
"""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc  # type: ignore[import-untyped]

from headrace.controller.auth import AuthFailed
from headrace.controller.service import ControllerAuth
from headrace.protocols import cluster_admin as wire
from headrace.protocols.pravega.auth import ROOT, Permission

if TYPE_CHECKING:  # the cluster modules load kazoo: only with --cluster
    from headrace.cluster.member import ClusterMember
    from headrace.server.cluster_node import ClusterNode

__all__ = ["ClusterAdminService"]

log = logging.getLogger(__name__)

_ADMIN_METHODS = frozenset({wire.DRAIN, wire.UNDRAIN})
"""Methods that change the cluster: an administrator's."""


def _peer_address(context: Any) -> str:
    """The client's address without its port (its failed-login bucket), from
    gRPC's ``ipv4:1.2.3.4:5``, ``ipv6:%5B::1%5D:5`` or ``unix:...``."""
    peer = urllib.parse.unquote(str(context.peer() or ""))
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return peer
    return rest.rpartition(":")[0].strip("[]")


class _Refused(Exception):
    """A call answered with a gRPC status and a one-line detail."""

    def __init__(self, code: Any, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class ClusterAdminService:
    """The ``headrace.cluster.v1.Cluster`` service of one server.

    Args:
        cluster: this node's membership; None: the server is no cluster node.
        auth: the controller's credential checks; None: auth is off.
    """

    def __init__(self, cluster: ClusterNode | None, auth: ControllerAuth | None) -> None:
        self._cluster = cluster
        self._auth = auth
        calls: dict[str, Callable[[ClusterMember, bytes], Awaitable[dict[str, object]]]] = {
            wire.STATUS: self._status,
            wire.DRAIN: self._drain,
            wire.UNDRAIN: self._undrain,
        }
        self._handler = grpc.method_handlers_generic_handler(
            wire.SERVICE_NAME,
            {
                name: grpc.unary_unary_rpc_method_handler(self._serve(name, call))
                for name, call in calls.items()
            },
        )

    @property
    def handler(self) -> Any:
        """What ``grpc.aio.Server.add_generic_rpc_handlers`` takes."""
        return self._handler

    def _serve(
        self, name: str, call: Callable[[ClusterMember, bytes], Awaitable[dict[str, object]]]
    ) -> Callable[[bytes, Any], Awaitable[bytes]]:
        async def handle(request: bytes, context: Any) -> bytes:
            try:
                await self._check_access(name, context)
                member = self._member()
                reply = await call(member, request)
            except _Refused as refused:
                log.debug("cluster %s refused: %s", name, refused.details)
                await context.abort(refused.code, refused.details)
                raise AssertionError("context.abort returned") from None  # pragma: no cover
            return wire.encode(reply)

        return handle

    async def _check_access(self, name: str, context: Any) -> None:
        auth = self._auth
        if auth is None:
            return
        metadata = context.invocation_metadata() or ()
        authorization = next((v for k, v in metadata if k == "authorization"), None)
        try:
            user = await auth.authenticator.authenticate(authorization, peer=_peer_address(context))
        except AuthFailed as exc:
            if auth.refused is not None:
                auth.refused(exc.reason)
            raise _Refused(grpc.StatusCode.UNAUTHENTICATED, str(exc)) from exc
        if name in _ADMIN_METHODS and auth.authenticator.permission(user, ROOT) < (
            Permission.READ_UPDATE
        ):
            if auth.refused is not None:
                auth.refused("permission_denied")
            raise _Refused(
                grpc.StatusCode.PERMISSION_DENIED,
                f"{user!r} needs READ_UPDATE on {ROOT} for cluster {name}",
            )

    def _member(self) -> ClusterMember:
        if self._cluster is None:
            raise _Refused(grpc.StatusCode.FAILED_PRECONDITION, wire.NOT_A_CLUSTER_NODE)
        member = self._cluster.member
        if member is None:
            raise _Refused(
                grpc.StatusCode.UNAVAILABLE,
                f"node {self._cluster.node_id} is not in the cluster now (starting or stopping)",
            )
        return member

    async def _status(self, member: ClusterMember, request: bytes) -> dict[str, object]:
        from headrace.cluster import admin

        self._decoded(request)
        return admin.status(member)

    async def _drain(self, member: ClusterMember, request: bytes) -> dict[str, object]:
        from headrace.cluster import admin

        return await self._change(admin.drain, member, request)

    async def _undrain(self, member: ClusterMember, request: bytes) -> dict[str, object]:
        from headrace.cluster import admin

        return await self._change(admin.undrain, member, request)

    async def _change(
        self,
        change: Callable[[ClusterMember, str], Awaitable[dict[str, object]]],
        member: ClusterMember,
        request: bytes,
    ) -> dict[str, object]:
        from headrace.cluster.admin import UnknownNode
        from headrace.cluster.errors import ClusterError

        try:
            node_id = wire.node_request(request)
        except wire.MessageError as exc:
            raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
        try:
            reply = await change(member, node_id)
        except UnknownNode as exc:
            raise _Refused(grpc.StatusCode.NOT_FOUND, str(exc)) from exc
        except ClusterError as exc:
            raise _Refused(grpc.StatusCode.UNAVAILABLE, str(exc)) from exc
        log.info(
            "cluster: %s %s (asked of %s)",
            "drain" if reply["draining"] else "undrain",
            node_id,
            member.node_id,
        )
        return reply

    @staticmethod
    def _decoded(request: bytes) -> dict[str, object]:
        try:
            return wire.decode(request)
        except wire.MessageError as exc:
            raise _Refused(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
