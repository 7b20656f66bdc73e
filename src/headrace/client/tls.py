"""TLS options of every client: one value that the Pravega, TANK and RS-IO clients take.

A server started with ``--tls-cert/--tls-key`` serves TLS on every port, so a
client needs the same few settings whichever protocol it speaks:

* which certificate authorities to trust (``ca_file``; default: the system's
  trust store, as a browser would);
* whether to check the server's certificate at all (``verify``; the Pravega
  client's ``disable_cert_verification`` is ``verify=False``);
* a client certificate and key (``cert_file``/``key_file``), for a server
  started with ``--tls-ca`` (mutual TLS: the credential of protocols that have
  none of their own, such as TANK and RS-IO).

``TlsOptions.ssl_context()`` serves the asyncio clients (segment store, TANK,
RS-IO, HTTP); ``TlsOptions.grpc_credentials()`` the controller client, whose
gRPC channel does its own TLS.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from headrace.errors import ConfigError

__all__ = ["TLS_SCHEMES", "TlsOptions", "uri_wants_tls"]

TLS_SCHEMES = frozenset({"tls", "ssl", "tcps", "pravegas"})
"""Controller URI schemes that mean TLS (the Rust client's set,
pravega-controller.md#transport)."""


def uri_wants_tls(uri: str) -> bool:
    """Whether a controller URI's scheme asks for TLS (``tls://host:port`` and kin)."""
    return "://" in uri and urlparse(uri).scheme in TLS_SCHEMES


@dataclass(frozen=True, slots=True)
class TlsOptions:
    """How a client does TLS. ``TlsOptions()`` trusts the system's CAs.

    Attributes:
        ca_file: PEM bundle of the CAs to trust instead of the system's.
        verify: check the server's certificate and name; False (only for
            testing) accepts any certificate, like the Pravega client's
            ``disable_cert_verification=True``.
        cert_file: PEM client certificate to present (mutual TLS).
        key_file: PEM key of ``cert_file`` (may be omitted when ``cert_file``
            holds the key too).
    """

    ca_file: Path | None = None
    verify: bool = True
    cert_file: Path | None = None
    key_file: Path | None = None

    def __post_init__(self) -> None:
        if self.key_file is not None and self.cert_file is None:
            raise ConfigError("a TLS client key needs its certificate (cert_file)")

    def ssl_context(self) -> ssl.SSLContext:
        """A client ``SSLContext``: TLS 1.2 or later, hostname checked unless ``verify`` is off.

        Raises:
            ConfigError: a file is missing or is not PEM.
        """
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            if self.ca_file is not None:
                context.load_verify_locations(cafile=self.ca_file)
            if self.cert_file is not None:
                context.load_cert_chain(self.cert_file, self.key_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"TLS client files: {exc}") from exc
        if not self.verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context

    def grpc_credentials(self) -> Any:
        """``grpc.ChannelCredentials`` for the controller client.

        Raises:
            ConfigError: ``verify`` is off (gRPC's Python API has no way to skip
                the check: give the server's CA as ``ca_file`` instead), or a
                file cannot be read.
        """
        import grpc  # type: ignore[import-untyped]

        if not self.verify:
            raise ConfigError(
                "the controller client cannot skip certificate verification (gRPC "
                "does not allow it): pass the server's CA file instead"
            )
        try:
            ca = None if self.ca_file is None else self.ca_file.read_bytes()
            cert = None if self.cert_file is None else self.cert_file.read_bytes()
            key_path = self.key_file if self.key_file is not None else self.cert_file
            key = None if key_path is None else key_path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"TLS client files: {exc}") from exc
        return grpc.ssl_channel_credentials(
            root_certificates=ca, private_key=key, certificate_chain=cert
        )
