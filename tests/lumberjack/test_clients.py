"""Our own v1 and v2 clients (the sans-I/O client role over a socket) against
``headrace serve``: plain and TLS, compressed and not, "W once", pipelined
windows with keepalives, client-certificate verification.
"""

from __future__ import annotations

import json
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from headrace.protocols.lumberjack import (
    Compressed,
    Data,
    JsonData,
    ProtocolVersion,
    WindowSize,
)
from tests.lumberjack.harness import (
    IO_TIMEOUT_S,
    Closed,
    LumberjackClient,
    TlsFiles,
    client_context,
    free_port,
    make_certificate,
    start_server,
    stored_documents,
)

V1, V2 = ProtocolVersion.V1, ProtocolVersion.V2


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, TlsFiles]:
    directory = tmp_path_factory.mktemp("tls")
    return {
        "server": make_certificate(directory, "localhost"),
        "client": make_certificate(directory, "beat-1"),
        "stranger": make_certificate(directory, "stranger"),
    }


def _lsf_event(seq: int, line: str, host: str = "h1") -> Data:
    """A logstash-forwarder style D frame: file, host, offset, line."""
    return Data(
        seq,
        (
            (b"file", b"/var/log/app.log"),
            (b"host", host.encode()),
            (b"offset", str(seq * 100).encode()),
            (b"line", line.encode()),
        ),
    )


def _all_docs(data_dir: Path) -> list[dict[str, object]]:
    return [doc for docs in stored_documents(data_dir).values() for doc in docs]


# --------------------------------------------------------------------------- v1


@pytest.mark.parametrize("compressed", [False, True], ids=["bare", "compressed"])
@pytest.mark.parametrize("use_tls", [False, True], ids=["plain", "tls"])
def test_v1_client_windows_are_acked_with_last_seq_and_stored_once(
    tmp_path: Path, certs: dict[str, TlsFiles], use_tls: bool, compressed: bool
) -> None:
    server = start_server(tmp_path / "data", tls=certs["server"] if use_tls else None)
    try:
        port = server.tls_port if use_tls else server.port
        context = client_context(certs["server"]) if use_tls else None
        with LumberjackClient(port, V1, ssl_context=context) as client:
            seq = 0
            for window in range(3):
                frames = [_lsf_event(seq + i + 1, f"w{window} line {i}") for i in range(50)]
                seq += len(frames)
                client.send(WindowSize(len(frames)))
                if compressed:
                    client.send(Compressed(tuple(frames[:20])), Compressed(tuple(frames[20:])))
                else:
                    client.send(*frames)
                client.wait_for_ack(seq)
            # seq keeps counting across windows (logstash-forwarder): acks are the last seq
            assert client.acks == [50, 100, 150]
            assert client.conn.unacked_windows == 0
    finally:
        assert server.stop() == 0, server.stderr
    docs = _all_docs(tmp_path / "data")
    assert len(docs) == 150
    assert {str(d["line"]) for d in docs} == {f"w{w} line {i}" for w in range(3) for i in range(50)}
    assert all(set(d) == {"@metadata", "file", "host", "offset", "line"} for d in docs)
    meta: dict[str, object] = {"ip_address": "127.0.0.1"}
    if use_tls:
        meta["tls_peer"] = {"status": "unverified"}  # no client certificate asked for
    assert all(d["@metadata"] == meta for d in docs)
    offsets = [int(str(d["offset"])) for d in docs]  # one host: one segment, wire order
    assert offsets == sorted(offsets)


@pytest.mark.parametrize("use_tls", [False, True], ids=["plain", "tls"])
def test_v1_client_sending_w_once_gets_one_ack_per_implicit_window(
    tmp_path: Path, certs: dict[str, TlsFiles], use_tls: bool
) -> None:
    """npm lumberjack-protocol / the Ruby client: one W, then D frames forever."""
    server = start_server(tmp_path / "data", tls=certs["server"] if use_tls else None)
    try:
        port = server.tls_port if use_tls else server.port
        context = client_context(certs["server"]) if use_tls else None
        with LumberjackClient(port, V1, ssl_context=context) as client:
            client.send_raw(WindowSize(10))
            for seq in range(1, 36):
                client.send_raw(_lsf_event(seq, f"line {seq}"))
            client.wait_for_ack(30)
            assert client.acks == [10, 20, 30]
            # 5 events of a fourth implicit window: no ack (v1: nothing partial)
            assert client.quiet_for(0.5) == []
            for seq in range(36, 41):
                client.send_raw(Compressed((_lsf_event(seq, f"line {seq}"),)))
            client.wait_for_ack(40)
            assert client.acks == [10, 20, 30, 40]
    finally:
        assert server.stop() == 0, server.stderr
    lines = sorted(int(str(d["line"]).split()[1]) for d in _all_docs(tmp_path / "data"))
    assert lines == list(range(1, 41))


