"""Copying a container's files from the node that released it to the node claiming it.

A node of a cluster listens on its ``transfer`` door (an internal port, bound
at start on ``--host`` and announced in ``/nodes/<id>`` with the other doors;
``docs/cluster.md#moves``). The node claiming a container moved to it (its
record ``RELEASED`` by its last owner) connects to that owner's transfer door
and asks for it; the owner streams the container's closed files, and the
claimer writes them into a staging directory of its own data dir, checks
each one's size and CRC-32 and installs the copy (``DiskStore.attach``).

The exchange, on one TCP connection (JSON lines, then raw bytes)::

    claimer:  {"v":1,"container":N,"node":"<claimer id>","token":"<node token>"}\\n
    owner:    {"error":"<why>"}\\n                      and closes, or, per file:
    owner:    {"path":"wal/...","size":S}\\n  S bytes  {"crc":C}\\n
    owner:    {"end":<file count>}\\n

What the owner checks before it sends a byte: a valid node token, signed
with the cluster secret (``docs/cluster.md#secret``; a node of a cluster
always has one); and that the container's record says
``RELEASED`` by this node to the asking node. It then detaches the container
if it was not already (a node restarted after a release opens it again), so
its files are closed and do not change while they are read.

Every limit is a named constant below: the request line, each header line,
the number of files, the time without progress, the connections served at
once. Memory per connection is a chunk or two (``TRANSFER_CHUNK_BYTES``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from headrace.cluster.layout import ContainerState, NodeInfo, check_node_id
from headrace.cluster.member import ClusterMember
from headrace.controller.auth import TokenIssuer
from headrace.errors import ConfigError, StoreError
from headrace.protocols.pravega.auth import Permission, TokenError, decode_token
from headrace.store.disk import DiskStore
from headrace.store.disk.log import FILE_MODE
from headrace.store.disk.moves import (
    MAX_CONTAINER_FILES,
    check_relative_path,
    container_file_paths,
    new_staging_dir,
)

__all__ = [
    "MAX_HEADER_BYTES",
    "MAX_TRANSFER_CONNECTIONS",
    "TRANSFER_CHUNK_BYTES",
    "TRANSFER_DOOR",
    "TRANSFER_IDLE_TIMEOUT_S",
    "TransferError",
    "TransferServer",
    "fetch_container",
]

log = logging.getLogger(__name__)

TRANSFER_DOOR: Final = "transfer"
"""The door name of the transfer port in ``/nodes/<id>``."""

TRANSFER_CHUNK_BYTES: Final = 1024 * 1024
"""Bytes read from a file or the socket at a time: a transfer holds one chunk
in memory at each end, whatever the container's size."""

MAX_HEADER_BYTES: Final = 16 * 1024
"""The longest request or header line (a request carries a node token of
about 300 bytes; a file header under 100): a peer cannot make the other end
buffer more than this before a line ends."""

TRANSFER_IDLE_TIMEOUT_S: Final = 30.0
"""Time either end waits for the next line or chunk before it gives up on a
transfer (a peer that stops sending cannot hold a connection, a staging
directory or the container's lock for longer). The claimer then tries again."""

MAX_TRANSFER_CONNECTIONS: Final = 8
"""Transfer connections one node serves at once; more are closed at once.
Placement moves one container at a time, so two or three are normal."""

TRANSFER_NODE_TOKEN_TTL_S: Final = 300
"""Life of the node token a claimer signs for one request."""


class TransferError(StoreError):
    """A container copy could not be fetched: the peer refused, broke off or sent bad data."""


