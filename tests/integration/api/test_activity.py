"""``/activity``: events per minute, the runs timeline and watchers' lag over time, grouped
in the store (SQLite and PostgreSQL); and the lag samples the heartbeat writes."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

from sqlalchemy import func, select, update

from tests.integration.api.test_routes import emit, schedule
from triggerer.service.daemon import lag_samples
from triggerer.service.daemon.lag_samples import LagSampler
from triggerer.service.daemon.supervisor import WatcherStatus
from triggerer.service.store import models
from triggerer.service.store.types import utcnow

if TYPE_CHECKING:
    import pytest

    from tests.integration.api.conftest import Api


async def _move_events(api: Api, minutes_ago: int, *event_ids: int) -> None:
    """Date events ``minutes_ago`` minutes back."""
    async with api.sessions.begin() as session:
        await session.execute(
            update(models.AssetEvent)
            .where(models.AssetEvent.id.in_(event_ids))
            .values(timestamp=utcnow() - dt.timedelta(minutes=minutes_ago))
        )


async def test_events_per_minute_in_total_and_per_asset(api: Api) -> None:
    orders = [await emit(api, "orders") for _ in range(3)]
    customers = await emit(api, "customers")
    old = await emit(api, "customers")
    await _move_events(api, 5, orders[0]["id"], orders[1]["id"])
    await _move_events(api, 90, old["id"])  # out of the hour, in the day

    asked_at = utcnow().timestamp()
    hour = (await api.client.get("/activity/events")).json()
    answered_at = utcnow().timestamp()
    assert (hour["window"], hour["bucket_s"], len(hour["buckets"])) == ("hour", 60, 60)
    assert hour["buckets"] == sorted(hour["buckets"])
    # The current minute's bucket, whichever side of a minute's turn the request fell.
    assert asked_at - 60 < hour["buckets"][-1] <= answered_at
    assert (hour["events"], sum(hour["counts"])) == (4, 4)
    by_uri = {asset["uri"]: asset for asset in hour["assets"]}
    assert [asset["uri"] for asset in hour["assets"]] == ["orders", "customers"]
    assert by_uri["orders"]["events"] == 3
    # Emitted this minute, or the one before when a minute turned before the request.
    assert by_uri["orders"]["counts"][-1] + by_uri["orders"]["counts"][-2] == 1
    # Five minutes back: the bucket 5 (or, across a minute's turn, 6) before the current one.
    assert by_uri["orders"]["counts"][-6] + by_uri["orders"]["counts"][-7] == 2
    assert by_uri["customers"]["counts"][-1] + by_uri["customers"]["counts"][-2] == 1
    assert by_uri["customers"]["asset_id"] == customers["asset_id"]

    day = (await api.client.get("/activity/events?window=day&top=1")).json()
    assert (len(day["buckets"]), day["events"]) == (1440, 5)
    assert [asset["uri"] for asset in day["assets"]] == ["orders"]
    one = (await api.client.get(f"/activity/events?asset_id={customers['asset_id']}")).json()
    assert (one["events"], [a["uri"] for a in one["assets"]]) == (1, ["customers"])
    assert (await api.client.get("/activity/events?window=week")).status_code == 422


async def test_runs_timeline_with_durations_and_states(api: Api) -> None:
    await emit(api, "orders")
    await emit(api, "customers")
    await schedule(api, "matched")
    manual = (await api.client.post("/pipelines/nightly/runs")).json()
    start = utcnow() - dt.timedelta(seconds=30)
    async with api.sessions.begin() as session:
        await session.execute(
            update(models.Run)
            .where(models.Run.run_id == manual["run_id"])
            .values(state="success", start_date=start, end_date=start + dt.timedelta(seconds=12))
        )
    timeline = (await api.client.get("/activity/runs")).json()
    assert timeline["states"] == {"queued": 1, "success": 1}
    newest, oldest = timeline["runs"]
    assert (newest["run_id"], newest["state"], newest["duration_s"]) == (
        manual["run_id"],
        "success",
        12.0,
    )
    assert (oldest["pipeline_id"], oldest["start_date"], oldest["duration_s"]) == (
        "matched",
        None,
        None,
    )
    matched = (await api.client.get("/activity/runs?pipeline_id=matched")).json()
    assert [run["pipeline_id"] for run in matched["runs"]] == ["matched"]
    assert (await api.client.get("/activity/runs?state=success")).json()["states"] == {"success": 1}
    later = (await api.client.get("/activity/runs?since=2999-01-01T00:00:00")).json()
    assert (later["states"], later["runs"]) == ({}, [])


async def test_lag_is_sampled_a_minute_apart_kept_a_day_and_drawn_per_minute(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with api.sessions() as session:
        trigger_id = await session.scalar(select(models.AssetWatcher.trigger_id))
    assert trigger_id is not None
    sampler = LagSampler(api.sessions)
    statuses = {trigger_id: WatcherStatus(state="running", lag=40), 999_999: WatcherStatus(lag=1)}
    # The trigger no longer stored (999999) is left out; a beat within the minute samples none.
    assert await sampler.sample(statuses) == 1
    assert await sampler.sample({trigger_id: WatcherStatus(lag=50)}) == 0
    monkeypatch.setattr(lag_samples, "SAMPLE_INTERVAL_S", 0.0)
    assert await sampler.sample({trigger_id: WatcherStatus(lag=70)}) == 1
    assert await sampler.sample({trigger_id: WatcherStatus(lag=None)}) == 0
    async with api.sessions.begin() as session:
        session.add(
            models.WatcherLagSample(
                trigger_id=trigger_id, lag=5, sampled_at=utcnow() - dt.timedelta(hours=3)
            )
        )
        session.add(
            models.WatcherLagSample(
                trigger_id=trigger_id, lag=9, sampled_at=utcnow() - dt.timedelta(days=2)
            )
        )
    await sampler.sample({})  # deletes what is older than a day
    async with api.sessions() as session:
        kept = await session.scalar(select(func.count()).select_from(models.WatcherLagSample))
    assert kept == 3

    hour = (await api.client.get("/activity/watcherLag")).json()
    [watcher] = hour["watchers"]
    assert (watcher["watchers"], watcher["latest"], len(watcher["lag"])) == (
        ["orders_files"],
        70,
        60,
    )
    # The minute's highest; 40 and 70 a minute apart when a minute turned between the beats,
    # and a minute without a beat after them when one turned before the request.
    assert [lag for lag in watcher["lag"][-3:] if lag is not None] in ([70], [40, 70])
    assert watcher["lag"][0] is None
    day = (await api.client.get("/activity/watcherLag?window=day")).json()
    assert sorted(lag for lag in day["watchers"][0]["lag"] if lag is not None)[0] == 5
    assert (await api.client.get("/activity/watcherLag?top=0")).status_code == 422
