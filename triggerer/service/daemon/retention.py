"""Retention: what the store no longer needs is deleted, in small batches.

Four kinds age out, each after its own ``[retention]`` days (``0`` keeps that kind):

- **runs** that are over (success, failed, cancelled) and ended before their cut-off, with
  their logs in the store (``run_log_chunk``), their log folders (``[spark]
  logs_dir/<pipeline_id>/<run_id>``) and the links to the events they consumed;
- **events** stored before their cut-off, except those still needed: queued for a pipeline,
  or consumed by a run that has not ended;
- **dead letters** written before their cut-off;
- **audit rows** (:mod:`triggerer.service.audit`) recorded before their cut-off.

Each batch is one short transaction of at most ``batch_size`` rows, and the next waits as long
as that one took: on SQLite, where every write waits for the one writer, ingest gets the store
at least half the time. The daemon runs a pass every ``interval_s`` on the one instance that
holds the ``retention`` lease; ``triggerer db clean`` runs the same batches by hand.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import structlog
from sqlalchemy import ColumnElement, delete, func, select, tuple_
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from triggerer.service import audit, metrics
from triggerer.service.store import models
from triggerer.service.store.states import FINISHED_RUN_STATES
from triggerer.service.store.types import utcnow

if TYPE_CHECKING:
    from triggerer.service.config import RetentionSettings
    from triggerer.service.daemon.leases import Leases

log = structlog.get_logger(__name__)

LEASE = "retention"
"""The lease whose holder runs the passes: one instance at a time."""
KINDS = ("runs", "log_chunks", "log_folders", "events", "dead_letters", "audit")
"""What retention deletes, as counted in its log lines, metrics and ``db clean``'s output."""

Counts = dict[str, int]
"""How many of each of :data:`KINDS`."""

_EVENT = models.AssetEvent
_RUN = models.Run
_LOG_CHUNK = models.RunLogChunk
_DEAD_LETTER = models.DeadLetter


@dataclasses.dataclass(frozen=True)
class Cutoffs:
    """What is older than these goes; ``None`` keeps that kind."""

    events: datetime | None = None
    runs: datetime | None = None
    dead_letters: datetime | None = None
    audit: datetime | None = None

    @classmethod
    def of(cls, settings: RetentionSettings, now: datetime) -> Cutoffs:
        """The cut-offs of ``[retention]`` at ``now``."""

        def days_ago(days: int) -> datetime | None:
            return now - timedelta(days=days) if days else None

        return cls(
            events=days_ago(settings.events_days),
            runs=days_ago(settings.runs_days),
            dead_letters=days_ago(settings.dead_letters_days),
            audit=days_ago(settings.audit_days),
        )

    @classmethod
    def before(cls, moment: datetime) -> Cutoffs:
        """Every kind from before ``moment`` (``db clean --before``)."""
        return cls(events=moment, runs=moment, dead_letters=moment, audit=moment)

    @property
    def any(self) -> bool:
        """Whether any kind goes at all."""
        cutoffs = (self.events, self.runs, self.dead_letters, self.audit)
        return any(cutoff is not None for cutoff in cutoffs)


def log_folders(logs_dir: Path, pipeline_id: str, run_id: str, log_path: str | None) -> set[Path]:
    """The folders holding a run's logs: ``logs_dir/<pipeline_id>/<run_id>``, and the folder of
    its last log file when that is another one of the same shape (``logs_dir`` changed since).

    An id that is no plain folder name (empty, ``.``, ``..``, a separator in it) gives nothing:
    a folder is deleted only where the launcher would have made it.
    """
    if not (_plain_name(pipeline_id) and _plain_name(run_id)):
        return set()
    folders = {logs_dir / pipeline_id / run_id}
    if log_path is not None:
        folder = Path(log_path).parent
        if folder.name == run_id and folder.parent.name == pipeline_id:
            folders.add(folder)
    return folders


def _folders_of(logs_dir: Path, runs: Iterable[Sequence[Any]]) -> set[Path]:
    """The log folders of ``runs``, each ``(pipeline_id, run_id, log_path)``."""
    folders: set[Path] = set()
    for pipeline_id, run_id, log_path in runs:
        folders |= log_folders(logs_dir, pipeline_id, run_id, log_path)
    return folders


