"""Test harness for the Lumberjack front door: a real ``headrace serve``, our own
blocking Lumberjack client, throwaway TLS certificates, and offline read-back.

Every wait here has a deadline; nothing sleeps to synchronise.
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import struct
import time
from collections.abc import Iterable
from pathlib import Path

from headrace.errors import RemoteProtocolError
from headrace.protocols.lumberjack import (
    Ack,
    ConnectionClosed,
    Frame,
    LumberjackConnection,
    ProtocolVersion,
    Role,
    encode_frame,
)
from headrace.store import DiskStore
from tests._server import FREE, ServerProcess, TlsFiles
from tests._server import free_port as free_port  # the tests here import these from this module
from tests._server import make_certificate as make_certificate

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0
IO_TIMEOUT_S = 15.0
"""Bound on every socket operation and every wait for an ack or a close."""

STREAM = "logs/beats"
EVENT_HEADER = struct.Struct(">ii")

# --------------------------------------------------------------------------- TLS


def client_context(server: TlsFiles, client: TlsFiles | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=server.cert)
    if client is not None:
        context.load_cert_chain(client.cert, client.key)
    return context


# --------------------------------------------------------------------------- server


class Server(ServerProcess):
    """A running ``python -m headrace -v serve`` child process with the Lumberjack
    listeners on free ports (TLS only with ``tls``) and, with ``pravega``, the
    controller and segment store too."""

    def __init__(
        self,
        data_dir: Path,
        *args: str,
        tls: TlsFiles | None = None,
        tls_ca: Path | None = None,
        port: int | None = None,
        pravega: bool = False,
    ) -> None:
        ports: dict[str, int | None] = {"lumberjack": port}  # None: FREE
        if tls is not None:
            ports["lumberjack_tls"] = FREE
        if pravega:
            ports |= {"controller": FREE, "segment_store": FREE}
        super().__init__(
            data_dir,
            ports=ports,
            args=args,
            global_args=["-v"],
            tls=tls,
            tls_ca=tls_ca,
            start_timeout_s=START_TIMEOUT_S,
            stop_timeout_s=STOP_TIMEOUT_S,
        )

    @property
    def port(self) -> int:
        return self.port_of("lumberjack")

    @property
    def tls_port(self) -> int:
        return self.ports.get("lumberjack_tls", 0)

    @property
    def controller_port(self) -> int:
        return self.ports.get("controller", 0)

    @property
    def stderr(self) -> str:
        return self.log_text()


def start_server(
    data_dir: Path,
    *args: str,
    tls: TlsFiles | None = None,
    tls_ca: Path | None = None,
    port: int | None = None,
    pravega: bool = False,
) -> Server:
    """Start ``headrace serve`` with the Lumberjack listeners on free ports (and,
    with ``pravega``, the controller and segment store too)."""
    return Server(data_dir, *args, tls=tls, tls_ca=tls_ca, port=port, pravega=pravega).start()


# --------------------------------------------------------------------------- read back


def stored_events(data_dir: Path, stream: str = STREAM) -> dict[str, list[bytes]]:
    """Every event payload of ``stream``'s segments, per segment, in stored order.

    Opens the data directory with ``DiskStore`` (the server must be stopped).
    """

    async def read_all() -> dict[str, list[bytes]]:
        store = await DiskStore.open(data_dir)
        try:
            out: dict[str, list[bytes]] = {}
            for name in await store.list_segments():
                if not name.startswith(stream + "/"):
                    continue
                info = await store.info(name)
                data = bytearray()
                offset = info.start_offset
                while offset < info.length:
                    result = await store.read(name, offset, info.length - offset)
                    assert result.data, f"{name}: no data at {offset} below {info.length}"
                    data += result.data
                    offset += len(result.data)
                events: list[bytes] = []
                position = 0
                while position < len(data):
                    kind, size = EVENT_HEADER.unpack_from(data, position)
                    assert kind == 0, f"{name}: event type {kind} at {position}"
                    start = position + EVENT_HEADER.size
                    assert start + size <= len(data), f"{name}: torn event at {position}"
                    events.append(bytes(data[start : start + size]))
                    position = start + size
                out[name] = events
            return out
        finally:
            await store.close()

    return asyncio.run(read_all())


LOOPBACK_METADATA: bytes = b'{"@metadata":{"ip_address":"127.0.0.1"},'
"""What the door puts before a loopback client's event that has no ``@metadata``."""


def as_stored(payload: bytes) -> bytes:
    """``payload`` (a JSON object without ``@metadata``, sent over plain TCP from
    loopback) as the door stores it: the connection's ``@metadata`` first, then
    the rest of the bytes as sent."""
    assert payload.startswith(b"{") and payload != b"{}"
    return LOOPBACK_METADATA + payload[1:]


