"""Bad input closes only the offending connection, with a log line and without
acking (or storing) anything of the broken window; other connections go on.
Also: acknowledged events survive a kill -9 and restart of the server.
"""

from __future__ import annotations

import json
import signal
import struct
import zlib
from collections import Counter
from pathlib import Path

import pytest

from headrace.protocols.lumberjack import JsonData, ProtocolVersion, WindowSize, encode_frame
from tests.lumberjack.harness import (
    LumberjackClient,
    start_server,
    stored_documents,
)

V2 = ProtocolVersion.V2

LIMIT_FLAGS = (
    "--lumberjack-max-window",
    "100",
    "--lumberjack-max-pending-bytes",
    str(64 * 1024),
    "--lumberjack-max-decompressed-bytes",
    str(1024 * 1024),
)


def _doc(tag: str, i: int, pad: int = 0) -> bytes:
    return json.dumps({"tag": tag, "i": i, "host": f"h{i % 5}", "pad": "x" * pad}).encode()


def _compressed(raw: bytes) -> bytes:
    body = zlib.compress(raw)
    return b"2C" + struct.pack(">I", len(body)) + body


def _bomb() -> bytes:
    # 64 MiB of valid-looking J frames' worth of zeros: 1000x the 1 MiB cap
    # that the server runs with, about 64 KiB on the wire.
    body = zlib.compress(b"\0" * (64 * 1024 * 1024), 9)
    return b"2C" + struct.pack(">I", len(body)) + body


BAD_INPUT: dict[str, tuple[bytes, str]] = {
    "garbage": (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "version byte"),
    "unknown frame type": (b"2X\x00\x00\x00\x01", "unknown frame type"),
    "invalid json": (
        b"2J" + struct.pack(">II", 3, 9) + b"{not json",
        "invalid JSON",
    ),
    "json not an object": (b"2J" + struct.pack(">II", 3, 7) + b"[1,2,3]", "object"),
    "window count over the limit": (b"2W" + struct.pack(">I", 1000), "exceeds the limit of 100"),
    "window bytes over the limit": (
        b"".join(
            b"2J" + struct.pack(">II", 3 + i, len(_doc("bad", i, 8000))) + _doc("bad", i, 8000)
            for i in range(20)
        ),
        "max_pending_bytes",
    ),
    "zlib bomb": (_bomb(), "exceeds the limit of 1048576 bytes"),
    "zlib garbage": (b"2C\x00\x00\x00\x05hello", "zlib"),
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_closes_only_that_connection_and_acks_nothing_of_its_window(
    tmp_path: Path, case: str
) -> None:
    bad_bytes, reason = BAD_INPUT[case]
    server = start_server(tmp_path / "data", *LIMIT_FLAGS)
    try:
        with (
            LumberjackClient(server.port, V2) as good,
            LumberjackClient(server.port, V2) as bad,
        ):
            good.send(WindowSize(3), *(JsonData(i + 1, _doc("good", i)) for i in range(3)))
            good.wait_for_ack(3)
            # A complete window first: it is acked and stored, before the broken one.
            bad.send_raw(WindowSize(2), JsonData(1, _doc("ok", 0)), JsonData(2, _doc("ok", 1)))
            bad.wait_for_ack(2)
            # The broken window: two valid events, then the bad input.
            bad.send_raw(
                WindowSize(50),
                JsonData(3, _doc("broken", 2)),
                _compressed(encode_frame(V2, JsonData(4, _doc("broken", 3)))),
            )
            bad.send_raw(bad_bytes)
            acks = bad.wait_closed()
            assert acks == [2], f"acked part of the broken window: {acks}"
            line = server.wait_for_line("protocol error, closing")
            assert reason.lower() in line.lower(), line
            # the other connection is untouched
            good.send(WindowSize(2), *(JsonData(i + 1, _doc("good", 3 + i)) for i in range(2)))
            good.wait_for_ack(2)
            assert good.acks == [3, 2]
        with LumberjackClient(server.port, V2) as again:  # and new ones are served
            again.send(WindowSize(1), JsonData(1, _doc("again", 0)))
            again.wait_for_ack(1)
    finally:
        assert server.stop() == 0, server.stderr
    assert "Traceback" not in server.stderr, server.stderr
    stored = stored_documents(tmp_path / "data")
    tags = Counter((str(d["tag"]), d["i"]) for docs in stored.values() for d in docs)
    assert tags == Counter(
        [("good", i) for i in range(5)] + [("ok", 0), ("ok", 1), ("again", 0)]
    ), "nothing of the broken window may be stored"


def test_acknowledged_events_survive_kill_9_and_restart(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    server = start_server(data_dir)
    port = server.port
    acked: list[int] = []
    try:
        with LumberjackClient(port, V2) as client:
            for window in range(10):
                first = window * 100
                client.send(
                    WindowSize(100),
                    *(JsonData(first + i + 1, _doc("before", first + i)) for i in range(100)),
                )
                client.wait_for_ack(first + 100)
                acked.extend(range(first, first + 100))
            # an unfinished window: never acked, may or may not be kept
            client.send(WindowSize(100), JsonData(1001, _doc("unacked", 0)))
            server.stop(signal.SIGKILL)
    finally:
        if server.process.poll() is None:
            server.stop(signal.SIGKILL)
    server = start_server(data_dir, port=port)
    try:
        with LumberjackClient(port, V2) as client:
            client.send(WindowSize(5), *(JsonData(i + 1, _doc("after", i)) for i in range(5)))
            client.wait_for_ack(5)
    finally:
        assert server.stop() == 0, server.stderr
    docs = [d for docs in stored_documents(data_dir).values() for d in docs]
    before = Counter(int(str(d["i"])) for d in docs if d["tag"] == "before")
    assert before == Counter(acked), "an acknowledged event was lost or doubled"
    assert sorted(int(str(d["i"])) for d in docs if d["tag"] == "after") == list(range(5))
    assert not [d for d in docs if d["tag"] == "unacked"], "an incomplete window was stored"


def test_windows_completed_before_a_refused_window_are_still_acked(tmp_path: Path) -> None:
    """A window over the pending-bytes limit right behind a whole one: the whole
    one is stored and acked (also when both arrive in one read), then the close."""
    server = start_server(tmp_path / "data", *LIMIT_FLAGS)
    try:
        with LumberjackClient(server.port, V2) as client:
            client.send_raw(
                WindowSize(2),
                JsonData(1, _doc("whole", 0)),
                JsonData(2, _doc("whole", 1)),
                WindowSize(20),
                *(JsonData(3 + i, _doc("broken", 2 + i, 8000)) for i in range(20)),
            )
            assert client.wait_closed() == [2]
            server.wait_for_line("max_pending_bytes")
    finally:
        assert server.stop() == 0, server.stderr
    assert "Traceback" not in server.stderr, server.stderr
    stored = stored_documents(tmp_path / "data")
    assert sorted(int(str(d["i"])) for docs in stored.values() for d in docs) == [0, 1]
