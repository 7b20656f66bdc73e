"""Side by side: headrace, NATS JetStream and Redis Streams against the machine's limits.

Run: ``make bench`` or ``.venv/bin/python benchmarks/suite.py [--quick] [--profile]``
(``--no-docs`` leaves ``docs/benchmarks.md`` alone; ``--quick`` never writes it
unless ``--docs``; ``--only SHAPE`` runs one shape after the machine limits).
The shapes live in the ``hrbench`` package beside this script; what each
measures is in ``docs/benchmarks.md``. Nothing here asserts speed.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hrbench.cli import main

if __name__ == "__main__":
    main()
