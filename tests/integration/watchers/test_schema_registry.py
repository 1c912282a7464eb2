"""Decoding through real registries: the tests' Confluent-speaking one
(:mod:`tests.fixtures.schema_registry`) and AWS Glue's in moto; Kafka's CloudEvents in either
mode with a registry's format; and the providers besides Kafka
(Redis Streams, NATS JetStream, Kinesis, Pub/Sub on its emulator, RabbitMQ) decoding through
the same step (:mod:`watchers.schemas.decoding`), Pub/Sub's and RabbitMQ's readers shared by
watchers of one source failing only the watcher whose registry does not answer."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

import aio_pika
import anyio
import nats
import pytest
from aiobotocore.session import get_session

from tests.fixtures.nats import SHARED_NATS
from tests.fixtures.pubsub import pending
from tests.fixtures.rabbitmq import SHARED_RABBITMQ, ready_count
from tests.fixtures.redis import SHARED_REDIS_HOST, SHARED_REDIS_PORT
from tests.fixtures.schema_registry import (
    FakeRegistry,
    avro_record,
    compile_proto,
    confluent,
    glue,
    proto_class,
)
from tests.fixtures.triggers import running, take, until
from tests.integration.watchers.test_kafka import produce, trigger_for
from triggerer import connections
from triggerer.triggers import BaseEventTrigger, TriggerEvent, load_trigger
from watchers import MessageQueueTrigger, PubSubTrigger, RabbitMqTrigger
from watchers.pubsub import puller as pubsub_puller
from watchers.pubsub import send as pubsub_send
from watchers.rabbitmq import consumer as rabbitmq_consumer
from watchers.schemas.decoding import BodyFormat, Undecodable
from watchers.schemas.registries import RegistryRefused, RegistryUnavailable

if TYPE_CHECKING:
    import redis.asyncio

    from tests.fixtures.kinesis import MakeStream
    from tests.fixtures.pubsub import Admin, MakeSubscription
    from tests.fixtures.rabbitmq import MakeQueue
    from tests.fixtures.redis import MakeStream as MakeRedisStream

ORDER = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [{"name": "id", "type": "long"}, {"name": "total", "type": "float"}],
}


@pytest.fixture
def named_connections(moto_server: str) -> Iterator[dict[str, dict[str, Any]]]:
    """``[connections.*]`` as the daemon's settings would give them; fill in, then use."""
    named: dict[str, dict[str, Any]] = {
        "glue": {
            "type": "glue",
            "region_name": "us-east-1",
            "endpoint_url": moto_server,
            "aws_access_key_id": "testing",
            "aws_secret_access_key": "testing",
        }
    }
    previous = connections._source
    connections.read_from(lambda: named)
    try:
        yield named
    finally:
        connections.read_from(previous)


async def test_concurrent_records_of_one_schema_fetch_it_once(
    schema_registry: FakeRegistry,
) -> None:
    schema_id = schema_registry.register("orders-value", ORDER)
    body_format = BodyFormat("avro", schema_registry.url)
    records = [confluent(schema_id, avro_record(ORDER, {"id": i, "total": 1.5})) for i in range(20)]
    decoded: list[Any] = []

    async def decode(raw: bytes) -> None:
        decoded.append(await body_format.decode(raw))

    async with anyio.create_task_group() as group:
        for raw in records:
            group.start_soon(decode, raw)
    assert sorted(d.value["id"] for d in decoded) == list(range(20))
    assert {d.schema_id for d in decoded} == {schema_id}
    assert schema_registry.requests[f"GET /schemas/ids/{schema_id}"] == 1
    # Another trigger of the same registry shares the schema too.
    await BodyFormat("avro", schema_registry.url).decode(records[0])
    assert schema_registry.requests[f"GET /schemas/ids/{schema_id}"] == 1


