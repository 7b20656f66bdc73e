"""Controller client: scopes, streams, segments, transactions, key-value tables (``grpc.aio``).

Speaks the controller API of ``pravega-controller.md`` with the message
classes generated from our ``controller.proto``
(``headrace.protocols.pravega.controller_pb2``, the same descriptor our
server registers, so a method name cannot differ between the two). Works against headrace and any
Pravega controller. The value types (``StreamConfig``, ``Segment``, ``TxnId``...)
are the controller API's own (``headrace.protocols.pravega.controller``, shared
with our controller) and are importable from here too.

gRPC failures are translated in one place (:func:`_rpc`): ``UNAVAILABLE``
becomes :class:`~headrace.errors.ConnectionLost`, ``DEADLINE_EXCEEDED``
:class:`~headrace.errors.RequestTimeout`, ``NOT_FOUND`` for a call about a
stream :class:`~headrace.client.errors.StreamNotFoundError` (its scope and
stream as data), anything else :class:`~headrace.errors.ServerError`. A retry
that waits ``RETRY_NOTICE_DELAY_S`` or more is logged as a warning on
``headrace.client.retry``. Status enums other than success become
:class:`~headrace.errors.ControllerError` unless the method's
docstring says it returns ``False`` for them (the ``StreamManager`` results
of the Python binding: "already exists" and "not found" are answers, not
errors).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TypeVar, cast
from urllib.parse import urlparse

import grpc  # type: ignore[import-untyped]
import grpc.aio  # type: ignore[import-untyped]
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from headrace.errors import ConnectionLost, ControllerError, RequestTimeout, ServerError
from headrace.protocols.pravega import controller_pb2 as pb
from headrace.protocols.pravega.auth import basic_header, token_expiry
from headrace.protocols.pravega.controller import (
    GroupRetention,
    KeyValueTableConfig,
    ReaderGroupConfig,
    RetentionPolicy,
    RetentionType,
    ScalingPolicy,
    ScalingType,
    Segment,
    SegmentRange,
    StreamConfig,
    TxnId,
    TxnState,
    config_from_proto,
    config_to_proto,
    kvtable_config_from_proto,
    kvtable_config_to_proto,
    reader_group_config_from_proto,
    reader_group_config_to_proto,
    txn_id_from_proto,
    txn_id_to_proto,
)

from ._conn import DEFAULT_RETRY, RETRY_NOTICE_DELAY_S, RetryPolicy, retry_log
from .errors import StreamNotFoundError
from .tls import TLS_SCHEMES, TlsOptions, uri_wants_tls

__all__ = [
    "CONTROLLER_TIMEOUT_S",
    "DEFAULT_TXN_LEASE_MS",
    "TOKEN_REFRESH_MARGIN_S",
    "ControllerClient",
    "GroupRetention",
    "KeyValueTableConfig",
    "ReaderGroupConfig",
    "RetentionPolicy",
    "RetentionType",
    "ScalingPolicy",
    "ScalingType",
    "Segment",
    "SegmentRange",
    "StreamConfig",
    "TxnId",
    "TxnState",
]

CONTROLLER_TIMEOUT_S = 30.0
"""Deadline of one controller call; the Rust client's request timeout."""

TOKEN_REFRESH_MARGIN_S = 30.0
"""A delegation token is fetched again when it has less than this left, so a
request never leaves with a token that expires on the way (the server's
default life is 600 s; one that lives shorter is refreshed at half its life)."""

DEFAULT_TXN_LEASE_MS = 90_000
"""Transaction lease the Rust client asks for (pravega-controller.md#transactions)."""

_CHANNEL_OPTIONS = [
    # grpc's defaults back off reconnects from 1 s up to 120 s; a restarted
    # controller should be found again within a fraction of a second.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
]

_SERVICE = pb.DESCRIPTOR.services_by_name["ControllerService"]
_METHODS: dict[str, tuple[str, type[Message]]] = {
    m.name: (f"/{_SERVICE.full_name}/{m.name}", GetMessageClass(m.output_type))
    for m in _SERVICE.methods
}
"""RPC name -> (method path, response class), from the generated service descriptor."""
_M = TypeVar("_M", bound=Message)