def _plain_name(name: str) -> bool:
    return name not in ("", ".", "..") and "/" not in name and "\\" not in name and "\0" not in name


# -- what goes


def _old_runs(cutoff: datetime) -> ColumnElement[bool]:
    return _RUN.state.in_(FINISHED_RUN_STATES) & (_RUN.end_date < cutoff)


def _still_needed() -> ColumnElement[bool]:
    """An event that a pipeline's queue holds, or that a run which has not ended consumed."""
    queued = select(models.QueuedEvent.id).where(models.QueuedEvent.event_id == _EVENT.id)
    consumed = (
        select(models.RunEvent.event_id)
        .join(_RUN, _RUN.id == models.RunEvent.run_pk)
        .where(models.RunEvent.event_id == _EVENT.id, _RUN.state.not_in(FINISHED_RUN_STATES))
    )
    return queued.exists() | consumed.exists()


# -- deleting


@dataclasses.dataclass
class _Batches:
    sessions: async_sessionmaker[AsyncSession]
    size: int
    go_on: Callable[[], bool]
    on_deleted: Callable[[Mapping[str, int]], None]
    deleted: Counts = dataclasses.field(default_factory=lambda: dict.fromkeys(KINDS, 0))

    def count(self, **deleted: int) -> None:
        for kind, count in deleted.items():
            self.deleted[kind] += count
        self.on_deleted(deleted)

    async def pause(self, started: float) -> None:
        """Wait as long as the batch begun at ``started`` took, so others get the store."""
        await anyio.sleep(anyio.current_time() - started)


async def clean(
    sessions: async_sessionmaker[AsyncSession],
    cutoffs: Cutoffs,
    logs_dir: Path,
    *,
    batch_size: int,
    go_on: Callable[[], bool] = lambda: True,
    on_deleted: Callable[[Mapping[str, int]], None] = lambda _: None,
) -> Counts:
    """Delete what is older than ``cutoffs``, in batches of at most ``batch_size`` rows, each
    its own transaction; before each batch ``go_on()`` may say stop. ``on_deleted`` hears of
    each batch's counts as it commits. The counts of the whole."""
    batches = _Batches(sessions, batch_size, go_on, on_deleted)
    if cutoffs.runs is not None:
        await _clean_runs(batches, cutoffs.runs, logs_dir)
    if cutoffs.events is not None:
        await _clean_events(batches, cutoffs.events)
    if cutoffs.dead_letters is not None:
        await _clean_dead_letters(batches, cutoffs.dead_letters)
    if cutoffs.audit is not None:
        await _clean_audit(batches, cutoffs.audit)
    return batches.deleted


async def _clean_runs(batches: _Batches, cutoff: datetime, logs_dir: Path) -> None:
    """Ended runs, oldest end first: their log folders, their logs in the store, then their
    rows (a folder is never left behind by a row deleted before it; a row whose folder went is
    deleted next batch)."""
    candidates = (
        select(_RUN.id, _RUN.pipeline_id, _RUN.run_id, _RUN.log_path)
        .where(_old_runs(cutoff))
        .order_by(_RUN.end_date, _RUN.id)
        .limit(batches.size)
    )
    while batches.go_on():
        started = anyio.current_time()
        async with batches.sessions() as session:
            rows = (await session.execute(candidates)).all()
        if not rows:
            return
        folders = _folders_of(logs_dir, [row[1:] for row in rows])
        removed = await anyio.to_thread.run_sync(_remove_folders, folders)
        batches.count(log_folders=removed)
        if not await _clean_log_chunks(batches, [row.id for row in rows]):
            return
        async with batches.sessions.begin() as session:
            result = await session.execute(
                delete(_RUN).where(_RUN.id.in_([row.id for row in rows]), _old_runs(cutoff))
            )
        batches.count(runs=_rowcount(result))
        if len(rows) < batches.size:
            return
        await batches.pause(started)


