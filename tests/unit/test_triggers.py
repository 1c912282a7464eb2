"""BaseEventTrigger, TriggerEvent and load_trigger."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from aiokafka import ConsumerRecord

from triggerer import BaseEventTrigger, TriggerEvent, load_trigger
from watchers.kafka import dedup_key
from watchers.sqs import SqsTrigger, message_payload


class PlainTrigger(BaseEventTrigger):
    """Written the way users write custom triggers: own __init__, serialize and run."""

    def __init__(self, folder: str, poll_interval_s: float = 1.0) -> None:
        self.folder = folder
        self.poll_interval_s = poll_interval_s

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {"folder": self.folder, "poll_interval_s": self.poll_interval_s}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        yield TriggerEvent({"folder": self.folder}, dedup_key="k1")


@dataclasses.dataclass
class DataclassTrigger(BaseEventTrigger):
    queue: str
    batch_size: int = 10

    async def run(self) -> AsyncIterator[TriggerEvent]:
        yield TriggerEvent({"queue": self.queue})


class NoSerializeTrigger(BaseEventTrigger):
    async def run(self) -> AsyncIterator[TriggerEvent]:
        yield TriggerEvent(None)


class NotATrigger:
    pass


def test_base_event_trigger_is_abstract() -> None:
    with pytest.raises(TypeError):
        BaseEventTrigger()  # type: ignore[abstract]


def test_subclass_without_run_is_abstract() -> None:
    class NoRun(BaseEventTrigger):
        pass

    with pytest.raises(TypeError):
        NoRun()  # type: ignore[abstract]


def test_plain_subclass_serializes_with_its_classpath() -> None:
    trigger = PlainTrigger("/data/in", 2.5)
    assert trigger.serialize() == (
        f"{__name__}.PlainTrigger",
        {"folder": "/data/in", "poll_interval_s": 2.5},
    )


def test_plain_subclass_round_trips_through_load_trigger() -> None:
    trigger = PlainTrigger("/data/in", 2.5)
    rebuilt = load_trigger(*trigger.serialize())
    assert isinstance(rebuilt, PlainTrigger)
    assert rebuilt.serialize() == trigger.serialize()


async def test_plain_subclass_runs_and_cleans_up() -> None:
    trigger = PlainTrigger("/data/in")
    events = [event async for event in trigger.run()]
    assert events == [TriggerEvent({"folder": "/data/in"}, dedup_key="k1")]
    assert await trigger.cleanup() is None


def test_dataclass_subclass_gets_serialize() -> None:
    trigger = DataclassTrigger("orders", batch_size=5)
    assert trigger.serialize() == (
        f"{__name__}.DataclassTrigger",
        {"queue": "orders", "batch_size": 5},
    )
    assert load_trigger(*trigger.serialize()).serialize() == trigger.serialize()


def test_subclass_neither_dataclass_nor_serializing_says_so() -> None:
    with pytest.raises(NotImplementedError, match="NoSerializeTrigger"):
        NoSerializeTrigger().serialize()


def test_shareable_defaults_to_false() -> None:
    assert PlainTrigger("x").shareable is False


@pytest.mark.parametrize(
    ("classpath", "error"),
    [
        ("PlainTrigger", ValueError),
        ("no_such_module_xyz.Trigger", ImportError),
        (f"{__name__}.MissingTrigger", ImportError),
        (f"{__name__}.NotATrigger", ValueError),
        (f"{__name__}.pytest", ValueError),
    ],
    ids=["no-dot", "missing-module", "missing-class", "not-a-trigger", "not-a-class"],
)
def test_load_trigger_bad_classpath_names_it(classpath: str, error: type[Exception]) -> None:
    with pytest.raises(error) as info:
        load_trigger(classpath, {})
    assert classpath in str(info.value)


def test_trigger_event_defaults() -> None:
    event = TriggerEvent({"a": 1})
    assert (event.payload, event.dedup_key, event.ack, event.partition_key) == (
        {"a": 1},
        None,
        None,
        None,
    )


@pytest.mark.parametrize("payload", [object(), {"when": {1, 2}}, b"bytes"])
def test_trigger_event_rejects_a_non_json_payload(payload: object) -> None:
    with pytest.raises(TypeError, match="JSON-serialisable"):
        TriggerEvent(payload)


def test_trigger_event_rejects_nan() -> None:
    with pytest.raises(TypeError):
        TriggerEvent({"value": float("nan")})


def test_event_of_decoded_json_equals_the_checked_event() -> None:
    async def ack() -> None:
        return None

    event = TriggerEvent.of_decoded_json(
        {"value": [1, "a"]}, dedup_key="t/0/1", ack=ack, partition_key="p"
    )

    assert event == TriggerEvent({"value": [1, "a"]}, dedup_key="t/0/1", partition_key="p")
    assert event.ack is ack
    with pytest.raises(AttributeError):
        event.payload = {}  # type: ignore[misc]  # frozen like any event


def test_a_checkpoint_alone_is_made_only_by_its_classmethod_and_is_checked() -> None:
    alone = TriggerEvent.checkpoint_only("kinesis/s/app/shardId-0", "42")
    assert alone.is_checkpoint_only
    assert (alone.checkpoint, alone.payload, alone.ack, alone.dedup_key) == (
        ("kinesis/s/app/shardId-0", "42"),
        None,
        None,
        None,
    )
    assert not TriggerEvent({"a": 1}, checkpoint=("k", "1")).is_checkpoint_only
    assert not TriggerEvent.of_decoded_json({"a": 1}).is_checkpoint_only
    with pytest.raises(ValueError, match="must be \\(key, position\\)"):
        TriggerEvent.checkpoint_only("k", "x")
    with pytest.raises(TypeError):
        TriggerEvent(None, is_checkpoint_only=True)  # type: ignore[call-arg]


def test_trigger_event_ack_does_not_affect_equality() -> None:
    async def ack() -> None:
        return None

    assert TriggerEvent(1, dedup_key="k", ack=ack) == TriggerEvent(1, dedup_key="k")


def test_trigger_event_options_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        TriggerEvent(1, "dedup")  # type: ignore[misc]


def test_repr_shows_classpath_and_kwargs() -> None:
    assert "PlainTrigger" in repr(PlainTrigger("/in"))
    assert '"folder": "/in"' in repr(PlainTrigger("/in"))


def test_a_trigger_that_never_says_it_polled_has_no_last_poll() -> None:
    assert PlainTrigger("/data/in").last_poll_at is None


def test_polled_is_the_last_poll_also_of_a_frozen_dataclass_trigger() -> None:
    @dataclasses.dataclass(frozen=True)
    class Frozen(BaseEventTrigger):
        queue: str

        async def run(self) -> AsyncIterator[TriggerEvent]:
            self.polled()
            yield TriggerEvent(None)

    trigger = Frozen("q")
    before = datetime.now(UTC)
    trigger.polled()
    polled = trigger.last_poll_at
    assert polled is not None
    assert before <= polled <= datetime.now(UTC)
    assert trigger.serialize() == (trigger.classpath(), {"queue": "q"})
    assert Frozen("q").last_poll_at is None  # each instance its own


def test_same_message_by_default_means_equal_payloads() -> None:
    trigger = PlainTrigger("/in")

    assert trigger.same_message({"n": 1, "tags": ["a"]}, {"tags": ["a"], "n": 1})
    assert not trigger.same_message({"n": 1}, {"n": 2})


def test_an_sqs_redelivery_is_the_same_message_though_its_receive_count_moved() -> None:
    trigger = SqsTrigger("orders", endpoint_url="http://127.0.0.1:1", region_name="us-east-1")
    first = {"MessageId": "m-1", "Body": '{"n": 1}', "Attributes": {"SentTimestamp": "1"}}
    received = message_payload(first)
    again = message_payload(
        {**first, "Attributes": {"SentTimestamp": "1", "ApproximateReceiveCount": "2"}}
    )
    other = message_payload({**first, "Body": '{"n": 2}'})

    assert trigger.same_message(received, again)
    assert trigger.same_message({"message_batch": [received]}, {"message_batch": [again]})
    assert not trigger.same_message(received, other)


def test_a_kafka_key_tells_a_recreated_topics_message_from_the_old_one_at_its_offset() -> None:
    def record(timestamp: int) -> ConsumerRecord[bytes, bytes]:
        return ConsumerRecord("orders", 0, 7, timestamp, 0, None, b"{}", None, 0, 2, [])

    assert dedup_key(record(1_790_000_000_123)) == "orders/0/7@1790000000123"
    assert dedup_key(record(1_790_000_000_123)) != dedup_key(record(1_790_000_099_000))
