"""``headrace status``: a summary of a running server, read from its HTTP port.

Reads ``/health`` and ``/metrics`` (the Prometheus text format, parsed with
prometheus-client's parser) and prints listeners, connections, traffic,
storage and latency. Exit status 0 when the server reports healthy, 1 when
it answers but is not (a listener down), 2 when it cannot be reached.

A server started with ``--tls-cert`` serves HTTPS on that port: ``--https``
(or any of ``--ca``, ``--client-cert``, ``--insecure``) reads it over TLS.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import urllib.error
import urllib.request

import click

from headrace.errors import HeadraceError

from ._client import client_tls, tls_options

__all__ = ["status"]

TIMEOUT_S = 5.0
"""Per request: a healthy server answers in milliseconds."""


def _get(url: str, context: ssl.SSLContext | None = None) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S, context=context) as response:
            return int(response.status), bytes(response.read())
    except urllib.error.HTTPError as exc:  # 503 still carries the health report
        return exc.code, exc.read()


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return values


def _by_label(
    values: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, label: str
) -> dict[str, float]:
    return {
        dict(labels)[label]: value
        for (sample, labels), value in values.items()
        if sample == name and label in dict(labels)
    }


def _size(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")


def _mean_ms(values: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str) -> str:
    count = values.get((f"{name}_count", ()), 0.0)
    total = values.get((f"{name}_sum", ()), 0.0)
    return f"{count:.0f} (mean {1000 * total / count:.2f} ms)" if count else "0"


_POINT = "point --http-port (or HEADRACE_HTTP_PORT) at the server's HTTP port (default 9100)"


class _Unreachable(click.ClickException):
    """The server's HTTP port could not be read: one ``Error:`` line, exit status 2."""

    exit_code = 2


def _why(host: str, port: int, context: ssl.SSLContext | None, exc: Exception) -> str:
    """Why ``host:port`` could not be read, and the fix, in one line."""
    import asyncio

    from ._probe import speaks_tls

    where = f"{host}:{port}"
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, ssl.SSLCertVerificationError):
        return (
            f"the certificate of {where} is not trusted ({reason.verify_message}): "
            "pass --ca with the CA that signed it"
        )
    if isinstance(reason, ConnectionRefusedError | TimeoutError | socket.gaierror):
        text = reason.strerror or str(reason)
        return (
            f"cannot reach {where} ({text}): is headrace serve running? Check --host, and {_POINT}"
        )
    tls = asyncio.run(speaks_tls(host, port))
    if context is None and tls:
        return f"{where} speaks TLS (the server has --tls-cert): use --https, and --ca FILE"
    if context is not None and not tls:
        return f"{where} does not speak TLS: leave out --https and the TLS flags"
    return f"{where} does not answer as an HTTP port: {_POINT}"


@click.command()
@click.option("--host", default="127.0.0.1", envvar="HEADRACE_HOST", show_default=True)
@click.option(
    "--http-port",
    type=click.IntRange(1, 65535),
    default=9100,
    envvar="HEADRACE_HTTP_PORT",
    show_default=True,
    help="The server's HTTP port (/health, /metrics).",
)
@click.option("--https", is_flag=True, help="The port speaks TLS (the server has --tls-cert).")
@tls_options
def status(host: str, http_port: int, https: bool) -> None:
    """Print a summary of a running server (from its HTTP port)."""
    tls = client_tls()
    if tls is None and https:
        from headrace.client.tls import TlsOptions

        tls = TlsOptions()  # the system's CAs
    try:
        context = None if tls is None else tls.ssl_context()
    except HeadraceError as exc:
        raise click.ClickException(str(exc)) from exc
    base = f"{'http' if context is None else 'https'}://{host}:{http_port}"
    try:
        health_status, health_body = _get(f"{base}/health", context)
        _, metrics_body = _get(f"{base}/metrics", context)
    except (OSError, urllib.error.URLError, http.client.HTTPException) as exc:
        raise _Unreachable(_why(host, http_port, context, exc)) from exc
    try:
        report = json.loads(health_body)
        if not isinstance(report, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        raise _Unreachable(
            f"{host}:{http_port} answers HTTP but not as headrace's /health: {_POINT}"
        ) from exc
    values = _samples(metrics_body.decode())
    click.echo(f"server {base}: {report.get('status', '?')}")
    if report.get("store", "ok") != "ok":
        click.echo(f"store: {report['store']}")
    click.echo("listeners:")
    opened = _by_label(values, "headrace_connections_total", "protocol")
    open_now = _by_label(values, "headrace_connections_open", "protocol")
    requests = _by_label(values, "headrace_requests_total", "protocol")
    received = _by_label(values, "headrace_received_bytes_total", "protocol")
    sent = _by_label(values, "headrace_sent_bytes_total", "protocol")
    for name, entry in sorted(report.get("listeners", {}).items()):
        state = "up" if entry.get("up") else "DOWN"
        line = f"  {name:<15} {entry.get('port', '?'):>5}  {state}"
        if name in opened:
            line += (
                f"  connections {open_now.get(name, 0):.0f} open / {opened[name]:.0f} total"
                f"  requests {requests.get(name, 0):.0f}"
                f"  in {_size(received.get(name, 0))}  out {_size(sent.get(name, 0))}"
            )
        click.echo(line)
    errors: dict[str, float] = {}
    for (sample, labels), value in values.items():
        if sample == "headrace_errors_total" and value:
            kind = dict(labels).get("kind", "?")
            errors[kind] = errors.get(kind, 0) + value
    click.echo(
        "storage: "
        f"{values.get(('headrace_streams', ()), 0):.0f} streams, "
        f"{values.get(('headrace_segments', ()), 0):.0f} segments, "
        f"{_size(values.get(('headrace_stored_bytes', ()), 0))} stored, "
        f"{values.get(('headrace_parked_readers', ()), 0):.0f} parked readers"
    )
    click.echo(
        f"appends: {_mean_ms(values, 'headrace_append_seconds')}; "
        f"fsyncs: {_mean_ms(values, 'headrace_fsync_seconds')}"
    )
    click.echo(
        "errors: "
        + (", ".join(f"{kind} {count:.0f}" for kind, count in sorted(errors.items())) or "none")
    )
    if health_status != 200:
        raise SystemExit(1)
