"""The least a Python asyncio server can do per Pravega append: the latency floor.

The latency targets (ack p99 <= 0.5 ms under ``never``, <= 2x the disk's
fdatasync p99 under ``always``) include the paced writer process and the
machine's scheduling. This server shows what is left for any Python server on
the same machine, measured by the same paced writer in the same run: it parses
the frame header, takes the CRC-32 of the events (every byte a store keeps is
covered by a checksum; the same zlib-ng function as headrace's store), writes
them to one file, optionally syncs, and answers ``DataAppended`` from a
precompiled ``struct``. No store, no segments, no validation, no metrics, one
file for every writer.

``--sync``:

* ``none``: ``os.write`` and the reply, in the read callback (``never``'s floor);
* ``inline``: ``os.write`` + ``os.fdatasync`` in the read callback. The event
  loop stops for every sync, so every other connection waits for the disk:
  no server that serves more than one client can do this, which is what
  makes it a floor;
* ``thread``: the write in the read callback, the ``fdatasync`` in one
  long-lived thread fed by a queue, the reply sent back to the loop with
  ``call_soon_threadsafe``: the least a server pays to keep serving while
  the disk syncs (headrace's ``always`` rounds do this, and group many
  appends into one sync).

The handshake (``Hello``, ``SetupAppend``) goes through headrace's codec; the
append reply is checked once against it at start, so the shortcut cannot
drift from the wire format. Anything else closes the connection.

    python benchmarks/floor_server.py --port 9090 --file /tmp/floor.bin --sync inline
"""

from __future__ import annotations

import argparse
import asyncio
import os
import queue
import struct
import sys
import threading
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from headrace.protocols import pravega as p
from headrace.protocols._buffer import ReceiveBuffer
from headrace.store.disk.format import crc32

HEADER = struct.Struct(">ii")
APPEND_HEAD = struct.Struct(">16sii")
APPEND_TAIL = struct.Struct(">iqq")
DATA_APPENDED = struct.Struct(">ii16sqqqq")
APPEND_BLOCK_END = int(p.CommandType.APPEND_BLOCK_END)
MAX_HANDSHAKE_FRAME_BYTES = 1 << 20
"""A handshake frame larger than this closes the connection."""

SyncJob = tuple[int, asyncio.Transport, bytes, asyncio.AbstractEventLoop]


def data_appended(writer: bytes, number: int, previous: int, request_id: int, end: int) -> bytes:
    return DATA_APPENDED.pack(
        int(p.CommandType.DATA_APPENDED),
        DATA_APPENDED.size - HEADER.size,
        writer,
        number,
        previous,
        request_id,
        end,
    )


def check_against_codec() -> None:
    writer = uuid.uuid4()
    expected = p.encode_command(p.DataAppended(writer, 9, 4, 7, 1234))
    if data_appended(writer.bytes, 9, 4, 7, 1234) != expected:
        raise RuntimeError("floor_server's DataAppended disagrees with encode_command")


def handshake_reply(frame: bytes) -> bytes:
    buffer = ReceiveBuffer(MAX_HANDSHAKE_FRAME_BYTES)
    buffer.feed(frame)
    cmd = p.decode_command(buffer)
    if isinstance(cmd, p.Hello):
        return p.encode_command(p.Hello(p.WIRE_VERSION, p.OLDEST_COMPATIBLE_VERSION))
    if isinstance(cmd, p.SetupAppend):
        return p.encode_command(p.AppendSetup(cmd.request_id, cmd.segment, cmd.writer_id, -1))
    raise ValueError(f"the floor server takes appends only, not {type(cmd).__name__}")


def syncer(jobs: queue.SimpleQueue[SyncJob]) -> None:
    while True:
        fd, transport, reply, loop = jobs.get()
        os.fdatasync(fd)
        loop.call_soon_threadsafe(transport.write, reply)


class Floor(asyncio.Protocol):
    def __init__(self, fd: int, sync: str, jobs: queue.SimpleQueue[SyncJob]) -> None:
        self.fd = fd
        self.sync = sync
        self.jobs = jobs
        self.buffer = bytearray()
        self.last: dict[bytes, int] = {}
        self.end = 0
        self.crc = 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport  # asyncio sets TCP_NODELAY, as headrace's server does

    def data_received(self, data: bytes) -> None:
        transport = self.transport
        assert transport is not None
        buffer = self.buffer
        buffer += data
        position = 0
        out = []
        while len(buffer) - position >= HEADER.size:
            kind, size = HEADER.unpack_from(buffer, position)
            body = position + HEADER.size
            if kind != APPEND_BLOCK_END and size > MAX_HANDSHAKE_FRAME_BYTES:
                print(f"floor_server: frame of type {kind} too large", file=sys.stderr)
                transport.close()
                return
            if len(buffer) - body < size:
                break
            position = body + size
            if kind != APPEND_BLOCK_END:
                try:
                    out.append(handshake_reply(bytes(buffer[body - HEADER.size : position])))
                except ValueError as exc:
                    print(f"floor_server: {exc}", file=sys.stderr)
                    transport.close()
                    return
                continue
            writer, _, length = APPEND_HEAD.unpack_from(buffer, body)
            start = body + APPEND_HEAD.size
            events = memoryview(buffer)[start : start + length]
            self.crc = crc32(events, self.crc)
            os.write(self.fd, events)
            del events  # the buffer is resized below
            self.end += length
            _, number, request_id = APPEND_TAIL.unpack_from(buffer, start + length)
            previous = self.last.get(writer, -1)
            self.last[writer] = number
            reply = data_appended(writer, number, previous, request_id, self.end)
            if self.sync == "thread":
                self.jobs.put((self.fd, transport, reply, asyncio.get_running_loop()))
                continue
            if self.sync == "inline":
                os.fdatasync(self.fd)
            out.append(reply)
        del buffer[:position]
        if out:
            transport.write(b"".join(out))


async def serve(port: int, path: Path, sync: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    jobs: queue.SimpleQueue[SyncJob] = queue.SimpleQueue()
    threading.Thread(target=syncer, args=(jobs,), name="floor-sync", daemon=True).start()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Floor(fd, sync, jobs), "127.0.0.1", port)
    await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--file", type=Path, required=True, help="where the events go")
    parser.add_argument("--sync", choices=["none", "inline", "thread"], default="none")
    args = parser.parse_args()
    check_against_codec()
    asyncio.run(serve(args.port, args.file, args.sync))


if __name__ == "__main__":
    main()