def _line(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


async def _read_line(reader: asyncio.StreamReader) -> dict[str, Any]:
    """One JSON-object line, within ``TRANSFER_IDLE_TIMEOUT_S`` and ``MAX_HEADER_BYTES``."""
    try:
        async with asyncio.timeout(TRANSFER_IDLE_TIMEOUT_S):
            raw = await reader.readuntil(b"\n")
    except asyncio.LimitOverrunError:
        raise TransferError(f"a line longer than {MAX_HEADER_BYTES} bytes") from None
    except asyncio.IncompleteReadError:
        raise TransferError("the peer closed the connection") from None
    except TimeoutError:
        raise TransferError(f"nothing for {TRANSFER_IDLE_TIMEOUT_S:g} s") from None
    if len(raw) > MAX_HEADER_BYTES:
        raise TransferError(f"a line longer than {MAX_HEADER_BYTES} bytes")
    try:
        obj = json.loads(raw)
    except ValueError:
        raise TransferError("a line that is not JSON") from None
    if not isinstance(obj, dict):
        raise TransferError("a line that is not a JSON object")
    return obj


def _int_field(obj: dict[str, Any], key: str, high: int) -> int:
    value = obj.get(key)
    if type(value) is not int or not 0 <= value <= high:
        raise TransferError(f"bad {key!r} in {sorted(obj)}")
    return value


# --------------------------------------------------------------------------- the owner's side


class TransferServer:
    """The transfer door of one node: serves the containers it released.

    Args:
        store: the node's disk store.
        member: returns the node's running ``ClusterMember`` (None before it started).
        node_key: the key node tokens are checked with (a cluster node always
            has the cluster secret); None: requests need none (embedding, tests).
    """

    def __init__(
        self,
        store: DiskStore,
        member: Callable[[], ClusterMember | None],
        node_key: bytes | None,
    ) -> None:
        self._store = store
        self._member = member
        self._node_key = node_key
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        assert self._server is not None
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def start(self, host: str, port: int = 0) -> None:
        self._server = await asyncio.start_server(self._serve, host, port, limit=MAX_HEADER_BYTES)

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self._connections) >= MAX_TRANSFER_CONNECTIONS:
            log.warning(
                "transfer: %d connections already; closing one more", len(self._connections)
            )
            writer.close()
            return
        self._connections.add(task)
        peer = writer.get_extra_info("peername")
        try:
            await self._answer(reader, writer, peer)
        except (StoreError, OSError, asyncio.IncompleteReadError) as exc:
            log.warning("transfer: to %s: %s", peer, exc)
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _answer(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, peer: object
    ) -> None:
        request = await _read_line(reader)
        refused = self._refusal(request)
        if refused is not None:
            log.warning("transfer: refused a request from %s: %s", peer, refused)
            writer.write(_line({"error": refused}))
            await writer.drain()
            return
        container = request["container"]
        await self._store.detach(container)  # a no-op unless restarted since the release
        paths = self._store.container_paths(container)
        files = await asyncio.to_thread(container_file_paths, paths)
        sent = 0
        for path in files:
            await self._send_file(writer, path, str(path.relative_to(paths.dir)))
            sent += path.stat().st_size
        writer.write(_line({"end": len(files)}))
        await writer.drain()
        log.info(
            "transfer: sent container %d (%d files, %d bytes) to %s",
            container,
            len(files),
            sent,
            request["node"],
        )

    def _refusal(self, request: dict[str, Any]) -> str | None:
        """Why ``request`` is not answered; None: it is."""
        if request.get("v") != 1:
            return "unknown version"
        container = request.get("container")
        node = request.get("node")
        if type(container) is not int or not 0 <= container < self._store.container_count:
            return "no such container"
        if not isinstance(node, str):
            return "no node id"
        try:
            check_node_id(node)
        except ConfigError:
            return "not a node id"
        if self._node_key is not None:
            token = request.get("token")
            try:
                if not isinstance(token, str):
                    raise TokenError("no token")
                claims = decode_token(self._node_key, token, now_s=time.time())
            except TokenError as exc:
                return f"not a node token: {exc}"
            if not claims.node:
                return "not a node token"
        member = self._member()
        if member is None:
            return "not in the cluster yet"
        record = member.record(container)
        if (
            record.state is not ContainerState.RELEASED
            or record.owner != member.node_id
            or record.target != node
        ):
            return f"container {container} is not released by {member.node_id} to {node}"
        return None

    async def _send_file(self, writer: asyncio.StreamWriter, path: Path, name: str) -> None:
        fd = await asyncio.to_thread(os.open, path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            writer.write(_line({"path": name, "size": size}))
            crc = 0
            position = 0
            while position < size:
                chunk = await asyncio.to_thread(
                    os.pread, fd, min(TRANSFER_CHUNK_BYTES, size - position), position
                )
                if not chunk:
                    raise TransferError(f"{path} shrank while it was sent")
                crc = zlib.crc32(chunk, crc)
                position += len(chunk)
                writer.write(chunk)
                async with asyncio.timeout(TRANSFER_IDLE_TIMEOUT_S):
                    await writer.drain()
            writer.write(_line({"crc": crc}))
            async with asyncio.timeout(TRANSFER_IDLE_TIMEOUT_S):
                await writer.drain()
        finally:
            os.close(fd)


# --------------------------------------------------------------------------- the claimer's side


async def fetch_container(
    store: DiskStore,
    container: int,
    source: NodeInfo,
    node_id: str,
    node_key: bytes | None,
) -> None:
    """Copy ``container`` from ``source`` (which released it to this node) and install it.

    This node's own copy is detached first and replaced only once every file
    arrived whole (sizes and CRC-32s checked): a failure leaves it as it was,
    detached, and the staging directory is removed.

    Raises:
        TransferError: ``source`` refused, has no transfer door, broke off or
            sent bad data; the claim is tried again later.
        StoreError, CorruptionError: the copy could not be opened.
    """
    address = source.address(TRANSFER_DOOR)
    if address is None:
        raise TransferError(f"node {source.node_id} announces no {TRANSFER_DOOR} door")
    token = ""
    if node_key is not None:
        issuer = TokenIssuer(node_key, TRANSFER_NODE_TOKEN_TTL_S)
        token = issuer.issue(node_id, "prn::/*", Permission.READ, node=True)
    await store.detach(container)
    staged = await asyncio.to_thread(new_staging_dir, store.root, container)
    try:
        try:
            async with asyncio.timeout(TRANSFER_IDLE_TIMEOUT_S):
                # a chunk at a time from the socket (a header line is checked
                # against MAX_HEADER_BYTES once read)
                reader, writer = await asyncio.open_connection(*address, limit=TRANSFER_CHUNK_BYTES)
        except (OSError, TimeoutError) as exc:
            raise TransferError(f"cannot reach {source.node_id} at {address}: {exc}") from None
        try:
            request = {"v": 1, "container": container, "node": node_id, "token": token}
            writer.write(_line(request))
            await writer.drain()
            try:
                count, size = await _receive(reader, staged)
            except OSError as exc:  # this node's disk (full?), or the connection
                raise TransferError(f"copying from {source.node_id} failed: {exc}") from exc
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
        await store.attach(container, install=staged)
    except BaseException:
        await asyncio.to_thread(shutil.rmtree, staged, True)
        raise
    log.info(
        "transfer: installed container %d from %s (%d files, %d bytes)",
        container,
        source.node_id,
        count,
        size,
    )


async def _receive(reader: asyncio.StreamReader, staged: Path) -> tuple[int, int]:
    """Write every file the owner sends into ``staged``; return (files, bytes)."""
    seen: set[str] = set()
    total = 0
    while True:
        header = await _read_line(reader)
        if "error" in header:
            raise TransferError(f"refused: {str(header['error'])[:200]}")
        if "end" in header:
            if _int_field(header, "end", MAX_CONTAINER_FILES) != len(seen):
                raise TransferError("the file count does not match")
            if "snapshot" not in seen:
                raise TransferError("the copy has no snapshot")
            return len(seen), total
        if len(seen) >= MAX_CONTAINER_FILES:
            raise TransferError(f"more than {MAX_CONTAINER_FILES} files")
        name = header.get("path")
        try:
            name = check_relative_path(name if isinstance(name, str) else "")
        except ValueError as exc:
            raise TransferError(str(exc)) from None
        if name in seen:
            raise TransferError(f"{name} sent twice")
        seen.add(name)
        size = _int_field(header, "size", 2**63)
        total += size
        await _receive_file(reader, staged / name, size)


async def _receive_file(reader: asyncio.StreamReader, path: Path, size: int) -> None:
    fd = await asyncio.to_thread(os.open, path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    try:
        crc = 0
        position = 0
        while position < size:
            try:
                async with asyncio.timeout(TRANSFER_IDLE_TIMEOUT_S):
                    chunk = await reader.read(min(TRANSFER_CHUNK_BYTES, size - position))
            except TimeoutError:
                raise TransferError(f"nothing for {TRANSFER_IDLE_TIMEOUT_S:g} s") from None
            if not chunk:
                raise TransferError("the peer closed the connection within a file")
            await asyncio.to_thread(os.pwrite, fd, chunk, position)
            crc = zlib.crc32(chunk, crc)
            position += len(chunk)
    finally:
        os.close(fd)
    trailer = await _read_line(reader)
    if _int_field(trailer, "crc", 2**32 - 1) != crc:
        raise TransferError(f"{path.name}: CRC-32 mismatch")
