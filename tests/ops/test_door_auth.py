"""Auth on every front door: TANK, Lumberjack and RS-IO (TCP and ``/rsio``) check
the password file's grants, and logins cost the same for every user name and
are limited per client address.

The servers are real ``headrace serve`` child processes; the clients are ours
(TANK, RS-IO, Pravega controller), a raw Lumberjack client, raw gRPC calls and
a small WebSocket client, over real sockets. A throwaway CA (the ``openssl``
CLI) signs the server's certificate and the clients': the password file maps
some of the client certificates to users (by subject CN, or by a
subjectAltName), others to nobody.
"""

from __future__ import annotations

import asyncio
import base64
import os
import ssl
import statistics
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]
import pytest
from wsproto.connection import Connection, ConnectionType
from wsproto.events import BytesMessage, CloseConnection

from headrace.client import PravegaClient
from headrace.client.controller import ControllerClient, ScalingPolicy, StreamConfig
from headrace.client.rsio import AUTH_EXTENSION, OFFER_EXTENSION, RsioClient, RsioError
from headrace.client.tank import TankClient
from headrace.client.tls import TlsOptions
from headrace.controller.auth import (
    NO_PASSWORD,
    Authenticator,
    AuthFailed,
    CertName,
    LoginLimiter,
    PasswordFile,
    UserEntry,
    certificate_names,
    hash_password,
    parse_cert_name,
)
from headrace.controller.rpc import METHODS, SERVICE_NAME
from headrace.errors import ConfigError, ServerError
from headrace.protocols import pravega as p
from headrace.protocols import rsio as r
from headrace.protocols import tank as t
from headrace.protocols.lumberjack import JsonData, ProtocolVersion, WindowSize
from headrace.protocols.pravega import controller_pb2 as pb
from headrace.protocols.pravega.auth import basic_header, parse_grant
from headrace.protocols.rsio.codec import decode_varint, encode_varint
from tests._server import FREE, ServerProcess, TlsFiles, make_ca, make_signed, run_cli
from tests.lumberjack.harness import LumberjackClient

WAIT_S = 15.0
"""Bound on every wait here."""

ADMIN = ("admin", "admin-secret")
READER = ("reader", "reader-secret")
WRITER = ("writer", "writer-secret")
SCOPE = "S"
ADVERTISE = ["--host", "127.0.0.1", "--advertise-host", "localhost"]
MESSAGES = [t.BundleMessage(b"m1", 1_700_000_000_000, b"k")]


# --------------------------------------------------------------------------- pure parts


def test_cert_items_and_no_password_round_trip_and_old_files_stay_valid() -> None:
    hashed = hash_password("x" * 8)
    old = f"reader:{hashed}:prn::/scope:S,READ;\n"
    assert PasswordFile.parse(old).users["reader"].certs == ()
    entry = UserEntry(
        "shipper",
        NO_PASSWORD,
        (parse_grant("prn::/scope:logs/stream:beats,READ_UPDATE"),),
        (parse_cert_name("cert:CN=filebeat 1"), parse_cert_name("DNS=Web1.Example.com")),
    )
    text = PasswordFile({"shipper": entry}).text()
    assert "shipper:!:prn::/scope:logs/stream:beats,READ_UPDATE;" in text
    assert "cert:CN=filebeat 1;cert:DNS=web1.example.com;" in text  # DNS names compare lower
    assert PasswordFile.parse(text).users == {"shipper": entry}
    assert not entry.has_password
    for bad, why in [
        (f"a:{hashed}:cert:SERIAL=1;", "kind one of"),
        (f"a:{hashed}:cert:CN=;", "1 to"),
        (f"a:{hashed}:cert:IP=not-an-address;", "not an IP address"),
        (f"a:{hashed}:cert:CN=x;\nb:!:cert:CN=x;", "already identifies user 'a'"),
        ("a:?:prn::/,READ;", "line 1"),
    ]:
        with pytest.raises(ConfigError, match=why):
            PasswordFile.parse(bad)


