"""``benchmarks/suite.py``'s command line: run the shapes, print the tables,
write the docs block."""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import _common as common

from hrbench.config import ROOT, SHAPE_CHOICES, Sizes
from hrbench.context import Context
from hrbench.floor import run_floor
from hrbench.hr_shapes import run_headrace
from hrbench.limits import fsync_latency, measure_limits
from hrbench.measure import say
from hrbench.peer_nats import run_nats
from hrbench.peer_redis import run_redis
from hrbench.render import DOCS, judge, render, render_docs, write_docs
from hrbench.results import Results, Run, load

RESULTS_DIR = ROOT / "benchmarks" / "results"
LATEST = RESULTS_DIR / "latest.json"
"""The results of the last run that wrote the docs: the docs block is rendered from it."""
SCRATCH = RESULTS_DIR / "scratch.json"
"""The results of a run that leaves the docs alone (git ignores it)."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="headrace, NATS JetStream and Redis Streams against the machine's limits"
    )
    p.add_argument("--quick", action="store_true", help="small counts: about two minutes")
    p.add_argument("--profile", action="store_true", help="py-spy the server's produce")
    p.add_argument(
        "--profile-dir", type=Path, default=None, help="keep py-spy's folded stacks here"
    )
    p.add_argument("--dir", type=Path, default=None, help="parent of the data directories")
    p.add_argument("--docs", action="store_true", help="write docs/benchmarks.md (quick)")
    p.add_argument("--no-docs", action="store_true", help="leave docs/benchmarks.md alone")
    p.add_argument(
        "--skip", action="append", default=[], choices=["nats", "redis", "floor", "headrace"]
    )
    p.add_argument(
        "--flush-ms",
        type=float,
        default=1.0,
        help="how often the latency shapes' paced writers send what has fallen due",
    )
    p.add_argument(
        "--only",
        action="append",
        default=[],
        choices=SHAPE_CHOICES,
        help="run only this shape (repeatable), after the machine limits; never writes the docs",
    )
    p.add_argument(
        "--results",
        type=Path,
        default=None,
        help="write the run's results here (default: benchmarks/results/latest.json for a run"
        " that writes the docs, benchmarks/results/scratch.json otherwise)",
    )
    p.add_argument(
        "--render",
        "--render-json",
        type=Path,
        default=None,
        help="print the tables and write the docs block again from a results file (or a saved"
        " run's output, its last JSON line); runs nothing",
    )
    return p


def run(args: argparse.Namespace) -> Results:
    """Every shape asked for, on this machine, in order."""
    sizes = Sizes(args.quick, args.flush_ms)
    began = time.perf_counter()
    load_start = common.loadavg()
    results = Results(
        Run(
            when=datetime.now(UTC).isoformat(timespec="seconds"),
            quick=args.quick,
            machine=common.machine(),
            only=args.only,
            flush_ms=args.flush_ms,
            loadavg_start=round(load_start, 2),
        )
    )
    with tempfile.TemporaryDirectory(prefix="headrace-suite-", dir=args.dir) as tmp:
        scratch = Path(tmp)
        results.run.filesystem = common.filesystem_of(scratch)
        say(
            f"machine: {results.run.machine}, data on {results.run.filesystem},"
            f" load {load_start:.2f}"
        )
        profile_dir = args.profile_dir or Path(tempfile.mkdtemp(prefix="headrace-profiles-"))
        ctx = Context(
            sizes,
            scratch,
            results,
            only=args.only,
            profile=args.profile,
            profile_dir=profile_dir,
            floor="floor" not in args.skip,
        )
        say("limits:")
        measure_limits(sizes, scratch, results.limits)
        if "nats" not in args.skip:
            say("NATS JetStream:")
            run_nats(ctx)
        if "redis" not in args.skip:
            say("Redis Streams:")
            run_redis(ctx)
        if ctx.floor and ctx.want("latency"):
            say("Python floor (benchmarks/floor_server.py):")
            run_floor(ctx)
        if "headrace" not in args.skip:
            say("headrace:")
            profile_dir.mkdir(parents=True, exist_ok=True)
            run_headrace(ctx)
            if args.profile:
                say(f"  folded stacks (py-spy raw format) kept in {profile_dir}")
        # the fsync limit again, after the run: the disk drifts
        results.limits.fsync["fsync_4k_after"] = fsync_latency(scratch, sizes.fsync_ops)
        say(f"  fsync_4k after the run: {results.limits.fsync['fsync_4k_after']}")
    results.run.loadavg_end = round(common.loadavg(), 2)
    results.run.wall_s = round(time.perf_counter() - began, 1)
    results.targets = judge(results)
    return results


def shown(path: Path) -> str:
    """``path`` relative to the repository when it is inside it."""
    resolved = path.resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else str(path)


def docs_from(path: Path) -> None:
    """Write the docs block from the results file at ``path``."""
    write_docs(render_docs(load(path), shown(path)))
    say(f"{shown(DOCS)} written from {shown(path)}")


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.render is not None:
        results = load(args.render)
        results.targets = judge(results)
        print(render(results))
        source = args.render
        if args.results is not None:  # a saved run's output, kept as a results file
            results.save(args.results)
            source = args.results
        if not args.no_docs:
            docs_from(source)
        return
    docs = (not args.quick or args.docs) and not args.no_docs and not args.only
    path = args.results or (LATEST if docs else SCRATCH)
    results = run(args)
    print()
    print(render(results))
    results.save(path)
    say(f"results written to {shown(path)}")
    if docs:
        docs_from(path)
    print(json.dumps(results.to_json(), ensure_ascii=False))
