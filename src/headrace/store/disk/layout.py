"""Where every DiskStore file lives: the directory layout and naming rules.

All path decisions are made here and nowhere else::

    <root>/
      manifest                          format version + container count (format.py)
      lock                              flock()ed while a DiskStore has the dir open
      containers/
        0000/                           one directory per segment container
          snapshot                      latest checkpoint of the container's metadata
          snapshot.tmp                  a checkpoint being written (renamed over snapshot)
          epochs                        a replicated container's epoch history (epochs.py)
          wal/
            00000000000000000001.wal    WAL files, named by their first record's seq
            00000000000000000001.wal.broken-<utc>   a torn tail, copied aside on recovery
          segments/
            0000000000000001.data       segment bytes, named by segment id (hex)
            0000000000000001.crc        checksum sidecar of that data file
        0000.install/                   a copy received from another node, being installed
        0000.old/                       the copy it replaces, while the two are swapped
      incoming/
        0000-<random>/                  a container copy being received (moves.py)

**Names never become paths.** A segment's name is data inside WAL records and
snapshots; on disk a segment is known only by the numeric id its container
gave it at creation. The container of a segment is a pure function of its
name and the data dir's segment mapping (``container_of``, ``SegmentMapping``,
recorded in the manifest), so a container can later move to another node with
all of its segments.
"""

from __future__ import annotations

import enum
import re
import zlib
from pathlib import Path
from typing import Final

__all__ = [
    "INCOMING_DIR",
    "INSTALL_SUFFIX",
    "OLD_SUFFIX",
    "PARENT_MARKS",
    "SYSTEM_CONTAINER",
    "SYSTEM_TABLE_PREFIX",
    "ContainerPaths",
    "SegmentMapping",
    "broken_wal_path",
    "container_of",
    "incoming_path",
    "install_path",
    "lock_path",
    "manifest_path",
    "old_path",
    "parent_segment",
]

CONTAINER_DIR_DIGITS = 4
"""Container directories are ``%04d``: Pravega deployments run tens to hundreds of containers."""

MAX_CONTAINER_COUNT = 10**CONTAINER_DIR_DIGITS
"""Containers a data dir may have, so every container directory name has the same width."""

SEQ_DIGITS = 20
"""WAL names are ``%020d``: every u64 sequence number fits, and ``ls`` sorts them."""

SEGMENT_ID_HEX_DIGITS = 16
"""Segment files are ``%016x``: every u64 segment id fits."""

WAL_DIR_NAME = "wal"
WAL_SUFFIX = ".wal"
DATA_SUFFIX = ".data"
SIDECAR_SUFFIX = ".crc"
BROKEN_MARK = ".broken-"

_WAL_NAME = re.compile(rf"^(\d{{{SEQ_DIGITS}}})\.wal$")
_SEGMENT_FILE = re.compile(rf"^([0-9a-f]{{{SEGMENT_ID_HEX_DIGITS}}})(\.data|\.crc)$")


class SegmentMapping(enum.IntEnum):
    """How a segment's name gives its container; a data dir records its own
    in the manifest, and a cluster in ``/cluster`` (the two must agree)."""

    HASH = 0
    """``crc32(name) % count`` for every name: data dirs whose manifest records
    no mapping (written before the mapping was recorded)."""

    GROUPED = 1
    """Pravega's grouping: a transaction or transient segment goes with its
    parent, so merging it is local to one container; the controller's tables
    go to ``SYSTEM_CONTAINER``, so its metadata lives in one container; every
    other name by ``HASH``. New data dirs and new clusters use it."""


SYSTEM_CONTAINER: Final = 0
"""The container of the controller's metadata tables under ``GROUPED``."""

SYSTEM_TABLE_PREFIX: Final = "_system/controller/"
"""Names of the controller's metadata tables (``controller/records.py``)."""

PARENT_MARKS: Final = ("#transaction.", "#transient.")
"""What follows a parent segment's name in a transaction segment
(``<parent>#transaction.<32 hex>``) and a transient one
(``<parent>#transient.<writer>.<random>``)."""


