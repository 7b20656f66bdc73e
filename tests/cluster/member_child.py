"""A cluster member in a process of its own, for tests that kill it with SIGKILL.

``python -m tests.cluster.member_child URL NODE_ID SESSION_TIMEOUT_S``: starts a
``ClusterMember`` (no hooks), prints ``ready`` once it has joined, and runs
until killed. Its session then lives on in ZooKeeper until the timeout, as a
crashed server's would.
"""

from __future__ import annotations

import asyncio
import sys

from headrace.cluster.layout import NodeInfo
from headrace.cluster.member import ClusterMember


async def main(url: str, node_id: str, session_timeout_s: float) -> None:
    member = ClusterMember(url, NodeInfo(node_id, "127.0.0.1"), session_timeout_s=session_timeout_s)
    await member.start()
    print("ready", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
