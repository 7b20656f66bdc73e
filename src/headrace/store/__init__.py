"""The storage engine: one contract (``SegmentStore``), two implementations.

``MemoryStore`` is the reference; ``DiskStore`` is the durable engine that
``headrace serve`` runs on. Nothing in this package knows about sockets or
wire protocols.
"""

from __future__ import annotations

from headrace.store.api import SegmentStore
from headrace.store.disk import DiskStore
from headrace.store.memory import MemoryStore

__all__ = ["DiskStore", "MemoryStore", "SegmentStore"]
