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


@pytest.mark.slow
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_the_demo_counts_every_event_once_and_leaves_no_process_behind() -> None:
    name = "HEADRACE_DEMO_TEST_MARK"
    marker = f"{name}={uuid.uuid4().hex}"
    env = {**os.environ, name: marker.partition("=")[2]}
    result = subprocess.run(
        [sys.executable, "-m", "headrace", "demo", "--events", "3000", "--minutes", "3"],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env=env,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "summarised 3000 of 3000 events in 3 one-minute windows" in result.stdout
    # Spark's JVM, its Python processes and the shipper all ended before the demo did.
    assert _processes_with(marker) == []
