"""Cluster scale: durable produce over 1 node and over 3 nodes, and what forwarding costs.

Run: ``.venv/bin/python benchmarks/cluster_scale.py [--quick]``
(``--events N`` 100-byte events per lane, ``--large-events N`` 10 KiB events
per lane, ``--lanes L``, ``--messages N`` TANK messages per bundled
forwarding run, ``--single-messages N`` per single-message run, ``--rounds R``
of the forwarding comparison).

Starts one ZooKeeper (the Debian ``zookeeper`` package, ``_zookeeper.py``),
then, in the same run:

* **1 node, then 3 nodes**: ``headrace serve --cluster ... --fsync always``
  nodes (``always`` is serve's default: an ack means on disk; a fresh chroot
  each), settled (every container owned, balanced, the leader serving the
  controller metadata and the others following it). ``--lanes`` writer
  processes start together; each writes its events to a 1-segment stream of
  its own with the project's ``EventWriter``, then flushes. Every stream is
  created through the first node's controller, and every writer is given
  that controller: it asks it for its segment's owner (``getURI``) and
  writes to that node's segment store, as the project's client does. Each
  lane's stream is picked so that its segment's container is owned by node
  ``lane % nodes``, so lanes are spread over the nodes. The figure is every
  lane's events over the time from the first lane's start to the last
  lane's flush: events/s and MB/s of payload, 100 B then 10 KiB, and the
  ratio 3 nodes / 1 node. The nodes' CPU per event is reported beside it.
  Every node and every writer shares this machine's cores: on a 2-core
  machine three nodes cannot run in parallel, so the ratio shows the
  cluster's overhead, not how it scales over machines.
* **Forwarding**, on the 3-node cluster: the TANK door has no redirect, so a
  node that does not own a partition's segment forwards each produce to the
  owner's segment store and acknowledges after the owner stored it. Two
  followers are picked, the owner and the forwarder, and two topics of
  ``TOPIC_PARTITIONS`` partitions, created through the first node's TANK
  door; in each the first ``FORWARD_PARTITIONS`` partitions whose container
  the owner holds are written, one topic only through the owner's TANK door
  (direct), the other only through the forwarder's (forwarded), with
  ``headrace.client.tank.TankClient`` over one connection. Two loads of
  100-byte messages: bundles of ``BUNDLE_MESSAGES``, one bundle in flight
  per partition; and single-message bundles, ``PIPELINE`` in flight over
  the partitions. Each load runs ``--rounds`` times, direct and forwarded
  in alternation; the best of each, the ratio forwarded / direct, and the
  nodes' CPU per message.

* **Replication** (``--replication``, instead of the two above): three nodes,
  each run on a fresh chroot with ``--replication-factor R`` (R = 1, 2, 3;
  ``--min-insync`` 2, at most R), settled with every container's copies in
  sync. The same durable produce of 100 B and 10 KiB events (each append
  acknowledged once every in-sync copy synced it, ``docs/replication.md``),
  then the acknowledgement latency at a paced ``PACED_RATE`` events/s (one
  writer, 100 B events): p50 and p99 from ``write`` to its acknowledgement.
  Ratios R = 3 / R = 1 (throughput, and p99).

The last line printed is one JSON object with every figure. Nothing here
asserts speed.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import _common as common

from _zookeeper import ZooKeeper, installed
from headrace.client import PravegaClient, ScalingPolicy, StreamConfig
from headrace.client.controller import Segment
from headrace.client.tank import TankClient
from headrace.protocols import tank as t
from headrace.store.disk.layout import SegmentMapping, container_of

SMALL_BYTES = 100
LARGE_BYTES = 10 * 1024
CONTAINERS = 12
"""Containers of each cluster: a multiple of 1 and 3, so the nodes are even."""
MAPPING = SegmentMapping.GROUPED
"""The segment mapping of every new cluster (``docs/cluster.md#containers``)."""
SETTLE_TIMEOUT_S = 90.0
LANE_TIMEOUT_S = 600.0
TOPIC_PARTITIONS = 16
"""Partitions of each forwarding topic: enough that some land on every node."""
FORWARD_PARTITIONS = 2
"""Partitions written per forwarding run, all owned by the one owner node."""
BUNDLE_MESSAGES = 100
"""100-byte messages per bundle of the bundled load (a 10 KB produce)."""
PIPELINE = 32
"""Single-message produce requests in flight at once, over the partitions."""
TOPIC_TIMEOUT_S = 60.0
"""Bound on a topic becoming known to both nodes' TANK doors."""

WRITER_CHILD = r"""
import asyncio, json, sys, time
from headrace.client import PravegaClient
uri, scope, stream = sys.argv[1:4]
count, size = int(sys.argv[4]), int(sys.argv[5])

async def main():
    event = b"x" * size
    async with PravegaClient(uri) as client:
        writer = await client.create_writer(scope, stream)
        await writer.write_and_wait(event)  # connected and set up before timing
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        start, cpu = time.monotonic(), time.process_time()
        for _ in range(count):
            await writer.write(event)
        await writer.flush()
        end = time.monotonic()
        await writer.aclose()
    print(json.dumps({"start": start, "end": end, "cpu_s": time.process_time() - cpu}))

asyncio.run(main())
"""
"""One lane: a writer process (its calls hold its own GIL, not the parent's)."""

PACED_RATE = 10_000
"""Events per second of the paced latency run (``--replication``)."""

PACED_CHILD = r"""
import asyncio, json, sys, time
from headrace.client import PravegaClient
uri, scope, stream = sys.argv[1:4]
count, size, rate = int(sys.argv[4]), int(sys.argv[5]), float(sys.argv[6])

async def main():
    event = b"x" * size
    latencies = []
    async with PravegaClient(uri) as client:
        writer = await client.create_writer(scope, stream)
        await writer.write_and_wait(event)
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        start = time.monotonic()
        for i in range(count):
            due = start + i / rate
            ahead = due - time.monotonic()
            if ahead > 0:
                await asyncio.sleep(ahead)
            sent = time.monotonic()
            future = await writer.write_future(event)
            future.add_done_callback(lambda _, s=sent: latencies.append(time.monotonic() - s))
        await writer.flush()
        end = time.monotonic()
        await writer.aclose()
    latencies.sort()
    pick = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))]
    print(json.dumps({"start": start, "end": end, "p50_ms": round(pick(0.5) * 1e3, 3),
                      "p99_ms": round(pick(0.99) * 1e3, 3), "acked": len(latencies)}))

asyncio.run(main())
"""
"""The paced latency writer: ``PACED_RATE`` events/s, each one's time to its ack."""


class Node:
    """One ``headrace serve --cluster`` child: its process and ports."""

    def __init__(self, proc: subprocess.Popen[bytes], name: str, ports: dict[str, int]) -> None:
        self.proc = proc
        self.name = name
        self.ports = ports

    @property
    def uri(self) -> str:
        return f"tcp://127.0.0.1:{self.ports['controller']}"

    def health(self) -> dict[str, Any]:
        """The node's own view of the cluster (``/health``'s ``cluster`` section)."""
        url = f"http://127.0.0.1:{self.ports['http']}/health"
        with urllib.request.urlopen(url, timeout=10) as response:
            report: dict[str, Any] = json.loads(response.read())["cluster"]
        return report


def start_node(data_dir: Path, url: str, name: str, extra: tuple[str, ...] = ()) -> Node:
    ports = {door: common.free_port() for door in ("controller", "segment-store", "tank", "http")}
    command = [sys.executable, "-m", "headrace", "serve", "--data-dir", str(data_dir)]
    command += ["--fsync", "always", f"--cluster={url}", f"--node-id={name}", *extra]
    command += ["--advertise-host=127.0.0.1", f"--container-count={CONTAINERS}"]
    for listener in common.LISTENERS:
        command += [f"--{listener}-port", str(ports.get(listener, 0))]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + common.START_TIMEOUT_S
    for port in ports.values():
        common.wait_connectable(proc, port, deadline)
    return Node(proc, name, ports)


def settle(nodes: list[Node], *, balanced: bool = True) -> tuple[dict[int, str], str]:
    """Wait until every node sees all of them and one leader, which serves the
    controller metadata (the others follow it), and every container is owned,
    evenly; container -> owner, and the leader."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    names = sorted(node.name for node in nodes)
    while True:
        try:
            views = [node.health() for node in nodes]
        except OSError:  # a node whose HTTP door listens before it answers
            views = []
        if views and all(v.get("joined") for v in views):
            owned = [c for v in views for c in v["owned"]]
            counts = [len(v["owned"]) for v in views]
            metadata = sorted(str(v.get("metadata")) for v in views)
            if (
                all(v["nodes"] == names for v in views)
                and len({v["leader"] for v in views}) == 1
                and metadata == ["following"] * (len(names) - 1) + ["leading"]
                and sorted(owned) == list(range(CONTAINERS))
                and (max(counts) - min(counts) <= 1 or not balanced)
            ):
                owners = {
                    c: node.name for node, v in zip(nodes, views, strict=True) for c in v["owned"]
                }
                return owners, str(views[0]["leader"])
        if time.monotonic() > deadline:
            raise SystemExit(f"the cluster did not settle within {SETTLE_TIMEOUT_S:.0f} s")
        time.sleep(0.1)  # polling the nodes' views under a deadline


def settle_copies(nodes: list[Node], factor: int) -> None:
    """Wait until every container's leader has ``factor`` copies in sync."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        leaders = [
            r
            for node in nodes
            for r in node.health().get("replicas", {}).values()
            if r["role"] == "leader"
        ]
        if len(leaders) == CONTAINERS and all(len(r["in_sync"]) == factor for r in leaders):
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"the copies were not in sync within {SETTLE_TIMEOUT_S:.0f} s")
        time.sleep(0.1)  # polling the nodes' views under a deadline


