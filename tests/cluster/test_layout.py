"""The cluster's ZooKeeper layout: the ``--cluster`` URL, node ids, record encodings."""

from __future__ import annotations

import json

import pytest

from headrace.cluster.errors import BadRecord
from headrace.cluster.layout import (
    UNOWNED,
    ClusterRecord,
    ClusterUrl,
    ContainerRecord,
    ContainerState,
    LeaderRecord,
    NodeInfo,
    check_node_id,
    container_path,
    decode_cluster,
    decode_container,
    decode_leader,
    decode_node,
    encode,
    node_path,
    parse_cluster_url,
)
from headrace.errors import ConfigError
from headrace.store.disk.layout import SegmentMapping


@pytest.mark.parametrize(
    ("text", "hosts", "chroot"),
    [
        ("zk://127.0.0.1:2181/headrace", (("127.0.0.1", 2181),), "/headrace"),
        ("zk://a:1,b:2,c/x/y/", (("a", 1), ("b", 2), ("c", 2181)), "/x/y"),
        ("zk://zk.example.com", (("zk.example.com", 2181),), "/headrace"),
        ("ZK://[::1]:2182,[fe80::1]/c", (("[::1]", 2182), ("[fe80::1]", 2181)), "/c"),
    ],
)
def test_cluster_urls_parse(text: str, hosts: tuple[tuple[str, int], ...], chroot: str) -> None:
    url = parse_cluster_url(text)
    assert url == ClusterUrl(hosts, chroot)
    assert parse_cluster_url(str(url)) == url
    assert url.connect_string == ",".join(f"{h}:{p}" for h, p in hosts)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("127.0.0.1:2181", "expected zk://host:port"),
        ("http://a:1/x", "expected zk://host:port"),
        ("zk:///x", "name 1 to 16 ZooKeeper hosts"),
        ("zk://a:0/x", "'a:0' is not host:port"),
        ("zk://a:65536/x", "'a:65536' is not host:port"),
        ("zk://a:b/x", "'a:b' is not host:port"),
        ("zk://a:²/x", "'a:²' is not host:port"),
        ("zk://a:1,,b:2/x", "'' is not host:port"),
        ("zk://[::1/x", "'[::1' is not host:port"),
        ("zk://a b:1/x", "'a b:1' is not host:port"),
        ("zk://a:1/x/../y", "chroot part '..'"),
        ("zk://a:1/zookeeper", "chroot part 'zookeeper'"),
        ("zk://a:1/x//y", "chroot part ''"),
        ("zk://" + ",".join(["a:1"] * 17) + "/x", "name 1 to 16 ZooKeeper hosts"),
    ],
)
def test_a_bad_cluster_url_is_one_clear_line(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=r"^--cluster ") as caught:
        parse_cluster_url(text)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("node_id", ["a", "node-1", "n.2_x", "A" * 64])
def test_node_ids_that_are_znode_names_are_accepted(node_id: str) -> None:
    assert check_node_id(node_id) == node_id
    assert node_path(node_id) == f"/nodes/{node_id}"


@pytest.mark.parametrize("node_id", ["", ".", "..", "-a", "a/b", "a b", "é", "A" * 65])
def test_node_ids_that_could_escape_their_znode_are_refused(node_id: str) -> None:
    with pytest.raises(ConfigError, match=r"^--node-id "):
        check_node_id(node_id)


def test_records_round_trip() -> None:
    cluster = ClusterRecord(16)
    assert decode_cluster(encode(cluster)) == cluster
    node = NodeInfo("a", "10.0.0.1", {"controller": 9090, "segment_store": 12345})
    assert decode_node(encode(node), node_path("a")) == node
    leader = LeaderRecord("a")
    assert decode_leader(encode(leader)) == leader
    for record in (
        UNOWNED,
        ContainerRecord(None, 0, ContainerState.RELEASED, "b"),
        ContainerRecord("a", 3, ContainerState.OWNED),
        ContainerRecord("a", 3, ContainerState.MOVING, "b"),
        ContainerRecord("a", 4, ContainerState.RELEASED, "b"),
    ):
        assert decode_container(encode(record), container_path(0)) == record
    assert json.loads(encode(ContainerRecord("a", 3, ContainerState.MOVING, "b"))) == {
        "v": 1,
        "owner": "a",
        "epoch": 3,
        "state": "MOVING",
        "target": "b",
    }


