"""One controller for the whole cluster: metadata written by the leader, seen by every node.

Real ``headrace serve --cluster`` nodes and a real ZooKeeper. Scopes,
streams and key-value tables created through any node's controller (our client, and the real
``pravega`` client in a child process) are seen through every other node's;
the TANK door of a follower creates its topic's stream at the leader;
after the leader restarts, the new leader loads the same metadata.
"""

from __future__ import annotations

import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from headrace.client.controller import ControllerClient
from headrace.cluster.layout import encode
from headrace.controller.records import SCOPES_TABLE
from headrace.protocols import pravega as p
from headrace.protocols.pravega.auth import Permission, TokenClaims, encode_token
from headrace.protocols.pravega.controller import (
    GroupRetention,
    KeyValueTableConfig,
    ReaderGroupConfig,
    Segment,
)
from headrace.store.disk.layout import container_of
from tests._real_pravega import SCENARIO_TIMEOUT_S, result_of, run_scenario, start_scenario
from tests._server import ServerProcess
from tests._zookeeper import ZooKeeper
from tests.cluster._nodes import (
    CONTAINERS,
    leader,
    owners,
    settle,
    start_node,
    wait_for_metadata,
    wait_for_view,
)
from tests.server.test_pravega_server import Raw

NODES = ("n1", "n2", "n3")
WAIT_S = 30.0
"""Bound on reaching ZooKeeper from the test."""
KV_CONFIG = KeyValueTableConfig(partition_count=2, primary_key_length=8)


@pytest.fixture
def nodes(shared_zookeeper: ZooKeeper, tmp_path: Path) -> Iterator[dict[str, ServerProcess]]:
    url = shared_zookeeper.url(f"/meta-{uuid.uuid4().hex[:12]}")
    started: dict[str, ServerProcess] = {}
    try:
        for name in NODES:
            started[name] = start_node(url, tmp_path / name, name)
        settle(started)
        yield started
    finally:
        for node in started.values():
            node.stop()


async def test_what_one_node_creates_every_node_sees(nodes: dict[str, ServerProcess]) -> None:
    boss = leader(nodes)
    follower, other = (n for n in NODES if n != boss)
    async with ControllerClient(nodes[follower].uri) as controller:
        assert await controller.create_scope("shared")
        assert not await controller.create_scope("shared")  # the leader knows it now
        assert await controller.create_stream("shared", "st")
        assert await controller.create_key_value_table("shared", "kv", KV_CONFIG)
    async with ControllerClient(nodes[other].uri) as controller:
        assert await controller.stream_exists("shared", "st")
        assert await controller.get_key_value_table_config("shared", "kv") == KV_CONFIG
        assert not await controller.create_stream("shared", "st")
        assert await controller.create_stream("shared", "second")
    for name in NODES:
        async with ControllerClient(nodes[name].uri) as controller:
            streams = [s async for s in controller.list_streams("shared")]
            assert sorted(streams) == ["second", "st"], name
            segments = await controller.get_current_segments("shared", "st")
            assert len(segments) == 1


@pytest.mark.slow
def test_the_real_client_writes_and_reads_through_any_node(
    nodes: dict[str, ServerProcess],
) -> None:
    """20,000 events over 6 segments whose containers span the three nodes,
    given a follower's controller; a reader group reads each exactly once,
    in order per key."""
    by_container = owners(nodes)
    names = [Segment("big", "st", number).name for number in range(6)]
    assert len({by_container[container_of(n, CONTAINERS)] for n in names}) > 1
    follower = next(n for n in NODES if n != leader(nodes))
    result = run_scenario("round_trip", nodes[follower].uri, "big", "20000", "6")
    assert result["read"] == 20000, result
    assert result["distinct"] == 20000
    assert result["duplicates"] == 0
    assert result["out_of_order"] == 0
    assert result["keys"] == 100


async def test_a_new_leader_loads_the_same_metadata(nodes: dict[str, ServerProcess]) -> None:
    boss = leader(nodes)
    follower = next(n for n in NODES if n != boss)
    async with ControllerClient(nodes[boss].uri) as controller:
        assert await controller.create_scope("kept")
        assert await controller.create_stream("kept", "st")
    # A reader group made through a follower: its records are the leader's tables'.
    async with ControllerClient(nodes[follower].uri) as controller:
        group = await controller.create_reader_group(
            ReaderGroupConfig("kept", "rg", start={"kept/st": {}}, retention=GroupRetention.MANUAL)
        )
    nodes[boss].restart()
    wait_for_metadata(nodes)
    for name in NODES:
        async with ControllerClient(nodes[name].uri) as controller:
            assert await controller.stream_exists("kept", "st"), name
            assert await controller.get_reader_group_config("kept", "rg") == group, name
            assert await controller.list_subscribers("kept", "st") == ["kept/rg"], name
            assert await controller.stream_exists("kept", "_RGrg"), name
    async with ControllerClient(nodes[boss].uri) as controller:
        assert await controller.create_stream("kept", "after")


