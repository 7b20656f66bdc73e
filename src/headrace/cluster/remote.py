"""``RemoteStore``: the store of another ``headrace serve``, reached over the Pravega wire protocol.

In a cluster each segment belongs to one node. Doors without redirects
(TANK, Lumberjack, RS-IO) and the controller's metadata reach a segment that
another node owns through a ``RemoteStore``: every ``SegmentStore`` call
becomes requests to the owner's segment-store port (``pravega.md#commands``)
and returns only once the owner answered, so an acknowledged append is one
the owner acknowledged (durable under its fsync policy).

How the calls travel
--------------------
* **One connection** (a *link*) carries everything: appends, requests and
  parked reads, pipelined. It is opened on first use and again after it
  ended; nothing is retried on a new one (a call whose link broke raises
  ``OwnerUnavailable``, which is retriable: the caller decides).
* **Appends** go as the wire's appends, in a writer session per writer id
  (``pravega.md#append-sessions``). An append with a ``WriterAppend`` keeps
  the writer's id and event number on the wire, so the owner's dedup (the
  writer's number kept as a segment attribute) works across the hop. An
  append without one uses this forwarder's own writer for the segment: a
  UUID derived from ``forwarder_id`` and the segment name, with increasing
  event numbers; it leaves one attribute on the segment per forwarder (a
  stable ``forwarder_id``, the node's id, keeps it at one across restarts).
  Appends are sent in call order, each as soon as it is called, without
  waiting for earlier acknowledgements: many concurrent appends to one
  segment go out pipelined on the one link, and the owner stores them in
  that order. The order holds per writer (appends without one share the
  forwarder's writer of the segment): an append of a writer that must be
  set up first can be stored after a later call of another writer. A
  writer session is (re)set up with ``SetupAppend`` when a writer first
  appends, moves to another segment, or sends a number below one it sent
  before (a retry): after every earlier append of that writer was
  answered, as the wire requires. A retry numbered below what the owner
  holds is answered here as the duplicate it is (the owner would not
  answer it).
* **Reads** never wait at the tail (the wire's ``ReadSegment`` does): a read
  asks for the segment's length first (``GetStreamSegmentInfo``) unless an
  earlier answer showed bytes at the offset, and answers at the tail itself.
* **Waits** (``wait_for_data``, ``watch``) are a ``ReadSegment`` at the
  offset, which the owner parks until bytes are there or the segment is
  sealed, then answers; sent again while the wait lasts.

Errors come back as the same store errors (``WIRE_ERRORS``, the one table);
where a reply lacks a field the store error carries (a conditional append's
actual length, a table condition's key and versions), it is asked for
afterwards, so it is the state a moment later. A lost, refused or silent
connection is ``OwnerUnavailable``.

What the wire cannot carry
--------------------------
* ``info().attributes`` is always empty: no request lists a segment's
  attributes (``get_attribute`` reads one).
* ``list_segments`` raises ``StoreError``: no request lists segments (the
  owner's own store lists them).
* ``failure`` is always None: an owner that cannot be reached is not this
  node's failure; calls raise ``OwnerUnavailable`` instead.
* ``check_appends`` checks are run here, before an append or merge is sent
  (the owner runs its own as well).
* ``read_region`` answers with bytes (``read``): a file of another machine
  cannot be sent from here.
* Names holding a lone surrogate cannot be encoded on the wire: every call
  naming one raises ``StoreError``. Names over ``MAX_NAME_BYTES`` raise
  ``LimitExceeded`` on creation and ``SegmentNotFound`` otherwise, as locally.
* The empty table key cannot travel (the wire writes an empty key without
  its version; Pravega's tables hold none): table calls naming it raise
  ``StoreError``, and the owner leaves it out of iterations and deltas of a
  table that holds it.
* A conditional append travels in one frame: at most
  ``MAX_CONDITIONAL_APPEND_BYTES``. Other appends up to ``MAX_APPEND_BYTES``
  travel as two frames the owner joins into one append.
* With ``token_key`` (the cluster secret, or with auth on the shared token
  key) every request carries a node token signed with it (``node_token``),
  which lets the owner take anything: internal segments (``_system/…``: the
  controller's and TANK's tables), names that are not ``scope/stream/…``,
  and ``flush`` (FlushToStorage names no segment). Without one, the owner
  refuses changes to internal segments (``OperationUnsupported``) and, with
  auth on, everything: ``StoreError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import ssl
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, TypeVar
from uuid import UUID

from headrace.client._conn import (
    CONNECT_TIMEOUT_S,
    READ_TIMEOUT_S,
    REQUEST_TIMEOUT_S,
    SegmentStoreConnection,
    next_request_id,
)
from headrace.client.errors import TlsCertificateError
from headrace.controller.auth import DEFAULT_TOKEN_TTL_S, TokenIssuer
from headrace.errors import (
    AppendRefused,
    BadOffset,
    ConnectionLost,
    LimitExceeded,
    LocalProtocolError,
    OwnerUnavailable,
    RequestTimeout,
    SegmentExists,
    SegmentNotFound,
    SegmentSealed,
    SegmentTruncated,
    SegmentTypeMismatch,
    StoreClosed,
    StoreError,
    TableKeyBadVersion,
    TableKeyNotFound,
    TableNotEmpty,
)
from headrace.protocols import pravega as p
from headrace.protocols.pravega.auth import ROOT, Permission
from headrace.protocols.pravega.codec import FRAME_HEADER
from headrace.store._timeindex import TimeIndex
from headrace.store.api import (
    MAX_APPEND_BYTES,
    MAX_TABLE_BATCH_BYTES,
    MAX_TABLE_KEY_BYTES,
    MAX_TABLE_VALUE_BYTES,
    MAX_WAIT_S,
    AppendCheck,
)
from headrace.store.memory import check_name
from headrace.store.tables import RECORD_HEADER, TableIndex, check_removals, check_updates
from headrace.types import (
    NO_VERSION,
    NOT_EXISTS,
    NULL_ATTRIBUTE_VALUE,
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

__all__ = [
    "APPEND_REPLY_TIMEOUT_S",
    "MAX_CONDITIONAL_APPEND_BYTES",
    "MAX_INLINE_APPEND_BYTES",
    "MAX_KNOWN_LENGTHS",
    "MAX_SESSIONS",
    "MAX_WRITERS_PER_LINK",
    "NODE_TOKEN_RENEW_S",
    "NODE_TOKEN_SUBJECT",
    "TABLE_READ_KEYS_PER_REQUEST",
    "WIRE_ERRORS",
    "Endpoint",
    "RemoteStore",
    "node_token",
]

log = logging.getLogger(__name__)

_T = TypeVar("_T")

Endpoint = tuple[str, int]
"""A node's segment-store address: (host, port)."""

APPEND_REPLY_TIMEOUT_S: Final = REQUEST_TIMEOUT_S
"""Most time an append waits for the owner's answer. An owner silent that long
is taken as gone: the link is closed, so every call on it ends with
``OwnerUnavailable`` instead of an acknowledgement that may never come."""

CLOSE_APPENDS_TIMEOUT_S: Final = APPEND_REPLY_TIMEOUT_S
"""Most time ``close`` waits for appends in flight to be answered before it
closes the link (they then end with ``StoreClosed``)."""

MAX_SESSIONS: Final = 4096
"""Writer sessions remembered (a forwarded writer's, or this forwarder's own
writer of a segment). Past it the least recently used idle one is forgotten;
its next append sets it up again (one more round trip)."""

