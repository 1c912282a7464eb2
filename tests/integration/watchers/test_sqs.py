"""SqsTrigger against a real moto SQS server, alone and sharing its queue's poller."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from aiobotocore.session import get_session
from structlog.testing import capture_logs

from tests.fixtures.triggers import running, take, until
from triggerer.triggers import SourceMissing, load_trigger
from watchers import SqsTrigger
from watchers.sqs import send as provider_send
from watchers.sqs import session as sqs_session
from watchers.sqs.client import QueueClient
from watchers.sqs.dead_letters import DEAD_LETTER_REASON_ATTRIBUTE, DEAD_LETTER_SOURCE_ATTRIBUTE

if TYPE_CHECKING:
    from tests.fixtures.brokers import MakeQueue


def drop_marked(payload: dict[str, Any]) -> dict[str, Any] | None:
    """A transform for the tests: drops bodies marked "drop", keeps the body of the rest."""
    body = payload["body"]
    if body.get("drop"):
        return None
    return {"id": payload["message_id"], "kind": body["kind"]}


def reject_poison(payload: dict[str, Any]) -> dict[str, Any]:
    """A transform for the tests that fails on the body "poison"."""
    if payload["body"] == "poison":
        raise ValueError("poison pill")
    return payload


def nan_on_request(payload: dict[str, Any]) -> dict[str, Any]:
    """A transform for the tests that returns NaN, which no JSON column can store, for "nan"."""
    return {"value": float("nan")} if payload["body"] == "nan" else payload


@pytest.fixture
async def sqs(moto_server: str) -> AsyncIterator[Any]:
    async with get_session().create_client("sqs", endpoint_url=moto_server) as client:
        yield client


async def send(sqs: Any, queue_url: str, *bodies: str, **extra: Any) -> list[str]:
    ids = []
    for body in bodies:
        response = await sqs.send_message(QueueUrl=queue_url, MessageBody=body, **extra)
        ids.append(response["MessageId"])
    return ids


async def queue_size(sqs: Any, queue_url: str) -> int:
    response = await sqs.get_queue_attributes(
        QueueUrl=queue_url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )
    return sum(int(value) for value in response["Attributes"].values())


def queue_name(queue_url: str) -> str:
    return queue_url.rsplit("/", 1)[1]


async def test_payload_shape(sqs: Any, sqs_queue: str) -> None:
    [json_id] = await send(
        sqs,
        sqs_queue,
        json.dumps({"order": 7}),
        MessageAttributes={
            "kind": {"DataType": "String", "StringValue": "order"},
            "count": {"DataType": "Number", "StringValue": "3"},
            "blob": {"DataType": "Binary", "BinaryValue": b"\xff\xfe"},
            "doc": {"DataType": "Binary", "BinaryValue": b'{"a": 1}'},
        },
    )
    [text_id] = await send(sqs, sqs_queue, "plain text")
    trigger = SqsTrigger(sqs_queue, wait_time_s=1)
    async with running(trigger) as events:
        first, second = sorted(
            await take(events, 2), key=lambda e: e.payload["body"] != {"order": 7}
        )
    assert first.dedup_key == f"{queue_name(sqs_queue)}/{json_id}"
    assert first.payload["message_id"] == json_id
    assert first.payload["body"] == {"order": 7}
    # Invalid UTF-8 reaches us through a Binary attribute (SQS bodies are always valid text).
    assert first.payload["message_attributes"] == {
        "kind": "order",
        "count": "3",
        "blob": {"base64": "//4="},
        "doc": {"a": 1},
    }
    assert first.payload["attributes"]["ApproximateReceiveCount"] == "1"
    assert first.sent_at == int(first.payload["attributes"]["SentTimestamp"]) / 1000
    assert set(first.payload) == {"message_id", "body", "attributes", "message_attributes"}
    assert second.payload["body"] == "plain text"
    assert second.payload["message_attributes"] == {}
    assert second.dedup_key == f"{queue_name(sqs_queue)}/{text_id}"
    assert first.partition_key is None


async def test_unacked_message_comes_back_after_restart_acked_never(
    sqs: Any, sqs_queue: str
) -> None:
    await send(sqs, sqs_queue, "once")
    trigger = SqsTrigger(sqs_queue, wait_time_s=1)
    async with running(trigger) as events:
        [first] = await take(events, 1)
    again = load_trigger(*trigger.serialize())
    assert isinstance(again, SqsTrigger)
    async with running(again) as events:
        [second] = await take(events, 1)
        assert second.dedup_key == first.dedup_key
        assert second.ack is not None
        await second.ack()
    assert await queue_size(sqs, sqs_queue) == 0
    response = await sqs.receive_message(QueueUrl=sqs_queue, WaitTimeSeconds=1)
    assert "Messages" not in response


async def test_visibility_is_extended_while_the_ack_is_pending(sqs: Any, sqs_queue: str) -> None:
    await send(sqs, sqs_queue, "slow")
    trigger = SqsTrigger(sqs_queue, wait_time_s=1, visibility_timeout_s=2)
    async with running(trigger) as events:
        [event] = await take(events, 1)
        # Without extension the message would be visible again after 2 s.
        response = await sqs.receive_message(QueueUrl=sqs_queue, WaitTimeSeconds=5)
        assert "Messages" not in response
        assert event.ack is not None
        await event.ack()
    assert await queue_size(sqs, sqs_queue) == 0


async def test_acks_are_deleted_in_batches(
    sqs: Any, sqs_queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await provider_send(sqs_queue, [str(n) for n in range(25)])
    calls: list[int] = []
    real_call = QueueClient.call

    async def recording_call(self: QueueClient, operation: str, **arguments: Any) -> dict[str, Any]:
        if operation != "delete_message_batch":
            return await real_call(self, operation, **arguments)
        calls.append(len(arguments["Entries"]))
        if len(calls) > 1:
            return await real_call(self, operation, **arguments)
        # The first batch: the service fails on one entry on its side; it must be retried.
        first, *rest = arguments["Entries"]
        response = await real_call(self, operation, **{**arguments, "Entries": rest})
        response["Failed"] = [{"Id": first["Id"], "SenderFault": False, "Code": "InternalError"}]
        return response

    monkeypatch.setattr(QueueClient, "call", recording_call)
    trigger = SqsTrigger(sqs_queue, wait_time_s=1)
    with capture_logs() as logs:
        async with running(trigger) as events:
            for event in await take(events, 25):
                assert event.ack is not None
                await event.ack()
    assert await queue_size(sqs, sqs_queue) == 0
    assert trigger.deleted == 25
    assert max(calls) == 10
    assert len(calls) <= 6, calls  # 25 acks + 1 retried entry in batches of up to ten
    assert any(log["event"] == "sqs_delete_retrying" for log in logs)


async def test_filter_and_transform(sqs: Any, sqs_queue: str) -> None:
    bodies = [
        {"kind": "keep"},
        {"kind": "other"},
        {"kind": "keep", "drop": True},
        {"kind": "keep", "n": 2},
    ]
    ids = await send(sqs, sqs_queue, *(json.dumps(body) for body in bodies))
    trigger = SqsTrigger(
        sqs_queue,
        wait_time_s=1,
        filter={"path": "$.body.kind", "equals": "keep"},
        transform=f"{__name__}.drop_marked",
    )
    async with running(trigger) as events:
        kept = await take(events, 2)
        for event in kept:
            assert event.ack is not None
            await event.ack()
    assert sorted(event.payload["id"] for event in kept) == sorted([ids[0], ids[3]])
    assert all(event.payload["kind"] == "keep" for event in kept)
    assert trigger.filtered == 2
    assert await queue_size(sqs, sqs_queue) == 0  # filtered messages are deleted too


async def test_poison_message_goes_to_the_dead_letter_queue_with_the_reason(
    sqs: Any, make_sqs_queue: MakeQueue
) -> None:
    dead_letters = await make_sqs_queue()
    queue = await make_sqs_queue(VisibilityTimeout="1")
    await send(sqs, queue, "poison", "fine")
    trigger = SqsTrigger(
        queue,
        wait_time_s=1,
        transform=f"{__name__}.reject_poison",
        dead_letter_queue=dead_letters,
        max_receives=2,
    )
    async with running(trigger) as events:
        [good] = await take(events, 1)
        assert good.payload["body"] == "fine"
        assert good.ack is not None
        await good.ack()
        response = await sqs.receive_message(
            QueueUrl=dead_letters, WaitTimeSeconds=10, MessageAttributeNames=["All"]
        )
        # Sent to the dead-letter queue first, then deleted from the queue.
        await until(lambda: trigger.dead_lettered == 1)
    [dead] = response["Messages"]
    assert dead["Body"] == "poison"
    attributes = dead["MessageAttributes"]
    assert attributes[DEAD_LETTER_REASON_ATTRIBUTE]["StringValue"] == "ValueError: poison pill"
    assert attributes[DEAD_LETTER_SOURCE_ATTRIBUTE]["StringValue"] == queue
    assert trigger.failed == 2
    assert trigger.dead_lettered == 1
    assert await queue_size(sqs, queue) == 0


async def test_transform_returning_non_json_dead_letters_that_message_only(
    sqs: Any, make_sqs_queue: MakeQueue
) -> None:
    dead_letters = await make_sqs_queue()
    queue = await make_sqs_queue(VisibilityTimeout="1")
    await send(sqs, queue, "nan", "fine")
    trigger = SqsTrigger(
        queue,
        wait_time_s=1,
        transform=f"{__name__}.nan_on_request",
        dead_letter_queue=dead_letters,
        max_receives=1,
    )
    async with running(trigger) as events:
        [good] = await take(events, 1)
        assert good.payload["body"] == "fine"
        response = await sqs.receive_message(
            QueueUrl=dead_letters, WaitTimeSeconds=10, MessageAttributeNames=["All"]
        )
    [dead] = response["Messages"]
    assert dead["Body"] == "nan"
    reason = dead["MessageAttributes"][DEAD_LETTER_REASON_ATTRIBUTE]["StringValue"]
    assert reason.startswith("TypeError: transform result")
    assert "JSON-serialisable" in reason


async def test_redrive_policy_is_the_default_dead_letter_queue(
    sqs: Any, make_sqs_queue: MakeQueue
) -> None:
    dead_letters = await make_sqs_queue()
    arn = (await sqs.get_queue_attributes(QueueUrl=dead_letters, AttributeNames=["QueueArn"]))[
        "Attributes"
    ]["QueueArn"]
    policy = json.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": 1})
    queue = await make_sqs_queue(RedrivePolicy=policy)
    await send(sqs, queue, "poison")
    trigger = SqsTrigger(queue, wait_time_s=1, transform=f"{__name__}.reject_poison")
    async with running(trigger) as events, anyio.create_task_group() as group:
        group.start_soon(take, events, 1, 60)  # drives the watcher: nothing is ever yielded
        response = await sqs.receive_message(
            QueueUrl=dead_letters, WaitTimeSeconds=10, MessageAttributeNames=["All"]
        )
        await until(lambda: trigger.dead_lettered == 1)
        group.cancel_scope.cancel()
    [dead] = response["Messages"]
    assert dead["MessageAttributes"][DEAD_LETTER_REASON_ATTRIBUTE]["StringValue"] == (
        "ValueError: poison pill"
    )
    assert trigger.dead_lettered == 1


async def test_batch_mode_yields_one_event_per_receive(sqs: Any, sqs_queue: str) -> None:
    await sqs.send_message_batch(
        QueueUrl=sqs_queue,
        Entries=[{"Id": str(n), "MessageBody": json.dumps({"n": n})} for n in range(6)],
    )
    trigger = SqsTrigger(sqs_queue, wait_time_s=1, batch=True)
    seen: list[int] = []
    async with running(trigger) as events:
        with anyio.fail_after(10):
            while len(seen) < 6:
                event = await anext(events)
                batch = event.payload["message_batch"]
                ids = [message["message_id"] for message in batch]
                assert event.dedup_key == f"{queue_name(sqs_queue)}/{','.join(ids)}"
                seen += [message["body"]["n"] for message in batch]
                assert event.ack is not None
                await event.ack()
    assert sorted(seen) == list(range(6))
    assert trigger.events < 6 or len(seen) == 6
    assert await queue_size(sqs, sqs_queue) == 0


async def test_concurrent_receivers(sqs: Any, sqs_queue: str) -> None:
    for start in range(0, 40, 10):
        await sqs.send_message_batch(
            QueueUrl=sqs_queue,
            Entries=[{"Id": str(n), "MessageBody": str(n)} for n in range(start, start + 10)],
        )
    trigger = SqsTrigger(sqs_queue, wait_time_s=1, receivers=4)
    bodies: dict[str | None, int] = {}
    async with running(trigger) as events:
        # Delivery is at least once: moto may hand one message to two receivers polling at the
        # same instant (the ingest's dedup key absorbs that), so count distinct messages.
        with anyio.fail_after(10):
            while len(bodies) < 40:
                event = await anext(events)
                assert event.ack is not None
                await event.ack()
                bodies[event.dedup_key] = event.payload["body"]
    assert sorted(bodies.values()) == list(range(40))
    assert await queue_size(sqs, sqs_queue) == 0


async def test_partition_key_from_the_payload(sqs: Any, sqs_queue: str) -> None:
    await send(sqs, sqs_queue, json.dumps({"day": "2026-03-16"}))
    trigger = SqsTrigger(sqs_queue, wait_time_s=1, partition_key_path="$.body.day")
    async with running(trigger) as events:
        [event] = await take(events, 1)
    assert event.partition_key == "2026-03-16"


async def test_named_connection_and_sqs_uri(
    sqs: Any, sqs_queue: str, moto_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    connections = {
        "aws": {
            "endpoint_url": moto_server,
            "region_name": "us-east-1",
            "aws_access_key_id": "testing",
            "aws_secret_access_key": "testing",
        }
    }
    monkeypatch.setattr("watchers.sqs.client.get_connection", connections.__getitem__)
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    await send(sqs, sqs_queue, "hello")
    trigger = SqsTrigger(f"sqs://{queue_name(sqs_queue)}", wait_time_s=1, connection="aws")
    async with running(trigger) as events:
        [event] = await take(events, 1)
    assert event.payload["body"] == "hello"


async def test_missing_queue_is_a_clear_error(moto_server: str) -> None:
    trigger = SqsTrigger(f"sqs://no-such-queue?endpoint_url={moto_server}", wait_time_s=1)
    with pytest.raises(SourceMissing, match="SQS queue 'no-such-queue' does not exist"):
        async with running(trigger) as events:
            await anext(events)


async def test_lag_is_the_queue_backlog(
    sqs: Any, sqs_queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("watchers.sqs.session.LAG_INTERVAL_S", 0.1)
    for start in range(0, 25, 10):
        await sqs.send_message_batch(
            QueueUrl=sqs_queue,
            Entries=[
                {"Id": str(n), "MessageBody": str(n)} for n in range(start, min(start + 10, 25))
            ],
        )
    trigger = SqsTrigger(sqs_queue, wait_time_s=1, max_messages=1)
    assert trigger.lag is None
    async with running(trigger) as events:
        first = await take(events, 1)
        assert trigger.lag == 25  # read when the watcher started
        # Received messages are in flight, not waiting: the next reading is lower.
        await until(lambda: trigger.lag is not None and trigger.lag < 25)
        for event in first + await take(events, 24):
            assert event.ack is not None
            await event.ack()
        await until(lambda: trigger.lag == 0)
    assert trigger.lag is None


def _queue_key(trigger: SqsTrigger) -> str:
    return trigger.reader_spec().source_key


def test_one_queue_has_one_poller_however_it_is_spelled() -> None:
    local = _queue_key(SqsTrigger("http://127.0.0.1:5000/123456789012/orders"))
    assert _queue_key(SqsTrigger("orders", endpoint_url="http://127.0.0.1:5000")) == local
    aws = SqsTrigger("https://sqs.eu-west-1.amazonaws.com/123456789012/orders", batch=True)
    assert _queue_key(SqsTrigger("sqs://orders?region=eu-west-1")) == _queue_key(aws)
    assert _queue_key(aws) != local
    assert _queue_key(SqsTrigger("sqs://orders?region=eu-west-1", connection="other")) != (
        _queue_key(aws)
    )


# -- watchers of one queue in the daemon share its poller


def kind(value: str) -> dict[str, Any]:
    return {"path": "$.body.kind", "equals": value}


def trigger(queue_url: str, **options: Any) -> SqsTrigger:
    return SqsTrigger(queue_url, wait_time_s=1, visibility_timeout_s=2, **options)


@contextlib.contextmanager
def shared(*triggers: SqsTrigger) -> Iterator[sqs_session.Pollers]:
    """The daemon's sharing, expecting ``triggers`` as the watchers of their queues."""
    pollers = sqs_session.Pollers()
    pollers.keep(triggers)
    with sqs_session.sharing(pollers):
        yield pollers