@pytest.mark.parametrize("outage", ["refuse", "fail"])
async def test_a_registry_that_does_not_answer_is_tried_again_then_raised(
    schema_registry: FakeRegistry, outage: str
) -> None:
    schema_id = schema_registry.register("orders-value", ORDER)
    getattr(schema_registry, outage)()
    raw = confluent(schema_id, avro_record(ORDER, {"id": 1, "total": 0.0}))
    with pytest.raises(RegistryUnavailable, match=r"does not answer|answered 503"):
        await BodyFormat("avro", schema_registry.url).decode(raw)
    if outage == "fail":
        assert schema_registry.requests[f"GET /schemas/ids/{schema_id}"] == 3  # tries in place
    schema_registry.restore()
    decoded = await BodyFormat("avro", schema_registry.url).decode(raw)
    assert decoded.value == {"id": 1, "total": 0.0}


async def test_only_confluents_not_found_is_a_schema_not_there(
    schema_registry: FakeRegistry,
) -> None:
    """A 404 with ``error_code`` 40403 (an id), 40401 or 40402 (a reference's subject or
    version) is a message of a schema the registry does not hold: a dead letter. Any other 404
    (a wrong path prefix, a proxy's page) says nothing of the schema: the watcher's error,
    naming the URL, so that a wrong URL dead-letters no message."""
    schema_id = schema_registry.register("orders-value", ORDER)
    raw = confluent(schema_id, avro_record(ORDER, {"id": 1, "total": 0.0}))
    with pytest.raises(Undecodable, match="schema id 4040 is not in the registry"):
        await BodyFormat("avro", schema_registry.url).decode(confluent(4040, b"\x02"))
    for subject, version, says in [("nowhere", 1, "subject 'nowhere'"), ("orders-value", 2, "")]:
        customer = {
            "type": "record",
            "name": "Customer",
            "namespace": "shop",
            "doc": f"{subject} {version}",  # a schema of its own: an id of its own
            "fields": [{"name": "home", "type": "shop.Address"}],
        }
        referring = schema_registry.register(
            f"customers-{subject}-{version}",
            customer,
            references=[{"name": "shop.Address", "subject": subject, "version": version}],
        )
        with pytest.raises(Undecodable, match=f"schema reference 'shop.Address' \\({says}"):
            await BodyFormat("avro", schema_registry.url).decode(confluent(referring, b""))

    wrong = f"{schema_registry.url}/registry"  # a path prefix the registry does not have
    with pytest.raises(
        RegistryRefused, match=rf"at {wrong} answered GET /schemas/ids/{schema_id} with a 404"
    ):
        await BodyFormat("avro", wrong).decode(raw)
    schema_registry.answer(f"/schemas/ids/{schema_id}", 404, "<html>Not Found</html>")
    with pytest.raises(RegistryRefused, match=r"a 404 that is not Confluent's .*<html>"):
        await BodyFormat("avro", schema_registry.url).decode(raw)
    schema_registry.restore()
    decoded = await BodyFormat("avro", schema_registry.url).decode(raw)
    assert decoded.value == {"id": 1, "total": 0.0}


async def test_references_that_are_not_a_list_are_the_watchers_error(
    schema_registry: FakeRegistry,
) -> None:
    schema_registry.answer("/schemas/ids/1", 200, {"schema": json.dumps(ORDER), "references": 5})
    with pytest.raises(RegistryRefused, match="answered references that are not a list: 5"):
        await BodyFormat("avro", schema_registry.url).decode(confluent(1, b"\x02\x00\x00\x00\x00"))


