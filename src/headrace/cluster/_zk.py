"""kazoo behind typed coroutines: the one place the cluster layer touches ZooKeeper.

kazoo runs its own threads: replies, watches and session-state changes arrive
on kazoo's callback thread. ``ZkSession`` hands every one of them over to the
asyncio loop with ``loop.call_soon_threadsafe``, so the member's state is only
ever touched on the loop. One exception, on purpose: ``generation`` and
``connected`` are written on kazoo's thread the moment the session state
changes, so a member stops claiming ownership before the loop even hears of
it (``docs/cluster.md#fencing``).

**The lease.** ``connected`` says what kazoo's thread last saw, which is stale
in a process that was paused (SIGSTOP, a VM frozen, a long stall): after a
pause past the session timeout, the loop may serve requests that waited in its
sockets before kazoo's thread notices that ZooKeeper ended the session. So
``live`` also asks for a recent proof that the session was alive: the time a
request was sent that ZooKeeper answered (the connect itself, then a
heartbeat every ``lease / HEARTBEATS_PER_LEASE``). ZooKeeper keeps a session
for the negotiated timeout after the last request it received, so a proof
younger than ``LEASE_FRACTION`` of that timeout means the session is still
there; a resumed process finds its proof too old and serves nothing until a
heartbeat or a new session renews it.

Paths passed in are relative to the cluster's chroot (``layout.py``); the
client itself is not chrooted, so the chroot can be created like any znode.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar, cast

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    KazooException,
    NodeExistsError,
    NoNodeError,
)
from kazoo.protocol.states import KazooState
from kazoo.retry import KazooRetry

from headrace.cluster.errors import ZooKeeperUnavailable
from headrace.cluster.layout import ClusterUrl

__all__ = ["CONNECTION_ERRORS", "Stat", "ZkSession"]

log = logging.getLogger(__name__)

RECONNECT_DELAY_S: Final = 0.05
"""First pause before kazoo tries the ensemble again after a connection drops."""
RECONNECT_MAX_DELAY_S: Final = 1.0
"""Longest pause between reconnection attempts: a member must be back well
within its session timeout once ZooKeeper is, or its session expires."""

LEASE_FRACTION: Final = 2 / 3
"""Part of the negotiated session timeout a proof of life lasts: what kazoo
itself waits for a reply before it calls a connection lost, leaving a third of
the timeout for the round trip and clock-rate differences."""

HEARTBEATS_PER_LEASE: Final = 4
"""Heartbeats sent per lease, so a few late ones (a busy loop) do not let it lapse."""

CONNECTION_ERRORS: Final = (KazooException,)
"""What a ZooKeeper call raises when the connection or session went away
(``ConnectionLoss``, ``SessionExpiredError``, ``ConnectionClosedError``...):
the member waits for the next session state instead of failing."""

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Stat:
    """The parts of a znode's stat the cluster uses."""

    version: int
    """Data version: the condition of a version-conditional write."""
    ephemeral_owner: int
    """Session id of an ephemeral znode's creator (0: persistent)."""


def _stat(raw: Any) -> Stat:
    return Stat(int(raw.version), int(raw.ephemeralOwner))


