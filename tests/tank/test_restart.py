"""Everything acknowledged is there after a restart (clean or killed), numbered as
before, and new messages continue the numbering."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from headrace.client.tank import TankClient
from headrace.protocols.tank import BundleMessage, CreateTopicResult, ProduceError, encode_bundle
from tests.tank.conftest import running_server

BIG_CONTENT_BYTES = 1024 * 1024
BIG_BUNDLES = 20
"""20 bundles of 2 MiB: more than one checkpoint interval (16 MiB) of data."""


def msg(seq: int, size: int = 10) -> BundleMessage:
    return BundleMessage((b"%d:" % seq).ljust(size, b"."), 1_700_000_000_000 + seq, b"k%d" % seq)


async def produce_everything(client: TankClient) -> list[int]:
    """Ordinary, big (incompressible), explicit and sparse bundles; returns the seq nums."""
    assert await client.create_topic("durable_topic", 2) is CreateTopicResult.CREATED
    seqs: list[int] = []
    await client.produce("durable_topic", 0, [msg(s) for s in range(1, 101)], compress=True)
    seqs += range(1, 101)
    for i in range(BIG_BUNDLES):
        first = 101 + 2 * i
        batch = [
            BundleMessage(os.urandom(BIG_CONTENT_BYTES), 1, b"", 0),
            BundleMessage(os.urandom(BIG_CONTENT_BYTES), 2, b"", 0),
        ]
        assert await client.produce_bundle(
            "durable_topic", 0, encode_bundle(batch, compress=False)
        ) is (ProduceError.OK)
        seqs += [first, first + 1]
    last = seqs[-1]
    bundle = encode_bundle([msg(s) for s in range(5000, 5003)])
    assert await client.produce_bundle("durable_topic", 0, bundle, first_seq_num=5000) is (
        ProduceError.OK
    )
    seqs += range(5000, 5003)
    sparse = encode_bundle(
        [BundleMessage(b"x", 1, b"", 6000), BundleMessage(b"y", 1, b"", 6002)], sparse=True
    )
    assert await client.produce_bundle("durable_topic", 0, sparse) is ProduceError.OK
    seqs += [6000, 6002]
    await client.produce("durable_topic", 1, [msg(s) for s in range(1, 4)])
    assert last == 140
    return seqs


async def read_seqs(client: TankClient, partition: int, hwm: int) -> list[int]:
    seqs: list[int] = []
    seq_num = 0
    while seq_num <= hwm:
        result = await client.consume("durable_topic", partition, seq_num, fetch_size=64 * 1024)
        assert result.messages, f"nothing at {seq_num}"
        seqs += [m.seq_num for m in result.messages]
        seq_num = result.next_seq_num
    return seqs


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
async def test_restart_keeps_messages_and_numbering(tmp_path: Path, how: str) -> None:
    data_dir = tmp_path / "data"
    with running_server(data_dir) as server:
        async with await TankClient.connect("127.0.0.1", server.port) as client:
            produced = await produce_everything(client)
        if how == "sigterm":
            server.stop()
        else:
            assert server.process is not None
            server.process.send_signal(signal.SIGKILL)
            server.process.wait(timeout=30)
    with running_server(data_dir) as server:
        async with await TankClient.connect("127.0.0.1", server.port) as client:
            partitions = await client.discover_partitions("durable_topic")
            assert partitions is not None
            assert [(p.first_available_seq_num, p.high_water_mark) for p in partitions] == [
                (1, 6002),
                (1, 3),
            ]
            assert await read_seqs(client, 0, 6002) == produced
            assert await read_seqs(client, 1, 3) == [1, 2, 3]
            first = await client.consume("durable_topic", 0, 1)
            assert first.messages[0] == BundleMessage(msg(1).content, msg(1).timestamp_ms, b"k1", 1)
            # numbering continues after the last stored seq num
            await client.produce("durable_topic", 0, [msg(1), msg(2)])
            await client.produce("durable_topic", 1, [msg(4)])
            tail = await client.consume("durable_topic", 0, 6003)
            assert [m.seq_num for m in tail.messages] == [6003, 6004]
            assert [m.seq_num for m in (await client.consume("durable_topic", 1, 4)).messages] == [
                4
            ]
            topics = {info.name: info.partitions_count for info in await client.discover_topics()}
            assert topics["durable_topic"] == 2
