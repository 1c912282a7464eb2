"""CloudEvents through ``triggerer run --config FILE`` with its API: a CloudEvent produced to
Kafka (tansu) in binary mode and posted to the REST API in structured mode (one ``source`` and
``id``) is one event, whichever came first; a malformed one is a 422 from the API and a dead
letter from Kafka naming the attribute, and the next message flows. SQS (moto) and Redis
pub/sub, which have no binding of headers, read structured mode: one CloudEvent sent through
both to one asset is one event.

The other providers' case is in the providers' contract (``tests/e2e/providers``)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import httpx

from tests.e2e.daemon import Deployment, events_of, sqlite_url, write_pipelines
from tests.e2e.providers.contract import dead_letter_count, duplicates_reach, listed
from tests.e2e.test_api import api_url
from tests.fixtures.redis import SHARED_REDIS_HOST, SHARED_REDIS_PORT
from watchers.kafka import send
from watchers.redis.pubsub import send as publish
from watchers.sqs import send as send_sqs

if TYPE_CHECKING:
    from pathlib import Path

    from tests.fixtures.brokers import MakeQueue, MakeTopic

TOKEN = "e2e-cloudevents"  # noqa: S105 - the token this test configures
NO_SPARK = "sc://127.0.0.1:1"  # no pipeline runs here
STRUCTURED = "application/cloudevents+json"
SOURCE = "https://shop.example/orders"
PIPELINES = """
from triggerer import Asset, AssetWatcher
from watchers import KafkaTrigger

orders = Asset("orders", watchers=[AssetWatcher("orders_topic", KafkaTrigger(
    bootstrap_servers="{bootstrap}", topics=["{topic}"],
    session_timeout_ms=6000, heartbeat_interval_ms=1000))])
"""
WAIT_S = 120.0


def binary(event_id: str, **more: str) -> dict[str, str]:
    """The Kafka headers of a CloudEvent of ``SOURCE`` in binary mode, its data JSON."""
    return {
        "ce_specversion": "1.0",
        "ce_id": event_id,
        "ce_source": SOURCE,
        "ce_type": "com.example.order.created",
        "ce_time": "2026-03-16T09:37:51Z",
        "content-type": "application/json",
        **more,
    }


def structured(event_id: str, data: Any) -> str:
    """The same CloudEvent in the JSON event format."""
    return json.dumps(
        {
            "specversion": "1.0",
            "id": event_id,
            "source": SOURCE,
            "type": "com.example.order.created",
            "time": "2026-03-16T09:37:51Z",
            "data": data,
        }
    )


async def test_a_cloudevent_by_kafka_and_by_rest_is_one_event(
    tmp_path: Path, kafka_broker: str, make_topic: MakeTopic
) -> None:
    deployment = Deployment(
        tmp_path, sqlite_url(tmp_path), NO_SPARK, kafka_broker, await make_topic()
    )
    deployment.write_pipelines(PIPELINES)
    topic_uri = f"kafka://{kafka_broker}/{deployment.topic}"
    config = deployment.config_file(api={"enabled": True, "port": 0, "tokens": [TOKEN]})
    with deployment.process_with_config(config) as daemon:
        await deployment.start_watching(daemon)
        await daemon.wait_logged("api_listening")
        async with httpx.AsyncClient(
            base_url=api_url(daemon), headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
        ) as client:

            async def post(body: str, query: str = "?uri=orders") -> httpx.Response:
                headers = {"Content-Type": STRUCTURED}
                return await client.post(f"/assets/events{query}", content=body, headers=headers)

            # Kafka first, in binary mode; then the same CloudEvent over REST: the event of
            # the Kafka message, stored before (200).
            await send(topic_uri, [json.dumps({"order": 7})], headers=binary("order-7"))
            [by_kafka] = await deployment.wait_for(lambda s: events_of(s, "orders"), bool)
            again = await post(structured("order-7", {"order": 7}))
            assert again.status_code == 200, again.text
            assert again.json()["id"] == by_kafka.id
            assert again.json()["source_trigger_id"] is not None

            # REST first, in structured mode; then the same CloudEvent from Kafka: absorbed.
            by_rest = await post(structured("order-8", {"order": 8}))
            assert by_rest.status_code == 201, by_rest.text
            await send(topic_uri, [json.dumps({"order": 8})], headers=binary("order-8"))

            # Malformed: a 422 from the API, a dead letter from Kafka; the next message flows.
            malformed = await post(json.dumps({"specversion": "1.0", "id": "x", "type": "t"}))
            assert malformed.status_code == 422
            assert "'source' is missing" in malformed.json()["detail"]
            no_source = {k: v for k, v in binary("order-9").items() if k != "ce_source"}
            await send(topic_uri, [json.dumps({"order": 9})], headers=no_source)
            await send(topic_uri, [json.dumps({"plain": True})])

            events = await deployment.wait_for(
                lambda s: events_of(s, "orders"), lambda found: len(found) >= 3, timeout_s=WAIT_S
            )
            await deployment.wait_for(dead_letter_count, lambda n: n >= 1, timeout_s=WAIT_S)
            # The copies of order-7 and order-8 read, and kept out.
            await duplicates_reach(api_url(daemon), 2, token=TOKEN)
            letters = await listed(daemon, "events", "dead-letters")
            events = await deployment.query(lambda s: events_of(s, "orders"))
            assert daemon.process is not None
            assert daemon.process.poll() is None, daemon.tail()

    cloudevents = [event.extra.get("cloudevent") for event in events]
    assert [ce["id"] if ce else None for ce in cloudevents] == ["order-7", "order-8", None]
    assert [event.source for event in events] == ["trigger", "rest_api", "trigger"]
    first, _, plain = events
    assert first.extra["cloudevent"] == {
        "specversion": "1.0",
        "id": "order-7",
        "source": SOURCE,
        "type": "com.example.order.created",
        "subject": None,
        "time": "2026-03-16T09:37:51Z",
        "datacontenttype": "application/json",
        "data": {"order": 7},
        "extensions": {},
    }
    assert first.extra["payload"]["headers"]["ce_id"] == "order-7"
    assert first.dedup_key == f'cloudevent:["{SOURCE}","order-7"]'
    assert plain.extra["payload"]["value"] == {"plain": True}
    [letter] = letters
    assert letter["asset"] == "orders"
    assert "CloudEvent attribute 'source' is missing" in letter["reason"]
    # The copies were the same CloudEvent: nothing logged of another message under a key.
    assert "duplicate_key_other_message" not in daemon.log_path.read_text()


TWO_BROKERS = """
from triggerer import Asset, AssetWatcher
from watchers import MessageQueueTrigger, SqsTrigger

