"""Pravega-style auth: the password file, ``headrace user``, the controller's
credential and permission checks, and delegation tokens at the segment store.

The server is a real ``headrace serve --auth-password-file`` child process;
the tests talk to it with raw gRPC calls (``grpcio``) and a raw segment-store
connection (our sans-I/O codec over a socket). The real ``pravega`` client's
side is in ``tests/pravega/test_auth_real_client.py``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc  # type: ignore[import-untyped]
import pytest

from headrace.controller.auth import (
    DEFAULT_TOKEN_TTL_S,
    TOKEN_KEY_FILE,
    Authenticator,
    PasswordFile,
    UserEntry,
    hash_password,
    verify_password,
)
from headrace.controller.rpc import METHODS, SERVICE_NAME
from headrace.errors import ConfigError
from headrace.protocols import pravega as p
from headrace.protocols.pravega import controller_pb2 as pb
from headrace.protocols.pravega.auth import (
    MAX_TOKEN_BYTES,
    Permission,
    TokenClaims,
    TokenExpired,
    TokenInvalid,
    basic_header,
    best_permission,
    decode_token,
    encode_token,
    parse_grant,
    segment_resource,
)
from headrace.server.config import LISTENER_NAMES
from headrace.store.api import MAX_NAME_BYTES
from tests._server import FREE, ServerProcess, add_user, run_cli, server_env
from tests.server.test_pravega_server import Raw

WAIT_S = 10.0  # bound on every wait here
ADMIN = ("admin", "admin-secret")
READER = ("reader", "reader-secret")
SCOPE = "S"


# --------------------------------------------------------------------------- pure parts


def test_password_hash_is_salted_scrypt_and_verifies() -> None:
    one, two = hash_password("hunter22"), hash_password("hunter22")
    assert one.startswith("$scrypt$n=16384,r=8,p=1$")
    assert one != two  # a fresh salt each time
    assert "hunter22" not in one
    assert verify_password("hunter22", one)
    assert not verify_password("hunter23", one)
    assert not verify_password("hunter22", "plain-text")


def test_password_file_round_trip_and_bad_lines() -> None:
    entry = UserEntry("reader", hash_password("x" * 8), (parse_grant("prn::/scope:S,READ"),))
    text = PasswordFile({"reader": entry}).text()
    assert PasswordFile.parse(text).users == {"reader": entry}
    for bad, why in [
        ("reader:plain:prn::/,READ;", "line 1"),
        (f"{entry.line()}\n{entry.line()}", "appears twice"),
        (f"a b:{entry.password_hash}:", "user name"),
        (f"u:{entry.password_hash}:prn::/scope:S,WRITE;", "READ or READ_UPDATE"),
        (f"u:{entry.password_hash}", "expected"),
    ]:
        with pytest.raises(ConfigError, match=why):
            PasswordFile.parse(bad)


def test_grants_cover_their_resource_and_everything_below() -> None:
    grants = [
        parse_grant("prn::/scope:S,READ"),
        parse_grant("prn::/scope:S/stream:*_kvtable,READ_UPDATE"),
    ]
    assert best_permission(grants, "prn::/scope:S") is Permission.READ
    assert best_permission(grants, "prn::/scope:S/stream:T") is Permission.READ
    assert best_permission(grants, "prn::/scope:S/stream:rg_kvtable") is Permission.READ_UPDATE
    assert best_permission(grants, "prn::/scope:SX/stream:T") is Permission.NONE
    assert best_permission(grants, "prn::/") is Permission.NONE
    admin = [parse_grant("prn::/*,READ_UPDATE")]
    assert best_permission(admin, "prn::/") is Permission.READ_UPDATE
    assert best_permission(admin, "prn::/scope:x/stream:y") is Permission.READ_UPDATE


def test_segment_names_map_to_their_stream() -> None:
    stream = "prn::/scope:S/stream:T"
    assert segment_resource("S/T/0.#epoch.0") == stream
    assert segment_resource("S/T/1.#epoch.2#transaction.00ff00ff00ff00ff00ff00ff00ff00ff") == stream
    assert segment_resource("S/T/0.#epoch.0#transient.ab.cd") == stream
    assert segment_resource("S/rg_kvtable/0.#epoch.0") == "prn::/scope:S/stream:rg_kvtable"
    assert segment_resource("_system/containers/metadata") is None
    assert segment_resource("no-slashes") is None
    assert segment_resource("S//0") is None


def test_tokens_refuse_forgery_expiry_and_tampering() -> None:
    key, other = b"k" * 32, b"o" * 32
    claims = TokenClaims("u", "prn::/scope:S/stream:T", Permission.READ, 2_000_000_000, 1)
    token = encode_token(key, claims)
    assert decode_token(key, token, now_s=1_000) == claims
    with pytest.raises(TokenInvalid, match="signature"):
        decode_token(other, token, now_s=1_000)
    with pytest.raises(TokenExpired):
        decode_token(key, token, now_s=2_000_000_000)
    head, body, sig = token.split(".")
    payload = json.loads(base64.urlsafe_b64decode(body + "=="))
    payload["perm"] = "READ_UPDATE"
    forged = base64.urlsafe_b64encode(json.dumps(payload).encode()).rstrip(b"=").decode()
    with pytest.raises(TokenInvalid, match="signature"):
        decode_token(key, f"{head}.{forged}.{sig}", now_s=1_000)
    none_alg = base64.urlsafe_b64encode(b'{"alg":"none"}').rstrip(b"=").decode()
    with pytest.raises(TokenInvalid):
        decode_token(key, f"{none_alg}.{body}.", now_s=1_000)
    for junk in ["", "a.b", "x" * (MAX_TOKEN_BYTES + 1), "é.é.é"]:
        with pytest.raises(TokenInvalid):
            decode_token(key, junk, now_s=1_000)


async def test_authenticator_rereads_the_file_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "pw"
    users = PasswordFile({"a": UserEntry("a", hash_password("password-a"), ())})
    users.save(path)
    auth = Authenticator(path)
    assert await auth.authenticate(basic_header("a", "password-a")) == "a"
    with pytest.raises(Exception, match="wrong password"):
        await auth.authenticate(basic_header("a", "password-b"))
    del users.users["a"]
    users.users["b"] = UserEntry("b", hash_password("password-b"), ())
    users.save(path)
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 1_000_000_000))  # a visible change
    with pytest.raises(Exception, match="wrong password"):
        await auth.authenticate(basic_header("a", "password-a"))  # even though remembered
    assert await auth.authenticate(basic_header("b", "password-b")) == "b"
    for value in [None, "", "Bearer x", "Basic !!!", basic_header("b", "")]:
        with pytest.raises(Exception, match=r"credentials|wrong password"):
            await auth.authenticate(value)


# --------------------------------------------------------------------------- headrace user


def test_user_add_list_remove_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "users"
    add_user(path, "admin", "admin-secret", "prn::/*,READ_UPDATE")
    add_user(path, "reader", "reader-secret", "prn::/scope:S,READ")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    assert "admin-secret" not in text and "reader-secret" not in text
    users = PasswordFile.load(path).users
    assert verify_password("admin-secret", users["admin"].password_hash)
    assert [str(g) for g in users["reader"].grants] == ["prn::/scope:S,READ"]
    listed = run_cli("user", "list", "--file", str(path))
    assert listed.stdout.splitlines() == [
        "admin\tprn::/*,READ_UPDATE",
        "reader\tprn::/scope:S,READ",
    ]
    again = run_cli(
        "user", "add", "admin", "--file", str(path), "--password-stdin", stdin="x" * 8 + "\n"
    )
    assert again.returncode == 1 and "exists" in again.stderr
    short = run_cli("user", "add", "new", "--file", str(path), "--password-stdin", stdin="short\n")
    assert short.returncode == 1 and "at least 8" in short.stderr
    bad = run_cli(
        "user",
        "add",
        "new",
        "--file",
        str(path),
        "--permission",
        "prn::/scope:x,ALL",
        "--password-stdin",
    )
    assert bad.returncode == 2 and "READ or READ_UPDATE" in bad.stderr
    assert run_cli("user", "remove", "admin", "--file", str(path)).returncode == 0
    assert list(PasswordFile.load(path).users) == ["reader"]
    missing = run_cli("user", "remove", "admin", "--file", str(path))
    assert missing.returncode == 1 and "no user 'admin'" in missing.stderr
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".users")]  # no temp left


# --------------------------------------------------------------------------- the server


@pytest.fixture(scope="module")
def auth_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("auth")
    users = tmp / "users"
    add_user(users, *ADMIN, "prn::/*,READ_UPDATE")
    add_user(users, *READER, f"prn::/scope:{SCOPE},READ")
    server = ServerProcess(
        tmp / "data",
        ports={"controller": FREE, "segment_store": FREE},
        args=["--auth-password-file", str(users)],
        wait_for=["controller", "segment_store"],
    )
    with server:
        yield server
    assert "Traceback" not in server.log_text(), server.log_text()


def _call(server: ServerProcess, rpc: str, request: Any, creds: tuple[str, str] | None) -> Any:
    """One controller RPC over a fresh channel, with Basic credentials if given."""
    method = METHODS[rpc]
    with grpc.insecure_channel(f"127.0.0.1:{server.port_of('controller')}") as channel:
        call = channel.unary_unary(
            f"/{SERVICE_NAME}/{rpc}",
            request_serializer=method.request.SerializeToString,
            response_deserializer=method.response.FromString,
        )
        metadata = [] if creds is None else [("authorization", basic_header(*creds))]
        return call(request, metadata=metadata, timeout=WAIT_S)


def _code(server: ServerProcess, rpc: str, request: Any, creds: tuple[str, str] | None) -> Any:
    with pytest.raises(grpc.RpcError) as info:
        _call(server, rpc, request, creds)
    return info.value.code()


@pytest.fixture(scope="module")
def stream(auth_server: ServerProcess) -> str:
    """``S/T`` with one segment, created by the admin (empty: tests write what they read)."""
    _call(auth_server, "createScope", pb.ScopeInfo(scope=SCOPE), ADMIN)
    config = pb.StreamConfig(
        streamInfo=pb.StreamInfo(scope=SCOPE, stream="T"),
        scalingPolicy=pb.ScalingPolicy(minNumSegments=1),
    )
    status = _call(auth_server, "createStream", config, ADMIN)
    assert status.status == pb.CreateStreamStatus.SUCCESS
    return f"{SCOPE}/T/0.#epoch.0"


def test_controller_refuses_missing_and_wrong_credentials(auth_server: ServerProcess) -> None:
    scope = pb.ScopeInfo(scope="x")
    unauth = grpc.StatusCode.UNAUTHENTICATED
    assert _code(auth_server, "createScope", scope, None) == unauth
    assert _code(auth_server, "createScope", scope, ("admin", "wrong-password")) == unauth
    assert _code(auth_server, "createScope", scope, ("nobody", "admin-secret")) == unauth
    assert _code(auth_server, "listScopes", pb.ScopesRequest(), None) == unauth
    assert (
        _code(auth_server, "getDelegationToken", pb.StreamInfo(scope="S", stream="T"), None)
        == unauth
    )


def _bearer_call(server: ServerProcess, rpc: str, request: Any, token: str) -> Any:
    method = METHODS[rpc]
    with grpc.insecure_channel(f"127.0.0.1:{server.port_of('controller')}") as channel:
        call = channel.unary_unary(
            f"/{SERVICE_NAME}/{rpc}",
            request_serializer=method.request.SerializeToString,
            response_deserializer=method.response.FromString,
        )
        return call(request, metadata=[("authorization", f"Bearer {token}")], timeout=WAIT_S)


def test_controller_takes_a_node_token_and_no_other_bearer(auth_server: ServerProcess) -> None:
    """A cluster node's own calls carry a node token signed with the shared key;
    a user's delegation token, a forged or an expired one is not a credential."""
    key = _key(auth_server)
    now = int(time.time())
    node = encode_token(
        key, TokenClaims("n2", "prn::/", Permission.READ_UPDATE, now + 60, now, True)
    )
    scope = pb.ScopeInfo(scope="bynode")
    status = _bearer_call(auth_server, "createScope", scope, node)
    assert status.status == pb.CreateScopeStatus.SUCCESS
    user = encode_token(key, TokenClaims("admin", "prn::/", Permission.READ_UPDATE, now + 60, now))
    forged = encode_token(
        b"k" * 32, TokenClaims("n2", "prn::/", Permission.READ_UPDATE, now + 60, now, True)
    )
    expired = encode_token(
        key, TokenClaims("n2", "prn::/", Permission.READ_UPDATE, now - 1, now - 61, True)
    )
    for token in (user, forged, expired, "not-a-token"):
        with pytest.raises(grpc.RpcError) as info:
            _bearer_call(auth_server, "createScope", pb.ScopeInfo(scope="nope"), token)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED, token


