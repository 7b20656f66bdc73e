"""The data source against a secured server: TLS on every listener and auth on.

One ``headrace serve`` for the module with ``--tls-cert/--tls-key`` (a
throwaway CA from the ``openssl`` CLI signed a certificate for ``localhost``)
and ``--auth-password-file`` (users made with ``headrace user add``). The
shared Spark session (``conftest.py``) reads and writes through it with the
``caFile``, ``user`` and ``passwordFile`` options: planning on the driver,
range reads and transactions in the Python workers (separate processes that
open the files themselves), the commit on the driver. A wrong password, no
credentials and a CA that did not sign the server's certificate each fail
with an error that says so, within a bound (no retrying for minutes).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from headrace.client import PravegaClient, ScalingPolicy, StreamConfig
from headrace.client.tls import TlsOptions
from headrace.spark import OptionError, _positions, read_options, write_options
from headrace.spark.options import Connection
from tests._server import FREE, ServerProcess, add_user, make_ca, make_signed
from tests.spark.conftest import stream_suffix

T = TypeVar("T")

QUERY_TIMEOUT_S = 180.0
"""Bound on a query that should succeed (a few seconds when healthy)."""
FAIL_WITHIN_S = 60.0
"""Bound on a query that should fail: well under the clients' retry budget
times Spark's task attempts, so a failure that went through retries shows."""
ADMIN = ("admin", "admin-secret")
SCOPE = "secured"
ADVERTISE = ("--host", "127.0.0.1", "--advertise-host", "localhost")
"""Bind 127.0.0.1, hand out ``localhost`` (the name on the certificate) for the segment store."""


# --------------------------------------------------------------------------- fixtures


SERVER_EXT = "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"
CLIENT_EXT = "extendedKeyUsage=clientAuth\n"


@dataclass(frozen=True)
class Secured:
    server: ServerProcess
    uri: str  # tls://localhost:PORT
    ca: Path
    other_ca: Path
    password_file: Path  # ADMIN's password
    wrong_password_file: Path

    def options(self, **extra: str) -> dict[str, str]:
        """The options that reach this server: TLS with our CA, ADMIN's credentials."""
        return {
            "controller": self.uri,
            "caFile": str(self.ca),
            "user": ADMIN[0],
            "passwordFile": str(self.password_file),
            **extra,
        }

    def run(self, work: Callable[[PravegaClient], Any]) -> Any:
        async def main() -> Any:
            tls = TlsOptions(ca_file=self.ca)
            async with PravegaClient(self.uri, tls=tls, credentials=ADMIN) as client:
                return await work(client)

        return asyncio.run(main())

    def create_stream(self, stream: str) -> None:
        async def work(client: PravegaClient) -> None:
            await client.controller.create_scope(SCOPE)
            await client.controller.create_stream(
                SCOPE, stream, StreamConfig(ScalingPolicy.fixed(2))
            )

        self.run(work)

    def write(self, stream: str, events: list[bytes]) -> None:
        async def work(client: PravegaClient) -> None:
            async with await client.create_writer(SCOPE, stream) as writer:
                for i, event in enumerate(events):
                    await writer.write(event, f"k{i % 5}")
                await writer.flush()

        self.run(work)

    def stored(self, stream: str) -> list[bytes]:
        async def work(client: PravegaClient) -> list[bytes]:
            reader = client.record_reader(SCOPE, stream)
            try:
                return [r.value async for r in reader]
            finally:
                await reader.aclose()

        return list(self.run(work))


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    tmp = tmp_path_factory.mktemp("secured")
    ca = make_ca(tmp, "ca")
    other_ca, _ = make_ca(tmp, "other-ca")
    users = tmp / "users"
    add_user(users, *ADMIN, "prn::/*,READ_UPDATE")
    password_file = tmp / "admin.password"
    password_file.write_text(ADMIN[1] + "\n")
    wrong = tmp / "wrong.password"
    wrong.write_text("not-the-password\n")
    server = ServerProcess(
        tmp / "data",
        ports={"controller": FREE, "segment_store": FREE},
        args=[*ADVERTISE, "--auth-password-file", str(users)],
        fsync="never",
        tls=make_signed(tmp, "localhost", ca, SERVER_EXT),
    )
    with server:
        uri = f"tls://localhost:{server.port_of('controller')}"
        yield Secured(server, uri, ca[0], other_ca, password_file, wrong)
    assert "Traceback" not in server.log_text(), server.log_text()


def _bounded(
    work: Callable[[], T], timeout_s: float
) -> tuple[T | None, BaseException | None, float]:
    """Run ``work`` in a thread, waiting at most ``timeout_s``: its result or
    exception, and how long it took (a hang fails the test instead of the run)."""
    started = time.monotonic()
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        future = pool.submit(work)
        try:
            return future.result(timeout=timeout_s), None, time.monotonic() - started
        except TimeoutError:
            pytest.fail(f"no result within {timeout_s} s")
        except Exception as exc:  # handed to the test to check
            return None, exc, time.monotonic() - started
    finally:
        pool.shutdown(wait=False)


