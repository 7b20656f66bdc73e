"""Real ``headrace serve --cluster`` nodes for the cluster tests: start, watch, settle.

Every node runs on 127.0.0.1 with free ports and its own data directory,
against one real ZooKeeper (a chroot per cluster). ``/health`` is each
node's own view of the cluster; ``settle`` polls it, bounded, until every
node sees the same members and leader and every container is owned.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

from tests._server import FREE, POLL_INTERVAL_S, ServerProcess

CONTAINERS: Final = 8
"""Containers of a test cluster: enough to place some on every node."""

SETTLE_S: Final = 90.0
"""Bound on a cluster settling: server starts and placement over ZooKeeper
on two busy cores."""

PRAVEGA_DOORS: Final = ("controller", "segment_store", "http")
ALL_DOORS: Final = ("controller", "segment_store", "http", "tank", "lumberjack", "rsio")


def node_process(
    url: str,
    data_dir: Path,
    name: str,
    *,
    doors: Iterable[str] = PRAVEGA_DOORS,
    verbose: bool = False,
    extra: Sequence[str] = (),
) -> ServerProcess:
    """One node of the cluster at ``url``, not started; ``verbose``: it logs at
    INFO (``headrace -v``); ``extra``: more ``serve`` arguments."""
    return ServerProcess(
        data_dir,
        global_args=["-v"] if verbose else [],
        ports={door: FREE for door in doors},
        args=[
            f"--cluster={url}",
            f"--node-id={name}",
            "--advertise-host=127.0.0.1",
            f"--container-count={CONTAINERS}",
            *extra,
        ],
    )


def start_node(
    url: str,
    data_dir: Path,
    name: str,
    *,
    doors: Iterable[str] = PRAVEGA_DOORS,
    verbose: bool = False,
) -> ServerProcess:
    """``node_process``, started (its ports open)."""
    return node_process(url, data_dir, name, doors=doors, verbose=verbose).start()


def health(node: ServerProcess) -> dict[str, Any]:
    url = f"http://127.0.0.1:{node.port_of('http')}/health"
    with urllib.request.urlopen(url, timeout=10) as response:
        report: dict[str, Any] = json.loads(response.read())
    return report


def views(nodes: Mapping[str, ServerProcess]) -> dict[str, dict[str, Any]]:
    """Each node's ``/health`` cluster section."""
    return {name: health(node)["cluster"] for name, node in nodes.items()}


def settled(seen: Mapping[str, Mapping[str, Any]]) -> bool:
    """Every node joined and sees all the others and one leader, which loaded
    the controller's metadata (the others follow it); every container is
    owned by exactly one node, balanced (placement moves no more)."""
    names = sorted(seen)
    if not all(v["joined"] and v["nodes"] == names for v in seen.values()):
        return False
    if len({v["leader"] for v in seen.values()}) != 1:
        return False
    metadata = sorted(v.get("metadata") for v in seen.values())
    if metadata != ["following"] * (len(names) - 1) + ["leading"]:
        return False  # the leader has not loaded the controller's tables yet
    owned = [c for v in seen.values() for c in v["owned"]]
    counts = [len(v["owned"]) for v in seen.values()]
    return sorted(owned) == list(range(CONTAINERS)) and max(counts) - min(counts) <= 1


def settle(nodes: Mapping[str, ServerProcess], timeout_s: float = SETTLE_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not settled(views(nodes)):
        assert time.monotonic() < deadline, views(nodes)
        time.sleep(POLL_INTERVAL_S)


def owners(nodes: Mapping[str, ServerProcess]) -> dict[int, str]:
    """Container -> the node owning it."""
    return {c: name for name, v in views(nodes).items() for c in v["owned"]}


def leader(nodes: Mapping[str, ServerProcess]) -> str:
    """The node every node names as leader (the cluster is settled)."""
    found = {v["leader"] for v in views(nodes).values()}
    assert len(found) == 1, found
    name: str = found.pop()
    return name


def wait_for_metadata(nodes: Mapping[str, ServerProcess], timeout_s: float = SETTLE_S) -> None:
    """Until one node leads the metadata and every other follows it."""
    deadline = time.monotonic() + timeout_s
    while True:
        modes = sorted(str(v.get("metadata")) for v in views(nodes).values())
        if modes == ["following"] * (len(nodes) - 1) + ["leading"]:
            return
        assert time.monotonic() < deadline, views(nodes)
        time.sleep(POLL_INTERVAL_S)


def wait_for_view(
    node: ServerProcess, check: Callable[[dict[str, Any]], bool], timeout_s: float = SETTLE_S
) -> None:
    """Until ``check`` holds for ``node``'s view of the cluster."""
    deadline = time.monotonic() + timeout_s
    while not check(health(node)["cluster"]):
        assert time.monotonic() < deadline, health(node)
        time.sleep(POLL_INTERVAL_S)
