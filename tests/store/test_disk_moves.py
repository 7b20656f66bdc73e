"""DiskStore containers detached, attached and replaced at runtime (a cluster's moves).

A detached container answers ``OwnerUnavailable`` and is closed, so its
files are a consistent copy; attached again (its own files, or a copy from
another data dir installed in their place) it serves exactly what was
acknowledged, writer positions included. An install interrupted at any step
leaves the old copy or the new one at the next open, never a mix.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path
from uuid import uuid4

import pytest

from headrace.errors import OwnerUnavailable, SegmentNotFound
from headrace.store.api import FsyncPolicy
from headrace.store.disk import DiskStore
from headrace.store.disk.layout import INCOMING_DIR, ContainerPaths, container_of
from headrace.store.disk.moves import (
    check_relative_path,
    container_files,
    new_staging_dir,
)
from headrace.types import TableUpdate, WriterAppend

COUNT = 4


def names_in(container: int, count: int = 8, prefix: str = "s") -> list[str]:
    """``count`` segment names hashing to ``container``."""
    found: list[str] = []
    i = 0
    while len(found) < count:
        name = f"{prefix}{i}"
        if container_of(name, COUNT) == container:
            found.append(name)
        i += 1
    return found


async def open_store(path: Path) -> DiskStore:
    return await DiskStore.open(path, container_count=COUNT, fsync=FsyncPolicy.ALWAYS)


def copy_container(source: DiskStore, target_root: Path, container: int) -> Path:
    """What the transfer does: list the detached container's files, copy them into
    a staging directory of the target data dir, checking sizes and CRCs."""
    paths = source.container_paths(container)
    staged = new_staging_dir(target_root, container)
    for item in container_files(paths):
        shutil.copyfile(paths.dir / check_relative_path(item.path), staged / item.path)
    return staged


async def test_a_detached_container_answers_owner_unavailable_and_the_rest_goes_on(
    tmp_path: Path,
) -> None:
    store = await open_store(tmp_path / "d")
    try:
        moved, kept = names_in(1, 1)[0], names_in(2, 1)[0]
        for name in (moved, kept):
            await store.create_segment(name)
            await store.append(name, b"abc")
        await store.detach(1)
        await store.detach(1)  # again: nothing to do
        assert not store.is_attached(1)
        for call in (
            store.append(moved, b"x"),
            store.read(moved, 0, 10),
            store.info(moved),
            store.create_segment(names_in(1, 2)[1]),
        ):
            with pytest.raises(OwnerUnavailable):
                await call
        assert (await store.read(kept, 0, 10)).data == b"abc"
        await store.append(kept, b"def")
        assert await store.list_segments() == [kept]
        await store.flush()
        await store.attach(1)
        assert (await store.read(moved, 0, 10)).data == b"abc"
        await store.append(moved, b"d")
        assert sorted(await store.list_segments()) == sorted([moved, kept])
    finally:
        await store.close()


async def test_detach_waits_for_what_is_in_flight(tmp_path: Path) -> None:
    """Every append acknowledged before or while the container is detached is in
    its files; every later one is refused, none half-applied."""
    store = await open_store(tmp_path / "d")
    try:
        name = names_in(3, 1)[0]
        await store.create_segment(name)
        writer = uuid4()
        appends = [
            asyncio.ensure_future(
                store.append(name, bytes([n]) * 10, writer=WriterAppend(writer, n + 1))
            )
            for n in range(200)
        ]
        await asyncio.sleep(0)  # let some be issued before the detach
        await store.detach(3)
        done = await asyncio.gather(*appends, return_exceptions=True)
        acked = [r for r in done if not isinstance(r, BaseException)]
        assert all(isinstance(r, OwnerUnavailable) for r in done if isinstance(r, BaseException))
        assert acked  # the ones issued before the detach finished
        await store.attach(3)
        info = await store.info(name)
        assert info.length == 10 * len(acked)
        assert info.attributes[writer] == len(acked)
        data = (await store.read(name, 0, info.length)).data
        assert data == b"".join(bytes([n]) * 10 for n in range(len(acked)))
    finally:
        await store.close()


async def test_an_installed_copy_replaces_the_container_with_its_writer_positions(
    tmp_path: Path,
) -> None:
    source = await open_store(tmp_path / "a")
    target = await open_store(tmp_path / "b")
    try:
        names = names_in(2, 5)
        writer = uuid4()
        for n, name in enumerate(names):
            await source.create_segment(name)
            for event in range(1, 4):
                await source.append(
                    name, f"{n}:{event};".encode(), writer=WriterAppend(writer, event)
                )
        await source.seal(names[0])
        await source.truncate(names[1], 4)
        table = names_in(2, 1, prefix="table")[0]
        await source.create_table(table)
        await source.update_table(table, [TableUpdate(b"k", b"v")])
        stale = names_in(2, 1, prefix="stale")[0]
        await target.create_segment(stale)  # the target's own old copy
        await source.detach(2)
        staged = copy_container(source, tmp_path / "b", 2)
        await target.detach(2)
        await target.attach(2, install=staged)
        assert not staged.exists()
        with pytest.raises(SegmentNotFound):
            await target.info(stale)
        for n, name in enumerate(names):
            info = await target.info(name)
            assert info.attributes[writer] == 3
            expected = b"".join(f"{n}:{e};".encode() for e in range(1, 4))
            assert (await target.read(name, info.start_offset, 100)).data == expected[
                info.start_offset :
            ]
        assert (await target.info(names[0])).sealed
        found = await target.get_table_entries(table, [b"k"])
        assert found[0] is not None and found[0].value == b"v"
        assert (await target.info(names[1])).start_offset == 4
        # a retried append of an event it holds is dropped, the next one is stored
        again = await target.append(names[2], b"2:3;", writer=WriterAppend(writer, 3))
        assert again.duplicate
        await target.append(names[2], b"2:4;", writer=WriterAppend(writer, 4))
    finally:
        await source.close()
        await target.close()
    reopened = await open_store(tmp_path / "b")  # the install is durable
    try:
        assert (await reopened.read(names[2], 0, 100)).data.endswith(b"2:3;2:4;")
        assert not (tmp_path / "b" / INCOMING_DIR).exists()
    finally:
        await reopened.close()


async def test_attach_refuses_to_install_over_an_attached_container(tmp_path: Path) -> None:
    store = await open_store(tmp_path / "d")
    try:
        staged = new_staging_dir(tmp_path / "d", 0)
        with pytest.raises(Exception, match="detach it first"):
            await store.attach(0, install=staged)
    finally:
        await store.close()


def test_container_copies_name_only_container_files() -> None:
    for good in ("snapshot", "wal/00000000000000000001.wal", "segments/000000000000000a.crc"):
        assert check_relative_path(good) == good
    for bad in ("../manifest", "/etc/passwd", "wal/../../x", "segments/x.data", "lock", ""):
        with pytest.raises(ValueError):
            check_relative_path(bad)


@pytest.mark.parametrize("step", ["staged", "committed", "old-moved", "renamed"])
async def test_an_install_cut_at_any_step_leaves_the_old_copy_or_the_new_one(
    tmp_path: Path, step: str
) -> None:
    """Each step of ``moves.commit_install`` done by hand, then the data dir opened."""
    source = await open_store(tmp_path / "a")
    target = await open_store(tmp_path / "b")
    new_name, old_name = names_in(1, 1, prefix="new")[0], names_in(1, 1, prefix="old")[0]
    try:
        await source.create_segment(new_name)
        await source.append(new_name, b"new")
        await target.create_segment(old_name)
        await target.append(old_name, b"old")
        await source.detach(1)
        staged = copy_container(source, tmp_path / "b", 1)
    finally:
        await source.close()
        await target.close()
    paths = ContainerPaths(tmp_path / "b", 1)
    install = paths.dir.with_name(paths.dir.name + ".install")
    old = paths.dir.with_name(paths.dir.name + ".old")
    if step != "staged":
        os.rename(staged, install)
    if step in ("old-moved", "renamed"):
        os.rename(paths.dir, old)
    if step == "renamed":
        os.rename(install, paths.dir)
    reopened = await open_store(tmp_path / "b")
    try:
        segments = await reopened.list_segments()
        if step == "staged":
            assert segments == [old_name]
        else:
            assert segments == [new_name]
            assert (await reopened.read(new_name, 0, 10)).data == b"new"
        assert not install.exists() and not old.exists()
        assert not (tmp_path / "b" / INCOMING_DIR).exists()
    finally:
        await reopened.close()


async def test_a_discarded_container_is_empty_even_after_a_restart(tmp_path: Path) -> None:
    store = await open_store(tmp_path / "d")
    name = names_in(0, 1)[0]
    try:
        await store.create_segment(name)
        await store.append(name, b"moved away")
        assert not await store.discard(0, lambda: False)
        assert (await store.read(name, 0, 100)).data == b"moved away"
        assert await store.discard(0, lambda: True)
        assert not store.is_attached(0)
        assert not store.container_paths(0).segment_files()
    finally:
        await store.close()
    reopened = await open_store(tmp_path / "d")
    try:
        with pytest.raises(SegmentNotFound):
            await reopened.info(name)
        await reopened.create_segment(name)  # an empty container, serving again
        await reopened.append(name, b"new")
    finally:
        await reopened.close()


async def test_a_cancelled_detach_still_closes_the_container_before_it_is_attached(
    tmp_path: Path,
) -> None:
    """A hook cancelled mid-detach (a lost ZooKeeper session) leaves no half-closed
    container: the close ends, and the next detach or attach waits for it."""
    store = await open_store(tmp_path / "d")
    try:
        name = names_in(1, 1)[0]
        await store.create_segment(name)
        pending = [asyncio.ensure_future(store.append(name, b"x" * 100)) for _ in range(50)]
        await asyncio.sleep(0)
        detaching = asyncio.ensure_future(store.detach(1))
        await asyncio.sleep(0)
        detaching.cancel()
        with pytest.raises(asyncio.CancelledError):
            await detaching
        await store.detach(1)  # waits for the close the cancelled call started
        acked = [r for r in await asyncio.gather(*pending, return_exceptions=True)]
        stored = sum(1 for r in acked if not isinstance(r, BaseException))
        await store.attach(1)
        assert (await store.info(name)).length == 100 * stored
    finally:
        await store.close()
