"""What happened over time, aggregated in the store for the UI's charts: events per minute (in
total and per asset), watchers' lag per minute, and the runs of a window with their durations.

Buckets are whole minutes since the epoch, grouped by the database (``GROUP BY`` on the epoch
seconds divided by the bucket's length, written for SQLite and PostgreSQL), so a chart of a day
reads at most a few thousand numbers, never the rows themselves.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from typing import TYPE_CHECKING, Any, Final, Literal

from sqlalchemy import BigInteger, Integer, cast, extract, func, literal_column, select
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import FunctionElement

from triggerer.service.reads.views import (
    AssetActivity,
    EventActivity,
    LagActivity,
    RunSpan,
    RunTimeline,
    WatcherLag,
)
from triggerer.service.store import models
from triggerer.service.store.types import utcnow

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession
    from sqlalchemy.sql.compiler import SQLCompiler

Window = Literal["hour", "day"]
WINDOW_S: Final = {"hour": 3600, "day": 86_400}
BUCKET_S: Final = 60
"""One bucket a minute: 60 in an hour's chart, 1440 in a day's."""


class _EpochSeconds(FunctionElement[int]):
    """Whole seconds since the epoch of a timestamp column, in the database's own words."""

    type = BigInteger()
    name = "epoch_seconds"
    inherit_cache = True


@compiles(_EpochSeconds, "sqlite")
def _epoch_sqlite(element: _EpochSeconds, compiler: SQLCompiler, **kw: Any) -> str:
    # Stored as UTC text ('2026-12-01 10:00:00.123456'), which strftime reads as UTC.
    return compiler.process(
        cast(func.strftime(literal_column("'%s'"), *element.clauses), Integer), **kw
    )


@compiles(_EpochSeconds)
def _epoch_default(element: _EpochSeconds, compiler: SQLCompiler, **kw: Any) -> str:
    [column] = element.clauses
    return compiler.process(cast(func.floor(extract("epoch", column)), BigInteger), **kw)


def _bucket(column: Any) -> Any:
    """The bucket (minutes since the epoch) of a timestamp column. Constants are written in the
    statement, not bound: PostgreSQL groups by an expression only if it is the one selected."""
    return _EpochSeconds(column) // literal_column(str(BUCKET_S), BigInteger())


def _buckets(window: Window, now: dt.datetime) -> tuple[dt.datetime, list[int]]:
    """The start of the window and its buckets' numbers, ending with the current minute."""
    last = int(now.timestamp()) // BUCKET_S
    count = WINDOW_S[window] // BUCKET_S
    numbers = list(range(last - count + 1, last + 1))
    return dt.datetime.fromtimestamp(numbers[0] * BUCKET_S, dt.UTC), numbers


async def events(
    session: AsyncSession, *, window: Window = "hour", asset_id: int | None = None, top: int = 10
) -> EventActivity:
    """Events per minute over the last ``window``: in total (of ``asset_id`` alone when given)
    and for the ``top`` assets with the most events."""
    since, numbers = _buckets(window, utcnow())
    # The window's events first, through the index on (time, asset): asked for one asset or
    # grouped by asset, a planner would read that asset's whole history (SQLite: every event)
    # through (asset_id, id) instead.
    window_events = (
        select(models.AssetEvent.asset_id, models.AssetEvent.timestamp)
        .where(models.AssetEvent.timestamp >= since)
        .cte("window_events")
        .prefix_with("MATERIALIZED")
    )
    event = window_events.c
    recent = [] if asset_id is None else [event.asset_id == asset_id]
    bucket = _bucket(event.timestamp)
    totals: dict[int, int] = dict(
        (await session.execute(select(bucket, func.count()).where(*recent).group_by(bucket))).all()
    )
    ranked = (
        await session.execute(
            select(event.asset_id, models.Asset.uri, func.count().label("events"))
            .join(models.Asset, models.Asset.id == event.asset_id)
            .where(*recent)
            .group_by(event.asset_id, models.Asset.uri)
            .order_by(func.count().desc(), event.asset_id)
            .limit(top)
        )
    ).all()
    per_asset: dict[int, dict[int, int]] = defaultdict(dict)
    if ranked:
        rows = await session.execute(
            select(event.asset_id, bucket, func.count())
            .where(*recent, event.asset_id.in_([row[0] for row in ranked]))
            .group_by(event.asset_id, bucket)
        )
        for asset, number, count in rows.all():
            per_asset[asset][number] = count
    return EventActivity(
        window=window,
        bucket_s=BUCKET_S,
        buckets=[number * BUCKET_S for number in numbers],
        events=sum(totals.get(number, 0) for number in numbers),
        counts=[totals.get(number, 0) for number in numbers],
        assets=[
            AssetActivity(
                asset_id=asset,
                uri=uri,
                events=count,
                counts=[per_asset[asset].get(number, 0) for number in numbers],
            )
            for asset, uri, count in ranked
        ],
    )


