"""Instrumentation for ``bench_daemon``: a ``Service`` that records when things happen, and
the small statistics and process measurements the benchmark reports.

The daemon's code runs unchanged: the subclass only wraps the callables ``serve()`` wires
together (ingest's commit, the scheduler's pass, the heartbeat, the run-created callback) and,
when asked, a KafkaTrigger's record handling and ``Launcher.run``.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple
from unittest import mock

import anyio

import triggerer.service.daemon.service as service_module
from tests.e2e.daemon import running_daemon
from triggerer.service.daemon.service import Service
from watchers.kafka import KafkaTrigger

if TYPE_CHECKING:
    from triggerer.service.config import Settings


class Commit(NamedTuple):
    """One ingest transaction: when it ran, events recorded so far, process CPU seconds."""

    started: float
    ended: float
    recorded: int
    cpu: float


class Probe:
    """What the instrumented daemon saw, with ``time.time()`` stamps; waiters wake on changes."""

    def __init__(self, *, launch_runs: bool = True, per_message: bool = False) -> None:
        self.launch_runs = launch_runs
        self.per_message = per_message
        self.service: Service | None = None
        self.consumed: dict[tuple[int, int], float] = {}
        self.committed: dict[tuple[int, int], float] = {}
        self.created: list[float] = []
        self.commits: list[Commit] = []
        self.scheduler_passes = 0
        self.heartbeats: list[tuple[float, float]] = []  # start, end
        self.lease_renewals: list[tuple[float, float]] = []  # start, end (inside heartbeats)
        self._changed = anyio.Event()

    def notify(self) -> None:
        self._changed.set()
        self._changed = anyio.Event()

    async def wait_created(self, count: int, timeout_s: float) -> None:
        await self.wait_until(lambda: len(self.created) >= count, timeout_s)

    async def wait_until(self, done: Callable[[], bool], timeout_s: float) -> None:
        with anyio.fail_after(timeout_s):
            while not done():
                await self._changed.wait()

    @property
    def running(self) -> Service:
        assert self.service is not None, "the daemon has not started"
        return self.service

    def triggers(self) -> list[Any]:
        return [watched.trigger for watched in self.running.registry.triggers.values()]


def _payload_key(payload: Any) -> tuple[int, int] | None:
    if isinstance(payload, dict) and "offset" in payload:
        return payload["partition"], payload["offset"]
    return None


@contextlib.contextmanager
def instrumented(probe: Probe) -> Iterator[None]:
    """``serve()`` builds an instrumented ``Service`` while this is active."""

    class InstrumentedService(Service):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            probe.service = self
            self._wrap_ingest()
            self._wrap_scheduler()
            self._wrap_heartbeat()
            if not probe.launch_runs:
                self.launcher.run = _no_launch  # type: ignore[method-assign]  # instrumenting

        def _run_created(self) -> None:
            probe.created.append(time.time())
            probe.notify()
            super()._run_created()

        async def reload(self, task_group: anyio.abc.TaskGroup) -> None:
            await super().reload(task_group)
            for trigger in probe.triggers():
                if not probe.per_message:
                    break
                if isinstance(trigger, KafkaTrigger) and "_event" not in vars(trigger):
                    stamped = _stamped_event(trigger._event, probe)
                    trigger._event = stamped  # type: ignore[method-assign]  # instrumenting

        def _wrap_ingest(self) -> None:
            commit = self.ingest._commit

            async def timed_commit(batch: list[Any]) -> None:
                started = time.time()
                await commit(batch)
                ended = time.time()
                for _, event in batch if probe.per_message else ():
                    key = _payload_key(event.payload)
                    if key is not None:
                        probe.committed.setdefault(key, ended)
                recorded = self.ingest.events_recorded
                probe.commits.append(Commit(started, ended, recorded, time.process_time()))
                probe.notify()

            self.ingest._commit = timed_commit  # type: ignore[method-assign]  # instrumenting

        def _wrap_scheduler(self) -> None:
            schedule = self.scheduler.schedule

            async def counted_schedule(*args: Any) -> int:
                probe.scheduler_passes += 1
                return await schedule(*args)

            self.scheduler.schedule = counted_schedule  # type: ignore[method-assign,assignment]  # instrumenting

        def _wrap_heartbeat(self) -> None:
            heartbeat = self.heartbeat
            leases = getattr(self, "leases", None)  # triggers that cannot be shared
            if leases is not None:
                renew = leases.renew

                async def timed_renew() -> set[str]:
                    started = time.time()
                    lost: set[str] = await renew()
                    probe.lease_renewals.append((started, time.time()))
                    return lost

                leases.renew = timed_renew

            async def timed_heartbeat() -> None:
                started = time.time()
                await heartbeat()
                probe.heartbeats.append((started, time.time()))

            self.heartbeat = timed_heartbeat  # type: ignore[method-assign]  # instrumenting

    with mock.patch.object(service_module, "Service", InstrumentedService):
        yield


async def _no_launch(task_group: anyio.abc.TaskGroup) -> None:
    """Replaces ``Launcher.run`` in the latency part: runs are created and stay queued."""


def _stamped_event(event: Callable[..., Any], probe: Probe) -> Callable[..., Any]:
    def stamped(record: Any, *args: Any) -> Any:
        probe.consumed.setdefault((record.partition, record.offset), time.time())
        return event(record, *args)

    return stamped


@contextlib.asynccontextmanager
async def daemon(settings: Settings, probe: Probe) -> AsyncIterator[Service]:
    with instrumented(probe):
        async with running_daemon(settings):
            yield probe.running


async def wait_assigned(probe: Probe, timeout_s: float = 120.0) -> None:
    """Until every KafkaTrigger of the daemon owns its partitions (group joins are not
    notified: poll them)."""
    with anyio.fail_after(timeout_s):
        while not all(  # noqa: ASYNC110 - group joins have no notification
            t.assignment for t in probe.triggers() if isinstance(t, KafkaTrigger)
        ):
            await anyio.sleep(0.1)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile: the smallest value with at least ``q``% of values at or below."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def spread_ms(values_s: list[float]) -> dict[str, float]:
    values = [v * 1000 for v in values_s]
    return {
        "p50": round(percentile(values, 50), 1),
        "p99": round(percentile(values, 99), 1),
        "max": round(max(values), 1),
    }


def cpu_s() -> float:
    return time.process_time()


def cpu_ticks() -> tuple[int, int]:
    """Busy and total CPU ticks of the whole machine (all processes, all CPUs)."""
    user, nice, system, idle, iowait, irq, softirq, steal = map(
        int, Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
    )
    busy = user + nice + system + irq + softirq + steal
    return busy, busy + idle + iowait


def machine_busy_percent(before: tuple[int, int]) -> float:
    busy, total = cpu_ticks()
    return round(100 * (busy - before[0]) / max(1, total - before[1]), 1)


def process_status() -> dict[str, int]:
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name == "Threads":
            fields["threads"] = int(value)
    fields["open_fds"] = len(os.listdir("/proc/self/fd"))
    return fields
