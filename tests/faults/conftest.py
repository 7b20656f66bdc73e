"""The fault suite's summary table: one row per fault test, printed as the run's last lines.

Each test adds a row through the ``fault_summary`` fixture (faults injected,
events checked, lost, duplicated). ``pytest_unconfigure`` runs after the
terminal reporter's own summary, so the table is the last thing printed.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest


@dataclass
class Row:
    test: str
    faults: int = 0
    checked: int = 0
    lost: int = 0
    duplicated: int = 0
    note: str = ""


ROWS: list[Row] = []


@pytest.fixture
def fault_summary(request: pytest.FixtureRequest) -> Row:
    """A row of the summary table for the running test (kept even if the test fails)."""
    row = Row(request.node.name)
    ROWS.append(row)
    return row


def pytest_unconfigure(config: pytest.Config) -> None:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if not ROWS or reporter is None:
        return
    header = f"{'fault test':<34} {'faults':>7} {'checked':>9} {'lost':>5} {'dup':>5}  note"
    reporter.write_line("")
    reporter.write_line("fault suite summary".center(len(header), "="))
    reporter.write_line(header)
    for row in ROWS:
        reporter.write_line(
            f"{row.test[:34]:<34} {row.faults:>7} {row.checked:>9} {row.lost:>5} "
            f"{row.duplicated:>5}  {row.note}"
        )
    total = Row(
        "total",
        sum(r.faults for r in ROWS),
        sum(r.checked for r in ROWS),
        sum(r.lost for r in ROWS),
        sum(r.duplicated for r in ROWS),
    )
    reporter.write_line(
        f"{total.test:<34} {total.faults:>7} {total.checked:>9} {total.lost:>5} "
        f"{total.duplicated:>5}"
    )
