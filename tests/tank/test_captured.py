"""Frames captured from TANK's own ``tank-cli`` replayed to a fresh ``headrace serve``:
the server's replies must be the bytes the real client got (``tests/data/tank``)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from tests.tank.conftest import running_server

SESSION = Path(__file__).resolve().parent.parent / "data" / "tank" / "tank_cli_session.json"
READ_TIMEOUT_S = 10.0
PING = b"\x03\x00\x00\x00\x00"


def request_count(data: bytes) -> int:
    """Requests (not Pings) in a run of whole frames."""
    count = 0
    while data:
        size = int.from_bytes(data[1:5], "little")
        count += data[0] != PING[0]
        data = data[5 + size :]
    return count


class Replay:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=READ_TIMEOUT_S)
        self.buffer = b""
        self.first = True

    def response(self) -> bytes:
        """The next frame that is not a Ping (the greeting must come first)."""
        while True:
            if len(self.buffer) >= 5:
                size = int.from_bytes(self.buffer[1:5], "little")
                if len(self.buffer) >= 5 + size:
                    frame, self.buffer = self.buffer[: 5 + size], self.buffer[5 + size :]
                    if self.first:
                        assert frame == PING, "the greeting comes first"
                        self.first = False
                    elif frame != PING:
                        return frame
                    continue
            data = self.sock.recv(65536)
            assert data, "connection closed"
            self.buffer += data


def test_tank_cli_session_replays_byte_for_byte(tmp_path: Path) -> None:
    session = json.loads(SESSION.read_text())
    with running_server(tmp_path / "data") as server:
        for number, exchanges in enumerate(session["connections"], 1):
            replay = Replay(server.port)
            try:
                for exchange in exchanges:
                    sent = bytes.fromhex(exchange["send"])
                    replay.sock.sendall(sent)
                    # Every request is answered; the capture has the first ones.
                    got = [replay.response() for _ in range(request_count(sent))]
                    expected = [bytes.fromhex(frame) for frame in exchange["expect"]]
                    assert got[: len(expected)] == expected, f"connection {number}"
            finally:
                replay.sock.close()