async def test_schemas_with_references_decode(schema_registry: FakeRegistry) -> None:
    address = {
        "type": "record",
        "name": "Address",
        "namespace": "shop",
        "fields": [{"name": "city", "type": "string"}],
    }
    customer = {
        "type": "record",
        "name": "Customer",
        "namespace": "shop",
        "fields": [{"name": "home", "type": "shop.Address"}],
    }
    schema_registry.register("address", address)
    customer_id = schema_registry.register(
        "customers-value",
        customer,
        references=[{"name": "shop.Address", "subject": "address", "version": 1}],
    )
    inline = {**customer, "fields": [{"name": "home", "type": address}]}
    raw = confluent(customer_id, avro_record(inline, {"home": {"city": "Oslo"}}))
    assert (await BodyFormat("avro", schema_registry.url).decode(raw)).value == {
        "home": {"city": "Oslo"}
    }

    money = 'syntax = "proto3";\npackage m;\nmessage Money { int32 cents = 1; }\n'
    pay = (
        'syntax = "proto3";\npackage p;\nimport "money.proto";\n'
        "message Pay { m.Money price = 1; string memo = 2; }\n"
    )
    schema_registry.register("money", money, "PROTOBUF")
    pay_id = schema_registry.register(
        "pay-value",
        pay,
        "PROTOBUF",
        references=[{"name": "money.proto", "subject": "money", "version": 1}],
    )
    money_file = compile_proto(money, name="money.proto")
    pay_class = proto_class(compile_proto(pay, {"money.proto": money}), "Pay", [money_file])
    raw = confluent(pay_id, pay_class(price={"cents": 5}).SerializeToString(), (0,))
    decoded = await BodyFormat("protobuf", schema_registry.url).decode(raw)
    assert decoded.value == {"price": {"cents": 5}, "memo": ""}  # defaults included


async def test_glue_schemas_decode_from_moto(
    moto_server: str, named_connections: dict[str, Any]
) -> None:
    registry = f"shop-{uuid.uuid4().hex[:8]}"
    async with get_session().create_client(
        "glue", endpoint_url=moto_server, region_name="us-east-1"
    ) as client:
        await client.create_registry(RegistryName=registry)

        async def version(name: str, data_format: str, definition: str) -> str:
            created = await client.create_schema(
                RegistryId={"RegistryName": registry},
                SchemaName=name,
                DataFormat=data_format,
                Compatibility="NONE",
                SchemaDefinition=definition,
            )
            return str(created["SchemaVersionId"])

        avro_id = await version("orders", "AVRO", json.dumps(ORDER))
        json_id = await version("refunds", "JSON", json.dumps({"type": "object"}))
        proto_id = await version("pay", "PROTOBUF", 'syntax = "proto3";\nmessage Pay {}\n')

    record = avro_record(ORDER, {"id": 3, "total": 2.5})
    avro = BodyFormat("avro", "glue")
    for compressed in (False, True):
        decoded = await avro.decode(glue(avro_id, record, compressed=compressed))
        assert decoded == ({"id": 3, "total": 2.5}, avro_id)
    refunds = await BodyFormat("json_schema", "glue").decode(glue(json_id, b'{"ok": 1}'))
    assert refunds == ({"ok": 1}, json_id)
    with pytest.raises(Undecodable, match="serialized FileDescriptorProto"):
        await BodyFormat("protobuf", "glue").decode(glue(proto_id, b""))
    with pytest.raises(Undecodable, match="is not in AWS Glue Schema Registry"):
        await avro.decode(glue(str(uuid.uuid4()), record))
    with pytest.raises(Undecodable, match="not AWS Glue Schema Registry wire format"):
        await avro.decode(confluent(1, record))


async def test_a_connection_of_another_type_is_refused(
    named_connections: dict[str, Any],
) -> None:
    with pytest.raises(KeyError, match="connection 'nowhere' is not configured"):
        BodyFormat("protobuf", "nowhere").load()
    named_connections["odd"] = {"type": "nexus", "url": "http://x"}
    named_connections["bare"] = {"username": "u"}
    with pytest.raises(ValueError, match="type='nexus'; a schema registry's is 'confluent'"):
        BodyFormat("avro", "odd").load()
    with pytest.raises(ValueError, match="must hold the registry's url"):
        BodyFormat("avro", "bare").load()
    named_connections["glue"]["colour"] = "red"
    with pytest.raises(ValueError, match="settings schema_registry \\(AWS Glue\\) does not know"):
        BodyFormat("avro", "glue").load()


