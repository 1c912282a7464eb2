"""The Kafka and SQS providers' send against the real brokers, and triggerer post's errors."""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from aiobotocore.session import get_session
from aiokafka import AIOKafkaConsumer

from deploy.local.services import DUMMY_AWS_ENV
from tests.e2e.daemon import triggerer_cli
from watchers import kafka, sqs


@pytest.fixture
async def sqs_client(moto_server: str) -> AsyncIterator[Any]:
    async with get_session().create_client("sqs", endpoint_url=moto_server) as client:
        yield client


async def test_send_sqs_batches_by_ten_and_returns_ids_in_order(
    sqs_client: Any, sqs_queue: str
) -> None:
    bodies = ["plain text", *(json.dumps({"n": n}) for n in range(1, 23))]
    ids = await sqs.send(sqs_queue, bodies, attributes={"source": "test"})
    assert len(ids) == 23
    assert len(set(ids)) == 23
    received: dict[str, dict[str, Any]] = {}
    with anyio.fail_after(10):
        while len(received) < 23:
            response = await sqs_client.receive_message(
                QueueUrl=sqs_queue, MaxNumberOfMessages=10, MessageAttributeNames=["All"]
            )
            received |= {m["MessageId"]: m for m in response.get("Messages", [])}
    assert received[ids[0]]["Body"] == "plain text"
    assert json.loads(received[ids[5]]["Body"]) == {"n": 5}
    assert received[ids[22]]["MessageAttributes"]["source"]["StringValue"] == "test"


async def test_send_sqs_by_name_and_to_a_fifo_queue(make_sqs_queue: Any) -> None:
    url = await make_sqs_queue(fifo=True)
    name = url.rsplit("/", 1)[1]
    endpoint = url.rsplit("/", 2)[0]
    ids = await sqs.send(f"sqs://{name}?endpoint_url={endpoint}", ["same", "same"])
    assert len(set(ids)) == 2  # each send is its own message, even with equal bodies


async def test_send_sqs_to_a_missing_queue(moto_server: str) -> None:
    with pytest.raises(LookupError, match="SQS queue 'nope' does not exist at http://127"):
        await sqs.send("nope", ["x"], endpoint_url=moto_server)


async def test_send_kafka_returns_offsets(kafka_broker: str, kafka_topic: str) -> None:
    sent = await kafka.send(
        f"kafka://{kafka_broker}/{kafka_topic}",
        ['{"n": 1}', "text"],
        key="k",
        headers={"source": "test"},
    )
    assert sent == [f"{kafka_topic}/0/0", f"{kafka_topic}/0/1"]
    consumer = AIOKafkaConsumer(
        kafka_topic, bootstrap_servers=kafka_broker, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        with anyio.fail_after(20):
            records = [await consumer.getone(), await consumer.getone()]
    finally:
        await consumer.stop()
    assert [record.value for record in records] == [b'{"n": 1}', b"text"]
    assert records[0].key == b"k"
    assert list(records[0].headers) == [("source", b"test")]


async def test_send_kafka_to_a_missing_topic(kafka_broker: str) -> None:
    with pytest.raises(LookupError, match="Kafka topic 'no-such-topic' does not exist"):
        await kafka.send(f"kafka://{kafka_broker}/no-such-topic", ["x"])


@pytest.mark.parametrize(
    ("post", "address"),
    [
        (["kafka", "orders", "--bootstrap-servers", "127.0.0.1:1"], "127.0.0.1:1"),
        (["sqs", "orders", "--endpoint-url", "http://127.0.0.1:1"], "http://127.0.0.1:1"),
    ],
)
async def test_post_to_an_unreachable_broker_is_one_line_naming_it(
    tmp_path: Path, post: list[str], address: str
) -> None:
    result = await triggerer_cli(cli_env(tmp_path), "post", *post, '{"id": 1}')

    assert result.returncode == 1
    assert result.stdout == b""
    [line] = result.stderr.decode().splitlines()
    assert line.startswith("triggerer: ")
    assert address in line


async def test_post_to_a_missing_queue_or_topic_is_one_line_naming_it(
    tmp_path: Path, moto_server: str, kafka_broker: str
) -> None:
    env = cli_env(tmp_path)
    sqs = await triggerer_cli(env, "post", "sqs", "nope", "x", "--endpoint-url", moto_server)
    kafka = await triggerer_cli(
        env, "post", "kafka", "nope", "x", "--bootstrap-servers", kafka_broker
    )

    for result, address in ((sqs, moto_server), (kafka, kafka_broker)):
        assert result.returncode == 1
        [line] = result.stderr.decode().splitlines()
        assert "'nope' does not exist" in line
        assert address in line


def cli_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a ``triggerer`` process with its own database and dummy AWS keys."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRIGGERER_", "AWS_"))}
    return env | DUMMY_AWS_ENV | {"TRIGGERER_DATABASE__URL": f"sqlite:///{tmp_path / 'db'}"}
