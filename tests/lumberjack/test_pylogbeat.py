"""The real pylogbeat client (PyPI 2.1.0, a v2 client) against ``headrace serve``.

10,000 events in pylogbeat's own windows (it always compresses), plain and
over TLS: every event is stored exactly once, in order per routing key, and
the client sees every ack. pylogbeat blocks, so it runs in a thread with a
socket timeout and a bounded join.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pylogbeat
import pytest

from headrace.protocols.pravega.routing import segment_for_key
from tests.lumberjack.harness import (
    IO_TIMEOUT_S,
    TlsFiles,
    as_stored,
    make_certificate,
    start_server,
    stored_documents,
    stored_events,
)

EVENT_COUNT = 10_000
WINDOW = 2048  # libbeat's default bulk_max_size
HOSTS = [f"web-{i}.example" for i in range(11)]
CLIENT_TIMEOUT_S = 120.0


def _events(first_id: int, count: int) -> list[dict[str, Any]]:
    return [
        {
            "@timestamp": "2026-11-22T03:00:00.000Z",
            "message": f'GET /item/{i} HTTP/1.1 200 {i * 7 % 5000} "-" "curl/8.5"',
            "host": HOSTS[i % len(HOSTS)],
            "id": i,
            "log": {"file": {"path": "/var/log/nginx/access.log"}, "offset": i * 120},
        }
        for i in range(first_id, first_id + count)
    ]


def _run_pylogbeat(port: int, tls: TlsFiles | None) -> dict[str, Any]:
    """Send EVENT_COUNT events in WINDOW-sized sends, then an empty send; in a thread."""
    outcome: dict[str, Any] = {}

    def client() -> None:
        try:
            options: dict[str, Any] = {"timeout": IO_TIMEOUT_S}
            if tls is not None:
                options.update(ssl_enable=True, ssl_verify=True, ca_certs=str(tls.cert))
            beat = pylogbeat.PyLogBeatClient("127.0.0.1", port, **options)
            with beat:
                for first in range(0, EVENT_COUNT, WINDOW):
                    beat.send(_events(first, min(WINDOW, EVENT_COUNT - first)))
                beat.send([])  # W = 0: answered with the last ack
                outcome["last_ack"] = beat._last_ack
                outcome["sequence"] = beat._sequence
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=client, daemon=True)
    thread.start()
    thread.join(CLIENT_TIMEOUT_S)
    assert not thread.is_alive(), "pylogbeat hung"
    if "error" in outcome:
        raise outcome["error"]
    return outcome


def _check_stored_once(data_dir: Path) -> None:
    per_segment = stored_documents(data_dir)
    ids = Counter(doc["id"] for docs in per_segment.values() for doc in docs)
    assert len(ids) == EVENT_COUNT
    assert set(ids) == set(range(EVENT_COUNT))
    assert max(ids.values()) == 1, "an event was stored twice"
    for name, docs in per_segment.items():
        # one host, one segment; per host, the wire order
        by_host: dict[str, list[int]] = {}
        for doc in docs:
            by_host.setdefault(str(doc["host"]), []).append(int(str(doc["id"])))
        for host, host_ids in by_host.items():
            assert host_ids == sorted(host_ids), f"{name}: {host} out of order"
    hosts_segments = {str(doc["host"]): name for name, docs in per_segment.items() for doc in docs}
    assert len(hosts_segments) == len(HOSTS)
    assert len(set(hosts_segments.values())) > 1, "routing keys should spread over segments"
    # The segment is the one a Pravega writer would pick for the same routing key.
    ranges = [(f"logs/beats/{i}.#epoch.0", i / 4, 1.0 if i == 3 else (i + 1) / 4) for i in range(4)]
    for host, name in hosts_segments.items():
        assert name == segment_for_key(ranges, host), host


@pytest.mark.parametrize("use_tls", [False, True], ids=["plain", "tls"])
def test_pylogbeat_10000_events_stored_once_and_all_acked(tmp_path: Path, use_tls: bool) -> None:
    tls = make_certificate(tmp_path / "tls", "localhost") if use_tls else None
    server = start_server(tmp_path / "data", tls=tls)
    try:
        outcome = _run_pylogbeat(server.tls_port if tls else server.port, tls)
    finally:
        assert server.stop() == 0, server.stderr
    assert outcome == {"last_ack": EVENT_COUNT, "sequence": EVENT_COUNT}
    assert "Traceback" not in server.stderr, server.stderr
    _check_stored_once(tmp_path / "data")


def test_pylogbeat_payload_is_stored_as_sent(tmp_path: Path) -> None:
    server = start_server(tmp_path / "data")
    sent = {"message": "héllo wörld", "host": "h1", "n": 1.5e300, "nested": {"a": [1, None]}}
    try:
        outcome: dict[str, Any] = {}

        def client() -> None:
            try:
                with pylogbeat.PyLogBeatClient("127.0.0.1", server.port, timeout=IO_TIMEOUT_S) as c:
                    c.send([sent])
            except BaseException as exc:
                outcome["error"] = exc

        thread = threading.Thread(target=client, daemon=True)
        thread.start()
        thread.join(CLIENT_TIMEOUT_S)
        assert not thread.is_alive()
        assert "error" not in outcome, outcome
    finally:
        assert server.stop() == 0, server.stderr
    payloads = [p for docs in stored_events(tmp_path / "data").values() for p in docs]
    # byte for byte what pylogbeat sent, after the connection's @metadata
    assert payloads == [as_stored(json.dumps(sent).encode())]
