"""Records produced in a schema registry's wire format arrive decoded, through a real
``triggerer run --config`` process reading tansu, with a registry speaking Confluent's REST API
(:mod:`tests.fixtures.schema_registry`) and AWS Glue's in moto.

- Avro (key and value), Protobuf and JSON Schema records arrive as their decoded records with
  their schema ids; a Glue-framed Avro record decodes with its schema from moto's Glue; a
  message of an unknown schema id and a corrupt one are dead letters with the reason, and the
  message after each flows.
- The registry down for 10 s (first refusing connections, then answering 503) while messages
  are produced: the watcher says so (``backoff``, its last error naming the registry), and once
  the registry is back every message is one event: none lost, none doubled.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from aiobotocore.session import get_session
from aiokafka import AIOKafkaProducer

from tests.e2e.daemon import (
    DaemonProcess,
    event_count,
    events_of,
    sqlite_url,
    trigger_rows,
    triggerer_cli,
    wait_for,
    without_triggerer_variables,
    write_config,
    write_pipelines,
)
from tests.fixtures.schema_registry import (
    FakeRegistry,
    avro_record,
    compile_proto,
    confluent,
    glue,
    proto_class,
)

if TYPE_CHECKING:
    from tests.fixtures.brokers import MakeTopic

pytestmark = pytest.mark.timeout(300)

ORDER = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "sku", "type": "string"},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["NEW", "PAID"]}},
        {
            "name": "price",
            "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2},
        },
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
}
ORDER_KEY = {"type": "record", "name": "OrderKey", "fields": [{"name": "id", "type": "long"}]}
PROTO = """
syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";

message Payment {
  int64 id = 1;
  string currency = 2;
  google.protobuf.Timestamp at = 3;
  bytes token = 4;
}
"""
REFUND_SCHEMA = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "type": "object",
    "properties": {"id": {"type": "integer"}, "reason": {"type": "string"}},
    "required": ["id"],
}
NUMBERED = {"type": "record", "name": "Numbered", "fields": [{"name": "i", "type": "int"}]}
OUTAGE_MESSAGES = 60


def order(i: int) -> dict[str, Any]:
    import datetime
    import decimal

    return {
        "id": i,
        "sku": f"sku-{i}",
        "kind": "PAID",
        "price": decimal.Decimal("12.50"),
        "at": datetime.datetime(2024, 5, 6, 7, 8, 9, 123000, tzinfo=datetime.UTC),
        "note": None,
    }


async def produce(bootstrap: str, topic: str, messages: list[tuple[bytes | None, bytes]]) -> None:
    """Send each ``(key, value)`` in order."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for key, value in messages:
            await producer.send_and_wait(topic, value, key=key)
    finally:
        await producer.stop()


def daemon(
    tmp_path: Path, pipelines: str, connections: dict[str, dict[str, Any]] | None = None
) -> DaemonProcess:
    """``triggerer run --config FILE`` on SQLite for ``pipelines``; no Spark, no API."""
    write_pipelines(tmp_path / "pipelines", pipelines)
    sections: dict[str, dict[str, Any]] = {
        "database": {"url": sqlite_url(tmp_path)},
        "pipelines": {"dir": str(tmp_path / "pipelines"), "reload_interval_s": 0.2},
        "daemon": {"heartbeat_interval_s": 0.5},
        "logging": {"format": "json"},
        "api": {"enabled": False},
        **{f"connections.{name}": values for name, values in (connections or {}).items()},
    }
    config = write_config(tmp_path / "triggerer.toml", sections)
    return DaemonProcess(without_triggerer_variables(), tmp_path / "daemon.log", config)


def asset(name: str, bootstrap: str, topic: str, **options: Any) -> str:
    return f"""
{name} = Asset({name!r}, watchers=[AssetWatcher("{name}_topic", KafkaTrigger(
    bootstrap_servers={bootstrap!r}, topics=[{topic!r}], session_timeout_ms=6000,
    heartbeat_interval_ms=1000, **{options!r}))])
"""


HEAD = """
from triggerer import Asset, AssetWatcher
from watchers import KafkaTrigger
"""


async def register_in_glue(endpoint: str, schema: dict[str, Any]) -> str:
    """A new Avro schema in moto's Glue; its first version's id."""
    async with get_session().create_client(
        "glue", endpoint_url=endpoint, region_name="us-east-1"
    ) as client:
        await client.create_registry(RegistryName="shop")
        created = await client.create_schema(
            RegistryId={"RegistryName": "shop"},
            SchemaName="orders",
            DataFormat="AVRO",
            Compatibility="NONE",
            SchemaDefinition=json.dumps(schema),
        )
        return str(created["SchemaVersionId"])