def test_reader_may_look_but_not_change(auth_server: ServerProcess, stream: str) -> None:
    denied = grpc.StatusCode.PERMISSION_DENIED
    info = pb.StreamInfo(scope=SCOPE, stream="T")
    assert _code(auth_server, "createScope", pb.ScopeInfo(scope="mine"), READER) == denied
    assert _code(auth_server, "sealStream", info, READER) == denied
    config = pb.StreamConfig(
        streamInfo=pb.StreamInfo(scope=SCOPE, stream="U"),
        scalingPolicy=pb.ScalingPolicy(minNumSegments=1),
    )
    assert _code(auth_server, "createStream", config, READER) == denied
    other = pb.StreamInfo(scope="elsewhere", stream="T")
    assert _code(auth_server, "getCurrentSegments", other, READER) == denied
    ranges = _call(auth_server, "getCurrentSegments", info, READER)
    assert len(ranges.segmentRanges) == 1
    _call(auth_server, "createScope", pb.ScopeInfo(scope="hidden"), ADMIN)
    scopes = _call(auth_server, "listScopes", pb.ScopesRequest(), READER).scopes
    assert list(scopes) == [SCOPE]  # the reader sees only what it may read
    assert "hidden" in _call(auth_server, "listScopes", pb.ScopesRequest(), ADMIN).scopes
    # A reader group's resource is its state stream: reading the scope allows looking only.
    group = pb.ReaderGroupConfiguration(
        scope=SCOPE, readerGroupName="rg", startingStreamCuts=[pb.StreamCut(streamInfo=info)]
    )
    assert _code(auth_server, "createReaderGroup", group, READER) == denied
    cut = pb.SubscriberStreamCut(subscriber=f"{SCOPE}/rg", streamCut=pb.StreamCut(streamInfo=info))
    assert _code(auth_server, "updateSubscriberStreamCut", cut, READER) == denied
    looked = _call(
        auth_server,
        "getReaderGroupConfig",
        pb.ReaderGroupInfo(scope=SCOPE, readerGroup="rg"),
        READER,
    )
    assert looked.status == pb.ReaderGroupConfigResponse.RG_NOT_FOUND


