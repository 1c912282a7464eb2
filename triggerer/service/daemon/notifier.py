"""Listener notifications off the daemon's hot paths: a bounded queue drained into the listeners'
own process.

Ingest, the launcher, the REST API and pipeline reloads hand what they committed to
:class:`Notifier`, which only appends it to a queue. One task takes what is queued, looks up
what the events refer to (assets the registry does not hold, producing runs) and writes it to
the listeners' process (:mod:`triggerer.service.daemon.listener_process`), which calls the hooks; a
second task reads its acknowledgements. So a listener that is slow, blocks or burns CPU costs
the daemon nothing but the encoding of what it is sent.

The queue holds at most ``max_pending_events`` asset events, counting those sent and not yet
acknowledged. When the listeners cannot keep up and the queue is full, new events are not
queued for them: they are counted (``triggerer_listener_events_dropped_total``) and logged at
most every :data:`DROP_LOG_INTERVAL_S`. The events themselves are stored and their consumers
queued as always; only the notification is lost. The alternatives are worse: blocking ingest
would make one listener the throughput of the whole daemon, and an unbounded queue would let a
stuck listener grow the daemon's memory until it is killed. Definition changes (assets and
aliases created or changed) are few and always queued.

A listeners' process that exits (a listener called ``os._exit``, or crashed the interpreter) is
started again with backoff; what it had been sent and not acknowledged is counted as dropped.
"""

from __future__ import annotations

import subprocess
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING

import anyio
import structlog
from anyio.streams.buffered import BufferedByteReceiveStream

from triggerer.backoff import backoff_s
from triggerer.listeners import listener_manager
from triggerer.service import metrics
from triggerer.service.daemon.listener_process import (
    ACKS,
    command,
    encode_definitions,
    encode_events,
)
from triggerer.service.events import Origins, Recorded, origins
from triggerer.service.scheduling.registry import DefinitionChanges
from triggerer.service.store.outages import HEALTHY_AFTER_S, until_stored

if TYPE_CHECKING:
    from anyio.abc import ByteReceiveStream, ByteSendStream, Process
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

    from triggerer.assets import Asset
    from triggerer.service.config import LoggingSettings

log = structlog.get_logger(__name__)

DROP_LOG_INTERVAL_S = 10.0
RESTART_BACKOFF_MAX_S = 60.0
STOP_TIMEOUT_S = 5.0
MAX_ACK_BYTES = 1 << 20
DEFINITION_HOOKS = ("on_asset_created", "on_asset_alias_created", "on_asset_changed")

_Item = Recorded | DefinitionChanges


