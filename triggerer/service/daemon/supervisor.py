"""The supervisor: one task per trigger instance, restarted with backoff when it fails."""

from __future__ import annotations

import dataclasses
import traceback
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING

import anyio
import structlog
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectSendStream

from triggerer.backoff import backoff_s
from triggerer.service import metrics
from triggerer.service.store.failures import STORE_ERRORS
from triggerer.service.store.models import NAME_LENGTH
from triggerer.service.store.outages import HEALTHY_AFTER_S, until_stored
from triggerer.service.store.states import TriggerState
from triggerer.service.store.types import storable_text, utcnow
from triggerer.triggers import (
    SOURCE_MISSING_RETRY_MAX_S,
    BaseEventTrigger,
    SourceMissing,
    load_trigger,
)

if TYPE_CHECKING:
    from triggerer.service.daemon.backpressure import Backpressure
    from triggerer.service.daemon.ingest import Delivery
    from triggerer.service.daemon.leases import Leases
    from triggerer.service.scheduling.registry import WatchedTrigger

log = structlog.get_logger(__name__)

CLEANUP_TIMEOUT_S = 10.0


@dataclasses.dataclass
class WatcherStatus:
    """What ``/watchers`` and ``triggerer`` output show about one trigger instance."""

    state: str = TriggerState.STARTING
    #: When the trigger last asked its source (its ``last_poll_at``, read at each heartbeat),
    #: never before its last event: a trigger that does not say polls at each event.
    last_poll_at: datetime | None = None
    last_event_at: datetime | None = None
    last_error: str | None = None
    last_error_at: datetime | None = None
    restart_count: int = 0
    lag: int | None = None
    reads_as: str | None = None
    #: The pipeline whose full backlog holds the watcher back (see ``backpressure``).
    held_by: str | None = None