def test_key_value_tables_need_a_grant_on_their_pseudo_stream(
    auth_server: ServerProcess, stream: str
) -> None:
    denied = grpc.StatusCode.PERMISSION_DENIED
    config = pb.KeyValueTableConfig(scope=SCOPE, kvtName="kv", partitionCount=2, primaryKeyLength=4)
    assert _code(auth_server, "createKeyValueTable", config, READER) == denied
    created = _call(auth_server, "createKeyValueTable", config, ADMIN)
    assert created.status == pb.CreateKeyValueTableStatus.SUCCESS
    kvt = pb.KeyValueTableInfo(scope=SCOPE, kvtName="kv")
    got = _call(auth_server, "getKeyValueTableConfiguration", kvt, READER)
    assert got.config.partitionCount == 2
    listing = pb.KVTablesInScopeRequest(scope=pb.ScopeInfo(scope=SCOPE))
    assert [
        t.kvtName for t in _call(auth_server, "listKeyValueTablesInScope", listing, READER).kvtables
    ] == ["kv"]
    assert _code(auth_server, "deleteKeyValueTable", kvt, READER) == denied
    elsewhere = pb.KeyValueTableInfo(scope="elsewhere", kvtName="kv")
    assert _code(auth_server, "getKeyValueTableConfiguration", elsewhere, READER) == denied
    deleted = _call(auth_server, "deleteKeyValueTable", kvt, ADMIN)
    assert deleted.status == pb.DeleteKVTableStatus.SUCCESS


