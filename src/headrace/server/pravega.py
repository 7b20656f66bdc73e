"""The Pravega segment-store front door: wire commands in, store calls, replies out.

Protocol: ``docs/protocols/pravega.md`` (``pravega.md#...`` below names its
anchors). The connection loop (``_loop.py``) runs each received event as its
own task, in arrival order; this module adds what a front door may add
(``docs/architecture.md#front-doors``):

* ``PravegaHandler``: the sans-I/O ``PravegaConnection`` (which already
  answers Hello, echoes KeepAlive, checks frame order and writer sessions and
  reassembles every append form into one ``AppendData``), one **dispatch
  table** ``DISPATCH`` (command type -> coroutine calling the store) and one
  **error table** ``STORE_ERROR_REPLIES`` (store error -> reply command);
* ``start_segment_store``: the ``segment_store`` listener's starter.

Behaviour the client depends on, and where it is kept:

* **Durable, ordered acks** (pravega.md#append-sessions): an append's store call is issued before
  the handler's first ``await`` (the store fixes the offset when the call is
  issued, so wire order is storage order), unless the connection's append
  room (``MAX_APPEND_BYTES_IN_FLIGHT``) is used up, in which case appends
  are let in strictly in arrival order; ``DataAppended`` is sent only after
  the call returned (durable), and a writer's acks wait for its previous
  ack, so they leave in event-number order.
* **Dedup survives restarts**: the store keeps each writer's last event
  number as a segment attribute, in the same durable step as the data;
  ``SetupAppend`` answers it, and a retried append at or below it is
  acknowledged without being stored again.
* **Tail reads park** (pravega.md#reads): a read at the tail waits on
  ``store.wait_for_data`` for at most ``READ_HOLD_S`` (well under the
  client's 30 s request timeout) and then gets an empty reply, so idle
  readers do not spin. Each read is its own task: a parked read never stalls
  appends or other requests on the same or other connections.
* **Large frames land where they are decoded**: once the header of a frame
  of ``LARGE_FRAME_BYTES`` or more has arrived, the loop receives the rest
  straight into a buffer of the frame's size (``frame_buffer``, see
  ``_frames.LargeFrames``), and the append data goes to the store as a view
  of it: the bytes are not copied after the kernel's copy into that buffer.
* **Bounded buffers**: read replies a client has not taken yet, and the
  data of reads issued to the store for them, are capped together
  (``MAX_UNSENT_REPLY_BYTES``): a read takes room for the most it may
  return *before* it is issued (``_reserve``), so a client pipelining reads
  it never takes holds at most that much; further reads wait, and a client
  that takes nothing for ``MAX_REPLY_WAIT_S`` is dropped. A read parked at
  the tail holds no room. Append data in flight is capped too.
* **Never unsolicited** (pravega.md#request-ids): every frame we send answers one the client sent.
* **Error replies echo** the request id and the segment name exactly as the
  client sent them (pravega.md#errors).
* **Bad input** (garbage, unknown types, frames over 16 MiB, an append before
  SetupAppend, a reply sent as a request) is the connection's
  ``RemoteProtocolError``: the loop writes its reply hint if it has one,
  logs and closes this connection only.
* **Delegation tokens** (auth on, ``token_key``): every request is checked
  against its token before it is dispatched (``PravegaHandler._check_token``);
  a refused one gets ``AuthTokenCheckFailed`` with TOKEN_EXPIRED (the client
  fetches a fresh token and retries) or TOKEN_CHECK_FAILED, and the
  connection stays open.
* **Internal segments are the nodes' own**: a request changing one
  (``PROTECTED_REQUESTS``) is carried out only with a node token (another
  node forwarding its controller's or TANK's tables), signed with the token
  key, or with auth off with the cluster secret (``node_key``); anyone else
  gets ``OperationUnsupported``.
* **Reply texts are bounded** (``p.reply_text``): a text quoting a segment
  name cuts a long one, so a reply about a name near the wire's 64 KiB
  string limit can still be encoded.
* **The empty table key** cannot travel (the wire writes it without its
  version; Pravega's tables hold none): a request naming it gets
  ``ErrorMessage`` (illegal argument), and iterations and deltas of a table
  that holds it (written through the store) leave it out.
* **Appends only after an accepted SetupAppend**: a writer's session opens
  when we send ``AppendSetup`` (the connection's rule), so a refused
  SetupAppend leaves its appends to close the connection; and every append
  is checked again against the segment its writer's accepted SetupAppend
  named (``_setups``) before its store call. As in Java, a writer's token
  is checked (expiry included) at SetupAppend, not on each append.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import ssl
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final, TypeVar

from headrace.controller.naming import TRANSIENT_INFIX, is_internal_segment
from headrace.errors import (
    AppendRefused,
    BadOffset,
    LimitExceeded,
    OwnerUnavailable,
    RemoteProtocolError,
    SegmentExists,
    SegmentNotFound,
    SegmentSealed,
    SegmentTruncated,
    SegmentTypeMismatch,
    StoreError,
    TableKeyBadVersion,
    TableKeyNotFound,
    TableNotEmpty,
)
from headrace.protocols import pravega as p
from headrace.protocols._buffer import HANDOVER_MIN_BYTES
from headrace.protocols.pravega.auth import (
    Permission,
    TokenClaims,
    TokenError,
    TokenInvalid,
    decode_token,
    resource_covers,
    segment_resource,
)
from headrace.server._context import Listener, ListenerContext, ListenerSettings
from headrace.server._frames import LargeFrames
from headrace.server._listen import NO_SETTINGS, start_tcp_listener
from headrace.server._loop import ConnectionHandler, OutputPiece
from headrace.store.api import SegmentStore, TimeIndexed

if TYPE_CHECKING:  # the cluster modules load kazoo: only with --cluster
    from headrace.server.cluster_node import Owner
from headrace.types import (
    AppendResult,
    FileRegion,
    ReadResult,
    RegionRead,
    TableDelta,
    TableEntry,
    TableKey,
    TablePage,
    TableUpdate,
    WriterAppend,
)

__all__ = [
    "DISPATCH",
    "MAX_READ_REPLY_BYTES",
    "MAX_TABLE_ITEMS_PER_REPLY",
    "MAX_TOKENS_PER_CONNECTION",
    "PROTECTED_REQUESTS",
    "READ_HOLD_S",
    "READ_REQUESTS",
    "STORE_ERROR_REPLIES",
    "PravegaHandler",
    "serve_segment_store",
    "start_segment_store",
]

log = logging.getLogger(__name__)

_T = TypeVar("_T")
_Item = TypeVar("_Item", TableKey, TableEntry)

READ_HOLD_S = 10.0
"""How long a read at the tail of an open segment is parked before it gets an
empty reply. Well under the client's 30 s request timeout (after which it
drops the connection), long enough that an idle reader sends a few reads a
minute instead of thousands a second (pravega.md#reads)."""

MAX_READ_REPLY_BYTES = 2 * 1024 * 1024
"""Most data in one SegmentRead: the Java server's cap (pravega.md#reads). Clients loop for
more, and a smaller reply bounds the memory one request holds."""

MIN_READ_REPLY_BYTES = 8
"""Java serves at least this much when asked for less (``max(8, suggested)``, pravega.md#reads)."""

MIN_REGION_BYTES = 64 * 1024
"""Reads at least this large go out with ``sendfile`` from the data file (on
plain TCP); smaller ones are copied, which is cheaper than opening the file
for them. Also the size from which read data is written as it is instead of
being copied into the reply frame."""

MAX_TABLE_ITEMS_PER_REPLY = 10_000
"""Most keys or entries one table iteration or delta reply carries, whatever
the client suggests; the store also caps a reply at about 2 MiB (pravega.md#table-semantics)."""

MAX_UNSENT_REPLY_BYTES = 8 * 1024 * 1024
"""Bytes of read replies a connection may have queued that the writer has not
taken yet, together with the most the reads issued to the store for further
replies may return. A client that sends reads but does not read the replies
would otherwise make the server read and buffer without bound (each reply
may be 2 MiB, and 256 requests may be pending); beyond this, reads wait
before they are issued, for the writer, whose drain waits for the client.
Four full replies keep a fast reader's pipe full."""

TABLE_READ_ROOM_BYTES: Final = MAX_READ_REPLY_BYTES
"""Room a table read takes under ``MAX_UNSENT_REPLY_BYTES`` before it is
issued: the store caps an iteration or delta reply at about 2 MiB. A reply
that turns out larger (ReadTable of many large values) waits, holding its
room, until the writer has taken everything queued."""

TABLE_READ_KEYS_PER_FETCH: Final = 16
"""Keys a ReadTable fetches from the store at once: sixteen of the largest
values make one full frame, so a request whose reply cannot fit one frame is
refused after reading about that much, whatever number of keys it names."""

TABLE_ENTRY_OVERHEAD_BYTES: Final = 32
"""Bytes a TableRead entry takes beside its key and value (lengths, version;
rounded up), for telling whether a reply fits one frame before encoding it."""

TABLE_READ_REPLY_OVERHEAD_BYTES: Final = 64
"""Bytes a TableRead takes beside its segment name and entries (frame header,
request id, counts; rounded up)."""


class _ReplyTooLarge(Exception):
    """A requested reply would not fit one wire frame; the request is refused."""


MAX_APPEND_BYTES_IN_FLIGHT = 64 * 1024 * 1024
"""Append data one connection may have issued to the store and not yet seen
durable: eight full Rust batches (8 MiB each). Beyond it appends wait their
turn in arrival order (so the wire order is still the storage order), and a
client pipelining large appends cannot make the server hold gigabytes."""

MAX_REPLY_WAIT_S = 60.0
"""Longest a read reply waits for room under ``MAX_UNSENT_REPLY_BYTES``. A
client that takes none of its replies for this long is disconnected (any
live reader takes a reply within its 30 s request timeout)."""


LARGE_FRAME_BYTES = HANDOVER_MIN_BYTES
"""Frames at least this large are received into a buffer of their own (see
the module docstring); smaller ones are copied once from the listener's
receive buffer into the codec's, which costs less than a buffer each."""

MAX_TOKENS_PER_CONNECTION = 16
"""Delegation tokens whose signature a connection remembers having checked
(their expiry is still checked on every command). A client sends one token
per stream it works on; a connection sending more only costs an HMAC each."""

EMPTY_KEY: Final = "a table key cannot be empty"
"""The ``ErrorMessage`` text of a table request naming the empty key."""


class _AckTurn:
    """One append's place in its writer's acknowledgement order.

    The next append of the same writer waits for it only if it is still
    unanswered when that one is ready to reply; the future it waits on is
    made then, so an append answered before the next one arrives (nearly
    all of them) costs no future.
    """

    __slots__ = ("_waiter", "done")

    def __init__(self) -> None:
        self.done = False
        self._waiter: asyncio.Future[None] | None = None

    def wait(self) -> asyncio.Future[None]:
        if self._waiter is None:
            self._waiter = asyncio.get_running_loop().create_future()
        return self._waiter

    def finish(self) -> None:
        self.done = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def cancel(self) -> None:
        """The connection closed: whoever waits for this turn is cancelled."""
        if self._waiter is None:
            self._waiter = asyncio.get_running_loop().create_future()
        self._waiter.cancel()


class PravegaHandler(ConnectionHandler):
    """One segment-store connection: a ``PravegaConnection`` and the store.

    Args:
        store: the store every command is carried out against.
        read_hold_s: how long a tail read is parked (``READ_HOLD_S``).
        max_append_bytes_in_flight: ``MAX_APPEND_BYTES_IN_FLIGHT``.
        token_key: the key delegation tokens are signed with; when given
            (auth on) every request must carry a valid token covering its
            segments (``check_token``); None: tokens are ignored, but for
            node tokens.
        node_key: with auth off, the key node tokens are checked with (the
            cluster secret): a request changing an internal segment is carried
            out only with a node token signed with it; None (and auth off):
            never. With auth on, node tokens are ``token_key``'s.
        on_refused: called with the reason of every refused token
            (``unidentified``, ``bad_credentials``, ``permission_denied``):
            the server's metrics.
        owner_of: in a cluster, who serves a segment now
            (``ClusterNode.owner_of``); a request naming a segment this node
            does not serve gets ``WrongHost`` (``_wrong_host``). None: every
            segment is served here.
    """

    name = "pravega"

    def __init__(
        self,
        store: SegmentStore,
        *,
        read_hold_s: float = READ_HOLD_S,
        max_append_bytes_in_flight: int = MAX_APPEND_BYTES_IN_FLIGHT,
        token_key: bytes | None = None,
        node_key: bytes | None = None,
        on_refused: Callable[[str], None] | None = None,
        owner_of: Callable[[str], Owner] | None = None,
    ) -> None:
        self._store = store
        self._owner_of = owner_of
        self._token_key = token_key
        self._node_key = token_key if token_key is not None else node_key
        self._on_refused = on_refused
        self._tokens: dict[str, TokenClaims] = {}  # signatures checked on this connection
        self._read_hold_s = read_hold_s
        # Append admission: room left, appends waiting in arrival order, and
        # appends admitted from the queue that have not issued their store call yet.
        self._append_room_max = max_append_bytes_in_flight
        self._append_room = max_append_bytes_in_flight
        self._admissions: deque[tuple[int, asyncio.Future[None]]] = deque()
        self._admitted_waking = 0
        self._conn = p.PravegaConnection(p.Role.SERVER)
        self._frames = LargeFrames(self._conn, LARGE_FRAME_BYTES)
        self._out: list[OutputPiece] = []
        """Output in order ahead of what the connection has queued: replies whose
        data goes out as it is (a file region or a large buffer) and, after a
        protocol error, the last replies and the error's."""
        self._failed = False
        # Per writer on this connection: the last event number acknowledged
        # (DataAppended.previous_event_number), and the ack the next one waits for.
        # Keyed by the writer id's ``int``: hashed in C (a UUID's hash is a Python call).
        self._last_acked: dict[int, int] = {}
        self._ack_tail: dict[int, _AckTurn] = {}
        # Per writer (id's ``int``): the segment its accepted SetupAppend named
        # (with auth on, one its token covered with READ_UPDATE). At most one
        # per writer session of the connection: a new SetupAppend removes it.
        self._setups: dict[int, str] = {}
        self._parked: set[asyncio.Task[object]] = set()  # tasks of reads parked at the tail
        self._unsent_bytes = 0  # data of read replies queued since the writer last took them
        self._reserved_bytes = 0  # room taken by reads issued to the store, not yet queued
        self._room = asyncio.Event()  # set when the writer takes the queued bytes or room is freed

    # ------------------------------------------------------------------ loop interface

    def feed(self, data: bytes) -> Iterator[object]:
        frames = self._frames
        if frames.pending:  # bytes that did not come through frame_buffer
            if not data:  # EOF inside the frame: its bytes go back for the codec to judge
                frames.give_back()
            else:
                taken = frames.fill(data)
                yield from self.frame_received(taken)
                data = data[taken:]
                if not data:
                    return
        self._conn.receive_data(data)
        yield from self._conn.events()
        frames.start()

    def frame_buffer(self) -> memoryview | None:
        return self._frames.view()

    def frame_received(self, nbytes: int) -> Iterator[object]:
        if self._frames.received(nbytes):  # whole: adopted by the codec, decoded in place
            yield from self._conn.events()
            self._frames.start()

    def partial_frame_bytes(self) -> int:
        return self._frames.held_bytes or self._conn.buffered_bytes

    def inline(self, event: object) -> bool:
        # An append issues its store call in its first step and, under fsync
        # never, is usually acknowledged without suspending at all.
        return isinstance(event, p.AppendData | p.KeepAlive)

    async def handle(self, event: object) -> None:
        if isinstance(event, p.AppendData):
            await self._append(event)
            return
        if isinstance(event, p.ConnectionClosed):
            # Nobody will read the replies of parked reads: stop waiting now
            # rather than hold the connection open for the rest of the hold.
            for task in self._parked:
                task.cancel()
            return
        if isinstance(event, p.Hello | p.KeepAlive):
            return  # the connection answered them itself
        assert isinstance(event, p.Command)
        if type(event) is p.SetupAppend:  # the connection ended the writer's session too
            self._setups.pop(event.writer_id.int, None)
        if self._token_key is not None:
            refusal = self._check_token(event)
            if refusal is not None:
                if self._on_refused is not None:
                    self._on_refused(self._refusal_reason(event))
                log.warning(
                    "pravega: refused %s on %s: %s",
                    type(event).__name__,
                    event.segment_or_none,
                    refusal,
                )
                self._reply(
                    p.AuthTokenCheckFailed(
                        event.request_id_or_default,
                        p.reply_text(str(refusal), _segments_named(event)),
                        refusal.error_code,
                    )
                )
                return
        internal = _internal_target(event)
        if internal is not None and not self._from_node(event):
            log.warning(
                "pravega: refused %s on internal segment %s: no node token",
                type(event).__name__,
                internal,
            )
            self._reply(
                p.OperationUnsupported(
                    event.request_id_or_default,
                    f"{type(event).__name__} on an internal segment",
                )
            )
            return
        if self._owner_of is not None and self._wrong_host(event):
            return
        action = DISPATCH.get(type(event))
        try:
            if action is None:
                self._reply(
                    p.OperationUnsupported(event.request_id_or_default, type(event).__name__)
                )
            else:
                await action(self, event)
        except StoreError as exc:
            self._reply(_error_reply(exc, event, event.segment_or_none or ""))

    def _wrong_host(self, request: p.Command) -> bool:
        """Answer ``WrongHost`` if a segment ``request`` names is not served here.

        As Pravega's segment store does: the reply names the owner's
        segment-store endpoint, or no host when nobody serves the segment
        right now (a move in course, a dead owner, this node fenced); either
        way the client asks the controller again (``getURI``) and retries.
        """
        assert self._owner_of is not None
        for name in _segments_named(request):
            if not name:
                continue
            owner = self._owner_of(name)
            if not owner.local:
                host = _host_of(owner)
                _WRONG_HOSTS.note(name, host)
                self._reply(p.WrongHost(request.request_id_or_default, name, host, ""))
                return True
        return False

    def _claims(self, request: p.Command, key: bytes) -> TokenClaims:
        """The claims of ``request``'s delegation token, checked with ``key``
        (a signature checked before on this connection is not checked again).

        Raises:
            TokenError: no token, a bad one, or an expired one.
        """
        token = getattr(request, "delegation_token", "")
        claims = self._tokens.get(token)
        now = time.time()
        try:
            if claims is None or claims.expires_at_s <= now:
                claims = decode_token(key, token, now_s=now)
                if len(self._tokens) >= MAX_TOKENS_PER_CONNECTION:
                    self._tokens.clear()
                self._tokens[token] = claims
        except TokenError:
            self._tokens.pop(token, None)
            raise
        return claims

    def _from_node(self, request: p.Command) -> bool:
        """Whether ``request`` carries a valid node token (another node of the
        cluster, signed with the key every node shares)."""
        if self._node_key is None:
            return False
        try:
            return self._claims(request, self._node_key).node
        except TokenError:
            return False

    def _check_token(self, request: p.Command) -> TokenError | None:
        """Why ``request``'s delegation token does not allow it; None if it does.

        A node token allows every request. Any other token must be well
        signed, not expired, name a resource covering the stream of every
        segment the request names, and carry READ for ``READ_REQUESTS`` or
        READ_UPDATE for anything else. Appends are covered by their
        SetupAppend. A request naming no segment (FlushToStorage, as Java's
        is checked against the empty resource only its internal token
        covers) or an internal one has no stream to be covered by, so only a
        node token allows it.
        """
        assert self._token_key is not None
        try:
            claims = self._claims(request, self._token_key)
        except TokenError as exc:
            return exc
        if claims.node:
            return None
        if type(request) is p.FlushToStorage:
            return TokenInvalid("FlushToStorage names no segment: only a node token allows it")
        needed = Permission.READ if type(request) in READ_REQUESTS else Permission.READ_UPDATE
        if claims.permission < needed:
            return TokenInvalid(f"{type(request).__name__} needs {needed.name}")
        for segment in _segments_named(request):
            resource = segment_resource(segment)
            if resource is None or not resource_covers(claims.resource, resource):
                return TokenInvalid(f"the token does not cover segment {segment!r}")
        return None

    def _refusal_reason(self, request: p.Command) -> str:
        """The metrics reason of a token ``_check_token`` just refused: none sent,
        one that did not decode (or expired), or a good one that does not allow this."""
        token = getattr(request, "delegation_token", "")
        if not token:
            return "unidentified"
        return "permission_denied" if token in self._tokens else "bad_credentials"

    def output(self) -> list[OutputPiece]:
        self._unsent_bytes = 0
        self._room.set()
        pieces, self._out = self._out, []
        if not self._failed:
            queued = self._conn.data_to_send()
            if queued:
                pieces.append(queued)
        return pieces

    def data_to_send(self) -> bytes:
        parts: list[bytes | bytearray | memoryview] = []
        for piece in self.output():
            if isinstance(piece, FileRegion):
                with piece:
                    parts.append(piece.read())
            else:
                parts.append(piece)
        return b"".join(parts)

    def _has_room(self, size_bytes: int) -> bool:
        """Whether a read of up to ``size_bytes`` may be issued now (one always
        may when nothing is queued or being read)."""
        held = self._unsent_bytes + self._reserved_bytes
        return not held or held + size_bytes <= MAX_UNSENT_REPLY_BYTES

    async def _reserve(self, size_bytes: int) -> None:
        """Take room for a read reply of up to ``size_bytes`` under
        ``MAX_UNSENT_REPLY_BYTES`` before the read is issued, waiting for it if
        needed. The caller gives it back with ``_unreserve`` or turns it into
        a queued reply with ``_queue_reserved``.

        Raises:
            TimeoutError: the client took no replies for ``MAX_REPLY_WAIT_S``;
                the loop closes the connection.
        """
        while not self._has_room(size_bytes):
            await self._wait_for_room()
        self._reserved_bytes += size_bytes

    def _unreserve(self, size_bytes: int) -> None:
        self._reserved_bytes -= size_bytes
        self._room.set()

    def _queue_room(self, reserved_bytes: int, size_bytes: int) -> None:
        """Turn the room of a read into the ``size_bytes`` (no more) of its reply,
        queued next."""
        self._reserved_bytes -= reserved_bytes
        self._unsent_bytes += size_bytes
        if size_bytes < reserved_bytes:
            self._room.set()

    async def _queue_reserved(self, reserved_bytes: int, size_bytes: int) -> None:
        """Turn the room of a read into the ``size_bytes`` of its reply, queued next.

        A reply larger than its room waits, holding the room, until it fits
        or the writer has taken everything queued (so that two such replies
        never wait for each other). The room is given back if it raises.

        Raises:
            TimeoutError: as ``_reserve``.
        """
        try:
            while (
                size_bytes > reserved_bytes
                and self._unsent_bytes
                and self._unsent_bytes + self._reserved_bytes - reserved_bytes + size_bytes
                > MAX_UNSENT_REPLY_BYTES
            ):
                await self._wait_for_room()
        except BaseException:
            self._unreserve(reserved_bytes)
            raise
        self._queue_room(reserved_bytes, size_bytes)

    async def _wait_for_room(self) -> None:
        self._room.clear()
        self.wake_writer()
        try:
            await asyncio.wait_for(self._room.wait(), MAX_REPLY_WAIT_S)
        except TimeoutError:
            raise TimeoutError(f"the client took no replies for {MAX_REPLY_WAIT_S:.0f} s") from None

    def on_protocol_error(self, exc: RemoteProtocolError) -> None:
        # What was queued before the bad frame still goes out, then the hint.
        self._out.append(self._conn.data_to_send())
        if isinstance(exc.reply_hint, p.Command):
            self._out.append(p.encode_command(exc.reply_hint))
        self._failed = True

    async def on_close(self) -> None:
        for piece in self._out:  # never taken by the writer
            if isinstance(piece, FileRegion):
                piece.close()
        self._out.clear()
        for turn in self._ack_tail.values():
            turn.cancel()

    def _reply(self, cmd: p.Command) -> None:
        if self._failed:
            log.debug("pravega: dropping %s after a protocol error", type(cmd).__name__)
            return
        self._conn.send(cmd)

    # ----------------------------------------------------------------- appends (pravega.md#appends)

    async def _append(self, ev: p.AppendData) -> None:
        """Append, then acknowledge in the writer's order (pravega.md#append-sessions).

        The common case (room to append, the writer's earlier acks sent, the
        store acknowledging without waiting) runs through without suspending
        and without creating a future: each step below that may wait is
        taken only when it must.
        """
        writer_id = ev.writer_id
        key = writer_id.int
        if self._setups.get(key) != ev.segment:
            self._refuse_append(ev)
            return
        if self._owner_of is not None:
            owner = self._owner_of(ev.segment)
            if not owner.local:  # moved or fenced since the SetupAppend
                host = _host_of(owner)
                _WRONG_HOSTS.note(ev.segment, host)
                self._reply(p.WrongHost(ev.request_id, ev.segment, host, ""))
                return
        tail = self._ack_tail
        before = tail.get(key)
        mine = tail[key] = _AckTurn()
        size = len(ev.data)
        if size > self._append_room_max:
            size = self._append_room_max
        try:
            if self._admissions or self._admitted_waking or size > self._append_room:
                # Other appends wait or the room is used up: let in in arrival order.
                await self._admit(size)
            else:
                self._append_room -= size
            outcome: AppendResult | StoreError
            try:
                # The store fixes the offset as the call is issued: wire order is kept.
                outcome = await self._store.append(
                    ev.segment,
                    ev.data,
                    expected_offset=ev.expected_offset,
                    writer=WriterAppend(writer_id, ev.last_event_number, ev.event_count),
                )
            except StoreError as exc:
                outcome = exc
            finally:
                self._append_room += size
                if self._admissions:
                    self._release(0)
            if before is not None and not before.done:
                await before.wait()  # the writer's earlier acks go first
            self._reply_append(ev, outcome)
        finally:
            mine.finish()
            if tail.get(key) is mine:
                del tail[key]

    def _refuse_append(self, ev: p.AppendData) -> None:
        """An append whose writer has no accepted SetupAppend for its segment
        (the connection refuses those first): not stored, the token refused."""
        log.warning(
            "pravega: refused an append of writer %s to %s: no accepted SetupAppend",
            ev.writer_id,
            ev.segment,
        )
        self._reply(
            p.AuthTokenCheckFailed(
                ev.request_id,
                "append without an accepted SetupAppend",
                p.AuthTokenCheckFailed.TOKEN_CHECK_FAILED,
            )
        )

    async def _admit(self, size: int) -> None:
        """Take ``size`` bytes of append room, waiting in arrival order if needed.

        Returns without suspending when there is room and nobody waits, so
        the store call that follows is issued in wire order.
        """
        if not self._admissions and not self._admitted_waking and size <= self._append_room:
            self._append_room -= size
            return
        admitted = asyncio.get_running_loop().create_future()
        self._admissions.append((size, admitted))
        try:
            await admitted
        except asyncio.CancelledError:
            if admitted.done() and not admitted.cancelled():  # let in, then cancelled
                self._admitted_waking -= 1
                self._release(size)
            raise
        self._admitted_waking -= 1

    def _release(self, size: int) -> None:
        """Give back append room and let waiting appends in, first come first."""
        self._append_room += size
        while self._admissions and self._admissions[0][0] <= self._append_room:
            wanted, admitted = self._admissions.popleft()
            if admitted.done():  # cancelled while waiting
                continue
            self._append_room -= wanted
            self._admitted_waking += 1
            admitted.set_result(None)

    def _reply_append(self, ev: p.AppendData, outcome: AppendResult | StoreError) -> None:
        if type(outcome) is AppendResult:  # the common case first: one type check
            writer_id = ev.writer_id
            number = ev.last_event_number
            acked = self._last_acked.get(writer_id.int, outcome.previous_event_number)
            if number < acked:
                return  # a retry of something already acknowledged on this connection
            self._last_acked[writer_id.int] = number
            if self._failed:
                log.debug("pravega: dropping DataAppended after a protocol error")
                return
            self._conn.send_data_appended(writer_id, number, acked, ev.request_id, outcome.length)
        elif isinstance(outcome, BadOffset):
            self._reply(p.ConditionalCheckFailed(ev.writer_id, ev.last_event_number, ev.request_id))
        else:
            assert isinstance(outcome, StoreError)
            self._reply(_error_reply(outcome, None, ev.segment, request_id=ev.request_id))

    async def _setup_append(self, cmd: p.SetupAppend) -> None:
        last = await self._store.get_attribute(cmd.segment, cmd.writer_id)
        self._last_acked[cmd.writer_id.int] = last
        self._reply(p.AppendSetup(cmd.request_id, cmd.segment, cmd.writer_id, last))
        if not self._failed:  # the reply opened the writer's session
            self._setups[cmd.writer_id.int] = cmd.segment

    async def _create_transient(self, cmd: p.CreateTransientSegment) -> None:
        await self._store.info(cmd.parent_segment)  # NoSuchSegment for a missing parent
        name = f"{cmd.parent_segment}{TRANSIENT_INFIX}{cmd.writer_id.hex}.{secrets.token_hex(16)}"
        await self._store.create_segment(name)
        self._reply(p.SegmentCreated(cmd.request_id, name))

    # ------------------------------------------------------------------ reads (pravega.md#reads)

    async def _read(self, cmd: p.ReadSegment, size: int) -> ReadResult | RegionRead:
        """The store's answer: a file region to ``sendfile`` when the connection
        can and the read is large, else bytes."""
        if self.sendfile_ok:
            return await self._store.read_region(
                cmd.segment, cmd.offset, size, min_region_bytes=MIN_REGION_BYTES
            )
        return await self._store.read(cmd.segment, cmd.offset, size)

    async def _read_segment(self, cmd: p.ReadSegment) -> None:
        size = min(max(cmd.suggested_length, MIN_READ_REPLY_BYTES), MAX_READ_REPLY_BYTES)
        result = await self._read_with_room(cmd, size)
        if result is None:  # parked at the tail for the whole hold
            self._reply(p.SegmentRead(cmd.segment, cmd.offset, True, False, b"", cmd.request_id))
            return
        if isinstance(result, RegionRead):
            payload: FileRegion | bytes = result.region
            size_bytes = result.region.size_bytes
        else:
            payload = result.data
            size_bytes = len(payload)
        self._queue_room(size, size_bytes)
        if isinstance(payload, bytes) and size_bytes < MIN_REGION_BYTES:  # a tail read, mostly
            self._reply(
                p.SegmentRead(
                    cmd.segment,
                    cmd.offset,
                    result.at_tail,
                    result.end_of_segment,
                    payload,
                    cmd.request_id,
                )
            )
            return
        reply = p.SegmentRead(
            cmd.segment, cmd.offset, result.at_tail, result.end_of_segment, b"", cmd.request_id
        )
        self._reply_with_data(reply, payload, size_bytes)

    async def _read_with_room(
        self, cmd: p.ReadSegment, size: int
    ) -> ReadResult | RegionRead | None:
        """The store's answer to ``cmd``, read with room for ``size`` bytes taken
        first (``_reserve``) and still held; None if the read was parked at the
        tail for the whole hold (holding no room meanwhile)."""
        if self._has_room(size):  # nearly always: no coroutine for a wait not needed
            self._reserved_bytes += size
        else:
            await self._reserve(size)
        result: ReadResult | RegionRead | None
        try:
            result = await self._read(cmd, size)
        except BadOffset:  # beyond the tail: wait for the segment to get there
            result = None
        except BaseException:
            self._unreserve(size)
            raise
        if result is not None and (
            isinstance(result, RegionRead) or result.data or result.end_of_segment
        ):
            return result
        self._unreserve(size)  # a parked read holds no room
        task = asyncio.current_task()
        assert task is not None
        self._parked.add(task)
        try:
            arrived = await self._store.wait_for_data(cmd.segment, cmd.offset, self._read_hold_s)
        finally:
            self._parked.discard(task)
        if not arrived:
            return None
        await self._reserve(size)
        try:
            return await self._read(cmd, size)
        except BaseException:
            self._unreserve(size)
            raise

    def _reply_with_data(
        self, reply: p.SegmentRead, data: FileRegion | bytes, size_bytes: int
    ) -> None:
        """Queue ``reply`` (its empty bytes field standing for ``data``) so that a large
        ``data`` goes out as it is: a file region by ``sendfile``, bytes uncopied."""
        try:
            if self._failed:
                log.debug("pravega: dropping %s after a protocol error", type(reply).__name__)
            elif isinstance(data, bytes) and size_bytes < MIN_REGION_BYTES:
                self._conn.send(dataclasses.replace(reply, data=data))
            else:
                prefix, suffix = self._conn.send_split(reply, size_bytes)
                queued = self._conn.data_to_send()  # replies before this one go first
                if queued:
                    self._out.append(queued)
                self._out += (prefix, data, suffix)
                data = b""  # handed over: the writer closes the region
        finally:
            if isinstance(data, FileRegion):
                data.close()

    # --------------------------------------------------------------- segments (pravega.md#segments)

    async def _segment_info(self, cmd: p.GetStreamSegmentInfo) -> None:
        try:
            info = await self._store.info(cmd.segment_name)
        except SegmentNotFound:
            # Java's answer for a missing segment (pravega.md#segments), not NoSuchSegment.
            self._reply(
                p.StreamSegmentInfo(cmd.request_id, cmd.segment_name, False, True, True, 0, 0, 0)
            )
            return
        self._reply(
            p.StreamSegmentInfo(
                cmd.request_id,
                cmd.segment_name,
                True,
                info.sealed,
                False,
                info.last_modified_ms,
                info.length,
                info.start_offset,
            )
        )

    async def _create_segment(self, cmd: p.CreateSegment) -> None:
        await self._store.create_segment(cmd.segment)
        self._reply(p.SegmentCreated(cmd.request_id, cmd.segment))

    async def _seal_segment(self, cmd: p.SealSegment) -> None:
        await self._store.seal(cmd.segment)
        self._reply(p.SegmentSealed(cmd.request_id, cmd.segment))

    async def _delete_segment(self, cmd: p.DeleteSegment) -> None:
        await self._store.delete(cmd.segment)
        self._reply(p.SegmentDeleted(cmd.request_id, cmd.segment))

    async def _update_policy(self, cmd: p.UpdateSegmentPolicy) -> None:
        await self._store.info(cmd.segment)  # scaling policies are the controller's business
        self._reply(p.SegmentPolicyUpdated(cmd.request_id, cmd.segment))

    async def _truncate_segment(self, cmd: p.TruncateSegment) -> None:
        await self._store.truncate(cmd.segment, cmd.truncation_offset)
        self._reply(p.SegmentTruncated(cmd.request_id, cmd.segment))

    async def _merge_segments(self, cmd: p.MergeSegments) -> None:
        if cmd.attribute_updates:
            # Java applies them atomically with the merge; no client we serve sends them.
            self._reply(p.OperationUnsupported(cmd.request_id, "MergeSegments with attributes"))
            return
        length = await self._store.merge(cmd.target, cmd.source)
        self._reply(p.SegmentsMerged(cmd.request_id, cmd.target, cmd.source, length))

    async def _merge_batch(self, cmd: p.MergeSegmentsBatch) -> None:
        lengths = [await self._store.merge(cmd.target, source) for source in cmd.sources]
        self._reply(p.SegmentsBatchMerged(cmd.request_id, cmd.target, cmd.sources, tuple(lengths)))

    async def _flush_to_storage(self, cmd: p.FlushToStorage) -> None:
        await self._store.flush()
        self._reply(p.StorageFlushed(cmd.request_id))

    async def _read_times(self, cmd: p.ReadSegmentTimes) -> None:
        times: list[int] = []
        if isinstance(self._store, TimeIndexed):  # every store here; an index-less one: none
            for offset, ms in await self._store.append_times(cmd.segment, cmd.offset, cmd.end):
                times += (offset, ms)
        self._reply(p.SegmentTimesRead(cmd.request_id, cmd.segment, tuple(times)))

    # ----------------------------------------------------------- attributes (pravega.md#attributes)

    async def _get_attribute(self, cmd: p.GetSegmentAttribute) -> None:
        value = await self._store.get_attribute(cmd.segment_name, cmd.attribute_id)
        self._reply(p.SegmentAttribute(cmd.request_id, value))

    async def _update_attribute(self, cmd: p.UpdateSegmentAttribute) -> None:
        done = await self._store.update_attribute(
            cmd.segment_name, cmd.attribute_id, cmd.new_value, cmd.expected_value
        )
        self._reply(p.SegmentAttributeUpdated(cmd.request_id, done))

    # ------------------------------------------------------------------ tables (pravega.md#tables)

    async def _create_table(self, cmd: p.CreateTableSegment) -> None:
        await self._store.create_table(cmd.segment)
        self._reply(p.SegmentCreated(cmd.request_id, cmd.segment))

    async def _delete_table(self, cmd: p.DeleteTableSegment) -> None:
        await self._store.delete_table(cmd.segment, must_be_empty=cmd.must_be_empty)
        self._reply(p.SegmentDeleted(cmd.request_id, cmd.segment))

    def _refuse_empty_key(
        self,
        cmd: p.UpdateTableEntries | p.RemoveTableKeys | p.ReadTable,
        keys: Sequence[p.TableKey],
    ) -> bool:
        """Refuse a request naming the empty table key (``ErrorMessage``, illegal
        argument); False if it names none. Pravega's tables hold no empty key
        (its segment store refuses a key of length 0), and the wire writes an
        empty key without its version, so no reply could carry one."""
        if all(key.key for key in keys):
            return False
        log.warning("pravega: refused %s on %s: %s", type(cmd).__name__, cmd.segment, EMPTY_KEY)
        self._reply(
            p.ErrorMessage(cmd.request_id, cmd.segment, EMPTY_KEY, p.ErrorMessage.ILLEGAL_ARGUMENT)
        )
        return True

    async def _update_table(self, cmd: p.UpdateTableEntries) -> None:
        if self._refuse_empty_key(cmd, [key for key, _ in cmd.table_entries.entries]):
            return
        updates = [
            TableUpdate(key.key, value.value, key.version)
            for key, value in cmd.table_entries.entries
        ]
        versions = await self._store.update_table(
            cmd.segment, updates, expected_length=_table_offset(cmd.table_segment_offset)
        )
        self._reply(p.TableEntriesUpdated(cmd.request_id, tuple(versions)))

    async def _remove_keys(self, cmd: p.RemoveTableKeys) -> None:
        if self._refuse_empty_key(cmd, cmd.keys):
            return
        keys = [TableKey(key.key, key.version) for key in cmd.keys]
        await self._store.remove_table_keys(
            cmd.segment, keys, expected_length=_table_offset(cmd.table_segment_offset)
        )
        self._reply(p.TableKeysRemoved(cmd.request_id, cmd.segment))

    async def _with_room(
        self, fetch: Callable[[], Awaitable[_T]], size_of: Callable[[_T], int]
    ) -> _T:
        """``fetch()``'s result (a table read), issued with ``TABLE_READ_ROOM_BYTES``
        of room taken first; its reply of ``size_of(result)`` bytes is queued next."""
        await self._reserve(TABLE_READ_ROOM_BYTES)
        try:
            result = await fetch()
        except BaseException:
            self._unreserve(TABLE_READ_ROOM_BYTES)
            raise
        await self._queue_reserved(TABLE_READ_ROOM_BYTES, size_of(result))
        return result

    async def _read_table(self, cmd: p.ReadTable) -> None:
        if self._refuse_empty_key(cmd, cmd.keys):
            return
        try:
            found = await self._with_room(
                lambda: self._table_entries(cmd),
                lambda found: _size_of([e for e in found if e is not None]),
            )
        except _ReplyTooLarge as exc:
            log.warning("pravega: refused ReadTable on %s: %s", cmd.segment, exc)
            self._reply(
                p.ErrorMessage(
                    cmd.request_id,
                    cmd.segment,
                    p.reply_text(str(exc)),
                    p.ErrorMessage.ILLEGAL_ARGUMENT,
                )
            )
            return
        entries = tuple(
            (p.TableKey(k.key, p.NOT_EXISTS), p.TableValue(b""))  # absent: version -1, empty
            if entry is None
            else (p.TableKey(entry.key, entry.version), p.TableValue(entry.value))
            for k, entry in zip(cmd.keys, found, strict=True)
        )
        self._reply(p.TableRead(cmd.request_id, cmd.segment, p.TableEntries(entries)))

    async def _table_entries(self, cmd: p.ReadTable) -> list[TableEntry | None]:
        """The entries of ``cmd.keys``, fetched ``TABLE_READ_KEYS_PER_FETCH`` at a time,
        so that a request for more than one frame can hold is refused after at most
        one frame's worth of values was read.

        Raises:
            _ReplyTooLarge: the reply would not fit one frame.
        """
        size = TABLE_READ_REPLY_OVERHEAD_BYTES + len(cmd.segment.encode())
        found: list[TableEntry | None] = []
        keys = [k.key for k in cmd.keys]
        for start in range(0, len(keys), TABLE_READ_KEYS_PER_FETCH):
            batch = keys[start : start + TABLE_READ_KEYS_PER_FETCH]
            entries = await self._store.get_table_entries(cmd.segment, batch)
            for key, entry in zip(batch, entries, strict=True):
                size += (
                    TABLE_ENTRY_OVERHEAD_BYTES
                    + len(key)
                    + (0 if entry is None else len(entry.value))
                )
            if size > p.MAX_FRAME_BYTES:
                raise _ReplyTooLarge(
                    f"the values of {len(keys)} keys do not fit one {p.MAX_FRAME_BYTES}-byte"
                    " reply: ask for fewer keys at a time"
                )
            found += entries
        return found

    async def _read_keys(self, cmd: p.ReadTableKeys) -> None:
        count = _item_count(cmd.suggested_key_count)
        page = await self._with_room(
            lambda: _wire_page(
                lambda token: self._store.iterate_table_keys(
                    cmd.segment, continuation_token=token, max_count=count
                ),
                cmd.args.continuation_token,
            ),
            lambda page: sum(len(k.key) for k in page.items),
        )
        keys = tuple(p.TableKey(k.key, k.version) for k in page.items)
        self._reply(p.TableKeysRead(cmd.request_id, cmd.segment, keys, page.continuation_token))

    async def _read_entries(self, cmd: p.ReadTableEntries) -> None:
        count = _item_count(cmd.suggested_entry_count)
        page = await self._with_room(
            lambda: _wire_page(
                lambda token: self._store.iterate_table_entries(
                    cmd.segment, continuation_token=token, max_count=count
                ),
                cmd.args.continuation_token,
            ),
            lambda page: _size_of(page.items),
        )
        self._reply(
            p.TableEntriesRead(
                cmd.request_id, cmd.segment, _entries(page.items), page.continuation_token
            )
        )

    async def _read_delta(self, cmd: p.ReadTableEntriesDelta) -> None:
        delta = await self._with_room(
            lambda: self._wire_delta(
                cmd.segment, cmd.from_position, _item_count(cmd.suggested_entry_count)
            ),
            lambda delta: _size_of(delta.entries),
        )
        self._reply(
            p.TableEntriesDeltaRead(
                cmd.request_id,
                cmd.segment,
                _entries(delta.entries),
                delta.should_clear,
                delta.reached_end,
                delta.last_position,
            )
        )

    async def _wire_delta(self, name: str, position: int, count: int) -> TableDelta:
        """The store's delta from ``position`` without the empty key (written by no
        wire client; the wire cannot carry its version). Where that leaves none
        of the entries read, the walk goes on from where it stopped, so a delta
        comes back empty only at the end of the log (each step moves forward)."""
        delta = await self._store.read_table_delta(name, position, count)
        clear = delta.should_clear
        entries = [entry for entry in delta.entries if entry.key]
        while (
            delta.entries
            and not entries
            and not delta.reached_end
            and delta.last_position > position
        ):
            position = delta.last_position
            delta = await self._store.read_table_delta(name, position, count)
            entries = [entry for entry in delta.entries if entry.key]
        if len(entries) == len(delta.entries) and delta.should_clear == clear:
            return delta
        return TableDelta(entries, delta.last_position, delta.reached_end, clear)

    async def _table_info(self, cmd: p.GetTableSegmentInfo) -> None:
        info = await self._store.table_info(cmd.segment_name)
        self._reply(
            p.TableSegmentInfo(
                cmd.request_id,
                cmd.segment_name,
                info.start_offset,
                info.length,
                info.entry_count,
                0,
            )
        )


async def _wire_page(
    fetch: Callable[[bytes], Awaitable[TablePage[_Item]]], token: bytes
) -> TablePage[_Item]:
    """``fetch(token)``'s page without the empty key (the wire cannot carry its
    version; no wire client writes it). A page that held nothing else is
    followed by the next one: clients stop at an empty page, so one comes back
    only at the end. A table holds the empty key once, first in key order."""
    page = await fetch(token)
    items = [item for item in page.items if item.key]
    if len(items) == len(page.items):
        return page
    if not items:
        page = await fetch(page.continuation_token)
        items = [item for item in page.items if item.key]
    return TablePage(items, page.continuation_token)


def _table_offset(table_segment_offset: int) -> int | None:
    return None if table_segment_offset == p.NULL_TABLE_SEGMENT_OFFSET else table_segment_offset


def _item_count(suggested: int) -> int:
    return min(max(suggested, 1), MAX_TABLE_ITEMS_PER_REPLY)


def _size_of(entries: Sequence[TableEntry]) -> int:
    return sum(len(e.key) + len(e.value) for e in entries)


def _entries(items: Sequence[TableEntry]) -> p.TableEntries:
    return p.TableEntries(
        tuple((p.TableKey(e.key, e.version), p.TableValue(e.value)) for e in items)
    )


# --------------------------------------------------------------------------- the two tables

_Action = Callable[[PravegaHandler, Any], Awaitable[None]]  # each takes its own command type

DISPATCH: dict[type[p.Command], _Action] = {
    p.SetupAppend: PravegaHandler._setup_append,
    p.CreateTransientSegment: PravegaHandler._create_transient,
    p.ReadSegment: PravegaHandler._read_segment,
    p.GetStreamSegmentInfo: PravegaHandler._segment_info,
    p.ReadSegmentTimes: PravegaHandler._read_times,
    p.CreateSegment: PravegaHandler._create_segment,
    p.SealSegment: PravegaHandler._seal_segment,
    p.DeleteSegment: PravegaHandler._delete_segment,
    p.UpdateSegmentPolicy: PravegaHandler._update_policy,
    p.TruncateSegment: PravegaHandler._truncate_segment,
    p.MergeSegments: PravegaHandler._merge_segments,
    p.MergeSegmentsBatch: PravegaHandler._merge_batch,
    p.FlushToStorage: PravegaHandler._flush_to_storage,
    p.GetSegmentAttribute: PravegaHandler._get_attribute,
    p.UpdateSegmentAttribute: PravegaHandler._update_attribute,
    p.CreateTableSegment: PravegaHandler._create_table,
    p.DeleteTableSegment: PravegaHandler._delete_table,
    p.UpdateTableEntries: PravegaHandler._update_table,
    p.RemoveTableKeys: PravegaHandler._remove_keys,
    p.ReadTable: PravegaHandler._read_table,
    p.ReadTableKeys: PravegaHandler._read_keys,
    p.ReadTableEntries: PravegaHandler._read_entries,
    p.ReadTableEntriesDelta: PravegaHandler._read_delta,
    p.GetTableSegmentInfo: PravegaHandler._table_info,
}
"""Request type -> what carries it out. Any other request (LocateOffset,
ListStorageChunks, MergeTableSegments, SealTableSegment: Java-only or removed
from Java) gets ``OperationUnsupported``."""


PROTECTED_REQUESTS: frozenset[type[p.Command]] = frozenset(
    {
        p.SetupAppend,  # appends need it, so no append reaches an internal segment
        p.CreateTransientSegment,
        p.CreateSegment,
        p.SealSegment,
        p.DeleteSegment,
        p.UpdateSegmentPolicy,
        p.TruncateSegment,
        p.MergeSegments,
        p.MergeSegmentsBatch,
        p.UpdateSegmentAttribute,
        p.CreateTableSegment,
        p.DeleteTableSegment,
        p.UpdateTableEntries,
        p.RemoveTableKeys,
    }
)
"""Requests that change a segment. Naming an internal segment
(``_system/…``: the controller's metadata tables, TANK's sequence-number
tables) in one of them gets ``OperationUnsupported``, unless it carries a
node token: only the servers of the cluster write there (this one with
direct store calls, another one forwarding its own over the wire), and the
model's in-memory mirror assumes nobody else does. Reads of internal
segments stay allowed with auth off (tools may inspect them); with auth on
only a node token covers them."""


READ_REQUESTS: frozenset[type[p.Command]] = frozenset(
    {
        p.ReadSegment,
        p.GetStreamSegmentInfo,
        p.ReadSegmentTimes,
        p.GetSegmentAttribute,
        p.LocateOffset,
        p.GetTableSegmentInfo,
        p.ReadTable,
        p.ReadTableKeys,
        p.ReadTableEntries,
        p.ReadTableEntriesDelta,
    }
)
"""Requests a READ delegation token allows (with auth on); every other request
needs READ_UPDATE."""


def _segments_named(request: p.Command) -> list[str]:
    """Every segment a request names: its segment, and a merge's sources."""
    names = [request.segment_or_none or ""]
    if isinstance(request, p.MergeSegments):
        names.append(request.source)
    elif isinstance(request, p.MergeSegmentsBatch):
        names.extend(request.sources)
    return names


def _host_of(owner: Owner) -> str:
    """``host:port`` of the owner's segment store for ``WrongHost``; empty if unknown."""
    address = owner.address("segment_store")
    return "" if address is None else f"{address[0]}:{address[1]}"


def _internal_target(request: p.Command) -> str | None:
    """The internal segment a changing request names, if any."""
    if type(request) not in PROTECTED_REQUESTS:
        return None
    return next((name for name in _segments_named(request) if is_internal_segment(name)), None)


def _offset_of(request: p.Command | None, default: int = -1) -> int:
    """The offset a request named (ReadSegment), for replies that echo it."""
    offset = getattr(request, "offset", None)
    return offset if isinstance(offset, int) else default


def _no_such_segment(e: SegmentNotFound, req: p.Command | None, rid: int, seg: str) -> p.Command:
    return p.NoSuchSegment(rid, seg, "", _offset_of(req))


def _already_exists(e: SegmentExists, req: p.Command | None, rid: int, seg: str) -> p.Command:
    return p.SegmentAlreadyExists(rid, seg, "")


def _sealed(e: SegmentSealed, req: p.Command | None, rid: int, seg: str) -> p.Command:
    return p.SegmentIsSealed(rid, seg, "", _offset_of(req, e.length))


def _truncated(e: SegmentTruncated, req: p.Command | None, rid: int, seg: str) -> p.Command:
    return p.SegmentIsTruncated(rid, seg, e.start_offset, "", _offset_of(req))


def _bad_offset(e: BadOffset, req: p.Command | None, rid: int, seg: str) -> p.Command:
    # Java's bad-offset path (truncation out of range, a table length condition):
    # SegmentIsTruncated(start_offset = what the store has, offset = what was asked).
    return p.SegmentIsTruncated(rid, seg, e.actual, "", e.expected)


def _key_absent(e: TableKeyNotFound, req: p.Command | None, rid: int, seg: str) -> p.Command:
    return p.TableKeyDoesNotExist(rid, seg, "")


def _bad_version(e: TableKeyBadVersion, req: p.Command | None, rid: int, seg: str) -> p.Command:
    return p.TableKeyBadVersion(rid, seg, "")


def _not_empty(e: TableNotEmpty, req: p.Command | None, rid: int, seg: str) -> p.Command:
    return p.TableSegmentNotEmpty(rid, seg, "")


def _illegal(e: StoreError, req: p.Command | None, rid: int, seg: str) -> p.Command:
    # The text quotes the name: bounded, or a long name could not be encoded.
    text = p.reply_text(str(e), [getattr(e, "name", seg)])
    return p.ErrorMessage(rid, seg, text, p.ErrorMessage.ILLEGAL_ARGUMENT)


WRONG_HOST_LOG_INTERVAL_S: Final = 10.0
"""At most one log line per this many seconds for the ``WrongHost`` answers: a
client that keeps asking the wrong node must not flood the log."""


class _WrongHostLog:
    """Logs ``WrongHost`` answers, the first at once, then one line per interval
    with how many were answered since."""

    def __init__(self) -> None:
        self._next = 0.0
        self._since = 0

    def note(self, name: str, host: str) -> None:
        now = time.monotonic()
        if now < self._next:
            self._since += 1
            return
        log.info(
            "segment store: WrongHost for %s (owner %s)%s",
            name,
            host or "none now",
            f", and {self._since} more since the last line" if self._since else "",
        )
        self._next = now + WRONG_HOST_LOG_INTERVAL_S
        self._since = 0


_WRONG_HOSTS: Final = _WrongHostLog()


def _wrong_host_reply(e: OwnerUnavailable, req: p.Command | None, rid: int, seg: str) -> p.Command:
    # Java's answer when the segment's container is not on this host: the
    # client asks the controller again and retries (pravega.md#errors).
    _WRONG_HOSTS.note(seg, "")
    return p.WrongHost(rid, seg, "", "")


STORE_ERROR_REPLIES: dict[type[StoreError], Callable[[Any, p.Command | None, int, str], p.Command]]
STORE_ERROR_REPLIES = {
    SegmentNotFound: _no_such_segment,
    SegmentExists: _already_exists,
    SegmentSealed: _sealed,
    SegmentTruncated: _truncated,
    BadOffset: _bad_offset,
    TableKeyNotFound: _key_absent,
    TableKeyBadVersion: _bad_version,
    TableNotEmpty: _not_empty,
    SegmentTypeMismatch: _illegal,
    LimitExceeded: _illegal,
    AppendRefused: _illegal,  # e.g. an event that is not a bundle into a TANK topic
    OwnerUnavailable: _wrong_host_reply,  # retriable: another node owns it, or nobody right now
}
"""Store error -> the reply command (Pravega's ``handleException``), built from
the error, the request (None for appends), the request id and the segment name
exactly as the client sent it. Reply texts are bounded (``p.reply_text``).
Any other store error (``StoreClosed``,
``StorageFull``, ``CorruptionError``) closes the connection, as Java does for
unknown failures; the client reconnects and retries."""


def _error_reply(
    exc: StoreError, request: p.Command | None, segment: str, *, request_id: int | None = None
) -> p.Command:
    if request_id is None:
        assert request is not None
        request_id = request.request_id_or_default
    for cls in type(exc).__mro__:
        build = STORE_ERROR_REPLIES.get(cls)
        if build is not None:
            return build(exc, request, request_id, segment)
    raise exc


# --------------------------------------------------------------------------- listener


async def serve_segment_store(
    store: SegmentStore,
    host: str,
    port: int,
    *,
    read_hold_s: float = READ_HOLD_S,
    settings: ListenerSettings = NO_SETTINGS,
    ssl_context: ssl.SSLContext | None = None,
    token_key: bytes | None = None,
    node_key: bytes | None = None,
    on_refused: Callable[[str], None] | None = None,
    owner_of: Callable[[str], Owner] | None = None,
    name: str = "segment_store",
) -> Listener:
    """Serve the segment-store protocol on (host, port) over ``store``; port 0 picks one.

    ``settings``: limits and metrics (``start_tcp_listener``).
    ``ssl_context``: serve TLS on the port (the Pravega client's ``tls://`` URIs).
    ``token_key``: require delegation tokens signed with it (auth on).
    ``node_key``: with auth off, let node tokens signed with it change internal segments.
    ``owner_of``: in a cluster, who serves a segment (``PravegaHandler``).
    ``name``: the listener's name in logs and metrics.

    Raises:
        OSError: the address could not be bound.
    """
    return await start_tcp_listener(
        name,
        host,
        port,
        lambda: PravegaHandler(
            store,
            read_hold_s=read_hold_s,
            token_key=token_key,
            node_key=node_key,
            on_refused=on_refused,
            owner_of=owner_of,
        ),
        settings=settings,
        ssl_context=ssl_context,
    )


async def start_segment_store(ctx: ListenerContext, host: str, port: int) -> Listener:
    """A ``segment_store`` listener of a ``ServerApp`` (default port 12345), over
    TLS when its context has an ``ssl_context``."""
    doors = ctx.door_auth
    name = ctx.listener_name("segment_store")
    return await serve_segment_store(
        ctx.own_store,
        host,
        port,
        settings=ctx.settings,
        ssl_context=ctx.ssl_context(),
        token_key=None if doors is None else doors.token_key,
        node_key=ctx.node_key,
        on_refused=None if doors is None else lambda reason: doors.refused(name, reason),
        owner_of=None if ctx.cluster is None else ctx.cluster.owner_of,
        name=name,
    )
