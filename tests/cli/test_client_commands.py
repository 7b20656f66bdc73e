"""The client commands as a user runs them: ``python -m headrace ...`` subprocesses
against one real ``headrace serve`` (controller, segment store, TANK, HTTP)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from headrace.cli.events import JSON_FIELDS
from headrace.client.tank import TankClient
from headrace.protocols.tank import BundleMessage
from tests._server import FREE, ServerProcess, server_env

CLI_TIMEOUT_S = 60.0
"""Bound on one command."""

METRIC_WAIT_S = 30.0
"""Bound on waiting for the lag metric to show a walk made after the reads."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    data = tmp_path_factory.mktemp("cli") / "data"
    ports = {"controller": FREE, "segment_store": FREE, "tank": FREE, "http": FREE}
    with ServerProcess(data, ports=ports, fsync="never", wait_for=list(ports)) as proc:
        yield proc


@pytest.fixture()
def hr(server: ServerProcess, tmp_path: Path) -> Cli:
    return Cli(server, tmp_path / "config")


class Cli:
    """``python -m headrace`` with the test server's controller and a private config dir."""

    def __init__(self, server: ServerProcess, config_home: Path) -> None:
        self.server = server
        self.config_home = config_home

    def __call__(
        self, *args: str, stdin: bytes = b"", controller: bool = True, ok: bool = True
    ) -> subprocess.CompletedProcess[str]:
        env = {"XDG_CONFIG_HOME": str(self.config_home)}
        if controller:
            env["HEADRACE_CONTROLLER"] = self.server.uri
        done = subprocess.run(
            [sys.executable, "-m", "headrace", *args],
            input=stdin,
            capture_output=True,
            timeout=CLI_TIMEOUT_S,
            env=server_env(env),
        )
        result = subprocess.CompletedProcess(
            done.args, done.returncode, done.stdout.decode(), done.stderr.decode()
        )
        if ok:
            assert result.returncode == 0, result.stderr
        return result


def one_line_error(result: subprocess.CompletedProcess[str], code: int = 1) -> str:
    """The single ``Error:`` line of a failed command."""
    assert result.returncode == code, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert "Traceback" not in result.stderr
    assert lines[-1].startswith("Error: "), lines
    if code == 1:
        assert len(lines) == 1, lines
    return lines[-1]


# ----------------------------------------------------------------------------- write / read


def test_write_keyed_lines_then_read_them_with_a_format_string(hr: Cli) -> None:
    hr("stream", "create", "rw/keyed", "--segments", "2")
    lines = [f"k{i % 3}:value {i}" for i in range(12)] + ["no separator here"]
    wrote = hr("write", "rw/keyed", "-K", ":", stdin="\n".join(lines).encode() + b"\n")
    assert "wrote 13 events" in wrote.stderr

    out = hr("read", "rw/keyed", "-f", "%s|%o|%k|%v|%S").stdout.splitlines()
    rows = [line.split("|") for line in out]
    assert sorted(r[3] for r in rows) == sorted(
        [f"value {i}" for i in range(12)] + ["no separator here"]
    )
    assert all(r[2] == "" for r in rows)  # Pravega events keep no key
    by_segment: dict[str, list[list[str]]] = {}
    for r in rows:
        by_segment.setdefault(r[0], []).append(r)
    for seg_rows in by_segment.values():  # offsets: each event's 8-byte header, then its value
        expected = 0
        for _, offset, _, value, size in seg_rows:
            assert (int(offset), int(size)) == (expected, len(value.encode()))
            expected += 8 + len(value.encode())
    for key in ("k0", "k1", "k2"):  # one key, one segment, written order
        numbers = [int(i) for i in range(12) if f"k{i % 3}" == key]
        mine = [r for r in rows if r[3] in {f"value {n}" for n in numbers}]
        assert len({r[0] for r in mine}) == 1
        assert [r[3] for r in mine] == [f"value {n}" for n in numbers]

    records = [
        json.loads(line) for line in hr("read", "rw/keyed", "-f", "json").stdout.splitlines()
    ]
    assert all(list(rec) == list(JSON_FIELDS) for rec in records)
    assert all(rec["key"] is None and rec["encoding"] == "utf-8" for rec in records)
    bad = hr("read", "rw/keyed", "-f", "%q", ok=False)
    assert "unknown field '%q'" in one_line_error(bad, 2)