def _token(server: ServerProcess, creds: tuple[str, str], scope: str, stream: str) -> str:
    reply = _call(server, "getDelegationToken", pb.StreamInfo(scope=scope, stream=stream), creds)
    return str(reply.delegationToken)


def test_delegation_token_names_user_stream_permission_and_expiry(
    auth_server: ServerProcess, stream: str
) -> None:
    token = _token(auth_server, READER, SCOPE, "T")
    _head, body, _sig = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    assert claims["sub"] == "reader"
    assert claims["res"] == "prn::/scope:S/stream:T"
    assert claims["perm"] == "READ"
    assert abs(claims["exp"] - (time.time() + DEFAULT_TOKEN_TTL_S)) < 60
    admin = json.loads(
        base64.urlsafe_b64decode(_token(auth_server, ADMIN, SCOPE, "T").split(".")[1] + "==")
    )
    assert admin["perm"] == "READ_UPDATE"
    denied = _code(auth_server, "getDelegationToken", pb.StreamInfo(scope="zz", stream="T"), READER)
    assert denied == grpc.StatusCode.PERMISSION_DENIED


def test_delegation_tokens_name_only_valid_streams(auth_server: ServerProcess) -> None:
    """A token's resource is matched as a pattern at the segment store, so its
    names follow the rules of every other RPC: no ``*``, ``/`` or other
    characters outside ``[A-Za-z0-9.-]`` (INVALID_ARGUMENT), except the ``_``
    of a table's pseudo-stream (``<group>_kvtable``, ``<group>_hrgroup``)."""
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    for scope, stream in [
        (SCOPE, "*"),
        (SCOPE, "T*"),
        (SCOPE, "*_kvtable"),
        (SCOPE, "T/x"),
        (SCOPE, "../T"),
        (SCOPE, "T/.."),
        (SCOPE, ""),
        (SCOPE, "_system"),
        (SCOPE, "_kvtable"),
        (SCOPE, "_hrgroupsx"),
        (SCOPE, "_RG"),
        (SCOPE, "_RG_x"),
        (SCOPE, "_MARK*"),
        (SCOPE, "T_other"),
        ("*", "T"),
        ("S/stream:T", "T"),
        ("", "T"),
    ]:
        request = pb.StreamInfo(scope=scope, stream=stream)
        assert _code(auth_server, "getDelegationToken", request, ADMIN) == invalid, (scope, stream)
    for stream in [
        "T",
        "t-1.x",
        "rg_kvtable",
        "my_group_kvtable",
        "g_hrgroup",
        "_hrgroups",
        "_RGrg",
        "_MARKT",
    ]:
        token = _token(auth_server, ADMIN, SCOPE, stream)
        claims = json.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))
        assert claims["res"] == f"prn::/scope:{SCOPE}/stream:{stream}"


def _key(server: ServerProcess) -> bytes:
    path = server.data_dir / TOKEN_KEY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    return path.read_bytes()


