"""Every stream through every door (``docs/interop.md``): one server, each front door
writes one small stream, each reader reads every stream, and every cell of the
matrix checks what that reader must see of what that writer wrote: the bytes,
the order per key, and keys and timestamps where both doors carry them.

Writers: the real ``pravega`` client's event writer and byte stream writer (one
child process), TANK produce, Lumberjack, RS-IO offer, the Spark sink. Readers:
the real ``pravega`` client's reader groups (one child process; the byte stream,
which holds no events, through headrace's own reader group), the record reader
(and the CLI for the byte stream), RS-IO subscriptions, one Spark batch read of
every stream, and TANK consumes (``SCOPE.STREAM`` topics).

Every read is done once and kept (``_Reads``); the cells only compare. The
Spark session is the run's (``tests/spark/conftest.py``).
"""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import pytest

from headrace.client import PravegaClient, ScalingPolicy, StreamConfig
from headrace.client.rsio import RsioClient, decode_record
from headrace.client.tank import TankClient
from headrace.protocols.lumberjack import JsonData, ProtocolVersion, WindowSize
from headrace.protocols.tank import BundleMessage, CreateTopicResult, decode_bundle
from tests._real_pravega import run_scenario
from tests._server import FREE, ServerProcess, server_env
from tests.lumberjack.harness import LumberjackClient

pytestmark = pytest.mark.slow

SCOPE: Final = "ij"
KEYS: Final = ("k0", "k1")
PER_KEY: Final = 3
TIME_0_MS: Final = 1_700_000_000_000
RAW: Final = bytes(range(1, 200)) * 30
"""A byte stream's bytes: more than one TANK piece (``RAW_PIECE_BYTES``)."""
IO_TIMEOUT_S: Final = 60.0
WRITERS: Final = ("pravega", "bytes", "tank", "lumberjack", "rsio", "spark")
READERS: Final = ("pravega", "records", "rsio", "spark", "tank")

Item = tuple[bytes | None, bytes, int | None]
"""What a reader saw of one record: (key, value, timestamp ms)."""


@dataclass
class Written:
    """What one door wrote into its stream, in write order."""

    stream: str  # scope/stream
    items: list[Item] = field(default_factory=list)
    raw: bytes | None = None  # a byte stream's bytes
    keyed: bool = False  # keys and timestamps are stored (TANK bundles)

    @property
    def topic(self) -> str:
        scope, _, stream = self.stream.partition("/")
        return stream if scope == "tank" else f"{scope}.{stream}"


def _value(key: str, n: int) -> bytes:
    return f"{key}:{n}".encode()


def _item(message: BundleMessage) -> Item:
    return message.key or None, message.content, message.timestamp_ms


def _plain(value: bytes) -> bytes:
    """A Lumberjack document without the ``@metadata`` the door adds (the client's
    address), in one spelling; any other value as it is."""
    if not value.startswith(b"{"):
        return value
    doc = json.loads(value)
    doc.pop("@metadata", None)
    return json.dumps(doc, sort_keys=True).encode()


def _key_of(value: bytes) -> str:
    """The writer's key, from the value (a Lumberjack document carries it as ``k``)."""
    if value.startswith(b"{"):
        return str(json.loads(value)["k"])
    return value.split(b":")[0].decode()


class Server(ServerProcess):
    def __init__(self, data_dir: Path) -> None:
        listeners = ["controller", "segment_store", "tank", "lumberjack", "rsio"]
        super().__init__(
            data_dir,
            ports=dict.fromkeys(listeners, FREE),
            fsync="never",
            args=["--lumberjack-stream", f"{SCOPE}/beats"],
            wait_for=listeners,
        )


# --------------------------------------------------------------------------- writing


