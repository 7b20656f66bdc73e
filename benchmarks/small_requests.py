"""Small requests pipelined through each front door, ``--fsync never`` against ``always``.

Run: ``.venv/bin/python benchmarks/small_requests.py [--quick] [--rounds N]``.

Builds nothing itself. For each round it starts a fresh ``headrace serve``
under ``never`` and then ``always`` (interleaved, so a busy machine moves both)
and runs, against each:

* **TANK, one-message bundles**: ``--messages`` produces of one 100-byte
  message each, all written before any reply is read (``tank-cli benchmark
  p2b -c N -s 100 -B 1 -R``). With ``TANK_CLI`` naming TANK's ``tank-cli``
  that client runs; otherwise a Python producer in this script sends the same
  requests (encoded before the clock starts, written by one thread while
  another reads the replies), so the figure is the server's.
* **TANK, bundles of 8,192**: the same messages in bundles of 8,192.
* **Pravega**: ``--writers`` writers of the project's client, one event each,
  then ``flush``, all at once.
* **Lumberjack**: one connection sending v2 windows of one event, each
  awaiting its ack (pylogbeat's shape).

With ``TANK_BROKER`` naming TANK's broker binary, the TANK rows also run
against it, and the ratios headrace/broker are printed. The last line is one
JSON object with every figure and the ratios ``always``/``never``. Nothing here
asserts speed; it is a measuring tool, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _common import free_port, machine, start_headrace, stop

from headrace.client.pravega import PravegaClient
from headrace.client.tank import TankClient
from headrace.client.writer import EventWriter
from headrace.protocols import tank as t
from headrace.protocols.tank.codec import decode_response, encode

MESSAGE_BYTES = 100
MESSAGES = 200_000
QUICK_MESSAGES = 20_000
BIG_BUNDLE = 8192
BIG_MESSAGES = 2_000_000
QUICK_BIG_MESSAGES = 200_000
WRITERS = 200
LUMBERJACK_WINDOWS = 2_000
IO_TIMEOUT_S = 120.0
TOPIC = "small"
SEND_CHUNK_BYTES = 1 << 20
"""The Python producer writes its pre-encoded requests in pieces this size."""


def _produce_requests(messages: int, bundle: int) -> bytes:
    """Every produce request of the run, encoded (request ids from 1)."""
    now_ms = int(time.time() * 1000)
    payload = b"x" * MESSAGE_BYTES
    frames = []
    count = 0
    request_id = 0
    while count < messages:
        size = min(bundle, messages - count)
        encoded = t.encode_bundle([t.BundleMessage(payload, now_ms)] * size, compress=False)
        request_id += 1
        partitions = (t.ProducePartition(0, encoded, 0),)
        frames.append(encode(t.Produce(request_id, (t.ProduceTopic(TOPIC, partitions),))))
        count += size
    return b"".join(frames)


def _python_producer(port: int, data: bytes, requests: int) -> float:
    """Write ``data`` (``requests`` produces) on one connection while reading the
    replies; seconds from the first byte sent to the last reply. Fails on an error."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.settimeout(IO_TIMEOUT_S)
    failed: list[BaseException] = []

    def send() -> None:
        try:
            view = memoryview(data)
            for start in range(0, len(view), SEND_CHUNK_BYTES):
                sock.sendall(view[start : start + SEND_CHUNK_BYTES])
        except OSError as exc:
            failed.append(exc)

    sender = threading.Thread(target=send, daemon=True)
    began = time.perf_counter()
    sender.start()
    buffer = bytearray()
    answered = 0
    ok_tail: bytes | None = None
    try:
        while answered < requests:
            chunk = sock.recv(1 << 20)
            if not chunk:
                raise SystemExit(f"the server closed after {answered} of {requests} replies")
            buffer += chunk
            position = 0
            while len(buffer) - position >= 5:
                size = int.from_bytes(buffer[position + 1 : position + 5], "little")
                end = position + 5 + size
                if end > len(buffer):
                    break
                if buffer[position] == t.MessageType.PRODUCE:
                    tail = bytes(buffer[position + 9 : end])  # after the request id
                    if ok_tail is None:
                        ok_tail = _checked_ok(bytes(buffer[position:end]))
                    elif tail != ok_tail:
                        _checked_ok(bytes(buffer[position:end]))
                    answered += 1
                position = end
            del buffer[:position]
    finally:
        elapsed = time.perf_counter() - began
        sock.close()
        sender.join(IO_TIMEOUT_S)
    if failed:
        raise SystemExit(f"sending failed: {failed[0]}")
    return elapsed


