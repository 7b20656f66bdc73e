"""headrace's shapes: a ``headrace serve --fsync always`` server gets every shape,
then a fresh ``--fsync never`` server the memory, large and latency shapes.

The shapes that run under both policies (10 KiB and 1 MiB produce, latency)
are one method each, parameterised by the server's policy.
"""

from __future__ import annotations

import asyncio
import threading

import _common as common

from hrbench.config import (
    CATCHUP_DEPTH,
    CATCHUP_MIN_BYTES,
    CONNECTION_BLOCK_EVENTS,
    HUGE,
    LARGE,
    LARGE_BUNDLE_MESSAGES,
    LARGE_TANK_IN_FLIGHT,
    MAX_CONNECTION_PROCESSES,
    OFFERED_RATE,
    PRODUCERS,
    RSS_SAMPLE_S,
    SMALL,
    producers_label,
    stamp_every,
    times,
)
from hrbench.context import Context
from hrbench.floor import floor_large_row, raw_blocks_row
from hrbench.hr_client import (
    hr_catchup,
    hr_memory,
    hr_produce,
    hr_stream_now,
    rust_produce,
    tank_large_produce,
    tank_produce,
    tank_topic,
)
from hrbench.limits import fsync_latency
from hrbench.measure import (
    Measured,
    Profiler,
    add_server_latency,
    e2e_row,
    group_row,
    histograms,
    latency_row,
    producers_row,
    rate_row,
    run_group,
    say,
    server_cpu_per_event,
    server_latency_text,
)
from hrbench.results import Row

LISTENERS = ("controller", "segment-store", "tank", "lumberjack", "rsio", "http")
"""The listeners the suite's headrace servers open."""

EVENT_HEADER_BYTES = 8
"""Each event in a segment: an 8-byte header, then the payload."""


def run_headrace(ctx: Context) -> None:
    listeners = {name: common.free_port() for name in LISTENERS}
    want = ctx.want
    with Headrace(ctx, listeners, "always") as hr:
        if want("produce") or want("consume"):
            hr.produce_small()
        if want("produce"):
            hr.produce_other_doors()
        if want("producers4"):
            hr.producers4()
        if want("large") or want("consume"):
            hr.large(all_doors=want("large"))  # the consume shape reads what it stores
        if want("consume"):
            hr.consume()
        if want("e2e"):
            hr.e2e()
        if want("latency"):
            hr.latency()
        if want("segments"):
            hr.segments()
        if want("connections"):
            hr.connections()
    if not (want("memory") or want("large") or want("latency")):
        return
    with Headrace(ctx, listeners, "never") as hr:
        if want("memory"):  # first, on a fresh server (a used one reuses the memory it freed)
            hr.memory()
        if want("large"):
            hr.large(all_doors=True)
        if want("latency"):
            hr.latency()