async def test_avro_protobuf_json_schema_and_glue_records_arrive_decoded(
    tmp_path: Path,
    kafka_broker: str,
    make_topic: MakeTopic,
    schema_registry: FakeRegistry,
    moto_server: str,
) -> None:
    topics = {name: await make_topic() for name in ("orders", "payments", "refunds", "glued")}
    order_id = schema_registry.register("orders-value", ORDER)
    key_id = schema_registry.register("orders-key", ORDER_KEY)
    payment_id = schema_registry.register("payments-value", PROTO, "PROTOBUF")
    refund_id = schema_registry.register("refunds-value", json.dumps(REFUND_SCHEMA), "JSON")
    glue_version = await register_in_glue(moto_server, ORDER)
    registry = schema_registry.url
    pipelines = HEAD + "".join(
        [
            asset(
                "orders",
                kafka_broker,
                topics["orders"],
                value_format="avro",
                key_format="avro",
                schema_registry=registry,
            ),
            # Through a named connection, as credentials would be given.
            asset(
                "payments",
                kafka_broker,
                topics["payments"],
                value_format="protobuf",
                schema_registry="registry",
            ),
            asset(
                "refunds",
                kafka_broker,
                topics["refunds"],
                value_format="json_schema",
                schema_registry=registry,
            ),
            asset(
                "glued", kafka_broker, topics["glued"], value_format="avro", schema_registry="glue"
            ),
        ]
    )
    connections = {
        "registry": {"url": registry},
        "glue": {
            "type": "glue",
            "region_name": "us-east-1",
            "endpoint_url": moto_server,
            "aws_access_key_id": "testing",
            "aws_secret_access_key": "testing",
        },
    }
    payment_class = proto_class(compile_proto(PROTO), "Payment")
    payment = payment_class(id=2**40, currency="EUR", token=b"\x00\x01")
    payment.at.FromSeconds(1_700_000_000)

    with daemon(tmp_path, pipelines, connections) as process:
        process.start()
        await process.wait_logged("pipelines_loaded")
        orders = [
            (
                confluent(key_id, avro_record(ORDER_KEY, {"id": 1})),
                confluent(order_id, avro_record(ORDER, order(1))),
            ),
            # An id the registry does not hold, then a record cut short: dead letters.
            (None, confluent(999, avro_record(ORDER, order(2)))),
            (None, confluent(order_id, avro_record(ORDER, order(3))[:-4])),
            (None, confluent(order_id, avro_record(ORDER, order(4)))),
        ]
        await produce(kafka_broker, topics["orders"], orders)
        await produce(
            kafka_broker,
            topics["payments"],
            [(None, confluent(payment_id, payment.SerializeToString(), (0,)))],
        )
        await produce(
            kafka_broker,
            topics["refunds"],
            [
                (None, confluent(refund_id, b'{"id": 5, "reason": "late"}')),
                (None, confluent(refund_id, b'{"reason": "no id"}')),  # does not match
                (None, confluent(refund_id, b'{"id": 6}')),
            ],
        )
        await produce(
            kafka_broker,
            topics["glued"],
            [(None, glue(glue_version, avro_record(ORDER, order(7)), compressed=True))],
        )

        async def counts(session: Any) -> dict[str, int]:
            return {name: await event_count(session, name) for name in topics}

        await wait_for(
            sqlite_url(tmp_path),
            counts,
            lambda n: n == {"orders": 2, "payments": 1, "refunds": 2, "glued": 1},
            timeout_s=120,
        )
        listed = await triggerer_cli(
            process.env, "--config", process.arguments[2], "events", "dead-letters", "--json"
        )
        assert process.process is not None
        assert process.process.poll() is None, process.tail()

    database = sqlite_url(tmp_path)

    async def payloads(name: str) -> list[Any]:
        return [
            e.extra["payload"] for e in await wait_for(database, lambda s: events_of(s, name), bool)
        ]

    first, last = await payloads("orders")
    assert first["value"] == {
        "id": 1,
        "sku": "sku-1",
        "kind": "PAID",
        "price": "12.50",
        "at": "2024-05-06T07:08:09.123000Z",
        "note": None,
    }
    assert (first["schema_id"], first["key"], first["key_schema_id"]) == (
        order_id,
        {"id": 1},
        key_id,
    )
    assert (last["value"]["id"], last["schema_id"], last["key"]) == (4, order_id, None)
    [paid] = await payloads("payments")
    assert paid["value"] == {
        "id": str(2**40),  # ProtoJSON: 64-bit integers as text
        "currency": "EUR",
        "at": "2023-11-14T22:13:20Z",
        "token": "AAE=",
    }
    assert paid["schema_id"] == payment_id
    refunds = await payloads("refunds")
    assert [r["value"] for r in refunds] == [{"id": 5, "reason": "late"}, {"id": 6}]
    [glued] = await payloads("glued")
    assert (glued["value"]["id"], glued["schema_id"]) == (7, glue_version)

    assert listed.returncode == 0, listed.stderr
    letters = {letter["dedup_key"].split("@")[0]: letter for letter in json.loads(listed.stdout)}
    assert set(letters) == {
        f"{topics['orders']}/0/1",
        f"{topics['orders']}/0/2",
        f"{topics['refunds']}/0/1",
    }
    unknown = letters[f"{topics['orders']}/0/1"]
    assert "schema id 999 is not in the registry" in unknown["reason"]
    assert json.loads(unknown["payload"])["payload"]["value"]["base64"]  # the bytes, kept
    assert "corrupt Avro record" in letters[f"{topics['orders']}/0/2"]["reason"]
    assert "does not match its schema" in letters[f"{topics['refunds']}/0/1"]["reason"]
    # One fetch per schema id for the daemon's life.
    assert schema_registry.requests[f"GET /schemas/ids/{order_id}"] == 1