def test_write_with_a_delimiter_and_binary_values_in_json(hr: Cli) -> None:
    hr("stream", "create", "rw/delim")
    hr("write", "rw/delim", "-D", "\\0", stdin=b"one\0two\nlines\0\xff\xfe\0")
    out = hr("read", "rw/delim", "-f", "json").stdout.splitlines()
    records = [json.loads(line) for line in out]
    assert [r["encoding"] for r in records] == ["utf-8", "utf-8", "base64"]
    assert [r["value"] for r in records[:2]] == ["one", "two\nlines"]
    assert records[2]["value"] == "//4="


def test_last_gives_exactly_the_last_records_of_each_segment(hr: Cli) -> None:
    hr("stream", "create", "rw/last")
    hr("write", "rw/last", stdin=b"".join(b"event %d\n" % i for i in range(10)))
    assert hr("read", "rw/last", "--last", "3").stdout.splitlines() == [
        "event 7", "event 8", "event 9",
    ]  # fmt: skip
    assert hr("read", "rw/last", "--last", "30").stdout.count("\n") == 10
    assert hr("read", "rw/last", "--last", "3", "--until", "2").stdout.splitlines() == [
        "event 7", "event 8",
    ]  # fmt: skip
    clash = hr("read", "rw/last", "--last", "3", "--from", "tail", ok=False)
    assert "exclude each other" in one_line_error(clash, 2)


def test_since_skips_segments_not_written_since(hr: Cli) -> None:
    hr("stream", "create", "rw/since")
    hr("write", "rw/since", stdin=b"a\nb\n")
    assert hr("read", "rw/since", "--since", "1h").stdout.splitlines() == ["a", "b"]
    later = str(int(time.time() * 1000) + 3_600_000)
    assert hr("read", "rw/since", "--since", later).stdout == ""
    bad = hr("read", "rw/since", "--since", "yesterday-ish", ok=False)
    assert "--since" in one_line_error(bad, 2)


def _next_ms() -> int:
    """The wall clock's next millisecond, once it came: what the server stamped
    before this call is earlier than the value returned."""
    now = time.time_ns() // 1_000_000
    deadline = time.monotonic() + 10
    while time.time_ns() // 1_000_000 <= now:
        assert time.monotonic() < deadline, "the wall clock stands still"
        time.sleep(0.0005)  # lets the clock tick; nothing else is waited for
    return time.time_ns() // 1_000_000


def test_since_and_until_time_select_by_append_time_exactly(hr: Cli) -> None:
    hr("stream", "create", "rw/times")
    hr("write", "rw/times", stdin=b"a\nb\n")
    t1 = _next_ms()
    hr("write", "rw/times", stdin=b"c\n")
    t2 = _next_ms()
    hr("write", "rw/times", stdin=b"d\n")
    window = hr("read", "rw/times", "--since", str(t1), "--until-time", str(t2))
    assert window.stdout.splitlines() == ["c"]
    assert hr("read", "rw/times", "--until-time", str(t1)).stdout.splitlines() == ["a", "b"]


def test_tank_keys_and_timestamps_in_the_format(hr: Cli, server: ServerProcess) -> None:
    async def produce() -> None:
        async with await TankClient.connect("127.0.0.1", server.port_of("tank")) as client:
            await client.create_topic("keyed", 1)
            await client.produce(
                "keyed",
                0,
                [
                    BundleMessage(b"v1", timestamp_ms=1000, key=b"alpha"),
                    BundleMessage(b"v2", timestamp_ms=2000, key=b"beta"),
                ],
            )

    asyncio.run(produce())
    out = hr("read", "tank/keyed", "-f", "%k=%v@%T#%i %K").stdout.splitlines()
    assert out == ["alpha=v1@1000#0 5", "beta=v2@2000#1 4"]


