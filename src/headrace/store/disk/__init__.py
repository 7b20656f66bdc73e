"""The durable store: segment containers, each with a write-ahead log and group commit.

Module map (the format is documented in ``format.py`` and ``docs/storage-format.md``):

* ``format.py``: byte layouts; pure encoders and decoders.
* ``layout.py``: directory layout and file naming (names never become paths).
* ``log.py``: WAL writing and scanning, the syscall layer (``FileOps``).
* ``segment.py``: segment metadata and ``ContainerState.apply``.
* ``container.py``: a live container: issue, group commit, checkpoints.
* ``recovery.py``: opening a data dir: replay, torn-tail backup, checkpoint.
* ``store.py``: ``DiskStore``, routing by container and cross-container merge.
* ``verify.py``: offline check of a data dir.
"""

from __future__ import annotations

from headrace.store.disk.log import FileOps
from headrace.store.disk.store import DiskStore

__all__ = ["DiskStore", "FileOps"]
