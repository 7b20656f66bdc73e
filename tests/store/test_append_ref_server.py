"""Large events survive ``kill -9`` of a real server: written once, logged by reference.

The real ``pravega`` client (child process, ``write_large`` of
``tests/_real_pravega.py``) writes
events of 10 KiB to 300 KiB to a ``headrace serve`` subprocess (``--fsync
always``), which is killed with SIGKILL at random moments and restarted on
the same ports; the client reconnects and goes on (its writer id and event
numbers deduplicate what it resends). The client's blocks (one store append
each) that hold a 300 KiB event pass ``REF_APPEND_BYTES``, so their bytes go
to the segment's data file only and the WAL holds an APPEND_REF (checked on
the WAL files the kills leave); smaller blocks stay APPENDs. Then:
``headrace verify`` passes, and every acknowledged event is stored exactly
once, byte for byte, with no event stored twice.
"""

from __future__ import annotations

import random
import signal
from pathlib import Path

import pytest

from headrace.store.disk.format import AppendRefRecord
from headrace.store.disk.layout import ContainerPaths
from headrace.store.disk.log import scan_wal
from tests._real_pravega import event_filler
from tests.faults.harness import (
    PRAVEGA_SCOPE,
    FaultServer,
    PravegaWriters,
    Progress,
    check,
    run_verify,
)
from tests.lumberjack.harness import stored_events

STREAM = "large"
KILLS = 3
SEED = 20261122
PROGRESS_TIMEOUT_S = 120.0
"""Bound on the client reconnecting after a restart and getting acknowledgements
(it backs off for up to a few seconds; recovery reads the referenced bytes)."""
MAX_ACKS_BETWEEN_KILLS = 4


def _references_in_wal(data_dir: Path) -> int:
    count = 0
    for container_dir in sorted((data_dir / "containers").iterdir()):
        paths = ContainerPaths(data_dir, int(container_dir.name))
        for _, wal in paths.wal_files():
            scan = scan_wal(wal, paths.container_id)
            count += sum(isinstance(r, AppendRefRecord) for _, _, r in scan.records)
    return count


@pytest.mark.timeout(600)
def test_large_events_survive_kill_9_exactly_once(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    server = FaultServer(tmp_path / "data")
    server.start()
    progress = Progress()
    writers = PravegaWriters(server, STREAM, progress, scenario="write_large")
    references = 0
    try:
        writers.start()
        assert progress.wait_for(1, PROGRESS_TIMEOUT_S), f"no acknowledgement {writers.log}"
        for kill in range(KILLS):
            target = progress.acks + rng.randint(1, MAX_ACKS_BETWEEN_KILLS)
            assert progress.wait_for(target, PROGRESS_TIMEOUT_S), (
                f"writer stalled before kill {kill}: {writers.log.failures[-3:]}"
            )
            server.signal(signal.SIGKILL)
            references = max(references, _references_in_wal(server.data_dir))
            server.start()
        target = progress.acks + 2
        assert progress.wait_for(target, PROGRESS_TIMEOUT_S), "writing did not resume"
    finally:
        writers.stop()
        final_code = server.signal(signal.SIGTERM)
    assert final_code == 0, server.log_text()[-5000:]
    assert references > 0, "no APPEND_REF record was ever in the WAL"

    verify = run_verify(server.data_dir)
    assert verify.returncode == 0, verify.stdout + verify.stderr

    stored: list[str] = []
    for payloads in stored_events(server.data_dir, f"{PRAVEGA_SCOPE}/{STREAM}").values():
        for payload in payloads:
            ident, _, filler = payload.partition(b"|")
            tag, _, n = ident.decode().partition(":")
            assert filler == event_filler(tag, int(n)), f"event {ident!r} stored damaged"
            stored.append(ident.decode())
    result = check(writers.log, stored)
    assert result.checked > 0
    assert not result.lost, f"lost acknowledged events {result.lost[:10]}"
    assert not result.duplicated, f"duplicated events {result.duplicated[:10]}"
