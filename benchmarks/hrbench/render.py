"""Tables from a run's results: the full report the suite prints, the compact
block it writes into ``docs/benchmarks.md``, and the targets judged on the
run's own figures."""

from __future__ import annotations

from typing import Final

from hrbench.config import PRODUCERS, ROOT, SHAPES, TARGETS
from hrbench.floor import FLOOR_MODES
from hrbench.results import Fsync, Results, Row, Target

DOCS: Final = ROOT / "docs" / "benchmarks.md"
BEGIN_MARK: Final = "<!-- suite:begin (written by benchmarks/suite.py) -->"
END_MARK: Final = "<!-- suite:end -->"

COLUMNS: Final = (
    ("events_per_s", "events/s"),
    ("mb_per_s", "MB/s"),
    ("p50_ms", "p50 ms"),
    ("p99_ms", "p99 ms"),
    ("p999_ms", "p99.9 ms"),
    ("server_cpu_us_per_event", "server CPU µs/event"),
    ("server_peak_rss_mib", "server peak RSS MiB"),
    ("server_rss_mib_before", "server RSS MiB before"),
    ("server_rss_mib_during", "server RSS MiB during (max)"),
    ("client_cpu_share", "client CPU (cores)"),
    ("send_lateness_p99_ms", "send lateness p99 ms"),
    ("server_append_p50_ms_at_most", "server append p50 ms ≤"),
    ("server_append_p99_ms_at_most", "server append p99 ms ≤"),
    ("server_fsync_p99_ms_at_most", "server fsync p99 ms ≤"),
)
"""Every figure column of the full tables, in order; a table shows those its rows have."""

RATIO_TITLES: Final = (
    ("produce_100b", "100-byte produce, one producer"),
    ("produce_100b_4", f"100-byte produce, {PRODUCERS} producer processes"),
    ("produce_10k", "10 KiB produce, one producer"),
    ("produce_10k_4", f"10 KiB produce, {PRODUCERS} producer processes"),
    ("produce_1mib", "1 MiB produce, one producer"),
    ("produce_1mib_4", f"1 MiB produce, {PRODUCERS} producer processes"),
    ("consume_100b", "100-byte consume"),
    ("catchup", "10 KiB catch-up"),
    ("consume_1mib", "1 MiB catch-up"),
    ("e2e_100b", "100-byte end to end"),
    ("e2e_10k", "10 KiB end to end"),
    ("e2e_1mib", "1 MiB end to end"),
    ("e2e_100b_4", f"100-byte end to end, {PRODUCERS} producer processes"),
    ("e2e_10k_4", f"10 KiB end to end, {PRODUCERS} producer processes"),
    ("e2e_1mib_4", f"1 MiB end to end, {PRODUCERS} producer processes"),
)

LIMIT_COLUMNS: Final = (
    ("loopback_tcp", "/ loopback TCP"),
    ("write_fsync", "/ fsynced sequential write"),
)
"""The machine limits each headrace row's MB/s is divided by in the ratio tables."""

LIMITS: Final = (
    ("loopback_tcp", "loopback TCP (iperf3, 1 stream)"),
    ("write_nosync", "sequential 1 MiB writes, no sync"),
    ("write_fsync", "sequential 1 MiB writes, fdatasync each"),
)

FSYNC_LIMITS: Final = (
    ("fsync_4k", "4 KiB append + fdatasync"),
    ("fsync_4k_before_latency", "the same just before the fsync-always latency shape"),
    ("fsync_4k_after_latency", "the same just after it"),
    ("fsync_4k_after", "the same after the run"),
)


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not b:
        return None
    return round(a / b, 3)


def _cell(value: object) -> str:
    if value is None:
        return ""
    return f"{value:,}" if isinstance(value, int) else str(value)