def test_v1_and_v2_empty_window_repeats_the_last_ack(tmp_path: Path) -> None:
    server = start_server(tmp_path / "data")
    try:
        with LumberjackClient(server.port, V2) as client:
            client.send(WindowSize(0))
            client.wait_for_acks(1)
            client.send(WindowSize(2), JsonData(7, b'{"a":1}'), JsonData(8, b'{"a":2}'))
            client.wait_for_ack(8)
            client.send(WindowSize(0), Compressed(()))  # pylogbeat's W 0 + empty C
            client.wait_for_acks(3)
            assert client.acks == [0, 8, 8]
        with LumberjackClient(server.port, V1) as client:
            client.send(WindowSize(1), _lsf_event(5, "x"), WindowSize(0))
            client.wait_for_acks(2)
            assert client.acks == [5, 5]
    finally:
        assert server.stop() == 0, server.stderr
    assert len(_all_docs(tmp_path / "data")) == 3


# --------------------------------------------------------------------------- v2


KEEPALIVE_S = 0.2


def _v2_window(first_seq: int, count: int, tag: str) -> Iterator[JsonData]:
    for i in range(count):
        doc = {"message": f"{tag} {i}", "beat": {"hostname": f"node-{i % 3}"}}
        yield JsonData(first_seq + i, json.dumps(doc).encode())


def test_v2_pipelined_windows_get_keepalives_then_acks_in_order(tmp_path: Path) -> None:
    server = start_server(tmp_path / "data", "--lumberjack-keepalive-interval", str(KEEPALIVE_S))
    try:
        with LumberjackClient(server.port, V2) as client:
            # libbeat: seq restarts at 1 per window; two windows pipelined
            # before any ack, the second one only half sent.
            started = time.monotonic()
            client.send(WindowSize(4), Compressed(tuple(_v2_window(1, 4, "first"))))
            client.send(WindowSize(4), *list(_v2_window(1, 4, "second"))[:2])
            client.wait_for_ack(4)  # the first window, stored, while the second is open
            # The second window is pending: keepalives (Ack 0) must come.
            client.wait_for_acks(client.acks.index(4) + 4, timeout_s=20 * KEEPALIVE_S + 5)
            assert set(client.acks) == {0, 4} and client.acks.count(4) == 1
            client.send(*list(_v2_window(1, 4, "second"))[2:])
            client.wait_for_acks(len(client.acks) + 1)
            while client.acks[-1] == 0:  # the real ack, maybe after more keepalives
                client.wait_for_acks(len(client.acks) + 1)
            elapsed = time.monotonic() - started
            assert client.acks[-1] == 4 and client.acks.count(4) == 2
            keepalives = client.acks.count(0)
            assert keepalives >= 3
            # never more often than the interval (however the reads were batched)
            assert keepalives <= elapsed / KEEPALIVE_S + 1, (keepalives, elapsed)
            assert client.conn.unacked_windows == 0
            # Nothing pending: no more keepalives.
            assert client.quiet_for(5 * KEEPALIVE_S) == []
    finally:
        assert server.stop() == 0, server.stderr
    by_segment = stored_documents(tmp_path / "data")
    messages = [str(d["message"]) for docs in by_segment.values() for d in docs]
    assert sorted(messages) == sorted(f"{t} {i}" for t in ("first", "second") for i in range(4))
    for docs in by_segment.values():  # routing key [beat][hostname]: one node, one segment
        for node in range(3):
            got = [str(d["message"]) for d in docs if d["beat"] == {"hostname": f"node-{node}"}]
            if got:
                want = [f"{t} {i}" for t in ("first", "second") for i in range(4) if i % 3 == node]
                assert got == want


def test_v1_gets_no_keepalives(tmp_path: Path) -> None:
    server = start_server(tmp_path / "data", "--lumberjack-keepalive-interval", str(KEEPALIVE_S))
    try:
        with LumberjackClient(server.port, V1) as client:
            client.send(WindowSize(3), _lsf_event(1, "a"), _lsf_event(2, "b"))
            assert client.quiet_for(5 * KEEPALIVE_S) == []
            client.send(_lsf_event(3, "c"))
            client.wait_for_ack(3)
            assert client.acks == [3]
    finally:
        assert server.stop() == 0, server.stderr


# --------------------------------------------------------------------------- TLS