def without_metadata(document: dict[str, object]) -> dict[str, object]:
    """``document`` with the door's ``@metadata`` taken off, after checking it
    names the loopback client."""
    meta = document.pop("@metadata")
    assert isinstance(meta, dict) and meta["ip_address"] == "127.0.0.1", meta
    return document


def stored_documents(data_dir: Path, stream: str = STREAM) -> dict[str, list[dict[str, object]]]:
    """``stored_events`` decoded as JSON objects."""
    return {
        name: [json.loads(payload) for payload in payloads]
        for name, payloads in stored_events(data_dir, stream).items()
    }


# --------------------------------------------------------------------------- client


class Closed(Exception):
    """The server closed the connection."""


class LumberjackClient:
    """A blocking Lumberjack client on the sans-I/O client role, for tests.

    ``send`` goes through ``LumberjackConnection`` (which checks that our
    frames follow the protocol); ``send_raw`` writes any bytes, for "W once"
    clients and bad input.
    """

    def __init__(
        self,
        port: int,
        version: ProtocolVersion,
        *,
        ssl_context: ssl.SSLContext | None = None,
        compress_level: int = 6,
    ) -> None:
        sock = socket.create_connection(("127.0.0.1", port), timeout=IO_TIMEOUT_S)
        if ssl_context is not None:
            sock = ssl_context.wrap_socket(sock, server_hostname="localhost")
        self.sock = sock
        self.version = version
        self.conn = LumberjackConnection(
            Role.CLIENT, version=version, compress_level=compress_level
        )
        self.acks: list[int] = []
        self.ack_times: list[float] = []
        self.closed = False

    def __enter__(self) -> LumberjackClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()

    def send(self, *frames: Frame) -> None:
        for frame in frames:
            self.conn.send(frame)
        self.sock.sendall(self.conn.data_to_send())

    def send_raw(self, *frames: Frame | bytes) -> None:
        data = b"".join(
            f if isinstance(f, bytes) else encode_frame(self.version, f) for f in frames
        )
        self.sock.sendall(data)

    def _receive(self, timeout_s: float) -> bool:
        """One read into the connection; False on timeout. Raises ``Closed`` at EOF."""
        self.sock.settimeout(timeout_s)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return False
        except (ConnectionResetError, ssl.SSLError, BrokenPipeError) as exc:
            self.closed = True
            raise Closed(str(exc)) from exc
        finally:
            self.sock.settimeout(IO_TIMEOUT_S)
        try:
            self.conn.receive_data(data)
            for event in self.conn.events():
                if isinstance(event, Ack):
                    self.acks.append(event.seq)
                    self.ack_times.append(time.monotonic())
                elif isinstance(event, ConnectionClosed):
                    self.closed = True
        except RemoteProtocolError as exc:
            raise AssertionError(f"server sent bad frames: {exc}") from exc
        if self.closed:
            raise Closed("EOF")
        return True

    def wait_for_ack(self, seq: int, timeout_s: float = IO_TIMEOUT_S) -> list[int]:
        """Read until an ack with ``seq`` arrives; returns the acks read so far."""
        deadline = time.monotonic() + timeout_s
        while seq not in self.acks:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no Ack({seq}) within {timeout_s} s; got {self.acks}")
            self._receive(remaining)
        return self.acks

    def wait_for_acks(self, count: int, timeout_s: float = IO_TIMEOUT_S) -> list[int]:
        """Read until ``count`` acks (keepalives included) have arrived."""
        deadline = time.monotonic() + timeout_s
        while len(self.acks) < count:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"{count} acks not within {timeout_s} s; got {self.acks}")
            self._receive(remaining)
        return self.acks

    def quiet_for(self, timeout_s: float) -> list[int]:
        """Read for ``timeout_s`` expecting nothing; returns any acks that came."""
        deadline = time.monotonic() + timeout_s
        before = len(self.acks)
        while (remaining := deadline - time.monotonic()) > 0:
            self._receive(remaining)
        return self.acks[before:]

    def wait_closed(self, timeout_s: float = IO_TIMEOUT_S) -> list[int]:
        """Read until the server closes the connection; returns every ack received."""
        deadline = time.monotonic() + timeout_s
        try:
            while (remaining := deadline - time.monotonic()) > 0:
                self._receive(remaining)
        except Closed:
            return self.acks
        raise AssertionError(f"the server kept the connection open for {timeout_s} s")


def json_events(start_seq: int, docs: Iterable[dict[str, object]]) -> list[tuple[int, bytes]]:
    """``(seq, payload)`` pairs numbered from ``start_seq``."""
    return [
        (start_seq + i, json.dumps(doc, separators=(",", ":")).encode())
        for i, doc in enumerate(docs)
    ]