def table(rows: list[Row]) -> list[str]:
    """One shape's rows, with the columns they have."""
    keys = [(k, h) for k, h in COLUMNS if any(getattr(row, k) is not None for row in rows)]
    lines = ["| system | " + " | ".join(h for _, h in keys) + " | note |"]
    lines.append("|---" * (len(keys) + 2) + "|")
    for row in rows:
        cells = [_cell(getattr(row, k)) for k, _ in keys]
        lines.append(f"| {row.system} | " + " | ".join(cells) + f" | {row.note} |")
    return lines


# --------------------------------------------------------------------------- targets


def judge(results: Results) -> list[Target]:
    """Each target: the measured ratio or figure, the target, and whether it is met."""
    limits = results.limits
    targets: list[Target] = []

    def get(shape: str, key: str | None, field: str) -> float | None:
        row = results.row(shape, key) if key else None
        value = getattr(row, field) if row is not None else None
        return float(value) if value is not None else None

    def add(name: str, value: float | None, target: float, higher_is_better: bool = True) -> None:
        met = None
        if value is not None:
            met = value >= target if higher_is_better else value <= target
        targets.append(Target(name, value, target, higher_is_better, met))

    def best(shape: str, keys: list[str], field: str) -> Row | None:
        """The fastest of headrace's front doors (each target takes its best)."""
        rows = [r for k in keys if (r := results.row(shape, k)) is not None]
        return max(rows, key=lambda r: float(getattr(r, field)), default=None)

    tcp = limits.mb_per_s.get("loopback_tcp")
    small = best(
        "produce_100b", ["headrace_client", "headrace_tank", "headrace_rust_client"], "events_per_s"
    )
    small_rate = float(small.events_per_s) if small else None
    name = small.system if small else ""
    add(f"100 B produce events/s ({name})", small_rate, TARGETS["produce_100b_events_per_s"])
    add(
        "100 B produce: headrace / NATS sync always",
        ratio(small_rate, get("produce_100b", "nats_always", "events_per_s")),
        TARGETS["produce_100b_vs_nats_always"],
    )
    add(
        "100 B produce: headrace / Redis everysec (redis-py)",
        ratio(small_rate, get("produce_100b", "redis_everysec", "events_per_s")),
        TARGETS["produce_100b_vs_redis_everysec"],
    )
    add(
        "100 B produce: headrace / Redis everysec (redis-benchmark -P 64)",
        ratio(small_rate, get("produce_100b", "redis_everysec_redis_benchmark", "events_per_s")),
        TARGETS["produce_100b_vs_redis_everysec"],
    )
    write_fsync = limits.mb_per_s.get("write_fsync")
    for fsync, limit, what, target in (
        ("always", write_fsync, "fsynced sequential write", "produce_10k_vs_fsynced_write"),
        ("never", tcp, "loopback TCP", "produce_10k_nofsync_vs_tcp"),
    ):
        keys = [
            r.key
            for r in results.shape("produce_10k")
            if r.key.startswith("headrace") and r.key.endswith(fsync)
        ]
        row = best("produce_10k", keys, "mb_per_s")
        add(
            f"10 KiB produce: headrace fsync {fsync} / {what} ({row.system if row else ''})",
            ratio(row.mb_per_s if row else None, limit),
            TARGETS[target],
        )
    for key, what in (
        ("headrace_reader_process", "bare-socket ReadSegment reader process"),
        ("headrace_client", "headrace's PravegaClient, segments.read"),
        ("headrace_client_views", "headrace's PravegaClient, segments.read_view"),
    ):
        add(
            f"catch-up consume / loopback TCP ({what})",
            ratio(get("catchup", key, "mb_per_s"), tcp),
            TARGETS["catchup_vs_tcp"],
        )
    for key, with_what in (
        ("headrace_never", "with a tail reader"),
        ("headrace_never_alone", "writer alone"),
    ):
        add(
            f"ack p99 ms at 10k/s, fsync never, {with_what}",
            get("latency", key, "p99_ms"),
            TARGETS["ack_p99_never_ms"],
            higher_is_better=False,
        )
    for key, with_what in (
        ("headrace_always", "with a tail reader"),
        ("headrace_always_alone", "writer alone"),
    ):
        for when in ("before", "after"):
            fsync_p99 = limits.fsync.get(f"fsync_4k_{when}_latency")
            add(
                f"ack p99 at 10k/s, fsync always, {with_what}"
                f" / 4 KiB fdatasync p99 measured just {when}",
                ratio(get("latency", key, "p99_ms"), fsync_p99.p99_ms if fsync_p99 else None),
                TARGETS["ack_p99_always_vs_fsync_p99"],
                higher_is_better=False,
            )
    for fsync in ("always", "never"):
        add(
            f"tail delivery p99 ms at 10k/s, fsync {fsync}",
            get("latency", f"headrace_{fsync}_delivery", "p99_ms"),
            TARGETS["delivery_p99_ms"],
            higher_is_better=False,
        )
    for key in ("headrace_tank", "headrace_client"):
        row = results.row("produce_100b", key)
        add(
            f"server CPU µs per 100 B event ({row.system if row else key})",
            get("produce_100b", key, "server_cpu_us_per_event"),
            TARGETS["server_cpu_us_per_event"],
            higher_is_better=False,
        )
    memory = results.memory.get("headrace")
    per_conn = memory.kib_per_connection if memory else None
    per_reader = memory.kib_per_reader_and_connection if memory else None
    add(
        "MiB for 10,000 idle connections (extrapolated)",
        round(per_conn * 10_000 / 1024, 1) if per_conn is not None else None,
        TARGETS["idle_connections_mib"],
        higher_is_better=False,
    )
    add(
        "MiB for 10,000 parked readers, each on its own connection (extrapolated)",
        round(per_reader * 10_000 / 1024, 1) if per_reader is not None else None,
        TARGETS["idle_connections_mib"],
        higher_is_better=False,
    )
    return targets


