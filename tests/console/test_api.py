"""The console's JSON API on a real ``headrace serve``: what it reports, who may see
it, bounded answers, and requests pipelined behind an API request."""

from __future__ import annotations

import asyncio
import re
import socket
from pathlib import Path
from typing import Any

from headrace.server.console import MAX_QUERY_FIELDS
from tests._server import add_user
from tests.console.conftest import api, group_scenario, produce
from tests.ops.conftest import WAIT_S, free_port, listener_args


def test_streams_and_connections_match_what_was_written(start_serve: Any) -> None:
    http, tank = free_port(), free_port()
    serve = start_serve(*listener_args(http=http, tank=tank))
    base = f"http://127.0.0.1:{http}"
    asyncio.run(asyncio.wait_for(produce(tank, {"alpha": 3, "beta": 5}), WAIT_S))
    status, body, headers = api(base, "/api/streams")
    assert status == 200 and body["truncated"] is False
    assert headers["X-Frame-Options"] == "DENY"
    streams = {s["name"]: s for s in body["streams"]}
    assert set(streams) == {"tank/alpha", "tank/beta"}
    beta = streams["tank/beta"]
    assert (beta["events"], beta["sealed"], beta["segments"]) == (5, False, 1)
    assert beta["events"] == serve.metric("headrace_stream_events_total", stream="tank/beta")
    assert beta["appended_bytes"] == serve.metric(
        "headrace_stream_appended_bytes_total", stream="tank/beta"
    )
    assert beta["bytes"] == beta["appended_bytes"]  # nothing truncated: all still held
    assert beta["tail"] == f"0:{beta['bytes']}"  # where a tail of the stream starts
    assert sum(s["bytes"] for s in streams.values()) <= serve.metric("headrace_stored_bytes")

    serve.wait_for_access(protocol="tank", reason="eof")
    status, body, _ = api(base, "/api/connections")
    doors = {door["door"]: door for door in body["doors"]}
    assert doors["tank"]["port"] == tank and doors["tank"]["up"] is True
    assert doors["tank"]["open"] == 0 and doors["tank"]["accepted"] == 1
    assert doors["tank"]["requests"] == serve.metric("headrace_requests_total", protocol="tank")
    assert doors["tank"]["received_bytes"] == serve.metric(
        "headrace_received_bytes_total", protocol="tank"
    )
    assert doors["http"]["open"] >= 1  # this request's own connection

    status, health, _ = api(base, "/api/health")
    assert status == 200 and health["status"] == "ok" and health["auth"] is False
    assert health["admin"] is False and health["user"] is None
    assert health["listeners"]["tank"] == {"port": tank, "up": True}


def test_groups_report_the_lag_of_each_segment(start_serve: Any) -> None:
    http, controller, segments = free_port(), free_port(), free_port()
    start_serve(*listener_args(http=http, controller=controller, segment_store=segments))
    size = asyncio.run(
        asyncio.wait_for(group_scenario(f"tcp://127.0.0.1:{controller}", 10, 4), 3 * WAIT_S)
    )
    status, body, _ = api(f"http://127.0.0.1:{http}", "/api/groups")
    assert status == 200
    _, streams, _ = api(f"http://127.0.0.1:{http}", "/api/streams")
    (stream,) = streams["streams"]
    assert (stream["name"], stream["events"], stream["bytes"]) == ("g/s", 10, size)
    (group,) = body["groups"]
    assert group["name"] == "g/grp" and group["known"] is True
    assert group["streams"] == ["g/s"]
    (segment,) = group["segments"]
    assert segment["segment"] == "g/s/0.#epoch.0" and segment["length"] == size
    assert segment["lag"] == size - 4 * size // 10 == group["lag"]


def _auth_server(start_serve: Any, tmp_path: Path) -> tuple[Any, str, int]:
    users = tmp_path / "users"
    add_user(users, "admin", "admin-secret", "prn::/,READ_UPDATE")
    add_user(users, "reader", "reader-secret", "prn::/scope:tank/stream:alpha,READ")
    http, tank = free_port(), free_port()
    serve = start_serve(
        *listener_args(http=http, tank=tank),
        "--auth-password-file", str(users),
        "--auth-trust-unauthenticated", "tank",
    )  # fmt: skip
    asyncio.run(asyncio.wait_for(produce(tank, {"alpha": 2, "beta": 1}), WAIT_S))
    return serve, f"http://127.0.0.1:{http}", tank