def _write_all(server: Server, spark: Any) -> dict[str, Written]:
    written: dict[str, Written] = {}
    pairs = [(k, _value(k, n)) for n in range(PER_KEY) for k in KEYS]
    events = [[k, v.decode("latin-1")] for k, v in pairs]
    run_scenario("interop_write", server.uri, SCOPE, json.dumps(events), RAW.hex())
    written["pravega"] = Written(f"{SCOPE}/events", [(None, v, None) for _, v in pairs])
    written["bytes"] = Written(f"{SCOPE}/bytes", raw=RAW)
    asyncio.run(asyncio.wait_for(_write_async(server, written, pairs), IO_TIMEOUT_S))
    docs = [
        json.dumps({"k": k, "n": n}, sort_keys=True).encode() for n in range(PER_KEY) for k in KEYS
    ]
    with LumberjackClient(server.port_of("lumberjack"), ProtocolVersion.V2) as lj:
        lj.send(WindowSize(len(docs)), *(JsonData(i + 1, d) for i, d in enumerate(docs)))
        lj.wait_for_ack(len(docs))
    written["lumberjack"] = Written(f"{SCOPE}/beats", [(None, d, None) for d in docs])
    rows = [(k, v.decode()) for k, v in pairs]
    spark.createDataFrame(rows, "key string, value string").coalesce(1).write.format(
        "headrace"
    ).option("controller", server.uri).option("stream", f"{SCOPE}/sparked").mode("append").save()
    written["spark"] = Written(f"{SCOPE}/sparked", [(None, v, None) for _, v in pairs])
    return written


async def _write_async(
    server: Server, written: dict[str, Written], pairs: list[tuple[str, bytes]]
) -> None:
    async with PravegaClient(server.uri) as client:
        # Sealed: a TANK consumer sees a byte stream's last, shorter piece only then.
        await client.controller.seal_stream(SCOPE, "bytes")
        for stream in ("offered", "sparked"):
            config = StreamConfig(ScalingPolicy.fixed(2))
            await client.controller.create_stream(SCOPE, stream, config)
    # TANK: per key one partition; a bundle of two messages, then one of one.
    tank = await TankClient.connect("127.0.0.1", server.port_of("tank"))
    async with tank:
        assert await tank.create_topic("interop", 2) is CreateTopicResult.CREATED
        items: list[Item] = []
        for partition, key in enumerate(KEYS):
            msgs = [
                BundleMessage(_value(key, n), TIME_0_MS + n, key.encode()) for n in range(PER_KEY)
            ]
            await tank.produce("interop", partition, msgs[:2])
            await tank.produce("interop", partition, msgs[2:])
            items += [(m.key, m.content, m.timestamp_ms) for m in msgs]
        written["tank"] = Written("tank/interop", items, keyed=True)
    rsio = await RsioClient.connect("127.0.0.1", server.port_of("rsio"))
    try:
        for key in KEYS:
            values = [v for k, v in pairs if k == key]
            await rsio.offer(f"{SCOPE}/offered", values, key=key)
    finally:
        await rsio.aclose()
    written["rsio"] = Written(f"{SCOPE}/offered", [(None, v, None) for _, v in pairs])


# --------------------------------------------------------------------------- reading


