"""A real ``headrace serve`` child process for tests: ``ServerProcess`` and ``free_port``.

Every test folder that talks to a real server over real sockets starts it the
same way, so the way is written once:

* **Ports.** ``ports`` names the listeners to open, each on a given port or on
  ``FREE`` (a free port picked here); every other listener gets port 0 (off),
  so a test never collides with a developer's running server on the default
  ports. ``ports=None`` passes no port flags at all (the caller's ``args`` say
  everything).
* **stderr goes to a file** (``log_path``, beside the data directory unless
  given): a pipe nobody reads can fill up and stall the server, and a file keeps
  the log of every start of a restarted server, readable at any time
  (``log_text``).
* **Waiting for a log line.** ``wait_for_line`` (a line of the current
  start) and ``wait_for_access`` (a ``headrace.access`` record, either log
  format) poll the file under a deadline and fail with the log's tail; the
  one way tests wait for what the server logs.
* **Bounded start.** ``start`` waits at most ``start_timeout_s`` for the
  ``headrace ready`` line of *this* start (the default), or, with
  ``wait_for``, until the named listeners accept a connection. If the server
  does not come up, it is killed and ``ServerStartError`` says why, with the
  exit code and the tail of its stderr. A start that fails because another
  process took a freshly picked port in the meantime (other test runs share
  the machine) is retried on new free ports, ``START_ATTEMPTS`` times at most.
* **Bounded stop.** ``stop`` sends SIGTERM (or the given signal), waits
  ``stop_timeout_s`` and then SIGKILLs; it returns the exit code, or None
  when the server had to be killed. ``start`` again restarts on the same ports.
* **Hermetic environment.** The child gets the test run's environment minus
  every ``HEADRACE_*`` variable (those configure ``headrace serve``; a
  developer's shell must not change what a test runs), plus ``env``; it
  imports ``headrace`` from this tree's ``src`` (or ``HEADRACE_TEST_SERVER_SRC``,
  to run the server from another source tree, e.g. a snapshot of the last
  commit while the work tree is mid-change).

The real ``pravega`` client's scenarios run through ``tests/_real_pravega.py``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Final, Self

from headrace.server.config import LISTENER_NAMES

ROOT: Final = Path(__file__).resolve().parent.parent
SRC: Final = Path(os.environ.get("HEADRACE_TEST_SERVER_SRC", str(ROOT / "src")))

START_TIMEOUT_S: Final = 30.0
"""Default bound on a start: recovery of a small data directory on 2 busy cores."""
STOP_TIMEOUT_S: Final = 15.0
"""Default bound on a signalled server exiting before it is SIGKILLed."""
START_ATTEMPTS: Final = 3
"""Starts on fresh free ports when a picked port was taken before the server
bound it (the window between ``free_port`` and the server's bind)."""
POLL_INTERVAL_S: Final = 0.02
"""Pause between two looks at the log or a port, always under a deadline."""
CONNECT_TIMEOUT_S: Final = 1.0
"""Bound on one connection attempt while waiting for a listener."""
STDERR_TAIL_CHARS: Final = 5000
"""How much of the server's stderr a failed start or wait quotes."""
LINE_TIMEOUT_S: Final = 15.0
"""Default bound on waiting for a log line: it follows its cause within
milliseconds, but two busy cores can hold a server up for seconds."""
READY_LINE: Final = "headrace ready"
"""What ``headrace serve`` prints to stderr once every listener is bound."""
PORT_TAKEN: Final = "address already in use"

FREE: Final = None
"""In ``ports``: pick a free port for this listener."""


def reset_memory_peak(pid: int) -> None:
    """Make process ``pid``'s ``VmHWM`` its current ``VmRSS``: the peak from here on (proc(5))."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def memory_kib(pid: int, field: str) -> int:
    """A memory figure (``VmRSS``, ``VmHWM``) of process ``pid``, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def listener_key(name: str) -> str:
    """``segment-store`` or ``segment_store`` -> ``segment_store`` (config's spelling)."""
    key = name.replace("-", "_")
    if key not in LISTENER_NAMES:
        raise ValueError(f"unknown listener {name!r}; known: {', '.join(LISTENER_NAMES)}")
    return key


def server_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without ``HEADRACE_*``, importing this tree, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HEADRACE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), str(ROOT)])
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


