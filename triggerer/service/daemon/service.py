"""The service: one task group holding watchers, ingest, scheduler, launcher and heartbeat.

SIGTERM or SIGINT stops the watchers' polling, lets ingest commit and ack what it holds, then
lets the watchers clean up (so Kafka's last offset commit covers those acks), gives runs a
grace period, and returns; a second signal exits at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import anyio
import structlog
from sqlalchemy import delete, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from triggerer import checkpoints, part_leases
from triggerer.service import metrics
from triggerer.service.config import ConfigError
from triggerer.service.daemon import heap
from triggerer.service.daemon.backpressure import Backpressure
from triggerer.service.daemon.ingest import Delivery, Ingest
from triggerer.service.daemon.lag_samples import LagSampler
from triggerer.service.daemon.leases import Leases
from triggerer.service.daemon.notifier import Notifier
from triggerer.service.daemon.part_leases import StoredPartLeases
from triggerer.service.daemon.retention import Retention
from triggerer.service.daemon.supervisor import Supervisor
from triggerer.service.daemon.wakeups import listen
from triggerer.service.daemon.watchdog import watch_event_loop
from triggerer.service.daemon.watcher_reports import WatcherReports
from triggerer.service.loader import LoadedPipelines, PipelinesFolder, pipeline_files
from triggerer.service.runs.launcher import Launcher
from triggerer.service.runs.lineage_emitter import LineageEmitter
from triggerer.service.runs.spark_server import LocalSparkServer
from triggerer.service.scheduling.registry import DefinitionChanges, Registry, sync_definitions
from triggerer.service.scheduling.scheduler import Scheduler
from triggerer.service.store import (
    create_engine,
    models,
    notices,
    session_factory,
    source_checkpoints,
    upgrade,
)
from triggerer.service.store.engine import async_url, deployment_id, masked_url
from triggerer.service.store.failures import STORE_ERRORS
from triggerer.service.store.migrate import NewerSchema
from triggerer.service.store.outages import keep_running, until_stored
from triggerer.service.store.states import RunState
from triggerer.service.store.types import utcnow
from triggerer.service.tracing import start as start_tracing
from watchers import providers

SYNC_ATTEMPTS = 5
"""Tries of a definitions sync that another daemon's sync of the same rows raced."""
SLOW_LOAD_S = 10.0
"""How long loading the pipelines folder may take before the file being imported is logged."""

if TYPE_CHECKING:
    from triggerer.service.config import Settings
    from triggerer.service.events import Recorded

log = structlog.get_logger(__name__)

DELIVERY_BUFFER = 10_000
POSTGRESQL_COMMITS_IN_FLIGHT = 2
"""Ingest transactions at once on PostgreSQL: the daemon prepares one while the server writes
the other. SQLite has a single writer, so a second transaction there would only wait."""


