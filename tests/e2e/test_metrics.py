"""The daemon's Prometheus metrics after known activity, and the event-loop watchdog.

The daemon runs in this process, so its metrics are read from prometheus_client's default
registry (what ``/api/v1/metrics`` serves); counters are compared with their values before.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
from prometheus_client import REGISTRY
from structlog.testing import capture_logs

from tests.e2e.daemon import (
    ORDERS,
    daemon_settings,
    running_daemon,
    runs,
    sqlite_url,
    trigger_rows,
    write_pipelines,
)
from triggerer.service.daemon.watchdog import INTERVAL_S

if TYPE_CHECKING:
    from tests.e2e.conftest import MakeDeployment

ACTIVITY = """
    from triggerer import TriggerEvent

    class Redelivering(BaseEventTrigger):
        # A message, the same message again, and one whose key the store cannot hold.
        # Shareable, so it runs without a lease: on a loaded machine a lease renewed late is
        # taken back, and the restarted trigger would yield its duplicate again.
        shareable = True

        def __init__(self, label):
            self.label = label

        def serialize(self):
            return self.classpath(), {{"label": self.label}}

        async def run(self):
            import anyio

            yield TriggerEvent({{"n": 1}}, dedup_key="again/1")
            yield TriggerEvent({{"n": 1}}, dedup_key="again/1")
            yield TriggerEvent({{"n": 2}}, dedup_key="x" * 2000)
            await anyio.sleep_forever()

    class Exploding(BaseEventTrigger):
        def __init__(self, label):
            self.label = label

        def serialize(self):
            return self.classpath(), {{"label": self.label}}

        async def run(self):
            raise RuntimeError("exploding on purpose")
            yield

    again = Asset("again", watchers=[AssetWatcher("again", Redelivering("r1"))])
    flaky = Asset("flaky", watchers=[AssetWatcher("exploding", Exploding("x1"))])
    never = Asset("never")
    counted = Asset("counted")

    @pipeline(schedule=orders, outlets=[counted])
    def count_orders(spark, context):
        assert spark.range(1).count() == 1

    @pipeline(schedule=[again, never])
    def waiting(spark, context):
        raise AssertionError("never runs: 'never' gets no events")
"""

COUNTERS = {
    "stored_trigger": ("triggerer_events_stored_total", {"source": "trigger"}),
    "stored_run": ("triggerer_events_stored_total", {"source": "run"}),
    "duplicates": ("triggerer_event_duplicates_total", {}),
    "dead_letters": ("triggerer_dead_letters_total", {}),
    "latency_count": ("triggerer_message_to_committed_seconds_count", {}),
    "latency_sum": ("triggerer_message_to_committed_seconds_sum", {}),
    "batches": ("triggerer_ingest_batch_size_count", {}),
    "batched_messages": ("triggerer_ingest_batch_size_sum", {}),
    "commits": ("triggerer_ingest_commit_seconds_count", {}),
    "runs_success": (
        "triggerer_runs_finished_total",
        {"pipeline_id": "count_orders", "state": "success"},
    ),
    "run_durations": ("triggerer_run_duration_seconds_count", {"pipeline_id": "count_orders"}),
    "scheduler_passes": ("triggerer_scheduler_pass_seconds_count", {}),
    "loop_lags": ("triggerer_event_loop_lag_seconds_count", {}),
}


def value(name: str, labels: dict[str, str] | None = None) -> float | None:
    return REGISTRY.get_sample_value(name, labels or {})


def counters() -> dict[str, float]:
    return {key: value(name, labels) or 0.0 for key, (name, labels) in COUNTERS.items()}


async def until(check: Callable[[], bool], timeout_s: float = 30) -> None:
    """Wait until ``check()`` is true: metrics change at the daemon's own cadence."""
    with anyio.fail_after(timeout_s):
        while not check():  # noqa: ASYNC110 - nothing to wait on but the registry's values
            await anyio.sleep(0.1)


