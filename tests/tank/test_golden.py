"""Golden bytes from TANK's worked example (tank.md#worked-example) and per-message examples,
sent on a raw socket to a live ``headrace serve``: the replies must match exactly."""

from __future__ import annotations

import socket

from headrace.protocols.tank import (
    BundleMessage,
    Produce,
    ProducePartition,
    ProduceTopic,
    encode,
    encode_bundle,
)
from tests.tank.conftest import TankServer

READ_TIMEOUT_S = 10.0


def h(text: str) -> bytes:
    return bytes.fromhex("".join(text.split()))


class RawConnection:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=READ_TIMEOUT_S)
        self.buffer = b""

    def close(self) -> None:
        self.sock.close()

    def frame(self) -> bytes:
        """The next whole frame (msg id, size, payload) as bytes."""
        while True:
            if len(self.buffer) >= 5:
                size = int.from_bytes(self.buffer[1:5], "little")
                if len(self.buffer) >= 5 + size:
                    frame, self.buffer = self.buffer[: 5 + size], self.buffer[5 + size :]
                    return frame
            data = self.sock.recv(65536)
            assert data, f"connection closed; buffered {self.buffer.hex()}"
            self.buffer += data

    def exchange(self, request: bytes) -> bytes:
        self.sock.sendall(request)
        return self.frame()


# worked example (tank.md#worked-example): produce "hello" (key k1) and "world" to
# logs/0, request id 1
PRODUCE_REQUEST = h("""
    01 32000000 0200 01000000 027079 00 00000000 01 046c6f6773 01 0000 1a
    08 01 0068e5cf8b010000 026b31 05 68656c6c6f 02 05 776f726c64
""")
PRODUCE_RESPONSE = h("01 05000000 01000000 00")
CONSUME_REQUEST = h("""
    02 28000000 0200 02000000 00 0000000000000000 00000000 01 046c6f6773 01 0000
    0000000000000000 00100000
""")
CONSUME_RESPONSE = h("""
    02 41000000 22000000 02000000 01 046c6f6773 01 0000 00 0100000000000000
    0200000000000000 1b000000
    1a 08 01 0068e5cf8b010000 026b31 05 68656c6c6f 02 05 776f726c64
""")


def test_worked_example_byte_for_byte(server: TankServer) -> None:
    conn = RawConnection(server.port)
    try:
        assert conn.frame() == h("03 00000000"), "the greeting comes first"
        # tank.md#create-topic: create topic logs with one partition
        create = h("07 0c000000 01000000 04 6c6f6773 0100 00")
        assert conn.exchange(create) == h("07 0a000000 01000000 04 6c6f6773 00")
        assert conn.exchange(create) == h("07 0a000000 01000000 04 6c6f6773 01"), "exists"
        assert len(PRODUCE_REQUEST) == 55
        assert conn.exchange(PRODUCE_REQUEST) == PRODUCE_RESPONSE
        assert conn.exchange(CONSUME_REQUEST) == CONSUME_RESPONSE
        # tank.md#chunks: boundary fault for seq num 100 on a partition holding 1..2
        boundary = h("""02 28000000 0200 07000000 00 0000000000000000 00000000 01 046c6f6773
                        01 0000 6400000000000000 00100000""")
        assert conn.exchange(boundary) == h("""
            02 2e000000 2a000000 07000000 01 04 6c6f6773 01 0000 01 0000000000000000
            0200000000000000 00000000 0100000000000000""")
        # tank.md#chunks: unknown topic "nope" with two partitions
        unknown_topic = h("""02 36000000 0200 09000000 00 0000000000000000 00000000 01 046e6f7065
                             02 0000 0000000000000000 00100000 0100 0000000000000000 00100000""")
        assert conn.exchange(unknown_topic) == h(
            "02 11000000 0d000000 09000000 01 04 6e6f7065 02 ffff"
        )
        # tank.md#chunks: unknown partition 5
        unknown_partition = h("""02 28000000 0200 0a000000 00 0000000000000000 00000000 01
                                 046c6f6773 01 0500 0000000000000000 00100000""")
        assert conn.exchange(unknown_partition) == h(
            "02 12000000 0e000000 0a000000 01 04 6c6f6773 01 0500 ff"
        )
        # tank.md#discover-partitions: discover partitions of logs (request id 1 in the example)
        discover = h("06 09000000 01000000 04 6c6f6773")
        assert conn.exchange(discover) == h(
            "06 1b000000 01000000 04 6c6f6773 0100 0100000000000000 0200000000000000"
        )
        # tank.md#produce: unknown topic nope (partitions 0, 1), then logs 0 and 9 (no such
        # partition)
        bundle = encode_bundle([BundleMessage(b"x", 1700000000000)])
        two_topics = encode(
            Produce(
                0x0D,
                (
                    ProduceTopic(
                        "nope", (ProducePartition(0, bundle), ProducePartition(1, bundle))
                    ),
                    ProduceTopic(
                        "logs", (ProducePartition(0, bundle), ProducePartition(9, bundle))
                    ),
                ),
            )
        )
        assert conn.exchange(two_topics) == h("01 07000000 0d000000 ff 00 01")
        # tank.md#discover-topics: discover topics (only "logs" exists on this server)
        assert conn.exchange(h("0b 05000000 01000000 00")) == h(
            "0b 11000000 01000000 01000000 00 04 6c6f6773 01 0100"
        )
        # tank.md#status: status; the last four fields vary (open time, start time)
        status = conn.exchange(h("0a 04000000 1e000000"))
        assert status[:19] == h("0a 1e000000 1e000000 00 00 01000000 01000000")
        assert status[-4:] == h("90010000"), "version 400"
        # tank.md#reload-conf: reload conf of logs/0
        assert conn.exchange(h("08 0b000000 01000000 04 6c6f6773 0000")) == h(
            "08 0c000000 01000000 04 6c6f6773 0000 00"
        )
        # tank.md#discover-topology: standalone topology
        assert conn.exchange(h("0c 05000000 01000000 00")) == h("0c 06000000 01000000 ffff")
    finally:
        conn.close()
