"""Lumberjack v1/v2 (Beats, logstash-forwarder, pylogbeat), sans-I/O.

``LumberjackConnection`` turns received bytes into ``Batch`` events of
ready-to-store payloads and lets the server ack only what it has made durable;
``codec`` encodes and decodes single frames. See ``docs/protocols/lumberjack.md``.
"""

from __future__ import annotations

from headrace.protocols.lumberjack._fast import DataRun, DecodedItem
from headrace.protocols.lumberjack.codec import (
    DEFAULT_LIMITS,
    MAX_COMPRESSED_DEPTH,
    MAX_DATA_PAIRS,
    MAX_DECOMPRESSED_BYTES,
    MAX_FRAME_BYTES,
    MAX_KEY_BYTES,
    MAX_PENDING_WINDOWS,
    MAX_VALUE_BYTES,
    MAX_WINDOW_COUNT,
    RECEIVE_SLACK_BYTES,
    DecodedFrame,
    FrameDecoder,
    Limits,
    data_document,
    data_to_json,
    decode_frame,
    decode_frames,
    document_parser,
    encode_frame,
    parse_json_object,
)
from headrace.protocols.lumberjack.commands import (
    Ack,
    Batch,
    Compressed,
    ConnectionClosed,
    Data,
    Event,
    Frame,
    FrameType,
    InnerFrame,
    JsonData,
    ProtocolVersion,
    WindowSize,
)
from headrace.protocols.lumberjack.connection import ConnectionEvent, LumberjackConnection
from headrace.protocols.lumberjack.states import Role, WindowState

__all__ = [
    "DEFAULT_LIMITS",
    "MAX_COMPRESSED_DEPTH",
    "MAX_DATA_PAIRS",
    "MAX_DECOMPRESSED_BYTES",
    "MAX_FRAME_BYTES",
    "MAX_KEY_BYTES",
    "MAX_PENDING_WINDOWS",
    "MAX_VALUE_BYTES",
    "MAX_WINDOW_COUNT",
    "RECEIVE_SLACK_BYTES",
    "Ack",
    "Batch",
    "Compressed",
    "ConnectionClosed",
    "ConnectionEvent",
    "Data",
    "DataRun",
    "DecodedFrame",
    "DecodedItem",
    "Event",
    "Frame",
    "FrameDecoder",
    "FrameType",
    "InnerFrame",
    "JsonData",
    "Limits",
    "LumberjackConnection",
    "ProtocolVersion",
    "Role",
    "WindowSize",
    "WindowState",
    "data_document",
    "data_to_json",
    "decode_frame",
    "decode_frames",
    "document_parser",
    "encode_frame",
    "parse_json_object",
]
