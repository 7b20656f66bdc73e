"""A damaged write-ahead log: a power cut's torn write, damage to synced records,
a deleted WAL file, a restart on a full disk.

* **Torn write of never-synced records.** ``torn_write_server.py`` runs
  ``headrace serve``'s app under the three writers of ``test_kill.py``; once
  a flag file exists, its next WAL write of two or more records reaches the
  file in pieces (its start, a hole of zeros, its last record: what a power
  cut can leave of an unsynced write) and the process
  dies before the sync. The WAL's synced mark says the hole lies in bytes no
  sync covered, so ``headrace verify`` calls it a note, the restarted server
  backs the write up, cuts it and says so in its log, and no acknowledged
  event is lost or stored twice.
* **Damage to synced records** (a record zeroed in the middle of the log,
  valid records after it, all inside the synced mark) is refused: ``headrace
  serve`` exits with one ``Error:`` line and changes nothing; ``headrace
  repair`` cuts the log there, reports what was cut off, and the server
  starts with every acknowledged event before the damage.
* **A deleted WAL file** (while stopped, after a kill: its records were
  acknowledged) is refused by ``headrace serve`` and by ``headrace verify``,
  each naming the container.
* **A restart on a full disk** (recovery must write) prints one ``Error:``
  line and leaves the directory as it was; with space back it starts.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from headrace.client.tank import TankClient
from headrace.protocols.tank import BundleMessage, CreateTopicResult
from headrace.store.disk.format import AppendRecord, CreateRecord
from headrace.store.disk.layout import ContainerPaths
from headrace.store.disk.log import scan_wal
from tests._server import ServerStartError, run_cli
from tests.faults.conftest import Row
from tests.faults.harness import (
    TANK_STREAM,
    TANK_TOPIC,
    BeatWriter,
    FaultServer,
    PravegaWriters,
    Progress,
    TankWriter,
    check,
    run_verify,
    stored_beats,
    stored_pravega,
    stored_tank_bundles,
)

HERE = Path(__file__).resolve().parent
TORN_RUNNER = HERE / "torn_write_server.py"
FULL_DISK_RUNNER = HERE / "full_disk_server.py"
PROGRESS_TIMEOUT_S = 120.0
"""Bound on the writers' getting acknowledgements (the real client backs off
for up to a few seconds after a restart)."""
DEATH_TIMEOUT_S = 120.0
"""Bound on the torn write happening once armed: it needs two appends in one
sync round, which three writers under load make within seconds."""
BUNDLES = 12
"""TANK bundles written before a fault, one acknowledgement each."""
IO_TIMEOUT_S = 30.0


def _files(root: Path) -> dict[str, bytes]:
    """Every file's bytes (but the lock): what an open that changes nothing leaves."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != "lock"
    }


