"""The launcher: claims queued runs, runs each in a child process, records how it ended.

A run that succeeds commits its outlet events together with its final state; one that fails
emits nothing and is retried with backoff while it has tries left; one cancelled while it runs
has its process group stopped and ends ``cancelled``, emitting nothing and never retried.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import subprocess
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import msgspec
import structlog
from anyio.abc import TaskGroup
from sqlalchemy import or_, select, update
from sqlalchemy.exc import IntegrityError, StatementError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker
from sqlalchemy.orm import aliased

from triggerer.assets import Asset, AssetAlias
from triggerer.service import metrics
from triggerer.service.dead_letters import unstorable
from triggerer.service.events import NewEvent, Recorded, record_events
from triggerer.service.runs.forks import ForkerUnavailable, RunForks, modules_ahead
from triggerer.service.runs.inlets import serving as inlet_events
from triggerer.service.runs.log_shipping import LogShipper
from triggerer.service.runs.processes import Process, terminate
from triggerer.service.runs.run_process import Ended, ended, run_command, run_env, run_spec
from triggerer.service.runs.spec import RunSpec, SpecAsset, SpecEvent
from triggerer.service.scheduling.registry import (
    DefinitionChanges,
    Registry,
    ensure_alias,
    ensure_asset,
)
from triggerer.service.store import models
from triggerer.service.store.failures import STORE_ERRORS, is_outage
from triggerer.service.store.outages import until_stored
from triggerer.service.store.states import FINISHED_RUN_STATES, EventSource, RunState
from triggerer.service.store.types import storable_text, utcnow
from triggerer.service.trace_context import TraceContext, stored
from triggerer.service.tracing import Consumed, now_ns

if TYPE_CHECKING:
    from triggerer.pipelines import Pipeline
    from triggerer.service.config import Settings
    from triggerer.service.runs.lineage_emitter import LineageEmitter
    from triggerer.service.runs.spark_server import LocalSparkServer
    from triggerer.service.tracing import RunSpan, Tracing

log = structlog.get_logger(__name__)

POLL_S = 5.0
UNRECORDABLE = (IntegrityError, LookupError, TypeError, ValueError, StatementError)
"""What recording a malformed or conflicting run result raises: the run fails, not the daemon.
(A ``StatementError`` that is not a ``DBAPIError`` is a value the driver could not send.)"""
MAX_RETRY_S = 86_400.0
"""The longest wait before a failed try runs again, however many tries failed before."""


class Launcher:
    """Starts runs as they are created; a run's process dies with the daemon.

    Once a run's end is committed, ``on_run_finished`` gets its pipeline to evaluate again (a
    slot under ``max_active_runs`` is free), and a successful run's outlets are reported: the
    assets and aliases they created to ``on_definitions``, their events (which wake their
    consumers) to ``on_events``.

    With ``tracing``, each try is a span linked to the trace context of every event it
    consumed; the run's process gets the span's context (``RunSpec.trace_context``), and so do
    the outlet events it emits.
    """

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        registry: Callable[[], Registry],
        settings: Settings,
        instance_id: str,
        on_run_finished: Callable[[set[str]], None],
        *,
        on_events: Callable[[Recorded], None],
        on_definitions: Callable[[DefinitionChanges], None],
        spark_server: LocalSparkServer | None = None,
        lineage: LineageEmitter,
        tracing: Tracing | None = None,
    ) -> None:
        self._sessions = sessions
        self._tracing = tracing
        self._spark_server = spark_server
        self._run_forks = RunForks(self._run_env, self._modules_ahead)
        self._registry = registry
        self._settings = settings
        self._instance_id = instance_id
        self._on_run_finished = on_run_finished
        self._on_events = on_events
        self._on_definitions = on_definitions
        self._lineage = lineage
        self._woken = anyio.Event()
        self._accepting = True
        # A run is in progress from its claim until its end is recorded; each has a scope
        # that interrupt() cancels.
        self._in_progress: dict[int, anyio.CancelScope] = {}
        self._idle = anyio.Event()
        self._idle.set()
        self._cancel_asked = anyio.Event()
        self._stopping_cancelled = False

    async def wait_idle(self) -> None:
        """Return once no run is in progress."""
        await self._idle.wait()

    def interrupt(self) -> None:
        """Stop every run in progress (shutdown past its grace): each is queued to run again."""
        for scope in self._in_progress.values():
            scope.cancel()

    def wake(self) -> None:
        self._woken.set()

    def cancel_requested(self) -> None:
        """A running run was cancelled (committed): it is stopped if it runs here."""
        self._cancel_asked.set()

    def stop_accepting(self) -> None:
        """Claim no more runs (shutdown); runs in progress go on."""
        self._accepting = False
        self._woken.set()

    async def run(self, task_group: TaskGroup) -> None:
        """Claim runs, oldest first and at most ``[runs] parallelism`` in progress at once, and
        start them in ``task_group`` until cancelled or stopped."""
        self._run_forks.serve_in(task_group)
        if not self._stopping_cancelled:  # once, however often a store outage restarts this
            self._stopping_cancelled = True
            task_group.start_soon(self._stop_cancelled)
        try:
            while self._accepting:
                if self._spark_server is not None:
                    await self._spark_server.wait_ready()  # runs wait while it (re)starts
                self._woken = anyio.Event()
                free = self._settings.runs.parallelism - len(self._in_progress)
                for run_pk in await self._claimable(free) if free > 0 else ():
                    if not self._accepting:
                        break
                    if await self._claim(run_pk):
                        self._in_progress[run_pk] = anyio.CancelScope()
                        self._idle = anyio.Event()
                        task_group.start_soon(self._execute, run_pk)
                    else:
                        self._woken.set()  # another instance took it: look for the next one
                with anyio.move_on_after(POLL_S):
                    await self._woken.wait()
        finally:
            with anyio.CancelScope(shield=True):
                await self._run_forks.close()

    async def _stop_cancelled(self) -> None:
        """Stop the runs in progress here that were cancelled, once told and at the latest
        every ``POLL_S`` (a cancel by another process comes as a notice, and the look covers a
        lost one): each is interrupted (its process group stopped) and recorded
        ``cancelled`` (:meth:`_record`). Runs through shutdown's grace period too."""
        while True:
            with anyio.move_on_after(POLL_S):
                await self._cancel_asked.wait()
            self._cancel_asked = anyio.Event()
            if not self._in_progress:
                continue
            for run_pk, run_id in await until_stored(self._cancelled_here, during="cancel check"):
                scope = self._in_progress.get(run_pk)
                if scope is not None and not scope.cancel_called:
                    log.info("run_cancelled", run_id=run_id)
                    scope.cancel()

    async def _cancelled_here(self) -> list[tuple[int, str]]:
        """The runs this instance runs that were cancelled: ``(id, run_id)``."""
        async with self._sessions() as session:
            rows = await session.execute(
                select(models.Run.id, models.Run.run_id).where(
                    models.Run.state == RunState.CANCELLING,
                    models.Run.owner == self._instance_id,
                )
            )
            return [(run_pk, run_id) for run_pk, run_id in rows.all()]

    async def _claimable(self, limit: int) -> list[int]:
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
                .limit(limit)
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
        span: RunSpan | None = None
        finished: Finished | None = None
        try:
            ended = Ended(interrupted=True)
            log_path: Path | None = None
            started_ns = now_ns() if self._tracing is not None else 0
            with self._in_progress[run_pk]:
                run, spec, consumed = await until_stored(
                    lambda: self._read(run_pk), during="run start"
                )
                if self._tracing is not None:
                    span = self._tracing.run_started(
                        run_id=run.run_id,
                        pipeline_id=run.pipeline_id,
                        try_number=run.try_number,
                        consumed=consumed,
                        started_ns=started_ns,
                    )
                    if spec is not None and span.context is not None:
                        trace_context = span.context.traceparent
                        spec = msgspec.structs.replace(spec, trace_context=trace_context)
                structlog.contextvars.bind_contextvars(run_id=run.run_id)
                folder = Path(self._settings.spark.logs_dir) / run.pipeline_id / run.run_id
                log_path = folder / f"try-{run.try_number}.log"
                log.info("run_started", pipeline_id=run.pipeline_id, try_number=run.try_number)
                self._lineage.run_started(run_pk, run.try_number)
                shipper = LogShipper(
                    self._sessions,
                    run_pk,
                    run.try_number,
                    log_path,
                    self._settings.runs.log_max_bytes,
                )
                await shipper.begin()
                try:
                    ended = await self._try(run, spec, folder, shipper)
                finally:
                    # The whole log is in the store before the try's end is recorded.
                    with anyio.CancelScope(shield=True):
                        await shipper.finish()
            # Recorded even when shutdown interrupted the run (it is queued to run again), and
            # however long the store is away: a run is never left running with no process.
            trace = span.context if span is not None else None
            with anyio.CancelScope(shield=True):
                finished = await until_stored(
                    lambda: self._finish(run_pk, ended, log_path, trace), during="run end"
                )
            if finished is None:
                return
            log.info("run_finished", run_pk=run_pk, state=finished.state, error=ended.error)
            metrics.run_finished(
                finished.pipeline_id, finished.state, finished.started, finished.ended
            )
            self._lineage.run_ended(run_pk, finished.state)
            self._on_run_finished({finished.pipeline_id})
            if finished.outlets is not None:
                self._on_definitions(finished.outlets.changes)
                self._on_events(finished.outlets.recorded)
        finally:
            if span is not None:
                span.end(finished.state if finished is not None else None, ended.error)
            del self._in_progress[run_pk]
            if not self._in_progress:
                self._idle.set()
            self.wake()  # a slot is free for the next queued run

    async def _try(
        self, run: models.Run, spec: RunSpec | None, folder: Path, shipper: LogShipper
    ) -> Ended:
        """Run one try of ``run`` in a child process, its log shipped by ``shipper``."""
        if spec is None:
            return Ended(error=f"pipeline {run.pipeline_id!r} is no longer defined")
        pipeline = self._registry().pipelines.get(run.pipeline_id)
        timeout_s = None if pipeline is None else pipeline.timeout_s
        inlets = [] if pipeline is None else pipeline.inlets
        try:
            return await self._run_child(spec, folder, shipper, run.try_number, timeout_s, inlets)
        except ForkerUnavailable as error:  # a try that failed, as any other
            return Ended(error=str(error))
        except OSError as error:  # its folder or process could not be made
            return Ended(error=f"the run could not start: {error}")

    async def _read(self, run_pk: int) -> tuple[models.Run, RunSpec | None, list[Consumed]]:
        """The claimed run, the spec its child process runs (``None``: no such pipeline), and
        the events it consumes as its span links them."""
        async with self._sessions() as session:
            run = await session.get_one(models.Run, run_pk)
            pipeline = self._registry().pipelines.get(run.pipeline_id)
            if pipeline is None or pipeline.fileloc is None:  # (the registry's have a file)
                return run, None, []
            return run, *await self._spec(session, run, pipeline, pipeline.fileloc)

    async def _run_child(
        self,
        spec: RunSpec,
        folder: Path,
        shipper: LogShipper,
        try_number: int,
        timeout_s: float | None,
        inlets: Sequence[Asset | AssetAlias],
    ) -> Ended:
        spec_path, result_path = folder / "spec.json", folder / f"result-{try_number}.json"
        await anyio.Path(folder).mkdir(parents=True, exist_ok=True)
        async with contextlib.AsyncExitStack() as serving:
            if inlets:  # the run reads them from the daemon, holding no database credential
                socket = await serving.enter_async_context(inlet_events(self._sessions, inlets))
                spec = msgspec.structs.replace(spec, inlets_socket=socket)
            # What triggered the run is its owner's business alone; and the spec is gone once
            # the try has ended (the child reads it as it starts).
            await anyio.to_thread.run_sync(_write_private, spec_path, msgspec.json.encode(spec))
            try:
                return await self._run_process(spec, spec_path, result_path, shipper, timeout_s)
            finally:
                with anyio.CancelScope(shield=True):
                    await anyio.Path(spec_path).unlink(missing_ok=True)

    async def _run_process(
        self,
        spec: RunSpec,
        spec_path: Path,
        result_path: Path,
        shipper: LogShipper,
        timeout_s: float | None,
    ) -> Ended:
        log_path = shipper.path
        process: Process
        if spec.spark.mode == "connect":
            process = await self._run_forks.start_run(spec_path, result_path, log_path)
        else:
            env = self._run_env(spec.trace_context)
            command = run_command(self._settings.spark, spec_path, result_path, env["SPARK_HOME"])
            with log_path.open("ab") as log_file:
                # A process group of its own: terminate() stops the run's whole process tree.
                process = await anyio.open_process(
                    command,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                )
        try:
            with anyio.move_on_after(math.inf if timeout_s is None else timeout_s) as limit:
                returncode = await shipper.while_waiting(process.wait)
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                await terminate(process)
            raise
        if limit.cancelled_caught:  # the pipeline's timeout_s: its process group is stopped
            with anyio.CancelScope(shield=True):
                await terminate(process)
            log.warning("run_timed_out", timeout_s=timeout_s)
            return Ended(error=f"timed out after {timeout_s:g} s (timeout_s), see {log_path}")
        return await ended(returncode, result_path, str(log_path))

    def _run_env(self, trace_context: str | None = None) -> dict[str, str]:
        env = run_env(self._settings.spark, trace_context)
        if self._spark_server is not None:
            env |= self._spark_server.client_env
        return env

    def _modules_ahead(self) -> frozenset[str]:
        """What the run forker imports ahead: the modules of the pipelines' triggers."""
        triggers = (watched.trigger for watched in self._registry().triggers.values())
        return modules_ahead(triggers, Path(self._settings.pipelines.dir))

    async def _spec(
        self, session: AsyncSession, run: models.Run, pipeline: Pipeline, fileloc: str
    ) -> tuple[RunSpec, list[Consumed]]:
        producer = aliased(models.Run)
        rows = await session.execute(
            select(models.AssetEvent, models.Asset, producer.run_id)
            .join(models.RunEvent, models.RunEvent.event_id == models.AssetEvent.id)
            .join(models.Asset, models.Asset.id == models.AssetEvent.asset_id)
            .outerjoin(producer, producer.id == models.AssetEvent.source_run_pk)
            .where(models.RunEvent.run_pk == run.id)
            .order_by(models.AssetEvent.id)
        )
        read = rows.all()
        events = [
            SpecEvent(
                id=event.id,
                asset=SpecAsset(asset.name, asset.uri),
                extra=event.extra,
                timestamp=event.timestamp,
                source=event.source,
                partition_key=event.partition_key,
                source_run_id=source_run_id,
            )
            for event, asset, source_run_id in read
        ]
        consumed = [
            Consumed(event.id, asset.name, stored(event.traceparent, event.tracestate))
            for event, asset, _ in read
        ]
        # Local mode: the run is a client of the daemon's warm Connect server.
        server = None if self._spark_server is None else await self._spark_server.wait_ready()
        spec = run_spec(
            pipeline,
            fileloc,
            self._settings.spark,
            run_id=run.run_id,
            try_number=run.try_number,
            partition_key=run.partition_key,
            params=run.params,
            events=events,
            pipelines_dir=str(self._settings.pipelines.dir),
            local_server=server,
        )
        return spec, consumed

    async def _finish(
        self, run_pk: int, ended: Ended, log_path: Path | None, trace: TraceContext | None
    ) -> Finished | None:
        """Record how a try ended (its new state, the pipelines to evaluate again, its outlets,
        which carry ``trace``, its span's context); ``None`` when the run is no longer this
        instance's to record.

        A result that cannot be recorded (outlets the store rejects) fails the run with the
        reason instead of failing the daemon.
        """
        try:
            return await self._record(run_pk, ended, log_path, trace)
        except (*UNRECORDABLE, *STORE_ERRORS) as error:
            if ended.result is None or is_outage(error):
                raise
            failed = Ended(error=f"its outlet events could not be recorded: {error}")
            log.error("run_outlets_unrecordable", run_pk=run_pk, error=str(error))
            return await self._record(run_pk, failed, log_path, trace)

    async def _record(
        self, run_pk: int, ended: Ended, log_path: Path | None, trace: TraceContext | None
    ) -> Finished | None:
        outlets = None
        async with self._sessions.begin() as session:
            run = await session.get_one(models.Run, run_pk, with_for_update=True)
            if run.owner != self._instance_id or run.state in FINISHED_RUN_STATES:
                # Another instance took this one for dead (it was silent past dead_after_s):
                # it queued the run again, or ended it as cancelled. Its record counts.
                log.warning("run_taken_over", owner=run.owner, state=run.state)
                return None
            run.log_path = str(log_path) if log_path else run.log_path
            run.end_date = end_date = utcnow()
            if run.state == RunState.CANCELLING:  # however the try ended: no outlets, no retry
                run.state = RunState.CANCELLED
            elif ended.interrupted:
                run.state, run.try_number = RunState.QUEUED, run.try_number - 1
            elif ended.result is not None:
                run.state = RunState.SUCCESS
                outlets = await _record_outlets(session, run, ended.result, trace)
            elif run.try_number < run.max_tries:
                pipeline = self._registry().pipelines.get(run.pipeline_id)
                delay_s = pipeline.retry_delay_s if pipeline is not None else 10.0
                run.state, run.error = RunState.UP_FOR_RETRY, _storable(ended.error)
                run.next_try_at = retry_at(run.try_number, delay_s)
            else:
                run.state, run.error = RunState.FAILED, _storable(ended.error)
        return Finished(run.pipeline_id, run.state, run.start_date, end_date, outlets)