async def test_kafka_cloudevents_with_a_registrys_value_format(
    kafka_broker: str, kafka_topic: str, schema_registry: FakeRegistry
) -> None:
    # In binary mode the record decoded is the CloudEvent's data; in structured mode the JSON
    # body is the event, the registry not asked; a malformed one is a dead letter, no schema
    # fetched for it.
    schema_id = schema_registry.register("orders-value", ORDER)
    attributes = [("ce_specversion", b"1.0"), ("ce_source", b"/shop"), ("ce_type", b"order")]
    document = {"specversion": "1.0", "id": "2", "source": "/shop", "type": "order", "data": 2}
    await produce(
        kafka_broker,
        kafka_topic,
        [
            {
                "value": confluent(schema_id, avro_record(ORDER, {"id": 1, "total": 1.5})),
                "headers": [*attributes, ("ce_id", b"1"), ("content-type", b"application/avro")],
            },
            {
                "value": json.dumps(document).encode(),
                "headers": [("content-type", b"application/cloudevents+json")],
            },
            {"value": confluent(4040, b"\x01"), "headers": attributes},  # no ce_id
        ],
    )
    trigger = trigger_for(
        kafka_broker, kafka_topic, value_format="avro", schema_registry=schema_registry.url
    )
    async with running(trigger) as events:
        binary, structured, malformed = await take(events, 3)

    assert binary.cloudevent is not None
    assert (binary.cloudevent.id, binary.cloudevent.data) == ("1", {"id": 1, "total": 1.5})
    assert (binary.payload["value"], binary.payload["schema_id"]) == (
        {"id": 1, "total": 1.5},
        schema_id,
    )
    assert binary.dedup_key == binary.cloudevent.dedup_key
    assert structured.cloudevent is not None
    assert (structured.cloudevent.id, structured.cloudevent.data) == ("2", 2)
    assert structured.payload["value"] == document
    assert "schema_id" not in structured.payload
    assert malformed.dead_letter == "CloudEvent attribute 'id' is missing"
    fetched = [request for request in schema_registry.requests if request.startswith("GET")]
    assert fetched == [f"GET /schemas/ids/{schema_id}"]
    assert trigger.undecodable == 1


# -- the providers besides Kafka


async def check_decoded_and_dead_letter(
    events: AsyncIterator[Any], schema_id: int, field: str = "body"
) -> None:
    taken: list[Any] = []
    while len(taken) < 2:  # past what only moves a place (Kinesis's first checkpoint)
        taken += [event for event in await take(events, 1) if not event.is_checkpoint_only]
    good, bad = taken
    assert good.payload[field] == {"id": 1, "total": 1.5}
    assert good.payload["schema_id"] == schema_id
    assert good.dead_letter is None
    assert bad.dead_letter is not None
    assert "schema id 4040 is not in the registry" in bad.dead_letter
    assert bad.payload[field] == {"base64": "AAAAD8gB"}


def records(schema_id: int) -> list[bytes]:
    """A record, then one of an id the registry does not hold."""
    return [
        confluent(schema_id, avro_record(ORDER, {"id": 1, "total": 1.5})),
        confluent(4040, b"\x01"),
    ]


async def test_redis_stream_entries_decode(
    shared_redis: redis.asyncio.Redis,
    make_stream: MakeRedisStream,
    schema_registry: FakeRegistry,
) -> None:
    schema_id = schema_registry.register("orders-value", ORDER)
    stream = await make_stream()
    for raw in records(schema_id):
        await shared_redis.xadd(stream, {"body": raw})
    trigger = MessageQueueTrigger(
        f"redis+stream://{SHARED_REDIS_HOST}:{SHARED_REDIS_PORT}/0/{stream}",
        start_id="0",
        block_ms=100,
        value_format="avro",
        schema_registry=schema_registry.url,
    )
    async with running(trigger) as events:
        await check_decoded_and_dead_letter(events, schema_id)


async def test_nats_messages_decode(make_nats_stream: Any, schema_registry: FakeRegistry) -> None:
    schema_id = schema_registry.register("orders-value", ORDER)
    stream = await make_nats_stream()
    client = await nats.connect(f"nats://{SHARED_NATS}")
    try:
        for raw in records(schema_id):
            await client.jetstream().publish(f"{stream}.in", raw, stream=stream)
    finally:
        await client.close()
    trigger = MessageQueueTrigger(
        f"nats://{SHARED_NATS}/{stream}/{stream}.%3E",
        value_format="avro",
        schema_registry=schema_registry.url,
    )
    async with running(trigger) as events:
        await check_decoded_and_dead_letter(events, schema_id)