def _one_error_line(log: str) -> str:
    """The start's stderr must be one ``Error:`` line and no traceback."""
    assert "Traceback" not in log, log
    errors = [line for line in log.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, log
    return errors[0]


async def _produce(port: int, bundles: int, first: int = 0) -> list[list[str]]:
    """``bundles`` acknowledged TANK bundles of 5 messages (texts from
    ``t:<first>`` on); their texts."""
    acked = []
    async with await TankClient.connect(
        "127.0.0.1", port, request_timeout_s=IO_TIMEOUT_S
    ) as client:
        result = await client.create_topic(TANK_TOPIC, 1)
        assert result in (CreateTopicResult.CREATED, CreateTopicResult.ALREADY_EXISTS)
        for b in range(bundles):
            texts = [f"t:{first + 5 * b + i}" for i in range(5)]
            await client.produce(TANK_TOPIC, 0, [BundleMessage(t.encode(), 1, b"") for t in texts])
            acked.append(texts)
    return acked


def _tank_segment(root: Path) -> tuple[ContainerPaths, int]:
    """The container and segment id of the TANK partition's segment."""
    for cdir in sorted((root / "containers").iterdir()):
        paths = ContainerPaths(root, int(cdir.name))
        for _, wal in paths.wal_files():
            for _, _, record in scan_wal(wal, paths.container_id).records:
                if isinstance(record, CreateRecord) and record.name.startswith(TANK_STREAM + "/"):
                    return paths, record.segment_id
    raise AssertionError("no TANK segment in the log")


@pytest.mark.timeout(600)
def test_a_torn_unsynced_write_under_load_is_cut_and_loses_nothing_acknowledged(
    tmp_path: Path, fault_summary: Row
) -> None:
    flag = tmp_path / "power-cut"
    server = FaultServer(tmp_path / "data", runner=[str(TORN_RUNNER), str(flag)])
    server.start()
    progress = Progress()
    pravega = PravegaWriters(server, "torn", progress)
    tank = TankWriter(server, progress)
    beats = BeatWriter(server, progress)
    writers = [pravega, tank, beats]
    try:
        for writer in writers:
            writer.start()
        assert progress.wait_for(3, PROGRESS_TIMEOUT_S), "no acknowledgements"
        flag.touch()
        assert server.process is not None
        server.process.wait(DEATH_TIMEOUT_S)  # the runner kills itself after the tear
        assert server.terminate() == -signal.SIGKILL, server.log_tail()  # (already dead)
        assert "torn write:" in server.log_text(), server.log_tail()
        fault_summary.faults += 1
        flag.unlink()

        verify = run_verify(server.data_dir)
        assert verify.returncode == 0, verify.stdout + verify.stderr
        assert "torn write of" in verify.stdout, verify.stdout

        server.start()
        assert "was synced up to" in server.log_text(), server.log_tail()
        target = progress.acks + 3
        assert progress.wait_for(target, PROGRESS_TIMEOUT_S), "writing did not resume"
    finally:
        for writer in writers:
            writer.stop()
        code = server.signal(signal.SIGTERM)
    assert code == 0, server.log_tail()
    verify = run_verify(server.data_dir)
    assert verify.returncode == 0, verify.stdout + verify.stderr

    bundles = stored_tank_bundles(server.data_dir)
    results = [
        check(pravega.log, stored_pravega(server.data_dir, "torn")),
        check(tank.log, [m for bundle in bundles for m in bundle]),
        check(beats.log, stored_beats(server.data_dir)),
    ]
    fault_summary.checked = sum(r.checked for r in results)
    fault_summary.lost = sum(len(r.lost) for r in results)
    fault_summary.duplicated = sum(len(r.duplicated) for r in results)
    fault_summary.note = "hole in an unsynced write of several records"
    for result in results:
        assert not result.lost, (result.name, result.lost[:10])
        assert not result.duplicated, (result.name, result.duplicated[:10])


@pytest.mark.timeout(300)
async def test_damage_to_synced_records_is_refused_and_repair_cuts_it(
    tmp_path: Path, fault_summary: Row
) -> None:
    server = FaultServer(tmp_path / "data")
    server.start()
    try:
        acked = await _produce(server.ports["tank"], BUNDLES)
    finally:
        server.signal(signal.SIGKILL)  # the records stay in the WAL, all synced
    paths, segment_id = _tank_segment(server.data_dir)
    [(_, wal)] = paths.wal_files()
    scan = scan_wal(wal, paths.container_id)
    appends = [
        (position, record)
        for position, _, record in scan.records
        if isinstance(record, AppendRecord) and record.segment_id == segment_id
    ]
    assert len(appends) == BUNDLES
    victim = BUNDLES // 2
    position, _ = appends[victim]
    assert scan.synced_end is not None and position < scan.synced_end
    raw = bytearray(wal.read_bytes())
    raw[position + 20 : position + 40] = bytes(20)  # inside a synced, acknowledged record
    wal.write_bytes(bytes(raw))
    fault_summary.faults += 1
    before = _files(server.data_dir)

    with pytest.raises(ServerStartError) as refused:
        server.start()
    assert server.returncode == 1
    error = _one_error_line(refused.value.log)
    assert "valid records follow" in error and "not a torn write" in error, error
    assert "`headrace repair` cuts the log there" in error, error
    assert _files(server.data_dir) == before

    verify = run_verify(server.data_dir)
    assert verify.returncode == 1, verify.stdout

    repaired = run_cli("repair", str(server.data_dir))
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    out = repaired.stdout
    assert f"container {paths.container_id}: {wal} cut at position {position}" in out, out
    # the damaged record is unreadable; the valid ones after it are listed
    lost_appends = f"{BUNDLES - victim - 1} appends ("
    assert lost_appends in out and "unreadable bytes" in out, out
    assert out.splitlines()[-1].startswith("REPAIRED:"), out
    assert len(list(wal.parent.glob(wal.name + ".broken-*"))) == 1

    verify = run_verify(server.data_dir)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    server.start()
    try:
        more = await _produce(server.ports["tank"], 1, first=1000)  # writing goes on
    finally:
        code = server.signal(signal.SIGTERM)
    assert code == 0, server.log_tail()
    stored = await asyncio.to_thread(stored_tank_bundles, server.data_dir)
    # Every bundle before the damaged record, none after it, then the new one.
    assert [b for b in stored if b != more[0]] == acked[:victim]
    fault_summary.checked = victim * 5
    fault_summary.note = f"refused; headrace repair cut {(len(acked) - victim) * 5} events"


@pytest.mark.timeout(300)
async def test_a_deleted_wal_file_is_refused_naming_its_container(
    tmp_path: Path, fault_summary: Row
) -> None:
    server = FaultServer(tmp_path / "data")
    server.start()
    try:
        await _produce(server.ports["tank"], 3)
    finally:
        server.signal(signal.SIGKILL)
    paths, _ = _tank_segment(server.data_dir)
    for _, wal in paths.wal_files():
        wal.unlink()
    fault_summary.faults += 1
    before = _files(server.data_dir)

    with pytest.raises(ServerStartError) as refused:
        server.start()
    error = _one_error_line(refused.value.log)
    assert f"container {paths.container_id} has no readable WAL file" in error, error
    assert _files(server.data_dir) == before

    verify = run_verify(server.data_dir)
    assert verify.returncode == 1, verify.stdout
    assert f"container {paths.container_id} has no readable WAL file" in verify.stdout


@pytest.mark.timeout(300)
async def test_a_restart_on_a_full_disk_says_one_line_and_changes_nothing(
    tmp_path: Path, fault_summary: Row
) -> None:
    flag = tmp_path / "disk-full"
    server = FaultServer(tmp_path / "data", runner=[str(FULL_DISK_RUNNER), str(flag), "--cli"])
    server.start()
    try:
        acked = await _produce(server.ports["tank"], 3)
    finally:
        server.signal(signal.SIGKILL)  # recovery will have records to replay
    flag.touch()
    before = _files(server.data_dir)
    with pytest.raises(ServerStartError) as refused:
        server.start()
    assert server.returncode == 1
    error = _one_error_line(refused.value.log)
    assert "no space left" in error, error
    assert _files(server.data_dir) == before
    fault_summary.faults += 1

    flag.unlink()
    server.start()
    code = server.signal(signal.SIGTERM)
    assert code == 0, server.log_tail()
    stored = await asyncio.to_thread(stored_tank_bundles, server.data_dir)
    assert stored == acked
    fault_summary.checked = len(acked) * 5