# --------------------------------------------------------------------------- the client


def _refused(what: str, status: str) -> ControllerError:
    """The error for a reply to ``what`` whose status (named ``status``) is not success."""
    return ControllerError(f"{what}: {status}", status=status)


def _stream_of(request: Message) -> tuple[str, str] | None:
    """The ``(scope, stream)`` a request is about (a ``StreamInfo``, or a
    message holding one as ``streamInfo``); None for other requests."""
    fields = request.DESCRIPTOR.fields_by_name
    if "streamInfo" in fields:
        return _stream_of(getattr(request, "streamInfo"))  # noqa: B009 (proto field)
    if "scope" in fields and "stream" in fields:
        return str(getattr(request, "scope")), str(getattr(request, "stream"))  # noqa: B009
    return None


def parse_controller_uri(uri: str) -> str:
    """``tcp://host:port`` (or ``host:port``, or a TLS scheme such as
    ``tls://host:port``) -> the grpc target ``host:port``.

    Raises:
        ValueError: an unknown scheme, or no port.
    """
    parsed = urlparse(uri if "://" in uri else f"tcp://{uri}")
    if parsed.scheme not in {"tcp", "pravega", *TLS_SCHEMES}:
        raise ValueError(
            f"controller URI scheme {parsed.scheme!r} is not supported "
            f"(tcp, or for TLS one of {', '.join(sorted(TLS_SCHEMES))})"
        )
    try:
        port = parsed.port
    except ValueError:  # not a number, or out of range
        port = None
    if not parsed.hostname or port is None:
        raise ValueError(f"controller URI {uri!r} needs a host and a port (1-65535)")
    host = parsed.hostname
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class ControllerClient:
    """An asyncio client of one controller. Close it with :meth:`aclose`.

    Args:
        uri: ``tcp://host:port`` of the controller; ``tls://host:port`` (or
            ``ssl``, ``tcps``, ``pravegas``) for TLS with the system's CAs.
        timeout_s: deadline of each call.
        credentials: ``(user, password)`` sent as Basic ``authorization``
            metadata on every call, for a server with auth on; then the
            segment-store requests carry delegation tokens
            (:meth:`delegation_token`). None: no credentials, no tokens.
        tls: TLS settings (CA file, client certificate); given, the channel
            uses TLS whatever the scheme.
        authorization: called before each call for its ``authorization``
            metadata, instead of ``credentials`` (a server node's own token).
    """

    def __init__(
        self,
        uri: str,
        *,
        timeout_s: float = CONTROLLER_TIMEOUT_S,
        retry: RetryPolicy = DEFAULT_RETRY,
        tls: TlsOptions | None = None,
        credentials: tuple[str, str] | None = None,
        authorization: Callable[[], str] | None = None,
    ) -> None:
        self.uri = uri
        self._metadata: tuple[tuple[str, str], ...] = (
            () if credentials is None else (("authorization", basic_header(*credentials)),)
        )
        self._authorization = authorization
        self._tokens: dict[tuple[str, str], tuple[str, float]] = {}  # (scope, stream) -> token, exp
        self._target = parse_controller_uri(uri)
        self._timeout_s = timeout_s
        self._retry = retry
        if tls is None and uri_wants_tls(uri):
            tls = TlsOptions()
        self.tls = tls
        """The TLS settings in use (None: plaintext); the segment store is reached the same way."""
        if tls is None:
            self._channel = grpc.aio.insecure_channel(self._target, options=_CHANNEL_OPTIONS)
        else:
            self._channel = grpc.aio.secure_channel(
                self._target, tls.grpc_credentials(), options=_CHANNEL_OPTIONS
            )

    async def aclose(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> ControllerClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _rpc(self, name: str, request: Message, response_type: type[_M]) -> _M:
        path, response_class = _METHODS[name]
        call = self._channel.unary_unary(
            path,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=response_class.FromString,
        )
        delays = self._retry.delays()
        while True:
            try:
                metadata = (
                    self._metadata
                    if self._authorization is None
                    else (("authorization", self._authorization()),)
                )
                response = await call(request, timeout=self._timeout_s, metadata=metadata)
                break
            except grpc.aio.AioRpcError as exc:
                code = exc.code()
                if code != grpc.StatusCode.UNAVAILABLE:
                    raise self._error(name, exc, request) from exc
                # No connection (a controller restarting): grpc reports UNAVAILABLE
                # when the request could not be sent, so sending it again is safe.
                delay = next(delays, None)
                if delay is None:
                    raise self._error(name, exc, request) from exc
                if delay >= RETRY_NOTICE_DELAY_S:
                    retry_log.warning(
                        "controller %s unavailable (%s); retrying in %.1f s",
                        self._target,
                        exc.details(),
                        delay,
                    )
                await asyncio.sleep(delay)
        return cast(_M, response)

    async def wait_ready(self, timeout_s: float) -> bool:
        """Whether the channel reaches the controller within ``timeout_s``
        (connected, and the TLS handshake done); no call is made."""
        try:
            await asyncio.wait_for(self._channel.channel_ready(), timeout_s)
        except TimeoutError:
            return False
        return True

    def _error(self, name: str, exc: grpc.aio.AioRpcError, request: Message) -> Exception:
        code = exc.code()
        if code == grpc.StatusCode.UNAVAILABLE:
            return ConnectionLost(f"controller {self._target}: {exc.details()}")
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return RequestTimeout(f"controller {self._target}: {name} timed out")
        stream = _stream_of(request)
        if code == grpc.StatusCode.NOT_FOUND and stream is not None:
            return StreamNotFoundError(*stream, f"{name}: {exc.details()}")
        return ServerError(code.name, f"{name}: {exc.details()}")

    # -- auth

    async def delegation_token(self, scope: str, stream: str) -> str:
        """The delegation token for ``scope/stream`` to put in segment-store requests.

        Empty without credentials (a server with auth off ignores tokens).
        Cached per stream and fetched again (``getDelegationToken``) once it
        has less than ``TOKEN_REFRESH_MARGIN_S`` (or half its life) left.

        Raises:
            ServerError: ``UNAUTHENTICATED`` (bad credentials) or
                ``PERMISSION_DENIED`` (no permission on the stream).
        """
        if not self._metadata:
            return ""
        now = time.time()
        cached = self._tokens.get((scope, stream))
        if cached is not None and cached[1] > now:
            return cached[0]
        reply = await self._rpc("getDelegationToken", self._info(scope, stream), pb.DelegationToken)
        token = str(reply.delegationToken)
        expires = token_expiry(token)
        if expires is None:  # no expiry claimed (or no token): keep it for the margin
            refresh_at = now + TOKEN_REFRESH_MARGIN_S
        else:
            refresh_at = max(expires - TOKEN_REFRESH_MARGIN_S, now + (expires - now) / 2)
        self._tokens[(scope, stream)] = (token, refresh_at)
        return token

    def forget_token(self, scope: str, stream: str) -> None:
        """Drop the cached token of ``scope/stream`` (the server said it expired)."""
        self._tokens.pop((scope, stream), None)

    @staticmethod
    def _info(scope: str, stream: str) -> pb.StreamInfo:
        return pb.StreamInfo(scope=scope, stream=stream)

    # ------------------------------------------------------------------ scopes

    async def create_scope(self, scope: str) -> bool:
        """Create a scope; ``False`` if it exists.

        Raises:
            ControllerError: invalid name or failure.
        """
        r = await self._rpc("createScope", pb.ScopeInfo(scope=scope), pb.CreateScopeStatus)
        if r.status == pb.CreateScopeStatus.SUCCESS:
            return True
        if r.status == pb.CreateScopeStatus.SCOPE_EXISTS:
            return False
        raise _refused(f"create scope {scope!r}", pb.CreateScopeStatus.Status.Name(r.status))

    async def delete_scope(self, scope: str) -> bool:
        """Delete an empty scope; ``False`` if it does not exist.

        Raises:
            ControllerError: the scope still has streams, or failure.
        """
        r = await self._rpc("deleteScope", pb.ScopeInfo(scope=scope), pb.DeleteScopeStatus)
        if r.status == pb.DeleteScopeStatus.SUCCESS:
            return True
        if r.status == pb.DeleteScopeStatus.SCOPE_NOT_FOUND:
            return False
        raise _refused(f"delete scope {scope!r}", pb.DeleteScopeStatus.Status.Name(r.status))

    async def scope_exists(self, scope: str) -> bool:
        r = await self._rpc("checkScopeExists", pb.ScopeInfo(scope=scope), pb.ExistsResponse)
        return bool(r.exists)

    async def list_scopes(self) -> AsyncIterator[str]:
        """Every scope, page by page."""
        token = ""
        while True:
            req = pb.ScopesRequest(continuationToken=pb.ContinuationToken(token=token))
            r = await self._rpc("listScopes", req, pb.ScopesResponse)
            if not r.scopes:
                return
            for name in r.scopes:
                yield name
            if r.continuationToken.token == token:
                return  # a server that repeats a token would loop forever
            token = r.continuationToken.token

    # ------------------------------------------------------------------ streams

    async def create_stream(
        self, scope: str, stream: str, config: StreamConfig | None = None
    ) -> bool:
        """Create a stream; ``False`` if it exists.

        Raises:
            ControllerError: missing scope, invalid name, or failure.
        """
        req = config_to_proto(scope, stream, config or StreamConfig())
        r = await self._rpc("createStream", req, pb.CreateStreamStatus)
        if r.status == pb.CreateStreamStatus.SUCCESS:
            return True
        if r.status == pb.CreateStreamStatus.STREAM_EXISTS:
            return False
        raise _refused(
            f"create stream {scope}/{stream}", pb.CreateStreamStatus.Status.Name(r.status)
        )

    async def update_stream(self, scope: str, stream: str, config: StreamConfig) -> None:
        """Replace a stream's policies and tags.

        Raises:
            ControllerError: missing stream or scope, or failure.
        """
        req = config_to_proto(scope, stream, config)
        r = await self._rpc("updateStream", req, pb.UpdateStreamStatus)
        self._check_update(r, f"update stream {scope}/{stream}")

    @staticmethod
    def _check_update(r: pb.UpdateStreamStatus, what: str) -> None:
        if r.status != pb.UpdateStreamStatus.SUCCESS:
            raise _refused(what, pb.UpdateStreamStatus.Status.Name(r.status))

    async def get_stream_config(self, scope: str, stream: str) -> StreamConfig:
        r = await self._rpc("getStreamConfiguration", self._info(scope, stream), pb.StreamConfig)
        return config_from_proto(r)

    async def stream_exists(self, scope: str, stream: str) -> bool:
        r = await self._rpc("checkStreamExists", self._info(scope, stream), pb.ExistsResponse)
        return bool(r.exists)

    async def list_streams(self, scope: str) -> AsyncIterator[str]:
        """Every stream of a scope, page by page (nothing for a missing scope)."""
        token = ""
        while True:
            req = pb.StreamsInScopeRequest(
                scope=pb.ScopeInfo(scope=scope), continuationToken=pb.ContinuationToken(token=token)
            )
            r = await self._rpc("listStreamsInScope", req, pb.StreamsInScopeResponse)
            if not r.streams:
                return
            for info in r.streams:
                yield info.stream
            if r.continuationToken.token == token:
                return
            token = r.continuationToken.token

    async def seal_stream(self, scope: str, stream: str) -> None:
        """Seal every open segment; later appends fail and readers reach the end.

        Raises:
            ControllerError: missing stream, or failure.
        """
        r = await self._rpc("sealStream", self._info(scope, stream), pb.UpdateStreamStatus)
        self._check_update(r, f"seal stream {scope}/{stream}")

    async def delete_stream(self, scope: str, stream: str) -> bool:
        """Delete a sealed stream; ``False`` if it does not exist.

        Raises:
            ControllerError: the stream is not sealed, or failure.
        """
        r = await self._rpc("deleteStream", self._info(scope, stream), pb.DeleteStreamStatus)
        if r.status == pb.DeleteStreamStatus.SUCCESS:
            return True
        if r.status == pb.DeleteStreamStatus.STREAM_NOT_FOUND:
            return False
        raise _refused(
            f"delete stream {scope}/{stream}", pb.DeleteStreamStatus.Status.Name(r.status)
        )

    async def truncate_stream(self, scope: str, stream: str, cut: dict[int, int]) -> None:
        """Drop everything before a stream cut (``segment id -> offset``)."""
        req = pb.StreamCut(streamInfo=self._info(scope, stream), cut=cut)
        r = await self._rpc("truncateStream", req, pb.UpdateStreamStatus)
        self._check_update(r, f"truncate stream {scope}/{stream}")

    # ------------------------------------------------------------------ segments

    @staticmethod
    def _ranges(ranges: Sequence[pb.SegmentRange]) -> list[SegmentRange]:
        out = [
            SegmentRange(
                Segment(
                    r.segmentId.streamInfo.scope,
                    r.segmentId.streamInfo.stream,
                    r.segmentId.segmentId,
                ),
                r.minKey,
                r.maxKey,
            )
            for r in ranges
        ]
        out.sort(key=lambda sr: sr.min_key)
        return out

    async def get_current_segments(self, scope: str, stream: str) -> list[SegmentRange]:
        """The open segments with their key ranges, by key (empty once sealed)."""
        r = await self._rpc("getCurrentSegments", self._info(scope, stream), pb.SegmentRanges)
        return self._ranges(r.segmentRanges)

    async def get_epoch_segments(self, scope: str, stream: str, epoch: int) -> list[SegmentRange]:
        req = pb.GetEpochSegmentsRequest(streamInfo=self._info(scope, stream), epoch=epoch)
        r = await self._rpc("getEpochSegments", req, pb.SegmentRanges)
        return self._ranges(r.segmentRanges)

    async def get_head_segments(self, scope: str, stream: str) -> dict[Segment, int]:
        """The first readable segments and their start offsets (``getSegments`` at time 0)."""
        return await self.get_segments_at(scope, stream, 0)

    async def get_segments_at(
        self, scope: str, stream: str, timestamp_ms: int
    ) -> dict[Segment, int]:
        """The segments that were open at ``timestamp_ms`` (epoch milliseconds),
        each with the offset to read it from (its start, or the truncation
        point); the head segments for 0 or a time before the stream's head.

        Coarse: the answer is a whole epoch, so the offsets are at or before
        that time, never after it.
        """
        req = pb.GetSegmentsRequest(streamInfo=self._info(scope, stream), timestamp=timestamp_ms)
        r = await self._rpc("getSegments", req, pb.SegmentsAtTime)
        return {
            Segment(
                loc.segmentId.streamInfo.scope or scope,
                loc.segmentId.streamInfo.stream or stream,
                loc.segmentId.segmentId,
            ): loc.offset
            for loc in r.segments
        }

    async def get_successors(self, segment: Segment) -> dict[SegmentRange, list[int]]:
        """The segments that replaced a sealed one, each with its predecessors' ids.

        Empty when the stream was sealed (nothing follows).
        """
        req = pb.SegmentId(
            streamInfo=self._info(segment.scope, segment.stream), segmentId=segment.segment_id
        )
        r = await self._rpc("getSegmentsImmediatelyFollowing", req, pb.SuccessorResponse)
        out: dict[SegmentRange, list[int]] = {}
        for entry in r.segments:
            (rng,) = self._ranges([entry.segment])
            out[rng] = list(entry.value)
        return out

    async def get_uri(self, segment: Segment) -> tuple[str, int]:
        """The segment store ``(host, port)`` serving ``segment``."""
        req = pb.SegmentId(
            streamInfo=self._info(segment.scope, segment.stream), segmentId=segment.segment_id
        )
        r = await self._rpc("getURI", req, pb.NodeUri)
        return r.endpoint, r.port

    async def scale_stream(
        self,
        scope: str,
        stream: str,
        sealed_segment_ids: Sequence[int],
        new_ranges: Sequence[tuple[float, float]],
    ) -> list[SegmentRange]:
        """Replace open segments by new ones covering the same key ranges.

        Returns the new segments. Writers see the old ones sealed and move to
        the new ones; readers finish the old ones before starting these.

        Raises:
            ControllerError: the request was refused (ranges do not match...).
        """
        req = pb.ScaleRequest(
            streamInfo=self._info(scope, stream),
            sealedSegments=list(sealed_segment_ids),
            newKeyRanges=[pb.ScaleRequest.KeyRangeEntry(start=a, end=b) for a, b in new_ranges],
        )
        r = await self._rpc("scale", req, pb.ScaleResponse)
        if r.status != pb.ScaleResponse.STARTED:
            raise _refused(
                f"scale {scope}/{stream}", pb.ScaleResponse.ScaleStreamStatus.Name(r.status)
            )
        return self._ranges(r.segments)

    # ------------------------------------------------------------------ transactions

    async def create_transaction(
        self, scope: str, stream: str, lease_ms: int = DEFAULT_TXN_LEASE_MS
    ) -> tuple[TxnId, list[SegmentRange]]:
        """Begin a transaction: its id and the stream's open segments it writes to."""
        req = pb.CreateTxnRequest(streamInfo=self._info(scope, stream), lease=lease_ms)
        r = await self._rpc("createTransaction", req, pb.CreateTxnResponse)
        return txn_id_from_proto(r.txnId), self._ranges(r.activeSegments)

    def _txn_request(
        self, scope: str, stream: str, txn: TxnId, writer_id: str = "", timestamp: int = 0
    ) -> pb.TxnRequest:
        return pb.TxnRequest(
            streamInfo=self._info(scope, stream),
            txnId=txn_id_to_proto(txn),
            writerId=writer_id,
            timestamp=timestamp,
        )

    async def commit_transaction(
        self, scope: str, stream: str, txn: TxnId, writer_id: str = "", timestamp: int = -(2**63)
    ) -> None:
        req = self._txn_request(scope, stream, txn, writer_id, timestamp)
        r = await self._rpc("commitTransaction", req, pb.TxnStatus)
        if r.status != pb.TxnStatus.SUCCESS:
            raise _refused(f"commit {txn.hex}", pb.TxnStatus.Status.Name(r.status))

    async def abort_transaction(self, scope: str, stream: str, txn: TxnId) -> None:
        r = await self._rpc("abortTransaction", self._txn_request(scope, stream, txn), pb.TxnStatus)
        if r.status != pb.TxnStatus.SUCCESS:
            raise _refused(f"abort {txn.hex}", pb.TxnStatus.Status.Name(r.status))

    async def ping_transaction(
        self, scope: str, stream: str, txn: TxnId, lease_ms: int = DEFAULT_TXN_LEASE_MS
    ) -> str:
        """Extend a transaction's lease; returns the status name (``OK`` while open)."""
        req = pb.PingTxnRequest(
            streamInfo=self._info(scope, stream),
            txnId=txn_id_to_proto(txn),
            lease=lease_ms,
        )
        r = await self._rpc("pingTransaction", req, pb.PingTxnStatus)
        return pb.PingTxnStatus.Status.Name(r.status)

    async def transaction_state(self, scope: str, stream: str, txn: TxnId) -> TxnState:
        r = await self._rpc(
            "checkTransactionState", self._txn_request(scope, stream, txn), pb.TxnState
        )
        return TxnState(r.state)

    # ------------------------------------------------------------------ reader groups

    async def create_reader_group(self, config: ReaderGroupConfig) -> ReaderGroupConfig:
        """Create a reader group in the controller (its record and its state stream
        ``_RG<group>``); returns the group as stored, with its id and generation.
        An existing group of that name is returned as it is.

        Raises:
            ControllerError: missing scope, invalid name, or failure.
            ServerError: ``NOT_FOUND``: a stream the group reads does not exist.
        """
        req = reader_group_config_to_proto(config)
        r = await self._rpc("createReaderGroup", req, pb.CreateReaderGroupResponse)
        if r.status != pb.CreateReaderGroupResponse.SUCCESS:
            raise _refused(
                f"create reader group {config.scope}/{config.group}",
                pb.CreateReaderGroupResponse.Status.Name(r.status),
            )
        return reader_group_config_from_proto(r.config)

    async def get_reader_group_config(self, scope: str, group: str) -> ReaderGroupConfig | None:
        """The group's configuration; ``None`` if it does not exist."""
        req = pb.ReaderGroupInfo(scope=scope, readerGroup=group)
        r = await self._rpc("getReaderGroupConfig", req, pb.ReaderGroupConfigResponse)
        if r.status == pb.ReaderGroupConfigResponse.RG_NOT_FOUND:
            return None
        if r.status != pb.ReaderGroupConfigResponse.SUCCESS:
            raise _refused(
                f"reader group {scope}/{group}", pb.ReaderGroupConfigResponse.Status.Name(r.status)
            )
        return reader_group_config_from_proto(r.config)

    async def update_reader_group(self, config: ReaderGroupConfig) -> int:
        """Replace a group's configuration; ``config.generation`` and ``group_id``
        must be the group's current ones. Returns the new generation.

        Raises:
            ControllerError: ``RG_NOT_FOUND``, ``INVALID_CONFIG`` (another
                generation or id, an invalid cut), or failure.
        """
        req = reader_group_config_to_proto(config)
        r = await self._rpc("updateReaderGroup", req, pb.UpdateReaderGroupResponse)
        if r.status != pb.UpdateReaderGroupResponse.SUCCESS:
            raise _refused(
                f"update reader group {config.scope}/{config.group}",
                pb.UpdateReaderGroupResponse.Status.Name(r.status),
            )
        return int(r.generation)

    async def delete_reader_group(self, scope: str, group: str, group_id: str) -> bool:
        """Delete a group (its record, subscriptions and state stream); ``False`` if
        no group of that name and id exists."""
        req = pb.ReaderGroupInfo(scope=scope, readerGroup=group, readerGroupId=group_id)
        r = await self._rpc("deleteReaderGroup", req, pb.DeleteReaderGroupStatus)
        if r.status == pb.DeleteReaderGroupStatus.SUCCESS:
            return True
        if r.status == pb.DeleteReaderGroupStatus.RG_NOT_FOUND:
            return False
        raise _refused(
            f"delete reader group {scope}/{group}",
            pb.DeleteReaderGroupStatus.Status.Name(r.status),
        )

    async def list_subscribers(self, scope: str, stream: str) -> list[str]:
        """The subscribing groups of a stream, as ``<scope>/<group>``.

        Raises:
            ControllerError: missing stream, or failure.
        """
        r = await self._rpc("listSubscribers", self._info(scope, stream), pb.SubscribersResponse)
        if r.status != pb.SubscribersResponse.SUCCESS:
            raise _refused(
                f"subscribers of {scope}/{stream}", pb.SubscribersResponse.Status.Name(r.status)
            )
        return list(r.subscribers)

    async def update_subscriber_stream_cut(
        self,
        scope: str,
        stream: str,
        subscriber: str,
        group_id: str,
        generation: int,
        cut: dict[int, int],
    ) -> None:
        """Report where subscriber ``<scope>/<group>`` is in a stream: retention
        keeps everything from there on.

        Raises:
            ControllerError: ``STREAM_NOT_FOUND``, ``SUBSCRIBER_NOT_FOUND``,
                ``GENERATION_MISMATCH``, ``STREAM_CUT_NOT_VALID`` (invalid, or
                behind the cut reported before), or failure.
        """
        req = pb.SubscriberStreamCut(
            subscriber=subscriber,
            generation=generation,
            readerGroupId=group_id,
            streamCut=pb.StreamCut(streamInfo=self._info(scope, stream), cut=cut),
        )
        r = await self._rpc("updateSubscriberStreamCut", req, pb.UpdateSubscriberStatus)
        if r.status != pb.UpdateSubscriberStatus.SUCCESS:
            raise _refused(
                f"subscriber {subscriber} on {scope}/{stream}",
                pb.UpdateSubscriberStatus.Status.Name(r.status),
            )

    # ------------------------------------------------------------------ key-value tables

    async def create_key_value_table(
        self, scope: str, table: str, config: KeyValueTableConfig | None = None
    ) -> bool:
        """Create a key-value table (``config``: partitions and key lengths,
        default one partition, one-byte primary keys); ``False`` if it exists.

        Raises:
            ControllerError: missing scope, invalid name, or failure.
            ServerError: ``INVALID_ARGUMENT`` for a shape the server refuses.
        """
        req = kvtable_config_to_proto(scope, table, config or KeyValueTableConfig())
        r = await self._rpc("createKeyValueTable", req, pb.CreateKeyValueTableStatus)
        if r.status == pb.CreateKeyValueTableStatus.SUCCESS:
            return True
        if r.status == pb.CreateKeyValueTableStatus.TABLE_EXISTS:
            return False
        raise _refused(
            f"create key-value table {scope}/{table}",
            pb.CreateKeyValueTableStatus.Status.Name(r.status),
        )

    async def get_key_value_table_config(
        self, scope: str, table: str
    ) -> KeyValueTableConfig | None:
        """A key-value table's shape; ``None`` if there is no such table."""
        req = pb.KeyValueTableInfo(scope=scope, kvtName=table)
        r = await self._rpc("getKeyValueTableConfiguration", req, pb.KeyValueTableConfigResponse)
        if r.status == pb.KeyValueTableConfigResponse.SUCCESS:
            return kvtable_config_from_proto(r.config)
        if r.status == pb.KeyValueTableConfigResponse.TABLE_NOT_FOUND:
            return None
        raise _refused(
            f"key-value table {scope}/{table}",
            pb.KeyValueTableConfigResponse.Status.Name(r.status),
        )

    async def get_key_value_table_segments(self, scope: str, table: str) -> list[SegmentRange]:
        """A key-value table's partitions by key range (segments under the table's
        name; ``kvtable_segment_name`` names their table segments)."""
        req = pb.KeyValueTableInfo(scope=scope, kvtName=table)
        r = await self._rpc("getCurrentSegmentsKeyValueTable", req, pb.SegmentRanges)
        return self._ranges(r.segmentRanges)

    async def list_key_value_tables(self, scope: str) -> AsyncIterator[str]:
        """Every key-value table of a scope, page by page (nothing for a missing scope)."""
        token = ""
        while True:
            req = pb.KVTablesInScopeRequest(
                scope=pb.ScopeInfo(scope=scope), continuationToken=pb.ContinuationToken(token=token)
            )
            r = await self._rpc("listKeyValueTablesInScope", req, pb.KVTablesInScopeResponse)
            if not r.kvtables:
                return
            for info in r.kvtables:
                yield info.kvtName
            if r.continuationToken.token == token:
                return
            token = r.continuationToken.token

    async def delete_key_value_table(self, scope: str, table: str) -> bool:
        """Delete a key-value table and its data; ``False`` if it does not exist."""
        req = pb.KeyValueTableInfo(scope=scope, kvtName=table)
        r = await self._rpc("deleteKeyValueTable", req, pb.DeleteKVTableStatus)
        if r.status == pb.DeleteKVTableStatus.SUCCESS:
            return True
        if r.status == pb.DeleteKVTableStatus.TABLE_NOT_FOUND:
            return False
        raise _refused(
            f"delete key-value table {scope}/{table}",
            pb.DeleteKVTableStatus.Status.Name(r.status),
        )


def ranges_partition(ranges: Sequence[SegmentRange]) -> bool:
    """Whether ``ranges`` (sorted by key) cover [0, 1) without gaps or overlaps."""
    expected = 0.0
    for r in ranges:
        if not math.isclose(r.min_key, expected, abs_tol=0.0) or r.max_key <= r.min_key:
            return False
        expected = r.max_key
    return expected == 1.0
