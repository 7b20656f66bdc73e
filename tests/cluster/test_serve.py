"""``headrace serve --cluster``: real server processes as nodes of one cluster.

One real ZooKeeper (the shared one, a chroot per test) and three
``headrace serve --cluster`` processes on free ports with their own data
directories. Each node announces its doors, the containers are placed over
the three, and each node's ``/health`` reports its view. The controller's
``getURI`` names the segment store of the node owning a segment's container,
``getControllerServerList`` every node's controller, and a segment store
answers ``WrongHost`` (naming the owner) for a segment it does not serve.
Every wait is bounded; polls of ``/health`` stop at a deadline.
"""

from __future__ import annotations

import asyncio
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

from headrace.client.controller import ControllerClient
from headrace.client.pravega import PravegaClient
from headrace.protocols import pravega as p
from headrace.protocols.pravega import controller_pb2 as pb
from headrace.protocols.pravega.controller import ScalingPolicy, Segment, StreamConfig
from headrace.store.disk import DiskStore
from headrace.store.disk.layout import SegmentMapping, container_of
from tests._server import (
    LISTENER_NAMES,
    ServerProcess,
    free_port,
    serve_command,
    server_env,
)
from tests._zookeeper import ZooKeeper
from tests.cluster._nodes import (
    CONTAINERS,
    health,
    owners,
    settle,
    start_node,
    views,
    wait_for_view,
)
from tests.server.test_pravega_server import Raw

NODES: Final = ("n1", "n2", "n3")
WAIT_S: Final = 60.0
"""Bound on the cluster settling: three JVM-free server starts and placement
over ZooKeeper on two busy cores."""


def metrics(node: ServerProcess) -> dict[str, float]:
    url = f"http://127.0.0.1:{node.port_of('http')}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    found = (line.split() for line in text.splitlines() if line.startswith("headrace_cluster"))
    return {name: float(value) for name, value in found}


@pytest.fixture
def serve_cluster(
    shared_zookeeper: ZooKeeper, tmp_path: Path
) -> Iterator[dict[str, ServerProcess]]:
    """Three ``headrace serve --cluster`` nodes, settled: every container owned."""
    url = shared_zookeeper.url(f"/serve-{uuid.uuid4().hex[:12]}")
    nodes: dict[str, ServerProcess] = {}
    try:
        for name in NODES:
            nodes[name] = start_node(url, tmp_path / name, name)
        settle(nodes, WAIT_S)
        yield nodes
    finally:
        for node in nodes.values():
            node.stop()


async def test_nodes_route_segments_to_their_owners(
    serve_cluster: dict[str, ServerProcess],
) -> None:
    nodes = serve_cluster
    seen = views(nodes)
    assert all(v["containers"] == CONTAINERS for v in seen.values())
    assert [v["is_leader"] for v in seen.values()].count(True) == 1
    owner_of = owners(nodes)
    for name, node in nodes.items():
        assert metrics(node) == {
            "headrace_cluster_containers_owned": len(seen[name]["owned"]),
            "headrace_cluster_leader": 1.0 if seen[name]["is_leader"] else 0.0,
            "headrace_cluster_nodes": 3.0,
        }
    store_port = {name: node.port_of("segment_store") for name, node in nodes.items()}

    async with ControllerClient(nodes["n1"].uri) as controller:
        uris = {}
        for number in range(6):
            segment = Segment("sc", "st", number)
            name = segment.name
            uris[name] = await controller.get_uri(segment)
            owner = owner_of[container_of(name, CONTAINERS)]
            assert uris[name] == ("127.0.0.1", store_port[owner]), (name, store_port, owner_of)
        assert len(set(uris.values())) > 1  # the segments' owners span several nodes
        listed = await controller._rpc(
            "getControllerServerList", pb.ServerRequest(), pb.ServerResponse
        )
        assert sorted((u.endpoint, u.port) for u in listed.nodeURI) == sorted(
            ("127.0.0.1", node.port_of("controller")) for node in nodes.values()
        )

    name = "sc/st/0.#epoch.0"
    owner = owner_of[container_of(name, CONTAINERS)]
    other = next(n for n in NODES if n != owner)
    raw = await Raw.connect(store_port[other])
    try:
        reply = await raw.request(p.GetStreamSegmentInfo(1, name, ""))
        assert reply == p.WrongHost(1, name, f"127.0.0.1:{store_port[owner]}", "")
        writer = uuid.uuid4()
        reply = await raw.request(p.SetupAppend(2, writer, name, ""))
        assert reply == p.WrongHost(2, name, f"127.0.0.1:{store_port[owner]}", "")
    finally:
        raw.writer.close()
    raw = await Raw.connect(store_port[owner])
    try:
        reply = await raw.request(p.GetStreamSegmentInfo(3, name, ""))
        assert isinstance(reply, p.StreamSegmentInfo)  # served here
        assert not reply.exists  # not created yet
    finally:
        raw.writer.close()


