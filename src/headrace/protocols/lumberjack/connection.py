"""LumberjackConnection: the sans-I/O Lumberjack v1/v2 endpoint (server or client).

The caller owns the socket. It passes received bytes to ``receive_data``,
takes what they mean from ``events()``, calls ``send`` with what it wants to
say, and writes ``data_to_send()`` to the socket. Nothing here blocks, reads
a clock, or logs.

Server role
-----------
* The version is fixed by the first byte received ('1' or '2'); every later
  frame must carry the same one, v1 data must be ``D`` and v2 data ``J``.
* ``events()`` yields ``Batch`` events: the data frames of one window that
  arrived so far (``C`` frames unpacked), each as ``Event(seq, payload)`` with
  a ready-to-store payload, plus the window's ``ack_seq`` once it closes.
* The server acknowledges with ``send(Ack(seq))`` **only after the events are
  durable** (architecture.md#invariant-durable-acks). The connection refuses
  (``LocalProtocolError``) an ack for anything not yet delivered, and acks out
  of order. Accepted:
  - ``Ack(batch.ack_seq)`` for the oldest pending ack point (v1 and v2);
  - v2 only: ``Ack(0)`` as a keepalive while any window is pending, and a
    partial ``Ack(seq)`` for a delivered event of the oldest pending window,
    after any earlier partial ack (lumberjack.md#keepalive). v1 gets neither (lumberjack.md#v1-acks:
    logstash-forwarder would take an extra ack for the next window's).
* ``data_to_send()`` returns whole 6-byte ack frames; write what it returns in
  one call (pylogbeat cannot read a split ack, lumberjack.md#frame-a).

Client role
-----------
Enough for tests and the CLI: ``send`` a ``WindowSize``, then exactly that
many ``Data``/``JsonData`` frames (bare or in ``Compressed``); ``events()``
yields each ``Ack`` received and ``unacked_windows`` counts the windows whose
final ack has not arrived.

EOF and errors
--------------
``receive_data(b"")`` means the peer closed its side: ``events()`` then ends
with ``ConnectionClosed``, or raises ``RemoteProtocolError`` if the EOF cut a
frame. Any ``RemoteProtocolError`` leaves the connection failed: close the
socket (Lumberjack has no error reply, so ``reply_hint`` is None). Any other
exception out of this module is a bug.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Iterator, Mapping

from headrace.errors import FrameTooLarge, LocalProtocolError, RemoteProtocolError
from headrace.protocols.lumberjack._fast import BulkDecoder, DataRun
from headrace.protocols.lumberjack.codec import (
    DEFAULT_LIMITS,
    DocumentParser,
    Limits,
    data_document,
    document_json,
    encode_frame,
    parse_json_object,
)
from headrace.protocols.lumberjack.commands import (
    Ack,
    Batch,
    Compressed,
    ConnectionClosed,
    Data,
    Frame,
    InnerFrame,
    JsonData,
    ProtocolVersion,
    WindowSize,
)
from headrace.protocols.lumberjack.states import (
    CLIENT_TRANSITIONS,
    SERVER_TRANSITIONS,
    ClientInput,
    Role,
    ServerAction,
    ServerInput,
    WindowState,
)

__all__ = ["ConnectionEvent", "LumberjackConnection"]

ConnectionEvent = Batch | Ack | ConnectionClosed
"""What ``events()`` yields: ``Batch``/``ConnectionClosed`` to a server,
``Ack``/``ConnectionClosed`` to a client."""

_DATA_FRAME_OF: dict[ProtocolVersion, type[Data] | type[JsonData]] = {
    ProtocolVersion.V1: Data,
    ProtocolVersion.V2: JsonData,
}
"""The only data frame type each version may carry (lumberjack.md#version-rules)."""


class _PendingWindow:
    """A server-side window (or ``W`` = 0 ack point) not yet fully acked."""

    __slots__ = ("ack_seq", "count", "event_count", "last_seq", "partial_acked", "seqs")

    def __init__(self, count: int, *, keep_seqs: bool) -> None:
        self.count = count
        self.event_count = 0
        self.last_seq: int | None = None
        self.ack_seq: int | None = None  # set when the window closes
        # v2 only: seqs of delivered events, to check partial acks (4 bytes each).
        self.seqs: array[int] | None = array("I") if keep_seqs else None
        self.partial_acked = 0  # events covered by partial acks so far

    def add(self, seq: int) -> None:
        self.event_count += 1
        self.last_seq = seq
        if self.seqs is not None:
            self.seqs.append(seq)


class _Batcher:
    """Collects one window's delivered events between two flushes."""

    __slots__ = ("_documents", "_payloads", "_seqs", "_version", "out")

    def __init__(self, version: ProtocolVersion) -> None:
        self._version = version
        self._seqs: list[int] = []
        self._payloads: list[bytes] = []
        self._documents: list[Mapping[str, object]] = []
        self.out: list[ConnectionEvent] = []

    def add(self, seq: int, payload: bytes, document: Mapping[str, object]) -> None:
        self._seqs.append(seq)
        self._payloads.append(payload)
        self._documents.append(document)

    def add_run(self, run: DataRun, start: int, stop: int) -> None:
        self._seqs += run.seqs[start:stop]
        self._payloads += run.payloads[start:stop]
        self._documents += run.documents[start:stop]

    def flush(self, ack_seq: int | None = None) -> None:
        if self._seqs or ack_seq is not None:
            self.out.append(
                Batch.of_columns(
                    self._version,
                    tuple(self._seqs),
                    tuple(self._payloads),
                    ack_seq,
                    tuple(self._documents),
                )
            )
            self._seqs, self._payloads, self._documents = [], [], []


class LumberjackConnection:
    """One Lumberjack connection, server or client side, without I/O.

    Args:
        role: ``Role.SERVER`` or ``Role.CLIENT``.
        version: required for a client (the version it speaks); for a server,
            None to take it from the first byte, or a version to insist on.
        limits: codec and window limits (``codec.Limits``).
        compress_level: zlib level a client uses for ``Compressed`` frames.
        bulk: server: decode data frames in runs (``_fast.BulkDecoder.decode_available``)
            and deliver each run's events to a window at once. False takes
            the frame-by-frame path (one ``next_frame`` and one state-machine
            step per frame): the same events and errors, slower; the property
            tests compare the two.
        parse: server: what each ``J`` document's ``Batch.documents`` entry is
            (``parse_json_object``, the whole object; ``document_parser(fields)``, the
            keys a router reads). Either accepts and refuses the same documents.

    Raises:
        LocalProtocolError: a client without a version.
    """

    def __init__(
        self,
        role: Role,
        *,
        version: ProtocolVersion | None = None,
        limits: Limits = DEFAULT_LIMITS,
        compress_level: int = 6,
        bulk: bool = True,
        parse: DocumentParser = parse_json_object,
    ) -> None:
        if role is Role.CLIENT and version is None:
            raise LocalProtocolError("a Lumberjack client must choose its version")
        self.role = role
        self._required_version = version
        self._version: ProtocolVersion | None = version if role is Role.CLIENT else None
        self._limits = limits
        self._compress_level = compress_level
        self._bulk = bulk
        self._parse = parse
        self._decoder = BulkDecoder(limits, parse)
        self._state = WindowState.AWAITING_WINDOW
        self._eof = False
        self._failure: RemoteProtocolError | None = None
        self._outgoing = bytearray()
        # Window accounting (server: received windows; client: sent windows).
        self._window_count = 0  # count of the open (or last) window
        self._window_frames = 0  # data frames in the open window so far
        # Server: the FIFO of windows and ack points awaiting their final ack.
        self._pending: deque[_PendingWindow] = deque()
        self._open: _PendingWindow | None = None
        self._last_ack_seq = 0  # ack seq of the most recent ack point (rule 6)
        # Client: final acks expected, oldest first.
        self._expected_acks: deque[int] = deque()
        self._last_sent_seq = 0

    # ------------------------------------------------------------------ properties

    @property
    def version(self) -> ProtocolVersion | None:
        """The connection's version; None for a server that has received nothing yet."""
        return self._version

    @property
    def state(self) -> WindowState:
        """Where the window protocol stands (see ``states.py``)."""
        return self._state

    @property
    def pending_window_count(self) -> int:
        """Server: windows and ack points not yet fully acked (for back-pressure)."""
        return len(self._pending)

    @property
    def awaiting_ack(self) -> bool:
        """Server: something received waits for an ack (keepalives are due on v2)."""
        return bool(self._pending)

    @property
    def unacked_windows(self) -> int:
        """Client: windows sent whose final ack has not arrived."""
        return len(self._expected_acks)

    # ------------------------------------------------------------------ receiving

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Add bytes received from the peer; ``b""`` means the peer closed (EOF).

        Pass at most ``codec.RECEIVE_SLACK_BYTES`` per call and drain
        ``events()`` after each call; the receive buffer holds one frame plus
        one read.

        Raises:
            FrameTooLarge: more than ``limits.max_buffered_bytes`` would be buffered.
            LocalProtocolError: data after EOF, or after a protocol error.
        """
        if self._failure is not None:
            raise LocalProtocolError(f"connection already failed: {self._failure}")
        if self._eof:
            raise LocalProtocolError("data received after EOF")
        if not data:
            self._eof = True
            return
        try:
            self._decoder.feed(data)
        except FrameTooLarge as exc:
            self._failure = exc
            raise

    def events(self) -> Iterator[ConnectionEvent]:
        """What the bytes received so far mean, in order.

        All whole frames received are processed before the first event is
        yielded, so an error raises before any event of the same call.

        Returns:
            An iterator over ``Batch``/``Ack`` events and a final
            ``ConnectionClosed`` after EOF.

        Raises:
            RemoteProtocolError: the peer broke the protocol (``FrameTooLarge``
                for a size over a limit); the connection is failed.
            LocalProtocolError: called again after a protocol error.
        """
        if self._failure is not None:
            raise LocalProtocolError(f"connection already failed: {self._failure}")
        if self._state is WindowState.CLOSED:
            return iter(())
        try:
            out = self._server_events() if self.role is Role.SERVER else self._client_events()
        except RemoteProtocolError as exc:
            self._failure = exc
            raise
        return iter(out)

    def _check_eof(self) -> bool:
        """True once EOF has arrived with every frame decoded."""
        if not self._eof:
            return False
        if self._decoder.in_frame:
            raise RemoteProtocolError("connection closed part-way through a frame")
        return True

    # ------------------------------------------------------------------ server side

    def _server_events(self) -> list[ConnectionEvent]:
        batcher: _Batcher | None = None
        if self._bulk:
            items, error = self._decoder.decode_available()
            for item in items:
                if isinstance(item, DataRun):
                    batcher = self._server_version(item.version, batcher)
                    self._server_run(item, batcher)
                else:
                    batcher = self._server_version(item[0], batcher)
                    self._server_frame(item[1], batcher)
            if error is not None:
                raise error
        else:
            while (decoded := self._decoder.next_frame()) is not None:
                version, frame = decoded
                batcher = self._server_version(version, batcher)
                self._server_frame(frame, batcher)
        if self._check_eof():
            if batcher is None:
                batcher = _Batcher(self._version or ProtocolVersion.V2)
            self._server_step(ServerInput.EOF, None, batcher)
        if batcher is None:
            return []
        batcher.flush()
        return batcher.out

    def _server_version(self, version: ProtocolVersion, batcher: _Batcher | None) -> _Batcher:
        """Check a received frame's version (the first one fixes the connection's)."""
        if self._version is None:
            if self._required_version not in (None, version):
                raise RemoteProtocolError(
                    f"this listener speaks {_name(self._required_version)}, got {version.name}"
                )
            self._version = version
        elif version != self._version:
            raise RemoteProtocolError(
                f"a {version.name} frame on a {self._version.name} connection"
            )
        return _Batcher(self._version) if batcher is None else batcher

    def _server_run(self, run: DataRun, batcher: _Batcher) -> None:
        """A run of data frames: what ``_server_frame`` does for each, a window at a time.

        Every frame that fits the open window is delivered in one step; the
        frame that fills it closes it (an ack point), and the next frame opens
        an implicit window, as the transition table says. A frame the table
        refuses goes through ``_server_frame``, which raises its error.
        """
        assert self._version is not None
        if run.kind is not _DATA_FRAME_OF[self._version]:
            raise RemoteProtocolError(
                f"a {run.kind.__name__} frame on a {self._version.name} connection"
            )
        index, count = 0, len(run.seqs)
        while index < count:
            if self._state is WindowState.WINDOW_FULL:
                # (window-full, data | last data): open an implicit window of the last count.
                self._open_window(self._window_count, batcher)
                self._state = WindowState.IN_WINDOW
            elif self._state is not WindowState.IN_WINDOW:
                self._server_frame(run.frame(index), batcher)  # raises: data outside a window
                raise AssertionError("unreachable")  # pragma: no cover
            window = self._open
            assert window is not None
            stop = min(count, index + self._window_count - self._window_frames)
            batcher.add_run(run, index, stop)
            seqs = run.seqs[index:stop]
            window.event_count += stop - index
            window.last_seq = seqs[-1]
            if window.seqs is not None:
                window.seqs.extend(seqs)
            self._window_frames += stop - index
            index = stop
            if self._window_frames == self._window_count:
                # (in-window, last data): the window is full, an ack point.
                self._close_open_window(batcher)
                self._state = WindowState.WINDOW_FULL

    def _server_frame(self, frame: Frame, batcher: _Batcher) -> None:
        assert self._version is not None
        match frame:
            case WindowSize(count=count):
                if count > self._limits.max_window_count:
                    raise RemoteProtocolError(
                        f"window of {count} frames exceeds the limit of "
                        f"{self._limits.max_window_count}"
                    )
                received = ServerInput.WINDOW_SIZE if count else ServerInput.EMPTY_WINDOW_SIZE
                self._server_step(received, count, batcher)
            case Data() | JsonData():
                if not isinstance(frame, _DATA_FRAME_OF[self._version]):
                    raise RemoteProtocolError(
                        f"a {type(frame).__name__} frame on a {self._version.name} connection"
                    )
                if self._state is WindowState.IN_WINDOW:
                    fills = self._window_frames + 1 == self._window_count
                else:
                    fills = self._window_count == 1
                received = ServerInput.LAST_DATA if fills else ServerInput.DATA
                self._server_step(received, frame, batcher)
            case Compressed(frames=inner):
                for inner_frame in inner:
                    self._server_frame(inner_frame, batcher)
            case Ack():
                raise RemoteProtocolError("a client sent an A (ack) frame")

    def _server_step(
        self, received: ServerInput, arg: int | Data | JsonData | None, batcher: _Batcher
    ) -> None:
        try:
            action, next_state = SERVER_TRANSITIONS[self._state, received]
        except KeyError:
            raise RemoteProtocolError(
                f"{received.value} frame in state {self._state.value}"
                + (
                    " (data outside a window: W must come first)"
                    if received in _DATA_INPUTS
                    else ""
                )
            ) from None
        A = ServerAction
        if action in (A.CLOSE_AND_OPEN_WINDOW, A.CLOSE_AND_ACK_LAST):
            self._close_open_window(batcher)
        if action in (A.OPEN_WINDOW, A.CLOSE_AND_OPEN_WINDOW):
            assert isinstance(arg, int)
            self._open_window(arg, batcher)
        elif action in (A.ACK_LAST, A.CLOSE_AND_ACK_LAST):
            batcher.flush()
            point = self._push_window(0)
            point.ack_seq = self._last_ack_seq
            batcher.flush(self._last_ack_seq)
        elif action in (A.OPEN_IMPLICIT_AND_DELIVER, A.OPEN_IMPLICIT_DELIVER_AND_CLOSE):
            self._open_window(self._window_count, batcher)
        elif action is A.CLOSE_CONNECTION:
            batcher.flush()
            batcher.out.append(ConnectionClosed())
        if isinstance(arg, Data | JsonData):
            self._deliver(arg, batcher)
            if received is ServerInput.LAST_DATA:
                self._close_open_window(batcher)
        self._state = next_state

    def _push_window(self, count: int) -> _PendingWindow:
        if len(self._pending) >= self._limits.max_pending_windows:
            raise RemoteProtocolError(
                f"more than {self._limits.max_pending_windows} windows await an ack"
            )
        window = _PendingWindow(count, keep_seqs=self._version is ProtocolVersion.V2)
        self._pending.append(window)
        return window

    def _open_window(self, count: int, batcher: _Batcher) -> None:
        batcher.flush()
        self._open = self._push_window(count)
        self._window_count = count
        self._window_frames = 0

    def _deliver(self, frame: Data | JsonData, batcher: _Batcher) -> None:
        assert self._open is not None
        if isinstance(frame, JsonData):
            payload = frame.payload
            document: Mapping[str, object] = self._parse(payload)
        else:
            document = data_document(frame.pairs)
            payload = document_json(document)
        batcher.add(frame.seq, payload, document)
        self._open.add(frame.seq)
        self._window_frames += 1

    def _close_open_window(self, batcher: _Batcher) -> None:
        """Close the open window: an ack point with its last seq, or dropped if empty."""
        window = self._open
        assert window is not None
        self._open = None
        if window.last_seq is None:
            # A W followed by another W: nothing to confirm, and an extra ack
            # would be taken by a v1 client as the next window's.
            self._pending.remove(window)
            batcher.flush()
            return
        window.ack_seq = window.last_seq
        self._last_ack_seq = window.last_seq
        batcher.flush(window.last_seq)

    def _server_ack(self, seq: int) -> None:
        assert self._version is not None
        if not self._pending:
            raise LocalProtocolError(f"Ack({seq}): nothing received awaits an ack")
        head = self._pending[0]
        if head.ack_seq is not None and seq == head.ack_seq:
            self._pending.popleft()
            return
        v2 = self._version is ProtocolVersion.V2
        if v2 and seq == 0:
            return  # keepalive (lumberjack.md#keepalive)
        if v2 and head.seqs is not None:
            found = _index(head.seqs, seq, head.partial_acked)
            if found is not None:
                head.partial_acked = found + 1
                return
        detail = (
            f"the oldest pending ack point is {head.ack_seq}"
            if head.ack_seq is not None
            else "the oldest pending window is still open"
        )
        raise LocalProtocolError(
            f"Ack({seq}) on a {self._version.name} connection: {detail}; acks go in order, "
            "only for delivered events" + ("" if v2 else " (v1 has no partial acks or keepalives)")
        )

    # ------------------------------------------------------------------ client side

    def _client_events(self) -> list[ConnectionEvent]:
        out: list[ConnectionEvent] = []
        while (decoded := self._decoder.next_frame()) is not None:
            version, frame = decoded
            if not isinstance(frame, Ack):
                raise RemoteProtocolError(f"a server sent a {type(frame).__name__} frame")
            if version != self._version:
                raise RemoteProtocolError(
                    f"ack with version {version.name} on a {_name(self._version)} connection"
                )
            if self._expected_acks and frame.seq == self._expected_acks[0]:
                self._expected_acks.popleft()
            out.append(frame)
        if self._check_eof():
            self._state = CLIENT_TRANSITIONS[self._state, ClientInput.EOF]
            out.append(ConnectionClosed())
        return out

    def _client_send(self, frame: Frame) -> None:
        assert self._version is not None
        match frame:
            case WindowSize(count=count):
                sending = ClientInput.WINDOW_SIZE if count else ClientInput.EMPTY_WINDOW_SIZE
                next_state = self._client_step(sending)
                if count == 0:
                    self._expected_acks.append(self._last_sent_seq)
                self._window_count = count
                self._window_frames = 0
                self._state = next_state
            case Data() | JsonData() | Compressed():
                data_frames = list(_data_frames(frame))
                for data_frame in data_frames:
                    if not isinstance(data_frame, _DATA_FRAME_OF[self._version]):
                        raise LocalProtocolError(
                            f"a {type(data_frame).__name__} frame on a "
                            f"{self._version.name} connection"
                        )
                remaining = self._window_count - self._window_frames
                if data_frames and (
                    self._state is not WindowState.IN_WINDOW or len(data_frames) > remaining
                ):
                    raise LocalProtocolError(
                        f"{len(data_frames)} data frames do not fit the open window "
                        f"(state {self._state.value}, {max(remaining, 0)} left)"
                    )
                for data_frame in data_frames:
                    last = self._window_frames + 1 == self._window_count
                    self._state = self._client_step(
                        ClientInput.LAST_DATA if last else ClientInput.DATA
                    )
                    self._window_frames += 1
                    self._last_sent_seq = data_frame.seq
                    if last:
                        self._expected_acks.append(data_frame.seq)
            case Ack():
                raise LocalProtocolError("a client does not send A (ack) frames")

    def _client_step(self, sending: ClientInput) -> WindowState:
        try:
            return CLIENT_TRANSITIONS[self._state, sending]
        except KeyError:
            raise LocalProtocolError(
                f"cannot {sending.value} in state {self._state.value}"
            ) from None

    # ------------------------------------------------------------------ sending

    def send(self, frame: Frame) -> None:
        """Queue a frame for the peer.

        Server: only ``Ack`` (see the module docstring for which ones).
        Client: ``WindowSize``, ``Data`` (v1), ``JsonData`` (v2), ``Compressed``.

        Raises:
            LocalProtocolError: the frame is not allowed now: an ack for
                something not delivered, out of order, a v1 partial or
                keepalive ack, data outside a window, the wrong data type for
                the version, or anything after a protocol error.
        """
        if self._failure is not None:
            raise LocalProtocolError(f"connection already failed: {self._failure}")
        if self.role is Role.SERVER:
            if not isinstance(frame, Ack):
                raise LocalProtocolError(f"a server only sends acks, not {type(frame).__name__}")
            if self._version is None:
                raise LocalProtocolError(f"Ack({frame.seq}): nothing has been received yet")
        assert self._version is not None
        # Encode first: a frame that cannot be encoded must not change any state.
        data = encode_frame(self._version, frame, compress_level=self._compress_level)
        if self.role is Role.SERVER:
            assert isinstance(frame, Ack)
            self._server_ack(frame.seq)
        else:
            self._client_send(frame)
        self._outgoing += data

    @property
    def buffered_bytes(self) -> int:
        """Bytes of a frame received in part (at least 1 inside a frame; 0 between frames)."""
        return max(len(self._decoder), int(self._decoder.in_frame))

    def data_to_send(self) -> bytes:
        """Bytes queued by ``send``, as whole frames; write them in one call."""
        data = bytes(self._outgoing)
        self._outgoing.clear()
        return data


_DATA_INPUTS = (ServerInput.DATA, ServerInput.LAST_DATA)


def _data_frames(frame: InnerFrame) -> Iterator[Data | JsonData]:
    """The data frames in ``frame``, ``C`` frames unpacked."""
    if isinstance(frame, Compressed):
        for inner in frame.frames:
            yield from _data_frames(inner)
    else:
        yield frame


def _index(seqs: array[int], seq: int, start: int) -> int | None:
    try:
        return seqs.index(seq, start)
    except ValueError:
        return None


def _name(version: ProtocolVersion | None) -> str:
    return "unknown" if version is None else version.name
