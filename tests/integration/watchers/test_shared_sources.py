"""Watchers that read one source, through the running daemon (SQLite and PostgreSQL).

Two Kafka watchers of one topic read it through the daemon's one shared consumer, each sees
every message, and editing a watcher's filter keeps its place (no replay). Two SQS watchers of
one queue share its poller the same way, and each message is deleted once both are done.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from tests.e2e.daemon import (
    daemon_env,
    daemon_settings,
    query,
    running_daemon,
    triggerer_cli,
    wait_for,
    write_pipelines,
)
from tests.integration.watchers.test_kafka import produce
from triggerer.service.store import models

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

    from tests.fixtures.brokers import MakeQueue, MakeTopic

NO_SPARK = "sc://127.0.0.1:1"  # no pipeline runs in these tests
TIMEOUT_S = 60.0

Stored = dict[str, list[int]]


def kafka_pipelines(bootstrap: str, topic: str, orders_kind: str) -> str:
    return f"""
from triggerer import Asset, AssetWatcher
from watchers import KafkaTrigger

def sales(**options):
    return KafkaTrigger(
        bootstrap_servers="{bootstrap}", topics=["{topic}"], session_timeout_ms=6000,
        heartbeat_interval_ms=1000, commit_interval_ms=100, fetch_max_wait_ms=100, **options)

orders = Asset("orders", watchers=[
    AssetWatcher("sales", sales(filter={{"path": "$.value.type", "equals": "{orders_kind}"}}))])
everything = Asset("everything", watchers=[AssetWatcher("sales", sales())])
"""


def sale(n: int) -> dict[str, Any]:
    """Message ``n``: an order when even, else a refund; both kinds in both partitions."""
    value = {"n": n, "type": "order" if n % 2 == 0 else "refund"}
    return {"value": json.dumps(value).encode(), "partition": n // 2 % 2}


async def stored(session: AsyncSession) -> Stored:
    """The ``n`` of each asset's events, by asset name."""
    rows = await session.execute(
        select(models.Asset.name, models.AssetEvent.extra).join(
            models.AssetEvent, models.AssetEvent.asset_id == models.Asset.id
        )
    )
    result: Stored = {}
    for name, extra in rows.all():
        body = extra["payload"].get("value") or extra["payload"].get("body")
        result.setdefault(name, []).append(body["n"])
    return {name: sorted(ns) for name, ns in result.items()}


async def watchers(session: AsyncSession) -> dict[str, models.Trigger]:
    """The trigger row of each asset's watcher, by asset name."""
    rows = await session.execute(
        select(models.Asset.name, models.Trigger)
        .join(models.AssetWatcher, models.AssetWatcher.asset_id == models.Asset.id)
        .join(models.Trigger, models.Trigger.id == models.AssetWatcher.trigger_id)
    )
    return {name: trigger for name, trigger in rows.all()}  # noqa: C416 - rows are Row objects


async def watchers_list(env: dict[str, str]) -> dict[str, dict[str, Any]]:
    """``triggerer watchers list --json`` as users run it, by asset."""
    result = await triggerer_cli(env, "watchers", "list", "--json")
    assert result.returncode == 0, result.stderr
    return {row["asset"]: row for row in json.loads(result.stdout)}


