"""The Pravega controller served over gRPC (``grpc.aio``): proto <-> model, errors -> replies.

``ControllerService`` has one coroutine per implemented RPC, named exactly
as the RPC, taking the request message and returning the reply message; it
converts between protobuf messages and the model's records and nothing
else. An RPC it does not define would answer ``UNIMPLEMENTED``, which the
Rust client treats as a final error.

Errors are translated in exactly one place, ``reply_for_error``:

1. if the reply message has a status field with a value for the error
   (``STATUS_REPLIES``), the RPC answers normally with that status, which
   the client turns into ``False`` or a final error;
2. otherwise the RPC fails with the gRPC status code in ``GRPC_CODES``.
   The Rust client fails at once on INVALID_ARGUMENT, NOT_FOUND and
   ALREADY_EXISTS and retries anything else for about a minute, so every
   error a retry cannot fix maps to one of those three.

``ControllerServer`` runs the service on a port, together with the
periodic sweep (lease expiry, aborted transactions' segments, abandoned transient
segments).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import socket
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import grpc  # type: ignore[import-untyped]
from google.protobuf.message import Message

from headrace.controller.auth import Authenticator, AuthFailed, PermissionDenied, TokenIssuer
from headrace.controller.errors import (
    ControllerError,
    GenerationMismatch,
    InvalidArgument,
    InvalidName,
    LeaseTooLarge,
    ReaderGroupMismatch,
    ReaderGroupNotFound,
    ScalePreconditionFailed,
    ScopeExists,
    ScopeNotEmpty,
    ScopeNotFound,
    SegmentNotInStream,
    StreamExists,
    StreamNotFound,
    StreamNotSealed,
    StreamSealed,
    SubscriberNotFound,
    TableExists,
    TableNotFound,
    TooMany,
    TxnNotFound,
    TxnNotOpen,
)
from headrace.controller.groups import GroupRetention, ReaderGroupRecord, scoped_name
from headrace.controller.model import ControllerModel, HeadSegment
from headrace.controller.naming import (
    is_valid_name,
    is_valid_token_stream,
    reader_group_stream,
)
from headrace.controller.records import SegmentRecord
from headrace.controller.rpc import METHODS, SERVICE_NAME
from headrace.controller.watermarks import WATERMARK_INTERVAL_S
from headrace.errors import StoreClosed
from headrace.protocols.pravega import controller_pb2 as pb
from headrace.protocols.pravega.auth import (
    ROOT,
    Permission,
    TokenError,
    decode_token,
    scope_resource,
    stream_resource,
)
from headrace.protocols.pravega.controller import (
    KVTABLE_SUFFIX,
    StreamConfig,
    TxnState,
    config_from_proto,
    config_to_proto,
    kvtable_config_from_proto,
    kvtable_config_to_proto,
    segment_name,
    txn_id_from_proto,
    txn_id_to_proto,
)
from headrace.store.api import SegmentStore

__all__ = [
    "AUTO_SCALE_INTERVAL_S",
    "GRPC_CODES",
    "LIST_PAGE_COUNT",
    "MAX_CONCURRENT_RPCS",
    "MAX_REQUEST_BYTES",
    "RETENTION_INTERVAL_S",
    "RPC_ACCESS",
    "STATUS_REPLIES",
    "TXN_SWEEP_INTERVAL_S",
    "ClusterRoutes",
    "ControllerAuth",
    "ControllerServer",
    "ControllerService",
    "reply_for_error",
]

log = logging.getLogger(__name__)
access = logging.getLogger("headrace.access")

LIST_PAGE_COUNT = 1_000
"""Names per listScopes/listStreamsInScope page: 1000 names of at most 255
characters stay well under gRPC's 4 MiB default message limit."""

MAX_REQUEST_BYTES = 4 * 1024 * 1024
"""Largest request message (gRPC's default); the biggest real request, a stream
cut or scale request, is a few KiB."""

MAX_CONCURRENT_RPCS = 1_000
"""RPCs served at once; grpc refuses more with RESOURCE_EXHAUSTED, which the
client retries with back-off. Bounds memory under a storm of clients (each real
client keeps at most a handful of calls in flight)."""

RETENTION_INTERVAL_S = 60.0
"""How often retention cuts are recorded and retention policies applied. Java's
default is 30 minutes; a cut costs one table write per stream, so a minute keeps
truncation close to the policy at little cost."""

AUTO_SCALE_INTERVAL_S = 10.0
"""How often auto-scaling streams are sampled (see ``ControllerModel.auto_scale``
for how many samples make a decision)."""

TXN_SWEEP_INTERVAL_S = 10.0
"""How often expired transactions are aborted; leases are 90 s, so 10 s of
lateness does not matter."""

GRACEFUL_STOP_S = 5.0
"""How long ``aclose`` lets RPCs in flight finish before cancelling them."""

_STATUS = "status"

