"""A replicated cluster of real nodes: a killed leader fails over and nothing acknowledged is lost.

Three ``headrace serve --cluster --replication-factor 3 --min-insync 2``
processes on the shared ZooKeeper. Our client writes numbered events to a
stream whose container is led by one node, through another node's
controller; that leader is killed with SIGKILL. Its session ends, the
cluster leader fails the container over to an in-sync copy at a new epoch,
the third copy follows the new leader, and the writer (retrying) goes on.
Every event it was told was stored is read back exactly once, in order,
from the copies that survived (``docs/replication.md``).
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest

from headrace.protocols.pravega.controller import Segment
from headrace.store.disk.layout import container_of
from tests._server import ServerProcess
from tests._zookeeper import ZooKeeper
from tests.cluster._nodes import CONTAINERS, node_process, owners, settled, views
from tests.cluster.test_cli import status_json
from tests.cluster.test_faults import (
    EVENTS_AFTER,
    EVENTS_BEFORE,
    read_stream,
    stream_on,
    wait_until,
    wait_until_async,
    writing,
)
from tests.cluster.test_serve import NODES, WAIT_S

pytestmark = pytest.mark.slow

REPLICATED = ("--replication-factor=3", "--min-insync=2", "--replica-lag-max=2")


def replicas_of(view: dict[str, Any], container: int) -> dict[str, Any] | None:
    found: dict[str, Any] | None = view.get("replicas", {}).get(str(container))
    return found


async def test_a_killed_leader_fails_over_to_an_in_sync_copy_and_loses_nothing(
    shared_zookeeper: ZooKeeper, tmp_path: Path
) -> None:
    url = shared_zookeeper.url(f"/replicated-{uuid.uuid4().hex[:12]}")
    nodes: dict[str, ServerProcess] = {}
    try:
        for name in NODES:
            nodes[name] = node_process(url, tmp_path / name, name, extra=REPLICATED).start()
        wait_until(lambda: settled(views(nodes)), "the cluster settled")
        seen = views(nodes)
        assert all(v["replication_factor"] == 3 and v["min_in_sync"] == 2 for v in seen.values())
        boss = next(iter(seen.values()))["leader"]
        victim = next(n for n in NODES if n not in {boss, owners(nodes)[0]})
        stream = stream_on(nodes, lambda owner: owner == victim)
        container = container_of(Segment("sc", stream, 0).name, CONTAINERS)
        others = [n for n in NODES if n != victim]
        # every other node follows the victim's container
        wait_until(
            lambda: all(
                (replicas_of(views({n: nodes[n]})[n], container) or {}).get("role") == "follower"
                for n in others
            ),
            "both followers subscribed",
        )
        async with (
            asyncio.timeout(4 * WAIT_S),
            writing(nodes, others[0], "sc", stream) as (
                client,
                w,
            ),
        ):
            await wait_until_async(lambda: w.acked >= EVENTS_BEFORE, "events before the kill")
            nodes[victim].kill()
            acked = w.acked
            await wait_until_async(
                lambda: w.acked >= acked + EVENTS_AFTER, "events after the failover"
            )
            written = await w.finish()
            assert await read_stream(client, "sc", stream) == written  # each once, in order
        live = {n: nodes[n] for n in others}
        roles = {n: replicas_of(v, container) for n, v in views(live).items()}
        leaders = [n for n, r in roles.items() if r is not None and r["role"] == "leader"]
        assert len(leaders) == 1, roles
        report = roles[leaders[0]]
        assert report is not None and report["epoch"] >= 2
        assert sorted(report["in_sync"]) == sorted(others), roles
        # `headrace cluster status` shows the copies, the in-sync set and the counts
        status = await asyncio.to_thread(status_json, nodes[others[0]])
        assert status["replication_factor"] == 3 and status["min_in_sync"] == 2
        entry = status["containers"][container]
        assert entry["owner"] == leaders[0] and sorted(entry["copies"]) == sorted(NODES)
        assert sorted(entry["in_sync"]) == sorted(others)
        assert status["under_replicated"] >= 1 and status["offline"] == 0
    finally:
        for node in nodes.values():
            node.stop()
