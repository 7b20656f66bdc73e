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
    for contract in _contracts():  # modules the contracts name inside a layer
        for module in contract["source_modules"]:
            parts = module.split(".")
            if len(parts) == 3 and "*" not in module:
                (package / parts[1] / f"{parts[2]}.py").write_text("")
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


# --------------------------------------------------------------------------- the server's wiring

SERVER = SRC / "server"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported_modules(path: Path, package: str, *, type_checking: bool) -> set[str]:
    """Every module ``path`` (a module of ``package``) imports, wherever the
    import stands (a function body too), with ``from package import module``
    resolved to the module; ``type_checking=False`` leaves out the
    ``if TYPE_CHECKING:`` blocks, which never run."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node) and not type_checking:
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return found


def _server_modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(SERVER.glob("*.py"))}


def _server_imports(path: Path, *, type_checking: bool) -> set[str]:
    """The modules of ``headrace.server`` that ``path`` (one of them) imports."""
    modules = _server_modules()
    imported = _imported_modules(path, "headrace.server", type_checking=type_checking)
    return {name for name in imported if name in modules} - {_module_name(path)}


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``graph`` (module -> the modules it imports), or None."""
    done: set[str] = set()

    def walk(name: str, trail: list[str]) -> list[str] | None:
        if name in trail:
            return [*trail[trail.index(name) :], name]
        if name in done:
            return None
        for imported in sorted(graph.get(name, set())):
            cycle = walk(imported, [*trail, name])
            if cycle is not None:
                return cycle
        done.add(name)
        return None

    for name in sorted(graph):
        cycle = walk(name, [])
        if cycle is not None:
            return cycle
    return None


def _front_doors() -> list[Path]:
    """The modules the starters table (``server/listeners.py``) takes its starters from."""
    modules = _server_modules()
    listeners = modules["headrace.server.listeners"]
    return [
        modules[name]
        for name in sorted(_server_imports(listeners, type_checking=True))
        if name != "headrace.server._context"
    ]


def test_server_modules_import_one_another_without_a_cycle() -> None:
    """``app.py`` imports the starters table, which imports every front door: a
    door (or anything it imports) importing ``app.py`` back would be a cycle."""
    graph = {
        name: _server_imports(path, type_checking=False) for name, path in _server_modules().items()
    }
    cycle = _find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


@pytest.mark.parametrize("path", _front_doors(), ids=lambda p: p.name)
def test_front_doors_do_not_import_the_app(path: Path) -> None:
    """A front door gets what it needs from its starter's ``ListenerContext``,
    and names its types from ``server/_context.py``, not ``app.py``."""
    imported = _server_imports(path, type_checking=True)
    assert "headrace.server.app" not in imported, f"{path.name} imports headrace.server.app"


def test_every_listener_has_a_starter_from_a_front_door() -> None:
    from headrace.server.config import DOORS
    from headrace.server.listeners import STARTERS

    assert sorted(STARTERS) == sorted(DOORS)
    doors = {_module_name(path) for path in _front_doors()}
    assert {starter.__module__ for starter in STARTERS.values()} == doors


def test_cycle_checker_sees_cycles_and_lazy_imports(tmp_path: Path) -> None:
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
    module = tmp_path / "door.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from headrace.server.metrics import ServerMetrics\n"
        "def start() -> None:\n    from . import app\n"
    )
    at_run_time = _imported_modules(module, "headrace.server", type_checking=False)
    assert "headrace.server.app" in at_run_time
    assert "headrace.server.metrics" not in at_run_time
    typed = _imported_modules(module, "headrace.server", type_checking=True)
    assert "headrace.server.metrics" in typed
