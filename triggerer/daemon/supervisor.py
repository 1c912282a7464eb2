"""The supervisor: one task per trigger instance, restarted with backoff when it fails."""

from __future__ import annotations

import dataclasses
import traceback
from datetime import datetime
from typing import TYPE_CHECKING

import anyio
import structlog
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectSendStream

from triggerer.daemon.backoff import backoff_s
from triggerer.store.models import TriggerState
from triggerer.store.types import utcnow
from triggerer.triggers import load_trigger

if TYPE_CHECKING:
    from triggerer.daemon.ingest import Delivery
    from triggerer.daemon.registry import WatchedTrigger

log = structlog.get_logger(__name__)

CLEANUP_TIMEOUT_S = 10.0
HEALTHY_AFTER_S = 60.0


@dataclasses.dataclass
class WatcherStatus:
    """What ``/watchers`` and ``triggerer`` output show about one trigger instance."""

    state: str = TriggerState.STARTING
    last_poll_at: datetime | None = None
    last_error: str | None = None
    restart_count: int = 0


class Supervisor:
    """Runs every trigger of the registry and follows registry changes."""

    def __init__(self, deliveries: MemoryObjectSendStream[Delivery], backoff_max_s: float) -> None:
        self._deliveries = deliveries
        self._backoff_max_s = backoff_max_s
        self._scopes: dict[int, anyio.CancelScope] = {}
        self._keys: dict[int, str] = {}
        self.status: dict[int, WatcherStatus] = {}

    def update(self, task_group: TaskGroup, triggers: dict[int, WatchedTrigger]) -> None:
        """Start new triggers, restart changed ones, stop removed ones."""
        for trigger_id in list(self._scopes):
            watched = triggers.get(trigger_id)
            if watched is None or repr(watched.asset_ids) != self._keys[trigger_id]:
                self._scopes.pop(trigger_id).cancel()
                self.status.pop(trigger_id, None)
        for trigger_id, watched in triggers.items():
            if trigger_id not in self._scopes:
                scope = anyio.CancelScope()
                self._scopes[trigger_id] = scope
                self._keys[trigger_id] = repr(watched.asset_ids)
                self.status[trigger_id] = WatcherStatus()
                task_group.start_soon(self._supervise, watched, scope, self._deliveries.clone())

    def stop(self) -> None:
        """Stop every trigger; their streams close, so ingest drains and ends."""
        for scope in self._scopes.values():
            scope.cancel()
        self._scopes.clear()
        self._deliveries.close()

    async def _supervise(
        self,
        watched: WatchedTrigger,
        scope: anyio.CancelScope,
        deliveries: MemoryObjectSendStream[Delivery],
    ) -> None:
        status = self.status[watched.trigger_id]
        structlog.contextvars.bind_contextvars(trigger_id=watched.trigger_id)
        trigger = watched.trigger
        with deliveries, scope:
            while True:
                started = anyio.current_time()
                status.state = TriggerState.RUNNING
                try:
                    async for event in trigger.run():
                        status.last_poll_at = utcnow()
                        await deliveries.send((watched, event))
                    raise RuntimeError("trigger run() returned; it must run until cancelled")
                # The supervisor is the one place that catches everything: a failing trigger is
                # user or broker trouble that must be restarted, never the daemon's end.
                except Exception as error:  # noqa: BLE001
                    status.restart_count += 1
                    status.state = TriggerState.BACKOFF
                    status.last_error = "".join(traceback.format_exception_only(error)).strip()
                    attempt = (
                        1
                        if anyio.current_time() - started > HEALTHY_AFTER_S
                        else status.restart_count
                    )
                    delay = backoff_s(attempt, self._backoff_max_s, base_s=1.0)
                    log.warning(
                        "trigger_failed", error=status.last_error, retry_in_s=round(delay, 2)
                    )
                finally:
                    with anyio.move_on_after(CLEANUP_TIMEOUT_S, shield=True):
                        await trigger.cleanup()
                await anyio.sleep(delay)
                trigger = load_trigger(*trigger.serialize())
        status.state = TriggerState.STOPPED
