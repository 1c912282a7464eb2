"""A watcher's last poll as the supervisor samples it from its trigger at each heartbeat, and
its last event as the supervisor records it from what the trigger yields."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import anyio
import pytest
from structlog.testing import capture_logs

from triggerer import BaseEventTrigger, TriggerEvent
from triggerer.service.daemon.backpressure import Backpressure
from triggerer.service.daemon.leases import Leases
from triggerer.service.daemon.supervisor import Supervisor, WatcherStatus, _sample_poll
from triggerer.service.scheduling.registry import WatchedTrigger

EVENT_AT = datetime(2026, 11, 26, 9, 0, tzinfo=UTC)


class Reporting(BaseEventTrigger):
    def __init__(self, polled: Any = None) -> None:
        self.reported = polled

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {}

    @property
    def last_poll_at(self) -> Any:
        if isinstance(self.reported, Exception):
            raise self.reported
        return self.reported

    async def run(self) -> AsyncIterator[TriggerEvent]:
        yield TriggerEvent(None)


def after_an_event() -> WatcherStatus:
    return WatcherStatus(last_poll_at=EVENT_AT, last_event_at=EVENT_AT)


def test_a_trigger_that_never_says_keeps_its_last_event_as_its_last_poll() -> None:
    status = after_an_event()
    _sample_poll(1, Reporting(None), status)
    assert (status.last_poll_at, status.last_event_at) == (EVENT_AT, EVENT_AT)


def test_a_poll_after_the_last_event_is_the_last_poll() -> None:
    status, later = after_an_event(), EVENT_AT + timedelta(minutes=3)
    _sample_poll(1, Reporting(later), status)
    assert (status.last_poll_at, status.last_event_at) == (later, EVENT_AT)


def test_the_last_poll_is_never_before_the_last_event() -> None:
    status = after_an_event()
    _sample_poll(1, Reporting(EVENT_AT - timedelta(seconds=1)), status)
    assert status.last_poll_at == EVENT_AT


@pytest.mark.parametrize(
    ("reported", "error"),
    [
        (ConnectionError("gone"), "ConnectionError('gone')"),
        (datetime(2026, 11, 26, 10, 0), "must be an aware datetime"),  # noqa: DTZ001 - naive on purpose
        ("10:00", "must be an aware datetime, not '10:00'"),
    ],
)
def test_a_last_poll_that_fails_is_logged_and_changes_nothing(reported: Any, error: str) -> None:
    status = after_an_event()
    with capture_logs() as logs:
        _sample_poll(7, Reporting(reported), status)
    assert status.last_poll_at == EVENT_AT
    [logged] = logs
    assert (logged["event"], logged["trigger_id"]) == ("trigger_last_poll_failed", 7)
    assert error in logged["error"]


class MovingItsPlace(BaseEventTrigger):
    """Yields a checkpoint alone (its place moved past filtered messages), then, once told to go
    on, an event."""

    shareable = True  # no lease, so no store

    def __init__(self) -> None:
        self.go_on = anyio.Event()

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        yield TriggerEvent.checkpoint_only("place/shard-1", "41")
        await self.go_on.wait()
        yield TriggerEvent({"n": 1})
        await anyio.sleep_forever()


async def test_a_checkpoint_only_yield_is_a_poll_not_an_event() -> None:
    sent, received = anyio.create_memory_object_stream[tuple[WatchedTrigger, TriggerEvent]](10)
    leases = Leases(cast("Any", None), "instance", ttl_s=30.0)  # never claimed: shareable
    unbounded = Backpressure(cast("Any", None), None)  # follows no registry: never holds back
    supervisor = Supervisor(
        sent, leases, unbounded, backoff_max_s=1.0, lease_poll_s=1.0, drain_timeout_s=1.0
    )
    trigger = MovingItsPlace()
    watched = WatchedTrigger(1, trigger, (1,), ("asset/watcher",))
    with sent, received, anyio.fail_after(10):
        async with anyio.create_task_group() as task_group:
            supervisor.update(task_group, {1: watched})
            status = supervisor.status[1]
            _, checkpoint = await received.receive()
            assert checkpoint.is_checkpoint_only
            assert status.last_poll_at is not None
            assert status.last_event_at is None
            trigger.go_on.set()
            _, event = await received.receive()
            assert event.payload == {"n": 1}
            assert status.last_event_at is not None
            assert status.last_event_at == status.last_poll_at
            supervisor.drained()
            supervisor.stop()
