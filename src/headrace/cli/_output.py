"""Output shared by the listing commands: aligned columns for people, ``--json`` for scripts."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import click

__all__ = ["echo_json", "echo_table", "human_bytes", "json_option"]

F = TypeVar("F", bound=Callable[..., Any])


def json_option(f: F) -> F:
    """``--json``: one JSON document on stdout instead of a table."""
    return click.option(
        "--json", "as_json", is_flag=True, help="Print JSON (stable fields) instead of a table."
    )(f)


def echo_json(value: object) -> None:
    click.echo(json.dumps(value, indent=2, ensure_ascii=False))


def _cell(value: object) -> str:
    return "-" if value is None else str(value)


def echo_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Left-aligned columns two spaces apart, a header line first (``-`` for None)."""
    cells = [list(headers), *([_cell(v) for v in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for row in cells:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def human_bytes(count: int | None) -> str | None:
    """``1536`` -> ``1.5 KiB``; None stays None."""
    if count is None:
        return None
    size = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{count} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")