class Supervisor:
    """Runs every trigger of the registry and follows registry changes."""

    def __init__(
        self,
        deliveries: MemoryObjectSendStream[Delivery],
        leases: Leases,
        backpressure: Backpressure,
        *,
        backoff_max_s: float,
        lease_poll_s: float,
        drain_timeout_s: float,
    ) -> None:
        self._deliveries = deliveries
        self._leases = leases
        self._backpressure = backpressure
        self._backoff_max_s = backoff_max_s
        self._lease_poll_s = lease_poll_s
        self._drain_timeout_s = drain_timeout_s
        self._stopping = False
        self._drained = anyio.Event()
        self._scopes: dict[int, anyio.CancelScope] = {}
        self._attempts: dict[int, anyio.CancelScope] = {}
        self._running: dict[int, BaseEventTrigger] = {}
        self._keys: dict[int, str] = {}
        self.status: dict[int, WatcherStatus] = {}

    def update(self, task_group: TaskGroup, triggers: dict[int, WatchedTrigger]) -> None:
        """Start new triggers, restart changed ones, stop removed ones."""
        for trigger_id in list(self._scopes):
            watched = triggers.get(trigger_id)
            if watched is None or repr(watched.asset_ids) != self._keys[trigger_id]:
                self._scopes.pop(trigger_id).cancel()
                self.status.pop(trigger_id, None)
                if watched is None:
                    metrics.watcher_stopped(trigger_id)
        for trigger_id, watched in triggers.items():
            if trigger_id not in self._scopes:
                scope = anyio.CancelScope()
                self._scopes[trigger_id] = scope
                self._keys[trigger_id] = repr(watched.asset_ids)
                self.status[trigger_id] = WatcherStatus()
                kind = type(watched.trigger).__name__
                metrics.watcher_started(trigger_id, kind, self.status[trigger_id])
                task_group.start_soon(self._supervise, watched, scope, self._deliveries.clone())

    def sample(self) -> None:
        """Copy each running trigger's ``lag``, ``reads_as`` and ``last_poll_at`` into its
        status, for the heartbeat to report, and its ``lag_by_partition`` into the metrics."""
        for trigger_id, trigger in self._running.items():
            status = self.status.get(trigger_id)
            if status is None:
                continue  # being stopped
            # ``lag`` may be a user's property: whatever it raises, the trigger runs on and the
            # heartbeat reports its lag as unknown.
            try:
                lag, reads_as = trigger.lag, trigger.reads_as
                by_partition = _partition_lags(trigger.lag_by_partition)
            except Exception as error:  # noqa: BLE001
                log.warning("trigger_lag_failed", trigger_id=trigger_id, error=repr(error))
                lag, reads_as, by_partition = None, None, {}
            status.lag = lag if isinstance(lag, int) else None
            # A user's property: text the store can hold, in the column's length.
            status.reads_as = (
                storable_text(reads_as)[:NAME_LENGTH] if isinstance(reads_as, str) else None
            )
            metrics.partition_lag(trigger_id, by_partition)
            _sample_poll(trigger_id, trigger, status)

    def leases_lost(self, names: set[str]) -> None:
        """Another instance took these leases over: stop running their triggers here."""
        for trigger_id, attempt in self._attempts.items():
            if lease_name(trigger_id) in names:
                log.warning("trigger_lease_lost", trigger_id=trigger_id)
                attempt.cancel()

    def stop(self) -> None:
        """Stop every trigger's polling; their streams close, so ingest drains and ends.

        A trigger's cleanup then waits for :meth:`drained` (at most the drain timeout): the
        acks of the events ingest still holds land first, so the final Kafka commit or SQS
        delete covers them and a restart delivers none of them again.
        """
        self._stopping = True
        for trigger_id, scope in self._scopes.items():
            scope.cancel()
            metrics.watcher_stopped(trigger_id)
        self._scopes.clear()
        self._deliveries.close()

    def drained(self) -> None:
        """Ingest has committed and acked everything it took: triggers may clean up."""
        self._drained.set()

    async def _supervise(
        self,
        watched: WatchedTrigger,
        scope: anyio.CancelScope,
        deliveries: MemoryObjectSendStream[Delivery],
    ) -> None:
        status = self.status[watched.trigger_id]
        structlog.contextvars.bind_contextvars(trigger_id=watched.trigger_id)
        with deliveries, scope:
            first = True
            while True:
                try:
                    exclusive = not watched.trigger.shareable
                # ``shareable`` may be a user's property: whatever it raises fails this watcher
                # alone, tried again after a backoff like a failed run.
                except Exception as error:  # noqa: BLE001
                    delay = self._failed(watched.trigger_id, status, error, anyio.current_time())
                else:
                    if exclusive:
                        await self._lease(watched.trigger_id, status)
                    delay = await self._attempt(watched, status, deliveries, rebuild=not first)
                    first = False
                await anyio.sleep(delay)
        status.state = TriggerState.STOPPED
        name = lease_name(watched.trigger_id)
        if name in self._leases.held:  # stopped, its acks done: no need to wait for expiry
            with anyio.CancelScope(shield=True):
                try:
                    await self._leases.release(name)
                except STORE_ERRORS as error:  # it expires on its own
                    log.warning("lease_release_failed", lease=name, error=str(error)[:200])

    async def _lease(self, trigger_id: int, status: WatcherStatus) -> None:
        status.state = TriggerState.STARTING
        name = lease_name(trigger_id)
        # A lease frees up only by expiring in another process: polling is the honest wait.
        while not await until_stored(lambda: self._leases.claim(name), during="lease"):  # noqa: ASYNC110
            await anyio.sleep(self._lease_poll_s)

    async def _attempt(
        self,
        watched: WatchedTrigger,
        status: WatcherStatus,
        deliveries: MemoryObjectSendStream[Delivery],
        *,
        rebuild: bool,
    ) -> float:
        """Run the trigger once (a new instance after a failure); the seconds to wait before
        the next attempt."""
        started = anyio.current_time()
        status.state = TriggerState.RUNNING
        trigger: BaseEventTrigger | None = None
        failure: Exception | None = None
        try:
            with anyio.CancelScope() as attempt:
                self._attempts[watched.trigger_id] = attempt
                trigger = load_trigger(*watched.trigger.serialize()) if rebuild else watched.trigger
                self._running[watched.trigger_id] = trigger
                async for event in trigger.run():
                    status.last_poll_at = utcnow()
                    if not event.is_checkpoint_only:  # its place moved: no event came
                        status.last_event_at = status.last_poll_at
                    if not event.is_checkpoint_only:
                        await self._backpressure.take(watched.trigger_id, status)
                    try:
                        # No trip through the event loop per event while the stream has room:
                        # the trigger's own awaits (a poll) are where others get their turn.
                        deliveries.send_nowait((watched, event))
                    except anyio.WouldBlock:
                        await deliveries.send((watched, event))
                raise RuntimeError("trigger run() returned; it must run until cancelled")
        # The supervisor is the one place that catches everything: a failing trigger (or one
        # that cannot be rebuilt from its serialize()) is user or broker trouble that must be
        # restarted, never the daemon's end.
        except Exception as error:  # noqa: BLE001
            failure = error
        finally:
            self._attempts.pop(watched.trigger_id, None)
            self._running.pop(watched.trigger_id, None)
            status.lag = None  # unknown until the trigger runs again
            metrics.partition_lag(watched.trigger_id, {})
            if self._stopping:
                deliveries.close()  # ingest ends once every trigger's stream is closed
                with anyio.move_on_after(self._drain_timeout_s, shield=True):
                    await self._drained.wait()
            if trigger is not None:
                cleanup_failure = await _clean_up(trigger)
                failure = failure or cleanup_failure
        if failure is None:
            return 0.0  # its lease was lost: wait for it again
        return self._failed(watched.trigger_id, status, failure, started)

    def _failed(
        self, trigger_id: int, status: WatcherStatus, error: Exception, started: float
    ) -> float:
        """Count a failed attempt that began at ``started``; the seconds to wait before the
        next one."""
        status.restart_count += 1
        metrics.watcher_restarted(trigger_id)
        status.state = TriggerState.BACKOFF
        status.last_error = _described(error)
        status.last_error_at = utcnow()
        healthy = anyio.current_time() - started > HEALTHY_AFTER_S
        attempt = 1 if healthy else status.restart_count
        # A source that does not exist yet is usually made soon, by hand or by its first
        # message: it is looked for again every few seconds, not after a minute's backoff.
        missing = isinstance(error, SourceMissing)
        max_s = self._backoff_max_s
        if missing:
            max_s = min(max_s, SOURCE_MISSING_RETRY_MAX_S)
        delay = backoff_s(attempt, max_s, 1.0)
        log.warning(
            "trigger_failed",
            error=status.last_error,
            source_missing=missing,
            retry_in_s=round(delay, 2),
        )
        return delay


