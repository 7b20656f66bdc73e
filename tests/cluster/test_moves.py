"""Containers move with their data: a node joining, and a node drained, while a writer writes.

Three ``headrace serve --cluster`` processes on a real ZooKeeper; a stream
whose segments cover every container, each segment created at its owner;
headrace's own ``EventWriter`` appending numbered events under many routing
keys and flushing after each round (what a flush returned for is
acknowledged). A fourth node starts during the writes: placement moves
containers to it one at a time, each with its files (``docs/cluster.md#moves``),
and the writer follows ``WrongHost`` to the new owners. Then the fourth node
is drained (``/drain/n4``) and its containers move back. After each, every
acknowledged event is read back from the owners exactly once and in order
per key, and nothing else is there.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import pytest
from kazoo.client import KazooClient

from headrace.client._conn import RetryPolicy
from headrace.client.controller import ControllerClient
from headrace.client.pravega import PravegaClient
from headrace.cluster.layout import drain_path, encode
from headrace.protocols import pravega as p
from headrace.protocols.pravega.codec import EVENT_HEADER
from headrace.protocols.pravega.controller import ScalingPolicy, Segment, StreamConfig
from headrace.store.disk.layout import ContainerPaths, container_of
from tests._server import FREE, POLL_INTERVAL_S, ServerProcess, ServerStartError
from tests._zookeeper import ZooKeeper
from tests.cluster._nodes import CONTAINERS, health, node_process, start_node

SCOPE: Final = "mv"
STREAM: Final = "st"
SEGMENTS: Final = 12
"""Segments of the stream: their names hash to every one of the 8 containers."""
KEYS: Final = [f"k{n}" for n in range(48)]
"""Routing keys: enough to land on every segment."""
WAIT_S: Final = 60.0
"""Bound on placement settling after a node joins or is drained, and on the
writer getting three rounds through (each move checkpoints, copies and
recovers a container, on two busy cores)."""
RETRY: Final = RetryPolicy(initial_delay_s=0.05, max_delay_s=1.0, max_attempts=0)
"""The writer retries for as long as a move takes: the test's deadlines bound it."""


def views(nodes: dict[str, ServerProcess]) -> dict[str, dict[str, Any]]:
    return {name: health(node)["cluster"] for name, node in nodes.items()}


def placed(seen: dict[str, dict[str, Any]], eligible: set[str]) -> bool:
    """Every node sees the others; every container is owned by exactly one
    node, all on ``eligible`` nodes, balanced over them."""
    if not all(v["joined"] and set(v["nodes"]) == set(seen) for v in seen.values()):
        return False
    owned = [c for v in seen.values() for c in v["owned"]]
    if sorted(owned) != list(range(CONTAINERS)):
        return False
    if any(v["owned"] for name, v in seen.items() if name not in eligible):
        return False
    counts = [len(seen[name]["owned"]) for name in eligible]
    return max(counts) - min(counts) <= 1


async def wait_placed(nodes: dict[str, ServerProcess], eligible: set[str]) -> dict[int, str]:
    """Wait (off the loop, so the writer goes on) until ``placed``; return the owners."""
    deadline = time.monotonic() + WAIT_S
    while True:
        seen = await asyncio.to_thread(views, nodes)
        if placed(seen, eligible):
            return {c: name for name, v in seen.items() for c in v["owned"]}
        assert time.monotonic() < deadline, seen
        await asyncio.sleep(POLL_INTERVAL_S)


class Writer:
    """Numbered events per key, a flush after each round: ``acked[key]`` events
    of each key are acknowledged (numbered 0 to acked - 1)."""

    def __init__(self, client: PravegaClient) -> None:
        self.client = client
        self.task: asyncio.Task[None] | None = None
        self.acked: dict[str, int] = dict.fromkeys(KEYS, 0)
        self.rounds = 0
        self.stop = asyncio.Event()
        self.flushed = asyncio.Event()

    async def run(self) -> None:
        writer = await self.client.create_writer(SCOPE, STREAM)
        try:
            while not self.stop.is_set():
                number = self.rounds
                for key in KEYS:
                    await writer.write(f"{key}:{number}".encode(), key)
                await writer.flush()
                self.rounds += 1
                for key in KEYS:
                    self.acked[key] = number + 1
                self.flushed.set()
        finally:
            await writer.aclose()

    def start(self) -> None:
        self.task = asyncio.create_task(self.run())

    async def rounds_past(self, count: int) -> None:
        """Wait for ``count`` more acknowledged rounds (bounded); a writer that
        failed raises its error here."""
        assert self.task is not None
        target = self.rounds + count
        async with asyncio.timeout(WAIT_S):
            while self.rounds < target:
                self.flushed.clear()
                flushed = asyncio.ensure_future(self.flushed.wait())
                await asyncio.wait([flushed, self.task], return_when=asyncio.FIRST_COMPLETED)
                flushed.cancel()
                if self.task.done():
                    self.task.result()
                    raise AssertionError("the writer stopped")

    async def finish(self) -> None:
        """Stop after the round in course; cancelled if it cannot finish in time."""
        assert self.task is not None
        self.stop.set()
        try:
            async with asyncio.timeout(WAIT_S):
                await asyncio.shield(self.task)
        except TimeoutError:
            self.task.cancel()
            raise


