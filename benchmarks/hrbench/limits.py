"""The machine's own limits, measured first: loopback TCP, sequential writes,
and 4 KiB ``fdatasync`` latency (again around the ``always`` latency shape and
at the end, because a shared disk drifts)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import _common as common

from hrbench.config import Sizes
from hrbench.measure import ms, say
from hrbench.results import Fsync, Limits


def ensure_debian(binary: str, package: str) -> str | None:
    """Path of ``binary``; install ``package`` with apt-get when missing and possible."""
    found = shutil.which(binary)
    if found:
        return found
    if os.geteuid() == 0 and shutil.which("apt-get"):
        say(f"  installing {package} (apt-get)")
        subprocess.run(
            ["apt-get", "install", "-y", "-q", package],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
        found = shutil.which(binary)
    if not found:
        say(f"  NOTE: {binary} not available (Debian package {package}); skipped")
    return found


def loopback_tcp(seconds: int) -> float | None:
    """MB/s of one iperf3 stream over loopback; None without iperf3."""
    iperf = ensure_debian("iperf3", "iperf3")
    if iperf is None:
        return None
    port = common.free_port()
    server = subprocess.Popen(
        [iperf, "-s", "-1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        time.sleep(0.3)  # iperf3 -s listening
        out = subprocess.run(
            [iperf, "-c", "127.0.0.1", "-p", str(port), "-t", str(seconds), "-J"],
            capture_output=True,
            text=True,
            timeout=seconds + 30,
            check=True,
        ).stdout
    finally:
        server.wait(timeout=10)
    bps = float(json.loads(out)["end"]["sum_received"]["bits_per_second"])
    return round(bps / 8 / 1e6, 1)


def sequential_write(directory: Path, mib: int, sync_each: bool) -> float:
    """MB/s of 1 MiB ``os.write`` calls, ``fdatasync`` after each (or once at the end,
    outside the time, so the next measurement does not pay for this one)."""
    block = os.urandom(1 << 20)
    path = directory / "seq.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        began = time.perf_counter()
        for _ in range(mib):
            os.write(fd, block)
            if sync_each:
                os.fdatasync(fd)
        seconds = time.perf_counter() - began
        os.fdatasync(fd)
    finally:
        os.close(fd)
        path.unlink()
    return round(mib * (1 << 20) / seconds / 1e6, 1)


def fsync_latency(directory: Path, ops: int) -> Fsync:
    """4 KiB ``os.write`` + ``fdatasync`` to a growing file: ops/s and latency."""
    block = os.urandom(4096)
    path = directory / "fsync.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
    latencies = []
    try:
        began = time.perf_counter()
        for _ in range(ops):
            t = time.perf_counter()
            os.write(fd, block)
            os.fdatasync(fd)
            latencies.append(time.perf_counter() - t)
        seconds = time.perf_counter() - began
    finally:
        os.close(fd)
        path.unlink()
    latencies.sort()
    return Fsync(
        ops_per_s=round(ops / seconds),
        p50_ms=ms(common.percentile(latencies, 0.5)),
        p99_ms=ms(common.percentile(latencies, 0.99)),
        p999_ms=ms(common.percentile(latencies, 0.999)),
    )


def measure_limits(sizes: Sizes, scratch: Path, limits: Limits) -> None:
    """Every limit, in order, into ``limits``."""
    tcp = loopback_tcp(sizes.tcp_s)
    if tcp is None:
        limits.skipped["loopback_tcp"] = "iperf3 not installed"
    else:
        limits.mb_per_s["loopback_tcp"] = tcp
    limits.mb_per_s["write_nosync"] = sequential_write(scratch, sizes.write_mib, False)
    limits.mb_per_s["write_fsync"] = sequential_write(scratch, sizes.write_mib, True)
    limits.fsync["fsync_4k"] = fsync_latency(scratch, sizes.fsync_ops)
    for name, mb_per_s in limits.mb_per_s.items():
        say(f"  {name}: {mb_per_s} MB/s")
    say(f"  fsync_4k: {limits.fsync['fsync_4k']}")
