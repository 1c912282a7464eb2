"""The service: one task group holding watchers, ingest, scheduler, launcher and heartbeat.

SIGTERM or SIGINT stops the watchers' polling, lets ingest commit and ack what it holds, then
lets the watchers clean up (so Kafka's last offset commit covers those acks), gives runs a
grace period, and returns; a second signal exits at once.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import structlog
from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from triggerer.daemon.ingest import Delivery, Ingest
from triggerer.daemon.launcher import Launcher
from triggerer.daemon.leases import Leases
from triggerer.daemon.registry import Registry, sync_definitions
from triggerer.daemon.scheduler import Scheduler
from triggerer.daemon.supervisor import Supervisor, WatcherStatus
from triggerer.daemon.wakeups import listen
from triggerer.loader import LoadedPipelines, load_pipelines
from triggerer.store import create_engine, models, notices, session_factory, upgrade
from triggerer.store.engine import async_url
from triggerer.store.models import RunState
from triggerer.store.types import utcnow

if TYPE_CHECKING:
    from triggerer.config import Settings

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
        self.instance_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.registry = Registry({}, {}, {}, {}, {})
        send, self._receive = anyio.create_memory_object_stream[Delivery](DELIVERY_BUFFER)
        self.scheduler = Scheduler(sessions, lambda: self.registry, self._run_created)
        self.ingest = Ingest(
            sessions,
            self.scheduler.wake,
            batch_size=settings.daemon.ingest_batch_size,
            commits_in_flight=_commits_in_flight(settings.database.url),
        )
        self.launcher = Launcher(
            sessions, lambda: self.registry, settings, self.instance_id, self.scheduler.wake
        )
        self.leases = Leases(sessions, self.instance_id, ttl_s=settings.daemon.dead_after_s)
        self.supervisor = Supervisor(
            send,
            self.leases,
            backoff_max_s=settings.daemon.restart_backoff_max_s,
            lease_poll_s=settings.daemon.heartbeat_interval_s,
            drain_timeout_s=settings.daemon.shutdown_grace_s,
        )

        # Watcher states as last written, so a heartbeat writes only what changed.
        self._reported: dict[int, WatcherStatus] = {}

    def _run_created(self) -> None:
        self.launcher.wake()

    def on_notice(self, payload: str) -> None:
        """Another process queued a run, or events for pipelines: wake who handles them."""
        if payload == notices.RUNS:
            self.launcher.wake()
        elif payload.startswith(notices.QUEUED):
            self.scheduler.wake(notices.parse_queued(payload))

    async def reload(self, task_group: anyio.abc.TaskGroup) -> None:
        """Load the pipelines folder and bring the database and the watchers in line."""
        loaded: LoadedPipelines = await anyio.to_thread.run_sync(
            load_pipelines, Path(self.settings.pipelines.dir)
        )
        for error in loaded.errors:
            log.error("pipeline_file_failed", error=str(error))
        async with self.sessions.begin() as session:
            self.registry = await sync_definitions(session, loaded)
        self.supervisor.update(task_group, self.registry.triggers)
        self.scheduler.wake()
        log.info(
            "pipelines_loaded",
            pipelines=len(self.registry.pipelines),
            watchers=len(self.registry.triggers),
            errors=len(loaded.errors),
        )

    async def recover(self) -> None:
        """Runs left running by a dead instance run again (their processes died with it).

        An instance is dead once its heartbeat is older than ``dead_after_s``; this runs at
        start and with every heartbeat, so a restart right after a crash recovers too.
        """
        stale = utcnow() - timedelta(seconds=self.settings.daemon.dead_after_s)
        alive = select(models.Instance.id).where(models.Instance.heartbeat_at >= stale)
        async with self.sessions.begin() as session:
            recovered = await session.execute(
                update(models.Run)
                .where(models.Run.state == RunState.RUNNING, models.Run.owner.not_in(alive))
                .values(state=RunState.QUEUED, try_number=models.Run.try_number - 1, owner=None)
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
        that changed since the last beat, and recovery of dead instances' runs."""
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
        changed = {
            trigger_id: status
            for trigger_id, status in self.supervisor.status.items()
            if self._reported.get(trigger_id) != status
        }
        if changed:
            async with self.sessions.begin() as session:
                await session.execute(
                    update(models.Trigger),
                    [
                        {
                            "id": trigger_id,
                            "state": status.state,
                            "last_poll_at": status.last_poll_at,
                            "last_error": status.last_error,
                            "restart_count": status.restart_count,
                            "instance_id": self.instance_id,
                        }
                        for trigger_id, status in changed.items()
                    ],
                )
            self._reported.update(
                (trigger_id, dataclasses.replace(status)) for trigger_id, status in changed.items()
            )
        await self.recover()


async def serve(
    settings: Settings,
    *,
    shutdown_trigger: Callable[[], Awaitable[object]] | None = None,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Run the daemon until ``shutdown_trigger`` returns (default: SIGTERM or SIGINT).

    ``task_status.started()`` is called once the database is migrated, the pipelines are
    loaded and every part is running.
    """
    await upgrade(settings.database.url)
    engine = create_engine(settings.database.url)
    service = Service(settings, session_factory(engine))
    try:
        await service.recover()
        async with anyio.create_task_group() as task_group:
            await service.reload(task_group)
            await service.heartbeat()
            ingest_done = anyio.Event()
            task_group.start_soon(_until_done, service.ingest.run(service._receive), ingest_done)
            task_group.start_soon(service.scheduler.run)
            runs = anyio.create_task_group()
            async with runs:
                runs.start_soon(service.launcher.run, runs)
                async with anyio.create_task_group() as background:
                    background.start_soon(
                        _every, settings.daemon.heartbeat_interval_s, service.heartbeat
                    )
                    background.start_soon(_watch_folder, service, task_group)
                    background.start_soon(listen, engine, service.on_notice)
                    task_status.started()
                    await (shutdown_trigger or _signalled)()
                    log.info("shutdown_started")
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
                task_group.cancel_scope.cancel()
        await service.leave()
    finally:
        await engine.dispose()
    log.info("shutdown_complete")


def _commits_in_flight(database_url: str) -> int:
    if async_url(database_url).get_backend_name() == "sqlite":
        return 1
    return POSTGRESQL_COMMITS_IN_FLIGHT


async def _until_done(work: Awaitable[None], done: anyio.Event) -> None:
    try:
        await work
    finally:
        done.set()


async def _signalled() -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for received in signals:
            log.info("signal_received", signal=received.name)
            break
    # A second signal means now: no more draining.
    signal.signal(signal.SIGTERM, lambda *_: os._exit(1))
    signal.signal(signal.SIGINT, lambda *_: os._exit(1))


async def _every(interval_s: float, action: Callable[[], Awaitable[None]]) -> None:
    while True:
        await anyio.sleep(interval_s)
        await action()


async def _watch_folder(service: Service, task_group: anyio.abc.TaskGroup) -> None:
    """Reload when a ``.py`` file in the pipelines folder is added, changed or removed."""
    folder = Path(service.settings.pipelines.dir)
    seen = _snapshot(folder)
    while True:
        await anyio.sleep(service.settings.pipelines.reload_interval_s)
        current = await anyio.to_thread.run_sync(_snapshot, folder)
        if current != seen:
            seen = current
            await service.reload(task_group)


def _snapshot(folder: Path) -> dict[str, float]:
    return {str(p): p.stat().st_mtime for p in folder.rglob("*.py")} if folder.is_dir() else {}
