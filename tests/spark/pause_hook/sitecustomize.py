"""Pauses one Spark task mid-batch, for the cluster test to kill its worker.

On the Spark workers' Python path only (the cluster test puts this directory
there): Python runs ``sitecustomize`` at start-up. With
``HEADRACE_TEST_PAUSE`` naming a directory, the first range read of any
task on any worker (``headrace.spark._reads.read_range``, claimed through an
exclusive file create, since workers are processes) writes the worker's
``HEADRACE_TEST_WORKER`` to ``<dir>/reached`` and waits to be killed; every
other read, including the retry of that task, runs as usual.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import time
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any

PAUSE_LIMIT_S = 300.0
"""Longest pause: the test kills the worker well before."""


def _patch(module: ModuleType) -> None:
    read_range = getattr(module, "read_range")  # noqa: B009 (a module mypy cannot see)
    pause = os.environ["HEADRACE_TEST_PAUSE"]

    def paused(*args: Any, **kwargs: Any) -> Iterator[Any]:
        try:
            fd = os.open(os.path.join(pause, "claimed"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            yield from read_range(*args, **kwargs)
            return
        os.close(fd)
        with open(os.path.join(pause, "reached.tmp"), "w") as f:
            f.write(os.environ.get("HEADRACE_TEST_WORKER", "?"))
        os.replace(os.path.join(pause, "reached.tmp"), os.path.join(pause, "reached"))
        deadline = time.monotonic() + PAUSE_LIMIT_S
        while time.monotonic() < deadline:
            time.sleep(0.1)
        raise RuntimeError("the test did not kill the paused worker")

    setattr(module, "read_range", paused)  # noqa: B010


class _Finder(importlib.abc.MetaPathFinder):
    """Patches ``headrace.spark._reads`` once it is loaded."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "headrace.spark._reads":
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader: Any = spec.loader
        exec_module = loader.exec_module

        def exec_and_patch(module: ModuleType) -> None:
            exec_module(module)
            _patch(module)

        loader.exec_module = exec_and_patch
        return spec


if os.environ.get("HEADRACE_TEST_PAUSE"):
    sys.meta_path.insert(0, _Finder())
