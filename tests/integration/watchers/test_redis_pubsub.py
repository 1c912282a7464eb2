"""RedisPubSubTrigger against the machine's Redis: payload, the at-most-once warning, filters,
``send``, and a reconnect after a private server's restart."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, cast

import anyio
from structlog.testing import capture_logs

from tests.fixtures.redis import SHARED_REDIS_HOST, SHARED_REDIS_PORT
from triggerer.triggers import TriggerEvent
from watchers import MessageQueueTrigger, RedisPubSubTrigger
from watchers.redis.pubsub import send

if TYPE_CHECKING:
    from deploy.local.services import Service


def shout(payload: dict[str, Any]) -> dict[str, Any] | None:
    """An apply_function for the tests: drops "quiet", upper-cases the rest, fails on "bad"."""
    if payload["body"] == "bad":
        raise ValueError("bad message")
    if payload["body"] == "quiet":
        return None
    return {"loud": payload["body"].upper()}


def channel_uri(port: int = SHARED_REDIS_PORT) -> str:
    return f"redis+pubsub://{SHARED_REDIS_HOST}:{port}/0/triggerer-test-{uuid.uuid4().hex}"


def trigger(uri: str, **options: Any) -> RedisPubSubTrigger:
    made = MessageQueueTrigger(uri, **options)
    assert isinstance(made, RedisPubSubTrigger), made
    return made


@contextlib.asynccontextmanager
async def running(source: RedisPubSubTrigger) -> AsyncIterator[list[TriggerEvent]]:
    """The events of the trigger, run in a task meanwhile, filled in as they come; entered once
    it is subscribed (a message published before is lost)."""
    taken: list[TriggerEvent] = []
    events = cast(AsyncGenerator[TriggerEvent, None], source.run())

    async def pump() -> None:
        async for event in events:
            taken.append(event)  # noqa: PERF401 - each as it comes, not all at the end

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(pump)
            await until(lambda: source.lag is not None)  # set by run() once subscribed
            yield taken
            group.cancel_scope.cancel()
    finally:
        await events.aclose()
        await source.cleanup()


async def until(condition: Callable[[], bool], timeout_s: float = 20) -> None:
    with anyio.fail_after(timeout_s):
        while not condition():  # noqa: ASYNC110 - state the trigger's task sets
            await anyio.sleep(0.01)


async def test_published_messages_become_events_and_the_start_warns() -> None:
    uri = channel_uri()
    source = trigger(uri)
    source = source.for_watcher(_Asset(), "news_channel")
    with capture_logs() as logs:
        async with running(source) as events:
            receivers = await send(uri, ['{"headline": "hi"}', "plain"])
            await until(lambda: len(events) == 2)
    first, second = events
    assert receivers == ["1", "1"]
    assert first.payload["body"] == {"headline": "hi"}
    assert first.payload["channel"] == source.channel
    assert isinstance(first.payload["received_at"], float)
    assert first.dedup_key is None
    assert first.ack is None
    assert second.payload["body"] == "plain"
    [warning] = [entry for entry in logs if entry["event"] == "redis_pubsub_at_most_once"]
    assert warning["watcher"] == "news_channel"
    assert warning["log_level"] == "warning"


async def test_apply_function_filters_and_drops() -> None:
    uri = channel_uri()
    source = trigger(uri, apply_function=f"{__name__}.shout")
    async with running(source) as events:
        await send(uri, ["bad", "quiet", "go"])
        await until(lambda: source.messages == 3)
    [event] = events
    assert event.payload == {"loud": "GO"}
    assert source.failed == 1
    assert source.filtered == 1


async def test_nobody_subscribed_the_message_is_gone() -> None:
    assert await send(channel_uri(), ["lost"]) == ["0"]


async def test_a_server_restart_is_followed_by_a_new_subscription(private_redis: Service) -> None:
    uri = channel_uri(private_redis.port)
    source = trigger(uri)
    with capture_logs() as logs:
        async with running(source) as events:
            await send(uri, ["before"])
            await until(lambda: len(events) == 1)
            private_redis.stop()
            private_redis.start()
            with anyio.fail_after(30):
                # Not subscribed again yet: "after" was lost; the broker has no event to await.
                while await send(uri, ["after"]) == ["0"]:  # noqa: ASYNC110
                    await anyio.sleep(0.1)
            await until(lambda: len(events) == 2)
    assert [event.payload["body"] for event in events] == ["before", "after"]
    assert any(entry["event"] == "redis_pubsub_subscribed" for entry in logs)


class _Asset:
    name = "news"
    uri = "news://x"