def targets_table(results: Results) -> list[str]:
    lines = ["| figure | measured | target | met |", "|---|---|---|---|"]
    for row in results.targets:
        if results.run.only and row.value is None:
            continue  # a shape left out with --only
        met = {True: "yes", False: "**no**", None: "n/a"}[row.met]
        comparison = ">=" if row.higher_is_better else "<="
        lines.append(f"| {row.figure} | {row.value} | {comparison} {row.target} | {met} |")
    return lines


def context(results: Results) -> list[str]:
    """The latency targets' figures for the peers and the Python floor, through
    the same paced writer.

    Not targets: the ack latency a target names includes the paced writer
    process and the machine's scheduling, so the peers' figures from the
    same harness in the same run show how much of it any server pays, and
    the floor's how much of it any Python asyncio server pays.
    """
    before = results.limits.fsync.get("fsync_4k_before_latency")
    fsync_p99 = before.p99_ms if before else None
    lines = []
    peers = ("nats_default", "redis_everysec", "nats_always", "redis_always")
    for key in (*peers, *(key for _, key, _ in FLOOR_MODES)):
        row = results.row("latency", key)
        if row is None:
            continue
        line = f"- {row.system}: p99 {row.p99_ms} ms"
        if "always" in key and fsync_p99:
            line += (
                f", {ratio(row.p99_ms, fsync_p99)}x the 4 KiB fdatasync p99 measured"
                " just before headrace's fsync-always latency shape"
            )
        if "NOT SUSTAINED" in row.note:
            line += " (the offered load was not sustained)"
        lines.append(line + ".")
    for fsync, floor_key in (("never", "floor_never"), ("always", "floor_always_thread")):
        ours = results.row("latency", f"headrace_{fsync}_alone")
        floor = results.row("latency", floor_key)
        if ours and floor:
            lines.append(
                f"- headrace writer alone under `{fsync}` against the floor"
                f" ({floor.system}): p50 {ratio(ours.p50_ms, floor.p50_ms)}x,"
                f" p99 {ratio(ours.p99_ms, floor.p99_ms)}x."
            )
    return lines