MAX_WRITERS_PER_LINK: Final = p.MAX_WRITERS_PER_CONNECTION // 2
"""Writer ids set up on one link before new sessions move to a fresh link.
The owner refuses more than ``MAX_WRITERS_PER_CONNECTION`` writers on one
connection (and closes it), and keeps every writer it saw until the
connection closes; a retired link closes once nothing uses it."""

MAX_KNOWN_LENGTHS: Final = 4096
"""Segments whose length the owner last reported is remembered, so a read
below it goes out at once instead of asking for the length first (about
a hundred bytes each); the oldest is forgotten past it."""

MAX_INLINE_APPEND_BYTES: Final = p.MAX_FRAME_BYTES - len(
    p.encode_command(p.AppendBlockEnd(UUID(int=0), 0, b"", 1, 0, 0))
)
"""Most bytes an append sends in one ``AppendBlockEnd``; a larger one (up to
``MAX_APPEND_BYTES``) is an ``AppendBlock`` holding its first half as a partial
event and an ``AppendBlockEnd`` with the rest, which the owner joins into one
append (``pravega.md#java-append-blocks``)."""

MAX_CONDITIONAL_APPEND_BYTES: Final = p.MAX_FRAME_BYTES - len(
    p.encode_command(p.ConditionalBlockEnd(UUID(int=0), 0, 0, b"", 0))
)
"""Most bytes a conditional append may hold: the wire carries it in one
``ConditionalBlockEnd`` frame. Larger ones raise ``LimitExceeded``."""

TABLE_READ_KEYS_PER_REQUEST: Final = 15
"""Keys one ``ReadTable`` asks for. The owner refuses a request whose reply
would not fit one frame; fifteen of the largest entries (key and value at
their limits, about 1 MiB each) fit, sixteen might not. More keys go as
several requests, pipelined."""

READ_REPLY_BYTES: Final = 2 * 1024 * 1024
"""Most bytes one ``ReadSegment`` asks for: the owner's cap on one reply."""


WAIT_READ_BYTES: Final = 1
"""Bytes a wait's ``ReadSegment`` asks for: it only needs to know that bytes
are there (the owner sends a few anyway)."""

NODE_TOKEN_SUBJECT: Final = "headrace-node"
"""Who a node's delegation token names: every node of the cluster."""

NODE_TOKEN_RENEW_S: Final = 60
"""A node token is replaced by a fresh one when less than this is left of its
life, so no request goes out with a token that expires on the way."""

_NULL: Final = NULL_ATTRIBUTE_VALUE


def node_token(issuer: TokenIssuer) -> str:
    """A node token for node-to-node calls, signed by ``issuer``'s key.

    It carries the node claim (``TokenClaims.node``: every request, internal
    segments included), names ``prn::/*`` with READ_UPDATE (every stream)
    and lives ``issuer.ttl_s``. Every node signs its own with the key every
    node's segment store checks node tokens with: the cluster secret, or
    with auth on the shared token key.
    """
    return issuer.issue(NODE_TOKEN_SUBJECT, ROOT + "*", Permission.READ_UPDATE, node=True)


# --------------------------------------------------------------------------- errors


@dataclass(frozen=True, slots=True)
class _Asked:
    """What a request named, to build the store error of its error reply.

    ``name`` is the segment (as asked, not as echoed); ``others`` are more
    segments it named (a merge's source); ``read`` says a ``SegmentIsTruncated``
    means a read below the start (else it stands for ``BadOffset``).
    """

    name: str
    others: tuple[str, ...] = ()
    read: bool = False


_LIMIT = re.compile(r"(?P<what>.+): (?P<got>-?\d+) exceeds the limit of (?P<limit>-?\d+)")
"""``str(LimitExceeded(...))``: the owner sends a store error's text in ``ErrorMessage``."""


def _illegal(reply: p.ErrorMessage, asked: _Asked) -> StoreError:
    """The store error whose text the owner sent (``SegmentTypeMismatch``,
    ``LimitExceeded`` and ``AppendRefused`` travel as ``ErrorMessage``)."""
    text = reply.message
    for name in (asked.name, *asked.others):
        # The owner bounds its texts (a long name is cut): compare with the same cut.
        for kind in SegmentKind:
            if text == p.reply_text(str(SegmentTypeMismatch(name, kind.value)), [name]):
                return SegmentTypeMismatch(name, kind.value)
        prefix = p.reply_text(str(AppendRefused(name, "")), [name])
        if text.startswith(prefix):
            return AppendRefused(name, text[len(prefix) :])
    limit = _LIMIT.fullmatch(text)
    if limit is not None:
        return LimitExceeded(limit["what"], int(limit["limit"]), int(limit["got"]))
    return StoreError(f"segment {asked.name!r}: the owner refused the request: {text}")


def _truncated(reply: p.SegmentIsTruncated, asked: _Asked) -> StoreError:
    # A read below the start, or the owner's form of BadOffset (the store's
    # ``actual`` in ``start_offset``, ``expected`` in ``offset``).
    if asked.read:
        return SegmentTruncated(asked.name, reply.start_offset)
    return BadOffset(asked.name, reply.offset, reply.start_offset)


def _token_refused(reply: p.AuthTokenCheckFailed, asked: _Asked) -> StoreError:
    return StoreError(
        f"segment {asked.name!r}: the owner refused this node's token "
        f"({reply.server_stack_trace or 'no reason given'}); the nodes must share "
        "one cluster secret (or, with auth on, one token key)"
    )


def _unsupported(reply: p.OperationUnsupported, asked: _Asked) -> StoreError:
    return StoreError(
        f"segment {asked.name!r}: the owner refused {reply.operation_name} "
        "(changes to internal segments need the cluster secret)"
    )


WIRE_ERRORS: dict[type[p.Command], Callable[[Any, _Asked], StoreError]] = {
    p.NoSuchSegment: lambda r, a: SegmentNotFound(a.name),
    p.SegmentAlreadyExists: lambda r, a: SegmentExists(a.name),
    p.SegmentIsSealed: lambda r, a: SegmentSealed(a.name, r.offset),
    p.SegmentIsTruncated: _truncated,
    p.ConditionalCheckFailed: lambda r, a: BadOffset(a.name, -1, -1),  # filled in by append
    p.TableKeyDoesNotExist: lambda r, a: TableKeyNotFound(a.name, b""),  # filled in by the call
    p.TableKeyBadVersion: lambda r, a: TableKeyBadVersion(a.name, b"", NO_VERSION, NOT_EXISTS),
    p.TableSegmentNotEmpty: lambda r, a: TableNotEmpty(a.name),
    p.ErrorMessage: _illegal,
    p.WrongHost: lambda r, a: OwnerUnavailable(
        a.name, f"it moved to {r.correct_host}" if r.correct_host else "its owner cannot serve it"
    ),
    p.OperationUnsupported: _unsupported,
    p.AuthTokenCheckFailed: _token_refused,
}
"""Error reply -> the store error it stands for: the inverse of the server's
``STORE_ERROR_REPLIES``, built from the reply and what the request named.
Any other reply is a ``StoreError`` saying which reply came."""


def _error(reply: p.Command, asked: _Asked) -> StoreError:
    build = WIRE_ERRORS.get(type(reply))
    if build is None:
        return StoreError(f"segment {asked.name!r}: unexpected reply {type(reply).__name__}")
    return build(reply, asked)


# --------------------------------------------------------------------------- links and sessions