def serve_command(data_dir: Path, *args: str, global_args: Sequence[str] = ()) -> list[str]:
    """``python -m headrace [global_args] serve --data-dir DATA_DIR [args]``."""
    return [
        sys.executable,
        "-m",
        "headrace",
        *global_args,
        "serve",
        "--data-dir",
        str(data_dir),
        *args,
    ]


class Ports(dict[str, int]):
    """Listener name (config spelling) -> port; also found by its flag spelling
    (``ports["segment-store"]``)."""

    def __missing__(self, name: str) -> int:
        if "-" in name:
            return self[name.replace("-", "_")]
        raise KeyError(name)


def ready_ports(line: str) -> Ports:
    """The listeners of a ready line: ``... listeners: tank=4711, http=4712``."""
    listed = line.partition("listeners: ")[2]
    items = (item.partition("=") for item in listed.split(", "))
    return Ports({name: int(port) for name, sep, port in items if sep})


@dataclass(frozen=True)
class TlsFiles:
    """A certificate and its private key, both PEM files."""

    cert: Path
    key: Path


def make_certificate(directory: Path, name: str) -> TlsFiles:
    """A throwaway self-signed certificate for localhost/127.0.0.1 (openssl CLI)."""
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", f"/CN={name}",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return TlsFiles(cert, key)


_EC_KEY = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
OPENSSL_TIMEOUT_S: Final = 60.0


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=OPENSSL_TIMEOUT_S)


CLI_TIMEOUT_S: Final = 60.0
"""Bound on one ``python -m headrace`` command run by a test."""


def run_cli(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """``python -m headrace ARGS`` from this tree, text output captured, bounded."""
    return subprocess.run(
        [sys.executable, "-m", "headrace", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_S,
        env=server_env(),
    )


def add_user(path: Path, name: str, password: str, *grants: str) -> None:
    """``headrace user add`` into the password file ``path`` with Pravega-style grants."""
    perms = [arg for grant in grants for arg in ("--permission", grant)]
    done = run_cli(
        "user", "add", name, "--file", str(path), *perms, "--password-stdin", stdin=password + "\n"
    )
    assert done.returncode == 0, done.stderr


def make_ca(directory: Path, name: str) -> tuple[Path, Path]:
    """A throwaway CA (certificate, key) for tests that check chains and client certificates."""
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    _openssl(
        "req", "-x509", *_EC_KEY, "-keyout", str(key), "-out", str(cert), "-days", "2",
        "-subj", f"/CN=headrace test {name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
    )  # fmt: skip
    return cert, key


def make_signed(directory: Path, name: str, ca: tuple[Path, Path], extensions: str) -> TlsFiles:
    """A certificate for ``name`` signed by ``ca``, with ``extensions`` (openssl extfile lines)."""
    cert, key, csr = (directory / f"{name}{ext}" for ext in (".pem", ".key", ".csr"))
    ext = directory / f"{name}.ext"
    ext.write_text(extensions)
    _openssl("req", "-new", *_EC_KEY, "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}")
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]),
        "-CAcreateserial", "-out", str(cert), "-days", "2", "-extfile", str(ext),
    )  # fmt: skip
    return TlsFiles(cert, key)


ACCESS_LOGGER: Final = "headrace.access"
"""The logger of the one line per closed connection (configuration.md)."""
_ACCESS_NUMBERS: Final = {"requests": int, "bytes_in": int, "bytes_out": int, "duration_s": float}


def access_record(line: str) -> dict[str, Any] | None:
    """The fields of a ``headrace.access`` line (``protocol``, ``peer``,
    ``requests``, ``bytes_in``, ``bytes_out``, ``duration_s``, ``reason``)
    in either log format; None for any other line."""
    if line.startswith("{"):
        record: dict[str, Any] = json.loads(line)
        return record if record.get("logger") == ACCESS_LOGGER else None
    _, marker, rest = line.partition(f" {ACCESS_LOGGER}: ")
    if not marker:
        return None
    protocol, peer, *pairs = rest.split()
    fields: dict[str, Any] = {"logger": ACCESS_LOGGER, "protocol": protocol, "peer": peer}
    for pair in pairs:
        key, _, value = pair.partition("=")
        fields[key] = _ACCESS_NUMBERS.get(key, str)(value)
    return fields


