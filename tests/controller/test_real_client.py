"""The real ``pravega`` 0.3.8 client against our controller, each side in its own process.

The server is ``python -m headrace serve`` with only the controller listener,
on the disk store; each scenario (``tests/_real_pravega.py``) runs in a child
process with a hard timeout and prints JSON that these tests assert on.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests._real_pravega import run_scenario
from tests._server import PravegaServer

STARTUP_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0


class Controller(PravegaServer):
    """``python -m headrace serve`` with the controller listener (and the segment
    store's, if asked), on the disk store in ``data_dir``."""

    def __init__(
        self,
        data_dir: Path,
        *,
        fsync: str = "always",
        segment_store: bool = False,
        extra: Sequence[str] = (),
    ) -> None:
        """``extra``: more ``headrace serve`` options, e.g. ``--retention-interval 0.2``."""
        super().__init__(
            data_dir,
            fsync=fsync,
            args=extra,
            segment_store=segment_store,
            start_timeout_s=STARTUP_TIMEOUT_S,
            stop_timeout_s=STOP_TIMEOUT_S,
        )
        self.port = self.controller_port

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        assert self.process is not None
        return self.process

    def stderr(self) -> str:
        return self.log_text()


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    # Durability is the restart test's business; these scenarios need speed.
    ctl = Controller(tmp_path_factory.mktemp("controller") / "data", fsync="never")
    yield ctl
    ctl.stop()
    assert ctl.proc.returncode == 0, ctl.stderr()


def test_scopes_and_streams(controller: Controller) -> None:
    r = run_scenario("scopes_and_streams", controller.uri)
    assert r["create_scope"] is True
    assert r["create_scope_again"] is False
    assert r["create_stream"] is True
    assert r["create_stream_again"] is False
    assert r["create_tagged"] is True
    assert "rc1" in r["list_scope"]
    assert r["list_stream"] == ["fixed", "tagged"]
    assert r["tags_untagged"] is None
    assert r["tags"] == ["red", "blue"]
    assert r["update"] is True
    assert r["tags_updated"] == ["green"]
    assert r["tags_cleared"] is None
    assert r["delete_scope_not_empty"] == {"error": "ValueError", "final": True}
    assert r["delete_unsealed"] == {"error": "ValueError", "final": True}
    assert r["seal"] is True and r["seal_again"] is True
    assert r["delete"] is True
    assert r["delete_again"] is False
    assert r["seal_tagged"] is True and r["delete_tagged"] is True
    assert r["list_stream_after"] == []
    assert r["delete_scope"] is True
    assert r["delete_scope_again"] is False
    assert "rc1" not in r["list_scope_after"]


def test_auto_scaling_and_retention_policies(controller: Controller) -> None:
    r = run_scenario("policies", controller.uri)
    assert r["by_event_rate"] is True and r["by_data_rate"] is True
    assert r["tags_events"] == ["auto"]
    assert r["tags_bytes"] is None
    assert r["list_stream"] == ["bytes", "events"]


def test_bad_requests_fail_at_once(controller: Controller) -> None:
    r = run_scenario("bad_requests", controller.uri)
    for key in [
        "invalid_scope",
        "invalid_stream",
        "stream_in_missing_scope",
        "seal_missing",
        "tags_missing",
    ]:
        assert r[key] == {"error": "ValueError", "final": True}, key
    assert r["delete_missing_scope"] is False
    assert r["list_missing_scope"] == []


def test_transactions_without_events(controller: Controller) -> None:
    r = run_scenario("transaction_states", controller.uri)
    assert r["first_open"] is True
    assert r["get_txn_open"] is True
    assert r["first_open_after_abort"] is False
    assert r["second_id"] != r["first_id"]
    assert r["second_open_after_commit"] is False
    assert r["begin_on_sealed"] == {"error": "ValueError", "final": True}


def test_list_scopes_across_pages(controller: Controller) -> None:
    r = run_scenario("many_scopes", controller.uri)
    assert r == {"created": True, "listed": True, "no_duplicates": True}


def test_metadata_survives_a_server_restart(tmp_path: Path) -> None:
    first = Controller(tmp_path / "data")
    try:
        written = run_scenario("restart_write", first.uri)
    finally:
        first.stop()
    assert written == {"scope": True, "stream": True, "sealed": True}
    second = Controller(tmp_path / "data")
    try:
        r = run_scenario("restart_read", second.uri)
    finally:
        second.stop()
    assert r["scopes"] == ["durable"]
    assert r["streams"] == ["sealed", "st"]
    assert r["tags"] == ["kept"]
    assert r["create_again"] is False
    assert r["delete_sealed"] is True
