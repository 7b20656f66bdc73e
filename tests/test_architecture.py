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
