"""Kill -9 and SIGTERM under load: three real clients write while the server is
stopped and restarted at random moments.

The real ``pravega`` writer (child process), the TANK client and pylogbeat
write concurrently to one ``headrace serve``. A cycle waits until the
writers got a random number of further acknowledgements (plus a random
fraction of a second), or, in one cycle of five, only a random fraction of a
second after the restart (so that faults also land in recovery and in the
clients' reconnects), then signals the server and restarts it on the same
ports. After the last cycle the writers must get further acknowledgements
(writing resumed), are stopped, and the server is stopped cleanly; then:

* ``headrace verify`` passes on the data directory;
* every acknowledged Pravega and TANK event is stored exactly once, and no
  event is stored twice (writers never resend: the Pravega writer's retries
  are deduplicated by writer id and event number, the TANK and Lumberjack
  writers use fresh texts after a failure);
* every acknowledged Lumberjack event is stored at least once, and, as the
  writer never resends, no event twice (docs/protocols/lumberjack.md 8.4:
  duplicates come only from resent windows);
* under SIGTERM (clean stop) nothing is half-stored: every stored TANK bundle
  decodes whole with all its messages, and every Lumberjack window is stored
  whole or not at all. The server exits 0 within its stop bound every time.

Acknowledged means what the client reported: the Pravega writer's
``flush()`` returned, a TANK produce response said OK, ``pylogbeat``'s
``send`` returned (it waits for the window's ack).

``HEADRACE_FAULT_KILL_CYCLES`` (default 4; ``make faults`` 20) and
``HEADRACE_FAULT_TERM_CYCLES`` (default 2; ``make faults`` 10) set the
cycles, ``HEADRACE_FAULT_SEED`` the randomness (printed in every failure).
"""

from __future__ import annotations

import os
import random
import signal
import threading
from collections import Counter
from pathlib import Path

import pytest

from tests.faults.conftest import Row
from tests.faults.harness import (
    BEATS_WINDOW,
    TANK_BUNDLE,
    BeatWriter,
    FaultServer,
    PravegaWriters,
    Progress,
    TankWriter,
    check,
    run_verify,
    stored_beats,
    stored_pravega,
    stored_tank_bundles,
)

SEED = int(os.environ.get("HEADRACE_FAULT_SEED", "20261122"))
KILL_CYCLES = int(os.environ.get("HEADRACE_FAULT_KILL_CYCLES", "4"))
TERM_CYCLES = int(os.environ.get("HEADRACE_FAULT_TERM_CYCLES", "2"))

MAX_ACKS_BETWEEN_FAULTS = 30
"""Upper bound of the random number of acknowledgements (over all writers) a
cycle waits for before the fault."""
MAX_EXTRA_DELAY_S = 0.3
"""A random delay up to this after the acknowledgements, so that the fault
lands anywhere in the next requests, not just after an ack."""
EARLY_FAULT_ONE_IN = 5
"""One cycle in this many signals the server soon after its restart."""
PROGRESS_TIMEOUT_S = 120.0
"""Bound on the writers' reconnecting and getting the acknowledgements a cycle
waits for (the real client backs off for up to a few seconds)."""
ACKS_AFTER_LAST_FAULT = 6
"""Acknowledgements the writers must get after the last restart."""


