"""The transfer door: a released container's files, copied to the node it was released to.

Two disk stores in this process and real sockets. The member's view (which
record says what) is the one edge replaced here, by ``Records``: the
handshake that produces those records is tested with ZooKeeper in
``test_member.py`` and end to end in ``test_moves.py``. What is checked: a
copy arrives whole and is served; a request without a valid node token, or
for a container not released to the asking node, gets nothing; a peer that
sends a name outside the container, a wrong CRC or too little is refused and
leaves nothing installed.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest

from headrace.cluster.layout import ContainerRecord, ContainerState, NodeInfo
from headrace.cluster.member import ClusterMember
from headrace.errors import OwnerUnavailable, SegmentNotFound
from headrace.server.container_transfer import (
    TRANSFER_DOOR,
    TransferError,
    TransferServer,
    fetch_container,
)
from headrace.store.api import FsyncPolicy
from headrace.store.disk import DiskStore
from headrace.store.disk.layout import INCOMING_DIR, container_of

COUNT = 4
CONTAINER = 2
KEY = secrets.token_bytes(32)


class Records:
    """The member's view, as the transfer door reads it."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.records: dict[int, ContainerRecord] = {}

    def record(self, container: int) -> ContainerRecord:
        return self.records.get(container, ContainerRecord(None, 0, ContainerState.RELEASED))


def name_in(container: int, prefix: str) -> str:
    i = 0
    while container_of(f"{prefix}{i}", COUNT) != container:
        i += 1
    return f"{prefix}{i}"


@pytest.fixture
async def stores(tmp_path: Path) -> AsyncIterator[tuple[DiskStore, DiskStore]]:
    a = await DiskStore.open(tmp_path / "a", container_count=COUNT, fsync=FsyncPolicy.ALWAYS)
    b = await DiskStore.open(tmp_path / "b", container_count=COUNT, fsync=FsyncPolicy.ALWAYS)
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


async def serve(store: DiskStore, view: Records, key: bytes | None) -> TransferServer:
    server = TransferServer(store, lambda: cast(ClusterMember, view), key)
    await server.start("127.0.0.1")
    return server


def released_to_b(view: Records) -> None:
    view.records[CONTAINER] = ContainerRecord("a", 3, ContainerState.RELEASED, "b")


async def test_a_released_container_arrives_whole_and_replaces_the_old_copy(
    stores: tuple[DiskStore, DiskStore],
) -> None:
    a, b = stores
    moved, stale = name_in(CONTAINER, "moved"), name_in(CONTAINER, "stale")
    await a.create_segment(moved)
    for n in range(50):
        await a.append(moved, bytes([n]) * 1000)
    await b.create_segment(stale)
    view = Records("a")
    released_to_b(view)
    await a.detach(CONTAINER)  # the release hook
    server = await serve(a, view, KEY)
    try:
        source = NodeInfo("a", "127.0.0.1", {TRANSFER_DOOR: server.port})
        await fetch_container(b, CONTAINER, source, "b", KEY)
    finally:
        await server.aclose()
    data = (await b.read(moved, 0, 100_000)).data
    assert data == b"".join(bytes([n]) * 1000 for n in range(50))
    with pytest.raises(SegmentNotFound):
        await b.info(stale)
    with pytest.raises(OwnerUnavailable):
        await a.info(moved)  # the old owner does not serve it


@pytest.mark.parametrize(
    ("server_key", "client_key", "record", "reason"),
    [
        (KEY, None, "released", "not a node token"),
        (KEY, secrets.token_bytes(32), "released", "not a node token"),
        (None, None, "owned", "is not released by a to b"),
        (None, None, "released-to-c", "is not released by a to b"),
    ],
    ids=["no-token", "another-key", "owned", "released-to-c"],
)
async def test_a_request_not_from_the_node_it_was_released_to_gets_nothing(
    stores: tuple[DiskStore, DiskStore],
    server_key: bytes | None,
    client_key: bytes | None,
    record: str,
    reason: str,
) -> None:
    a, b = stores
    name = name_in(CONTAINER, "kept")
    await b.create_segment(name)
    view = Records("a")
    view.records[CONTAINER] = {
        "released": ContainerRecord("a", 3, ContainerState.RELEASED, "b"),
        "owned": ContainerRecord("a", 3, ContainerState.OWNED),
        "released-to-c": ContainerRecord("a", 3, ContainerState.RELEASED, "c"),
    }[record]
    server = await serve(a, view, server_key)
    try:
        source = NodeInfo("a", "127.0.0.1", {TRANSFER_DOOR: server.port})
        with pytest.raises(TransferError, match=reason):
            await fetch_container(b, CONTAINER, source, "b", client_key)
    finally:
        await server.aclose()
    assert a.is_attached(CONTAINER)  # nothing was detached for a refused request
    await b.attach(CONTAINER)  # b's own copy is as it was
    assert (await b.info(name)).length == 0
    assert not any((b.root / INCOMING_DIR).iterdir())


async def hostile(lines: list[bytes]) -> tuple[asyncio.Server, int]:
    """A peer that answers any request with ``lines``."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readline()
        for line in lines:
            writer.write(line)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj).encode() + b"\n"


@pytest.mark.parametrize(
    ("lines", "reason"),
    [
        ([line({"path": "../../manifest", "size": 1}), b"x"], "not a file of a container"),
        ([line({"path": "snapshot", "size": 3}), b"abc", line({"crc": 1})], "CRC-32 mismatch"),
        ([line({"path": "snapshot", "size": 30}), b"abc"], "closed the connection within"),
        ([line({"end": 0})], "no snapshot"),
        ([b"x" * 20_000 + b"\n"], "longer than"),
        ([line({"path": "snapshot", "size": -1})], "bad 'size'"),
    ],
)
async def test_a_bad_copy_is_refused_and_nothing_is_installed(
    stores: tuple[DiskStore, DiskStore], lines: list[bytes], reason: str
) -> None:
    _, b = stores
    name = name_in(CONTAINER, "kept")
    await b.create_segment(name)
    server, port = await hostile(lines)
    try:
        source = NodeInfo("a", "127.0.0.1", {TRANSFER_DOOR: port})
        with pytest.raises(TransferError, match=reason):
            await fetch_container(b, CONTAINER, source, "b", None)
    finally:
        server.close()
        await server.wait_closed()
    assert not any((b.root / INCOMING_DIR).iterdir())
    assert not (b.root / "manifest").with_name("x").exists()
    await b.attach(CONTAINER)
    assert (await b.info(name)).length == 0


async def test_a_request_naming_no_node_id_is_refused_without_quoting_it(
    stores: tuple[DiskStore, DiskStore],
) -> None:
    a, _ = stores
    view = Records("a")
    released_to_b(view)
    server = await serve(a, view, None)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        request = {"v": 1, "container": CONTAINER, "node": "b\nforged log line", "token": ""}
        writer.write(line(request))
        answer = json.loads(await asyncio.wait_for(reader.readline(), 10))
        writer.close()
    finally:
        await server.aclose()
    assert answer == {"error": "not a node id"}
    assert a.is_attached(CONTAINER)
