"""Moving a container between data dirs: its files listed, a new copy installed.

A container is a directory (``layout.py``): its snapshot, its WAL files and
its segments' data and sidecar files. A closed container's directory is a
consistent copy of it (``Container.close`` checkpoints it), so moving a
container to another node is copying those files and opening the copy there
with recovery, as at start (``recovery.recover_container``).

**Installing a copy** replaces a container's directory with another one,
and a crash at any point leaves either the old copy or the new one, never
a mix of both (``docs/storage-format.md#installs``):

1. The copy is written into ``incoming/<NNNN>-<random>/`` and every file and
   directory of it is synced. A crash here leaves the old copy; ``incoming/``
   is removed at the next open.
2. The copy is renamed to ``containers/<NNNN>.install`` and ``containers/``
   synced: the commit point. From here on the new copy wins.
3. ``containers/<NNNN>`` is renamed to ``containers/<NNNN>.old``, then
   ``<NNNN>.install`` to ``<NNNN>``, ``containers/`` is synced, and ``<NNNN>.old``
   is removed.

``finish_installs`` (run by every open before recovery) finishes step 3 from
wherever a crash stopped it, and clears ``incoming/``.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from headrace.store.disk.format import Snapshot, encode_snapshot
from headrace.store.disk.layout import (
    CONTAINER_DIR_DIGITS,
    ContainerPaths,
    containers_path,
    incoming_path,
    install_path,
    old_path,
)
from headrace.store.disk.log import FileOps, WalWriter, atomic_write, fsync_dir, make_dir, sync_path

__all__ = [
    "MAX_CONTAINER_FILES",
    "READ_CHUNK_BYTES",
    "ContainerFile",
    "check_relative_path",
    "commit_install",
    "container_file_paths",
    "container_files",
    "finish_installs",
    "new_staging_dir",
    "write_empty_container",
]

MAX_CONTAINER_FILES: Final = 1_000_000
"""Files one container copy may list: two per segment plus the WAL files and
the snapshot. A peer's listing past it is refused before anything is written."""

READ_CHUNK_BYTES: Final = 1024 * 1024
"""Bytes read or written at a time when checksumming or copying a file, so a
copy of any size needs this much memory per file at once."""

_RELATIVE_PATH = re.compile(
    r"^(snapshot|epochs|wal/\d{20}\.wal|segments/[0-9a-f]{16}\.(data|crc))$"
)
"""The files of a container copy, relative to its directory (``layout.py``)."""


@dataclass(frozen=True, slots=True)
class ContainerFile:
    """One file of a container copy: its path in the container's directory,
    its size and the CRC-32 of its bytes."""

    path: str
    size_bytes: int
    crc: int


def check_relative_path(path: str) -> str:
    """``path`` if it names a file a container copy may hold; else ValueError.

    A copy from another node names its files: only these names, so no name
    can reach outside the copy's directory.
    """
    if not _RELATIVE_PATH.match(path):
        raise ValueError(f"not a file of a container: {path[:80]!r}")
    return path


def file_crc(path: Path) -> tuple[int, int]:
    """``(size, crc32)`` of the file at ``path``, read ``READ_CHUNK_BYTES`` at a time."""
    crc = 0
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(READ_CHUNK_BYTES):
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
    return size, crc


def container_file_paths(paths: ContainerPaths) -> list[Path]:
    """Every file of a closed container's copy, snapshot first.

    Torn-tail backups (``*.broken-*``) and temporary files stay behind: they
    are not part of the container's state.
    """
    found = [paths.snapshot]
    if paths.epochs.exists():  # a replicated container's epoch history travels with it
        found.append(paths.epochs)
    found += [path for _, path in paths.wal_files()]
    for segment_id in sorted(files := paths.segment_files()):
        found += sorted(files[segment_id])
    return found


def container_files(paths: ContainerPaths) -> list[ContainerFile]:
    """``container_file_paths`` with each file's size and CRC-32 (blocking)."""
    listed = []
    for path in container_file_paths(paths):
        size, crc = file_crc(path)
        listed.append(ContainerFile(str(path.relative_to(paths.dir)), size, crc))
    return listed


def new_staging_dir(root: Path, container_id: int) -> Path:
    """A fresh ``incoming/<NNNN>-<random>/`` with the directories of a container."""
    incoming = incoming_path(root)
    make_dir(incoming)
    staged = incoming / f"{container_id:0{CONTAINER_DIR_DIGITS}d}-{secrets.token_hex(4)}"
    make_dir(staged)
    for sub in ("wal", "segments"):
        make_dir(staged / sub)
    return staged


def write_empty_container(staged: Path, container_id: int, ops: FileOps) -> None:
    """An empty container's files in ``staged`` (from ``new_staging_dir``), as a
    new data dir has them: to install over a copy that moved away."""
    atomic_write(
        staged / "snapshot",
        staged / "snapshot.tmp",
        encode_snapshot(Snapshot(container_id, 0, 1)),
        ops,
    )
    wal = WalWriter.create(staged / "wal" / f"{1:020d}.wal", container_id, 1, ops)
    try:
        ops.sync_wal(wal.fd)
    finally:
        wal.close()


def commit_install(root: Path, container_id: int, staged: Path, ops: FileOps) -> None:
    """Make the copy in ``staged`` the container's files (steps 2 and 3, blocking).

    The container must be closed. Every file of ``staged`` is synced first
    (the receiver may have synced them already; syncing twice costs little).
    """
    for sub in ("wal", "segments"):
        for path in (staged / sub).iterdir():
            sync_path(path, ops)
        fsync_dir(staged / sub, ops)
    if (staged / "snapshot").exists():
        sync_path(staged / "snapshot", ops)
    fsync_dir(staged, ops)
    paths = ContainerPaths(root, container_id)
    install = install_path(paths)
    if install.exists():
        shutil.rmtree(install)  # a copy committed but not finished: this one is newer
    os.rename(staged, install)
    fsync_dir(containers_path(root), ops)
    _finish_install(paths, ops)


def _finish_install(paths: ContainerPaths, ops: FileOps) -> None:
    """Step 3 from wherever it stopped: the ``.install`` copy, if any, wins."""
    install = install_path(paths)
    old = old_path(paths)
    containers = paths.dir.parent
    if install.exists():
        if paths.dir.exists():
            if old.exists():
                shutil.rmtree(old)
            os.rename(paths.dir, old)
        os.rename(install, paths.dir)
        fsync_dir(containers, ops)
    if old.exists():
        shutil.rmtree(old)
        fsync_dir(containers, ops)


def finish_installs(root: Path, container_count: int, ops: FileOps) -> None:
    """At open: finish every install a crash interrupted, and drop ``incoming/``."""
    if containers_path(root).is_dir():
        for cid in range(container_count):
            _finish_install(ContainerPaths(root, cid), ops)
    incoming = incoming_path(root)
    if incoming.exists():
        shutil.rmtree(incoming)