def _run(tmp_path: Path, signum: int, cycles: int, row: Row) -> None:
    rng = random.Random(f"{SEED}-{signum}")
    where = f"seed {SEED}, signal {signum}"
    server = FaultServer(tmp_path / "data")
    server.start()
    progress = Progress()
    pravega = PravegaWriters(server, f"s{signum}", progress)
    tank = TankWriter(server, progress)
    beats = BeatWriter(server, progress)
    writers = [pravega, tank, beats]
    exit_codes: list[int | None] = []
    try:
        for writer in writers:
            writer.start()
        assert progress.wait_for(3, PROGRESS_TIMEOUT_S), f"no acknowledgements ({where})"
        for cycle in range(cycles):
            if cycle % EARLY_FAULT_ONE_IN == EARLY_FAULT_ONE_IN - 1:
                delay_s = rng.uniform(0.0, 1.0)
            else:
                target = progress.acks + rng.randint(1, MAX_ACKS_BETWEEN_FAULTS)
                assert progress.wait_for(target, PROGRESS_TIMEOUT_S), (
                    f"writers stalled before fault {cycle} ({where}): "
                    f"{[w.log.failures[-3:] for w in writers]}"
                )
                delay_s = rng.uniform(0.0, MAX_EXTRA_DELAY_S)
            if delay_s:
                fault_moment(delay_s)
            assert server.alive(), f"the server died by itself ({where}):\n{server.log_text()}"
            exit_codes.append(server.signal(signum))
            row.faults += 1
            server.start()
        target = progress.acks + ACKS_AFTER_LAST_FAULT
        assert progress.wait_for(target, PROGRESS_TIMEOUT_S), (
            f"writing did not resume after the last restart ({where})"
        )
        # every kind of writer gets through (a slow client's reconnect may come last)
        assert progress.wait_until(lambda: all(w.log.acked for w in writers), PROGRESS_TIMEOUT_S), (
            f"a writer got no acknowledgement ({where}): "
            f"{[w.log.failures[-3:] for w in writers if not w.log.acked]}"
        )
    finally:
        for writer in writers:
            writer.stop()
        final_code = server.signal(signal.SIGTERM)
    assert final_code == 0, f"clean stop failed ({where}):\n{server.log_text()[-5000:]}"
    if signum == signal.SIGTERM:
        assert exit_codes == [0] * len(exit_codes), (
            f"SIGTERM exit codes {exit_codes} ({where}):\n{server.log_text()[-5000:]}"
        )

    verify = run_verify(server.data_dir)
    assert verify.returncode == 0, (
        f"headrace verify failed ({where}):\n{verify.stdout}{verify.stderr}"
    )

    bundles = stored_tank_bundles(server.data_dir)
    beats_stored = stored_beats(server.data_dir)
    results = [
        check(pravega.log, stored_pravega(server.data_dir, f"s{signum}")),
        check(tank.log, [m for bundle in bundles for m in bundle]),
        check(beats.log, beats_stored),
    ]
    row.checked = sum(r.checked for r in results)
    row.lost = sum(len(r.lost) for r in results)
    row.duplicated = sum(len(r.duplicated) for r in results)
    row.note = ", ".join(
        f"{w.log.name} {len(w.log.acked)} acked/{len(w.log.failures)} client errors"
        for w in writers
    )
    for result in results:
        assert not result.lost, f"{result.name}: lost acknowledged {result.lost[:10]} ({where})"
        assert not result.duplicated, (
            f"{result.name}: duplicated {result.duplicated[:10]} ({where})"
        )
    assert all(r.checked > 0 for r in results), f"a writer got no acknowledgement ({where})"

    if signum == signal.SIGTERM:
        for bundle in bundles:
            first = int(bundle[0].split(":")[1])
            expected = [f"t:{i}" for i in range(first, first + TANK_BUNDLE)]
            assert bundle == expected, f"TANK bundle stored partly: {bundle} ({where})"
        windows = Counter(int(e.split(":")[1]) // BEATS_WINDOW for e in beats_stored)
        partial = {w: c for w, c in windows.items() if c != BEATS_WINDOW}
        assert not partial, f"Lumberjack windows stored partly: {partial} ({where})"


def fault_moment(delay_s: float) -> None:
    """The random moment of a fault: a deliberate delay, not synchronisation."""
    threading.Event().wait(delay_s)


@pytest.mark.timeout(300 + 60 * KILL_CYCLES)
def test_kill_9_under_load_loses_and_duplicates_nothing_acknowledged(
    tmp_path: Path, fault_summary: Row
) -> None:
    _run(tmp_path, signal.SIGKILL, KILL_CYCLES, fault_summary)


@pytest.mark.timeout(300 + 60 * TERM_CYCLES)
def test_sigterm_under_load_stores_whole_or_nothing(tmp_path: Path, fault_summary: Row) -> None:
    _run(tmp_path, signal.SIGTERM, TERM_CYCLES, fault_summary)
