"""A slow WAL sync under ``--fsync always`` stalls no other connection.

The committer waits for a small sync round on the event loop itself for at most
``INLINE_SYNC_WAIT_S`` and then hands it over to the sync thread, so while one
sync hangs on a slow disk (``slow_disk_server.py``) another connection's
request that needs no sync is answered at once, and the append waiting for the
sync is acknowledged only once it returned.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from headrace.client.tank import TankClient
from headrace.protocols import tank as t
from tests._server import FREE, ServerProcess
from tests.faults.slow_disk_server import SLOW_SYNC_S

RUNNER = Path(__file__).with_name("slow_disk_server.py")
WAIT_S = 20.0
"""Bound on every wait."""

ANSWER_WITHIN_S = SLOW_SYNC_S / 4
"""A request that needs no sync is answered within this while a sync hangs."""


async def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    while not await asyncio.to_thread(path.exists):
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        await asyncio.sleep(0.01)  # polling a file under a deadline


async def test_a_slow_sync_is_handed_over_and_stalls_no_other_connection(tmp_path: Path) -> None:
    flag = tmp_path / "slow"
    runner = [str(RUNNER), str(flag)]
    with ServerProcess(tmp_path / "data", ports={"tank": FREE}, runner=runner) as server:
        port = server.port_of("tank")
        async with (
            await TankClient.connect("127.0.0.1", port) as writer,
            await TankClient.connect("127.0.0.1", port) as other,
        ):
            assert await writer.create_topic("slow", 1) is t.CreateTopicResult.CREATED
            await writer.produce("slow", 0, [t.BundleMessage(b"fast", 1)])
            flag.touch()  # the disk turns slow
            began = time.monotonic()
            produce = asyncio.create_task(writer.produce("slow", 0, [t.BundleMessage(b"slow", 2)]))
            await _wait_for(flag.with_name("slow.syncing"))  # its sync hangs now

            asked = time.monotonic()
            count = await asyncio.wait_for(other.discover_partitions("slow"), WAIT_S)
            answered_s = time.monotonic() - asked
            assert len(count) == 1
            assert answered_s < ANSWER_WITHIN_S, f"answered after {answered_s:.2f} s"
            assert not produce.done()  # not acknowledged before its sync returned

            flag.unlink()
            await asyncio.wait_for(produce, WAIT_S)
            assert time.monotonic() - began >= SLOW_SYNC_S
