"""The real ``pravega`` 0.3.8 client with ``auth_enabled=True`` against
``headrace serve --auth-password-file``.

Credentials go to the client the way its users give them: the environment
variables ``pravega_client_auth_method`` / ``_username`` / ``_password``.
Each scenario (``tests/_real_pravega.py``) runs in its own child process with a
hard timeout (the client blocks, holds the GIL and retries UNAUTHENTICATED
for about a minute), so bad-password paths are tested with raw gRPC in
``tests/ops/test_auth.py`` instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests._real_pravega import run_scenario
from tests._server import FREE, ServerProcess, add_user

TOKEN_TTL_S = 2  # the expiry scenario waits this plus a second

ADMIN = ("admin", "admin-secret", "prn::/*,READ_UPDATE")
READER = (
    "reader",
    "reader-secret",
    # reads scope S; a reader group keeps its state in the table segment of
    # the pseudo-stream <group>_kvtable, which the reader updates
    "prn::/scope:S,READ",
    "prn::/scope:S/stream:*_kvtable,READ_UPDATE",
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("auth-real")
    users = tmp / "users"
    add_user(users, *ADMIN)
    add_user(users, *READER)
    srv = ServerProcess(
        tmp / "data",
        ports={"controller": FREE, "segment_store": FREE},
        args=["--auth-password-file", str(users), "--auth-token-ttl", str(TOKEN_TTL_S)],
        wait_for=["controller", "segment_store"],
    )
    with srv:
        yield srv
    assert "Traceback" not in srv.log_text(), srv.log_text()


def _run(server: ServerProcess, user: tuple[str, ...], scenario: str, *args: str) -> dict[str, Any]:
    env = {
        "pravega_client_auth_method": "Basic",
        "pravega_client_auth_username": user[0],
        "pravega_client_auth_password": user[1],
    }
    return run_scenario(f"auth_{scenario}", server.uri, *args, env=env)


@pytest.fixture(scope="module")
def written(server: ServerProcess) -> dict[str, Any]:
    """The admin's run: scope S, stream st, 50 events written and read back."""
    return _run(server, ADMIN, "write_read", "S", "50")


def test_admin_writes_and_reads_with_tokens(server: ServerProcess, written: dict[str, Any]) -> None:
    result = written
    assert result["created"] == [True, True]
    assert result["read"] == [f"e{i}" for i in range(50)]
    assert result["large"] == [9 * 1024 * 1024]
    assert "refused" not in server.log_text()  # every token the client sent was good


def test_reader_reads_but_may_not_create(server: ServerProcess, written: dict[str, Any]) -> None:
    result = _run(server, READER, "read_only", "S", "50")
    assert result["read"] == 50
    refusal = result["create_stream_refusal"]
    assert "PermissionDenied" in refusal and "READ_UPDATE on prn::/scope:S/stream:other" in refusal
    assert result["refused_after_s"] < 5  # PERMISSION_DENIED is final: no minute of retries


def test_client_refreshes_expired_tokens(server: ServerProcess) -> None:
    result = _run(server, ADMIN, "outlive_token", "X", str(TOKEN_TTL_S + 1))
    assert result["first"] == ["before"]
    assert sorted(result["later"]) == ["after-new-writer", "after-same-writer"]