async def watcher_lag(
    session: AsyncSession, *, window: Window = "hour", top: int = 20
) -> LagActivity:
    """The highest lag sampled per minute over the last ``window``, for the ``top`` triggers
    whose lag was highest."""
    since, numbers = _buckets(window, utcnow())
    sample = models.WatcherLagSample
    recent = sample.sampled_at >= since
    ranked = (
        await session.scalars(
            select(sample.trigger_id)
            .where(recent)
            .group_by(sample.trigger_id)
            .order_by(func.max(sample.lag).desc(), sample.trigger_id)
            .limit(top)
        )
    ).all()
    if not ranked:
        return LagActivity(
            window=window, bucket_s=BUCKET_S, buckets=[n * BUCKET_S for n in numbers], watchers=[]
        )
    bucket = _bucket(sample.sampled_at)
    highest: dict[int, dict[int, int]] = defaultdict(dict)
    rows = await session.execute(
        select(sample.trigger_id, bucket, func.max(sample.lag))
        .where(recent, sample.trigger_id.in_(ranked))
        .group_by(sample.trigger_id, bucket)
    )
    for trigger_id, number, lag in rows.all():
        highest[trigger_id][number] = lag
    watchers: dict[int, list[tuple[str, int]]] = defaultdict(list)
    named = await session.execute(
        select(
            models.AssetWatcher.trigger_id, models.AssetWatcher.name, models.AssetWatcher.asset_id
        )
        .where(models.AssetWatcher.trigger_id.in_(ranked))
        .order_by(models.AssetWatcher.name, models.AssetWatcher.asset_id)
    )
    for trigger_id, name, asset in named.all():
        watchers[trigger_id].append((name, asset))
    series = []
    for trigger_id in ranked:
        lags = [highest[trigger_id].get(number) for number in numbers]
        series.append(
            WatcherLag(
                trigger_id=trigger_id,
                watchers=[name for name, _ in watchers[trigger_id]],
                asset_ids=[asset for _, asset in watchers[trigger_id]],
                lag=lags,
                latest=next((lag for lag in reversed(lags) if lag is not None), None),
            )
        )
    return LagActivity(
        window=window, bucket_s=BUCKET_S, buckets=[n * BUCKET_S for n in numbers], watchers=series
    )


async def runs(
    session: AsyncSession,
    *,
    since: dt.datetime,
    pipeline_id: str | None = None,
    state: str | None = None,
    limit: int = 1000,
) -> RunTimeline:
    """Runs created at or after ``since``, newest first, with start, end and duration; and how
    many runs of the window (and filters) are in each state."""
    run = models.Run
    where = [run.created_at >= since]
    if pipeline_id is not None:
        where.append(run.pipeline_id == pipeline_id)
    if state is not None:
        where.append(run.state == state)
    states = dict(
        (
            await session.execute(select(run.state, func.count()).where(*where).group_by(run.state))
        ).all()
    )
    found = await session.execute(
        select(run.run_id, run.pipeline_id, run.state, run.created_at, run.start_date, run.end_date)
        .where(*where)
        .order_by(run.id.desc())
        .limit(limit)
    )
    now = utcnow()
    return RunTimeline(
        since=since,
        states=states,
        runs=[
            RunSpan(
                run_id=run_id,
                pipeline_id=pipeline,
                state=run_state,
                created_at=created_at,
                start_date=start,
                end_date=end,
                duration_s=None
                if start is None
                else round(((end or now) - start).total_seconds(), 3),
            )
            for run_id, pipeline, run_state, created_at, start, end in found.all()
        ],
    )