STATUS_REPLIES: dict[type[Message], dict[type[ControllerError], int]] = {
    pb.CreateScopeStatus: {
        ScopeExists: pb.CreateScopeStatus.SCOPE_EXISTS,
        InvalidName: pb.CreateScopeStatus.INVALID_SCOPE_NAME,
    },
    pb.DeleteScopeStatus: {
        ScopeNotFound: pb.DeleteScopeStatus.SCOPE_NOT_FOUND,
        ScopeNotEmpty: pb.DeleteScopeStatus.SCOPE_NOT_EMPTY,
    },
    pb.CreateStreamStatus: {
        StreamExists: pb.CreateStreamStatus.STREAM_EXISTS,
        ScopeNotFound: pb.CreateStreamStatus.SCOPE_NOT_FOUND,
        InvalidName: pb.CreateStreamStatus.INVALID_STREAM_NAME,
    },
    pb.UpdateStreamStatus: {
        StreamNotFound: pb.UpdateStreamStatus.STREAM_NOT_FOUND,
        ScopeNotFound: pb.UpdateStreamStatus.SCOPE_NOT_FOUND,
    },
    pb.DeleteStreamStatus: {
        StreamNotFound: pb.DeleteStreamStatus.STREAM_NOT_FOUND,
        ScopeNotFound: pb.DeleteStreamStatus.STREAM_NOT_FOUND,
        StreamNotSealed: pb.DeleteStreamStatus.STREAM_NOT_SEALED,
    },
    pb.StreamsInScopeResponse: {
        ScopeNotFound: pb.StreamsInScopeResponse.SCOPE_NOT_FOUND,
    },
    pb.TxnStatus: {
        StreamNotFound: pb.TxnStatus.STREAM_NOT_FOUND,
        ScopeNotFound: pb.TxnStatus.STREAM_NOT_FOUND,
        TxnNotFound: pb.TxnStatus.TRANSACTION_NOT_FOUND,
        # Commit of an aborted (or abort of a committed) transaction: final, not
        # FAILURE, which the client would retry for a minute.
        TxnNotOpen: pb.TxnStatus.TRANSACTION_NOT_FOUND,
    },
    pb.PingTxnStatus: {
        LeaseTooLarge: pb.PingTxnStatus.LEASE_TOO_LARGE,
        # The client's pinger dies on an RPC error; a status keeps it alive.
        TxnNotFound: pb.PingTxnStatus.UNKNOWN,
        StreamNotFound: pb.PingTxnStatus.UNKNOWN,
        ScopeNotFound: pb.PingTxnStatus.UNKNOWN,
    },
    pb.ScaleResponse: {
        ScalePreconditionFailed: pb.ScaleResponse.PRECONDITION_FAILED,
        TooMany: pb.ScaleResponse.PRECONDITION_FAILED,
    },
    pb.ScaleStatusResponse: {
        InvalidArgument: pb.ScaleStatusResponse.INVALID_INPUT,
        StreamNotFound: pb.ScaleStatusResponse.INVALID_INPUT,
        ScopeNotFound: pb.ScaleStatusResponse.INVALID_INPUT,
    },
    pb.SubscribersResponse: {
        StreamNotFound: pb.SubscribersResponse.STREAM_NOT_FOUND,
        ScopeNotFound: pb.SubscribersResponse.STREAM_NOT_FOUND,
    },
    pb.CreateKeyValueTableStatus: {
        TableExists: pb.CreateKeyValueTableStatus.TABLE_EXISTS,
        ScopeNotFound: pb.CreateKeyValueTableStatus.SCOPE_NOT_FOUND,
        InvalidName: pb.CreateKeyValueTableStatus.INVALID_TABLE_NAME,
    },
    pb.KeyValueTableConfigResponse: {
        TableNotFound: pb.KeyValueTableConfigResponse.TABLE_NOT_FOUND,
        ScopeNotFound: pb.KeyValueTableConfigResponse.TABLE_NOT_FOUND,
    },
    pb.KVTablesInScopeResponse: {
        ScopeNotFound: pb.KVTablesInScopeResponse.SCOPE_NOT_FOUND,
    },
    pb.DeleteKVTableStatus: {
        TableNotFound: pb.DeleteKVTableStatus.TABLE_NOT_FOUND,
        ScopeNotFound: pb.DeleteKVTableStatus.TABLE_NOT_FOUND,
    },
    pb.UpdateSubscriberStatus: {
        StreamNotFound: pb.UpdateSubscriberStatus.STREAM_NOT_FOUND,
        ScopeNotFound: pb.UpdateSubscriberStatus.STREAM_NOT_FOUND,
        SubscriberNotFound: pb.UpdateSubscriberStatus.SUBSCRIBER_NOT_FOUND,
        GenerationMismatch: pb.UpdateSubscriberStatus.GENERATION_MISMATCH,
        InvalidArgument: pb.UpdateSubscriberStatus.STREAM_CUT_NOT_VALID,
    },
    pb.CreateReaderGroupResponse: {
        ScopeNotFound: pb.CreateReaderGroupResponse.SCOPE_NOT_FOUND,
        InvalidName: pb.CreateReaderGroupResponse.INVALID_RG_NAME,
    },
    pb.ReaderGroupConfigResponse: {
        ReaderGroupNotFound: pb.ReaderGroupConfigResponse.RG_NOT_FOUND,
    },
    pb.DeleteReaderGroupStatus: {
        ReaderGroupNotFound: pb.DeleteReaderGroupStatus.RG_NOT_FOUND,
    },
    pb.UpdateReaderGroupResponse: {
        ReaderGroupNotFound: pb.UpdateReaderGroupResponse.RG_NOT_FOUND,
        ReaderGroupMismatch: pb.UpdateReaderGroupResponse.INVALID_CONFIG,
        InvalidArgument: pb.UpdateReaderGroupResponse.INVALID_CONFIG,
    },
}
"""Reply message type -> error -> value of its ``status`` field."""

GRPC_CODES: dict[type[ControllerError], Any] = {
    InvalidName: grpc.StatusCode.INVALID_ARGUMENT,
    InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    LeaseTooLarge: grpc.StatusCode.INVALID_ARGUMENT,
    # A sealed stream takes no transactions; FAILED_PRECONDITION would be the
    # natural code, but the client would retry it for a minute.
    StreamSealed: grpc.StatusCode.INVALID_ARGUMENT,
    StreamNotSealed: grpc.StatusCode.INVALID_ARGUMENT,
    ScopeNotEmpty: grpc.StatusCode.INVALID_ARGUMENT,
    TxnNotOpen: grpc.StatusCode.INVALID_ARGUMENT,
    ScalePreconditionFailed: grpc.StatusCode.INVALID_ARGUMENT,
    ScopeNotFound: grpc.StatusCode.NOT_FOUND,
    StreamNotFound: grpc.StatusCode.NOT_FOUND,
    SegmentNotInStream: grpc.StatusCode.NOT_FOUND,
    TxnNotFound: grpc.StatusCode.NOT_FOUND,
    TableNotFound: grpc.StatusCode.NOT_FOUND,
    ScopeExists: grpc.StatusCode.ALREADY_EXISTS,
    StreamExists: grpc.StatusCode.ALREADY_EXISTS,
    TableExists: grpc.StatusCode.ALREADY_EXISTS,
    TooMany: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ReaderGroupNotFound: grpc.StatusCode.NOT_FOUND,
    SubscriberNotFound: grpc.StatusCode.NOT_FOUND,
    ReaderGroupMismatch: grpc.StatusCode.INVALID_ARGUMENT,
    GenerationMismatch: grpc.StatusCode.INVALID_ARGUMENT,
}
"""Errors of RPCs whose reply has no status for them -> gRPC status code."""


def reply_for_error(response: type[Message], exc: ControllerError) -> Message | tuple[Any, str]:
    """The reply for ``exc``: a status reply message, or ``(grpc code, details)``."""
    statuses = STATUS_REPLIES.get(response, {})
    for cls in type(exc).__mro__:
        if cls in statuses:
            reply = response()
            setattr(reply, _STATUS, statuses[cls])
            return reply
    for cls in type(exc).__mro__:
        if cls in GRPC_CODES:
            return GRPC_CODES[cls], str(exc)
    return grpc.StatusCode.INTERNAL, str(exc)


