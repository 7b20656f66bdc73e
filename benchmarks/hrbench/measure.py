"""Measuring around a block: rows from counts and times, the server's CPU, the
suite's worker processes, py-spy profiles and the server's own histograms."""

from __future__ import annotations

import contextlib
import json
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import IO, Any

import _common as common

from hrbench.config import GROUP_TIMEOUT_S, SMALL, WORKERS
from hrbench.results import Profile, Row


def say(text: str) -> None:
    print(text, flush=True)


def ms(seconds: float) -> float:
    return round(seconds * 1e3, 3)


def peak_rss_mib(pid: int) -> float:
    return round(common.memory_kib(pid).get("VmHWM", 0) / 1024, 1)


def rate_row(
    system: str,
    events: int,
    size: int,
    seconds: float,
    *,
    pid: int | None = None,
    cpu_s: float | None = None,
    latencies: list[float] | None = None,
    producers: int = 1,
    note: str = "",
) -> Row:
    """A row of ``events`` of ``size`` bytes in ``seconds``; the server's CPU per
    event and peak RSS when its ``pid`` and CPU seconds are given."""
    row = Row(
        system=system,
        size=size,
        events=events,
        seconds=round(seconds, 3),
        events_per_s=round(events / seconds),
        mb_per_s=round(events * size / seconds / 1e6, 2),
        producers=producers,
        note=note,
    )
    if latencies:
        latencies.sort()
        row.p50_ms = ms(common.percentile(latencies, 0.5))
        row.p99_ms = ms(common.percentile(latencies, 0.99))
        row.p999_ms = ms(common.percentile(latencies, 0.999))
    if cpu_s is not None:
        row.server_cpu_us_per_event = round(cpu_s * 1e6 / events, 2)
    if pid is not None:
        row.server_peak_rss_mib = peak_rss_mib(pid)
    return row


class Measured:
    """Server CPU seconds and wall time around a block."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.cpu = 0.0
        self.seconds = 0.0

    def __enter__(self) -> Measured:
        self._cpu0 = common.cpu_s(self.pid)
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._t0
        self.cpu = common.cpu_s(self.pid) - self._cpu0


# --------------------------------------------------------------------------- worker processes


def run_group(
    commands: list[list[str]], timeout: float = GROUP_TIMEOUT_S
) -> tuple[float, list[dict[str, Any]]]:
    """Start one ``suite_workers.py`` process per command, wait until every one has
    set up (``ready``), say ``go`` to all at once, and return the wall time from
    ``go`` to the last exit and each worker's JSON result."""
    deadline = time.monotonic() + timeout
    procs: list[subprocess.Popen[str]] = []
    errors: list[IO[bytes]] = []
    stack = contextlib.ExitStack()
    try:
        for command in commands:
            err = stack.enter_context(tempfile.TemporaryFile())  # noqa: SIM115 - closed by stack
            errors.append(err)
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(WORKERS), *command],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=err,
                    text=True,
                )
            )
        _wait_ready(procs, deadline)
        began = time.perf_counter()
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outputs = []
        for proc in procs:
            out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            outputs.append(out)
        seconds = time.perf_counter() - began
        results = []
        for proc, out, stderr in zip(procs, outputs, errors, strict=True):
            lines = [line for line in out.splitlines() if line.startswith("{")]
            if proc.returncode != 0 or not lines:
                stderr.seek(0)
                tail = stderr.read().decode(errors="replace")[-1500:]
                args = list(proc.args)[2:] if isinstance(proc.args, list) else proc.args
                raise RuntimeError(f"worker {args!r} failed ({proc.returncode}): {tail}")
            results.append(json.loads(lines[-1]))
        return seconds, results
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        stack.close()


def _wait_ready(procs: list[subprocess.Popen[str]], deadline: float) -> None:
    """Return once every worker has said ``ready``."""
    with selectors.DefaultSelector() as waiting:
        for proc in procs:
            assert proc.stdout is not None
            waiting.register(proc.stdout, selectors.EVENT_READ, proc)
        pending = len(procs)
        while pending:
            remaining = deadline - time.monotonic()
            events = waiting.select(remaining) if remaining > 0 else []
            if not events:
                raise RuntimeError("workers did not get ready in time")
            for key, _ in events:
                line = key.fileobj.readline()  # type: ignore[union-attr]
                if line.strip() != "ready":
                    raise RuntimeError(f"worker said {line!r} instead of ready")
                waiting.unregister(key.fileobj)
                pending -= 1


