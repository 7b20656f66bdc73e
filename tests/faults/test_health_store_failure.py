"""``/health`` reports a store that stopped: 503 with the reason, not 200.

The server runs ``full_disk_server.py`` (``headrace serve``'s app on a disk
that fills up on demand, as in ``test_disk_full.py``). A TANK produce while
the disk is full fails the store (by design it then refuses every write
until a restart); the HTTP port must say so, or an orchestrator would keep
routing writes to a server that refuses them all.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from headrace.client.errors import ClientError
from headrace.client.tank import TankClient
from headrace.protocols.tank import BundleMessage, CreateTopicResult, ProduceError, encode_bundle
from tests._server import FREE, ServerProcess, run_cli

RUNNER = Path(__file__).with_name("full_disk_server.py")
TOPIC = "health"
IO_TIMEOUT_S = 30.0


async def _health(port: int) -> tuple[int, dict[str, object]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        response = await asyncio.wait_for(reader.read(), IO_TIMEOUT_S)  # to the server's close
    finally:
        writer.close()
    head, _, body = response.partition(b"\r\n\r\n")
    match = re.match(rb"HTTP/1\.1 (\d{3}) ", head)
    assert match, response[:200]
    return int(match.group(1)), json.loads(body)


async def _produce(port: int, text: bytes) -> ProduceError | str:
    """One bundle; the produce's result, or the client error's name."""
    client = await TankClient.connect("127.0.0.1", port, request_timeout_s=IO_TIMEOUT_S)
    try:
        created = await client.create_topic(TOPIC, 1)
        assert created in (CreateTopicResult.CREATED, CreateTopicResult.ALREADY_EXISTS)
        return await client.produce_bundle(TOPIC, 0, encode_bundle([BundleMessage(text, 1, b"")]))
    except ClientError as exc:
        return type(exc).__name__
    finally:
        await client.aclose()


@pytest.mark.timeout(120)
async def test_health_is_503_with_the_reason_once_the_disk_filled(tmp_path: Path) -> None:
    flag = tmp_path / "disk-full"
    server = ServerProcess(
        tmp_path / "data",
        ports={"tank": FREE, "http": FREE},
        runner=[str(RUNNER), str(flag)],
    )
    server.start()
    try:
        http, tank = server.ports["http"], server.ports["tank"]
        assert await _produce(tank, b"before") == ProduceError.OK
        status, report = await _health(http)
        assert (status, report["status"], report.get("store", "ok")) == (200, "ok", "ok"), report

        flag.touch()
        assert await _produce(tank, b"full") != ProduceError.OK
        flag.unlink()  # space is back, but the store stopped: a restart is needed
        status, report = await _health(http)
        assert status == 503, report
        assert report["status"] == "unavailable"
        assert "No space left on device" in str(report["store"]), report
        status_cli = await asyncio.to_thread(run_cli, "status", "--http-port", str(http))
        assert status_cli.returncode == 1, status_cli.stderr
        assert "store: the store stopped after an I/O error" in status_cli.stdout
    finally:
        server.stop()
