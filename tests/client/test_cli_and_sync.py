"""The client CLI commands (``stream``, ``write``, ``read``) and the blocking facade."""

from __future__ import annotations

import json
from pathlib import Path

import click
from click.testing import CliRunner

from headrace.cli.events import read, write
from headrace.cli.stream import stream
from headrace.client.sync import SyncClient

from .conftest import Server


def _cli() -> click.Group:
    group = click.Group()
    for command in (stream, write, read):
        group.add_command(command)
    return group


def test_cli_create_write_read_info_delete(server: Server, tmp_path: Path) -> None:
    runner = CliRunner()
    cli, ctl = _cli(), ["--controller", server.uri]

    r = runner.invoke(cli, ["stream", "create", "cli/st", "--segments", "2", "--tag", "x", *ctl])
    assert r.exit_code == 0, r.output
    assert "created: cli/st" in r.output
    r = runner.invoke(cli, ["stream", "create", "cli/st", *ctl])
    assert "exists" in r.output

    lines = tmp_path / "in.txt"
    lines.write_text("".join(f"line {i}\n" for i in range(50)))
    r = runner.invoke(cli, ["write", "cli/st", str(lines), "--routing-key", "k", *ctl])
    assert r.exit_code == 0, r.output
    r = runner.invoke(cli, ["write", "cli/st", *ctl], input="from stdin\n")
    assert r.exit_code == 0, r.output

    r = runner.invoke(cli, ["read", "cli/st", *ctl])
    assert r.exit_code == 0, r.output
    got = r.output.splitlines()
    assert sorted(got) == sorted([f"line {i}" for i in range(50)] + ["from stdin"])
    assert [g for g in got if g.startswith("line")] == [f"line {i}" for i in range(50)]

    r = runner.invoke(cli, ["read", "cli/st", "--format", "json", "--until", "3", *ctl])
    assert r.exit_code == 0, r.output
    records = [json.loads(line) for line in r.output.splitlines()]
    assert len(records) == 3
    assert all(rec["stream"] == "cli/st" and "offset" in rec for rec in records)

    first = records[0]
    r = runner.invoke(
        cli, ["read", "cli/st", "--from", f"{first['segment']}:{first['offset']}", *ctl]
    )
    assert r.exit_code == 0, r.output
    assert first["value"] in r.output.splitlines()

    r = runner.invoke(cli, ["stream", "list", "-q", *ctl])
    assert "cli/st" in r.output.splitlines()
    r = runner.invoke(cli, ["stream", "list", "cli", "-q", *ctl])
    assert r.output.splitlines() == ["cli/st"]
    r = runner.invoke(cli, ["stream", "info", "cli/st", *ctl])
    assert r.exit_code == 0, r.output
    info = json.loads(r.output)
    assert info["tags"] == ["x"] and len(info["open_segments"]) == 2
    assert sum(s["length"] for s in info["open_segments"]) > 0

    r = runner.invoke(cli, ["stream", "delete", "cli/st", *ctl])
    assert r.exit_code == 0, r.output
    r = runner.invoke(cli, ["stream", "delete", "cli/st", *ctl])
    assert r.exit_code == 1
    r = runner.invoke(cli, ["read", "nosuch", *ctl])
    assert r.exit_code == 2  # bad SCOPE/STREAM


def test_sync_facade_round_trip(server: Server) -> None:
    with SyncClient(server.uri) as hr:
        assert hr.create_scope("sy")
        assert hr.create_stream("sy", "st", segments=2)
        with hr.writer("sy", "st") as w:
            for i in range(100):
                w.write(f"e{i}".encode(), routing_key="k")
        values = [r.value for r in hr.records("sy", "st")]
        assert values == [f"e{i}".encode() for i in range(100)]
        assert hr.run(hr.client.controller.stream_exists("sy", "st"))
        assert list(hr.iterate(hr.client.controller.list_streams("sy"))) == ["st"]
