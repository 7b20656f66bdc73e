"""The Lumberjack package is sans-I/O: it imports only the stdlib and what it may
(msgspec, for ``J`` documents)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import headrace.protocols.lumberjack as package

ALLOWED_HEADRACE = {
    "headrace.errors",
    "headrace.types",
    "headrace.protocols._buffer",
}
ALLOWED_THIRD_PARTY = {"msgspec"}
"""msgspec is an option for JSON-bearing frames (Lumberjack v2 ``J``)."""
FORBIDDEN_STDLIB = {"asyncio", "socket", "logging", "ssl", "selectors", "threading"}


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_package_imports_only_stdlib_errors_types_and_buffer() -> None:
    files = sorted(Path(package.__file__).parent.glob("*.py"))
    assert {f.name for f in files} >= {
        "__init__.py",
        "commands.py",
        "codec.py",
        "connection.py",
        "states.py",
    }
    for path in files:
        for name in imported_modules(path):
            top = name.split(".")[0]
            if top == "headrace":
                assert name in ALLOWED_HEADRACE or name.startswith(
                    "headrace.protocols.lumberjack"
                ), f"{path.name} imports {name}"
            else:
                allowed = sys.stdlib_module_names | {"__future__"} | ALLOWED_THIRD_PARTY
                assert top in allowed, f"{path.name}: {name}"
                assert top not in FORBIDDEN_STDLIB, f"{path.name} imports {name}"


def test_public_names_import() -> None:
    for name in package.__all__:
        assert getattr(package, name) is not None
