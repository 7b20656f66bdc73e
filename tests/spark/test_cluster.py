"""The reference pipeline on a Spark standalone cluster, with a worker killed mid-batch.

A master and two workers (one core each) from pyspark's own distribution, on
127.0.0.1; the workers' Python is this one with the repository's ``src`` on
its path (what ``pip install headrace`` on every node amounts to). The
pipeline is submitted as ``docs/spark.md`` shows (``spark-submit --master
spark://... pipeline.py ...``). The first range read of any task pauses
(``pause_hook/sitecustomize.py``, on the workers' path only) and the test
kills that worker, its executor and their Python processes: the task is
retried on the other worker, and the results are the local run's, each
summary published once.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import headrace.spark.pipeline
from headrace.cli.demo import generate_access_logs
from tests.spark.conftest import Server
from tests.spark.test_pipeline import (
    _check_summary_stream,
    _expected,
    _summary_records,
    _write_logs,
)

pyspark = pytest.importorskip("pyspark")

SPARK_HOME = Path(pyspark.__file__).parent
REPO = Path(__file__).resolve().parents[2]
HOOK = Path(__file__).resolve().parent / "pause_hook"

START_TIMEOUT_S = 120.0
"""Master and workers up and registered."""
PAUSE_TIMEOUT_S = 180.0
"""Driver start-up, query start and the first micro-batch's read tasks."""
RUN_TIMEOUT_S = 300.0
"""The whole submitted job, from its start."""
STOP_TIMEOUT_S = 20.0
POLL_S = 0.2


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class _Group:
    """A process started in its own session; ``kill`` ends it and everything it started."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], log: Path) -> None:
        self.name = name
        self.log = log
        self._out = log.open("wb")
        self.proc = subprocess.Popen(
            args, env=env, stdout=self._out, stderr=subprocess.STDOUT, start_new_session=True
        )

    def kill(self, sig: int = signal.SIGKILL) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def stop(self) -> None:
        self.kill(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(STOP_TIMEOUT_S)
        self.kill(signal.SIGKILL)  # the group: children outlive a leader that exited
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(STOP_TIMEOUT_S)
        self._out.close()

    def text(self) -> str:
        return self.log.read_text(errors="replace")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "SPARK_"))}
    env.update(
        SPARK_HOME=str(SPARK_HOME),
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        PYTHONPATH=str(REPO / "src"),
    )
    env.update(extra)
    return env


def _wait(what: str, done: Any, timeout_s: float, *watched: _Group) -> None:
    """Poll ``done()`` until true; fail at ``timeout_s`` or when a watched process exits."""
    deadline = time.monotonic() + timeout_s
    while not done():
        for group in watched:
            if group.proc.poll() is not None:
                pytest.fail(
                    f"{group.name} exited ({group.proc.returncode}) before {what}:\n"
                    f"{group.text()[-4000:]}"
                )
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} after {timeout_s:.0f} s")
        time.sleep(POLL_S)


def _alive_workers(ui_port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=5) as reply:
            state = json.load(reply)
    except OSError:
        return -1
    return int(state.get("aliveworkers", 0))


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[str, dict[str, _Group], Path]]:
    """``(master URL, {"worker-1": ..., "worker-2": ...}, pause dir)``."""
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    port, ui_port = _free_port(), _free_port()
    master_url = f"spark://127.0.0.1:{port}"
    pause = tmp_path / "pause"
    pause.mkdir()
    groups: list[_Group] = []
    try:
        master = _Group(
            "master",
            [
                spark_class,
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--webui-port",
                str(ui_port),
            ],
            _env(),
            tmp_path / "master.log",
        )
        groups.append(master)
        workers = {}
        for n in (1, 2):
            work = tmp_path / f"worker-{n}"
            work.mkdir()
            env = _env(
                PYTHONPATH=f"{REPO / 'src'}{os.pathsep}{HOOK}",
                HEADRACE_TEST_PAUSE=str(pause),
                HEADRACE_TEST_WORKER=f"worker-{n}",
            )
            workers[f"worker-{n}"] = worker = _Group(
                f"worker-{n}",
                [
                    spark_class,
                    "org.apache.spark.deploy.worker.Worker",
                    master_url,
                    "--host",
                    "127.0.0.1",
                    "--cores",
                    "1",
                    "--memory",
                    "1g",
                    "--webui-port",
                    str(_free_port()),
                    "--work-dir",
                    str(work),
                ],
                env,
                tmp_path / f"worker-{n}.log",
            )
            groups.append(worker)
        _wait(
            "two registered workers", lambda: _alive_workers(ui_port) == 2, START_TIMEOUT_S, *groups
        )
        yield master_url, workers, pause
    finally:
        for group in reversed(groups):
            group.stop()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_pipeline_on_a_standalone_cluster_survives_a_worker_killed_mid_batch(
    server: Server, cluster: tuple[str, dict[str, _Group], Path], stream_name: str, tmp_path: Path
) -> None:
    master_url, workers, pause = cluster
    source, summary = f"sp/{stream_name}", f"sp/{stream_name}-summary"
    server.create_stream("sp", stream_name, segments=2)
    lines = list(generate_access_logs(3000, minutes=3))
    _write_logs(server, source, lines)

    driver = _Group(
        "spark-submit",
        [
            str(SPARK_HOME / "bin" / "spark-submit"),
            "--master",
            master_url,
            "--conf",
            "spark.executor.memory=512m",
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            "spark.driver.host=127.0.0.1",
            headrace.spark.pipeline.__file__,
            "--controller",
            server.uri,
            "--checkpoint",
            str(tmp_path / "checkpoint"),
            "--parquet",
            str(tmp_path / "summary"),
            "--source",
            source,
            "--summary",
            summary,
            "--max-events-per-trigger",
            "1000",
        ],
        _env(),
        tmp_path / "driver.log",
    )
    try:
        reached = pause / "reached"
        _wait("paused read task", reached.exists, PAUSE_TIMEOUT_S, driver)
        victim = workers[reached.read_text()]
        victim.kill()  # the worker, its executor and their Python processes
        victim.proc.wait(STOP_TIMEOUT_S)
        try:
            code = driver.proc.wait(RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the job did not finish in time:\n{driver.text()[-4000:]}")
        assert code == 0, driver.text()[-4000:]
    finally:
        driver.stop()
    # The paused task was lost with its executor and ran again (attempt 1) on the other one.
    log = driver.text()
    assert "Lost executor" in log and re.search(r"Starting task \d+\.1 in stage", log), log[-4000:]

    want = _expected(lines)
    assert _parquet(tmp_path / "summary") == want
    _check_summary_stream(_summary_records(server, summary), want)


def _parquet(path: Path) -> dict[Any, dict[str, Any]]:
    """The Parquet summary by window start (naive UTC), read without Spark."""
    import pyarrow.parquet as pq

    out = {}
    for row in pq.read_table(path).to_pylist():
        minute = row.pop("minute")
        for name in ("window_start", "window_end"):
            row[name] = row[name].replace(tzinfo=None)
        assert str(minute) == row["window_start"].strftime("%Y%m%dT%H%M")
        out[row["window_start"]] = row
    return out
