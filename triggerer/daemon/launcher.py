"""The launcher: claims queued runs, runs each in a child process, records how it ended.

A run that succeeds commits its outlet events together with its final state; one that fails
emits nothing and is retried with backoff while it has tries left.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import structlog
from anyio.abc import TaskGroup
from sqlalchemy import or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from triggerer import runner
from triggerer.assets import Asset, AssetAlias
from triggerer.daemon.registry import Registry, ensure_alias, ensure_asset
from triggerer.events import NewEvent, record_events
from triggerer.store import models
from triggerer.store.models import EventSource, RunState
from triggerer.store.types import utcnow

if TYPE_CHECKING:
    from triggerer.config import Settings
    from triggerer.pipelines import Pipeline

log = structlog.get_logger(__name__)

POLL_S = 5.0
KILL_GRACE_S = 5.0


class Launcher:
    """Starts runs as they are created; a run's process dies with the daemon."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        registry: Callable[[], Registry],
        settings: Settings,
        instance_id: str,
        on_run_finished: Callable[[set[str]], None],
    ) -> None:
        self._sessions = sessions
        self._registry = registry
        self._settings = settings
        self._instance_id = instance_id
        self._on_run_finished = on_run_finished
        self._woken = anyio.Event()
        self._accepting = True
        # A run is in progress from its claim until its end is recorded; each has a scope
        # that interrupt() cancels.
        self._in_progress: dict[int, anyio.CancelScope] = {}
        self._idle = anyio.Event()
        self._idle.set()

    async def wait_idle(self) -> None:
        """Return once no run is in progress."""
        await self._idle.wait()

    def interrupt(self) -> None:
        """Stop every run in progress (shutdown past its grace): each is queued to run again."""
        for scope in self._in_progress.values():
            scope.cancel()

    def wake(self) -> None:
        self._woken.set()

    def stop_accepting(self) -> None:
        """Claim no more runs (shutdown); runs in progress go on."""
        self._accepting = False
        self._woken.set()

    async def run(self, task_group: TaskGroup) -> None:
        """Claim runs and start them in ``task_group`` until cancelled or stopped."""
        while self._accepting:
            self._woken = anyio.Event()
            for run_pk in await self._claimable():
                if not self._accepting:
                    break
                if await self._claim(run_pk):
                    self._in_progress[run_pk] = anyio.CancelScope()
                    self._idle = anyio.Event()
                    task_group.start_soon(self._execute, run_pk)
            with anyio.move_on_after(POLL_S):
                await self._woken.wait()

    async def _claimable(self) -> list[int]:
        async with self._sessions() as session:
            rows = await session.scalars(
                select(models.Run.id)
                .where(
                    or_(
                        models.Run.state == RunState.QUEUED,
                        (models.Run.state == RunState.UP_FOR_RETRY)
                        & (models.Run.next_try_at <= utcnow()),
                    )
                )
                .order_by(models.Run.id)
            )
            return list(rows.all())

    async def _claim(self, run_pk: int) -> bool:
        async with self._sessions.begin() as session:
            claimed = await session.execute(
                update(models.Run)
                .where(
                    models.Run.id == run_pk,
                    models.Run.state.in_((RunState.QUEUED, RunState.UP_FOR_RETRY)),
                )
                .values(
                    state=RunState.RUNNING,
                    owner=self._instance_id,
                    try_number=models.Run.try_number + 1,
                    start_date=utcnow(),
                    heartbeat_at=utcnow(),
                )
            )
            return bool(claimed.rowcount == 1)  # type: ignore[attr-defined]  # CursorResult

    async def _execute(self, run_pk: int) -> None:
        try:
            ended = Ended(interrupted=True)
            log_path: Path | None = None
            with self._in_progress[run_pk]:
                async with self._sessions() as session:
                    run = await session.get_one(models.Run, run_pk)
                    pipeline = self._registry().pipelines.get(run.pipeline_id)
                    spec = await self._spec(session, run, pipeline) if pipeline else None
                structlog.contextvars.bind_contextvars(run_id=run.run_id)
                folder = Path(self._settings.spark.logs_dir) / run.pipeline_id / run.run_id
                log_path = folder / f"try-{run.try_number}.log"
                log.info("run_started", pipeline_id=run.pipeline_id, try_number=run.try_number)
                if spec is None:
                    ended = Ended(error=f"pipeline {run.pipeline_id!r} is no longer defined")
                else:
                    ended = await self._run_child(spec, folder, log_path, run.try_number)
            # Recorded even when shutdown interrupted the run: it is queued to run again.
            with anyio.CancelScope(shield=True):
                state, queued = await self._finish(run_pk, ended, log_path)
            log.info("run_finished", run_pk=run_pk, state=state, error=ended.error)
            self._on_run_finished(queued)
        finally:
            del self._in_progress[run_pk]
            if not self._in_progress:
                self._idle.set()

    async def _run_child(
        self, spec: dict[str, Any], folder: Path, log_path: Path, try_number: int
    ) -> Ended:
        spec_path, result_path = folder / "spec.json", folder / f"result-{try_number}.json"
        await anyio.Path(folder).mkdir(parents=True, exist_ok=True)
        await anyio.Path(spec_path).write_text(json.dumps(spec))
        command = _command(self._settings, spec_path, result_path)
        with log_path.open("ab") as log_file:
            process = await anyio.open_process(
                command, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True
            )
            try:
                returncode = await process.wait()
            except anyio.get_cancelled_exc_class():
                with anyio.CancelScope(shield=True):
                    await _terminate(process)
                raise
        return await _ended(returncode, result_path, log_path)

    async def _spec(
        self, session: AsyncSession, run: models.Run, pipeline: Pipeline
    ) -> dict[str, Any]:
        rows = await session.execute(
            select(models.AssetEvent, models.Asset)
            .join(models.RunEvent, models.RunEvent.event_id == models.AssetEvent.id)
            .join(models.Asset, models.Asset.id == models.AssetEvent.asset_id)
            .where(models.RunEvent.run_pk == run.id)
            .order_by(models.AssetEvent.id)
        )
        events = [
            {
                "id": event.id,
                "asset": {"name": asset.name, "uri": asset.uri},
                "extra": event.extra,
                "timestamp": event.timestamp.isoformat(),
                "source": event.source,
                "partition_key": event.partition_key,
            }
            for event, asset in rows.all()
        ]
        spark = self._settings.spark
        return {
            "run_id": run.run_id,
            "pipeline_id": run.pipeline_id,
            "fileloc": pipeline.fileloc,
            "application": pipeline.application,
            "try_number": run.try_number,
            "partition_key": run.partition_key,
            "params": run.params,
            "triggering_events": events,
            "database_url": self._settings.database.url,
            "spark": {
                "mode": spark.mode,
                "master": spark.master,
                "remote": spark.remote,
                "conf": spark.conf,
            },
        }

    async def _finish(
        self, run_pk: int, ended: Ended, log_path: Path | None
    ) -> tuple[str, set[str]]:
        """Record how a try ended; the new state and the pipelines to evaluate again."""
        async with self._sessions.begin() as session:
            run = await session.get_one(models.Run, run_pk, with_for_update=True)
            queued = {run.pipeline_id}
            run.log_path = str(log_path) if log_path else run.log_path
            run.end_date = utcnow()
            if ended.interrupted:
                run.state, run.try_number = RunState.QUEUED, run.try_number - 1
            elif ended.result is not None:
                run.state = RunState.SUCCESS
                queued |= await _record_outlets(session, run, ended.result)
            elif run.try_number < run.max_tries:
                pipeline = self._registry().pipelines.get(run.pipeline_id)
                delay_s = pipeline.retry_delay_s if pipeline is not None else 10.0
                run.state, run.error = RunState.UP_FOR_RETRY, ended.error
                run.next_try_at = retry_at(run.try_number, delay_s)
            else:
                run.state, run.error = RunState.FAILED, ended.error
            return run.state, queued