def _has(record: Mapping[str, Any], fields: Mapping[str, object]) -> bool:
    return all(record.get(key) == value for key, value in fields.items())


def _matcher(match: str | Callable[[str], bool]) -> Callable[[str], bool]:
    if isinstance(match, str):
        return lambda line: match in line
    return match


class ServerStartError(AssertionError):
    """``headrace serve`` did not come up in time; the message quotes its stderr."""

    def __init__(self, message: str, log: str) -> None:
        super().__init__(message)
        self.log = log


class ServerProcess:
    """One ``headrace serve`` (or a runner script) child process; see the module doc.

    ``ports``: listener name (``segment-store`` or ``segment_store``) -> port or
    ``FREE``; unnamed listeners are off. ``args``: more flags, after the port
    flags (so a test's flag wins). ``global_args``: flags before ``serve``
    (``-v``). ``tls``/``tls_ca``: ``--tls-cert``/``--tls-key``/``--tls-ca``.
    ``wait_for``: listeners to connect to instead of waiting for the ready
    line. ``runner``: run ``python RUNNER... DATA_DIR --name-port=N ... args``
    instead of ``headrace serve`` (a test-only server that prints the same
    ready line). ``env``: extra environment variables.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        ports: Mapping[str, int | None] | None = None,
        args: Sequence[str] = (),
        global_args: Sequence[str] = (),
        fsync: str | None = None,
        tls: TlsFiles | None = None,
        tls_ca: Path | None = None,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        wait_for: Sequence[str] | None = None,
        runner: Sequence[str] | None = None,
        log_path: Path | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
        stop_timeout_s: float = STOP_TIMEOUT_S,
    ) -> None:
        self.data_dir = data_dir
        self._wanted = None if ports is None else {listener_key(k): v for k, v in ports.items()}
        self.ports = Ports()
        """The open listeners' ports (config spelling), fixed at the first start;
        with ``ports=None``, those the ready line lists."""
        self.args = list(args)
        self.global_args = list(global_args)
        self.fsync = fsync
        self.tls = tls
        self.tls_ca = tls_ca
        self.env = dict(env or {})
        self.cwd = ROOT if cwd is None else cwd
        self.wait_for = None if wait_for is None else [listener_key(n) for n in wait_for]
        self.runner = None if runner is None else list(runner)
        self.log_path = data_dir.with_name(data_dir.name + ".log") if log_path is None else log_path
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        """Successful starts so far."""
        self._log: IO[bytes] | None = None
        self._log_first = -1  # where this object's first start began in the log file
        self._log_start = 0  # where the current (or last) start began

    # ------------------------------------------------------------------ state

    def port_of(self, name: str) -> int:
        """The port of listener ``name`` (either spelling)."""
        return self.ports[listener_key(name)]

    @property
    def uri(self) -> str:
        """The controller's address for the Pravega clients."""
        return f"tcp://127.0.0.1:{self.port_of('controller')}"

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.process is None else self.process.returncode

    def log_text(self) -> str:
        """Everything the server wrote to stderr so far, over all starts of this
        object (another one on the same data directory shares the file)."""
        return self._read_from(max(self._log_first, 0)) if self._log_first >= 0 else ""

    def log_tail(self, chars: int = STDERR_TAIL_CHARS) -> str:
        return self.log_text()[-chars:]

    # ------------------------------------------------------------------ start

    def command(self) -> list[str]:
        flags: list[str] = []
        if self.fsync is not None:
            flags += ["--fsync", self.fsync]
        if self._wanted is not None:
            for name in LISTENER_NAMES:
                flags.append(f"--{name.replace('_', '-')}-port={self.ports.get(name, 0)}")
        flags += self.args
        if self.tls is not None:
            flags += ["--tls-cert", str(self.tls.cert), "--tls-key", str(self.tls.key)]
        if self.tls_ca is not None:
            flags += ["--tls-ca", str(self.tls_ca)]
        if self.runner is not None:
            return [sys.executable, *self.runner, str(self.data_dir), *flags]
        return serve_command(self.data_dir, *flags, global_args=self.global_args)

    def _pick_ports(self) -> None:
        if self._wanted is not None:
            # Distinct ports: the OS may hand the same free port out twice in a
            # row, and the server refuses one port for two listeners.
            taken = {v for v in self._wanted.values() if v}
            picked: dict[str, int] = {}
            for key, value in self._wanted.items():
                port = value
                while port is None or (value is None and port in taken):
                    port = free_port()
                taken.add(port)
                picked[key] = port
            self.ports = Ports(picked)

    def start(self) -> Self:
        """Start (or restart, on the same ports) and wait until it is up."""
        assert not self.alive(), "already running"
        if self.starts == 0:
            self._pick_ports()
        attempt = 1
        while True:
            try:
                self._start_once()
            except ServerStartError as exc:
                # Only ports picked here, and only before a first success: a
                # restarted server keeps its addresses.
                retry = self.starts == 0 and FREE in (self._wanted or {}).values()
                if retry and attempt < START_ATTEMPTS and PORT_TAKEN in exc.log.lower():
                    attempt += 1
                    self._pick_ports()
                    continue
                raise
            self.starts += 1
            return self

    def _start_once(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        log_start = self._log_start = self._log.tell()
        if self._log_first < 0:
            self._log_first = log_start
        self.process = subprocess.Popen(
            self.command(),
            stdout=subprocess.DEVNULL,
            stderr=self._log,
            env=server_env(self.env),
            cwd=self.cwd,
        )
        deadline = time.monotonic() + self.start_timeout_s
        if self.wait_for is None:
            up = self._wait_ready(log_start, deadline)
            what = f"no {READY_LINE!r} line"
        else:
            up = all(self._wait_connectable(self.port_of(name), deadline) for name in self.wait_for)
            what = f"listeners {', '.join(self.wait_for)} not accepting"
        if not up:
            exited = not self.alive()
            self.terminate(signal.SIGKILL)
            log = self._read_from(log_start)
            why = (
                f"it exited with code {self.returncode}"
                if exited
                else f"{what} within {self.start_timeout_s} s; killed"
            )
            raise ServerStartError(
                f"headrace serve did not start ({why}); command: {' '.join(self.command())}\n"
                f"stderr:\n{log[-STDERR_TAIL_CHARS:]}",
                log,
            )

    def _wait_ready(self, log_start: int, deadline: float) -> bool:
        while True:
            over = not self.alive() or time.monotonic() >= deadline
            for line in self._read_from(log_start).splitlines():
                if line.startswith(READY_LINE):
                    if self._wanted is None:  # the configuration chose the ports
                        self.ports = ready_ports(line)
                    return True
            if over:
                return False
            time.sleep(POLL_INTERVAL_S)  # polling the log under a deadline

    def _read_from(self, offset: int) -> str:
        try:
            with self.log_path.open("rb") as log:
                log.seek(offset)
                return log.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def _wait_connectable(self, port: int, deadline: float) -> bool:
        while self.alive():
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=CONNECT_TIMEOUT_S):
                    return True
            except OSError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(POLL_INTERVAL_S)  # polling a port under a deadline
        return False

    def wait_for_line(
        self,
        match: str | Callable[[str], bool],
        timeout_s: float = LINE_TIMEOUT_S,
        *,
        after: int = 0,
    ) -> str:
        """The first stderr line of the current start that contains ``match`` (or
        for which ``match`` is true), skipping the first ``after`` such lines;
        AssertionError quoting the log's tail if none comes within ``timeout_s``."""
        what = repr(match) if isinstance(match, str) else "matching line"
        return self._wait_for(_matcher(match), timeout_s, after, self._log_start, what)

    def access_records(self, **fields: object) -> list[dict[str, Any]]:
        """The ``headrace.access`` lines so far with ``fields`` (all of them
        without), over every start, as records (``access_record``)."""
        records = (access_record(line) for line in self.log_text().splitlines())
        return [r for r in records if r is not None and _has(r, fields)]

    def wait_for_access(
        self, timeout_s: float = LINE_TIMEOUT_S, *, after: int = 0, **fields: object
    ) -> dict[str, Any]:
        """The first ``headrace.access`` record with ``fields`` over every start,
        skipping the first ``after`` such records (so a test counts them with
        ``access_records`` first); AssertionError quoting the log's tail if none
        comes within ``timeout_s``."""

        def match(line: str) -> bool:
            record = access_record(line)
            return record is not None and _has(record, fields)

        start = max(self._log_first, 0)
        line = self._wait_for(match, timeout_s, after, start, f"access line with {fields}")
        record = access_record(line)
        assert record is not None
        return record

    def _wait_for(
        self, match: Callable[[str], bool], timeout_s: float, after: int, start: int, what: str
    ) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            text = self._read_from(start)
            exited = not self.alive()
            done = exited or time.monotonic() >= deadline
            # A line counts once it is complete, or once nothing more can come.
            found = [
                line.rstrip("\n")
                for line in text.splitlines(keepends=True)
                if (line.endswith("\n") or done) and match(line.rstrip("\n"))
            ]
            if len(found) > after:
                return found[after]
            if done:
                why = (
                    f"; it exited with code {self.returncode}"
                    if exited
                    else f" within {timeout_s} s"
                )
                raise AssertionError(
                    f"no {what} from headrace serve{why}; stderr:\n{text[-STDERR_TAIL_CHARS:]}"
                )
            time.sleep(POLL_INTERVAL_S)  # polling the log under a deadline

    # ------------------------------------------------------------------ stop

    def terminate(self, sig: int = signal.SIGTERM) -> int | None:
        """Send ``sig`` and wait for the exit, SIGKILL after ``stop_timeout_s``.

        (``stop`` and ``kill`` call this; wrappers may give those their own checks.)

        Returns the exit code, None if the server had to be killed (or never
        ran). Safe to call again, and after the server exited by itself.
        """
        if self.process is None:
            return None
        code: int | None
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            code = self.process.wait(timeout=self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=self.stop_timeout_s)
            code = None
        if self._log is not None:
            self._log.close()
            self._log = None
        return code

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        """A graceful stop by default: ``terminate(sig)``."""
        return self.terminate(sig)

    def kill(self) -> int | None:
        """SIGKILL: a crash, no chance to flush or close anything."""
        return self.terminate(signal.SIGKILL)

    def restart(self, sig: int = signal.SIGTERM) -> int | None:
        """``stop(sig)`` then ``start()`` on the same ports; the stop's exit code."""
        code = self.terminate(sig)
        self.start()
        return code

    def __enter__(self) -> Self:
        return self if self.alive() else self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.terminate()