async def test_kafka_watchers_with_different_filters_each_see_every_message(
    database_url: str, tmp_path: Path, kafka_broker: str, make_topic: MakeTopic
) -> None:
    topic = await make_topic(partitions=2)
    folder = tmp_path / "pipelines"
    write_pipelines(folder, kafka_pipelines(kafka_broker, topic, "order"))
    settings = daemon_settings(tmp_path, database_url, NO_SPARK)

    async with running_daemon(settings):
        await produce(kafka_broker, topic, (sale(n) for n in range(20)))
        got = await wait_for(
            database_url,
            stored,
            lambda got: len(got.get("orders", [])) >= 10 and len(got.get("everything", [])) >= 20,
            timeout_s=TIMEOUT_S,
        )
        assert got == {"orders": list(range(0, 20, 2)), "everything": list(range(20))}
        done = await wait_for(
            database_url,
            watchers,
            lambda rows: [row.lag for row in rows.values()] == [0, 0],
            timeout_s=TIMEOUT_S,
        )
        listed = await watchers_list(daemon_env(tmp_path, database_url, NO_SPARK))
        groups = {asset: row["consumer_group"] for asset, row in listed.items()}
        assert groups["orders"] == groups["everything"]  # one consumer reads for both
        assert groups["orders"].startswith("triggerer-shared-")
        assert [row["lag"] for row in listed.values()] == [0, 0]

        # Refunds now: the watcher keeps its place, so old refunds are not replayed.
        write_pipelines(folder, kafka_pipelines(kafka_broker, topic, "refund"))
        edited = await wait_for(
            database_url,
            watchers,
            lambda rows: "refund" in json.dumps(rows["orders"].kwargs),
            timeout_s=TIMEOUT_S,
        )
        assert edited["orders"].id != done["orders"].id
        assert edited["orders"].kwargs["group_id"] == done["orders"].kwargs["group_id"]
        await produce(kafka_broker, topic, (sale(n) for n in range(20, 24)))
        got = await wait_for(
            database_url,
            stored,
            lambda got: len(got["orders"]) >= 12 and len(got["everything"]) >= 24,
            timeout_s=TIMEOUT_S,
        )
        # A replay would have stored the old refunds before 21 and 23 (the same partitions).
        assert got == {"orders": [*range(0, 20, 2), 21, 23], "everything": list(range(24))}


def sqs_pipelines(queue_url: str) -> str:
    return f"""
from triggerer import Asset, AssetWatcher
from watchers import SqsTrigger

def sales(kind):
    return SqsTrigger("{queue_url}", wait_time_s=1, max_messages=1,
                      filter={{"path": "$.body.type", "equals": kind}})

orders = Asset("orders", watchers=[AssetWatcher("sales", sales("order"))])
refunds = Asset("refunds", watchers=[AssetWatcher("sales", sales("refund"))])
"""


async def test_sqs_watchers_with_different_filters_share_the_queue_and_each_sees_its_messages(
    database_url: str, tmp_path: Path, moto_server: str, make_sqs_queue: MakeQueue
) -> None:
    from watchers.sqs import send

    queue_url = await make_sqs_queue()
    sent = [{"n": n, "type": ("order", "refund")[n % 2]} for n in range(20)]
    await send(queue_url, [json.dumps(message) for message in sent])
    write_pipelines(tmp_path / "pipelines", sqs_pipelines(queue_url))
    settings = daemon_settings(tmp_path, database_url, NO_SPARK)

    async with running_daemon(settings):
        got = await wait_for(
            database_url,
            stored,
            lambda got: len(got.get("orders", [])) >= 10 and len(got.get("refunds", [])) >= 10,
            timeout_s=TIMEOUT_S,
        )
        rows = await wait_for(
            database_url,
            watchers,
            lambda rows: [row.lag for row in rows.values()] == [0, 0],
            timeout_s=TIMEOUT_S,
        )
        listed = await watchers_list(daemon_env(tmp_path, database_url, NO_SPARK))

    assert got == {"orders": list(range(0, 20, 2)), "refunds": list(range(1, 20, 2))}
    assert {row.state for row in rows.values()} == {"running"}
    assert [row["last_error"] for row in listed.values()] == [None, None]
    # Each message was deleted once both watchers were done with it: the queue is empty.
    assert await query(database_url, stored) == got
    from aiobotocore.session import get_session

    async with get_session().create_client("sqs", endpoint_url=moto_server) as sqs:
        attributes = await sqs.get_queue_attributes(
            QueueUrl=queue_url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )
    assert sum(int(v) for v in attributes["Attributes"].values()) == 0