def test_with_auth_on_the_api_needs_credentials_and_shows_what_the_user_may_read(
    start_serve: Any, tmp_path: Path
) -> None:
    serve, base, _ = _auth_server(start_serve, tmp_path)
    status, body, headers = api(base, "/api/streams")
    assert status == 401 and "log in" in body["error"]
    assert headers["WWW-Authenticate"] == 'Basic realm="headrace"'
    # The console's own requests get no Basic challenge (no browser dialog).
    status, _, headers = api(base, "/api/streams", headers={"X-Headrace-Console": "1"})
    assert status == 401 and "WWW-Authenticate" not in headers
    status, body, _ = api(base, "/api/health", user="reader", password="wrong")
    assert status == 401 and "wrong password" in body["error"]
    assert serve.metric("headrace_auth_refusals_total", protocol="http", reason="bad_credentials")

    status, body, _ = api(base, "/api/streams", user="reader", password="reader-secret")
    assert status == 200 and [s["name"] for s in body["streams"]] == ["tank/alpha"]
    status, body, _ = api(base, "/api/health", user="reader", password="reader-secret")
    assert (body["user"], body["admin"], body["auth"]) == ("reader", False, True)
    status, body, _ = api(base, "/api/streams", user="admin", password="admin-secret")
    assert [s["name"] for s in body["streams"]] == ["tank/alpha", "tank/beta"]
    status, body, _ = api(base, "/api/health", user="admin", password="admin-secret")
    assert body["admin"] is True


def test_only_an_admin_may_seal_a_stream(start_serve: Any, tmp_path: Path) -> None:
    _, base, _ = _auth_server(start_serve, tmp_path)
    seal = "/api/streams/seal?stream=tank/alpha"
    status, body, _ = api(base, seal, method="POST", user="reader", password="reader-secret")
    assert status == 403 and "only an admin" in body["error"]
    status, body, _ = api(base, seal, method="GET", user="admin", password="admin-secret")
    assert status == 405
    status, body, _ = api(base, seal, method="POST", user="admin", password="admin-secret")
    assert status == 200 and body == {"sealed": "tank/alpha"}
    _, body, _ = api(base, "/api/streams", user="admin", password="admin-secret")
    assert {s["name"]: s["sealed"] for s in body["streams"]} == {
        "tank/alpha": True,
        "tank/beta": False,
    }
    status, body, _ = api(
        base,
        "/api/streams/seal?stream=no/such",
        method="POST",
        user="admin",
        password="admin-secret",
    )
    assert status == 404


def test_with_auth_off_the_console_is_read_only(start_serve: Any) -> None:
    http, tank = free_port(), free_port()
    start_serve(*listener_args(http=http, tank=tank))
    asyncio.run(asyncio.wait_for(produce(tank, {"alpha": 1}), WAIT_S))
    base = f"http://127.0.0.1:{http}"
    status, body, _ = api(base, "/api/streams/seal?stream=tank/alpha", method="POST")
    assert status == 403 and "read-only" in body["error"]
    _, body, _ = api(base, "/api/streams")
    assert body["streams"][0]["sealed"] is False


def test_requests_pipelined_behind_an_api_request_are_answered_in_order(
    start_serve: Any,
) -> None:
    http = free_port()
    start_serve(*listener_args(http=http))
    requests = b"".join(
        f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
        for path in ("/api/health", "/health", "/api/connections", "/nope", "/api/streams")
    )
    with socket.create_connection(("127.0.0.1", http), timeout=WAIT_S) as sock:
        sock.sendall(requests + b"GET /api/groups HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    answers = re.split(rb"HTTP/1\.1 ", received)[1:]
    assert [answer[:3] for answer in answers] == [b"200", b"200", b"200", b"404", b"200", b"200"]
    assert b'"version"' in answers[0] and b'"version"' not in answers[1]
    assert b'"doors"' in answers[2] and b'"streams"' in answers[4] and b'"groups"' in answers[5]


def test_console_page_and_files_are_served_with_their_types(start_serve: Any) -> None:
    http = free_port()
    serve = start_serve(*listener_args(http=http))
    status, page = serve.get("/")
    assert status == 200 and "<title>headrace console</title>" in page
    for path in ("/console/console.js", "/console/console.css"):
        assert serve.get(path)[0] == 200
    assert serve.get("/console/nothing.js")[0] == 404
    status, _, _ = api(f"http://127.0.0.1:{http}", "/api/health", method="DELETE")
    assert status == 405
    query = "&".join(f"f{n}=1" for n in range(MAX_QUERY_FIELDS + 1))
    status, body, _ = api(f"http://127.0.0.1:{http}", f"/api/streams?{query}")
    assert status == 400 and "at most" in body["error"]
    assert serve.get("/api/health")[0] == 200  # the server goes on


def test_a_websocket_upgrade_pipelined_behind_an_api_request_is_answered(
    start_serve: Any,
) -> None:
    http = free_port()
    start_serve(*listener_args(http=http))
    upgrade = (
        f"GET /rsio HTTP/1.1\r\nHost: 127.0.0.1:{http}\r\nUpgrade: websocket\r\n"
        "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        "Sec-WebSocket-Version: 13\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", http), timeout=WAIT_S) as sock:
        sock.sendall(b"GET /api/health HTTP/1.1\r\nHost: x\r\n\r\n" + upgrade)
        received = b""
        while received.count(b"HTTP/1.1 ") < 2 or not received.endswith(b"\r\n\r\n"):
            chunk = sock.recv(65536)
            assert chunk, received
            received += chunk
    answers = re.split(rb"HTTP/1\.1 ", received)[1:]
    assert [answer[:3] for answer in answers] == [b"200", b"101"]
