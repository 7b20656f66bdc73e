"""The cluster options of ``headrace serve``: ``--cluster``, ``--node-id``, ``--container-count``.

They are read and checked like every option (TOML, ``HEADRACE_*``, flags);
a bad value stops the server before it starts, with one line naming it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from headrace.cluster.layout import ClusterUrl
from headrace.errors import ConfigError
from headrace.server import config as config_module
from headrace.server.config import ClusterConfig, build_config
from tests.ops.conftest import START_TIMEOUT_S, listener_args, run_env, serve_command


def test_without_cluster_a_single_node_keeps_its_container_count() -> None:
    assert build_config({}).cluster is None
    assert build_config({}).container_count == 4
    assert build_config({"container_count": 8}).container_count == 8


def test_cluster_options_build_a_cluster_config() -> None:
    config = build_config({"cluster": "zk://zk1:2181,zk2/hr", "node_id": "n1"})
    assert config.cluster == ClusterConfig(
        ClusterUrl((("zk1", 2181), ("zk2", 2181)), "/hr"),
        "n1",
        None,
        min_in_sync=1,  # --min-insync is capped at the replication factor (1)
    )
    assert config.container_count == 16  # a cluster's default
    config = build_config({"cluster": "zk://zk1/hr", "node_id": "n1", "container_count": 32})
    assert config.cluster is not None and config.cluster.container_count == 32
    assert config.container_count == 32


def test_the_node_id_defaults_to_the_host_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config_module.socket, "gethostname", lambda: "box-7.example.com")
    cluster = build_config({"cluster": "zk://zk1/hr"}).cluster
    assert cluster is not None and cluster.node_id == "box-7"
    monkeypatch.setattr(config_module.socket, "gethostname", lambda: "_odd")
    with pytest.raises(ConfigError, match="the host name '_odd' is not a node id; set --node-id"):
        build_config({"cluster": "zk://zk1/hr"})


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"cluster": "zk//zk1:2181"}, "--cluster 'zk//zk1:2181': expected zk://host:port"),
        ({"cluster": "zk://zk1:99999/hr"}, "'zk1:99999' is not host:port"),
        ({"cluster": "zk://zk1/hr", "node_id": "a/b"}, "--node-id 'a/b'"),
        ({"node_id": "n1"}, "--node-id needs --cluster"),
        (
            {"cluster": "zk://zk1/hr", "node_id": "n", "container_count": 2000},
            "--container-count 2000: a cluster has 1 to 1024",
        ),
    ],
)
def test_a_bad_cluster_option_is_one_line(values: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        build_config(values)  # type: ignore[arg-type]
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["--cluster", "http://zk1:2181/hr"], None, "--cluster 'http://zk1:2181/hr'"),
        ([], {"HEADRACE_CLUSTER": "zk://zk1:0/hr"}, "'zk1:0' is not host:port"),
        (["--cluster", "zk://zk1/hr", "--node-id", ".."], None, "--node-id '..'"),
        (  # --containers is another name of --container-count
            ["--cluster", "zk://zk1/hr", "--node-id", "n1", "--containers", "2000"],
            None,
            "--container-count 2000: a cluster has 1 to 1024",
        ),
    ],
)
def test_a_bad_cluster_option_stops_serve_with_one_line(
    tmp_path: Path, args: list[str], env: dict[str, str] | None, named: str
) -> None:
    result = subprocess.run(
        [*serve_command(tmp_path / "data", *listener_args()), *args],
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
        env=run_env(env),
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert named in line
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize(
    ("secret", "mode", "named"),
    [
        (b"s" * 16, 0o600, "must hold 32 to 4096 bytes"),
        (b"s" * 5000, 0o600, "must hold 32 to 4096 bytes"),
        (b"s" * 32, 0o640, "is readable by others; chmod 600 it"),
    ],
)
def test_a_bad_cluster_secret_stops_serve_with_one_line(
    tmp_path: Path, secret: bytes, mode: int, named: str
) -> None:
    """``--cluster-secret-file`` is checked at start as the token key is: too short
    (or too long) to be a key, or readable by others, stops the server."""
    path = tmp_path / "cluster.secret"
    path.write_bytes(secret)
    path.chmod(mode)
    assert build_config({"cluster_secret_file": str(path)}).cluster_secret_file == path
    result = subprocess.run(
        [*serve_command(tmp_path / "data", *listener_args()), "--cluster-secret-file", str(path)],
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
        env=run_env(None),
    )
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert f"cluster secret {path}" in line and named in line
