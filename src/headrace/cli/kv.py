"""``headrace kv get|put|list|delete|drop``: key-value tables from the shell
(``nats kv`` style), over the client's :class:`~headrace.client.KeyValueTable`.

Keys are UTF-8 text; values are bytes (printed as they are; ``--json`` gives
them as text, or base64 when they are not UTF-8). Versions make conditional
writes possible: ``put --if-version V`` and ``--if-absent``.
"""

from __future__ import annotations

import base64
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final, TypeVar

import click

from headrace.client import KeyValueTable
from headrace.client.errors import NoSuchSegmentError, TableKeyVersionError
from headrace.client.kvtable import NO_VERSION, NOT_EXISTS

from ._client import controller_option, pravega_client, run, split_stream
from ._output import echo_json, echo_table, json_option

if TYPE_CHECKING:
    from headrace.client import PravegaClient

__all__ = ["MAX_VALUE_BYTES", "kv"]

MAX_VALUE_BYTES: Final = 1024 * 1024
"""Largest value ``kv put`` reads from stdin: the segment store's limit on one
table entry's value (Pravega's ``MAXIMUM_VALUE_LENGTH``)."""

SHOWN_VALUE_CHARS: Final = 60
"""``kv list`` cuts longer values to this many characters in its table (not in --json)."""

T = TypeVar("T")


def _table_name(value: str) -> tuple[str, str]:
    try:
        return split_stream(value)
    except click.BadParameter as exc:
        raise click.BadParameter(f"expected SCOPE/TABLE, got {value!r}") from exc


def _with_table(
    controller: str, name: str, action: Callable[[KeyValueTable], Awaitable[T]], create: bool
) -> T:
    scope, table = _table_name(name)

    async def go() -> T:
        client: PravegaClient
        async with pravega_client(controller) as client:
            kvt = await KeyValueTable.open(client, scope, table, create=create)
            try:
                return await action(kvt)
            except ValueError as exc:  # a key of the wrong length for a partitioned table
                raise click.ClickException(str(exc)) from exc
            except NoSuchSegmentError as exc:
                raise click.ClickException(f"no table {scope}/{table}") from exc
            except TableKeyVersionError as exc:
                raise click.ClickException(
                    f"version mismatch in {scope}/{table}: the key changed (or exists)"
                ) from exc

    return run(go())


def _text(data: bytes) -> tuple[str, str]:
    """``(text, encoding)``: UTF-8 as it is, anything else as base64."""
    try:
        return data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return base64.b64encode(data).decode(), "base64"


@click.group()
def kv() -> None:
    """Get, put, list and delete the keys of key-value tables."""


@kv.command()
@controller_option
@click.argument("table", metavar="SCOPE/TABLE")
@click.argument("key")
@click.argument("value", required=False)
@click.option("--if-version", type=int, help="Only if the key's version is still this.")
@click.option("--if-absent", is_flag=True, help="Only if the key does not exist yet.")
def put(
    controller: str,
    table: str,
    key: str,
    value: str | None,
    if_version: int | None,
    if_absent: bool,
) -> None:
    """Set KEY to VALUE (default: stdin, as bytes) in SCOPE/TABLE, creating the table
    if needed; prints the key's new version.

    \b
    Examples:
      headrace kv put app/config color blue
      headrace kv put app/config logo < logo.png
    """
    if if_version is not None and if_absent:
        raise click.UsageError("--if-version and --if-absent exclude each other")
    if value is None or value == "-":
        data = sys.stdin.buffer.read(MAX_VALUE_BYTES + 1)
        if len(data) > MAX_VALUE_BYTES:
            raise click.ClickException(f"a value is at most {MAX_VALUE_BYTES} bytes")
    else:
        data = value.encode()
    version = NOT_EXISTS if if_absent else (NO_VERSION if if_version is None else if_version)

    async def action(kvt: KeyValueTable) -> int:
        return await kvt.put(key.encode(), data, version=version)

    new = _with_table(controller, table, action, create=True)
    click.echo(f"put: {key} (version {new})")


@kv.command()
@controller_option
@click.argument("table", metavar="SCOPE/TABLE")
@click.argument("key")
@json_option
def get(controller: str, table: str, key: str, as_json: bool) -> None:
    """Print the value of KEY in SCOPE/TABLE (exit 1 when it has none)."""

    async def action(kvt: KeyValueTable) -> tuple[bytes, int] | None:
        return await kvt.get(key.encode())

    found = _with_table(controller, table, action, create=False)
    if found is None:
        raise click.ClickException(f"no key {key!r} in {table}")
    data, version = found
    if as_json:
        text, encoding = _text(data)
        echo_json({"key": key, "value": text, "version": version, "encoding": encoding})
        return
    out = sys.stdout.buffer
    out.write(data if data.endswith(b"\n") or not sys.stdout.isatty() else data + b"\n")
    out.flush()


@kv.command(name="list")
@controller_option
@click.argument("table", metavar="SCOPE/TABLE")
@click.option("-q", "--keys", "keys_only", is_flag=True, help="Only the keys, one a line.")
@json_option
def list_(controller: str, table: str, keys_only: bool, as_json: bool) -> None:
    """List the keys of SCOPE/TABLE with their versions and values."""

    async def action(kvt: KeyValueTable) -> list[tuple[bytes, bytes, int]]:
        return await kvt.items()

    rows = sorted(_with_table(controller, table, action, create=False))
    if keys_only:
        for k, _, _ in rows:
            click.echo(k.decode("utf-8", "replace"))
        return
    if as_json:
        entries = []
        for k, v, version in rows:
            text, encoding = _text(v)
            key_text = k.decode("utf-8", "replace")
            entries.append(
                {"key": key_text, "value": text, "version": version, "encoding": encoding}
            )
        echo_json(entries)
        return
    shown = []
    for k, v, version in rows:
        text, encoding = _text(v)
        if encoding != "utf-8":
            text = f"({len(v)} bytes, not UTF-8)"
        elif len(text) > SHOWN_VALUE_CHARS:
            text = text[: SHOWN_VALUE_CHARS - 1] + "…"
        shown.append((k.decode("utf-8", "replace"), version, text.replace("\n", "\\n")))
    echo_table(["KEY", "VERSION", "VALUE"], shown)


@kv.command()
@controller_option
@click.argument("table", metavar="SCOPE/TABLE")
@click.argument("keys", nargs=-1, required=True)
@click.option("--if-version", type=int, help="Only if the key's version is still this (one KEY).")
def delete(controller: str, table: str, keys: tuple[str, ...], if_version: int | None) -> None:
    """Remove KEYS from SCOPE/TABLE (a key that is not there is no error)."""
    if if_version is not None and len(keys) != 1:
        raise click.UsageError("--if-version takes exactly one KEY")
    version = NO_VERSION if if_version is None else if_version

    async def action(kvt: KeyValueTable) -> None:
        for key in keys:
            await kvt.remove(key.encode(), version=version)

    _with_table(controller, table, action, create=False)
    click.echo(f"deleted: {', '.join(keys)}")


@kv.command()
@controller_option
@click.argument("table", metavar="SCOPE/TABLE")
def drop(controller: str, table: str) -> None:
    """Delete the whole table SCOPE/TABLE with every key in it."""

    async def action(kvt: KeyValueTable) -> bool:
        return await kvt.delete()

    if not _with_table(controller, table, action, create=False):
        raise click.ClickException(f"no table {table}")
    click.echo(f"dropped: {table}")
