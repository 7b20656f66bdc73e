"""``headrace.spark.local.stop``: nothing the Spark session started outlives it."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

RUN_TIMEOUT_S = 240.0

SCRIPT = """
import sys
from headrace.spark import local

spark = local.session("local[2]", "headrace-stop-test")
# Python workers on the executor side, and the JVM's worker daemon.
assert spark.sparkContext.parallelize(range(4), 2).map(lambda x: x + 1).sum() == 10
jvm = spark.sparkContext._gateway.proc
local.stop(spark)
print("jvm exit", jvm.poll(), flush=True)
"""


def _processes_with(marker: str) -> list[str]:
    """Command lines of the live processes whose environment holds ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker.encode() in (entry / "environ").read_bytes():
                found.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:
            continue  # gone, or a zombie
    return found


def test_stop_ends_the_jvm_and_its_python_processes_before_returning() -> None:
    name = "HEADRACE_STOP_TEST_MARK"
    marker = f"{name}={uuid.uuid4().hex}"
    env = {**os.environ, name: marker.partition("=")[2]}
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # The JVM exited inside stop() (not later, when this script's exit closed
    # its standard input), and nothing it started is left once the script is gone.
    assert "jvm exit 0" in result.stdout, result.stdout
    assert _processes_with(marker) == []
