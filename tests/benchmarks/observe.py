"""What the daemon benchmarks see of a daemon running in their process, through surfaces it
offers; its code runs unchanged, nothing of it is wrapped or replaced.

- Its Prometheus metrics (:mod:`triggerer.service.metrics`), read from their collectors: ingest's
  commits and their seconds, message-to-committed seconds, scheduler passes, events stored,
  the watchers' gauges.
- Its store, through SQLAlchemy's event hooks (the library's public extension points, which see
  every session and connection of this process): when each run's transaction committed, each
  heartbeat (from the sign of life's read to the heartbeat's last query), each renewal of its
  leases; and a wake-up at every commit, so waiters need no polling.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio
from prometheus_client.metrics import MetricWrapperBase
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, object_session

from triggerer.service import metrics
from triggerer.service.store import models

# -- metrics


def metric_value(
    metric: MetricWrapperBase, sample: str, labels: Mapping[str, str] | None = None
) -> float:
    """The sum of ``metric``'s samples named ``sample`` whose labels include ``labels`` (0 when
    there is none): a counter's ``..._total``, a histogram's ``..._count`` or ``..._sum``."""
    wanted = (labels or {}).items()
    return sum(
        found.value
        for family in metric.collect()
        for found in family.samples
        if found.name == sample and wanted <= found.labels.items()
    )


def metric_series(metric: MetricWrapperBase) -> dict[tuple[tuple[str, str], ...], float]:
    """Each series of a labelled gauge or counter: its labels, and its value now."""
    return {
        tuple(sorted(found.labels.items())): found.value
        for family in metric.collect()
        for found in family.samples
        if not found.name.endswith("_created")
    }


def histogram(metric: MetricWrapperBase) -> tuple[int, float]:
    """A histogram's observations so far: how many, and their sum."""
    count, total = 0.0, 0.0
    for family in metric.collect():
        for found in family.samples:
            if found.name == f"{family.name}_count":
                count += found.value
            elif found.name == f"{family.name}_sum":
                total += found.value
    return int(count), total


TRIGGER = {"source": "trigger"}


def events_stored() -> int:
    """Events the daemons of this process committed from their watchers, so far."""
    stored = metric_value(metrics.EVENTS_STORED, "triggerer_events_stored_total", TRIGGER)
    return int(stored)


def last_events_at() -> dict[str, float]:
    """When each running watcher last yielded an event (``time.time()``), by trigger id: the
    gauge ``triggerer_watcher_last_event_age_seconds`` is its age at the moment it is read."""
    ages = metric_series(metrics.WATCHER_LAST_EVENT_AGE)
    now = time.time()
    return {
        dict(labels)["trigger_id"]: now - age for labels, age in ages.items() if not math.isnan(age)
    }


# -- the store


HEARTBEAT_STARTS = "SELECT instance."
"""``Service.heartbeat`` begins with its sign of life: the merge of this instance's row, which
reads it by id (``... FROM instance WHERE instance.id = ?``)."""
HEARTBEAT_ENDS = "GROUP BY queued_event.pipeline_id"
"""...and ends with its last query: the queued events per pipeline, for the metrics."""
LEASES_RENEWED = "UPDATE lease SET expires_at"
"""``Leases.renew``: every held lease in one statement, then the commit."""


