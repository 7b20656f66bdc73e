"""A segment whose owner cannot be reached gets every door's retriable answer.

In a cluster a store call can end with ``OwnerUnavailable``: the segment's
owner (another node) did not answer, or nobody owns it while its container
moves. The server here is ``headrace serve``'s own (``unowned_server.py``)
on a ``RoutedStore`` whose placement finds no owner for the segments under a
prefix while a flag file names it, over real sockets; each door answers the
way its clients retry, and serves again once the segment has an owner:

* segment store: ``WrongHost`` (Java's answer for a container not on this
  host; the client asks the controller again), the connection open;
* TANK: ``NO_LEADER`` for produce, consume and partition discovery;
* Lumberjack: no ack, the connection closed (logged as ``unavailable``); the
  client sends the window again;
* RS-IO: ``onError`` whose reason says to try again.

Every wait is bounded; nothing sleeps to synchronise.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

from headrace.client import PravegaClient
from headrace.client.rsio import RsioClient, RsioError
from headrace.client.tank import TankClient
from headrace.cluster.remote import RemoteStore
from headrace.errors import OwnerUnavailable
from headrace.protocols import pravega as p
from headrace.protocols import tank as t
from headrace.protocols.lumberjack import JsonData, ProtocolVersion, WindowSize
from tests._server import ServerProcess, free_port
from tests.lumberjack.harness import LumberjackClient, stored_events
from tests.server.test_pravega_server import Raw

HERE: Final = Path(__file__).resolve().parent
WAIT_S: Final = 20.0
"""Bound on every wait a test expects to end."""
LISTENERS: Final = ("controller", "segment_store", "tank", "lumberjack", "rsio")


class Node:
    """The server, and the switch that takes the owner of segments away."""

    def __init__(self, server: ServerProcess, flag: Path) -> None:
        self.server = server
        self.flag = flag

    def port(self, listener: str) -> int:
        return self.server.port_of(listener)

    @contextlib.contextmanager
    def unowned(self, prefix: str) -> Iterator[None]:
        """Segments under ``prefix`` have no owner inside the block."""
        self.flag.write_text(prefix)
        try:
            yield
        finally:
            self.flag.unlink()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    flag = tmp_path / "unowned"
    server = ServerProcess(
        tmp_path / "data",
        ports={name: free_port() for name in LISTENERS},
        runner=[str(HERE / "unowned_server.py"), str(flag)],
    )
    with server:
        yield Node(server, flag)
    assert "Traceback" not in server.log_text(), server.log_text()


def test_segment_store_answers_wrong_host(node: Node) -> None:
    """Every request on an unowned segment, appends included, gets ``WrongHost``
    (no correct host: ask the controller); the connection serves others; a
    forwarding node sees a retriable ``OwnerUnavailable``."""
    away, here = "sc/away/0.#epoch.0", "sc/here/0.#epoch.0"
    port = node.port("segment_store")

    async def check() -> None:
        raw = await Raw.connect(port)
        remote = RemoteStore(("127.0.0.1", port))
        try:
            for rid, name in enumerate((away, here), 1):
                assert await raw.request(p.CreateSegment(rid, name, 0, 0)) == p.SegmentCreated(
                    rid, name
                )
            writer = uuid.uuid4()
            assert isinstance(await raw.request(p.SetupAppend(3, writer, away)), p.AppendSetup)
            one = p.encode_event(b"one")
            appended = await raw.request(p.AppendBlockEnd(writer, len(one), one, 1, 1, 4))
            assert isinstance(appended, p.DataAppended), appended
            with node.unowned("sc/away/"):
                two = p.encode_event(b"two")
                for cmd in (
                    p.AppendBlockEnd(writer, len(two), two, 1, 2, 5),
                    p.GetStreamSegmentInfo(6, away),
                    p.ReadSegment(away, 0, 100, "", 7),
                    p.SetupAppend(8, uuid.uuid4(), away),
                    p.SealSegment(9, away),
                ):
                    assert await raw.request(cmd) == p.WrongHost(
                        cmd.request_id_or_default, away, "", ""
                    ), cmd
                info = await raw.request(p.GetStreamSegmentInfo(10, here))
                assert isinstance(info, p.StreamSegmentInfo) and info.exists, info
                with pytest.raises(OwnerUnavailable) as caught:
                    await remote.append(away, b"forwarded")
                assert caught.value.reason == "its owner cannot serve it"
            # Owned again: the writer sets up anew, as the client does after WrongHost.
            again = await Raw.connect(port)
            try:
                setup = await again.request(p.SetupAppend(11, writer, away))
                assert setup == p.AppendSetup(11, away, writer, 1)
                appended = await again.request(p.AppendBlockEnd(writer, len(two), two, 1, 2, 12))
                assert isinstance(appended, p.DataAppended), appended
                read = await again.request(p.ReadSegment(away, 0, 100, "", 13))
                assert isinstance(read, p.SegmentRead) and bytes(read.data) == one + two
            finally:
                await again.aclose()
        finally:
            await remote.close()
            await raw.aclose()

    asyncio.run(check())


def test_tank_answers_no_leader(node: Node) -> None:
    """Produce, consume and partition discovery on an unowned partition get
    ``NO_LEADER``; once it has an owner again, the produce retried is stored."""
    messages = [t.BundleMessage(b"first", 1_700_000_000_000)]
    again = [t.BundleMessage(b"retried", 1_700_000_000_001)]

    async def check() -> None:
        client = await TankClient.connect("127.0.0.1", node.port("tank"))
        try:
            assert await client.create_topic("away", 1) is t.CreateTopicResult.CREATED
            await client.produce("away", 0, messages)
            with node.unowned("tank/away/"):
                bundle = t.encode_bundle(again)
                assert await client.produce_bundle("away", 0, bundle) is t.ProduceError.NO_LEADER
                consumed = await client.consume("away", 0, 1)
                assert consumed.error is t.ConsumeError.NO_LEADER
                assert consumed.messages == ()
                partitions = await client.discover_partitions("away")
                assert partitions is not None
                assert [entry.error for entry in partitions] == [
                    t.DiscoverPartitionsError.NO_LEADER
                ]
            await client.produce("away", 0, again)
            consumed = await client.consume("away", 0, 1)
            assert [m.content for m in consumed.messages] == [b"first", b"retried"]
        finally:
            await client.aclose()

    asyncio.run(check())


def _window(start: int, *docs: str) -> list[object]:
    events = [JsonData(start + i, json.dumps({"message": d}).encode()) for i, d in enumerate(docs)]
    return [WindowSize(len(events)), *events]


def test_lumberjack_closes_without_the_ack(node: Node) -> None:
    """A window for an unowned stream is not acknowledged: the connection closes
    (access reason ``unavailable``); the client's resend, once the stream has an
    owner, is stored, and nothing of the refused attempt is."""
    port = node.port("lumberjack")
    with LumberjackClient(port, ProtocolVersion.V2) as client:
        client.send(*_window(1, "before"))  # type: ignore[arg-type]
        client.wait_for_ack(1, WAIT_S)
        with node.unowned("logs/beats/"):
            client.send(*_window(2, "resent", "resent too"))  # type: ignore[arg-type]
            assert client.wait_closed(WAIT_S) == [1]
    with LumberjackClient(port, ProtocolVersion.V2) as client:
        client.send(*_window(1, "resent", "resent too"))  # type: ignore[arg-type]
        client.wait_for_ack(2, WAIT_S)
    log = node.server.log_text()
    assert "not acknowledged" in log and "reason=unavailable" in log
    node.server.stop()
    stored = sorted(
        json.loads(event)["message"]
        for events in stored_events(node.server.data_dir).values()
        for event in events
    )
    assert stored == ["before", "resent", "resent too"]


def test_rsio_subscriptions_and_offers_end_with_a_retriable_error(node: Node) -> None:
    """A subscription to an unowned stream and an offer into it end with
    ``onError`` saying to try again; the connection serves on, and both work
    once the stream has an owner."""

    async def check() -> None:
        async with PravegaClient(f"tcp://127.0.0.1:{node.port('controller')}") as pravega:
            await pravega.controller.create_scope("rs")
            await pravega.controller.create_stream("rs", "away")
        client = await RsioClient.connect("127.0.0.1", node.port("rsio"))
        try:
            with node.unowned("rs/away/"):
                sub = client.subscribe("rs/away")
                with pytest.raises(RsioError, match=r"^unavailable, try again: "):
                    await asyncio.wait_for(sub.next(), WAIT_S)
                with pytest.raises(RsioError, match=r"^unavailable, try again: "):
                    await asyncio.wait_for(client.offer("rs/away", [b"x"]), WAIT_S)
            assert await asyncio.wait_for(client.offer("rs/away", [b"stored"]), WAIT_S) == 1
            sub = client.subscribe("rs/away")
            assert await asyncio.wait_for(sub.next(), WAIT_S) == b"stored"
        finally:
            await client.aclose()

    asyncio.run(check())