class Service:
    """The daemon's parts, wired together; ``serve`` runs them."""

    def __init__(self, settings: Settings, sessions: async_sessionmaker[AsyncSession]) -> None:
        self.settings = settings
        self.sessions = sessions
        # Triggers of sources without acks (Kinesis) read their stored positions from here.
        checkpoints.read_from(source_checkpoints.reader(sessions))
        self.instance_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.leases = Leases(sessions, self.instance_id, ttl_s=settings.daemon.dead_after_s)
        # Shareable triggers of sources with parts (Kinesis shards) spread them over the
        # instances running them with leases of their parts, renewed with the others.
        part_leases.lease_with(
            StoredPartLeases(
                sessions,
                self.leases,
                interval_s=settings.daemon.heartbeat_interval_s,
                ttl_s=settings.daemon.dead_after_s,
            )
        )
        self.registry = Registry({}, {}, {}, {}, {})
        # Imported again file by file: a reload imports the files that changed.
        self.folder = PipelinesFolder(Path(settings.pipelines.dir))
        send, self._receive = anyio.create_memory_object_stream[Delivery](DELIVERY_BUFFER)
        self.scheduler = Scheduler(sessions, lambda: self.registry, self._run_created)
        # Watchers whose pipelines' backlogs are full stop fetching ([runs] max_backlog).
        self.backpressure = Backpressure(sessions, settings.runs.max_backlog)
        # Spans of ingest and runs ([tracing]; None when off: nothing of it on the hot paths).
        self.tracing = start_tracing(settings.tracing, self.instance_id)
        self.ingest = Ingest(
            sessions,
            self.events_recorded,
            batch_size=settings.daemon.ingest_batch_size,
            commits_in_flight=_commits_in_flight(settings.database.url),
            on_stored=self.backpressure.committed,
            owner=self.instance_id,
            tracing=self.tracing,
        )
        # Local mode: one warm Spark Connect server, which every run uses.
        self.spark_server = (
            LocalSparkServer(
                settings.spark, restart_backoff_max_s=settings.daemon.restart_backoff_max_s
            )
            if settings.spark.mode == "local"
            else None
        )
        # OpenLineage run events, sent off the launcher's path (nothing when not enabled).
        self.lineage = LineageEmitter(settings.openlineage, sessions)
        self.launcher = Launcher(
            sessions,
            lambda: self.registry,
            settings,
            self.instance_id,
            self.scheduler.wake,
            on_events=self.events_recorded,
            on_definitions=self.definitions_changed,
            spark_server=self.spark_server,
            lineage=self.lineage,
            tracing=self.tracing,
        )
        self.notifier = Notifier(
            settings.listeners.plugins,
            settings.logging,
            sessions,
            lambda: self.registry.assets,
            max_pending_events=settings.listeners.max_pending_events,
        )
        self.retention = Retention(
            sessions, settings.retention, Path(settings.spark.logs_dir), self.leases
        )
        self.supervisor = Supervisor(
            send,
            self.leases,
            self.backpressure,
            backoff_max_s=settings.daemon.restart_backoff_max_s,
            lease_poll_s=settings.daemon.heartbeat_interval_s,
            drain_timeout_s=settings.daemon.shutdown_grace_s,
        )

        # What each queue provider's watchers share here (a Kafka consumer per cluster, in
        # groups of this deployment; an SQS poller per queue).
        deployment = deployment_id(settings.database.url)
        self.shared_readers = [
            provider.shared(deployment)
            for provider in providers.installed()
            if provider.shared is not None
        ]

        # Watcher states, written where they changed.
        self.watcher_reports = WatcherReports(sessions, self.instance_id)
        # Their lag over time, for the UI's chart.
        self.lag_samples = LagSampler(sessions)

    def events_recorded(self, recorded: Recorded) -> None:
        """New events were committed (by a watcher, a run, the CLI or the REST API): the one
        place that reacts to them, after the commit and never inside the transaction."""
        if recorded.queued_pipelines:
            self.scheduler.wake(recorded.queued_pipelines)
        metrics.events_recorded(recorded)
        self.notifier.events_recorded(recorded)

    def definitions_changed(self, changes: DefinitionChanges) -> None:
        """Assets or aliases were created or changed (committed): tell the listeners."""
        self.notifier.definitions_changed(changes)

    def _run_created(self) -> None:
        self.launcher.wake()
        self.backpressure.wake()

    def on_notice(self, payload: str) -> None:
        """Another process queued a run, cancelled one, or queued events for pipelines: wake
        who handles them."""
        if payload == notices.RUNS:
            self.launcher.wake()
        elif payload == notices.CANCEL:
            self.launcher.cancel_requested()
        elif payload.startswith(notices.QUEUED):
            self.scheduler.wake(notices.parse_queued(payload))

    async def reload(self, task_group: anyio.abc.TaskGroup) -> None:
        """Load the pipelines folder and bring the database and the watchers in line."""
        loaded = await _load(self.folder)
        for error in loaded.errors:
            log.error(
                "pipeline_file_failed",
                error=str(error),
                path=error.path,
                line=error.line,
                traceback=error.traceback,
            )
        for attempt in range(1, SYNC_ATTEMPTS + 1):
            changes = DefinitionChanges()
            try:
                async with self.sessions.begin() as session:
                    self.registry = await sync_definitions(session, loaded, changes)
                break
            # Another daemon synced the same definitions at the same moment (two started
            # together on a new store): its rows are there now, and the next try finds them.
            except IntegrityError as error:
                if attempt == SYNC_ATTEMPTS:
                    raise
                log.info("definitions_sync_raced", attempt=attempt, error=str(error.orig))
                await anyio.sleep(0.1 * attempt)
        self.definitions_changed(changes)
        self.backpressure.follow(self.registry)
        self.supervisor.update(task_group, self.registry.triggers)
        triggers = [watched.trigger for watched in self.registry.triggers.values()]
        for shared in self.shared_readers:
            shared.keep(triggers)
        self.scheduler.wake(self.registry.changed)
        log.info(
            "pipelines_loaded",
            pipelines=len(self.registry.pipelines),
            watchers=len(self.registry.triggers),
            errors=len(loaded.errors),
        )

    async def recover(self) -> None:
        """Runs left running by a dead instance run again (their processes died with it);
        those cancelled while they ran there are ``cancelled``.

        An instance is dead once its heartbeat is older than ``dead_after_s``; this runs at
        start and with every heartbeat, so a restart right after a crash recovers too.
        """
        stale = utcnow() - timedelta(seconds=self.settings.daemon.dead_after_s)
        # Never this instance: a heartbeat slower than dead_after_s (a loaded machine, a slow
        # store) must not make it take its own runs for a dead one's and start them twice.
        alive = select(models.Instance.id).where(
            or_(models.Instance.heartbeat_at >= stale, models.Instance.id == self.instance_id)
        )
        async with self.sessions.begin() as session:
            recovered = await session.execute(
                update(models.Run)
                .where(models.Run.state == RunState.RUNNING, models.Run.owner.not_in(alive))
                .values(state=RunState.QUEUED, try_number=models.Run.try_number - 1, owner=None)
            )
            await session.execute(
                update(models.Run)
                .where(models.Run.state == RunState.CANCELLING, models.Run.owner.not_in(alive))
                .values(state=RunState.CANCELLED, end_date=utcnow(), owner=None)
            )
        if recovered.rowcount:  # type: ignore[attr-defined]  # CursorResult
            log.warning("runs_recovered", count=recovered.rowcount)  # type: ignore[attr-defined]
            self.launcher.wake()

    async def leave(self) -> None:
        """On a clean exit: no heartbeat left behind, and leases free for other instances."""
        async with self.sessions.begin() as session:
            await session.execute(
                delete(models.Lease).where(models.Lease.owner == self.instance_id)
            )
            await session.execute(
                delete(models.Instance).where(models.Instance.id == self.instance_id)
            )

    async def heartbeat(self) -> None:
        """Sign of life first (what ``triggerer check`` reads), then leases, watcher states
        that changed since the last beat, recovery of dead instances' runs, and the metrics
        read from the store."""
        async with self.sessions.begin() as session:
            await session.merge(
                models.Instance(
                    id=self.instance_id,
                    hostname=socket.gethostname(),
                    pid=os.getpid(),
                    heartbeat_at=utcnow(),
                )
            )
        self.supervisor.leases_lost(await self.leases.renew())
        self.supervisor.sample()
        await self.lag_samples.sample(self.supervisor.status)
        await self.watcher_reports.write(self.supervisor.status)
        await self.recover()
        async with self.sessions() as session:
            queued = await session.execute(
                select(models.QueuedEvent.pipeline_id, func.count()).group_by(
                    models.QueuedEvent.pipeline_id
                )
            )
            metrics.queued_events(dict(queued.all()), set(self.registry.pipelines))


