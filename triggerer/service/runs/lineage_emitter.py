"""OpenLineage run events off the daemon's hot paths: a bounded queue drained by one task that
sends through the OpenLineage client's transport in a worker thread.

The launcher tells :class:`LineageEmitter` when a run starts and when it ends, which only
appends to a queue. One task takes each change in turn, reads the run's inputs, outputs and
parent from the store, builds the event (:mod:`triggerer.service.runs.openlineage`) and hands it to
the transport in a thread: HTTP (Marquez or any OpenLineage endpoint), a file of JSON lines,
Kafka, or the console (the daemon's log). A backend that is slow or away costs the daemon
nothing but waiting changes: every send is bounded by the transport's timeout (``[openlineage]
timeout_s`` per HTTP attempt, with the client's retries; Kafka's delivery timeout), and at most
``max_pending_events`` changes wait. Beyond that they are dropped, counted
(``triggerer_openlineage_events_total{outcome="dropped"}``) and logged at most every
:data:`DROP_LOG_INTERVAL_S`; a send that fails is logged (``openlineage_send_failed``) and
counted, and the next one is tried. Runs and ingest never wait for lineage.

Per run, not per try: the first try's start sends ``START``, the run's end ``COMPLETE``,
``FAIL`` or (a cancelled run) ``ABORT``; a try that fails with tries left sends nothing, as the
run goes on. OpenLineage asks one START and one terminal event per run, and the run is what
consumed the events and emitted the outlets. A try interrupted by shutdown runs again from try
1, so its run sends ``START`` again, under the same run id.

The client's import takes a second, so it is imported in a thread, and only when enabled. The
transport is made by :meth:`LineageEmitter.start`, before the daemon runs: a setting it refuses
(a file that cannot be appended to, a producer setting librdkafka rejects) stops the start with
a :class:`~triggerer.service.config.ConfigError` naming it, rather than the running daemon.
"""

from __future__ import annotations

import re
import time
from collections import deque
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
import structlog
from sqlalchemy import select
from sqlalchemy.orm import aliased

from triggerer.service import metrics
from triggerer.service.config import ConfigError
from triggerer.service.store import models
from triggerer.service.store.outages import until_stored
from triggerer.service.store.types import utcnow

if TYPE_CHECKING:
    from datetime import datetime

    from openlineage.client.transport import Transport
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

    from triggerer.service.config import OpenLineageSettings
    from triggerer.service.runs.openlineage import EventType, RunLineage

log = structlog.get_logger(__name__)

DROP_LOG_INTERVAL_S = 10.0
CLOSE_TIMEOUT_S = 5.0

_SECRET_SETTING = re.compile(r"password|secret|\.pem$|oauthbearer\.config")
"""The librdkafka settings whose values an error message never shows."""

_END_EVENTS: dict[str, EventType] = {"success": "COMPLETE", "failed": "FAIL", "cancelled": "ABORT"}
"""The OpenLineage event of each state that ends a run (other states end a try, not the run)."""


@dataclass(frozen=True)
class _Change:
    run_pk: int
    event_type: EventType
    at: datetime