async def restarted_while_the_registry_fails(
    trigger: BaseEventTrigger, restarts: int, between_s: float
) -> None:
    """Run the watcher made again from ``trigger`` ``restarts`` times, as the daemon restarts
    it, each run failing on the registry (answering 503), ``between_s`` apart: each run is
    delivered the messages again, counted once more."""
    for _ in range(restarts):
        async with running(load_trigger(*trigger.serialize())) as events:
            with pytest.raises(RegistryUnavailable, match="answered 503"):
                await take(events, 10, timeout_s=30)
        await anyio.sleep(between_s)


async def until_each_of(
    events: AsyncIterator[TriggerEvent], count: int, timeout_s: float = 30
) -> list[TriggerEvent]:
    """The events until ``count`` messages (by dedup key) each gave one. A message is
    delivered at least once: one not acked within its ack wait (no daemon acks here) comes
    again, in any order, with its key, and the store keeps one event of a key."""
    seen: list[TriggerEvent] = []
    with anyio.fail_after(timeout_s):
        while len({event.dedup_key for event in seen}) < count:
            seen.append(await anext(events))
    return seen


async def test_nats_a_registry_down_past_max_deliveries_dead_letters_nothing(
    make_nats_stream: Any, schema_registry: FakeRegistry
) -> None:
    """Each restart of the watcher while the registry is down has its messages delivered again,
    past ``max_deliveries``: the registry is asked whatever the count (none is a dead letter
    while it is down), and once it answers each message is an event. They were dead letters
    after ``max_deliveries`` restarts, unasked."""
    schema_id = schema_registry.register("orders-value", ORDER)
    stream = await make_nats_stream()
    client = await nats.connect(f"nats://{SHARED_NATS}")
    try:
        for raw in orders(schema_id, 2):
            await client.jetstream().publish(f"{stream}.in", raw, stream=stream)
    finally:
        await client.close()
    trigger = MessageQueueTrigger(
        f"nats://{SHARED_NATS}/{stream}/{stream}.%3E",
        value_format="avro",
        schema_registry=schema_registry.url,
        max_deliveries=2,
        ack_wait_s=1,
    )
    schema_registry.fail()
    await restarted_while_the_registry_fails(trigger, restarts=4, between_s=1.5)
    schema_registry.restore()
    async with running(load_trigger(*trigger.serialize())) as events:
        seen = await until_each_of(events, 2)
    assert [event.dead_letter for event in seen] == [None] * len(seen)
    messages = sorted({event.payload["sequence"]: event.payload for event in seen}.items())
    assert [(sequence, body["body"]["id"]) for sequence, body in messages] == [(1, 0), (2, 1)]


async def test_redis_stream_a_registry_down_past_max_deliveries_dead_letters_nothing(
    shared_redis: redis.asyncio.Redis,
    make_stream: MakeRedisStream,
    schema_registry: FakeRegistry,
) -> None:
    """As for NATS: each restart claims the entries again, past ``max_deliveries``."""
    schema_id = schema_registry.register("orders-value", ORDER)
    stream = await make_stream()
    for raw in orders(schema_id, 2):
        await shared_redis.xadd(stream, {"body": raw})
    trigger = MessageQueueTrigger(
        f"redis+stream://{SHARED_REDIS_HOST}:{SHARED_REDIS_PORT}/0/{stream}",
        start_id="0",
        block_ms=100,
        min_idle_ms=300,
        max_deliveries=2,
        value_format="avro",
        schema_registry=schema_registry.url,
    )
    schema_registry.fail()
    await restarted_while_the_registry_fails(trigger, restarts=4, between_s=0.5)
    schema_registry.restore()
    async with running(load_trigger(*trigger.serialize())) as events:
        seen = await until_each_of(events, 2)
    assert [event.dead_letter for event in seen] == [None] * len(seen)
    assert sorted({event.payload["body"]["id"] for event in seen}) == [0, 1]