CONTEXT_INTRO: Final = (
    "The peers and the Python floor (`benchmarks/floor_server.py`: frame, checksum, write,"
    " optionally sync, ack; nothing else) through the same paced writer (not targets:"
    " the harness and the machine are in their figures too):"
)


def peer_ratio_lines(results: Results, shape: str) -> list[str]:
    """Each headrace row's events/s over each peer's (and the floor's), and its
    MB/s over the machine's limits, all from the same run."""
    rows = results.shape(shape)
    peers = [r for r in rows if not r.key.startswith("headrace")]
    ours = [r for r in rows if r.key.startswith("headrace")]
    limits = [
        (results.limits.mb_per_s[k], header)
        for k, header in LIMIT_COLUMNS
        if results.limits.mb_per_s.get(k)
    ]
    if not ours or not (peers or limits):
        return []
    headers = [f"/ {p.key}" for p in peers] + [header for _, header in limits]
    lines = ["| headrace row | " + " | ".join(headers) + " |"]
    lines.append("|---" * (len(headers) + 1) + "|")
    for row in ours:
        cells = [str(ratio(row.events_per_s, p.events_per_s)) for p in peers]
        cells += [str(ratio(row.mb_per_s, limit)) for limit, _ in limits]
        lines.append(f"| {row.system} | " + " | ".join(cells) + " |")
    return lines


# --------------------------------------------------------------------------- whole reports


def _fsync_cell(f: Fsync) -> str:
    return f"{f.ops_per_s:,} ops/s, p50 {f.p50_ms} ms, p99 {f.p99_ms} ms, p99.9 {f.p999_ms} ms"


def machine_lines(results: Results) -> list[str]:
    """The run and the machine it ran on."""
    run, m = results.run, results.run.machine
    out = [
        f"Machine: {m.get('cpus')} CPUs ({m.get('cpu')}), {m.get('memory_gib')} GiB RAM, kernel"
        f" {m.get('kernel')}, Python {m.get('python')}; data on {run.filesystem}."
        f" Load average (1 min) {run.loadavg_start:.2f} at start, {run.loadavg_end:.2f} at end."
        f" Wall time {run.wall_s:.0f} s.",
    ]
    guest = m.get("guest")
    if guest:
        settings = ", ".join(f"`{k}` {v}" for k, v in guest.items())
        out += ["", f'Guest settings (see "What the VM adds"): {settings}.']
    return out


def header(results: Results) -> list[str]:
    """The run and the machine, and the machine's limits as a table."""
    limits = results.limits
    out = [*machine_lines(results), "", "| limit | figure |", "|---|---|"]
    for key, name in LIMITS:
        figure = limits.mb_per_s.get(key)
        out.append(f"| {name} | {limits.skipped.get(key, f'{figure} MB/s')} |")
    for key, name in FSYNC_LIMITS:
        if key in limits.fsync:
            out.append(f"| {name} | {_fsync_cell(limits.fsync[key])} |")
    return out


def limits_sentence(results: Results) -> str:
    """The machine's limits in one sentence, for the docs."""
    limits = results.limits
    parts = [
        f"{name} {limits.skipped.get(key, f'{limits.mb_per_s.get(key)} MB/s')}"
        for key, name in LIMITS
    ]
    fsync = [
        f"{limits.fsync[key].p99_ms} ms {when}"
        for key, when in (
            ("fsync_4k", "first"),
            ("fsync_4k_before_latency", "just before the `always` latency shape"),
            ("fsync_4k_after_latency", "just after it"),
            ("fsync_4k_after", "at the end"),
        )
        if key in limits.fsync
    ]
    text = "Limits: " + "; ".join(parts)
    if fsync:
        text += f"; 4 KiB append + fdatasync p99 {', '.join(fsync)}"
    return text + "."