class Headrace:
    """One ``headrace serve`` (policy ``fsync``) and the shapes run against it."""

    def __init__(self, ctx: Context, listeners: dict[str, int], fsync: str) -> None:
        self.ctx = ctx
        self.sizes = ctx.sizes
        self.results = ctx.results
        self.listeners = listeners
        self.fsync = fsync
        self.uri = f"tcp://127.0.0.1:{listeners['controller']}"
        self.ss = str(listeners["segment-store"])
        self.pid = 0

    def __enter__(self) -> Headrace:
        self.proc = common.start_headrace(
            self.ctx.scratch / f"hr-{self.fsync}", self.listeners, self.fsync
        )
        self.pid = self.proc.pid
        return self

    def __exit__(self, *exc: object) -> None:
        common.stop(self.proc)

    def profiler(self, name: str) -> Profiler:
        return Profiler(self.ctx.profile, self.pid, name, self.ctx.profile_dir)

    def put(self, shape: str, key: str, row: Row) -> Row:
        return self.results.put(shape, key, row)

    # ------------------------------------------------------------------ producers

    def produce_small(self) -> None:
        """100 B through our client, then TANK bundles of 8192 (read back too)."""
        sizes = self.sizes
        label = "headrace client (Pravega wire)"
        with self.profiler("headrace_client_100b") as prof, Measured(self.pid) as m:
            seconds = asyncio.run(hr_produce(self.uri, "p100", SMALL, sizes.small_events))
        self.ctx.keep_profile("headrace_client_100b", prof.summary)
        row = rate_row(label, sizes.small_events, SMALL, seconds, pid=self.pid, cpu_s=m.cpu)
        self.put("produce_100b", "headrace_client", row)
        say(
            f"  {label}: 100 B {row.events_per_s:,} events/s,"
            f" {row.server_cpu_us_per_event} µs CPU/event"
        )

        prof = self.profiler("tank_100b")  # around the produce only
        produce_s, cpu, consume_s = tank_produce(
            self.listeners["tank"], sizes.small_events, prof, self.pid
        )
        self.ctx.keep_profile("tank_100b", prof.summary)
        system = "headrace TANK (bundles of 8192)"
        row = rate_row(system, sizes.small_events, SMALL, produce_s, pid=self.pid, cpu_s=cpu)
        self.put("produce_100b", "headrace_tank", row)
        say(
            f"  TANK: 100 B {row.events_per_s:,} events/s,"
            f" {row.server_cpu_us_per_event} µs CPU/event"
        )
        system = "headrace TANK consume (raw chunks, 4 MiB fetches)"
        row = rate_row(system, sizes.small_events, SMALL, consume_s, pid=self.pid)
        self.put("consume_100b", "headrace_tank", row)

    def produce_other_doors(self) -> None:
        """Lumberjack windows of 2048, and 100 B through the real ``pravega`` client."""
        import lumberjack_ingest

        sizes = self.sizes
        with Measured(self.pid) as m:
            lj = asyncio.run(
                lumberjack_ingest._measure(
                    self.listeners["lumberjack"], False, 1, sizes.lumberjack_windows
                )
            )
        size = round(lj.payload_mb_per_s * 1e6 / lj.events_per_s)
        system = "headrace Lumberjack (windows of 2048)"
        note = f"~{size} B JSON events"
        row = rate_row(system, lj.events, size, lj.seconds, pid=self.pid, cpu_s=m.cpu, note=note)
        self.put("produce_100b", "headrace_lumberjack", row)
        say(f"  Lumberjack: {row.events_per_s:,} events/s ({size} B JSON)")

        with Measured(self.pid) as m:
            seconds = rust_produce(self.uri, "rust100", sizes.rust_events)
        system = "headrace, real pravega client"
        row = rate_row(system, sizes.rust_events, SMALL, seconds, pid=self.pid, cpu_s=m.cpu)
        self.put("produce_100b", "headrace_rust_client", row)
        say(f"  pravega (Rust) client: 100 B {row.events_per_s:,} events/s")

    def producers4(self) -> None:
        """``PRODUCERS`` client processes on one segment, every size; TANK at 100 B."""
        sizes = self.sizes
        system = f"headrace client, {PRODUCERS} producer processes"
        note = "EventWriter each, one segment"
        for shape, stream, size, total in (
            ("produce_100b_4", "p100x4", SMALL, sizes.small_events),
            *sizes.producers4_large(),
        ):
            hr_stream_now(self.uri, stream)
            command = ["hr-produce", self.uri, "bench", stream, str(size), str(total // PRODUCERS)]
            row = producers_row(system, command, PRODUCERS, size, self.pid, note)
            self.put(shape, "headrace_client", row)
            say(
                f"  {PRODUCERS} client processes: {size} B {row.events_per_s:,} events/s,"
                f" {row.mb_per_s} MB/s"
            )
            if size == SMALL:
                row = self.tank_producers()
                self.put(shape, "headrace_tank", row)
                say(f"  {PRODUCERS} TANK processes: 100 B {row.events_per_s:,} events/s")

    def tank_producers(self) -> Row:
        """``PRODUCERS`` TANK producer processes on one partition of a fresh topic."""
        port = self.listeners["tank"]
        tank_topic(port, "bench4")
        command = ["tank-produce", str(port), "bench4", str(self.sizes.small_events // PRODUCERS)]
        system = f"headrace TANK, {PRODUCERS} producer processes"
        note = "bundles of 8192, one partition"
        return producers_row(system, command, PRODUCERS, SMALL, self.pid, note)

    def large(self, *, all_doors: bool) -> None:
        """10 KiB and 1 MiB events through our client under this server's policy;
        with ``all_doors`` the 10 KiB shape also through raw-socket blocks (and
        the Python floor right after), TANK and the real ``pravega`` client."""
        fsync, count = self.fsync, self.sizes.large_events
        profile = "headrace_client_10k" if fsync == "always" else "headrace_client_10k_never"
        with self.profiler(profile) as prof, Measured(self.pid) as m:
            seconds = asyncio.run(hr_produce(self.uri, "p10k", LARGE, count))
        self.ctx.keep_profile(profile, prof.summary)
        system = f"headrace client, fsync {fsync}"
        row = rate_row(system, count, LARGE, seconds, pid=self.pid, cpu_s=m.cpu)
        self.put("produce_10k", f"headrace_{fsync}", row)
        say(f"  10 KiB, fsync {fsync}: {row.mb_per_s} MB/s")
        if all_doors:
            self.raw_blocks()
            self.large_doors()
        # 1 MiB under `never` too: the peers' default policies sync in the background
        count = self.sizes.huge_events
        with Measured(self.pid) as m:
            seconds = asyncio.run(hr_produce(self.uri, "p1m", HUGE, count))
        row = rate_row(system, count, HUGE, seconds, pid=self.pid, cpu_s=m.cpu)
        self.put("produce_1mib", f"headrace_{fsync}", row)
        say(f"  1 MiB, fsync {fsync}: {row.mb_per_s} MB/s")

    def raw_blocks(self) -> None:
        """The 10 KiB raw-socket block rows: headrace's, then (unless ``--skip
        floor``) the Python floor's of the same policy."""
        fsync = self.fsync
        segment, _ = hr_stream_now(self.uri, f"raw10k{fsync}")
        system = f"headrace, raw-socket blocks, fsync {fsync}"
        row = raw_blocks_row(
            self.listeners["segment-store"], segment, self.pid, self.sizes.large_events, system
        )
        self.put("produce_10k", f"headrace_raw_{fsync}", row)
        say(f"  10 KiB, raw-socket blocks, fsync {fsync}: {row.mb_per_s} MB/s")
        if self.ctx.floor:
            key, row = floor_large_row(self.ctx, fsync)
            self.put("produce_10k", key, row)
            say(f"  10 KiB, Python floor: {row.mb_per_s} MB/s")

    def large_doors(self) -> None:
        """The 10 KiB shape through TANK (uncompressed bundles, so the bytes stored
        are the bytes counted) and through the real ``pravega`` client (a native
        client: the server, not a Python client, is what these rows measure)."""
        fsync, count = self.fsync, self.sizes.large_events
        seconds, cpu = tank_large_produce(self.listeners["tank"], f"p10k{fsync}", count, self.pid)
        note = f"bundles of {LARGE_BUNDLE_MESSAGES}, uncompressed, {LARGE_TANK_IN_FLIGHT} in flight"
        system = f"headrace TANK, fsync {fsync}"
        row = rate_row(system, count, LARGE, seconds, pid=self.pid, cpu_s=cpu, note=note)
        self.put("produce_10k", f"headrace_tank_{fsync}", row)
        say(f"  {row.system}: 10 KiB {row.mb_per_s} MB/s")
        with Measured(self.pid) as m:
            seconds = rust_produce(self.uri, f"rust10k{fsync}", count, LARGE)
        system = f"headrace, real pravega client, fsync {fsync}"
        row = rate_row(system, count, LARGE, seconds, pid=self.pid, cpu_s=m.cpu)
        self.put("produce_10k", f"headrace_rust_{fsync}", row)
        say(f"  {row.system}: 10 KiB {row.mb_per_s} MB/s")

    # ------------------------------------------------------------------ consumers

    def catchup_row(self, segment: str, length: int, size: int, passes: int) -> Row:
        """A bare-socket reader process (``hr-catchup``, ``CATCHUP_DEPTH`` reads ahead)
        reading a stored segment of ``size``-byte events ``passes`` times."""
        reader = ["hr-catchup", self.ss, segment, str(length), str(size), str(CATCHUP_DEPTH)]
        reader += [str(2 * 1024 * 1024), "0", str(passes)]
        with Measured(self.pid) as m:
            _, (got,) = run_group([reader])
        whole = got["complete"] and got["events"] * (size + 8) == length * passes
        row = rate_row(
            f"headrace ReadSegment 2 MiB, bare-socket reader process, {CATCHUP_DEPTH} ahead",
            got["events"],
            size + EVENT_HEADER_BYTES,
            got["seconds"],
            pid=self.pid,
            cpu_s=m.cpu,
            note=f"the stream read {times(passes)}; every event header checked"
            + ("" if whole else f" INCOMPLETE: {got['bytes']} of {length * passes} bytes"),
        )
        row.client_cpu_share = round(got["client_cpu_s"] / got["seconds"], 2)
        return row

    def consume(self) -> None:
        """The stored 10 KiB, 1 MiB and 100 B streams read back; RS-IO subscribers."""
        segment, length = hr_stream_now(self.uri, "p10k")
        passes = -(-CATCHUP_MIN_BYTES // length)
        with self.profiler("catchup") as prof:
            row = self.catchup_row(segment, length, LARGE, passes)
        self.ctx.keep_profile("catchup", prof.summary)
        self.put("catchup", "headrace_reader_process", row)
        say(f"  catch-up (reader process, {CATCHUP_DEPTH} ahead): {row.mb_per_s} MB/s")

        segment, length = hr_stream_now(self.uri, "p1m")
        row = self.catchup_row(segment, length, HUGE, 1)
        self.put("consume_1mib", "headrace_reader_process", row)
        say(f"  1 MiB catch-up (reader process): {row.mb_per_s} MB/s")

        for key, call, views, kept_as in (
            ("headrace_client", "read", False, "as bytes"),
            ("headrace_client_views", "read_view", True, "as views of the received replies"),
        ):
            with Measured(self.pid) as m:
                seconds, nbytes = asyncio.run(hr_catchup(self.uri, "p10k", passes, views=views))
            size = LARGE + EVENT_HEADER_BYTES
            row = rate_row(
                f"headrace PravegaClient segments.{call} 2 MiB (in the suite's process)",
                nbytes // size,
                size,
                seconds,
                pid=self.pid,
                cpu_s=m.cpu,
                note=f"the stream read {times(passes)}, {kept_as}",
            )
            self.put("catchup", key, row)
            say(f"  catch-up (PravegaClient.segments.{call}): {row.mb_per_s} MB/s")

        segment, length = hr_stream_now(self.uri, "p100")
        with Measured(self.pid) as m:
            wall, out = run_group([["hr-consume", self.ss, segment, str(length), "120"]])
        row = group_row(
            "headrace ReadSegment 2 MiB, bare-socket reader process",
            wall,
            out,
            SMALL,
            events=length // (SMALL + EVENT_HEADER_BYTES),
            pid=self.pid,
            cpu_s=m.cpu,
        )
        self.put("consume_100b", "headrace_read", row)
        say(f"  consume 100 B (ReadSegment): {row.events_per_s:,} events/s")
        self.rsio()

    def rsio(self) -> None:
        """RS-IO subscribers of a filled stream: unbounded demand, then batches of 64."""
        import rsio_subscribe

        from headrace.client import PravegaClient
        from headrace.protocols.rsio import MAX_DEMAND

        count = self.sizes.rsio_events

        async def fill() -> None:
            async with PravegaClient(self.uri) as client:
                await rsio_subscribe._fill(client, "rs100", count, SMALL)

        asyncio.run(fill())
        for mode, batch in (("unbounded demand", MAX_DEMAND), ("batch 64", 64)):
            with Measured(self.pid) as m:
                seconds = asyncio.run(
                    rsio_subscribe._read(self.listeners["rsio"], "rs100", batch, count)
                )
            key = "headrace_rsio" if batch == 64 else "headrace_rsio_unbounded"
            row = rate_row(
                f"headrace RS-IO subscriber, {mode}",
                count,
                SMALL,
                seconds,
                pid=self.pid,
                cpu_s=m.cpu,
                note="RsioClient (rsio_subscribe.py), in the suite's process",
            )
            self.put("consume_100b", key, row)
            say(f"  RS-IO ({mode}): {row.events_per_s:,} events/s")

    def e2e(self) -> None:
        """Producer processes and a bare-socket reader process at once, every size."""
        for shape, stream, size, total, producers in self.sizes.e2e_shapes(self.sizes.e2e_events):
            segment, _ = hr_stream_now(self.uri, stream)
            per = total // producers
            producer = ["hr-produce", self.uri, "bench", stream, str(size), str(per)]
            producer.append(stamp_every(total))
            # each producer writes one event more, before the timing starts
            nbytes = producers * (per + 1) * (size + EVENT_HEADER_BYTES)
            consumer = ["hr-consume", self.ss, segment, str(nbytes), "300", str(size)]
            system = producers_label("headrace client → bare-socket ReadSegment reader", producers)
            row = e2e_row(system, producer, producers, consumer, size, per * producers, self.pid)
            self.put(shape, "headrace", row)
            say(f"  end to end, {shape}: {row.mb_per_s} MB/s")

    # ------------------------------------------------------------------ latency

    def latency(self) -> None:
        """Ack and tail-delivery latency at ``OFFERED_RATE``: a paced raw-socket writer
        process and a raw-socket tail reader process (``suite_workers.py``), the
        server's own histograms over the same seconds and, under ``always``, the
        disk's fsync p99 measured just before and just after.

        Then the paced writer again, alone on a fresh stream: the peers' ack rows
        are measured that way (a writer, no reader), and on two cores the reader
        process is a third process competing for them, so only the writer-alone
        row compares with theirs. Both rows are judged.
        """
        fsync, sizes, limits = self.fsync, self.sizes, self.results.limits
        segment, tail = hr_stream_now(self.uri, f"lat{fsync}")
        total = int(OFFERED_RATE * sizes.latency_s)

        def writer_on(segment: str) -> list[str]:
            return [
                *("lat-pravega", self.ss, segment, str(OFFERED_RATE)),
                *(str(sizes.latency_s), sizes.flush_s),
            ]

        reader = ["tail-pravega", self.ss, segment, str(tail), str(total)]
        reader.append(str(sizes.latency_s + 5))
        if fsync == "always":
            limits.fsync["fsync_4k_before_latency"] = fsync_latency(
                self.ctx.scratch, sizes.fsync_ops
            )
        before = histograms(self.listeners["http"])
        with self.profiler(f"latency_{fsync}") as prof, Measured(self.pid) as m:
            _, (acks, delivery) = run_group([writer_on(segment), reader])
        self.ctx.keep_profile(f"latency_{fsync}", prof.summary)
        ack = latency_row(
            f"headrace ack, fsync {fsync}",
            acks,
            note=f"raw-socket paced writer process, {acks['batches']:,} appends",
        )
        ack.server_cpu_us_per_event = server_cpu_per_event(m.cpu, acks["events"])
        add_server_latency(ack, self.listeners["http"], before)
        alone_segment, _ = hr_stream_now(self.uri, f"lat{fsync}alone")
        with Measured(self.pid) as m_alone:
            _, (alone_out,) = run_group([writer_on(alone_segment)])
        if fsync == "always":
            limits.fsync["fsync_4k_after_latency"] = fsync_latency(
                self.ctx.scratch, sizes.fsync_ops
            )
        self.put("latency", f"headrace_{fsync}", ack)
        row = latency_row(
            f"headrace tail delivery, fsync {fsync}",
            delivery,
            note="raw-socket tail reader process, one parked ReadSegment",
        )
        self.put("latency", f"headrace_{fsync}_delivery", row)
        alone = latency_row(
            f"headrace ack, fsync {fsync}, writer alone",
            alone_out,
            note="raw-socket paced writer process alone (as the peers),"
            f" {alone_out['batches']:,} appends",
        )
        alone.server_cpu_us_per_event = server_cpu_per_event(m_alone.cpu, alone_out["events"])
        self.put("latency", f"headrace_{fsync}_alone", alone)
        say(
            f"  ack at 10k/s ({fsync}): p50 {ack.p50_ms} p99 {ack.p99_ms} ms"
            f" (writer CPU {ack.client_cpu_share:.0%}); delivery p99 {row.p99_ms} ms;"
            f" writer alone p50 {alone.p50_ms} p99 {alone.p99_ms} ms;"
            f" server {server_latency_text(ack)}"
        )

    # ------------------------------------------------------------------ scaling, memory

    def segments(self) -> None:
        """One writer over 1, 16 (and 256) segments."""
        sizes = self.sizes
        for n in sizes.segment_counts:
            with Measured(self.pid) as m:
                seconds = asyncio.run(
                    hr_produce(self.uri, f"seg{n}", SMALL, sizes.scaling_events, segments=n)
                )
            system = f"headrace client, {n} segments"
            row = rate_row(system, sizes.scaling_events, SMALL, seconds, pid=self.pid, cpu_s=m.cpu)
            self.put("scaling", f"segments_{n}", row)
            say(f"  {n} segments: {row.events_per_s:,} events/s")

    def connections(self) -> None:
        """Events/s with N connections, each its own writer sending blocks of
        ``CONNECTION_BLOCK_EVENTS`` with one block in flight, over up to
        ``MAX_CONNECTION_PROCESSES`` raw-socket client processes; and the server's RSS."""
        sizes, pid = self.sizes, self.pid
        for n in sizes.connection_counts:
            segment, _ = hr_stream_now(self.uri, f"conn{n}")
            processes = min(MAX_CONNECTION_PROCESSES, n)
            commands = []
            for i in range(processes):
                share = n // processes + (1 if i < n % processes else 0)
                commands.append(
                    [
                        *("hr-connections", self.ss, segment),
                        *(str(share), str(sizes.connection_s), str(CONNECTION_BLOCK_EVENTS)),
                    ]
                )
            rss_before = common.memory_kib(pid).get("VmRSS", 0)
            peak = [rss_before]
            done = threading.Event()

            def sample_rss(done: threading.Event, peak: list[int]) -> None:
                while not done.wait(RSS_SAMPLE_S):
                    peak[0] = max(peak[0], common.memory_kib(pid).get("VmRSS", 0))

            sampler = threading.Thread(target=sample_rss, args=(done, peak), daemon=True)
            sampler.start()
            try:
                with Measured(pid) as m:
                    wall, out = run_group(commands)
            finally:
                done.set()
                sampler.join()
            row = group_row(
                f"headrace, {n} connections writing",
                wall,
                out,
                SMALL,
                events=sum(int(r["events"]) for r in out),
                pid=pid,
                cpu_s=m.cpu,
                producers=processes,
                note=f"{processes} client processes, blocks of {CONNECTION_BLOCK_EVENTS},"
                " 1 in flight",
            )
            row.server_rss_mib_before = round(rss_before / 1024, 1)
            row.server_rss_mib_during = round(peak[0] / 1024, 1)
            self.put("connections", f"connections_{n}", row)
            say(
                f"  {n} connections: {row.events_per_s:,} events/s,"
                f" {row.server_cpu_us_per_event} µs CPU/event"
            )

    def memory(self) -> None:
        """RSS per idle connection and per parked tail reader, on a fresh server."""
        sizes = self.sizes
        memory = asyncio.run(
            hr_memory(
                self.uri,
                self.listeners["segment-store"],
                self.pid,
                sizes.idle_connections,
                sizes.parked_readers,
            )
        )
        self.results.memory["headrace"] = memory
        say(f"  memory: {memory}")
