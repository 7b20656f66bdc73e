"""Segment mapping: which container holds a segment, and what a data dir records.

Under ``GROUPED`` (new data dirs and clusters) a transaction or transient
segment lives in its parent's container, so merging it is local, and the
controller's tables all live in container 0; every other name keeps the plain
hash. A data dir whose manifest records no mapping (written before it was
recorded) keeps the plain hash for every name, and still finds every segment.
"""

from __future__ import annotations

import uuid
import zlib
from pathlib import Path
from typing import Final

import pytest

from headrace.controller import records
from headrace.controller.naming import (
    TRANSIENT_INFIX,
    TxnId,
    segment_name,
    transaction_segment_name,
)
from headrace.errors import CorruptionError
from headrace.store.disk import DiskStore
from headrace.store.disk.format import (
    MANIFEST,
    MAPPED_MANIFEST,
    Manifest,
    decode_manifest,
    encode_manifest,
)
from headrace.store.disk.layout import (
    SYSTEM_CONTAINER,
    ContainerPaths,
    SegmentMapping,
    container_of,
    manifest_path,
    parent_segment,
)
from headrace.store.disk.verify import verify_data_dir

COUNTS: Final = (1, 2, 3, 8, 16, 1024)
PARENTS: Final = [
    segment_name("sc", f"st{i}", (epoch << 32) | number)
    for i in range(8)
    for number, epoch in ((0, 0), (3, 1), (7, 2))
]
SYSTEM_TABLES: Final = (
    records.SCOPES_TABLE,
    records.STREAMS_TABLE,
    records.TRANSACTIONS_TABLE,
    records.RETENTION_TABLE,
)


def _plain(name: str, count: int) -> int:
    return zlib.crc32(name.encode()) % count


def _txn(parent: str, low: int) -> str:
    return transaction_segment_name(parent, TxnId(7 << 32, low))


def _transient(parent: str) -> str:
    return f"{parent}{TRANSIENT_INFIX}{uuid.uuid4().hex}.{uuid.uuid4().hex}"


@pytest.mark.parametrize("count", COUNTS)
def test_transaction_and_transient_segments_land_with_their_parent(count: int) -> None:
    for parent in PARENTS:
        home = container_of(parent, count, SegmentMapping.GROUPED)
        for low in range(20):
            assert container_of(_txn(parent, low), count, SegmentMapping.GROUPED) == home
            assert container_of(_transient(parent), count, SegmentMapping.GROUPED) == home


def test_the_plain_hash_would_have_split_them() -> None:
    """What the grouping changes: most transaction segments hash elsewhere."""
    split = [
        parent
        for parent in PARENTS
        if container_of(_txn(parent, 1), 16, SegmentMapping.HASH)
        != container_of(parent, 16, SegmentMapping.HASH)
    ]
    assert len(split) > len(PARENTS) // 2


@pytest.mark.parametrize("count", COUNTS)
def test_the_controller_tables_live_in_the_system_container(count: int) -> None:
    assert SYSTEM_CONTAINER == 0
    for table in SYSTEM_TABLES:
        assert container_of(table, count, SegmentMapping.GROUPED) == SYSTEM_CONTAINER
    spread = {container_of(table, 16, SegmentMapping.HASH) for table in SYSTEM_TABLES}
    assert spread != {SYSTEM_CONTAINER}  # the plain hash spread them


@pytest.mark.parametrize("count", COUNTS)
def test_plain_segments_keep_the_plain_hash(count: int) -> None:
    others = [*PARENTS, "_system/tank/seq/t", "tank/topic/0", "a#b", "", "\udcff", "x" * 300]
    for name in others:
        grouped = container_of(name, count, SegmentMapping.GROUPED)
        assert grouped == container_of(name, count, SegmentMapping.HASH)
    for name in PARENTS:
        assert container_of(name, count, SegmentMapping.GROUPED) == _plain(name, count)


def test_the_hash_mapping_hashes_every_name() -> None:
    for parent in PARENTS[:4]:
        for name in (parent, _txn(parent, 3), _transient(parent)):
            assert container_of(name, 16, SegmentMapping.HASH) == _plain(name, 16)
    for table in SYSTEM_TABLES:
        assert container_of(table, 16, SegmentMapping.HASH) == _plain(table, 16)


def test_a_parent_is_the_name_up_to_its_first_mark() -> None:
    parent = "sc/st/0.#epoch.3"
    assert parent_segment(parent) == parent
    txn = _txn(parent, 5)
    assert parent_segment(txn) == parent
    assert parent_segment(f"{txn}{TRANSIENT_INFIX}ab.cd") == parent
    assert parent_segment(f"{parent}{TRANSIENT_INFIX}ab.cd") == parent


# --------------------------------------------------------------------------- the manifest


