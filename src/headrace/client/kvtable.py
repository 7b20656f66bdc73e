"""Key-value tables over table segments.

Two kinds, one API:

* A table the controller knows (``ControllerClient.create_key_value_table``,
  Pravega's ``createKeyValueTable``) has ``partition_count`` partitions, the
  table segments ``S/T_kvtable/<n>.#epoch.0`` (pravega-controller.md#key-value-tables).
  Its keys are exactly ``primary_key_length + secondary_key_length`` bytes;
  the primary key alone picks the partition, hashed as the Java client's
  ``KeyValueTableSegments`` does (``routing.table_key_position``), so Java
  and this client put a key in the same partition. All keys of one primary
  key share a partition, which is what makes a multi-key ``put_all`` atomic.
* A table made without the controller (``KeyValueTable.open`` of a name the
  controller does not know) is the single table segment
  ``S/T_kvtable/0.#epoch.0``, the name the Rust client's ``Table`` API uses;
  its keys are raw bytes of any length (the Rust ``Table`` stores
  CBOR-encoded keys and values in the same kind of segment; its tables are
  readable as bytes).

Versions make conditional updates possible: ``put(key, value, version=v)``
succeeds only if the key's version is ``v`` (``NOT_EXISTS``: the key must be
absent), otherwise :class:`~headrace.client.errors.TableKeyVersionError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from headrace.errors import ServerError
from headrace.protocols import pravega as p
from headrace.protocols.pravega.controller import KVTABLE_SUFFIX
from headrace.protocols.pravega.routing import KeyRanges, table_key_position

from .controller import KeyValueTableConfig, Segment

if TYPE_CHECKING:
    from .pravega import PravegaClient

__all__ = ["NOT_EXISTS", "NO_VERSION", "KeyValueTable", "KeyValueTableConfig"]

NO_VERSION = p.NO_VERSION
"""Version for an unconditional put or removal."""

NOT_EXISTS = p.NOT_EXISTS
"""Version meaning "the key must be absent" (on put)."""


class KeyValueTable:
    """A key-value table. Build with :meth:`open` (or :meth:`create`).

    Args:
        client: the client whose connections the table uses.
        scope, name: the table.
        config: the controller's record of the table; None for a table made
            without the controller (one segment, keys of any length).
    """

    def __init__(
        self,
        client: PravegaClient,
        scope: str,
        name: str,
        config: KeyValueTableConfig | None = None,
    ) -> None:
        self._segments = client.segments
        self._controller = client.controller
        self.scope = scope
        self.name = name
        self.config = config
        count = 1 if config is None else config.partition_count
        self.partitions = [Segment(scope, name + KVTABLE_SUFFIX, n) for n in range(count)]
        self._ranges = KeyRanges.from_ranges(
            (seg, n / count, 1.0 if n == count - 1 else (n + 1) / count)
            for n, seg in enumerate(self.partitions)
        )
        self._anchor = self.partitions[0]
        self.segment_name = self._anchor.name
        """The first partition's table segment (the only one of a one-segment table)."""

    @classmethod
    async def open(
        cls, client: PravegaClient, scope: str, name: str, *, create: bool = True
    ) -> KeyValueTable:
        """Open a table: with its partitions if the controller knows it; else
        the one-segment table, created if missing when ``create``."""
        try:
            config = await client.controller.get_key_value_table_config(scope, name)
        except ServerError as exc:
            if exc.code != "UNIMPLEMENTED":  # a controller without key-value tables
                raise
            config = None
        table = cls(client, scope, name, config)
        if config is None and create:
            await client.segments.create_table(table._anchor, table.segment_name)
        return table

    @classmethod
    async def create(
        cls, client: PravegaClient, scope: str, name: str, config: KeyValueTableConfig
    ) -> KeyValueTable:
        """Create a table through the controller (an existing one is opened as it is)."""
        await client.controller.create_key_value_table(scope, name, config)
        return await cls.open(client, scope, name, create=False)

    def partition_of(self, key: bytes) -> Segment:
        """The partition holding ``key``.

        Raises:
            ValueError: a partitioned table's key of the wrong length.
        """
        config = self.config
        if config is None:
            return self._anchor
        if len(key) != config.key_length:
            raise ValueError(
                f"keys of {self.scope}/{self.name} are {config.key_length} bytes "
                f"({config.primary_key_length} primary + {config.secondary_key_length} "
                f"secondary), got {len(key)}"
            )
        position = table_key_position(key[: config.primary_key_length])
        return self._ranges.segment_for_position(position)

    async def put(self, key: bytes, value: bytes, *, version: int = NO_VERSION) -> int:
        """Set ``key``; returns its new version."""
        seg = self.partition_of(key)
        (new,) = await self._segments.table_update(seg, seg.name, [(key, value, version)])
        return new

    async def put_all(self, entries: Sequence[tuple[bytes, bytes, int]]) -> list[int]:
        """Set several ``(key, value, expected_version)`` at once: all or none.

        Raises:
            ValueError: the keys are in more than one partition (give them one
                primary key).
        """
        if not entries:
            return []
        segs = {self.partition_of(key) for key, _, _ in entries}
        if len(segs) > 1:
            raise ValueError("keys updated together must share a partition (one primary key)")
        (seg,) = segs
        return await self._segments.table_update(seg, seg.name, entries)

    async def get(self, key: bytes) -> tuple[bytes, int] | None:
        """``(value, version)`` of ``key``, or ``None`` if absent."""
        seg = self.partition_of(key)
        (found,) = await self._segments.table_get(seg, seg.name, [key])
        return found

    async def remove(self, key: bytes, *, version: int = NO_VERSION) -> None:
        seg = self.partition_of(key)
        await self._segments.table_remove(seg, seg.name, [(key, version)])

    async def items(self) -> list[tuple[bytes, bytes, int]]:
        """Every ``(key, value, version)``, partition by partition."""
        out: list[tuple[bytes, bytes, int]] = []
        for seg in self.partitions:
            out += await self._segments.table_entries(seg, seg.name)
        return out

    async def delete(self) -> bool:
        """Delete the whole table; ``False`` if it did not exist."""
        if self.config is not None:
            return await self._controller.delete_key_value_table(self.scope, self.name)
        return await self._segments.delete_table(self._anchor, self.segment_name)
