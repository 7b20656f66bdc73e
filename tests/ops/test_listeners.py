"""``--listener DOOR=SCHEME://HOST:PORT``: each listener plain or TLS, several per door.

Real ``headrace serve`` processes and real clients:

* TANK in plaintext (our ``TankClient``, as TANK's C++ client has no TLS) and
  Lumberjack over TLS (pylogbeat) on one server at once;
* the controller on a plain and a TLS listener at once: a client on each is
  handed the segment-store listener of its own scheme by ``getURI`` and
  writes and reads through it (our ``PravegaClient``, and the real
  ``pravega`` client in a child process);
* the options from a TOML list;
* refusals, one ``Error:`` line each: an unknown door or scheme, a port bound
  twice, ``tls`` without ``--tls-cert``, a port flag beside ``--listener`` for
  the same door.
"""

from __future__ import annotations

import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pylogbeat
import pytest

from headrace.client import PravegaClient
from headrace.client.controller import ScalingPolicy, StreamConfig
from headrace.client.tank import TankClient
from headrace.client.tls import TlsOptions
from headrace.errors import ConfigError
from headrace.protocols.pravega.controller import Segment
from headrace.protocols.tank import BundleMessage
from headrace.server.config import DEFAULT_PORTS, ListenerSpec, build_config, parse_listener
from tests._real_pravega import run_scenario
from tests._server import TlsFiles, make_ca, make_signed
from tests.ops.conftest import (
    START_TIMEOUT_S,
    WAIT_S,
    free_port,
    listener_args,
    run_env,
    serve_command,
)


@dataclass(frozen=True)
class Pki:
    ca: Path
    server: TlsFiles
    ca_dir: Path
    """A directory holding only ``ca`` (where the real client reads trust from)."""


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
    ca_dir = directory / "trust"
    ca_dir.mkdir()
    (ca_dir / "ca.pem").write_bytes(ca[0].read_bytes())
    return Pki(ca[0], server, ca_dir)


def tls_args(pki: Pki) -> list[str]:
    return ["--tls-cert", str(pki.server.cert), "--tls-key", str(pki.server.key)]


def _pylogbeat_tls(port: int, ca: Path, events: list[dict[str, Any]]) -> dict[str, Any]:
    """Send ``events`` in one window over TLS, checking the certificate; in a thread."""
    outcome: dict[str, Any] = {}

    def client() -> None:
        try:
            beat = pylogbeat.PyLogBeatClient(
                "localhost",
                port,
                timeout=WAIT_S,
                ssl_enable=True,
                ssl_verify=True,
                ca_certs=str(ca),
            )
            with beat:
                beat.send(events)
                outcome["last_ack"] = beat._last_ack
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=client, daemon=True)
    thread.start()
    thread.join(3 * WAIT_S)
    assert not thread.is_alive(), "pylogbeat hung"
    if "error" in outcome:
        raise outcome["error"]
    return outcome


async def test_tank_plain_and_lumberjack_tls_on_one_server(start_serve: Any, pki: Pki) -> None:
    tank, tank_tls, lumberjack, http = free_port(), free_port(), free_port(), free_port()
    serve = start_serve(
        *listener_args(),
        *tls_args(pki),
        "--listener",
        f"tank=plain://127.0.0.1:{tank}",
        "--listener",
        f"tank=tls://127.0.0.1:{tank_tls}",
        "--listener",
        f"lumberjack=tls://127.0.0.1:{lumberjack}",
        "--listener",
        f"http=plain://127.0.0.1:{http}",
    )
    assert serve.ports == {"tank": tank, "tank_2": tank_tls, "lumberjack": lumberjack, "http": http}

    async with await TankClient.connect("127.0.0.1", tank) as client:  # no TLS
        await client.create_topic("plain", 1)
        await client.produce("plain", 0, [BundleMessage(b"m1", 1_700_000_000_000, b"k")])
        consumed = await client.consume("plain", 0, 0)
    assert [m.content for m in consumed.messages] == [b"m1"]
    # The TLS listener of the same door is the same broker: one partition, one
    # sequence, whichever listener a message came in on.
    tls = TlsOptions(ca_file=pki.ca).ssl_context()
    async with await TankClient.connect("localhost", tank_tls, ssl_context=tls) as client:
        await client.produce("plain", 0, [BundleMessage(b"m2", 1_700_000_000_001, b"k")])
        over_tls = await client.consume("plain", 0, 0)
    async with await TankClient.connect("127.0.0.1", tank) as client:
        consumed = await client.consume("plain", 0, 0)
    for result in (over_tls, consumed):
        assert [m.content for m in result.messages] == [b"m1", b"m2"]
        assert [m.seq_num for m in result.messages] == [1, 2]

    events = [{"message": f"line {i}", "host": "web-1"} for i in range(5)]
    assert _pylogbeat_tls(lumberjack, pki.ca, events) == {"last_ack": 5}
    assert serve.wait_for_access(protocol="lumberjack", reason="eof")["requests"] >= 1
    assert serve.get("/health")[0] == 200  # the HTTP listener is plain