class Notifier:
    """Queues committed events and definition changes for the listener ``plugins`` (and those
    of the entry-point group), and feeds them to the listeners' process."""

    def __init__(
        self,
        plugins: Sequence[str],
        logging: LoggingSettings,
        sessions: async_sessionmaker[AsyncSession],
        known_assets: Callable[[], Mapping[int, Asset]],
        *,
        max_pending_events: int,
    ) -> None:
        # Imported here too, so a plugin that cannot be imported stops the daemon at start.
        manager = listener_manager(plugins)
        self._hears_events = bool(manager.hook.on_asset_event_emitted.get_hookimpls())
        self._hears_definitions = any(
            getattr(manager.hook, name).get_hookimpls() for name in DEFINITION_HOOKS
        )
        self._command = command(plugins, logging)
        self._sessions = sessions
        self._known_assets = known_assets
        self._max_pending_events = max_pending_events
        self._queued: deque[_Item] = deque()  # not yet sent
        self._sent: deque[_Item] = deque()  # sent, not yet acknowledged
        self._arrived = anyio.Event()
        self._pending_events = 0  # accepted, and not yet heard by every listener
        self._idle = anyio.Event()
        self._idle.set()
        self._dropped = 0  # since the last log of drops
        self._dropped_logged_at = -DROP_LOG_INTERVAL_S

    def events_recorded(self, recorded: Recorded) -> None:
        """Queue ``recorded`` (committed) for ``on_asset_event_emitted``, unless it is full."""
        count = len(recorded.events)
        if not self._hears_events or not count:
            return
        if self._pending_events + count > self._max_pending_events:
            self._drop(count)
            return
        self._pending_events += count
        metrics.LISTENER_PENDING.inc(count)
        self._queue(recorded)

    def definitions_changed(self, changes: DefinitionChanges) -> None:
        """Queue ``changes`` (committed) for the listeners of assets and aliases."""
        if self._hears_definitions and changes:
            self._queue(changes)

    async def drained(self) -> None:
        """Return once the listeners have heard everything queued so far."""
        await self._idle.wait()

    async def run(self) -> None:
        """Keep the listeners' process fed until cancelled; start it again when it exits."""
        if not (self._hears_events or self._hears_definitions):
            return
        attempt = 0
        try:
            while True:
                started = anyio.current_time()
                returncode = await self._serve_process()
                lost = self._lose_sent()
                healthy = anyio.current_time() - started > HEALTHY_AFTER_S
                attempt = 1 if healthy else attempt + 1
                delay = backoff_s(attempt, RESTART_BACKOFF_MAX_S, 1.0)
                log.error(
                    "listener_process_exited",
                    returncode=returncode,
                    lost_events=lost,
                    restart_in_s=round(delay, 2),
                )
                await anyio.sleep(delay)
        finally:
            self._log_drops()
            if self._pending_events:
                log.warning("listener_events_abandoned", events=self._pending_events)

    def _queue(self, item: _Item) -> None:
        self._idle = anyio.Event() if self._idle.is_set() else self._idle
        self._queued.append(item)
        self._arrived.set()

    def _drop(self, count: int) -> None:
        metrics.LISTENER_DROPPED.inc(count)
        self._dropped += count
        if time.monotonic() - self._dropped_logged_at >= DROP_LOG_INTERVAL_S:
            self._log_drops()

    def _log_drops(self) -> None:
        if self._dropped:
            log.warning(
                "listener_events_dropped",
                events=self._dropped,
                pending_events=self._pending_events,
                max_pending_events=self._max_pending_events,
            )
            self._dropped, self._dropped_logged_at = 0, time.monotonic()

    async def _serve_process(self) -> int | None:
        """Run the listeners' process until it exits; its exit code."""
        process = await anyio.open_process(
            self._command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None
        )
        stdin, stdout = process.stdin, process.stdout
        if stdin is None or stdout is None:
            raise RuntimeError("the listeners' process was started without pipes")
        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(self._read_acks, stdout, tasks.cancel_scope)
                await self._send(stdin)
        finally:
            with anyio.CancelScope(shield=True):
                await _stop(process)
        return process.returncode

    async def _send(self, stdin: ByteSendStream) -> None:
        """Write what is queued, oldest first (what a process that exited left too); wait for
        more. A process that is gone stops taking lines: the acknowledgements' reader then ends
        the process's turn."""
        try:
            while True:
                self._arrived = anyio.Event()
                while self._queued:
                    item = self._queued[0]
                    if isinstance(item, Recorded):
                        known = await until_stored(partial(self._origins, item), during="listen")
                        line = encode_events(item, known)
                    else:
                        line = encode_definitions(item)
                    await stdin.send(line)
                    self._sent.append(self._queued.popleft())
                await self._arrived.wait()
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            await anyio.sleep_forever()

    async def _read_acks(self, stdout: ByteReceiveStream, turn: anyio.CancelScope) -> None:
        lines = BufferedByteReceiveStream(stdout)
        try:
            while True:
                ack = ACKS.decode(await lines.receive_until(b"\n", MAX_ACK_BYTES))
                for hook, failed in ack.failures.items():
                    metrics.LISTENER_FAILURES.labels(hook).inc(failed)
                self._heard(self._sent.popleft())
        except (anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError):
            turn.cancel()  # the process has exited

    async def _origins(self, recorded: Recorded) -> Origins:
        """The assets and runs the events refer to; the store is read only for what the
        registry does not hold (assets created by runs) and for producing runs."""
        known = self._known_assets()
        if all(e.source_run_pk is None and e.asset_id in known for e in recorded.events):
            return Origins(known, {})
        async with self._sessions() as session:
            return await origins(session, [recorded], known)

    def _heard(self, item: _Item) -> None:
        if isinstance(item, Recorded):
            self._pending_events -= len(item.events)
            metrics.LISTENER_PENDING.dec(len(item.events))
        if not (self._queued or self._sent):
            self._idle.set()

    def _lose_sent(self) -> int:
        """What the exited process had not acknowledged is lost: counted as dropped."""
        lost = 0
        while self._sent:
            item = self._sent.popleft()
            if isinstance(item, Recorded):
                lost += len(item.events)
                metrics.LISTENER_DROPPED.inc(len(item.events))
            self._heard(item)
        return lost


async def _stop(process: Process) -> None:
    """Close the process's stdin (it finishes the item at hand and exits); kill it when it
    does not within :data:`STOP_TIMEOUT_S`."""
    if process.stdin is not None:
        await process.stdin.aclose()
    with anyio.move_on_after(STOP_TIMEOUT_S):
        await process.wait()
        return
    process.kill()
    await process.wait()