async def test_our_client_reaches_each_segment_at_its_owner(
    serve_cluster: dict[str, ServerProcess],
) -> None:
    """The segments of one stream live on different nodes: the client asks
    ``getURI`` per segment, not once per stream."""
    nodes = serve_cluster
    owner_of = owners(nodes)
    segments = [Segment("sc", "st", number) for number in range(6)]
    assert len({owner_of[container_of(s.name, CONTAINERS)] for s in segments}) > 1
    client = PravegaClient(nodes["n2"].uri)
    try:
        for segment in segments:
            stat = await client.segments.stat(segment)
            assert not stat.exists  # answered by its owner, not WrongHost
    finally:
        await client.aclose()


TXN_ATTEMPTS: Final = 16
"""Transactions tried until one whose segment the plain hash would have put in
a container of another node (each does with probability about 2/3)."""


async def test_a_transaction_commits_on_its_parents_owner(
    serve_cluster: dict[str, ServerProcess],
) -> None:
    """A transaction segment lives in its parent's container (the grouped
    mapping), so the node owning the parent takes the transaction's appends and
    merges it locally on commit, even for transactions whose segment the plain
    hash would have put on another node."""
    nodes = serve_cluster
    owner_of = owners(nodes)
    parent = Segment("sc", "tx", 0)
    owner = owner_of[container_of(parent.name, CONTAINERS, SegmentMapping.GROUPED)]
    events: list[bytes] = []
    elsewhere = 0
    async with asyncio.timeout(WAIT_S), PravegaClient(nodes[owner].uri) as client:
        # The controller of the parent's owner: each node's controller still
        # keeps its streams in its own store (docs/cluster.md#serving).
        await client.controller.create_scope("sc")
        await client.controller.create_stream("sc", "tx", StreamConfig(ScalingPolicy.fixed(1)))
        for attempt in range(TXN_ATTEMPTS):
            txn = await client.begin_transaction("sc", "tx")
            name = txn.txn_id.segment_name(parent)
            assert container_of(name, CONTAINERS) == container_of(parent.name, CONTAINERS)
            batch = [f"t{attempt}-{i}".encode() for i in range(20)]
            for event in batch:
                await txn.write(event)
            await txn.commit()
            events += batch
            if owner_of[container_of(name, CONTAINERS, SegmentMapping.HASH)] != owner:
                elsewhere += 1
                if elsewhere == 2:
                    break
        assert elsewhere == 2, "no transaction segment hashed to another node"
        async with client.record_reader("sc", "tx") as reader:
            values = [r.value async for r in reader]
    assert values == events


async def test_a_data_dir_of_another_mapping_refuses_to_join_in_one_line(
    shared_zookeeper: ZooKeeper, tmp_path: Path
) -> None:
    """A data dir written before the mapping was recorded (the plain hash) holds
    transaction segments where a grouped cluster does not look: its node stops
    at start with one line, and the cluster goes on without it."""
    url = shared_zookeeper.url(f"/mapping-{uuid.uuid4().hex[:12]}")
    first = start_node(url, tmp_path / "n1", "n1")
    try:
        wait_for_view(first, lambda v: v["owned"] == list(range(CONTAINERS)))
        old = tmp_path / "old"
        store = await DiskStore.open(
            old, container_count=CONTAINERS, segment_mapping=SegmentMapping.HASH
        )
        await store.close()
        result = await asyncio.to_thread(
            subprocess.run,
            serve_command(
                old,
                f"--cluster={url}",
                "--node-id=n2",
                "--advertise-host=127.0.0.1",
                *(f"--{name.replace('_', '-')}-port=0" for name in LISTENER_NAMES),
                f"--segment-store-port={free_port()}",  # the last one wins
            ),
            capture_output=True,
            text=True,
            timeout=WAIT_S,
            env=server_env(),
        )
        assert result.returncode == 1, result.stderr
        assert "Traceback" not in result.stderr
        (line,) = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
        assert "'grouped' mapping and this node's data dir by 'hash'" in line
        assert health(first)["cluster"]["nodes"] == ["n1"]
    finally:
        first.stop()


async def test_a_node_without_zookeeper_serves_nothing_until_it_reclaims(
    zookeeper: ZooKeeper, tmp_path: Path
) -> None:
    """Fencing: once the ZooKeeper connection has been lost for longer than
    its lease the node owns nothing and answers WrongHost with no host; once
    ZooKeeper is back it re-claims its containers and serves them again."""
    node = start_node(zookeeper.url("/fence"), tmp_path / "n1", "n1")
    try:
        everything = list(range(CONTAINERS))
        wait_for_view(node, lambda v: v["owned"] == everything)
        name = "sc/st/0.#epoch.0"
        raw = await Raw.connect(node.port_of("segment_store"))
        try:
            assert isinstance(
                await raw.request(p.GetStreamSegmentInfo(1, name, "")), p.StreamSegmentInfo
            )
            zookeeper.kill()
            wait_for_view(node, lambda v: v["owned"] == [])
            reply = await raw.request(p.GetStreamSegmentInfo(2, name, ""))
            assert reply == p.WrongHost(2, name, "", "")
            zookeeper.restart()
            wait_for_view(node, lambda v: v["owned"] == everything)
            assert isinstance(
                await raw.request(p.GetStreamSegmentInfo(3, name, "")), p.StreamSegmentInfo
            )
        finally:
            raw.writer.close()
    finally:
        node.stop()