class StoreWatch:
    """Commits to the stores of this process, seen through SQLAlchemy's events while the
    ``with`` block runs; :meth:`wait_until` wakes at every commit."""

    def __init__(self) -> None:
        self.runs: dict[str, float] = {}
        """Each run inserted, by run id: when its transaction committed (``time.time()``)."""
        self.heartbeats: list[tuple[float, float]] = []
        """Each heartbeat: (start, end)."""
        self.lease_renewals: list[tuple[float, float]] = []
        """Each renewal of the leases, inside a heartbeat: (its statement, its commit)."""
        self._beat_started: float | None = None
        self._renewal_started: float | None = None
        self._changed = anyio.Event()
        self._listeners: list[tuple[Any, str, Callable[..., None]]] = [
            (models.Run, "after_insert", self._run_inserted),
            (Session, "after_commit", self._committed),
            (Session, "after_rollback", self._rolled_back),
            (Engine, "before_cursor_execute", self._executing),
            (Engine, "after_cursor_execute", self._executed),
        ]

    def __enter__(self) -> StoreWatch:
        for target, name, listener in self._listeners:
            event.listen(target, name, listener)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for target, name, listener in self._listeners:
            event.remove(target, name, listener)

    async def wait_until(self, done: Callable[[], bool], timeout_s: float) -> None:
        """Until ``done()``, looked at after every commit; fails after ``timeout_s``."""
        with anyio.fail_after(timeout_s):
            while not done():
                await self._changed.wait()

    async def wait_runs(self, count: int, timeout_s: float) -> None:
        """Until ``count`` runs were committed since the watch began."""
        await self.wait_until(lambda: len(self.runs) >= count, timeout_s)

    async def wait_stored(self, count: int, timeout_s: float) -> None:
        """Until :func:`events_stored` reaches ``count``."""
        await self.wait_until(lambda: events_stored() >= count, timeout_s)

    async def next_commit(self) -> None:
        """Return after the next commit."""
        await self._changed.wait()

    # SQLAlchemy calls these in the thread of the event loop (the async engine runs the
    # session's work in greenlets there).

    def _run_inserted(self, mapper: Any, connection: Any, run: models.Run) -> None:
        session = object_session(run)
        if session is not None:
            session.info.setdefault(_INSERTED_RUNS, []).append(run.run_id)

    def _committed(self, session: Session) -> None:
        now = time.time()
        for run_id in session.info.pop(_INSERTED_RUNS, ()):
            self.runs[run_id] = now
        if self._renewal_started is not None:
            self.lease_renewals.append((self._renewal_started, now))
            self._renewal_started = None
        self._changed.set()
        self._changed = anyio.Event()

    def _rolled_back(self, session: Session) -> None:
        session.info.pop(_INSERTED_RUNS, None)

    def _executing(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.startswith(HEARTBEAT_STARTS) and "WHERE instance.id" in statement:
            self._beat_started = time.time()
        elif statement.startswith(LEASES_RENEWED) and self._beat_started is not None:
            self._renewal_started = time.time()

    def _executed(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if self._beat_started is not None and statement.endswith(HEARTBEAT_ENDS):
            self.heartbeats.append((self._beat_started, time.time()))
            self._beat_started = None


_INSERTED_RUNS = "bench_inserted_runs"


# -- ingest


@dataclass(frozen=True)
class Progress:
    """Ingest as of one moment, counted from when the :class:`IngestLog` began."""

    at: float
    recorded: int
    commits: int
    committing_s: float
    cpu_s: float


class IngestLog:
    """Ingest's progress after each of its commits, from the daemon's metrics (events stored,
    commits, seconds spent committing) and this process's CPU time: :meth:`run` it in a task."""

    def __init__(self, watch: StoreWatch) -> None:
        self._watch = watch
        self._base = self._now(None)
        self._changed = anyio.Event()
        self.progress: list[Progress] = []

    async def run(self) -> None:
        while True:
            await self._watch.next_commit()
            # Up to date by now: ingest counts a batch right after its commit returns, with no
            # await in between, and this task runs only once ingest's task awaits again.
            now = self._now(self._base)
            if not self.progress or now.recorded > self.progress[-1].recorded:
                self.progress.append(now)
                self._changed.set()
                self._changed = anyio.Event()

    async def wait_recorded(self, count: int, timeout_s: float) -> Progress:
        """The first moment at least ``count`` events were stored, once it has come."""
        with anyio.fail_after(timeout_s):
            while not self.progress or self.progress[-1].recorded < count:
                await self._changed.wait()
        return self.first(count)

    def first(self, recorded: float) -> Progress:
        """The first moment at least ``recorded`` events were stored."""
        return next(p for p in self.progress if p.recorded >= recorded)

    @staticmethod
    def _now(base: Progress | None) -> Progress:
        commits, committing_s = histogram(metrics.INGEST_COMMIT)
        now = Progress(time.time(), events_stored(), commits, committing_s, time.process_time())
        if base is None:
            return now
        return Progress(
            now.at,
            now.recorded - base.recorded,
            now.commits - base.commits,
            now.committing_s - base.committing_s,
            now.cpu_s,
        )
