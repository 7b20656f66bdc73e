"""A replicated container's epoch history, in the file ``epochs`` beside its snapshot.

For each epoch that wrote records into the container's log, the number of
the first one (``docs/replication.md#epochs``): what a replica compares with
its leader's to find where their logs part (``cluster/replication_rules.py``).
Written before the first record of a new epoch, so every record on disk is
covered by the entry of its epoch. The file (big-endian)::

    magic      4 bytes  b"HREP"
    count      u32      entries, at most MAX_EPOCH_ENTRIES
    entries    count x (u64 epoch, u64 first record number)
    crc        u32      CRC-32 of everything before it

Replaced whole (``atomic_write``: a temporary file, fsync, rename, fsync of
the directory). A missing file is an empty history (an unreplicated
container); a damaged one is a ``CorruptionError``, never a guess.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import Final

from headrace.errors import CorruptionError
from headrace.store.disk.layout import ContainerPaths
from headrace.store.disk.log import FileOps, atomic_write

__all__ = ["MAX_EPOCH_ENTRIES", "decode_epochs", "encode_epochs", "read_epochs", "write_epochs"]

MAGIC: Final = b"HREP"
_HEAD: Final = struct.Struct(">4sI")
_ENTRY: Final = struct.Struct(">QQ")
_CRC: Final = struct.Struct(">I")

MAX_EPOCH_ENTRIES: Final = 65536
"""Entries the file may hold: one per change of leader that wrote records
(1 MiB of file at most); a longer history keeps its last entries."""

Epochs = tuple[tuple[int, int], ...]


def encode_epochs(entries: Epochs) -> bytes:
    kept = entries[-MAX_EPOCH_ENTRIES:]
    body = _HEAD.pack(MAGIC, len(kept)) + b"".join(_ENTRY.pack(e, s) for e, s in kept)
    return body + _CRC.pack(zlib.crc32(body))


def decode_epochs(raw: bytes, path: str) -> Epochs:
    if len(raw) < _HEAD.size + _CRC.size:
        raise CorruptionError(path, 0, "epoch history too short")
    magic, count = _HEAD.unpack_from(raw)
    if magic != MAGIC:
        raise CorruptionError(path, 0, "not an epoch history")
    if count > MAX_EPOCH_ENTRIES or len(raw) != _HEAD.size + count * _ENTRY.size + _CRC.size:
        raise CorruptionError(path, 4, f"{count} entries do not fit {len(raw)} bytes")
    (crc,) = _CRC.unpack_from(raw, len(raw) - _CRC.size)
    if crc != zlib.crc32(raw[: -_CRC.size]):
        raise CorruptionError(path, len(raw) - _CRC.size, "epoch history checksum mismatch")
    return tuple(_ENTRY.unpack_from(raw, _HEAD.size + i * _ENTRY.size) for i in range(count))


def read_epochs(paths: ContainerPaths) -> Epochs:
    """The container's epoch history (empty if it has none). Blocking."""
    try:
        raw = Path(paths.epochs).read_bytes()
    except FileNotFoundError:
        return ()
    return decode_epochs(raw, str(paths.epochs))


def write_epochs(paths: ContainerPaths, entries: Epochs, ops: FileOps) -> None:
    """Replace the container's epoch history, durably. Blocking."""
    atomic_write(paths.epochs, paths.epochs_tmp, encode_epochs(entries), ops)