class _Reads:
    """Each reader's view of every written stream, read on first use and kept."""

    def __init__(self, server: Server, spark: Any, written: dict[str, Written]) -> None:
        self.server = server
        self.spark = spark
        self.written = written
        self._got: dict[str, dict[str, list[Item]]] = {}
        self.cli_args = ["--controller", server.uri, "-f", "json"]
        self.appended_ms = (0, 0)
        """When the writes began and ended (epoch ms): every append time is within."""

    def of(self, reader: str) -> dict[str, list[Item]]:
        if reader not in self._got:
            read: Callable[[], dict[str, list[Item]]] = getattr(self, f"_read_{reader}")
            self._got[reader] = read()
        return self._got[reader]

    def _run(self, work: Callable[[PravegaClient], Any]) -> Any:
        async def main() -> Any:
            async with PravegaClient(self.server.uri) as client:
                return await work(client)

        return asyncio.run(asyncio.wait_for(main(), IO_TIMEOUT_S))

    def _read_pravega(self) -> dict[str, list[Item]]:
        events = [w for w in self.written.values() if w.raw is None]
        wanted = []
        for w in events:
            count = len(w.items) if not w.keyed else 2 * len(KEYS)  # TANK: stored bundles
            wanted.append([*w.stream.split("/"), count])
        got = run_scenario("read_streams", self.server.uri, json.dumps(wanted))
        out = {
            name: [(None, e.encode("latin-1"), None) for e in values]
            for name, values in got.items()
        }

        async def group(client: PravegaClient) -> list[Item]:
            # The byte stream through headrace's reader group (no events: raw chunks).
            rg = await client.reader_group(SCOPE, "bytes-group", [f"{SCOPE}/bytes"])
            reader = await rg.create_reader("r1")
            items: list[Item] = []
            try:
                while (event := await reader.read_next(timeout_s=1.0)) is not None:
                    items.append((None, event.data, None))
            finally:
                await reader.aclose()
            return items

        out[f"{SCOPE}/bytes"] = self._run(group)
        return out

    def _read_records(self) -> dict[str, list[Item]]:
        async def work(client: PravegaClient) -> dict[str, list[Item]]:
            out: dict[str, list[Item]] = {}
            for w in self.written.values():
                scope, stream = w.stream.split("/")
                async with client.record_reader(scope, stream) as reader:
                    records = [r async for r in reader]
                formats = {r.format for r in records}
                assert formats == {"bytes" if w.raw else "bundle" if w.keyed else "event"}
                out[w.stream] = [(r.key, r.value, r.timestamp_ms) for r in records]
            return out

        return dict(self._run(work))

    def _read_rsio(self) -> dict[str, list[Item]]:
        async def cut(client: PravegaClient, stream: str) -> str:
            scope, name = stream.split("/")
            parts = []
            for seg in await client.controller.get_current_segments(scope, name):
                length = (await client.segments.stat(seg.segment)).length
                parts.append(f"{seg.segment.segment_id}:{length}")
            return ",".join(parts)

        async def work(client: PravegaClient) -> dict[str, list[Item]]:
            out: dict[str, list[Item]] = {}
            rsio = await RsioClient.connect("127.0.0.1", self.server.port_of("rsio"))
            try:
                for w in self.written.values():
                    until = await cut(client, w.stream)  # none for a sealed stream: it ends
                    query = f"&until={until}" if until else ""
                    sub = rsio.subscribe(f"{w.stream}?format=record{query}")
                    records = [decode_record(e) async for e in sub]
                    out[w.stream] = [(r.key, r.value, r.timestamp_ms) for r in records]
            finally:
                await rsio.aclose()
            return out

        return dict(self._run(work))

    def _read_spark(self) -> dict[str, list[Item]]:
        streams = ",".join(w.stream for w in self.written.values())
        rows = (
            self.spark.read.format("headrace")
            .option("controller", self.server.uri)
            .option("streams", streams)
            .load()
            .coalesce(1)  # one task reads every range in turn: fewer Python workers
            .collect()
        )
        out: dict[str, list[Item]] = {w.stream: [] for w in self.written.values()}
        for row in rows:
            stamp = row.timestamp
            ms = None if stamp is None else round(stamp.timestamp() * 1000)
            out[f"{row.scope}/{row.stream}"].append((row.key, bytes(row.value), ms))
        return out

    def _read_tank(self) -> dict[str, list[Item]]:
        async def work() -> dict[str, list[Item]]:
            out: dict[str, list[Item]] = {}
            tank = await TankClient.connect("127.0.0.1", self.server.port_of("tank"))
            async with tank:
                for w in self.written.values():
                    partitions = await tank.discover_partitions(w.topic)
                    assert partitions, f"no partitions for topic {w.topic}"
                    items: list[Item] = []
                    for pid, seqs in enumerate(partitions):
                        seq = 0
                        while seqs.high_water_mark and seq <= seqs.high_water_mark:
                            got = await tank.consume(w.topic, pid, seq)
                            assert not got.unknown_topic and got.messages, (w.topic, pid, got)
                            items += [
                                (m.key or None, m.content, m.timestamp_ms) for m in got.messages
                            ]
                            seq = got.next_seq_num
                    out[w.stream] = items
            return out

        return asyncio.run(asyncio.wait_for(work(), IO_TIMEOUT_S))


