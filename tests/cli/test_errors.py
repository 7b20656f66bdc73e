"""Mistakes a user makes with the CLI end in one ``Error:`` line naming the cause
and the fix, with no traceback, and quickly: the real CLI as a subprocess,
against real ``headrace serve`` processes where a server is needed.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._real_pravega import run_scenario
from tests._server import (
    FREE,
    ServerProcess,
    TlsFiles,
    add_user,
    free_port,
    run_cli,
    serve_command,
    server_env,
)

CLI_TIMEOUT_S = 60.0
"""Bound on one command run here."""
STOPPED_REPORT_S = 10.0
"""Bound on reporting a server that takes connections and says nothing: the 2 s
wait, then a look at the port bounded by 1 s per step, plus a Python start."""
RETRY_NOTICE_S = 20.0
"""Bound on a retry notice appearing (the first wait of 0.5 s comes after about
1 s of retries) and on a reader's first record, on a busy machine."""
POLL_S = 0.05
"""Pause between two looks at a command's output file, under a deadline."""
UNREACHABLE_REPORT_S = 7.0
"""Bound on a command against a controller it cannot talk to: about 2 s of
waiting plus a Python start and imports on a busy machine (the client's own
retries would take about 20 s)."""


def one_error(result: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    """Assert exit ``code``, exactly one ``Error:`` line holding every needle, no
    traceback; for exit 1, nothing else on stderr. Returns the line."""
    assert result.returncode == code, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    errors = [line for line in lines if line.startswith("Error:")]
    assert len(errors) == 1, result.stderr
    if code == 1:
        assert lines == errors, result.stderr
    for needle in needles:
        assert needle in errors[0], (needle, errors[0])
    return errors[0]


def serve(
    data_dir: Path, *args: str, wrap: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """``headrace serve`` expected to stop at once (bounded)."""
    return subprocess.run(
        [*wrap, *serve_command(data_dir, *args)],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        env=server_env(),
    )


def every_port_off(**ports: int) -> list[str]:
    names = ("controller", "segment-store", "tank", "lumberjack", "lumberjack-tls", "rsio", "http")
    return [f"--{name}-port={ports.get(name.replace('-', '_'), 0)}" for name in names]


# --------------------------------------------------------------------------- serve


@pytest.mark.parametrize("listener", ["controller", "tank", "http"])
def test_serve_names_the_listener_whose_port_is_taken(tmp_path: Path, listener: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = serve(
            tmp_path / "data", "--host", "127.0.0.1", *every_port_off(**{listener: port})
        )
    flag = f"--{listener}-port"
    one_error(
        result, 1, f"{listener} listener", f"127.0.0.1:{port}", "address already in use", flag
    )


def test_serve_refuses_a_data_dir_under_a_file(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    result = serve(tmp_path / "file" / "data", *every_port_off())
    one_error(result, 1, "cannot create the data dir", "is not a directory", "--data-dir")


def test_serve_refuses_a_data_dir_it_cannot_write(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    # root passes every permission check; in a user namespace of its own it
    # meets the owner's bits like anyone else.
    wrap = ("unshare", "--user") if os.geteuid() == 0 else ()
    for data_dir, what in ((locked, "write to"), (locked / "data", "create")):
        result = serve(data_dir, *every_port_off(), wrap=wrap)
        one_error(result, 1, f"cannot {what} the data dir", "no write permission", "--data-dir")
    assert not (locked / "data").exists()


def test_serve_says_a_data_dir_is_in_use(tmp_path: Path) -> None:
    with ServerProcess(tmp_path / "data", ports={}):
        result = serve(tmp_path / "data", *every_port_off())
    one_error(result, 1, "in use by another store", "headrace serve", "another data dir")


def test_serve_says_which_tls_file_is_wrong(tmp_path: Path) -> None:
    for name in ("one", "two"):
        assert run_cli("cert", str(tmp_path / name)).returncode == 0
    one, two = tmp_path / "one", tmp_path / "two"
    cases = [
        (one / "ca.pem", one / "server.pem", "is not a PEM private key"),
        (one / "server-key.pem", one / "server-key.pem", "is not a PEM certificate"),
        (one / "server.pem", two / "server-key.pem", "is not the key of --tls-cert"),
    ]
    for cert, key, says in cases:
        flags = ["--tls-cert", str(cert), "--tls-key", str(key)]
        result = serve(tmp_path / "data", *every_port_off(tank=free_port()), *flags)
        one_error(result, 1, says)


# --------------------------------------------------------------------------- no server


@pytest.mark.parametrize("uri", ["nonsense", "http://127.0.0.1:9090", "tcp://127.0.0.1:99999"])
def test_a_bad_controller_value_is_refused_in_one_line(uri: str) -> None:
    one_error(run_cli("stream", "list", "--controller", uri), 2, "--controller", "tcp://HOST:PORT")


@pytest.mark.parametrize(
    ("option", "value"),
    [("--from", "garbage:12"), ("--from", "sc/st/0.#epoch.0:abc"), ("--until", "-3")],
)
def test_a_bad_read_position_is_refused_in_one_line(option: str, value: str) -> None:
    result = run_cli(
        "read", "--controller", f"tcp://127.0.0.1:{free_port()}", "sc/st", option, value
    )
    one_error(result, 2, option)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_an_unreachable_controller_is_reported_within_seconds(host: str) -> None:
    began = time.monotonic()
    result = run_cli("stream", "list", "--controller", f"tcp://{host}:{free_port()}")
    took = time.monotonic() - began
    one_error(result, 1, "cannot reach the controller", "is headrace serve running", "--controller")
    assert took < UNREACHABLE_REPORT_S, took


def _wait_for_text(path: Path, text: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        content = path.read_text(errors="replace")
        if text in content:
            return content
        assert time.monotonic() < deadline, (text, content[-2000:])
        time.sleep(POLL_S)


@pytest.mark.slow
def test_a_long_retry_says_it_is_retrying(tmp_path: Path) -> None:
    """A reader whose server went away says it is retrying while it waits."""
    out, err = tmp_path / "read.out", tmp_path / "read.err"
    with ServerProcess(tmp_path / "data", ports={"controller": FREE, "segment_store": FREE}) as srv:
        controller = ["--controller", srv.uri]
        assert run_cli("stream", "create", *controller, "demo/r").returncode == 0
        assert run_cli("write", *controller, "demo/r", stdin="first\n").returncode == 0
        command = [sys.executable, "-m", "headrace", "read", *controller, "demo/r"]
        with out.open("wb") as stdout, err.open("wb") as stderr:
            reader = subprocess.Popen(
                [*command, "--until", "never"], stdout=stdout, stderr=stderr, env=server_env()
            )
        try:
            _wait_for_text(out, "first", RETRY_NOTICE_S)  # reading: connected to both
            srv.stop()
            log = _wait_for_text(err, "retrying", RETRY_NOTICE_S)
        finally:
            reader.kill()
            reader.wait(CLI_TIMEOUT_S)
    assert "Traceback" not in log, log
    notices = [line for line in log.splitlines() if "retrying" in line]
    assert notices[0].startswith("headrace: "), log
    assert "unreachable" in notices[0] or "unavailable" in notices[0], log


# --------------------------------------------------------------------------- a plain server


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with ServerProcess(
        tmp_path_factory.mktemp("plain") / "data",
        ports={"controller": FREE, "segment_store": FREE, "tank": FREE, "http": FREE},
    ) as srv:
        yield srv


def test_a_missing_stream_says_how_to_create_it(plain: ServerProcess) -> None:
    controller = ["--controller", plain.uri]
    fix = "no stream demo/nope (create it with: headrace stream create demo/nope)"
    for args in (["stream", "info"], ["read"], ["write"]):
        one_error(run_cli(*args, *controller, "demo/nope", stdin="x\n"), 1, fix)


def test_a_missing_scope_is_an_error(plain: ServerProcess) -> None:
    one_error(run_cli("stream", "list", "--controller", plain.uri, "nope"), 1, "no scope nope")


@pytest.mark.parametrize("name", ["bad name/st", "demo/bad_name", "demo/_st"])
def test_an_invalid_name_says_which_names_are_allowed(plain: ServerProcess, name: str) -> None:
    result = run_cli("stream", "create", "--controller", plain.uri, name)
    one_error(result, 2, "is not allowed", "letters, digits, '.' and '-'")


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--retention-bytes", "100", "--retention-ms", "10"], ["cannot go together"]),
        (["--segments", "0"], ["--segments", "0"]),
    ],
)
def test_stream_create_refuses_options_it_cannot_honour(
    plain: ServerProcess, args: list[str], needles: list[str]
) -> None:
    result = run_cli("stream", "create", "--controller", plain.uri, "demo/opts", *args)
    one_error(result, 2, *needles)
    listed = run_cli("stream", "list", "--controller", plain.uri, "demo")
    assert "opts" not in listed.stdout  # nothing was created


@pytest.mark.parametrize("listener", ["tank", "http"])
def test_a_port_that_is_not_the_controller_says_so(plain: ServerProcess, listener: str) -> None:
    uri = f"tcp://127.0.0.1:{plain.port_of(listener)}"
    began = time.monotonic()
    result = run_cli("stream", "list", "--controller", uri)
    assert time.monotonic() - began < UNREACHABLE_REPORT_S
    one_error(result, 1, "does not answer as a controller", "--controller")


def test_a_stopped_server_is_reported_not_waited_for(tmp_path: Path) -> None:
    """A server that takes connections but answers nothing (SIGSTOP) is reported
    in seconds; once it runs again, the same command works."""
    with ServerProcess(tmp_path / "data", ports={"controller": FREE}) as srv:
        assert srv.process is not None
        srv.process.send_signal(signal.SIGSTOP)
        try:
            began = time.monotonic()
            result = run_cli("stream", "list", "--controller", srv.uri)
            took = time.monotonic() - began
        finally:
            srv.process.send_signal(signal.SIGCONT)
        one_error(result, 1, "does not answer", "--controller")
        assert took < STOPPED_REPORT_S, took
        assert run_cli("stream", "list", "--controller", srv.uri).returncode == 0


def test_tls_to_a_plain_controller_says_to_use_tcp(plain: ServerProcess) -> None:
    port = plain.port_of("controller")
    result = run_cli("stream", "list", "--controller", f"tls://127.0.0.1:{port}")
    one_error(result, 1, "does not speak TLS", f"tcp://127.0.0.1:{port}")


@pytest.mark.parametrize("listener", ["controller", "tank"])
def test_status_on_a_port_that_is_not_http_says_so(plain: ServerProcess, listener: str) -> None:
    result = run_cli("status", "--http-port", str(plain.port_of(listener)))
    one_error(result, 2, "does not answer as an HTTP port", "--http-port")


def test_status_of_nothing_listening_says_so() -> None:
    result = run_cli("status", "--http-port", str(free_port()))
    one_error(result, 2, "cannot reach", "is headrace serve running", "--http-port")


def test_controller_commands_do_not_offer_insecure(plain: ServerProcess) -> None:
    """gRPC cannot skip the certificate check: the flag is not there to be ignored."""
    one_error(run_cli("stream", "list", "--controller", plain.uri, "--insecure"), 2, "--insecure")
    assert "--insecure" not in run_cli("stream", "list", "--help").stdout
    assert "--insecure" in run_cli("status", "--help").stdout


# --------------------------------------------------------------------------- auth


@pytest.fixture(scope="module")
def authed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    directory = tmp_path_factory.mktemp("auth")
    passwords = directory / "passwords"
    add_user(passwords, "admin", "admin secret 1", "prn::/*,READ_UPDATE")
    add_user(passwords, "reader", "reader secret 1", "prn::/*,READ")
    for name in ("admin", "reader"):
        (directory / name).write_text(f"{name} secret 1\n")
    (directory / "wrong").write_text("not the password\n")
    with ServerProcess(
        directory / "data",
        ports={"controller": FREE, "segment_store": FREE},
        args=["--auth-password-file", str(passwords)],
    ) as srv:
        yield srv, directory


def test_credentials_missing_or_wrong_name_the_flags(authed: tuple[ServerProcess, Path]) -> None:
    srv, directory = authed
    controller = ["--controller", srv.uri]
    one_error(run_cli("stream", "list", *controller), 1, "--user", "--password-file")
    wrong = ["--user", "admin", "--password-file", str(directory / "wrong")]
    one_error(run_cli("stream", "list", *controller, *wrong), 1, "refused", "--password-file")


def test_a_write_without_permission_is_one_line(authed: tuple[ServerProcess, Path]) -> None:
    srv, directory = authed
    controller = ["--controller", srv.uri]
    admin = ["--user", "admin", "--password-file", str(directory / "admin")]
    reader = ["--user", "reader", "--password-file", str(directory / "reader")]
    assert run_cli("stream", "create", *controller, *admin, "demo/locked").returncode == 0
    result = run_cli("write", *controller, *reader, "demo/locked", stdin="x\n")
    one_error(result, 1, "not allowed", "READ_UPDATE", "--permission", "--user")
    result = run_cli("stream", "create", *controller, *reader, "demo/other")
    one_error(result, 1, "not allowed", "READ_UPDATE", "--user")


# --------------------------------------------------------------------------- TLS


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("certs")
    made = run_cli("cert", str(directory), "--dns", "localhost", "--ip", "127.0.0.1")
    assert made.returncode == 0, made.stderr
    return directory


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory, certs: Path) -> Iterator[ServerProcess]:
    with ServerProcess(
        tmp_path_factory.mktemp("tls") / "data",
        ports={"controller": FREE, "segment_store": FREE, "http": FREE},
        args=["--host", "127.0.0.1", "--advertise-host", "localhost"],
        tls=TlsFiles(certs / "server.pem", certs / "server-key.pem"),
    ) as srv:
        yield srv


def test_cert_makes_a_ca_and_a_server_certificate_it_signed(certs: Path) -> None:
    ca, server = certs / "ca.pem", certs / "server.pem"
    verified = subprocess.run(
        ["openssl", "verify", "-CAfile", str(ca), str(server)],
        capture_output=True, text=True, timeout=CLI_TIMEOUT_S,
    )  # fmt: skip
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert ca.read_bytes() != server.read_bytes()  # not self-signed
    assert (certs / "server-key.pem").stat().st_mode & 0o077 == 0
    again = run_cli("cert", str(certs))
    one_error(again, 1, "already holds", "--force")


def test_a_plain_client_on_a_tls_port_is_told_to_use_tls(tls_server: ServerProcess) -> None:
    port = tls_server.port_of("controller")
    began = time.monotonic()
    result = run_cli("stream", "list", "--controller", f"tcp://localhost:{port}")
    assert time.monotonic() - began < UNREACHABLE_REPORT_S
    one_error(result, 1, "speaks TLS", f"tls://localhost:{port}", "--ca")


def test_an_unknown_ca_is_told_to_pass_ca(tls_server: ServerProcess, tmp_path: Path) -> None:
    uri = f"tls://localhost:{tls_server.port_of('controller')}"
    began = time.monotonic()
    result = run_cli("stream", "list", "--controller", uri)
    assert time.monotonic() - began < UNREACHABLE_REPORT_S
    one_error(result, 1, "not trusted", "--ca")
    other = tmp_path / "other"
    assert run_cli("cert", str(other)).returncode == 0
    result = run_cli("stream", "list", "--controller", uri, "--ca", str(other / "ca.pem"))
    one_error(result, 1, "not trusted", "--ca")


def test_the_cli_works_with_the_ca_of_headrace_cert(tls_server: ServerProcess, certs: Path) -> None:
    tls = ["--controller", f"tls://localhost:{tls_server.port_of('controller')}"]
    tls += ["--ca", str(certs / "ca.pem")]
    assert run_cli("stream", "create", *tls, "sec/st").returncode == 0
    written = run_cli("write", *tls, "sec/st", stdin="one\ntwo\n")
    assert written.returncode == 0, written.stderr
    read = run_cli("read", *tls, "sec/st")
    assert read.stdout.splitlines() == ["one", "two"], read.stderr
    port = str(tls_server.port_of("http"))
    status = run_cli(
        "status", "--host", "localhost", "--http-port", port, "--ca", str(certs / "ca.pem")
    )
    assert status.returncode == 0, status.stderr
    one_error(run_cli("status", "--http-port", port), 2, "speaks TLS", "--https")


def test_the_real_pravega_client_trusts_the_ca_of_headrace_cert(
    tls_server: ServerProcess, certs: Path, tmp_path: Path
) -> None:
    trust = tmp_path / "trust"
    trust.mkdir()
    (trust / "ca.pem").write_bytes((certs / "ca.pem").read_bytes())
    result = run_scenario(
        "tls_write_read",
        f"tls://localhost:{tls_server.port_of('controller')}",
        "certrecipe",
        "verify",
        env={"pravega_client_tls_cert_path": str(trust)},
        cwd=tmp_path,
    )
    assert result == {
        "scope_created": True,
        "stream_created": True,
        "read": ["tls-0", "tls-1", "tls-2"],
    }


def test_a_certificate_for_another_name_says_so(tmp_path: Path) -> None:
    assert run_cli("cert", str(tmp_path / "tls"), "--dns", "other.test").returncode == 0
    tls = TlsFiles(tmp_path / "tls" / "server.pem", tmp_path / "tls" / "server-key.pem")
    with ServerProcess(tmp_path / "data", ports={"controller": FREE}, tls=tls) as srv:
        port = srv.port_of("controller")
        ca = ["--ca", str(tmp_path / "tls" / "ca.pem")]
        result = run_cli("stream", "list", "--controller", f"tls://localhost:{port}", *ca)
    one_error(result, 1, "does not name localhost", "a name on the certificate")


def test_a_server_wanting_a_client_certificate_says_so(tmp_path: Path, certs: Path) -> None:
    tls = TlsFiles(certs / "server.pem", certs / "server-key.pem")
    with ServerProcess(
        tmp_path / "data", ports={"controller": FREE}, tls=tls, tls_ca=certs / "ca.pem"
    ) as srv:
        uri = f"tls://localhost:{srv.port_of('controller')}"
        result = run_cli("stream", "list", "--controller", uri, "--ca", str(certs / "ca.pem"))
    one_error(result, 1, "client certificate", "--client-cert")