def events(data: bytes) -> Iterator[bytes]:
    position = 0
    while position < len(data):
        kind, length = EVENT_HEADER.unpack_from(data, position)
        assert kind == p.CommandType.EVENT
        position += EVENT_HEADER.size
        yield data[position : position + length]
        position += length


async def read_all(client: PravegaClient) -> dict[str, list[int]]:
    """Every event of every segment, read from its owner: key -> numbers in order."""
    found: dict[str, list[int]] = defaultdict(list)
    for number in range(SEGMENTS):
        segment = Segment(SCOPE, STREAM, number)
        stat = await client.segments.stat(segment)
        data = b""
        while len(data) < stat.length:
            got = await client.segments.read(segment, len(data))
            data += got.data
        keys_here = set()
        for event in events(data):
            key, _, value = event.decode().partition(":")
            found[key].append(int(value))
            keys_here.add(key)
        assert keys_here, f"segment {number} got no event"
    return found


def check(found: dict[str, list[int]], acked: dict[str, int], rounds: int) -> None:
    """Each key: every acknowledged event once, in order, and nothing but events
    written (at most the round in course past the acknowledged ones)."""
    for key in KEYS:
        numbers = found[key]
        assert numbers[: acked[key]] == list(range(acked[key])), key
        assert numbers == list(range(len(numbers))), key
        assert len(numbers) <= rounds + 1, key


async def emptied(data_dir: Path, containers: list[int]) -> None:
    """Wait until a drained node emptied the copies it released (bounded)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        left = [c for c in containers if ContainerPaths(data_dir, c).segment_files()]
        if not left:
            return
        assert time.monotonic() < deadline, f"containers still holding data: {left}"
        await asyncio.sleep(POLL_INTERVAL_S)


@pytest.fixture
def chroot() -> str:
    return f"/moves-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def nodes() -> Iterator[dict[str, ServerProcess]]:
    """The nodes a test starts, all stopped at its end."""
    started: dict[str, ServerProcess] = {}
    try:
        yield started
    finally:
        for node in started.values():
            node.stop()


async def create_stream(node: ServerProcess) -> None:
    """The stream, through ``node``'s controller (the leader's model creates its
    segments at their owners, ``docs/cluster.md#metadata``)."""
    async with ControllerClient(node.uri) as controller:
        await controller.create_scope(SCOPE)
        await controller.create_stream(
            SCOPE, STREAM, StreamConfig(scaling=ScalingPolicy.fixed(SEGMENTS))
        )
    names = [Segment(SCOPE, STREAM, n).name for n in range(SEGMENTS)]
    assert {container_of(n, CONTAINERS) for n in names} == set(range(CONTAINERS))


@pytest.mark.slow
@pytest.mark.timeout(400)
async def test_a_joining_node_and_a_drained_node_move_containers_with_their_data(
    nodes: dict[str, ServerProcess], shared_zookeeper: ZooKeeper, chroot: str, tmp_path: Path
) -> None:
    url = shared_zookeeper.url(chroot)
    three = {"n1", "n2", "n3"}
    for name in sorted(three):
        nodes[name] = start_node(url, tmp_path / name, name)
    await wait_placed(nodes, three)
    await create_stream(nodes["n2"])
    client = PravegaClient(nodes["n1"].uri, retry=RETRY)
    writer = Writer(client)
    writer.start()
    try:
        await writer.rounds_past(3)

        nodes["n4"] = await asyncio.to_thread(start_node, url, tmp_path / "n4", "n4")
        owners = await wait_placed(nodes, three | {"n4"})
        moved = sorted(c for c, owner in owners.items() if owner == "n4")
        assert len(moved) >= 2, owners
        await writer.rounds_past(3)
        # read while n4 owns some: their segments come from n4, whole
        acked = dict(writer.acked)
        found = await read_all(client)
        check(found, acked, writer.rounds)

        zk = KazooClient(hosts=f"{shared_zookeeper.hosts}{chroot}")
        await asyncio.to_thread(zk.start, 30)
        try:
            await asyncio.to_thread(zk.create, drain_path("n4"), encode(None))
        finally:
            await asyncio.to_thread(zk.stop)
            await asyncio.to_thread(zk.close)
        owners = await wait_placed(nodes, three)
        await writer.rounds_past(3)
        await emptied(tmp_path / "n4", moved)
    finally:
        await writer.finish()
    try:
        found = await read_all(client)
        check(found, writer.acked, writer.rounds)
        assert all(writer.acked[key] == writer.rounds for key in KEYS)
    finally:
        await client.aclose()


