"""The suite's client processes (``benchmarks/suite.py`` starts them; not a benchmark itself).

Each worker is its own process so that several producers do not share one
interpreter (and its GIL), and so that the measuring side of the latency
shapes is not starved by the writer it measures. The protocol with the
parent is three lines: the worker sets up (connections, pre-encoded data),
prints ``ready``, waits for ``go`` on stdin, runs, and prints one JSON object
(its own wall time, CPU time and figures) as its last line.

Latency workers talk raw sockets with pre-encoded frames, so the client's
share of a round trip is a few microseconds of Python per batch, and every
timestamp is ``CLOCK_MONOTONIC`` (shared by every process on the machine):
the writer stamps each event with its send time, the tail reader in another
process subtracts it from the arrival time.

Run by hand: ``python benchmarks/suite_workers.py KIND ARGS...`` (see
``WORKERS`` at the bottom).
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import socket
import struct
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

READ_BYTES = 2 * 1024 * 1024
"""``ReadSegment`` size of the consumers (the suite's catch-up size)."""

TAIL_READ_BYTES = 64 * 1024
"""``ReadSegment`` size of the latency tail reader (it reads small bursts)."""

FLUSH_INTERVAL_S = 0.001
"""Default for how often a paced writer sends what has fallen due (one append
block, or one pipelined burst, per wake-up), as a client that flushes every
millisecond: about 10 events per send at 10,000 events/s. A send is then up to
this late; the lateness is reported beside the latency, not counted in it."""

BACKLOG_S = 0.25
"""A paced writer stops offering once this much offered load is unacknowledged."""

GO_TIMEOUT_S = 120.0
RECV_BYTES = 1 << 20

_FRAME = struct.Struct(">ii")
_I64 = struct.Struct(">q")


def now_ns() -> int:
    """``CLOCK_MONOTONIC`` in ns: the same clock in every process of the machine."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


class Stamps:
    """Events of ``size`` bytes whose first 8 bytes carry their send time
    (``now_ns``, big-endian) in one of every ``every`` events and zeros in the
    others (0: none): a consumer subtracts the stamps it finds from its own
    clock, so an end-to-end shape gives a delivery latency for a sample of its
    events without a clock read per event."""

    def __init__(self, size: int, every: int) -> None:
        self.pad = os.urandom(size - _I64.size)
        self.plain = bytes(_I64.size) + self.pad
        self.every = every

    def event(self, i: int) -> bytes:
        if self.every and i % self.every == 0:
            return _I64.pack(now_ns()) + self.pad
        return self.plain


def stamped_latency(payload: bytes | memoryview, arrived: int, into: list[int]) -> None:
    """Add ``payload``'s delivery latency to ``into`` if it carries a stamp."""
    stamp = _I64.unpack_from(payload)[0]
    if stamp:
        into.append(arrived - stamp)


def handshake() -> None:
    """Tell the parent the worker is set up; return when it says go."""
    print("ready", flush=True)
    ready, _, _ = select.select([sys.stdin], [], [], GO_TIMEOUT_S)
    if not ready or sys.stdin.readline().strip() != "go":
        raise SystemExit("no go from the parent")


def finish(result: dict[str, Any]) -> None:
    print(json.dumps(result), flush=True)
    sys.stdout.flush()
    os._exit(0)  # the peers' clients leave threads behind


def quantiles_ms(values_ns: list[int]) -> dict[str, float | None]:
    values_ns.sort()
    out: dict[str, float | None] = {}
    for label, q in (("p50", 0.5), ("p99", 0.99), ("p999", 0.999)):
        if not values_ns:
            out[f"{label}_ms"] = None
            continue
        index = min(len(values_ns) - 1, int(q * len(values_ns)))
        out[f"{label}_ms"] = round(values_ns[index] / 1e6, 3)
    return out


# --------------------------------------------------------------------------- Pravega frames


class Frames:
    """Whole Pravega frames out of a socket's bytes (the parts the workers need)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = bytearray()

    def available(self) -> list[tuple[int, bytes]]:
        """The complete frames received so far, (type, payload)."""
        out = []
        buffer = self.buffer
        position = 0
        while len(buffer) - position >= 8:
            kind, size = _FRAME.unpack_from(buffer, position)
            if len(buffer) - position - 8 < size:
                break
            out.append((kind, bytes(buffer[position + 8 : position + 8 + size])))
            position += 8 + size
        del buffer[:position]
        return out

    def receive(self) -> None:
        data = self.sock.recv(RECV_BYTES)
        if not data:
            raise ConnectionError("server closed the connection")
        self.buffer += data

    def one(self) -> tuple[int, bytes]:
        """Block for the next frame (set-up replies)."""
        while True:
            frames = self.available()
            if frames:
                if len(frames) > 1:
                    raise RuntimeError("unexpected extra frames during set-up")
                return frames[0]
            self.receive()


def pravega_connect(port: int) -> tuple[socket.socket, Frames]:
    from headrace.protocols import pravega as p

    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    frames = Frames(sock)
    sock.sendall(p.encode_command(p.Hello(p.WIRE_VERSION, p.OLDEST_COMPATIBLE_VERSION)))
    kind, _ = frames.one()
    if kind != p.CommandType.HELLO:
        raise RuntimeError(f"expected Hello, got type {kind}")
    return sock, frames


def setup_append(sock: socket.socket, frames: Frames, segment: str) -> uuid.UUID:
    from headrace.protocols import pravega as p

    writer = uuid.uuid4()
    sock.sendall(p.encode_command(p.SetupAppend(1, writer, segment, "")))
    kind, payload = frames.one()
    if kind != p.CommandType.APPEND_SETUP:
        raise RuntimeError(f"SetupAppend answered with type {kind}: {payload[:80]!r}")
    return writer


class AppendEncoder:
    """``AppendBlockEnd`` frames of ``size``-byte events built with ``struct`` only;
    each event's first 8 bytes are a caller's stamp. Checked once against the
    project's codec, so the shortcut cannot drift from the wire format."""

    def __init__(self, writer: uuid.UUID, size: int) -> None:
        from headrace.protocols import pravega as p

        self.writer_bytes = writer.bytes
        self.size = size
        self.pad = os.urandom(size - 8)
        self.event_header = _FRAME.pack(int(p.CommandType.EVENT), size)
        self.type = int(p.CommandType.APPEND_BLOCK_END)
        self.tail = struct.Struct(">iqq")
        probe = self.block([7, 9], last_number=2, request_id=5)
        data = b"".join(p.encode_event(_I64.pack(s) + self.pad) for s in (7, 9))
        expected = p.encode_command(p.AppendBlockEnd(writer, len(data), data, 2, 2, 5))
        if probe != expected:
            raise RuntimeError("AppendEncoder disagrees with encode_command")

    def block(self, stamps: list[int], last_number: int, request_id: int) -> bytes:
        data = b"".join(self.event_header + _I64.pack(s) + self.pad for s in stamps)
        body = (
            self.writer_bytes
            + struct.pack(">ii", len(data), len(data))
            + data
            + self.tail.pack(len(stamps), last_number, request_id)
        )
        return _FRAME.pack(self.type, len(body)) + body


# --------------------------------------------------------------------------- paced writers


class PacedProtocol:
    """What a paced writer needs of a protocol: a batch's bytes, and how many of
    the events sent so far are acknowledged (acknowledgements are cumulative)."""

    def batch(self, first: int, stamps: list[int]) -> bytes:
        raise NotImplementedError

    def acked_through(self, data: bytes) -> int:
        """Feed received bytes; return the count of events acknowledged so far."""
        raise NotImplementedError


class PravegaPaced(PacedProtocol):
    """One ``AppendBlockEnd`` per wake-up with the events due (a Pravega writer
    sends what has queued); ``DataAppended`` carries the last event number."""

    def __init__(self, port: int, segment: str) -> None:
        self.sock, self.frames = pravega_connect(port)
        writer = setup_append(self.sock, self.frames, segment)
        self.encoder = AppendEncoder(writer, 100)
        self.acked = 0
        self.request_id = 10

    def batch(self, first: int, stamps: list[int]) -> bytes:
        self.request_id += 1
        # event numbers start at 1: the last one of this block is first + len
        return self.encoder.block(stamps, first + len(stamps), self.request_id)

    def acked_through(self, data: bytes) -> int:
        self.frames.buffer += data
        for kind, payload in self.frames.available():
            if kind == 7:  # DataAppended: writer id (16), event number
                self.acked = max(self.acked, _I64.unpack_from(payload, 16)[0])
            else:
                raise RuntimeError(f"append answered with type {kind}: {payload[:80]!r}")
        return self.acked


class NatsPaced(PacedProtocol):
    """JetStream publish with a reply inbox per message (what nats-py does), acks
    by the inbox's number; several ``PUB``s per wake-up in one send."""

    def __init__(self, port: int, subject: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buffer = b""
        self._line()  # INFO
        connect = {"verbose": False, "pedantic": False, "headers": False, "protocol": 1}
        self.sock.sendall(
            f"CONNECT {json.dumps(connect)}\r\nSUB _INBOX.lat.* 1\r\nPING\r\n".encode()
        )
        while self._line() != b"PONG":
            pass
        self.subject = subject
        self.pad = os.urandom(92)
        self.acked = 0

    def _line(self) -> bytes:
        while b"\r\n" not in self.buffer:
            self.buffer += self.sock.recv(65536)
        line, self.buffer = self.buffer.split(b"\r\n", 1)
        return line

    def batch(self, first: int, stamps: list[int]) -> bytes:
        return b"".join(
            b"PUB %s _INBOX.lat.%d 100\r\n%s%s\r\n"
            % (self.subject.encode(), first + i + 1, _I64.pack(s), self.pad)
            for i, s in enumerate(stamps)
        )

    def acked_through(self, data: bytes) -> int:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n")
            if end < 0:
                break
            line = self.buffer[:end]
            if line.startswith(b"MSG "):
                parts = line.split()
                size = int(parts[-1])
                if len(self.buffer) < end + 2 + size + 2:
                    break
                body = self.buffer[end + 2 : end + 2 + size]
                if b'"error"' in body:
                    raise RuntimeError(f"JetStream refused a publish: {body!r}")
                self.acked = max(self.acked, int(parts[1].rsplit(b".", 1)[1]))
                self.buffer = self.buffer[end + 2 + size + 2 :]
            elif line == b"PING":
                self.sock.sendall(b"PONG\r\n")
                self.buffer = self.buffer[end + 2 :]
            elif line.startswith(b"-ERR"):
                raise RuntimeError(line.decode())
            else:
                self.buffer = self.buffer[end + 2 :]
        return self.acked


class RedisPaced(PacedProtocol):
    """Pipelined ``XADD``s (several per wake-up in one send); replies come in order."""

    def __init__(self, port: int, key: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        head = [b"XADD", key.encode(), b"*", b"v"]
        self.prefix = b"*5\r\n" + b"".join(b"$%d\r\n%s\r\n" % (len(x), x) for x in head)
        self.prefix += b"$100\r\n"
        self.pad = os.urandom(92)
        self.buffer = b""
        self.acked = 0

    def batch(self, first: int, stamps: list[int]) -> bytes:
        return b"".join(self.prefix + _I64.pack(s) + self.pad + b"\r\n" for s in stamps)

    def acked_through(self, data: bytes) -> int:
        self.buffer += data
        position = 0
        buffer = self.buffer
        while True:
            end = buffer.find(b"\r\n", position)
            if end < 0:
                break
            if buffer[position : position + 1] == b"$":
                size = int(buffer[position + 1 : end])
                if len(buffer) < end + 2 + size + 2:
                    break
                position = end + 2 + size + 2
                self.acked += 1
            elif buffer[position : position + 1] == b"-":
                raise RuntimeError(buffer[position:end].decode())
            else:
                position = end + 2
        self.buffer = buffer[position:]
        return self.acked


def paced(
    protocol: PacedProtocol, sock: socket.socket, rate: int, seconds: float, flush_s: float
) -> None:
    """Offer ``rate`` events/s for ``seconds``, sending what has fallen due at most
    once per ``flush_s``; ack latency runs from each event's send to the arrival
    of the acknowledgement covering it."""
    total = int(rate * seconds)
    interval_ns = 1e9 / rate
    send_ns = [0] * total
    lateness_ns: list[int] = []
    latencies: list[int] = []
    backlog = max(100, int(rate * BACKLOG_S))
    sent = acked = batches = 0
    stopped = ""
    flush_ns = int(flush_s * 1e9)
    handshake()
    cpu0 = time.process_time()
    start = now_ns()
    next_flush = start
    deadline = start + int((seconds + 30) * 1e9)
    while acked < total:
        now = now_ns()
        if now > deadline:
            stopped = f"acknowledgements stopped at {acked} of {sent}"
            break
        due = min(total, int((now - start) / interval_ns) + 1)
        if due > sent and now >= next_flush:
            if sent - acked > backlog:
                stopped = f"{sent - acked} events unacknowledged: the offered load is not sustained"
                break
            stamps = [now] * (due - sent)
            sock.sendall(protocol.batch(sent, stamps))
            for i in range(sent, due):
                send_ns[i] = now
                lateness_ns.append(now - start - int(i * interval_ns))
            sent = due
            batches += 1
            next_flush = now + flush_ns
        next_ns = max(start + int(sent * interval_ns), next_flush)
        wait = max(0.0, (next_ns - now_ns()) / 1e9) if sent < total else 1.0
        readable, _, _ = select.select([sock], [], [], wait)
        if readable:
            data = sock.recv(RECV_BYTES)
            if not data:
                raise ConnectionError("server closed the connection")
            arrived = now_ns()
            through = min(protocol.acked_through(data), sent)
            for i in range(acked, through):
                latencies.append(arrived - send_ns[i])
            acked = max(acked, through)
    elapsed_s = (now_ns() - start) / 1e9
    cpu = time.process_time() - cpu0
    lateness_ns.sort()
    finish(
        {
            "events": acked,
            "offered": total,
            "seconds": elapsed_s,
            "batches": batches,
            "client_cpu_share": round(cpu / elapsed_s, 3),
            "send_lateness_p99_ms": round(lateness_ns[int(0.99 * (len(lateness_ns) - 1))] / 1e6, 3)
            if lateness_ns
            else None,
            "stopped": stopped,
            **quantiles_ms(latencies),
        }
    )


def lat_pravega(
    port: str, segment: str, rate: str, seconds: str, flush_s: str = str(FLUSH_INTERVAL_S)
) -> None:
    protocol = PravegaPaced(int(port), segment)
    paced(protocol, protocol.sock, int(rate), float(seconds), float(flush_s))


def lat_nats(
    port: str, subject: str, rate: str, seconds: str, flush_s: str = str(FLUSH_INTERVAL_S)
) -> None:
    protocol = NatsPaced(int(port), subject)
    paced(protocol, protocol.sock, int(rate), float(seconds), float(flush_s))


def lat_redis(
    port: str, key: str, rate: str, seconds: str, flush_s: str = str(FLUSH_INTERVAL_S)
) -> None:
    protocol = RedisPaced(int(port), key)
    paced(protocol, protocol.sock, int(rate), float(seconds), float(flush_s))


# --------------------------------------------------------------------------- tail reader


def tail_pravega(port: str, segment: str, offset: str, count: str, seconds: str) -> None:
    """Follow ``segment`` from ``offset`` with one parked ``ReadSegment`` at a time;
    each event's first 8 bytes are its send time (``CLOCK_MONOTONIC`` ns)."""
    from headrace.protocols import pravega as p

    sock, frames = pravega_connect(int(port))
    wanted = int(count)
    position = int(offset)
    carry = b""
    latencies: list[int] = []
    request_id = 1
    handshake()
    cpu0 = time.process_time()
    start = now_ns()
    deadline = start + int(float(seconds) * 1e9)
    sock.sendall(p.encode_command(p.ReadSegment(segment, position, TAIL_READ_BYTES, "", 1)))
    while len(latencies) < wanted and now_ns() < deadline:
        readable, _, _ = select.select([sock], [], [], 0.5)
        if not readable:
            continue
        frames.receive()
        arrived = now_ns()
        for kind, payload in frames.available():
            if kind != p.CommandType.SEGMENT_READ:
                raise RuntimeError(f"ReadSegment answered with type {kind}: {payload[:80]!r}")
            name_size = struct.unpack_from(">H", payload)[0]
            at = 2 + name_size + 8 + 2
            size = struct.unpack_from(">i", payload, at)[0]
            data = carry + payload[at + 4 : at + 4 + size]
            position += size
            used = 0
            while len(data) - used >= 16:
                length = _FRAME.unpack_from(data, used)[1]
                if len(data) - used < 8 + length:
                    break
                latencies.append(arrived - _I64.unpack_from(data, used + 8)[0])
                used += 8 + length
            carry = data[used:]
            request_id += 1
            read = p.ReadSegment(segment, position, TAIL_READ_BYTES, "", request_id)
            sock.sendall(p.encode_command(read))
    elapsed_s = (now_ns() - start) / 1e9
    finish(
        {
            "events": len(latencies),
            "seconds": elapsed_s,
            "client_cpu_share": round((time.process_time() - cpu0) / elapsed_s, 3),
            **quantiles_ms(latencies),
        }
    )


# --------------------------------------------------------------------------- producers


def _timed(run: Callable[[], Any]) -> None:
    cpu0 = time.process_time()
    began = time.perf_counter()
    extra = run()
    seconds = time.perf_counter() - began
    finish({"seconds": seconds, "client_cpu_s": time.process_time() - cpu0, **(extra or {})})


def hr_produce(uri: str, scope: str, stream: str, size: str, count: str, every: str = "0") -> None:
    """headrace's ``EventWriter``: ``count`` events, then ``flush``; one in
    ``every`` stamped (``Stamps``)."""
    from headrace.client import PravegaClient

    stamps = Stamps(int(size), int(every))
    event = stamps.plain
    n = int(count)

    async def main() -> None:
        async with PravegaClient(uri) as client:
            writer = await client.create_writer(scope, stream)
            await writer.write_and_wait(event)  # connections set up before timing
            await asyncio.to_thread(handshake)

            async def produce() -> None:
                every = stamps.every or n
                for first in range(0, n, every):  # no per-event test: 100 B is client-bound
                    await writer.write(stamps.event(first) if stamps.every else event)
                    for _ in range(min(every, n - first) - 1):
                        await writer.write(event)
                await writer.flush()

            cpu0 = time.process_time()
            began = time.perf_counter()
            await produce()
            seconds = time.perf_counter() - began
            cpu = time.process_time() - cpu0
            await writer.aclose()
        finish({"seconds": seconds, "client_cpu_s": cpu, "events": n})

    asyncio.run(main())


def raw_produce(
    port: str, segment: str, size: str, count: str, block_bytes: str, in_flight: str
) -> None:
    """``AppendBlockEnd`` frames of about ``block_bytes`` of ``size``-byte events, as
    our client's writer sends them, ``in_flight`` unacknowledged at most, over a
    raw socket: the same bytes for headrace and for ``floor_server.py``.

    Every full block carries the same events, so one block's bytes are built
    once and only its 20-byte tail (event count, last event number, request
    id) is packed per block."""
    from headrace.protocols import pravega as p

    sock, frames = pravega_connect(int(port))
    writer = setup_append(sock, frames, segment)
    encoder = AppendEncoder(writer, int(size))
    per_block = max(1, int(block_bytes) // (int(size) + 8))
    n = int(count)
    window = int(in_flight)
    tail_size = encoder.tail.size
    head = encoder.block([0] * per_block, per_block, 0)[:-tail_size]
    blocks = []  # (events, last event number)
    for first in range(0, n, per_block):
        events = min(per_block, n - first)
        blocks.append((events, first + events))
    handshake()
    cpu0 = time.process_time()
    began = time.perf_counter()
    sent = acked_blocks = 0
    while acked_blocks < len(blocks):
        while sent < len(blocks) and sent - acked_blocks < window:
            events, last = blocks[sent]
            if events == per_block:
                sock.sendall(head)
                sock.sendall(encoder.tail.pack(events, last, sent + 10))
            else:
                sock.sendall(encoder.block([0] * events, last, sent + 10))
            sent += 1
        frames.receive()
        for kind, payload in frames.available():
            if kind != p.CommandType.DATA_APPENDED:
                raise RuntimeError(f"append answered with type {kind}: {payload[:80]!r}")
            acked_blocks += 1
    seconds = time.perf_counter() - began
    finish({"seconds": seconds, "client_cpu_s": time.process_time() - cpu0, "events": n})


def tank_produce(port: str, topic: str, count: str) -> None:
    """TANK bundles of 8192 100-byte messages (``tank_produce.py``'s), one in flight."""
    import tank_produce as tank

    from headrace.client.tank import TankClient

    bundles = tank._bundles(int(count))

    async def main() -> None:
        async with await TankClient.connect("127.0.0.1", int(port)) as client:
            await asyncio.to_thread(handshake)
            cpu0 = time.process_time()
            began = time.perf_counter()
            for bundle in bundles:
                error = await client.produce_bundle(topic, 0, bundle)
                if error.name != "OK":
                    raise SystemExit(f"produce failed: {error!r}")
            seconds = time.perf_counter() - began
            cpu = time.process_time() - cpu0
        finish({"seconds": seconds, "client_cpu_s": cpu, "events": int(count)})

    asyncio.run(main())


def nats_produce(port: str, subject: str, size: str, count: str, every: str = "0") -> None:
    """nats-py ``publish_async`` (4,000 pending; 16 of events over 64 KiB), then
    wait for every ack; one in ``every`` stamped (``Stamps``)."""
    import nats

    stamps = Stamps(int(size), int(every))
    n = int(count)

    async def main() -> None:
        nc = await nats.connect(f"nats://127.0.0.1:{port}", max_reconnect_attempts=0)
        js = nc.jetstream(publish_async_max_pending=4000 if int(size) <= 64 * 1024 else 16)
        await asyncio.to_thread(handshake)
        cpu0 = time.process_time()
        began = time.perf_counter()
        for i in range(n):
            await js.publish_async(subject, stamps.event(i))
        await js.publish_async_completed()
        seconds = time.perf_counter() - began
        cpu = time.process_time() - cpu0
        await nc.close()
        finish({"seconds": seconds, "client_cpu_s": cpu, "events": n})

    asyncio.run(main())


def redis_produce(port: str, key: str, size: str, count: str, every: str = "0") -> None:
    """redis-py pipelines of ``XADD`` (1,000 per pipeline; 10 for 1 MiB events);
    one in ``every`` stamped (``Stamps``)."""
    import redis

    stamps = Stamps(int(size), int(every))
    n = int(count)
    batch = 1000 if int(size) <= 1024 else (100 if int(size) <= 64 * 1024 else 10)
    client = redis.Redis(host="127.0.0.1", port=int(port))
    client.ping()
    handshake()
    cpu0 = time.process_time()
    began = time.perf_counter()
    for start in range(0, n, batch):
        pipe = client.pipeline(transaction=False)
        for i in range(start, min(start + batch, n)):
            pipe.xadd(key, {"v": stamps.event(i)})
        pipe.execute()
    seconds = time.perf_counter() - began
    finish({"seconds": seconds, "client_cpu_s": time.process_time() - cpu0, "events": n})


# --------------------------------------------------------------------------- consumers


def hr_consume(port: str, segment: str, nbytes: str, seconds: str, event_bytes: str = "0") -> None:
    """Read ``segment`` from 0 until ``nbytes`` with 2 MiB ``ReadSegment``s over a
    bare socket (parked at the tail while a producer is still behind). With
    ``event_bytes`` (every event that size), the delivery latency of each
    stamped event (``Stamps``), from the arrival of the reply that completes it."""
    from headrace.protocols import pravega as p

    sock, frames = pravega_connect(int(port))
    end = int(nbytes)
    size = int(event_bytes)
    stride = _FRAME.size + size
    # an event: its header, the stamp, the rest of its payload
    event = struct.Struct(f">{_FRAME.size}xq{size - _I64.size}x") if size else None
    latencies: list[int] = []
    cut = b""  # the start of an event the previous reply ended in
    handshake()
    cpu0 = time.process_time()
    began = time.perf_counter()
    deadline = began + float(seconds)
    offset = 0
    request_id = 1
    while offset < end and time.perf_counter() < deadline:
        sock.sendall(p.encode_command(p.ReadSegment(segment, offset, READ_BYTES, "", request_id)))
        kind, payload = frames.one()
        if kind != p.CommandType.SEGMENT_READ:
            raise RuntimeError(f"ReadSegment answered with type {kind}: {payload[:80]!r}")
        name_size = struct.unpack_from(">H", payload)[0]
        at = 2 + name_size + 8 + 2
        got = struct.unpack_from(">i", payload, at)[0]
        offset += got
        request_id += 1
        if event is not None:
            arrived = now_ns()
            data = memoryview(payload)[at + 4 : at + 4 + got]
            start = 0
            if cut:  # finish the event the previous reply cut
                start = min(stride - len(cut), len(data))
                cut += bytes(data[:start])
                if len(cut) == stride:
                    stamped_latency(cut[_FRAME.size :], arrived, latencies)
                    cut = b""
            whole = start + (len(data) - start) // stride * stride
            for (stamp,) in event.iter_unpack(data[start:whole]):
                if stamp:
                    latencies.append(arrived - stamp)
            if whole < len(data):
                cut = bytes(data[whole:])
    finish(
        {
            "seconds": time.perf_counter() - began,
            "client_cpu_s": time.process_time() - cpu0,
            "bytes": offset,
            "complete": offset >= end,
            **quantiles_ms(latencies),
        }
    )


class EventWalk:
    """Count the events in a segment's bytes as they arrive, checking every header.

    A segment holds events as ``[type 0][length][payload]`` (``encode_event``);
    replies cut them anywhere, so a header may be split across two replies
    (kept in ``carry``) and a payload across many (``skip``). Every header must
    be an ``EVENT`` of ``event_bytes``: a reader that lost or doubled a byte
    anywhere stops at the next header instead of counting socket bytes.
    """

    def __init__(self, event_bytes: int) -> None:
        self.header = _FRAME.pack(0, event_bytes)
        self.stride = _FRAME.size + event_bytes
        self.carry = b""
        self.skip = 0
        self.events = 0
        self.bytes = 0

    def feed(self, data: memoryview) -> None:
        size = len(data)
        self.bytes += size
        stride = self.stride
        position = min(self.skip, size)
        self.skip -= position
        if self.carry and position < size:  # a header cut short by the previous reply
            need = _FRAME.size - len(self.carry)
            self.carry += bytes(data[:need])
            if len(self.carry) < _FRAME.size:
                return
            self._check(self.carry)
            self.carry = b""
            position = min(size, need + stride - _FRAME.size)
            self.skip = need + stride - _FRAME.size - position
        header = self.header
        while size - position >= stride:  # whole events
            if data[position : position + _FRAME.size] != header:
                self._check(bytes(data[position : position + _FRAME.size]))
            self.events += 1
            position += stride
        if size - position >= _FRAME.size:  # an event that goes on in the next reply
            self._check(bytes(data[position : position + _FRAME.size]))
            self.skip = stride - (size - position)
        elif position < size:
            self.carry = bytes(data[position:])

    def _check(self, header: bytes) -> None:
        """Count an event whose header is ``header``; raise if it is not one of ours."""
        if header != self.header:
            kind, length = _FRAME.unpack(header)
            raise RuntimeError(
                f"event {self.events} (in the first {self.bytes} bytes of the stream): type {kind},"
                f" length {length}; expected an event of {self.stride - _FRAME.size} bytes"
            )
        self.events += 1

    @property
    def whole(self) -> bool:
        """No event cut short at the end of what was fed."""
        return not self.carry and not self.skip


def hr_catchup(
    port: str,
    segment: str,
    nbytes: str,
    event_bytes: str,
    depth: str = "4",
    read_bytes: str = str(READ_BYTES),
    rcvbuf: str = "0",
    passes: str = "1",
    seconds: str = "120",
) -> None:
    """Read ``segment`` from 0 to ``nbytes`` as a native catch-up reader does: up to
    ``depth`` ``ReadSegment``s of ``read_bytes`` sent ahead of the reply being
    received (the next ones at the offsets full replies would reach; sent as
    soon as a reply's header has come), each reply's data received with
    ``recv_into`` into one reused buffer and walked event by event
    (``EventWalk``). A reply shorter than asked moves the next read to where it
    ended (replies for the offsets guessed before are received and dropped), and
    a reply that overtook an earlier one is kept until its turn. ``rcvbuf``: the
    socket's ``SO_RCVBUF`` (0: the kernel's autotuning). ``passes``: read the
    stream that many times over (each pass walked and checked on its own), so a
    short stream still makes a measurement of a second or more. The result says
    whether every byte and every event of every pass came (``complete``);
    ``bytes`` and ``events`` are those of all passes."""
    from headrace.protocols import pravega as p

    end = int(nbytes)
    want = int(read_bytes)
    ahead = int(depth)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if int(rcvbuf):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, int(rcvbuf))
    sock.connect(("127.0.0.1", int(port)))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.sendall(p.encode_command(p.Hello(p.WIRE_VERSION, p.OLDEST_COMPATIBLE_VERSION)))
    name = segment.encode()
    # frame header, then SegmentRead's fields before its data: name, offset, two
    # flags and the data's length; the request id follows the data
    fields = struct.Struct(f">ii H{len(name)}s q ? ? i")
    head = bytearray(max(fields.size, 64 * 1024))
    head_view = memoryview(head)
    data = bytearray(want)
    data_view = memoryview(data)

    recv_calls = 0

    def receive(view: memoryview) -> None:
        nonlocal recv_calls
        got = 0
        size = len(view)
        while got < size:
            n = sock.recv_into(view[got:])
            if not n:
                raise ConnectionError("server closed the connection")
            got += n
            recv_calls += 1

    receive(head_view[:8])
    kind, size = _FRAME.unpack_from(head)
    receive(head_view[8 : 8 + size])
    if kind != p.CommandType.HELLO:
        raise RuntimeError(f"expected Hello, got type {kind}")
    walk = EventWalk(int(event_bytes))
    early: dict[int, bytes] = {}  # replies that overtook an earlier one, by offset
    position = 0  # where the stream's bytes walked so far end (in this pass)
    next_offset = 0  # where the next ReadSegment asks from
    in_flight = 0  # ReadSegments whose reply has not begun to arrive
    request_id = 1
    replies = dropped = 0

    def ask() -> None:
        nonlocal next_offset, in_flight, request_id
        requests = []
        while in_flight < ahead and next_offset < end:
            requests.append(
                p.encode_command(p.ReadSegment(segment, next_offset, want, "", request_id))
            )
            request_id += 1
            in_flight += 1
            next_offset += want
        if requests:
            sock.sendall(b"".join(requests))

    def advance(offset: int, got: memoryview) -> None:
        """Walk a reply that starts at ``position``, then any kept ones that follow."""
        nonlocal position, next_offset
        walk.feed(got)
        position = offset + len(got)
        if len(got) < want and position < end and next_offset != position:
            next_offset = position  # short: ask again from here; guesses past it are dropped
            early.clear()
        while position in early:
            kept = early.pop(position)
            walk.feed(memoryview(kept))
            position += len(kept)

    handshake()
    cpu0 = time.process_time()
    began = time.perf_counter()
    deadline = began + float(seconds)
    complete = True
    totals = {"bytes": 0, "events": 0}
    for _ in range(int(passes)):
        walk = EventWalk(int(event_bytes))
        position = next_offset = 0
        ask()
        while (position < end or in_flight) and time.perf_counter() < deadline:
            receive(head_view[:8])
            kind, size = _FRAME.unpack_from(head)
            if kind != p.CommandType.SEGMENT_READ:
                receive(head_view[8 : 8 + min(size, len(head) - 8)])
                raise RuntimeError(f"ReadSegment answered with type {kind}: {head[8:88]!r}")
            receive(head_view[8 : fields.size])
            _, _, _, got_name, offset, _, _, length = fields.unpack_from(head)
            if got_name != name or not 0 <= length <= want:
                raise RuntimeError(f"unexpected SegmentRead for {got_name!r} of {length} bytes")
            in_flight -= 1
            replies += 1
            ask()  # the server starts on the next read while this one's data arrives
            got = data_view[:length]
            receive(got)
            receive(head_view[: size - (fields.size - 8) - length])  # the request id
            if offset == position and position < end:
                if not length:
                    raise RuntimeError(f"empty reply at {position}, short of {end}")
                advance(offset, got)
            elif position < offset < next_offset:
                early[offset] = bytes(got)
            else:
                dropped += 1
        complete = complete and position == end and walk.bytes == end and walk.whole
        totals["bytes"] += walk.bytes
        totals["events"] += walk.events
    seconds_run = time.perf_counter() - began
    finish(
        {
            "seconds": seconds_run,
            "client_cpu_s": time.process_time() - cpu0,
            **totals,
            "passes": int(passes),
            "replies": replies,
            "dropped_replies": dropped,
            "depth": ahead,
            "read_bytes": want,
            "rcvbuf": sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF),
            "recv_calls": recv_calls,
            "complete": complete,
        }
    )


def nats_consume(
    port: str, stream: str, subject: str, count: str, seconds: str, batch: str = "1000"
) -> None:
    """A JetStream pull consumer fetching ``batch`` messages at a time (nats-py),
    acking none."""
    import nats
    from nats.js.api import AckPolicy, ConsumerConfig

    n = int(count)

    async def main() -> None:
        nc = await nats.connect(f"nats://127.0.0.1:{port}", max_reconnect_attempts=0)
        js = nc.jetstream()
        config = ConsumerConfig(ack_policy=AckPolicy.NONE)
        sub = await js.pull_subscribe(subject, durable=None, stream=stream, config=config)
        await asyncio.to_thread(handshake)
        cpu0 = time.process_time()
        began = time.perf_counter()
        deadline = began + float(seconds)
        got = 0
        latencies: list[int] = []
        while got < n and time.perf_counter() < deadline:
            try:
                messages = await sub.fetch(min(int(batch), n - got), timeout=1.0)
            except nats.errors.TimeoutError:
                continue
            arrived = now_ns()
            for message in messages:
                stamped_latency(message.data, arrived, latencies)
            got += len(messages)
        elapsed = time.perf_counter() - began
        cpu = time.process_time() - cpu0
        await nc.close()
        result = {"seconds": elapsed, "client_cpu_s": cpu, "events": got, "complete": got >= n}
        finish({**result, **quantiles_ms(latencies)})

    asyncio.run(main())


def redis_consume(port: str, key: str, count: str, seconds: str, batch: str = "1000") -> None:
    """``XREAD BLOCK`` of up to ``batch`` entries at a time from the start (redis-py)."""
    import redis

    n = int(count)
    client = redis.Redis(host="127.0.0.1", port=int(port))
    client.ping()
    handshake()
    cpu0 = time.process_time()
    began = time.perf_counter()
    deadline = began + float(seconds)
    got = 0
    latencies: list[int] = []
    last = b"0-0"
    while got < n and time.perf_counter() < deadline:
        reply: Any = client.xread({key: last}, count=int(batch), block=1000)
        if not reply:
            continue
        arrived = now_ns()
        entries = reply[0][1]
        for _, fields in entries:
            stamped_latency(fields[b"v"], arrived, latencies)
        got += len(entries)
        last = entries[-1][0]
    finish(
        {
            "seconds": time.perf_counter() - began,
            "client_cpu_s": time.process_time() - cpu0,
            "events": got,
            "complete": got >= n,
            **quantiles_ms(latencies),
        }
    )


# --------------------------------------------------------------------------- connections


def hr_connections(port: str, segment: str, connections: str, seconds: str, block: str) -> None:
    """``connections`` sockets, each its own Pravega writer on ``segment``, each
    sending blocks of ``block`` 100-byte events with one block in flight."""
    socks = []
    states: dict[int, tuple[socket.socket, PravegaPaced]] = {}
    per_block = int(block)
    for _ in range(int(connections)):
        writer = PravegaPaced.__new__(PravegaPaced)
        writer.sock, writer.frames = pravega_connect(int(port))
        writer.encoder = AppendEncoder(setup_append(writer.sock, writer.frames, segment), 100)
        writer.acked = 0
        writer.request_id = 10
        writer.sock.setblocking(False)
        socks.append(writer.sock)
        states[writer.sock.fileno()] = (writer.sock, writer)
    stamps = [0] * per_block
    sent = {fd: 0 for fd in states}
    handshake()
    cpu0 = time.process_time()
    began = time.perf_counter()
    stop_at = began + float(seconds)
    poller = select.epoll()
    for fd, (sock, writer) in states.items():
        sock.send(writer.batch(0, stamps))
        sent[fd] = per_block
        poller.register(fd, select.EPOLLIN)
    acked_total = 0
    while time.perf_counter() < stop_at:
        for fd, _ in poller.poll(0.1):
            sock, writer = states[fd]
            data = sock.recv(RECV_BYTES)
            if not data:
                raise ConnectionError("server closed a connection")
            before = writer.acked
            through = writer.acked_through(data)
            acked_total += through - before
            if through >= sent[fd]:
                sock.send(writer.batch(sent[fd], stamps))
                sent[fd] += per_block
    seconds_run = time.perf_counter() - began
    cpu = time.process_time() - cpu0
    for sock in socks:
        sock.close()
    finish({"seconds": seconds_run, "client_cpu_s": cpu, "events": acked_total})


WORKERS: dict[str, Callable[..., None]] = {
    "lat-pravega": lat_pravega,
    "lat-nats": lat_nats,
    "lat-redis": lat_redis,
    "tail-pravega": tail_pravega,
    "hr-produce": hr_produce,
    "tank-produce": tank_produce,
    "raw-produce": raw_produce,
    "nats-produce": nats_produce,
    "redis-produce": redis_produce,
    "hr-consume": hr_consume,
    "hr-catchup": hr_catchup,
    "nats-consume": nats_consume,
    "redis-consume": redis_consume,
    "hr-connections": hr_connections,
}


if __name__ == "__main__":
    WORKERS[sys.argv[1]](*sys.argv[2:])