def _checked_ok(frame: bytes) -> bytes:
    """The bytes after the request id of an all-OK produce reply; exits on an error."""
    request_id = int.from_bytes(frame[5:9], "little")
    partitions = (t.ProducePartition(0, b"", 0),)
    request = t.Produce(request_id, (t.ProduceTopic(TOPIC, partitions),))
    response = decode_response(frame[0], frame[5:], request)
    assert isinstance(response, t.ProduceResponse)
    for topic in response.topics:
        errors = [p.error for p in topic.partitions]
        if topic.error is not t.ProduceError.OK or any(e is not t.ProduceError.OK for e in errors):
            raise SystemExit(f"produce failed: {topic.error!r} {errors!r}")
    return frame[9:]


def _tank_cli(cli: str, port: int, messages: int, bundle: int) -> float:
    """TANK's own client (``tank-cli benchmark p2b``), timed from outside."""
    command = [cli, "-b", f"127.0.0.1:{port}", "-t", TOPIC, "benchmark", "p2b"]
    command += ["-c", str(messages), "-s", str(MESSAGE_BYTES), "-B", str(bundle), "-R"]
    began = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=IO_TIMEOUT_S * 5)
    elapsed = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"tank-cli failed: {done.stderr.strip()[-400:]}")
    return elapsed


async def _create_topic(port: int) -> None:
    async with await TankClient.connect("127.0.0.1", port) as client:
        await client.create_topic(TOPIC, 1)


def _tank_row(port: int, messages: int, bundle: int, cli: str | None) -> float:
    """Messages/s of one TANK run (the topic is made first if missing)."""
    if cli is not None:
        return messages / _tank_cli(cli, port, messages, bundle)
    data = _produce_requests(messages, bundle)
    requests = -(-messages // bundle)
    return messages / _python_producer(port, data, requests)


async def _pravega_row(controller_port: int, writers: int, stream: str) -> float:
    """Events/s: ``writers`` writers, one event each, then flush, all at once."""
    async with PravegaClient(f"tcp://127.0.0.1:{controller_port}") as client:
        await client.controller.create_scope("small")
        await client.controller.create_stream("small", stream)
        opened = [await client.create_writer("small", stream) for _ in range(writers)]
        event = b"y" * MESSAGE_BYTES

        async def one(writer: EventWriter) -> None:
            await writer.write(event)
            await writer.flush()

        began = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*(one(w) for w in opened)), IO_TIMEOUT_S)
        elapsed = time.perf_counter() - began
        for writer in opened:
            await writer.aclose()
    return writers / elapsed