@dataclasses.dataclass(frozen=True)
class Outlets:
    """What a successful run's outlets committed: events, and assets and aliases created."""

    recorded: Recorded
    changes: DefinitionChanges


@dataclasses.dataclass(frozen=True)
class Finished:
    """A try's end as recorded."""

    pipeline_id: str
    state: str
    started: datetime | None
    ended: datetime
    outlets: Outlets | None


def _write_private(path: Path, data: bytes) -> None:
    """Write ``path`` created with mode 0600 (a spec left by a crash is replaced)."""
    path.unlink(missing_ok=True)
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as file:
        file.write(data)


async def _record_outlets(
    session: AsyncSession, run: models.Run, result: dict[str, Any], trace: TraceContext | None
) -> Outlets:
    changes = DefinitionChanges()
    events: dict[tuple[int, str], NewEvent] = {}
    through: dict[tuple[int, str], set[int]] = {}
    for outlet in result["assets"]:
        asset = Asset(outlet["name"], outlet["uri"])
        asset_id = await ensure_asset(session, asset, define=False, changes=changes)
        key = (asset_id, json.dumps(outlet["extra"], sort_keys=True))
        events[key] = _outlet_event(asset_id, asset.uri, outlet["extra"], run, trace)
    for add in result["alias_adds"]:
        asset = Asset(add["name"], add["uri"])
        asset_id = await ensure_asset(session, asset, define=False, changes=changes)
        alias_id = await ensure_alias(session, AssetAlias(add["alias"]), changes)
        await session.merge(models.AssetAliasAsset(alias_id=alias_id, asset_id=asset_id))
        # The same asset with the same extra through several aliases is one event.
        key = (asset_id, json.dumps(add["extra"], sort_keys=True))
        events.setdefault(key, _outlet_event(asset_id, asset.uri, add["extra"], run, trace))
        through.setdefault(key, set()).add(alias_id)
    await session.flush()
    recorded = await record_events(session, list(events.values()))
    # Two assets with the same extra have the same dedup key: an event is its asset and key.
    event_ids = {(event.asset_id, event.dedup_key): event.id for event in recorded.events}
    for key, alias_ids in through.items():
        event_id = event_ids.get((key[0], events[key].dedup_key))
        if event_id is not None:
            session.add_all(
                models.AssetEventAlias(event_id=event_id, alias_id=alias_id)
                for alias_id in alias_ids
            )
    return Outlets(recorded, changes)


def _storable(error: str | None) -> str | None:
    """A try's error as the store can hold it (it may name a file or quote user code)."""
    return None if error is None else storable_text(error)


def _outlet_event(
    asset_id: int, uri: str, extra: dict[str, Any], run: models.Run, trace: TraceContext | None
) -> NewEvent:
    event = NewEvent(
        asset_id=asset_id,
        extra=extra,
        source=EventSource.RUN,
        partition_key=run.partition_key,
        source_run_pk=run.id,
        # One event per asset, extra and run: a recovered run cannot emit twice.
        dedup_key=f"run:{run.run_id}:{json.dumps(extra, sort_keys=True)}"[:1500],
        # The run's span's context: a downstream run links back to it.
        traceparent=trace.traceparent if trace is not None else None,
    )
    reason = unstorable(event)
    if reason is not None:
        raise ValueError(f"the event of {uri!r}: {reason}")
    return event


def retry_at(try_number: int, delay_s: float) -> datetime:
    """When a failed try may run again: ``delay_s`` doubling with each try, up to a day."""
    doublings = min(max(0, try_number - 1), 64)  # a day is reached long before
    return utcnow() + timedelta(seconds=min(delay_s * 2**doublings, MAX_RETRY_S))