def memory_table(results: Results) -> list[str]:
    if not results.memory:
        return []
    out = ["| server | KiB per idle connection | KiB per parked reader and its connection |"]
    out.append("|---|---|---|")
    for key, memory in results.memory.items():
        per_reader = memory.kib_per_reader_and_connection
        readers = f"{per_reader} ({memory.readers:,})" if per_reader is not None else ""
        out.append(f"| {key} | {memory.kib_per_connection} ({memory.connections:,}) | {readers} |")
    return out


def render(results: Results) -> str:
    """The full report: every shape's table, the ratios, memory, targets."""
    run = results.run
    out = [
        f"### Results, {run.when} ({'quick' if run.quick else 'full'} run)",
        "",
        *header(results),
        "",
    ]
    for key, title in SHAPES:
        rows = results.shape(key)
        if rows:
            out += [f"**{title}**", "", *table(rows), ""]
            if key == "latency":
                out += [
                    f"The paced writers send what has fallen due every {run.flush_ms} ms;"
                    " `send lateness` is how far behind that schedule they sent.",
                    "",
                ]
    for shape, title in RATIO_TITLES:
        lines = peer_ratio_lines(results, shape)
        if lines:
            out += [f"**{title}, ratios headrace / peer and / limit (same run)**", "", *lines, ""]
    memory = memory_table(results)
    if memory:
        out += ["**Memory (server RSS growth)**", "", *memory, ""]
    out += ["**Targets**", "", *targets_table(results)]
    lines = context(results)
    if lines:
        out += ["", CONTEXT_INTRO, "", *lines]
    return "\n".join(out) + "\n"


DOORS: Final = {
    "headrace_client": "client",
    "headrace_tank": "TANK",
    "headrace_lumberjack": "Lumberjack",
    "headrace_rust_client": "pravega",
    "headrace_always": "client",
    "headrace_never": "client",
    "headrace_raw_always": "raw blocks",
    "headrace_raw_never": "raw blocks",
    "headrace_tank_always": "TANK",
    "headrace_tank_never": "TANK",
    "headrace_rust_always": "pravega",
    "headrace_rust_never": "pravega",
    "headrace_read": "reader",
    "headrace_reader_process": "reader",
    "headrace_client_views": "client read_view",
    "headrace_rsio_unbounded": "RS-IO unbounded",
    "headrace_rsio": "RS-IO batches of 64",
}
"""The short name of each headrace row's front door or client in the docs table."""

DOCS_SHAPES: Final = (
    ("produce 100 B", "events/s", "produce_100b", "events_per_s"),
    ("produce 100 B, 4 producers", "events/s", "produce_100b_4", "events_per_s"),
    ("produce 10 KiB", "MB/s", "produce_10k", "mb_per_s"),
    ("produce 10 KiB, 4 producers", "MB/s", "produce_10k_4", "mb_per_s"),
    ("produce 1 MiB", "MB/s", "produce_1mib", "mb_per_s"),
    ("produce 1 MiB, 4 producers", "MB/s", "produce_1mib_4", "mb_per_s"),
    ("consume 100 B", "events/s", "consume_100b", "events_per_s"),
    ("consume 10 KiB (catch-up)", "MB/s", "catchup", "mb_per_s"),
    ("consume 1 MiB (catch-up)", "MB/s", "consume_1mib", "mb_per_s"),
    ("end to end 100 B", "events/s", "e2e_100b", "events_per_s"),
    ("end to end 10 KiB", "MB/s", "e2e_10k", "mb_per_s"),
    ("end to end 1 MiB", "MB/s", "e2e_1mib", "mb_per_s"),
    ("end to end 100 B, 4 producers", "events/s", "e2e_100b_4", "events_per_s"),
    ("end to end 10 KiB, 4 producers", "MB/s", "e2e_10k_4", "mb_per_s"),
    ("end to end 1 MiB, 4 producers", "MB/s", "e2e_1mib_4", "mb_per_s"),
)
"""The throughput rows of the docs table: label, unit, shape, figure."""