async def _lumberjack_row(port: int, windows: int) -> float:
    """Events/s: one connection, v2 windows of one event, each awaiting its ack."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    payload = json.dumps({"message": "z" * (MESSAGE_BYTES - 16)}).encode()
    window = b"2W" + struct.pack(">I", 1) + b"2J" + struct.pack(">II", 1, len(payload)) + payload
    try:
        began = time.perf_counter()
        for _ in range(windows):
            writer.write(window)
            while True:
                frame = await asyncio.wait_for(reader.readexactly(6), IO_TIMEOUT_S)
                if frame[:2] != b"2A":
                    raise SystemExit(f"not an ack: {frame!r}")
                if struct.unpack(">I", frame[2:])[0] == 1:
                    break  # Ack(0) is a keepalive
        elapsed = time.perf_counter() - began
    finally:
        writer.close()
        await writer.wait_closed()
    return windows / elapsed


def _headrace_round(
    fsync: str, sizes: argparse.Namespace, cli: str | None, scratch: Path, key: str
) -> dict[str, float]:
    ports = {"tank": free_port(), "controller": free_port(), "segment-store": free_port()}
    ports["lumberjack"] = free_port()
    data_dir = scratch / f"{key}-{fsync}"
    proc = start_headrace(data_dir, ports, fsync)
    try:
        asyncio.run(_create_topic(ports["tank"]))
        row = {
            "tank_b1": _tank_row(ports["tank"], sizes.messages, 1, cli),
            "tank_b8192": _tank_row(ports["tank"], sizes.big_messages, BIG_BUNDLE, cli),
        }
        if not sizes.tank_only:
            row["pravega"] = asyncio.run(_pravega_row(ports["controller"], sizes.writers, key))
            row["lumberjack"] = asyncio.run(_lumberjack_row(ports["lumberjack"], sizes.windows))
        return row
    finally:
        stop(proc)
        shutil.rmtree(data_dir, ignore_errors=True)


def _broker_round(
    broker: str, sizes: argparse.Namespace, cli: str | None, scratch: Path
) -> dict[str, float]:
    """TANK's broker on a fresh base directory (its topic made as a directory)."""
    base = scratch / "tank-broker"
    (base / TOPIC / "0").mkdir(parents=True)
    port = free_port()
    proc = subprocess.Popen(
        [broker, "-p", str(base), "-l", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit("the TANK broker did not start") from None
                time.sleep(0.05)  # polling a port under a deadline
        return {
            "tank_b1": _tank_row(port, sizes.messages, 1, cli),
            "tank_b8192": _tank_row(port, sizes.big_messages, BIG_BUNDLE, cli),
        }
    finally:
        stop(proc)
        shutil.rmtree(base, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tenth of the messages")
    parser.add_argument("--rounds", type=int, default=2, help="never/always pairs (medians)")
    parser.add_argument("--messages", type=int, help="one-message bundles per TANK run")
    parser.add_argument("--tank-only", action="store_true", help="skip Pravega and Lumberjack")
    parser.add_argument("--dir", type=Path, help="where the data directories go")
    args = parser.parse_args()
    args.messages = args.messages or (QUICK_MESSAGES if args.quick else MESSAGES)
    args.big_messages = QUICK_BIG_MESSAGES if args.quick else BIG_MESSAGES
    args.writers = WRITERS // 4 if args.quick else WRITERS
    args.windows = LUMBERJACK_WINDOWS // 4 if args.quick else LUMBERJACK_WINDOWS
    cli = os.environ.get("TANK_CLI") or None
    broker = os.environ.get("TANK_BROKER") or None
    if cli is None:
        print("TANK_CLI not set: the TANK rows use this script's Python producer")
    figures: dict[str, list[dict[str, float]]] = {"never": [], "always": [], "broker": []}
    with tempfile.TemporaryDirectory(prefix="headrace-small-", dir=args.dir) as scratch:
        for number in range(args.rounds):
            for fsync in ("never", "always"):
                row = _headrace_round(fsync, args, cli, Path(scratch), f"r{number}")
                figures[fsync].append(row)
                print(f"round {number + 1} {fsync}: " + _text(row))
            if broker is not None:
                row = _broker_round(broker, args, cli, Path(scratch))
                figures["broker"].append(row)
                print(f"round {number + 1} TANK broker: " + _text(row))
    if broker is None:
        print("TANK_BROKER not set: no broker row")
    medians = {
        key: {name: statistics.median(r[name] for r in rows) for name in rows[0]}
        for key, rows in figures.items()
        if rows
    }
    ratios = {
        f"{name}_always_over_never": medians["always"][name] / medians["never"][name]
        for name in medians["never"]
    }
    for key in ("never", "always"):
        for name in medians.get("broker", {}):
            ratios[f"{name}_{key}_over_broker"] = medians[key][name] / medians["broker"][name]
    for name, ratio in ratios.items():
        print(f"{name}: {ratio:.2f}x")
    print(
        json.dumps(
            {
                "messages": args.messages,
                "big_messages": args.big_messages,
                "message_bytes": MESSAGE_BYTES,
                "client": "tank-cli" if cli else "python",
                "per_s": medians,
                "ratios": ratios,
                "machine": machine(),
                "python": sys.version.split()[0],
            }
        )
    )


def _text(row: dict[str, float]) -> str:
    return ", ".join(f"{name} {value:,.0f}/s" for name, value in row.items())


if __name__ == "__main__":
    main()