# --------------------------------------------------------------------------- conversions


def _stream_info(scope: str, stream: str) -> pb.StreamInfo:
    return pb.StreamInfo(scope=scope, stream=stream)


def _segment_range(scope: str, stream: str, seg: SegmentRecord) -> pb.SegmentRange:
    return pb.SegmentRange(
        segmentId=pb.SegmentId(streamInfo=_stream_info(scope, stream), segmentId=seg.id),
        minKey=seg.min_key,
        maxKey=seg.max_key,
    )


def _segment_ranges(scope: str, stream: str, segs: list[SegmentRecord]) -> pb.SegmentRanges:
    return pb.SegmentRanges(segmentRanges=[_segment_range(scope, stream, s) for s in segs])


def _locations(scope: str, stream: str, heads: list[HeadSegment]) -> pb.SegmentsAtTime:
    info = _stream_info(scope, stream)
    return pb.SegmentsAtTime(
        segments=[
            pb.SegmentsAtTime.SegmentLocation(
                segmentId=pb.SegmentId(streamInfo=info, segmentId=h.segment.id), offset=h.offset
            )
            for h in heads
        ]
    )


def _config_from_proto(msg: pb.StreamConfig) -> StreamConfig:
    try:
        return config_from_proto(msg)
    except ValueError as exc:
        raise InvalidArgument(f"unknown policy type: {exc}") from None


def _cut(cut: Mapping[int, int]) -> dict[int, int]:
    return dict(cut.items())


def _group_from_proto(msg: pb.ReaderGroupConfiguration) -> ReaderGroupRecord:
    """The group a ``ReaderGroupConfiguration`` describes (id and generation as sent)."""
    try:
        retention = GroupRetention(msg.retentionType)
    except ValueError:
        raise InvalidArgument(f"unknown reader group retention type {msg.retentionType}") from None
    cuts: list[dict[str, dict[int, int]]] = [{}, {}]
    for cuts_of, field in zip(cuts, (msg.startingStreamCuts, msg.endingStreamCuts), strict=True):
        for cut in field:
            name = scoped_name(cut.streamInfo.scope, cut.streamInfo.stream)
            if name in cuts_of:
                raise InvalidArgument(f"stream {name} is named twice")
            cuts_of[name] = _cut(cut.cut)
    return ReaderGroupRecord(
        scope=msg.scope,
        group=msg.readerGroupName,
        group_id=msg.readerGroupId,
        generation=msg.generation,
        refresh_ms=msg.groupRefreshTimeMillis,
        checkpoint_ms=msg.automaticCheckpointIntervalMillis,
        max_outstanding_checkpoints=msg.maxOutstandingCheckpointRequest,
        retention=retention,
        start_cuts=cuts[0],
        end_cuts=cuts[1],
    )


def _group_to_proto(rec: ReaderGroupRecord) -> pb.ReaderGroupConfiguration:
    def stream_cuts(cuts: Mapping[str, Mapping[int, int]]) -> list[pb.StreamCut]:
        out = []
        for name, cut in sorted(cuts.items()):
            scope, _, stream = name.partition("/")
            out.append(pb.StreamCut(streamInfo=_stream_info(scope, stream), cut=dict(cut)))
        return out

    return pb.ReaderGroupConfiguration(
        scope=rec.scope,
        readerGroupName=rec.group,
        groupRefreshTimeMillis=rec.refresh_ms,
        automaticCheckpointIntervalMillis=rec.checkpoint_ms,
        maxOutstandingCheckpointRequest=rec.max_outstanding_checkpoints,
        retentionType=int(rec.retention),
        generation=rec.generation,
        readerGroupId=rec.group_id,
        startingStreamCuts=stream_cuts(rec.start_cuts),
        endingStreamCuts=stream_cuts(rec.end_cuts),
    )


_PING = {
    TxnState.OPEN: pb.PingTxnStatus.OK,
    TxnState.COMMITTING: pb.PingTxnStatus.COMMITTED,
    TxnState.COMMITTED: pb.PingTxnStatus.COMMITTED,
    TxnState.ABORTING: pb.PingTxnStatus.ABORTED,
    TxnState.ABORTED: pb.PingTxnStatus.ABORTED,
}

# --------------------------------------------------------------------------- access


CURRENT_USER: contextvars.ContextVar[str] = contextvars.ContextVar("CURRENT_USER", default="")
"""The authenticated user of the RPC being served (set by the gRPC glue)."""


@dataclass(frozen=True, slots=True)
class ControllerAuth:
    """What the controller needs with auth on: the password file and the token signer."""

    authenticator: Authenticator
    issuer: TokenIssuer
    refused: Callable[[str], None] | None = None
    """Called with the reason of every refused call (``AuthFailed.reason`` or
    ``permission_denied``): the server's metrics."""


def _peer_address(context: Any) -> str:
    """The client's address without its port, from gRPC's ``ipv4:1.2.3.4:5``,
    ``ipv6:%5B::1%5D:5`` or ``unix:...`` (the key of its failed-login bucket)."""
    peer = urllib.parse.unquote(str(context.peer() or ""))
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return peer
    return rest.rpartition(":")[0].strip("[]")


def _scope_of(field: str) -> Callable[[Any], str]:
    return lambda req: scope_resource(getattr(req, field))


def _stream_in(field: str | None) -> Callable[[Any], str]:
    def resource(req: Any) -> str:
        info = req if field is None else getattr(req, field)
        return stream_resource(info.scope, info.stream)

    return resource


def _kvtable_of(req: Any) -> str:
    """A key-value table's resource: its pseudo-stream ``<table>_kvtable``, the
    resource its delegation tokens name, so one grant covers managing the
    table and reading and writing its partitions."""
    return stream_resource(req.scope, req.kvtName + KVTABLE_SUFFIX)


_R, _RU = Permission.READ, Permission.READ_UPDATE


def _group_stream(scope_field: str, group_field: str) -> Callable[[Any], str]:
    """A reader group's resource: its state stream ``_RG<group>`` (a grant on the
    scope covers it)."""

    def resource(req: Any) -> str:
        group = getattr(req, group_field)
        return stream_resource(getattr(req, scope_field), reader_group_stream(group))

    return resource


_STREAM, _STREAM_INFO = _stream_in("streamInfo"), _stream_in(None)

