"""A sans-I/O Pravega segment-store connection: bytes in, events out; commands in, bytes out.

``PravegaConnection(Role.SERVER)`` is what ``headrace.server`` wraps around
each accepted socket; ``PravegaConnection(Role.CLIENT)`` is what our own
client wraps around each connection it opens. Neither does any I/O: the
caller feeds received bytes to :meth:`~PravegaConnection.receive_data`, takes
events from :meth:`~PravegaConnection.next_event`, hands commands to
:meth:`~PravegaConnection.send`, and writes out
:meth:`~PravegaConnection.data_to_send`.

What this layer owns (``docs/protocols/pravega.md``; ``pravega.md#...`` names
its anchors):

* framing and the frame size limit (via ``codec.py``), and the limit on bytes
  buffered while a frame is incomplete;
* the handshake (pravega.md#handshake): a client connection sends ``Hello`` itself when it is
  created; a server connection answers the client's ``Hello`` itself and
  echoes ``KeepAlive`` itself, so the server never sends either on its own;
* the order of frames (``states.py``);
* per-writer append sessions on the server (pravega.md#append-sessions): a writer may append
  only once the server accepted its ``SetupAppend`` on this connection (sent
  ``AppendSetup``); its last event number must not go backwards, Java's
  AppendBlock/PartialEvent/Padding framing is reassembled, and every append
  form is delivered as one :class:`AppendData`.

What it does not own: anything about segments (existence, lengths, sealing,
durability) and request/reply matching; those belong to the server and client.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import NoReturn, TypeVar
from uuid import UUID

from headrace.errors import LocalProtocolError, RemoteProtocolError
from headrace.protocols._buffer import ReceiveBuffer

from . import commands as c
from ._fast import decode_command, encode_command, encode_data_appended
from .codec import FRAME_HEADER, HEADER_SIZE_BYTES, MAX_FRAME_BYTES, encode_split
from .codec import encode_event as _encode_event
from .states import CLIENT_STREAM, SERVER_STREAM, Action, Input, Role, StreamState, classify

__all__ = [
    "MAX_BUFFERED_BYTES",
    "MAX_WRITERS_PER_CONNECTION",
    "OLDEST_COMPATIBLE_VERSION",
    "WIRE_VERSION",
    "AppendData",
    "ConnectionClosed",
    "ConnectionEvent",
    "PravegaConnection",
    "WriterSession",
]

WIRE_VERSION = 17
"""Highest wire version we speak: the Java server's (pravega.md#handshake). The Rust client (15)
accepts it."""

OLDEST_COMPATIBLE_VERSION = 5
"""Lowest wire version we accept: the same as Java and the Rust client (pravega.md#handshake)."""

MAX_BUFFERED_BYTES = 2 * MAX_FRAME_BYTES
"""Most received-but-unparsed bytes held per connection.

The caller drains events after each ``receive_data``, so what stays buffered
is at most one incomplete frame (< ``MAX_FRAME_BYTES``) plus the bytes of the
read that completes it; twice the frame limit leaves room for a read of up to
a whole frame while bounding memory per connection at 32 MiB.
"""

MAX_WRITERS_PER_CONNECTION = 16_384
"""Most writer sessions (SetupAppend) one connection may hold.

The Rust client opens one connection per segment writer; the Java client
multiplexes its writers for one server on one connection (pravega.md#java-append-blocks), a few per
segment it writes to. Sixteen thousand covers any real client while bounding
the per-connection table (about 2 MiB) against a peer inventing writer ids.
"""


_Frame = TypeVar("_Frame", bytes, tuple[bytes, bytes])
"""An encoding ``PravegaConnection._send`` is given: a whole frame, or one in two parts."""


_SEND_INPUTS: dict[type[c.Command], Input] = {}
"""``classify`` of each command class sent so far (a few dozen at most), so that
a send costs one lookup for it."""


def _encode_split(cmd: c.Command, size_bytes: int, max_frame_bytes: int) -> tuple[bytes, bytes]:
    """``encode_split`` with its arguments in order, for ``PravegaConnection._send``."""
    return encode_split(cmd, size_bytes, max_frame_bytes=max_frame_bytes)


@dataclass(frozen=True, slots=True)
class AppendData:
    """Bytes to append for a writer, whatever append form carried them (pravega.md#appends).

    Delivered by a server connection for AppendBlockEnd (the Rust client's
    form, data inline), AppendBlock + AppendBlockEnd (the Java client's form,
    reassembled), ConditionalAppend and ConditionalBlockEnd.

    Attributes:
        writer_id: the writer (also the attribute id of its last event number).
        segment: the segment the writer set up on this connection.
        data: the bytes to append, verbatim (Event frames for event writers,
            raw bytes for byte streams and large-event chunks); a read-only
            view of the received frame when it was large (not copied).
        event_count: number of events in ``data`` (1 for conditional appends).
        last_event_number: the writer's event number of the last event in ``data``.
        request_id: to echo in DataAppended / ConditionalCheckFailed.
        expected_offset: for a conditional append, the segment length the
            append requires; ``None`` for an unconditional one.
    """

    writer_id: UUID
    segment: str
    data: bytes | memoryview
    event_count: int
    last_event_number: int
    request_id: int
    expected_offset: int | None = None


@dataclass(frozen=True, slots=True)
class ConnectionClosed:
    """The peer closed its end; no more events will come."""


ConnectionEvent = c.Command | AppendData | ConnectionClosed
"""What :meth:`PravegaConnection.next_event` delivers."""


@dataclass(slots=True)
class WriterSession:
    """A server connection's view of one writer (pravega.md#append-sessions), opened by the server's
    ``AppendSetup``: a refused SetupAppend opens none.

    Attributes:
        segment: the segment named in the writer's accepted SetupAppend.
        last_event_number: the highest last event number received from it.
        last_acked: the highest event number acknowledged with DataAppended.
    """

    segment: str
    last_event_number: int = c.NULL_ATTRIBUTE_VALUE
    last_acked: int = c.NULL_ATTRIBUTE_VALUE


class PravegaConnection:
    """One end of a Pravega segment-store connection, without I/O.

    Args:
        role: ``Role.SERVER`` for an accepted connection, ``Role.CLIENT`` for
            one we opened. A client connection queues its ``Hello`` at once.
        high_version: highest wire version we speak (sent in our Hello).
        low_version: lowest wire version we accept.
        max_buffered_bytes: limit on received bytes not yet parsed.
        max_frame_bytes: largest frame accepted, header included.
        max_writers: most writer sessions on this connection (server).
    """

    def __init__(
        self,
        role: Role,
        *,
        high_version: int = WIRE_VERSION,
        low_version: int = OLDEST_COMPATIBLE_VERSION,
        max_buffered_bytes: int = MAX_BUFFERED_BYTES,
        max_frame_bytes: int = MAX_FRAME_BYTES,
        max_writers: int = MAX_WRITERS_PER_CONNECTION,
    ) -> None:
        self._role = role
        self._hello = c.Hello(high_version, low_version)
        self._max_frame_bytes = max_frame_bytes
        self._max_writers = max_writers
        self._buffer = ReceiveBuffer(max_buffered_bytes)
        self._outbound = bytearray()
        self._eof = False
        self._error: RemoteProtocolError | None = None
        self._peer_hello: c.Hello | None = None
        self._writers: dict[UUID, WriterSession] = {}
        self._held_block: c.AppendBlock | None = None
        # Our stream's table is checked on send, the peer's on receive.
        if role is Role.CLIENT:
            self._our_table, self._their_table = CLIENT_STREAM, SERVER_STREAM
        else:
            self._our_table, self._their_table = SERVER_STREAM, CLIENT_STREAM
        self._our_state = StreamState.START
        self._their_state = StreamState.START
        if role is Role.CLIENT:
            self._queue(self._hello)

    # ------------------------------------------------------------------ inspection

    @property
    def role(self) -> Role:
        return self._role

    @property
    def our_state(self) -> StreamState:
        """State of the stream we send."""
        return self._our_state

    @property
    def their_state(self) -> StreamState:
        """State of the stream we receive."""
        return self._their_state

    @property
    def peer_hello(self) -> c.Hello | None:
        """The peer's Hello once received (its version range), else ``None``."""
        return self._peer_hello

    @property
    def writers(self) -> Mapping[UUID, WriterSession]:
        """Server: the writer sessions whose SetupAppend was accepted on this
        connection (read-only view)."""
        return MappingProxyType(self._writers)

    # ------------------------------------------------------------------ receiving

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Add bytes received from the peer; ``b""`` means the peer closed (EOF).

        Nothing is parsed here: call :meth:`next_event` until it returns
        ``None`` after each call, so that at most one incomplete frame stays
        buffered (the buffered-bytes limit counts on it).

        Raises:
            FrameTooLarge: the unparsed bytes would exceed ``max_buffered_bytes``.
            LocalProtocolError: data after EOF.
        """
        if self._eof:
            raise LocalProtocolError("receive_data() after EOF")
        if not data:
            self._eof = True
            return
        try:
            self._buffer.feed(data)
        except RemoteProtocolError as exc:  # FrameTooLarge
            self._fail(exc)

    def receive_owned(self, data: bytearray) -> None:
        """Like :meth:`receive_data`, for bytes the caller gives away (not empty).

        A client that received a whole large frame into a ``bytearray`` of its
        own passes it here: with nothing else buffered it is parsed where it
        lies, and a large bytes field of the frame (a ``SegmentRead``'s data)
        comes out as a view of it, not a copy (``ReceiveBuffer.adopt``).

        Raises:
            FrameTooLarge: the unparsed bytes would exceed ``max_buffered_bytes``.
            LocalProtocolError: data after EOF, or no data.
        """
        if self._eof:
            raise LocalProtocolError("receive_owned() after EOF")
        if not data:
            raise LocalProtocolError("receive_owned() needs bytes; EOF is receive_data(b'')")
        try:
            self._buffer.adopt(data)
        except RemoteProtocolError as exc:  # FrameTooLarge
            self._fail(exc)

    def next_event(self) -> ConnectionEvent | None:
        """The next event, or ``None`` if more data is needed.

        Events are the peer's commands, except that a server connection turns
        every append form into :class:`AppendData` (and swallows AppendBlock
        until its AppendBlockEnd), and the end of input is
        :class:`ConnectionClosed` (returned again on every later call). A
        server has already answered Hello and KeepAlive when it delivers them;
        it must not answer them again.

        Raises:
            RemoteProtocolError: the peer broke the protocol. ``reply_hint`` is
                a command to encode (with ``encode_command``) and write before
                closing, or ``None`` to just close. Every later call raises the
                same error. Any other exception is a bug in this module.
        """
        if self._error is not None:
            raise self._error
        while True:
            if self._their_state is StreamState.CLOSED:
                return ConnectionClosed()
            try:
                cmd = decode_command(self._buffer, max_frame_bytes=self._max_frame_bytes)
            except RemoteProtocolError as exc:
                self._fail(exc)
            if cmd is None:
                if not self._eof:
                    return None
                if self._buffer:
                    self._fail(
                        RemoteProtocolError(
                            f"connection closed inside a frame ({len(self._buffer)} bytes)"
                        )
                    )
                self._transition_in(Input.EOF, "end of input")
                return ConnectionClosed()
            event = self._receive(cmd)
            if event is not None:
                return event

    def events(self) -> Iterator[ConnectionEvent]:
        """Every event available now; stops when more data is needed or after ConnectionClosed.

        Raises:
            RemoteProtocolError: as :meth:`next_event`.
        """
        while True:
            event = self.next_event()
            if event is None:
                return
            yield event
            if isinstance(event, ConnectionClosed):
                return

    def _receive(self, cmd: c.Command) -> ConnectionEvent | None:
        action = self._transition_in(classify(cmd), type(cmd).__name__)
        if action is Action.ANSWER_HELLO:
            assert isinstance(cmd, c.Hello)
            self._peer_hello = cmd
            if not self._compatible(cmd):
                # Java answers with its own Hello, then closes (pravega.md#handshake).
                self._fail(
                    RemoteProtocolError(
                        f"incompatible wire versions {cmd.low_version}..{cmd.high_version}",
                        reply_hint=self._hello,
                    )
                )
            self._queue(self._hello)
        elif action is Action.CHECK_HELLO:
            assert isinstance(cmd, c.Hello)
            self._peer_hello = cmd
            if not self._compatible(cmd):
                self._fail(
                    RemoteProtocolError(
                        f"server speaks wire versions {cmd.low_version}..{cmd.high_version}"
                    )
                )
        elif action is Action.ECHO:
            self._queue(c.KeepAlive())
        elif action is Action.SETUP_WRITER:
            assert isinstance(cmd, c.SetupAppend)
            # The writer asks again (maybe for another segment): its earlier
            # session ends now, and only the server's AppendSetup opens the
            # next one. Until then its appends close the connection, as
            # Java's do (they would go where the writer no longer means them
            # to, or where its new token may not allow).
            if self._writers.pop(cmd.writer_id, None) is None and (
                len(self._writers) >= self._max_writers
            ):
                self._fail(
                    RemoteProtocolError(f"more than {self._max_writers} writers on one connection")
                )
        elif action is Action.APPEND:
            return self._append(cmd)
        elif action is Action.HOLD_BLOCK:
            assert isinstance(cmd, c.AppendBlock)
            self._session(cmd.writer_id)
            self._held_block = cmd
            return None
        elif action is Action.APPEND_BLOCK:
            assert isinstance(cmd, c.AppendBlockEnd)
            return self._append_block(cmd)
        return cmd

    def _compatible(self, hello: c.Hello) -> bool:
        # The two version ranges overlap (Java's rule on both ends).
        return hello.low_version <= self._hello.high_version and (
            hello.high_version >= self._hello.low_version
        )

    # ------------------------------------------------------------------ appends (server)

    def _session(self, writer_id: UUID) -> WriterSession:
        session = self._writers.get(writer_id)
        if session is None:
            # Never set up, or its SetupAppend was refused (bad token, no such
            # segment) or not answered yet: Java closes the connection (pravega.md#append-sessions).
            self._fail(
                RemoteProtocolError(
                    f"append from writer {writer_id} without an accepted SetupAppend"
                )
            )
        return session

    def _advance(self, session: WriterSession, writer_id: UUID, event_number: int) -> None:
        if event_number < session.last_event_number:
            # Java: "Last event number went backwards", connection closed
            # (pravega.md#append-sessions).
            self._fail(
                RemoteProtocolError(
                    f"writer {writer_id}: event number {event_number} goes back from "
                    f"{session.last_event_number}"
                )
            )
        session.last_event_number = event_number

    def _append(self, cmd: c.Command) -> AppendData:
        if isinstance(cmd, c.AppendBlockEnd):
            return self._whole_append(cmd, cmd.data)
        data: bytes | memoryview
        if isinstance(cmd, c.ConditionalAppend):
            # the Event header is stored too (pravega.md#append-sessions)
            data = _encode_event(cmd.event.data)
        else:
            assert isinstance(cmd, c.ConditionalBlockEnd)
            data = cmd.data
        session = self._session(cmd.writer_id)
        self._advance(session, cmd.writer_id, cmd.event_number)
        return AppendData(
            cmd.writer_id,
            session.segment,
            data,
            1,
            cmd.event_number,
            cmd.request_id,
            expected_offset=cmd.expected_offset,
        )

    def _whole_append(self, cmd: c.AppendBlockEnd, data: bytes | memoryview) -> AppendData:
        session = self._session(cmd.writer_id)
        if cmd.num_events <= 0:
            self._fail(RemoteProtocolError(f"AppendBlockEnd with {cmd.num_events} events"))
        self._advance(session, cmd.writer_id, cmd.last_event_number)
        return AppendData(
            cmd.writer_id,
            session.segment,
            data,
            cmd.num_events,
            cmd.last_event_number,
            cmd.request_id,
        )

    def _append_block(self, end: c.AppendBlockEnd) -> AppendData:
        """Join a Java AppendBlock with its AppendBlockEnd (pravega.md#java-append-blocks)."""
        block = self._held_block
        assert block is not None
        self._held_block = None
        if end.writer_id != block.writer_id:
            self._fail(RemoteProtocolError("AppendBlockEnd for another writer than its block"))
        whole = end.size_of_whole_events
        if not 0 <= whole <= len(block.data):
            self._fail(
                RemoteProtocolError(
                    f"size_of_whole_events {whole} outside the block of {len(block.data)} bytes"
                )
            )
        data: bytes | memoryview = block.data[:whole]
        tail = block.data[whole:]
        if tail:
            # The block must end with exactly one PartialEvent or Padding frame.
            if len(tail) < HEADER_SIZE_BYTES:
                self._fail(RemoteProtocolError("append block ends inside a frame header"))
            type_code, length = FRAME_HEADER.unpack_from(tail)
            if HEADER_SIZE_BYTES + length != len(tail):
                self._fail(RemoteProtocolError("append block tail is not exactly one frame"))
            if type_code == c.CommandType.PARTIAL_EVENT:
                data = b"".join((data, tail[HEADER_SIZE_BYTES:], end.data))
            elif type_code == c.CommandType.PADDING:
                if end.data:
                    self._fail(RemoteProtocolError("AppendBlockEnd data after a Padding"))
            else:
                self._fail(
                    RemoteProtocolError(
                        f"append block ends with type {type_code}, not PartialEvent or Padding"
                    )
                )
        elif end.data:
            self._fail(RemoteProtocolError("AppendBlockEnd data without a PartialEvent"))
        return self._whole_append(end, data)

    # ------------------------------------------------------------------ sending

    def send(self, cmd: c.Command) -> None:
        """Queue a command for the peer; fetch the bytes with :meth:`data_to_send`.

        A server's ``AppendSetup`` opens the writer's session: from then on
        its appends are delivered. Any other answer to a SetupAppend (a
        refusal) leaves the writer without one.

        Raises:
            LocalProtocolError: the command may not be sent now by this role
                (for example a reply before the handshake, a Hello or a
                server KeepAlive, which the connection sends itself, an
                out-of-order DataAppended), it cannot be encoded, or the
                connection has failed. Nothing is queued or changed then.
        """
        if isinstance(cmd, c.DataAppended):
            writer_id, event_number = cmd.writer_id, cmd.event_number
        else:
            writer_id, event_number = None, 0
        self._send(type(cmd), writer_id, event_number, encode_command, cmd, self._max_frame_bytes)
        if self._role is Role.SERVER and isinstance(cmd, c.AppendSetup):
            self._writers[cmd.writer_id] = WriterSession(cmd.segment)

    def send_data_appended(
        self,
        writer_id: UUID,
        event_number: int,
        previous_event_number: int,
        request_id: int,
        current_segment_write_offset: int,
    ) -> None:
        """``send(DataAppended(...))`` from its fields: the same checks and bytes,
        without building the command (a server sends one per append).

        Raises:
            LocalProtocolError: as :meth:`send`.
        """
        self._send(
            c.DataAppended,
            writer_id,
            event_number,
            encode_data_appended,
            writer_id,
            event_number,
            previous_event_number,
            request_id,
            current_segment_write_offset,
        )

    def send_split(self, cmd: c.Command, size_bytes: int) -> tuple[bytes, bytes]:
        """Send a reply whose large bytes field the caller writes itself (zero-copy).

        ``cmd``'s first empty bytes field stands for ``size_bytes`` bytes (a
        ``SegmentRead``'s data); the frame is checked like :meth:`send` but not
        queued: the caller writes :meth:`data_to_send` (what was queued before),
        then the returned prefix, the bytes, and the suffix, before anything
        queued later (``encode_split``).

        Raises:
            LocalProtocolError: as :meth:`send`.
        """
        return self._send(type(cmd), None, 0, _encode_split, cmd, size_bytes, self._max_frame_bytes)

    def _send(
        self,
        kind: type[c.Command],
        writer_id: UUID | None,
        event_number: int,
        encode: Callable[..., _Frame],
        *args: object,
        own: bool = False,
    ) -> _Frame:
        """The one way out: every check of sending a command of class ``kind``
        now, then its encoding ``encode(*args)``, then the change of state.

        The encoding is a whole frame (bytes), which is queued, or a frame in
        two parts (prefix, suffix) around bytes the caller writes itself,
        which is returned. ``writer_id`` and ``event_number`` are a
        ``DataAppended``'s (``writer_id`` None for any other command): a
        server acknowledges each writer's events in order. ``own``: a
        command the connection sends itself (Hello, KeepAlive), which the
        caller may not.

        Raises:
            LocalProtocolError: the connection failed, the command is one the
                connection sends itself, our stream's table does not allow it
                now, an ack would go back in event numbers, or the command
                cannot be encoded. Nothing is queued or changed then.
        """
        if self._error is not None:
            raise LocalProtocolError(f"connection failed earlier: {self._error}")
        server = self._role is Role.SERVER
        if not own and (kind is c.Hello or (kind is c.KeepAlive and server)):
            raise LocalProtocolError(f"{kind.__name__} is sent by the connection itself")
        inp = _SEND_INPUTS.get(kind)
        if inp is None:
            inp = _SEND_INPUTS[kind] = classify(kind)
        step = self._our_table.get((self._our_state, inp))
        if step is None:
            raise LocalProtocolError(
                f"cannot send {kind.__name__} in state {self._our_state.value}"
            )
        session = None
        if writer_id is not None and server:
            session = self._writers.get(writer_id)
            if session is not None and event_number < session.last_acked:
                raise LocalProtocolError(
                    f"DataAppended {event_number} after {session.last_acked}: "
                    "acks go out in event-number order"
                )
        frame = encode(*args)
        if isinstance(frame, bytes):
            self._outbound += frame
        self._our_state = step[1]
        if session is not None:
            session.last_acked = event_number
        return frame

    def _queue(self, cmd: c.Command) -> None:
        """Queue a command of the connection's own (Hello, KeepAlive)."""
        self._send(type(cmd), None, 0, encode_command, cmd, self._max_frame_bytes, own=True)

    @property
    def buffered_bytes(self) -> int:
        """Bytes received that do not make a whole frame yet (0 between frames)."""
        return len(self._buffer)

    def partial_frame_size(self) -> int:
        """The size (header included) of the frame the buffered bytes begin, if
        its header has arrived and the frame has not; else 0.

        Meaningful once :meth:`events` has stopped for want of data: the
        header was then checked (type, length limits) and the buffer starts
        at a frame boundary.
        """
        buffer = self._buffer
        if self._error is not None or self._eof or len(buffer) < HEADER_SIZE_BYTES:
            return 0
        header = buffer.peek(HEADER_SIZE_BYTES)
        assert header is not None
        size = HEADER_SIZE_BYTES + FRAME_HEADER.unpack(header)[1]
        return size if size > len(buffer) else 0

    def take_partial_frame(self, target: bytearray) -> int:
        """Move the buffered bytes of a partial frame to the front of ``target``
        (a buffer of the frame's size, see :meth:`partial_frame_size`); how many.

        The caller receives the rest of the frame into ``target`` and gives
        the whole frame back with :meth:`receive_owned`, so a large frame's
        bytes are not copied after the socket.
        """
        return self._buffer.move_to(target)

    def data_to_send(self) -> bytes:
        """All bytes queued for the peer since the last call (possibly none)."""
        data = bytes(self._outbound)
        self._outbound.clear()
        return data

    # ------------------------------------------------------------------ helpers

    def _transition_in(self, inp: Input, what: str) -> Action:
        key = (self._their_state, inp)
        if key not in self._their_table:
            self._fail(
                RemoteProtocolError(
                    f"{what} is not allowed from the {self._peer_name} "
                    f"in state {self._their_state.value}"
                )
            )
        action, self._their_state = self._their_table[key]
        return action

    @property
    def _peer_name(self) -> str:
        return "server" if self._role is Role.CLIENT else "client"

    def _fail(self, exc: RemoteProtocolError) -> NoReturn:
        self._error = exc
        raise exc