def test_a_data_dir_with_another_container_count_stops_the_start_with_one_line(
    shared_zookeeper: ZooKeeper, chroot: str, nodes: dict[str, ServerProcess], tmp_path: Path
) -> None:
    """A move carries a disk container as the cluster's container of the same
    number: a node whose data dir has another count would carry other segments."""
    url = shared_zookeeper.url(chroot)
    nodes["n1"] = start_node(url, tmp_path / "n1", "n1")
    other = ServerProcess(
        tmp_path / "n2",
        ports={"controller": FREE, "segment_store": FREE, "http": FREE},
        args=[
            f"--cluster={url}",
            "--node-id=n2",
            "--advertise-host=127.0.0.1",
            "--container-count=4",
        ],
    )
    with pytest.raises(ServerStartError) as failed:
        other.start()
    log = other.log_text()
    assert "Traceback" not in log
    (line,) = [line for line in log.splitlines() if "the data dir has 4 containers" in line]
    assert "the cluster 8" in line, failed.value


def secret_node(url: str, data_dir: Path, name: str, secret: Path) -> ServerProcess:
    """A node with its own ``--cluster-secret-file``, not started yet."""
    return node_process(url, data_dir, name, extra=[f"--cluster-secret-file={secret}"])


def secret_file(path: Path) -> Path:
    path.write_bytes(os.urandom(32))
    path.chmod(0o600)
    return path


async def wait_view(node: ServerProcess, check: Callable[[dict[str, Any]], bool]) -> None:
    deadline = time.monotonic() + WAIT_S
    while True:
        view = (await asyncio.to_thread(health, node))["cluster"]
        if check(view):
            return
        assert time.monotonic() < deadline, view
        await asyncio.sleep(POLL_INTERVAL_S)


@pytest.mark.slow
@pytest.mark.timeout(400)
async def test_a_released_copy_survives_its_old_owners_restart_until_it_is_fetched(
    nodes: dict[str, ServerProcess], shared_zookeeper: ZooKeeper, chroot: str, tmp_path: Path
) -> None:
    """n2 joins with a cluster secret of its own, so n1 refuses it the copy of the
    container n1 released to it: the container waits, ``RELEASED`` to n2. n1
    restarts meanwhile (it opens that copy again, but does not serve it). n2,
    restarted with the cluster's secret, then fetches the copy from the
    restarted n1 and every acknowledged event is there."""
    url = shared_zookeeper.url(chroot)
    secret = secret_file(tmp_path / "cluster.secret")
    nodes["n1"] = secret_node(url, tmp_path / "n1", "n1", secret).start()
    await wait_view(nodes["n1"], lambda v: v["owned"] == list(range(CONTAINERS)))
    await create_stream(nodes["n1"])
    client = PravegaClient(nodes["n1"].uri, retry=RETRY)
    try:
        writer = Writer(client)
        writer.start()
        try:
            await writer.rounds_past(3)
        finally:
            await writer.finish()

        wrong = secret_file(tmp_path / "other.secret")
        n2 = nodes["n2"] = secret_node(url, tmp_path / "n2", "n2", wrong)
        await asyncio.to_thread(n2.start)
        # one container released to n2, which cannot fetch it; nothing else moves
        await wait_view(nodes["n1"], lambda v: len(v["owned"]) == CONTAINERS - 1)
        await asyncio.to_thread(nodes["n1"].wait_for_line, "refused a request")
        await asyncio.to_thread(nodes["n1"].stop)
        await asyncio.to_thread(nodes["n1"].start)
        await wait_view(nodes["n1"], lambda v: len(v["owned"]) == CONTAINERS - 1)
        await asyncio.to_thread(n2.stop)
        nodes["n2"] = secret_node(url, tmp_path / "n2", "n2", secret)
        await asyncio.to_thread(nodes["n2"].start)
        await wait_placed(nodes, {"n1", "n2"})
        found = await read_all(client)
        check(found, writer.acked, writer.rounds)
        assert all(writer.acked[key] == writer.rounds for key in KEYS)
    finally:
        await client.aclose()