RPC_ACCESS: dict[str, tuple[Callable[[Any], str], Permission] | None] = {
    # any authenticated user; the handler itself decides (or there is nothing to guard)
    "getControllerServerList": None,
    "getDelegationToken": None,
    "listScopes": None,
    # scopes: a grant on prn::/scope:S (or above) lets a user create and delete S
    "createScope": (_scope_of("scope"), _RU),
    "deleteScope": (_scope_of("scope"), _RU),
    "checkScopeExists": (_scope_of("scope"), _R),
    "listStreamsInScope": (lambda req: scope_resource(req.scope.scope), _R),
    "listStreamsInScopeForTag": (lambda req: scope_resource(req.scope.scope), _R),
    # streams: changes need READ_UPDATE on prn::/scope:S/stream:T, looks need READ
    "createStream": (_STREAM, _RU),
    "updateStream": (_STREAM, _RU),
    "truncateStream": (_STREAM, _RU),
    "sealStream": (_STREAM_INFO, _RU),
    "deleteStream": (_STREAM_INFO, _RU),
    "scale": (_STREAM, _RU),
    "createTransaction": (_STREAM, _RU),
    "commitTransaction": (_STREAM, _RU),
    "abortTransaction": (_STREAM, _RU),
    "pingTransaction": (_STREAM, _RU),
    "removeWriter": (_stream_in("stream"), _RU),
    "noteTimestampFromWriter": (
        lambda req: stream_resource(req.position.streamInfo.scope, req.position.streamInfo.stream),
        _RU,
    ),
    "getStreamConfiguration": (_STREAM_INFO, _R),
    "checkStreamExists": (_STREAM_INFO, _R),
    "getCurrentSegments": (_STREAM_INFO, _R),
    "listSubscribers": (_STREAM_INFO, _R),
    "updateSubscriberStreamCut": (lambda req: _STREAM_INFO(req.streamCut.streamInfo), _RU),
    # reader groups: their state stream _RG<group> is the resource
    "createReaderGroup": (_group_stream("scope", "readerGroupName"), _RU),
    "updateReaderGroup": (_group_stream("scope", "readerGroupName"), _RU),
    "deleteReaderGroup": (_group_stream("scope", "readerGroup"), _RU),
    "getReaderGroupConfig": (_group_stream("scope", "readerGroup"), _R),
    "getEpochSegments": (_STREAM, _R),
    "getSegments": (_STREAM, _R),
    "getSegmentsImmediatelyFollowing": (_STREAM, _R),
    "getSegmentsImmediatlyFollowing": (_STREAM, _R),
    "getSegmentsBetween": (_STREAM, _R),
    "checkScale": (_STREAM, _R),
    "getURI": (_STREAM, _R),
    "isSegmentValid": (_STREAM, _R),
    "isStreamCutValid": (_STREAM, _R),
    "checkTransactionState": (_STREAM, _R),
    # key-value tables: as streams, on the table's pseudo-stream
    "createKeyValueTable": (_kvtable_of, _RU),
    "deleteKeyValueTable": (_kvtable_of, _RU),
    "getKeyValueTableConfiguration": (_kvtable_of, _R),
    "getCurrentSegmentsKeyValueTable": (_kvtable_of, _R),
    "listKeyValueTablesInScope": (lambda req: scope_resource(req.scope.scope), _R),
}
"""RPC -> (the resource its request names, the permission it needs), or None
for RPCs any authenticated user may call. An RPC not listed needs READ_UPDATE
on ``prn::/`` (the root): only an administrator may call what nobody
classified."""

_ADMIN: tuple[Callable[[Any], str], Permission] = (lambda req: ROOT, _RU)


NODE_AUTH_PREFIX: Final = "Bearer "
"""How another node of the cluster authenticates its own calls (a follower's
changes for its doors): ``authorization: Bearer <node token>``, a token signed
with the cluster secret whose ``node`` claim is set (``docs/cluster.md#secret``)."""


def _node_caller(auth: ControllerAuth, token: str) -> str:
    """The name of the node whose token this is; a node may call anything.

    Raises:
        AuthFailed: not a valid, unexpired node token.
    """
    try:
        claims = decode_token(auth.issuer.key, token, now_s=time.time())
    except TokenError as exc:
        raise AuthFailed(f"bearer token refused: {exc}") from None
    if not claims.node:
        raise AuthFailed("a bearer token here must be a node token")
    return f"node {claims.subject}"


async def _check_access(auth: ControllerAuth, name: str, request: Message, context: Any) -> str:
    """Authenticate the call and check its permission; the user's name.

    Raises:
        AuthFailed: no or wrong credentials.
        PermissionDenied: not allowed.
    """
    metadata = context.invocation_metadata() or ()
    authorization = next((value for key, value in metadata if key == "authorization"), None)
    if authorization is not None and authorization.startswith(NODE_AUTH_PREFIX):
        return _node_caller(auth, authorization[len(NODE_AUTH_PREFIX) :])
    user = await auth.authenticator.authenticate(authorization, peer=_peer_address(context))
    rule = RPC_ACCESS.get(name, _ADMIN)
    if rule is not None:
        resource_of, needed = rule
        resource = resource_of(request)
        if auth.authenticator.permission(user, resource) < needed:
            raise PermissionDenied(f"{user!r} needs {needed.name} on {resource} for {name}")
    return user


# --------------------------------------------------------------------------- service


@dataclass(frozen=True, slots=True)
class ClusterRoutes:
    """Where things are in a cluster, as this node sees it (``server/cluster_node.py``)."""

    locate: Callable[[str], tuple[str, int] | None]
    """Segment name -> the owner's segment-store ``(host, port)``; None: nobody now."""
    controllers: Callable[[], list[tuple[str, int]]]
    """Every live node's controller ``(host, port)``."""