# ----------------------------------------------------------------------------- streams, scopes


def test_seal_truncate_scale_update_and_list(hr: Cli) -> None:
    hr("stream", "create", "adm/st", "--segments", "2")
    hr("write", "adm/st", stdin=b"x\ny\nz\n")
    listed = json.loads(hr("stream", "list", "adm", "--json").stdout)
    assert listed == [{"stream": "adm/st", "open_segments": 2, "bytes": 3 * 9, "events": 3}]
    table = hr("stream", "list").stdout.splitlines()
    assert table[0].split() == ["STREAM", "SEGMENTS", "SIZE", "BYTES", "EVENTS"]
    assert ["adm/st", "2", "27", "B", "27", "3"] in [line.split() for line in table]

    assert "truncated: adm/st at" in hr("stream", "truncate", "adm/st", "tail").stdout
    assert hr("read", "adm/st").stdout == ""
    listed = json.loads(hr("stream", "list", "adm", "--json").stdout)
    assert (listed[0]["bytes"], listed[0]["events"]) == (0, 0)

    assert "to 3 segments" in hr("stream", "scale", "adm/st", "--segments", "3").stdout
    hr("stream", "update", "adm/st", "--retention-bytes", "4096", "--tag", "blue")
    info = json.loads(hr("stream", "info", "adm/st").stdout)
    assert len(info["open_segments"]) == 3  # the update kept the scaled count
    assert info["retention"] == {"type": "SIZE", "param": 4096}
    assert info["tags"] == ["blue"]

    assert hr("stream", "seal", "adm/st").stdout.strip() == "sealed: adm/st"
    refused = hr("write", "adm/st", stdin=b"late\n", ok=False)
    assert "sealed" in one_line_error(refused)
    missing = hr("stream", "seal", "adm/nope", ok=False)
    assert "adm/nope" in one_line_error(missing)


def test_scope_create_list_delete(hr: Cli) -> None:
    assert hr("scope", "create", "sc1").stdout.strip() == "created: sc1"
    assert hr("scope", "create", "sc1").stdout.strip() == "exists: sc1"
    hr("stream", "create", "sc1/a")
    scopes = {s["scope"]: s["streams"] for s in json.loads(hr("scope", "list", "--json").stdout)}
    assert scopes["sc1"] == 1
    assert "SCOPE_NOT_EMPTY" in one_line_error(hr("scope", "delete", "sc1", ok=False))
    hr("stream", "delete", "sc1/a")
    assert hr("scope", "delete", "sc1").stdout.strip() == "deleted: sc1"
    assert "sc1" not in hr("scope", "list", "-q").stdout.splitlines()


# ----------------------------------------------------------------------------- reader groups