def client_cpu(results: list[dict[str, Any]], seconds: float) -> float:
    """The workers' CPU time over ``seconds``, in cores."""
    return round(sum(float(r.get("client_cpu_s", 0.0)) for r in results) / seconds, 2)


def group_row(
    system: str,
    seconds: float,
    results: list[dict[str, Any]],
    size: int,
    *,
    events: int | None = None,
    pid: int | None = None,
    cpu_s: float | None = None,
    producers: int = 1,
    note: str = "",
) -> Row:
    """A row for a group of workers: events over the group's wall time, and the
    clients' CPU as a share of one core (so a reader sees whether they kept up)."""
    total = events if events is not None else sum(int(r.get("events", 0)) for r in results)
    row = rate_row(
        system, max(1, total), size, seconds, pid=pid, cpu_s=cpu_s, producers=producers, note=note
    )
    row.client_cpu_share = client_cpu(results, seconds)
    if any(r.get("complete") is False for r in results):
        row.note = f"{row.note} INCOMPLETE: a consumer ran out of time".strip()
    return row


def producers_row(
    system: str, producer: list[str], producers: int, size: int, pid: int, note: str = ""
) -> Row:
    """``producers`` copies of the ``producer`` worker at once."""
    with Measured(pid) as m:
        wall, out = run_group([producer] * producers)
    return group_row(system, wall, out, size, pid=pid, cpu_s=m.cpu, producers=producers, note=note)


def e2e_row(
    system: str,
    producer: list[str],
    producers: int,
    consumer: list[str],
    size: int,
    events: int,
    pid: int,
    note: str = "",
) -> Row:
    """``producers`` copies of ``producer`` and one ``consumer`` started together;
    the time until the consumer has every event, and the consumer's delivery
    latency of the stamped ones. The clients' CPU counts all."""
    with Measured(pid) as m:
        wall, out = run_group([producer] * producers + [consumer])
    row = group_row(
        system,
        wall,
        out[producers:],
        size,
        events=events,
        pid=pid,
        cpu_s=m.cpu,
        producers=producers,
        note=note,
    )
    row.client_cpu_share = client_cpu(out, wall)
    delivered = out[producers]  # delivery of the stamped events
    row.p50_ms = delivered.get("p50_ms", row.p50_ms)
    row.p99_ms = delivered.get("p99_ms", row.p99_ms)
    row.p999_ms = delivered.get("p999_ms", row.p999_ms)
    return row


def latency_row(system: str, result: dict[str, Any], note: str = "") -> Row:
    """A row from a paced writer's or tail reader's result."""
    row = Row(
        system=system,
        size=SMALL,
        events=result["events"],
        seconds=round(result["seconds"], 3),
        events_per_s=round(result["events"] / result["seconds"]),
        mb_per_s=round(result["events"] * SMALL / result["seconds"] / 1e6, 2),
        p50_ms=result["p50_ms"],
        p99_ms=result["p99_ms"],
        p999_ms=result["p999_ms"],
        client_cpu_share=result["client_cpu_share"],
        send_lateness_p99_ms=result.get("send_lateness_p99_ms"),
        note=note,
    )
    if result.get("stopped"):
        row.add_note(f"NOT SUSTAINED: {result['stopped']}")
    return row


def server_cpu_per_event(cpu_s: float, events: int) -> float:
    return round(cpu_s * 1e6 / max(1, events), 2)


# --------------------------------------------------------------------------- profiles


