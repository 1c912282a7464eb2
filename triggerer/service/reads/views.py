"""The rows the CLI prints and the REST API returns (its response schemas), one model per view.

:mod:`triggerer.service.reads.queries` reads them from the store.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from pydantic import BaseModel, ConfigDict


class View(BaseModel):
    """A row as the CLI prints it and the API returns it."""

    model_config = ConfigDict(frozen=True)


class PipelineRow(View):
    pipeline_id: str
    schedule: str
    """The schedule as text, e.g. ``orders & customers`` or ``@daily``."""
    progress: str | None
    """How far the asset condition is: ``1 of 2 assets updated``; null without one."""
    queued_by_asset: dict[int, int]
    """How many events wait in its queue, by asset id (assets with none left out)."""
    paused: bool
    active: bool
    """False once the pipelines folder no longer defines it (its history is kept)."""
    partitioned: bool
    max_active_runs: int
    run_policy: str
    next_cron_at: dt.datetime | None
    fileloc: str
    error: str | None
    """Why evaluating it fails, null while it works."""
    error_at: dt.datetime | None


class ImportErrorRow(View):
    """A file of the pipelines folder that failed to load, as of the daemon's last load."""

    fileloc: str
    """The file, as the daemon found it in its pipelines folder (a folder that cannot be
    read, or is missing, is named itself)."""
    line: int | None
    """The line in the file where loading it failed, when known."""
    error: str
    """What failed, e.g. ``NameError: name 'spark_conf' is not defined``."""
    traceback: str | None
    """The traceback's last frames, from the file on, as Python prints them."""
    error_at: dt.datetime
    """Since when the file fails so."""


class AssetRow(View):
    id: int
    name: str
    uri: str
    group: str
    extra: dict[str, Any]
    created_at: dt.datetime
    consumers: list[str]
    """Pipelines scheduled on it."""
    producers: list[str]
    """Pipelines with it as an outlet."""
    watchers: list[str]


class AliasRow(View):
    id: int
    name: str
    group: str
    asset_ids: list[int]
    """The assets ever added through it."""
    consumers: list[str]
    producers: list[str]


class WatcherRow(View):
    watcher: str
    asset_id: int
    asset: str
    """The URI of the watched asset."""
    trigger: str
    """The trigger's class name."""
    classpath: str
    state: str
    last_poll_at: dt.datetime | None
    """When the watcher last asked its source, a poll that found nothing included (for a
    trigger that does not report its polls, its last event)."""
    last_event_at: dt.datetime | None
    """When its trigger last yielded an event."""
    restarts: int
    lag: int | None
    """Messages waiting in the source, when the trigger can tell."""
    consumer_group: str | None
    held_by: str | None = None
    """The pipeline whose full backlog (``max_backlog``) holds the watcher back: it fetches
    nothing until that backlog drains."""
    last_error: str | None
    """Why its last attempt failed: the current state while ``failing``, history after."""
    last_error_at: dt.datetime | None
    """When ``last_error`` happened."""
    failing: bool
    """Its current state is an error: backing off before it tries again (``backoff``), or
    ``failed``. Only such a watcher is shown as failing (red in the UI)."""
    recovered: bool
    """It failed, and has run since: ``running``, with a poll after ``last_error_at``. Its last
    error is history."""
    instance_id: str | None
    """The instance that last reported the state."""


class EventRow(View):
    id: int
    asset_id: int
    uri: str
    source: str
    timestamp: dt.datetime
    partition_key: str | None
    extra: dict[str, Any]
    source_run_id: str | None
    """The run whose outlet this event is."""
    source_trigger_id: int | None


class RunRef(View):
    run_id: str
    pipeline_id: str
    state: str


class EventDetail(EventRow):
    produced_by: RunRef | None
    consumed_by: list[RunRef]
    queued_for: list[str]
    """Pipelines whose queue still holds it."""


class QueuedEventRow(View):
    pipeline_id: str
    asset_id: int
    uri: str
    event_id: int
    partition_key: str | None
    created_at: dt.datetime


class RunRow(View):
    run_id: str
    pipeline_id: str
    state: str
    run_type: str
    try_number: int
    max_tries: int
    events: int
    """How many events it consumed."""
    partition_key: str | None
    created_at: dt.datetime
    start_date: dt.datetime | None
    end_date: dt.datetime | None
    error: str | None
    rerun_of: str | None
    """The run this one runs again (a re-run consumes the same events); null for others."""


class RunDetail(RunRow):
    params: dict[str, Any]
    consumed: list[EventRow]


class DeadLetterRow(View):
    id: int
    created_at: dt.datetime
    asset_id: int | None
    asset: str | None
    """The URI of the asset the event was for."""
    trigger_id: int | None
    source: str
    dedup_key: str | None
    partition_key: str | None
    reason: str
    payload: str
    """The event's extra as text."""


class AssetActivity(View):
    asset_id: int
    uri: str
    events: int
    """Its events in the window."""
    counts: list[int]
    """Its events per bucket, in the order of :attr:`EventActivity.buckets`."""


class EventActivity(View):
    """Events per bucket (a minute) over a window ending now: in total and per asset."""

    window: str
    bucket_s: int
    buckets: list[int]
    """The start of each bucket, in seconds since the epoch (UTC), oldest first."""
    events: int
    """All events in the window."""
    counts: list[int]
    """All events per bucket."""
    assets: list[AssetActivity]
    """The assets with the most events in the window, most first."""


class WatcherLag(View):
    trigger_id: int
    watchers: list[str]
    """The watchers reading through this trigger (usually one)."""
    asset_ids: list[int]
    lag: list[int | None]
    """The highest lag sampled in each bucket (null: none), as :attr:`LagActivity.buckets`."""
    latest: int | None
    """The newest sample's lag."""


class LagActivity(View):
    """Watchers' lag over a window ending now, sampled at heartbeats (one a minute)."""

    window: str
    bucket_s: int
    buckets: list[int]
    watchers: list[WatcherLag]
    """The watchers with the highest lag in the window, highest first."""


class RunSpan(View):
    run_id: str
    pipeline_id: str
    state: str
    created_at: dt.datetime
    start_date: dt.datetime | None
    end_date: dt.datetime | None
    duration_s: float | None
    """End minus start; for a run still running, so far; null before it starts."""


class RunTimeline(View):
    """Runs created in a window, newest first, with how many there are in each state."""

    since: dt.datetime
    states: dict[str, int]
    """Runs in the window (and filters) per state: all of them, not only those listed."""
    runs: list[RunSpan]
