"""PubSubTrigger against the real Pub/Sub emulator, alone and sharing its subscription's puller."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import datetime
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from structlog.testing import capture_logs

from tests.fixtures.pubsub import PROJECT, Admin, pending
from tests.fixtures.triggers import running, take, until
from triggerer.triggers import TriggerEvent, load_trigger
from watchers import MessageQueueTrigger, PubSubTrigger
from watchers.pubsub import puller as pubsub_puller
from watchers.pubsub import send
from watchers.pubsub.puller import MissingSubscription

if TYPE_CHECKING:
    from deploy.local.services import Service
    from tests.fixtures.pubsub import MakeSubscription


def reject_poison(payload: dict[str, Any]) -> dict[str, Any]:
    """An apply_function for the tests that fails on the body "poison"."""
    if payload["body"] == "poison":
        raise ValueError("poison pill")
    return payload


def body_only(payload: dict[str, Any]) -> dict[str, Any] | None:
    """An apply_function for the tests: drops bodies marked "drop", keeps the body of the rest."""
    body = payload["body"]
    if isinstance(body, dict) and body.get("drop"):
        return None
    return {"id": payload["message_id"], "body": body}


async def nothing_within(events: AsyncIterator[TriggerEvent], seconds: float) -> None:
    with anyio.move_on_after(seconds):
        event = await anext(events)
        pytest.fail(f"an event came: {event!r}")


async def ack_all(events: list[TriggerEvent]) -> None:
    for event in events:
        assert event.ack is not None
        await event.ack()


def name_of(uri: str) -> str:
    return uri.rsplit("/", 1)[1]


def key_of(uri: str, message_id: str, event: TriggerEvent) -> str:
    """The dedup key of message ``message_id``, whose publish time the event's payload gives
    to the microsecond (the emulator's times are whole milliseconds: the key's nanoseconds
    add three zeros)."""
    published = event.payload["publish_time"].removesuffix("Z")
    return f"{name_of(uri)}/{message_id}@{published}000Z"


async def test_payload_dedup_key_and_sent_at(
    pubsub_emulator_host: str, pubsub_admin: Admin, make_subscription: MakeSubscription
) -> None:
    uri = await make_subscription()
    [json_id] = await pubsub_admin.publish(name_of(uri), json.dumps({"order": 7}), kind="order")
    [text_id] = await pubsub_admin.publish(name_of(uri), "plain text")
    trigger = MessageQueueTrigger(uri, emulator_host=pubsub_emulator_host)
    assert isinstance(trigger, PubSubTrigger)
    async with running(trigger) as events:
        first, second = await take(events, 2)
        await ack_all([first, second])
    assert first.dedup_key == key_of(uri, json_id, first)
    assert first.payload["message_id"] == json_id
    assert first.payload["body"] == {"order": 7}
    assert first.payload["attributes"] == {"kind": "order"}
    assert first.payload["ordering_key"] is None
    assert first.payload["delivery_attempt"] is None  # set only under a dead-letter policy
    assert first.payload["publish_time"].endswith("Z")
    assert first.sent_at is not None
    published = datetime.fromisoformat(first.payload["publish_time"].replace("Z", "+00:00"))
    assert first.sent_at == pytest.approx(published.timestamp(), abs=1e-6)
    assert set(first.payload) == {
        "message_id",
        "body",
        "attributes",
        "publish_time",
        "ordering_key",
        "delivery_attempt",
    }
    assert second.payload["body"] == "plain text"
    assert second.dedup_key == key_of(uri, text_id, second)
    assert first.partition_key is None
    assert trigger.reads_as == f"projects/{PROJECT}/subscriptions/{name_of(uri)}"
    assert load_trigger(*trigger.serialize()).serialize() == trigger.serialize()


async def test_the_emulator_from_the_environment(
    pubsub_emulator_host: str,
    pubsub_admin: Admin,
    make_subscription: MakeSubscription,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", pubsub_emulator_host)
    uri = await make_subscription()
    [sent] = await send(uri, ['{"a": 1}'], attributes={"source": "test"})
    trigger = PubSubTrigger(uri)
    async with running(trigger) as events:
        [event] = await take(events, 1)
        await ack_all([event])
    assert event.payload["message_id"] == sent
    assert event.payload["body"] == {"a": 1}
    assert event.payload["attributes"] == {"source": "test"}


async def test_unacked_message_comes_back_acked_one_does_not(
    pubsub_emulator_host: str, pubsub_admin: Admin, make_subscription: MakeSubscription
) -> None:
    uri = await make_subscription()
    await pubsub_admin.publish(name_of(uri), "once", "twice")
    trigger = PubSubTrigger(uri, emulator_host=pubsub_emulator_host)
    async with running(trigger) as events:
        events_taken = await take(events, 2)
        acked = next(e for e in events_taken if e.payload["body"] == "once")
        kept = next(e for e in events_taken if e.payload["body"] == "twice")
        await ack_all([acked])
    # Cleanup nacked the unacked one: it is delivered again at once, under the same key.
    again = load_trigger(*trigger.serialize())
    assert isinstance(again, PubSubTrigger)
    async with running(again) as events:
        [second] = await take(events, 1)
        assert second.dedup_key == kept.dedup_key
        assert second.payload["body"] == "twice"
        await ack_all([second])
        await nothing_within(events, 1.5)
    assert await pending(pubsub_admin, uri) == 0


async def test_the_ack_deadline_is_extended_while_an_event_waits_for_its_commit(
    pubsub_emulator_host: str, pubsub_admin: Admin, make_subscription: MakeSubscription
) -> None:
    uri = await make_subscription(ack_deadline_s=10)
    await pubsub_admin.publish(name_of(uri), "slow commit")
    trigger = PubSubTrigger(uri, emulator_host=pubsub_emulator_host)
    async with running(trigger) as events:
        [event] = await take(events, 1)
        assert trigger.lag == 1
        await anyio.sleep(14)  # past the subscription's deadline of 10 s
        assert await pending(pubsub_admin, uri) == 0  # still held: not handed to another
        await ack_all([event])
        await until(lambda: trigger.lag == 0)
        await nothing_within(events, 1.5)
    assert await pending(pubsub_admin, uri) == 0


async def test_a_failing_message_becomes_a_dead_letter_after_max_deliveries(
    pubsub_emulator_host: str, pubsub_admin: Admin, make_subscription: MakeSubscription
) -> None:
    uri = await make_subscription()
    [poison_id] = await pubsub_admin.publish(name_of(uri), "poison")
    await pubsub_admin.publish(name_of(uri), "fine")
    trigger = PubSubTrigger(
        uri,
        emulator_host=pubsub_emulator_host,
        max_deliveries=3,
        apply_function=f"{__name__}.reject_poison",
    )
    with capture_logs() as logs:
        async with running(trigger) as events:
            first, second = await take(events, 2)
            await ack_all([first, second])
            await until(lambda: trigger.lag == 0)
            await nothing_within(events, 1.5)
    fine, letter = sorted([first, second], key=lambda e: e.dead_letter is not None)
    assert fine.payload["body"] == "fine"
    assert fine.dead_letter is None
    assert letter.dedup_key == key_of(uri, poison_id, letter)
    assert letter.payload["body"] == "poison"
    assert letter.dead_letter is not None
    assert "ValueError: poison pill" in letter.dead_letter
    assert "delivered 3 times" in letter.dead_letter
    assert trigger.failed == 3
    assert trigger.dead_lettered == 1
    assert [e["event"] for e in logs].count("pubsub_message_failed") == 3
    assert await pending(pubsub_admin, uri) == 0


async def test_the_subscriptions_dead_letter_policy_is_honoured(
    pubsub_emulator_host: str, pubsub_admin: Admin, make_subscription: MakeSubscription
) -> None:
    """Under a dead-letter policy, Pub/Sub counts the deliveries and forwards the message to
    the dead-letter topic; the trigger only nacks it, and yields no dead letter of its own."""
    uri = await make_subscription(dead_letter_after=5)
    [poison_id] = await pubsub_admin.publish(name_of(uri), "poison")
    await pubsub_admin.publish(name_of(uri), "fine")
    trigger = PubSubTrigger(
        uri,
        emulator_host=pubsub_emulator_host,
        max_deliveries=1,  # not used: the policy's attempts are
        apply_function=f"{__name__}.reject_poison",
    )
    dead: list[Any] = []
    async with running(trigger) as events:
        [fine] = await take(events, 1)
        assert fine.payload["delivery_attempt"] == 1
        await ack_all([fine])
        with anyio.fail_after(30):
            while not dead:
                dead += await pubsub_admin.pull_dead(name_of(uri))
                await anyio.sleep(0.2)
        await nothing_within(events, 1)
    assert [m.message.data for m in dead] == [b"poison"]
    assert trigger.failed == 5
    assert trigger.dead_lettered == 0
    assert poison_id  # forwarded under a message id of the dead-letter topic's own


async def test_filter_apply_function_and_partition_key(
    pubsub_emulator_host: str, pubsub_admin: Admin, make_subscription: MakeSubscription
) -> None:
    uri = await make_subscription()
    bodies = [
        {"kind": "order", "region": "eu"},
        {"kind": "refund", "region": "us"},
        {"kind": "order", "region": "us", "drop": True},
        {"kind": "order", "region": 7},
    ]
    await pubsub_admin.publish(name_of(uri), *(json.dumps(b) for b in bodies))
    trigger = PubSubTrigger(
        uri,
        emulator_host=pubsub_emulator_host,
        filter={"path": "$.body.kind", "equals": "order"},
        apply_function=f"{__name__}.body_only",
        partition_key_path="$.body.region",
    )
    async with running(trigger) as events:
        taken = await take(events, 2)
        await ack_all(taken)
        await until(lambda: trigger.lag == 0)
    assert sorted(str(e.partition_key) for e in taken) == ["7", "eu"]
    assert all(set(e.payload) == {"id", "body"} for e in taken)
    assert trigger.filtered == 2
    assert await pending(pubsub_admin, uri) == 0


async def test_lag_counts_the_messages_held_until_acked(
    pubsub_emulator_host: str, pubsub_admin: Admin, make_subscription: MakeSubscription
) -> None:
    uri = await make_subscription()
    await pubsub_admin.publish(name_of(uri), *(str(n) for n in range(5)))
    trigger = PubSubTrigger(uri, emulator_host=pubsub_emulator_host)
    assert trigger.lag is None
    async with running(trigger) as events:
        taken = await take(events, 5)
        assert trigger.lag == 5
        assert trigger.last_poll_at is not None
        await ack_all(taken[:2])
        await until(lambda: trigger.lag == 3)
        await ack_all(taken[2:])
        await until(lambda: trigger.lag == 0)
    assert trigger.lag is None


async def test_a_missing_subscription_is_the_watchers_error(pubsub_emulator_host: str) -> None:
    trigger = PubSubTrigger(
        f"pubsub://{PROJECT}/no-such-subscription", emulator_host=pubsub_emulator_host
    )
    with pytest.raises(MissingSubscription, match="no-such-subscription' does not exist"):
        async with running(trigger) as events:
            await anext(events)
    with pytest.raises(LookupError, match="does not exist"):
        await send(
            trigger.serialize()[1]["subscription"], ["x"], emulator_host=pubsub_emulator_host
        )


async def test_send_publishes_to_the_subscriptions_topic(
    pubsub_emulator_host: str, pubsub_admin: Admin, make_subscription: MakeSubscription
) -> None:
    uri = await make_subscription()
    bodies = [json.dumps({"i": i}) for i in range(1200)]  # more than one Publish call
    ids = await send(uri, bodies, emulator_host=pubsub_emulator_host)
    assert len(ids) == len(set(ids)) == 1200
    trigger = PubSubTrigger(uri, emulator_host=pubsub_emulator_host)
    async with running(trigger) as events:
        taken = await take(events, 1200, timeout_s=60)
        await ack_all(taken)
    assert sorted(e.payload["body"]["i"] for e in taken) == list(range(1200))
    assert {e.payload["message_id"] for e in taken} == set(ids)


async def test_triggers_of_one_subscription_share_one_puller(
    pubsub_emulator_host: str, pubsub_admin: Admin, make_subscription: MakeSubscription
) -> None:
    uri = await make_subscription()
    first = PubSubTrigger(uri, emulator_host=pubsub_emulator_host)
    second = PubSubTrigger(
        uri, emulator_host=pubsub_emulator_host, filter={"path": "$.body", "equals": "b"}
    )
    pullers = pubsub_puller.Pullers()
    pullers.keep([first, second])
    with pubsub_puller.sharing(pullers):
        async with running(first) as one, running(second) as two:
            taken: dict[str, list[TriggerEvent]] = {}

            async def read(name: str, events: AsyncIterator[TriggerEvent], count: int) -> None:
                taken[name] = await take(events, count)

            # Both readers join (as the daemon's watchers do) before the messages come.
            async with anyio.create_task_group() as readers:
                readers.start_soon(read, "first", one, 2)
                readers.start_soon(read, "second", two, 1)
                await pubsub_admin.publish(name_of(uri), "a", "b")
            seen_by_first, [seen_by_second] = taken["first"], taken["second"]
            assert sorted(e.payload["body"] for e in seen_by_first) == ["a", "b"]
            assert seen_by_second.payload["body"] == "b"
            await ack_all(seen_by_first)
            assert first.lag == 1  # "b" waits for the second watcher's ack
            await ack_all([seen_by_second])
            await until(lambda: first.lag == 0)
    assert await pending(pubsub_admin, uri) == 0


async def test_the_watcher_reconnects_after_the_emulator_restarts(
    restartable_pubsub_emulator: Service,
) -> None:
    """The emulator keeps nothing across a restart (topics, subscriptions, messages): what
    this proves is that the watcher retries with backoff while it is away (``pubsub_call_retry``)
    and that messages posted after the restart flow, once the subscription is made again.
    A pull that finds the subscription missing meanwhile fails the trigger, which the daemon
    restarts; here the test does that. The emulator numbers its messages from 1 again: the
    message after the restart has the id of the one before, and another dedup key (its publish
    time), so it is not taken for the one stored."""
    host = restartable_pubsub_emulator.address
    admin = Admin(host)
    try:
        uri = await admin.create("restarted")
        await admin.publish("restarted", "before")
        trigger = PubSubTrigger(uri, emulator_host=host)
        with capture_logs() as logs:
            async with running(trigger) as events:
                [before] = await take(events, 1)
                await ack_all([before])
                restartable_pubsub_emulator.stop()
                await until(lambda: any(e["event"] == "pubsub_call_retry" for e in logs))
                restartable_pubsub_emulator.start(timeout_s=60)
                await admin.create("restarted")
                await admin.publish("restarted", "after")
                try:
                    [after] = await take(events, 1, timeout_s=60)
                except MissingSubscription:
                    after = None
            if after is None:  # it pulled between the start and the subscription's making
                async with running(trigger) as events:
                    [after] = await take(events, 1, timeout_s=60)
            await ack_all([after])
        assert after.payload["body"] == "after"
        assert after.payload["message_id"] == before.payload["message_id"]
        assert after.dedup_key != before.dedup_key
    finally:
        await admin.aclose()
