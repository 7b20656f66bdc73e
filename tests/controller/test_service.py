"""The controller over gRPC: a grpc.aio client on the method table, against ControllerServer."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest
from google.protobuf.message import Message

from headrace.controller.rpc import METHODS, SERVICE_NAME
from headrace.controller.service import ControllerServer
from headrace.protocols.pravega import controller_pb2 as pb
from headrace.store.memory import MemoryStore

# Every RPC of the client's proto (pravega-controller.md#rpcs), spelled exactly.
SPEC_RPCS = [
    "getControllerServerList",
    "createStream",
    "updateStream",
    "truncateStream",
    "sealStream",
    "deleteStream",
    "getCurrentSegments",
    "getEpochSegments",
    "getSegments",
    "getSegmentsImmediatlyFollowing",
    "getSegmentsImmediatelyFollowing",
    "getSegmentsBetween",
    "scale",
    "checkScale",
    "getURI",
    "isSegmentValid",
    "isStreamCutValid",
    "createTransaction",
    "commitTransaction",
    "abortTransaction",
    "pingTransaction",
    "checkTransactionState",
    "createScope",
    "listScopes",
    "checkScopeExists",
    "checkStreamExists",
    "listStreamsInScope",
    "deleteScope",
    "getDelegationToken",
    "removeWriter",
    "noteTimestampFromWriter",
    "createKeyValueTable",
    "getCurrentSegmentsKeyValueTable",
    "listKeyValueTablesInScope",
    "getKeyValueTableConfiguration",
    "deleteKeyValueTable",
    "listSubscribers",
    "updateSubscriberStreamCut",
    "createReaderGroup",
    "getReaderGroupConfig",
    "deleteReaderGroup",
    "updateReaderGroup",
    "getStreamConfiguration",
    "listStreamsInScopeForTag",
]

CALL_TIMEOUT_S = 10.0


class Client:
    """Calls any controller RPC by name over one channel."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._calls = {
            name: channel.unary_unary(
                m.path,
                request_serializer=m.request.SerializeToString,
                response_deserializer=m.response.FromString,
            )
            for name, m in METHODS.items()
        }

    async def __call__(self, name: str, request: Message) -> Any:
        return await self._calls[name](request, timeout=CALL_TIMEOUT_S)


@pytest.fixture
async def server() -> AsyncIterator[ControllerServer]:
    srv = await ControllerServer.start(
        MemoryStore(), host="127.0.0.1", port=0, segment_store=("127.0.0.1", 12345)
    )
    yield srv
    await srv.aclose()


@pytest.fixture
async def call(server: ControllerServer) -> AsyncIterator[Client]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        yield Client(channel)


def info(scope: str = "sc", stream: str = "st") -> pb.StreamInfo:
    return pb.StreamInfo(scope=scope, stream=stream)


def config(n: int, tags: list[str] | None = None) -> pb.StreamConfig:
    cfg = pb.StreamConfig(streamInfo=info(), scalingPolicy=pb.ScalingPolicy(minNumSegments=n))
    if tags is not None:
        cfg.tags.tag.extend(tags)
    return cfg


async def make_stream(call: Client, n: int = 1, tags: list[str] | None = None) -> None:
    await call("createScope", pb.ScopeInfo(scope="sc"))
    reply = await call("createStream", config(n, tags))
    assert reply.status == pb.CreateStreamStatus.SUCCESS


def test_service_and_method_names_match_the_spec() -> None:
    assert SERVICE_NAME == "io.pravega.controller.stream.api.grpc.v1.ControllerService"
    assert sorted(METHODS) == sorted(SPEC_RPCS)
    assert METHODS["getURI"].path == f"/{SERVICE_NAME}/getURI"


async def test_create_scope_statuses(call: Client) -> None:
    ok = await call("createScope", pb.ScopeInfo(scope="sc"))
    again = await call("createScope", pb.ScopeInfo(scope="sc"))
    bad = await call("createScope", pb.ScopeInfo(scope="bad/name"))
    assert ok.status == pb.CreateScopeStatus.SUCCESS
    assert again.status == pb.CreateScopeStatus.SCOPE_EXISTS
    assert bad.status == pb.CreateScopeStatus.INVALID_SCOPE_NAME
    exists = await call("checkScopeExists", pb.ScopeInfo(scope="sc"))
    assert exists.exists


