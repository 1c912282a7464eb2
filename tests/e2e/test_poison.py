"""A message the store cannot hold, among 1,000 on two watchers of a ``triggerer run`` process
on PostgreSQL: it becomes one dead letter, and everything else flows on. A message whose JSON
holds a NUL character, which jsonb cannot hold either, is stored: as its text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from tests.e2e.daemon import (
    DaemonProcess,
    daemon_env,
    event_count,
    events_of,
    produce_json,
    query,
    triggerer_cli,
    wait_for,
    write_pipelines,
)
from triggerer.service.store.models import ID_LENGTH

if TYPE_CHECKING:
    from tests.fixtures.brokers import MakeTopic

MESSAGES = 500
"""Messages on each of the two topics."""
POISON_AT = 250
"""The offset of the message whose partition key is too long on the ``orders`` topic, and of
the one holding a NUL character on the ``refunds`` topic."""

WATCHERS = """
from triggerer import Asset, AssetWatcher
from watchers import KafkaTrigger


def watched(name, topic):
    trigger = KafkaTrigger(
        bootstrap_servers="{bootstrap}", topics=[topic], group_id=topic + "-group",
        partition_key_path="$.value.region", session_timeout_ms=6000, heartbeat_interval_ms=1000,
    )
    return Asset(name, watchers=[AssetWatcher(name + "_topic", trigger)])


orders = watched("orders", "{orders}")
refunds = watched("refunds", "{refunds}")
"""


async def committed_offset(bootstrap: str, topic: str) -> int:
    """The offset the watcher's consumer group committed on the topic's one partition."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=f"{topic}-group")
    await consumer.start()
    try:
        return await consumer.committed(TopicPartition(topic, 0)) or 0
    finally:
        await consumer.stop()


def messages(odd_one: dict[str, Any]) -> list[dict[str, Any]]:
    values = [{"i": i, "region": "eu-west"} for i in range(MESSAGES)]
    values[POISON_AT] = odd_one
    return values


def number(event: Any) -> int:
    value = event.extra["payload"]["value"]
    return int(json.loads(value)["i"] if isinstance(value, str) else value["i"])


@pytest.mark.timeout(180)
@pytest.mark.parametrize("db_backend", ["postgresql"], indirect=True)
async def test_a_poison_message_is_one_dead_letter_and_both_watchers_keep_flowing(
    tmp_path: Path, database_url: str, kafka_broker: str, make_topic: MakeTopic
) -> None:
    topics = {"orders": await make_topic(), "refunds": await make_topic()}
    write_pipelines(
        tmp_path / "pipelines", WATCHERS.format(bootstrap=kafka_broker, **topics), "sources.py"
    )
    # Partitioned events queue no run here (no pipeline), so no Spark server is needed.
    env = daemon_env(tmp_path, database_url, "sc://127.0.0.1:1")
    poison = {"i": POISON_AT, "region": "r" * (ID_LENGTH + 1)}
    nul = {"i": POISON_AT, "region": "eu-west", "note": "a\x00b"}
    with DaemonProcess(env, tmp_path / "daemon.log") as daemon:
        daemon.start()
        await daemon.wait_logged("pipelines_loaded")
        async with anyio.create_task_group() as producers:
            producers.start_soon(produce_json, kafka_broker, topics["orders"], messages(poison))
            producers.start_soon(produce_json, kafka_broker, topics["refunds"], messages(nul))

        async def stored(session: Any) -> int:
            return await event_count(session, "orders") + await event_count(session, "refunds")

        await wait_for(database_url, stored, lambda n: n >= 2 * MESSAGES - 1, timeout_s=60)
        # Every message is acked, the poison one included: none is delivered again.
        with anyio.fail_after(30):
            for topic in topics.values():
                while await committed_offset(kafka_broker, topic) < MESSAGES:  # noqa: ASYNC110 - polling the broker
                    await anyio.sleep(0.2)
        listed = await triggerer_cli(env, "events", "dead-letters", "--json")
        assert daemon.process is not None
        assert daemon.process.poll() is None, daemon.tail()
        logged = await anyio.Path(daemon.log_path).read_text()

    orders = await query(database_url, lambda s: events_of(s, "orders"))
    refunds = await query(database_url, lambda s: events_of(s, "refunds"))
    assert sorted(number(e) for e in orders) == [i for i in range(MESSAGES) if i != POISON_AT]
    assert sorted(number(e) for e in refunds) == list(range(MESSAGES))
    [text] = [e.extra["payload"]["value"] for e in refunds if number(e) == POISON_AT]
    assert json.loads(text) == nul
    assert listed.returncode == 0, listed.stderr
    [letter] = json.loads(listed.stdout)
    assert letter["asset"] == "orders"
    assert letter["dedup_key"].startswith(f"{topics['orders']}/0/{POISON_AT}@")
    assert letter["reason"].startswith("partition key is 251 characters long")
    assert json.loads(letter["payload"])["payload"]["value"] == poison
    assert '"event": "event_dead_lettered"' in logged
