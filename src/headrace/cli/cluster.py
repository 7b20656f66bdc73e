"""``headrace cluster status|drain|undrain``: a cluster's nodes, containers and leader.

Talks to the cluster administration service on any node's controller port
(``client/cluster.py``); that node answers from its own ZooKeeper view.
``status --json`` prints one JSON object (``nodes``, ``containers``,
``leader``) for scripts. ``drain NODE`` writes the drain record, and the
leader moves NODE's containers to the other nodes one at a time;
``--wait`` polls the status until no container record names NODE (each
of its containers is owned by another node), within ``--timeout``.
Every failure is one ``Error:`` line and exit status 1.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

import click

from headrace.errors import HeadraceError

from ._client import client_credentials, client_tls, controller_option

__all__ = ["cluster"]

WAIT_POLL_S: Final = 0.25
"""Pause between two status reads while ``drain --wait`` waits: a move takes
at least a few ZooKeeper round trips, so polling faster only costs calls."""

DEFAULT_WAIT_TIMEOUT_S: Final = 300.0
"""``drain --wait``'s default bound: moves go one at a time, each a flush and
three ZooKeeper writes, so hundreds of containers take a while."""

T = TypeVar("T")


def _run(controller: str, job: Callable[[Any], Awaitable[T]]) -> T:
    """Run ``job`` with a client of ``controller``; errors become one ``Error:`` line."""
    from headrace.client.cluster import ClusterAdminClient
    from headrace.client.controller import ControllerClient, parse_controller_uri

    from ._reach import CONTROLLER_PROBE_TIMEOUT_S, why_unreachable

    try:
        parse_controller_uri(controller)
    except ValueError as exc:
        raise click.ClickException(f"--controller {controller}: {exc}") from None
    tls, credentials = client_tls(controller), client_credentials()

    async def go() -> T:  # the channel belongs to the loop it is made on
        async with ControllerClient(controller, tls=tls) as probe:
            # as every client command: a controller that does not answer within
            # the probe's bound is explained in one line, not after 20 s of retries
            if not await probe.wait_ready(CONTROLLER_PROBE_TIMEOUT_S):
                message = await why_unreachable(controller, probe.tls)
                if message is not None:
                    raise click.ClickException(message)
        async with ClusterAdminClient(controller, tls=tls, credentials=credentials) as client:
            return await job(client)

    try:
        return asyncio.run(go())
    except HeadraceError as exc:
        raise click.ClickException(str(exc)) from None


def held_by(status: dict[str, Any], node_id: str) -> list[int]:
    """Containers ``node_id`` owns, hands over or is being handed, in a status reply.

    A container released by ``node_id`` still names it until its new owner
    claimed it, so a drain is over once this is empty.
    """
    return [
        c["container"] for c in status["containers"] if node_id in (c.get("owner"), c.get("target"))
    ]


def _node(status: dict[str, Any], node_id: str) -> dict[str, Any] | None:
    return next((n for n in status["nodes"] if n["id"] == node_id), None)


@click.group()
def cluster() -> None:
    """Look at a cluster and move containers off a node."""


@cluster.command()
@controller_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (for scripts).")
def status(controller: str, as_json: bool) -> None:
    """Print the nodes, the containers and the leader, as one node sees them."""
    report = _run(controller, lambda client: client.status())
    if as_json:
        click.echo(json.dumps(report, sort_keys=True))
        return
    _print_status(controller, report)


def _print_status(controller: str, report: dict[str, Any]) -> None:
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if sys.stdout.isatty() else 120, highlight=False)
    nodes: list[dict[str, Any]] = report["nodes"]
    containers: list[dict[str, Any]] = report["containers"]
    console.print(
        f"cluster of {len(containers)} containers, leader {report['leader'] or '(none)'} "
        f"(as {controller} sees it)"
    )
    if report.get("replication_factor", 1) > 1:
        console.print(
            f"replication factor {report['replication_factor']}, min in-sync "
            f"{report['min_in_sync']}: {report['under_replicated']} under-replicated, "
            f"{report['offline']} offline"
        )
    table = Table(box=box.SIMPLE, pad_edge=False, show_edge=False)
    for name in ("node", "alive", "draining", "containers", "host", "ports"):
        table.add_column(name, justify="right" if name == "containers" else "left")
    for node in nodes:
        held = sum(1 for c in containers if c["owner"] == node["id"] and c["state"] != "RELEASED")
        table.add_row(
            node["id"],
            "yes" if node["alive"] else "NO",
            "yes" if node["draining"] else "",
            str(held),
            node["host"] or "-",
            " ".join(f"{door}={port}" for door, port in sorted(node["ports"].items())) or "-",
        )
    console.print(table)
    table = Table(box=box.SIMPLE, pad_edge=False, show_edge=False)
    for name in ("container", "owner", "state", "epoch", "target", "copies", "in sync"):
        table.add_column(name, justify="right" if name in ("container", "epoch") else "left")
    for c in containers:
        table.add_row(
            str(c["container"]),
            c["owner"] or "-",
            c["state"],
            str(c["epoch"]),
            c["target"] or "",
            ",".join(c["copies"]) or "-",
            ",".join(c.get("in_sync", ())),
        )
    console.print(table)


@cluster.command()
@controller_option
@click.argument("node")
@click.option(
    "--wait", is_flag=True, help="Wait until every container of NODE is owned by another node."
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT_WAIT_TIMEOUT_S,
    show_default=True,
    help="Seconds --wait waits at most.",
)
def drain(controller: str, node: str, wait: bool, timeout: float) -> None:
    """Move every container off NODE (the leader moves them one at a time)."""

    async def go(client: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        reply = await client.drain(node)
        return reply, await client.status()

    reply, report = _run(controller, go)
    held = held_by(report, node)
    prefix = f"{node} was already draining" if reply["already"] else f"draining {node}"
    listed = ", ".join(map(str, held))
    click.echo(
        f"{prefix}: {len(held)} containers to move" + (f" ({listed})" if held else "")
        if held
        else f"{prefix}: it holds no containers"
    )
    info = _node(report, node)
    if held and info is not None and not info["alive"]:
        message = f"{node} is not alive: its containers stay with it until it comes back"
        if wait:
            raise click.ClickException(message)
        click.echo(message)
        return
    if wait and held:
        _wait_until_empty(controller, node, timeout)


def _wait_until_empty(controller: str, node: str, timeout: float) -> None:
    started = time.monotonic()

    async def go(client: Any) -> list[int]:
        deadline = started + timeout
        while True:
            held = held_by(await client.status(), node)
            if not held or time.monotonic() >= deadline:
                return held
            await asyncio.sleep(WAIT_POLL_S)

    held = _run(controller, go)
    if held:
        raise click.ClickException(
            f"{node} still holds {len(held)} containers ({', '.join(map(str, held))}) "
            f"after {timeout:g} s"
        )
    click.echo(f"{node} holds no containers (waited {time.monotonic() - started:.1f} s)")


@cluster.command()
@controller_option
@click.argument("node")
def undrain(controller: str, node: str) -> None:
    """Make NODE eligible again: placement gives it its share of containers back."""
    reply = _run(controller, lambda client: client.undrain(node))
    if reply["already"]:
        click.echo(f"{node} was not draining")
    else:
        click.echo(f"{node} is no longer draining: the leader moves containers back to it")