async def test_list_scopes_pages_until_an_empty_page(call: Client) -> None:
    for name in ["a", "b"]:
        await call("createScope", pb.ScopeInfo(scope=name))
    first = await call(
        "listScopes", pb.ScopesRequest(continuationToken=pb.ContinuationToken(token=""))
    )
    assert list(first.scopes) == ["a", "b"]
    second = await call("listScopes", pb.ScopesRequest(continuationToken=first.continuationToken))
    assert list(second.scopes) == []
    assert second.continuationToken.token == first.continuationToken.token


async def test_delete_scope_statuses(call: Client) -> None:
    await make_stream(call)
    not_empty = await call("deleteScope", pb.ScopeInfo(scope="sc"))
    missing = await call("deleteScope", pb.ScopeInfo(scope="nope"))
    assert not_empty.status == pb.DeleteScopeStatus.SCOPE_NOT_EMPTY
    assert missing.status == pb.DeleteScopeStatus.SCOPE_NOT_FOUND


async def test_create_stream_statuses(call: Client) -> None:
    missing_scope = await call("createStream", config(1))
    assert missing_scope.status == pb.CreateStreamStatus.SCOPE_NOT_FOUND
    await make_stream(call)
    again = await call("createStream", config(1))
    assert again.status == pb.CreateStreamStatus.STREAM_EXISTS
    bad = pb.StreamConfig(streamInfo=info(stream="rg_kvtable"))
    assert (await call("createStream", bad)).status == pb.CreateStreamStatus.INVALID_STREAM_NAME


async def test_get_stream_configuration_sets_policies_and_tags_only_if_any(call: Client) -> None:
    await make_stream(call, 2, tags=["t1", "t2"])
    cfg = await call("getStreamConfiguration", info())
    assert cfg.HasField("streamInfo") and cfg.HasField("scalingPolicy")
    assert cfg.scalingPolicy.minNumSegments == 2
    assert list(cfg.tags.tag) == ["t1", "t2"]
    await call("updateStream", config(2))
    assert not (await call("getStreamConfiguration", info())).HasField("tags")


async def test_current_segments_partition_the_key_space(call: Client) -> None:
    await make_stream(call, 4)
    ranges = (await call("getCurrentSegments", info())).segmentRanges
    assert [r.segmentId.segmentId for r in ranges] == [0, 1, 2, 3]
    assert [(r.minKey, r.maxKey) for r in ranges] == [
        (0.0, 0.25),
        (0.25, 0.5),
        (0.5, 0.75),
        (0.75, 1.0),
    ]
    assert ranges[0].segmentId.streamInfo.stream == "st"


async def test_get_uri_returns_the_segment_store_for_any_segment(call: Client) -> None:
    uri = await call("getURI", pb.SegmentId(streamInfo=info("x", "rg_kvtable"), segmentId=0))
    assert (uri.endpoint, uri.port) == ("127.0.0.1", 12345)


async def test_get_segments_at_head(call: Client) -> None:
    await make_stream(call, 1)
    head = await call("getSegments", pb.GetSegmentsRequest(streamInfo=info(), timestamp=0))
    assert [(s.segmentId.segmentId, s.offset) for s in head.segments] == [(0, 0)]


async def test_seal_then_delete_stream(call: Client) -> None:
    await make_stream(call, 2)
    not_sealed = await call("deleteStream", info())
    assert not_sealed.status == pb.DeleteStreamStatus.STREAM_NOT_SEALED
    sealed = await call("sealStream", info())
    assert sealed.status == pb.UpdateStreamStatus.SUCCESS
    assert list((await call("getCurrentSegments", info())).segmentRanges) == []
    follow = await call("getSegmentsImmediatelyFollowing", pb.SegmentId(streamInfo=info()))
    assert list(follow.segments) == []
    assert (await call("deleteStream", info())).status == pb.DeleteStreamStatus.SUCCESS
    gone = await call("deleteStream", info())
    assert gone.status == pb.DeleteStreamStatus.STREAM_NOT_FOUND


async def test_list_streams_in_scope_and_for_tag(call: Client) -> None:
    await make_stream(call, 1, tags=["x"])
    req = pb.StreamsInScopeRequest(
        scope=pb.ScopeInfo(scope="sc"), continuationToken=pb.ContinuationToken(token="")
    )
    page = await call("listStreamsInScope", req)
    assert [s.stream for s in page.streams] == ["st"]
    req.continuationToken.CopyFrom(page.continuationToken)
    assert list((await call("listStreamsInScope", req)).streams) == []
    tagged = await call(
        "listStreamsInScopeForTag",
        pb.StreamsInScopeWithTagRequest(scope=pb.ScopeInfo(scope="sc"), tag="x"),
    )
    assert [s.stream for s in tagged.streams] == ["st"]
    missing = await call(
        "listStreamsInScope", pb.StreamsInScopeRequest(scope=pb.ScopeInfo(scope="nope"))
    )
    assert missing.status == pb.StreamsInScopeResponse.SCOPE_NOT_FOUND