class PravegaServer(ServerProcess):
    """What a Pravega client needs: the controller and (unless told otherwise) the
    segment store on free ports, every other listener off, up once both accept
    connections. The constructor starts it."""

    def __init__(
        self,
        data_dir: Path,
        *,
        fsync: str,
        args: Sequence[str] = (),
        segment_store: bool = True,
        start_timeout_s: float = START_TIMEOUT_S,
        stop_timeout_s: float = STOP_TIMEOUT_S,
    ) -> None:
        ports: dict[str, int | None] = {"controller": FREE}
        if segment_store:
            ports["segment_store"] = FREE
        super().__init__(
            data_dir,
            ports=ports,
            fsync=fsync,
            args=args,
            wait_for=list(ports),
            start_timeout_s=start_timeout_s,
            stop_timeout_s=stop_timeout_s,
        )
        self.start()

    @property
    def controller_port(self) -> int:
        return self.port_of("controller")

    @property
    def segment_store_port(self) -> int:
        return self.ports.get("segment_store", 0)


async def serve_app_over(store: Any, data_dir: Path, args: Sequence[str]) -> None:
    """Run a ``ServerApp`` over ``store`` as ``headrace serve`` would, in a test's
    child process: the ports from ``--NAME-port=N`` arguments (every other door
    off), the ready line ``ServerProcess`` waits for, and a clean stop on SIGTERM
    or SIGINT. For the servers a test builds around a store of its own (a
    forwarding store, a failing disk)."""
    import asyncio

    from headrace.server.app import ServerApp
    from headrace.server.config import DEFAULT_PORTS, ServerConfig

    ports = dict.fromkeys(DEFAULT_PORTS, 0)
    for arg in args:
        name, _, value = arg.removeprefix("--").partition("=")
        key = name.removesuffix("-port").replace("-", "_")
        assert key in ports, arg
        ports[key] = int(value)
    app = ServerApp(ServerConfig(data_dir=data_dir, ports=ports), store=store)
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, app.request_stop)
    try:
        await app.start()
        print(f"headrace ready: data in {data_dir}, listeners: {app.ports}", file=sys.stderr)
        sys.stderr.flush()
        await app.serve_until_stopped()
    finally:
        await app.aclose()
    print("headrace stopped", file=sys.stderr)
