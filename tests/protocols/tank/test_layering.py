"""The TANK package stays sans-I/O: it imports only what the layering allows."""

from __future__ import annotations

import ast
from pathlib import Path

import headrace.protocols.tank as tank

PACKAGE = Path(tank.__file__).parent
ALLOWED_HEADRACE = (
    "headrace.errors",
    "headrace.types",
    "headrace.protocols._buffer",
    "headrace.protocols._varint",
    "headrace.protocols.tank",
)
FORBIDDEN = {"asyncio", "socket", "logging", "selectors", "ssl", "threading"}


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_tank_package_imports_no_io_and_no_other_layer() -> None:
    modules = sorted(PACKAGE.glob("*.py"))
    assert {m.name for m in modules} >= {"commands.py", "codec.py", "connection.py", "states.py"}
    for module in modules:
        for name in _imports(module):
            top = name.split(".")[0]
            assert top not in FORBIDDEN, (module.name, name)
            if top == "headrace":
                assert name.startswith(ALLOWED_HEADRACE), (module.name, name)


def test_public_names_import() -> None:
    for name in tank.__all__:
        assert getattr(tank, name) is not None, name