def test_tls_client_certificate_is_required_with_tls_ca(
    tmp_path: Path, certs: dict[str, TlsFiles]
) -> None:
    server = start_server(tmp_path / "data", tls=certs["server"], tls_ca=certs["client"].cert)
    try:
        with LumberjackClient(
            server.tls_port, V2, ssl_context=client_context(certs["server"], certs["client"])
        ) as client:
            client.send(WindowSize(1), JsonData(1, b'{"who":"beat-1"}'))
            client.wait_for_ack(1)
        for stranger in (None, certs["stranger"]):
            with pytest.raises((ssl.SSLError, ConnectionError, Closed)):
                context = client_context(certs["server"], stranger)
                with LumberjackClient(server.tls_port, V2, ssl_context=context) as client:
                    # TLS 1.3 reports the refusal on the first read, not in connect
                    client.send(WindowSize(1), JsonData(1, b'{"who":"stranger"}'))
                    client.wait_for_ack(1, timeout_s=IO_TIMEOUT_S)
    finally:
        assert server.stop() == 0, server.stderr
    docs = _all_docs(tmp_path / "data")
    assert [d["who"] for d in docs] == ["beat-1"]
    # the verified client certificate's subject, as Logstash's beats input records it
    tls_peer = {"status": "verified", "subject": f"CN={certs['client'].cert.stem}"}
    assert docs[0]["@metadata"] == {"ip_address": "127.0.0.1", "tls_peer": tls_peer}


def test_tls_listener_not_started_without_a_certificate(tmp_path: Path) -> None:
    server = start_server(tmp_path / "data", "--lumberjack-tls-port", str(free_port()))
    try:
        line = server.wait_for_line("lumberjack_tls listener not started")
        assert "--tls-cert" in line
        assert "lumberjack_tls" not in server.wait_for_line("headrace ready")
        with LumberjackClient(server.port, V2) as client:  # the plain listener is there
            client.send(WindowSize(1), JsonData(1, b'{"a":1}'))
            client.wait_for_ack(1)
    finally:
        assert server.stop() == 0, server.stderr


# --------------------------------------------------------------------------- captured clients

CAPTURES = {
    # logstash-forwarder framing (v1, Go zlib level 3 with a sync flush)
    "logstash-forwarder v1": (
        "315700000002"
        "314300000068"
        "785e3274616060606460606001e1b4cc9c5406060601fdb2c422fd9cfc74fdc48202bd9cfc74"
        "905c467e71090303035386210303035b7e5a5a712a88cf680092ccc9cc036964cd48cdc9c907"
        "9bc944899966c86696e717e5a400000000ffff010000ffffa84921ca",
        "314100000002",
    ),
    # pylogbeat 2.1.0, send([{"message":"hello"},{"message":"world"}])
    "pylogbeat v2": (
        "325700000002"
        "324300000031"
        "789c33f2626060600462916aa5dcd4e2e2c4f454252b05a58cd49c9c7ca55a23902c13866c79"
        "7e514e8a522d00900e0ede",
        "324100000002",
    ),
    # go-lumber's v2 client (libbeat's), compression level 0
    "go-lumber v2": (
        "325700000002"
        "324a00000001000000137b226d657373616765223a2268656c6c6f227d"
        "324a00000002000000137b226d657373616765223a22776f726c64227d",
        "324100000002",
    ),
}


@pytest.mark.parametrize("client_name", list(CAPTURES))
def test_captured_client_bytes_get_the_exact_ack_bytes(tmp_path: Path, client_name: str) -> None:
    sent, expected = (bytes.fromhex(h) for h in CAPTURES[client_name])
    server = start_server(tmp_path / "data")
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=IO_TIMEOUT_S) as sock:
            sock.sendall(sent)
            reply = b""
            while len(reply) < len(expected):
                chunk = sock.recv(64)
                assert chunk, f"closed after {reply.hex()}; {server.stderr}"
                reply += chunk
            assert reply == expected
    finally:
        assert server.stop() == 0, server.stderr
    docs = _all_docs(tmp_path / "data")
    assert len(docs) == 2
    if client_name.startswith("logstash"):
        assert {str(d["line"]) for d in docs} == {"hello", "world"}
        assert all(list(d) == ["@metadata", "file", "host", "offset", "line"] for d in docs)
    else:
        assert {str(d["message"]) for d in docs} == {"hello", "world"}


@pytest.mark.parametrize("linger", [True, False], ids=["linger", "no-linger"])
def test_w_once_client_idle_closed_mid_window_keeps_its_events_only_with_linger(
    tmp_path: Path, linger: bool
) -> None:
    """npm lumberjack-protocol: W 1000 once, three events, then silence; it never resends."""
    server = start_server(
        tmp_path / "data",
        "--lumberjack-window-linger",
        "0.2" if linger else "0",
        "--lumberjack-idle-timeout",
        "1",
    )
    try:
        with LumberjackClient(server.port, V1) as client:
            client.send(WindowSize(1000), *(_lsf_event(seq, f"quiet {seq}") for seq in (1, 2, 3)))
            assert client.wait_closed() == []  # the idle timeout; nothing acked on v1
        server.wait_for_line("idle for")
    finally:
        assert server.stop() == 0, server.stderr
    lines = sorted(str(d["line"]) for d in _all_docs(tmp_path / "data"))
    assert lines == (["quiet 1", "quiet 2", "quiet 3"] if linger else [])
