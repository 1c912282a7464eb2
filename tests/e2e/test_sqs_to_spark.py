"""An SQS message becomes an asset event, a PySpark run, an outlet event, a downstream run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from aiobotocore.session import get_session

from tests.e2e.daemon import (
    consumed,
    daemon_settings,
    events_of,
    query,
    running_daemon,
    runs,
    sqlite_url,
    wait_for,
    write_pipelines,
)

if TYPE_CHECKING:
    from tests.fixtures.brokers import MakeQueue

PIPELINES = """
    from triggerer import Asset, AssetWatcher, Metadata, pipeline
    from watchers import SqsTrigger

    orders = Asset("sqs_orders", watchers=[AssetWatcher("orders_queue", SqsTrigger(
        "{queue_url}", endpoint_url="{endpoint}", region_name="us-east-1", wait_time_s=1))])
    report = Asset("sqs_report")

    @pipeline(schedule=orders, outlets=[report])
    def sum_quantities(spark, context):
        bodies = [e.extra["payload"]["body"] for e in context.triggering_asset_events[orders]]
        rows = [(item["sku"], item["qty"]) for body in bodies for item in body["items"]]
        total = spark.createDataFrame(rows, ["sku", "qty"]).groupBy().sum("qty").first()[0]
        yield Metadata(report, {{"order_id": bodies[0]["order_id"], "total_qty": total,
                                 "run_id": context.run_id}})

    @pipeline(schedule=report)
    def downstream(spark, context):
        (event,) = context.triggering_asset_events[report]
        assert event.extra["total_qty"] == 5, event.extra
        assert spark.range(3).count() == 3
"""

BODY = {"order_id": "o-17", "items": [{"sku": "a", "qty": 2}, {"sku": "b", "qty": 3}]}


async def test_sqs_message_runs_pipeline_and_downstream(
    tmp_path: Path, moto_server: str, make_sqs_queue: MakeQueue, spark_remote: str
) -> None:
    queue_url = await make_sqs_queue()
    database_url = sqlite_url(tmp_path)
    write_pipelines(
        tmp_path / "pipelines", PIPELINES.format(queue_url=queue_url, endpoint=moto_server)
    )
    settings = daemon_settings(tmp_path, database_url, spark_remote)

    async with (
        get_session().create_client(
            "sqs", endpoint_url=moto_server, region_name="us-east-1"
        ) as sqs,
        running_daemon(settings),
    ):
        sent = await sqs.send_message(
            QueueUrl=queue_url,
            MessageBody=json.dumps(BODY),
            MessageAttributes={"source": {"DataType": "String", "StringValue": "shop"}},
        )
        finished = await wait_for(
            database_url,
            runs,
            lambda rs: [r.state for r in rs] == ["success", "success"],
            timeout_s=90,
        )
        # Acked only after the event was committed: the message is gone from the queue.
        left = await sqs.get_queue_attributes(
            QueueUrl=queue_url,
            AttributeNames=[
                "ApproximateNumberOfMessages",
                "ApproximateNumberOfMessagesNotVisible",
            ],
        )

    assert left["Attributes"] == {
        "ApproximateNumberOfMessages": "0",
        "ApproximateNumberOfMessagesNotVisible": "0",
    }
    first, second = finished
    assert (first.pipeline_id, second.pipeline_id) == ("sum_quantities", "downstream")
    assert first.logical_date is None
    orders = await query(database_url, lambda s: events_of(s, "sqs_orders"))
    assert len(orders) == 1
    attributes = orders[0].extra["payload"]["attributes"]
    assert orders[0].extra == {
        "from_trigger": True,
        "payload": {
            "message_id": sent["MessageId"],
            "body": BODY,
            "attributes": attributes,
            "message_attributes": {"source": "shop"},
        },
    }
    assert attributes["ApproximateReceiveCount"] == "1"
    assert "SentTimestamp" in attributes
    report = await query(database_url, lambda s: events_of(s, "sqs_report"))
    assert [e.extra for e in report] == [
        {"order_id": "o-17", "total_qty": 5, "run_id": first.run_id}
    ]
    assert await query(database_url, consumed) == {
        first.run_id: [orders[0].id],
        second.run_id: [report[0].id],
    }
