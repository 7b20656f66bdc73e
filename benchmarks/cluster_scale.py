"""Cluster scale: durable produce over 1 node and over 3 nodes, and what forwarding costs.

Run: ``.venv/bin/python benchmarks/cluster_scale.py [--quick]``
(``--events N`` 100-byte events per lane, ``--large-events N`` 10 KiB events
per lane, ``--lanes L``, ``--rounds R`` of the forwarding comparison).

Starts one ZooKeeper (the Debian ``zookeeper`` package, ``_zookeeper.py``),
then, in the same run:

* **1 node, then 3 nodes**: ``headrace serve --cluster ... --fsync always``
  nodes (``always`` is serve's default: an ack means on disk; a fresh chroot
  each), settled (every container owned, balanced).
  ``--lanes`` writer processes start together; each writes its events to a
  1-segment stream of its own with the project's ``EventWriter``, then
  flushes. A lane's stream is created through the controller of the node
  that owns its segment's container, and its writer talks to that node
  (each node keeps its own controller metadata for now, ``docs/cluster.md``),
  so lanes are spread over the nodes as the containers are. The figure is
  every lane's events over the time from the first lane's start to the last
  lane's flush: events/s and MB/s of payload, 100 B then 10 KiB, and the
  ratio 3 nodes / 1 node. The nodes' CPU per event is reported beside it.
  Every node and every writer shares this machine's cores: on a 2-core
  machine three nodes cannot run in parallel, so the ratio shows the
  cluster's overhead, not how it scales over machines.
* **Forwarding**: no door of ``headrace serve`` forwards yet, so a
  forwarding node is emulated by ``_forwarder.py``: the same ``ServerApp``
  on a ``RoutedStore`` that sends the benchmark's segments to the 1-node
  cluster's node (their owner) over the segment-store wire, as a node does
  for segments another node owns. One lane writes 100 B events through the
  forwarder, and one writes straight to the owner, ``--rounds`` times in
  alternation; the best of each, and the ratio forwarded / direct.

The last line printed is one JSON object with every figure. Nothing here
asserts speed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import _common as common

from _zookeeper import ZooKeeper, installed
from headrace.client import PravegaClient, ScalingPolicy, StreamConfig
from headrace.client.cluster import ClusterAdminClient
from headrace.client.controller import Segment
from headrace.errors import ClientError
from headrace.store.disk.layout import container_of

HERE = Path(__file__).resolve().parent
SMALL_BYTES = 100
LARGE_BYTES = 10 * 1024
CONTAINERS = 12
"""Containers of each cluster: a multiple of 1 and 3, so the nodes are even."""
SETTLE_TIMEOUT_S = 60.0
LANE_TIMEOUT_S = 600.0

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


class Node:
    """One ``headrace serve`` child: its process and ports."""

    def __init__(self, proc: subprocess.Popen[bytes], name: str, ports: dict[str, int]) -> None:
        self.proc = proc
        self.name = name
        self.ports = ports

    @property
    def uri(self) -> str:
        return f"tcp://127.0.0.1:{self.ports['controller']}"


def start_node(data_dir: Path, url: str, name: str) -> Node:
    ports = {"controller": common.free_port(), "segment-store": common.free_port()}
    command = [sys.executable, "-m", "headrace", "serve", "--data-dir", str(data_dir)]
    command += ["--fsync", "always", f"--cluster={url}", f"--node-id={name}"]
    command += ["--advertise-host=127.0.0.1", f"--container-count={CONTAINERS}"]
    for listener in common.LISTENERS:
        command += [f"--{listener}-port", str(ports.get(listener, 0))]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + common.START_TIMEOUT_S
    for port in ports.values():
        common.wait_connectable(proc, port, deadline)
    return Node(proc, name, ports)


def start_forwarder(data_dir: Path, owner: Node, prefix: str) -> Node:
    ports = {"controller": common.free_port(), "segment-store": common.free_port()}
    owner_store = f"127.0.0.1:{owner.ports['segment-store']}"
    command = [sys.executable, str(HERE / "_forwarder.py"), str(data_dir)]
    command += [str(ports["controller"]), str(ports["segment-store"]), owner_store, prefix]
    with (data_dir.parent / "forwarder.log").open("ab") as log:
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + common.START_TIMEOUT_S
    for port in ports.values():
        common.wait_connectable(proc, port, deadline)
    return Node(proc, "forwarder", ports)


async def settle(nodes: list[Node]) -> dict[int, str]:
    """Wait until every node sees every container owned, evenly; container -> owner."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    names = sorted(node.name for node in nodes)
    while True:
        views = []
        try:
            for node in nodes:
                async with ClusterAdminClient(node.uri) as admin:
                    views.append(await admin.status())
        except ClientError:  # a node whose doors listen before it joined
            views = []
        if not views:
            await asyncio.sleep(0.1)
            continue
        owners = [{c["container"]: c["owner"] for c in v["containers"]} for v in views]
        states = {c["state"] for v in views for c in v["containers"]}
        alive = [sorted(n["id"] for n in v["nodes"] if n["alive"]) for v in views]
        counts = [list(owners[0].values()).count(name) for name in names]
        if (
            states == {"OWNED"}
            and all(o == owners[0] for o in owners)
            and all(a == names for a in alive)
            and max(counts) - min(counts) <= 1
        ):
            return owners[0]
        if time.monotonic() > deadline:
            raise SystemExit(f"the cluster did not settle within {SETTLE_TIMEOUT_S:.0f} s")
        await asyncio.sleep(0.1)  # polling the nodes' views under a deadline


