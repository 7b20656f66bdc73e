"""``ByteStream``: a one-segment stream as a file of raw bytes (no event framing).

Writes are conditional appends (``ConditionalBlockEnd`` with the expected
offset = the segment length this object believes in), so two byte-stream
writers cannot interleave silently: the second gets
:class:`~headrace.client.errors.ConditionalCheckFailedError`. Unlike the Rust
client, which expects the segment to be empty when a ``ByteStream`` object is
made, ours starts appending at the current tail. Reads are ``ReadSegment``
from the current read position; ``seek`` moves it.

Bytes written here have no Event framing: do not read such a stream with an
event reader (the Rust reader panics on it).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING
from uuid import uuid4

from headrace.errors import ConnectionLost
from headrace.protocols import pravega as p

from ._conn import REQUEST_TIMEOUT_S, SegmentStoreConnection, next_request_id
from .controller import Segment
from .errors import error_for_reply

if TYPE_CHECKING:
    from .pravega import PravegaClient

__all__ = ["MAX_WRITE_BYTES", "ByteStream"]

MAX_WRITE_BYTES = 8 * 1024 * 1024
"""Most bytes per conditional append; larger writes are split (the Rust client's chunk)."""


class ByteStream:
    """Build with :meth:`open`; close with :meth:`aclose`."""

    def __init__(self, client: PravegaClient, segment: Segment) -> None:
        self._client = client
        self.segment = segment
        self._writer_id = uuid4()
        self._event_number = 0
        self._write_offset = 0
        self._read_offset = 0
        self._replies: asyncio.Queue[p.Command | BaseException] = asyncio.Queue()
        self._set_up_on: SegmentStoreConnection | None = None

    @classmethod
    async def open(cls, client: PravegaClient, scope: str, stream: str) -> ByteStream:
        """Open ``scope/stream``, which must have exactly one segment.

        Raises:
            ValueError: the stream has more than one segment.
        """
        head = await client.controller.get_head_segments(scope, stream)
        if len(head) != 1:
            raise ValueError(f"a byte stream has one segment; {scope}/{stream} has {len(head)}")
        ((segment, start),) = head.items()
        bs = cls(client, segment)
        stat = await client.segments.stat(segment)
        bs._write_offset = stat.length
        bs._read_offset = start
        return bs

    # ------------------------------------------------------------------ WriterListener

    def reply(self, cmd: p.Command) -> None:
        self._replies.put_nowait(cmd)

    def connection_lost(self, exc: BaseException) -> None:
        self._set_up_on = None
        self._replies.put_nowait(ConnectionLost(str(exc)))

    async def _next_reply(self) -> p.Command:
        async with asyncio.timeout(REQUEST_TIMEOUT_S):
            item = await self._replies.get()
        if isinstance(item, BaseException):
            raise item
        return item

    # ------------------------------------------------------------------ writing

    async def write(self, data: bytes) -> None:
        """Append ``data`` at the end and wait until it is stored.

        Raises:
            ConditionalCheckFailedError: someone else appended meanwhile.
        """
        for start in range(0, len(data), MAX_WRITE_BYTES):
            await self._append(data[start : start + MAX_WRITE_BYTES])

    async def _append(self, chunk: bytes) -> None:
        conn = await self._client.segments.connection(self.segment)
        if self._set_up_on is not conn:
            conn.attach_writer(self._writer_id, self)
            rid = next_request_id()
            token = await self._client.controller.delegation_token(
                self.segment.scope, self.segment.stream
            )
            conn.send_append(
                self._writer_id, rid, p.SetupAppend(rid, self._writer_id, self.segment.name, token)
            )
            reply = await self._next_reply()
            if not isinstance(reply, p.AppendSetup):
                raise error_for_reply(reply)
            self._set_up_on = conn
            self._event_number = max(self._event_number, reply.last_event_number)
        self._event_number += 1
        rid = next_request_id()
        cmd = p.ConditionalBlockEnd(
            self._writer_id, self._event_number, self._write_offset, chunk, rid
        )
        conn.send_append(self._writer_id, rid, cmd)
        reply = await self._next_reply()
        if not isinstance(reply, p.DataAppended):
            raise error_for_reply(reply)
        self._write_offset += len(chunk)

    # ------------------------------------------------------------------ reading

    async def read(self, size_bytes: int = -1) -> bytes:
        """Up to ``size_bytes`` bytes from the read position (all available if -1);
        ``b""`` at the end of what is written."""
        out = bytearray()
        while size_bytes < 0 or len(out) < size_bytes:
            tail = await self.tail_offset()
            if self._read_offset >= tail:
                break
            got = await self._client.segments.read(self.segment, self._read_offset)
            data = got.data if size_bytes < 0 else got.data[: size_bytes - len(out)]
            out += data
            self._read_offset += len(data)
            if not data:
                break
        return bytes(out)

    def seek(self, offset: int) -> None:
        """Move the read position to the absolute ``offset``."""
        self._read_offset = offset

    def tell(self) -> int:
        return self._read_offset

    async def head_offset(self) -> int:
        return (await self._client.segments.stat(self.segment)).start_offset

    async def tail_offset(self) -> int:
        return (await self._client.segments.stat(self.segment)).length

    async def truncate(self, offset: int) -> None:
        """Drop the bytes before ``offset``."""
        await self._client.segments.truncate(self.segment, offset)

    async def aclose(self) -> None:
        if self._set_up_on is not None:
            self._set_up_on.detach_writer(self._writer_id)
        self._set_up_on = None
