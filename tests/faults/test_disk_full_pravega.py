"""Disk full through the Pravega segment store: appends are refused, a writer
retries (or gives up with a retriable error), nothing stored before is
damaged, and writing resumes once space returns and the store restarted.

The server is ``full_disk_server.py`` (see ``test_disk_full.py``): every
write fails with ENOSPC while a flag file exists. A failed WAL write fails the
store until it restarts (``store/disk/commit.py``), and the segment store
answers a failed append by closing the connection, as Java does for a storage
failure it has no reply for. What a Pravega writer does then is what the Java
client does: reconnect with back-off, ``SetupAppend`` again (refused too while
the store is failed, so nothing unstored is ever acknowledged through
``AppendSetup``), and either outlast the outage or give up once its retry
policy is spent.

* ``test_disk_full_pravega_writer_resumes_after_restart``: our
  ``EventWriter``. A patient writer's events written while the disk is full
  stay unacknowledged and are stored, once each and byte for byte, after the
  space came back and the server restarted; an impatient writer's futures fail
  with ``ConnectionLost`` and none of its events is stored.
* ``test_failed_checkpoint_pravega_writer_backs_off_then_resumes``: the
  disk fills under a checkpoint instead (``--checkpoints-only``), so the
  store fails with every record synced and still answers ``SetupAppend``
  truthfully while every append is refused by closing the connection. Our
  writer must back off then as after a failed connect (it used to reconnect
  at full speed forever): the impatient one gives up within its attempts,
  the patient one is stored after the restart.
* ``test_disk_full_real_pravega_client_resumes_after_restart``: the real
  ``pravega`` client (in a child process; its retries last about a minute, so
  the restart comes well within them) keeps the same writer across the
  outage and resumes; every acknowledged event is stored exactly once.
"""

from __future__ import annotations

import asyncio
import random
import signal
from pathlib import Path

import pytest

from headrace.client import PravegaClient
from headrace.client._conn import RetryPolicy
from headrace.errors import ConnectionLost
from tests.faults.conftest import Row
from tests.faults.harness import (
    PRAVEGA_SCOPE,
    FaultServer,
    PravegaWriters,
    Progress,
    check,
    run_verify,
    stored_pravega,
)
from tests.lumberjack.harness import stored_events

RUNNER = Path(__file__).with_name("full_disk_server.py")
STREAM = "diskfull"
EVENTS = 60
"""Events written in each phase (before, while full, after)."""
REFUSED_LINE = "I/O failure, refusing writes"
"""What the store logs when the full disk failed it (``Container.fail``)."""
REFUSAL_TIMEOUT_S = 60.0
"""Bound on the first refused write reaching the store and its log line."""
GIVE_UP_TIMEOUT_S = 60.0
"""Bound on the impatient writer's retries running out (IMPATIENT: well under 5 s)."""
RESUME_TIMEOUT_S = 90.0
"""Bound on a waiting writer's events being acknowledged after the restart
(the writer's back-off is at most PATIENT.max_delay_s; gRPC reconnects too)."""

PATIENT = RetryPolicy(initial_delay_s=0.05, max_delay_s=0.5, max_attempts=0)
"""Retries for as long as it takes, as a Java writer configured to wait out an outage."""
IMPATIENT = RetryPolicy(initial_delay_s=0.01, max_delay_s=0.1, max_attempts=4)


def _events(tag: str, count: int, rng: random.Random) -> list[bytes]:
    """Distinct payloads of varied sizes and all byte values (checked byte for byte)."""
    return [f"{tag}:{i}:".encode() + rng.randbytes(rng.randrange(0, 2000)) for i in range(count)]


@pytest.mark.timeout(300)
async def _verified_events(server: FaultServer, code: int | None) -> list[bytes]:
    """The stream's stored events once the server stopped cleanly and verify passed."""
    assert code == 0, server.log_tail()
    verify = run_verify(server.data_dir)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    stored = await asyncio.to_thread(stored_events, server.data_dir, f"{PRAVEGA_SCOPE}/{STREAM}")
    return [e for payloads in stored.values() for e in payloads]