async def test_a_registry_down_for_10_s_loses_and_doubles_nothing(
    tmp_path: Path, kafka_broker: str, make_topic: MakeTopic, schema_registry: FakeRegistry
) -> None:
    topic = await make_topic()
    schema_id = schema_registry.register("numbered-value", NUMBERED)
    pipelines = HEAD + asset(
        "numbered", kafka_broker, topic, value_format="avro", schema_registry=schema_registry.url
    )
    database = sqlite_url(tmp_path)

    def numbered(first: int, stop: int) -> list[tuple[bytes | None, bytes]]:
        return [
            (None, confluent(schema_id, avro_record(NUMBERED, {"i": i})))
            for i in range(first, stop)
        ]

    with daemon(tmp_path, pipelines) as process:
        process.start()
        await process.wait_logged("pipelines_loaded")
        await wait_for(database, trigger_rows, lambda rows: rows[0].state == "running")
        # Down before the daemon has fetched the schema: every message needs the registry.
        schema_registry.refuse()
        down_at = time.monotonic()
        await produce(kafka_broker, topic, numbered(0, OUTAGE_MESSAGES // 2))
        rows = await wait_for(
            database,
            trigger_rows,
            lambda rows: (
                rows[0].state == "backoff" and "schema registry" in (rows[0].last_error or "")
            ),
        )
        assert "does not answer" in (rows[0].last_error or "")
        # Then answering 503 for the rest of the 10 s.
        schema_registry.fail()
        await produce(kafka_broker, topic, numbered(OUTAGE_MESSAGES // 2, OUTAGE_MESSAGES))
        await wait_for(
            database, trigger_rows, lambda rows: "answered 503" in (rows[0].last_error or "")
        )
        await anyio.sleep(max(0.0, 10 - (time.monotonic() - down_at)))  # the outage's length
        assert await wait_for(database, lambda s: event_count(s, "numbered"), lambda _: True) == 0
        schema_registry.restore()

        await wait_for(
            database,
            lambda s: event_count(s, "numbered"),
            lambda n: n >= OUTAGE_MESSAGES,
            timeout_s=120,
        )
        # Time for anything delivered twice to be stored twice, the daemon still running.
        await anyio.sleep(2)
        rows = await wait_for(database, trigger_rows, lambda rows: rows[0].state == "running")
        events = await wait_for(database, lambda s: events_of(s, "numbered"), bool)
        assert process.process is not None
        assert process.process.poll() is None, process.tail()

    assert sorted(e.extra["payload"]["value"]["i"] for e in events) == list(range(OUTAGE_MESSAGES))
    assert {e.extra["payload"]["schema_id"] for e in events} == {schema_id}
    assert rows[0].restart_count >= 1
