"""The import direction is the architecture (docs/architecture.md); this keeps it honest.

The rules are import-linter contracts in ``pyproject.toml`` (``[tool.importlinter]``):
which headrace layer may import which, directly or through other modules;
that sans-I/O code (the protocols, every ``format`` and ``tables`` module)
imports no I/O module; and which third-party packages each layer may import
(pyspark only in spark and the cli, gRPC only in controller, server and client,
kazoo only in a cluster package, ...). ``lint-imports`` runs here, so ``make
test`` checks them. The AST checks what the linter cannot see: every layer
under ``src/headrace`` is named in the contracts, and a relative import stays
inside its own package.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "headrace"
PYPROJECT = ROOT / "pyproject.toml"
LINT_TIMEOUT_S = 120.0
"""Bound on one ``lint-imports`` run (it parses every module; seconds on a busy machine)."""
LINT = "import sys; from importlinter.cli import lint_imports_command as lint; sys.exit(lint())"
NOT_LAYERS = {"__init__", "__main__"}
"""The package's own entry points, which may import every layer."""


def _lint(src: Path, config: Path = PYPROJECT) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` with ``config`` over the ``headrace`` package under ``src``."""
    return subprocess.run(
        [sys.executable, "-c", LINT, "--no-cache", "--no-logo", str(config)],
        capture_output=True,
        text=True,
        timeout=LINT_TIMEOUT_S,
        env={**os.environ, "PYTHONPATH": str(src)},
        cwd=src,
    )


def _contracts() -> list[dict[str, Any]]:
    config: dict[str, Any] = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]
    contracts: list[dict[str, Any]] = config["contracts"]
    return contracts


def _named_layers() -> set[str]:
    """The headrace layers the contracts name (``headrace.store`` -> ``store``)."""
    names = set()
    for contract in _contracts():
        for module in contract["source_modules"] + contract["forbidden_modules"]:
            parts = module.split(".")
            if parts[0] == "headrace" and "*" not in parts[1]:
                names.add(parts[1])
    return names


def _layers() -> set[str]:
    return {
        path.name.removesuffix(".py")
        for path in SRC.iterdir()
        if (path.suffix == ".py" or (path / "__init__.py").exists())
    } - NOT_LAYERS


def _modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def _relative_imports(path: Path) -> list[tuple[int, str]]:
    """``(level, module)`` of every relative import in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        (node.level, node.module or "")
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.level > 0
    ]


def _relative_import_problem(path: Path, package_root: Path = SRC) -> str | None:
    """Why a relative import of ``path`` leaves its package, if one does: only
    ``from .x import y`` inside a subpackage of headrace; a top-level module
    (a layer of its own) imports other layers by their absolute names."""
    for level, module in _relative_imports(path):
        if level > 1:
            return f"imports {'.' * level}{module}: outside its package"
        if path.parent == package_root:
            return f"imports .{module}: a top-level module names other layers absolutely"
    return None


def test_imports_keep_the_contracts() -> None:
    done = _lint(SRC.parent)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_layer_is_named_in_the_contracts() -> None:
    unknown = _layers() - _named_layers()
    assert not unknown, (
        f"{sorted(unknown)}: unknown layers; add them to docs/architecture.md and to the "
        "[tool.importlinter] contracts in pyproject.toml"
    )


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SRC)))
def test_relative_imports_stay_in_their_package(path: Path) -> None:
    problem = _relative_import_problem(path)
    assert problem is None, f"{path.relative_to(SRC)} {problem}"


def test_the_contracts_see_violations(tmp_path: Path) -> None:
    """The real contracts over a tree whose protocols import the store, asyncio and kazoo."""
    package = tmp_path / "headrace"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for layer in _named_layers():
        if (SRC / f"{layer}.py").exists():
            (package / f"{layer}.py").write_text("")
        else:
            (package / layer).mkdir()
            (package / layer / "__init__.py").write_text("")
    (package / "protocols" / "bad.py").write_text(
        "import asyncio\nimport kazoo.client\nfrom headrace.store import MemoryStore\n"
    )
    done = _lint(tmp_path)
    assert done.returncode != 0
    for broken in [
        "headrace.protocols is not allowed to import headrace.store",
        "headrace.protocols is not allowed to import asyncio",
        "headrace.protocols is not allowed to import kazoo",
    ]:
        assert broken in done.stdout, done.stdout


def test_the_relative_import_check_sees_violations(tmp_path: Path) -> None:
    (tmp_path / "layer").mkdir()
    inside = tmp_path / "layer" / "ok.py"
    inside.write_text("from .sibling import x\nfrom . import sibling\n")
    assert _relative_import_problem(inside, tmp_path) is None
    across = tmp_path / "layer" / "across.py"
    across.write_text("from ..other import x\n")
    assert _relative_import_problem(across, tmp_path) == "imports ..other: outside its package"
    top = tmp_path / "errors.py"
    top.write_text("from .types import x\n")
    assert "absolutely" in str(_relative_import_problem(top, tmp_path))