def _sample_poll(trigger_id: int, trigger: BaseEventTrigger, status: WatcherStatus) -> None:
    """Move the status's last poll up to the trigger's ``last_poll_at``."""
    # A user's override may raise or return anything: the last poll stays as it was.
    try:
        polled = trigger.last_poll_at
    except Exception as error:  # noqa: BLE001
        log.warning("trigger_last_poll_failed", trigger_id=trigger_id, error=repr(error))
        return
    if polled is None:
        return
    if not (isinstance(polled, datetime) and polled.tzinfo is not None):
        shape = f"last_poll_at must be an aware datetime, not {polled!r}"
        log.warning("trigger_last_poll_failed", trigger_id=trigger_id, error=shape)
        return
    if status.last_poll_at is None or polled > status.last_poll_at:
        status.last_poll_at = polled


async def _clean_up(trigger: BaseEventTrigger) -> Exception | None:
    """Call ``trigger.cleanup()`` (shielded, for at most ``CLEANUP_TIMEOUT_S``); what it raised."""
    with anyio.move_on_after(CLEANUP_TIMEOUT_S, shield=True):
        try:
            await trigger.cleanup()
        # User code that runs as an attempt ends, or is cancelled: whatever it raises fails
        # that attempt (or is only logged, when the watcher stops), never the daemon.
        except Exception as error:  # noqa: BLE001
            log.warning(
                "trigger_cleanup_failed",
                trigger=trigger.classpath(),
                error=_described(error),
            )
            return error
    return None


def _described(error: Exception) -> str:
    """``error`` on a line of text the store can hold (its message may hold anything)."""
    return storable_text("".join(traceback.format_exception_only(error)).strip())


def lease_name(trigger_id: int) -> str:
    return f"trigger:{trigger_id}"


def _partition_lags(value: object) -> dict[tuple[str, int], int]:
    """A trigger's ``lag_by_partition`` as the metrics take it; a value of another shape (a
    user's property) raises, naming what it holds."""
    shape = "lag_by_partition must map (topic, partition) to a lag in messages"
    if not isinstance(value, Mapping):
        raise TypeError(f"{shape}, not {type(value).__name__}")
    lags = dict(value)
    for key, lag in lags.items():
        match key, lag:
            case (str(), int()), int():
                pass
            case _:
                raise TypeError(f"{shape}; got {key!r}: {lag!r}")
    return lags
