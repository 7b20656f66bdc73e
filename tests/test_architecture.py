"""The import direction is the architecture (docs/architecture.md); this keeps it honest.

Walks the AST of every module under src/headrace and checks which headrace
layers (and which I/O modules) it imports.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "headrace"

# layer -> the headrace layers it may import (besides itself)
ALLOWED: dict[str, set[str]] = {
    "types": set(),
    "errors": set(),
    "protocols": {"types", "errors"},
    "store": {"types", "errors"},
    "controller": {"types", "errors", "protocols", "store"},
    "server": {"types", "errors", "protocols", "store", "controller", "cluster"},
    "client": {"types", "errors", "protocols"},
    "spark": {"types", "errors", "protocols", "client"},
    "cluster": {"types", "errors", "protocols", "store", "controller", "client"},
    "cli": {"*"},
    "__init__": {"*"},
    "__main__": {"*"},
}

# Sans-I/O code must not touch the event loop, sockets, logging or ZooKeeper.
FORBIDDEN_IN_SANS_IO = {"asyncio", "socket", "logging", "selectors", "ssl", "kazoo"}

# The cluster's layout and placement are pure: the leader's decisions are testable without I/O.
PURE_CLUSTER_MODULES = {"layout.py", "placement.py"}


def _modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def _layer(path: Path) -> str:
    first = path.relative_to(SRC).parts[0]
    return first.removesuffix(".py")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SRC)))
def test_layer_imports_only_allowed_layers(path: Path) -> None:
    layer = _layer(path)
    allowed = ALLOWED.get(layer)
    assert allowed is not None, f"{layer} is an unknown layer; add it to architecture.md and here"
    if "*" in allowed:
        return
    for name in _imports(path):
        parts = name.split(".")
        if parts[0] != "headrace" or len(parts) < 2 or parts[1] == layer:
            continue
        assert parts[1] in allowed, f"{path.relative_to(SRC)} imports {name}"


@pytest.mark.parametrize(
    "path",
    [p for p in _modules() if _layer(p) == "protocols"]
    + [p for p in _modules() if p.name in {"format.py", "tables.py"}]
    + [p for p in _modules() if _layer(p) == "cluster" and p.name in PURE_CLUSTER_MODULES],
    ids=lambda p: str(p.relative_to(SRC)),
)
def test_sans_io_modules_do_no_io(path: Path) -> None:
    for name in _imports(path):
        assert name.split(".")[0] not in FORBIDDEN_IN_SANS_IO, f"{path.name} imports {name}"


def test_only_server_and_cli_import_the_cluster() -> None:
    importers = {layer for layer, allowed in ALLOWED.items() if allowed & {"cluster", "*"}}
    assert importers - {"__init__", "__main__"} == {"server", "cli"}


def test_checker_sees_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import asyncio\nfrom headrace.store import MemoryStore\n")
    assert _imports(bad) == {"asyncio", "headrace.store"}


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
    from headrace.server.config import LISTENER_NAMES
    from headrace.server.listeners import STARTERS

    assert sorted(STARTERS) == sorted(LISTENER_NAMES)
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
