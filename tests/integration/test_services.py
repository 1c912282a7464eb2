"""Smoke tests of the dev services the integration tests run against."""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
from aiobotocore.session import get_session
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

if TYPE_CHECKING:
    from deploy.local.services import Service


async def produce(bootstrap: str, topic: str, *values: bytes) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for value in values:
            await producer.send_and_wait(topic, value)
    finally:
        await producer.stop()


async def consume_one(bootstrap: str, topic: str) -> bytes:
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=f"{topic}-group",
        auto_offset_reset="earliest",
        session_timeout_ms=6000,
        heartbeat_interval_ms=1000,
    )
    await consumer.start()
    try:
        with anyio.fail_after(20):
            record = await consumer.getone()
        await consumer.commit()
    finally:
        await consumer.stop()
    value: bytes = record.value
    return value


async def test_kafka_produce_and_consume(kafka_broker: str, kafka_topic: str) -> None:
    await produce(kafka_broker, kafka_topic, b"hello")

    assert await consume_one(kafka_broker, kafka_topic) == b"hello"


async def test_sqs_send_and_receive(moto_server: str, sqs_queue: str) -> None:
    async with get_session().create_client("sqs", endpoint_url=moto_server) as sqs:
        await sqs.send_message(QueueUrl=sqs_queue, MessageBody="hello")
        response = await sqs.receive_message(QueueUrl=sqs_queue, WaitTimeSeconds=5)

    assert [message["Body"] for message in response["Messages"]] == ["hello"]


async def test_s3_broker_keeps_messages_across_a_crash(
    restartable_kafka_broker: Service,
) -> None:
    bootstrap = restartable_kafka_broker.address
    await produce(bootstrap, "restart", b"kept")

    restartable_kafka_broker.kill()  # as a crash: what was acknowledged is in s3 already
    restartable_kafka_broker.start()

    assert await consume_one(bootstrap, "restart") == b"kept"
