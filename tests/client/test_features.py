"""Transactions, byte streams, key-value tables (partitioned too), TANK records, admin calls."""

from __future__ import annotations

import pytest

from headrace.client import (
    KeyValueTableConfig,
    PravegaClient,
    RetentionPolicy,
    ScalingPolicy,
    StreamConfig,
    TxnState,
    WriterClosedError,
)
from headrace.client.controller import RetentionType
from headrace.client.errors import (
    ConditionalCheckFailedError,
    ControllerError,
    TableKeyVersionError,
)
from headrace.client.kvtable import NOT_EXISTS
from headrace.client.writer import MAX_INLINE_EVENT_BYTES
from headrace.protocols.pravega.routing import table_key_position
from headrace.protocols.tank.bundle import encode_bundle
from headrace.protocols.tank.commands import BundleMessage

from .conftest import Server


async def _values(client: PravegaClient, scope: str, stream: str) -> list[bytes]:
    async with client.record_reader(scope, stream) as reader:
        return [r.value async for r in reader]


async def test_admin_scopes_and_streams(server: Server) -> None:
    async with PravegaClient(server.uri) as client:
        c = client.controller
        assert await c.create_scope("adm")
        assert not await c.create_scope("adm")
        config = StreamConfig(
            ScalingPolicy.fixed(2), RetentionPolicy(RetentionType.SIZE, 1 << 20), ("t1", "t2")
        )
        assert await c.create_stream("adm", "a", config)
        assert not await c.create_stream("adm", "a", config)
        got = await c.get_stream_config("adm", "a")
        assert got.scaling.min_num_segments == 2
        assert got.retention.retention_type is RetentionType.SIZE
        assert got.tags == ("t1", "t2")
        await c.update_stream("adm", "a", StreamConfig(ScalingPolicy.fixed(2), tags=("t3",)))
        assert (await c.get_stream_config("adm", "a")).tags == ("t3",)
        assert await c.stream_exists("adm", "a")
        assert [s async for s in c.list_streams("adm")] == ["a"]
        assert "adm" in [s async for s in c.list_scopes()]
        with pytest.raises(ControllerError) as refused:
            await c.delete_scope("adm")  # not empty
        assert refused.value.status == "SCOPE_NOT_EMPTY"
        await c.seal_stream("adm", "a")
        assert await c.get_current_segments("adm", "a") == []
        assert await c.delete_stream("adm", "a")
        assert not await c.delete_stream("adm", "a")
        assert await c.delete_scope("adm")
        assert not await c.scope_exists("adm")


async def test_transaction_commit_and_abort(server: Server) -> None:
    async with PravegaClient(server.uri) as client:
        await client.controller.create_scope("tx")
        await client.controller.create_stream("tx", "st", StreamConfig(ScalingPolicy.fixed(2)))
        committed = await client.begin_transaction("tx", "st")
        aborted = await client.begin_transaction("tx", "st")
        assert committed.txn_id != aborted.txn_id
        for i in range(100):
            await committed.write(f"c{i}".encode(), routing_key=f"k{i % 4}")
            await aborted.write(f"a{i}".encode(), routing_key=f"k{i % 4}")
        assert await _values(client, "tx", "st") == []  # nothing visible before commit
        assert await committed.state() is TxnState.OPEN
        await committed.commit()
        await aborted.abort()
        with pytest.raises(WriterClosedError):
            await committed.write(b"late")
        values = await _values(client, "tx", "st")
    assert sorted(values) == sorted(f"c{i}".encode() for i in range(100))


async def test_a_detached_transaction_is_committed_by_another_client(server: Server) -> None:
    async with PravegaClient(server.uri) as client:
        await client.controller.create_scope("txd")
        await client.controller.create_stream("txd", "st", StreamConfig(ScalingPolicy.fixed(2)))
        txn = await client.begin_transaction("txd", "st", lease_ms=10_000)
        for i in range(100):
            await txn.write(f"d{i}".encode(), routing_key=f"k{i % 4}")
        txn_id = await txn.detach()
        with pytest.raises(WriterClosedError):
            await txn.write(b"late")
    # The first client is gone; the transaction is still open, with every event stored.
    async with PravegaClient(server.uri) as other:
        assert await other.controller.transaction_state("txd", "st", txn_id) is TxnState.OPEN
        assert await _values(other, "txd", "st") == []
        await other.controller.commit_transaction("txd", "st", txn_id)
        values = await _values(other, "txd", "st")
    assert sorted(values) == sorted(f"d{i}".encode() for i in range(100))


async def test_byte_stream_write_read_seek_truncate(server: Server) -> None:
    async with PravegaClient(server.uri) as client:
        await client.controller.create_scope("bs")
        await client.controller.create_stream("bs", "st")
        bs = await client.byte_stream("bs", "st")
        await bs.write(b"hello ")
        await bs.write(b"world")
        assert await bs.read() == b"hello world"
        bs.seek(6)
        assert await bs.read(3) == b"wor"
        assert bs.tell() == 9
        other = await client.byte_stream("bs", "st")  # starts at the current tail
        await other.write(b"!")
        with pytest.raises(ConditionalCheckFailedError):
            await bs.write(b"?")  # its idea of the tail is stale
        assert await bs.tail_offset() == 12
        await bs.truncate(6)
        assert await bs.head_offset() == 6
        bs.seek(6)
        assert await bs.read() == b"world!"
        await bs.aclose()
        await other.aclose()


