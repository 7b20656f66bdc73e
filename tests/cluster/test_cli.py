"""``headrace cluster status|drain|undrain`` as a real subprocess against real nodes.

Three ``headrace serve --cluster`` nodes on the shared ZooKeeper (the
``serve_cluster`` fixture of ``test_serve.py``); the CLI runs as
``python -m headrace`` and talks to the cluster administration service on a
node's controller port. Servers without ``--cluster``, with and without
auth, show the one-line refusals. Every wait is bounded.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]

from headrace.protocols.cluster_admin import (
    DRAIN,
    NOT_A_CLUSTER_NODE,
    STATUS,
    UNDRAIN,
    method_path,
)
from tests._server import FREE, POLL_INTERVAL_S, ServerProcess, add_user, free_port, run_cli
from tests.cluster._nodes import CONTAINERS, health, views
from tests.cluster.test_serve import NODES, WAIT_S, serve_cluster

__all__ = ["serve_cluster"]  # the fixture, imported for the tests below


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("cluster", *args)


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The failed command's message: exit status 1, one ``Error:`` line, no traceback."""
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), done.stderr
    return lines[0]


def status_json(node: ServerProcess) -> dict[str, Any]:
    done = cli("status", "--json", "--controller", node.uri)
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.strip().splitlines()) == 1, done.stdout  # one JSON object
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def owned_in(report: dict[str, Any], node_id: str) -> list[int]:
    return [
        c["container"]
        for c in report["containers"]
        if c["owner"] == node_id and c["state"] == "OWNED"
    ]


def test_status_from_every_node_agrees_with_health(
    serve_cluster: dict[str, ServerProcess],
) -> None:
    nodes = serve_cluster
    seen = views(nodes)
    leader = next(v["leader"] for v in seen.values())
    for asked in nodes.values():
        report = status_json(asked)
        assert sorted(report) == [
            "containers",
            "leader",
            "min_in_sync",
            "nodes",
            "offline",
            "replication_factor",
            "under_replicated",
        ]
        assert report["replication_factor"] == 1 and report["offline"] == 0
        assert report["under_replicated"] == 0
        assert report["leader"] == leader
        assert [n["id"] for n in report["nodes"]] == sorted(NODES)
        for entry in report["nodes"]:
            node = nodes[entry["id"]]
            assert entry["alive"] and not entry["draining"]
            assert entry["leader"] == (entry["id"] == leader)
            assert entry["host"] == "127.0.0.1"
            ports = dict(entry["ports"])
            assert ports.pop("transfer") > 0  # the internal door of moves, on a free port
            assert ports.pop("replication") > 0  # the internal door of replication
            assert ports == {
                door: node.port_of(door) for door in ("controller", "segment_store", "http")
            }
            assert owned_in(report, entry["id"]) == seen[entry["id"]]["owned"]
        assert [c["container"] for c in report["containers"]] == list(range(CONTAINERS))
        for c in report["containers"]:
            assert c["state"] == "OWNED" and c["epoch"] >= 1 and c["target"] is None
            assert c["copies"] == [c["owner"]]  # one copy: the owner's

    done = cli("status", "--controller", nodes["n2"].uri)
    assert done.returncode == 0, done.stderr
    assert f"leader {leader}" in done.stdout
    for name in NODES:
        assert name in done.stdout
    assert "OWNED" in done.stdout


