"""MqttTrigger against the machine's real Mosquitto (and private ones for a restart)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiomqtt
import anyio
import pytest
from anyio.streams.memory import MemoryObjectReceiveStream
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from structlog.testing import capture_logs

from tests.fixtures.mqtt import SHARED_MQTT
from triggerer.triggers import TriggerEvent, load_trigger
from watchers.mqtt import MqttTrigger, send, watcher_client_id

if TYPE_CHECKING:
    from deploy.local.services import Service

BROKER = f"mqtt://{SHARED_MQTT}"
BROKER_PORT = int(SHARED_MQTT.rpartition(":")[2])
REPOSITORY = Path(__file__).resolve().parents[3]


def refuse_poison(payload: dict[str, Any]) -> dict[str, Any]:
    """An apply_function for the tests that fails on the body "poison"."""
    if payload["body"] == "poison":
        raise ValueError("poison pill")
    return payload


def body_only(payload: dict[str, Any]) -> dict[str, Any] | None:
    """An apply_function for the tests: drops "skip", keeps the body of the rest."""
    return None if payload["body"] == "skip" else {"body": payload["body"]}


@contextlib.asynccontextmanager
async def running(trigger: MqttTrigger) -> AsyncIterator[MemoryObjectReceiveStream[TriggerEvent]]:
    """The trigger's events, read by a task of their own, once its session is subscribed."""
    sender, receiver = anyio.create_memory_object_stream[TriggerEvent](1000)

    async def pump() -> None:
        async with sender:
            async for event in trigger.run():
                await sender.send(event)

    async with receiver, anyio.create_task_group() as group:
        group.start_soon(pump)
        try:
            await until(lambda: trigger.connections > 0)
            yield receiver
        finally:
            group.cancel_scope.cancel()
    await trigger.cleanup()


async def take(
    events: MemoryObjectReceiveStream[TriggerEvent], count: int, timeout_s: float = 10
) -> list[TriggerEvent]:
    taken: list[TriggerEvent] = []
    with anyio.fail_after(timeout_s):
        while len(taken) < count:
            taken.append(await events.receive())
    return taken


async def nothing_more(
    events: MemoryObjectReceiveStream[TriggerEvent], wait_s: float = 1.0
) -> None:
    with anyio.move_on_after(wait_s):
        event = await events.receive()
        raise AssertionError(f"no more events expected, got {event!r}")


async def until(condition: Callable[[], bool], timeout_s: float = 10) -> None:
    """Wait, with a deadline, for a counter the trigger keeps."""
    with anyio.fail_after(timeout_s):
        while not condition():  # noqa: ASYNC110 - a counter has no event to wait on
            await anyio.sleep(0.01)


def trigger_of(topic: str, **options: Any) -> MqttTrigger:
    """A trigger of a client id of its own (the shared broker serves every test)."""
    return MqttTrigger(uri=f"{BROKER}/{topic}", client_id=f"test-{uuid.uuid4().hex}", **options)


async def forget_session(trigger: MqttTrigger, port: int = BROKER_PORT) -> None:
    """End the trigger's session on the broker (a clean start with no expiry)."""
    async with aiomqtt.Client(
        "127.0.0.1",
        port,
        identifier=trigger.session_client_id,
        protocol=aiomqtt.ProtocolVersion.V5,
        clean_start=True,
    ):
        pass


async def test_payload_dedup_key_and_counters(mqtt_topic: str) -> None:
    trigger = trigger_of(mqtt_topic)
    async with running(trigger) as events:
        [json_id, text_id] = await send(
            f"{BROKER}/{mqtt_topic}", [json.dumps({"order": 7}), "plain text"]
        )
        # A publisher that sets no message-id, and one with a content type.
        async with aiomqtt.Client(
            "127.0.0.1", BROKER_PORT, protocol=aiomqtt.ProtocolVersion.V5
        ) as client:
            properties = Properties(PacketTypes.PUBLISH)
            properties.ContentType = "text/plain"
            properties.UserProperty = [("kind", "a"), ("kind", "b")]
            await client.publish(mqtt_topic, b"\xff\xfe", qos=1, properties=properties)
        first, second, third = await take(events, 3)
        for event in (first, second, third):
            await event.ack()  # type: ignore[misc]
        await until(lambda: trigger.acked == 3)
    await forget_session(trigger)
    assert first.payload == {
        "topic": mqtt_topic,
        "body": {"order": 7},
        "qos": 1,
        "retain": False,
        "user_properties": {"message-id": json_id},
        "content_type": None,
    }
    assert first.dedup_key == f"{mqtt_topic}/{json_id}"
    assert second.payload["body"] == "plain text"
    assert second.dedup_key == f"{mqtt_topic}/{text_id}"
    assert third.dedup_key is None  # no message-id: at least once
    assert third.payload["body"] == {"base64": "//4="}
    assert third.payload["user_properties"] == {"kind": "b"}
    assert third.payload["content_type"] == "text/plain"
    assert (trigger.messages, trigger.events, trigger.connections) == (3, 3, 1)
    assert trigger.lag is None
    assert trigger.last_poll_at is not None