async def test_key_value_table(server: Server) -> None:
    async with PravegaClient(server.uri) as client:
        await client.controller.create_scope("kv")
        table = await client.kv_table("kv", "t")
        v1 = await table.put(b"a", b"1")
        assert await table.get(b"a") == (b"1", v1)
        assert await table.get(b"missing") is None
        with pytest.raises(TableKeyVersionError):
            await table.put(b"a", b"x", version=NOT_EXISTS)
        v2 = await table.put(b"a", b"2", version=v1)
        assert v2 > v1
        with pytest.raises(TableKeyVersionError):
            await table.put(b"a", b"3", version=v1)
        await table.put_all([(b"b", b"B", NOT_EXISTS), (b"c", b"C", NOT_EXISTS)])
        assert sorted((k, v) for k, v, _ in await table.items()) == [
            (b"a", b"2"),
            (b"b", b"B"),
            (b"c", b"C"),
        ]
        await table.remove(b"b")
        assert await table.get(b"b") is None
        assert await table.delete()


async def test_partitioned_table_through_the_client(server: Server) -> None:
    config = KeyValueTableConfig(partition_count=3, primary_key_length=4, secondary_key_length=2)
    async with PravegaClient(server.uri) as client:
        ctl = client.controller
        await ctl.create_scope("kvt1")
        assert await ctl.create_key_value_table("kvt1", "orders", config)
        assert not await ctl.create_key_value_table("kvt1", "orders", config)
        assert await ctl.get_key_value_table_config("kvt1", "orders") == config
        assert [t async for t in ctl.list_key_value_tables("kvt1")] == ["orders"]
        ranges = await ctl.get_key_value_table_segments("kvt1", "orders")
        assert [(r.segment.segment_id, r.min_key, r.max_key) for r in ranges] == [
            (0, 0.0, 1 / 3),
            (1, 1 / 3, 2 / 3),
            (2, 2 / 3, 1.0),
        ]

        table = await client.kv_table("kvt1", "orders")
        assert table.config == config
        keys = [f"k{i:03d}".encode() + b"s0" for i in range(30)]
        for key in keys:
            await table.put(key, b"v" + key)
        # Each key sits in the partition its primary key hashes to, and only there.
        for key in keys:
            position = table_key_position(key[:4])
            expected = next(r for r in ranges if position <= r.max_key)  # Java's ceiling rule
            for seg in table.partitions:
                (found,) = await client.segments.table_get(seg, seg.name, [key])
                assert (found is not None) == (seg.segment_id == expected.segment.segment_id)
        assert {k for k, _, _ in await table.items()} == set(keys)
        assert len({table.partition_of(k) for k in keys}) == 3  # every partition used

        # One primary key: updated together, atomically.
        versions = await table.put_all([(b"k000s1", b"a", -1), (b"k000s2", b"b", -1)])
        assert len(versions) == 2
        with pytest.raises(ValueError, match="share a partition"):
            multi = [k for k in keys if table.partition_of(k) != table.partition_of(keys[0])]
            await table.put_all([(keys[0], b"x", -1), (multi[0], b"y", -1)])
        with pytest.raises(ValueError, match="6 bytes"):
            await table.put(b"short", b"x")

        assert await table.delete()
        assert await ctl.get_key_value_table_config("kvt1", "orders") is None
        assert not await ctl.delete_key_value_table("kvt1", "orders")
        assert [t async for t in ctl.list_key_value_tables("kvt1")] == []


async def test_tank_bundles_become_records_with_keys_and_timestamps(server: Server) -> None:
    async with PravegaClient(server.uri) as client:
        await client.controller.create_scope("tank")
        await client.controller.create_stream("tank", "topic", StreamConfig(ScalingPolicy.fixed(1)))
        bundle = encode_bundle(
            [
                BundleMessage(b"v1", 1_700_000_000_000, b"k1"),
                BundleMessage(b"v2", 1_700_000_000_005, b""),
            ]
        )
        async with await client.create_writer("tank", "topic") as writer:
            await writer.write(bundle)
            await writer.write(encode_bundle([BundleMessage(b"v3", 1_700_000_000_009, b"k3")]))
        async with client.record_reader("tank", "topic") as reader:
            records = [r async for r in reader]
    assert [(r.key, r.value, r.timestamp_ms, r.index) for r in records] == [
        (b"k1", b"v1", 1_700_000_000_000, 0),
        (None, b"v2", 1_700_000_000_005, 1),
        (b"k3", b"v3", 1_700_000_000_009, 0),
    ]
    assert records[0].offset == records[1].offset == 0
    assert records[2].offset == 8 + len(bundle)
    assert records[0].stream == "tank/topic"


async def test_large_events_go_through_transient_segments_in_order(server: Server) -> None:
    big = bytes(range(256)) * (20 * 1024 * 1024 // 256 + 3)  # ~20 MiB: three chunks
    async with PravegaClient(server.uri) as client:
        await client.controller.create_scope("big")
        await client.controller.create_stream("big", "st")
        async with await client.create_writer("big", "st") as writer:
            await writer.write(b"before", routing_key="k")
            fut = await writer.write_future(big, routing_key="k")
            await writer.write(b"after", routing_key="k")
            await writer.write_and_wait(b"y" * MAX_INLINE_EVENT_BYTES, routing_key="k")
            await fut
        values = await _values(client, "big", "st")
    assert [len(v) for v in values] == [6, len(big), 5, MAX_INLINE_EVENT_BYTES]
    assert values[1] == big