orders = Asset("orders", watchers=[
    AssetWatcher("orders_queue", SqsTrigger(
        {queue_url!r}, endpoint_url={endpoint!r}, region_name="us-east-1", wait_time_s=1)),
    AssetWatcher("orders_channel", MessageQueueTrigger(queue={channel!r})),
])
"""


async def test_one_cloudevent_through_sqs_and_redis_pubsub_is_one_event(
    tmp_path: Path, moto_server: str, make_sqs_queue: MakeQueue
) -> None:
    queue_url = await make_sqs_queue()
    channel = f"redis+pubsub://{SHARED_REDIS_HOST}:{SHARED_REDIS_PORT}/0/{tmp_path.name}"
    write_pipelines(
        tmp_path / "pipelines",
        TWO_BROKERS.format(queue_url=queue_url, endpoint=moto_server, channel=channel),
    )
    deployment = Deployment(tmp_path, sqlite_url(tmp_path), NO_SPARK, bootstrap="", topic="")
    config = deployment.config_file(api={"enabled": True, "port": 0, "tokens": []})
    order = structured("order-1", {"order": 1})
    no_id = json.dumps({**json.loads(order), "id": None})
    with deployment.process_with_config(config) as daemon:
        daemon.start()
        await daemon.wait_logged("api_listening")
        await daemon.wait_logged("redis_pubsub_subscribed")
        await publish(channel, [order])
        await send_sqs(queue_url, [order, no_id, json.dumps({"plain": True})])
        events = await deployment.wait_for(
            lambda s: events_of(s, "orders"), lambda found: len(found) >= 2, timeout_s=WAIT_S
        )
        await deployment.wait_for(dead_letter_count, lambda n: n >= 1, timeout_s=WAIT_S)
        await duplicates_reach(api_url(daemon), 1)  # the second copy of order-1, kept out
        letters = await listed(daemon, "events", "dead-letters")
        events = await deployment.query(lambda s: events_of(s, "orders"))
        assert daemon.process is not None
        assert daemon.process.poll() is None, daemon.tail()
    by_id = {event.extra.get("cloudevent", {}).get("id"): event for event in events}
    assert set(by_id) == {"order-1", None}
    assert len(events) == 2
    assert by_id["order-1"].extra["cloudevent"]["data"] == {"order": 1}
    assert by_id[None].extra["payload"]["body"] == {"plain": True}
    [letter] = letters
    assert "CloudEvent attribute 'id' is missing" in letter["reason"]
