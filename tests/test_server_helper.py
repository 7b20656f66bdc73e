"""The shared ``headrace serve`` test helper (``tests/_server.py``) against the real server."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests import _server
from tests._server import FREE, ServerProcess, ServerStartError


def test_a_server_that_does_not_start_is_reported_with_its_stderr(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data", ports={"tank": FREE}, args=["--fsync", "bogus"])
    with pytest.raises(ServerStartError) as caught:
        server.start()
    message = str(caught.value)
    assert "exited with code 2" in message
    assert "'bogus' is not one of" in message  # the server's own words, quoted
    assert not server.alive()


def test_restart_keeps_the_ports_and_the_log_of_every_start(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data", ports={"tank": FREE, "controller": FREE})
    with server:
        ports = dict(server.ports)
        assert set(ports) == {"tank", "controller"}
        with socket.create_connection(("127.0.0.1", server.port_of("tank")), timeout=5):
            pass
        assert server.restart() == 0  # SIGTERM is a clean exit
        assert server.ports == ports
        assert "headrace stopped" in server.log_text()  # the first start's last line
        # ... but a wait for a line looks at the current start only
        with pytest.raises(AssertionError, match="no 'headrace stopped'"):
            server.wait_for_line("headrace stopped", 0.2)
    assert server.returncode == 0
    assert server.log_text().count(_server.READY_LINE) == 2
    assert server.starts == 2


def test_a_taken_port_is_replaced_by_a_free_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        taken_port = taken.getsockname()[1]
        picks = iter([taken_port])
        real_free_port = _server.free_port
        monkeypatch.setattr(_server, "free_port", lambda: next(picks, None) or real_free_port())
        with ServerProcess(tmp_path / "data", ports={"tank": FREE}) as server:
            assert server.port_of("tank") != taken_port
        assert _server.PORT_TAKEN in server.log_text().lower()  # the first try's complaint


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_access_lines_are_waited_for_in_either_log_format(tmp_path: Path, log_format: str) -> None:
    server = ServerProcess(
        tmp_path / "data", ports={"tank": FREE}, args=["--log-format", log_format]
    )
    with server:
        assert server.access_records() == []
        ports = []
        for _ in range(2):
            with socket.create_connection(("127.0.0.1", server.port_of("tank")), timeout=5) as s:
                ports.append(s.getsockname()[1])
        second = server.wait_for_access(protocol="tank", reason="eof", after=1)
        first = server.wait_for_access(peer=f"127.0.0.1:{ports[0]}")
        assert first["requests"] == second["requests"]  # numbers in either format
        assert isinstance(first["requests"], int) and isinstance(first["duration_s"], float)
        assert {first["peer"], second["peer"]} == {f"127.0.0.1:{port}" for port in ports}
        assert len(server.access_records(protocol="tank")) == 2
        with pytest.raises(AssertionError, match=r"no access line with .* within 0.2 s") as caught:
            server.wait_for_access(0.2, protocol="tank", after=2)
        assert _server.READY_LINE in str(caught.value)  # the log's tail is quoted
