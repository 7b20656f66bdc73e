"""Reader groups and subscribers in the controller: records, RPCs, subscriber retention.

The model's retention runs on a fake clock over a memory store; the RPCs run
over raw gRPC and through ``headrace.client`` against one real ``headrace
serve``, which the real ``pravega`` client then reads a group of.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import grpc
import pytest

from headrace.client import GroupRetention, PravegaClient, ReaderGroupConfig
from headrace.controller.errors import ReaderGroupNotFound
from headrace.controller.groups import ReaderGroupRecord
from headrace.controller.model import ControllerModel
from headrace.controller.records import (
    RetentionPolicy,
    RetentionType,
    ScalingPolicy,
    StreamConfig,
)
from headrace.controller.rpc import METHODS
from headrace.errors import ControllerError
from headrace.protocols.pravega import controller_pb2 as pb
from headrace.store.memory import MemoryStore
from tests._real_pravega import run_scenario
from tests._server import PravegaServer

CALL_TIMEOUT_S = 10.0
SEG = "sc/st/0.#epoch.0"


class Clock:
    def __init__(self) -> None:
        self.now_ms = 1_700_000_000_000

    def __call__(self) -> int:
        return self.now_ms


# --------------------------------------------------------------------------- the model


@pytest.fixture
async def model() -> AsyncIterator[tuple[ControllerModel, MemoryStore, Clock]]:
    store, clock = MemoryStore(), Clock()
    yield await ControllerModel.open(store, clock_ms=clock), store, clock
    await store.close()


def group(retention: GroupRetention, **cuts: dict[int, int]) -> ReaderGroupRecord:
    return ReaderGroupRecord(
        scope="sc",
        group="g",
        group_id="",
        generation=0,
        refresh_ms=3000,
        checkpoint_ms=30000,
        max_outstanding_checkpoints=3,
        retention=retention,
        start_cuts={f"sc/{name}": cut for name, cut in cuts.items()} or {"sc/st": {}},
    )


async def retained(model: ControllerModel, param: int, maximum: int = 0) -> None:
    await model.create_scope("sc")
    policy = RetentionPolicy(RetentionType.SIZE, param, maximum)
    await model.create_stream("sc", "st", StreamConfig(ScalingPolicy.fixed(1), policy))


async def grow(model: ControllerModel, store: MemoryStore, clock: Clock, events: int) -> int:
    """Append ``events`` 8-byte events, one retention round after each; truncations."""
    truncated = 0
    for _ in range(events):
        await store.append(SEG, b"event-x|")
        clock.now_ms += 1000
        truncated += await model.enforce_retention()
    return truncated


async def test_retention_never_truncates_past_a_subscriber(
    model: tuple[ControllerModel, MemoryStore, Clock],
) -> None:
    m, store, clock = model
    await retained(m, 8)
    rec = await m.create_reader_group(group(GroupRetention.MANUAL))
    assert m.subscriber_cut("sc", "st", "sc/g") == {0: 0}  # from the head it starts at
    assert await grow(m, store, clock, 5) == 0  # 40 bytes, 8 to keep: the group holds them
    assert (await store.info(SEG)).start_offset == 0
    await m.update_subscriber_cut("sc", "st", "sc/g", rec.group_id, 0, {0: 16})
    assert await grow(m, store, clock, 1) == 1
    assert (await store.info(SEG)).start_offset == 16  # exactly where the group is
    assert await grow(m, store, clock, 3) == 0
    assert (await store.info(SEG)).start_offset == 16
    # Once it no longer subscribes, the policy alone decides.
    await m.update_reader_group(
        ReaderGroupRecord(**{**_fields(rec), "retention": GroupRetention.NONE})
    )
    assert m.list_subscribers("sc", "st") == []
    assert await grow(m, store, clock, 1) == 1
    assert (await store.info(SEG)).start_offset > 16


def _fields(rec: ReaderGroupRecord) -> dict[str, object]:
    return {name: getattr(rec, name) for name in ReaderGroupRecord.__dataclass_fields__}


async def test_retention_max_truncates_past_a_lagging_subscriber(
    model: tuple[ControllerModel, MemoryStore, Clock],
) -> None:
    m, store, clock = model
    await retained(m, 8, 24)
    await m.create_reader_group(group(GroupRetention.AUTOMATIC))
    assert await grow(m, store, clock, 3) == 0  # 24 bytes: within the maximum
    assert await grow(m, store, clock, 2) >= 1  # beyond it: the lagging group loses data
    info = await store.info(SEG)
    assert 8 <= info.length - info.start_offset <= 24


async def test_subscriber_updates_are_checked(
    model: tuple[ControllerModel, MemoryStore, Clock],
) -> None:
    m, store, _ = model
    await retained(m, 8)
    rec = await m.create_reader_group(group(GroupRetention.MANUAL))
    await store.append(SEG, b"x" * 32)
    update = m.update_subscriber_cut
    with pytest.raises(ControllerError, match="generation"):
        await update("sc", "st", "sc/g", rec.group_id, 7, {0: 8})
    with pytest.raises(ControllerError, match="no subscriber"):
        await update("sc", "st", "sc/g", "another-id", 0, {0: 8})
    with pytest.raises(ControllerError, match="beyond"):
        await update("sc", "st", "sc/g", rec.group_id, 0, {0: 33})
    await update("sc", "st", "sc/g", rec.group_id, 0, {0: 16})
    with pytest.raises(ControllerError, match="behind"):
        await update("sc", "st", "sc/g", rec.group_id, 0, {0: 8})


async def test_groups_and_subscribers_survive_a_restart_and_orphans_are_removed(
    model: tuple[ControllerModel, MemoryStore, Clock],
) -> None:
    m, store, clock = model
    await retained(m, 8)
    rec = await m.create_reader_group(group(GroupRetention.MANUAL))
    # A creation interrupted after its state stream: no record points at it.
    await m._create_stream("sc", "_RGhalf", m.stream_config("sc", "_RGg"))
    again = await ControllerModel.open(store, clock_ms=clock)
    assert again.reader_group("sc", "g") == rec
    assert again.list_subscribers("sc", "st") == ["sc/g"]
    assert not again.stream_exists("sc", "_RGhalf")
    await again.delete_reader_group("sc", "g", rec.group_id)
    assert not again.stream_exists("sc", "_RGg")
    with pytest.raises(ReaderGroupNotFound):
        again.reader_group("sc", "g")


# --------------------------------------------------------------------------- over gRPC


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PravegaServer]:
    srv = PravegaServer(tmp_path_factory.mktemp("rg") / "data", fsync="never")
    yield srv
    srv.stop()


class Rpc:
    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._channel = channel

    async def __call__(self, name: str, request: object) -> object:
        method = METHODS[name]
        call = self._channel.unary_unary(
            method.path,
            request_serializer=method.request.SerializeToString,
            response_deserializer=method.response.FromString,
        )
        return await call(request, timeout=CALL_TIMEOUT_S)


@pytest.fixture
async def rpc(server: PravegaServer) -> AsyncIterator[Rpc]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.controller_port}") as channel:
        yield Rpc(channel)


def _info(scope: str, stream: str) -> pb.StreamInfo:
    return pb.StreamInfo(scope=scope, stream=stream)


async def test_reader_group_rpcs_over_raw_grpc(rpc: Rpc) -> None:
    await rpc("createScope", pb.ScopeInfo(scope="raw"))
    for stream in ("a", "b"):
        cfg = pb.StreamConfig(
            streamInfo=_info("raw", stream), scalingPolicy=pb.ScalingPolicy(minNumSegments=2)
        )
        assert (await rpc("createStream", cfg)).status == pb.CreateStreamStatus.SUCCESS
    config = pb.ReaderGroupConfiguration(
        scope="raw",
        readerGroupName="rg",
        retentionType=pb.ReaderGroupConfiguration.MANUAL,
        startingStreamCuts=[
            pb.StreamCut(streamInfo=_info("raw", "a"), cut={0: 0, 1: 0}),
            pb.StreamCut(streamInfo=_info("raw", "b")),
        ],
    )
    created = await rpc("createReaderGroup", config)
    assert created.status == pb.CreateReaderGroupResponse.SUCCESS
    rg_id = created.config.readerGroupId
    assert rg_id and created.config.generation == 0
    # Idempotent: the same group again.
    again = await rpc("createReaderGroup", config)
    assert again.config.readerGroupId == rg_id
    # Its state stream, one segment, as Pravega's clients expect.
    state = await rpc("getCurrentSegments", _info("raw", "_RGrg"))
    assert len(state.segmentRanges) == 1
    got = await rpc("getReaderGroupConfig", pb.ReaderGroupInfo(scope="raw", readerGroup="rg"))
    assert got.status == pb.ReaderGroupConfigResponse.SUCCESS
    assert [c.streamInfo.stream for c in got.config.startingStreamCuts] == ["a", "b"]
    assert (await rpc("listSubscribers", _info("raw", "a"))).subscribers == ["raw/rg"]

    def sub(cut: dict[int, int], generation: int = 0, rid: str = rg_id) -> pb.SubscriberStreamCut:
        return pb.SubscriberStreamCut(
            subscriber="raw/rg",
            generation=generation,
            readerGroupId=rid,
            streamCut=pb.StreamCut(streamInfo=_info("raw", "a"), cut=cut),
        )

    status = pb.UpdateSubscriberStatus
    assert (await rpc("updateSubscriberStreamCut", sub({0: 0, 1: 0}))).status == status.SUCCESS
    assert (await rpc("updateSubscriberStreamCut", sub({0: 0}))).status == (
        status.STREAM_CUT_NOT_VALID
    )
    assert (await rpc("updateSubscriberStreamCut", sub({0: 0, 1: 0}, 3))).status == (
        status.GENERATION_MISMATCH
    )
    unknown = sub({0: 0, 1: 0}, rid="00000000-0000-0000-0000-000000000000")
    assert (await rpc("updateSubscriberStreamCut", unknown)).status == status.SUBSCRIBER_NOT_FOUND

    update = pb.ReaderGroupConfiguration()
    update.CopyFrom(got.config)
    update.generation = 5
    stale = await rpc("updateReaderGroup", update)
    assert stale.status == pb.UpdateReaderGroupResponse.INVALID_CONFIG
    update.generation = 0
    del update.startingStreamCuts[1]  # stop reading b
    done = await rpc("updateReaderGroup", update)
    assert done.status == pb.UpdateReaderGroupResponse.SUCCESS and done.generation == 1
    assert (await rpc("listSubscribers", _info("raw", "b"))).subscribers == []

    wrong = pb.ReaderGroupInfo(scope="raw", readerGroup="rg", readerGroupId="x")
    assert (await rpc("deleteReaderGroup", wrong)).status == pb.DeleteReaderGroupStatus.RG_NOT_FOUND
    info = pb.ReaderGroupInfo(scope="raw", readerGroup="rg", readerGroupId=rg_id)
    assert (await rpc("deleteReaderGroup", info)).status == pb.DeleteReaderGroupStatus.SUCCESS
    assert not (await rpc("checkStreamExists", _info("raw", "_RGrg"))).exists
    assert (await rpc("listSubscribers", _info("raw", "a"))).subscribers == []
    gone = await rpc("getReaderGroupConfig", pb.ReaderGroupInfo(scope="raw", readerGroup="rg"))
    assert gone.status == pb.ReaderGroupConfigResponse.RG_NOT_FOUND


async def test_reader_group_rpcs_refuse_bad_requests(rpc: Rpc) -> None:
    await rpc("createScope", pb.ScopeInfo(scope="bad"))
    # Users cannot create the internal streams themselves.
    internal = pb.StreamConfig(streamInfo=_info("bad", "_RGmine"))
    assert (await rpc("createStream", internal)).status == pb.CreateStreamStatus.INVALID_STREAM_NAME
    start = [pb.StreamCut(streamInfo=_info("bad", "st"))]
    for name, scope, status in [
        ("_x", "bad", pb.CreateReaderGroupResponse.INVALID_RG_NAME),
        ("ok", "nope", pb.CreateReaderGroupResponse.SCOPE_NOT_FOUND),
    ]:
        req = pb.ReaderGroupConfiguration(
            scope=scope, readerGroupName=name, startingStreamCuts=start
        )
        assert (await rpc("createReaderGroup", req)).status == status
    missing_stream = pb.ReaderGroupConfiguration(
        scope="bad", readerGroupName="ok", startingStreamCuts=start
    )
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await rpc("createReaderGroup", missing_stream)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    # retentionMax below retentionParam is not a policy.
    policy = pb.RetentionPolicy(
        retentionType=pb.RetentionPolicy.SIZE, retentionParam=100, retentionMax=10
    )
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await rpc(
            "createStream", pb.StreamConfig(streamInfo=_info("bad", "st"), retentionPolicy=policy)
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


# --------------------------------------------------------------------------- headrace.client


async def test_client_reader_group_over_two_streams_checkpoints_and_iterates(
    server: PravegaServer,
) -> None:
    async with PravegaClient(server.uri) as client:
        ctl = client.controller
        await ctl.create_scope("cl")
        for stream in ("x", "y"):
            await ctl.create_stream("cl", stream, StreamConfig(ScalingPolicy.fixed(2)))
            async with await client.create_writer("cl", stream) as writer:
                for i in range(10):
                    await writer.write(f"{stream}{i}".encode(), routing_key=str(i))
        rg = await client.reader_group(
            "cl", "g", ["x", "cl/y"], retention=GroupRetention.AUTOMATIC, checkpoint_interval_s=0
        )
        stored = await ctl.get_reader_group_config("cl", "g")
        assert stored is not None and stored.group_id == rg.group_id
        assert sorted(stored.start) == ["cl/x", "cl/y"]
        assert await ctl.list_subscribers("cl", "x") == ["cl/g"]
        for stream in ("x", "y"):
            await ctl.seal_stream("cl", stream)
        got = []
        async with await rg.create_reader("r1") as reader:
            async for event in reader:  # ends once both sealed streams are read
                got.append(event.data.decode())
        assert sorted(got) == sorted(f"{s}{i}" for s in "xy" for i in range(10))
        # The readers reported the group's cuts as they went: the head is behind them now.
        with pytest.raises(ControllerError) as err:
            await ctl.update_subscriber_stream_cut("cl", "x", "cl/g", rg.group_id, 0, {0: 0, 1: 0})
        assert err.value.status == "STREAM_CUT_NOT_VALID"
        cuts = await rg.checkpoint()
        assert set(cuts) == {"cl/x", "cl/y"} and all(sum(c.values()) > 0 for c in cuts.values())
        # The controller holds the group's position; a new group can start there.
        again = await client.reader_group("cl", "g2", ["x"], start={"cl/x": cuts["cl/x"]})
        async with await again.create_reader("r1") as reader:
            assert [e async for e in reader] == []
        assert await rg.delete() and await again.delete()
        assert await ctl.get_reader_group_config("cl", "g") is None
        assert not await ctl.stream_exists("cl", "_RGg")


async def test_client_controller_calls_report_refusals(server: PravegaServer) -> None:
    async with PravegaClient(server.uri) as client:
        ctl = client.controller
        await ctl.create_scope("cc")
        await ctl.create_stream("cc", "st", StreamConfig(ScalingPolicy.fixed(1)))
        cfg = await ctl.create_reader_group(
            ReaderGroupConfig("cc", "g", start={"cc/st": {}}, retention=GroupRetention.MANUAL)
        )
        with pytest.raises(ControllerError) as err:
            await ctl.update_subscriber_stream_cut("cc", "st", "cc/g", cfg.group_id, 9, {0: 0})
        assert err.value.status == "GENERATION_MISMATCH"
        with pytest.raises(ControllerError) as err:
            await ctl.update_reader_group(ReaderGroupConfig("cc", "g", start={"cc/st": {}}))
        assert err.value.status == "INVALID_CONFIG"  # no id: not this group
        assert (
            await ctl.update_reader_group(
                ReaderGroupConfig("cc", "g", start={"cc/st": {}}, group_id=cfg.group_id)
            )
            == 1
        )
        assert await ctl.list_subscribers("cc", "st") == []  # retention NONE now
        assert not await ctl.delete_reader_group("cc", "g", "another")
        assert await ctl.delete_reader_group("cc", "g", cfg.group_id)


# --------------------------------------------------------------------------- the real client


async def test_a_group_created_through_the_rpcs_is_read_by_the_real_client(
    server: PravegaServer,
) -> None:
    async with PravegaClient(server.uri) as client:
        ctl = client.controller
        await ctl.create_scope("real")
        await ctl.create_stream("real", "st", StreamConfig(ScalingPolicy.fixed(2)))
        async with await client.create_writer("real", "st") as writer:
            for i in range(20):
                await writer.write(f"e{i}".encode(), routing_key=f"k{i % 4}")
        cfg = await ctl.create_reader_group(
            ReaderGroupConfig("real", "rg", start={"real/st": {}}, retention=GroupRetention.MANUAL)
        )
    result = run_scenario("read_group", server.uri, "real", "st", "rg", "20")
    assert sorted(result["events"]) == sorted(f"e{i}" for i in range(20))
    async with PravegaClient(server.uri) as client:
        # The controller's record is untouched by the client's own group state.
        stored = await client.controller.get_reader_group_config("real", "rg")
        assert stored is not None and stored.group_id == cfg.group_id
        assert await client.controller.list_subscribers("real", "st") == ["real/rg"]