DOCS_HEADER: Final = (
    "| shape | unit | headrace `always` | floor, sync | NATS sync always | Redis always"
    " | headrace `never` | floor, no sync | NATS default | Redis everysec |"
)


def _figure(row: Row | None, field: str) -> str:
    return "" if row is None else _cell(getattr(row, field))


def _best(rows: list[Row], field: str) -> str:
    """The best headrace row's figure, and its door when the shape has several."""
    best = max(rows, key=lambda r: float(getattr(r, field)), default=None)
    if best is None:
        return ""
    door = DOORS.get(best.key, "")
    return _figure(best, field) + (f" ({door})" if door and len(rows) > 1 else "")


def _docs_throughput(results: Results, shape: str, field: str) -> list[str]:
    rows = results.shape(shape)
    ours = [r for r in rows if r.key.startswith("headrace")]
    never = [r for r in ours if r.key.endswith("never")]
    always = [r for r in ours if not r.key.endswith("never")]
    redis = _figure(results.row(shape, "redis_everysec"), field)
    ceiling = results.row(shape, "redis_everysec_redis_benchmark")
    if ceiling is not None:
        redis += f" (redis-benchmark {_figure(ceiling, field)})"
    return [
        _best(always, field),
        _figure(results.row(shape, "floor_always"), field),
        _figure(results.row(shape, "nats_always"), field),
        _figure(results.row(shape, "redis_always"), field),
        _best(never, field),
        _figure(results.row(shape, "floor_never"), field),
        _figure(results.row(shape, "nats_default"), field),
        redis,
    ]


def _docs_latency(results: Results, suffix: str, peers: bool) -> list[str]:
    """p99 ms of the latency rows ``headrace_<policy><suffix>``, beside the peers'
    and the floor's acks when ``peers``."""

    def p99(key: str) -> str:
        row = results.row("latency", key)
        sustained = row is None or "NOT SUSTAINED" not in row.note
        return _figure(row, "p99_ms") + ("" if sustained else " (not sustained)")

    inline, thread = p99("floor_always"), p99("floor_always_thread")
    floor_sync = f"{inline} inline, {thread} thread" if inline and thread else inline or thread
    return [
        p99(f"headrace_always{suffix}"),
        floor_sync if peers else "",
        p99("nats_always") if peers else "",
        p99("redis_always") if peers else "",
        p99(f"headrace_never{suffix}"),
        p99("floor_never") if peers else "",
        p99("nats_default") if peers else "",
        p99("redis_everysec") if peers else "",
    ]


def docs_table(results: Results) -> list[str]:
    """Every system side by side, one line per shape: durable policies on the
    left (headrace ``always``, the floor that syncs, NATS and Redis syncing each
    write), the others on the right."""
    out = [DOCS_HEADER, "|---" * 10 + "|"]

    def line(label: str, unit: str, cells: list[str]) -> None:
        if any(cells):
            out.append(f"| {label} | {unit} | " + " | ".join(cells) + " |")

    for label, unit, shape, field in DOCS_SHAPES:
        line(label, unit, _docs_throughput(results, shape, field))
    line("ack at 10,000/s, writer alone", "p99 ms", _docs_latency(results, "_alone", True))
    line("ack, with a tail reader", "p99 ms", _docs_latency(results, "", False))
    line("tail delivery", "p99 ms", _docs_latency(results, "_delivery", False))
    for shape, what in (("scaling", "segments"), ("connections", "connections")):
        rows = results.shape(shape)
        if rows:
            counts = " / ".join(r.key.rsplit("_", 1)[1] for r in rows)
            figures = " / ".join(_cell(r.events_per_s) for r in rows)
            line(f"{counts} {what}", "events/s", [figures, *[""] * 7])
    memory = results.memory

    def kib(key: str, field: str) -> str:
        value = getattr(memory[key], field) if key in memory else None
        return "" if value is None else str(value)

    idle = [
        kib(key, "kib_per_connection") for key in ("headrace", "nats_default", "redis_everysec")
    ]
    line("idle connection", "KiB", [idle[0], "", "", "", "", "", idle[1], idle[2]])
    parked = kib("headrace", "kib_per_reader_and_connection")
    line("parked tail reader and its connection", "KiB", [parked, *[""] * 7])
    return out


