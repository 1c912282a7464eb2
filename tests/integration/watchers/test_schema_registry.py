"""Decoding through real registries: the tests' Confluent-speaking one
(:mod:`tests.fixtures.schema_registry`) and AWS Glue's in moto; and the providers besides Kafka
(Redis Streams, NATS JetStream, Kinesis) decoding through the same step
(:mod:`watchers.schemas.decoding`)."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any

import anyio
import nats
import pytest
from aiobotocore.session import get_session

from tests.fixtures.nats import SHARED_NATS
from tests.fixtures.redis import SHARED_REDIS_HOST, SHARED_REDIS_PORT
from tests.fixtures.schema_registry import (
    FakeRegistry,
    avro_record,
    compile_proto,
    confluent,
    glue,
    proto_class,
)
from tests.fixtures.triggers import running, take
from triggerer import connections
from watchers import MessageQueueTrigger
from watchers.schemas.decoding import BodyFormat, Undecodable
from watchers.schemas.registries import RegistryUnavailable

if TYPE_CHECKING:
    import redis.asyncio

    from tests.fixtures.kinesis import MakeStream
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