async def test_disk_full_pravega_writer_resumes_after_restart(
    tmp_path: Path, fault_summary: Row
) -> None:
    rng = random.Random(20261122)
    before, full, given_up, after = (
        _events(tag, EVENTS, rng) for tag in ("before", "full", "given-up", "after")
    )
    flag = tmp_path / "disk-full"
    server = FaultServer(tmp_path / "data", runner=[str(RUNNER), str(flag)])
    server.start()
    patient = PravegaClient(server.uri, retry=PATIENT)
    impatient = PravegaClient(server.uri, retry=IMPATIENT)
    try:
        await patient.controller.create_scope(PRAVEGA_SCOPE)
        await patient.controller.create_stream(PRAVEGA_SCOPE, STREAM)  # one segment: one order
        writer = await patient.create_writer(PRAVEGA_SCOPE, STREAM)
        quitter = await impatient.create_writer(PRAVEGA_SCOPE, STREAM)
        for event in before:
            await writer.write(event)
        await writer.flush()

        flag.touch()
        waiting = [await writer.write_future(event) for event in full]
        await asyncio.to_thread(server.wait_for_line, REFUSED_LINE, REFUSAL_TIMEOUT_S)
        doomed = [await quitter.write_future(event) for event in given_up]
        done, _ = await asyncio.wait(doomed, timeout=GIVE_UP_TIMEOUT_S)
        assert len(done) == len(doomed), "the impatient writer did not give up in time"
        errors = {type(f.exception()) for f in doomed}
        assert errors == {ConnectionLost}, errors
        assert all(f.exception().retriable for f in doomed)  # type: ignore[union-attr]
        fault_summary.faults += len(doomed)
        acked_while_full = [f for f in waiting if f.done() and f.exception() is None]
        assert not acked_while_full, f"{len(acked_while_full)} events acknowledged on a full disk"
        failed = [f for f in waiting if f.done()]
        assert not failed, [f.exception() for f in failed[:3]]
        assert writer.stats["reconnects"] == 0  # every SetupAppend was refused too
        await quitter.aclose()  # after its fatal error: closes without raising

        # Space returns; the failed store accepts writes again after a restart.
        flag.unlink()
        code = await asyncio.to_thread(server.signal, signal.SIGTERM)
        assert code == 0, f"stop after a disk-full failure: exit {code}\n{server.log_tail()}"
        verify = await asyncio.to_thread(run_verify, server.data_dir)
        assert verify.returncode == 0, verify.stdout + verify.stderr
        await asyncio.to_thread(server.start)
        await asyncio.wait_for(asyncio.gather(*waiting), RESUME_TIMEOUT_S)
        assert writer.stats["reconnects"] >= 1, writer.stats
        for event in after:
            await writer.write(event)
        await writer.flush()
        await writer.aclose()
    finally:
        await impatient.aclose()
        await patient.aclose()
        code = server.signal(signal.SIGTERM)
    events = await _verified_events(server, code)
    fault_summary.checked = len(before) + len(full) + len(after)
    expected = before + full + after
    fault_summary.lost = len(set(expected) - set(events))
    fault_summary.duplicated = len(events) - len(set(events))
    fault_summary.note = "our EventWriter; refused: ConnectionLost after retries"
    assert events == expected, (len(events), len(expected))  # once each, in order, byte for byte


CHECKPOINT_WAL_BYTES = 1024 * 1024
"""The failing-checkpoint server's checkpoint threshold: one large event passes it."""


