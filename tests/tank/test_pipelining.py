"""Pipelined produces through one TANK connection: wire order and replies are kept.

A produce is handled ``inline`` (its first step runs in the read loop, a task
only if it suspends). Hundreds of requests written in one go, produces to
several partitions of two topics, one with an explicit first seq num, ones
refused (unknown topic, unknown partition) and a Status in between, must get
their responses in request order, with the results the broker would give
one at a time, and every partition must hold its bundles numbered in that
order, under both fsync policies (under ``never`` most produces finish in
their first step, under ``always`` every one suspends for its sync round).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from headrace.client.tank import TankClient
from headrace.protocols import tank as t
from tests.tank.conftest import running_server

WAIT_S = 20.0
"""Bound on every wait."""

REQUESTS = 300
JUMP_AT = 150
"""The request that produces to b/0 with an explicit first seq num."""
JUMP_TO = 10_000


def _messages(topic: str, partition: int, index: int) -> list[t.BundleMessage]:
    count = 1 + index % 3
    return [
        t.BundleMessage(b"%s/%d/%d/%d" % (topic.encode(), partition, index, i), 1_000 + index)
        for i in range(count)
    ]


def _produce(
    request_id: int, topic: str, partition: int, index: int, first: int = 0
) -> t.Produce | t.ProduceWithSeqnum:
    bundle = t.encode_bundle(_messages(topic, partition, index))
    topics = (t.ProduceTopic(topic, (t.ProducePartition(partition, bundle, first),)),)
    if first:
        return t.ProduceWithSeqnum(request_id, topics)
    return t.Produce(request_id, topics)


@pytest.mark.parametrize("fsync", ["never", "always"])
async def test_pipelined_produces_keep_wire_order_and_replies(tmp_path: Path, fsync: str) -> None:
    with running_server(tmp_path / "data", extra_args=("--fsync", fsync)) as server:
        async with await TankClient.connect("127.0.0.1", server.port) as client:
            assert await client.create_topic("pipe_a", 2) is t.CreateTopicResult.CREATED
            assert await client.create_topic("pipe_b", 1) is t.CreateTopicResult.CREATED

        targets = [("pipe_a", 0), ("pipe_a", 1), ("pipe_b", 0)]
        requests: list[object] = []
        expected: list[object] = []  # per request: a produce error, or "status"
        stored: dict[tuple[str, int], list[tuple[int, bytes]]] = {k: [] for k in targets}
        next_seq = dict.fromkeys(targets, 1)
        for index in range(REQUESTS):
            request_id = 100 + index
            if index % 97 == 50:
                requests.append(t.Status(request_id))
                expected.append("status")
                continue
            if index % 89 == 40:
                requests.append(_produce(request_id, "pipe_nope", 0, index))
                expected.append(t.ProduceError.UNKNOWN_TOPIC)
                continue
            if index % 83 == 30:
                requests.append(_produce(request_id, "pipe_b", 5, index))
                expected.append(t.ProduceError.UNKNOWN_PARTITION)
                continue
            topic, partition = targets[index % len(targets)]
            first = JUMP_TO if (topic, partition) == ("pipe_b", 0) and index >= JUMP_AT else 0
            if first and next_seq[(topic, partition)] > JUMP_TO:
                first = 0  # only the first produce past JUMP_AT jumps
            requests.append(_produce(request_id, topic, partition, index, first))
            expected.append(t.ProduceError.OK)
            seq = first or next_seq[(topic, partition)]
            for message in _messages(topic, partition, index):
                stored[(topic, partition)].append((seq, message.content))
                seq += 1
            next_seq[(topic, partition)] = seq
        assert next_seq[("pipe_b", 0)] > JUMP_TO  # the jump happened

        conn = t.TankConnection(t.Role.CLIENT)
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            for request in requests:
                conn.send(request)  # type: ignore[arg-type]
            writer.write(conn.data_to_send())  # every request before any response
            await writer.drain()
            responses: list[object] = []
            while len(responses) < len(requests):
                data = await asyncio.wait_for(reader.read(1 << 16), WAIT_S)
                assert data, "the broker closed the connection"
                conn.receive_data(data)
                responses += [e for e in conn.events() if not isinstance(e, t.Ping)]
        finally:
            writer.close()
            await writer.wait_closed()

        assert [r.request_id for r in responses] == [  # type: ignore[attr-defined]
            q.request_id  # type: ignore[attr-defined]
            for q in requests
        ]
        for response, want in zip(responses, expected, strict=True):
            if want == "status":
                assert isinstance(response, t.StatusResponse)
                continue
            assert isinstance(response, t.ProduceResponse)
            (topic_result,) = response.topics
            if want is t.ProduceError.UNKNOWN_TOPIC:
                assert topic_result.error is want
            else:
                assert [p.error for p in topic_result.partitions] == [want]

        async with await TankClient.connect("127.0.0.1", server.port) as client:
            for (topic, partition), want_stored in stored.items():
                got: list[tuple[int, bytes]] = []
                seq_num = 0
                while len(got) < len(want_stored):
                    result = await client.consume(topic, partition, seq_num)
                    assert result.messages, f"{topic}/{partition}: nothing at {seq_num}"
                    got += [(m.seq_num, m.content) for m in result.messages]
                    seq_num = result.next_seq_num
                assert got == want_stored
