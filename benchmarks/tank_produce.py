"""TANK produce and consume throughput against a real ``headrace serve``.

Run: ``.venv/bin/python benchmarks/tank_produce.py [--messages N] [--in-flight K]``.

The shape of TANK's own published benchmark: 1,000,000 messages of 100 bytes,
in bundles of 8192 messages, from one producer. It starts ``python -m headrace
serve`` (fsync on acknowledge, the default) in a temporary directory, creates
a one-partition topic, and produces the messages with the C++ producer's
compression policy (bundles over 512 messages are Snappy-compressed), each
bundle awaiting its acknowledgement (``--in-flight`` allows more). Bundles are
encoded before the clock starts; the encoding time is printed separately.

Then it consumes the topic from the start twice: once fetching raw chunks
(walking bundle headers only, as a broker-to-disk figure), once decoding every
message with ``TankClient.consume`` (what a Python consumer gets).

MB/s are 10^6 bytes of message content (100 bytes each); the raw consume also
reports wire chunk MB/s. The last line is one JSON object with every figure.
Nothing here asserts speed; it is a measuring tool, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

from _common import free_port as _free_port  # shared with benchmarks/suite.py

from headrace.client.tank import TankClient
from headrace.protocols.tank import (
    BundleMessage,
    Consume,
    ConsumePartition,
    ConsumeResponse,
    ConsumeTopic,
    ConsumeTopicResult,
    ProduceError,
    decode_bundle_header,
    encode_bundle,
)
from headrace.protocols.tank.codec import decode_varint

MESSAGES = 1_000_000
MESSAGE_BYTES = 100
BUNDLE_MESSAGES = 8192
FETCH_SIZE_BYTES = 4 * 1024 * 1024
START_TIMEOUT_S = 60.0
TOPIC = "bench"
OTHER_LISTENERS = ("controller", "segment-store", "lumberjack", "lumberjack-tls", "rsio", "http")


def _start_server(data_dir: Path, port: int) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "headrace", "serve", "--data-dir", str(data_dir)]
    command += ["--tank-port", str(port)]
    for name in OTHER_LISTENERS:
        command += [f"--{name}-port", "0"]
    process = subprocess.Popen(
        command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
    )
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            lines.put(line)
        lines.put("")

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while (remaining := deadline - time.monotonic()) > 0:
        line = lines.get(timeout=remaining)
        if not line:
            break
        if "headrace ready" in line:
            return process
    process.kill()
    raise SystemExit("headrace serve did not start")


def _bundles(
    messages: int,
    message_bytes: int = MESSAGE_BYTES,
    bundle_messages: int = BUNDLE_MESSAGES,
    compress: bool | None = None,
) -> list[bytes]:
    """Bundles of ``bundle_messages`` messages of ``message_bytes`` (hex text).

    ``compress`` None follows the C++ producer's compression policy; the
    suite's 10 KiB shape passes False, so the bytes stored are the bytes counted.
    """
    bundles = []
    now_ms = int(time.time() * 1000)
    for start in range(0, messages, bundle_messages):
        count = min(bundle_messages, messages - start)
        batch = [
            BundleMessage(os.urandom(message_bytes // 2).hex().encode(), now_ms)
            for _ in range(count)
        ]
        bundles.append(encode_bundle(batch, compress=compress))
    return bundles


def _chunk_messages(chunk: bytes) -> int:
    """Messages in a chunk, from bundle headers only."""
    count = 0
    position = 0
    while position < len(chunk):
        length, used = decode_varint(chunk[position : position + 5])
        position += used
        count += decode_bundle_header(chunk[position : position + 19]).msg_count
        position += length
    return count


async def _produce(
    client: TankClient, bundles: list[bytes], in_flight: int, topic: str = TOPIC
) -> float:
    slots = asyncio.Semaphore(in_flight)

    async def one(bundle: bytes) -> None:
        try:
            error = await client.produce_bundle(topic, 0, bundle)
        finally:
            slots.release()
        if error is not ProduceError.OK:
            raise SystemExit(f"produce failed: {error!r}")

    began = time.perf_counter()
    tasks = []
    for bundle in bundles:
        await slots.acquire()
        tasks.append(asyncio.create_task(one(bundle)))  # tasks start, and send, in order
    await asyncio.gather(*tasks)
    return time.perf_counter() - began


async def _consume_raw(client: TankClient, messages: int) -> tuple[float, int]:
    began = time.perf_counter()
    seq_num = 1
    wire_bytes = 0
    while seq_num <= messages:
        wanted = (ConsumePartition(0, seq_num, FETCH_SIZE_BYTES),)
        response = await client.request(
            Consume(client.next_request_id(), (ConsumeTopic(TOPIC, wanted),))
        )
        assert isinstance(response, ConsumeResponse)
        topic = response.topics[0]
        assert isinstance(topic, ConsumeTopicResult)
        part = topic.partitions[0]
        wire_bytes += len(part.chunk)
        seq_num = part.base_seq_num + _chunk_messages(part.chunk)
    return time.perf_counter() - began, wire_bytes


async def _consume_decoded(client: TankClient, messages: int) -> float:
    began = time.perf_counter()
    seq_num = 0
    got = 0
    while got < messages:
        result = await client.consume(TOPIC, 0, seq_num, fetch_size=FETCH_SIZE_BYTES)
        got += len(result.messages)
        seq_num = result.next_seq_num
    return time.perf_counter() - began


async def _run(port: int, messages: int, in_flight: int) -> dict[str, object]:
    began = time.perf_counter()
    bundles = _bundles(messages)
    encode_s = time.perf_counter() - began
    content_mb = messages * MESSAGE_BYTES / 1e6
    async with await TankClient.connect("127.0.0.1", port) as client:
        await client.create_topic(TOPIC, 1)
        produce_s = await _produce(client, bundles, in_flight)
        print(
            f"produce: {messages} messages of {MESSAGE_BYTES} B in {len(bundles)} bundles, "
            f"{in_flight} in flight: {produce_s:.2f} s, {messages / produce_s:,.0f} messages/s, "
            f"{content_mb / produce_s:.1f} MB/s (encoding beforehand took {encode_s:.2f} s)"
        )
        raw_s, wire_bytes = await _consume_raw(client, messages)
        print(
            f"consume (raw chunks): {raw_s:.2f} s, {messages / raw_s:,.0f} messages/s, "
            f"{content_mb / raw_s:.1f} MB/s of messages, "
            f"{wire_bytes / 1e6 / raw_s:.1f} MB/s on the wire"
        )
        decoded_s = await _consume_decoded(client, messages)
        print(
            f"consume (decoded): {decoded_s:.2f} s, {messages / decoded_s:,.0f} messages/s, "
            f"{content_mb / decoded_s:.1f} MB/s"
        )
    return {
        "benchmark": "tank_produce",
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "messages": messages,
        "message_bytes": MESSAGE_BYTES,
        "bundle_messages": BUNDLE_MESSAGES,
        "bundles": len(bundles),
        "in_flight": in_flight,
        "encode_s": round(encode_s, 3),
        "produce_s": round(produce_s, 3),
        "produce_messages_per_s": round(messages / produce_s),
        "produce_mb_per_s": round(content_mb / produce_s, 2),
        "consume_raw_s": round(raw_s, 3),
        "consume_raw_messages_per_s": round(messages / raw_s),
        "consume_raw_mb_per_s": round(content_mb / raw_s, 2),
        "consume_raw_wire_mb_per_s": round(wire_bytes / 1e6 / raw_s, 2),
        "consume_decoded_s": round(decoded_s, 3),
        "consume_decoded_messages_per_s": round(messages / decoded_s),
        "consume_decoded_mb_per_s": round(content_mb / decoded_s, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--messages", type=int, default=MESSAGES)
    parser.add_argument("--in-flight", type=int, default=1, help="produce requests in flight")
    parser.add_argument("--dir", type=Path, help="parent of the temporary data directory")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="tank-bench-", dir=args.dir))
    port = _free_port()
    process = _start_server(scratch / "data", port)
    try:
        figures = asyncio.run(_run(port, args.messages, args.in_flight))
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stderr is not None:
            process.stderr.close()
        shutil.rmtree(scratch, ignore_errors=True)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
