"""Faults of a real cluster: a killed node, a paused node, a restarted ZooKeeper.

Three ``headrace serve --cluster`` processes on a real ZooKeeper (the shared
one, or a test's own when the test restarts it), written to by our own
client through the segment store (``getURI`` per segment, ``WrongHost``
followed) or by raw segment-store requests. What must hold
(``docs/cluster.md#fencing``, ``#killed-node``):

* a killed node's containers are served by nobody until it is back: the
  other nodes answer ``WrongHost`` with no host, never data and never the
  dead node's address; back under the same id and data dir, it serves every
  event it acknowledged, and the writer's events arrive exactly once;
* a node paused past its ZooKeeper session acknowledges nothing for the
  containers it lost, not even the appends that waited in its socket while it
  was paused; it rejoins and serves again;
* when ZooKeeper goes down, each node serves its containers on while its
  lease lasts (its session lives on at ZooKeeper), then nothing; once
  ZooKeeper is back, every node re-claims its containers and writes go on.

Every wait polls under a deadline; the tests that restart processes are slow.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Final

import pytest

from headrace.client._conn import RetryPolicy
from headrace.client.controller import ControllerClient
from headrace.client.pravega import PravegaClient
from headrace.client.writer import EventWriter
from headrace.errors import ClientError
from headrace.protocols import pravega as p
from headrace.protocols.pravega.controller import ScalingPolicy, Segment, StreamConfig
from headrace.store.disk.layout import container_of
from tests._server import POLL_INTERVAL_S, ServerProcess
from tests._zookeeper import ZooKeeper
from tests.cluster._nodes import CONTAINERS, owners, settled, start_node, views
from tests.cluster.test_serve import NODES, WAIT_S

pytestmark = pytest.mark.slow

EVENTS_BEFORE: Final = 200
"""Events acknowledged before the fault: the writer is well under way."""
EVENTS_AFTER: Final = 200
"""Events acknowledged after recovery: the writer goes on."""
IN_FLIGHT: Final = 50
"""Events the writer keeps unacknowledged at most (it waits for the oldest)."""
PAUSED_APPENDS: Final = 40
"""Appends sent to the paused node before its session expired, and as many after:
each is a chance for a resumed node to act on its stale view."""
UNLIMITED: Final = RetryPolicy(max_attempts=0)
"""The writer retries until the node is back; each test bounds the whole."""
CLOSE_S: Final = 10.0
"""Bound on closing the writer after a failed test (its events may never be stored)."""


def wait_until(check: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout_s:g} s: {what}"
        time.sleep(POLL_INTERVAL_S)


async def wait_until_async(check: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    """``wait_until`` for checks whose progress needs this loop to run (a writer's acks)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout_s:g} s: {what}"
        await asyncio.sleep(POLL_INTERVAL_S)


def others_see(nodes: dict[str, ServerProcess], gone: str, present: bool) -> bool:
    """Whether every node but ``gone`` lists ``gone`` as live (``present``) or not."""
    seen = views({name: node for name, node in nodes.items() if name != gone})
    return all((gone in v["nodes"]) is present for v in seen.values())


@pytest.fixture
def cluster_nodes(tmp_path: Path) -> Iterator[Callable[[str], dict[str, ServerProcess]]]:
    """Starts three nodes on a ZooKeeper URL and waits until they settled; stops them."""
    started: dict[str, ServerProcess] = {}

    def start(url: str) -> dict[str, ServerProcess]:
        for name in NODES:
            started[name] = start_node(url, tmp_path / name, name)
        wait_until(lambda: settled(views(started)), "the cluster settled")
        return started

    try:
        yield start
    finally:
        for node in started.values():
            node.stop()


class Writer:
    """Our client's writer on one stream, writing numbered events in the background,
    at most ``IN_FLIGHT`` unacknowledged; ``acked`` counts the events stored."""

    def __init__(self, writer: EventWriter) -> None:
        self.writer = writer
        self.sent: list[bytes] = []
        self.acked = 0
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        pending: list[asyncio.Future[None]] = []
        while not self._stop.is_set():
            event = f"event-{len(self.sent):06d}".encode()
            self.sent.append(event)
            pending.append(await self.writer.write_future(event))
            if len(pending) >= IN_FLIGHT:
                await pending.pop(0)
                self.acked += 1
        for future in pending:
            await future
            self.acked += 1

    async def finish(self) -> list[bytes]:
        """Stop writing, wait until every event written is stored; all of them."""
        self._stop.set()
        await self._task
        await self.writer.flush()
        return self.sent


@asynccontextmanager
async def writing(
    nodes: dict[str, ServerProcess], via: str, scope: str, stream: str
) -> AsyncIterator[tuple[PravegaClient, Writer]]:
    """A ``Writer`` on ``scope/stream`` (one segment), its client talking to ``via``'s
    controller.

    Each node's controller keeps its own streams (``docs/cluster.md#serving``):
    the stream is created through ``via``'s controller (for the writer) and
    through the controller of its segment's owner (whose store must hold it).
    """
    owner = owners(nodes)[container_of(Segment(scope, stream, 0).name, CONTAINERS)]
    for name in {via, owner}:
        async with ControllerClient(nodes[name].uri) as controller:
            await controller.create_scope(scope)
            await controller.create_stream(scope, stream, StreamConfig(ScalingPolicy.fixed(1)))
    async with PravegaClient(nodes[via].uri, retry=UNLIMITED) as client:
        writer = Writer(await client.create_writer(scope, stream))
        try:
            yield client, writer
        finally:
            if not writer._task.done():
                writer._task.cancel()
            # after a failure the events may never be stored: close without waiting long
            with contextlib.suppress(TimeoutError, ClientError):
                async with asyncio.timeout(CLOSE_S):
                    await writer.writer.aclose()


async def read_stream(client: PravegaClient, scope: str, stream: str) -> list[bytes]:
    async with client.record_reader(scope, stream) as reader:
        return [r.value async for r in reader]


def stream_on(nodes: dict[str, ServerProcess], wanted: Callable[[str], bool]) -> str:
    """A stream name whose one segment's container is owned by a node ``wanted`` accepts."""
    owner_of = owners(nodes)
    for i in range(256):
        if wanted(owner_of[container_of(Segment("sc", f"s{i}", 0).name, CONTAINERS)]):
            return f"s{i}"
    raise AssertionError(f"no stream on the wanted nodes: {owner_of}")


class RawConnection:
    """A segment-store connection sending raw requests; a closed connection is an answer."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.conn = p.PravegaConnection(p.Role.CLIENT)

    @classmethod
    async def open(cls, port: int) -> RawConnection:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), WAIT_S)
        raw = cls(reader, writer)
        await raw.send()
        assert isinstance(await raw.recv(), p.Hello)
        return raw

    async def send(self, *cmds: p.Command) -> None:
        for cmd in cmds:
            self.conn.send(cmd)
        self.writer.write(self.conn.data_to_send())
        await self.writer.drain()

    async def recv(self) -> p.Command | None:
        """The next reply; None when the server closed the connection."""
        while True:
            event = self.conn.next_event()
            if event is not None:
                assert isinstance(event, p.Command), event
                return event
            data = await asyncio.wait_for(self.reader.read(1 << 20), WAIT_S)
            if not data:
                return None
            self.conn.receive_data(data)

    async def request(self, cmd: p.Command) -> p.Command | None:
        await self.send(cmd)
        return await self.recv()

    def close(self) -> None:
        self.writer.close()


def append(writer_id: uuid.UUID, first: int, count: int, rid: int) -> p.AppendBlockEnd:
    """Events ``first`` .. ``first + count - 1`` of a writer, in one append."""
    data = b"".join(p.encode_event(f"e{n}".encode()) for n in range(first, first + count))
    return p.AppendBlockEnd(writer_id, len(data), data, count, first + count - 1, rid)


# --------------------------------------------------------------------------- kill -9


async def test_a_killed_node_comes_back_with_everything_it_acknowledged(
    shared_zookeeper: ZooKeeper, cluster_nodes: Callable[[str], dict[str, ServerProcess]]
) -> None:
    nodes = cluster_nodes(shared_zookeeper.url(f"/kill-{uuid.uuid4().hex[:12]}"))
    # The victim neither leads nor holds the controller's tables (container 0): with
    # one copy, killing either would stop the metadata until it returns.
    boss = next(iter(views(nodes).values()))["leader"]
    victim = next(n for n in NODES if n not in {boss, owners(nodes)[0]})
    stream = stream_on(nodes, lambda owner: owner == victim)
    segment = Segment("sc", stream, 0)
    its_containers = sorted(c for c, n in owners(nodes).items() if n == victim)
    others = [n for n in NODES if n != victim]
    entry = others[0]
    async with asyncio.timeout(4 * WAIT_S), writing(nodes, entry, "sc", stream) as (client, w):
        await wait_until_async(lambda: w.acked >= EVENTS_BEFORE, "events before the kill")
        nodes[victim].kill()
        # Until its session expires, the others still name it; then nobody serves its
        # containers, and they say so instead of naming a dead node.
        await asyncio.to_thread(
            wait_until, lambda: others_see(nodes, victim, present=False), "its session expired"
        )
        acked = w.acked
        for name in others:
            raw = await RawConnection.open(nodes[name].port_of("segment_store"))
            try:
                reply = await raw.request(p.GetStreamSegmentInfo(1, segment.name, ""))
                assert reply == p.WrongHost(1, segment.name, "", ""), name
                reply = await raw.request(p.SetupAppend(2, uuid.uuid4(), segment.name, ""))
                assert reply == p.WrongHost(2, segment.name, "", ""), name
            finally:
                raw.close()
            async with ControllerClient(nodes[name].uri) as controller:
                # getURI (answered by the leader) names a live node's store, which
                # answers WrongHost, never the dead node's
                uri = await controller.get_uri(segment)
                live = {("127.0.0.1", nodes[n].port_of("segment_store")) for n in others}
                assert uri in live, (name, uri)
        assert w.acked == acked  # nothing is acknowledged while nobody serves it

        await asyncio.to_thread(nodes[victim].start)  # same node id, ports and data dir
        await asyncio.to_thread(
            wait_until,
            lambda: views({victim: nodes[victim]})[victim]["owned"] == its_containers,
            "the restarted node re-claimed its containers",
        )
        await wait_until_async(lambda: w.acked >= acked + EVENTS_AFTER, "events after the restart")
        written = await w.finish()
        assert await read_stream(client, "sc", stream) == written  # each exactly once, in order


# --------------------------------------------------------------------------- SIGSTOP


async def test_a_paused_node_acknowledges_nothing_for_the_containers_it_lost(
    shared_zookeeper: ZooKeeper, cluster_nodes: Callable[[str], dict[str, ServerProcess]]
) -> None:
    nodes = cluster_nodes(shared_zookeeper.url(f"/pause-{uuid.uuid4().hex[:12]}"))
    victim = "n2"
    its_containers = sorted(c for c, n in owners(nodes).items() if n == victim)
    assert its_containers
    name = Segment("sc", stream_on(nodes, lambda owner: owner == victim), 0).name
    port = nodes[victim].port_of("segment_store")
    process = nodes[victim].process
    assert process is not None
    pid = process.pid
    writer_id = uuid.uuid4()
    async with asyncio.timeout(4 * WAIT_S):
        raw = await RawConnection.open(port)
        try:
            assert await raw.request(p.CreateSegment(1, name, 0, 0)) == p.SegmentCreated(1, name)
            setup = await raw.request(p.SetupAppend(2, writer_id, name, ""))
            assert setup == p.AppendSetup(2, name, writer_id, p.NULL_ATTRIBUTE_VALUE)
            reply = await raw.request(append(writer_id, 1, 3, 3))
            assert isinstance(reply, p.DataAppended) and reply.event_number == 3

            os.kill(pid, signal.SIGSTOP)
            try:
                # Appends wait in its socket, from before and after its session expired.
                early = range(PAUSED_APPENDS)
                await raw.send(*(append(writer_id, 4 + i, 1, 10 + i) for i in early))
                await asyncio.to_thread(
                    wait_until,
                    lambda: others_see(nodes, victim, present=False),
                    "the paused node's session expired",
                )
                late = range(PAUSED_APPENDS, 2 * PAUSED_APPENDS)
                await raw.send(*(append(writer_id, 4 + i, 1, 10 + i) for i in late))
            finally:
                os.kill(pid, signal.SIGCONT)
            replies = []
            while len(replies) < 2 * PAUSED_APPENDS and (reply := await raw.recv()) is not None:
                replies.append(reply)
        finally:
            raw.close()
        acked = [r for r in replies if not isinstance(r, p.WrongHost)]
        assert acked == [], acked  # WrongHost or a closed connection: never an ack

        await asyncio.to_thread(
            wait_until,
            lambda: views({victim: nodes[victim]})[victim]["owned"] == its_containers,
            "the paused node rejoined and re-claimed its containers",
        )
        raw = await RawConnection.open(port)
        try:
            setup = await raw.request(p.SetupAppend(6, writer_id, name, ""))
            assert setup == p.AppendSetup(6, name, writer_id, 3)  # nothing after 3 was stored
            reply = await raw.request(append(writer_id, 4, 3, 7))
            assert isinstance(reply, p.DataAppended) and reply.event_number == 6
            info = await raw.request(p.GetStreamSegmentInfo(8, name, ""))
            expected = sum(len(p.encode_event(f"e{n}".encode())) for n in range(1, 7))
            assert isinstance(info, p.StreamSegmentInfo) and info.write_offset == expected
        finally:
            raw.close()


# --------------------------------------------------------------------------- ZooKeeper restart


async def test_a_zookeeper_restart_is_served_through_the_lease_then_fenced_then_reclaimed(
    zookeeper: ZooKeeper, cluster_nodes: Callable[[str], dict[str, ServerProcess]]
) -> None:
    """(``docs/cluster.md#fencing``) The moment ZooKeeper dies, each node keeps
    serving its containers (the writer's appends are still acknowledged) while
    its lease lasts; a ZooKeeper down longer than that fences every node; once
    it is back, each node re-claims the containers it had, and the writer goes on."""
    nodes = cluster_nodes(zookeeper.url("/restart"))
    before = owners(nodes)
    stream = stream_on(nodes, lambda owner: True)
    segment = Segment("sc", stream, 0)
    async with asyncio.timeout(4 * WAIT_S), writing(nodes, "n1", "sc", stream) as (client, w):
        await wait_until_async(lambda: w.acked >= EVENTS_BEFORE, "events before the restart")
        await asyncio.to_thread(zookeeper.kill)
        at_kill = w.acked
        # Within the lease (two thirds of the test ZooKeeper's 4 s session, less the
        # age of the last heartbeat), the owner goes on acknowledging.
        await wait_until_async(
            lambda: w.acked >= at_kill + 10, "acks right after ZooKeeper died", timeout_s=2.0
        )
        await asyncio.to_thread(
            wait_until,
            lambda: all(v["owned"] == [] for v in views(nodes).values()),
            "every node fenced",
        )
        acked = w.acked
        for name, node in nodes.items():
            raw = await RawConnection.open(node.port_of("segment_store"))
            try:
                reply = await raw.request(p.GetStreamSegmentInfo(1, segment.name, ""))
                assert reply == p.WrongHost(1, segment.name, "", ""), name
            finally:
                raw.close()
        assert w.acked == acked  # nothing is acknowledged while every node is fenced

        await asyncio.to_thread(zookeeper.start)  # same port, same data (its log kept)
        await asyncio.to_thread(
            wait_until,
            lambda: settled(views(nodes)) and owners(nodes) == before,
            "every node re-claimed its containers",
        )
        await wait_until_async(lambda: w.acked >= acked + EVENTS_AFTER, "events after the restart")
        written = await w.finish()
        assert await read_stream(client, "sc", stream) == written
