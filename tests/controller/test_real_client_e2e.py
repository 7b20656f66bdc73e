"""The real client through the controller and the segment store together.

What only the controller decides, seen end to end: transactions commit as a
block and aborted ones vanish; a scale hands writers and readers over to the
successor segments without losing or reordering events of a key; a
transaction open across a scale commits by rolling, its events after those
written before the commit and before those written after; a byte
stream's head comes from ``getSegments``; an auto-scaling policy splits a hot
segment. (Size retention, end to end: ``tests/pravega/test_real_client.py``.)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._real_pravega import run_scenario
from tests.controller.test_real_client import Controller


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    srv = Controller(tmp_path_factory.mktemp("e2e") / "data", fsync="never", segment_store=True)
    yield srv
    srv.stop()
    assert srv.proc.returncode == 0, srv.stderr()


def test_committed_transaction_is_contiguous_and_aborted_one_absent(server: Controller) -> None:
    events = run_scenario("events_and_transactions", server.uri)["events"]
    assert sorted(events) == sorted([f"ev{i}" for i in range(10)] + ["tx1", "tx2", "after"])
    assert events.index("tx2") == events.index("tx1") + 1
    k0 = [e for e in events if e in {"ev0", "ev3", "ev6", "ev9", "tx1", "tx2", "after"}]
    assert k0 == ["ev0", "ev3", "ev6", "ev9", "tx1", "tx2", "after"]


def test_scale_moves_writers_and_readers_to_successors_in_order(server: Controller) -> None:
    r = run_scenario("scale_while_writing", server.uri)
    assert r["scale_status"] == 0  # STARTED
    assert r["new_segments"] == 2
    events = r["events"]
    assert sorted(events) == sorted([f"a{i}" for i in range(10)] + [f"b{i}" for i in range(10)])
    assert [e for e in events if e.startswith("a")] == [f"a{i}" for i in range(10)]
    assert [e for e in events if e.startswith("b")] == [f"b{i}" for i in range(10)]


def test_transaction_open_across_a_scale_commits_in_order(server: Controller) -> None:
    r = run_scenario("rolling_transaction", server.uri)
    assert r["scale_status"] == 0  # STARTED, with the transaction open
    assert r["segments"] == 2
    assert r["events"] == ["before", "scaled", "tx1", "tx2", "after"]


def test_byte_stream_head_follows_truncation(server: Controller) -> None:
    r = run_scenario("byte_stream_head", server.uri)
    assert r == {"tail": 34, "head": 6, "read": "world"}


def test_auto_scaling_splits_a_hot_segment_and_keeps_key_order(tmp_path: Path) -> None:
    srv = Controller(
        tmp_path / "data",
        fsync="never",
        segment_store=True,
        extra=["--auto-scale-interval", "0.2"],
    )
    try:
        r = run_scenario("auto_scale", srv.uri)
    finally:
        srv.stop()
    assert r["before"] == 1 and r["after"] == 2  # split in two (scale factor 2)
    events = r["events"]
    assert len(events) == sum(r["written"].values())
    for key, count in r["written"].items():
        assert [e for e in events if e[0] == key] == [f"{key}{i}" for i in range(count)]
