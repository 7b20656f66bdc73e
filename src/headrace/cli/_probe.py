"""Looking at a port with plain sockets, to tell a person what it speaks.

Used when a command cannot talk to a port: does it answer TLS at all? Each
look is bounded by ``DIAGNOSE_TIMEOUT_S``. Free of the client and gRPC, so
``headrace status`` can use it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from typing import Final

__all__ = ["DIAGNOSE_TIMEOUT_S", "handshake", "speaks_tls"]

DIAGNOSE_TIMEOUT_S: Final = 1.0
"""Bound of each look at a port (a TCP connect, a TLS handshake): a local or
LAN server answers in milliseconds."""


async def handshake(host: str, port: int, context: ssl.SSLContext) -> None:
    """A TLS handshake with ``host:port``, then close. Raises what it met."""
    _, writer = await asyncio.wait_for(
        asyncio.open_connection(host, port, ssl=context, server_hostname=host),
        DIAGNOSE_TIMEOUT_S,
    )
    writer.close()
    with contextlib.suppress(OSError, ssl.SSLError, TimeoutError):
        await asyncio.wait_for(writer.wait_closed(), DIAGNOSE_TIMEOUT_S)


async def speaks_tls(host: str, port: int) -> bool:
    """Whether ``host:port`` answers a TLS handshake (any certificate)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        await handshake(host, port, context)
    except ssl.SSLError as exc:  # an alert is TLS talking (a client certificate wanted...)
        return "ALERT" in str(exc.reason or "").upper()
    except (OSError, TimeoutError):
        return False
    return True