@dataclasses.dataclass(frozen=True)
class Ended:
    """How a try ended: with a result (success), an error, or interrupted by shutdown."""

    result: dict[str, Any] | None = None
    error: str | None = None
    interrupted: bool = False


async def _ended(returncode: int, result_path: Path, log_path: Path) -> Ended:
    if returncode != 0:
        return Ended(error=f"exit code {returncode}, see {log_path}")
    try:
        return Ended(result=json.loads(await anyio.Path(result_path).read_text()))
    except (OSError, ValueError) as error:
        return Ended(error=f"the run reported no outlets ({error}), see {log_path}")


async def _record_outlets(
    session: AsyncSession, run: models.Run, result: dict[str, Any]
) -> set[str]:
    events: dict[tuple[int, str], NewEvent] = {}
    through: dict[tuple[int, str], set[int]] = {}
    for outlet in result["assets"]:
        asset_id = await ensure_asset(session, Asset(outlet["name"], outlet["uri"]))
        key = (asset_id, json.dumps(outlet["extra"], sort_keys=True))
        events[key] = _outlet_event(asset_id, outlet["extra"], run)
    for add in result["alias_adds"]:
        asset_id = await ensure_asset(session, Asset(add["name"], add["uri"]))
        alias_id = await ensure_alias(session, AssetAlias(add["alias"]))
        await session.merge(models.AssetAliasAsset(alias_id=alias_id, asset_id=asset_id))
        # The same asset with the same extra through several aliases is one event.
        key = (asset_id, json.dumps(add["extra"], sort_keys=True))
        events.setdefault(key, _outlet_event(asset_id, add["extra"], run))
        through.setdefault(key, set()).add(alias_id)
    await session.flush()
    recorded = await record_events(session, list(events.values()))
    event_ids = {event.dedup_key: event.id for event in recorded.events}
    for key, alias_ids in through.items():
        event_id = event_ids.get(events[key].dedup_key)
        if event_id is not None:
            session.add_all(
                models.AssetEventAlias(event_id=event_id, alias_id=alias_id)
                for alias_id in alias_ids
            )
    return recorded.queued_pipelines


def _outlet_event(asset_id: int, extra: dict[str, Any], run: models.Run) -> NewEvent:
    return NewEvent(
        asset_id=asset_id,
        extra=extra,
        source=EventSource.RUN,
        partition_key=run.partition_key,
        source_run_pk=run.id,
        # One event per asset, extra and run: a recovered run cannot emit twice.
        dedup_key=f"run:{run.run_id}:{json.dumps(extra, sort_keys=True)}"[:1500],
    )


def _command(settings: Settings, spec_path: Path, result_path: Path) -> list[str]:
    arguments = [str(spec_path), str(result_path)]
    if settings.spark.mode == "submit":
        submit = os.path.join(os.path.dirname(sys.executable), "spark-submit")
        return [submit, "--master", settings.spark.master, runner.__file__, *arguments]
    return [sys.executable, "-m", "triggerer.runner", *arguments]


async def _terminate(process: anyio.abc.Process) -> None:
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    with anyio.move_on_after(KILL_GRACE_S):
        await process.wait()
        return
    os.killpg(process.pid, signal.SIGKILL)
    await process.wait()


def retry_at(try_number: int, delay_s: float) -> datetime:
    """When a failed try may run again: ``delay_s`` doubling with each try."""
    return utcnow() + timedelta(seconds=delay_s * 2 ** max(0, try_number - 1))
