"""RS-IO over WebSocket at ``/rsio`` on the HTTP port (one binary message per message,
rsio.md#websocket)."""

from __future__ import annotations

import asyncio
import base64
import os
import re

from wsproto.connection import Connection, ConnectionType
from wsproto.events import BytesMessage, CloseConnection, Message, TextMessage

from headrace.client import PravegaClient

from .conftest import WAIT_S, Server, new_stream, write_events

Binary = tuple[str, bytes]
"""``("binary", payload)``: a whole binary message received."""
Close = tuple[str, int]
"""``("close", code)``: a close frame received."""


class WsClient:
    """A minimal WebSocket client (``wsproto`` frames), enough to talk RS-IO by hand."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, rest: bytes = b""
    ) -> None:
        self.reader, self.writer = reader, writer
        self.ws = Connection(ConnectionType.CLIENT, trailing_data=rest)
        self.pending: list[Binary | Close] = []
        self.message = bytearray()

    @classmethod
    async def connect(
        cls, port: int, path: str = "/rsio", extra: str = ""
    ) -> tuple[WsClient, bytes]:
        """Open ``path`` with an upgrade request (``extra``: more header lines)."""
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        key = base64.b64encode(os.urandom(16)).decode()
        writer.write(
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n{extra}"
            "Sec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
        return cls(reader, writer), head

    def send(self, payload: bytes, *, text: bool = False) -> None:
        event: Message[str] | Message[bytes] = (
            TextMessage(payload.decode()) if text else BytesMessage(payload)
        )
        self.writer.write(self.ws.send(event))

    def close(self, code: int) -> None:
        self.writer.write(self.ws.send(CloseConnection(code)))

    async def receive(self) -> Binary | Close | None:
        while not self.pending:
            data = await asyncio.wait_for(self.reader.read(65536), WAIT_S)
            if not data:
                return None
            self.ws.receive_data(data)
            for event in self.ws.events():
                if isinstance(event, BytesMessage):
                    self.message += event.data
                    if event.message_finished:
                        self.pending.append(("binary", bytes(self.message)))
                        self.message.clear()
                elif isinstance(event, CloseConnection):
                    self.pending.append(("close", int(event.code)))
        return self.pending.pop(0)


def binary(hex_payload: str) -> Binary:
    return ("binary", bytes.fromhex(hex_payload))


async def test_part_c_exchange_over_websocket(server: Server, pravega: PravegaClient) -> None:
    scope, stream = await new_stream(pravega)
    await write_events(pravega, scope, stream, [b"hello", b"world"])
    await pravega.controller.seal_stream(scope, stream)
    ws, head = await WsClient.connect(server.http_port)
    try:
        assert head.startswith(b"HTTP/1.1 101 ")
        name = f"{scope}/{stream}".encode()
        ws.send(bytes.fromhex("010000"))  # clientHello, no length prefix
        ws.send(bytes([0x04, len(name)]) + name + bytes([0x01, 0x00]))  # subscribe
        ws.send(bytes.fromhex("050102"))  # request(1, 2)
        expected = ["020000", "070100", "08010568656c6c6f", "080105776f726c64", "0c01"]
        for message in expected:
            got = await ws.receive()
            assert got == binary(message)
        ws.send(bytes.fromhex("0304646f6e65"))  # goodbye("done")
        assert await ws.receive() == binary("0300")
        ws.close(1000)
        assert await ws.receive() == ("close", 1000)
        assert await ws.receive() is None  # the closing handshake ends the connection
    finally:
        ws.writer.close()


async def test_text_message_gets_goodbye_and_close(server: Server) -> None:
    ws, _ = await WsClient.connect(server.http_port)
    try:
        ws.send(bytes.fromhex("010000"))
        assert await ws.receive() == binary("020000")
        ws.send(b"hello", text=True)
        goodbye = await ws.receive()
        assert goodbye is not None and goodbye[0] == "binary"
        assert isinstance(goodbye[1], bytes) and goodbye[1].startswith(b"\x03")
        assert b"text message" in goodbye[1]
        assert await ws.receive() == ("close", 1002)
        assert await ws.receive() is None  # closed
    finally:
        ws.writer.close()


async def test_unmasked_frame_is_refused_with_a_close(server: Server) -> None:
    ws, _ = await WsClient.connect(server.http_port)
    try:
        ws.writer.write(bytes([0x82, 3]) + bytes.fromhex("010000"))  # FIN, binary, not masked
        assert await ws.receive() == ("close", 1002)
        assert await ws.receive() is None
    finally:
        ws.writer.close()


async def test_health_and_unknown_paths(server: Server) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.http_port)
    try:
        writer.write(
            b"GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /nope HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        writer.write(b"GET /rsio HTTP/1.1\r\nHost: x\r\n\r\n")
        got = b""
        while got.count(b"HTTP/1.1 ") < 3:
            chunk = await asyncio.wait_for(reader.read(65536), WAIT_S)
            assert chunk
            got += chunk
        statuses = re.findall(rb"HTTP/1\.1 (\d{3}) ", got)
        assert statuses == [b"200", b"404", b"426"]
        assert b'"status": "ok"' in got  # the /health JSON report
    finally:
        writer.close()