def _why(error: BaseException | None) -> str:
    """An error's text, with the Java side's message for a Py4J error."""
    java = getattr(error, "java_exception", None)
    return str(error) if java is None else f"{error}: {java.toString()}"


def _read(spark: Any, options: dict[str, str]) -> list[bytes]:
    rows = spark.read.format("headrace").options(**options).load().select("value").collect()
    return sorted(bytes(r.value) for r in rows)


# --------------------------------------------------------------------------- tests


def test_batch_read_and_write_over_tls_with_credentials(secured: Secured, spark: Any) -> None:
    source, target = f"in{stream_suffix()}", f"out{stream_suffix()}"
    secured.create_stream(source)
    secured.create_stream(target)
    events = [b"secured-%03d" % i for i in range(300)]
    secured.write(source, events)

    options = secured.options(stream=f"{SCOPE}/{source}", minPartitions="4")
    got, error, _ = _bounded(lambda: _read(spark, options), QUERY_TIMEOUT_S)
    assert error is None, error
    assert got == events  # planned on the driver, read in the workers: both over TLS with auth

    def write() -> None:
        df = spark.createDataFrame(
            [(f"k{i}", f"out-{i:03d}") for i in range(120)], "key string, value string"
        )
        df.repartition(3).write.format("headrace").options(
            **secured.options(stream=f"{SCOPE}/{target}")
        ).mode("append").save()

    _, error, _ = _bounded(write, QUERY_TIMEOUT_S)
    assert error is None, error
    assert sorted(secured.stored(target)) == [b"out-%03d" % i for i in range(120)]


