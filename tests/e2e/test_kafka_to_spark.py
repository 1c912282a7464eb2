"""A Kafka message becomes an asset event, a PySpark run, an outlet event, a downstream run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from aiokafka import AIOKafkaProducer

from tests.e2e.daemon import (
    consumed,
    daemon_settings,
    events_of,
    query,
    running_daemon,
    runs,
    wait_for,
    write_pipelines,
)

if TYPE_CHECKING:
    from tests.fixtures.brokers import MakeTopic

PIPELINES = """
    from triggerer import Asset, AssetWatcher, Metadata, pipeline
    from watchers import KafkaTrigger

    orders = Asset("orders", watchers=[AssetWatcher("orders_topic", KafkaTrigger(
        bootstrap_servers="{bootstrap}", topics=["{topic}"], group_id="{topic}-group",
        session_timeout_ms=6000, heartbeat_interval_ms=1000))])
    report = Asset("report")

    @pipeline(schedule=orders, outlets=[report])
    def count_orders(spark, context):
        values = [e.extra["payload"]["value"]["n"] for e in context.triggering_asset_events[orders]]
        total = spark.createDataFrame([(v,) for v in values], ["n"]).groupBy().sum("n").first()[0]
        yield Metadata(report, {{"total": total, "run_id": context.run_id,
                                 "logical_date": context.logical_date}})

    @pipeline(schedule=report)
    def downstream(spark, context):
        assert spark.range(3).count() == 3
"""


async def test_kafka_message_runs_pipeline_and_downstream(
    tmp_path: Path, kafka_broker: str, make_topic: MakeTopic, spark_remote: str
) -> None:
    topic = await make_topic()
    database_url = f"sqlite:///{tmp_path / 'triggerer.db'}"
    write_pipelines(tmp_path / "pipelines", PIPELINES.format(bootstrap=kafka_broker, topic=topic))
    settings = daemon_settings(tmp_path, database_url, spark_remote)

    async with running_daemon(settings):
        producer = AIOKafkaProducer(bootstrap_servers=kafka_broker)
        await producer.start()
        try:
            await producer.send_and_wait(topic, json.dumps({"n": 42}).encode())
        finally:
            await producer.stop()
        finished = await wait_for(
            database_url,
            runs,
            lambda rs: [r.state for r in rs] == ["success", "success"],
            timeout_s=150,
        )

    first, second = finished
    assert (first.pipeline_id, second.pipeline_id) == ("count_orders", "downstream")
    assert first.logical_date is None
    assert second.logical_date is None
    orders = await query(database_url, lambda s: events_of(s, "orders"))
    assert len(orders) == 1
    assert orders[0].extra["from_trigger"] is True
    assert orders[0].extra["payload"]["value"] == {"n": 42}
    assert orders[0].extra["payload"]["topic"] == topic
    report = await query(database_url, lambda s: events_of(s, "report"))
    assert [e.extra for e in report] == [
        {"total": 42, "run_id": first.run_id, "logical_date": None}
    ]
    assert await query(database_url, consumed) == {
        first.run_id: [orders[0].id],
        second.run_id: [report[0].id],
    }