async def test_unacked_messages_come_back_to_the_session_acked_ones_never(
    mqtt_topic: str,
) -> None:
    uri = f"{BROKER}/{mqtt_topic}"
    trigger = trigger_of(mqtt_topic)
    # Subscribe once, so that the session exists for what is sent next.
    async with running(trigger):
        pass
    ids = await send(uri, ["a", "b", "c"])
    again = load_trigger(*trigger.serialize())
    assert isinstance(again, MqttTrigger)
    async with running(again) as events:
        taken = await take(events, 3)
        assert [event.payload["body"] for event in taken] == ["a", "b", "c"]
        await taken[0].ack()  # type: ignore[misc]
        await until(lambda: again.acked == 1)
    third = load_trigger(*trigger.serialize())
    assert isinstance(third, MqttTrigger)
    async with running(third) as events:
        taken = await take(events, 2)
        assert [event.dedup_key for event in taken] == [f"{mqtt_topic}/{i}" for i in ids[1:]]
        for event in taken:
            await event.ack()  # type: ignore[misc]
        await until(lambda: third.acked == 2)
        await nothing_more(events)
    fourth = load_trigger(*trigger.serialize())
    assert isinstance(fourth, MqttTrigger)
    async with running(fourth) as events:
        await nothing_more(events)
    await forget_session(trigger)


async def test_acks_go_in_the_order_the_messages_came(mqtt_topic: str) -> None:
    trigger = trigger_of(mqtt_topic)
    async with running(trigger) as events:
        await send(f"{BROKER}/{mqtt_topic}", ["1", "2", "3"])
        first, second, third = await take(events, 3)
        await third.ack()  # type: ignore[misc]
        await second.ack()  # type: ignore[misc]
        assert trigger.acked == 0  # the first holds them: PUBACKs go in order
        await first.ack()  # type: ignore[misc]
        assert trigger.acked == 3
        await first.ack()  # type: ignore[misc]
        assert trigger.acked == 3
    await forget_session(trigger)


CRASHING_READER = """
import asyncio, sys
from watchers.mqtt import MqttTrigger

async def main():
    trigger = MqttTrigger(uri=sys.argv[1], client_id=sys.argv[2])
    async for event in trigger.run():
        print(event.payload["body"], flush=True)  # never acked: the process is killed first

asyncio.run(main())
"""


async def test_a_reader_killed_before_its_acks_gets_its_messages_again(
    mqtt_topic: str, tmp_path: Path
) -> None:
    """What happens to the daemon's trigger when it dies (kill -9) before the commit: aiomqtt
    would have acknowledged each message on receipt; with manual acks the broker sends them
    all again to the session."""
    uri = f"{BROKER}/{mqtt_topic}"
    client_id = f"test-{uuid.uuid4().hex}"
    trigger = MqttTrigger(uri=uri, client_id=client_id)
    async with running(trigger):  # the session exists and is subscribed
        pass
    script = tmp_path / "reader.py"
    script.write_text(textwrap.dedent(CRASHING_READER))
    output = tmp_path / "reader.out"
    with output.open("wb") as out:
        reader = await anyio.open_process(
            [sys.executable, str(script), uri, client_id],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPOSITORY,
            env={**os.environ, "PYTHONPATH": str(REPOSITORY)},
        )
    try:
        await send(uri, [str(i) for i in range(10)])
        with anyio.fail_after(30):
            while len(output.read_text().split()) < 10:
                assert reader.returncode is None, output.read_text()
                await anyio.sleep(0.05)
    finally:
        reader.send_signal(signal.SIGKILL)
        await reader.wait()
    again = MqttTrigger(uri=uri, client_id=client_id)
    async with running(again) as events:
        taken = await take(events, 10, timeout_s=20)
        for event in taken:
            await event.ack()  # type: ignore[misc]
    await forget_session(again)
    assert sorted(int(event.payload["body"]) for event in taken) == list(range(10))


async def test_filter_and_apply_function_drop_and_ack(mqtt_topic: str) -> None:
    trigger = trigger_of(
        mqtt_topic,
        filter={"path": "$.body.kind", "one_of": ["keep", "skip-me-not"]},
        apply_function="tests.integration.watchers.test_mqtt.body_only",
        partition_key_path="$.body.region",
    )
    async with running(trigger) as events:
        await send(
            f"{BROKER}/{mqtt_topic}",
            [
                json.dumps({"kind": "other"}),
                json.dumps({"kind": "keep", "region": "eu"}),
            ],
        )
        [event] = await take(events, 1)
        assert event.payload == {"body": {"kind": "keep", "region": "eu"}}
        assert event.partition_key == "eu"
        assert trigger.filtered == 1
        await event.ack()  # type: ignore[misc]
        assert trigger.acked == 2
    await forget_session(trigger)


