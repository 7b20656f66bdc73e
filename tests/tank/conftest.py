"""A real ``headrace serve`` subprocess for the TANK tests, on a free port.

Every wait has a deadline; stopping is SIGTERM (clean) or SIGKILL (crash).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._server import FREE, ServerProcess

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0


class TankServer(ServerProcess):
    """One ``python -m headrace serve`` process serving TANK on ``port``."""

    def __init__(
        self,
        data_dir: Path,
        *,
        pravega: bool = False,
        extra_args: tuple[str, ...] = (),
        verbose: bool = False,
    ) -> None:
        """``verbose``: ``-v``, so that info lines (access lines) are logged."""
        ports: dict[str, int | None] = {"tank": FREE}
        if pravega:  # also serve the controller and segment store
            ports |= {"controller": FREE, "segment_store": FREE}
        super().__init__(
            data_dir,
            ports=ports,
            args=extra_args,
            global_args=["-v"] if verbose else [],
            start_timeout_s=START_TIMEOUT_S,
            stop_timeout_s=STOP_TIMEOUT_S,
        )
        self.pravega = pravega

    @property
    def port(self) -> int:
        return self.port_of("tank")

    @property
    def controller_port(self) -> int:
        return self.ports.get("controller", 0)

    def stop(self, sig: int = signal.SIGTERM) -> int | None:
        """SIGTERM and wait for a clean exit."""
        code = self.terminate(sig)
        assert code == 0, self.log_text()
        return code


@contextlib.contextmanager
def running_server(
    data_dir: Path,
    *,
    pravega: bool = False,
    extra_args: tuple[str, ...] = (),
    verbose: bool = False,
) -> Iterator[TankServer]:
    server = TankServer(data_dir, pravega=pravega, extra_args=extra_args, verbose=verbose)
    server.start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TankServer]:
    with running_server(tmp_path_factory.mktemp("tank") / "data") as srv:
        yield srv
