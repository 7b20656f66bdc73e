"""What the client commands share: the controller option, ``SCOPE/STREAM``
arguments, running a coroutine with client errors shown as CLI errors."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import click

from headrace.errors import HeadraceError

__all__ = ["CONTROLLER_DEFAULT", "controller_option", "run", "split_stream"]

CONTROLLER_DEFAULT = "tcp://127.0.0.1:9090"
"""``headrace serve``'s default controller port."""

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


def controller_option(f: F) -> F:
    return click.option(
        "--controller",
        default=CONTROLLER_DEFAULT,
        show_default=True,
        envvar="HEADRACE_CONTROLLER",
        help="Controller URI.",
    )(f)


def split_stream(value: str) -> tuple[str, str]:
    """``scope/stream`` -> ``(scope, stream)``."""
    scope, sep, stream = value.partition("/")
    if not sep or not scope or not stream or "/" in stream:
        raise click.BadParameter(f"expected SCOPE/STREAM, got {value!r}")
    return scope, stream


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run a client coroutine; headrace errors become a clean CLI error (exit 1)."""
    try:
        return asyncio.run(coro)
    except HeadraceError as exc:
        raise click.ClickException(f"{type(exc).__name__}: {exc}") from exc
