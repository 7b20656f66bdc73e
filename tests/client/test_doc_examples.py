"""The client examples of ``docs/client.md#examples`` run as they are written,
each as its own Python process against a real ``headrace serve``, and print
what they say they print."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._server import FREE, ROOT, ServerProcess, server_env

DOC = ROOT / "docs" / "client.md"
RUN_TIMEOUT_S = 90.0
"""Bound on one example: a few controller calls and a few events."""

EXAMPLE = re.compile(r'<a id="example-([a-z-]+)"></a>.*?```python\n(.*?)```', re.S)

EXPECTED = {
    "reader-group": str(sorted(b"order-%d" % i for i in range(10))),
    "transaction": "[b'debit 10', b'credit 10']",
    "byte-stream": "b'hello, bytes'",
    "kv-table": "someone else changed apples first\n(b'9', ",
}
"""What each example prints (the start of its output)."""


def examples() -> dict[str, str]:
    return dict(EXAMPLE.findall(DOC.read_text()))


def test_every_feature_has_one_example() -> None:
    assert sorted(examples()) == sorted(EXPECTED)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with ServerProcess(
        tmp_path_factory.mktemp("examples") / "data",
        ports={"controller": FREE, "segment_store": FREE},
    ) as srv:
        yield srv


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_example_runs(server: ServerProcess, name: str, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", examples()[name]],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env=server_env({"HEADRACE_CONTROLLER": server.uri}),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith(EXPECTED[name]), result.stdout