def docs_doors(results: Results) -> list[str]:
    """Each of headrace's front doors where a shape has several (the table shows
    the best)."""
    lines = []
    for label, unit, shape, field in DOCS_SHAPES:
        rows = [r for r in results.shape(shape) if r.key in DOORS]
        for policy in ("always", "never"):
            mine = [r for r in rows if r.key.endswith("never") == (policy == "never")]
            if len(mine) > 1:
                figures = ", ".join(f"{DOORS[r.key]} {_figure(r, field)}" for r in mine)
                lines.append(f"- {label}, `{policy}`, {unit}: {figures}.")
    return ["headrace's doors and clients where a shape has several:", "", *lines] if lines else []


def render_docs(results: Results, source: str) -> str:
    """The block of ``docs/benchmarks.md``, from the results file ``source``: the
    machine and its limits, every system side by side, the targets."""
    run = results.run
    out = [
        f"A {'quick' if run.quick else 'full'} run, from `{source}`: every row is there,"
        f" and `benchmarks/suite.py --render {source}` prints them and writes this block again."
        + (f" {run.note}" if run.note else ""),
        "",
        *machine_lines(results),
        "",
        limits_sentence(results),
        "",
        *docs_table(results),
        "",
        *docs_doors(results),
        "",
        *targets_table(results),
    ]
    lines = docs_context(results)
    if lines:
        out += ["", *lines]
    return "\n".join(out) + "\n"


def docs_context(results: Results) -> list[str]:
    """The ``always`` acks over the disk's fdatasync p99, and headrace's acks
    over the Python floor's: what the ack targets leave to the server."""
    before = results.limits.fsync.get("fsync_4k_before_latency")
    lines = []
    if before is not None:
        ratios = []
        for key, name in (
            ("headrace_always_alone", "headrace, writer alone"),
            ("floor_always", "the floor syncing in its read callback"),
            ("floor_always_thread", "the floor with a sync thread"),
            ("redis_always", "Redis `always`"),
            ("nats_always", "NATS sync always"),
        ):
            row = results.row("latency", key)
            if row is not None:
                ratios.append(f"{name} {ratio(row.p99_ms, before.p99_ms)}x")
        if ratios:
            lines.append(
                f"Ack p99 under a sync per write over the 4 KiB fdatasync p99 ({before.p99_ms} ms)"
                f" measured just before: {', '.join(ratios)}."
            )
    for fsync, floor_key in (("never", "floor_never"), ("always", "floor_always_thread")):
        ours = results.row("latency", f"headrace_{fsync}_alone")
        floor = results.row("latency", floor_key)
        if ours and floor:
            p50, p99 = ratio(ours.p50_ms, floor.p50_ms), ratio(ours.p99_ms, floor.p99_ms)
            lines.append(
                f"headrace's writer-alone ack under `{fsync}` over the floor's"
                f" ({floor.system.removeprefix('Python floor ack, ')}): p50 {p50}x, p99 {p99}x."
            )
    return [line for pair in zip(lines, [""] * len(lines), strict=True) for line in pair][:-1]


def write_docs(text: str) -> None:
    """Replace the generated block of ``docs/benchmarks.md`` with ``text``."""
    current = DOCS.read_text() if DOCS.exists() else "# Benchmarks\n"
    block = f"{BEGIN_MARK}\n{text}{END_MARK}"
    if BEGIN_MARK in current and END_MARK in current:
        head, rest = current.split(BEGIN_MARK, 1)
        tail = rest.split(END_MARK, 1)[1]
        current = head + block + tail
    else:
        current = current.rstrip("\n") + "\n\n## Latest results\n\n" + block + "\n"
    DOCS.write_text(current)