async def test_kinesis_records_decode(
    moto_server: str, kinesis: Any, kinesis_stream: MakeStream, schema_registry: FakeRegistry
) -> None:
    schema_id = schema_registry.register("orders-value", ORDER)
    stream = await kinesis_stream()
    for raw in records(schema_id):
        await kinesis.put_record(StreamName=stream, Data=raw, PartitionKey="k")
    trigger = MessageQueueTrigger(
        f"kinesis://{stream}?region=us-east-1&endpoint_url={moto_server}",
        poll_interval_s=0.1,
        value_format="avro",
        schema_registry=schema_registry.url,
    )
    async with running(trigger) as events:
        await check_decoded_and_dead_letter(events, schema_id)


# -- the providers sharing one reader of a source: Pub/Sub and RabbitMQ


async def messages_of(events: AsyncIterator[TriggerEvent], count: int) -> list[TriggerEvent]:
    """The next ``count`` events that are messages (not a first start's checkpoint), acked;
    a deadline long enough for Pub/Sub to deliver again what it was left to."""
    taken: list[TriggerEvent] = []
    with anyio.fail_after(90):
        while len(taken) < count:
            event = await anext(events)
            if not event.is_checkpoint_only:
                assert event.ack is not None
                await event.ack()
                taken.append(event)
    return taken


def check_flowed(taken: list[TriggerEvent], schema_id: int) -> None:
    """A record decoded, one of an unknown schema id a dead letter, and the record after it
    decoded: in the order the broker gave them, which Pub/Sub does not promise."""
    good = sorted(
        (event for event in taken if event.dead_letter is None),
        key=lambda event: event.payload["body"]["id"],
    )
    [bad] = [event for event in taken if event.dead_letter is not None]
    assert [event.payload["body"] for event in good] == [
        {"id": 1, "total": 1.5},
        {"id": 2, "total": 1.5},
    ]
    assert {event.payload["schema_id"] for event in good} == {schema_id}
    assert "schema id 4040 is not in the registry" in bad.dead_letter
    assert bad.payload["body"] == {"base64": "AAAAD8gB"}
    assert "schema_id" not in bad.payload


def flowing(schema_id: int) -> list[bytes]:
    """A record, one of an id the registry does not hold, and another record."""
    return [*records(schema_id), confluent(schema_id, avro_record(ORDER, {"id": 2, "total": 1.5}))]


def orders(schema_id: int, count: int) -> list[bytes]:
    return [confluent(schema_id, avro_record(ORDER, {"id": i, "total": 0.5})) for i in range(count)]


async def raises_registry_unavailable(
    events: AsyncIterator[TriggerEvent], says: str = "does not answer"
) -> None:
    """The events until the watcher fails on its registry, acked (those of messages handed to
    it before); it must fail."""
    with pytest.raises(RegistryUnavailable, match=says):
        await messages_of(events, 1_000)


async def every_message_once(trigger: BaseEventTrigger, sent: list[str]) -> None:
    """The watcher made again from ``trigger`` (as the daemon restarts it) has each message of
    ``sent`` (ids) as one event: the records ``orders`` made."""
    async with running(load_trigger(*trigger.serialize())) as events:
        taken = await messages_of(events, len(sent))
    assert ids_of(taken) == sorted(sent)
    assert sorted(event.payload["body"]["id"] for event in taken) == list(range(len(sent)))


async def rabbitmq_publish(name: str, bodies: list[bytes]) -> list[str]:
    """Publish ``bodies`` to queue ``name`` on the shared broker, each with a message id of its
    own (its dedup key); the ids."""
    ids = [str(uuid.uuid4()) for _ in bodies]
    connection = await aio_pika.connect(f"amqp://guest:guest@{SHARED_RABBITMQ}/")
    async with connection:
        channel = await connection.channel()
        for body, message_id in zip(bodies, ids, strict=True):
            await channel.default_exchange.publish(
                aio_pika.Message(body, message_id=message_id), routing_key=name
            )
    return ids