def _container(**fields: object) -> bytes:
    body = {"v": 1, "owner": "a", "epoch": 1, "state": "OWNED", "target": None, **fields}
    return json.dumps(body).encode()


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\xff", "not a JSON object"),
        (b"[1]", "not a JSON object"),
        (_container(v=2), "record version 2"),
        (b'{"v": 1}', "no 'epoch'"),
        (_container(epoch=-1), "epoch -1 is not an integer"),
        (_container(epoch=True), "epoch True is not an integer"),
        (_container(state="GONE"), "state 'GONE' is not one of"),
        (_container(owner="../x"), "owner '../x' is not a node id"),
        (_container(owner=None), "owner and epoch disagree"),
        (_container(target="b"), "an OWNED container has no target"),
        (_container(state="MOVING"), "a MOVING container needs a target"),
        (_container(state="MOVING", target="a"), "a MOVING container needs a target"),
        (_container(state="RELEASED"), "a released container that had an owner needs a target"),
        (b" " * 20_000, "more than 16384"),
    ],
)
def test_a_bad_container_record_is_refused(data: bytes, reason: str) -> None:
    with pytest.raises(BadRecord, match=r"^ZooKeeper record /containers/3: ") as caught:
        decode_container(data, container_path(3))
    assert reason in caught.value.reason


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"node": "a", "host": "h", "ports": {"Door": 1}}, "door name 'Door'"),
        ({"node": "a", "host": "h", "ports": {"tank": 0}}, "tank 0 is not an integer"),
        ({"node": "a", "host": "h/x", "ports": {}}, "host 'h/x'"),
        ({"node": "a", "host": "h", "ports": []}, "ports is not an object"),
    ],
)
def test_a_bad_node_record_is_refused(body: dict[str, object], reason: str) -> None:
    with pytest.raises(BadRecord) as caught:
        decode_node(json.dumps({"v": 1, **body}).encode(), node_path("a"))
    assert reason in caught.value.reason


def test_a_cluster_record_outside_the_limits_is_refused() -> None:
    for containers in (0, 1025):
        data = json.dumps(
            {"v": 1, "containers": containers, "replication_factor": 1, "min_in_sync": 1}
        ).encode()
        with pytest.raises(BadRecord, match="containers"):
            decode_cluster(data)


def test_the_cluster_record_says_its_segment_mapping() -> None:
    """New clusters group (``"mapping":"grouped"``); a record written before the
    mapping was recorded has none and means the plain hash."""
    assert ClusterRecord(16).mapping is SegmentMapping.GROUPED
    assert json.loads(encode(ClusterRecord(16)))["mapping"] == "grouped"
    hashed = ClusterRecord(16, mapping=SegmentMapping.HASH)
    assert decode_cluster(encode(hashed)) == hashed
    old = {"v": 1, "containers": 16, "replication_factor": 1, "min_in_sync": 1}
    assert decode_cluster(json.dumps(old).encode()).mapping is SegmentMapping.HASH
    for bad in ("crc32", 1, None):
        with pytest.raises(BadRecord, match="mapping"):
            decode_cluster(json.dumps({**old, "mapping": bad}).encode())


def test_a_replicated_container_record_round_trips_and_its_rules_hold() -> None:
    record = ContainerRecord("a", 2, ContainerState.OWNED, None, ("a", "b", "c"), ("a", "c"))
    assert decode_container(encode(record), "/containers/0") == record
    plain = ContainerRecord("a", 2, ContainerState.OWNED)
    assert b"replicas" not in encode(plain)  # one copy: no replica fields
    for bad in (
        b'{"v":1,"owner":"a","epoch":2,"state":"OWNED","target":null,'
        b'"replicas":["a","b"],"in_sync":["b"]}',  # the owner must be in sync
        b'{"v":1,"owner":"a","epoch":2,"state":"OWNED","target":null,'
        b'"replicas":["a"],"in_sync":["a","z"]}',  # in sync but not a replica
        b'{"v":1,"owner":"a","epoch":2,"state":"OWNED","target":null,'
        b'"replicas":["a","a"],"in_sync":["a"]}',  # twice
        b'{"v":1,"owner":"a","epoch":2,"state":"OWNED","target":null,'
        b'"replicas":"a","in_sync":[]}',  # not a list
    ):
        with pytest.raises(BadRecord):
            decode_container(bad, "/containers/0")
