"""RabbitMqTrigger against the machine's real RabbitMQ broker (and a private node for a
restart), alone and sharing its queue's consumer."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING, Any, cast

import aio_pika
import anyio
import pytest
from structlog.testing import capture_logs

from tests.fixtures.rabbitmq import SHARED_RABBITMQ, declare_queue, ready_count
from triggerer import checkpoints
from triggerer.triggers import SourceMissing, TriggerEvent, load_trigger
from watchers import MessageQueueTrigger, RabbitMqTrigger
from watchers.rabbitmq import consumer as rabbitmq_consumer
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
    """The trigger's events, without the checkpoint of its first start (see
    :func:`test_the_first_start_is_stored_first`)."""
    events = cast(AsyncGenerator[TriggerEvent, None], trigger.run())
    only = messages(events)
    try:
        yield only
    finally:
        await only.aclose()
        await events.aclose()
        await trigger.cleanup()


async def messages(events: AsyncIterator[TriggerEvent]) -> AsyncGenerator[TriggerEvent, None]:
    async for event in events:
        if not event.is_checkpoint_only:
            yield event


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


class Positions:
    """The daemon's stored positions, as a test keeps them: each acked event's checkpoint."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.stored: dict[str, str] = {}
        monkeypatch.setattr(checkpoints, "_reader", self.read)

    async def read(self, prefix: str) -> dict[str, str]:
        return {key: value for key, value in self.stored.items() if key.startswith(prefix)}

    async def commit(self, events: list[TriggerEvent]) -> None:
        for event in events:
            assert event.checkpoint is not None
            key, position = event.checkpoint
            self.stored[key] = str(max(int(position), int(self.stored.get(key, "0"))))
        await ack_all(events)


def offsets(events: list[TriggerEvent]) -> list[int]:
    return [event.payload["stream_offset"] for event in events]