def test_certificate_names_come_from_the_subject_cn_and_the_alt_names() -> None:
    peer_cert: dict[str, object] = {
        "subject": ((("countryName", "NL"),), (("commonName", "filebeat-1"),)),
        "subjectAltName": (
            ("DNS", "Web1.Example.com"),
            ("IP Address", "2001:DB8:0:0:0:0:0:1\n"),
            ("URI", "spiffe://example.org/shipper"),
            ("othername", "<unsupported>"),
        ),
    }
    assert certificate_names(peer_cert) == {
        CertName("CN", "filebeat-1"),
        CertName("DNS", "web1.example.com"),
        CertName("IP", "2001:db8::1"),
        CertName("URI", "spiffe://example.org/shipper"),
    }
    assert certificate_names(None) == certificate_names({}) == frozenset()
    assert parse_cert_name("IP=2001:db8::0001") == CertName("IP", "2001:db8::1")


def test_login_limiter_buckets_refill_and_stay_bounded() -> None:
    now = [0.0]
    limiter = LoginLimiter(3, 10.0, max_peers=2, clock=lambda: now[0])
    assert [limiter.take("a") for _ in range(4)] == [True, True, True, False]
    assert limiter.retry_after_s("a") == pytest.approx(10.0)
    now[0] = 10.0
    assert limiter.take("a") and not limiter.take("a")  # one more per interval
    limiter.give_back("a")  # a success returns its token
    assert limiter.take("a")
    assert limiter.take("b") and limiter.take("c")  # "a", seen least recently, is forgotten
    assert len(limiter) == 2
    assert limiter.take("a")  # a forgotten address starts with a full bucket


async def test_unknown_users_and_users_without_a_password_fail_like_wrong_passwords(
    tmp_path: Path,
) -> None:
    path = tmp_path / "users"
    PasswordFile(
        {
            "a": UserEntry("a", hash_password("password-a"), ()),
            "c": UserEntry("c", NO_PASSWORD, (), (CertName("CN", "c"),)),
        }
    ).save(path)
    auth = Authenticator(path, limiter=LoginLimiter(3, 3600.0))
    assert await auth.authenticate(basic_header("a", "password-a"), peer="p") == "a"
    for user in ("nobody", "c", "a"):
        with pytest.raises(AuthFailed, match="unknown user or wrong password") as info:
            await auth.authenticate(basic_header(user, "wrong-password"), peer="p")
        assert info.value.reason == "bad_credentials"
    with pytest.raises(AuthFailed, match="too many failed logins") as info:
        await auth.authenticate(basic_header("a", "password-b"), peer="p")
    assert info.value.reason == "rate_limited"
    # A remembered good pair costs no check, so it is not limited; another address is not.
    assert await auth.authenticate(basic_header("a", "password-a"), peer="p") == "a"
    with pytest.raises(AuthFailed, match="wrong password"):
        await auth.authenticate(basic_header("a", "password-b"), peer="q")
    assert auth.certificate_user(frozenset({CertName("CN", "c")})) == "c"
    assert auth.certificate_user(frozenset({CertName("CN", "a")})) is None


