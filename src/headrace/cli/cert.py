"""``headrace cert``: a test CA and a server certificate signed by it, for TLS.

Writes three PEM files into a directory: ``ca.pem`` (the CA certificate,
what clients pass as ``--ca``), ``server.pem`` and ``server-key.pem`` (what
``headrace serve`` takes as ``--tls-cert`` and ``--tls-key``). The server
certificate is signed by the CA, not self-signed: the real Pravega client
(rustls) refuses a CA certificate used as a server's, and hangs retrying.
The CA's key is not kept: the CA signs this one certificate and nothing else.

For testing and private networks; a production server should get its
certificate from the organisation's CA (``docs/security.md``).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path
from typing import TYPE_CHECKING, Final

import click

if TYPE_CHECKING:
    from cryptography import x509

__all__ = ["cert", "make_test_certificates"]

DEFAULT_DAYS: Final = 365
"""Validity of the certificates made; a test setup outlives a year rarely."""

KEY_FILE_MODE: Final = 0o600
"""The server's private key is readable by its owner only."""

FILES: Final = ("ca.pem", "server.pem", "server-key.pem")
"""What ``headrace cert`` writes."""


def _key_usage(*, signer: bool) -> x509.KeyUsage:
    """A CA signs certificates (and CRLs); a server only signs its handshakes."""
    from cryptography import x509

    return x509.KeyUsage(
        digital_signature=not signer,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=signer,
        crl_sign=signer,
        encipher_only=False,
        decipher_only=False,
    )


def make_test_certificates(
    directory: Path, dns_names: list[str], ips: list[str], days: int = DEFAULT_DAYS
) -> tuple[Path, Path, Path]:
    """Write ``ca.pem``, ``server.pem`` and ``server-key.pem`` into ``directory``.

    The server certificate names ``dns_names`` and ``ips`` (subjectAltName),
    is for server authentication only, and is signed by a new CA (EC P-256).

    Returns:
        The paths of the CA certificate, the server certificate and its key.

    Raises:
        ValueError: an entry of ``ips`` is not an IP address.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    addresses = [ipaddress.ip_address(ip) for ip in ips]
    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(hours=1), now + datetime.timedelta(days=days)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "headrace test CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(signer=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )

    key = ec.generate_private_key(ec.SECP256R1())
    common_name = (dns_names or ips)[0]
    alt_names: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
    alt_names += [x509.IPAddress(address) for address in addresses]
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(signer=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )

    directory.mkdir(parents=True, exist_ok=True)
    ca_path, cert_path, key_path = (directory / name for name in FILES)
    ca_path.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    cert_path.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    key_bytes = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, KEY_FILE_MODE)
    with os.fdopen(fd, "wb") as file:
        os.fchmod(file.fileno(), KEY_FILE_MODE)  # whatever the umask or an older file
        file.write(key_bytes)
    return ca_path, cert_path, key_path


@click.command()
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--dns", "dns_names", multiple=True, metavar="NAME",
    help="A DNS name of the server (repeatable). Default: localhost, unless --ip is given.",
)  # fmt: skip
@click.option(
    "--ip", "ips", multiple=True, metavar="ADDRESS",
    help="An IP address of the server (repeatable). Default: 127.0.0.1, unless --dns is given.",
)  # fmt: skip
@click.option(
    "--days", type=click.IntRange(1, 3650), default=DEFAULT_DAYS, show_default=True,
    help="Days the certificates stay valid.",
)  # fmt: skip
@click.option("--force", is_flag=True, help="Overwrite the files if they exist.")
def cert(
    directory: Path, dns_names: tuple[str, ...], ips: tuple[str, ...], days: int, force: bool
) -> None:
    """Make a test CA and a server certificate it signs, in DIRECTORY.

    Writes ca.pem (give it to clients: --ca), server.pem and server-key.pem
    (give them to the server: headrace serve --tls-cert server.pem --tls-key
    server-key.pem). Clients must connect by one of the names or addresses.
    """
    if not dns_names and not ips:
        dns_names, ips = ("localhost",), ("127.0.0.1",)
    for ip in ips:
        try:
            ipaddress.ip_address(ip)
        except ValueError as exc:
            raise click.BadParameter(f"{ip!r} is not an IP address", param_hint="--ip") from exc
    existing = [name for name in FILES if (directory / name).exists()]
    if existing and not force:
        raise click.ClickException(
            f"{directory} already holds {', '.join(existing)}: pass --force to replace "
            "them, or choose another directory"
        )
    try:
        paths = make_test_certificates(directory, list(dns_names), list(ips), days)
    except OSError as exc:
        raise click.ClickException(
            f"cannot write the certificates into {directory} ({exc.strerror or exc}): "
            "choose another directory"
        ) from exc
    for path in paths:
        click.echo(str(path))
    names = ", ".join([*dns_names, *ips])
    click.echo(
        f"certificates for {names}, valid {days} days; start the server with "
        f"--tls-cert {paths[1]} --tls-key {paths[2]} and give clients --ca {paths[0]}",
        err=True,
    )
