"""Timing and statistics helpers of the daemon benchmarks: percentiles, and what this process,
another process or the whole machine spent (``/proc``)."""

from __future__ import annotations

import contextlib
import math
import os
import time
from pathlib import Path

from tests.e2e.daemon import stat_fields


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile: the smallest value with at least ``q``% of values at or below."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def spread_ms(values_s: list[float]) -> dict[str, float]:
    """p50, p99 and max of ``values_s``, in milliseconds."""
    values = [v * 1000 for v in values_s]
    return {
        "p50": round(percentile(values, 50), 1),
        "p99": round(percentile(values, 99), 1),
        "max": round(max(values), 1),
    }


def cpu_s() -> float:
    """CPU seconds of this process so far (the daemon's, when it runs in this process)."""
    return time.process_time()


def cpu_ticks() -> tuple[int, int]:
    """Busy and total CPU ticks of the whole machine (all processes, all CPUs)."""
    user, nice, system, idle, iowait, irq, softirq, steal = map(
        int, Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
    )
    busy = user + nice + system + irq + softirq + steal
    return busy, busy + idle + iowait


def machine_busy_percent(before: tuple[int, int]) -> float:
    """How busy the machine was since ``before`` (:func:`cpu_ticks`), in percent."""
    busy, total = cpu_ticks()
    return round(100 * (busy - before[0]) / max(1, total - before[1]), 1)


def process_status() -> dict[str, int]:
    """Threads and open file descriptors of this process."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name == "Threads":
            fields["threads"] = int(value)
    fields["open_fds"] = len(os.listdir("/proc/self/fd"))
    return fields


def process_rss_mb(pid: int) -> float:
    """Resident memory of process ``pid``."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def thread_activity(pid: int) -> dict[str, tuple[int, int]]:
    """For each thread of ``pid``: (context switches, CPU ticks) so far."""
    activity = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            status = (task / "status").read_text()
            switches = sum(
                int(line.split()[1]) for line in status.splitlines() if "ctxt_switches" in line
            )
            fields = stat_fields(task / "stat")
            activity[task.name] = (switches, int(fields[11]) + int(fields[12]))
    return activity