def test_user_add_takes_certificate_names_and_no_password(tmp_path: Path) -> None:
    path = tmp_path / "users"
    done = run_cli(
        "user", "add", "shipper", "--file", str(path), "--no-password",
        "--permission", "prn::/scope:logs,READ_UPDATE",
        "--cert", "CN=filebeat-1", "--cert", "DNS=web1.example.com",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    entry = PasswordFile.load(path).users["shipper"]
    assert entry.password_hash == NO_PASSWORD
    assert [str(c) for c in entry.certs] == ["cert:CN=filebeat-1", "cert:DNS=web1.example.com"]
    listed = run_cli("user", "list", "--file", str(path))
    assert listed.stdout.splitlines() == [
        "shipper\tprn::/scope:logs,READ_UPDATE cert:CN=filebeat-1 cert:DNS=web1.example.com"
    ]
    taken = run_cli(
        "user", "add", "other", "--file", str(path), "--no-password", "--cert", "CN=filebeat-1"
    )
    assert taken.returncode == 1 and "already identifies user 'shipper'" in taken.stderr
    lonely = run_cli("user", "add", "other", "--file", str(path), "--no-password")
    assert lonely.returncode == 1 and "--no-password needs --cert" in lonely.stderr
    bad = run_cli("user", "add", "other", "--file", str(path), "--cert", "SERIAL=1")
    assert bad.returncode == 2 and "kind one of" in bad.stderr


# --------------------------------------------------------------------------- certificates


@dataclass(frozen=True)
class Pki:
    """A CA, the server's certificate, and client certificates it signed."""

    ca: Path
    server: TlsFiles
    clients: dict[str, TlsFiles]

    def context(self, client: str | None = None) -> ssl.SSLContext:
        """A client context trusting the CA, presenting ``client``'s certificate if named."""
        files = None if client is None else self.clients[client]
        return TlsOptions(
            ca_file=self.ca,
            cert_file=None if files is None else files.cert,
            key_file=None if files is None else files.key,
        ).ssl_context()


CLIENT_CERTS = {
    "tank-admin": "extendedKeyUsage=clientAuth\n",
    "producer": "extendedKeyUsage=clientAuth\n",
    "stranger": "extendedKeyUsage=clientAuth\n",  # signed by the CA, named by nobody
    "nogrant": "extendedKeyUsage=clientAuth\n",
    # CN not mapped: the user is found by its subjectAltName
    "shipper-host": "subjectAltName=DNS:shipper.example.com\nextendedKeyUsage=clientAuth\n",
}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    ca = make_ca(directory, "ca")
    server = make_signed(
        directory,
        "localhost",
        ca,
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    )
    clients = {name: make_signed(directory, name, ca, ext) for name, ext in CLIENT_CERTS.items()}
    return Pki(ca[0], server, clients)


def _add(path: Path, name: str, *args: str, password: str | None = None) -> None:
    flags = ["--password-stdin"] if password is not None else ["--no-password"]
    done = run_cli(
        "user", "add", name, "--file", str(path), *args, *flags, stdin=(password or "") + "\n"
    )
    assert done.returncode == 0, done.stderr


def users_file(directory: Path) -> Path:
    path = directory / "users"
    _add(path, ADMIN[0], "--permission", "prn::/*,READ_UPDATE", password=ADMIN[1])
    _add(path, READER[0], "--permission", f"prn::/scope:{SCOPE},READ", password=READER[1])
    _add(
        path, WRITER[0], "--permission", f"prn::/scope:{SCOPE}/stream:T,READ_UPDATE",
        password=WRITER[1],
    )  # fmt: skip
    _add(
        path, "tankadmin", "--permission", "prn::/scope:tank,READ_UPDATE", "--cert", "CN=tank-admin"
    )
    _add(
        path, "producer", "--permission", "prn::/scope:tank/stream:granted,READ_UPDATE",
        "--cert", "CN=producer",
    )  # fmt: skip
    _add(
        path, "shipper", "--permission", "prn::/scope:logs/stream:beats,READ_UPDATE",
        "--cert", "DNS=shipper.example.com",
    )  # fmt: skip
    _add(path, "nogrant", "--permission", f"prn::/scope:{SCOPE},READ", "--cert", "CN=nogrant")
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("doors")
    listeners = ["controller", "segment_store", "tank", "rsio", "http", "lumberjack"]
    auth = ["--auth-password-file", str(users_file(tmp)), "--tls-verify-client", "optional"]
    with ServerProcess(
        tmp / "data",
        ports={**dict.fromkeys(listeners, FREE), "lumberjack_tls": FREE},
        args=[*ADVERTISE, *auth],
        tls=pki.server,
        tls_ca=pki.ca,
    ) as srv:
        yield srv
    assert "Traceback" not in srv.log_text(), srv.log_tail()


def refusals(srv: ServerProcess, protocol: str, reason: str, context: ssl.SSLContext) -> float:
    """``headrace_auth_refusals_total{protocol, reason}`` from ``/metrics``."""
    from prometheus_client.parser import text_string_to_metric_families

    scheme = "https" if srv.tls is not None else "http"
    host = "localhost" if srv.tls is not None else "127.0.0.1"
    url = f"{scheme}://{host}:{srv.port_of('http')}/metrics"
    with urllib.request.urlopen(url, timeout=WAIT_S, context=context) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "headrace_auth_refusals_total" and sample.labels == {
                "protocol": protocol,
                "reason": reason,
            }:
                return float(sample.value)
    return 0.0


async def _metric(srv: ServerProcess, protocol: str, reason: str, ctx: ssl.SSLContext) -> float:
    return await asyncio.to_thread(refusals, srv, protocol, reason, ctx)


def tls_uri(srv: ServerProcess) -> str:
    return f"tls://localhost:{srv.port_of('controller')}"


# --------------------------------------------------------------------------- TANK


async def _tank(srv: ServerProcess, context: ssl.SSLContext | None) -> TankClient:
    host = "localhost" if context is not None else "127.0.0.1"
    return await TankClient.connect(host, srv.port_of("tank"), ssl_context=context)


@pytest.fixture(scope="module")
def topics(server: ServerProcess, pki: Pki) -> tuple[str, str]:
    """``granted`` and ``other``, made by the certificate of a user who may create topics."""

    async def create() -> None:
        async with await _tank(server, pki.context("tank-admin")) as tank:
            for topic in ("granted", "other"):
                assert await tank.create_topic(topic, 1) is t.CreateTopicResult.CREATED
            await tank.produce("other", 0, MESSAGES)

    asyncio.run(create())
    return "granted", "other"


async def test_tank_refuses_a_client_it_cannot_identify(
    server: ServerProcess, pki: Pki, topics: tuple[str, str]
) -> None:
    anonymous = pki.context()
    before = await _metric(server, "tank", "unidentified", anonymous)
    for context in (anonymous, pki.context("stranger")):  # no certificate; one named by nobody
        async with await _tank(server, context) as tank:
            assert await tank.create_topic("mine", 1) is t.CreateTopicResult.READ_ONLY
            with pytest.raises(ServerError) as info:
                await tank.produce("granted", 0, MESSAGES)
            assert info.value.code is t.ProduceError.READ_ONLY
            assert (await tank.consume("other", 0, 0)).unknown_topic
            assert await tank.discover_partitions("other") is None
            assert await tank.discover_topics() == ()
            assert (await tank.status()).topics_count == 0
    # create, produce, consume, discover partitions, twice over
    assert await _metric(server, "tank", "unidentified", anonymous) >= before + 8
    assert "tank 127.0.0.1: refused: unauthenticated: tank cannot tell" in server.log_text()


async def test_tank_certificate_user_gets_its_grants_and_no_more(
    server: ServerProcess, pki: Pki, topics: tuple[str, str]
) -> None:
    granted, other = topics
    before = await _metric(server, "tank", "permission_denied", pki.context())
    async with await _tank(server, pki.context("producer")) as tank:
        await tank.produce(granted, 0, MESSAGES)
        assert [m.content for m in (await tank.consume(granted, 0, 0)).messages] == [b"m1"]
        assert [info.name for info in await tank.discover_topics()] == [granted]
        with pytest.raises(ServerError) as info:
            await tank.produce(other, 0, MESSAGES)
        assert info.value.code is t.ProduceError.READ_ONLY
        assert (await tank.consume(other, 0, 0)).unknown_topic
        assert await tank.create_topic("another", 1) is t.CreateTopicResult.READ_ONLY
    assert await _metric(server, "tank", "permission_denied", pki.context()) >= before + 3
    # The topic's owner of the scope still reads what it wrote.
    async with await _tank(server, pki.context("tank-admin")) as tank:
        assert [m.content for m in (await tank.consume(other, 0, 0)).messages] == [b"m1"]


# --------------------------------------------------------------------------- Lumberjack


def _ship(port: int, context: ssl.SSLContext | None) -> LumberjackClient:
    client = LumberjackClient(port, ProtocolVersion.V2, ssl_context=context)
    client.send(WindowSize(1), JsonData(1, b'{"message":"hello"}'))
    return client


def test_lumberjack_needs_a_certificate_user_who_may_write(server: ServerProcess, pki: Pki) -> None:
    anonymous = pki.context()
    before = refusals(server, "lumberjack_tls", "unidentified", anonymous)
    denied_before = refusals(server, "lumberjack_tls", "permission_denied", anonymous)
    plain_before = refusals(server, "lumberjack", "unidentified", anonymous)
    # The plain port can never tell who a client is; TLS without a certificate neither.
    for port, context in (
        (server.port_of("lumberjack"), None),
        (server.port_of("lumberjack_tls"), anonymous),
        (server.port_of("lumberjack_tls"), pki.context("nogrant")),  # known, may not write
    ):
        with _ship(port, context) as client:
            assert client.wait_closed(WAIT_S) == []  # closed, nothing acknowledged
    with _ship(server.port_of("lumberjack_tls"), pki.context("shipper-host")) as client:
        assert client.wait_for_ack(1, WAIT_S) == [1]
    assert refusals(server, "lumberjack", "unidentified", anonymous) == plain_before + 1
    assert refusals(server, "lumberjack_tls", "unidentified", anonymous) == before + 1
    assert refusals(server, "lumberjack_tls", "permission_denied", anonymous) == denied_before + 1
    log = server.log_text()
    assert "access denied, closing: permission denied: user 'nogrant' needs READ_UPDATE" in log
    assert "reason=access_denied" in log


def test_lumberjack_template_checks_each_stream_an_event_goes_to(tmp_path: Path, pki: Pki) -> None:
    """With a stream template, a window is stored only if its client may write
    to every stream its events go to: the shipper may write ``logs/beats``
    (the default stream) and nothing else."""
    with ServerProcess(
        tmp_path / "data",
        ports={"lumberjack_tls": FREE, "lumberjack": 0},
        args=[
            "--auth-password-file",
            str(users_file(tmp_path)),
            "--lumberjack-stream",
            "logs/{[@metadata][beat]}",
        ],
        tls=pki.server,
        tls_ca=pki.ca,
    ) as srv:
        port, context = srv.port_of("lumberjack_tls"), pki.context("shipper-host")
        with LumberjackClient(port, ProtocolVersion.V2, ssl_context=context) as client:
            client.send(WindowSize(1), JsonData(1, b'{"message":"to the default stream"}'))
            assert client.wait_for_ack(1, WAIT_S) == [1]
            client.send(WindowSize(1), JsonData(2, b'{"@metadata":{"beat":"filebeat"}}'))
            assert client.wait_closed(WAIT_S) == [1]  # logs/filebeat: not granted, no ack
        log = srv.log_text()
    assert "user 'shipper' needs READ_UPDATE on prn::/scope:logs/stream:filebeat" in log


# --------------------------------------------------------------------------- RS-IO


@pytest.fixture(scope="module")
def stream(server: ServerProcess, pki: Pki) -> str:
    """``S/T`` holding ``a`` and ``b``, and an empty ``S/U``, made by the admin (a
    Pravega client without a certificate: ``--tls-verify-client optional``)."""

    async def create() -> None:
        tls = TlsOptions(ca_file=pki.ca)
        async with PravegaClient(tls_uri(server), tls=tls, credentials=ADMIN) as client:
            assert await client.controller.create_scope(SCOPE)
            for name in ("T", "U"):
                config = StreamConfig(ScalingPolicy(min_num_segments=1))
                assert await client.controller.create_stream(SCOPE, name, config)
            async with await client.create_writer(SCOPE, "T") as writer:
                for value in (b"a", b"b"):
                    await writer.write(value)

    asyncio.run(create())
    return f"{SCOPE}/T"


async def _rsio(srv: ServerProcess, context: ssl.SSLContext, **login: Any) -> RsioClient:
    return await RsioClient.connect("localhost", srv.port_of("rsio"), ssl_context=context, **login)


async def _first(client: RsioClient, publisher: str, count: int) -> list[bytes]:
    got: list[bytes] = []
    async with client.subscribe(publisher) as sub:
        async for element in sub:
            got.append(element)
            if len(got) == count:
                break
    return got


async def test_rsio_subscriptions_and_offers_need_an_identity_and_grants(
    server: ServerProcess, pki: Pki, stream: str
) -> None:
    ctx = pki.context()
    unidentified = await _metric(server, "rsio", "unidentified", ctx)
    bad = await _metric(server, "rsio", "bad_credentials", ctx)
    denied = await _metric(server, "rsio", "permission_denied", ctx)

    nobody = await _rsio(server, ctx)
    try:
        with pytest.raises(RsioError, match="unauthenticated: rsio cannot tell"):
            await asyncio.wait_for(_first(nobody, stream, 1), WAIT_S)
        with pytest.raises(RsioError, match="unauthenticated"):
            await asyncio.wait_for(nobody.offer(stream, [b"x"]), WAIT_S)
    finally:
        await nobody.goodbye()

    with pytest.raises(RsioError, match="unauthenticated: unknown user or wrong password"):
        await _rsio(server, ctx, credentials=(READER[0], "wrong-password"))
    with pytest.raises(RsioError, match="delegation token refused"):
        await _rsio(server, ctx, token="not.a.token")

    reader = await _rsio(server, ctx, credentials=READER)
    try:
        assert await asyncio.wait_for(_first(reader, stream, 2), WAIT_S) == [b"a", b"b"]
        with pytest.raises(RsioError, match="permission denied: user 'reader' needs READ_UPDATE"):
            await asyncio.wait_for(reader.offer(stream, [b"x"]), WAIT_S)
    finally:
        await reader.goodbye()

    # A delegation token allows what it names: reading and writing S/T, nothing else.
    controller = ControllerClient(
        tls_uri(server), tls=TlsOptions(ca_file=pki.ca), credentials=WRITER
    )
    try:
        token = await controller.delegation_token(SCOPE, "T")
    finally:
        await controller.aclose()
    bearer = await _rsio(server, ctx, token=token)
    try:
        assert await asyncio.wait_for(bearer.offer(stream, [b"c"]), WAIT_S) == 1
        assert await asyncio.wait_for(_first(bearer, stream, 3), WAIT_S) == [b"a", b"b", b"c"]
        with pytest.raises(RsioError, match="permission denied: the bearer of a token"):
            await asyncio.wait_for(_first(bearer, f"{SCOPE}/U", 1), WAIT_S)
    finally:
        await bearer.goodbye()

    # A certificate the password file names is an identity on RS-IO too.
    tank_admin = await _rsio(server, pki.context("tank-admin"))
    try:
        with pytest.raises(RsioError, match="permission denied: user 'tankadmin' needs READ"):
            await asyncio.wait_for(_first(tank_admin, stream, 1), WAIT_S)
    finally:
        await tank_admin.goodbye()

    assert await _metric(server, "rsio", "unidentified", ctx) >= unidentified + 2
    assert await _metric(server, "rsio", "bad_credentials", ctx) >= bad + 2
    assert await _metric(server, "rsio", "permission_denied", ctx) >= denied + 3


class Wss:
    """RS-IO over a WebSocket at ``/rsio`` over TLS: our sans-I/O client connection,
    one binary message per RS-IO message (no length prefix)."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, rest: bytes = b""
    ) -> None:
        self.reader, self.writer = reader, writer
        self.ws = Connection(ConnectionType.CLIENT, trailing_data=rest)
        self.message = bytearray()
        self.conn = r.ReactiveConnection(
            r.Role.CLIENT, extensions=(OFFER_EXTENSION, AUTH_EXTENSION)
        )
        self.events: list[object] = []

    @classmethod
    async def connect(cls, srv: ServerProcess, context: ssl.SSLContext) -> Wss:
        reader, writer = await asyncio.open_connection(
            "localhost", srv.port_of("http"), ssl=context
        )
        key = base64.b64encode(os.urandom(16)).decode()
        writer.write(
            f"GET /rsio HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S)
        assert head.startswith(b"HTTP/1.1 101 ")
        return cls(reader, writer)

    def send(self, *messages: object) -> None:
        """Send ``messages`` (the hello is queued already) in one write."""
        for message in messages:
            self.conn.send(message)  # type: ignore[arg-type]
        data, position, out = self.conn.data_to_send(), 0, bytearray()
        while position < len(data):
            length, start = decode_varint(data, position)
            out += self.ws.send(BytesMessage(data[start : start + length]))
            position = start + length
        self.writer.write(out)

    async def until(self, done: Any) -> list[object]:
        """Receive until ``done(events)``; every event so far."""
        while not done(self.events):
            data = await asyncio.wait_for(self.reader.read(65536), WAIT_S)
            assert data, f"closed; events so far: {self.events}"
            self.ws.receive_data(data)
            for event in self.ws.events():
                assert not isinstance(event, CloseConnection), event
                if isinstance(event, BytesMessage):
                    self.message += event.data
                    if event.message_finished:
                        payload, self.message = bytes(self.message), bytearray()
                        self.conn.receive_data(encode_varint(len(payload)) + payload)
                        self.events += self.conn.events()
        return self.events


async def test_rsio_over_websocket_needs_credentials(
    server: ServerProcess, pki: Pki, stream: str
) -> None:
    ctx = pki.context()
    anonymous = await Wss.connect(server, ctx)
    try:
        anonymous.send(r.Subscribe(stream, 1, 2))
        events = await anonymous.until(lambda ev: any(isinstance(e, r.OnError) for e in ev))
        error = next(e for e in events if isinstance(e, r.OnError))
        assert error.subscriber == 1 and error.error.startswith("unauthenticated: http cannot")
    finally:
        anonymous.writer.close()

    # Credentials and a subscription in one write: the subscription waits for the login.
    ws = await Wss.connect(server, ctx)
    try:
        ws.send(r.Subscribe("auth:" + basic_header(*READER), 1, 0), r.Subscribe(stream, 2, 2))
        events = await ws.until(lambda ev: sum(isinstance(e, r.OnNext) for e in ev) == 2)
        assert r.ServerHello(0, (OFFER_EXTENSION, AUTH_EXTENSION)) in events
        assert r.OnComplete(1) in events
        assert [e.element for e in events if isinstance(e, r.OnNext)] == [b"a", b"b"]
    finally:
        ws.writer.close()

    # Offers pipelined behind a login are checked once it is decided: the reader's is
    # refused, the admin's stores what it publishes (into S/U, which others leave empty).
    offer = r.Subscribe(f"offer:{SCOPE}/U", 3, 0)
    for creds, allowed in ((READER, False), (ADMIN, True)):
        ws = await Wss.connect(server, ctx)
        try:
            ws.send(r.Subscribe("auth:" + basic_header(*creds), 1, 0), offer)
            if not allowed:
                events = await ws.until(lambda ev: any(isinstance(e, r.OnError) for e in ev))
                error = next(e for e in events if isinstance(e, r.OnError))
                assert error.subscriber == 3 and error.error.startswith("permission denied")
                continue
            await ws.until(lambda ev: any(isinstance(e, r.Subscribe) for e in ev))
            ws.send(r.Subscribed(3, 0), r.OnNext(3, b"w"), r.OnComplete(3))
            events = await ws.until(lambda ev: r.OnComplete(3) in ev)  # stored, durable
            assert r.OnComplete(1) in events
        finally:
            ws.writer.close()


# --------------------------------------------------------------------------- trusted listeners


def test_a_trusted_listener_lets_unidentified_clients_in(tmp_path: Path) -> None:
    users = users_file(tmp_path)
    with ServerProcess(
        tmp_path / "data",
        ports={"tank": FREE, "lumberjack": FREE, "rsio": FREE, "http": FREE},
        args=[
            "--auth-password-file",
            str(users),
            "--auth-trust-unauthenticated",
            "tank,lumberjack",
        ],
    ) as srv:

        async def scenario() -> None:
            async with await _tank(srv, None) as tank:
                assert await tank.create_topic("open", 1) is t.CreateTopicResult.CREATED
                await tank.produce("open", 0, MESSAGES)
                assert [m.content for m in (await tank.consume("open", 0, 0)).messages] == [b"m1"]
            rsio = await RsioClient.connect("127.0.0.1", srv.port_of("rsio"))
            try:  # RS-IO is not trusted
                with pytest.raises(RsioError, match="unauthenticated"):
                    await asyncio.wait_for(_first(rsio, "tank/open", 1), WAIT_S)
            finally:
                await rsio.goodbye()

        asyncio.run(scenario())
        with _ship(srv.port_of("lumberjack"), None) as client:
            assert client.wait_for_ack(1, WAIT_S) == [1]
    for args, why in [
        (["--auth-trust-unauthenticated", "tank,controller"], "'controller' is not one of"),
        (["--auth-trust-unauthenticated", "tank"], "needs --auth-password-file"),
        (["--tls-verify-client", "optional"], "needs --tls-ca"),
    ]:
        done = run_cli("serve", "--data-dir", str(tmp_path / "never"), *args)
        assert done.returncode != 0
        assert why in done.stderr and "Traceback" not in done.stderr


# --------------------------------------------------------------------------- logins


def _call(
    channel: grpc.Channel, rpc: str, request: Any, creds: tuple[str, str]
) -> tuple[grpc.StatusCode | None, str, float]:
    """One controller RPC with Basic credentials: (code or None, details, seconds)."""
    method = METHODS[rpc]
    call = channel.unary_unary(
        f"/{SERVICE_NAME}/{rpc}",
        request_serializer=method.request.SerializeToString,
        response_deserializer=method.response.FromString,
    )
    started = time.perf_counter()
    try:
        call(request, metadata=[("authorization", basic_header(*creds))], timeout=WAIT_S)
    except grpc.RpcError as exc:
        return exc.code(), str(exc.details()), time.perf_counter() - started
    return None, "", time.perf_counter() - started


TIMING_ROUNDS = 15
TIMING_TOLERANCE = 2.5
"""The medians of known and unknown user names may differ by this factor at most;
answering unknown names without a scrypt run made them about 20 times faster."""


def test_login_time_does_not_tell_known_from_unknown_users(tmp_path: Path) -> None:
    users = tmp_path / "users"
    _add(users, ADMIN[0], "--permission", "prn::/*,READ_UPDATE", password=ADMIN[1])
    args = ["--auth-password-file", str(users), "--auth-failed-login-burst", "1000"]
    known: list[float] = []
    unknown: list[float] = []
    with ServerProcess(tmp_path / "data", ports={"controller": FREE}, args=args) as srv:
        channel = grpc.insecure_channel(f"127.0.0.1:{srv.port_of('controller')}")
        with channel:
            request = pb.ScopesRequest()
            _call(channel, "listScopes", request, ADMIN)  # the channel is up
            for _ in range(TIMING_ROUNDS):
                code, _, seconds = _call(channel, "listScopes", request, (ADMIN[0], "wrong-one"))
                assert code is grpc.StatusCode.UNAUTHENTICATED
                known.append(seconds)
                code, _, seconds = _call(channel, "listScopes", request, ("nobody", "wrong-one"))
                assert code is grpc.StatusCode.UNAUTHENTICATED
                unknown.append(seconds)
    ratio = statistics.median(known) / statistics.median(unknown)
    assert 1 / TIMING_TOLERANCE < ratio < TIMING_TOLERANCE, (known, unknown)


def test_failed_logins_are_limited_per_address(tmp_path: Path) -> None:
    users = tmp_path / "users"
    _add(users, ADMIN[0], "--permission", "prn::/*,READ_UPDATE", password=ADMIN[1])
    args = [
        "--auth-password-file", str(users),
        "--auth-failed-login-burst", "3", "--auth-failed-login-interval", "3600",
    ]  # fmt: skip
    ports = {"controller": FREE, "rsio": FREE, "http": FREE}
    with ServerProcess(tmp_path / "data", ports=ports, args=args) as srv:
        plain = ssl.create_default_context()
        with grpc.insecure_channel(f"127.0.0.1:{srv.port_of('controller')}") as channel:
            request = pb.ScopesRequest()
            for _ in range(3):
                code, details, _ = _call(channel, "listScopes", request, ("nobody", "guess-1"))
                assert code is grpc.StatusCode.UNAUTHENTICATED and "wrong password" in details
            # The right password now, from the same address: refused unchecked.
            code, details, _ = _call(channel, "listScopes", request, ADMIN)
            assert code is grpc.StatusCode.UNAUTHENTICATED
            assert "too many failed logins from this address" in details

        async def rsio_login() -> None:
            with pytest.raises(RsioError, match="too many failed logins"):
                await RsioClient.connect("127.0.0.1", srv.port_of("rsio"), credentials=ADMIN)

        asyncio.run(rsio_login())  # the same bucket: RS-IO's Basic logins are the same checks
        assert refusals(srv, "controller", "bad_credentials", plain) == 3
        assert refusals(srv, "controller", "rate_limited", plain) == 1
        assert refusals(srv, "rsio", "rate_limited", plain) == 1


def test_segment_store_refusals_are_counted(tmp_path: Path) -> None:
    from tests.server.test_pravega_server import Raw

    users = tmp_path / "users"
    _add(users, ADMIN[0], "--permission", "prn::/*,READ_UPDATE", password=ADMIN[1])
    ports = {"controller": FREE, "segment_store": FREE, "http": FREE}
    args = ["--auth-password-file", str(users)]
    with ServerProcess(tmp_path / "data", ports=ports, args=args) as srv:
        with grpc.insecure_channel(f"127.0.0.1:{srv.port_of('controller')}") as channel:
            method = METHODS["getDelegationToken"]
            call = channel.unary_unary(
                f"/{SERVICE_NAME}/getDelegationToken",
                request_serializer=method.request.SerializeToString,
                response_deserializer=method.response.FromString,
            )
            token = call(
                pb.StreamInfo(scope=SCOPE, stream="T"),
                metadata=[("authorization", basic_header(*ADMIN))],
                timeout=WAIT_S,
            ).delegationToken

        async def refuse() -> None:
            raw = await Raw.connect(srv.port_of("segment_store"))
            try:
                stream_t, stream_u = f"{SCOPE}/T/0.#epoch.0", f"{SCOPE}/U/0.#epoch.0"
                asks = [(stream_t, ""), (stream_t, "forged"), (stream_u, token)]
                for rid, (segment, given) in enumerate(asks, 1):
                    reply = await raw.request(p.ReadSegment(segment, 0, 10, given, rid))
                    assert isinstance(reply, p.AuthTokenCheckFailed), reply
            finally:
                raw.writer.close()

        asyncio.run(refuse())
        plain = ssl.create_default_context()
        for reason in ("unidentified", "bad_credentials", "permission_denied"):
            assert refusals(srv, "segment_store", reason, plain) == 1, reason
