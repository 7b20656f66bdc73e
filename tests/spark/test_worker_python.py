"""The Python a driver runs from is its Spark workers' Python, unless the user says otherwise.

Spark starts its Python workers (those that find the ``headrace`` data source
among them) with ``PYSPARK_PYTHON``, by default ``python3`` from ``PATH``: a
script run with a virtual environment's Python would get workers without the
package. The wheel installs ``headrace-spark-python.pth``, which every start
of the environment's Python runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

PTH = "headrace-spark-python.pth"
ROOT = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 60.0


def _venv_with_pth(tmp_path: Path) -> Path:
    """A fresh virtual environment holding only the ``.pth`` file; its Python."""
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)],
        check=True,
        timeout=RUN_TIMEOUT_S,
    )
    (site,) = venv.glob("lib/python3*/site-packages")
    (site / PTH).write_text((ROOT / "src" / PTH).read_text())
    return venv / "bin" / "python"


def _workers_python(python: Path, **env: str) -> str:
    base = {k: v for k, v in os.environ.items() if k != "PYSPARK_PYTHON"}
    out = subprocess.run(
        [str(python), "-c", "import os; print(os.environ['PYSPARK_PYTHON'])"],
        env={**base, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=RUN_TIMEOUT_S,
    )
    return out.stdout.strip()


def test_the_environments_python_runs_the_workers_unless_pyspark_python_is_set(
    tmp_path: Path,
) -> None:
    python = _venv_with_pth(tmp_path)
    assert _workers_python(python) == str(python)
    assert _workers_python(python, PYSPARK_PYTHON="/opt/py/bin/python") == "/opt/py/bin/python"


def test_the_wheel_installs_the_pth_file_in_site_packages() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    forced = config["tool"]["hatch"]["build"]["targets"]["wheel"]["force-include"]
    assert forced == {f"src/{PTH}": PTH}