class ControllerService:
    """One coroutine per implemented RPC, named as in the proto.

    Args:
        model: the controller model.
        segment_store: ``(host, port)`` that ``getURI`` hands out for every segment.
        controller: ``(host, port)`` of this controller (``getControllerServerList``).
        auth: credential checks and token signing; None: auth is off.
        routes: in a cluster, where each segment and every controller is; None:
            everything is here.
    """

    def __init__(
        self,
        model: ControllerModel,
        *,
        segment_store: tuple[str, int],
        controller: tuple[str, int],
        auth: ControllerAuth | None = None,
        routes: ClusterRoutes | None = None,
    ) -> None:
        self.model = model
        self.auth = auth
        self.routes = routes
        self._segment_store = pb.NodeUri(endpoint=segment_store[0], port=segment_store[1])
        self._controller = pb.NodeUri(endpoint=controller[0], port=controller[1])

    # -- cluster

    async def getControllerServerList(self, req: pb.ServerRequest) -> pb.ServerResponse:
        if self.routes is not None:
            nodes = [pb.NodeUri(endpoint=h, port=p) for h, p in self.routes.controllers()]
            if nodes:
                return pb.ServerResponse(nodeURI=nodes)
        return pb.ServerResponse(nodeURI=[self._controller])

    async def getURI(self, req: pb.SegmentId) -> pb.NodeUri:
        # Single node: every segment of every stream (and pseudo-streams such
        # as "<readergroup>_kvtable") lives in the one segment store. In a
        # cluster, the owner of the segment's container; while nobody owns
        # it, this node's own, which answers WrongHost until someone does.
        if self.routes is not None:
            info = req.streamInfo
            name = segment_name(info.scope, info.stream, req.segmentId)
            found = self.routes.locate(name)
            if found is not None:
                return pb.NodeUri(endpoint=found[0], port=found[1])
        return self._segment_store

    async def getDelegationToken(self, req: pb.StreamInfo) -> pb.DelegationToken:
        """A token for the segment store naming the stream and the caller's best
        permission on it (empty with auth off: the client then sends none).

        The permission is the strongest the user holds, whatever
        ``accessOperation`` asks (the Rust client 0.3.8 sends UNSPECIFIED for
        writers, readers and reader-group tables alike); the segment store
        checks each command against it. A user with no permission at all gets
        PERMISSION_DENIED here already.

        The names follow the other RPCs' rules (a table's pseudo-stream
        ``<group>_kvtable`` included): the token's resource is matched as a
        pattern at the segment store, so a ``*`` in it would reach every
        stream it matches.
        """
        if not is_valid_name(req.scope):
            raise InvalidName("scope", req.scope)
        if not is_valid_token_stream(req.stream):
            raise InvalidName("stream", req.stream)
        if self.auth is None:
            return pb.DelegationToken(delegationToken="")
        user = CURRENT_USER.get()
        resource = stream_resource(req.scope, req.stream)
        permission = self.auth.authenticator.permission(user, resource)
        if permission is Permission.NONE:
            raise PermissionDenied(f"{user!r} has no permission on {resource}")
        return pb.DelegationToken(
            delegationToken=self.auth.issuer.issue(user, resource, permission)
        )

    def _may_read_scope(self, scope: str) -> bool:
        if self.auth is None:
            return True
        permission = self.auth.authenticator.permission(CURRENT_USER.get(), scope_resource(scope))
        return permission >= Permission.READ

    # -- scopes

    async def createScope(self, req: pb.ScopeInfo) -> pb.CreateScopeStatus:
        await self.model.create_scope(req.scope)
        return pb.CreateScopeStatus(status=pb.CreateScopeStatus.SUCCESS)

    async def deleteScope(self, req: pb.ScopeInfo) -> pb.DeleteScopeStatus:
        await self.model.delete_scope(req.scope)
        return pb.DeleteScopeStatus(status=pb.DeleteScopeStatus.SUCCESS)

    async def checkScopeExists(self, req: pb.ScopeInfo) -> pb.ExistsResponse:
        return pb.ExistsResponse(exists=self.model.scope_exists(req.scope))

    async def listScopes(self, req: pb.ScopesRequest) -> pb.ScopesResponse:
        # With auth on, a user sees the scopes it may read. A page whose every
        # name is hidden is skipped, not sent: an empty page ends the client's listing.
        token = req.continuationToken.token
        while True:
            names = self.model.list_scopes(after=token, limit=LIST_PAGE_COUNT)
            visible = [name for name in names if self._may_read_scope(name)]
            token = names[-1] if names else token
            if visible or not names:
                return pb.ScopesResponse(
                    scopes=visible, continuationToken=pb.ContinuationToken(token=token)
                )

    # -- streams

    async def createStream(self, req: pb.StreamConfig) -> pb.CreateStreamStatus:
        info = req.streamInfo
        await self.model.create_stream(info.scope, info.stream, _config_from_proto(req))
        return pb.CreateStreamStatus(status=pb.CreateStreamStatus.SUCCESS)

    async def updateStream(self, req: pb.StreamConfig) -> pb.UpdateStreamStatus:
        info = req.streamInfo
        await self.model.update_stream(info.scope, info.stream, _config_from_proto(req))
        return pb.UpdateStreamStatus(status=pb.UpdateStreamStatus.SUCCESS)

    async def getStreamConfiguration(self, req: pb.StreamInfo) -> pb.StreamConfig:
        return config_to_proto(
            req.scope, req.stream, self.model.stream_config(req.scope, req.stream)
        )

    async def checkStreamExists(self, req: pb.StreamInfo) -> pb.ExistsResponse:
        return pb.ExistsResponse(exists=self.model.stream_exists(req.scope, req.stream))

    async def sealStream(self, req: pb.StreamInfo) -> pb.UpdateStreamStatus:
        await self.model.seal_stream(req.scope, req.stream)
        return pb.UpdateStreamStatus(status=pb.UpdateStreamStatus.SUCCESS)

    async def deleteStream(self, req: pb.StreamInfo) -> pb.DeleteStreamStatus:
        await self.model.delete_stream(req.scope, req.stream)
        return pb.DeleteStreamStatus(status=pb.DeleteStreamStatus.SUCCESS)

    async def truncateStream(self, req: pb.StreamCut) -> pb.UpdateStreamStatus:
        info = req.streamInfo
        await self.model.truncate_stream(info.scope, info.stream, _cut(req.cut))
        return pb.UpdateStreamStatus(status=pb.UpdateStreamStatus.SUCCESS)

    async def listStreamsInScope(self, req: pb.StreamsInScopeRequest) -> pb.StreamsInScopeResponse:
        return self._list_streams(req.scope.scope, req.continuationToken.token, None)

    async def listStreamsInScopeForTag(
        self, req: pb.StreamsInScopeWithTagRequest
    ) -> pb.StreamsInScopeResponse:
        return self._list_streams(req.scope.scope, req.continuationToken.token, req.tag)

    def _list_streams(self, scope: str, token: str, tag: str | None) -> pb.StreamsInScopeResponse:
        names = self.model.list_streams(scope, after=token, limit=LIST_PAGE_COUNT, tag=tag)
        return pb.StreamsInScopeResponse(
            streams=[_stream_info(scope, n) for n in names],
            continuationToken=pb.ContinuationToken(token=names[-1] if names else token),
            status=pb.StreamsInScopeResponse.SUCCESS,
        )

    # -- segments

    async def getCurrentSegments(self, req: pb.StreamInfo) -> pb.SegmentRanges:
        segs = self.model.current_segments(req.scope, req.stream)
        return _segment_ranges(req.scope, req.stream, segs)

    async def getEpochSegments(self, req: pb.GetEpochSegmentsRequest) -> pb.SegmentRanges:
        info = req.streamInfo
        segs = self.model.epoch_segments(info.scope, info.stream, req.epoch)
        return _segment_ranges(info.scope, info.stream, segs)

    async def getSegments(self, req: pb.GetSegmentsRequest) -> pb.SegmentsAtTime:
        info = req.streamInfo
        heads = await self.model.segments_at(info.scope, info.stream, req.timestamp)
        return _locations(info.scope, info.stream, heads)

    async def getSegmentsImmediatelyFollowing(self, req: pb.SegmentId) -> pb.SuccessorResponse:
        info = req.streamInfo
        successors = self.model.successors(info.scope, info.stream, req.segmentId)
        return pb.SuccessorResponse(
            segments=[
                pb.SuccessorResponse.SegmentEntry(
                    segment=_segment_range(info.scope, info.stream, s.segment),
                    value=list(s.predecessors),
                )
                for s in successors
            ]
        )

    async def getSegmentsImmediatlyFollowing(self, req: pb.SegmentId) -> pb.SuccessorResponse:
        return await self.getSegmentsImmediatelyFollowing(req)  # the deprecated spelling

    async def getSegmentsBetween(self, req: pb.StreamCutRange) -> pb.StreamCutRangeResponse:
        info = req.streamInfo
        segs = self.model.segments_between(
            info.scope, info.stream, _cut(getattr(req, "from")), _cut(req.to)
        )
        return pb.StreamCutRangeResponse(
            segments=[pb.SegmentId(streamInfo=info, segmentId=s.id) for s in segs]
        )

    async def isSegmentValid(self, req: pb.SegmentId) -> pb.SegmentValidityResponse:
        info = req.streamInfo
        valid = self.model.is_segment_open(info.scope, info.stream, req.segmentId)
        return pb.SegmentValidityResponse(response=valid)

    async def isStreamCutValid(self, req: pb.StreamCut) -> pb.StreamCutValidityResponse:
        info = req.streamInfo
        valid = self.model.is_stream_cut_valid(info.scope, info.stream, _cut(req.cut))
        return pb.StreamCutValidityResponse(response=valid)

    async def scale(self, req: pb.ScaleRequest) -> pb.ScaleResponse:
        info = req.streamInfo
        epoch, new = await self.model.scale(
            info.scope,
            info.stream,
            list(req.sealedSegments),
            [(r.start, r.end) for r in req.newKeyRanges],
        )
        return pb.ScaleResponse(
            status=pb.ScaleResponse.STARTED,
            segments=[_segment_range(info.scope, info.stream, s) for s in new],
            epoch=epoch,
        )

    async def checkScale(self, req: pb.ScaleStatusRequest) -> pb.ScaleStatusResponse:
        # Scaling runs to completion inside ``scale``: any epoch up to the current
        # one is done; a later one has not been started.
        info = req.streamInfo
        if req.epoch > self.model.current_epoch(info.scope, info.stream) or req.epoch < 0:
            raise InvalidArgument(f"epoch {req.epoch} has not started")
        return pb.ScaleStatusResponse(status=pb.ScaleStatusResponse.SUCCESS)

    # -- transactions

    async def createTransaction(self, req: pb.CreateTxnRequest) -> pb.CreateTxnResponse:
        info = req.streamInfo
        txn, segs = await self.model.create_txn(info.scope, info.stream, req.lease)
        return pb.CreateTxnResponse(
            txnId=txn_id_to_proto(txn.txn),
            activeSegments=[_segment_range(info.scope, info.stream, s) for s in segs],
        )

    async def commitTransaction(self, req: pb.TxnRequest) -> pb.TxnStatus:
        info = req.streamInfo
        await self.model.commit_txn(
            info.scope,
            info.stream,
            txn_id_from_proto(req.txnId),
            writer_id=req.writerId,
            timestamp=req.timestamp,
        )
        return pb.TxnStatus(status=pb.TxnStatus.SUCCESS)

    async def abortTransaction(self, req: pb.TxnRequest) -> pb.TxnStatus:
        info = req.streamInfo
        await self.model.abort_txn(info.scope, info.stream, txn_id_from_proto(req.txnId))
        return pb.TxnStatus(status=pb.TxnStatus.SUCCESS)

    async def pingTransaction(self, req: pb.PingTxnRequest) -> pb.PingTxnStatus:
        info = req.streamInfo
        txn = txn_id_from_proto(req.txnId)
        state = self.model.ping_txn(info.scope, info.stream, txn, req.lease)
        return pb.PingTxnStatus(status=_PING[state])

    async def checkTransactionState(self, req: pb.TxnRequest) -> pb.TxnState:
        info = req.streamInfo
        state = self.model.txn_state(info.scope, info.stream, txn_id_from_proto(req.txnId))
        return pb.TxnState(state=int(state))  # type: ignore[arg-type]

    # -- key-value tables

    async def createKeyValueTable(
        self, req: pb.KeyValueTableConfig
    ) -> pb.CreateKeyValueTableStatus:
        await self.model.create_kvtable(req.scope, req.kvtName, kvtable_config_from_proto(req))
        return pb.CreateKeyValueTableStatus(status=pb.CreateKeyValueTableStatus.SUCCESS)

    async def getKeyValueTableConfiguration(
        self, req: pb.KeyValueTableInfo
    ) -> pb.KeyValueTableConfigResponse:
        config = self.model.kvtable_config(req.scope, req.kvtName)
        return pb.KeyValueTableConfigResponse(
            config=kvtable_config_to_proto(req.scope, req.kvtName, config),
            status=pb.KeyValueTableConfigResponse.SUCCESS,
        )

    async def getCurrentSegmentsKeyValueTable(self, req: pb.KeyValueTableInfo) -> pb.SegmentRanges:
        # As Java's: segment ids under the table's own name; the client adds
        # the ``_kvtable`` suffix when it names a partition's table segment.
        segs = self.model.kvtable_partitions(req.scope, req.kvtName)
        return _segment_ranges(req.scope, req.kvtName, segs)

    async def listKeyValueTablesInScope(
        self, req: pb.KVTablesInScopeRequest
    ) -> pb.KVTablesInScopeResponse:
        scope, token = req.scope.scope, req.continuationToken.token
        names = self.model.list_kvtables(scope, after=token, limit=LIST_PAGE_COUNT)
        return pb.KVTablesInScopeResponse(
            kvtables=[pb.KeyValueTableInfo(scope=scope, kvtName=n) for n in names],
            continuationToken=pb.ContinuationToken(token=names[-1] if names else token),
            status=pb.KVTablesInScopeResponse.SUCCESS,
        )

    async def deleteKeyValueTable(self, req: pb.KeyValueTableInfo) -> pb.DeleteKVTableStatus:
        await self.model.delete_kvtable(req.scope, req.kvtName)
        return pb.DeleteKVTableStatus(status=pb.DeleteKVTableStatus.SUCCESS)

    # -- writers (watermarks, controller/watermarks.py) and subscribers

    async def removeWriter(self, req: pb.RemoveWriterRequest) -> pb.RemoveWriterResponse:
        scope, stream = req.stream.scope, req.stream.stream
        if not self.model.stream_exists(scope, stream):
            return pb.RemoveWriterResponse(result=pb.RemoveWriterResponse.STREAM_DOES_NOT_EXIST)
        known = self.model.remove_writer(scope, stream, req.writer)
        return pb.RemoveWriterResponse(
            result=pb.RemoveWriterResponse.SUCCESS
            if known
            else pb.RemoveWriterResponse.UNKNOWN_WRITER
        )

    async def noteTimestampFromWriter(self, req: pb.TimestampFromWriter) -> pb.TimestampResponse:
        info = req.position.streamInfo
        if not self.model.stream_exists(info.scope, info.stream):
            return pb.TimestampResponse(result=pb.TimestampResponse.INVALID_POSITION)
        result = self.model.note_writer_time(
            info.scope, info.stream, req.writer, req.timestamp, dict(req.position.cut)
        )
        return pb.TimestampResponse(result=result)  # type: ignore[arg-type]

    async def listSubscribers(self, req: pb.StreamInfo) -> pb.SubscribersResponse:
        return pb.SubscribersResponse(
            subscribers=self.model.list_subscribers(req.scope, req.stream),
            status=pb.SubscribersResponse.SUCCESS,
        )

    async def updateSubscriberStreamCut(
        self, req: pb.SubscriberStreamCut
    ) -> pb.UpdateSubscriberStatus:
        info = req.streamCut.streamInfo
        await self.model.update_subscriber_cut(
            info.scope,
            info.stream,
            req.subscriber,
            req.readerGroupId,
            req.generation,
            _cut(req.streamCut.cut),
        )
        return pb.UpdateSubscriberStatus(status=pb.UpdateSubscriberStatus.SUCCESS)

    # -- reader groups (Java's records; the readers' own state is the clients')

    async def createReaderGroup(
        self, req: pb.ReaderGroupConfiguration
    ) -> pb.CreateReaderGroupResponse:
        rec = await self.model.create_reader_group(_group_from_proto(req))
        return pb.CreateReaderGroupResponse(
            status=pb.CreateReaderGroupResponse.SUCCESS, config=_group_to_proto(rec)
        )

    async def getReaderGroupConfig(self, req: pb.ReaderGroupInfo) -> pb.ReaderGroupConfigResponse:
        rec = self.model.reader_group(req.scope, req.readerGroup)
        return pb.ReaderGroupConfigResponse(
            status=pb.ReaderGroupConfigResponse.SUCCESS, config=_group_to_proto(rec)
        )

    async def updateReaderGroup(
        self, req: pb.ReaderGroupConfiguration
    ) -> pb.UpdateReaderGroupResponse:
        generation = await self.model.update_reader_group(_group_from_proto(req))
        return pb.UpdateReaderGroupResponse(
            status=pb.UpdateReaderGroupResponse.SUCCESS, generation=generation
        )

    async def deleteReaderGroup(self, req: pb.ReaderGroupInfo) -> pb.DeleteReaderGroupStatus:
        await self.model.delete_reader_group(req.scope, req.readerGroup, req.readerGroupId)
        return pb.DeleteReaderGroupStatus(status=pb.DeleteReaderGroupStatus.SUCCESS)