async def test_only_the_clusters_secret_changes_its_tables(
    shared_zookeeper: ZooKeeper, tmp_path: Path
) -> None:
    """Without a secret file the first node keeps a random secret in ZooKeeper;
    the owner of the controller's tables takes a change to them only with a
    node token signed with it."""
    chroot = f"/secret-{uuid.uuid4().hex[:12]}"
    node = start_node(shared_zookeeper.url(chroot), tmp_path / "n1", "n1")
    try:
        settle({"n1": node})
        zk = KazooClient(hosts=shared_zookeeper.hosts)
        zk.start(timeout=WAIT_S)
        try:
            secret, _ = zk.get(f"{chroot}/secret")
        finally:
            zk.stop()
            zk.close()
        assert len(secret) >= 32
        now = int(time.time())

        def token(key: bytes) -> str:
            claims = TokenClaims("n9", "prn::/*", Permission.READ_UPDATE, now + 600, now, True)
            return encode_token(key, claims)

        entries = p.TableEntries(((p.TableKey(b"forged"), p.TableValue(b"scope")),))
        raw = await Raw.connect(node.port_of("segment_store"))
        try:
            for rid, credential in ((1, ""), (2, token(b"k" * 32))):
                reply = await raw.request(
                    p.UpdateTableEntries(rid, SCOPES_TABLE, credential, entries)
                )
                assert not isinstance(reply, p.TableEntriesUpdated), reply
            reply = await raw.request(p.UpdateTableEntries(3, SCOPES_TABLE, token(secret), entries))
            assert isinstance(reply, p.TableEntriesUpdated), reply
        finally:
            await raw.aclose()
    finally:
        node.stop()


@pytest.mark.slow
def test_the_real_client_follows_its_segments_through_a_drain(
    shared_zookeeper: ZooKeeper, tmp_path: Path
) -> None:
    """20,000 events over 6 segments through a follower's controller while the
    node holding most of them is drained: its containers move (with their
    data) and the client, answered ``WrongHost``, follows them. A reader group
    then reads each event once, in order per key."""
    chroot = f"/drain-{uuid.uuid4().hex[:12]}"
    nodes: dict[str, ServerProcess] = {}
    try:
        for name in NODES:
            nodes[name] = start_node(
                shared_zookeeper.url(chroot), tmp_path / name, name, verbose=True
            )
        settle(nodes)
        by_container = owners(nodes)
        held = Counter(
            by_container[container_of(Segment("moved", "st", n).name, CONTAINERS)] for n in range(6)
        )
        drained = held.most_common(1)[0][0]
        entry = next(n for n in NODES if n != drained)
        count = 20000
        writer = start_scenario(
            "write_through_restart",
            nodes[entry].uri,
            str(count),
            "moved",
            "6",
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            assert writer.stdout is not None
            for line in writer.stdout:
                if line.startswith("progress") and int(line.split()[1]) >= count // 3:
                    break
            assert writer.poll() is None  # the drain starts before the writer's flush
            zk = KazooClient(hosts=shared_zookeeper.hosts)
            zk.start(timeout=WAIT_S)
            try:
                zk.create(f"{chroot}/drain/{drained}", encode(None))
            finally:
                zk.stop()
                zk.close()
            out, _ = writer.communicate(timeout=SCENARIO_TIMEOUT_S)
        finally:
            writer.kill()
            writer.wait()
        result = result_of("write_through_restart", out, "", writer.returncode)
        assert result["acknowledged"] == count
        wait_for_view(nodes[drained], lambda view: view["owned"] == [])
        r = run_scenario("read_all", nodes[drained].uri, "moved", str(count))
        assert (r["read"], r["distinct"], r["duplicates"]) == (count, count, 0)
        assert r["out_of_order"] == 0 and r["max"] == count - 1
        assert any("segment store: WrongHost for " in n.log_text() for n in nodes.values())
    finally:
        for node in nodes.values():
            node.stop()
