"""Disk full: writes fail, reads of what was stored before go on, through every door.

The server runs ``full_disk_server.py`` (``headrace serve``'s app on a
``DiskStore`` whose writes fail with ENOSPC while a flag file exists). TANK
and Lumberjack write and are acknowledged; the flag is created and a TANK
produce fails the store (by design: ``store/disk/commit.py``). Then every
door must still answer reads of the durable data, byte for byte:

* Pravega segment store: ``GetStreamSegmentInfo`` (length, start) and
  ``ReadSegment`` of the TANK partition's segment;
* TANK: ``DiscoverPartitions`` (first seq num, high-water mark) and a consume
  from the first message;
* RS-IO: a subscription to the Lumberjack stream delivers every event.

Writes keep failing with the store's error (a TANK produce answers
``IO_FAULT``) until the restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from pathlib import Path

import pylogbeat
import pytest

from headrace.client.rsio import RsioClient
from headrace.client.tank import TankClient
from headrace.protocols import pravega as p
from headrace.protocols.tank import (
    BundleMessage,
    CreateTopicResult,
    ProduceError,
    decode_bundle,
    encode_bundle,
)
from tests.faults.conftest import Row
from tests.faults.harness import BEATS_STREAM, TANK_STREAM, TANK_TOPIC, FaultServer
from tests.server.test_pravega_server import Raw

RUNNER = Path(__file__).with_name("full_disk_server.py")
BUNDLES = 5
"""TANK bundles (of 10 messages) stored before the disk fills."""
WINDOWS = 3
"""Lumberjack windows (of 10 events) stored before the disk fills."""
IO_TIMEOUT_S = 30.0
TANK_SEGMENT = f"{TANK_STREAM}/0.#epoch.0"
"""The segment of the TANK topic's partition 0."""


def _texts(first: int) -> list[str]:
    return [f"t:{i}" for i in range(first, first + 10)]


def _beats(port: int) -> list[str]:
    """``WINDOWS`` acknowledged windows of 10 events; their ids."""
    ids = []
    for w in range(WINDOWS):
        beat = pylogbeat.PyLogBeatClient("127.0.0.1", port, timeout=IO_TIMEOUT_S)
        try:
            beat.connect()
            window = [f"l:{10 * w + i}" for i in range(10)]
            beat.send([{"id": i, "message": "x"} for i in window])
            ids += window
        finally:
            with contextlib.suppress(Exception):
                beat.close()
    return ids


@pytest.mark.timeout(300)
async def test_reads_of_stored_data_go_on_through_every_door_after_the_disk_filled(
    tmp_path: Path, fault_summary: Row
) -> None:
    flag = tmp_path / "disk-full"
    server = FaultServer(tmp_path / "data", runner=[str(RUNNER), str(flag)])
    server.start()
    try:
        tank = await TankClient.connect(
            "127.0.0.1", server.ports["tank"], request_timeout_s=IO_TIMEOUT_S
        )
        try:
            created = await tank.create_topic(TANK_TOPIC, 1)
            assert created is CreateTopicResult.CREATED
            stored = []
            for b in range(BUNDLES):
                messages = [BundleMessage(t.encode(), 1, b"") for t in _texts(10 * b)]
                await tank.produce(TANK_TOPIC, 0, messages)
                stored += _texts(10 * b)
            beats = await asyncio.to_thread(_beats, server.ports["lumberjack"])

            flag.touch()
            bundle = encode_bundle([BundleMessage(b"t:full", 1, b"")])
            refused = await tank.produce_bundle(TANK_TOPIC, 0, bundle)
            assert refused is ProduceError.IO_FAULT, refused
            fault_summary.faults += 1

            # TANK: DiscoverPartitions and a consume from the start.
            [partition] = await tank.discover_partitions(TANK_TOPIC) or ()
            assert (partition.first_available_seq_num, partition.high_water_mark) == (
                1,
                len(stored),
            )
            got: list[str] = []
            seq = 0
            while len(got) < len(stored):
                result = await tank.consume(TANK_TOPIC, 0, seq)
                assert result.messages, result
                got += [m.content.decode() for m in result.messages]
                seq = result.next_seq_num
            assert got == stored
            # ... and writing is still refused with the store's error.
            again = await tank.produce_bundle(TANK_TOPIC, 0, bundle)
            assert again is ProduceError.IO_FAULT, again
        finally:
            await tank.aclose()

        # Pravega segment store: GetStreamSegmentInfo and ReadSegment.
        raw = await Raw.connect(server.ports["segment_store"])
        try:
            info = await raw.request(p.GetStreamSegmentInfo(1, TANK_SEGMENT))
            assert isinstance(info, p.StreamSegmentInfo) and info.exists, info
            assert info.start_offset == 0 and info.write_offset > 0, info
            read = await raw.request(p.ReadSegment(TANK_SEGMENT, 0, info.write_offset, "", 2))
            assert isinstance(read, p.SegmentRead), read
            assert len(read.data) == info.write_offset
            events = p.decode_events(bytes(read.data))
            messages = [m.content.decode() for e in events for m in decode_bundle(e, 1)]
            assert messages == stored
        finally:
            await raw.aclose()

        # RS-IO: a subscription to the Lumberjack stream.
        rsio = await RsioClient.connect("127.0.0.1", server.ports["rsio"])
        try:
            sub = rsio.subscribe(BEATS_STREAM, batch=len(beats))
            ids = []
            async with asyncio.timeout(IO_TIMEOUT_S):
                while len(ids) < len(beats):
                    ids.append(json.loads(await sub.next())["id"])
            assert sorted(ids) == sorted(beats)
            await sub.cancel()
        finally:
            await rsio.aclose()
        fault_summary.checked = len(stored) + len(beats)
        fault_summary.note = "every door read the stored data back"
        assert server.alive(), server.log_tail()
    finally:
        code = server.signal(signal.SIGTERM)
    assert code == 0, server.log_tail()
