"""Scenarios with headrace's own client that must run in a process of their own
(to die without closing anything). ``python our_client.py SCENARIO URI ARGS...``;
the last line printed is JSON."""

from __future__ import annotations

import asyncio
import json
import os
import sys

from headrace.client import PravegaClient
from headrace.client.reader import ReaderGroup


async def read_then_die(uri: str, scope: str, group_name: str, synced: str, more: str) -> None:
    """Join the group as reader "doomed", read ``synced`` events, store positions,
    read ``more`` events, print them all and exit without leaving the group."""
    client = PravegaClient(uri)
    group = ReaderGroup(client, scope, group_name)
    reader = await group.create_reader("doomed")
    got: list[str] = []
    while len(got) < int(synced):
        event = await reader.read_next(timeout_s=5.0)
        if event is not None:
            got.append(event.data.decode())
    await reader.sync()
    while len(got) < int(synced) + int(more):
        event = await reader.read_next(timeout_s=5.0)
        if event is not None:
            got.append(event.data.decode())
    print(json.dumps({"events": got}), flush=True)
    os._exit(0)  # a crash: no release, no goodbye


if __name__ == "__main__":
    name, *args = sys.argv[1:]
    asyncio.run({"read_then_die": read_then_die}[name](*args))
