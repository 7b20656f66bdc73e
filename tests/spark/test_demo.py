"""``headrace demo`` as a person runs it: every event counted once, nothing left running."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from tests.spark.test_local import _processes_with

RUN_TIMEOUT_S = 480.0
"""The demo on a small log: Spark's start, the query's start, a few micro-batches."""

SCRIPT = """
import atexit, os, sys
from pathlib import Path

def children():
    # The last exit handler to run (the first registered), as the process ends:
    # a child still here outlives the demo.
    kids = []
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        kids += (task / "children").read_text().split()
    print("children at exit:", sorted(kids), flush=True)

atexit.register(children)
from headrace.cli import main
main(["demo", "--events", "3000", "--minutes", "3"])
"""


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_the_demo_counts_every_event_once_and_leaves_no_process_behind() -> None:
    name = "HEADRACE_DEMO_TEST_MARK"
    marker = f"{name}={uuid.uuid4().hex}"
    env = {**os.environ, name: marker.partition("=")[2]}
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env=env,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "summarised 3000 of 3000 events in 3 one-minute windows" in result.stdout
    # Spark's JVM and the shipper were waited for before the demo ended, and
    # nothing they started is left.
    assert "children at exit: []" in result.stdout, result.stdout[-2000:]
    assert _processes_with(marker) == []
