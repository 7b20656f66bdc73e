"""Disk full: appends are refused with each protocol's error, nothing stored
before is damaged, and writing resumes after a restart once there is space.

The server runs ``full_disk_server.py``: ``headrace serve``'s app on a
``DiskStore`` whose ``FileOps`` fails every write with ENOSPC while a flag
file exists. The TANK client and pylogbeat write; the flag is created; the
next appends must be refused: TANK answers the produce with an error code
(or closes the connection), Lumberjack closes the connection without an ack
(its only refusal). The flag is removed.

By design (src/headrace/store/disk/commit.py) a failed WAL write fails
the store: no later append is accepted, because the failed write's state
is unknown and no later sync could vouch for it; reads of durable data go
on. So "writing resumes once space returns" means after a restart, and that
is what this test checks: appends are still refused after the space came
back, the server stops cleanly, ``headrace verify`` passes, every event
acknowledged before the disk filled is stored exactly once, no refused
event is stored, and after the restart both clients write again.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path

import pylogbeat
import pytest

from headrace.client.errors import ClientError
from headrace.client.tank import TankClient
from headrace.protocols.tank import BundleMessage, CreateTopicResult, ProduceError, encode_bundle
from tests.faults.conftest import Row
from tests.faults.harness import (
    TANK_TOPIC,
    FaultServer,
    WriterLog,
    check,
    run_verify,
    stored_beats,
    stored_tank_bundles,
)

RUNNER = Path(__file__).with_name("full_disk_server.py")
ROUNDS = 5
"""Bundles and windows written in each phase."""
IO_TIMEOUT_S = 30.0


def _tank_bundle(first: int) -> list[BundleMessage]:
    return [BundleMessage(f"t:{i}".encode(), 1, b"") for i in range(first, first + 10)]


async def _tank_produce(port: int, first: int, rounds: int) -> list[ProduceError | str]:
    """One bundle of 10 per round; the result of each (an error name if the
    connection failed; a new connection then)."""
    results: list[ProduceError | str] = []
    client = await TankClient.connect("127.0.0.1", port, request_timeout_s=IO_TIMEOUT_S)
    try:
        result = await client.create_topic(TANK_TOPIC, 1)
        assert result in (CreateTopicResult.CREATED, CreateTopicResult.ALREADY_EXISTS), result
        for r in range(rounds):
            try:
                results.append(
                    await client.produce_bundle(
                        TANK_TOPIC, 0, encode_bundle(_tank_bundle(first + 10 * r))
                    )
                )
            except ClientError as exc:
                results.append(type(exc).__name__)
                await client.aclose()
                client = await TankClient.connect("127.0.0.1", port, request_timeout_s=IO_TIMEOUT_S)
    finally:
        await client.aclose()
    return results


def _beats_send(port: int, first: int, rounds: int) -> list[str]:
    """One window of 10 per round, each on a new connection; "ack" or the error."""
    results = []
    for r in range(rounds):
        beat = pylogbeat.PyLogBeatClient("127.0.0.1", port, timeout=IO_TIMEOUT_S)
        try:
            beat.connect()
            ids = range(first + 10 * r, first + 10 * r + 10)
            beat.send([{"id": f"l:{i}", "message": "x"} for i in ids])
            results.append("ack")
        except Exception as exc:  # pylogbeat raises socket, struct and its own errors
            results.append(type(exc).__name__)
        finally:
            with contextlib.suppress(Exception):  # closing a broken connection may fail too
                beat.close()
    return results


def _acked(log: WriterLog, prefix: str, first: int, results: list[object], ok: object) -> None:
    for r, result in enumerate(results):
        if result == ok:
            log.acked.update(f"{prefix}:{i}" for i in range(first + 10 * r, first + 10 * r + 10))


@pytest.mark.timeout(300)
async def test_disk_full_refuses_appends_damages_nothing_and_resumes_after_restart(
    tmp_path: Path, fault_summary: Row
) -> None:
    flag = tmp_path / "disk-full"
    server = FaultServer(tmp_path / "data", runner=[str(RUNNER), str(flag)])
    server.start()
    tank_port, beats_port = server.ports["tank"], server.ports["lumberjack"]
    tank, beats = WriterLog("tank"), WriterLog("lumberjack")
    try:
        before_tank = await _tank_produce(tank_port, 0, ROUNDS)
        before_beats = await asyncio.to_thread(_beats_send, beats_port, 0, ROUNDS)
        assert before_tank == [ProduceError.OK] * ROUNDS, before_tank
        assert before_beats == ["ack"] * ROUNDS, before_beats
        _acked(tank, "t", 0, before_tank, ProduceError.OK)
        _acked(beats, "l", 0, before_beats, "ack")

        flag.touch()
        full_tank = await _tank_produce(tank_port, 1000, ROUNDS)
        full_beats = await asyncio.to_thread(_beats_send, beats_port, 1000, ROUNDS)
        fault_summary.faults += 2 * ROUNDS
        assert ProduceError.OK not in full_tank, full_tank
        assert "ack" not in full_beats, full_beats

        flag.unlink()
        space_tank = await _tank_produce(tank_port, 2000, ROUNDS)
        space_beats = await asyncio.to_thread(_beats_send, beats_port, 2000, ROUNDS)
        # the store stopped after the I/O error (by design): still refused
        assert ProduceError.OK not in space_tank, space_tank
        assert "ack" not in space_beats, space_beats
        assert server.alive(), server.log_text()[-5000:]
    finally:
        code = server.signal(signal.SIGTERM)
    assert code == 0, f"stop after a disk-full failure: exit {code}\n{server.log_text()[-5000:]}"
    refusals = {getattr(r, "name", r) for r in full_tank} | set(full_beats)
    fault_summary.note = f"refused with {sorted(refusals)}"

    verify = run_verify(server.data_dir)
    assert verify.returncode == 0, verify.stdout + verify.stderr

    server.start()
    try:
        after_tank = await _tank_produce(tank_port, 3000, ROUNDS)
        after_beats = await asyncio.to_thread(_beats_send, beats_port, 3000, ROUNDS)
        assert after_tank == [ProduceError.OK] * ROUNDS, after_tank
        assert after_beats == ["ack"] * ROUNDS, after_beats
        _acked(tank, "t", 3000, after_tank, ProduceError.OK)
        _acked(beats, "l", 3000, after_beats, "ack")
    finally:
        code = server.signal(signal.SIGTERM)
    assert code == 0, server.log_text()[-5000:]
    verify = run_verify(server.data_dir)
    assert verify.returncode == 0, verify.stdout + verify.stderr

    bundles = await asyncio.to_thread(stored_tank_bundles, server.data_dir)
    stored_tank = [m for bundle in bundles for m in bundle]
    stored_lj = await asyncio.to_thread(stored_beats, server.data_dir)
    results = [check(tank, stored_tank), check(beats, stored_lj)]
    fault_summary.checked = sum(r.checked for r in results)
    fault_summary.lost = sum(len(r.lost) for r in results)
    fault_summary.duplicated = sum(len(r.duplicated) for r in results)
    for result in results:
        assert not result.lost, (result.name, result.lost[:10])
        assert not result.duplicated, (result.name, result.duplicated[:10])
    refused = [e for e in stored_tank + stored_lj if 1000 <= int(e.split(":")[1]) < 3000]
    assert not refused, f"refused events were stored: {refused[:10]}"