def bodies(events: list[Any]) -> list[int]:
    return sorted(event.payload["body"]["n"] for event in events)


async def test_watchers_of_one_queue_each_see_every_message_and_it_is_deleted_once_both_acked(
    sqs: Any, sqs_queue: str
) -> None:
    await send(sqs, sqs_queue, *(json.dumps({"n": n, "kind": ("a", "b")[n % 2]}) for n in range(6)))
    every, only_b = trigger(sqs_queue), trigger(sqs_queue, filter=kind("b"))

    with shared(every, only_b):
        async with running(every) as all_events, running(only_b) as b_events:
            got_all, got_b = await asyncio.gather(take(all_events, 6), take(b_events, 3))
            assert bodies(got_all) == list(range(6))
            assert bodies(got_b) == [1, 3, 5]
            for event in got_all:  # partial acks: the b messages still wait for only_b
                assert event.ack is not None
                await event.ack()
            await until(lambda: every.deleted == 3)  # the a messages, filtered by only_b
            assert await queue_size(sqs, sqs_queue) == 3
            for event in got_b:
                assert event.ack is not None
                await event.ack()
            await until(lambda: every.deleted == 6)
    assert only_b.filtered == 3
    assert await queue_size(sqs, sqs_queue) == 0


async def test_a_message_reappears_for_a_watcher_that_was_not_running(
    sqs: Any, sqs_queue: str
) -> None:
    [message_id] = await send(sqs, sqs_queue, json.dumps({"n": 1, "kind": "a"}))
    present, absent = trigger(sqs_queue), trigger(sqs_queue, filter=kind("a"))

    with shared(present, absent):
        async with running(present) as present_events:
            [first] = await take(present_events, 1, timeout_s=15)  # after the wait for absent
            assert first.ack is not None
            await first.ack()
            assert present.deleted == 0  # kept: a watcher of the queue has not seen it
            async with running(absent) as absent_events:
                [late] = await take(absent_events, 1, timeout_s=15)  # once visible again
                assert late.payload["message_id"] == message_id
                [again] = await take(present_events, 1)  # the daemon stores it once (dedup key)
                assert again.dedup_key == first.dedup_key
                for event in (late, again):
                    assert event.ack is not None
                    await event.ack()
                await until(lambda: present.deleted == 1)
    assert await queue_size(sqs, sqs_queue) == 0