def test_drain_empties_a_node_and_undrain_gives_it_containers_again(
    serve_cluster: dict[str, ServerProcess],
) -> None:
    nodes = serve_cluster
    assert health(nodes["n3"])["cluster"]["owned"]  # it has some to give away
    done = cli("drain", "n3", "--wait", "--timeout", str(WAIT_S), "--controller", nodes["n1"].uri)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "draining n3" in done.stdout and "n3 holds no containers" in done.stdout
    assert health(nodes["n3"])["cluster"]["owned"] == []  # released before the records said so

    def balanced_without_n3(seen: dict[str, dict[str, Any]]) -> bool:
        counts = [len(seen[name]["owned"]) for name in ("n1", "n2")]
        return sum(counts) == CONTAINERS and max(counts) - min(counts) <= 1

    deadline = time.monotonic() + WAIT_S  # each new owner confirms its claim on its own loop
    while not balanced_without_n3(seen := views(nodes)):
        assert time.monotonic() < deadline, seen
        time.sleep(POLL_INTERVAL_S)
    assert seen["n3"]["owned"] == []
    report = status_json(nodes["n2"])
    assert [n["id"] for n in report["nodes"] if n["draining"]] == ["n3"]
    assert owned_in(report, "n3") == []

    again = cli("drain", "n3", "--controller", nodes["n2"].uri)
    assert again.returncode == 0, again.stderr
    assert "n3 was already draining: it holds no containers" in again.stdout

    done = cli("undrain", "n3", "--controller", nodes["n2"].uri)
    assert done.returncode == 0, done.stderr
    assert "n3 is no longer draining" in done.stdout
    deadline = time.monotonic() + WAIT_S
    while not health(nodes["n3"])["cluster"]["owned"]:
        assert time.monotonic() < deadline, views(nodes)
        time.sleep(POLL_INTERVAL_S)
    assert not any(n["draining"] for n in status_json(nodes["n1"])["nodes"])


def test_an_unknown_node_is_one_line(serve_cluster: dict[str, ServerProcess]) -> None:
    uri = serve_cluster["n1"].uri
    for command in ("drain", "undrain"):
        line = one_error_line(cli(command, "n9", "--controller", uri))
        assert line == "Error: no node 'n9' in the cluster (known nodes: n1, n2, n3)"
    assert not any(n["draining"] for n in status_json(serve_cluster["n1"])["nodes"])


def test_a_stopped_node_keeps_its_containers_and_cannot_be_drained(
    serve_cluster: dict[str, ServerProcess],
) -> None:
    """A node that left shows as not alive, still owning its containers (their
    only copy is on its disk): ``drain`` records the drain and says so, and
    ``--wait`` refuses at once instead of waiting for moves that cannot happen."""
    nodes = serve_cluster
    held = health(nodes["n3"])["cluster"]["owned"]
    assert held
    nodes["n3"].stop()
    deadline = time.monotonic() + WAIT_S
    while True:
        report = status_json(nodes["n1"])
        if not next(n for n in report["nodes"] if n["id"] == "n3")["alive"]:
            break
        assert time.monotonic() < deadline, report
        time.sleep(POLL_INTERVAL_S)
    assert next(n for n in report["nodes"] if n["id"] == "n3") == {
        "id": "n3",
        "host": None,
        "ports": {},
        "alive": False,
        "draining": False,
        "leader": False,
    }
    assert owned_in(report, "n3") == held

    done = cli("status", "--controller", nodes["n1"].uri)
    assert done.returncode == 0, done.stderr
    assert any(line.split()[:2] == ["n3", "NO"] for line in done.stdout.splitlines())

    line = one_error_line(cli("drain", "n3", "--wait", "--controller", nodes["n2"].uri))
    assert line == "Error: n3 is not alive: its containers stay with it until it comes back"
    done = cli("drain", "n3", "--controller", nodes["n2"].uri)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"n3 was already draining: {len(held)} containers to move ({', '.join(map(str, held))})",
        "n3 is not alive: its containers stay with it until it comes back",
    ]
    assert owned_in(status_json(nodes["n1"]), "n3") == held


