"""RS-IO over WebSocket at ``/rsio`` on the HTTP port (B.4: one binary message per message)."""

from __future__ import annotations

import asyncio
import base64
import os
import re

from headrace.client import PravegaClient
from headrace.protocols.websocket import Close, FrameReader, Message, Opcode, encode_frame

from .conftest import WAIT_S, Server, new_stream, write_events


class WsClient:
    """A minimal WebSocket client (masked frames), enough to talk RS-IO by hand."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.frames = FrameReader(masked=False)
        self.pending: list[Message | Close] = []

    @classmethod
    async def connect(cls, port: int, path: str = "/rsio") -> tuple[WsClient, bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        key = base64.b64encode(os.urandom(16)).decode()
        writer.write(
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
        return cls(reader, writer), head

    def send(self, payload: bytes, opcode: Opcode = Opcode.BINARY) -> None:
        self.writer.write(encode_frame(opcode, payload, mask=True))

    async def receive(self) -> Message | Close | None:
        while not self.pending:
            data = await asyncio.wait_for(self.reader.read(65536), WAIT_S)
            if not data:
                return None
            for frame in self.frames.receive_data(data):
                if isinstance(frame, Message | Close):
                    self.pending.append(frame)
        return self.pending.pop(0)


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
            assert got == Message(Opcode.BINARY, bytes.fromhex(message))
        ws.send(bytes.fromhex("0304646f6e65"))  # goodbye("done")
        assert await ws.receive() == Message(Opcode.BINARY, bytes.fromhex("0300"))
        ws.send(b"\x03\xe8", Opcode.CLOSE)
        assert await ws.receive() == Close(1000, b"")
    finally:
        ws.writer.close()


async def test_text_message_gets_goodbye_and_close(server: Server) -> None:
    ws, _ = await WsClient.connect(server.http_port)
    try:
        ws.send(bytes.fromhex("010000"))
        assert await ws.receive() == Message(Opcode.BINARY, bytes.fromhex("020000"))
        ws.send(b"hello", Opcode.TEXT)
        goodbye = await ws.receive()
        assert isinstance(goodbye, Message) and goodbye.payload.startswith(b"\x03")
        assert b"text message" in goodbye.payload
        assert await ws.receive() == Close(1002, b"")
        assert await ws.receive() is None  # closed
    finally:
        ws.writer.close()


async def test_unmasked_frame_is_refused_with_a_close(server: Server) -> None:
    ws, _ = await WsClient.connect(server.http_port)
    try:
        ws.writer.write(encode_frame(Opcode.BINARY, bytes.fromhex("010000")))  # not masked
        assert await ws.receive() == Close(1002, b"")
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