async def _write_read(uri: str, tls: TlsOptions | None, scope: str) -> tuple[str, int]:
    """Through the controller at ``uri``: the segment store ``getURI`` names, and
    a stream written and read back through it."""
    async with PravegaClient(uri, tls=tls) as client:
        assert await client.controller.create_scope(scope)
        assert await client.controller.create_stream(scope, "st", StreamConfig(ScalingPolicy()))
        store = await client.controller.get_uri(Segment(scope, "st", 0))
        async with await client.create_writer(scope, "st") as writer:
            for value in (b"a", b"b"):
                await writer.write(value)
        await client.controller.seal_stream(scope, "st")
        records = [r.value async for r in client.record_reader(scope, "st")]
    assert records == [b"a", b"b"]
    return store


@pytest.fixture
def two_schemes(start_serve: Any, pki: Pki) -> Iterator[Any]:
    """Controller and segment store, each on a plain and a TLS listener."""
    ports = [free_port() for _ in range(4)]
    serve = start_serve(
        *listener_args(),
        *tls_args(pki),
        "--listener",
        f"controller=plain://127.0.0.1:{ports[0]}",
        "--listener",
        f"controller=tls://127.0.0.1:{ports[1]}",
        "--listener",
        f"segment-store=plain://127.0.0.1:{ports[2]}",
        "--listener",
        f"segment-store=tls://127.0.0.1:{ports[3]}?advertise=localhost",
    )
    assert serve.ports == dict(
        zip(("controller", "controller_2", "segment_store", "segment_store_2"), ports, strict=True)
    )
    yield serve


async def test_each_controller_listener_hands_out_the_segment_store_of_its_scheme(
    two_schemes: Any, pki: Pki
) -> None:
    serve = two_schemes
    plain_uri = f"tcp://127.0.0.1:{serve.ports['controller']}"
    tls_uri = f"tls://localhost:{serve.ports['controller_2']}"

    assert await _write_read(plain_uri, None, "plainside") == (
        "127.0.0.1",
        serve.ports["segment_store"],
    )
    serve.wait_for_access(protocol="segment_store", reason="eof")

    tls = TlsOptions(ca_file=pki.ca)
    assert await _write_read(tls_uri, tls, "tlsside") == (
        "localhost",
        serve.ports["segment_store_2"],
    )
    serve.wait_for_access(protocol="segment_store_2", reason="eof")
    # Both listeners serve the one store: each side reads what the other wrote.
    async with PravegaClient(plain_uri) as client:
        assert [r.value async for r in client.record_reader("tlsside", "st")] == [b"a", b"b"]


def test_the_real_pravega_client_on_each_controller_listener(
    two_schemes: Any, pki: Pki, tmp_path: Path
) -> None:
    serve = two_schemes
    result = run_scenario(
        "tls_write_read",
        f"tls://localhost:{serve.ports['controller_2']}",
        "realtls",
        "verify",
        env={"pravega_client_tls_cert_path": str(pki.ca_dir)},
        cwd=tmp_path,
    )
    assert result == {
        "scope_created": True,
        "stream_created": True,
        "read": ["tls-0", "tls-1", "tls-2"],
    }
    serve.wait_for_access(protocol="segment_store_2", reason="eof")
    plain = run_scenario(
        "write_only", f"tcp://127.0.0.1:{serve.ports['controller']}", "20", "realplain"
    )
    assert plain["acknowledged"] == 20
    serve.wait_for_access(protocol="segment_store", reason="eof")


def test_listeners_from_a_toml_list(start_serve: Any, tmp_path: Path) -> None:
    tank, http = free_port(), free_port()
    config = tmp_path / "headrace.toml"
    config.write_text(
        "".join(f"{name}_port = 0\n" for name in ("controller", "segment_store", "rsio"))
        + "tank_port = 0\nlumberjack_port = 0\nlumberjack_tls_port = 0\nhttp_port = 0\n"
        + f'listener = ["tank=plain://127.0.0.1:{tank}", "http=plain://:{http}"]\n'
    )
    serve = start_serve("--config", str(config))
    assert serve.ports == {"tank": tank, "http": http}


