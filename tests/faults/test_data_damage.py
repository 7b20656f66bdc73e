"""A byte flipped in a segment's data file while the server was stopped.

Every block of data that was on disk when the server started is checked
against its sidecar CRC the first time it is read (``store/disk/checks.py``).
A damaged block is never sent: each front door answers a read that touches
it with its error (the Pravega segment store closes that connection, as
Java does for a failure it has no reply for; TANK answers the partition
with ``SYSTEM_ERROR``; RS-IO ends the subscription with ``onError``), logs
it once, and goes on serving every other connection and every good block.
``headrace verify`` names the damaged segment, not only the file.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from headrace.client.rsio import RsioClient, RsioError
from headrace.client.tank import TankClient
from headrace.protocols import pravega as p
from headrace.protocols.tank import BundleMessage, ConsumeError, CreateTopicResult
from headrace.store.disk.format import SIDECAR_BLOCK_BYTES
from headrace.store.disk.layout import ContainerPaths
from headrace.store.disk.log import scan_wal
from tests.faults.conftest import Row
from tests.faults.harness import TANK_STREAM, TANK_TOPIC, FaultServer, run_verify
from tests.server.test_pravega_server import Raw

TANK_SEGMENT = f"{TANK_STREAM}/0.#epoch.0"
BUNDLES = 32
"""Bundles of one 100 KiB message: a little over three checksum blocks."""
MESSAGE_BYTES = 100 * 1024
DAMAGE_AT = SIDECAR_BLOCK_BYTES + SIDECAR_BLOCK_BYTES // 2
"""Inside the second block of the TANK partition's data file."""
IO_TIMEOUT_S = 30.0


MESSAGES = [b"%06d" % i + os.urandom(MESSAGE_BYTES - 6) for i in range(BUNDLES)]
"""Random, so that no bundle compresses."""


def _data_file(root: Path) -> Path:
    for cdir in sorted((root / "containers").iterdir()):
        paths = ContainerPaths(root, int(cdir.name))
        for _, wal in paths.wal_files():
            for _, _, record in scan_wal(wal, paths.container_id).records:
                name = getattr(record, "name", "")
                if name == TANK_SEGMENT:
                    return paths.data(record.segment_id)  # type: ignore[attr-defined]
    raise AssertionError("no TANK segment in the log")


@pytest.mark.timeout(300)
async def test_a_damaged_block_is_answered_with_an_error_and_harms_no_other_read(
    tmp_path: Path, fault_summary: Row
) -> None:
    server = FaultServer(tmp_path / "data")
    server.start()
    try:
        async with await TankClient.connect(
            "127.0.0.1", server.ports["tank"], request_timeout_s=IO_TIMEOUT_S
        ) as tank:
            assert await tank.create_topic(TANK_TOPIC, 1) is CreateTopicResult.CREATED
            for i in range(BUNDLES):
                await tank.produce(TANK_TOPIC, 0, [BundleMessage(MESSAGES[i], 1, b"")])
        data_file = _data_file(server.data_dir)  # found before the stop's checkpoint
    finally:
        assert server.signal(signal.SIGTERM) == 0, server.log_tail()
    raw = bytearray(data_file.read_bytes())
    good = bytes(raw)
    assert len(raw) > 3 * SIDECAR_BLOCK_BYTES
    raw[DAMAGE_AT] ^= 0x01
    data_file.write_bytes(bytes(raw))
    fault_summary.faults += 1

    verify = run_verify(server.data_dir)
    assert verify.returncode == 1, verify.stdout
    assert f"of segment {TANK_SEGMENT!r}" in verify.stdout, verify.stdout

    server.start()
    try:
        # Pravega: a good block is served; the damaged one never is.
        reader = await Raw.connect(server.ports["segment_store"])
        try:
            read = await reader.request(p.ReadSegment(TANK_SEGMENT, 0, 100_000, "", 1))
            assert isinstance(read, p.SegmentRead) and bytes(read.data) == good[:100_000]
            await reader.send(p.ReadSegment(TANK_SEGMENT, DAMAGE_AT - 10, 100, "", 2))
            assert await reader.closed_by_server()
        finally:
            await reader.aclose()
        other = await Raw.connect(server.ports["segment_store"])
        try:
            at = 3 * SIDECAR_BLOCK_BYTES
            read = await other.request(p.ReadSegment(TANK_SEGMENT, at, 100_000, "", 3))
            assert isinstance(read, p.SegmentRead) and bytes(read.data) == good[at : at + 100_000]
            info = await other.request(p.GetStreamSegmentInfo(4, TANK_SEGMENT))
            assert isinstance(info, p.StreamSegmentInfo) and info.write_offset == len(good)
            # the damage stays refused on every later read
            await other.send(p.ReadSegment(TANK_SEGMENT, DAMAGE_AT, 100, "", 5))
            assert await other.closed_by_server()
        finally:
            await other.aclose()

        # TANK: the partition's consume answers with an error, never the bytes.
        async with await TankClient.connect(
            "127.0.0.1", server.ports["tank"], request_timeout_s=IO_TIMEOUT_S
        ) as tank:
            result = await tank.consume(TANK_TOPIC, 0, 1, fetch_size=8 * 1024 * 1024)
            assert result.error is ConsumeError.SYSTEM_ERROR, result
            assert all(m.content == MESSAGES[int(m.content[:6])] for m in result.messages)

        # RS-IO: the subscription gets the good events, then onError.
        rsio = await RsioClient.connect("127.0.0.1", server.ports["rsio"])
        try:
            sub = rsio.subscribe(TANK_STREAM, batch=BUNDLES)
            delivered = 0
            with pytest.raises(RsioError, match="fails its checksum"):
                while True:
                    element = await sub.next()
                    assert element.endswith(MESSAGES[delivered])  # in order, whole
                    delivered += 1
            assert delivered < BUNDLES
        finally:
            await rsio.aclose()

        assert server.alive(), server.log_tail()
        log = server.log_text()
        assert f"segment {TANK_SEGMENT!r}: data block" in log and "fails its checksum" in log
        fault_summary.checked = 3
        fault_summary.note = "Pravega closed, TANK SYSTEM_ERROR, RS-IO onError; others served"
    finally:
        code = server.signal(signal.SIGTERM)
    assert code == 0, server.log_tail()