class ZkSession:
    """One ZooKeeper session for one member, with its calls as coroutines.

    Args:
        url: the ensemble and the chroot.
        session_timeout_s: asked of ZooKeeper, which clamps it to its own
            range (2 to 20 ticks by default).
        on_state: called on the loop with the new state after each session
            state change (``CONNECTED``, ``SUSPENDED`` or ``LOST``).
        on_watch: called on the loop with the chroot-relative path of every
            watch that fires.
    """

    def __init__(
        self,
        url: ClusterUrl,
        session_timeout_s: float,
        on_state: Callable[[str], None],
        on_watch: Callable[[str], None],
    ) -> None:
        self.url = url
        self._loop = asyncio.get_running_loop()
        self._on_state = on_state
        self._on_watch = on_watch
        self._closed = False
        self.generation = 0
        """Counts session state changes; written on kazoo's thread only."""
        self.connected = False
        """True while the session is connected; written on kazoo's thread only."""
        self.session_id = 0
        """The session the last ``CONNECTED`` belongs to; a new one means a new session."""
        self._proof = -math.inf
        """``time.monotonic()`` when a request ZooKeeper answered in this session was sent."""
        self._lease_s = 0.0
        """How long a proof lasts: ``LEASE_FRACTION`` of the negotiated session timeout."""
        self._heartbeat: asyncio.Task[None] | None = None
        self._client = KazooClient(
            hosts=url.connect_string,
            timeout=session_timeout_s,
            connection_retry=KazooRetry(
                max_tries=-1, delay=RECONNECT_DELAY_S, max_delay=RECONNECT_MAX_DELAY_S
            ),
        )
        self._client.add_listener(self._state_changed)
        handler = self._client._connection
        handler_connect = handler._connect  # fails here, not silently, if kazoo changes it

        def connect(*args: Any) -> Any:
            """kazoo's handshake (on its thread), noting the negotiated timeout and a proof."""
            sent = time.monotonic()
            read_timeout_ms, connect_timeout_ms = handler_connect(*args)
            # kazoo reads with 2/3 of the negotiated timeout (kazoo/protocol/connection.py)
            self._lease_s = read_timeout_ms * 1.5 / 1000 * LEASE_FRACTION
            self._proof = sent
            return read_timeout_ms, connect_timeout_ms

        handler._connect = connect

    @property
    def live(self) -> bool:
        """Connected, with a proof of life younger than the lease; safe from any thread."""
        return self.connected and time.monotonic() - self._proof < self._lease_s

    # ------------------------------------------------------------------ kazoo's thread

    def _state_changed(self, state: str) -> None:
        """kazoo's listener: runs on kazoo's thread, must not block."""
        self.generation += 1
        if state != KazooState.CONNECTED:
            self._proof = -math.inf  # a suspended session proves nothing any more
        self.connected = state == KazooState.CONNECTED
        if self.connected:
            client_id = self._client.client_id
            self.session_id = int(client_id[0]) if client_id else 0
        self._call_soon(self._on_state, str(state))

    def _watched(self, event: Any) -> None:
        path = event.path
        if isinstance(path, str) and path.startswith(self.url.chroot):
            self._call_soon(self._on_watch, path[len(self.url.chroot) :] or "/")

    def _call_soon(self, callback: Callable[[str], None], arg: str) -> None:
        if self._closed:
            return
        with contextlib.suppress(RuntimeError):  # the loop closed under a late callback
            self._loop.call_soon_threadsafe(callback, arg)

    # ------------------------------------------------------------------ the loop

    async def connect(self, timeout_s: float) -> None:
        """Open the session and create the chroot.

        Raises:
            ZooKeeperUnavailable: no server answered within ``timeout_s``.
        """
        live = await asyncio.to_thread(self._client.start_async)
        if not await asyncio.to_thread(live.wait, timeout_s):
            await self.close()
            raise ZooKeeperUnavailable(self.url.connect_string, timeout_s)
        await self._result(self._client.ensure_path_async(self.url.chroot))
        self._heartbeat = asyncio.create_task(self._beat(), name=f"heartbeat {self.url}")

    async def _beat(self) -> None:
        """Renew the proof of life: a request answered in the session, sent each
        ``lease / HEARTBEATS_PER_LEASE`` (a timer, on the loop whose stalls it detects)."""
        while True:
            await asyncio.sleep(max(self._lease_s, RECONNECT_MAX_DELAY_S) / HEARTBEATS_PER_LEASE)
            if not self.connected:
                continue
            generation, sent = self.generation, time.monotonic()
            try:
                async with asyncio.timeout(max(self._lease_s, RECONNECT_MAX_DELAY_S)):
                    await self._result(self._client.exists_async(self.url.chroot))
            except (*CONNECTION_ERRORS, TimeoutError):
                continue  # the session state change says what happened
            if self.generation == generation:
                self._proof = max(self._proof, sent)

    async def close(self) -> None:
        """End the session: ZooKeeper deletes its ephemeral znodes at once."""
        self._closed = True
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat
        await asyncio.to_thread(self._stop)

    def _stop(self) -> None:
        self._client.stop()
        self._client.close()

    def _full(self, path: str) -> str:
        return self.url.chroot + path

    async def _result(self, async_result: Any) -> Any:
        """Await a kazoo ``IAsyncResult``: its callback resolves a future on the loop."""
        future: asyncio.Future[Any] = self._loop.create_future()

        def settle(result: Any) -> None:
            if future.done():
                return
            try:
                future.set_result(result.get(block=False))
            except BaseException as exc:
                future.set_exception(exc)

        def done(result: Any) -> None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(settle, result)

        async_result.rawlink(done)
        return await future

    async def get(self, path: str, *, watch: bool) -> tuple[bytes, Stat] | None:
        """Data and stat of ``path``, or None if absent; ``watch`` fires on any change."""
        watcher = self._watched if watch else None
        while True:
            try:
                data, raw = await self._result(self._client.get_async(self._full(path), watcher))
                return cast(bytes, data), _stat(raw)
            except NoNodeError:
                if not watch:
                    return None
            # a data watch is not left on a missing node; an exists watch is
            if await self._result(self._client.exists_async(self._full(path), watcher)) is None:
                return None

    async def children(self, path: str, *, watch: bool) -> list[str]:
        """Names under ``path`` (empty if it is absent); ``watch`` fires when they change."""
        watcher = self._watched if watch else None
        try:
            names = await self._result(self._client.get_children_async(self._full(path), watcher))
        except NoNodeError:
            return []
        return sorted(cast(list[str], names))

    async def create(self, path: str, data: bytes, *, ephemeral: bool = False) -> bool:
        """Create ``path``; False if it exists already."""
        try:
            await self._result(
                self._client.create_async(self._full(path), data, ephemeral=ephemeral)
            )
        except NodeExistsError:
            return False
        return True

    async def create_all(self, nodes: Sequence[tuple[str, bytes]]) -> bool:
        """Create every ``(path, data)`` in one transaction; False if the first exists."""
        transaction = self._client.transaction()
        for path, data in nodes:
            transaction.create(self._full(path), data)
        results = await self._result(transaction.commit_async())
        failures = [r for r in results if isinstance(r, Exception)]
        if not failures:
            return True
        if isinstance(results[0], NodeExistsError):
            return False
        raise failures[0]

    async def set_if(self, path: str, data: bytes, version: int) -> Stat | None:
        """Write ``path`` only if its version is still ``version``; the new stat, or None."""
        try:
            raw = await self._result(self._client.set_async(self._full(path), data, version))
        except (BadVersionError, NoNodeError):
            return None
        return _stat(raw)

    async def delete(self, path: str) -> bool:
        """Delete ``path``; False if it was absent."""
        try:
            await self._result(self._client.delete_async(self._full(path)))
        except NoNodeError:
            return False
        return True