def _lag_metric(server: ServerProcess, group: str) -> float | None:
    url = f"http://127.0.0.1:{server.port_of('http')}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith(f'headrace_reader_group_lag_bytes{{group="{group}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_group_describe_shows_the_lag_of_what_was_not_read(hr: Cli, server: ServerProcess) -> None:
    hr("stream", "create", "grp/st", "--segments", "2")
    values = [f"event {i}" for i in range(10)]
    hr(
        "write",
        "grp/st",
        "-K",
        ":",
        stdin="".join(f"{i}:{v}\n" for i, v in enumerate(values)).encode(),
    )
    first = hr("read", "grp/st", "--group", "g1", "--until", "4").stdout.splitlines()
    assert len(first) == 4
    # the group's state stream is the controller's own: listed only with --all
    assert hr("stream", "list", "grp", "-q").stdout.split() == ["grp/st"]
    assert hr("stream", "list", "grp", "-q", "--all").stdout.split() == ["grp/_RGg1", "grp/st"]

    lag = json.loads(hr("group", "describe", "grp/g1", "--json").stdout)
    assert lag["lag_events"] == 10 - 4
    unread_bytes = sum(8 + len(v) for v in values) - sum(8 + len(v) for v in first)
    assert lag["lag_bytes"] == unread_bytes
    assert sum(s["lag_events"] for s in lag["segments"]) == 6
    assert {s["segment"] for s in lag["segments"]} == {"grp/st/0.#epoch.0", "grp/st/1.#epoch.0"}
    text = hr("group", "describe", "grp/g1").stdout
    assert f"lag: 6 events, {unread_bytes} bytes" in text
    listed = json.loads(hr("group", "list", "grp", "--json").stdout)
    assert listed == [{"group": "grp/g1", "streams": ["grp/st"], "readers": 0,
                       "lag_bytes": unread_bytes}]  # fmt: skip

    deadline = time.monotonic() + METRIC_WAIT_S
    while _lag_metric(server, "grp/g1") != unread_bytes:
        assert time.monotonic() < deadline, "the lag metric never showed the group's lag"
        time.sleep(0.2)

    rest = hr("read", "grp/st", "--group", "g1").stdout.splitlines()
    assert sorted(first + rest) == sorted(values)
    lag = json.loads(hr("group", "describe", "grp/g1", "--json").stdout)
    assert (lag["lag_events"], lag["lag_bytes"]) == (0, 0)

    assert hr("group", "delete", "grp/g1").stdout.strip() == "deleted: grp/g1"
    assert hr("group", "list", "grp", "-q").stdout == ""
    gone = hr("group", "describe", "grp/g1", ok=False)
    assert one_line_error(gone) == "Error: no reader group grp/g1"


def test_truncate_to_a_groups_positions(hr: Cli) -> None:
    hr("stream", "create", "grp/cut")
    hr("write", "grp/cut", stdin=b"a\nb\nc\nd\n")
    hr("read", "grp/cut", "--group", "cutter", "--until", "2")
    hr("stream", "truncate", "grp/cut", "--group", "cutter")
    assert hr("read", "grp/cut").stdout.splitlines() == ["c", "d"]


# ----------------------------------------------------------------------------- kv, bench


def test_kv_put_get_list_delete_round_trip(hr: Cli) -> None:
    assert hr("kv", "put", "app/cfg", "color", "blue").stdout.startswith("put: color (version ")
    hr("kv", "put", "app/cfg", "logo", stdin=b"\x89PNG\x00")
    assert hr("kv", "get", "app/cfg", "color").stdout == "blue"
    got = json.loads(hr("kv", "get", "app/cfg", "logo", "--json").stdout)
    assert (got["value"], got["encoding"]) == ("iVBORwA=", "base64")
    entries = json.loads(hr("kv", "list", "app/cfg", "--json").stdout)
    assert [e["key"] for e in entries] == ["color", "logo"]
    version = entries[0]["version"]
    hr("kv", "put", "app/cfg", "color", "red", "--if-version", str(version))
    stale = hr("kv", "put", "app/cfg", "color", "green", "--if-version", str(version), ok=False)
    assert "version mismatch" in one_line_error(stale)
    assert hr("kv", "get", "app/cfg", "color").stdout == "red"
    assert "exists" in one_line_error(
        hr("kv", "put", "app/cfg", "color", "x", "--if-absent", ok=False)
    )
    hr("kv", "delete", "app/cfg", "color")
    assert hr("kv", "list", "app/cfg", "-q").stdout.splitlines() == ["logo"]
    assert one_line_error(hr("kv", "get", "app/cfg", "color", ok=False)) == (
        "Error: no key 'color' in app/cfg"
    )
    assert hr("kv", "drop", "app/cfg").stdout.strip() == "dropped: app/cfg"
    assert one_line_error(hr("kv", "list", "app/cfg", ok=False)) == "Error: no table app/cfg"


