"""What every shape of one run shares: sizes, scratch directory, results, choices."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from hrbench.config import Sizes
from hrbench.results import Profile, Results


@dataclass(slots=True)
class Context:
    sizes: Sizes
    scratch: Path
    """Parent of every data directory and file of the run (deleted at its end)."""
    results: Results
    only: list[str] = field(default_factory=list)
    """``--only`` shapes; empty for all."""
    profile: bool = False
    profile_dir: Path = Path()
    floor: bool = True
    """Whether the Python floor runs (``--skip floor`` leaves it out)."""

    def want(self, shape: str) -> bool:
        return not self.only or shape in self.only

    def keep_profile(self, name: str, summary: Profile | None) -> None:
        if summary is not None:
            self.results.profiles[name] = summary
