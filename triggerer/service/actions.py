"""What the CLI and the REST API change in the store: emit an event, pause a pipeline, clear
queued events, queue a manual run, cancel a run or run it again. The caller commits; what is
named must exist (:class:`~triggerer.service.errors.NotFound`), what is given must be usable
(:class:`~triggerer.service.errors.Refused`) and its state must allow the change
(:class:`~triggerer.service.errors.Conflict`).

Each change is made by an ``actor`` (the principal of the request or of the command), and
writes its row of the audit log (:mod:`triggerer.service.audit`) in the caller's transaction.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from sqlalchemy import bindparam, delete, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from triggerer.service import audit
from triggerer.service.dead_letters import unstorable
from triggerer.service.errors import Conflict, NotFound, Refused
from triggerer.service.events import NewEvent, Recorded, RecordedEvent, record_events
from triggerer.service.reads import queries
from triggerer.service.store import models
from triggerer.service.store.notices import notify_cancel, notify_queued
from triggerer.service.store.states import FINISHED_RUN_STATES, AuditAction, RunState
from triggerer.service.store.types import utcnow
from triggerer.triggers import check_json
from triggerer.uri import normalize_uri

if TYPE_CHECKING:
    from triggerer.service.principals import Principal
    from triggerer.service.trace_context import TraceContext


async def find_asset(session: AsyncSession, *, asset_id: int | None, uri: str | None) -> int:
    """The id of the asset named by its id or its URI (as assets store it: ``s3://b`` is
    ``s3://b/``)."""
    found = (await find_assets(session, [(asset_id, uri)]))[0]
    if isinstance(found, Exception):
        raise found
    return found.id


class FoundAsset(NamedTuple):
    """An asset a user named, as :func:`find_assets` found it."""

    id: int
    uri: str
    name: str


# Built once: the REST API runs it for every batch of events posted.
_ASSETS_BY_ID_OR_URI = (
    select(models.Asset.id, models.Asset.uri, models.Asset.name)
    .where(
        or_(
            models.Asset.id.in_(bindparam("ids", expanding=True)),
            models.Asset.uri.in_(bindparam("uris", expanding=True)),
        )
    )
    .order_by(models.Asset.id)
)


async def find_assets(
    session: AsyncSession, named: Sequence[tuple[int | None, str | None]]
) -> list[FoundAsset | NotFound | Refused]:
    """For each asset named by ``(asset_id, uri)`` (one of them), its id, URI and name, or why
    it cannot be used; one query for all."""
    wanted: list[int | str | Refused] = []
    for asset_id, uri in named:
        if asset_id is not None:
            wanted.append(asset_id)
        elif uri is None:
            wanted.append(Refused("name the asset by its asset_id or its uri"))
        else:
            try:
                wanted.append(normalize_uri(uri))
            except ValueError as error:
                wanted.append(Refused(f"{uri!r} is not an asset URI: {error}"))
    ids = list({want for want in wanted if isinstance(want, int)})
    uris = list({want for want in wanted if isinstance(want, str)})
    rows = (await session.execute(_ASSETS_BY_ID_OR_URI, {"ids": ids, "uris": uris})).all()
    by_id = {row.id: FoundAsset(*row) for row in rows}
    ids_of: dict[str, list[int]] = {}
    for row in rows:
        ids_of.setdefault(row.uri, []).append(row.id)
    return [_found(want, by_id, ids_of) for want in wanted]


def _found(
    want: int | str | Refused, by_id: dict[int, FoundAsset], ids_of: dict[str, list[int]]
) -> FoundAsset | NotFound | Refused:
    if isinstance(want, Refused):
        return want
    if isinstance(want, int):
        if want not in by_id:
            return queries.missing_asset(want)
        return by_id[want]
    ids = ids_of.get(want, [])
    if not ids:
        return NotFound(f"no asset with URI {want!r} (see 'assets list')")
    if len(ids) > 1:
        return Refused(
            f"several assets have URI {want!r} (ids {', '.join(map(str, ids[:5]))}): "
            "name one by its asset_id"
        )
    return by_id[ids[0]]


def new_event(
    asset_id: int,
    extra: dict[str, Any],
    *,
    source: str,
    partition_key: str | None = None,
    dedup_key: str | None = None,
    trace: TraceContext | None = None,
) -> NewEvent:
    """An event a user asked for, with the trace context of the request, once it is known to
    be storable (else :class:`Refused`)."""
    try:
        check_json(extra, "extra")
    except TypeError as error:
        raise Refused(str(error)) from None
    new = NewEvent(
        asset_id=asset_id,
        extra=extra,
        source=source,
        partition_key=partition_key,
        dedup_key=dedup_key,
        traceparent=None if trace is None else trace.traceparent,
        tracestate=None if trace is None else trace.tracestate,
    )
    reason = unstorable(new)
    if reason is not None:
        raise Refused(f"the event cannot be stored: {reason}")
    return new


async def emit_event(
    session: AsyncSession,
    asset_id: int,
    extra: dict[str, Any],
    *,
    actor: Principal,
    source: str,
    partition_key: str | None = None,
) -> Recorded:
    """Record an event on ``asset_id`` and queue it for its consumers; daemons in other
    processes hear of it when the caller commits (PostgreSQL)."""
    asset = await session.get(models.Asset, asset_id)
    if asset is None:
        raise queries.missing_asset(asset_id)
    new = new_event(asset_id, extra, source=source, partition_key=partition_key)
    recorded = await record_events(session, [new])
    await notify_queued(session, recorded.queued_pipelines)
    await audit.record_all(session, [emitted(actor, asset.uri, recorded.events[0], extra)])
    return recorded


def emitted(actor: Principal, uri: str, event: RecordedEvent, extra: dict[str, Any]) -> audit.Entry:
    """The audit entry of an event ``actor`` emitted on the asset ``uri``, with the ``extra``
    it gave (the REST API's stored extra also says ``from_rest_api``)."""
    details = {"event_id": event.id, "extra": extra, "partition_key": event.partition_key}
    return audit.Entry(actor.name, AuditAction.EMIT, audit.asset_target(uri), details)


async def set_paused(
    session: AsyncSession, pipeline_id: str, paused: bool, *, actor: Principal
) -> None:
    """Pause (no runs start; events are still queued for it, and wait) or unpause a
    pipeline."""
    changed = await session.execute(
        update(models.Pipeline)
        .where(models.Pipeline.pipeline_id == pipeline_id)
        .values(paused=paused)
    )
    if changed.rowcount != 1:  # type: ignore[attr-defined]  # CursorResult
        raise NotFound(f"pipeline {pipeline_id!r} does not exist (see 'pipelines list')")
    if not paused:
        # Events queued before or during the pause may be enough for a run now.
        await notify_queued(session, [pipeline_id])
    action = AuditAction.PAUSE if paused else AuditAction.UNPAUSE
    await audit.record(session, actor, action, audit.pipeline_target(pipeline_id), {})


async def delete_queued_events(
    session: AsyncSession,
    *,
    actor: Principal,
    asset_id: int | None = None,
    pipeline_id: str | None = None,
    before: dt.datetime | None = None,
) -> int:
    """Remove events from pipelines' queues (by asset, pipeline or both; queued before
    ``before``); how many queue rows went. The events themselves are kept."""
    details: dict[str, Any] = {}
    if asset_id is not None:
        asset = await session.get(models.Asset, asset_id)
        if asset is None:
            raise queries.missing_asset(asset_id)
        target = audit.asset_target(asset.uri)
        details["asset"] = asset.uri
    if pipeline_id is not None:
        await queries.pipeline_model(session, pipeline_id)
        target = audit.pipeline_target(pipeline_id)
    elif asset_id is None:
        raise Refused("name the asset or the pipeline whose queued events to delete")
    statement = delete(models.QueuedEvent)
    if asset_id is not None:
        statement = statement.where(models.QueuedEvent.asset_id == asset_id)
    if pipeline_id is not None:
        statement = statement.where(models.QueuedEvent.pipeline_id == pipeline_id)
    if before is not None:
        statement = statement.where(models.QueuedEvent.created_at < before)
        details["before"] = before.isoformat()
    result = await session.execute(statement)
    deleted = int(result.rowcount)  # type: ignore[attr-defined]  # CursorResult
    details["deleted"] = deleted
    await audit.record(session, actor, AuditAction.DELETE_QUEUED, target, details)
    return deleted


async def trigger_run(
    session: AsyncSession,
    pipeline_id: str,
    params: dict[str, Any] | None = None,
    *,
    actor: Principal,
) -> str:
    """Queue a manual run of ``pipeline_id``; its run id."""
    await queries.pipeline_model(session, pipeline_id)
    try:
        check_json(params or {}, "params")
    except TypeError as error:
        raise Refused(str(error)) from None
    # The scheduler's queries, with the schedules and croniter, only for this: the CLI's other
    # verbs skip them.
    from triggerer.service.scheduling.schedule_queries import create_manual_run

    run_id = await create_manual_run(session, pipeline_id, params)
    details = {"run_id": run_id, "params": params or {}}
    await audit.record(
        session, actor, AuditAction.TRIGGER, audit.pipeline_target(pipeline_id), details
    )
    return run_id


async def cancel_run(session: AsyncSession, run_id: str, *, actor: Principal) -> RunState:
    """Cancel a run; the state it is in now. One that has not started (queued, or waiting to
    retry) is ``cancelled`` at once; a running one is ``cancelling`` until the daemon running
    it, told when the caller commits, has stopped its process group. A finished run is a
    :class:`Conflict`."""
    run = await queries.run_model(session, run_id)
    # Each change is conditional on the state it changes, so a launcher claiming the run or
    # recording its end at the same moment is never overwritten: one of the two comes first.
    # A launcher may move the run between the two (its try ended, to be retried): look again,
    # until the run is cancelled or has finished.
    waiting = (RunState.QUEUED, RunState.UP_FOR_RETRY)
    while run.state not in FINISHED_RUN_STATES:
        if await _change_state(session, run.id, waiting, RunState.CANCELLED):
            return await _cancelled(session, actor, run, RunState.CANCELLED)
        if await _change_state(
            session, run.id, (RunState.RUNNING, RunState.CANCELLING), RunState.CANCELLING
        ):  # (again, for one already cancelling: the daemon is told once more)
            await notify_cancel(session)
            return await _cancelled(session, actor, run, RunState.CANCELLING)
        await session.refresh(run)  # as another process left it
    raise Conflict(
        f"run {run_id!r} is {run.state}: only a queued, running or up_for_retry run can be "
        "cancelled"
    )


async def _cancelled(
    session: AsyncSession, actor: Principal, run: models.Run, state: RunState
) -> RunState:
    """Record ``actor``'s cancel of ``run``, which left it in ``state``; that state."""
    details = {"pipeline_id": run.pipeline_id, "state": state.value}
    await audit.record(session, actor, AuditAction.CANCEL, audit.run_target(run.run_id), details)
    return state


async def _change_state(
    session: AsyncSession, run_pk: int, states: tuple[RunState, ...], to: RunState
) -> bool:
    """Move run ``run_pk`` to state ``to`` if it is in one of ``states``; whether it was."""
    values: dict[str, Any] = {"state": to}
    if to == RunState.CANCELLED:
        values["end_date"] = utcnow()
    changed = await session.execute(
        update(models.Run)
        .where(models.Run.id == run_pk, models.Run.state.in_(states))
        .values(values)
        .execution_options(synchronize_session=False)
    )
    return bool(changed.rowcount == 1)  # type: ignore[attr-defined]  # CursorResult


async def rerun(session: AsyncSession, run_id: str, *, actor: Principal) -> str:
    """Queue a new run of a finished run's pipeline consuming the same events (a re-run of it);
    its run id. A run that is not finished is a :class:`Conflict`."""
    run = await queries.run_model(session, run_id)
    if run.state not in FINISHED_RUN_STATES:
        finished = ", ".join(FINISHED_RUN_STATES)
        raise Conflict(
            f"run {run_id!r} is {run.state}: only a finished run ({finished}) can be re-run"
        )
    # As for a manual run: the scheduler's queries only for this.
    from triggerer.service.scheduling.schedule_queries import create_rerun

    new_run_id = await create_rerun(session, run)
    details = {"pipeline_id": run.pipeline_id, "new_run_id": new_run_id}
    await audit.record(session, actor, AuditAction.RERUN, audit.run_target(run.run_id), details)
    return new_run_id
