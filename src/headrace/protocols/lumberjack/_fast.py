"""The Lumberjack codec's fast path: data frames decoded in bulk, equal to ``codec.py``.

A server receives runs of ``J`` frames (Beats) and ``D`` frames
(logstash-forwarder), bare or in a ``C`` frame. :class:`BulkDecoder` takes
them off the received bytes with C-speed loops (``struct.unpack_from``, one
JSON parse per document, no object per frame) into :class:`DataRun` s; any
other frame, and any frame that is invalid or not whole yet, goes through
the frame-by-frame decoder of ``codec.py`` (the reference), so the frames,
checks and errors are its own. ``tests/protocols/lumberjack/test_bulk.py``
holds the two paths to the same events and errors.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from headrace.errors import RemoteProtocolError
from headrace.protocols.lumberjack.codec import (
    _COMPRESSED_HEADER_BYTES,
    _DATA_HEADER_BYTES,
    _HEADER_BYTES,
    _JSON_HEADER_BYTES,
    _PAIR_OVERHEAD_BYTES,
    _U32,
    _U32_PAIR,
    _VERSION_OF,
    _VERSIONS,
    _WINDOW_OR_ACK_BYTES,
    DocumentParser,
    FrameDecoder,
    Limits,
    _Budget,
    _BytesReader,
    _inflate,
    _inner_frame,
    data_document,
    document_json,
    parse_json_object,
)
from headrace.protocols.lumberjack.commands import (
    Ack,
    Compressed,
    Data,
    Frame,
    FrameType,
    JsonData,
    ProtocolVersion,
    WindowSize,
)

__all__ = ["BulkDecoder", "DataRun", "DecodedItem"]


_WINDOW_TYPE: Final = int(FrameType.WINDOW_SIZE)
_JSON_TYPE: Final = int(FrameType.JSON_DATA)
_DATA_TYPE: Final = int(FrameType.DATA)
_COMPRESSED_TYPE: Final = int(FrameType.COMPRESSED)


class DataRun:
    """Consecutive data frames of one type and version, decoded in bulk.

    What ``FrameDecoder.decode_available`` gives a server instead of one
    ``Data``/``JsonData`` object per frame: parallel lists, filled by C-speed
    loops where the frames allow (``struct.unpack_from`` over the received or
    inflated bytes, one JSON parse per document).

    Attributes:
        version: the version byte every frame of the run carried.
        kind: ``Data`` or ``JsonData``: the frame type of the whole run.
        seqs: each frame's sequence number.
        payloads: each event's payload to store: the ``J`` document as sent,
            or a ``D`` frame's pairs as ``data_to_json`` writes them.
        documents: each payload's top-level object (``parse_json_object`` for
            ``J``, ``data_document`` for ``D``): what routing reads.
    """

    __slots__ = ("documents", "kind", "payloads", "seqs", "version")

    def __init__(self, version: ProtocolVersion, kind: type[Data] | type[JsonData]) -> None:
        self.version = version
        self.kind = kind
        self.seqs: list[int] = []
        self.payloads: list[bytes] = []
        self.documents: list[Mapping[str, object]] = []

    def frame(self, index: int) -> Data | JsonData:
        """Frame ``index`` as the frame-by-frame path would have it (for error paths).

        A ``Data`` frame comes back with the pairs of its stored object (the
        connection only checks its type and seq).
        """
        if self.kind is JsonData:
            return JsonData(self.seqs[index], self.payloads[index])
        pairs = tuple((str(k).encode(), str(v).encode()) for k, v in self.documents[index].items())
        return Data(self.seqs[index], pairs)


DecodedItem = tuple[ProtocolVersion, WindowSize | Ack | Compressed] | DataRun
"""What ``FrameDecoder.decode_available`` returns: a ``W``/``A`` frame with its
version, or a run of data frames (``C`` frames unpacked into their runs; an
empty ``C`` frame stays, for its version byte)."""


class _Items:
    """Collects decoded items, appending data frames to the current run.

    ``parse`` is what each ``J`` document goes through (the decoder's).
    """

    __slots__ = ("_run", "items", "parse")

    def __init__(self, parse: DocumentParser = parse_json_object) -> None:
        self.items: list[DecodedItem] = []
        self._run: DataRun | None = None
        self.parse = parse

    def run(self, version: ProtocolVersion, kind: type[Data] | type[JsonData]) -> DataRun:
        run = self._run
        if run is None or run.version is not version or run.kind is not kind:
            run = self._run = DataRun(version, kind)
            self.items.append(run)
        return run

    def extend(self, other: _Items) -> None:
        """Add ``other``'s items after these (runs of the same kind are joined)."""
        for item in other.items:
            if isinstance(item, DataRun):
                run = self.run(item.version, item.kind)
                run.seqs += item.seqs
                run.payloads += item.payloads
                run.documents += item.documents
            else:
                self.frame(*item)

    def frame(self, version: ProtocolVersion, frame: Frame) -> None:
        """Add one frame decoded by the frame-by-frame path (``C`` unpacked)."""
        match frame:
            case WindowSize() | Ack():
                self._run = None
                self.items.append((version, frame))
            case JsonData(seq=seq, payload=payload):
                run = self.run(version, JsonData)
                run.seqs.append(seq)
                run.payloads.append(payload)
                run.documents.append(self.parse(payload))
            case Data(seq=seq, pairs=pairs):
                document = data_document(pairs)
                run = self.run(version, Data)
                run.seqs.append(seq)
                run.payloads.append(document_json(document))
                run.documents.append(document)
            case Compressed(frames=frames):
                if not frames:  # still a frame of its version (pylogbeat's empty C)
                    self._run = None
                    self.items.append((version, frame))
                for inner in frames:
                    self.frame(version, inner)


def _scan_frames(
    data: bytes, position: int, items: _Items, limits: Limits, *, inside: int | None = None
) -> int:
    """Take consecutive whole, valid ``J``, ``D`` and ``W`` frames off ``data``.

    ``inside`` is the version byte of the ``C`` frame whose inflated bytes
    ``data`` are: only ``J``/``D`` frames of that version are taken then (a
    ``W``, or another version, is an error there, raised by the frame-by-frame
    code).

    Returns the position of the first byte not taken: the end of ``data``, a
    frame of another type, one that has not fully arrived, or one that is
    invalid (left for the frame-by-frame decoder, which takes it or raises its
    usual error). Nothing this loop takes would have been refused.
    """
    end = len(data)
    max_frame_bytes = limits.max_frame_bytes
    unpack_pair = _U32_PAIR.unpack_from
    unpack = _U32.unpack_from
    parse = items.parse
    versions = _VERSION_OF if inside is None else {inside: _VERSION_OF[inside]}
    windows = inside is None
    run: DataRun | None = None
    while end - position >= _WINDOW_OR_ACK_BYTES:
        version_byte = data[position]
        type_byte = data[position + 1]
        if version_byte not in versions:
            break
        if type_byte == _JSON_TYPE:
            if end - position < _JSON_HEADER_BYTES:
                break
            seq, json_bytes = unpack_pair(data, position + _HEADER_BYTES)
            stop = position + _JSON_HEADER_BYTES + json_bytes
            if stop > end or _JSON_HEADER_BYTES + json_bytes > max_frame_bytes:
                break
            payload = data[position + _JSON_HEADER_BYTES : stop]
            try:
                document = parse(payload)
            except RemoteProtocolError:
                break  # the frame-by-frame decoder raises it, with the frame's seq
            if run is None or run.version != version_byte or run.kind is not JsonData:
                run = items.run(versions[version_byte], JsonData)
                seqs, payloads, documents = run.seqs, run.payloads, run.documents
            seqs.append(seq)
            payloads.append(payload)
            documents.append(document)
            position = stop
        elif type_byte == _DATA_TYPE:
            taken = _scan_data_frame(data, position, limits)
            if taken is None:
                break
            seq, pairs, stop = taken
            data_doc = data_document(pairs)
            if run is None or run.version != version_byte or run.kind is not Data:
                run = items.run(versions[version_byte], Data)
                seqs, payloads, documents = run.seqs, run.payloads, run.documents
            seqs.append(seq)
            payloads.append(document_json(data_doc))
            documents.append(data_doc)
            position = stop
        elif type_byte == _WINDOW_TYPE and windows:
            (count,) = unpack(data, position + _HEADER_BYTES)
            items.frame(versions[version_byte], WindowSize(count))
            run = None
            position += _WINDOW_OR_ACK_BYTES
        else:
            break
    return position


def _scan_data_frame(
    data: bytes, position: int, limits: Limits
) -> tuple[int, list[tuple[bytes, bytes]], int] | None:
    """The whole, valid ``D`` frame at ``position``: its seq, pairs and end.

    None when the frame has not fully arrived or breaks a limit: the
    frame-by-frame decoder (pair by pair, ``FrameDecoder._next_pair``) then
    waits for it or raises its error. The checks are those of
    ``_decode_data_header`` and ``_decode_pair``.
    """
    end = len(data)
    if end - position < _DATA_HEADER_BYTES:
        return None
    seq, pair_count = _U32_PAIR.unpack_from(data, position + _HEADER_BYTES)
    if pair_count > limits.max_data_pairs:
        return None
    unpack = _U32.unpack_from
    max_key_bytes, max_value_bytes = limits.max_key_bytes, limits.max_value_bytes
    max_frame_bytes = limits.max_frame_bytes
    frame_bytes = _DATA_HEADER_BYTES
    cursor = position + _DATA_HEADER_BYTES
    pairs: list[tuple[bytes, bytes]] = []
    for _ in range(pair_count):
        if end - cursor < 4:
            return None
        (key_bytes,) = unpack(data, cursor)
        frame_bytes += _PAIR_OVERHEAD_BYTES + key_bytes
        if key_bytes > max_key_bytes or frame_bytes > max_frame_bytes:
            return None
        key_end = cursor + 4 + key_bytes
        if end - key_end < 4:
            return None
        (value_bytes,) = unpack(data, key_end)
        frame_bytes += value_bytes
        if value_bytes > max_value_bytes or frame_bytes > max_frame_bytes:
            return None
        value_end = key_end + 4 + value_bytes
        if value_end > end:
            return None
        pairs.append((data[cursor + 4 : key_end], data[key_end + 4 : value_end]))
        cursor = value_end
    return seq, pairs, cursor


def _decode_inflated(
    inflated: bytes,
    version: ProtocolVersion,
    limits: Limits,
    depth: int,
    budget: _Budget,
    items: _Items,
) -> None:
    """A ``C`` frame's inflated bytes into ``items``: ``_decode_compressed``'s loop in bulk.

    Runs of ``J`` frames go through ``_scan_json_frames``; any other frame (or
    an invalid one) through the frame-by-frame code with the same checks and
    errors, in the same order.
    """
    reader = _BytesReader(inflated)
    end = len(inflated)
    while reader.consumed < end:
        reader.consumed = _scan_frames(inflated, reader.consumed, items, limits, inside=version)
        if reader.consumed == end:
            break
        frame = _inner_frame(reader, end - reader.consumed, version, limits, depth, budget)
        items.frame(version, frame)


def _take_compressed(data: bytes, position: int, limits: Limits, items: _Items) -> int:
    """A whole top-level ``C`` frame at ``position`` in ``data`` into ``items``.

    Returns the position after it, or ``position`` (nothing taken) when the
    frame is not whole or breaks a limit: the frame-by-frame decoder then
    waits for it or raises its error.
    """
    if limits.max_compressed_depth < 1 or len(data) - position < _COMPRESSED_HEADER_BYTES:
        return position
    compressed_bytes: int = _U32.unpack_from(data, position + _HEADER_BYTES)[0]
    frame_bytes = _COMPRESSED_HEADER_BYTES + compressed_bytes
    end = position + frame_bytes
    if frame_bytes > limits.max_frame_bytes or end > len(data):
        return position
    budget = _Budget(limits.max_decompressed_bytes)
    inflated = _inflate(data[position + _COMPRESSED_HEADER_BYTES : end], budget)
    version = ProtocolVersion(data[position])
    inner = _Items(items.parse)  # the C frame's frames count only once all are valid
    _decode_inflated(inflated, version, limits, 1, budget, inner)
    if inner.items:
        items.extend(inner)
    else:
        items.frame(version, Compressed(()))
    return end


class BulkDecoder(FrameDecoder):
    """A :class:`~headrace.protocols.lumberjack.codec.FrameDecoder` that also takes
    whole frames in bulk (a server's path, :meth:`decode_available`)."""

    __slots__ = ()

    def decode_available(self) -> tuple[list[DecodedItem], RemoteProtocolError | None]:
        """Every whole frame received so far, data frames in bulk (a server's path).

        The same frames, checks and errors as calling ``next_frame`` until it
        returns None, but runs of ``J`` frames, bare or in a ``C`` frame, are
        taken by C-speed loops over the bytes (``struct.unpack_from``, one
        JSON parse per document, no object per frame), and ``C`` frames come
        unpacked. Any other frame, and any frame that is invalid, goes
        through the frame-by-frame code, so both paths raise the same
        errors.

        Returns:
            The frames decoded, in order (``W``/``A`` frames with their version,
            data frames as ``DataRun``s), and the error that stopped decoding,
            if any: the caller processes the frames before it, then raises it
            (as the frame-by-frame path would have).
        """
        items = _Items(self._parse)
        buffer = self._buffer
        limits = self._limits
        data: bytes | None = None  # the buffer's bytes at the first bulk step
        position = 0  # where the buffer's first byte is in ``data``
        try:
            while len(buffer) >= self._bytes_needed:
                if self._partial is None:
                    if data is None:
                        # One copy per call, however many frames: a step that
                        # copied the buffer would make small frames quadratic.
                        data = bytes(buffer.peek(len(buffer)) or b"")
                        position = 0
                    taken = _scan_frames(data, position, items, limits)
                    if (
                        taken == position
                        and taken + 1 < len(data)
                        and data[taken] in _VERSIONS
                        and data[taken + 1] == _COMPRESSED_TYPE
                    ):
                        taken = _take_compressed(data, position, limits, items)
                    if taken != position:
                        buffer.consume_exactly(taken - position)
                        buffer.commit()
                        position = taken
                        self._bytes_needed = 1
                        continue
                before = len(buffer)
                decoded = self.next_frame()
                position += before - len(buffer)
                if decoded is None:
                    break
                items.frame(*decoded)
        except RemoteProtocolError as exc:
            return items.items, exc
        return items.items, None