class LineageEmitter:
    """Queues runs' starts and ends and sends them as OpenLineage run events (does nothing
    unless ``settings.enabled``)."""

    def __init__(
        self, settings: OpenLineageSettings, sessions: async_sessionmaker[AsyncSession]
    ) -> None:
        self._settings = settings
        self._sessions = sessions
        self._transport: Transport | None = None  # made by start()
        self._queued: deque[_Change] = deque()
        self._arrived = anyio.Event()
        self._idle = anyio.Event()
        self._idle.set()
        self._failing = anyio.Event()  # set while the latest send failed
        # One send at a time, in order: a run's START goes before its end.
        self._sending = anyio.CapacityLimiter(1)
        self._dropped = 0  # since the last log of drops
        self._dropped_logged_at = -DROP_LOG_INTERVAL_S

    def run_started(self, run_pk: int, try_number: int) -> None:
        """A try of the run ``run_pk`` started: its first try starts the OpenLineage run."""
        if try_number == 1:
            self._queue(_Change(run_pk, "START", utcnow()))

    def run_ended(self, run_pk: int, state: str) -> None:
        """A try of ``run_pk`` ended, leaving the run in ``state`` (its end when final)."""
        event_type = _END_EVENTS.get(state)
        if event_type is not None:
            self._queue(_Change(run_pk, event_type, utcnow()))

    async def drained(self) -> None:
        """Return once everything queued so far was sent, or once a send fails: a backend that
        is away would only hold up the shutdown that waits for this."""

        async def first(event: anyio.Event) -> None:
            await event.wait()
            waiting.cancel_scope.cancel()

        async with anyio.create_task_group() as waiting:
            waiting.start_soon(first, self._idle)
            waiting.start_soon(first, self._failing)

    async def start(self) -> None:
        """Make the transport (nothing unless enabled); a setting it refuses raises
        :class:`ConfigError` naming it. Awaited before :meth:`run`, outside the daemon's task
        group, so a bad setting stops the start instead of the running daemon."""
        if not self._settings.enabled:
            return
        self._transport = await anyio.to_thread.run_sync(make_transport, self._settings)
        log.info(
            "openlineage_enabled",
            transport=self._settings.transport,
            namespace=self._settings.namespace,
        )

    async def run(self) -> None:
        """Send what is queued until cancelled (once :meth:`start` made the transport)."""
        if not self._settings.enabled:
            return
        transport = self._transport
        if transport is None:
            raise RuntimeError("LineageEmitter.run() needs LineageEmitter.start() first")
        try:
            while True:
                self._arrived = anyio.Event()
                while self._queued:
                    await self._send(transport, self._queued[0])
                    self._queued.popleft()
                    if not self._queued:
                        self._idle.set()
                await self._arrived.wait()
        finally:
            self._log_drops()
            if self._queued:
                log.warning("openlineage_events_abandoned", events=len(self._queued))
            with anyio.CancelScope(shield=True), anyio.move_on_after(CLOSE_TIMEOUT_S):
                await anyio.to_thread.run_sync(
                    transport.close, CLOSE_TIMEOUT_S, abandon_on_cancel=True
                )

    def _queue(self, change: _Change) -> None:
        if not self._settings.enabled:
            return
        if len(self._queued) >= self._settings.max_pending_events:
            metrics.OPENLINEAGE_EVENTS.labels("dropped").inc()
            self._dropped += 1
            if time.monotonic() - self._dropped_logged_at >= DROP_LOG_INTERVAL_S:
                self._log_drops()
            return
        self._idle = anyio.Event() if self._idle.is_set() else self._idle
        self._queued.append(change)
        self._arrived.set()

    def _log_drops(self) -> None:
        if self._dropped:
            log.warning(
                "openlineage_events_dropped",
                events=self._dropped,
                max_pending_events=self._settings.max_pending_events,
            )
            self._dropped, self._dropped_logged_at = 0, time.monotonic()

    async def _send(self, transport: Transport, change: _Change) -> None:
        from triggerer.service.runs.openlineage import run_event  # imported by make_transport

        read = await until_stored(partial(self._lineage, change.run_pk), during="openlineage")
        if read is None:  # its pipeline, and so the run, was deleted meanwhile
            return
        lineage, error = read
        namespace, failed = self._settings.namespace, change.event_type == "FAIL"
        event = run_event(
            lineage, change.event_type, change.at, namespace, error=error if failed else None
        )
        try:
            await anyio.to_thread.run_sync(
                transport.emit, event, limiter=self._sending, abandon_on_cancel=True
            )
        # A fault boundary around a third-party transport, like the supervisor's around a
        # watcher: the transports raise what their libraries raise (requests' errors, ValueError
        # and RuntimeError from the HTTP client, RuntimeError wrapping any error of the file or
        # fsspec, confluent-kafka's KafkaException and BufferError, an auth token provider's
        # own), a set no tuple here can keep up with. A lineage backend that fails must not stop
        # the daemon, only its event.
        except Exception as error:  # noqa: BLE001
            metrics.OPENLINEAGE_EVENTS.labels("failed").inc()
            self._failing.set()
            log.warning(
                "openlineage_send_failed",
                run_id=lineage.run_id,
                event_type=change.event_type,
                transport=self._settings.transport,
                error=str(error) or type(error).__name__,
            )
        else:
            metrics.OPENLINEAGE_EVENTS.labels("sent").inc()
            if self._failing.is_set():
                self._failing = anyio.Event()

    async def _lineage(self, run_pk: int) -> tuple[RunLineage, str | None] | None:
        """The run's lineage as stored, and its error; ``None`` when the run is gone."""
        from triggerer.service.runs.openlineage import ParentRun, RunLineage

        async with self._sessions() as session:
            run = await session.get(models.Run, run_pk)
            if run is None:
                return None
            producer = aliased(models.Run)
            consumed = await session.execute(
                select(models.Asset.uri, producer.run_id, producer.pipeline_id)
                .select_from(models.RunEvent)
                .join(models.AssetEvent, models.AssetEvent.id == models.RunEvent.event_id)
                .join(models.Asset, models.Asset.id == models.AssetEvent.asset_id)
                .outerjoin(producer, producer.id == models.AssetEvent.source_run_pk)
                .where(models.RunEvent.run_pk == run_pk)
                .order_by(models.AssetEvent.id)
            )
            emitted = await session.scalars(
                select(models.Asset.uri)
                .join(models.AssetEvent, models.AssetEvent.asset_id == models.Asset.id)
                .where(models.AssetEvent.source_run_pk == run_pk)
                .order_by(models.AssetEvent.id)
            )
            inputs, parent = [], None
            for uri, parent_run_id, parent_pipeline_id in consumed.all():
                inputs.append(uri)
                if parent_run_id is not None:  # the latest triggering event's producer wins
                    parent = ParentRun(parent_run_id, parent_pipeline_id)
            lineage = RunLineage(
                run.run_id, run.pipeline_id, tuple(inputs), tuple(emitted.all()), parent
            )
            return lineage, run.error