def test_segment_store_checks_every_token(auth_server: ServerProcess, stream: str) -> None:
    port = auth_server.port_of("segment_store")
    reader_token = _token(auth_server, READER, SCOPE, "T")
    admin_token = _token(auth_server, ADMIN, SCOPE, "T")
    other_stream = _token(auth_server, ADMIN, SCOPE, "other")
    key = _key(auth_server)
    past = int(time.time()) - 10
    expired = encode_token(
        key, TokenClaims("admin", "prn::/scope:S/stream:T", Permission.READ_UPDATE, past, past - 5)
    )
    forged = encode_token(
        b"f" * 32,
        TokenClaims("admin", "prn::/scope:S/stream:T", Permission.READ_UPDATE, past + 3600, past),
    )
    failed, expired_code = (
        p.AuthTokenCheckFailed.TOKEN_CHECK_FAILED,
        p.AuthTokenCheckFailed.TOKEN_EXPIRED,
    )

    async def check() -> None:
        raw = await Raw.connect(port)
        bystander = await Raw.connect(port)
        try:

            async def refused(cmd: p.Command) -> int:
                reply = await raw.request(cmd)
                assert isinstance(reply, p.AuthTokenCheckFailed), reply
                assert reply.request_id == cmd.request_id_or_default
                return reply.error_code

            def read(rid: int, token: str, segment: str = stream) -> p.ReadSegment:
                return p.ReadSegment(segment, 0, 100, token, rid)

            assert await refused(read(1, "")) == failed
            assert await refused(read(2, forged)) == failed
            assert await refused(read(3, expired)) == expired_code
            assert await refused(read(4, other_stream)) == failed
            assert await refused(read(5, "garbage")) == failed
            assert await refused(read(6, admin_token, "_system/containers/0")) == failed
            writer = uuid.uuid4()
            assert await refused(p.SetupAppend(7, writer, stream, reader_token)) == failed
            assert await refused(p.SealSegment(8, stream, reader_token)) == failed
            assert await refused(p.CreateTableSegment(9, f"{SCOPE}/T/x", reader_token)) == failed
            # The connection (and another one) still work with good tokens: the
            # admin appends one event and the reader reads it back (a read of the
            # empty segment would be parked at the tail, not answered).
            setup = await raw.request(p.SetupAppend(10, writer, stream, admin_token))
            assert isinstance(setup, p.AppendSetup)
            event = p.encode_event(b"checked")
            appended = await raw.request(p.AppendBlockEnd(writer, len(event), event, 1, 1, 11))
            assert isinstance(appended, p.DataAppended) and appended.event_number == 1
            info = await bystander.request(p.GetStreamSegmentInfo(12, stream, reader_token))
            assert isinstance(info, p.StreamSegmentInfo) and info.write_offset == len(event)
            reply = await bystander.request(read(13, reader_token))
            assert isinstance(reply, p.SegmentRead) and reply.request_id == 13
            assert bytes(reply.data) == event
        finally:
            await raw.aclose()
            await bystander.aclose()

    asyncio.run(check())
    assert auth_server.alive()
    log = auth_server.log_text()
    assert "refused ReadSegment on S/T/0.#epoch.0: bad delegation token signature" in log


def test_internal_segments_and_flush_take_only_node_tokens(
    auth_server: ServerProcess, stream: str
) -> None:
    """A node token (the node claim, signed with the server's key) may change
    internal segments and FlushToStorage, as another node forwarding its
    controller's or TANK's tables does; a user's token (even an administrator's)
    or a token naming every stream without the node claim may not, nor a
    forged or expired node token. Refusals are ``AuthTokenCheckFailed``."""
    port = auth_server.port_of("segment_store")
    key = _key(auth_server)
    now = int(time.time())

    def signed(node: bool, *, with_key: bytes = key, expires: int = now + 600) -> str:
        claims = TokenClaims("headrace-node", "prn::/*", Permission.READ_UPDATE, expires, now, node)
        return encode_token(with_key, claims)

    node = signed(True)
    refused = {
        "an administrator's": _token(auth_server, ADMIN, SCOPE, "T"),
        "every stream, no node claim": signed(False),
        "forged": signed(True, with_key=b"f" * 32),
        "expired": signed(True, expires=now - 10),
    }
    table = f"_system/nodes/{uuid.uuid4().hex}"
    segment = f"_system/other/{uuid.uuid4().hex}"
    entries = p.TableEntries(((p.TableKey(b"k"), p.TableValue(b"v")),))

    def flush(rid: int, token: str) -> p.FlushToStorage:
        return p.FlushToStorage(0, token, rid)

    async def check() -> None:
        raw = await Raw.connect(port)
        try:
            for why, token in refused.items():
                for cmd in (
                    flush(1, token),
                    p.CreateTableSegment(2, table, token),
                    p.CreateSegment(3, segment, 0, 0, token),
                    p.ReadTable(4, "_system/containers/0", token, (p.TableKey(b"k"),)),
                ):
                    reply = await raw.request(cmd)
                    assert isinstance(reply, p.AuthTokenCheckFailed), (why, cmd, reply)
                    assert reply.request_id == cmd.request_id_or_default
            assert await raw.request(flush(5, node)) == p.StorageFlushed(5)
            assert await raw.request(p.CreateTableSegment(6, table, node)) == p.SegmentCreated(
                6, table
            )
            updated = await raw.request(p.UpdateTableEntries(7, table, node, entries))
            assert updated == p.TableEntriesUpdated(7, (0,))
            read = await raw.request(p.ReadTable(8, table, node, (p.TableKey(b"k"),)))
            assert isinstance(read, p.TableRead) and read.entries.entries[0][1].value == b"v"
            created = await raw.request(p.CreateSegment(9, segment, 0, 0, node))
            assert created == p.SegmentCreated(9, segment)
            writer = uuid.uuid4()
            setup = await raw.request(p.SetupAppend(10, writer, segment, node))
            assert isinstance(setup, p.AppendSetup), setup
            event = p.encode_event(b"forwarded")
            appended = await raw.request(p.AppendBlockEnd(writer, len(event), event, 1, 1, 11))
            assert isinstance(appended, p.DataAppended), appended
            # The user's token still does what it always did.
            user = refused["an administrator's"]
            info = await raw.request(p.GetStreamSegmentInfo(12, stream, user))
            assert isinstance(info, p.StreamSegmentInfo) and info.exists, info
        finally:
            await raw.aclose()

    asyncio.run(check())
    assert auth_server.alive()
    assert "FlushToStorage names no segment: only a node token allows it" in auth_server.log_text()


