"""The Hypothesis profiles (``tests/_hypothesis.py``): chosen by ``HYPOTHESIS_PROFILE``."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests._hypothesis import CI_EXAMPLES, PROFILE_VARIABLE, THOROUGH_EXAMPLES
from tests._server import ROOT, server_env

SHOW = (
    "import tests.conftest; from hypothesis import settings;"
    " from tests._hypothesis import examples;"
    " print(settings().max_examples, examples(40), settings().deadline)"
)


def _loaded(profile: str | None) -> str:
    env = server_env()
    env.pop(PROFILE_VARIABLE, None)
    if profile is not None:
        env[PROFILE_VARIABLE] = profile
    done = subprocess.run(
        [sys.executable, "-c", SHOW], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize(
    ("profile", "shown"),
    [
        (None, f"{CI_EXAMPLES} 40 0:00:00.200000"),
        ("ci", f"{CI_EXAMPLES} 40 0:00:00.200000"),
        ("thorough", f"{THOROUGH_EXAMPLES} {40 * THOROUGH_EXAMPLES // CI_EXAMPLES} 0:00:00.200000"),
    ],
)
def test_the_profile_sets_the_counts_and_keeps_the_deadline(
    profile: str | None, shown: str
) -> None:
    assert _loaded(profile) == shown


def test_an_unknown_profile_stops_the_run() -> None:
    with pytest.raises(AssertionError, match="not registered"):
        _loaded("fast")