@pytest.mark.timeout(300)
async def test_failed_checkpoint_pravega_writer_backs_off_then_resumes(
    tmp_path: Path, fault_summary: Row
) -> None:
    """A checkpoint that fails for lack of space fails the store with every
    record synced, so ``SetupAppend`` is still answered (truthfully) while
    every append is refused by closing the connection. A writer must then back
    off as after a failed connect: the impatient one gives up with
    ``ConnectionLost`` within its four attempts (instead of reconnecting at full
    speed forever), the patient one waits and is stored after the restart."""
    rng = random.Random(20261123)
    before, waiting_events, given_up = (
        _events(tag, EVENTS, rng) for tag in ("before", "waiting", "given-up")
    )
    crossing = b"crossing:" + rng.randbytes(CHECKPOINT_WAL_BYTES + 4096)  # passes the threshold
    flag = tmp_path / "disk-full"
    runner = [
        str(RUNNER),
        str(flag),
        "--checkpoints-only",
        f"--checkpoint-wal-bytes={CHECKPOINT_WAL_BYTES}",
    ]
    server = FaultServer(tmp_path / "data", runner=runner)
    server.start()
    patient = PravegaClient(server.uri, retry=PATIENT)
    impatient = PravegaClient(server.uri, retry=IMPATIENT)
    try:
        await patient.controller.create_scope(PRAVEGA_SCOPE)
        await patient.controller.create_stream(PRAVEGA_SCOPE, STREAM)
        writer = await patient.create_writer(PRAVEGA_SCOPE, STREAM)
        quitter = await impatient.create_writer(PRAVEGA_SCOPE, STREAM)
        for event in before:
            await writer.write(event)
        await writer.flush()

        flag.touch()
        await writer.write_and_wait(crossing)  # acknowledged; then the checkpoint fails
        await asyncio.to_thread(server.wait_for_line, REFUSED_LINE, REFUSAL_TIMEOUT_S)
        waiting = [await writer.write_future(event) for event in waiting_events]
        doomed = [await quitter.write_future(event) for event in given_up]
        done, _ = await asyncio.wait(doomed, timeout=GIVE_UP_TIMEOUT_S)
        assert len(done) == len(doomed), (
            f"the impatient writer did not give up in time: {quitter.stats}"
        )
        errors = {type(f.exception()) for f in doomed}
        assert errors == {ConnectionLost}, errors
        assert "none acknowledged" in str(doomed[0].exception())
        # Each attempt was a SetupAppend answered and an append refused: bounded by the policy.
        assert quitter.stats["reconnects"] < IMPATIENT.max_attempts, quitter.stats
        fault_summary.faults += len(doomed)
        assert not any(f.done() for f in waiting), "acknowledged or failed on a failed store"
        await quitter.aclose()

        flag.unlink()
        code = await asyncio.to_thread(server.signal, signal.SIGTERM)
        assert code == 0, f"stop after a failed checkpoint: exit {code}\n{server.log_tail()}"
        verify = await asyncio.to_thread(run_verify, server.data_dir)
        assert verify.returncode == 0, verify.stdout + verify.stderr
        await asyncio.to_thread(server.start)
        await asyncio.wait_for(asyncio.gather(*waiting), RESUME_TIMEOUT_S)
        await writer.aclose()
    finally:
        await impatient.aclose()
        await patient.aclose()
        code = server.signal(signal.SIGTERM)
    events = await _verified_events(server, code)
    expected = [*before, crossing, *waiting_events]
    fault_summary.checked = len(expected)
    fault_summary.lost = len(set(expected) - set(events))
    fault_summary.duplicated = len(events) - len(set(events))
    fault_summary.note = "failed checkpoint: writers back off"
    assert events == expected, (len(events), len(expected))


@pytest.mark.timeout(300)
async def test_disk_full_real_pravega_client_resumes_after_restart(
    tmp_path: Path, fault_summary: Row
) -> None:
    flag = tmp_path / "disk-full"
    server = FaultServer(tmp_path / "data", runner=[str(RUNNER), str(flag)])
    server.start()
    progress = Progress()
    writers = PravegaWriters(server, STREAM, progress)
    try:
        writers.start()
        assert progress.wait_for(2, REFUSAL_TIMEOUT_S), writers.log.failures
        flag.touch()
        server.wait_for_line(REFUSED_LINE, REFUSAL_TIMEOUT_S)
        fault_summary.faults += 1

        flag.unlink()
        code = server.signal(signal.SIGTERM)
        assert code == 0, f"stop after a disk-full failure: exit {code}\n{server.log_tail()}"
        acks_when_full = progress.acks  # the server is down: no more acks until it is back
        verify = run_verify(server.data_dir)
        assert verify.returncode == 0, verify.stdout + verify.stderr
        server.start()
        # Two more flushes: the one that was waiting when the disk filled, and a new one.
        resumed = progress.wait_for(acks_when_full + 2, RESUME_TIMEOUT_S)
        assert resumed, (progress.acks, writers.log.failures, server.log_tail())
        # The same child (writer) waited out the outage: none gave up and was replaced.
        assert writers.generation == 1, writers.log.failures
    finally:
        writers.stop()
        code = server.signal(signal.SIGTERM)
    assert code == 0, server.log_tail()
    verify = run_verify(server.data_dir)
    assert verify.returncode == 0, verify.stdout + verify.stderr

    stored = await asyncio.to_thread(stored_pravega, server.data_dir, STREAM)
    result = check(writers.log, stored)
    fault_summary.checked = result.checked
    fault_summary.lost = len(result.lost)
    fault_summary.duplicated = len(result.duplicated)
    fault_summary.note = "real pravega client waited out the outage"
    assert not result.lost, result.lost[:10]
    assert not result.duplicated, result.duplicated[:10]