def test_a_refusal_naming_the_longest_segment_is_encodable(
    auth_server: ServerProcess, stream: str
) -> None:
    """A token refused for a segment whose name is as long as names go gets
    ``AuthTokenCheckFailed`` whose text quotes the name cut, within the bound;
    the connection serves on."""
    long_name = f"{SCOPE}/U/" + "u" * (MAX_NAME_BYTES - len(f"{SCOPE}/U/"))
    token = _token(auth_server, ADMIN, SCOPE, "T")

    async def check() -> None:
        raw = await Raw.connect(auth_server.port_of("segment_store"))
        try:
            reply = await raw.request(p.GetStreamSegmentInfo(1, long_name, token))
            assert isinstance(reply, p.AuthTokenCheckFailed), reply
            assert len(reply.server_stack_trace.encode()) <= p.MAX_REPLY_TEXT_BYTES
            assert repr(long_name[: p.QUOTED_NAME_CHARS] + "\u2026") in reply.server_stack_trace
            info = await raw.request(p.GetStreamSegmentInfo(2, stream, token))
            assert isinstance(info, p.StreamSegmentInfo) and info.exists, info
        finally:
            await raw.aclose()

    asyncio.run(check())


@pytest.fixture(scope="module")
def two_streams(auth_server: ServerProcess, stream: str) -> tuple[str, str]:
    """``S/A`` and ``S/B``, one segment each, created by the admin and written only
    by the test that checks who may append to them."""
    for name in ("A", "B"):
        config = pb.StreamConfig(
            streamInfo=pb.StreamInfo(scope=SCOPE, stream=name),
            scalingPolicy=pb.ScalingPolicy(minNumSegments=1),
        )
        status = _call(auth_server, "createStream", config, ADMIN).status
        assert status == pb.CreateStreamStatus.SUCCESS
    return f"{SCOPE}/A/0.#epoch.0", f"{SCOPE}/B/0.#epoch.0"


async def _answer(raw: Raw) -> p.Command | None:
    """The next reply on ``raw``, or None once the server closed the connection."""
    while True:
        event = raw.conn.next_event()
        if isinstance(event, p.ConnectionClosed):
            return None
        if event is not None:
            assert isinstance(event, p.Command), event
            return event
        try:
            data = await asyncio.wait_for(raw.reader.read(1 << 20), WAIT_S)
        except ConnectionResetError:
            data = b""
        raw.conn.receive_data(data)


def _append_forms(writer: uuid.UUID) -> dict[str, list[p.Command]]:
    """Every way a writer appends (pravega.md#appends), each with event number 1."""
    small = p.encode_event(b"smuggled")
    large = p.encode_event(b"L" * (256 * 1024))  # over LARGE_FRAME_BYTES: its own buffer
    block = p.encode_event(b"java")
    return {
        "AppendBlockEnd": [p.AppendBlockEnd(writer, len(small), small, 1, 1, 100)],
        "large AppendBlockEnd": [p.AppendBlockEnd(writer, len(large), large, 1, 1, 100)],
        "AppendBlock": [
            p.AppendBlock(writer, block),
            p.AppendBlockEnd(writer, len(block), b"", 1, 1, 100),
        ],
        "ConditionalAppend": [p.ConditionalAppend(writer, 1, 0, p.Event(b"cond"), 100)],
        "ConditionalBlockEnd": [p.ConditionalBlockEnd(writer, 1, 0, b"raw bytes", 100)],
    }


