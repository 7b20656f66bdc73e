"""Streams written by other protocols, Id reuse, and TLS."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from headrace.client import PravegaClient
from headrace.client.rsio import RsioClient, decode_record
from headrace.client.tank import TankClient
from headrace.client.tls import TlsOptions
from headrace.protocols.rsio import (
    Cancel,
    OnComplete,
    OnNext,
    ReactiveConnection,
    Role,
    ServerHello,
    Subscribe,
    SubscriberState,
)
from headrace.protocols.tank import BundleMessage

from .conftest import WAIT_S, Server, new_stream, start_server, stop, write_events


async def test_tank_topic_is_read_as_records(server: Server) -> None:
    tank = await TankClient.connect("127.0.0.1", server.tank_port)
    try:
        await tank.create_topic("rsio-topic", 1)
        await tank.produce(
            "rsio-topic",
            0,
            [
                BundleMessage(b"v1", 1_700_000_000_001, b"k1"),
                BundleMessage(b"v2", 1_700_000_000_002, b""),
            ],
        )
        await tank.produce("rsio-topic", 0, [BundleMessage(b"v3", 1_700_000_000_003, b"k3")])
    finally:
        await tank.aclose()
    client = await RsioClient.connect("127.0.0.1", server.rsio_port)
    try:
        sub = client.subscribe("tank/rsio-topic?format=record", batch=2)
        records = [decode_record(await asyncio.wait_for(sub.next(), WAIT_S)) for _ in range(3)]
        await sub.cancel()
        sub = client.subscribe("tank/rsio-topic", batch=2)  # format=value: the messages
        values = [await asyncio.wait_for(sub.next(), WAIT_S) for _ in range(3)]
        await sub.cancel()
    finally:
        await client.goodbye()
    assert [(r.key, r.value, r.timestamp_ms, r.index) for r in records] == [
        (b"k1", b"v1", 1_700_000_000_001, 0),
        (None, b"v2", 1_700_000_000_002, 1),
        (b"k3", b"v3", 1_700_000_000_003, 0),
    ]
    assert records[0].offset == records[1].offset < records[2].offset
    assert values == [b"v1", b"v2", b"v3"]


async def test_reused_id_gets_nothing_of_the_cancelled_subscription(
    server: Server, pravega: PravegaClient
) -> None:
    old_scope, old_stream = await new_stream(pravega)
    await write_events(pravega, old_scope, old_stream, [b"old%d" % i for i in range(1000)])
    new_scope, new_stream_ = await new_stream(pravega)
    await write_events(pravega, new_scope, new_stream_, [b"new0", b"new1"])
    await pravega.controller.seal_stream(new_scope, new_stream_)
    conn = ReactiveConnection(Role.CLIENT)
    reader, writer = await asyncio.open_connection("127.0.0.1", server.rsio_port)
    try:
        # Unbounded demand on the old stream, cancelled at once, the Id reused at once.
        conn.send(Subscribe(f"{old_scope}/{old_stream}", 1, 2**63 - 1))
        conn.send(Cancel(1))
        writer.write(conn.data_to_send())
        events: list[object] = []
        # The cancelled subscription keeps Id 1 until its subscribed arrives.
        while conn.subscription_state(1) is not SubscriberState.CLOSED:
            conn.receive_data(await asyncio.wait_for(reader.read(65536), WAIT_S))
            events += list(conn.events())
        assert events == [ServerHello(0)]  # nothing of the old subscription was delivered
        conn.send(Subscribe(f"{new_scope}/{new_stream_}", 1, 10))
        writer.write(conn.data_to_send())
        events = []
        while not any(isinstance(e, OnComplete) for e in events):
            data = await asyncio.wait_for(reader.read(65536), WAIT_S)
            assert data
            conn.receive_data(data)
            events += list(conn.events())
            writer.write(conn.data_to_send())
        elements = [e.element for e in events if isinstance(e, OnNext)]
        assert elements == [b"new0", b"new1"]
    finally:
        writer.close()


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Path]]:
    directory = tmp_path_factory.mktemp("tls")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=rsio",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    srv = start_server(directory / "data", "--tls-cert", str(cert), "--tls-key", str(key))
    yield srv, cert
    stop(srv)


async def test_tls_subscription(tls_server: tuple[Server, Path]) -> None:
    server, cert = tls_server
    # Every port of the server speaks TLS, the controller's and the segment store's too.
    tls = TlsOptions(ca_file=cert)
    pravega = PravegaClient(f"tls://127.0.0.1:{server.controller_port}", tls=tls)
    try:
        scope, stream = await new_stream(pravega)
        await write_events(pravega, scope, stream, [b"secret"])
        await pravega.controller.seal_stream(scope, stream)
    finally:
        await pravega.aclose()
    client = await RsioClient.connect("127.0.0.1", server.rsio_port, ssl_context=tls.ssl_context())
    try:
        got = await asyncio.wait_for(_all(client, f"{scope}/{stream}"), WAIT_S)
        assert got == [b"secret"]
    finally:
        await client.goodbye()
    # The same port does not speak plain RS-IO then.
    reader, writer = await asyncio.open_connection("127.0.0.1", server.rsio_port)
    writer.write(bytes.fromhex("03010000"))
    writer.write_eof()
    data = await asyncio.wait_for(reader.read(100), WAIT_S)
    assert not data.startswith(bytes.fromhex("03020000"))
    writer.close()


async def _all(client: RsioClient, publisher: str) -> list[bytes]:
    return [e async for e in client.subscribe(publisher)]
