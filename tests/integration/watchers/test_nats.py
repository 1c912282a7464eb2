"""NatsTrigger against real NATS JetStream servers: the machine's shared one, and private ones
restarted on their port."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, cast

import anyio
import nats
import pytest
from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig
from structlog.testing import capture_logs

from tests.fixtures.nats import SHARED_NATS, create_stream
from tests.fixtures.triggers import running, take
from triggerer.triggers import SourceMissing, TriggerEvent
from watchers.nats import PROVIDER, NatsTrigger
from watchers.nats import client as nats_client
from watchers.nats.in_flight import IN_PROGRESS, InFlight
from watchers.nats.pull import Pull, PullEnded

if TYPE_CHECKING:
    from deploy.local.services import Service
    from tests.fixtures.nats import MakeStream


def refuse_poison(payload: dict[str, Any]) -> dict[str, Any]:
    """An apply_function for the tests that fails on the body "poison"."""
    if payload["body"] == "poison":
        raise ValueError("poison pill")
    return payload


@contextlib.asynccontextmanager
async def client(servers: str = SHARED_NATS) -> AsyncIterator[Client]:
    connection = await nats.connect(f"nats://{servers}")
    try:
        yield connection
    finally:
        await connection.close()


async def until(condition: Callable[[], Any], timeout_s: float = 20) -> None:
    with anyio.fail_after(timeout_s):
        # A counter the trigger or the server keeps: there is no event to wait on.
        while not await condition():  # noqa: ASYNC110
            await anyio.sleep(0.05)


async def send(stream: str, *bodies: str, servers: str = SHARED_NATS) -> list[str]:
    return await PROVIDER.send(f"nats://{servers}/{stream}/{stream}.in", list(bodies))


def trigger_of(stream: str, servers: str = SHARED_NATS, **options: Any) -> NatsTrigger:
    options.setdefault("fetch_wait_s", 0.5)
    trigger = PROVIDER.trigger(f"nats://{servers}/{stream}/{stream}.%3E", **options)
    assert isinstance(trigger, NatsTrigger)
    return trigger


async def consumer(stream: str, durable: str, servers: str = SHARED_NATS) -> Any:
    async with client(servers) as connection:
        return await connection.jetstream().consumer_info(stream, durable)


async def key_of(stream: str, sequence: int, servers: str = SHARED_NATS) -> str:
    """The dedup key of the message at ``sequence`` of the stream as it is now."""
    async with client(servers) as connection:
        created_ns = await nats_client.stream_created_ns(connection, stream)
    return f"{stream}/{sequence}@{created_ns}"


async def test_payload_dedup_key_and_ack_after(make_nats_stream: MakeStream) -> None:
    stream = await make_nats_stream()
    ids = await send(stream, '{"n": 1}', "plain text")
    assert ids == [f"{stream}/1", f"{stream}/2"]
    trigger = trigger_of(stream)
    async with running(trigger) as events:
        first, second = await take(events, 2)
        assert first.payload["body"] == {"n": 1}
        assert second.payload["body"] == "plain text"
        assert first.payload["subject"] == f"{stream}.in"
        assert first.payload["stream"] == stream
        assert first.payload["sequence"] == 1
        assert "Nats-Msg-Id" in first.payload["headers"]
        assert first.payload["published_at"].endswith("+00:00")
        assert first.dedup_key == await key_of(stream, 1)
        assert second.dedup_key == await key_of(stream, 2)
        assert first.sent_at is not None
        assert trigger.reads_as == trigger.durable_name
        info = await consumer(stream, trigger.durable_name)
        assert info.num_ack_pending == 2  # nothing is acked before the commit
        assert first.ack is not None
        assert second.ack is not None
        await first.ack()
        await second.ack()

        async def none_pending() -> bool:
            return (await consumer(stream, trigger.durable_name)).num_ack_pending == 0

        await until(none_pending)
        assert trigger.acked == 2


async def test_an_unacked_message_is_delivered_again_with_its_key(
    make_nats_stream: MakeStream,
) -> None:
    stream = await make_nats_stream()
    await send(stream, '{"n": 1}')
    trigger = trigger_of(stream, ack_wait_s=1)
    async with running(trigger) as events:
        [first] = await take(events, 1)
    # Its ack never came: a later reader of the durable gets it again, under the same key.
    again = trigger_of(stream, ack_wait_s=1)
    async with running(again) as events:
        [second] = await take(events, 1)
        assert second.dedup_key == first.dedup_key
        assert second.payload == first.payload
        assert second.ack is not None
        await second.ack()


async def test_in_progress_holds_a_message_past_ack_wait(make_nats_stream: MakeStream) -> None:
    stream = await make_nats_stream()
    await send(stream, '{"n": 1}')
    trigger = trigger_of(stream, ack_wait_s=1)
    async with running(trigger) as events:
        [event] = await take(events, 1)
        waiting = anyio.create_task_group()
        async with waiting:
            waiting.start_soon(anext, events)
            await anyio.sleep(3.5)  # three ack waits, the commit still under way
            info = await consumer(stream, trigger.durable_name)
            assert info.num_redelivered == 0
            assert info.num_ack_pending == 1
            waiting.cancel_scope.cancel()
        assert event.ack is not None
        await event.ack()


async def test_a_failed_in_progress_mark_is_logged_and_marking_goes_on(
    make_nats_stream: MakeStream, monkeypatch: pytest.MonkeyPatch
) -> None:
    stream = await make_nats_stream()
    await send(stream, '"held"')
    async with client() as connection:
        jetstream = connection.jetstream()
        await jetstream.add_consumer(
            stream,
            ConsumerConfig(durable_name="held", ack_policy=AckPolicy.EXPLICIT, ack_wait=1),
        )
        pull = await jetstream.pull_subscribe_bind(durable="held", stream=stream)
        [message] = await pull.fetch(1, timeout=5)
        publish = connection.publish
        marks = 0

        async def first_mark_fails(subject: str, payload: bytes, *more: Any, **named: Any) -> None:
            nonlocal marks
            if payload == IN_PROGRESS:
                marks += 1
                if marks == 1:
                    raise nats.errors.OutboundBufferLimitError
            await publish(subject, payload, *more, **named)

        monkeypatch.setattr(connection, "publish", first_mark_fails)
        in_flight = InFlight(ack_wait_s=1, limit=10)
        ack = in_flight.received(message.metadata.sequence.stream, message.reply)
        with capture_logs() as logs:
            in_flight.connected(connection, name="test-in-progress")
            try:
                await anyio.sleep(3.5)  # three ack waits
                with pytest.raises(TimeoutError):
                    await pull.fetch(1, timeout=1)  # not delivered again: still in progress
                await ack()
            finally:
                await in_flight.disconnected()

        async def acked() -> bool:
            info = await jetstream.consumer_info(stream, "held")
            assert info.num_redelivered == 0
            return bool(info.num_ack_pending == 0)

        await until(acked)
    assert marks >= 5
    [failure] = [entry for entry in logs if entry["event"] == "nats_in_progress_failed"]
    assert failure["messages"] == 1
    assert "OutboundBufferLimitError" in failure["error"]


async def test_a_failing_message_is_dead_lettered_at_max_deliveries(
    make_nats_stream: MakeStream,
) -> None:
    stream = await make_nats_stream()
    await send(stream, '"first"', "poison", '"last"')
    trigger = trigger_of(stream, max_deliveries=3, apply_function=f"{__name__}.refuse_poison")
    async with running(trigger) as events:
        taken = await take(events, 3)
        for event in taken:
            assert event.ack is not None
            await event.ack()
    [letter] = [event for event in taken if event.dead_letter is not None]
    assert [event.payload["body"] for event in taken if event.dead_letter is None] == [
        "first",
        "last",
    ]
    assert letter.payload["body"] == "poison"
    assert letter.dedup_key == await key_of(stream, 2)
    assert letter.dead_letter is not None
    assert "ValueError: poison pill" in letter.dead_letter
    assert "delivery 3 of max_deliveries=3" in letter.dead_letter
    assert trigger.failed == 3
    assert trigger.dead_lettered == 1


async def test_a_message_delivered_past_max_deliveries_is_dead_lettered_unprocessed(
    make_nats_stream: MakeStream,
) -> None:
    """The daemon killed during each delivery (by the message itself, maybe): the server keeps
    delivering it though nobody listens when its last ack wait runs out, and the delivery past
    ``max_deliveries`` is a dead letter, its apply_function not run again."""
    stream = await make_nats_stream()
    trigger = trigger_of(
        stream, max_deliveries=2, ack_wait_s=1, apply_function=f"{__name__}.refuse_poison"
    )
    async with running(trigger) as events:
        # The durable exists once the trigger reads; nothing to read yet.
        with anyio.move_on_after(1):
            await anext(events)
    assert (await consumer(stream, trigger.durable_name)).config.max_deliver == -1
    await send(stream, "poison")
    # Another reader of the durable takes the message twice and never acks (a killed daemon),
    # then nobody reads it for longer than the ack wait.
    async with client() as connection:
        pull = await connection.jetstream().pull_subscribe_bind(
            durable=trigger.durable_name, stream=stream
        )
        for delivery in (1, 2):
            [message] = await pull.fetch(1, timeout=5)
            assert message.metadata.num_delivered == delivery
            await anyio.sleep(1.3)
    await anyio.sleep(2)
    async with running(trigger) as events:
        [letter] = await take(events, 1)
        assert letter.ack is not None
        await letter.ack()

        async def none_pending() -> bool:
            info = await consumer(stream, trigger.durable_name)
            return bool(info.num_ack_pending == info.num_pending == 0)

        await until(none_pending)
    assert letter.dedup_key == await key_of(stream, 1)
    assert letter.payload["body"] == "poison"
    assert letter.dead_letter == (
        "delivered 3 times, more than max_deliveries=2, without its event being stored"
    )
    assert trigger.failed == 0  # refuse_poison was not run on it


async def test_a_durable_of_an_earlier_version_is_updated_to_unlimited_deliveries(
    make_nats_stream: MakeStream,
) -> None:
    """Durables made before had ``max_deliver=max_deliveries``: the server would give up on a
    message by itself. The trigger updates them in place, keeping their place."""
    stream = await make_nats_stream()
    await send(stream, '"acked before"', '"after"')
    trigger = trigger_of(stream)
    async with client() as connection:
        jetstream = connection.jetstream()
        made = await jetstream.add_consumer(
            stream,
            ConsumerConfig(
                durable_name=trigger.durable_name,
                filter_subject=f"{stream}.>",
                ack_policy=AckPolicy.EXPLICIT,
                ack_wait=30,
                max_deliver=5,
                max_ack_pending=5000,
            ),
        )
        pull = await jetstream.pull_subscribe_bind(durable=trigger.durable_name, stream=stream)
        [message] = await pull.fetch(1, timeout=5)
        await message.ack_sync()
    async with running(trigger) as events:
        [event] = await take(events, 1)
        assert event.payload["body"] == "after"
        info = await consumer(stream, trigger.durable_name)
        assert info.config.max_deliver == -1
        assert info.created == made.created  # the same durable, not one made again


async def test_filtered_messages_are_acked(make_nats_stream: MakeStream) -> None:
    stream = await make_nats_stream()
    await send(stream, '{"kind": "a"}', '{"kind": "b"}')
    trigger = trigger_of(stream, filter={"path": "$.body.kind", "equals": "b"})
    async with running(trigger) as events:
        [event] = await take(events, 1)
        assert event.payload["body"] == {"kind": "b"}
        assert trigger.filtered == 1
        info = await consumer(stream, trigger.durable_name)
        assert info.num_ack_pending == 1  # the filtered one is acked, the event is not yet


async def test_partition_key_and_lag(make_nats_stream: MakeStream) -> None:
    stream = await make_nats_stream()
    await send(stream, *(json.dumps({"day": f"d{n}"}) for n in range(5)))
    trigger = trigger_of(stream, partition_key_path="$.body.day", fetch_batch=1)
    assert trigger.lag is None
    async with running(trigger) as events:
        [first] = await take(events, 1)
        assert first.partition_key == "d0"
        assert trigger.lag == 5  # four to deliver, one unacked
        rest = await take(events, 4)
        for event in [first, *rest]:
            assert event.ack is not None
            await event.ack()
        with anyio.move_on_after(1.5):
            await anext(events)  # an empty pull
        assert trigger.lag == 0
        assert trigger.last_poll_at is not None


async def test_max_in_flight_pauses_pulling(make_nats_stream: MakeStream) -> None:
    stream = await make_nats_stream()
    await send(stream, "1", "2", "3")
    trigger = trigger_of(stream, max_in_flight=2)
    async with running(trigger) as events:
        first, _ = await take(events, 2)
        # Cancelling a pending anext() would end the generator: a task waits for it instead.
        third = asyncio.ensure_future(anext(events))
        await anyio.sleep(1.5)
        assert not third.done()
        assert first.ack is not None
        await first.ack()
        with anyio.fail_after(20):
            assert (await third).payload["body"] == 3


async def test_a_missing_stream_or_a_foreign_subject_is_the_watchers_error(
    make_nats_stream: MakeStream,
) -> None:
    missing = PROVIDER.trigger(f"nats://{SHARED_NATS}/no-such-stream/a.b")
    with pytest.raises(SourceMissing, match="NATS stream 'no-such-stream' does not exist"):
        async with running(cast(NatsTrigger, missing)) as events:
            await anext(events)
    stream = await make_nats_stream()
    foreign = PROVIDER.trigger(f"nats://{SHARED_NATS}/{stream}/elsewhere.x")
    with pytest.raises(
        ValueError, match=re.escape("cannot be created or updated for subject 'elsewhere.x'")
    ):
        async with running(cast(NatsTrigger, foreign)) as events:
            await anext(events)


async def test_send_refuses_wildcards_and_unknown_streams(make_nats_stream: MakeStream) -> None:
    stream = await make_nats_stream()
    with pytest.raises(ValueError, match="a wildcard subject"):
        await PROVIDER.send(f"nats://{SHARED_NATS}/{stream}/{stream}.*", ["x"])
    with pytest.raises(ConnectionError, match="stream 'nope'"):
        await PROVIDER.send(f"nats://{SHARED_NATS}/nope/{stream}.a", ["x"])
    with pytest.raises(ConnectionError, match="cannot be reached"):
        await PROVIDER.send("nats://127.0.0.1:1/S/a", ["x"])


@pytest.mark.timeout(120)
async def test_a_server_restart_reconnects_and_loses_nothing(private_nats: Service) -> None:
    servers = private_nats.address
    stream = "restarted"
    await create_stream(servers, stream)
    await send(stream, "1", "2", servers=servers)
    trigger = trigger_of(stream, servers, ack_wait_s=2)
    seen: list[TriggerEvent] = []

    async def read_and_ack(events: AsyncIterator[TriggerEvent]) -> None:
        async for event in events:
            seen.append(event)
            assert event.ack is not None
            await event.ack()

    async def all_done() -> bool:
        info = await consumer(stream, trigger.durable_name, servers)
        bodies = {event.payload["body"] for event in seen}
        return bool(bodies == {1, 2, 3} and info.num_ack_pending == info.num_pending == 0)

    async with running(trigger) as events, anyio.create_task_group() as group:
        group.start_soon(read_and_ack, events)
        await until(lambda: asyncio.sleep(0, result=len(seen) >= 2))
        private_nats.stop()
        private_nats.start()
        await send(stream, "3", servers=servers)
        await until(all_done, timeout_s=60)
        group.cancel_scope.cancel()
    # An ack the restart lost brings its message again, under the same key.
    keys = {event.dedup_key: event.payload["body"] for event in seen}
    assert keys == {await key_of(stream, n, servers): n for n in (1, 2, 3)}


async def supervised(trigger: NatsTrigger) -> AsyncIterator[TriggerEvent]:
    """The trigger's events, its run started again (as the daemon does) when it ends on a
    missing stream."""
    while True:
        events = cast(AsyncGenerator[TriggerEvent, None], trigger.run())
        try:
            async for event in events:
                yield event
        except LookupError:
            await anyio.sleep(0.2)
        finally:
            await events.aclose()


async def test_a_stream_created_again_gives_new_keys(make_nats_stream: MakeStream) -> None:
    """A stream deleted and made again under its name starts its sequences over: the new
    messages are events of keys of their own, not duplicates of the old ones."""
    stream = await make_nats_stream()
    await send(stream, '"old 1"', '"old 2"')
    trigger = trigger_of(stream)
    events = cast(AsyncGenerator[TriggerEvent, None], supervised(trigger))
    try:
        old = await take(events, 2)
        for event in old:
            assert event.ack is not None
            await event.ack()
        async with client() as connection:  # deleted and made again at once
            await connection.jetstream().delete_stream(stream)
            await connection.jetstream().add_stream(name=stream, subjects=[f"{stream}.>"])
        assert await send(stream, '"new 1"', '"new 2"') == [f"{stream}/1", f"{stream}/2"]
        new = await take(events, 2, timeout_s=30)
    finally:
        await events.aclose()
        await trigger.cleanup()
    assert [event.payload["body"] for event in new] == ["new 1", "new 2"]
    assert [event.payload["sequence"] for event in new] == [1, 2]
    assert [event.dedup_key for event in new] == [await key_of(stream, n) for n in (1, 2)]
    assert not {event.dedup_key for event in old} & {event.dedup_key for event in new}


async def test_an_unanswered_pull_looks_the_durable_up(make_nats_stream: MakeStream) -> None:
    """A pull to a durable deleted between two pulls is not answered at all: past its expiry
    the durable is looked up, and its absence ends the pulls (the trigger connects again)."""
    stream = await make_nats_stream()
    async with client() as connection:
        pull = Pull(connection, stream, "nobody", batch=10, expires_s=0.2)
        await pull.start()
        with anyio.fail_after(10), pytest.raises(PullEnded, match=r"'nobody' .* no longer exists"):
            await pull.take(10)
        await pull.stop()