def rabbitmq_uri(name: str) -> str:
    return f"amqp://{SHARED_RABBITMQ}/%2F/{name}"


def ids_of(events: list[TriggerEvent]) -> list[Any]:
    return sorted(event.payload["message_id"] for event in events)


async def test_pubsub_messages_decode(
    pubsub_emulator_host: str, make_subscription: MakeSubscription, schema_registry: FakeRegistry
) -> None:
    schema_id = schema_registry.register("orders-value", ORDER)
    uri = await make_subscription()
    await pubsub_send(uri, flowing(schema_id), emulator_host=pubsub_emulator_host)
    trigger = MessageQueueTrigger(
        uri,
        emulator_host=pubsub_emulator_host,
        value_format="avro",
        schema_registry=schema_registry.url,
    )
    async with running(trigger) as events:
        check_flowed(await messages_of(events, 3), schema_id)
    assert isinstance(trigger, PubSubTrigger)
    assert (trigger.events, trigger.dead_lettered, trigger.failed) == (2, 1, 0)


async def test_rabbitmq_messages_decode(
    make_rabbitmq_queue: MakeQueue, schema_registry: FakeRegistry
) -> None:
    schema_id = schema_registry.register("orders-value", ORDER)
    name = await make_rabbitmq_queue()
    await rabbitmq_publish(name, flowing(schema_id))
    trigger = MessageQueueTrigger(
        queue=rabbitmq_uri(name), value_format="avro", schema_registry=schema_registry.url
    )
    async with running(trigger) as events:
        check_flowed(await messages_of(events, 3), schema_id)
    assert isinstance(trigger, RabbitMqTrigger)
    assert (trigger.events, trigger.dead_lettered, trigger.failed) == (2, 1, 0)
    assert await ready_count(SHARED_RABBITMQ, name) == 0


async def test_pubsub_a_registry_down_fails_the_watcher_and_loses_nothing(
    pubsub_emulator_host: str,
    pubsub_admin: Admin,
    make_subscription: MakeSubscription,
    schema_registry: FakeRegistry,
) -> None:
    """Messages the watcher failed on (its registry refusing connections) are not
    acknowledged: they come back once their ack deadline passes, to the watcher restarted
    (as the daemon does) once the registry is back, each one event."""
    schema_id = schema_registry.register("orders-value", ORDER)
    uri = await make_subscription()
    sent = await pubsub_send(uri, orders(schema_id, 3), emulator_host=pubsub_emulator_host)
    options = {
        "emulator_host": pubsub_emulator_host,
        "value_format": "avro",
        "schema_registry": schema_registry.url,
    }
    schema_registry.refuse()
    trigger = PubSubTrigger(uri, **options)
    async with running(trigger) as events:
        await raises_registry_unavailable(events)
    assert trigger.events == 0
    schema_registry.restore()
    await every_message_once(trigger, sent)
    assert await pending(pubsub_admin, uri) == 0


async def test_rabbitmq_a_registry_down_fails_the_watcher_and_loses_nothing(
    make_rabbitmq_queue: MakeQueue, schema_registry: FakeRegistry
) -> None:
    """Messages the watcher failed on (its registry answering 503) are not acked: the broker
    delivers them again to the watcher restarted (as the daemon does) once the registry is
    back, each one event."""
    schema_id = schema_registry.register("orders-value", ORDER)
    name = await make_rabbitmq_queue(kind="quorum")
    sent = await rabbitmq_publish(name, orders(schema_id, 3))
    schema_registry.fail()
    trigger = RabbitMqTrigger(
        rabbitmq_uri(name), value_format="avro", schema_registry=schema_registry.url
    )
    async with running(trigger) as events:
        await raises_registry_unavailable(events, "answered 503")
    assert trigger.events == 0
    assert await ready_count(SHARED_RABBITMQ, name) == 3  # back in the queue
    schema_registry.restore()
    await every_message_once(trigger, sent)
    assert await ready_count(SHARED_RABBITMQ, name) == 0