def test_appends_need_an_accepted_setup_append(
    auth_server: ServerProcess, two_streams: tuple[str, str]
) -> None:
    """A SetupAppend refused for its token opens no writer session: whatever the
    append form, the writer's appends close the connection and nothing is stored,
    whether the token was bad, only READ, or for another stream."""
    a, b = two_streams
    port = auth_server.port_of("segment_store")
    admin_a = _token(auth_server, ADMIN, SCOPE, "A")
    admin_b = _token(auth_server, ADMIN, SCOPE, "B")
    reader_b = _token(auth_server, READER, SCOPE, "B")
    refused_tokens = {"garbage": "garbage", "READ only": reader_b, "stream A's": admin_a}
    failed = p.AuthTokenCheckFailed.TOKEN_CHECK_FAILED

    async def attempt(token: str, form: str, *, wait_for_refusal: bool) -> str:
        raw = await Raw.connect(port)
        try:
            writer = uuid.uuid4()
            setup = p.SetupAppend(1, writer, b, token)
            appends = _append_forms(writer)[form]
            if wait_for_refusal:
                refusal = await raw.request(setup)
                assert isinstance(refusal, p.AuthTokenCheckFailed), refusal
                assert refusal.error_code == failed
                await raw.send(*appends)
            else:  # pipelined: the appends arrive before the server answered the setup
                await raw.send(setup, *appends)
                refusal = await _answer(raw)
                assert isinstance(refusal, p.AuthTokenCheckFailed | None), refusal
            answer = await _answer(raw)
            return "closed" if answer is None else type(answer).__name__
        finally:
            await raw.aclose()

    async def moved(form: str) -> str:
        """A writer set up on A asks for B with A's token: refused, and its
        session on A is gone too (its appends are not meant for A any more)."""
        raw = await Raw.connect(port)
        try:
            writer = uuid.uuid4()
            setup = await raw.request(p.SetupAppend(1, writer, a, admin_a))
            assert isinstance(setup, p.AppendSetup), setup
            refusal = await raw.request(p.SetupAppend(2, writer, b, admin_a))
            assert isinstance(refusal, p.AuthTokenCheckFailed), refusal
            await raw.send(*_append_forms(writer)[form])
            answer = await _answer(raw)
            return "closed" if answer is None else type(answer).__name__
        finally:
            await raw.aclose()

    async def length(segment: str, token: str) -> int:
        raw = await Raw.connect(port)
        try:
            info = await raw.request(p.GetStreamSegmentInfo(9, segment, token))
            assert isinstance(info, p.StreamSegmentInfo), info
            return info.write_offset
        finally:
            await raw.aclose()

    async def check() -> None:
        outcomes = {}
        for form in _append_forms(uuid.uuid4()):
            for why, token in refused_tokens.items():
                for waited in (True, False):
                    outcomes[why, form, waited] = await attempt(
                        token, form, wait_for_refusal=waited
                    )
            outcomes["moved", form, True] = await moved(form)
        assert set(outcomes.values()) == {"closed"}, outcomes
        assert await length(b, admin_b) == 0
        assert await length(a, admin_a) == 0
        # The stream's own writer still appends (the refusals harmed nobody).
        raw = await Raw.connect(port)
        try:
            writer = uuid.uuid4()
            setup = await raw.request(p.SetupAppend(1, writer, b, admin_b))
            assert isinstance(setup, p.AppendSetup), setup
            event = p.encode_event(b"allowed")
            appended = await raw.request(p.AppendBlockEnd(writer, len(event), event, 1, 1, 2))
            assert isinstance(appended, p.DataAppended), appended
        finally:
            await raw.aclose()
        assert await length(b, admin_b) == len(event)

    asyncio.run(check())
    assert auth_server.alive()
    assert "without an accepted SetupAppend" in auth_server.log_text()


# --------------------------------------------------------------------------- our client


def test_our_client_with_credentials(auth_server: ServerProcess, stream: str) -> None:
    from headrace.client import PravegaClient
    from headrace.client.controller import ScalingPolicy, Segment, StreamConfig
    from headrace.client.errors import ReplyError
    from headrace.errors import ServerError

    async def check() -> None:
        async with PravegaClient(auth_server.uri, credentials=ADMIN) as client:
            assert await client.controller.create_scope("ours")
            config = StreamConfig(ScalingPolicy.fixed(1))
            assert await client.controller.create_stream("ours", "st", config)
            async with await client.create_writer("ours", "st") as writer:
                for i in range(10):
                    await writer.write(f"e{i}".encode())
                await writer.flush()
            segment = Segment("ours", "st", 0)
            data = await client.segments.read(segment, 0)
            assert data.data.count(b"e") == 10
            # A token that expired on the way: the client fetches a fresh one once.
            key = _key(auth_server)
            past = int(time.time()) - 5
            stale = encode_token(
                key, TokenClaims("admin", "prn::/scope:ours/stream:st", Permission.READ, past, 0)
            )
            client.controller._tokens[("ours", "st")] = (stale, time.time() + 3600)
            again = await client.segments.read(segment, 0)
            assert again.data == data.data
            assert client.controller._tokens[("ours", "st")][0] != stale

        async with PravegaClient(auth_server.uri, credentials=("admin", "wrong-pass")) as client:
            with pytest.raises(ServerError, match="UNAUTHENTICATED"):
                await client.controller.create_scope("nope")

        async with PravegaClient(auth_server.uri, credentials=READER) as client:
            data = await client.segments.read(Segment(SCOPE, "T", 0), 0)
            assert data.offset == 0
            with pytest.raises(ServerError, match="PERMISSION_DENIED"):
                await client.controller.create_scope("nope")
            writer = await client.create_writer(SCOPE, "T")
            with pytest.raises(ReplyError, match="AuthTokenCheckFailed"):
                await writer.write(b"not allowed")
                await writer.flush()
            with contextlib.suppress(ReplyError):
                await writer.aclose()

        async with PravegaClient(auth_server.uri) as client:  # no credentials at all
            with pytest.raises(ServerError, match="UNAUTHENTICATED"):
                await client.controller.create_scope("nope")

    asyncio.run(asyncio.wait_for(check(), 60))


