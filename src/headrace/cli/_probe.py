"""Looking at a port with plain sockets, to tell a person what it speaks.

Used when a command cannot talk to a port: does it answer TLS at all, and
does it answer HTTP/2 as a gRPC server does? Each look is bounded by
``DIAGNOSE_TIMEOUT_S``. Free of the client and gRPC, so
``headrace status`` can use it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from typing import Final

__all__ = ["DIAGNOSE_TIMEOUT_S", "answer_to_http2", "handshake", "speaks_tls"]

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


HTTP2_PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
"""The HTTP/2 client connection preface, then an empty SETTINGS frame (RFC 9113)."""

SETTINGS_FRAME: Final = 0x04
"""Type of the frame an HTTP/2 server sends first (its SETTINGS)."""


async def answer_to_http2(host: str, port: int, context: ssl.SSLContext | None) -> str:
    """How ``host:port`` answers the HTTP/2 preface (over TLS with ``context``):
    ``"http2"`` (a SETTINGS frame: a gRPC server), ``"other"`` (anything else,
    or a close) or ``"silent"`` (nothing within ``DIAGNOSE_TIMEOUT_S``)."""
    if context is not None:
        context.set_alpn_protocols(["h2"])
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(
                host, port, ssl=context, server_hostname=None if context is None else host
            ),
            DIAGNOSE_TIMEOUT_S,
        )
    except TimeoutError:
        return "silent"
    except OSError:  # ssl.SSLError included
        return "other"
    try:
        writer.write(HTTP2_PREFACE)
        header = await asyncio.wait_for(reader.readexactly(9), DIAGNOSE_TIMEOUT_S)
    except TimeoutError:
        return "silent"
    except (OSError, asyncio.IncompleteReadError):
        return "other"
    finally:
        writer.close()
    return "http2" if header[3] == SETTINGS_FRAME else "other"