async def test_pubsub_a_registry_down_fails_only_its_watcher(
    pubsub_emulator_host: str,
    pubsub_admin: Admin,
    make_subscription: MakeSubscription,
    schema_registry: FakeRegistry,
) -> None:
    """Two watchers of one subscription share its puller: the one decoding Avro fails while its
    registry refuses connections, the other (JSON) reads on. The messages are left to their
    deadline for the first, which, back, has each of them once; the second may see them again
    then, under the same dedup keys (one event each in the store)."""
    schema_id = schema_registry.register("orders-value", ORDER)
    uri = await make_subscription()
    plain = PubSubTrigger(uri, emulator_host=pubsub_emulator_host)
    options = {"value_format": "avro", "schema_registry": schema_registry.url}
    avro = PubSubTrigger(uri, emulator_host=pubsub_emulator_host, **options)
    pullers = pubsub_puller.Pullers()
    pullers.keep([plain, avro])
    seen_by_plain: list[TriggerEvent] = []

    async def read_plain(events: AsyncIterator[TriggerEvent]) -> None:
        async for event in events:
            assert event.ack is not None
            await event.ack()
            seen_by_plain.append(event)

    schema_registry.refuse()
    with pubsub_puller.sharing(pullers):
        async with running(plain) as plain_events, anyio.create_task_group() as group:
            group.start_soon(read_plain, plain_events)
            async with running(avro) as avro_events:
                sent = await pubsub_send(
                    uri, orders(schema_id, 3), emulator_host=pubsub_emulator_host
                )
                await raises_registry_unavailable(avro_events)
            await until(lambda: len(seen_by_plain) >= 3)
            schema_registry.restore()
            async with running(load_trigger(*avro.serialize())) as avro_events:
                taken = await messages_of(avro_events, 3)
            await until(lambda: plain.lag == 0, timeout_s=60)
            group.cancel_scope.cancel()
    assert ids_of(taken) == sorted(sent)
    assert sorted(event.payload["body"]["id"] for event in taken) == [0, 1, 2]
    assert set(ids_of(seen_by_plain)) == set(sent)
    assert {event.dedup_key for event in seen_by_plain} == {event.dedup_key for event in taken}
    assert all("base64" in event.payload["body"] for event in seen_by_plain)
    assert await pending(pubsub_admin, uri) == 0


async def test_rabbitmq_a_registry_down_fails_only_its_watcher(
    make_rabbitmq_queue: MakeQueue, schema_registry: FakeRegistry
) -> None:
    """Two watchers of one queue share its consumer: the one decoding Avro fails while its
    registry refuses connections, the other (JSON) reads on. The messages are held, unacked,
    for the first, which, back, has each of them once."""
    schema_id = schema_registry.register("orders-value", ORDER)
    name = await make_rabbitmq_queue()
    plain = RabbitMqTrigger(rabbitmq_uri(name))
    options = {"value_format": "avro", "schema_registry": schema_registry.url}
    avro = RabbitMqTrigger(rabbitmq_uri(name), **options)
    consumers = rabbitmq_consumer.Consumers()
    consumers.keep([plain, avro])
    schema_registry.refuse()
    with rabbitmq_consumer.sharing(consumers):
        async with running(plain) as plain_events:
            async with running(avro) as avro_events, anyio.create_task_group() as group:
                group.start_soon(raises_registry_unavailable, avro_events)
                sent = await rabbitmq_publish(name, orders(schema_id, 3))
                seen_by_plain = await messages_of(plain_events, 3)
            assert await ready_count(SHARED_RABBITMQ, name) == 0  # held for the Avro watcher
            schema_registry.restore()
            async with running(load_trigger(*avro.serialize())) as avro_events:
                taken = await messages_of(avro_events, 3)
    assert ids_of(taken) == ids_of(seen_by_plain) == sorted(sent)
    # In the order they came: held for the watcher away, handed to it in that order.
    assert [event.payload["body"] for event in taken] == [{"id": i, "total": 0.5} for i in range(3)]
    assert await ready_count(SHARED_RABBITMQ, name) == 0