@pytest.mark.parametrize(
    ("listeners", "env", "named"),
    [
        (["queue=plain://127.0.0.1:{p}"], None, "unknown door 'queue'"),
        (["tank=ssl://127.0.0.1:{p}"], None, "unknown scheme 'ssl'"),
        (["tank=plain://127.0.0.1"], None, "needs a port"),
        (
            ["tank=plain://127.0.0.1:{p}", "rsio=plain://0.0.0.0:{p}"],
            None,
            "port {p} is used twice",
        ),
        (["lumberjack=tls://127.0.0.1:{p}"], None, "tls needs --tls-cert and --tls-key"),
        (["controller=plain://127.0.0.1:{p}?advertise=a&b"], None, "not a host name"),
        ([], {"HEADRACE_LISTENER": "http=gopher://127.0.0.1:{p}"}, "unknown scheme 'gopher'"),
    ],
)
def test_a_bad_listener_stops_serve_with_one_line(
    tmp_path: Path, listeners: list[str], env: dict[str, str] | None, named: str
) -> None:
    port = free_port()
    args = [arg for text in listeners for arg in ("--listener", text.format(p=port))]
    result = subprocess.run(
        [*serve_command(tmp_path / "data", *listener_args()), *args],
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
        env=run_env(None if env is None else {k: v.format(p=port) for k, v in env.items()}),
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert named.format(p=port) in line
    assert not (tmp_path / "data").exists()


def test_a_port_flag_beside_a_listener_of_its_door_stops_serve(tmp_path: Path) -> None:
    port, other = free_port(), free_port()
    result = subprocess.run(
        [
            *serve_command(tmp_path / "data", *listener_args(tank=other)),
            "--listener",
            f"tank=plain://127.0.0.1:{port}",
        ],
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
        env=run_env(None),
    )
    assert result.returncode == 2, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert f"--tank-port {other} and --listener tank=" in line


def test_two_port_flags_on_one_port_stop_serve(tmp_path: Path) -> None:
    port = free_port()
    result = subprocess.run(
        serve_command(tmp_path / "data", *listener_args(tank=port, rsio=port)),
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
        env=run_env(None),
    )
    assert result.returncode == 2, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert f"port {port} is used twice: by tank" in line


def test_a_later_listener_may_be_trusted_by_its_name(tmp_path: Path) -> None:
    """``--auth-trust-unauthenticated`` names a door's second listener as ``tank_2``:
    the plaintext one of a door whose other listener is TLS, say."""
    users = tmp_path / "users"
    users.write_text("")
    base = {
        **{f"{name}_port": 0 for name in DEFAULT_PORTS},
        "auth_password_file": str(users),
        "listener": ("tank=plain://127.0.0.1:1", "tank=plain://127.0.0.1:2"),
    }
    config = build_config({**base, "auth_trust_unauthenticated": "tank_2"})
    assert config.auth is not None and config.auth.trusted_listeners == {"tank_2"}
    with pytest.raises(ConfigError, match="no listener 'tank_3'"):
        build_config({**base, "auth_trust_unauthenticated": "tank_3"})
    with pytest.raises(ConfigError, match="'controller_2' is not one of"):
        build_config({**base, "auth_trust_unauthenticated": "controller_2"})


def test_the_forms_of_a_listener() -> None:
    assert parse_listener("Segment-Store=TLS://[::1]:12443?advertise=store.example") == (
        ListenerSpec("", "segment_store", True, "::1", 12443, "store.example")
    )
    assert parse_listener("segment_store=plain://:12345") == (
        ListenerSpec("", "segment_store", False, "", 12345)
    )
    config = build_config(
        {
            **{f"{name}_port": 0 for name in DEFAULT_PORTS},
            "host": "10.0.0.5",
            "listener": "rsio=plain://:7070 rsio=plain://127.0.0.1:7071",  # as the environment
        }
    )
    assert [(s.name, s.host, s.port) for s in config.listener_plan()] == [
        ("rsio", "10.0.0.5", 7070),
        ("rsio_2", "127.0.0.1", 7071),
    ]


@pytest.mark.parametrize("door", ["controller", "tank"])
def test_a_taken_listener_port_names_its_listener_flag(tmp_path: Path, door: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [
                *serve_command(tmp_path / "data", *listener_args()),
                "--listener",
                f"{door}=plain://127.0.0.1:{free_port()}",
                "--listener",
                f"{door}=plain://127.0.0.1:{port}",
            ],
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT_S,
            env=run_env(None),
        )
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert f"the {door}_2 listener cannot listen on 127.0.0.1:{port}" in line
    assert "address already in use" in line and f"--listener {door}=..." in line