# --------------------------------------------------------------------------- grpc glue

_Handler = Callable[[Message], Awaitable[Message]]


def _wrap(
    name: str, method: _Handler, auth: ControllerAuth | None = None
) -> Callable[[Message, Any], Awaitable[Message]]:
    response = METHODS[name].response

    async def handle(request: Message, context: Any) -> Message:
        started = time.monotonic()
        outcome: Message | tuple[Any, str]
        try:
            if auth is not None:
                CURRENT_USER.set(await _check_access(auth, name, request, context))
            reply = await method(request)
            access.debug("%s ok %.1fms", name, (time.monotonic() - started) * 1000)
            return reply
        except AuthFailed as exc:
            outcome = (grpc.StatusCode.UNAUTHENTICATED, str(exc))
            if auth is not None and auth.refused is not None:
                auth.refused(exc.reason)
        except PermissionDenied as exc:
            outcome = (grpc.StatusCode.PERMISSION_DENIED, str(exc))
            if auth is not None and auth.refused is not None:
                auth.refused("permission_denied")
        except ControllerError as exc:
            outcome = reply_for_error(response, exc)
        except StoreClosed as exc:
            outcome = (grpc.StatusCode.UNAVAILABLE, str(exc))
        except Exception as exc:
            log.exception("controller %s failed", name)
            outcome = (grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")
        elapsed_ms = (time.monotonic() - started) * 1000
        if isinstance(outcome, Message):
            access.debug("%s %s %.1fms", name, _status_name(outcome), elapsed_ms)
            return outcome
        code, details = outcome
        access.debug("%s %s %.1fms: %s", name, code.name, elapsed_ms, details)
        await context.abort(code, details)
        raise AssertionError("context.abort returned")  # pragma: no cover

    return handle


def _status_name(reply: Message) -> str:
    field = reply.DESCRIPTOR.fields_by_name[_STATUS]
    value = getattr(reply, _STATUS)
    enum_value = field.enum_type.values_by_number.get(value) if field.enum_type else None
    return enum_value.name if enum_value is not None else str(value)


def build_handler(service: ControllerService) -> Any:
    """A grpc generic handler serving every RPC that ``service`` defines."""
    handlers = {}
    for name, rpc in METHODS.items():
        method = getattr(service, name, None)
        if method is None:
            continue  # grpc answers UNIMPLEMENTED
        handlers[name] = grpc.unary_unary_rpc_method_handler(
            _wrap(name, method, service.auth),
            request_deserializer=rpc.request.FromString,
            response_serializer=rpc.response.SerializeToString,
        )
    return grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)


