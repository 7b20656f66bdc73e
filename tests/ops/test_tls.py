"""TLS on every listener: real server, real sockets, real clients.

A throwaway CA (the ``openssl`` CLI) signs a server certificate for DNS name
``localhost`` (and 127.0.0.1) and a client certificate. ``headrace serve``
binds 127.0.0.1, advertises ``localhost`` for the segment store
(``--advertise-host``: the real Pravega client takes the ``getURI`` host as
the TLS server name and panics on an IP literal) and serves every listener
over TLS. Then:

* the real ``pravega`` client (``tls_enabled=True``) creates, writes and reads,
  checking the certificate against our CA (``pravega_client_tls_cert_path``),
  and with ``disable_cert_verification=True``; each run in a child process
  with a hard timeout;
* our own clients (Pravega, TANK, RS-IO), an HTTPS GET and ``headrace status``
  and the client CLI commands work over TLS, and refuse a certificate they
  cannot verify;
* a plaintext client on a TLS port gets a logged close (access line and
  ``headrace_errors_total{kind="tls_failed"}``) and harms no other connection;
* with ``--tls-ca`` a client without a certificate is refused (TANK has no
  credentials of its own: the certificate is the credential), one with a
  certificate signed by the CA is served.
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from headrace.client import PravegaClient, RetryPolicy, SegmentStoreConnection
from headrace.client.controller import ControllerClient, ScalingPolicy, StreamConfig
from headrace.client.errors import TlsCertificateError
from headrace.client.rsio import RsioClient
from headrace.client.sync import SyncClient
from headrace.client.tank import TankClient
from headrace.client.tls import TlsOptions
from headrace.errors import ConnectionLost
from headrace.protocols.pravega import PravegaConnection, Role
from headrace.protocols.tank import BundleMessage
from tests._real_pravega import run_scenario
from tests._server import FREE, ServerProcess, TlsFiles, make_ca, make_signed, run_cli

WAIT_S = 15.0
"""Bound on every other wait in these tests."""
NO_RETRY = RetryPolicy(max_attempts=1)


# --------------------------------------------------------------------------- certificates


@dataclass(frozen=True)
class Pki:
    """A CA, a server certificate (``localhost``, 127.0.0.1) and a client one it
    signed, and a second CA that signed nothing of ours."""

    ca: Path
    server: TlsFiles
    client: TlsFiles
    other_ca: Path
    ca_dir: Path
    """A directory holding only ``ca`` (what the real client reads trust from)."""
    other_ca_dir: Path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    ca = make_ca(directory, "ca")
    other = make_ca(directory, "other-ca")
    server = make_signed(
        directory,
        "localhost",
        ca,
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    )
    client = make_signed(directory, "client", ca, "extendedKeyUsage=clientAuth\n")
    ca_dir, other_dir = directory / "trust", directory / "other-trust"
    ca_dir.mkdir()
    other_dir.mkdir()
    (ca_dir / "ca.pem").write_bytes(ca[0].read_bytes())
    (other_dir / "ca.pem").write_bytes(other[0].read_bytes())
    return Pki(ca[0], server, client, other[0], ca_dir, other_dir)


# --------------------------------------------------------------------------- servers

EVERY_LISTENER = {
    "controller": FREE,
    "segment_store": FREE,
    "tank": FREE,
    "rsio": FREE,
    "http": FREE,
    "lumberjack": FREE,
    "lumberjack_tls": FREE,
}
ADVERTISE = ["--host", "127.0.0.1", "--advertise-host", "localhost"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[ServerProcess]:
    with ServerProcess(
        tmp_path_factory.mktemp("tls") / "data",
        ports=EVERY_LISTENER,
        args=ADVERTISE,
        tls=pki.server,
    ) as srv:
        yield srv


@pytest.fixture(scope="module")
def mtls_server(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[ServerProcess]:
    with ServerProcess(
        tmp_path_factory.mktemp("mtls") / "data",
        ports={"controller": FREE, "segment_store": FREE, "tank": FREE, "http": FREE},
        args=ADVERTISE,
        tls=pki.server,
        tls_ca=pki.ca,
    ) as srv:
        yield srv


def tls_uri(srv: ServerProcess) -> str:
    return f"tls://localhost:{srv.port_of('controller')}"


def https_get(srv: ServerProcess, path: str, context: ssl.SSLContext) -> tuple[int, str]:
    url = f"https://localhost:{srv.port_of('http')}{path}"
    with urllib.request.urlopen(url, timeout=WAIT_S, context=context) as response:
        return int(response.status), response.read().decode()


def errors_metric(srv: ServerProcess, context: ssl.SSLContext, protocol: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    _, text = https_get(srv, "/metrics", context)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if (
                sample.name == "headrace_errors_total"
                and labels.get("protocol") == protocol
                and labels.get("kind") == "tls_failed"
            ):
                return float(sample.value)
    return 0.0


# --------------------------------------------------------------------------- the real client


@pytest.mark.parametrize(
    ("verify", "scheme"),
    [("verify", "tls"), ("no-verify", "pravegas")],
)
def test_real_pravega_client_writes_and_reads_over_tls(
    server: ServerProcess, pki: Pki, tmp_path: Path, verify: str, scheme: str
) -> None:
    # Verifying, the client trusts only our CA. Not verifying, it is handed a CA
    # that signed nothing of ours: it must work all the same.
    trust = pki.ca_dir if verify == "verify" else pki.other_ca_dir
    uri = f"{scheme}://localhost:{server.port_of('controller')}"
    scope = f"tls{verify.replace('-', '')}"
    result = run_scenario(
        "tls_write_read",
        uri,
        scope,
        verify,
        env={"pravega_client_tls_cert_path": str(trust)},
        cwd=tmp_path,  # the client would read ./certs without the variable
    )
    assert result == {
        "scope_created": True,
        "stream_created": True,
        "read": ["tls-0", "tls-1", "tls-2"],
    }
    # The events went through the TLS segment-store port (it speaks nothing else).
    server.wait_for_access(protocol="segment_store", reason="eof")


# --------------------------------------------------------------------------- our clients


async def test_own_clients_work_over_tls(server: ServerProcess, pki: Pki) -> None:
    tls = TlsOptions(ca_file=pki.ca)
    async with PravegaClient(tls_uri(server), tls=tls) as client:
        assert await client.controller.create_scope("own")
        assert await client.controller.create_stream("own", "st", StreamConfig(ScalingPolicy()))
        async with await client.create_writer("own", "st") as writer:
            for value in (b"a", b"b"):
                await writer.write(value)
        await client.controller.seal_stream("own", "st")
        records = [r.value async for r in client.record_reader("own", "st")]
    assert records == [b"a", b"b"]

    tank = await TankClient.connect(
        "localhost", server.port_of("tank"), ssl_context=tls.ssl_context()
    )
    async with tank:
        await tank.create_topic("tlstopic", 1)
        await tank.produce("tlstopic", 0, [BundleMessage(b"m1", 1_700_000_000_000, b"k")])
        consumed = await tank.consume("tlstopic", 0, 0)
    assert [m.content for m in consumed.messages] == [b"m1"]

    rsio = await RsioClient.connect(
        "localhost", server.port_of("rsio"), ssl_context=tls.ssl_context()
    )
    try:
        got = await asyncio.wait_for(_elements(rsio, "own/st"), WAIT_S)
    finally:
        await rsio.goodbye()
    assert got == [b"a", b"b"]

    status, body = await asyncio.to_thread(https_get, server, "/health", tls.ssl_context())
    assert status == 200
    assert json.loads(body)["status"] == "ok"


def test_sync_client_over_tls(server: ServerProcess, pki: Pki) -> None:
    with SyncClient(tls_uri(server), tls=TlsOptions(ca_file=pki.ca), timeout_s=WAIT_S) as hr:
        assert hr.create_scope("sync")
        assert hr.create_stream("sync", "st")
        with hr.writer("sync", "st") as writer:
            writer.write(b"blocking")
        hr.run(hr.client.controller.seal_stream("sync", "st"))
        assert [record.value for record in hr.records("sync", "st")] == [b"blocking"]


async def _elements(client: RsioClient, publisher: str) -> list[bytes]:
    return [element async for element in client.subscribe(publisher)]


async def test_own_clients_refuse_a_certificate_they_cannot_verify(
    server: ServerProcess, pki: Pki
) -> None:
    wrong = TlsOptions(ca_file=pki.other_ca).ssl_context()
    with pytest.raises(TlsCertificateError, match="certificate"):
        await TankClient.connect("localhost", server.port_of("tank"), ssl_context=wrong)
    with pytest.raises(TlsCertificateError):
        await SegmentStoreConnection.connect(
            "localhost", server.port_of("segment_store"), ssl_context=wrong
        )
    # The name is checked too: the certificate does not name 127.0.0.2.
    right = TlsOptions(ca_file=pki.ca).ssl_context()
    with pytest.raises(TlsCertificateError, match=r"mismatch|match"):
        await asyncio.wait_for(_connect_named(server.port_of("tank"), right, "127.0.0.2"), WAIT_S)
    # Not verifying accepts the certificate whoever signed it.
    insecure = TlsOptions(ca_file=pki.other_ca, verify=False).ssl_context()
    async with await TankClient.connect(
        "localhost", server.port_of("tank"), ssl_context=insecure
    ) as tank:
        assert await tank.discover_topics() is not None


async def _connect_named(port: int, context: ssl.SSLContext, name: str) -> None:
    try:
        _, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=context, server_hostname=name
        )
    except ssl.SSLCertVerificationError as exc:
        raise TlsCertificateError(exc.verify_message or str(exc)) from exc
    writer.close()


def test_controller_client_refuses_insecure_tls(pki: Pki) -> None:
    from headrace.errors import ConfigError

    with pytest.raises(ConfigError, match="CA"):
        ControllerClient("tls://localhost:1", tls=TlsOptions(verify=False))


# --------------------------------------------------------------------------- plaintext on TLS


PLAINTEXT_HELLOS = {
    "segment_store": PravegaConnection(Role.CLIENT).data_to_send(),  # Hello
    "tank": b"\x02\x00\x00\x00\x00",
    "rsio": bytes.fromhex("03010000"),
    "http": b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
    "lumberjack_tls": b"2W\x00\x00\x00\x01",
}
"""A first message of each protocol, in plaintext."""


async def test_plaintext_client_on_a_tls_port_gets_a_logged_close(
    server: ServerProcess, pki: Pki
) -> None:
    tls = TlsOptions(ca_file=pki.ca)
    context = tls.ssl_context()
    before = {
        name: await asyncio.to_thread(errors_metric, server, context, name)
        for name in PLAINTEXT_HELLOS
    }
    seen = {
        name: len(server.access_records(protocol=name, reason="tls_failed"))
        for name in PLAINTEXT_HELLOS
    }
    # A TLS client already connected must not notice the plaintext ones.
    bystander = await TankClient.connect("localhost", server.port_of("tank"), ssl_context=context)
    async with bystander:
        await bystander.create_topic("bystander", 1)
        for name, hello in PLAINTEXT_HELLOS.items():
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port_of(name))
            writer.write(hello)
            try:
                answer = await asyncio.wait_for(reader.read(1024), WAIT_S)
            except ConnectionResetError:
                answer = b""
            writer.close()
            # Nothing in plaintext comes back: the server closes (TLS alert bytes at most).
            assert not answer.startswith((b"HTTP", b"\x03\x02", b"\xff\xff\xff\x81", b"2A"))
            assert server.wait_for_access(protocol=name, reason="tls_failed", after=seen[name])
        await bystander.produce("bystander", 0, [BundleMessage(b"still here", 1, b"")])
        consumed = await bystander.consume("bystander", 0, 0)
        assert [m.content for m in consumed.messages] == [b"still here"]
    after = {
        name: await asyncio.to_thread(errors_metric, server, context, name)
        for name in PLAINTEXT_HELLOS
    }
    for name in PLAINTEXT_HELLOS:
        assert after[name] >= before[name] + 1, name
    assert "TLS handshake with 127.0.0.1" in server.log_text()
    # The plain Lumberjack port stays plain beside the TLS one.
    with socket.create_connection(("127.0.0.1", server.port_of("lumberjack")), WAIT_S) as sock:
        sock.settimeout(WAIT_S)
        sock.sendall(b"2W\x00\x00\x00\x01" + _lumberjack_json(1, b'{"m":"plain"}'))
        assert sock.recv(6) == b"2A\x00\x00\x00\x01"


async def test_a_stalled_handshake_is_closed_after_the_bound(server: ServerProcess) -> None:
    from headrace.server._listen import TLS_HANDSHAKE_TIMEOUT_S

    before = len(server.access_records(protocol="rsio", reason="tls_failed"))
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port_of("rsio"))
    opened = time.monotonic()
    try:  # connect and say nothing: the server must not wait for ever
        assert await asyncio.wait_for(reader.read(1024), TLS_HANDSHAKE_TIMEOUT_S + WAIT_S) == b""
    finally:
        writer.close()
    assert time.monotonic() - opened >= TLS_HANDSHAKE_TIMEOUT_S * 0.9
    record = server.wait_for_access(protocol="rsio", reason="tls_failed", after=before)
    assert record["requests"] == 0


def _lumberjack_json(seq: int, payload: bytes) -> bytes:
    return b"2J" + seq.to_bytes(4, "big") + len(payload).to_bytes(4, "big") + payload


async def test_plaintext_controller_client_on_a_tls_controller_fails(server: ServerProcess) -> None:
    client = ControllerClient(f"tcp://127.0.0.1:{server.port_of('controller')}", retry=NO_RETRY)
    try:
        with pytest.raises(ConnectionLost):
            await client.create_scope("never")
    finally:
        await client.aclose()


# --------------------------------------------------------------------------- mutual TLS


async def test_mutual_tls_refuses_a_client_without_a_certificate(
    mtls_server: ServerProcess, pki: Pki
) -> None:
    anonymous = TlsOptions(ca_file=pki.ca).ssl_context()
    # TLS 1.3: the client's side of the handshake ends before the server checks
    # the client's certificate, so the refusal shows on the first request.
    with pytest.raises(ConnectionLost):
        tank = await TankClient.connect(
            "localhost", mtls_server.port_of("tank"), ssl_context=anonymous
        )
        async with tank:
            await asyncio.wait_for(tank.create_topic("refused", 1), WAIT_S)
    mtls_server.wait_for_access(protocol="tank", reason="tls_failed")
    assert "tank: TLS handshake with 127.0.0.1" in mtls_server.log_text()
    assert "PEER_DID_NOT_RETURN_A_CERTIFICATE" in mtls_server.log_text()
    controller = ControllerClient(
        tls_uri(mtls_server), tls=TlsOptions(ca_file=pki.ca), retry=NO_RETRY
    )
    try:
        with pytest.raises(ConnectionLost):
            await controller.create_scope("refused")
    finally:
        await controller.aclose()

    with_cert = TlsOptions(ca_file=pki.ca, cert_file=pki.client.cert, key_file=pki.client.key)
    async with await TankClient.connect(
        "localhost", mtls_server.port_of("tank"), ssl_context=with_cert.ssl_context()
    ) as tank:
        await tank.create_topic("allowed", 1)
        await tank.produce("allowed", 0, [BundleMessage(b"ok", 1, b"")])
        assert [m.content for m in (await tank.consume("allowed", 0, 0)).messages] == [b"ok"]
    async with PravegaClient(tls_uri(mtls_server), tls=with_cert) as client:
        assert await client.controller.create_scope("allowed")
        assert await client.controller.create_stream("allowed", "st", StreamConfig())
        async with await client.create_writer("allowed", "st") as writer:
            await writer.write(b"mutual")
        await client.controller.seal_stream("allowed", "st")
        assert [r.value async for r in client.record_reader("allowed", "st")] == [b"mutual"]


# --------------------------------------------------------------------------- the CLI


def test_status_reads_an_https_port(server: ServerProcess, pki: Pki) -> None:
    port = str(server.port_of("http"))
    done = run_cli("status", "--host", "localhost", "--http-port", port, "--ca", str(pki.ca))
    assert done.returncode == 0, done.stderr
    assert f"server https://localhost:{port}: ok" in done.stdout
    assert "segment_store" in done.stdout
    plain = run_cli("status", "--host", "localhost", "--http-port", port)
    assert plain.returncode == 2
    assert "--https" in plain.stderr
    unverified = run_cli("status", "--host", "localhost", "--http-port", port, "--https")
    assert unverified.returncode == 2
    assert "not trusted" in unverified.stderr and "--ca" in unverified.stderr


def test_client_commands_over_tls(server: ServerProcess, pki: Pki) -> None:
    tls = ["--controller", tls_uri(server), "--ca", str(pki.ca)]
    created = run_cli("stream", "create", *tls, "cli/st")
    assert created.returncode == 0, created.stderr
    assert "created: cli/st" in created.stdout
    written = run_cli("write", *tls, "cli/st", stdin="one\ntwo\n")
    assert written.returncode == 0, written.stderr
    read = run_cli("read", *tls, "cli/st")
    assert read.returncode == 0, read.stderr
    assert read.stdout.splitlines() == ["one", "two"]
    # gRPC cannot skip the check: no --insecure for controller commands, and
    # without --ca the server's certificate is not trusted.
    refused = run_cli("stream", "list", "--controller", tls_uri(server), "--insecure")
    assert refused.returncode == 2
    assert "--insecure" in refused.stderr
    untrusted = run_cli("stream", "list", "--controller", tls_uri(server))
    assert untrusted.returncode == 1
    assert "--ca" in untrusted.stderr
