"""Measuring helpers shared by the benchmark scripts (not a benchmark itself).

Ports, a ``headrace serve`` child with chosen listeners, percentiles, a
process's CPU time and memory from ``/proc``, and the machine description
that goes beside every figure.
"""

from __future__ import annotations

import os
import platform
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

LISTENERS = (
    "controller",
    "segment-store",
    "tank",
    "lumberjack",
    "lumberjack-tls",
    "rsio",
    "http",
)
"""Every ``headrace serve`` listener flag (``--<name>-port``; 0 disables)."""

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_connectable(proc: subprocess.Popen[bytes], port: int, deadline: float) -> None:
    """Return once ``port`` accepts a connection; fail if ``proc`` exits first."""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return
        except OSError:
            time.sleep(0.05)  # polling a port under a deadline
    proc.kill()
    raise SystemExit(f"nothing listened on {port} within {START_TIMEOUT_S:.0f} s")


def start_headrace(
    data_dir: Path, listeners: dict[str, int], fsync: str = "always"
) -> subprocess.Popen[bytes]:
    """``python -m headrace serve`` with only ``listeners`` (name -> port) enabled."""
    command = [sys.executable, "-m", "headrace", "serve", "--data-dir", str(data_dir)]
    command += ["--fsync", fsync]
    for name in LISTENERS:
        command += [f"--{name}-port", str(listeners.get(name, 0))]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + START_TIMEOUT_S
    for port in listeners.values():
        wait_connectable(proc, port, deadline)
    return proc


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after ``STOP_TIMEOUT_S``."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def percentile(sorted_values: list[float], fraction: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, int(fraction * len(sorted_values)))
    return sorted_values[index]


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux ``/proc``), 0 elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def memory_kib(pid: int) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` (peak RSS) of a process in KiB; empty if unknown."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    return {m[1]: int(m[2]) for m in re.finditer(r"^(VmRSS|VmHWM):\s+(\d+) kB", text, re.M)}


def loadavg() -> float:
    return os.getloadavg()[0]


def machine() -> dict[str, object]:
    """What the figures were measured on."""
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    described: dict[str, object] = {
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "memory_gib": round(mem_gib, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
    }
    guest = guest_settings()
    if guest:
        described["guest"] = guest
    return described


GUEST_SETTINGS = {
    "cpuidle_governor": "/sys/devices/system/cpu/cpuidle/current_governor",
    "guest_halt_poll_ns": "/sys/module/haltpoll/parameters/guest_halt_poll_ns",
    "page_reporting_order": "/sys/module/page_reporting/parameters/page_reporting_order",
}
"""Virtual-machine settings that move the figures (``docs/benchmarks.md#vm``):
whether an idle vCPU polls before it halts (with
``guest_halt_poll_ns`` 0 every wake-up from idle goes through the host, which
sets the latency rows' tail), and whether free memory is handed back to the host
(free page reporting: page-cache pages allocated from it fault in the host on
first write, which sets the no-fsync 10 KiB rows)."""


def guest_settings() -> dict[str, str]:
    """The ``GUEST_SETTINGS`` this machine has (none on bare metal, as a rule)."""
    found = {}
    for name, path in GUEST_SETTINGS.items():
        try:
            found[name] = Path(path).read_text().strip()
        except OSError:
            continue
    if found.get("cpuidle_governor") != "haltpoll":
        found.pop("guest_halt_poll_ns", None)  # the module's knob only counts under its governor
    return found


def filesystem_of(path: Path) -> str:
    """``device fstype`` of the mount holding ``path`` (from ``/proc/mounts``)."""
    best = ("", "?", "?")
    try:
        resolved = str(path.resolve())
        for line in Path("/proc/mounts").read_text().splitlines():
            device, mount, fstype = line.split()[:3]
            if resolved.startswith(mount) and len(mount) >= len(best[0]):
                best = (mount, device, fstype)
    except OSError:
        pass
    return f"{best[1]} {best[2]}"