def paced_latency(controller: Node, stream: str, count: int) -> dict[str, float]:
    """One writer at ``PACED_RATE`` events/s of 100 B: p50/p99 from write to ack."""
    command = [sys.executable, "-c", PACED_CHILD, controller.uri, "bench", stream]
    command += [str(count), str(SMALL_BYTES), str(PACED_RATE)]
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        if proc.stdout.readline().strip() != "ready":
            raise SystemExit(
                f"the paced writer failed to set up (exit {proc.wait(LANE_TIMEOUT_S)})"
            )
        proc.stdin.write("go\n")
        proc.stdin.flush()
        out, _ = proc.communicate(timeout=LANE_TIMEOUT_S)
        if proc.returncode != 0:
            raise SystemExit(f"the paced writer failed with exit status {proc.returncode}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    result["events_per_s"] = round(count / (result.pop("end") - result.pop("start")))
    return result


def replication_phase(tmp: Path, zookeeper: ZooKeeper, args: argparse.Namespace) -> dict[str, Any]:
    """Three nodes at R = 1, 2, 3: durable produce, then paced ack latency."""
    figures: dict[str, Any] = {}
    for factor in (1, 2, 3):
        nodes, owners, _ = start_cluster(tmp, zookeeper, 3, factor)
        try:
            row = scale_phase(nodes, owners, args)
            owner = sorted(set(owners.values()))[-1]
            stream = asyncio.run(create_stream(nodes[0], owners, owner, f"paced-{factor}"))
            row["paced"] = paced = paced_latency(nodes[0], stream, args.paced_events)
            print(
                f"R={factor}: ack at {paced['events_per_s']:,} events/s "
                f"p50 {paced['p50_ms']} ms p99 {paced['p99_ms']} ms",
                flush=True,
            )
            figures[f"r{factor}"] = row
        finally:
            for node in nodes:
                common.stop(node.proc)
    for label in ("small", "large"):
        figures[f"ratio_r3_to_r1_{label}"] = round(
            figures["r3"][label]["events_per_s"] / figures["r1"][label]["events_per_s"], 3
        )
    figures["ratio_r3_to_r1_p99"] = round(
        figures["r3"]["paced"]["p99_ms"] / max(figures["r1"]["paced"]["p99_ms"], 1e-3), 3
    )
    return figures


def owned_by(owners: dict[int, str], name: str, segment: Segment) -> bool:
    return owners[container_of(segment.name, CONTAINERS, MAPPING)] == name


async def create_stream(controller: Node, owners: dict[int, str], owner: str, stem: str) -> str:
    """A new 1-segment stream of scope ``bench`` whose segment ``owner`` owns,
    created through ``controller``'s controller."""
    stream = next(
        s
        for s in (f"{stem}-{k}" for k in itertools.count())
        if owned_by(owners, owner, Segment("bench", s, 0))
    )
    async with PravegaClient(controller.uri) as client:
        await client.controller.create_scope("bench")
        await client.controller.create_stream("bench", stream, StreamConfig(ScalingPolicy.fixed(1)))
    return stream


def run_lanes(
    controller: Node, streams: list[str], count: int, size: int, nodes: list[Node]
) -> dict[str, float]:
    """Start a writer per stream (given ``controller``), let them go together,
    and time them; the servers' CPU counts every node of ``nodes``."""
    procs = []
    for stream in streams:
        command = [sys.executable, "-c", WRITER_CHILD, controller.uri, "bench", stream]
        command += [str(count), str(size)]
        procs.append(
            subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        )
    try:
        for proc in procs:
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "ready":
                raise SystemExit(f"a writer failed to set up (exit {proc.wait(LANE_TIMEOUT_S)})")
        cpu_before = {node.proc.pid: common.cpu_s(node.proc.pid) for node in nodes}
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        results = []
        for proc in procs:
            out, _ = proc.communicate(timeout=LANE_TIMEOUT_S)
            if proc.returncode != 0:
                raise SystemExit(f"a writer failed with exit status {proc.returncode}")
            results.append(json.loads(out.strip().splitlines()[-1]))
        server_cpu = sum(common.cpu_s(pid) - before for pid, before in cpu_before.items())
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    seconds = max(r["end"] for r in results) - min(r["start"] for r in results)
    events = count * len(streams)
    return {
        "events": events,
        "seconds": round(seconds, 3),
        "events_per_s": round(events / seconds),
        "mb_per_s": round(events * size / seconds / 1e6, 2),
        "server_cpu_us_per_event": round(server_cpu * 1e6 / events, 1),
        "writer_cpu_us_per_event": round(sum(r["cpu_s"] for r in results) * 1e6 / events, 1),
    }


def start_cluster(
    tmp: Path, zookeeper: ZooKeeper, size: int, factor: int = 0
) -> tuple[list[Node], dict[int, str], str]:
    """``size`` nodes on a fresh chroot, settled: the nodes, container -> owner, the leader.
    ``factor``: ``--replication-factor`` (0: the default), and then every container's
    copies in sync before it returns."""
    url = zookeeper.url(f"/scale-{size}-r{factor}")
    extra = (
        () if not factor else (f"--replication-factor={factor}", f"--min-insync={min(2, factor)}")
    )
    nodes: list[Node] = []
    try:
        for i in range(size):
            name = f"n{i + 1}"
            nodes.append(start_node(tmp / f"c{size}-r{factor}-{name}", url, name, extra))
        # a replicated cluster whose factor is below its size places every copy
        # on the first nodes to join: the others lead nothing (no copy moves yet)
        owners, leader = settle(nodes, balanced=factor in (0, 1, size))
        if factor > 1:
            settle_copies(nodes, factor)
    except BaseException:
        for node in nodes:
            common.stop(node.proc)
        raise
    return nodes, owners, leader


def scale_phase(
    nodes: list[Node], owners: dict[int, str], args: argparse.Namespace
) -> dict[str, Any]:
    """Produce over the cluster of ``nodes``: 100 B, then 10 KiB, over ``--lanes`` writers."""
    figures: dict[str, Any] = {"nodes": len(nodes)}
    for label, size, count in (
        ("small", SMALL_BYTES, args.events),
        ("large", LARGE_BYTES, args.large_events),
    ):
        leading = sorted(set(owners.values()))  # the nodes that lead containers
        streams = [
            asyncio.run(
                create_stream(nodes[0], owners, leading[lane % len(leading)], f"{label}-{lane}")
            )
            for lane in range(args.lanes)
        ]
        figures[label] = row = run_lanes(nodes[0], streams, count, size, nodes)
        print(
            f"{len(nodes)} node{'s' if len(nodes) > 1 else ''}, {size:>6} B: "
            f"{row['events_per_s']:>9,} events/s {row['mb_per_s']:>8.2f} MB/s "
            f"(servers {row['server_cpu_us_per_event']} µs CPU/event)",
            flush=True,
        )
    return figures


def owned_partitions(topic: str, owners: dict[int, str], owner: str) -> list[int]:
    """The partitions of ``topic`` whose segment's container ``owner`` holds."""
    partitions = range(TOPIC_PARTITIONS)
    return [p for p in partitions if owned_by(owners, owner, Segment("tank", topic, p))]


def forwarding_topic(owners: dict[int, str], owner: str, stem: str) -> tuple[str, list[int]]:
    """A topic name with at least ``FORWARD_PARTITIONS`` partitions at ``owner``, and those."""
    for k in itertools.count():
        topic = f"{stem}{k}"
        picked = owned_partitions(topic, owners, owner)
        if len(picked) >= FORWARD_PARTITIONS:
            return topic, picked[:FORWARD_PARTITIONS]
    raise AssertionError("unreachable")


async def create_topics(creator: Node, readers: list[Node], topics: list[str]) -> None:
    """Create ``topics`` through ``creator``'s TANK door, then wait until every
    node of ``readers`` knows them (a follower's view lags by up to its
    metadata poll)."""
    deadline = time.monotonic() + TOPIC_TIMEOUT_S
    async with await TankClient.connect("127.0.0.1", creator.ports["tank"]) as tank:
        for topic in topics:
            while (result := await tank.create_topic(topic, TOPIC_PARTITIONS)) not in (
                t.CreateTopicResult.CREATED,
                t.CreateTopicResult.ALREADY_EXISTS,
            ):
                if time.monotonic() > deadline:
                    raise SystemExit(f"creating TANK topic {topic} failed: {result.name}")
                await asyncio.sleep(0.2)  # the broker opens its scope once a leader serves
    for node in readers:
        async with await TankClient.connect("127.0.0.1", node.ports["tank"]) as tank:
            for topic in topics:
                while await tank.discover_partitions(topic) is None:
                    if time.monotonic() > deadline:
                        raise SystemExit(f"{node.name} did not learn of TANK topic {topic}")
                    await asyncio.sleep(0.1)  # polling a follower's view under a deadline


async def produce_load(
    door: Node,
    topic: str,
    partitions: list[int],
    messages: int,
    per_bundle: int,
    in_flight: int,
    nodes: list[Node],
) -> dict[str, float]:
    """``messages`` 100-byte messages in bundles of ``per_bundle`` through
    ``door``'s TANK door, ``in_flight`` produce requests at once (each bound
    to one of ``partitions``, round robin); the servers' CPU counts ``nodes``."""
    bundle = t.encode_bundle([t.BundleMessage(b"x" * SMALL_BYTES)] * per_bundle, compress=False)
    bundles = messages // per_bundle
    taken = itertools.count()

    async def produce(tank: TankClient, partition: int) -> None:
        error = await tank.produce_bundle(topic, partition, bundle)
        if error is not t.ProduceError.OK:
            raise SystemExit(f"produce to {topic}/{partition} through {door.name}: {error.name}")

    async def worker(tank: TankClient, partition: int) -> None:
        while next(taken) < bundles:
            await produce(tank, partition)

    async with await TankClient.connect("127.0.0.1", door.ports["tank"]) as tank:
        for partition in partitions:  # loaded at both ends before timing
            await produce(tank, partition)
        cpu_before = {node.proc.pid: common.cpu_s(node.proc.pid) for node in nodes}
        start = time.monotonic()
        await asyncio.gather(
            *(worker(tank, partitions[i % len(partitions)]) for i in range(in_flight))
        )
        seconds = time.monotonic() - start
        server_cpu = sum(common.cpu_s(pid) - before for pid, before in cpu_before.items())
    sent = bundles * per_bundle
    return {
        "messages": sent,
        "seconds": round(seconds, 3),
        "messages_per_s": round(sent / seconds),
        "produces_per_s": round(bundles / seconds),
        "server_cpu_us_per_message": round(server_cpu * 1e6 / sent, 1),
    }


def forwarding_phase(
    nodes: list[Node], owners: dict[int, str], leader: str, args: argparse.Namespace
) -> dict[str, Any]:
    """Direct vs forwarded TANK produce, in alternation, on a settled 3-node cluster."""
    followers = [node for node in nodes if node.name != leader]
    owner, forwarder = followers[0], followers[1]
    direct_topic, direct_partitions = forwarding_topic(owners, owner.name, "direct")
    via_topic, via_partitions = forwarding_topic(owners, owner.name, "forwarded")
    asyncio.run(create_topics(nodes[0], [owner, forwarder], [direct_topic, via_topic]))
    result: dict[str, Any] = {
        "measured": "TankClient produce of 100 B messages through the TANK door of the "
        "node owning the partitions (direct) vs of a node forwarding to it (forwarded)",
        "owner": owner.name,
        "forwarder": forwarder.name,
        "leader": leader,
        "partitions": FORWARD_PARTITIONS,
    }
    loads = (
        ("bundles", BUNDLE_MESSAGES, FORWARD_PARTITIONS),
        ("single", 1, PIPELINE),
    )
    for label, per_bundle, in_flight in loads:
        count = args.messages if per_bundle > 1 else args.single_messages
        direct: list[dict[str, float]] = []
        forwarded: list[dict[str, float]] = []
        for i in range(args.rounds):
            direct.append(
                asyncio.run(
                    produce_load(
                        owner, direct_topic, direct_partitions, count, per_bundle, in_flight, nodes
                    )
                )
            )
            forwarded.append(
                asyncio.run(
                    produce_load(
                        forwarder, via_topic, via_partitions, count, per_bundle, in_flight, nodes
                    )
                )
            )
            print(
                f"round {i}, {label} ({per_bundle} x 100 B per produce, {in_flight} in flight): "
                f"to the owner {direct[-1]['messages_per_s']:,} msg/s, "
                f"forwarded {forwarded[-1]['messages_per_s']:,} msg/s "
                f"(servers {direct[-1]['server_cpu_us_per_message']} and "
                f"{forwarded[-1]['server_cpu_us_per_message']} µs CPU/message)",
                flush=True,
            )
        best_direct = max(direct, key=lambda r: r["messages_per_s"])
        best_forwarded = max(forwarded, key=lambda r: r["messages_per_s"])
        result[label] = {
            "messages_per_bundle": per_bundle,
            "in_flight": in_flight,
            "direct": best_direct,
            "forwarded": best_forwarded,
            "ratio_forwarded_to_direct": round(
                best_forwarded["messages_per_s"] / best_direct["messages_per_s"], 3
            ),
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="Smaller counts (~40 s).")
    parser.add_argument("--events", type=int, help="100 B events per lane (default 400,000).")
    parser.add_argument("--large-events", type=int, help="10 KiB events per lane (default 10,000).")
    parser.add_argument("--lanes", type=int, default=3, help="Writer processes at once.")
    parser.add_argument(
        "--messages", type=int, help="TANK messages per bundled forwarding run (default 100,000)."
    )
    parser.add_argument(
        "--single-messages",
        type=int,
        help="TANK single-message produces per forwarding run (default 2,000).",
    )
    parser.add_argument("--rounds", type=int, help="Forwarding rounds (default 3).")
    parser.add_argument(
        "--replication",
        action="store_true",
        help="Instead: produce and paced ack latency on 3 nodes at R = 1, 2, 3.",
    )
    parser.add_argument(
        "--paced-events", type=int, help="Events of each paced latency run (default 50,000)."
    )
    args = parser.parse_args()
    args.paced_events = args.paced_events or (10_000 if args.quick else 50_000)
    args.events = args.events or (50_000 if args.quick else 400_000)
    args.large_events = args.large_events or (2_000 if args.quick else 10_000)
    args.messages = args.messages or (20_000 if args.quick else 100_000)
    args.single_messages = args.single_messages or (500 if args.quick else 2_000)
    args.rounds = args.rounds or (1 if args.quick else 3)
    if not installed():
        raise SystemExit("ZooKeeper is missing: apt-get install zookeeper")

    began = time.monotonic()
    result: dict[str, Any] = {
        "benchmark": "cluster_scale",
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": common.machine(),
        "fsync": "always",
        "lanes": args.lanes,
        "containers": CONTAINERS,
    }
    with tempfile.TemporaryDirectory(prefix="headrace-cluster-") as name:
        tmp = Path(name)
        zookeeper = ZooKeeper(tmp / "zookeeper")
        zookeeper.start()
        nodes: list[Node] = []
        if args.replication:
            try:
                result["replication"] = figures = replication_phase(tmp, zookeeper, args)
            finally:
                zookeeper.stop()
            print(
                f"R=3 / R=1: 100 B {figures['ratio_r3_to_r1_small']}x, 10 KiB "
                f"{figures['ratio_r3_to_r1_large']}x, paced p99 {figures['ratio_r3_to_r1_p99']}x"
            )
            result["seconds"] = round(time.monotonic() - began, 1)
            print(json.dumps(result))
            return
        try:
            nodes, owners, _ = start_cluster(tmp, zookeeper, 1)
            one = scale_phase(nodes, owners, args)
            for node in nodes:
                common.stop(node.proc)
            nodes, owners, leader = start_cluster(tmp, zookeeper, 3)
            three = scale_phase(nodes, owners, args)
            result["forwarding"] = forwarding_phase(nodes, owners, leader, args)
        finally:
            for node in nodes:
                common.stop(node.proc)
            zookeeper.stop()
    result["one_node"], result["three_nodes"] = one, three
    for label in ("small", "large"):
        result[f"ratio_3_to_1_{label}"] = round(
            three[label]["events_per_s"] / one[label]["events_per_s"], 3
        )
    result["load_average"] = round(common.loadavg(), 2)
    result["seconds"] = round(time.monotonic() - began, 1)
    print(
        f"3 nodes / 1 node: 100 B {result['ratio_3_to_1_small']}x, "
        f"10 KiB {result['ratio_3_to_1_large']}x"
    )
    cpus = result["machine"]["cpus"]
    if isinstance(cpus, int) and cpus < 6:
        print(
            f"note: {cpus} cores run every node and writer here, so the ratio shows the "
            "cluster's overhead, not scale over machines"
        )
    forwarding = result["forwarding"]
    print(
        "forwarding (TANK produce through a node without the partitions / through their "
        f"owner): bundles of {BUNDLE_MESSAGES} "
        f"{forwarding['bundles']['ratio_forwarded_to_direct']}x, single messages "
        f"{forwarding['single']['ratio_forwarded_to_direct']}x"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