def test_streaming_read_into_the_streaming_sink_over_tls_with_credentials(
    secured: Secured, spark: Any, tmp_path: Path
) -> None:
    source, target = f"sin{stream_suffix()}", f"sout{stream_suffix()}"
    secured.create_stream(source)
    secured.create_stream(target)
    events = [b"stream-%03d" % i for i in range(200)]
    secured.write(source, events)

    # Not in a thread (_bounded): Spark finds a Python sink by the calling thread's
    # active session; awaitTermination bounds the wait.
    def run() -> None:
        df = (
            spark.readStream.format("headrace")
            .options(**secured.options(stream=f"{SCOPE}/{source}"))
            .option("startingOffsets", "earliest")
            .option("maxEventsPerTrigger", "70")  # several micro-batches, several commits
            .load()
        )
        query = (
            df.select("value")
            .writeStream.format("headrace")
            .options(**secured.options(stream=f"{SCOPE}/{target}"))
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(QUERY_TIMEOUT_S), "query did not finish in time"
        assert query.exception() is None, query.exception()
        assert query.lastProgress is not None and query.lastProgress["batchId"] >= 2

    try:
        run()
    except Exception as exc:
        pytest.fail(_why(exc))
    assert sorted(secured.stored(target)) == events


def test_a_client_certificate_reaches_a_server_that_asks_for_one(
    tmp_path_factory: pytest.TempPathFactory, spark: Any
) -> None:
    tmp = tmp_path_factory.mktemp("mtls")
    ca = make_ca(tmp, "ca")
    client = make_signed(tmp, "spark-client", ca, CLIENT_EXT)
    with ServerProcess(
        tmp / "data",
        ports={"controller": FREE, "segment_store": FREE},
        args=list(ADVERTISE),
        fsync="never",
        tls=make_signed(tmp, "localhost", ca, SERVER_EXT),
        tls_ca=ca[0],  # mutual TLS: a client certificate signed by this CA is required
    ) as server:
        uri = f"tls://localhost:{server.port_of('controller')}"
        stream = f"mtls{stream_suffix()}"

        async def setup() -> None:
            tls = TlsOptions(ca_file=ca[0], cert_file=client.cert, key_file=client.key)
            async with PravegaClient(uri, tls=tls) as c:
                await c.controller.create_scope(SCOPE)
                await c.controller.create_stream(
                    SCOPE, stream, StreamConfig(ScalingPolicy.fixed(1))
                )
                async with await c.create_writer(SCOPE, stream) as writer:
                    for i in range(50):
                        await writer.write(b"m-%02d" % i)
                    await writer.flush()

        asyncio.run(setup())
        options = {
            "controller": uri,
            "caFile": str(ca[0]),
            "clientCert": str(client.cert),
            "clientKey": str(client.key),
            "stream": f"{SCOPE}/{stream}",
        }
        got, error, _ = _bounded(lambda: _read(spark, options), QUERY_TIMEOUT_S)
        assert error is None, _why(error)
        assert got == [b"m-%02d" % i for i in range(50)]


def test_wrong_password_fails_clearly_for_reads_and_writes(secured: Secured, spark: Any) -> None:
    stream = f"pw{stream_suffix()}"
    secured.create_stream(stream)
    secured.write(stream, [b"x"])
    wrong = secured.options(
        stream=f"{SCOPE}/{stream}", passwordFile=str(secured.wrong_password_file)
    )

    _, error, took = _bounded(lambda: _read(spark, wrong), FAIL_WITHIN_S)
    assert error is not None and took < FAIL_WITHIN_S
    assert "refused the credentials of user 'admin'" in str(error)
    assert "UNAUTHENTICATED" in str(error)

    def write() -> None:
        spark.createDataFrame([("v",)], "value string").write.format("headrace").options(
            **wrong
        ).mode("append").save()

    _, error, took = _bounded(write, FAIL_WITHIN_S)
    assert error is not None and took < FAIL_WITHIN_S
    assert "refused the credentials of user 'admin'" in str(error)
    assert secured.stored(stream) == [b"x"]  # nothing written


def test_no_credentials_fails_clearly(secured: Secured, spark: Any) -> None:
    stream = f"anon{stream_suffix()}"
    secured.create_stream(stream)
    options = {"controller": secured.uri, "caFile": str(secured.ca), "stream": f"{SCOPE}/{stream}"}
    _, error, took = _bounded(lambda: _read(spark, options), FAIL_WITHIN_S)
    assert error is not None and took < FAIL_WITHIN_S
    assert "UNAUTHENTICATED" in str(error)


def test_a_ca_that_did_not_sign_the_certificate_fails_fast(secured: Secured, spark: Any) -> None:
    stream = f"ca{stream_suffix()}"
    secured.create_stream(stream)
    for wrong in (
        secured.options(stream=f"{SCOPE}/{stream}", caFile=str(secured.other_ca)),
        {k: v for k, v in secured.options(stream=f"{SCOPE}/{stream}").items() if k != "caFile"},
    ):
        _, error, took = _bounded(lambda: _read(spark, wrong), FAIL_WITHIN_S)  # noqa: B023
        assert error is not None
        assert took < FAIL_WITHIN_S / 2  # no 20 s of controller retries
        assert "TlsCertificateError" in str(error) and "option 'caFile'" in str(error)
        assert "certificate verify failed" in str(error) or "unable to get" in str(error)


def test_tls_and_auth_options_are_checked_at_planning(secured: Secured, tmp_path: Path) -> None:
    base = {"controller": "tcp://h:1", "stream": "a/b"}
    secret = "hunter2-secret"
    for read in (True, False):
        parse: Callable[[dict[str, str]], object] = (
            (lambda o: read_options(o, streaming=False)) if read else write_options
        )
        for bad, named in [
            ({"password": secret, "user": "u"}, "'password'"),
            ({"caFile": str(tmp_path / "missing.pem")}, "'caFile'"),
            ({"clientKey": str(secured.ca)}, "'clientKey'"),
            ({"insecure": "true"}, "insecure=true"),
            ({"verifyCertificate": "false"}, "verifyCertificate=false"),
            ({"verifyCertificate": "maybe"}, "'verifyCertificate'"),
            ({"tls": "false", "caFile": str(secured.ca)}, "'tls'"),
            ({"user": "u"}, "'passwordFile'"),
            ({"passwordFile": str(secured.password_file)}, "'user'"),
            ({"user": "u", "passwordFile": str(tmp_path / "none")}, "'passwordFile'"),
        ]:
            with pytest.raises(OptionError, match=named) as info:
                parse({**base, **bad})
            assert secret not in str(info.value) and secret not in repr(info.value)

    opts = read_options({**base, "tls": "true"}, streaming=False)
    assert opts.connection.tls == TlsOptions()  # the system's CAs
    assert read_options(base, streaming=False).connection.tls is None
    by_scheme = read_options({**base, "controller": "pravegas://h:1"}, streaming=False)
    assert by_scheme.connection.tls == TlsOptions()
    full = write_options({**secured.options(stream="a/b"), "controller": "tcp://h:1"})
    assert full.connection.tls == TlsOptions(ca_file=secured.ca)
    assert full.connection.credentials() == ADMIN
    assert ADMIN[1] not in repr(full)  # the password is read where a client is built, never kept


def test_a_file_missing_where_a_client_is_built_names_the_option(tmp_path: Path) -> None:
    # What an executor without the files meets: they were there at planning, not here.
    missing = tmp_path / "gone.pem"
    no_ca = Connection("tls://localhost:1", TlsOptions(ca_file=missing))
    with pytest.raises(OptionError, match=r"'caFile'.*on host"):
        _positions.earliest(no_ca, ["a/b"])
    no_password = Connection("tcp://127.0.0.1:1", user="u", password_file=str(missing))
    with pytest.raises(OptionError, match=r"'passwordFile'.*on host"):
        _positions.earliest(no_password, ["a/b"])


def test_credentials_fall_back_to_the_real_clients_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    conn = Connection("tcp://h:1")
    for name in ("pravega_client_auth_username", "pravega_client_auth_password"):
        monkeypatch.delenv(name, raising=False)
    assert conn.credentials() is None
    monkeypatch.setenv("pravega_client_auth_method", "Basic")
    monkeypatch.setenv("pravega_client_auth_username", "env-user")
    monkeypatch.setenv("pravega_client_auth_password", "env-password")
    assert conn.credentials() == ("env-user", "env-password")
    assert "env-password" not in repr(conn)
