"""``headrace scope create|list|delete``: the namespaces streams, tables and reader
groups live in."""

from __future__ import annotations

import click

from ._client import controller_option, pravega_client, run
from ._output import echo_json, echo_table, json_option

__all__ = ["scope"]


@click.group()
def scope() -> None:
    """Create, list and delete scopes."""


@scope.command()
@controller_option
@click.argument("name", metavar="SCOPE")
def create(controller: str, name: str) -> None:
    """Create SCOPE (says so if it exists)."""

    async def go() -> bool:
        async with pravega_client(controller) as client:
            return await client.controller.create_scope(name)

    click.echo(f"{'created' if run(go()) else 'exists'}: {name}")


@scope.command(name="list")
@controller_option
@click.option("-q", "--names", is_flag=True, help="Only the names, one a line.")
@json_option
def list_(controller: str, names: bool, as_json: bool) -> None:
    """List every scope with its number of streams."""

    async def go() -> list[tuple[str, int]]:
        async with pravega_client(controller) as client:
            scopes = [s async for s in client.controller.list_scopes()]
            if names:
                return [(s, 0) for s in scopes]
            return [(s, len([x async for x in client.controller.list_streams(s)])) for s in scopes]

    rows = run(go())
    if names:
        for name, _ in rows:
            click.echo(name)
    elif as_json:
        echo_json([{"scope": name, "streams": count} for name, count in rows])
    else:
        echo_table(["SCOPE", "STREAMS"], rows)


@scope.command()
@controller_option
@click.argument("name", metavar="SCOPE")
def delete(controller: str, name: str) -> None:
    """Delete SCOPE, which must hold no streams (``stream delete`` them first)."""

    async def go() -> bool:
        async with pravega_client(controller) as client:
            return await client.controller.delete_scope(name)

    if not run(go()):
        raise click.ClickException(f"no scope {name}")
    click.echo(f"deleted: {name}")