async def test_a_poison_message_becomes_a_dead_letter_after_max_deliveries(
    mqtt_topic: str,
) -> None:
    trigger = trigger_of(
        mqtt_topic,
        apply_function="tests.integration.watchers.test_mqtt.refuse_poison",
        max_deliveries=3,
    )
    async with running(trigger) as events:
        with capture_logs() as logs:
            [poison_id, _] = await send(f"{BROKER}/{mqtt_topic}", ["poison", "fine"])
            letter, event = await take(events, 2)
        assert letter.dead_letter == "ValueError: poison pill (failed 3 times)"
        assert letter.payload["body"] == "poison"
        assert letter.dedup_key == f"{mqtt_topic}/{poison_id}"
        assert event.dead_letter is None
        assert event.payload["body"] == "fine"
        await letter.ack()  # type: ignore[misc]
        await event.ack()  # type: ignore[misc]
        assert (trigger.dead_lettered, trigger.acked) == (1, 2)
    await forget_session(trigger)
    assert [entry["event"] for entry in logs if entry["log_level"] == "warning"] == [
        "mqtt_message_dead_lettered"
    ]


async def test_the_trigger_reconnects_after_a_broker_restart_and_loses_nothing(
    private_mosquitto: Service,
) -> None:
    port = private_mosquitto.port
    topic = "restart/here"
    uri = f"mqtt://127.0.0.1:{port}/{topic}"
    trigger = MqttTrigger(uri=uri, client_id="restarting")
    with capture_logs() as logs:
        async with running(trigger) as events:
            await send(uri, ["before"])
            [before] = await take(events, 1)
            # Not acked when the broker stops: it comes again, with what is sent meanwhile.
            private_mosquitto.stop()
            private_mosquitto.start()
            await send(uri, ["after"])
            taken = await take(events, 2, timeout_s=30)
            await before.ack()  # of the old connection: not sent, the broker resent it
            for event in taken:
                await event.ack()  # type: ignore[misc]
            assert trigger.acked == 2
    assert [event.payload["body"] for event in taken] == ["before", "after"]
    assert taken[0].dedup_key == before.dedup_key
    assert trigger.connections >= 2
    assert "mqtt_disconnected" in [entry["event"] for entry in logs]


async def test_for_watcher_names_the_session_after_the_watcher(mqtt_topic: str) -> None:
    class Asset:
        name = "orders"
        uri = "orders://x"

    trigger = MqttTrigger(uri=f"{BROKER}/{mqtt_topic}")
    assert (trigger.reads_as or "").startswith("triggerer-")
    made = trigger.for_watcher(Asset(), "orders watcher")
    assert made.client_id == watcher_client_id(Asset(), "orders watcher", trigger.uri)
    other_topic = MqttTrigger(uri=f"{BROKER}/{mqtt_topic}/2").for_watcher(Asset(), "orders watcher")
    assert other_topic.client_id != made.client_id
    assert made.reads_as == made.client_id
    assert (made.client_id or "").startswith("triggerer-orders-watcher-")
    assert made.exclusive_sources() == (f"MQTT session {made.client_id!r} at {SHARED_MQTT}",)
    own = MqttTrigger(uri=f"{BROKER}/{mqtt_topic}", client_id="mine")
    assert own.for_watcher(Asset(), "w") is own
    assert load_trigger(*made.serialize()).serialize() == made.serialize()


async def test_send_refuses_a_wildcard_topic() -> None:
    with pytest.raises(ValueError, match="not a wildcard"):
        await send(f"{BROKER}/a/+/b", ["x"])
    with pytest.raises(ValueError, match="not a wildcard"):
        await send(f"{BROKER}/a/%23", ["x"])


async def test_a_wildcard_subscription_reads_every_matching_topic(mqtt_topic: str) -> None:
    trigger = trigger_of(f"{mqtt_topic}/%23")
    async with running(trigger) as events:
        await send(f"{BROKER}/{mqtt_topic}/a", ["1"])
        await send(f"{BROKER}/{mqtt_topic}/b/c", ["2"])
        taken = await take(events, 2)
        for event in taken:
            await event.ack()  # type: ignore[misc]
    await forget_session(trigger)
    assert [event.payload["topic"] for event in taken] == [f"{mqtt_topic}/a", f"{mqtt_topic}/b/c"]


async def test_a_message_of_an_old_subscription_of_the_session_is_acked_and_dropped(
    mqtt_topic: str,
) -> None:
    old = trigger_of(f"{mqtt_topic}/old")
    async with running(old):
        pass
    moved = MqttTrigger(uri=f"{BROKER}/{mqtt_topic}/new", client_id=old.client_id)
    with capture_logs() as logs:
        async with running(moved) as events:
            await send(f"{BROKER}/{mqtt_topic}/old", ["stale"])
            await send(f"{BROKER}/{mqtt_topic}/new", ["fresh"])
            [event] = await take(events, 1)
            await event.ack()  # type: ignore[misc]
            assert (moved.filtered, moved.acked) == (1, 2)
    await forget_session(moved)
    assert event.payload["body"] == "fresh"
    assert "mqtt_message_of_another_subscription" in [entry["event"] for entry in logs]
