"""Send messages to Kafka and SQS: what ``triggerer post kafka|sqs`` uses to fire pipelines."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError, KafkaError
from botocore.exceptions import BotoCoreError, ClientError

from watchers.sqs_address import parse_queue
from watchers.sqs_client import MAX_MESSAGES, is_missing_queue

Message = Any  # text is sent as it is; any other value as its JSON
_MAX_SEND_ATTEMPTS = 3
#: A sender waits for an answer, not for a long poll: a few seconds tell an endpoint is down.
_SQS_CONFIG = AioConfig(connect_timeout=5, read_timeout=30, retries={"mode": "standard"})


class SendError(Exception):
    """The broker could not be reached or did not take the messages; the text names where."""


def encode_message(message: Message) -> str:
    """Text as it is, any other value as JSON; a value JSON cannot hold is a ``TypeError``."""
    if isinstance(message, str):
        return message
    try:
        return json.dumps(message)
    except (TypeError, ValueError) as error:
        raise TypeError(f"message {message!r} must be text or JSON-serialisable: {error}") from None


async def send_kafka(
    bootstrap_servers: str,
    topic: str,
    messages: Iterable[Message],
    *,
    key: str | bytes | None = None,
    headers: Mapping[str, str | bytes] | None = None,
) -> list[dict[str, int]]:
    """Send ``messages`` to an existing ``topic``; the ``{"partition", "offset"}`` of each."""
    values = [encode_message(message).encode() for message in messages]
    key_bytes = key.encode() if isinstance(key, str) else key
    header_list = [
        (name, value.encode() if isinstance(value, str) else value)
        for name, value in (headers or {}).items()
    ]
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap_servers, acks="all")
    try:
        await producer.start()
        metadata = await producer.client.fetch_all_metadata()
        if topic not in metadata.topics():
            raise LookupError(
                f"Kafka topic {topic!r} does not exist on {bootstrap_servers}; "
                f"existing topics: {', '.join(sorted(metadata.topics())) or 'none'}"
            )
        futures = [
            await producer.send(topic, value, key=key_bytes, headers=header_list or None)
            for value in values
        ]
        records = [await future for future in futures]
    except KafkaConnectionError:
        raise SendError(f"cannot reach a Kafka broker at {bootstrap_servers}") from None
    except KafkaError as error:
        raise SendError(f"Kafka at {bootstrap_servers}, topic {topic!r}: {error}") from None
    finally:
        await producer.stop()  # also after a failed start: it closes the client's connections
    return [{"partition": record.partition, "offset": record.offset} for record in records]


async def send_sqs(
    queue: str,
    messages: Iterable[Message],
    *,
    endpoint_url: str | None = None,
    region_name: str | None = None,
    attributes: Mapping[str, str] | None = None,
) -> list[str]:
    """Send ``messages`` to ``queue`` (name, URL or ``sqs://`` URI) in batches of ten.

    ``attributes`` become String message attributes of every message. Returns the message ids,
    in the order of ``messages``.
    """
    location = parse_queue(queue, region_name=region_name, endpoint_url=endpoint_url)
    bodies = [encode_message(message) for message in messages]
    message_attributes = {
        name: {"DataType": "String", "StringValue": value}
        for name, value in (attributes or {}).items()
    }
    fifo = location.name.endswith(".fifo")
    async with get_session().create_client(
        "sqs",
        region_name=location.region_name,
        endpoint_url=location.endpoint_url,
        config=_SQS_CONFIG,
    ) as client:
        try:
            url = location.url or (await client.get_queue_url(QueueName=location.name))["QueueUrl"]
            ids: list[str] = []
            for start in range(0, len(bodies), MAX_MESSAGES):
                entries = [
                    {"Id": str(start + number), "MessageBody": body}
                    | ({"MessageAttributes": message_attributes} if message_attributes else {})
                    | (
                        {
                            "MessageGroupId": location.name,
                            "MessageDeduplicationId": uuid.uuid4().hex,
                        }
                        if fifo
                        else {}
                    )
                    for number, body in enumerate(bodies[start : start + MAX_MESSAGES])
                ]
                ids += await _send_batch(client, url, entries)
        except ClientError as error:
            if is_missing_queue(error):
                raise LookupError(
                    f"SQS queue {queue!r} does not exist at {client.meta.endpoint_url} "
                    f"(region {client.meta.region_name}); create it first"
                ) from None
            raise SendError(
                f"SQS at {client.meta.endpoint_url}, queue {queue!r}: {error}"
            ) from None
        except BotoCoreError as error:  # unreachable endpoint, no credentials
            raise SendError(
                f"SQS at {client.meta.endpoint_url}, queue {queue!r}: {error}"
            ) from None
    return ids


async def _send_batch(client: Any, url: str, entries: list[dict[str, Any]]) -> list[str]:
    """Send one batch; entries the service failed on its side are sent again."""
    ids: dict[str, str] = {}
    pending = entries
    for _ in range(_MAX_SEND_ATTEMPTS):
        response = await client.send_message_batch(QueueUrl=url, Entries=pending)
        ids |= {sent["Id"]: sent["MessageId"] for sent in response.get("Successful", [])}
        failed = response.get("Failed", [])
        rejected = [failure for failure in failed if failure.get("SenderFault")]
        if rejected:
            raise ValueError(f"SQS rejected messages {rejected!r} sent to {url}")
        retry = {failure["Id"] for failure in failed}
        pending = [entry for entry in pending if entry["Id"] in retry]
        if not pending:
            return [ids[entry["Id"]] for entry in entries]
    raise RuntimeError(
        f"SQS failed to take {len(pending)} messages sent to {url} after "
        f"{_MAX_SEND_ATTEMPTS} attempts: {failed!r}"
    )
