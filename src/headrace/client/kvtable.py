"""Key-value tables over a table segment.

A table ``T`` in scope ``S`` is the table segment ``S/T_kvtable/0.#epoch.0``,
the name the Rust client's ``Table`` API uses (pravega-controller.md#naming). Keys and
values are raw bytes here (the Rust ``Table`` stores CBOR-encoded keys and
values in the same kind of segment; its tables are readable as bytes).

Versions make conditional updates possible: ``put(key, value, version=v)``
succeeds only if the key's version is ``v`` (``NOT_EXISTS``: the key must be
absent), otherwise :class:`~headrace.client.errors.TableKeyVersionError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from headrace.protocols import pravega as p

from .controller import Segment

if TYPE_CHECKING:
    from .pravega import PravegaClient

__all__ = ["NOT_EXISTS", "NO_VERSION", "KeyValueTable"]

NO_VERSION = p.NO_VERSION
"""Version for an unconditional put or removal."""

NOT_EXISTS = p.NOT_EXISTS
"""Version meaning "the key must be absent" (on put)."""


class KeyValueTable:
    """A key-value table. Build with :meth:`open` (creates it if missing)."""

    def __init__(self, client: PravegaClient, scope: str, name: str) -> None:
        self._segments = client.segments
        self.scope = scope
        self.name = name
        self._anchor = Segment(scope, f"{name}_kvtable", 0)
        self.segment_name = self._anchor.name

    @classmethod
    async def open(cls, client: PravegaClient, scope: str, name: str) -> KeyValueTable:
        table = cls(client, scope, name)
        await client.segments.create_table(table._anchor, table.segment_name)
        return table

    async def put(self, key: bytes, value: bytes, *, version: int = NO_VERSION) -> int:
        """Set ``key``; returns its new version."""
        (new,) = await self._segments.table_update(
            self._anchor, self.segment_name, [(key, value, version)]
        )
        return new

    async def put_all(self, entries: Sequence[tuple[bytes, bytes, int]]) -> list[int]:
        """Set several ``(key, value, expected_version)`` at once: all or none."""
        return await self._segments.table_update(self._anchor, self.segment_name, entries)

    async def get(self, key: bytes) -> tuple[bytes, int] | None:
        """``(value, version)`` of ``key``, or ``None`` if absent."""
        (found,) = await self._segments.table_get(self._anchor, self.segment_name, [key])
        return found

    async def remove(self, key: bytes, *, version: int = NO_VERSION) -> None:
        await self._segments.table_remove(self._anchor, self.segment_name, [(key, version)])

    async def items(self) -> list[tuple[bytes, bytes, int]]:
        """Every ``(key, value, version)``."""
        return await self._segments.table_entries(self._anchor, self.segment_name)

    async def delete(self) -> bool:
        """Delete the whole table; ``False`` if it did not exist."""
        return await self._segments.delete_table(self._anchor, self.segment_name)