def test_malformed_requests_are_refused_and_change_nothing(
    serve_cluster: dict[str, ServerProcess],
) -> None:
    """Bytes that are not a request of the service get ``INVALID_ARGUMENT``; a
    node id that is no znode name is an unknown node; nothing is written."""
    node = serve_cluster["n1"]

    async def call(method: str, request: bytes) -> tuple[Any, str]:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{node.port_of('controller')}") as channel:
            try:
                await channel.unary_unary(method_path(method))(request, timeout=WAIT_S)
            except grpc.aio.AioRpcError as exc:
                return exc.code(), exc.details() or ""
        return grpc.StatusCode.OK, ""

    async def run() -> None:
        for method, request in [
            (DRAIN, b"not json"),
            (DRAIN, b"[]"),
            (DRAIN, b'{"node": 5}'),
            (UNDRAIN, b"{}"),
            (UNDRAIN, b"\xff\xfe"),
            (STATUS, b"[1]"),
        ]:
            code, details = await call(method, request)
            assert code == grpc.StatusCode.INVALID_ARGUMENT, (method, request, code, details)
        code, details = await call(DRAIN, b'{"node": "../n1"}')
        assert code == grpc.StatusCode.NOT_FOUND, details
        assert details.startswith("no node '../n1' in the cluster")
        code, details = await call(DRAIN, b'{"node": "%s"}' % (b"x" * 1_000_000))
        assert code == grpc.StatusCode.NOT_FOUND, details
        assert details == f"no node '{'x' * 64}...' in the cluster (known nodes: n1, n2, n3)"

    asyncio.run(run())
    assert not any(n["draining"] for n in status_json(node)["nodes"])
    assert "Traceback" not in node.log_text(), node.log_text()


def test_a_server_without_cluster_says_so_in_one_line(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "data", ports={"controller": FREE}) as server:
        for args in (["status"], ["status", "--json"], ["drain", "n1"], ["undrain", "n1"]):
            line = one_error_line(cli(*args, "--controller", server.uri))
            assert line == f"Error: {NOT_A_CLUSTER_NODE}"


def test_a_bad_controller_address_is_one_line() -> None:
    closed = free_port()  # nothing listens there
    line = one_error_line(cli("status", "--controller", f"tcp://127.0.0.1:{closed}"))
    assert line.startswith(f"Error: cannot reach the controller at 127.0.0.1:{closed} ")
    assert "is headrace serve running?" in line
    for args, says in (
        (("status", "--controller", "tcp://127.0.0.1"), "needs a host and a port"),
        (("drain", "n1", "--controller", "ftp://127.0.0.1:9090"), "scheme 'ftp' is not supported"),
    ):
        done = cli(*args)  # a usage error: exit status 2, click's usage lines, one Error: line
        assert done.returncode == 2, (done.returncode, done.stderr)
        assert "Traceback" not in done.stderr
        errors = [line for line in done.stderr.splitlines() if line.startswith("Error: ")]
        assert len(errors) == 1 and says in errors[0], done.stderr


def test_with_auth_status_needs_a_user_and_drain_an_administrator(tmp_path: Path) -> None:
    passwords = tmp_path / "passwords"
    add_user(passwords, "admin", "admin secret 1", "prn::/*,READ_UPDATE")
    add_user(passwords, "reader", "reader secret 1", "prn::/scope:logs,READ")
    for name, password in (("admin", "admin secret 1"), ("reader", "reader secret 1")):
        (tmp_path / name).write_text(password + "\n")
    server = ServerProcess(
        tmp_path / "data",
        ports={"controller": FREE},
        args=["--auth-password-file", str(passwords)],
    )
    with server:
        uri = ["--controller", server.uri]
        reader = ["--user", "reader", "--password-file", str(tmp_path / "reader")]
        admin = ["--user", "admin", "--password-file", str(tmp_path / "admin")]

        line = one_error_line(cli("status", *uri))
        assert "--user" in line and "--password-file" in line
        wrong = ["--user", "reader", "--password-file", str(tmp_path / "admin")]
        line = one_error_line(cli("status", *uri, *wrong))
        assert "--user" in line and "--password-file" in line
        # a valid user gets past the check: the server then says it is no cluster node
        line = one_error_line(cli("status", *uri, *reader))
        assert line == f"Error: {NOT_A_CLUSTER_NODE}"
        line = one_error_line(cli("drain", "n1", *uri, *reader))
        assert "'reader' needs READ_UPDATE on prn::/" in line
        assert "administrator" in line and "--user" in line
        line = one_error_line(cli("drain", "n1", *uri, *admin))
        assert line == f"Error: {NOT_A_CLUSTER_NODE}"
