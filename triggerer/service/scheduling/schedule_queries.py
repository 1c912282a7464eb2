"""What the scheduler reads and writes in the store: the statements, and the functions that run
them in the caller's session.

The caller holds the transaction: a run, the exact events it consumes and the deletion of their
queue rows commit together or not at all. Manual runs, queued by the CLI and the REST API, are
written here too, under the same run ids, and re-runs, which consume the events of a run again.
"""

from __future__ import annotations

import hashlib
import uuid
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from sqlalchemy import (
    ColumnElement,
    Row,
    Select,
    and_,
    bindparam,
    delete,
    exists,
    func,
    insert,
    literal,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.ext.asyncio import AsyncSession

from triggerer.service.scheduling.picking import Queued
from triggerer.service.store import models
from triggerer.service.store.models import ID_LENGTH
from triggerer.service.store.notices import notify_runs
from triggerer.service.store.states import ACTIVE_RUN_STATES, RefRole, RunState, RunType
from triggerer.service.store.types import utcnow

if TYPE_CHECKING:
    from triggerer.assets import AssetAlias, BaseAsset
    from triggerer.pipelines import Pipeline
    from triggerer.service.scheduling.registry import Registry

K = TypeVar("K", int, str)
"""A key of pipelines or assets, as :func:`_queued_keys` takes them."""

ACTIVE_STATES = ACTIVE_RUN_STATES
"""The states of the runs that count towards a pipeline's ``max_active_runs``."""


class ConsumedElsewhere(Exception):
    """Another scheduler consumed some of the picked events first."""


class PipelineState(NamedTuple):
    """What the scheduler reads of a pipeline's row before evaluating it, in one statement."""

    paused: bool | None
    """``None`` when there is no row."""
    error: str | None
    active_runs: int


NO_ROW = PipelineState(None, None, 0)
"""The state of a pipeline without a row (its file gone, its row not written yet)."""


def compose_run_id(pipeline_id: str, kind: str, suffix: str) -> str:
    """``{pipeline_id}__{kind}__{suffix}``, cut to fit the column: a pipeline id may be as long
    as the column, so a long one is shortened and a digest of it keeps run ids apart."""
    run_id = f"{pipeline_id}__{kind}__{suffix}"
    if len(run_id) <= ID_LENGTH:
        return run_id
    tail = f"~{hashlib.sha256(pipeline_id.encode()).hexdigest()[:16]}__{kind}__{suffix}"
    return pipeline_id[: ID_LENGTH - len(tail)] + tail


def asset_run_id(pipeline_id: str, rows: Sequence[Queued]) -> str:
    """The run id of the run consuming ``rows``, named after its first event: ``asset``, or
    ``replay`` when a replay queued that event again (its first run may carry that name)."""
    first = rows[0]
    return compose_run_id(pipeline_id, "replay" if first.replayed else "asset", str(first.event_id))


# The statements of every pass are built once: building them cost more than running them.
# The active states as one comparison each, not IN: an IN list is rendered on every execution.
_ACTIVE_RUNS = (
    select(func.count())
    .select_from(models.Run)
    .where(
        models.Run.pipeline_id == models.Pipeline.pipeline_id,
        or_(*(models.Run.state == state for state in ACTIVE_STATES)),
    )
    .scalar_subquery()
)
_PIPELINE_STATES = select(
    models.Pipeline.pipeline_id, models.Pipeline.paused, models.Pipeline.error, _ACTIVE_RUNS
).where(models.Pipeline.pipeline_id.in_(bindparam("keys", expanding=True)))


def _with_queued_rows(key: Any, *match: ColumnElement[bool]) -> Select[Any]:
    """Each ``key`` in the bound list ``keys``, with the id of a queue row ``match`` finds for
    it (NULL when none): a scalar subquery with LIMIT 1 runs as one index probe per key, in one
    round trip however many keys, where an EXISTS may be planned as a join over the backlog."""
    first = select(models.QueuedEvent.id).where(*match).limit(1).scalar_subquery()
    return select(key, first).where(key.in_(bindparam("keys", expanding=True)))


_ASSETS_WITH_QUEUED = _with_queued_rows(
    models.Asset.id,
    models.QueuedEvent.pipeline_id == bindparam("pipeline_id"),
    models.QueuedEvent.asset_id == models.Asset.id,
)
_PIPELINES_WITH_QUEUED = _with_queued_rows(
    models.Pipeline.pipeline_id, models.QueuedEvent.pipeline_id == models.Pipeline.pipeline_id
)
_QUEUED_SCHEDULE_ASSETS = select(
    models.PipelineAssetRef.pipeline_id,
    models.PipelineAssetRef.asset_id,
    select(models.QueuedEvent.id)
    .where(
        models.QueuedEvent.pipeline_id == models.PipelineAssetRef.pipeline_id,
        models.QueuedEvent.asset_id == models.PipelineAssetRef.asset_id,
    )
    .limit(1)
    .scalar_subquery(),
).where(
    models.PipelineAssetRef.role == RefRole.SCHEDULE,
    models.PipelineAssetRef.pipeline_id.in_(bindparam("keys", expanding=True)),
)
_FAILING = select(models.Pipeline.pipeline_id).where(
    models.Pipeline.error.is_not(None), models.Pipeline.is_active.is_(True)
)
_ACTIVE_CRON = and_(models.Pipeline.next_cron_at.is_not(None), models.Pipeline.is_active.is_(True))
_DUE_CRON_TICKS = select(models.Pipeline.pipeline_id, models.Pipeline.next_cron_at).where(
    _ACTIVE_CRON, models.Pipeline.next_cron_at <= bindparam("now")
)
_NEXT_CRON_TICK = select(func.min(models.Pipeline.next_cron_at)).where(
    _ACTIVE_CRON, models.Pipeline.next_cron_at > bindparam("now")
)


async def pipeline_states(
    session: AsyncSession, pipeline_ids: list[str]
) -> dict[str, PipelineState]:
    """:func:`pipeline_state` of each of ``pipeline_ids`` that has a row, in one statement."""
    rows = await session.execute(_PIPELINE_STATES, {"keys": pipeline_ids})
    return {pipeline_id: PipelineState(*state) for pipeline_id, *state in rows}


async def pipeline_state(session: AsyncSession, pipeline_id: str) -> PipelineState:
    """Whether the pipeline is paused, its error, and how many of its runs are active."""
    return (await pipeline_states(session, [pipeline_id])).get(pipeline_id, NO_ROW)


async def record_error(
    session: AsyncSession, pipeline_id: str, error: str | None, *, newly_failing: bool
) -> None:
    """Set the pipeline's ``error`` (``None``: it works). ``error_at`` keeps the time it started
    failing: set when ``newly_failing``, cleared with the error."""
    values: dict[str, Any] = {"error": error}
    if error is None:
        values["error_at"] = None
    elif newly_failing:
        values["error_at"] = utcnow()
    await session.execute(
        update(models.Pipeline).where(models.Pipeline.pipeline_id == pipeline_id).values(values)
    )


async def pipelines_with_queued(session: AsyncSession, pipeline_ids: set[str]) -> set[str]:
    """The ``pipeline_ids`` that have queued events."""
    return await _queued_keys(session, _PIPELINES_WITH_QUEUED, pipeline_ids)


async def queued_schedule_assets(
    session: AsyncSession, pipeline_ids: set[str]
) -> dict[str, set[int]]:
    """Of each of ``pipeline_ids``, the assets it is scheduled on (directly, not through an
    alias) that have events queued for it: one index probe per reference, one round trip."""
    found: dict[str, set[int]] = defaultdict(set)
    if pipeline_ids:
        rows = await session.execute(_QUEUED_SCHEDULE_ASSETS, {"keys": sorted(pipeline_ids)})
        for pipeline_id, asset_id, queued in rows:
            if queued is not None:
                found[pipeline_id].add(asset_id)
    return found


async def failing_pipelines(session: AsyncSession) -> set[str]:
    """The active pipelines with an error recorded."""
    return set((await session.scalars(_FAILING)).all())


async def assets_with_queued(
    session: AsyncSession, pipeline_id: str, asset_ids: set[int]
) -> set[int]:
    """The ``asset_ids`` that have events queued for ``pipeline_id``."""
    return await _queued_keys(session, _ASSETS_WITH_QUEUED, asset_ids, pipeline_id=pipeline_id)


async def _queued_keys(
    session: AsyncSession, probes: Select[Any], keys: set[K], **parameters: object
) -> set[K]:
    """The ``keys`` that ``probes`` (made by :func:`_with_queued_rows`) finds queue rows for."""
    if not keys:
        return set()
    rows = await session.execute(probes, {"keys": sorted(keys), **parameters})
    return {key for key, queued in rows.all() if queued is not None}


async def queued_rows_of(session: AsyncSession, pipeline_ids: list[str]) -> dict[str, list[Queued]]:
    """The queue rows of each of ``pipeline_ids``, oldest first, in one statement."""
    statement = (
        select(
            models.QueuedEvent.pipeline_id,
            models.QueuedEvent.id,
            models.QueuedEvent.event_id,
            models.QueuedEvent.asset_id,
            models.QueuedEvent.partition_key,
            models.AssetEvent.timestamp,
            models.QueuedEvent.created_at,
            models.QueuedEvent.replay_id.is_not(None),
        )
        .join(models.AssetEvent, models.AssetEvent.id == models.QueuedEvent.event_id)
        .where(models.QueuedEvent.pipeline_id.in_(pipeline_ids))
        .order_by(models.QueuedEvent.id)
    )
    if session.get_bind().dialect.name == "postgresql":
        # Rows another scheduler is consuming are skipped rather than waited for; the events
        # are read, not locked (other pipelines consume them too).
        statement = statement.with_for_update(skip_locked=True, of=models.QueuedEvent)
    rows: dict[str, list[Queued]] = defaultdict(list)
    for row in await session.execute(statement):
        rows[row[0]].append(Queued(*row[1:]))
    return rows


async def drop_queued(session: AsyncSession, row_ids: list[int]) -> None:
    """Delete the queue rows ``row_ids`` (expired, or cleared by a reset): their events stay
    stored. Rows another scheduler consumed meanwhile are gone already."""
    await session.execute(delete(models.QueuedEvent).where(models.QueuedEvent.id.in_(row_ids)))


async def members_of_aliases(
    session: AsyncSession, condition: BaseAsset, registry: Registry
) -> dict[int, set[AssetAlias]]:
    """For each asset id, the aliases of ``condition`` it was ever added through."""
    aliases = {
        registry.alias_ids[a]: a for a in condition.iter_aliases() if a in registry.alias_ids
    }
    members: dict[int, set[AssetAlias]] = defaultdict(set)
    if aliases:
        rows = await session.execute(
            select(models.AssetAliasAsset.asset_id, models.AssetAliasAsset.alias_id).where(
                models.AssetAliasAsset.alias_id.in_(list(aliases))
            )
        )
        for asset_id, alias_id in rows.all():
            members[asset_id].add(aliases[alias_id])
    return members


async def drop_foreign_rows(session: AsyncSession) -> int:
    """Delete the queue rows no run can consume under the current definitions: of assets a
    changed schedule no longer names, or plain rows of a pipeline now partitioned (and the
    reverse); how many. Rows of pipelines whose file is gone stay, in case it comes back."""
    queue, pipeline = models.QueuedEvent, models.Pipeline
    direct = select(models.PipelineAssetRef.pipeline_id).where(
        models.PipelineAssetRef.pipeline_id == queue.pipeline_id,
        models.PipelineAssetRef.asset_id == queue.asset_id,
        models.PipelineAssetRef.role == RefRole.SCHEDULE,
    )
    through_alias = (
        select(models.PipelineAliasRef.pipeline_id)
        .join(
            models.AssetAliasAsset,
            models.AssetAliasAsset.alias_id == models.PipelineAliasRef.alias_id,
        )
        .where(
            models.PipelineAliasRef.pipeline_id == queue.pipeline_id,
            models.AssetAliasAsset.asset_id == queue.asset_id,
            models.PipelineAliasRef.role == RefRole.SCHEDULE,
        )
    )
    other_kind = select(pipeline.pipeline_id).where(
        pipeline.pipeline_id == queue.pipeline_id,
        or_(
            and_(pipeline.partitioned.is_(True), queue.partition_key.is_(None)),
            and_(pipeline.partitioned.is_(False), queue.partition_key.is_not(None)),
        ),
    )
    active = select(pipeline.pipeline_id).where(pipeline.is_active.is_(True))
    dropped = await session.execute(
        delete(queue).where(
            queue.pipeline_id.in_(active),
            or_(and_(~exists(direct), ~exists(through_alias)), exists(other_kind)),
        )
    )
    count: int = dropped.rowcount  # type: ignore[attr-defined]  # CursorResult
    return count


async def due_cron_ticks(
    session: AsyncSession, now: datetime
) -> tuple[Sequence[Row[str, datetime | None]], datetime | None]:
    """The cron ticks due at ``now`` (pipeline id and tick), and the earliest tick after it:
    two index range reads, however many pipelines run on a cron."""
    due = (await session.execute(_DUE_CRON_TICKS, {"now": now})).all()
    return due, await session.scalar(_NEXT_CRON_TICK, {"now": now})


async def move_cron_tick(
    session: AsyncSession, pipeline_id: str, tick: datetime, after: datetime
) -> bool:
    """Move the pipeline's next cron tick from ``tick`` to ``after``; whether it was still at
    ``tick`` (another scheduler may have moved it first)."""
    moved = await session.execute(
        update(models.Pipeline)
        .where(
            models.Pipeline.pipeline_id == pipeline_id,
            models.Pipeline.next_cron_at == tick,
        )
        .values(next_cron_at=after)
    )
    count: int = moved.rowcount  # type: ignore[attr-defined]  # CursorResult
    return count == 1


class NewRun(NamedTuple):
    """A run to insert: its pipeline, id, type and partition key, and the queue rows it
    consumes."""

    pipeline: Pipeline
    run_id: str
    run_type: RunType
    partition_key: str | None
    picked: list[Queued]


async def insert_run(
    session: AsyncSession,
    pipeline: Pipeline,
    run_id: str,
    run_type: RunType,
    partition_key: str | None,
    picked: list[Queued],
) -> None:
    """Insert one run: see :func:`insert_runs`."""
    await insert_runs(session, [NewRun(pipeline, run_id, run_type, partition_key, picked)])


async def insert_runs(session: AsyncSession, runs: list[NewRun]) -> None:
    """Insert queued runs, each consuming the events of its picked queue rows, and delete those
    rows: three statements however many runs; :class:`ConsumedElsewhere` when some rows are
    gone already (another scheduler took them)."""
    if not runs:
        return
    run_pks = await session.scalars(
        insert(models.Run).returning(models.Run.id, sort_by_parameter_order=True),
        [
            {
                "run_id": run.run_id,
                "pipeline_id": run.pipeline.pipeline_id,
                "run_type": run.run_type,
                "logical_date": None,
                "partition_key": run.partition_key,
                "state": RunState.QUEUED,
                "try_number": 0,
                "max_tries": run.pipeline.retries + 1,
                "params": dict(run.pipeline.params),
            }
            for run in runs
        ],
    )
    links = [
        {
            "run_pk": run_pk,
            "event_id": row.event_id,
            "pipeline_id": run.pipeline.pipeline_id,
            # An event a replay queued again may have been consumed already: its link
            # stands outside the unique guard, as a re-run's (the replay's key holds it).
            "rerun": row.replayed,
        }
        for run, run_pk in zip(runs, run_pks.all(), strict=True)
        for row in run.picked
    ]
    if not links:
        return
    await session.execute(insert(models.RunEvent), links)
    picked = [row.row_id for run in runs for row in run.picked]
    deleted = await session.execute(
        delete(models.QueuedEvent).where(models.QueuedEvent.id.in_(picked))
    )
    if deleted.rowcount != len(picked):  # type: ignore[attr-defined]  # CursorResult
        raise ConsumedElsewhere(", ".join(run.run_id for run in runs))


async def create_manual_run(
    session: AsyncSession, pipeline_id: str, params: dict[str, Any] | None = None
) -> str:
    """Insert a queued manual run of a known pipeline; the caller commits, which also wakes
    the launchers of daemons in other processes (PostgreSQL)."""
    row = await session.get(models.Pipeline, pipeline_id)
    if row is None:
        raise LookupError(f"pipeline {pipeline_id!r} does not exist")
    run_id = compose_run_id(pipeline_id, "manual", uuid.uuid4().hex[:12])
    session.add(
        models.Run(
            run_id=run_id,
            pipeline_id=pipeline_id,
            run_type=RunType.MANUAL,
            state=RunState.QUEUED,
            try_number=0,
            max_tries=row.retries + 1,
            params=params or {},
        )
    )
    await session.flush()
    await notify_runs(session)
    return run_id


async def create_rerun(session: AsyncSession, run: models.Run) -> str:
    """Insert a queued run of ``run``'s pipeline consuming the same events, with the same
    params and partition key, marked as a re-run of it; the caller commits, which also wakes
    the launchers of daemons in other processes (PostgreSQL)."""
    pipeline = await session.get_one(models.Pipeline, run.pipeline_id)
    rerun = models.Run(
        run_id=compose_run_id(run.pipeline_id, "rerun", uuid.uuid4().hex[:12]),
        pipeline_id=run.pipeline_id,
        run_type=run.run_type,
        partition_key=run.partition_key,
        state=RunState.QUEUED,
        try_number=0,
        max_tries=pipeline.retries + 1,
        params=dict(run.params),
        rerun_of=run.run_id,
    )
    session.add(rerun)
    await session.flush()
    links = models.RunEvent
    await session.execute(
        insert(links).from_select(
            ["run_pk", "event_id", "pipeline_id", "rerun"],
            select(literal(rerun.id), links.event_id, links.pipeline_id, true()).where(
                links.run_pk == run.id
            ),
        )
    )
    await notify_runs(session)
    return rerun.run_id
