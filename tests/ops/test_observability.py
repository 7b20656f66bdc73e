"""/health, /metrics, access log lines and ``headrace status`` against a real server."""

from __future__ import annotations

import asyncio
import gc
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from headrace.client import ControllerClient
from headrace.client.tank import TankClient
from headrace.protocols.tank import BundleMessage
from headrace.server import app as app_module
from headrace.server._context import Listener, ListenerContext
from headrace.server.app import ServerApp
from headrace.server.config import DEFAULT_PORTS, build_config
from headrace.server.metrics import GC_GENERATIONS
from headrace.store.memory import MemoryStore
from tests.ops.conftest import WAIT_S, free_port, listener_args, run_env


async def _tank_traffic(port: int) -> None:
    async with await TankClient.connect("127.0.0.1", port) as client:
        await client.create_topic("ops", 1)
        for n in range(5):
            await client.produce("ops", 0, [BundleMessage(f"event {n}".encode())])
        result = await client.consume("ops", 0, 0)
        assert result is not None


async def _controller_calls(port: int) -> None:
    async with ControllerClient(f"tcp://127.0.0.1:{port}") as client:
        assert await client.create_scope("ops")
        assert await client.scope_exists("ops")


def test_metrics_count_real_traffic_and_access_lines_describe_it(start_serve: Any) -> None:
    http, tank, controller = free_port(), free_port(), free_port()
    serve = start_serve(
        *listener_args(http=http, tank=tank, controller=controller), "--log-format", "json"
    )
    status, body = serve.get("/health")
    assert status == 200
    assert json.loads(body) == {
        "status": "ok",
        "listeners": {
            "controller": {"port": controller, "up": True},
            "http": {"port": http, "up": True},
            "tank": {"port": tank, "up": True},
        },
        "store": "ok",
    }
    assert serve.metric("headrace_connections_total", protocol="tank") == 0

    asyncio.run(asyncio.wait_for(_tank_traffic(tank), WAIT_S))
    asyncio.run(asyncio.wait_for(_controller_calls(controller), WAIT_S))
    assert serve.metric("headrace_requests_total", protocol="controller") == 2

    record = serve.wait_for_access(protocol="tank", reason="eof")
    assert record["requests"] >= 7  # create, 5 produces, consume
    assert record["bytes_in"] > 0 and record["bytes_out"] > 0
    assert record["peer"].startswith("127.0.0.1:")
    assert "tank 127.0.0.1:" in record["message"]
    assert serve.metric("headrace_connections_total", protocol="tank") == 1
    assert serve.metric("headrace_connections_open", protocol="tank") == 0
    assert serve.metric("headrace_requests_total", protocol="tank") == record["requests"]
    assert serve.metric("headrace_received_bytes_total", protocol="tank") == record["bytes_in"]
    assert serve.metric("headrace_sent_bytes_total", protocol="tank") == record["bytes_out"]
    assert serve.metric("headrace_append_seconds_count") >= 5
    assert serve.metric("headrace_fsync_seconds_count") >= 1  # fsync=always
    assert serve.metric("headrace_stored_bytes") > 0
    assert serve.metric("headrace_segments") >= 1
    assert serve.metric("headrace_streams") >= 1
    assert serve.metric("headrace_parked_readers") == 0
    assert serve.metric("headrace_listener_up", listener="tank") == 1
    assert serve.metric("headrace_requests_total", protocol="http") >= 1  # the scrapes
    _, text = serve.get("/metrics")
    for generation in range(GC_GENERATIONS):  # exported from the start, collections or not
        assert f'headrace_gc_pause_seconds_bucket{{generation="{generation}",le="+Inf"}}' in text

    result = subprocess.run(
        [sys.executable, "-m", "headrace", "status", "--http-port", str(http)],
        capture_output=True,
        text=True,
        timeout=WAIT_S * 3,
        env=run_env(),
    )
    assert result.returncode == 0, result.stderr
    assert "server http://127.0.0.1:" in result.stdout and ": ok" in result.stdout
    tank_line = next(line for line in result.stdout.splitlines() if line.strip().startswith("tank"))
    assert "up" in tank_line and "requests" in tank_line
    assert "streams" in result.stdout and "appends: " in result.stdout


def test_status_of_a_server_that_is_not_there_fails() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "headrace", "status", "--http-port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=WAIT_S * 3,
        env=run_env(),
    )
    assert result.returncode == 2
    assert "cannot reach" in result.stderr


async def _get(port: int, path: str) -> tuple[int, dict[str, Any]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
        body = await reader.readexactly(length)
    finally:
        writer.close()
        await writer.wait_closed()
    return int(head.split()[1]), json.loads(body)


async def test_health_is_503_until_every_listener_is_up(monkeypatch: Any, tmp_path: Path) -> None:
    entered, release = asyncio.Event(), asyncio.Event()

    async def slow_tank(ctx: ListenerContext, host: str, port: int) -> Listener:
        entered.set()
        await release.wait()

        async def close() -> None:
            return None

        return Listener("tank", port, close)

    monkeypatch.setattr(app_module, "STARTERS", {**app_module.STARTERS, "tank": slow_tank})
    http = free_port()
    config = build_config(
        {**{f"{name}_port": 0 for name in ("controller", "segment_store", "lumberjack")}}
        | {"lumberjack_tls_port": 0, "rsio_port": 0, "http_port": http, "tank_port": 1}
    )
    app = ServerApp(config, store=MemoryStore())
    starting = asyncio.create_task(app.start())
    try:
        await asyncio.wait_for(entered.wait(), WAIT_S)  # http started first, tank is starting
        status, report = await asyncio.wait_for(_get(http, "/health"), WAIT_S)
        assert status == 503
        assert report["status"] == "unavailable"
        assert report["listeners"]["tank"]["up"] is False
        assert report["listeners"]["http"]["up"] is True
        release.set()
        await asyncio.wait_for(starting, WAIT_S)
        status, report = await asyncio.wait_for(_get(http, "/health"), WAIT_S)
        assert status == 200 and report["status"] == "ok"
    finally:
        release.set()
        await asyncio.wait_for(starting, WAIT_S)
        await app.aclose()


def _gc_samples(app: ServerApp) -> dict[tuple[str, str], float]:
    """``headrace_gc_pause_seconds`` samples of ``app``, by (sample name, generation)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = app.metrics.exposition().decode()
    return {
        (sample.name, sample.labels["generation"]): sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "headrace_gc_pause_seconds"
        for sample in family.samples
        if sample.name != "headrace_gc_pause_seconds_bucket"
    }


async def test_gc_pauses_are_timed_by_generation_while_the_app_runs() -> None:
    no_listeners = build_config({f"{name}_port": 0 for name in DEFAULT_PORTS})
    app = ServerApp(no_listeners, store=MemoryStore())
    await app.start()
    try:
        before = _gc_samples(app)
        gc.collect(0)
        gc.collect(2)
        after = _gc_samples(app)
        for generation in ("0", "2"):
            count = ("headrace_gc_pause_seconds_count", generation)
            total = ("headrace_gc_pause_seconds_sum", generation)
            assert after[count] >= before[count] + 1
            assert after[total] > before[total]
    finally:
        await app.aclose()
    closed = _gc_samples(app)
    gc.collect(2)
    assert _gc_samples(app) == closed  # a closed app leaves no hook in the process