async def test_metrics_count_what_the_daemon_did(
    database_url: str, make_deployment: MakeDeployment
) -> None:
    deployment = await make_deployment(database_url)
    deployment.write_pipelines(ORDERS + ACTIVITY)
    before = counters()
    sent_at = time.time()

    async with deployment.running():
        await deployment.produce([{"order": 1}])
        await deployment.wait_for(runs, lambda rs: [r.state for r in rs] == ["success"])
        triggers = {
            r.classpath.rsplit(".", 1)[-1]: str(r.id) for r in await deployment.query(trigger_rows)
        }
        kafka = {"trigger_id": triggers["KafkaTrigger"], "trigger": "KafkaTrigger"}
        exploding = {"trigger_id": triggers["Exploding"], "trigger": "Exploding"}
        # Gauges that need the store, and lags, are sampled by the heartbeat (every 0.5 s here).
        await until(
            lambda: value("triggerer_queued_events", {"pipeline_id": "waiting"}) == 1,
        )
        await until(
            lambda: (
                value("triggerer_watcher_lag", kafka) == 0
                and value(
                    "triggerer_kafka_consumer_lag",
                    {
                        "trigger_id": kafka["trigger_id"],
                        "topic": deployment.topic,
                        "partition": "0",
                    },
                )
                == 0
            ),
        )
        await until(
            lambda: (value("triggerer_watcher_restarts_total", exploding) or 0) >= 1,
        )
        gauges = {
            "queued_count_orders": value(
                "triggerer_queued_events", {"pipeline_id": "count_orders"}
            ),
            "kafka_up": value("triggerer_watcher_up", kafka),
            "exploding_up": value("triggerer_watcher_up", exploding),
            "kafka_restarts": value("triggerer_watcher_restarts_total", kafka),
            "kafka_poll_age": value("triggerer_watcher_last_poll_age_seconds", kafka),
        }
        during = counters()

    delta = {key: during[key] - before[key] for key in COUNTERS}
    assert delta["stored_trigger"] == 2  # the Kafka message and the first "again/1"
    assert delta["stored_run"] == 1  # count_orders' outlet
    assert delta["duplicates"] == 1
    assert delta["dead_letters"] == 1
    assert delta["batched_messages"] == 4  # every message, dead letter and duplicate included
    assert delta["batches"] == delta["commits"] >= 1
    # Only the Kafka message has a broker timestamp.
    assert delta["latency_count"] == 1
    assert 0 <= delta["latency_sum"] <= time.time() - sent_at
    assert delta["runs_success"] == 1
    assert delta["run_durations"] == 1
    assert delta["scheduler_passes"] >= 1
    assert delta["loop_lags"] >= 1
    assert gauges["queued_count_orders"] == 0
    assert gauges["kafka_up"] == 1
    assert gauges["exploding_up"] == 0  # backing off
    assert gauges["kafka_restarts"] == 0
    assert gauges["kafka_poll_age"] is not None
    assert 0 <= gauges["kafka_poll_age"] < time.time() - sent_at
    # The daemon has stopped: its watchers' series are gone.
    assert value("triggerer_watcher_up", kafka) is None


async def test_watchdog_logs_and_counts_a_blocked_event_loop(tmp_path: Path) -> None:
    write_pipelines(tmp_path / "pipelines", "")
    settings = daemon_settings(tmp_path, sqlite_url(tmp_path), "sc://127.0.0.1:1")
    async with running_daemon(settings):
        await anyio.sleep(0.2)  # the watchdog is asleep
        # Counted over the same window as the logs: a slow start on a busy machine may block
        # the loop too, and is no part of this test.
        with capture_logs() as logs:
            blocked_before = value("triggerer_event_loop_blocked_total") or 0.0
            time.sleep(0.8)  # noqa: ASYNC251 - blocking the event loop is the point
            with anyio.fail_after(5):
                while not any(entry["event"] == "event_loop_blocked" for entry in logs):  # noqa: ASYNC110 - a log entry
                    await anyio.sleep(0.05)
            blocked_after = value("triggerer_event_loop_blocked_total") or 0.0
    (blocked,) = [entry for entry in logs if entry["event"] == "event_loop_blocked"]
    assert blocked["log_level"] == "warning"
    # The block began at most one watchdog interval before its wake-up was due.
    assert 0.8 - INTERVAL_S <= blocked["blocked_s"] < 5
    assert blocked_after - blocked_before == 1