class _Link:
    """One connection to the owner, and what still uses it."""

    __slots__ = ("conn", "requests", "retired", "sessions", "writers")

    def __init__(self, conn: SegmentStoreConnection) -> None:
        self.conn = conn
        self.writers = 0  # writer ids set up on it so far (the owner counts them)
        self.sessions = 0  # sessions attached now
        self.requests = 0  # requests awaiting their reply
        self.retired = False  # takes no new sessions or requests

    @property
    def usable(self) -> bool:
        return not self.retired and not self.conn.is_closed


@dataclass(slots=True)
class _Append:
    """One append, from its call to its answer."""

    name: str
    data: bytes | memoryview
    size: int
    expected_offset: int | None
    writer: WriterAppend | None
    future: asyncio.Future[p.Command | AppendResult]
    request_id: int = 0


class _Session:
    """One writer id's appends to the owner: set up on a link for one segment at a time.

    The wire's rules (``pravega.md#append-sessions``) shape it: an append may
    follow only an accepted ``SetupAppend`` for its segment on that
    connection; a writer's event numbers must not go back (the owner closes
    the connection); and an append numbered below what the owner holds is
    stored nowhere and answered never. So an append is sent at once only
    when the session is set up for its segment on a link that is still open
    (a retired one too: only new sessions go to a fresh link) and its number
    is not below any sent or held; otherwise it waits in ``waiting``
    (as does every later one, to keep the order) for ``_run`` to answer
    the earlier ones' replies, set the session up again and go on.
    """

    __slots__ = (
        "in_flight",
        "last_sent",
        "link",
        "plain",
        "pump",
        "remote",
        "segment",
        "setup_reply",
        "setup_rid",
        "setup_value",
        "waiting",
        "wake_idle",
        "writer_id",
    )

    def __init__(self, remote: RemoteStore, writer_id: UUID, *, plain: bool) -> None:
        self.remote = remote
        self.writer_id = writer_id
        self.plain = plain  # the forwarder's own writer: numbers are ours to give
        self.link: _Link | None = None
        self.segment: str | None = None  # what the accepted SetupAppend named
        self.setup_value = _NULL  # the owner's number for the writer at setup
        self.last_sent = _NULL  # the highest number sent since the setup
        self.waiting: deque[_Append] = deque()
        self.in_flight: dict[int, _Append] = {}
        self.pump: asyncio.Task[None] | None = None
        self.wake_idle: asyncio.Future[None] | None = None
        self.setup_rid = 0
        self.setup_reply: asyncio.Future[p.Command] | None = None

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.in_flight or self.pump is not None)

    # ------------------------------------------------------------------ sending

    def submit(self, append: _Append) -> None:
        """Send ``append`` now if it may go, else queue it behind the others."""
        if self.pump is None and not self.waiting and self._may_send(append):
            self._send(append)
            return
        self.waiting.append(append)
        if self.pump is None:
            self.pump = asyncio.create_task(self._run(), name=f"appends of {self.writer_id}")

    def _may_send(self, append: _Append) -> bool:
        link = self.link  # a retired link still carries the sessions set up on it
        if link is None or link.conn.is_closed or self.segment != append.name:
            return False
        if self.plain or append.writer is None:
            return True
        number = append.writer.event_number
        return number >= self.setup_value and number >= self.last_sent

    def _send(self, append: _Append) -> None:
        link = self.link
        assert link is not None
        if self.plain or append.writer is None:
            number = max(self.last_sent, self.setup_value, 0) + 1
        else:
            number = append.writer.event_number
        rid = append.request_id = next_request_id()
        self.in_flight[rid] = append
        self.last_sent = max(self.last_sent, number)
        try:
            _send_append(link.conn, self.writer_id, append, number, rid)
        except (ConnectionLost, LocalProtocolError) as exc:
            del self.in_flight[rid]
            self._answered()
            _fail(append.future, self.remote._lost(append.name, exc))

    async def _run(self) -> None:
        """Send what waits, in order, setting the session up again where needed."""
        try:
            while self.waiting:
                head = self.waiting[0]
                if self._may_send(head):
                    self._send(self.waiting.popleft())
                    continue
                if self._is_held(head):
                    self.waiting.popleft()
                    self.remote._answer_duplicate(head, self.setup_value)
                    continue
                await self._idle()
                try:
                    await self._setup(head.name)
                except StoreError as exc:
                    self._fail_waiting(head.name, exc)
        finally:
            self.pump = None

    def _is_held(self, append: _Append) -> bool:
        """A forwarded writer's retry numbered below what the owner held at the setup:
        stored already, and the owner would not answer it."""
        return (
            self.segment == append.name
            and not self.plain
            and append.writer is not None
            and append.writer.event_number < self.setup_value
        )

    async def _idle(self) -> None:
        """Until every append sent in this session has been answered."""
        while self.in_flight:
            self.wake_idle = asyncio.get_running_loop().create_future()
            await self.wake_idle

    async def _setup(self, segment: str) -> None:
        """``SetupAppend`` for ``segment``, on the current link (one with room for
        another writer) unless the session is on it already.

        Raises:
            StoreError: the owner refused (``SegmentNotFound``...), or
                ``OwnerUnavailable``.
        """
        remote = self.remote
        expired_once = False
        while True:
            link = await remote._current_link(segment)
            if self.link is not link:
                if link.writers >= MAX_WRITERS_PER_LINK:
                    link.retired = True  # full: new sessions go to a fresh link
                    continue
                if self.link is not None:
                    remote._detach(self.link, self)
                try:
                    link.conn.attach_writer(self.writer_id, self)
                except ConnectionLost as exc:
                    raise remote._lost(segment, exc) from exc
                self.link = link
                link.sessions += 1
                link.writers += 1
            self.segment = None
            rid = self.setup_rid = next_request_id()
            reply_future = self.setup_reply = asyncio.get_running_loop().create_future()
            cmd = p.SetupAppend(rid, self.writer_id, segment, remote._token())
            try:
                link.conn.send_append(self.writer_id, rid, cmd)
                async with asyncio.timeout(REQUEST_TIMEOUT_S):
                    reply = await reply_future
            except TimeoutError:
                await remote._drop_link(link, "no answer to SetupAppend")
                raise OwnerUnavailable(segment, "no answer to SetupAppend") from None
            except (ConnectionLost, LocalProtocolError) as exc:
                raise remote._lost(segment, exc) from exc
            finally:
                self.setup_reply = None
            if isinstance(reply, p.AppendSetup):
                self.segment = segment
                self.setup_value = reply.last_event_number
                self.last_sent = _NULL
                return
            if _expired(reply) and not expired_once:
                expired_once = True
                remote._renew_token()
                continue
            raise _error(reply, _Asked(segment))

    def _fail_waiting(self, segment: str, exc: StoreError) -> None:
        """The setup for ``segment`` failed: so does every append waiting for it."""
        kept: deque[_Append] = deque()
        for append in self.waiting:
            if append.name == segment:
                _fail(append.future, exc)
            else:
                kept.append(append)
        self.waiting = kept

    def abandon(self, append: _Append) -> bool:
        """Take back an append that was not sent (its caller stopped waiting);
        False if it went out already."""
        try:
            self.waiting.remove(append)
        except ValueError:
            return False
        return True

    # ------------------------------------------------------------------ replies (WriterListener)

    def reply(self, cmd: p.Command) -> None:
        rid = getattr(cmd, "request_id", None)
        if rid == self.setup_rid and self.setup_reply is not None:
            if not self.setup_reply.done():
                self.setup_reply.set_result(cmd)
            return
        if rid is None or isinstance(cmd, p.InvalidEventNumber):
            # The owner gave up on the writer's session: every append of it
            # in flight is unanswered for good; the next one sets up again.
            self._drop_in_flight(OwnerUnavailable(self.segment or "", type(cmd).__name__))
            self.segment = None
            return
        append = self.in_flight.pop(rid, None)
        if append is None:
            log.debug("dropping %s nobody waits for", type(cmd).__name__)
            return
        if isinstance(cmd, p.DataAppended):
            self.remote._learn_length(append.name, cmd.current_segment_write_offset)
        if not append.future.done():
            append.future.set_result(cmd)
        self._answered()

    def connection_lost(self, exc: BaseException) -> None:
        link = self.link
        self.link = None
        self.segment = None
        if link is not None:
            link.sessions -= 1
        if self.setup_reply is not None and not self.setup_reply.done():
            self.setup_reply.set_exception(ConnectionLost(str(exc)))
        # Appends sent: their outcome is unknown. Appends not sent yet fail too,
        # so none is stored after an earlier one of the same burst was lost.
        self._drop_in_flight(self.remote._lost("", exc))
        for append in self.waiting:
            _fail(append.future, self.remote._lost(append.name, exc))
        self.waiting.clear()

    def _drop_in_flight(self, error: StoreError) -> None:
        appends = list(self.in_flight.values())
        self.in_flight.clear()
        for append in appends:
            _fail(append.future, _renamed(error, append.name))
        self._answered()

    def _answered(self) -> None:
        if not self.in_flight and self.wake_idle is not None and not self.wake_idle.done():
            self.wake_idle.set_result(None)


