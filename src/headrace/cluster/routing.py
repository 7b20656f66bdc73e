"""``RoutedStore``: one ``SegmentStore`` over the whole cluster, each segment at its owner.

A node's doors without redirects (TANK, Lumberjack, RS-IO) and its
controller use one store whatever node owns a segment. ``RoutedStore`` asks
``locate`` who owns the segment a call names: this node (the call goes to
the local store, as without a cluster), another node (the call goes to a
``RemoteStore`` for that node's segment-store endpoint, one per endpoint,
kept), or nobody right now (``OwnerUnavailable``, retriable: ownership is
moving, or the cluster has not placed the segment's container yet).

What is local, and what is not
------------------------------
* ``list_segments`` lists the local store's segments: those this node holds.
* ``failure`` is the local store's: an unreachable owner is not this node's
  failure (calls for its segments raise ``OwnerUnavailable``).
* ``check_appends`` is given to the local store and to every remote store,
  now and later (each runs it before an append leaves this node).
* ``flush`` flushes the local store and asks every owner this node has
  talked to to flush.
* ``unwatch`` is passed to every store (a future watched through one that
  no longer owns the segment is forgotten there too).
* ``close`` closes every remote store and the local store.

Merges
------
A merge is carried out by the owner of both segments. Segments with
different owners cannot be merged (no node holds both): ``merge`` refuses
with a ``StoreError`` naming the owners, before anything changes. Pravega
names a transaction's segment ``<parent>#transaction.<id>`` and a transient
one ``<parent>#transient.<writer>.<random>``; the store's container of a
name is the CRC-32 of the whole name (``store/disk/layout.py``), so such a
segment is generally placed elsewhere than its parent. The placement that
``locate`` follows must map those names to their parent's container (as
Pravega's ``SegmentToContainerMapper`` does) for commits and large events
to be merged in the cluster.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final
from uuid import UUID

from headrace.cluster.remote import Endpoint, RemoteStore
from headrace.controller.auth import DEFAULT_TOKEN_TTL_S
from headrace.errors import OwnerUnavailable, StoreClosed, StoreError
from headrace.store.api import AppendCheck, SegmentStore, TimeIndexed
from headrace.types import (
    AppendResult,
    ReadResult,
    RegionRead,
    SegmentInfo,
    SegmentKind,
    TableDelta,
    TableEntry,
    TableInfo,
    TableKey,
    TablePage,
    TableUpdate,
    WriterAppend,
)

__all__ = ["MAX_OWNERS", "Locate", "RoutedStore"]

log = logging.getLogger(__name__)

Locate = Callable[[str], Endpoint | None]
"""Segment name -> the segment-store endpoint of the node owning it now, or
None when no node owns it (the cluster's placement; a cheap lookup)."""

MAX_OWNERS: Final = 256
"""Remote stores kept (one per owner endpoint; each holds a connection). A
cluster has far fewer nodes; past it the least recently used one is closed
(calls in flight on it finish first) and opened again when needed."""


class RoutedStore:
    """Every segment at its owner: the local store, or a ``RemoteStore`` per other node.

    Args:
        local: this node's store (the ``RoutedStore`` owns it: ``close`` closes it).
        locate: who owns a segment now (``Locate``).
        here: this node's own segment-store endpoint, as ``locate`` names it.
        ssl_context, token_key, token_ttl_s: how remote stores reach their
            owners (``RemoteStore``).
        forwarder_id: this node's stable id, for appends forwarded without
            a writer (``RemoteStore``).
    """

    def __init__(
        self,
        local: SegmentStore,
        locate: Locate,
        *,
        here: Endpoint,
        ssl_context: ssl.SSLContext | None = None,
        token_key: bytes | None = None,
        token_ttl_s: int = DEFAULT_TOKEN_TTL_S,
        forwarder_id: UUID | None = None,
    ) -> None:
        self.local = local
        self._locate = locate
        self.here = here
        self._ssl_context = ssl_context
        self._token_key = token_key
        self._token_ttl_s = token_ttl_s
        self._forwarder_id = forwarder_id
        self._remotes: OrderedDict[Endpoint, RemoteStore] = OrderedDict()
        self._checks: dict[str, AppendCheck] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self._closed = False

    # ------------------------------------------------------------------ routing

    def store_for(self, name: str) -> SegmentStore:
        """The store that carries calls for segment ``name`` now.

        Raises:
            OwnerUnavailable: no node owns it now.
            StoreClosed: closed.
        """
        if self._closed:
            raise StoreClosed("the store is closed")
        owner = self._locate(name)
        if owner is None:
            raise OwnerUnavailable(name, "no node owns it now")
        if owner == self.here:
            return self.local
        remote = self._remotes.get(owner)
        if remote is None:
            remote = self._remotes[owner] = RemoteStore(
                owner,
                ssl_context=self._ssl_context,
                token_key=self._token_key,
                token_ttl_s=self._token_ttl_s,
                forwarder_id=self._forwarder_id,
            )
            for prefix, check in self._checks.items():
                remote.check_appends(prefix, check)
            if len(self._remotes) > MAX_OWNERS:
                _, oldest = self._remotes.popitem(last=False)
                self._close_later(oldest)
        else:
            self._remotes.move_to_end(owner)
        return remote

    def forget(self, endpoint: Endpoint) -> None:
        """Close the remote store of ``endpoint`` (a node that left), once its calls ended."""
        remote = self._remotes.pop(endpoint, None)
        if remote is not None:
            self._close_later(remote)

    def _close_later(self, remote: RemoteStore) -> None:
        task = asyncio.ensure_future(remote.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    # ------------------------------------------------------------------ segments

    async def create_segment(self, name: str, *, kind: SegmentKind = SegmentKind.STREAM) -> None:
        await self.store_for(name).create_segment(name, kind=kind)

    def append(
        self,
        name: str,
        data: bytes | memoryview,
        *,
        expected_offset: int | None = None,
        writer: WriterAppend | None = None,
    ) -> Awaitable[AppendResult]:
        """The owner's append itself (no coroutine of its own in between); an
        unavailable owner is raised when awaited, as by any store's append."""
        try:
            store = self.store_for(name)
        except StoreError as exc:
            return _raised(exc)
        return store.append(name, data, expected_offset=expected_offset, writer=writer)

    async def read(self, name: str, offset: int, max_bytes: int) -> ReadResult:
        return await self.store_for(name).read(name, offset, max_bytes)

    async def read_region(
        self, name: str, offset: int, max_bytes: int, *, min_region_bytes: int = 0
    ) -> ReadResult | RegionRead:
        return await self.store_for(name).read_region(
            name, offset, max_bytes, min_region_bytes=min_region_bytes
        )

    async def wait_for_data(self, name: str, offset: int, timeout_s: float) -> bool:
        return await self.store_for(name).wait_for_data(name, offset, timeout_s)

    def watch(self, name: str, offset: int, wake: asyncio.Future[None]) -> bool:
        return self.store_for(name).watch(name, offset, wake)

    def unwatch(self, name: str, wake: asyncio.Future[None]) -> None:
        self.local.unwatch(name, wake)
        for remote in self._remotes.values():
            remote.unwatch(name, wake)

    async def info(self, name: str) -> SegmentInfo:
        return await self.store_for(name).info(name)

    async def seal(self, name: str) -> int:
        return await self.store_for(name).seal(name)

    async def truncate(self, name: str, offset: int) -> None:
        await self.store_for(name).truncate(name, offset)

    async def delete(self, name: str) -> None:
        await self.store_for(name).delete(name)

    async def merge(self, target: str, source: str) -> int:
        """Merge at the owner of both; refused when they have different owners.

        Raises:
            StoreError: ``target`` and ``source`` are owned by different nodes.
            (and what ``SegmentStore.merge`` raises)
        """
        store = self.store_for(target)
        if self.store_for(source) is not store:
            raise StoreError(
                f"cannot merge {source!r} into {target!r}: they are owned by different "
                f"nodes ({_owner(self._locate(source))} and {_owner(self._locate(target))})"
            )
        return await store.merge(target, source)

    def check_appends(self, prefix: str, check: AppendCheck) -> None:
        self._checks[prefix] = check
        self.local.check_appends(prefix, check)
        for remote in self._remotes.values():
            remote.check_appends(prefix, check)

    async def get_attribute(self, name: str, attribute_id: UUID) -> int:
        return await self.store_for(name).get_attribute(name, attribute_id)

    async def update_attribute(
        self, name: str, attribute_id: UUID, new_value: int, expected_value: int
    ) -> bool:
        return await self.store_for(name).update_attribute(
            name, attribute_id, new_value, expected_value
        )

    async def offset_at_time(self, name: str, time_ms: int) -> int:
        """``TimeIndexed.offset_at_time`` at the segment's owner (its start, if
        that store keeps no index)."""
        store = self.store_for(name)
        if isinstance(store, TimeIndexed):
            return await store.offset_at_time(name, time_ms)
        return (await store.info(name)).start_offset

    async def append_times(self, name: str, offset: int, end: int) -> list[tuple[int, int]]:
        """``TimeIndexed.append_times`` at the segment's owner (none, if that
        store keeps no index)."""
        store = self.store_for(name)
        if isinstance(store, TimeIndexed):
            return await store.append_times(name, offset, end)
        return []

    async def list_segments(self) -> list[str]:
        """The segments this node holds (the local store's)."""
        if self._closed:
            raise StoreClosed("the store is closed")
        return await self.local.list_segments()

    # ------------------------------------------------------------------ tables

    async def create_table(self, name: str) -> None:
        await self.store_for(name).create_table(name)

    async def delete_table(self, name: str, *, must_be_empty: bool = False) -> None:
        await self.store_for(name).delete_table(name, must_be_empty=must_be_empty)

    async def update_table(
        self,
        name: str,
        updates: Sequence[TableUpdate],
        *,
        expected_length: int | None = None,
    ) -> list[int]:
        return await self.store_for(name).update_table(
            name, updates, expected_length=expected_length
        )

    async def remove_table_keys(
        self,
        name: str,
        keys: Sequence[TableKey],
        *,
        expected_length: int | None = None,
    ) -> None:
        await self.store_for(name).remove_table_keys(name, keys, expected_length=expected_length)

    async def get_table_entries(self, name: str, keys: Sequence[bytes]) -> list[TableEntry | None]:
        return await self.store_for(name).get_table_entries(name, keys)

    async def iterate_table_keys(
        self, name: str, *, continuation_token: bytes = b"", max_count: int
    ) -> TablePage[TableKey]:
        return await self.store_for(name).iterate_table_keys(
            name, continuation_token=continuation_token, max_count=max_count
        )

    async def iterate_table_entries(
        self, name: str, *, continuation_token: bytes = b"", max_count: int
    ) -> TablePage[TableEntry]:
        return await self.store_for(name).iterate_table_entries(
            name, continuation_token=continuation_token, max_count=max_count
        )

    async def read_table_delta(self, name: str, from_position: int, max_count: int) -> TableDelta:
        return await self.store_for(name).read_table_delta(name, from_position, max_count)

    async def table_info(self, name: str) -> TableInfo:
        return await self.store_for(name).table_info(name)

    # ------------------------------------------------------------------ lifecycle

    @property
    def failure(self) -> str | None:
        """The local store's failure: an owner out of reach is not this node's."""
        return self.local.failure

    async def flush(self) -> None:
        """Flush the local store, and ask every owner this node talked to to flush."""
        if self._closed:
            raise StoreClosed("the store is closed")
        results = await asyncio.gather(
            self.local.flush(),
            *(remote.flush() for remote in self._remotes.values()),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def close(self) -> None:
        """Close every remote store (their calls in flight finish first), then the local one."""
        if self._closed:
            return
        self._closed = True
        remotes = list(self._remotes.values())
        self._remotes.clear()
        closing: list[Any] = [*self._closing, *(remote.close() for remote in remotes)]
        await asyncio.gather(*closing, return_exceptions=True)
        await self.local.close()


async def _raised(exc: StoreError) -> AppendResult:
    raise exc


def _owner(endpoint: Endpoint | None) -> str:
    return "nobody" if endpoint is None else f"{endpoint[0]}:{endpoint[1]}"
