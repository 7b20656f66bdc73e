"""``docs/threat-model.md`` stays current: every constant its limits table
names exists with the value the table gives, and the table covers the limits
that ``headrace serve`` exposes as options."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "threat-model.md"
ROW = re.compile(r"^\| `(headrace\.[\w.]+)\.([A-Z][A-Z0-9_]*)` \| `([^`]+)` \|")


def _rows() -> list[tuple[str, str, str]]:
    rows = [m.groups() for line in DOC.read_text().splitlines() if (m := ROW.match(line))]
    assert len(rows) > 40, "the limits table went missing"
    return [(module, name, value) for module, name, value in rows]


@pytest.mark.parametrize(
    ("module", "name", "value"), _rows(), ids=lambda v: v if v.isupper() else ""
)
def test_limit_in_the_table_is_the_constant(module: str, name: str, value: str) -> None:
    actual = getattr(importlib.import_module(module), name)
    documented = eval(value, {"__builtins__": {}})  # the doc's own arithmetic, e.g. 64 * 1024
    assert actual == documented, f"{module}.{name} is {actual!r}, the doc says {value}"


def test_every_limit_option_is_in_the_table() -> None:
    from headrace.server.config import OPTIONS

    text = DOC.read_text()
    for option in OPTIONS:
        if option.section in {"Limits", "Auth"} and option.key != "auth_password_file":
            assert f"`{option.flag}`" in text, f"{option.flag} is not in docs/threat-model.md"
