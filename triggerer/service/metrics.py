"""Prometheus metrics of the daemon, all named ``triggerer_*``, served at ``/api/v1/metrics``.

They live in prometheus_client's default registry, registered when this module is imported.
Hot paths (ingest, once per batch and once per message) use children bound once, here, and add
no allocation per event; what needs the database (queued events) is refreshed with the
heartbeat, never per scrape; what the daemon holds in memory (watcher states) is read at scrape.
"""

from __future__ import annotations

import math
import time
from collections import Counter as Tally
from collections.abc import Mapping
from datetime import datetime
from operator import attrgetter
from typing import TYPE_CHECKING, Protocol

from prometheus_client import Counter, Gauge, Histogram

from triggerer.service.store.states import EventSource, RunState, TriggerState

if TYPE_CHECKING:
    from triggerer.service.events import Recorded

_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

EVENTS_STORED = Counter(
    "triggerer_events_stored",
    "Asset events this process committed, by what created them "
    "(trigger, run, rest_api; CLI events are committed by the CLI)",
    ["source"],
)
DUPLICATES = Counter(
    "triggerer_event_duplicates",
    "Events not stored again because their (asset, dedup key) was stored: redeliveries",
)
DEAD_LETTERS = Counter(
    "triggerer_dead_letters",
    "Events the store refused, kept in the dead-letter table with the reason",
)
MESSAGE_TO_COMMITTED = Histogram(
    "triggerer_message_to_committed_seconds",
    "From when a message's source took it in (a trigger event's sent_at: Kafka's record "
    "timestamp, SQS's SentTimestamp) to the commit of its events",
    buckets=_SECONDS,
)
INGEST_BATCH_SIZE = Histogram(
    "triggerer_ingest_batch_size",
    "Messages per ingest batch (one transaction, then the acks)",
    buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000),
)
INGEST_COMMIT = Histogram(
    "triggerer_ingest_commit_seconds",
    "Writing and committing one ingest batch, retries after a store outage included",
    buckets=_SECONDS,
)
RUNS_FINISHED = Counter(
    "triggerer_runs_finished",
    "Runs this daemon ran to a final state, by pipeline and state (success, failed, cancelled)",
    ["pipeline_id", "state"],
)
RUN_DURATION = Histogram(
    "triggerer_run_duration_seconds",
    "Wall time of a finished run's last try, from its claim to its recorded end",
    ["pipeline_id"],
    buckets=(1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 10800.0),
)
QUEUE_DROPS = Counter(
    "triggerer_queued_events_dropped",
    "Queued events that left a pipeline's queue without a run, by pipeline and reason "
    "(expired: outside its AND's window; reset: cleared at its AND's reset tick)",
    ["pipeline_id", "reason"],
)
QUEUED_EVENTS = Gauge(
    "triggerer_queued_events",
    "Events waiting in each active pipeline's queue (read from the store every heartbeat)",
    ["pipeline_id"],
)
# Per trigger instance: its id in the store's trigger table, and its class (KafkaTrigger, ...).
_WATCHER_LABELS = ["trigger_id", "trigger"]
WATCHER_UP = Gauge(
    "triggerer_watcher_up",
    "1 while the trigger instance runs; 0 while it starts, backs off after a failure or waits "
    "for its lease",
    _WATCHER_LABELS,
)
WATCHER_RESTARTS = Counter(
    "triggerer_watcher_restarts",
    "Times the trigger instance failed and was restarted",
    _WATCHER_LABELS,
)
WATCHER_LAST_POLL_AGE = Gauge(
    "triggerer_watcher_last_poll_age_seconds",
    "Seconds since the trigger instance last asked its source, a poll that found nothing "
    "included, as of the last heartbeat (its last event for a trigger that does not report its "
    "polls; NaN before the first)",
    _WATCHER_LABELS,
)
WATCHER_LAST_EVENT_AGE = Gauge(
    "triggerer_watcher_last_event_age_seconds",
    "Seconds since the trigger instance last yielded an event (NaN before the first)",
    _WATCHER_LABELS,
)
WATCHER_HELD = Gauge(
    "triggerer_watcher_held_back",
    "1 while the watcher fetches nothing because every pipeline it feeds has its backlog full "
    "(max_backlog), else 0",
    _WATCHER_LABELS,
)
WATCHER_LAG = Gauge(
    "triggerer_watcher_lag",
    "Messages waiting at the trigger's source, sampled every heartbeat (NaN when unknown): "
    "Kafka, the consumer lag summed over assigned partitions; SQS, the queue's approximate "
    "backlog (ApproximateNumberOfMessages)",
    _WATCHER_LABELS,
)
KAFKA_CONSUMER_LAG = Gauge(
    "triggerer_kafka_consumer_lag",
    "Kafka consumer lag of one assigned partition: highwater minus the oldest offset not done; "
    "sampled every heartbeat",
    ["trigger_id", "topic", "partition"],
)
SCHEDULER_PASS = Histogram(
    "triggerer_scheduler_pass_seconds",
    "One scheduler pass: evaluating the pipelines it was woken for, and due cron ticks",
    buckets=_SECONDS,
)
EVENT_LOOP_LAG = Histogram(
    "triggerer_event_loop_lag_seconds",
    "How late the event-loop watchdog woke from its sleep: how long the loop was kept busy",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
EVENT_LOOP_BLOCKED = Counter(
    "triggerer_event_loop_blocked",
    "Times the event loop was blocked longer than the watchdog's threshold",
)
LISTENER_FAILURES = Counter(
    "triggerer_listener_failures",
    "Listener calls that raised, by hook",
    ["hook"],
)
LISTENER_DROPPED = Counter(
    "triggerer_listener_events_dropped",
    "Asset events no listener heard of because the listener queue was full",
)
LISTENER_PENDING = Gauge(
    "triggerer_listener_pending_events",
    "Asset events waiting for the listeners",
)
OPENLINEAGE_EVENTS = Counter(
    "triggerer_openlineage_events",
    "OpenLineage run events, by outcome: sent, failed (the transport raised or timed out), "
    "dropped (too many were waiting)",
    ["outcome"],
)
RETENTION_DELETED = Counter(
    "triggerer_retention_deleted",
    "What retention deleted from the store, by kind (runs, log_chunks, log_folders, events, "
    "dead_letters, audit)",
    ["kind"],
)

_STORED = {source: EVENTS_STORED.labels(source) for source in EventSource}
# The label values in use, so series of pipelines and partitions that are gone can be removed.
_queued_pipelines: set[str] = set()
_partition_lags: dict[str, dict[tuple[str, int], int]] = {}
_watchers: dict[int, tuple[str, str]] = {}
_FINAL_STATES = (RunState.SUCCESS, RunState.FAILED, RunState.CANCELLED)
_source = attrgetter("source")


def events_recorded(recorded: Recorded) -> None:
    """Count committed events by source, and the duplicates their batch absorbed."""
    if recorded.duplicates:
        DUPLICATES.inc(recorded.duplicates)
    for source, count in Tally(map(_source, recorded.events)).items():
        _STORED[source].inc(count)


def committed(sent_at: list[float | None], batch_seconds: float) -> None:
    """An ingest batch of messages committed after ``batch_seconds``; ``sent_at``: when each
    message's source took it in (:attr:`triggerer.TriggerEvent.sent_at`), where it says."""
    INGEST_BATCH_SIZE.observe(len(sent_at))
    INGEST_COMMIT.observe(batch_seconds)
    now = time.time()
    for sent in sent_at:
        # A trigger's own figure: one that is no time at all (NaN, infinite) is left out.
        if sent is not None and math.isfinite(sent):
            MESSAGE_TO_COMMITTED.observe(max(0.0, now - sent))


def run_finished(pipeline_id: str, state: str, started: datetime | None, ended: datetime) -> None:
    """A run's try ended in ``state``; counted when that state is final."""
    if state not in _FINAL_STATES:
        return
    RUNS_FINISHED.labels(pipeline_id, state).inc()
    if started is not None:
        RUN_DURATION.labels(pipeline_id).observe((ended - started).total_seconds())


def queued_events(counts: Mapping[str, int], pipeline_ids: set[str]) -> None:
    """Set the queued-events gauge of ``pipeline_ids`` (0 when absent from ``counts``); other
    pipelines' series go."""
    for pipeline_id in _queued_pipelines - pipeline_ids:
        QUEUED_EVENTS.remove(pipeline_id)
    for pipeline_id in pipeline_ids:
        QUEUED_EVENTS.labels(pipeline_id).set(counts.get(pipeline_id, 0))
    _queued_pipelines.clear()
    _queued_pipelines.update(pipeline_ids)


def retention_deleted(counts: Mapping[str, int]) -> None:
    """Retention deleted ``counts`` of each kind (a kind at 0 gets its series)."""
    for kind, count in counts.items():
        RETENTION_DELETED.labels(kind).inc(count)


class WatcherState(Protocol):
    """What the watcher gauges read of a running watcher (the supervisor's status of it)."""

    state: str
    last_poll_at: datetime | None
    last_event_at: datetime | None
    lag: int | None
    held_by: str | None


def watcher_started(trigger_id: int, kind: str, status: WatcherState) -> None:
    """Expose the state of one trigger instance of class ``kind``, read from ``status`` at
    each scrape."""
    watcher_stopped(trigger_id)  # restarted with other assets: the series start again
    labels = _watchers[trigger_id] = (str(trigger_id), kind)
    WATCHER_UP.labels(*labels).set_function(lambda: float(status.state == TriggerState.RUNNING))
    WATCHER_LAST_POLL_AGE.labels(*labels).set_function(lambda: _age_s(status.last_poll_at))
    WATCHER_LAST_EVENT_AGE.labels(*labels).set_function(lambda: _age_s(status.last_event_at))
    WATCHER_LAG.labels(*labels).set_function(
        lambda: math.nan if status.lag is None else float(status.lag)
    )
    WATCHER_HELD.labels(*labels).set_function(lambda: float(status.held_by is not None))
    WATCHER_RESTARTS.labels(*labels)  # shown as 0 until the first restart


def watcher_restarted(trigger_id: int) -> None:
    labels = _watchers.get(trigger_id)
    if labels is not None:
        WATCHER_RESTARTS.labels(*labels).inc()


def watcher_stopped(trigger_id: int) -> None:
    """The trigger instance is gone: its series go too."""
    labels = _watchers.pop(trigger_id, None)
    if labels is not None:
        for metric in (
            WATCHER_UP,
            WATCHER_HELD,
            WATCHER_LAST_POLL_AGE,
            WATCHER_LAST_EVENT_AGE,
            WATCHER_LAG,
            WATCHER_RESTARTS,
        ):
            metric.remove(*labels)
    partition_lag(trigger_id, {})


def partition_lag(trigger_id: int, lags: Mapping[tuple[str, int], int]) -> None:
    """Set the Kafka consumer lag per ``(topic, partition)`` of one trigger instance;
    partitions it no longer owns lose their series."""
    label = str(trigger_id)
    before = _partition_lags.get(label, {})
    if lags == before:
        return  # an idle watcher's, heartbeat after heartbeat: nothing to set
    if lags:
        _partition_lags[label] = dict(lags)
    else:
        del _partition_lags[label]
    for topic, partition in before.keys() - lags.keys():
        KAFKA_CONSUMER_LAG.remove(label, topic, str(partition))
    for (topic, partition), lag in lags.items():
        KAFKA_CONSUMER_LAG.labels(label, topic, str(partition)).set(lag)


def _age_s(moment: datetime | None) -> float:
    if moment is None:
        return math.nan
    return time.time() - moment.timestamp()
