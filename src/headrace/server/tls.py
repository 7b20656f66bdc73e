"""TLS for the front doors: one place that turns ``--tls-*`` options into an SSLContext.

Every listener that speaks TLS uses the same certificate, key and optional
client CA (``ServerConfig.tls``); this module builds the server-side
``ssl.SSLContext`` for them. Protocol adapters never see TLS: the accept loop
wraps the socket and the adapter reads plaintext.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from headrace.errors import ConfigError

__all__ = ["TlsConfig", "server_ssl_context"]


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """Certificate files for TLS listeners (``--tls-cert``, ``--tls-key``, ``--tls-ca``).

    Attributes:
        cert: PEM certificate chain the server presents.
        key: PEM private key of ``cert``.
        ca: PEM CA bundle; when given, clients must present a certificate
            signed by it (mutual TLS), otherwise client certificates are not asked for.
    """

    cert: Path
    key: Path
    ca: Path | None = None


def server_ssl_context(tls: TlsConfig) -> ssl.SSLContext:
    """A server ``SSLContext`` for ``tls``: TLS 1.2 or later, the library's default ciphers.

    TLS 1.2 is the floor: every client we serve (Beats, logstash-forwarder,
    pylogbeat, the npm clients, the Pravega client) negotiates it, and older
    versions are disabled by default in current OpenSSL builds anyway.

    Raises:
        ConfigError: a file is missing or unreadable, or the key does not match
            the certificate.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(tls.cert, tls.key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"--tls-cert {tls.cert} / --tls-key {tls.key}: {exc}") from exc
    if tls.ca is not None:
        try:
            context.load_verify_locations(cafile=tls.ca)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"--tls-ca {tls.ca}: {exc}") from exc
        context.verify_mode = ssl.CERT_REQUIRED
    return context