async def test_segments_of_unknown_stream_fail_with_not_found(call: Client) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call("getCurrentSegments", info("nope", "nope"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_transaction_lifecycle(call: Client) -> None:
    await make_stream(call, 2)
    created = await call("createTransaction", pb.CreateTxnRequest(streamInfo=info(), lease=90_000))
    txn = created.txnId
    assert txn.lowBits >= 0
    assert [r.segmentId.segmentId for r in created.activeSegments] == [0, 1]
    req = pb.TxnRequest(streamInfo=info(), txnId=txn)
    assert (await call("checkTransactionState", req)).state == pb.TxnState.OPEN
    ping = pb.PingTxnRequest(streamInfo=info(), txnId=txn, lease=90_000)
    assert (await call("pingTransaction", ping)).status == pb.PingTxnStatus.OK
    epoch = await call("getEpochSegments", pb.GetEpochSegmentsRequest(streamInfo=info(), epoch=0))
    assert len(epoch.segmentRanges) == 2
    commit = pb.TxnRequest(streamInfo=info(), txnId=txn, writerId="42", timestamp=-(2**63))
    assert (await call("commitTransaction", commit)).status == pb.TxnStatus.SUCCESS
    assert (await call("checkTransactionState", req)).state == pb.TxnState.COMMITTED
    assert (await call("pingTransaction", ping)).status == pb.PingTxnStatus.COMMITTED
    abort = await call("abortTransaction", req)
    assert abort.status == pb.TxnStatus.TRANSACTION_NOT_FOUND


async def test_scale_with_an_open_transaction_then_commit_rolls(call: Client) -> None:
    await make_stream(call, 1)
    created = await call("createTransaction", pb.CreateTxnRequest(streamInfo=info(), lease=90_000))
    scale = pb.ScaleRequest(
        streamInfo=info(),
        sealedSegments=[0],
        newKeyRanges=[
            pb.ScaleRequest.KeyRangeEntry(start=0.0, end=0.5),
            pb.ScaleRequest.KeyRangeEntry(start=0.5, end=1.0),
        ],
    )
    assert (await call("scale", scale)).status == pb.ScaleResponse.STARTED
    req = pb.TxnRequest(streamInfo=info(), txnId=created.txnId)
    assert (await call("checkTransactionState", req)).state == pb.TxnState.OPEN
    assert (await call("commitTransaction", req)).status == pb.TxnStatus.SUCCESS
    assert (await call("checkTransactionState", req)).state == pb.TxnState.COMMITTED
    current = await call("getCurrentSegments", info())
    assert [r.segmentId.segmentId for r in current.segmentRanges] == [3 << 32 | 1, 3 << 32 | 2]
    copy = await call("getEpochSegments", pb.GetEpochSegmentsRequest(streamInfo=info(), epoch=2))
    assert [r.segmentId.segmentId for r in copy.segmentRanges] == [2 << 32 | 0]


async def test_key_value_table_rpcs(call: Client) -> None:
    kvt = pb.KeyValueTableInfo(scope="sc", kvtName="kv")
    config = pb.KeyValueTableConfig(
        scope="sc", kvtName="kv", partitionCount=2, primaryKeyLength=8, secondaryKeyLength=4
    )
    missing_scope = await call("createKeyValueTable", config)
    assert missing_scope.status == pb.CreateKeyValueTableStatus.SCOPE_NOT_FOUND
    await call("createScope", pb.ScopeInfo(scope="sc"))
    created = await call("createKeyValueTable", config)
    assert created.status == pb.CreateKeyValueTableStatus.SUCCESS
    again = await call("createKeyValueTable", config)
    assert again.status == pb.CreateKeyValueTableStatus.TABLE_EXISTS
    bad_name = pb.KeyValueTableConfig(scope="sc", kvtName="a/b", partitionCount=1)
    bad_name.primaryKeyLength = 1
    assert (
        await call("createKeyValueTable", bad_name)
    ).status == pb.CreateKeyValueTableStatus.INVALID_TABLE_NAME
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call("createKeyValueTable", pb.KeyValueTableConfig(scope="sc", kvtName="z"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # no partitions, no key

    got = await call("getKeyValueTableConfiguration", kvt)
    assert got.status == pb.KeyValueTableConfigResponse.SUCCESS
    assert got.config == config
    segs = await call("getCurrentSegmentsKeyValueTable", kvt)
    assert [(r.segmentId.segmentId, r.minKey, r.maxKey) for r in segs.segmentRanges] == [
        (0, 0.0, 0.5),
        (1, 0.5, 1.0),
    ]
    listing = await call(
        "listKeyValueTablesInScope",
        pb.KVTablesInScopeRequest(scope=pb.ScopeInfo(scope="sc")),
    )
    assert [t.kvtName for t in listing.kvtables] == ["kv"]
    assert listing.continuationToken.token == "kv"
    nothing = await call(
        "listKeyValueTablesInScope",
        pb.KVTablesInScopeRequest(scope=pb.ScopeInfo(scope="nope")),
    )
    assert nothing.status == pb.KVTablesInScopeResponse.SCOPE_NOT_FOUND

    deleted = await call("deleteKeyValueTable", kvt)
    assert deleted.status == pb.DeleteKVTableStatus.SUCCESS
    gone = await call("deleteKeyValueTable", kvt)
    assert gone.status == pb.DeleteKVTableStatus.TABLE_NOT_FOUND
    absent = await call("getKeyValueTableConfiguration", kvt)
    assert absent.status == pb.KeyValueTableConfigResponse.TABLE_NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call("getCurrentSegmentsKeyValueTable", kvt)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_abort_then_state_is_aborted(call: Client) -> None:
    await make_stream(call, 1)
    created = await call("createTransaction", pb.CreateTxnRequest(streamInfo=info(), lease=90_000))
    req = pb.TxnRequest(streamInfo=info(), txnId=created.txnId)
    assert (await call("abortTransaction", req)).status == pb.TxnStatus.SUCCESS
    assert (await call("checkTransactionState", req)).state == pb.TxnState.ABORTED


async def test_unknown_transaction_replies(call: Client) -> None:
    await make_stream(call, 1)
    txn = pb.TxnId(highBits=0, lowBits=999)
    ping = await call("pingTransaction", pb.PingTxnRequest(streamInfo=info(), txnId=txn, lease=1))
    assert ping.status == pb.PingTxnStatus.UNKNOWN
    commit = await call("commitTransaction", pb.TxnRequest(streamInfo=info(), txnId=txn))
    assert commit.status == pb.TxnStatus.TRANSACTION_NOT_FOUND
    missing_stream = pb.TxnRequest(streamInfo=info("sc", "nope"), txnId=txn)
    assert (await call("commitTransaction", missing_stream)).status == pb.TxnStatus.STREAM_NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call("checkTransactionState", pb.TxnRequest(streamInfo=info(), txnId=txn))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_create_transaction_with_huge_lease_is_invalid(call: Client) -> None:
    await make_stream(call, 1)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call("createTransaction", pb.CreateTxnRequest(streamInfo=info(), lease=10**9))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_scale_check_scale_and_successors(call: Client) -> None:
    await make_stream(call, 1)
    reply = await call(
        "scale",
        pb.ScaleRequest(
            streamInfo=info(),
            sealedSegments=[0],
            newKeyRanges=[
                pb.ScaleRequest.KeyRangeEntry(start=0.0, end=0.5),
                pb.ScaleRequest.KeyRangeEntry(start=0.5, end=1.0),
            ],
        ),
    )
    assert reply.status == pb.ScaleResponse.STARTED
    new_ids = [r.segmentId.segmentId for r in reply.segments]
    assert new_ids == [(1 << 32) | 1, (1 << 32) | 2]
    status = await call("checkScale", pb.ScaleStatusRequest(streamInfo=info(), epoch=reply.epoch))
    assert status.status == pb.ScaleStatusResponse.SUCCESS
    follow = await call("getSegmentsImmediatelyFollowing", pb.SegmentId(streamInfo=info()))
    assert [(e.segment.segmentId.segmentId, list(e.value)) for e in follow.segments] == [
        (new_ids[0], [0]),
        (new_ids[1], [0]),
    ]
    valid = await call("isSegmentValid", pb.SegmentId(streamInfo=info(), segmentId=new_ids[0]))
    assert valid.response
    bad = await call(
        "scale",
        pb.ScaleRequest(
            streamInfo=info(),
            sealedSegments=[0],
            newKeyRanges=[pb.ScaleRequest.KeyRangeEntry(start=0.0, end=1.0)],
        ),
    )
    assert bad.status == pb.ScaleResponse.PRECONDITION_FAILED


async def test_stream_cut_rpcs(call: Client) -> None:
    await make_stream(call, 2)
    cut = pb.StreamCut(streamInfo=info(), cut={0: 0, 1: 0})
    assert (await call("isStreamCutValid", cut)).response
    between = await call("getSegmentsBetween", pb.StreamCutRange(streamInfo=info()))
    assert [s.segmentId for s in between.segments] == [0, 1]
    truncated = await call("truncateStream", cut)
    assert truncated.status == pb.UpdateStreamStatus.SUCCESS


async def test_unknown_rpcs_say_so(server: ControllerServer) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        call = channel.unary_unary(
            f"/{SERVICE_NAME}/noSuchRpc",
            request_serializer=bytes,
            response_deserializer=bytes,
        )
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call(b"", timeout=CALL_TIMEOUT_S)
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_delegation_token_is_empty_without_auth(call: Client) -> None:
    assert (await call("getDelegationToken", info())).delegationToken == ""


@pytest.mark.parametrize(("scope", "stream"), [("sc", "*"), ("sc", "a/b"), ("*", "st"), ("", "st")])
async def test_delegation_token_names_follow_the_naming_rules(
    call: Client, scope: str, stream: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call("getDelegationToken", pb.StreamInfo(scope=scope, stream=stream))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_server_list_names_this_controller(server: ControllerServer, call: Client) -> None:
    reply = await call("getControllerServerList", pb.ServerRequest())
    assert [(u.endpoint, u.port) for u in reply.nodeURI] == [("127.0.0.1", server.port)]


async def test_aclose_stops_serving() -> None:
    srv = await ControllerServer.start(
        MemoryStore(), host="127.0.0.1", port=0, segment_store=("127.0.0.1", 1)
    )
    await srv.aclose()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{srv.port}") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await Client(channel)("createScope", pb.ScopeInfo(scope="x"))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_port_in_use_raises_os_error(server: ControllerServer) -> None:
    with pytest.raises(OSError):
        await ControllerServer.start(
            MemoryStore(), host="127.0.0.1", port=server.port, segment_store=("127.0.0.1", 1)
        )


async def test_closed_store_answers_unavailable() -> None:
    store = MemoryStore()
    srv = await ControllerServer.start(
        store, host="127.0.0.1", port=0, segment_store=("127.0.0.1", 1)
    )
    try:
        await store.close()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{srv.port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await Client(channel)("createScope", pb.ScopeInfo(scope="x"))
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        await srv.aclose()


def test_every_error_has_a_reply() -> None:
    import inspect

    from headrace.controller import errors
    from headrace.controller.service import GRPC_CODES

    leaves = [
        cls
        for _, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, errors.ControllerError) and cls is not errors.ControllerError
    ]
    assert set(leaves) <= set(GRPC_CODES)


async def test_access_log_has_one_line_per_rpc(
    call: Client, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="headrace.access"):
        await call("createScope", pb.ScopeInfo(scope="sc"))
        await call("createScope", pb.ScopeInfo(scope="sc"))
        with pytest.raises(grpc.aio.AioRpcError):
            await call("getCurrentSegments", info("nope", "nope"))
    lines = [r.getMessage() for r in caplog.records if r.name == "headrace.access"]
    assert [line.split()[:2] for line in lines] == [
        ["createScope", "ok"],
        ["createScope", "SCOPE_EXISTS"],
        ["getCurrentSegments", "NOT_FOUND"],
    ]


async def test_concurrent_transactions_get_distinct_ids_and_all_commit(call: Client) -> None:
    await make_stream(call, 3)

    async def one() -> tuple[int, int]:
        created = await call(
            "createTransaction", pb.CreateTxnRequest(streamInfo=info(), lease=90_000)
        )
        req = pb.TxnRequest(streamInfo=info(), txnId=created.txnId)
        assert (await call("commitTransaction", req)).status == pb.TxnStatus.SUCCESS
        assert (await call("checkTransactionState", req)).state == pb.TxnState.COMMITTED
        return created.txnId.highBits, created.txnId.lowBits

    ids = await asyncio.gather(*(one() for _ in range(50)))
    assert len(set(ids)) == 50
    assert all(low >= 0 for _, low in ids)