def _send_append(
    conn: SegmentStoreConnection, writer_id: UUID, append: _Append, number: int, rid: int
) -> None:
    """Write ``append`` as the wire's append frames, numbered ``number`` (not copied
    into the frame, except the first half of one too large for a frame)."""
    data, size = append.data, append.size
    if append.expected_offset is not None:
        cmd: p.Command = p.ConditionalBlockEnd(writer_id, number, append.expected_offset, b"", rid)
        conn.send_append_parts(writer_id, rid, cmd, [data], size)
        return
    if size <= MAX_INLINE_APPEND_BYTES:
        cmd = p.AppendBlockEnd(writer_id, size, b"", 1, number, rid)
        conn.send_append_parts(writer_id, rid, cmd, [data], size)
        return
    # Two frames, written together (nothing may come between them): the first
    # half as a block ending in a partial event, the rest in the block's end.
    half = size // 2
    block = FRAME_HEADER.pack(p.CommandType.PARTIAL_EVENT, half) + bytes(data[:half])
    conn.send_nowait(p.AppendBlock(writer_id, block))
    end = p.AppendBlockEnd(writer_id, 0, b"", 1, number, rid)
    conn.send_append_parts(writer_id, rid, end, [data[half:]], size - half)


def _fail(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


def _renamed(error: StoreError, name: str) -> StoreError:
    """``error`` for segment ``name`` (an ``OwnerUnavailable`` is per segment)."""
    if isinstance(error, OwnerUnavailable):
        return OwnerUnavailable(name, error.reason)
    return error


def _expired(reply: p.Command) -> bool:
    return (
        isinstance(reply, p.AuthTokenCheckFailed)
        and reply.error_code == p.AuthTokenCheckFailed.TOKEN_EXPIRED
    )


@dataclass(slots=True)
class _Watch:
    """The futures waiting for bytes at one (segment, offset), and the wait for them."""

    wakes: dict[asyncio.Future[None], None] = field(default_factory=dict)
    task: asyncio.Task[None] | None = None


# --------------------------------------------------------------------------- the store


class RemoteStore:
    """The ``SegmentStore`` of the ``headrace serve`` at ``endpoint``, over its segment-store port.

    Args:
        endpoint: (host, port) of the owner's segment-store listener.
        ssl_context: speak TLS to it (the owner serves TLS when it has a
            certificate), checking its certificate against ``host``.
        token_key: the key node tokens are signed with (the cluster secret,
            or with auth on the shared token key): every request carries one
            (``node_token``). None: requests carry no token.
        token_ttl_s: life of those tokens.
        forwarder_id: this node's stable id; appends without a writer go as
            a writer derived from it and the segment name (a new random one
            when not given).
    """

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        ssl_context: ssl.SSLContext | None = None,
        token_key: bytes | None = None,
        token_ttl_s: int = DEFAULT_TOKEN_TTL_S,
        forwarder_id: UUID | None = None,
    ) -> None:
        self.endpoint = endpoint
        self._ssl_context = ssl_context
        self._issuer = None if token_key is None else TokenIssuer(token_key, token_ttl_s)
        self._token_value = ""
        self._token_renew_at = 0.0
        self._forwarder_id = uuid.uuid4() if forwarder_id is None else forwarder_id
        self._link: _Link | None = None
        self._links: set[_Link] = set()
        self._connecting: asyncio.Future[_Link] | None = None
        self._writers: OrderedDict[UUID, _Session] = OrderedDict()  # forwarded writers
        self._plain: OrderedDict[str, _Session] = OrderedDict()  # our writer, per segment
        self._lengths: OrderedDict[str, int] = OrderedDict()
        self._watches: dict[str, dict[int, _Watch]] = {}  # segment -> offset -> its wait
        self._checks: dict[str, AppendCheck] = {}
        self._background: set[asyncio.Future[Any]] = set()
        self._closed = False  # no new calls
        self._shut = False  # no link any more: what is still out ends with StoreClosed

    def __repr__(self) -> str:
        return f"RemoteStore({self.endpoint[0]}:{self.endpoint[1]})"

    @property
    def appends_in_flight(self) -> int:
        """Appends sent to the owner and not answered yet."""
        sessions = [*self._writers.values(), *self._plain.values()]
        return sum(len(s.in_flight) for s in sessions)

    # ------------------------------------------------------------------ links

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosed("the remote store is closed")

    def _lost(self, name: str, exc: BaseException) -> StoreError:
        """The error of a call whose link ended under it."""
        if self._shut:
            return StoreClosed("the remote store is closed")
        return OwnerUnavailable(name, f"connection to {self._peer} lost: {exc}")

    @property
    def _peer(self) -> str:
        return f"{self.endpoint[0]}:{self.endpoint[1]}"

    async def _current_link(self, name: str) -> _Link:
        """The link new work goes on, connecting one if there is none.

        Raises:
            OwnerUnavailable: the owner could not be reached.
            StoreClosed, StoreError: closed; the owner's certificate did not verify.
        """
        if self._shut:
            raise StoreClosed("the remote store is closed")
        link = self._link
        if link is not None and link.usable:
            return link
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._connect())
            self._connecting.add_done_callback(_consume)
        try:
            return await asyncio.shield(self._connecting)
        except (ConnectionLost, RequestTimeout) as exc:
            raise OwnerUnavailable(name, f"cannot connect to {self._peer}: {exc}") from exc
        except TlsCertificateError as exc:
            raise StoreError(f"segment {name!r}: the owner's certificate: {exc}") from exc

    async def _connect(self) -> _Link:
        try:
            conn = await SegmentStoreConnection.connect(
                *self.endpoint, timeout_s=CONNECT_TIMEOUT_S, ssl_context=self._ssl_context
            )
        finally:
            self._connecting = None
        if self._shut:
            await conn.aclose()
            raise StoreClosed("the remote store is closed")
        old = self._link
        link = self._link = _Link(conn)
        self._links.add(link)
        if old is not None:
            old.retired = True
            self._close_if_unused(old)
        return link

    def _detach(self, link: _Link, session: _Session) -> None:
        link.conn.detach_writer(session.writer_id)
        link.sessions -= 1
        self._close_if_unused(link)

    def _close_if_unused(self, link: _Link) -> None:
        """Close a retired or dead link once no session and no request uses it."""
        if link is self._link and link.usable:
            return
        if link.conn.is_closed or (link.sessions <= 0 and link.requests <= 0):
            self._links.discard(link)
            if link is self._link:
                self._link = None
            if not link.conn.is_closed:
                self._spawn(link.conn.aclose())

    async def _drop_link(self, link: _Link, why: str) -> None:
        """Give up on a link whose owner went silent: every call on it ends now."""
        log.warning("closing the connection to %s: %s", self._peer, why)
        link.retired = True
        self._links.discard(link)
        if link is self._link:
            self._link = None
        await link.conn.aclose()

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(_consume)

    # ------------------------------------------------------------------ tokens

    def _token(self) -> str:
        """The node token to send (renewed before it runs out); empty without auth."""
        if self._issuer is None:
            return ""
        now = time.monotonic()
        if now >= self._token_renew_at:
            self._token_value = node_token(self._issuer)
            self._token_renew_at = now + max(self._issuer.ttl_s - NODE_TOKEN_RENEW_S, 1)
        return self._token_value

    def _renew_token(self) -> None:
        self._token_renew_at = 0.0

    # ------------------------------------------------------------------ requests

    async def _request(
        self, cmd: p.Command, asked: _Asked, *, timeout_s: float = REQUEST_TIMEOUT_S
    ) -> p.Command:
        """Send ``cmd`` (its token and request id are set here) and return the reply.

        A reply saying the token expired gets one more try with a fresh token.

        Raises:
            OwnerUnavailable: the link broke or the owner did not answer in
                ``timeout_s`` (the link is then closed).
            LimitExceeded: the request is too large for one frame.
            StoreClosed: the store was closed.
        """
        for attempt in range(2):
            if self._issuer is not None:
                cmd = _with_token(cmd, self._token())
            link = await self._current_link(asked.name)
            link.requests += 1
            try:
                reply = await link.conn.request(cmd, timeout_s=timeout_s)
            except ConnectionLost as exc:
                raise self._lost(asked.name, exc) from exc
            except LocalProtocolError as exc:
                size = _encoded_size(cmd)
                if size > p.MAX_FRAME_BYTES:
                    what = f"{type(cmd).__name__} frame bytes"
                    raise LimitExceeded(what, p.MAX_FRAME_BYTES, size) from exc
                raise StoreError(
                    f"segment {asked.name!r}: the wire cannot carry it: {exc}"
                ) from exc
            except RequestTimeout:
                await self._drop_link(link, f"no answer to {type(cmd).__name__}")
                raise OwnerUnavailable(asked.name, f"no answer from {self._peer}") from None
            finally:
                link.requests -= 1
                if not link.usable:
                    self._close_if_unused(link)
            if not (_expired(reply) and attempt == 0):
                return reply
            self._renew_token()
            cmd = replace(cmd, request_id=next_request_id())  # type: ignore[type-var]
        raise AssertionError("unreachable")

    async def _call(
        self,
        cmd: p.Command,
        expect: type[_T],
        asked: _Asked,
        *,
        timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> _T:
        """``_request``, raising the store error of any reply but an ``expect``."""
        reply = await self._request(cmd, asked, timeout_s=timeout_s)
        if not isinstance(reply, expect):
            raise _error(reply, asked)
        return reply

    # ------------------------------------------------------------------ names and lengths

    def _wire_name(self, name: str, *, creating: bool = False) -> None:
        """Refuse a name the wire cannot carry.

        Raises:
            LimitExceeded: over ``MAX_NAME_BYTES``, when creating.
            SegmentNotFound: over ``MAX_NAME_BYTES`` otherwise (none can exist).
            StoreError: a lone surrogate (not UTF-8).
        """
        try:
            check_name(name)
        except LimitExceeded:
            if creating:
                raise
            raise SegmentNotFound(name) from None
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise StoreError(
                f"segment name {name!r} holds a lone surrogate: the wire protocol cannot carry it"
            ) from None

    def _learn_length(self, name: str, length: int) -> None:
        lengths = self._lengths
        known = lengths.get(name)
        if known is None or length > known:
            lengths[name] = length
            lengths.move_to_end(name)
            if len(lengths) > MAX_KNOWN_LENGTHS:
                lengths.popitem(last=False)

    def _forget_length(self, name: str) -> None:
        self._lengths.pop(name, None)

    async def _stat(self, name: str) -> p.StreamSegmentInfo:
        self._wire_name(name)
        reply = await self._call(
            p.GetStreamSegmentInfo(next_request_id(), name),
            p.StreamSegmentInfo,
            _Asked(name),
        )
        if not reply.exists:
            self._forget_length(name)
            raise SegmentNotFound(name)
        self._learn_length(name, reply.write_offset)
        return reply

    # ------------------------------------------------------------------ segments

    async def create_segment(self, name: str, *, kind: SegmentKind = SegmentKind.STREAM) -> None:
        self._check_open()
        self._wire_name(name, creating=True)
        cmd: p.Command
        if kind is SegmentKind.TABLE:
            cmd = p.CreateTableSegment(next_request_id(), name)
        else:
            cmd = p.CreateSegment(next_request_id(), name, 0, 0)
        await self._call(cmd, p.SegmentCreated, _Asked(name))
        self._forget_length(name)

    async def append(
        self,
        name: str,
        data: bytes | memoryview,
        *,
        expected_offset: int | None = None,
        writer: WriterAppend | None = None,
    ) -> AppendResult:
        """Forward an append; see the module docstring for how it travels."""
        self._check_open()
        size = data.nbytes if isinstance(data, memoryview) else len(data)
        if size > MAX_APPEND_BYTES:
            raise LimitExceeded("append bytes", MAX_APPEND_BYTES, size)
        if expected_offset is not None and size > MAX_CONDITIONAL_APPEND_BYTES:
            raise LimitExceeded("conditional append bytes", MAX_CONDITIONAL_APPEND_BYTES, size)
        if self._checks:
            for prefix, check in self._checks.items():
                if name.startswith(prefix):
                    reason = check(data)
                    if reason is not None:
                        raise AppendRefused(name, reason)
        session = self._session(name, writer)
        future: asyncio.Future[p.Command | AppendResult] = (
            asyncio.get_running_loop().create_future()
        )
        append = _Append(name, data, size, expected_offset, writer, future)
        session.submit(append)
        # A door may start this call inline, outside any task (``server/_inline.py``),
        # where ``asyncio.timeout`` cannot run: the append is sent, so suspend once
        # (the owner's answer is a round trip away anyway) and time out from there.
        await asyncio.sleep(0)
        try:
            async with asyncio.timeout(APPEND_REPLY_TIMEOUT_S):
                link = session.link
                if append.request_id and link is not None:
                    # Sent: wait while the link holds more than its high-water mark of
                    # bytes the owner has not taken (a lost link fails the append itself).
                    with contextlib.suppress(ConnectionLost):
                        await link.conn.drain()
                reply = await future
        except TimeoutError:
            link = session.link
            if not session.abandon(append) and link is not None:
                await self._drop_link(link, "an append was not answered")
            raise OwnerUnavailable(name, f"no answer from {self._peer}") from None
        return await self._append_result(append, reply)

    def _session(self, name: str, writer: WriterAppend | None) -> _Session:
        """The session an append goes in (made, and an idle one forgotten, if needed).

        Raises:
            SegmentNotFound, StoreError: a name the wire cannot carry.
        """
        if writer is None:
            session = self._plain.get(name)
            if session is None:
                self._wire_name(name)
                writer_id = uuid.uuid5(self._forwarder_id, name)
                session = self._plain[name] = _Session(self, writer_id, plain=True)
                self._trim_sessions(self._plain)
            else:
                self._plain.move_to_end(name)
            return session
        session = self._writers.get(writer.writer_id)
        if session is None:
            self._wire_name(name)
            session = self._writers[writer.writer_id] = _Session(
                self, writer.writer_id, plain=False
            )
            self._trim_sessions(self._writers)
        else:
            if session.segment != name:
                self._wire_name(name)
            self._writers.move_to_end(writer.writer_id)
        return session

    def _trim_sessions(self, sessions: OrderedDict[Any, _Session]) -> None:
        if len(sessions) <= MAX_SESSIONS:
            return
        for key, session in list(sessions.items()):
            if len(sessions) <= MAX_SESSIONS:
                return
            if not session.busy:
                del sessions[key]
                if session.link is not None:
                    self._detach(session.link, session)
                    session.link = None

    async def _append_result(
        self, append: _Append, reply: p.Command | AppendResult
    ) -> AppendResult:
        if isinstance(reply, AppendResult):
            return reply
        name = append.name
        if isinstance(reply, p.DataAppended):
            length = reply.current_segment_write_offset
            writer = append.writer
            if writer is None:
                return AppendResult(length - append.size, length)
            previous = reply.previous_event_number
            if writer.event_number <= previous:
                return AppendResult(length, length, previous, duplicate=True)
            return AppendResult(length - append.size, length, previous)
        if isinstance(reply, p.ConditionalCheckFailed):
            assert append.expected_offset is not None
            actual = -1
            with contextlib.suppress(StoreError):
                actual = (await self._stat(name)).write_offset
            raise BadOffset(name, append.expected_offset, actual)
        raise _error(reply, _Asked(name))

    def _answer_duplicate(self, append: _Append, held: int) -> None:
        """Answer a retry the owner holds already, as the store would: a duplicate
        (unless the segment is a table or sealed)."""

        async def answer() -> None:
            try:
                info = await self._info(append.name)
                if info.kind is not SegmentKind.STREAM:
                    raise SegmentTypeMismatch(append.name, SegmentKind.STREAM.value)
                if info.sealed:
                    raise SegmentSealed(append.name, info.length)
            except StoreError as exc:
                _fail(append.future, exc)
                return
            if not append.future.done():
                append.future.set_result(AppendResult(info.length, info.length, held, True))

        self._spawn(answer())

    async def read(self, name: str, offset: int, max_bytes: int) -> ReadResult:
        """Up to ``max_bytes`` (at most the owner's 2 MiB per reply) from ``offset``, at once."""
        self._check_open()
        self._wire_name(name)
        known = self._lengths.get(name, -1)
        for _ in range(2):
            if max_bytes > 0 and offset < known:
                result = await self._read_segment(name, offset, max_bytes)
                if result is not None:
                    return result
                self._forget_length(name)  # the bytes went away (deleted and made anew)
            stat = await self._stat(name)
            if offset < stat.start_offset:
                raise SegmentTruncated(name, stat.start_offset)
            if offset > stat.write_offset:
                raise BadOffset(name, offset, stat.write_offset)
            if offset == stat.write_offset or max_bytes <= 0:
                at_tail = offset == stat.write_offset
                return ReadResult(offset, b"", at_tail, at_tail and stat.is_sealed)
            known = stat.write_offset
        return ReadResult(offset, b"", True, False)

    async def _read_segment(self, name: str, offset: int, max_bytes: int) -> ReadResult | None:
        """One ``ReadSegment`` where bytes are known to be; None if it came back
        empty (they are not there after all)."""
        asked = min(max_bytes, READ_REPLY_BYTES)
        reply = await self._call(
            p.ReadSegment(name, offset, asked, request_id=next_request_id()),
            p.SegmentRead,
            _Asked(name, read=True),
            timeout_s=READ_TIMEOUT_S,
        )
        data = reply.data
        if not data and not reply.end_of_segment:
            return None
        at_tail, end = reply.at_tail, reply.end_of_segment
        if at_tail:
            self._learn_length(name, offset + len(data))
        if len(data) > max_bytes:  # the owner sends at least a few bytes
            data, at_tail, end = data[:max_bytes], False, False
        return ReadResult(offset, data if type(data) is bytes else bytes(data), at_tail, end)

    async def read_region(
        self, name: str, offset: int, max_bytes: int, *, min_region_bytes: int = 0
    ) -> ReadResult | RegionRead:
        """``read``: the owner's files are not here to send from."""
        return await self.read(name, offset, max_bytes)

    async def _wait_once(self, name: str, offset: int, timeout_s: float) -> bool:
        """One ``ReadSegment`` at ``offset``, parked by the owner until bytes are
        there or the segment is sealed (True), or its hold ran out (False)."""
        try:
            reply = await self._call(
                p.ReadSegment(name, offset, WAIT_READ_BYTES, request_id=next_request_id()),
                p.SegmentRead,
                _Asked(name, read=True),
                timeout_s=timeout_s,
            )
        except SegmentTruncated:
            return True  # bytes are there, below the start: the read says so
        if reply.data:
            self._learn_length(name, offset + 1)
        return bool(reply.data) or reply.end_of_segment

    async def wait_for_data(self, name: str, offset: int, timeout_s: float) -> bool:
        self._check_open()
        self._wire_name(name)
        if offset < self._lengths.get(name, -1):
            return True
        timeout_s = min(timeout_s, MAX_WAIT_S)
        if not timeout_s > 0:
            stat = await self._stat(name)
            return stat.is_sealed or stat.write_offset > offset
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            try:
                async with asyncio.timeout(remaining):
                    if await self._wait_once(name, offset, READ_TIMEOUT_S):
                        return True
            except TimeoutError:
                return False

    def watch(self, name: str, offset: int, wake: asyncio.Future[None]) -> bool:
        """Register ``wake`` for bytes at ``offset`` (or a seal); False if known to be there.

        Whether the segment is ready is known only from the owner, so unless
        an earlier answer showed bytes at ``offset`` the future is registered
        and resolved once the owner answered a wait there: when bytes came,
        the segment was sealed, deleted or merged away, or the owner became
        unreachable (the woken caller checks again and sees which), or when
        the store closes. One wait serves every future watching the same offset.

        Raises:
            StoreClosed.
        """
        self._check_open()
        if offset < self._lengths.get(name, -1):
            return False
        offsets = self._watches.setdefault(name, {})
        watch = offsets.get(offset)
        if watch is None:
            watch = offsets[offset] = _Watch()
            watch.task = asyncio.create_task(self._watch(name, offset, watch), name="watch")
        watch.wakes[wake] = None
        return True

    async def _watch(self, name: str, offset: int, watch: _Watch) -> None:
        try:
            self._wire_name(name)
            while not await self._wait_once(name, offset, READ_TIMEOUT_S):
                pass
        except StoreError:
            pass  # the woken callers find out what happened by checking again
        finally:
            offsets = self._watches.get(name)
            if offsets is not None and offsets.get(offset) is watch:
                del offsets[offset]
                if not offsets:
                    del self._watches[name]
            for wake in watch.wakes:
                if not wake.done():
                    wake.set_result(None)

    def unwatch(self, name: str, wake: asyncio.Future[None]) -> None:
        offsets = self._watches.get(name)
        if offsets is None:
            return
        for offset, watch in list(offsets.items()):
            watch.wakes.pop(wake, None)
            if not watch.wakes:
                del offsets[offset]
                if watch.task is not None:
                    watch.task.cancel()  # the owner's parked read is answered to nobody
        if not offsets:
            del self._watches[name]

    async def info(self, name: str) -> SegmentInfo:
        """The segment's metadata; ``attributes`` is always empty (the wire cannot list them).

        Asks for the segment's info and, at the same time, its table info:
        whether the latter is answered tells the kind.
        """
        self._check_open()
        return await self._info(name)

    async def _info(self, name: str) -> SegmentInfo:
        self._wire_name(name)
        stat, table = await asyncio.gather(
            self._stat(name),
            self._request(p.GetTableSegmentInfo(next_request_id(), name), _Asked(name)),
            return_exceptions=True,
        )
        if isinstance(stat, BaseException):
            raise stat
        if isinstance(table, OwnerUnavailable | StoreClosed):
            raise table
        kind = SegmentKind.TABLE if isinstance(table, p.TableSegmentInfo) else SegmentKind.STREAM
        return SegmentInfo(
            name,
            kind,
            stat.start_offset,
            stat.write_offset,
            stat.is_sealed,
            stat.last_modified,
        )

    async def seal(self, name: str) -> int:
        self._check_open()
        self._wire_name(name)
        await self._call(p.SealSegment(next_request_id(), name), p.SegmentSealed, _Asked(name))
        return (await self._stat(name)).write_offset  # final now: the reply does not carry it

    async def truncate(self, name: str, offset: int) -> None:
        self._check_open()
        self._wire_name(name)
        await self._call(
            p.TruncateSegment(next_request_id(), name, offset), p.SegmentTruncated, _Asked(name)
        )

    async def delete(self, name: str) -> None:
        self._check_open()
        self._wire_name(name)
        self._forget_length(name)
        await self._call(p.DeleteSegment(next_request_id(), name), p.SegmentDeleted, _Asked(name))

    async def merge(self, target: str, source: str) -> int:
        self._check_open()
        self._wire_name(target)
        self._wire_name(source)
        if target == source:
            raise StoreError(f"cannot merge segment {source!r} into itself")
        for prefix in self._checks:
            if target.startswith(prefix) and not source.startswith(prefix):
                raise AppendRefused(target, f"a merge from {source!r}, outside {prefix!r}")
        asked = _Asked(target, (source,))
        try:
            reply = await self._call(
                p.MergeSegments(next_request_id(), target, source), p.SegmentsMerged, asked
            )
        except SegmentNotFound:
            # The reply names the target whichever was missing: ask which.
            await self._stat(target)
            raise SegmentNotFound(source) from None
        self._forget_length(source)
        self._learn_length(target, reply.new_target_write_offset)
        return reply.new_target_write_offset

    def check_appends(self, prefix: str, check: AppendCheck) -> None:
        """Run ``check`` here on every append (and merge) under ``prefix`` before it is sent."""
        self._checks[prefix] = check

    async def get_attribute(self, name: str, attribute_id: UUID) -> int:
        self._check_open()
        self._wire_name(name)
        reply = await self._call(
            p.GetSegmentAttribute(next_request_id(), name, attribute_id),
            p.SegmentAttribute,
            _Asked(name),
        )
        return reply.value

    async def update_attribute(
        self, name: str, attribute_id: UUID, new_value: int, expected_value: int
    ) -> bool:
        self._check_open()
        self._wire_name(name)
        reply = await self._call(
            p.UpdateSegmentAttribute(
                next_request_id(), name, attribute_id, new_value, expected_value
            ),
            p.SegmentAttributeUpdated,
            _Asked(name),
        )
        return reply.success

    async def append_times(self, name: str, offset: int, end: int) -> list[tuple[int, int]]:
        """The owner's time index entries covering ``[offset, end)`` (``ReadSegmentTimes``)."""
        self._check_open()
        self._wire_name(name)
        reply = await self._call(
            p.ReadSegmentTimes(next_request_id(), name, offset, end),
            p.SegmentTimesRead,
            _Asked(name),
        )
        times = reply.times
        return list(zip(times[0::2], times[1::2], strict=True))

    async def offset_at_time(self, name: str, time_ms: int) -> int:
        """Where the events appended at or after ``time_ms`` begin, from the owner's
        whole time index (at most ``MAX_TIME_INDEX_ENTRIES`` entries)."""
        info = await self.info(name)
        entries = await self.append_times(name, 0, info.length)
        found = TimeIndex(entries).offset_at(time_ms)
        if found is None:
            return info.length
        return min(max(found, info.start_offset), info.length)

    async def list_segments(self) -> list[str]:
        """Refused: the wire has no request listing segments (the owner's store lists them).

        Raises:
            StoreError, StoreClosed.
        """
        self._check_open()
        raise StoreError(f"a remote store cannot list the segments of {self._peer}")

    # ------------------------------------------------------------------ tables

    async def create_table(self, name: str) -> None:
        await self.create_segment(name, kind=SegmentKind.TABLE)

    async def delete_table(self, name: str, *, must_be_empty: bool = False) -> None:
        self._check_open()
        self._wire_name(name)
        self._forget_length(name)
        await self._call(
            p.DeleteTableSegment(next_request_id(), name, must_be_empty),
            p.SegmentDeleted,
            _Asked(name),
        )

    async def _length_condition(self, name: str, expected_length: int | None) -> int:
        """``expected_length`` as the wire's ``table_segment_offset``; a negative one
        (which the wire reads as "none") fails here as the store fails it."""
        if expected_length is None:
            return p.NULL_TABLE_SEGMENT_OFFSET
        if expected_length < 0:
            raise BadOffset(name, expected_length, (await self.table_info(name)).length)
        return expected_length

    async def update_table(
        self,
        name: str,
        updates: Sequence[TableUpdate],
        *,
        expected_length: int | None = None,
    ) -> list[int]:
        self._check_open()
        self._wire_name(name)
        _check_keys(name, [u.key for u in updates])
        _check_batch_size([u.key for u in updates], [u.value for u in updates])
        offset = await self._length_condition(name, expected_length)
        entries = p.TableEntries(
            tuple((p.TableKey(u.key, u.expected_version), p.TableValue(u.value)) for u in updates)
        )
        cmd = p.UpdateTableEntries(next_request_id(), name, "", entries, offset)
        reply = await self._request(cmd, _Asked(name))
        if isinstance(reply, p.TableEntriesUpdated):
            return list(reply.versions)
        error = _error(reply, _Asked(name))
        if isinstance(error, TableKeyNotFound | TableKeyBadVersion):
            conditional = [u for u in updates if u.expected_version != NO_VERSION]
            index = await self._versions(name, [u.key for u in conditional])
            error = _first_failure(
                error, lambda: check_updates(name, index, conditional, 1 << 62, 1 << 62)
            )
        raise error

    async def remove_table_keys(
        self,
        name: str,
        keys: Sequence[TableKey],
        *,
        expected_length: int | None = None,
    ) -> None:
        self._check_open()
        self._wire_name(name)
        _check_keys(name, [k.key for k in keys])
        _check_batch_size([k.key for k in keys], None)
        offset = await self._length_condition(name, expected_length)
        cmd = p.RemoveTableKeys(
            next_request_id(), name, "", tuple(p.TableKey(k.key, k.version) for k in keys), offset
        )
        reply = await self._request(cmd, _Asked(name))
        if isinstance(reply, p.TableKeysRemoved):
            return
        error = _error(reply, _Asked(name))
        if isinstance(error, TableKeyNotFound | TableKeyBadVersion):
            conditional = [k for k in keys if k.version != NO_VERSION]
            index = await self._versions(name, [k.key for k in conditional])
            error = _first_failure(error, lambda: check_removals(name, index, conditional, 1 << 62))
        raise error

    async def _versions(self, name: str, keys: list[bytes]) -> TableIndex:
        """An index holding the current versions of ``keys`` (values left out), to
        tell which condition of a refused batch failed, as the store checks them."""
        index = TableIndex()
        with contextlib.suppress(StoreError):
            for entry in await self.get_table_entries(name, keys):
                if entry is not None:
                    index.entries[entry.key] = (entry.version, b"")
        return index

    async def get_table_entries(self, name: str, keys: Sequence[bytes]) -> list[TableEntry | None]:
        self._check_open()
        self._wire_name(name)
        _check_keys(name, keys)
        if not keys:
            await self.table_info(name)  # the owner checks nothing for no keys
            return []
        chunks = [
            keys[i : i + TABLE_READ_KEYS_PER_REQUEST]
            for i in range(0, len(keys), TABLE_READ_KEYS_PER_REQUEST)
        ]
        replies = await asyncio.gather(
            *(
                self._call(
                    p.ReadTable(next_request_id(), name, "", tuple(p.TableKey(k) for k in chunk)),
                    p.TableRead,
                    _Asked(name),
                )
                for chunk in chunks
            )
        )
        found: list[TableEntry | None] = []
        for reply in replies:
            for key, value in reply.entries.entries:
                absent = key.version == p.NOT_EXISTS
                found.append(None if absent else TableEntry(key.key, value.value, key.version))
        return found

    async def iterate_table_keys(
        self, name: str, *, continuation_token: bytes = b"", max_count: int
    ) -> TablePage[TableKey]:
        self._check_open()
        self._wire_name(name)
        reply = await self._call(
            p.ReadTableKeys(
                next_request_id(),
                name,
                "",
                max_count,
                p.TableIteratorArgs(continuation_token=continuation_token),
            ),
            p.TableKeysRead,
            _Asked(name),
        )
        return TablePage([TableKey(k.key, k.version) for k in reply.keys], reply.continuation_token)

    async def iterate_table_entries(
        self, name: str, *, continuation_token: bytes = b"", max_count: int
    ) -> TablePage[TableEntry]:
        self._check_open()
        self._wire_name(name)
        reply = await self._call(
            p.ReadTableEntries(
                next_request_id(),
                name,
                "",
                max_count,
                p.TableIteratorArgs(continuation_token=continuation_token),
            ),
            p.TableEntriesRead,
            _Asked(name),
        )
        return TablePage(_entries(reply.entries), reply.continuation_token)

    async def read_table_delta(self, name: str, from_position: int, max_count: int) -> TableDelta:
        self._check_open()
        self._wire_name(name)
        reply = await self._call(
            p.ReadTableEntriesDelta(next_request_id(), name, "", from_position, max_count),
            p.TableEntriesDeltaRead,
            _Asked(name),
        )
        return TableDelta(
            _entries(reply.entries), reply.last_position, reply.reached_end, reply.should_clear
        )

    async def table_info(self, name: str) -> TableInfo:
        self._check_open()
        self._wire_name(name)
        reply = await self._call(
            p.GetTableSegmentInfo(next_request_id(), name), p.TableSegmentInfo, _Asked(name)
        )
        return TableInfo(name, reply.start_offset, reply.length, reply.entry_count)

    # ------------------------------------------------------------------ lifecycle

    @property
    def failure(self) -> str | None:
        """Always None: an owner out of reach is not this node's failure."""
        return None

    async def flush(self) -> None:
        """Ask the owner to make everything it acknowledged durable now (FlushToStorage)."""
        await self._call(p.FlushToStorage(0, "", next_request_id()), p.StorageFlushed, _Asked(""))

    async def close(self) -> None:
        """Let appends already called finish (for a bounded time), then close the link.

        Waits parked on the owner end with ``StoreClosed``; watchers are woken.
        """
        if self._closed:
            return
        self._closed = True
        sessions = [*self._writers.values(), *self._plain.values()]
        pending: list[asyncio.Future[Any]] = [s.pump for s in sessions if s.pump is not None]
        for session in sessions:
            pending += [a.future for a in session.in_flight.values()]
            pending += [a.future for a in session.waiting]
        if pending:
            await asyncio.wait(pending, timeout=CLOSE_APPENDS_TIMEOUT_S)
        if self._background:  # duplicates being answered
            await asyncio.wait(list(self._background), timeout=CLOSE_APPENDS_TIMEOUT_S)
        self._shut = True
        for offsets in list(self._watches.values()):
            for watch in list(offsets.values()):
                if watch.task is not None:
                    watch.task.cancel()
        links = list(self._links)
        self._links.clear()
        self._link = None
        for link in links:
            await link.conn.aclose()
        rest = list(self._background)
        for task in rest:
            task.cancel()
        if rest:
            await asyncio.wait(rest, timeout=CLOSE_APPENDS_TIMEOUT_S)


def _entries(entries: p.TableEntries) -> list[TableEntry]:
    return [TableEntry(k.key, v.value, k.version) for k, v in entries.entries]


def _with_token(cmd: p.Command, token: str) -> p.Command:
    return replace(cmd, delegation_token=token)  # type: ignore[type-var]


def _check_keys(name: str, keys: Sequence[bytes]) -> None:
    """Refuse the empty table key: the wire writes an empty key without its version
    (Java's layout), so no reply could say the empty key's version.

    Raises:
        StoreError.
    """
    if any(not key for key in keys):
        raise StoreError(f"table {name!r}: the empty key cannot travel on the wire")


def _check_batch_size(keys: Sequence[bytes], values: Sequence[bytes] | None) -> None:
    """Refuse a table batch over ``MAX_TABLE_BATCH_BYTES`` here, as the store would
    (a key or value over its limit first): no frame could carry it to the owner.

    ``values`` is None for a removal batch.

    Raises:
        LimitExceeded.
    """
    records = RECORD_HEADER.size * len(keys) + sum(len(k) for k in keys)
    if values is not None:
        records += sum(len(v) for v in values)
    if records <= MAX_TABLE_BATCH_BYTES:
        return
    for key in keys:
        if len(key) > MAX_TABLE_KEY_BYTES:
            raise LimitExceeded("table key bytes", MAX_TABLE_KEY_BYTES, len(key))
    for value in values or ():
        if len(value) > MAX_TABLE_VALUE_BYTES:
            raise LimitExceeded("table value bytes", MAX_TABLE_VALUE_BYTES, len(value))
    raise LimitExceeded("table batch bytes", MAX_TABLE_BATCH_BYTES, records)


def _encoded_size(cmd: p.Command) -> int:
    """Bytes ``cmd``'s frame would take, limit or not."""
    try:
        return len(p.encode_command(cmd, max_frame_bytes=1 << 62))
    except LocalProtocolError:
        return -1


def _first_failure(fallback: StoreError, check: Callable[[], None]) -> StoreError:
    """The error ``check`` raises (the store's own condition checks, against the
    versions read after the refusal), else ``fallback``."""
    try:
        check()
    except (TableKeyNotFound, TableKeyBadVersion) as exc:
        return exc
    return fallback


def _consume(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()
