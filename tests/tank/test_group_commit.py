"""Pipelined produces of one TANK connection share their syncs under ``--fsync always``.

Hundreds of one-message produces written in one go are all issued while the
first waits for its sync, so a handful of WAL syncs (``headrace_fsync_seconds``'s
count on ``/metrics``) covers them all, where waiting for each produce's sync
before storing the next would cost one sync each. The replies still come in
request order, each once its bundle is durable.
"""

from __future__ import annotations

import asyncio
import re
import urllib.request
from pathlib import Path

from headrace.client.tank import TankClient
from headrace.protocols import tank as t
from tests._server import FREE, ServerProcess

WAIT_S = 20.0
"""Bound on every wait."""

REQUESTS = 300
MAX_SYNCS = REQUESTS // 6
"""Syncs allowed for all of them: a few rounds (the requests may arrive in several
reads), far from one each."""


def _syncs(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=WAIT_S) as response:
        text = response.read().decode()
    found = re.search(r"^headrace_fsync_seconds_count(?:\{[^}]*\})? (\S+)$", text, re.M)
    assert found is not None, "no sync count on /metrics"
    return float(found[1])


async def test_pipelined_produces_share_syncs_and_keep_reply_order(tmp_path: Path) -> None:
    ports: dict[str, int | None] = {"tank": FREE, "http": FREE}
    with ServerProcess(tmp_path / "data", ports=ports, fsync="always") as server:
        port = server.port_of("tank")
        async with await TankClient.connect("127.0.0.1", port) as client:
            assert await client.create_topic("grouped", 1) is t.CreateTopicResult.CREATED
            await client.produce("grouped", 0, [t.BundleMessage(b"first", 1)])  # loaded
        before = _syncs(server.port_of("http"))

        conn = t.TankConnection(t.Role.CLIENT)
        for request_id in range(1, REQUESTS + 1):
            bundle = t.encode_bundle([t.BundleMessage(b"m%d" % request_id, 1)])
            partitions = (t.ProducePartition(0, bundle, 0),)
            conn.send(t.Produce(request_id, (t.ProduceTopic("grouped", partitions),)))
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(conn.data_to_send())  # every request before any reply
            await writer.drain()
            replies: list[t.ProduceResponse] = []
            while len(replies) < REQUESTS:
                data = await asyncio.wait_for(reader.read(1 << 16), WAIT_S)
                assert data, "the broker closed the connection"
                conn.receive_data(data)
                replies += [e for e in conn.events() if isinstance(e, t.ProduceResponse)]
        finally:
            writer.close()
            await writer.wait_closed()
        syncs = _syncs(server.port_of("http")) - before

        assert [r.request_id for r in replies] == list(range(1, REQUESTS + 1))
        assert all(r.topics[0].partitions[0].error is t.ProduceError.OK for r in replies)
        assert syncs <= MAX_SYNCS, f"{syncs:.0f} syncs for {REQUESTS} pipelined produces"

        async with await TankClient.connect("127.0.0.1", port) as client:
            got: list[bytes] = []
            seq_num = 0
            while len(got) < REQUESTS + 1:
                result = await client.consume("grouped", 0, seq_num)
                assert result.messages, f"nothing at {seq_num}"
                got += [m.content for m in result.messages]
                seq_num = result.next_seq_num
        assert got == [b"first"] + [b"m%d" % i for i in range(1, REQUESTS + 1)]
