"""``headrace context add|list|use|show|remove``: saved connection settings (``nats
context`` / ``kubectl config`` style), so ``--controller``, the TLS files and the
credentials need not be typed on every command.

Contexts live in ``$XDG_CONFIG_HOME/headrace/contexts.json`` (``~/.config`` when
the variable is unset), written 0600: one object per context, and which one is
current. A context holds file paths (a password *file*, never a password).

A client command uses the context named by ``--context`` / ``HEADRACE_CONTEXT``,
else the current one. Its values are defaults: a flag or a ``HEADRACE_*``
variable given for the same setting wins (``apply_context`` sets only the
variables that are not set).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Final

import click

from ._output import echo_json, echo_table, json_option

__all__ = ["CONTEXT_SETTINGS", "apply_context", "config_dir", "context"]

CONTEXT_SETTINGS: Final = {
    "controller": "HEADRACE_CONTROLLER",
    "ca": "HEADRACE_CA",
    "client_cert": "HEADRACE_CLIENT_CERT",
    "client_key": "HEADRACE_CLIENT_KEY",
    "user": "HEADRACE_USER",
    "password_file": "HEADRACE_PASSWORD_FILE",
}
"""What a context may hold -> the environment variable of the client flag it sets."""

MAX_CONTEXTS_FILE_BYTES: Final = 1024 * 1024
"""A contexts file larger than this is not read (it is a few hundred bytes per context)."""

_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")


def config_dir() -> Path:
    """``$XDG_CONFIG_HOME/headrace``, or ``~/.config/headrace``."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "headrace"


def _path() -> Path:
    return config_dir() / "contexts.json"


def _load() -> dict[str, object]:
    path = _path()
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_CONTEXTS_FILE_BYTES + 1)
    except FileNotFoundError:
        return {"current": None, "contexts": {}}
    except OSError as exc:
        raise click.ClickException(f"cannot read {path}: {exc.strerror}") from exc
    if len(raw) > MAX_CONTEXTS_FILE_BYTES:
        raise click.ClickException(f"{path} is over {MAX_CONTEXTS_FILE_BYTES} bytes")
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise click.ClickException(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("contexts"), dict):
        raise click.ClickException(f"{path} does not hold headrace contexts")
    return data


def _contexts(data: dict[str, object]) -> dict[str, dict[str, str]]:
    contexts = data["contexts"]
    assert isinstance(contexts, dict)
    return contexts


def _save(data: dict[str, object]) -> Path:
    path = _path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)
    except OSError as exc:
        raise click.ClickException(f"cannot write {path}: {exc.strerror}") from exc
    return path


def apply_context(name: str | None) -> None:
    """Make context ``name`` (or the current one) the defaults of the client flags.

    Raises:
        click.UsageError: ``name`` is not a saved context.
    """
    data = _load()
    contexts = _contexts(data)
    chosen = name or data.get("current")
    if not chosen:
        return
    values = contexts.get(str(chosen))
    if values is None:
        known = ", ".join(sorted(contexts)) or "none saved"
        raise click.UsageError(f"no context {chosen!r} (known: {known}; see headrace context add)")
    for key, envvar in CONTEXT_SETTINGS.items():
        value = values.get(key)
        if value:
            os.environ.setdefault(envvar, str(value))


@click.group()
def context() -> None:
    """Save, list and choose connection settings (controller, TLS, credentials)."""


def _file(value: Path | None) -> str | None:
    return None if value is None else str(value.resolve())


@context.command()
@click.argument("name")
@click.option("--controller", required=True, help="Controller URI (tls://host:port for TLS).")
@click.option("--ca", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--client-cert", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--client-key", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--user", help="Auth user name (with --password-file).")
@click.option(
    "--password-file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="File whose first line is --user's password (the path is saved, not the password).",
)  # fmt: skip
@click.option("--use/--no-use", default=None, help="Make it current (default: if it is the first).")
def add(
    name: str,
    controller: str,
    ca: Path | None,
    client_cert: Path | None,
    client_key: Path | None,
    user: str | None,
    password_file: Path | None,
    use: bool | None,
) -> None:
    """Save context NAME (replacing one of that name).

    \b
    Example:
      headrace context add prod --controller tls://hr.example:9090 --ca ca.pem
      headrace --context prod stream list
    """
    if not _NAME.fullmatch(name):
        raise click.BadParameter("1-64 letters, digits, '.', '_' or '-'", param_hint="NAME")
    if (user is None) != (password_file is None):
        raise click.UsageError("--user and --password-file go together")
    from headrace.client.controller import parse_controller_uri

    try:
        parse_controller_uri(controller)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--controller") from exc
    data = _load()
    contexts = _contexts(data)
    values = {
        "controller": controller,
        "ca": _file(ca),
        "client_cert": _file(client_cert),
        "client_key": _file(client_key),
        "user": user,
        "password_file": _file(password_file),
    }
    contexts[name] = {k: v for k, v in values.items() if v is not None}
    if use or (use is None and not data.get("current")):
        data["current"] = name
    path = _save(data)
    current = " (current)" if data.get("current") == name else ""
    click.echo(f"saved: {name}{current} in {path}")


@context.command(name="list")
@json_option
def list_(as_json: bool) -> None:
    """List the saved contexts; * marks the current one."""
    data = _load()
    contexts = _contexts(data)
    current = data.get("current")
    if as_json:
        echo_json({"current": current, "contexts": contexts})
        return
    rows = []
    for name, c in sorted(contexts.items()):
        tls = "ca" if c.get("ca") else ("on" if c.get("controller", "").startswith("tls") else None)
        rows.append(("*" if name == current else "", name, c.get("controller"), tls, c.get("user")))
    echo_table(["", "NAME", "CONTROLLER", "TLS", "USER"], rows)


@context.command()
@click.argument("name")
def use(name: str) -> None:
    """Make NAME the current context."""
    data = _load()
    if name not in _contexts(data):
        raise click.ClickException(f"no context {name!r}")
    data["current"] = name
    _save(data)
    click.echo(f"current: {name}")


@context.command()
@click.argument("name", required=False)
def show(name: str | None) -> None:
    """Print context NAME (default: the current one) as JSON."""
    data = _load()
    chosen = name or data.get("current")
    values = _contexts(data).get(str(chosen)) if chosen else None
    if values is None:
        raise click.ClickException(f"no context {chosen!r}" if chosen else "no current context")
    echo_json({"name": chosen, **values})


@context.command()
@click.argument("name")
def remove(name: str) -> None:
    """Forget context NAME."""
    data = _load()
    if _contexts(data).pop(name, None) is None:
        raise click.ClickException(f"no context {name!r}")
    if data.get("current") == name:
        data["current"] = None
    _save(data)
    click.echo(f"removed: {name}")