async def _clean_log_chunks(batches: _Batches, run_pks: list[int]) -> bool:
    """The logs of the runs ``run_pks`` in the store, in batches of chunks (a run's log may be
    thousands); whether all went (``go_on()`` may say stop between two)."""
    chunks = (
        select(_LOG_CHUNK.run_pk, _LOG_CHUNK.try_number, _LOG_CHUNK.seq)
        .where(_LOG_CHUNK.run_pk.in_(run_pks))
        .limit(batches.size)
    )
    key = tuple_(_LOG_CHUNK.run_pk, _LOG_CHUNK.try_number, _LOG_CHUNK.seq)
    while True:
        started = anyio.current_time()
        async with batches.sessions.begin() as session:
            result = await session.execute(delete(_LOG_CHUNK).where(key.in_(chunks)))
        deleted = _rowcount(result)
        batches.count(log_chunks=deleted)
        if deleted < batches.size:
            return True
        await batches.pause(started)
        if not batches.go_on():
            return False


def _remove_folders(folders: set[Path]) -> int:
    """Delete each folder with what it holds; how many there were. One that cannot be deleted
    is logged and left: its run goes all the same."""
    removed = 0
    for folder in folders:
        try:
            shutil.rmtree(folder)
        except FileNotFoundError:
            continue
        except OSError as error:
            log.warning("retention_log_folder_failed", path=str(folder), error=str(error))
            continue
        removed += 1
    return removed


async def _clean_events(batches: _Batches, cutoff: datetime) -> None:
    """Old events by id, skipping those still needed; a cursor on the id steps over those, so
    a paused pipeline's long queue is read once per pass, not once per batch.

    Events are stored with the time they are written, so ids grow with time: the pass reads
    ids up to the first event stored at the cut-off or later (found through the timestamp
    index) instead of every newer event. An old event past that id (another instance's clock
    behind) waits for a later pass.
    """
    async with batches.sessions() as session:
        newest = await session.scalar(
            select(_EVENT.id).where(_EVENT.timestamp >= cutoff).order_by(_EVENT.timestamp).limit(1)
        )
    old = _EVENT.timestamp < cutoff
    if newest is not None:
        old &= _EVENT.id < newest
    after = 0
    while batches.go_on():
        started = anyio.current_time()
        async with batches.sessions.begin() as session:
            ids = list(
                (
                    await session.scalars(
                        select(_EVENT.id)
                        .where(old, _EVENT.id > after)
                        .order_by(_EVENT.id)
                        .limit(batches.size)
                    )
                ).all()
            )
            if not ids:
                return
            # On PostgreSQL, first locked: a replay or a re-run that links one of them now
            # (its foreign key check holds the row) is waited for, and the delete's own check,
            # in a snapshot taken after, sees its link; one that links it later waits for this
            # commit and is refused, never left linking a deleted event. SQLite has one writer.
            deletable = list(
                (
                    await session.scalars(
                        select(_EVENT.id)
                        .where(_EVENT.id.in_(ids), ~_still_needed())
                        .with_for_update(of=_EVENT)
                    )
                ).all()
            )
            deleted = 0
            if deletable:
                result = await session.execute(
                    delete(_EVENT).where(_EVENT.id.in_(deletable), ~_still_needed())
                )
                deleted = _rowcount(result)
        batches.count(events=deleted)
        if len(ids) < batches.size:
            return
        after = ids[-1]
        await batches.pause(started)


async def _clean_dead_letters(batches: _Batches, cutoff: datetime) -> None:
    oldest = (
        select(_DEAD_LETTER.id)
        .where(_DEAD_LETTER.created_at < cutoff)
        .order_by(_DEAD_LETTER.created_at)
        .limit(batches.size)
    )
    while batches.go_on():
        started = anyio.current_time()
        async with batches.sessions.begin() as session:
            result = await session.execute(delete(_DEAD_LETTER).where(_DEAD_LETTER.id.in_(oldest)))
        deleted = _rowcount(result)
        batches.count(dead_letters=deleted)
        if deleted < batches.size:
            return
        await batches.pause(started)