def _advertised_host(host: str) -> str:
    """A host name clients can connect to: a wildcard address is not one."""
    if host in ("", "0.0.0.0", "::", "[::]"):
        return socket.getfqdn()
    return host


def _check_bindable(host: str, port: int) -> None:
    """Bind a plain socket to (host, port) as gRPC would, and let it go.

    Raises:
        OSError: with the reason (``errno``) gRPC would not give.
    """
    bare = host.strip("[]")
    family = socket.AF_INET6 if ":" in bare else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds
        probe.bind((bare, port))


def _bind_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


class ControllerServer:
    """The controller on a port: a ``grpc.aio`` server plus three periodic jobs,
    the sweep (lease expiry, aborted and transient segments), retention and
    auto-scaling.

    Start it with ``await ControllerServer.start(...)``; stop it with ``aclose``.
    """

    def __init__(self, server: Any, model: ControllerModel, port: int) -> None:
        self._server = server
        self.model = model
        self.port = port
        self._jobs: list[asyncio.Task[None]] = []
        self._stopping = asyncio.Event()

    @classmethod
    async def start(
        cls,
        store: SegmentStore,
        *,
        host: str,
        port: int,
        segment_store: tuple[str, int],
        sweep_interval_s: float = TXN_SWEEP_INTERVAL_S,
        retention_interval_s: float = RETENTION_INTERVAL_S,
        model: ControllerModel | None = None,
        auto_scale_interval_s: float = AUTO_SCALE_INTERVAL_S,
        watermark_interval_s: float = WATERMARK_INTERVAL_S,
        interceptors: Sequence[Any] = (),
        auth: ControllerAuth | None = None,
        credentials: Any = None,
        advertise_host: str | None = None,
        routes: ClusterRoutes | None = None,
        jobs: bool = True,
        wrap_handler: Callable[[Any], Any] | None = None,
        handlers: Sequence[Any] = (),
    ) -> ControllerServer:
        """Load the controller metadata from ``store`` and serve it on (host, port).

        Args:
            store: the store with the metadata tables and the segments.
            host, port: where to listen (port 0 picks a free port; see ``.port``).
            segment_store: the segment store's (host, port) for ``getURI``; a
                wildcard host is replaced by this machine's name.
            sweep_interval_s: period of the lease-expiry sweep.
            retention_interval_s: period of the retention job.
            auto_scale_interval_s: period of the auto-scaling job.
            watermark_interval_s: period of the watermark job (writers' marks
                folded into ``_MARK<stream>``).
            model: the metadata model to serve, when the caller shares one with
                other front doors (the server app does); opened from ``store``
                otherwise.
            interceptors: ``grpc.aio.ServerInterceptor`` objects (metrics).
            auth: check credentials and permissions on every RPC and sign
                delegation tokens; None: auth is off.
            credentials: ``grpc.ServerCredentials`` to serve TLS with (the
                server layer builds them from ``--tls-*``); None: plaintext.
            advertise_host: the host ``getControllerServerList`` names for this
                controller (default: ``host``); under TLS, a name on the certificate.
            routes: in a cluster, each segment's owner and the live controllers
                (``getURI``, ``getControllerServerList``); None: all here.
            jobs: run the sweep, retention and auto-scaling; False for a second
                server on the same model (another listener), so each job runs once.
            wrap_handler: given the grpc generic handler of the controller
                service, returns the handler to serve instead (in a cluster,
                one that forwards calls to the leader while this node follows).
            handlers: more grpc generic handlers served on the same port
                (the server's cluster administration service).

        Raises:
            OSError: the address could not be bound.
        """
        if model is None:
            model = await ControllerModel.open(store)
        if port:
            _check_bindable(host, port)  # before gRPC, which logs a failed bind itself
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", MAX_REQUEST_BYTES),
                ("grpc.so_reuseport", 0),
            ],
            maximum_concurrent_rpcs=MAX_CONCURRENT_RPCS,
            interceptors=list(interceptors),
        )
        try:
            address = _bind_address(host, port)
            if credentials is None:
                bound = server.add_insecure_port(address)
            else:
                bound = server.add_secure_port(address, credentials)
        except RuntimeError as exc:
            await server.stop(None)
            raise OSError(f"controller cannot listen on {host}:{port}: {exc}") from exc
        if bound == 0:
            await server.stop(None)
            raise OSError(f"controller cannot listen on {host}:{port}")
        service = ControllerService(
            model,
            segment_store=(_advertised_host(segment_store[0]), segment_store[1]),
            controller=(_advertised_host(advertise_host or host), bound),
            auth=auth,
            routes=routes,
        )
        handler = build_handler(service)
        if wrap_handler is not None:
            handler = wrap_handler(handler)
        server.add_generic_rpc_handlers((handler, *handlers))
        await server.start()
        self = cls(server, model, bound)
        if not jobs:
            return self
        self._jobs = [
            asyncio.create_task(self._every(sweep_interval_s, "transaction sweep", self._sweep)),
            asyncio.create_task(self._every(retention_interval_s, "retention", self._retention)),
            asyncio.create_task(
                self._every(auto_scale_interval_s, "auto-scaling", self._auto_scale)
            ),
            asyncio.create_task(self._every(watermark_interval_s, "watermarks", self._watermarks)),
        ]
        return self

    async def _sweep(self) -> None:
        result = await self.model.sweep()
        if result.aborted or result.purged or result.aborted_segments_deleted:
            log.info(
                "transaction sweep: %d expired and aborted, %d aborted cleaned up, "
                "%d finished forgotten",
                result.aborted,
                result.aborted_segments_deleted,
                result.purged,
            )
        if result.transients_deleted:
            log.info("sweep: %d abandoned transient segments deleted", result.transients_deleted)

    async def _retention(self) -> None:
        truncated = await self.model.enforce_retention()
        if truncated:
            log.info("retention: %d streams truncated", truncated)

    async def _auto_scale(self) -> None:
        scaled = await self.model.auto_scale()
        if scaled:
            log.info("auto-scaling: %d streams scaled", scaled)

    async def _watermarks(self) -> None:
        await self.model.emit_watermarks()

    async def _every(
        self, interval_s: float, name: str, job: Callable[[], Awaitable[None]]
    ) -> None:
        while not self._stopping.is_set():
            # A timer that ``aclose`` cuts short; a job in progress is never
            # cancelled halfway through its store calls.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), interval_s)
            if self._stopping.is_set():
                return
            try:
                await job()
            except StoreClosed:
                return
            except Exception:
                log.exception("controller %s failed", name)

    async def aclose(self, grace_s: float = GRACEFUL_STOP_S) -> None:
        """Stop accepting RPCs, let those in flight finish (up to ``grace_s``),
        then let running periodic jobs finish and stop them. Idempotent."""
        await self._server.stop(grace_s)
        self._stopping.set()
        jobs, self._jobs = self._jobs, []
        for job in jobs:
            await job
