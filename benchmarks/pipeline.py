"""Events/s of the reference pipeline end to end: ``headrace demo`` without its display.

Run: ``.venv/bin/python benchmarks/pipeline.py [--events 100000 1000000]
[--master local[2]] [--max-events-per-trigger N] [--event-log DIR]``.

Each size runs in a fresh Python process, as ``headrace demo --events N``
does (its generator, its shipper process, its embedded server, its Spark session,
its query):

* ``spark_start_s``: the Spark session (the JVM) started;
* ``query_start_s``: the streaming query started and warmed up, waiting for data;
* ``ship_s``: every event shipped over Lumberjack and acknowledged (the query
  processes them meanwhile);
* ``end_to_end_s``: from the first event shipped to the last one summarised
  (in Parquet and, exactly once, in ``logs/summary``); ``events_per_s`` is
  the events over this time. The start-ups are not in it.

``--event-log DIR`` keeps Spark's event log of each run there (per-job and
per-stage times, ``docs/spark.md``, "Where the time goes"). The load average
of the machine is recorded before and after each run: the figures move with
it. The last line printed is one JSON object with the figures. Nothing here
asserts speed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _common import machine

GOAL_EVENTS_PER_S = 150_000
"""The goal for 1,000,000 events on ``local[2]``."""

RUN_TIMEOUT_S = 1800.0
"""Longest run of one size (the demo's own query timeout)."""


def _one(events: int, master: str, max_events: int | None) -> dict[str, Any]:
    """One run in this process; returns its figures."""
    from headrace.cli.demo import MAX_EVENTS_PER_TRIGGER, generate_access_logs, run_demo

    started = time.perf_counter()
    lines = list(generate_access_logs(events))
    generated = time.perf_counter() - started
    run = run_demo(
        lines, master=master, max_events=max_events or MAX_EVENTS_PER_TRIGGER, show=False
    )
    return {
        "events": events,
        "generate_s": round(generated, 2),
        "spark_start_s": round(run.spark_start_s, 2),
        "query_start_s": round(run.query_start_s, 2),
        "ship_s": round(run.ship_s, 2),
        "ship_events_per_s": round(run.shipped / run.ship_s),
        "end_to_end_s": round(run.end_to_end_s, 2),
        "events_per_s": round(run.events_per_s),
        "micro_batches": run.micro_batches,
        "summarised": run.summarised,
        "windows": run.windows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--max-events-per-trigger", type=int, default=None)
    parser.add_argument("--event-log", type=Path, default=None, help="keep Spark's event logs here")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(_one(args.events[0], args.master, args.max_events_per_trigger)))
        return

    runs = []
    for events in args.events:
        env = dict(os.environ)
        if args.event_log is not None:
            log_dir = (args.event_log / f"{events}").resolve()
            log_dir.mkdir(parents=True, exist_ok=True)
            env["PYSPARK_SUBMIT_ARGS"] = (
                "--conf spark.eventLog.enabled=true --conf spark.eventLog.compress=false "
                f"--conf spark.eventLog.dir=file://{log_dir} pyspark-shell"
            )
        command = [sys.executable, __file__, "--one", "--events", str(events)]
        command += ["--master", args.master]
        if args.max_events_per_trigger:
            command += ["--max-events-per-trigger", str(args.max_events_per_trigger)]
        load_before = os.getloadavg()[0]
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=env
        )
        if done.returncode != 0:
            sys.exit(f"the run of {events} events failed:\n{done.stderr[-4000:]}")
        figures = json.loads(done.stdout.strip().splitlines()[-1])
        figures["load_average_before"] = round(load_before, 2)
        figures["load_average_after"] = round(os.getloadavg()[0], 2)
        runs.append(figures)
        print(
            f"{events:>9,} events: Spark start {figures['spark_start_s']:.1f} s, "
            f"query start {figures['query_start_s']:.1f} s; shipped in {figures['ship_s']:.1f} s; "
            f"end to end {figures['end_to_end_s']:.1f} s, {figures['events_per_s']:,} events/s "
            f"({figures['micro_batches']} micro-batches; load {load_before:.1f})",
            flush=True,
        )
    print(
        json.dumps(
            {
                "benchmark": "pipeline",
                "master": args.master,
                "goal_events_per_s": GOAL_EVENTS_PER_S,
                "machine": machine(),
                "runs": runs,
            }
        )
    )


if __name__ == "__main__":
    main()