async def _clean_audit(batches: _Batches, cutoff: datetime) -> None:
    while batches.go_on():
        started = anyio.current_time()
        async with batches.sessions.begin() as session:
            deleted = await audit.prune(session, cutoff, batches.size)
        batches.count(audit=deleted)
        if deleted < batches.size:
            return
        await batches.pause(started)


def _rowcount(result: object) -> int:
    return int(result.rowcount)  # type: ignore[attr-defined]  # a CursorResult


# -- what would go


@dataclasses.dataclass(frozen=True)
class Preview:
    """What :func:`clean` would delete now, and the old events it would keep."""

    counts: Counts
    kept_events: int
    """Events older than their cut-off that are still needed."""


async def preview(session: AsyncSession, cutoffs: Cutoffs, logs_dir: Path) -> Preview:
    """What :func:`clean` with ``cutoffs`` would delete now (``db clean --dry-run``)."""
    counts = dict.fromkeys(KINDS, 0)
    if cutoffs.runs is not None:
        rows = (
            await session.execute(
                select(_RUN.pipeline_id, _RUN.run_id, _RUN.log_path).where(_old_runs(cutoffs.runs))
            )
        ).all()
        counts["runs"] = len(rows)
        counts["log_chunks"] = int(
            await session.scalar(
                select(func.count())
                .select_from(_LOG_CHUNK)
                .join(_RUN, _RUN.id == _LOG_CHUNK.run_pk)
                .where(_old_runs(cutoffs.runs))
            )
            or 0
        )
        folders = _folders_of(logs_dir, rows)
        counts["log_folders"] = await anyio.to_thread.run_sync(_existing, folders)
    kept = 0
    if cutoffs.events is not None:
        old = _EVENT.timestamp < cutoffs.events
        counts["events"] = await _count(session, _EVENT, old & ~_still_needed())
        kept = await _count(session, _EVENT, old) - counts["events"]
    if cutoffs.dead_letters is not None:
        counts["dead_letters"] = await _count(
            session, _DEAD_LETTER, _DEAD_LETTER.created_at < cutoffs.dead_letters
        )
    if cutoffs.audit is not None:
        counts["audit"] = await audit.count_before(session, cutoffs.audit)
    return Preview(counts, kept)


async def kept_events(session: AsyncSession, cutoff: datetime) -> int:
    """Events older than ``cutoff`` left after a clean: those still needed."""
    return await _count(session, _EVENT, _EVENT.timestamp < cutoff)


async def _count(
    session: AsyncSession, table: type[models.Base], where: ColumnElement[bool]
) -> int:
    return int(await session.scalar(select(func.count()).select_from(table).where(where)) or 0)


def _existing(folders: set[Path]) -> int:
    return sum(folder.is_dir() for folder in folders)


# -- the daemon's passes


class Retention:
    """The daemon's retention: a pass every ``interval_s`` while this instance holds the
    :data:`LEASE` (claimed before each pass, renewed by the heartbeat)."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        settings: RetentionSettings,
        logs_dir: Path,
        leases: Leases,
    ) -> None:
        self._sessions = sessions
        self._settings = settings
        self._logs_dir = logs_dir
        self._leases = leases

    async def run(self) -> None:
        """Passes until cancelled; the first at once. Nothing to keep for a limited time (every
        kind ``0`` days): no pass, and no lease."""
        if not Cutoffs.of(self._settings, utcnow()).any:
            return
        metrics.retention_deleted(dict.fromkeys(KINDS, 0))  # the series exist from the start
        while True:
            if await self._leases.claim(LEASE):
                await self.run_pass()
            await anyio.sleep(self._settings.interval_s)

    async def run_pass(self) -> Counts:
        """Delete what is past its time, until done or the lease is lost; logged as
        ``retention_pass``."""
        started = anyio.current_time()
        deleted = await clean(
            self._sessions,
            Cutoffs.of(self._settings, utcnow()),
            self._logs_dir,
            batch_size=self._settings.batch_size,
            go_on=lambda: LEASE in self._leases.held,
            on_deleted=metrics.retention_deleted,
        )
        log.info("retention_pass", **deleted, duration_s=round(anyio.current_time() - started, 3))
        return deleted