def parent_segment(name: str) -> str:
    """``name`` up to its first ``PARENT_MARKS`` mark: the segment it merges into
    (``name`` itself when it has no mark)."""
    cut = min((i for i in (name.find(mark) for mark in PARENT_MARKS) if i >= 0), default=-1)
    return name if cut < 0 else name[:cut]


def container_of(
    name: str, container_count: int, mapping: SegmentMapping = SegmentMapping.GROUPED
) -> int:
    """The container that owns segment ``name`` under ``mapping`` (by default a new
    data dir's)."""
    if mapping is SegmentMapping.GROUPED:
        name = parent_segment(name)
        if name.startswith(SYSTEM_TABLE_PREFIX):
            return SYSTEM_CONTAINER
    return zlib.crc32(name.encode("utf-8", "surrogatepass")) % container_count


def manifest_path(root: Path) -> Path:
    return root / "manifest"


def lock_path(root: Path) -> Path:
    return root / "lock"


def containers_path(root: Path) -> Path:
    return root / "containers"


INCOMING_DIR: Final = "incoming"
"""Where container copies being received from another node are written, beside
``containers/`` (same file system, so installing one is a rename; ``moves.py``)."""

INSTALL_SUFFIX: Final = ".install"
"""A received copy renamed beside the container it replaces: the install's commit point."""

OLD_SUFFIX: Final = ".old"
"""The replaced copy, while an install swaps the directories."""


def incoming_path(root: Path) -> Path:
    return root / INCOMING_DIR


def install_path(paths: ContainerPaths) -> Path:
    return paths.dir.with_name(paths.dir.name + INSTALL_SUFFIX)


def old_path(paths: ContainerPaths) -> Path:
    return paths.dir.with_name(paths.dir.name + OLD_SUFFIX)


def broken_wal_path(wal: Path, stamp: str) -> Path:
    """Where a torn WAL tail is copied before the WAL is truncated."""
    return wal.with_name(f"{wal.name}{BROKEN_MARK}{stamp}")


class ContainerPaths:
    """The files of one container."""

    def __init__(self, root: Path, container_id: int) -> None:
        assert 0 <= container_id < MAX_CONTAINER_COUNT
        self.container_id = container_id
        self.dir = containers_path(root) / f"{container_id:0{CONTAINER_DIR_DIGITS}d}"
        self.wal_dir = self.dir / WAL_DIR_NAME
        self.segments_dir = self.dir / "segments"
        self.snapshot = self.dir / "snapshot"
        self.snapshot_tmp = self.dir / "snapshot.tmp"
        self.epochs = self.dir / "epochs"
        self.epochs_tmp = self.dir / "epochs.tmp"

    def wal(self, first_seq: int) -> Path:
        return self.wal_dir / f"{first_seq:0{SEQ_DIGITS}d}{WAL_SUFFIX}"

    def data(self, segment_id: int) -> Path:
        return self.segments_dir / f"{segment_id:0{SEGMENT_ID_HEX_DIGITS}x}{DATA_SUFFIX}"

    def sidecar(self, segment_id: int) -> Path:
        return self.segments_dir / f"{segment_id:0{SEGMENT_ID_HEX_DIGITS}x}{SIDECAR_SUFFIX}"

    def wal_files(self) -> list[tuple[int, Path]]:
        """``(first_seq, path)`` of every WAL file, oldest first (backups excluded)."""
        found = []
        if self.wal_dir.is_dir():
            for path in self.wal_dir.iterdir():
                match = _WAL_NAME.match(path.name)
                if match:
                    found.append((int(match.group(1)), path))
        return sorted(found)

    def broken_files(self) -> list[Path]:
        if not self.wal_dir.is_dir():
            return []
        return sorted(p for p in self.wal_dir.iterdir() if BROKEN_MARK in p.name)

    def segment_files(self) -> dict[int, list[Path]]:
        """Files in ``segments/`` by segment id (data and sidecar)."""
        found: dict[int, list[Path]] = {}
        if self.segments_dir.is_dir():
            for path in self.segments_dir.iterdir():
                match = _SEGMENT_FILE.match(path.name)
                if match:
                    found.setdefault(int(match.group(1), 16), []).append(path)
        return found
