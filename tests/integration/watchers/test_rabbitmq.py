"""RabbitMqTrigger against the machine's real RabbitMQ broker (and a private node for a
restart), alone and sharing its queue's consumer."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING, Any, cast

import aio_pika
import anyio
import pytest
from structlog.testing import capture_logs

from tests.fixtures.rabbitmq import SHARED_RABBITMQ, declare_queue, ready_count
from triggerer.triggers import TriggerEvent, load_trigger
from watchers import MessageQueueTrigger, RabbitMqTrigger, rabbitmq_consumer
from watchers.rabbitmq import send

if TYPE_CHECKING:
    from deploy.local.services import Service
    from tests.fixtures.rabbitmq import MakeQueue


def refuse_poison(payload: dict[str, Any]) -> dict[str, Any]:
    """An apply_function for the tests that fails on the body "poison"."""
    if payload["body"] == "poison":
        raise ValueError("poison pill")
    return payload


def kind_only(payload: dict[str, Any]) -> dict[str, Any] | None:
    """An apply_function for the tests: drops bodies marked "drop", keeps the kind of the rest."""
    body = payload["body"]
    return None if body.get("drop") else {"kind": body["kind"]}


def uri(name: str, address: str = SHARED_RABBITMQ) -> str:
    return f"amqp://{address}/%2F/{name}"


@contextlib.asynccontextmanager
async def running(trigger: RabbitMqTrigger) -> AsyncIterator[AsyncGenerator[TriggerEvent, None]]:
    events = cast(AsyncGenerator[TriggerEvent, None], trigger.run())
    try:
        yield events
    finally:
        await events.aclose()
        await trigger.cleanup()


async def take(events: AsyncGenerator[TriggerEvent, None], count: int) -> list[TriggerEvent]:
    with anyio.fail_after(20):
        return [await anext(events) for _ in range(count)]


async def publish(name: str, *bodies: bytes, address: str = SHARED_RABBITMQ, **props: Any) -> None:
    """Publish raw messages (no message id unless given)."""
    connection = await aio_pika.connect(f"amqp://guest:guest@{address}/")
    async with connection:
        channel = await connection.channel()
        for body in bodies:
            await channel.default_exchange.publish(aio_pika.Message(body, **props), name)


async def eventually(condition: Any, timeout_s: float = 20) -> None:
    with anyio.fail_after(timeout_s):
        while not await condition():  # noqa: ASYNC110  # the broker's count is what tells
            await anyio.sleep(0.05)


async def test_payload_dedup_key_and_ack_after(make_rabbitmq_queue: MakeQueue) -> None:
    name = await make_rabbitmq_queue()
    [first, _] = await send(uri(name), ['{"kind": "a"}', "plain text"])
    trigger = MessageQueueTrigger(queue=uri(name))
    assert isinstance(trigger, RabbitMqTrigger)
    async with running(trigger) as events:
        one, two = await take(events, 2)
        assert one.payload["body"] == {"kind": "a"}
        assert one.payload["message_id"] == first
        assert one.payload["content_type"] == "application/json"
        assert one.payload["routing_key"] == name
        assert two.payload["body"] == "plain text"
        assert one.dedup_key == f"%2F/{name}/{first}"
        assert one.sent_at is not None
        # Delivered, not acked: nothing ready, nothing gone either.
        assert await ready_count(SHARED_RABBITMQ, name) == 0
        assert one.ack is not None
        assert two.ack is not None
        await one.ack()
        await two.ack()
        await one.ack()  # a second ack is a no-op
        assert trigger.acked == 2
    assert await ready_count(SHARED_RABBITMQ, name) == 0
    # Acked: a new consumer gets nothing.
    assert load_trigger(*trigger.serialize()).serialize() == trigger.serialize()


async def test_an_unacked_message_is_delivered_again_with_its_key(
    make_rabbitmq_queue: MakeQueue,
) -> None:
    name = await make_rabbitmq_queue(kind="quorum")
    await send(uri(name), ['{"kind": "a"}'])
    async with running(RabbitMqTrigger(uri(name))) as events:
        [before] = await take(events, 1)
    assert await ready_count(SHARED_RABBITMQ, name) == 1  # back in the queue at cleanup
    async with running(RabbitMqTrigger(uri(name))) as events:
        [again] = await take(events, 1)
        assert again.dedup_key == before.dedup_key
        assert again.payload == before.payload  # the delivery count is not in it
        assert again.ack is not None
        await again.ack()


async def test_headers_are_json(make_rabbitmq_queue: MakeQueue) -> None:
    name = await make_rabbitmq_queue()
    headers = {"tenant": "t1", "raw": bytearray(b"\x00\xff"), "n": 3, "nested": {"a": [1]}}
    await publish(name, b"{}", headers=headers)
    async with running(RabbitMqTrigger(uri(name))) as events:
        [event] = await take(events, 1)
    assert event.payload["headers"] == {
        "tenant": "t1",
        "raw": {"base64": "AP8="},
        "n": 3,
        "nested": {"a": [1]},
    }
    assert event.payload["message_id"]  # aio-pika (aiormq) gives every message an id


@pytest.mark.parametrize("kind", ["quorum", "classic"])
async def test_a_failing_message_is_retried_then_dead_lettered(
    make_rabbitmq_queue: MakeQueue, kind: str
) -> None:
    name = await make_rabbitmq_queue(kind=kind)
    await send(uri(name), ["poison", '"fine"'])
    trigger = RabbitMqTrigger(
        uri(name), apply_function=f"{__name__}.refuse_poison", max_deliveries=3
    )
    async with running(trigger) as events:
        got = await take(events, 2)
        fine = [event for event in got if event.dead_letter is None]
        letters = [event for event in got if event.dead_letter is not None]
        assert [event.payload["body"] for event in fine] == ["fine"]
        [letter] = letters
        assert letter.dead_letter is not None
        assert "ValueError: poison pill" in letter.dead_letter
        assert "delivered 3 time(s)" in letter.dead_letter
        assert letter.payload["body"] == "poison"
        assert trigger.failed == 3
        for event in got:
            assert event.ack is not None
            await event.ack()
    assert await ready_count(SHARED_RABBITMQ, name) == 0


async def test_the_queues_own_dead_letter_exchange_is_honoured(
    make_rabbitmq_queue: MakeQueue,
) -> None:
    dead = await make_rabbitmq_queue()
    name = await make_rabbitmq_queue(
        kind="quorum",
        arguments={
            "x-delivery-limit": 2,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": dead,
        },
    )
    await send(uri(name), ["poison", '"fine"'])
    trigger = RabbitMqTrigger(
        uri(name),
        apply_function=f"{__name__}.refuse_poison",
        max_deliveries=10,
        broker_dead_letters=True,
    )
    async with running(trigger) as events:
        [fine] = await take(events, 1)
        assert fine.payload["body"] == "fine"
        assert fine.ack is not None
        await fine.ack()
        await eventually(lambda: _ready_is(dead, 1))
    assert trigger.dead_lettered == 0  # the broker's, not the table's
    assert await ready_count(SHARED_RABBITMQ, name) == 0


async def _ready_is(name: str, count: int) -> bool:
    return await ready_count(SHARED_RABBITMQ, name) == count


async def test_filter_apply_function_and_partition_key(make_rabbitmq_queue: MakeQueue) -> None:
    name = await make_rabbitmq_queue()
    bodies = [{"kind": "a"}, {"kind": "b"}, {"kind": "a", "drop": True}, {"kind": "a"}]
    await send(uri(name), [json.dumps(body) for body in bodies])
    trigger = RabbitMqTrigger(
        uri(name),
        filter={"path": "$.body.kind", "equals": "a"},
        apply_function=f"{__name__}.kind_only",
        partition_key_path="$.kind",
    )
    async with running(trigger) as events:
        got = await take(events, 2)
        for event in got:
            assert event.ack is not None
            await event.ack()
        with anyio.fail_after(20):
            while trigger.filtered < 2:  # noqa: ASYNC110  # the consumer's own counter
                await anyio.sleep(0.05)
    assert [(event.payload, event.partition_key) for event in got] == [({"kind": "a"}, "a")] * 2
    assert await ready_count(SHARED_RABBITMQ, name) == 0  # the filtered ones acked too


async def test_a_stream_queue_is_read_from_an_offset(make_rabbitmq_queue: MakeQueue) -> None:
    name = await make_rabbitmq_queue(kind="stream")
    await publish(name, b'{"i": 0}', b'{"i": 1}')
    trigger = RabbitMqTrigger(uri(name), stream_offset="first")
    async with running(trigger) as events:
        got = await take(events, 2)
        for event in got:
            assert event.ack is not None
            await event.ack()
    # The publisher's id first (aio-pika sets one); the offset keys a message without one.
    assert [event.dedup_key for event in got] == [
        f"%2F/{name}/{event.payload['message_id']}" for event in got
    ]
    assert [event.payload["stream_offset"] for event in got] == [0, 1]
    # Read again from the start: the same keys, so the store keeps one event each.
    async with running(RabbitMqTrigger(uri(name), stream_offset="first")) as events:
        assert [event.dedup_key for event in await take(events, 2)] == [
            event.dedup_key for event in got
        ]


async def test_lag_is_the_ready_backlog(make_rabbitmq_queue: MakeQueue) -> None:
    name = await make_rabbitmq_queue()
    await send(uri(name), [json.dumps({"i": i}) for i in range(10)])
    trigger = RabbitMqTrigger(uri(name), prefetch=2)
    assert trigger.lag is None
    async with running(trigger) as events:
        [first] = await take(events, 1)
        assert trigger.lag is not None
        assert 0 < trigger.lag <= 9
        assert trigger.last_poll_at is not None
        assert first.ack is not None
        await first.ack()


async def test_watchers_of_one_queue_each_see_every_message(
    make_rabbitmq_queue: MakeQueue,
) -> None:
    name = await make_rabbitmq_queue()
    consumers = rabbitmq_consumer.Consumers()
    one = RabbitMqTrigger(uri(name))
    two = RabbitMqTrigger(uri(name), filter={"path": "$.body.i", "one_of": [0, 1, 2]})
    consumers.keep([one, two])  # as the daemon says which watchers it runs
    got: dict[int, list[TriggerEvent]] = {}

    async def collect(number: int, events: AsyncGenerator[TriggerEvent, None]) -> None:
        got[number] = await take(events, 3)

    with rabbitmq_consumer.sharing(consumers):
        async with running(one) as first, running(two) as second:
            await send(uri(name), [json.dumps({"i": i}) for i in range(3)])
            async with anyio.create_task_group() as group:
                group.start_soon(collect, 1, first)
                group.start_soon(collect, 2, second)
            got_one, got_two = got[1], got[2]
            assert [e.payload["body"]["i"] for e in got_one] == [0, 1, 2]
            assert [e.payload["body"]["i"] for e in got_two] == [0, 1, 2]
            for event in got_one:
                assert event.ack is not None
                await event.ack()
            # Acked by one watcher only: still held for the other.
            await anyio.sleep(0.3)
            async with running(RabbitMqTrigger(uri(name))) as third:
                with anyio.move_on_after(0.5):
                    await anext(third)
                    pytest.fail("a message not done by every watcher was delivered elsewhere")
            for event in got_two:
                assert event.ack is not None
                await event.ack()
    assert await ready_count(SHARED_RABBITMQ, name) == 0


async def test_a_missing_queue_is_the_watchers_error() -> None:
    trigger = RabbitMqTrigger(uri("triggerer-test-no-such-queue"))
    with pytest.raises(LookupError, match="'triggerer-test-no-such-queue' does not exist in vhost"):
        async with running(trigger) as events:
            await take(events, 1)


async def test_an_unknown_vhost_is_the_watchers_error() -> None:
    trigger = RabbitMqTrigger(f"amqp://{SHARED_RABBITMQ}/no-such-vhost/q")
    with pytest.raises(PermissionError, match="no-such-vhost"):
        async with running(trigger) as events:
            await take(events, 1)


async def test_send_publishes_persistent_messages_with_ids(make_rabbitmq_queue: MakeQueue) -> None:
    name = await make_rabbitmq_queue()
    ids = await send(uri(name), ["1", "two"])
    assert len(set(ids)) == 2
    connection = await aio_pika.connect(f"amqp://guest:guest@{SHARED_RABBITMQ}/")
    async with connection:
        channel = await connection.channel()
        queue = await channel.get_queue(name)
        got = [await queue.get(timeout=5) for _ in ids]
    assert [m.message_id for m in got] == ids
    assert {m.delivery_mode for m in got} == {aio_pika.DeliveryMode.PERSISTENT}
    with pytest.raises(LookupError, match="does not exist"):
        await send(uri("triggerer-test-no-such-queue"), ["x"])


@pytest.mark.timeout(240)
async def test_a_broker_restart_is_reconnected(private_rabbitmq: Service) -> None:
    address = private_rabbitmq.address
    name = "triggerer-test-restart"
    await declare_queue(address, name, kind="quorum")
    await send(uri(name, address), ['{"i": 0}'])
    trigger = RabbitMqTrigger(uri(name, address))
    with capture_logs() as logs:
        async with running(trigger) as events:
            [held] = await take(events, 1)
            private_rabbitmq.stop(grace_s=30)
            private_rabbitmq.start(timeout_s=90)
            assert held.ack is not None
            await held.ack()  # its channel is gone: the broker delivers it again
            await send(uri(name, address), ['{"i": 1}'])
            with anyio.fail_after(90):
                again = [await anext(events) for _ in range(2)]
            assert sorted(e.payload["body"]["i"] for e in again) == [0, 1]
            assert {e.dedup_key for e in again} >= {held.dedup_key}
            for event in again:
                assert event.ack is not None
                await event.ack()
    assert trigger.reconnects >= 1
    assert any(entry["event"] == "rabbitmq_connection_lost" for entry in logs)
    assert await ready_count(address, name) == 0