class Server(Protocol):
    """A server run beside the daemon's parts: the REST API."""

    async def run(self) -> None: ...

    def stop(self) -> None: ...


async def serve(
    settings: Settings,
    *,
    api: Callable[[Service], Server] | None = None,
    shutdown_trigger: Callable[[], Awaitable[object]] | None = None,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Run the daemon until ``shutdown_trigger`` returns (default: SIGTERM or SIGINT).

    ``api`` makes the REST API's server of the daemon's parts (the API is a layer above the
    daemon: ``triggerer run`` passes :func:`triggerer.service.api.server.api_server`); it is
    served when ``[api] enabled``. ``task_status.started()`` is called once the database is
    migrated, the pipelines are loaded and every part is running, the REST API too. A store that is
    down at start is waited for; one that goes away later stops nothing: every loop that uses
    it retries until it is back.

    A signal is heeded from the first moment: during the start it ends the start (nothing was
    acknowledged yet), after it the drain.
    """
    if shutdown_trigger is not None:
        await _serve(settings, api, shutdown_trigger, task_status)
        return
    started, stop = anyio.Event(), anyio.Event()

    async def until_signalled() -> None:
        started.set()
        await stop.wait()

    try:
        async with anyio.create_task_group() as serving:
            serving.start_soon(_heed_signals, started, stop, serving.cancel_scope)
            await _serve(settings, api, until_signalled, task_status)
            serving.cancel_scope.cancel()
    # What the start or the drain raised, as they raised it (a ConfigError is one line to the
    # CLI), not wrapped by this task group.
    except ExceptionGroup as errors:
        if len(errors.exceptions) == 1:
            raise errors.exceptions[0] from None
        raise
    if not started.is_set():  # a signal ended the start
        log.info("shutdown_complete")


async def _serve(
    settings: Settings,
    api: Callable[[Service], Server] | None,
    shutdown_trigger: Callable[[], Awaitable[object]],
    task_status: anyio.abc.TaskStatus[None],
) -> None:
    try:
        await until_stored(lambda: upgrade(settings.database.url), during="upgrade")
    except NewerSchema as error:
        raise ConfigError(f"[database] url {masked_url(settings.database.url)}: {error}") from None
    # The first connection: a URL that passes the settings' check but that the driver refuses
    # (libpq's ``sslmode=`` where asyncpg takes ``ssl=``) would fail every start the same way.
    except (TypeError, ValueError, OverflowError) as error:
        raise ConfigError(
            f"[database] url {masked_url(settings.database.url)}: the database driver refuses "
            f"it: {error}"
        ) from None
    engine = create_engine(settings.database.url)
    service = Service(settings, session_factory(engine))
    try:
        await service.lineage.start()  # a transport setting it refuses stops the start here
        await until_stored(service.recover, during="recover")
        # Bound before anything runs: a port in use stops the start with one clear error.
        server = api(service) if api is not None and settings.api.enabled else None
        with contextlib.ExitStack() as sharing:
            for shared in service.shared_readers:
                sharing.enter_context(shared.sharing())
            await _run(service, server, engine, shutdown_trigger, task_status)
        if service.tracing is not None:
            await service.tracing.shutdown()  # the last spans sent, the runs' among them
        try:
            await service.leave()
        except STORE_ERRORS as error:
            # Nothing is lost: the heartbeat goes stale and the leases expire on their own.
            log.warning("leave_failed", error=str(error).splitlines()[0])
    finally:
        # Also when a signal cancels the start: the connections close, none is left mid-close.
        with anyio.CancelScope(shield=True), anyio.move_on_after(10):
            await engine.dispose()
    log.info("shutdown_complete")


async def _run(
    service: Service,
    api: Server | None,
    engine: AsyncEngine,
    shutdown_trigger: Callable[[], Awaitable[object]],
    task_status: anyio.abc.TaskStatus[None],
) -> None:
    """Every part of the daemon in one task group until the shutdown trigger; then the drain:
    watchers stop, ingest commits and acks what it holds, runs get their grace period."""
    settings = service.settings
    async with anyio.create_task_group() as task_group:
        task_group.start_soon(watch_event_loop)
        task_group.start_soon(service.notifier.run)
        task_group.start_soon(service.lineage.run)
        if service.spark_server is not None:
            task_group.start_soon(service.spark_server.run)
        # Seen before the first load, so a file written while it runs is loaded next.
        seen = _snapshot(Path(settings.pipelines.dir))
        await until_stored(lambda: service.reload(task_group), during="reload")
        await until_stored(service.heartbeat, during="heartbeat")
        if api is not None:
            task_group.start_soon(api.run)
        ingest_done = anyio.Event()
        task_group.start_soon(_until_done, service.ingest.run(service._receive), ingest_done)
        task_group.start_soon(partial(keep_running, service.scheduler.run, during="schedule"))
        runs = anyio.create_task_group()
        async with runs:
            runs.start_soon(
                partial(keep_running, partial(service.launcher.run, runs), during="launch")
            )
            async with anyio.create_task_group() as background:
                background.start_soon(
                    partial(
                        keep_running,
                        partial(_every, settings.daemon.heartbeat_interval_s, service.heartbeat),
                        during="heartbeat",
                    )
                )
                background.start_soon(_watch_folder, service, task_group, seen)
                background.start_soon(service.backpressure.run)
                background.start_soon(listen, engine, service.on_notice)
                background.start_soon(
                    partial(keep_running, service.retention.run, during="retention")
                )
                # Every part has started: what lives from here on is the collector's alone.
                with heap.frozen():
                    task_status.started()
                    await shutdown_trigger()
                log.info("shutdown_started")
                if api is not None:
                    api.stop()
                background.cancel_scope.cancel()
            service.supervisor.stop()
            service.launcher.stop_accepting()
            with anyio.move_on_after(settings.daemon.shutdown_grace_s):
                await ingest_done.wait()
            service.supervisor.drained()
            with anyio.move_on_after(settings.daemon.shutdown_grace_s):
                await service.launcher.wait_idle()
            service.launcher.interrupt()
            await service.launcher.wait_idle()
            # One deadline for both: a grace period each would overrun the stop timeout that
            # systemd and containers give (grace + 15 s).
            with anyio.move_on_after(settings.daemon.shutdown_grace_s):
                await service.notifier.drained()
                await service.lineage.drained()
            task_group.cancel_scope.cancel()


def _commits_in_flight(database_url: str) -> int:
    if async_url(database_url).get_backend_name() == "sqlite":
        return 1
    return POSTGRESQL_COMMITS_IN_FLIGHT


async def _until_done(work: Awaitable[None], done: anyio.Event) -> None:
    try:
        await work
    finally:
        done.set()


async def _heed_signals(
    started: anyio.Event, stop: anyio.Event, starting: anyio.CancelScope
) -> None:
    """On SIGTERM or SIGINT: the drain once the daemon has started (``stop``), else the start
    is cancelled; a second signal means now, no more draining."""
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for received in signals:
            log.info("signal_received", signal=received.name)
            break
    signal.signal(signal.SIGTERM, lambda *_: os._exit(1))
    signal.signal(signal.SIGINT, lambda *_: os._exit(1))
    if started.is_set():
        stop.set()
    else:
        starting.cancel()


async def _every(interval_s: float, action: Callable[[], Awaitable[None]]) -> None:
    while True:
        await anyio.sleep(interval_s)
        await action()


async def _watch_folder(
    service: Service, task_group: anyio.abc.TaskGroup, seen: dict[str, float]
) -> None:
    """Reload when a ``.py`` file in the pipelines folder is added, changed or removed since
    ``seen``."""
    folder = Path(service.settings.pipelines.dir)
    while True:
        await anyio.sleep(service.settings.pipelines.reload_interval_s)
        current = await anyio.to_thread.run_sync(_snapshot, folder)
        if current != seen:
            await until_stored(lambda: service.reload(task_group), during="reload")
            seen = current


async def _load(folder: PipelinesFolder) -> LoadedPipelines:
    """``folder.load()`` in a thread. A file whose import does not return (one that waits on
    the network at import) holds up this load and every reload after it: logged, naming it."""
    importing: list[Path] = []

    async def report_slow() -> None:
        started = anyio.current_time()
        while True:
            await anyio.sleep(SLOW_LOAD_S)
            log.warning(
                "pipeline_file_slow",
                path=str(importing[-1]) if importing else str(folder.folder),
                loading_s=round(anyio.current_time() - started),
                hint="its import has not returned; the pipelines folder is not reloaded meanwhile",
            )

    async with anyio.create_task_group() as reporting:
        reporting.start_soon(report_slow)
        loaded = await anyio.to_thread.run_sync(folder.load, importing.append)
        reporting.cancel_scope.cancel()
    return loaded


def _snapshot(folder: Path) -> dict[str, float]:
    """The modification time of each pipeline file the loader would import."""
    if not folder.is_dir():
        return {}
    mtimes = {}
    for path in pipeline_files(folder):
        try:
            mtimes[str(path)] = path.stat().st_mtime
        # A symlink to nothing, or a file deleted since the folder was listed: the loader
        # reports the first on its own, and the second is gone.
        except OSError:
            continue
    return mtimes