def make_transport(settings: OpenLineageSettings) -> Transport:
    """The OpenLineage client's transport that ``settings`` describe (imports the client); a
    setting the transport refuses raises :class:`ConfigError` naming the key and its value."""
    transport: Any
    if settings.transport == "http":
        from openlineage.client.transport.http import HttpConfig, HttpTransport

        params: dict[str, Any] = {
            "url": settings.url,
            "endpoint": settings.endpoint,
            "timeout": settings.timeout_s,
        }
        if settings.api_key:
            params["auth"] = {"type": "api_key", "apiKey": settings.api_key}
        try:
            transport = HttpTransport(HttpConfig.from_dict(params))
        except ValueError as error:  # urllib3 refuses what urlsplit let through (port 99999)
            raise ConfigError(f"[openlineage] url {settings.url!r}: {error}") from None
    elif settings.transport == "file":
        from openlineage.client.transport.file import FileConfig, FileTransport

        if settings.path is None:
            raise ValueError("[openlineage] transport 'file' needs a path")  # settings check it
        try:
            settings.path.parent.mkdir(parents=True, exist_ok=True)
            # Opened once now: the transport opens it at each send, where a file that cannot be
            # appended to would fail every event.
            with settings.path.open("a"):
                pass
        except OSError as error:
            raise ConfigError(
                f"[openlineage] path {str(settings.path)!r}: events cannot be appended to it: "
                f"{error}"
            ) from None
        transport = FileTransport(FileConfig(log_file_path=str(settings.path), append=True))
    elif settings.transport == "kafka":
        from confluent_kafka import KafkaError, KafkaException
        from openlineage.client.transport.kafka import KafkaConfig, KafkaTransport

        config = {
            "bootstrap.servers": settings.bootstrap_servers or "",
            # A delivery that cannot complete fails after the timeout instead of librdkafka's
            # five minutes, during which the next events would wait.
            "message.timeout.ms": str(int(settings.timeout_s * 1000)),
            **settings.kafka_config,
        }
        try:
            transport = KafkaTransport(KafkaConfig(config=config, topic=settings.topic, flush=True))
        except KafkaException as error:  # the producer is made here, with its settings
            kafka_error = error.args[0] if error.args else None
            reason = kafka_error.str() if isinstance(kafka_error, KafkaError) else error
            raise ConfigError(
                f"[openlineage] kafka_config {_shown(settings.kafka_config)}: the Kafka producer "
                f"refuses it: {reason}"
            ) from None
    else:
        from openlineage.client.transport.console import ConsoleConfig, ConsoleTransport

        transport = ConsoleTransport(ConsoleConfig())
    import triggerer.service.runs.openlineage  # noqa: F401 - the events' model, imported here too

    return transport  # type: ignore[no-any-return]


def _shown(config: dict[str, str]) -> dict[str, str]:
    """``config`` with the values of its secrets (passwords, keys) hidden."""
    return {
        key: "***" if _SECRET_SETTING.search(key.lower()) else value
        for key, value in config.items()
    }