def test_the_manifest_records_a_mapping_other_than_the_hash() -> None:
    grouped = Manifest(8, 123, mapping=SegmentMapping.GROUPED)
    raw = encode_manifest(grouped)
    assert len(raw) == MAPPED_MANIFEST.size and raw[:8] == b"HRMANIF2"
    assert decode_manifest(raw, "m") == grouped
    plain = Manifest(8, 123)
    raw = encode_manifest(plain)
    assert len(raw) == MANIFEST.size and raw[:8] == b"HRMANIF1"  # what earlier releases wrote
    assert decode_manifest(raw, "m").mapping is SegmentMapping.HASH


@pytest.mark.parametrize("code", [0, 2, 0xFFFFFFFF])
def test_a_mapped_manifest_with_an_unknown_mapping_is_refused(code: int) -> None:
    raw = bytearray(encode_manifest(Manifest(8, 123, mapping=SegmentMapping.GROUPED)))
    raw[24:28] = code.to_bytes(4, "big")
    raw[28:32] = zlib.crc32(bytes(raw[:28])).to_bytes(4, "big")
    with pytest.raises(CorruptionError, match="mapping"):
        decode_manifest(bytes(raw), "m")


def test_a_bit_flip_in_a_mapped_manifest_is_corruption() -> None:
    raw = bytearray(encode_manifest(Manifest(8, 123, mapping=SegmentMapping.GROUPED)))
    raw[25] ^= 1
    with pytest.raises(CorruptionError, match="checksum"):
        decode_manifest(bytes(raw), "m")


# --------------------------------------------------------------------------- data dirs

CONTAINERS: Final = 8


async def _fill(store: DiskStore, names: list[str]) -> None:
    for name in names:
        await store.create_segment(name)
        await store.append(name, name.encode() * 3)


def _names() -> list[str]:
    parent = next(
        p
        for p in PARENTS
        if container_of(_txn(p, 1), CONTAINERS, SegmentMapping.HASH)
        != container_of(p, CONTAINERS, SegmentMapping.HASH)
    )
    return [parent, _txn(parent, 1), _transient(parent), *SYSTEM_TABLES]


async def test_a_new_data_dir_groups_and_says_so(tmp_path: Path) -> None:
    root = tmp_path / "data"
    names = _names()
    store = await DiskStore.open(root, container_count=CONTAINERS)
    try:
        assert store.mapping is SegmentMapping.GROUPED
        await _fill(store, names)
        home = container_of(names[0], CONTAINERS, SegmentMapping.GROUPED)
        await store.seal(names[1])
        await store.merge(names[0], names[1])  # within one container
        assert (await store.read(names[0], 0, 1 << 16)).data == (
            names[0].encode() * 3 + names[1].encode() * 3
        )
    finally:
        await store.close()
    manifest = decode_manifest(manifest_path(root).read_bytes(), "m")
    assert manifest.mapping is SegmentMapping.GROUPED
    segments = {cid: len(ContainerPaths(root, cid).segment_files()) for cid in range(CONTAINERS)}
    # the parent and its transient segment in one container, the tables in container 0
    assert segments[home] >= 2 and segments[SYSTEM_CONTAINER] >= len(SYSTEM_TABLES)
    assert sum(segments.values()) == 2 + len(SYSTEM_TABLES)
    assert verify_data_dir(root).ok


async def test_a_data_dir_without_the_mark_keeps_the_plain_hash(tmp_path: Path) -> None:
    """A data dir written before the mapping was recorded: a 28-byte manifest,
    every segment where the plain hash put it. It opens, reads back everything,
    and goes on placing new segments by the plain hash."""
    root = tmp_path / "data"
    names = _names()
    store = await DiskStore.open(
        root, container_count=CONTAINERS, segment_mapping=SegmentMapping.HASH
    )
    try:
        await _fill(store, names)
    finally:
        await store.close()
    raw = manifest_path(root).read_bytes()
    assert len(raw) == MANIFEST.size and raw[:8] == b"HRMANIF1"  # the old layout, byte for byte
    for name in names:  # each where the old function put it
        paths = ContainerPaths(root, zlib.crc32(name.encode()) % CONTAINERS)
        assert paths.segment_files(), name

    store = await DiskStore.open(root)  # a new data dir would be grouped; this one is not
    try:
        assert store.mapping is SegmentMapping.HASH
        for name in names:
            assert (await store.read(name, 0, 1 << 16)).data == name.encode() * 3
        more = _txn(names[0], 2)
        await store.create_segment(more)
        await store.append(more, b"later")
        await store.seal(more)
        await store.merge(names[0], more)
    finally:
        await store.close()
    assert manifest_path(root).read_bytes() == raw
    store = await DiskStore.open(root)
    try:
        assert (await store.read(names[0], 0, 1 << 16)).data == names[0].encode() * 3 + b"later"
        for name in names[1:]:
            assert (await store.read(name, 0, 1 << 16)).data == name.encode() * 3
    finally:
        await store.close()
    assert verify_data_dir(root).ok
