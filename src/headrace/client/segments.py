"""Request/reply segment operations: info, reads, truncation, table segments.

:class:`SegmentClient` finds the segment store of a segment through the
controller (``getURI``), borrows the pool's shared connection and turns error
replies into :mod:`headrace.client.errors` exceptions. Reads, table calls and
metadata calls all go through it; appends go through the writers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, replace

from headrace.errors import ConnectionLost, RequestTimeout
from headrace.protocols import pravega as p

from ._conn import (
    READ_TIMEOUT_S,
    REQUEST_TIMEOUT_S,
    ConnectionPool,
    SegmentStoreConnection,
    next_request_id,
)
from .controller import ControllerClient, Segment
from .errors import error_for_reply

__all__ = ["READ_SUGGESTED_BYTES", "SegmentClient", "SegmentData", "SegmentStat"]

READ_SUGGESTED_BYTES = 2 * 1024 * 1024
"""Bytes asked for per ``ReadSegment``: the server's cap on one reply (Java's
2 MiB), so one round trip carries as much as the server will send."""


@dataclass(frozen=True, slots=True)
class SegmentStat:
    """What ``GetStreamSegmentInfo`` says about a segment."""

    name: str
    exists: bool
    sealed: bool
    start_offset: int
    length: int
    last_modified_ms: int


@dataclass(frozen=True, slots=True)
class SegmentData:
    """One ``SegmentRead``: bytes from ``offset``; ``end_of_segment`` once sealed and read."""

    offset: int
    data: bytes
    end_of_segment: bool
    at_tail: bool


class SegmentClient:
    """Segment-store calls for any segment, routed through the controller's ``getURI``."""

    def __init__(self, controller: ControllerClient, pool: ConnectionPool) -> None:
        self._controller = controller
        self._pool = pool
        self._endpoints: dict[tuple[str, str], tuple[str, int]] = {}

    async def connection(self, segment: Segment) -> SegmentStoreConnection:
        """The pool's connection to the store serving ``segment`` (endpoint cached per stream)."""
        key = (segment.scope, segment.stream)
        endpoint = self._endpoints.get(key)
        if endpoint is None:
            endpoint = await self._controller.get_uri(segment)
            self._endpoints[key] = endpoint
        return await self._pool.get(endpoint)

    async def _call(
        self,
        segment: Segment,
        cmd: p.Command,
        expect: type[p.Command],
        timeout_s: float = REQUEST_TIMEOUT_S,
        *,
        idempotent: bool = False,
    ) -> p.Command:
        """Send ``cmd`` with the stream's delegation token; the reply if it is
        an ``expect``, else its error.

        An ``idempotent`` request (reads, info) is sent again, on a new
        connection, when the connection is lost or the request times out,
        as the pool's retry policy allows (a server restart is invisible).
        """
        delays = self._pool.retry.delays()
        refreshed = False
        while True:
            try:
                conn = await self.connection(segment)
                token = await self._controller.delegation_token(segment.scope, segment.stream)
                if token:
                    cmd = replace(cmd, delegation_token=token)  # type: ignore[type-var]
                reply = await conn.request(cmd, timeout_s=timeout_s)
            except (ConnectionLost, RequestTimeout):
                delay = next(delays, None) if idempotent else None
                if delay is None:
                    raise
                await asyncio.sleep(delay)
                cmd = replace(cmd, request_id=next_request_id())  # type: ignore[type-var]
                continue
            if (
                isinstance(reply, p.AuthTokenCheckFailed)
                and reply.error_code == p.AuthTokenCheckFailed.TOKEN_EXPIRED
                and not refreshed
            ):
                # The token ran out on the way (or the clocks disagree): once more
                # with a fresh one; the server did nothing with the refused request.
                refreshed = True
                self._controller.forget_token(segment.scope, segment.stream)
                cmd = replace(cmd, request_id=next_request_id())  # type: ignore[type-var]
                continue
            break
        if not isinstance(reply, expect):
            raise error_for_reply(reply)
        return reply

    async def stat(self, segment: Segment, name: str | None = None) -> SegmentStat:
        """``GetStreamSegmentInfo`` of ``segment`` (or of ``name``, a segment of its stream)."""
        seg_name = name or segment.name
        reply = await self._call(
            segment,
            p.GetStreamSegmentInfo(next_request_id(), seg_name),
            p.StreamSegmentInfo,
            idempotent=True,
        )
        assert isinstance(reply, p.StreamSegmentInfo)
        return SegmentStat(
            seg_name,
            reply.exists,
            reply.is_sealed,
            reply.start_offset,
            reply.write_offset,
            reply.last_modified,
        )

    async def read(
        self,
        segment: Segment,
        offset: int,
        *,
        suggested_bytes: int = READ_SUGGESTED_BYTES,
        name: str | None = None,
        timeout_s: float = READ_TIMEOUT_S,
    ) -> SegmentData:
        """One ``ReadSegment`` from ``offset``; at the tail of an open segment the
        server holds the read until data arrives (or replies empty after a while).

        Raises:
            SegmentIsTruncatedError: ``offset`` is below the segment's start.
            NoSuchSegmentError: the segment does not exist.
        """
        seg_name = name or segment.name
        cmd = p.ReadSegment(seg_name, offset, suggested_bytes, request_id=next_request_id())
        reply = await self._call(segment, cmd, p.SegmentRead, timeout_s, idempotent=True)
        assert isinstance(reply, p.SegmentRead)
        if reply.offset != offset:
            raise error_for_reply(reply)
        return SegmentData(reply.offset, reply.data, reply.end_of_segment, reply.at_tail)

    async def truncate(self, segment: Segment, offset: int) -> None:
        await self._call(
            segment,
            p.TruncateSegment(next_request_id(), segment.name, offset),
            p.SegmentTruncated,
        )

    # ------------------------------------------------------------------ table segments

    async def create_table(self, segment: Segment, name: str) -> bool:
        """Create table segment ``name``; ``False`` if it exists."""
        conn = await self.connection(segment)
        reply = await conn.request(p.CreateTableSegment(next_request_id(), name))
        if isinstance(reply, p.SegmentCreated):
            return True
        if isinstance(reply, p.SegmentAlreadyExists):
            return False
        raise error_for_reply(reply)

    async def delete_table(self, segment: Segment, name: str) -> bool:
        """Delete table segment ``name``; ``False`` if it did not exist."""
        conn = await self.connection(segment)
        reply = await conn.request(p.DeleteTableSegment(next_request_id(), name, False))
        if isinstance(reply, p.SegmentDeleted):
            return True
        if isinstance(reply, p.NoSuchSegment):
            return False
        raise error_for_reply(reply)

    async def table_update(
        self, segment: Segment, name: str, entries: Sequence[tuple[bytes, bytes, int]]
    ) -> list[int]:
        """Put ``(key, value, expected_version)`` entries atomically; their new versions.

        ``expected_version`` is ``p.NO_VERSION`` (unconditional), ``-1`` (must
        be absent) or the key's current version.

        Raises:
            TableKeyVersionError: a condition failed; nothing was written.
        """
        table = p.TableEntries(
            tuple((p.TableKey(k, v_exp), p.TableValue(v)) for k, v, v_exp in entries)
        )
        reply = await self._call(
            segment,
            p.UpdateTableEntries(next_request_id(), name, "", table),
            p.TableEntriesUpdated,
        )
        assert isinstance(reply, p.TableEntriesUpdated)
        return list(reply.versions)

    async def table_remove(
        self, segment: Segment, name: str, keys: Sequence[tuple[bytes, int]]
    ) -> None:
        """Remove ``(key, expected_version)`` keys atomically."""
        await self._call(
            segment,
            p.RemoveTableKeys(
                next_request_id(), name, "", tuple(p.TableKey(k, v) for k, v in keys)
            ),
            p.TableKeysRemoved,
        )

    async def table_get(
        self, segment: Segment, name: str, keys: Sequence[bytes]
    ) -> list[tuple[bytes, int] | None]:
        """Each key's ``(value, version)``, or ``None`` where absent."""
        reply = await self._call(
            segment,
            p.ReadTable(next_request_id(), name, "", tuple(p.TableKey(k) for k in keys)),
            p.TableRead,
        )
        assert isinstance(reply, p.TableRead)
        out: list[tuple[bytes, int] | None] = []
        for key, value in reply.entries.entries:
            out.append(None if key.version == p.NOT_EXISTS else (value.value, key.version))
        return out

    async def table_entries(
        self, segment: Segment, name: str, *, page_size: int = 1000
    ) -> list[tuple[bytes, bytes, int]]:
        """Every ``(key, value, version)`` of a table, through the entry iterator."""
        token = b""
        out: list[tuple[bytes, bytes, int]] = []
        while True:
            reply = await self._call(
                segment,
                p.ReadTableEntries(
                    next_request_id(),
                    name,
                    "",
                    page_size,
                    p.TableIteratorArgs(continuation_token=token),
                ),
                p.TableEntriesRead,
            )
            assert isinstance(reply, p.TableEntriesRead)
            for key, value in reply.entries.entries:
                out.append((key.key, value.value, key.version))
            if not reply.entries.entries or reply.continuation_token == token:
                return out
            token = reply.continuation_token
