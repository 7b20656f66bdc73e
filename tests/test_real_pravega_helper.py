"""The real ``pravega`` client's runner (``tests/_real_pravega.py``): how it fails."""

from __future__ import annotations

import time

import pytest

from tests._real_pravega import CONNECT_TIMEOUT_S, SCENARIOS, result_of, run_scenario
from tests._server import free_port


def test_a_dead_controller_fails_at_once_without_a_child() -> None:
    uri = f"tcp://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(AssertionError, match=f"no controller accepts connections at {uri}"):
        run_scenario("scopes_and_streams", uri)
    assert time.monotonic() - started < CONNECT_TIMEOUT_S  # not the client's minute of retries


def test_the_result_is_the_last_json_line_and_an_error_line_fails() -> None:
    assert result_of("x", 'client noise\n{"ok": 1}\n', "", 0) == {"ok": 1}
    assert result_of("x", '{"ok": 1}\n', "", -11) == {"ok": 1}  # a crash after the result
    with pytest.raises(AssertionError, match="x failed: ValueError: nope\nTraceback"):
        result_of("x", "E ValueError: nope\n", "Traceback ...", 1)
    with pytest.raises(AssertionError, match=r"x printed no result \(exit code -9\):\nkilled"):
        result_of("x", "", "killed", -9)


def test_every_scenario_takes_the_controller_uri_first() -> None:
    for name, scenario in SCENARIOS.items():
        assert scenario.__code__.co_varnames[0] == "uri", name
