"""A failed append is one log line that names the event and its size, never its bytes.

The server runs ``full_disk_server.py`` (``headrace serve``'s app on a store
whose writes fail with ENOSPC while a flag file exists). A Pravega writer
appends a 7 KB event while the disk is "full": the store fails the append, the
segment store closes the connection, and its log says so in one line: the
event's type and size, no traceback, none of the payload's bytes. The failure
is counted (``headrace_errors_total{kind="handler_error"}``).
"""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from headrace.protocols import pravega as p
from tests._server import FREE, ServerProcess
from tests.raw_pravega import RawPravega

RUNNER = Path(__file__).with_name("full_disk_server.py")
SEGMENT = "logs/test/0.#epoch.0"
MARKER = b"PAYLOAD-BYTES-"
PAYLOAD = (MARKER * 500)[:7000]
WAIT_S = 10.0
POLL_S = 0.05


def _handler_errors(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "headrace_errors_total" and sample.labels == {
                "protocol": "segment_store",
                "kind": "handler_error",
            }:
                return float(sample.value)
    return 0.0


def test_a_failed_append_is_logged_in_one_line_without_its_payload(tmp_path: Path) -> None:
    flag = tmp_path / "disk-full"
    server = ServerProcess(
        tmp_path / "data",
        ports={"segment_store": FREE, "http": FREE},
        runner=[str(RUNNER), str(flag)],
    )
    with server.start():
        with RawPravega(server.port_of("segment_store")) as raw:
            assert raw.request(p.CreateSegment(1, SEGMENT, 0, 0)) == p.SegmentCreated(1, SEGMENT)
            flag.touch()
            try:
                reply = raw.append(SEGMENT, PAYLOAD)
            except ConnectionError:
                reply = None
            assert not isinstance(reply, p.DataAppended), reply
        server.wait_for_line("handling AppendData", 10.0)
        # The close is counted just after that line is logged: poll under a deadline.
        deadline = time.monotonic() + WAIT_S
        while _handler_errors(server.port_of("http")) < 1 and time.monotonic() < deadline:
            time.sleep(POLL_S)
        assert _handler_errors(server.port_of("http")) == 1
        log = server.log_text()
    assert MARKER.decode() not in log, "the payload's bytes are in the log"
    assert "Traceback" not in log, log
    lines = [line for line in log.splitlines() if "handling" in line]
    assert len(lines) == 1, lines
    assert "AppendData (data=7008 bytes)" in lines[0], lines[0]