@pytest.fixture(scope="module")
def reads(tmp_path_factory: pytest.TempPathFactory, spark: Any) -> Iterator[_Reads]:
    server = Server(tmp_path_factory.mktemp("interop") / "data")
    server.start()
    try:
        began_ms = int(time.time() * 1000)
        reads = _Reads(server, spark, _write_all(server, spark))
        reads.appended_ms = (began_ms, int(time.time() * 1000))
        yield reads
    finally:
        server.stop()


# --------------------------------------------------------------------------- the matrix


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("writer", WRITERS)
def test_every_stream_through_every_door(reads: _Reads, writer: str, reader: str) -> None:
    w = reads.written[writer]
    got = reads.of(reader)[w.stream]
    if w.raw is not None:  # a byte stream: its bytes as they are, in order
        assert b"".join(value for _, value, _ in got) == w.raw
        assert all(key is None for key, _, _ in got)
        assert all(stamp in (None, 0) or _appended(reads, stamp) for _, _, stamp in got)
        return
    if writer == "tank" and reader == "pravega":  # a Pravega event is a whole bundle
        got = [
            (m.key or None, m.content, m.timestamp_ms)
            for _, bundle, _ in got
            for m in decode_bundle(bundle, 1)
        ]
    values = [_plain(value) for _, value, _ in got]
    assert Counter(values) == Counter(value for _, value, _ in w.items)
    for key in KEYS:  # order per key
        assert [v for v in values if _key_of(v) == key] == [
            v for _, v, _ in w.items if _key_of(v) == key
        ]
    if w.keyed:  # keys and timestamps travel with TANK bundles to every door
        assert sorted(got, key=lambda i: i[1]) == sorted(w.items, key=lambda i: i[1])
    else:  # no key is stored; each door with a time gives the time it was appended
        assert all(key is None for key, _, _ in got)
        stamps = [stamp for _, _, stamp in got]
        if reader == "pravega":  # the real client's events carry no time
            assert set(stamps) == {None}
        else:
            assert all(_appended(reads, stamp) for stamp in stamps), stamps[:5]


def _appended(reads: _Reads, stamp: int | None) -> bool:
    """Whether ``stamp`` is a time within the writes (an append time)."""
    began, ended = reads.appended_ms
    return stamp is not None and began - 1 <= stamp <= ended + 1


def test_the_cli_reads_a_byte_stream_as_raw_chunks(reads: _Reads) -> None:
    """``headrace read`` on a Pravega byte stream: its bytes, each record marked ``bytes``."""
    done = subprocess.run(
        [sys.executable, "-m", "headrace", "read", f"{SCOPE}/bytes", *reads.cli_args],
        capture_output=True,
        timeout=IO_TIMEOUT_S,
        env=server_env(),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert {(r["format"], r["encoding"]) for r in records} == {("bytes", "base64")}
    assert b"".join(base64.b64decode(r["value"]) for r in records) == RAW


def test_tank_produce_into_a_pravega_stream_stores_ordinary_events(reads: _Reads) -> None:
    """A TANK produce to topic ``SCOPE.STREAM`` appends each message as an event,
    numbered after the events already there."""

    async def work() -> list[bytes]:
        async with PravegaClient(reads.server.uri) as client:
            config = StreamConfig(ScalingPolicy.fixed(1))
            await client.controller.create_stream(SCOPE, "produced", config)
            async with await client.create_writer(SCOPE, "produced") as writer:
                await writer.write(b"p:0")
                await writer.flush()
            tank = await TankClient.connect("127.0.0.1", reads.server.port_of("tank"))
            async with tank:
                topic = f"{SCOPE}.produced"
                await tank.produce(
                    topic, 0, [BundleMessage(b"t:0", 5, b"k"), BundleMessage(b"t:1")]
                )
                got = await tank.consume(topic, 0, 0)
                assert [(m.seq_num, m.content) for m in got.messages] == [
                    (1, b"p:0"),
                    (2, b"t:0"),
                    (3, b"t:1"),
                ]
            async with client.record_reader(SCOPE, "produced") as reader:
                return [r.value async for r in reader if r.format == "event"]

    assert asyncio.run(asyncio.wait_for(work(), IO_TIMEOUT_S)) == [b"p:0", b"t:0", b"t:1"]