class Profiler:
    """``py-spy record`` of a pid while a block runs (``--profile``): raw folded stacks."""

    def __init__(self, enabled: bool, pid: int, name: str, out_dir: Path) -> None:
        beside = Path(sys.executable).parent / "py-spy"
        self.tool = str(beside) if beside.exists() else shutil.which("py-spy")
        self.enabled = enabled and self.tool is not None
        if enabled and self.tool is None:
            say("  NOTE: py-spy not found (the bench extra); no profile")
        self.pid = pid
        self.path = out_dir / f"{name}.folded"
        self.name = name
        self.summary: Profile | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Profiler:
        if self.enabled:
            self._proc = subprocess.Popen(
                [
                    *(str(self.tool), "record", "--pid", str(self.pid), "--rate", "200"),
                    *("--format", "raw", "--output", str(self.path), "--nonblocking"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(0.5)  # py-spy attaches before the block starts
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is None:
            return
        self._proc.send_signal(2)
        try:
            self._proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
        if self.path.exists():
            self.summary = summarize_folded(self.path)
            say(f"  profile {self.name}: {self.summary.samples} samples; self time:")
            for where, share in self.summary.self_time[:10]:
                say(f"    {share:5.1%}  {where}")
            say("  inclusive:")
            for where, share in self.summary.inclusive[:14]:
                say(f"    {share:5.1%}  {where}")


def summarize_folded(path: Path) -> Profile:
    """Self and inclusive shares of the frames in py-spy's raw folded stacks."""
    self_time: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = [
            f.split(" (")[0] + " (" + f.split(" (")[-1].split(":")[0].rsplit("/", 1)[-1] + ")"
            if " (" in f
            else f
            for f in stack.split(";")
        ]
        total += count
        self_time[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    # the main thread's outer frames (runpy, click, the event loop) are in every
    # one of its samples: leave them out of the inclusive list
    outer = max(inclusive.values(), default=0)
    inner = Counter({k: v for k, v in inclusive.items() if v < outer})
    return Profile(
        samples=total,
        self_time=[(k, round(v / total, 3)) for k, v in self_time.most_common(15)],
        inclusive=[(k, round(v / total, 3)) for k, v in inner.most_common(30)],
    )


# --------------------------------------------------------------------------- server histograms


SERVER_HISTOGRAMS = ("headrace_append_seconds", "headrace_fsync_seconds")
"""The server's own histograms read over the latency shapes."""


def histogram(http_port: int, name: str) -> dict[float, float]:
    """Cumulative bucket counts ``{le: count}`` of a histogram on ``/metrics``."""
    url = f"http://127.0.0.1:{http_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    buckets: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith(f"{name}_bucket{{"):
            labels, _, value = line.rpartition(" ")
            le = labels.split('le="', 1)[1].split('"', 1)[0]
            bound = float("inf") if le == "+Inf" else float(le)
            buckets[bound] = buckets.get(bound, 0.0) + float(value)
    return buckets


def histograms(http_port: int) -> dict[str, dict[float, float]]:
    return {name: histogram(http_port, name) for name in SERVER_HISTOGRAMS}


def bucket_quantiles(
    before: dict[float, float], after: dict[float, float]
) -> tuple[int, float | None, float | None]:
    """The count, and the upper bucket bounds (ms) of p50 and p99, of the
    observations between two scrapes."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1] if counts else 0.0

    def bound_of(q: float) -> float | None:
        found = next((b for b, c in zip(bounds, counts, strict=True) if c >= q * total), None)
        return None if found is None else found * 1e3

    return int(total), bound_of(0.5), bound_of(0.99)


def add_server_latency(row: Row, http_port: int, before: dict[str, dict[float, float]]) -> None:
    """The server's own append (call to ack) and fsync histograms over a shape."""
    after = histograms(http_port)
    name = "headrace_append_seconds"
    count, p50, p99 = bucket_quantiles(before[name], after[name])
    row.server_append_count = count
    row.server_append_p50_ms_at_most, row.server_append_p99_ms_at_most = p50, p99
    name = "headrace_fsync_seconds"
    count, p50, p99 = bucket_quantiles(before[name], after[name])
    row.server_fsync_count = count
    row.server_fsync_p50_ms_at_most, row.server_fsync_p99_ms_at_most = p50, p99


def server_latency_text(row: Row) -> str:
    return (
        f"append p50 ≤ {row.server_append_p50_ms_at_most} p99 ≤"
        f" {row.server_append_p99_ms_at_most} ms ({row.server_append_count}),"
        f" fsync p99 ≤ {row.server_fsync_p99_ms_at_most} ms ({row.server_fsync_count})"
    )
