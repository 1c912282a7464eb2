"""The metrics module's pure parts: the time from a message's source, series that go away, the
ages of a watcher's last poll and last event."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime, timedelta

from prometheus_client import REGISTRY

from triggerer.service import metrics
from triggerer.service.daemon.supervisor import WatcherStatus


def test_message_to_committed_is_measured_from_what_the_source_said() -> None:
    def measured() -> tuple[float, float]:
        name = "triggerer_message_to_committed_seconds"
        count = REGISTRY.get_sample_value(f"{name}_count") or 0.0
        return count, REGISTRY.get_sample_value(f"{name}_sum") or 0.0

    count, total = measured()
    # A second ago, unknown, and two figures that are no time (a trigger's own values).
    metrics.committed([time.time() - 1.0, None, math.nan, math.inf], batch_seconds=0.01)

    new_count, new_total = measured()
    assert new_count == count + 1
    assert 1.0 <= new_total - total < 60.0


def test_queued_events_of_pipelines_that_are_gone_are_removed() -> None:
    def queued(pipeline_id: str) -> float | None:
        return REGISTRY.get_sample_value("triggerer_queued_events", {"pipeline_id": pipeline_id})

    metrics.queued_events({"a": 3}, {"a", "b"})
    assert (queued("a"), queued("b")) == (3, 0)
    metrics.queued_events({}, {"b"})
    assert (queued("a"), queued("b")) == (None, 0)
    metrics.queued_events({}, set())
    assert queued("b") is None


def test_partitions_no_longer_assigned_lose_their_lag_series() -> None:
    def lag(partition: str) -> float | None:
        return REGISTRY.get_sample_value(
            "triggerer_kafka_consumer_lag",
            {"trigger_id": "9999", "topic": "t", "partition": partition},
        )

    metrics.partition_lag(9999, {("t", 0): 5, ("t", 1): 0})
    assert (lag("0"), lag("1")) == (5, 0)
    metrics.partition_lag(9999, {("t", 1): 2})
    assert (lag("0"), lag("1")) == (None, 2)
    metrics.partition_lag(9999, {})
    assert lag("1") is None


def test_a_watcher_shows_its_last_poll_and_its_last_event_apart() -> None:
    def age(name: str) -> float | None:
        return REGISTRY.get_sample_value(name, {"trigger_id": "9998", "trigger": "Quiet"})

    now = datetime.now(UTC)
    status = WatcherStatus(last_poll_at=now, last_event_at=now - timedelta(minutes=3))
    metrics.watcher_started(9998, "Quiet", status)
    poll_age = age("triggerer_watcher_last_poll_age_seconds")
    event_age = age("triggerer_watcher_last_event_age_seconds")
    assert poll_age is not None
    assert 0 <= poll_age < 60
    assert event_age is not None
    assert 180 <= event_age < 240
    metrics.watcher_stopped(9998)
    assert age("triggerer_watcher_last_event_age_seconds") is None