async def test_a_stream_queue_is_read_on_from_the_stored_offset(
    make_rabbitmq_queue: MakeQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What was published while the watcher was away (a broker restart, a daemon restart) is
    read, and what it stored already is not read again, whatever ``stream_offset`` says."""
    positions = Positions(monkeypatch)
    name = await make_rabbitmq_queue(kind="stream")
    await publish(name, b'{"i": 0}', b'{"i": 1}', b'{"i": 2}')
    async with running(RabbitMqTrigger(uri(name), stream_offset="first", reader_name="r")) as ev:
        got = await take(ev, 3)
        start = offsets(got)[0]
        assert offsets(got) == [start, start + 1, start + 2]
        assert got[-1].checkpoint == (f"rabbitmq/%2F/{name}/r", str(start + 2))
        await positions.commit(got)
    await publish(name, b'{"i": 3}', b'{"i": 4}')  # while no watcher runs
    trigger = RabbitMqTrigger(uri(name), reader_name="r")  # the broker's default: next
    assert trigger.reads_as is None
    async with running(trigger) as events:
        got = await take(events, 2)
        assert offsets(got) == [start + 3, start + 4]
        assert trigger.reads_as == "r"
        await positions.commit(got)
    await publish(name, b'{"i": 5}')
    async with running(RabbitMqTrigger(uri(name), stream_offset="first", reader_name="r")) as ev:
        got = await take(ev, 1)
        assert offsets(got) == [start + 5]  # not the whole stream again
        await positions.commit(got)


async def test_a_stream_declared_again_is_read_from_its_start(
    make_rabbitmq_queue: MakeQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stored offset past the stream's end (the stream deleted and declared again, numbering
    from 0): the broker would wait there for ever; the stream is read from its start instead."""
    monkeypatch.setattr(rabbitmq_consumer, "RESUME_CHECK_S", 0.5)
    positions = Positions(monkeypatch)
    name = await make_rabbitmq_queue(kind="stream")
    positions.stored[f"rabbitmq/%2F/{name}/r"] = "50"
    await publish(name, b'{"i": 0}', b'{"i": 1}')
    with capture_logs() as logs:
        async with running(RabbitMqTrigger(uri(name), reader_name="r")) as events:
            got = await take(events, 2)
            assert bodies(got) == [{"i": 0}, {"i": 1}]
            await ack_all(got)
    assert any(entry["event"] == "rabbitmq_stream_declared_again" for entry in logs)


async def test_the_first_start_is_stored_first() -> None:
    """A watcher reading new messages (``stream_offset`` ``next``, the default) yields when it
    first started as its first checkpoint, before it looks for the queue."""
    name = f"triggerer-test-missing-{time.time_ns()}"
    before_ms = time.time_ns() // 1_000_000
    trigger = RabbitMqTrigger(uri(name), reader_name="r")
    events = cast(AsyncGenerator[TriggerEvent, None], trigger.run())
    try:
        marker = await anext(events)
        with pytest.raises(SourceMissing):
            await anext(events)
    finally:
        await events.aclose()
        await trigger.cleanup()
    assert marker.is_checkpoint_only
    assert marker.checkpoint is not None
    key, started_ms = marker.checkpoint
    assert key == f"rabbitmq/%2F/{name}/r/@started"
    assert before_ms <= int(started_ms) <= time.time_ns() // 1_000_000


async def test_a_stream_queue_is_read_from_the_first_start_while_nothing_is_stored(
    make_rabbitmq_queue: MakeQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watcher first started before its stream queue was written to (declared later, or
    written while no daemon ran): with no offset stored it reads from that start, not from
    ``next``; what came before that second is not read."""
    positions = Positions(monkeypatch)
    name = await make_rabbitmq_queue(kind="stream")
    await publish(name, b'{"i": -1}')
    second = int(time.time()) + 1
    with anyio.fail_after(5):  # RabbitMQ takes the time in whole seconds: the next one
        while time.time() < second:  # noqa: ASYNC110 - waiting for the clock
            await anyio.sleep(0.05)
    positions.stored[f"rabbitmq/%2F/{name}/r/@started"] = str(second * 1000)
    await publish(name, b'{"i": 0}', b'{"i": 1}')
    async with running(RabbitMqTrigger(uri(name), reader_name="r")) as events:
        got = await take(events, 2)
    assert bodies(got) == [{"i": 0}, {"i": 1}]


async def test_another_queue_is_consumed_though_a_first_start_is_stored(
    make_rabbitmq_queue: MakeQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a stream queue takes a start time: a quorum queue refuses it, and is consumed
    without one."""
    positions = Positions(monkeypatch)
    name = await make_rabbitmq_queue(kind="quorum")
    positions.stored[f"rabbitmq/%2F/{name}/r/@started"] = str(time.time_ns() // 1_000_000)
    await send(uri(name), ['{"i": 0}'])
    async with running(RabbitMqTrigger(uri(name), reader_name="r")) as events:
        got = await take(events, 1)
        await ack_all(got)
    assert bodies(got) == [{"i": 0}]


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


async def ack_all(events: list[TriggerEvent]) -> None:
    for event in events:
        assert event.ack is not None
        await event.ack()


def bodies(events: list[TriggerEvent]) -> list[Any]:
    return [event.payload["body"] for event in events]


async def test_a_watcher_not_running_sees_the_messages_it_missed(
    make_rabbitmq_queue: MakeQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two watchers of a queue, the second not running when messages come (its own backoff
    after a failure is longer than the consumer waits for it): the first reads and acks them,
    and they are held, unacked, until the second has read them too."""
    monkeypatch.setattr(rabbitmq_consumer, "JOIN_WAIT_S", 0.2)
    name = await make_rabbitmq_queue()
    consumers = rabbitmq_consumer.Consumers()
    one = RabbitMqTrigger(uri(name))
    two = RabbitMqTrigger(uri(name), prefetch=50)
    consumers.keep([one, two])
    with rabbitmq_consumer.sharing(consumers):
        async with running(one) as first:
            await send(uri(name), [json.dumps({"i": i}) for i in range(3)])
            await ack_all(got_one := await take(first, 3))
            assert bodies(got_one) == [{"i": i} for i in range(3)]
            assert await ready_count(SHARED_RABBITMQ, name) == 0
            # Back (a new instance of the same watcher): handed what it missed.
            async with running(RabbitMqTrigger(uri(name), prefetch=50)) as second:
                got_two = await take(second, 3)
                assert bodies(got_two) == [{"i": i} for i in range(3)]
                await ack_all(got_two)
                await send(uri(name), ['{"i": 3}'])
                await ack_all(await take(first, 1))
                await ack_all(await take(second, 1))
    # Every message acked: none went back to the queue when the consumer closed.
    assert await ready_count(SHARED_RABBITMQ, name) == 0


async def test_a_watcher_restarted_sees_what_it_had_not_acked_and_what_came_meanwhile(
    make_rabbitmq_queue: MakeQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``prefetch=1``, the broker delivers the next message only once the one before is
    acked: so what comes next shows what was acked."""
    monkeypatch.setattr(rabbitmq_consumer, "JOIN_WAIT_S", 0.2)
    name = await make_rabbitmq_queue()
    consumers = rabbitmq_consumer.Consumers()

    def watcher(reader_name: str) -> RabbitMqTrigger:
        return RabbitMqTrigger(uri(name), prefetch=1, reader_name=reader_name)

    one = watcher("one")
    consumers.keep([one, watcher("two")])
    with rabbitmq_consumer.sharing(consumers):
        async with running(one) as first:
            async with running(watcher("two")) as second:
                await send(uri(name), ['{"i": 0}'])
                await ack_all(await take(first, 1))
                [unacked] = await take(second, 1)
            # The second watcher stopped before its ack (restarted): held for it.
            await send(uri(name), ['{"i": 1}'])
            async with running(watcher("two")) as second:
                [again] = await take(second, 1)
                assert again.dedup_key == unacked.dedup_key
                assert bodies([again]) == [{"i": 0}]
                await ack_all([again])
                # Acked by both: the broker delivers the next one.
                await ack_all(next_one := await take(first, 1))
                assert bodies(next_one) == [{"i": 1}]
                await ack_all(await take(second, 1))
            # Held for a watcher the daemon no longer runs: acked once it says so.
            await send(uri(name), ['{"i": 2}', '{"i": 3}'])
            await ack_all(await take(first, 1))
            consumers.keep([one])
            [last] = await take(first, 1)
            assert bodies([last]) == [{"i": 3}]
            await ack_all([last])
    assert await ready_count(SHARED_RABBITMQ, name) == 0


async def test_a_missing_queue_is_the_watchers_error() -> None:
    trigger = RabbitMqTrigger(uri("triggerer-test-no-such-queue"))
    with pytest.raises(
        SourceMissing, match="'triggerer-test-no-such-queue' does not exist in vhost"
    ):
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