def test_credentials_from_the_real_clients_environment_variables() -> None:
    from headrace.client.pravega import credentials_from_env

    env = {"pravega_client_auth_username": "u", "pravega_client_auth_password": "pw"}
    assert credentials_from_env(env) == ("u", "pw")
    assert credentials_from_env({**env, "pravega_client_auth_method": "basic"}) == ("u", "pw")
    assert credentials_from_env({**env, "pravega_client_auth_method": "Bearer"}) is None
    assert credentials_from_env({"pravega_client_auth_password": "pw"}) is None


def test_cli_commands_take_credentials(auth_server: ServerProcess, tmp_path: Path) -> None:
    password = tmp_path / "password"
    password.write_text("admin-secret\n")
    creds = ["--controller", auth_server.uri, "--user", "admin", "--password-file", str(password)]
    created = run_cli("stream", "create", "cli/st", *creds)
    assert created.returncode == 0, created.stderr
    assert created.stdout.strip() == "created: cli/st"
    wrote = run_cli("write", "cli/st", "-", *creds, stdin="one\ntwo\n")
    assert wrote.returncode == 0, wrote.stderr
    read = run_cli("read", "cli/st", *creds)
    assert read.returncode == 0, read.stderr
    assert read.stdout.splitlines() == ["one", "two"]
    anonymous = run_cli("stream", "create", "cli/other", "--controller", auth_server.uri)
    assert anonymous.returncode == 1 and "wants credentials" in anonymous.stderr
    assert "--user" in anonymous.stderr
    env_creds = subprocess.run(
        [sys.executable, "-m", "headrace", "read", "cli/st", "--controller", auth_server.uri],
        capture_output=True,
        text=True,
        timeout=60,
        env=server_env(
            {"pravega_client_auth_username": "reader", "pravega_client_auth_password": "x"}
        ),
    )
    assert env_creds.returncode == 1 and "refused the credentials" in env_creds.stderr
    half = run_cli("stream", "create", "cli/other", "--controller", auth_server.uri, "--user", "a")
    assert half.returncode == 2 and "go together" in half.stderr


def _serve_fails(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``headrace serve`` with only the segment store (on a free port) and ``args``;
    it must stop by itself at start."""
    from tests._server import free_port

    ports = [f"--{name.replace('_', '-')}-port=0" for name in LISTENER_NAMES]
    return subprocess.run(
        [sys.executable, "-m", "headrace", "serve", "--data-dir", str(tmp_path / "data"),
         *ports, f"--segment-store-port={free_port()}", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=server_env(),
    )  # fmt: skip


def test_serve_refuses_a_bad_password_file_or_an_open_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad-users"
    bad.write_text("# users\nalice:plaintext:prn::/*,READ_UPDATE;\n")
    done = _serve_fails(tmp_path, "--auth-password-file", str(bad))
    assert done.returncode == 1
    assert "line 2" in done.stderr and "$scrypt$" in done.stderr
    missing = _serve_fails(tmp_path, "--auth-password-file", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "--auth-password-file" in missing.stderr
    good = tmp_path / "users"
    add_user(good, *ADMIN, "prn::/*,READ_UPDATE")
    (tmp_path / "data").mkdir(exist_ok=True)
    key = tmp_path / "data" / TOKEN_KEY_FILE
    key.write_bytes(b"k" * 32)
    key.chmod(0o644)
    done = _serve_fails(tmp_path, "--auth-password-file", str(good))
    assert done.returncode == 1 and "readable by others" in done.stderr


def test_sync_client_with_credentials(auth_server: ServerProcess) -> None:
    from headrace.client.sync import SyncClient

    with SyncClient(auth_server.uri, credentials=ADMIN, timeout_s=WAIT_S * 3) as hr:
        hr.create_scope("sync")
        hr.create_stream("sync", "st")
        writer = hr.writer("sync", "st")
        writer.write(b"blocking")
        writer.flush()
        writer.close()
        assert [r.value for r in hr.records("sync", "st")] == [b"blocking"]
