"""``headrace user add|remove|list``: manage the password file of ``--auth-password-file``.

The file is rewritten atomically (temporary file, fsync, rename) with mode
0600, so a server reading it at the same moment sees the old or the new file,
never half of one; the server re-reads it when it changes. Passwords are read
from a prompt (twice) or, with ``--password-stdin``, from the first line of
standard input, and never appear on the command line or in the file. A user
may also (or, with ``--no-password``, only) be known by the names on its TLS
client certificate (``--cert CN=host-1``, ``--cert DNS=host-1.example.com``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from headrace.controller.auth import (
    CERT_NAME_KINDS,
    NO_PASSWORD,
    CertName,
    PasswordFile,
    UserEntry,
    check_user_name,
    hash_password,
    parse_cert_name,
)
from headrace.errors import ConfigError
from headrace.protocols.pravega.auth import Grant, parse_grant

__all__ = ["user"]

MIN_PASSWORD_CHARS = 8
"""Shortest password accepted: short ones fall to guessing even through scrypt."""

_FILE = click.option(
    "--file",
    "path",
    required=True,
    envvar="HEADRACE_AUTH_PASSWORD_FILE",
    show_envvar=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The password file (the server's --auth-password-file).",
)


def _load(path: Path, *, missing_ok: bool) -> PasswordFile:
    if missing_ok and not path.exists():
        return PasswordFile()
    try:
        return PasswordFile.load(path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from exc


def _save(users: PasswordFile, path: Path) -> None:
    try:
        users.save(path)
    except OSError as exc:
        raise click.ClickException(f"cannot write {path}: {exc.strerror}") from exc


def _grant(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> list[Grant]:
    try:
        return [parse_grant(value) for value in values]
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


def _certs(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> list[CertName]:
    try:
        return [parse_cert_name(value) for value in values]
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


def _name(ctx: click.Context, param: click.Parameter, value: str) -> str:
    try:
        return check_user_name(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


@click.group()
def user() -> None:
    """Manage users of the password file (--auth-password-file)."""


@user.command()
@click.argument("name", callback=_name)
@_FILE
@click.option(
    "--permission",
    "grants",
    multiple=True,
    callback=_grant,
    metavar="RESOURCE,PERM",
    help="A grant, e.g. 'prn::/*,READ_UPDATE' or 'prn::/scope:logs,READ' (repeatable).",
)
@click.option(
    "--cert",
    "certs",
    multiple=True,
    callback=_certs,
    metavar="KIND=VALUE",
    help="A name on the user's TLS client certificate that identifies it on every front "
    f"door; KIND is one of {', '.join(CERT_NAME_KINDS)} (subject CN or a subjectAltName "
    "entry), e.g. 'CN=filebeat-1' (repeatable).",
)
@click.option(
    "--password-stdin", is_flag=True, help="Read the password from the first line of stdin."
)
@click.option(
    "--no-password",
    is_flag=True,
    help="No password: the user is known by its certificate (--cert) only.",
)
@click.option("--replace", is_flag=True, help="Overwrite an existing user.")
def add(
    name: str,
    path: Path,
    grants: list[Grant],
    certs: list[CertName],
    password_stdin: bool,
    no_password: bool,
    replace: bool,
) -> None:
    """Add user NAME (creating the file if needed) with its grants."""
    users = _load(path, missing_ok=True)
    if name in users.users and not replace:
        raise click.ClickException(f"user {name!r} exists in {path}; use --replace")
    if no_password and not certs:
        raise click.ClickException("--no-password needs --cert: the user could never log in")
    owners = {cert: user for user, entry in users.users.items() for cert in entry.certs}
    for cert in certs:
        owner = owners.get(cert)
        if owner is not None and owner != name:
            raise click.ClickException(f"{cert} already identifies user {owner!r}")
    if no_password:
        password_hash = NO_PASSWORD
    else:
        if password_stdin:
            password = sys.stdin.readline().rstrip("\r\n")
        else:
            password = click.prompt("Password", hide_input=True, confirmation_prompt=True)
        if len(password) < MIN_PASSWORD_CHARS:
            raise click.ClickException(
                f"the password must have at least {MIN_PASSWORD_CHARS} characters"
            )
        password_hash = hash_password(password)
    if not grants:
        click.echo(f"note: {name!r} has no grants and can do nothing but log in", err=True)
    users.users[name] = UserEntry(name, password_hash, tuple(grants), tuple(dict.fromkeys(certs)))
    _save(users, path)
    click.echo(f"user {name} saved in {path}")


@user.command()
@click.argument("name")
@_FILE
def remove(name: str, path: Path) -> None:
    """Remove user NAME. Tokens already issued to it stay valid until they expire."""
    users = _load(path, missing_ok=False)
    if users.users.pop(name, None) is None:
        raise click.ClickException(f"no user {name!r} in {path}")
    _save(users, path)
    click.echo(f"user {name} removed from {path}")


@user.command(name="list")
@_FILE
def list_users(path: Path) -> None:
    """List the users, their grants and certificate names (never the hashes)."""
    for entry in _load(path, missing_ok=False).users.values():
        items = [*map(str, entry.grants), *map(str, entry.certs)]
        click.echo(f"{entry.name}\t" + " ".join(items))