async def owned_stream(node: Node, owners: dict[int, str] | None, scope: str, stem: str) -> str:
    """A new 1-segment stream whose segment ``node`` owns, created through ``node``'s controller."""
    for k in range(10_000):
        stream = f"{stem}-{k}"
        container = container_of(Segment(scope, stream, 0).name, CONTAINERS)
        if owners is None or owners[container] == node.name:
            break
    async with PravegaClient(node.uri) as client:
        await client.controller.create_scope(scope)
        await client.controller.create_stream(scope, stream, StreamConfig(ScalingPolicy.fixed(1)))
    return stream


def run_lanes(
    lanes: list[tuple[Node, str, str]], count: int, size: int, also: tuple[Node, ...] = ()
) -> dict[str, float]:
    """Start a writer per ``(node, scope, stream)``, let them go together, and time them.

    The servers' CPU counts the lanes' nodes and ``also`` (an owner behind a forwarder).
    """
    procs = []
    for node, scope, stream in lanes:
        command = [sys.executable, "-c", WRITER_CHILD, node.uri, scope, stream]
        command += [str(count), str(size)]
        procs.append(
            subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        )
    try:
        for proc in procs:
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "ready":
                raise SystemExit(f"a writer failed to set up (exit {proc.wait(LANE_TIMEOUT_S)})")
        servers = [node for node, _, _ in lanes] + list(also)
        cpu_before = {node.proc.pid: common.cpu_s(node.proc.pid) for node in servers}
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
    events = count * len(lanes)
    return {
        "events": events,
        "seconds": round(seconds, 3),
        "events_per_s": round(events / seconds),
        "mb_per_s": round(events * size / seconds / 1e6, 2),
        "server_cpu_us_per_event": round(server_cpu * 1e6 / events, 1),
        "writer_cpu_us_per_event": round(sum(r["cpu_s"] for r in results) * 1e6 / events, 1),
    }


