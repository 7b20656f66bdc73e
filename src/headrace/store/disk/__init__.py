"""The durable store: segment containers, each with a write-ahead log and group commit.

Module map (the format is documented in ``format.py`` and ``docs/storage-format.md``):

* ``format.py``: byte layouts; pure encoders and decoders.
* ``layout.py``: directory layout and file naming (names never become paths).
* ``log.py``: WAL writing and scanning, the syscall layer (``FileOps``).
* ``segment.py``: segment metadata and ``ContainerState.apply``.
* ``container.py``: a live container: issuing records, composing the three below.
* ``commit.py``: group commit: the WAL's writes and syncs, the sync thread,
  callers parked until their record is durable.
* ``datafiles.py``: segment data files: open descriptors, creating them.
* ``checkpoint.py``: checkpoints: starting one, writing the snapshot, freeing
  truncated blocks.
* ``recovery.py``: opening a data dir: replay, torn-tail backup, repair.
* ``store.py``: ``DiskStore``, routing by container and cross-container merge.
* ``verify.py``: offline check of a data dir.
"""

from __future__ import annotations

from headrace.store.disk.log import FileOps
from headrace.store.disk.store import DiskStore

__all__ = ["DiskStore", "FileOps"]