def test_bench_prints_rates_and_latency(hr: Cli) -> None:
    done = hr("bench", "bench/tiny", "-n", "20", "-s", "64")
    lines = done.stdout.splitlines()
    assert lines[0].startswith("produced 20 events of 64 B in ")
    assert "events/s" in lines[0] and lines[1].startswith("consumed 20 events")
    assert lines[2].startswith("latency (write to read): p50 ")
    result = json.loads(hr("bench", "bench/tiny", "-n", "5", "-r", "100", "--json").stdout)
    assert result["consumed"] == 5 and result["produce_events_per_s"] > 0
    assert "bench/tiny" not in hr("stream", "list", "-q").stdout  # a stream it made is removed


# ----------------------------------------------------------------------------- contexts, help


def test_a_saved_context_is_used_by_later_commands(hr: Cli, server: ServerProcess) -> None:
    saved = hr("context", "add", "local", "--controller", server.uri, controller=False)
    path = hr.config_home / "headrace" / "contexts.json"
    assert f"saved: local (current) in {path}" in saved.stdout
    assert path.stat().st_mode & 0o777 == 0o600
    assert json.loads(path.read_text())["contexts"]["local"] == {"controller": server.uri}
    hr("scope", "create", "ctx", controller=False)  # no --controller, no HEADRACE_CONTROLLER
    assert "ctx" in hr("scope", "list", "-q", controller=False).stdout.splitlines()

    hr("context", "add", "nowhere", "--controller", "tcp://127.0.0.1:1", controller=False)
    junk = hr.config_home / "junk.pem"
    junk.write_text("not a certificate\n")
    hr("context", "add", "badca", "--controller", server.uri, "--ca", str(junk), controller=False)
    refused = hr("--context", "badca", "scope", "list", controller=False, ok=False)
    assert "TLS client files" in one_line_error(refused)  # the context's CA was used
    bad_uri = hr("context", "add", "x", "--controller", "http://h:1", controller=False, ok=False)
    assert "scheme 'http'" in one_line_error(bad_uri, 2)
    hr("context", "use", "nowhere", controller=False)
    assert "ctx" in hr("scope", "list", "-q").stdout.splitlines()  # the variable wins
    listing = hr("context", "list", controller=False).stdout.splitlines()
    assert [line.split()[:2] for line in listing if "*" in line] == [["*", "nowhere"]]
    unknown = hr("--context", "nope", "scope", "list", controller=False, ok=False)
    assert "no context 'nope'" in one_line_error(unknown, 2)
    hr("context", "remove", "nowhere", controller=False)
    assert json.loads(path.read_text())["current"] is None


def test_the_lag_metric_reports_a_bounded_number_of_groups(server: ServerProcess) -> None:
    from headrace.client import PravegaClient
    from headrace.server.metrics import MAX_LAG_GROUPS

    count = MAX_LAG_GROUPS + 5

    async def make_groups() -> None:
        async with PravegaClient(server.uri) as client:
            await client.controller.create_scope("zz-many")
            await client.controller.create_stream("zz-many", "st")
            for i in range(count):
                await client.reader_group("zz-many", f"g{i:03d}", ["st"])

    asyncio.run(make_groups())
    url = f"http://127.0.0.1:{server.port_of('http')}/metrics"
    deadline = time.monotonic() + METRIC_WAIT_S
    while True:
        with urllib.request.urlopen(url, timeout=10) as response:
            lines = response.read().decode().splitlines()
        groups = [float(x.split()[1]) for x in lines if x.startswith("headrace_reader_groups ")]
        if groups and groups[0] >= count:
            break
        assert time.monotonic() < deadline, "the walk never found the groups"
        time.sleep(0.2)
    series = [x for x in lines if x.startswith("headrace_reader_group_lag_bytes{")]
    assert len(series) == MAX_LAG_GROUPS