def scale_phase(
    tmp: Path, zookeeper: ZooKeeper, size_of_cluster: int, args: argparse.Namespace
) -> tuple[dict[str, Any], list[Node]]:
    """Produce over a cluster of ``size_of_cluster`` nodes; the figures and the nodes (running)."""
    url = zookeeper.url(f"/scale-{size_of_cluster}")
    nodes: list[Node] = []
    for i in range(size_of_cluster):
        name = f"n{i + 1}"
        nodes.append(start_node(tmp / f"c{size_of_cluster}-{name}", url, name))
    owners = asyncio.run(settle(nodes))
    figures: dict[str, Any] = {"nodes": size_of_cluster}
    for label, size, count in (
        ("small", SMALL_BYTES, args.events),
        ("large", LARGE_BYTES, args.large_events),
    ):
        lanes = []
        for lane in range(args.lanes):
            node = nodes[lane % len(nodes)]
            stream = asyncio.run(owned_stream(node, owners, "bench", f"{label}-{lane}"))
            lanes.append((node, "bench", stream))
        figures[label] = run_lanes(lanes, count, size)
        row = figures[label]
        print(
            f"{size_of_cluster} node{'s' if size_of_cluster > 1 else ''}, {size:>6} B: "
            f"{row['events_per_s']:>9,} events/s {row['mb_per_s']:>8.2f} MB/s "
            f"(servers {row['server_cpu_us_per_event']} µs CPU/event)",
            flush=True,
        )
    return figures, nodes


def forwarding_phase(tmp: Path, owner: Node, args: argparse.Namespace) -> dict[str, Any]:
    forwarder = start_forwarder(tmp / "forwarder", owner, "fwd/")
    direct: list[dict[str, float]] = []
    forwarded: list[dict[str, float]] = []
    try:
        for i in range(args.rounds):
            stream = asyncio.run(owned_stream(owner, None, "fwd", f"direct{i}"))
            direct.append(run_lanes([(owner, "fwd", stream)], args.events, SMALL_BYTES))
            stream = asyncio.run(owned_stream(forwarder, None, "fwd", f"via{i}"))
            forwarded.append(
                run_lanes([(forwarder, "fwd", stream)], args.events, SMALL_BYTES, (owner,))
            )
            print(
                f"round {i}: 100 B to the owner {direct[-1]['events_per_s']:,} events/s, "
                f"through a forwarding node {forwarded[-1]['events_per_s']:,} events/s "
                f"(servers {direct[-1]['server_cpu_us_per_event']} and "
                f"{forwarded[-1]['server_cpu_us_per_event']} µs CPU/event)",
                flush=True,
            )
    except SystemExit:
        log = (tmp / "forwarder.log").read_text(errors="replace")
        print(f"the forwarder's log ends:\n{log[-3000:]}", file=sys.stderr)
        raise
    finally:
        common.stop(forwarder.proc)
    best_direct = max(direct, key=lambda r: r["events_per_s"])
    best_forwarded = max(forwarded, key=lambda r: r["events_per_s"])
    return {
        "measured": "EventWriter through _forwarder.py (ServerApp on a RoutedStore) vs "
        "straight to the owner node",
        "direct": best_direct,
        "forwarded": best_forwarded,
        "ratio_forwarded_to_direct": round(
            best_forwarded["events_per_s"] / best_direct["events_per_s"], 3
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="Smaller counts (~40 s).")
    parser.add_argument("--events", type=int, help="100 B events per lane (default 400,000).")
    parser.add_argument("--large-events", type=int, help="10 KiB events per lane (default 10,000).")
    parser.add_argument("--lanes", type=int, default=3, help="Writer processes at once.")
    parser.add_argument("--rounds", type=int, help="Forwarding rounds (default 3).")
    args = parser.parse_args()
    args.events = args.events or (50_000 if args.quick else 400_000)
    args.large_events = args.large_events or (2_000 if args.quick else 10_000)
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
        try:
            one, nodes = scale_phase(tmp, zookeeper, 1, args)
            result["forwarding"] = forwarding_phase(tmp, nodes[0], args)
            for node in nodes:
                common.stop(node.proc)
            three, nodes = scale_phase(tmp, zookeeper, 3, args)
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
    print(
        "forwarding (100 B, one lane; a forwarding node emulated by _forwarder.py): "
        f"forwarded / direct {result['forwarding']['ratio_forwarded_to_direct']}x"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
