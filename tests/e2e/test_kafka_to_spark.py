"""A Kafka message becomes an asset event, a PySpark run, an outlet event, a downstream run."""

from __future__ import annotations

from tests.e2e.daemon import ORDERS, Deployment, consumed, events_of, runs

PIPELINES = """
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


async def test_kafka_message_runs_pipeline_and_downstream(deployment: Deployment) -> None:
    deployment.write_pipelines(ORDERS + PIPELINES)

    async with deployment.running():
        await deployment.produce([{"n": 42}])
        finished = await deployment.wait_for(
            runs, lambda rs: [r.state for r in rs] == ["success", "success"], timeout_s=150
        )

    first, second = finished
    assert (first.pipeline_id, second.pipeline_id) == ("count_orders", "downstream")
    assert first.logical_date is None
    assert second.logical_date is None
    orders = await deployment.query(lambda s: events_of(s, "orders"))
    assert len(orders) == 1
    assert orders[0].extra["from_trigger"] is True
    assert orders[0].extra["payload"]["value"] == {"n": 42}
    assert orders[0].extra["payload"]["topic"] == deployment.topic
    report = await deployment.query(lambda s: events_of(s, "report"))
    assert [e.extra for e in report] == [
        {"total": 42, "run_id": first.run_id, "logical_date": None}
    ]
    assert await deployment.query(consumed) == {
        first.run_id: [orders[0].id],
        second.run_id: [report[0].id],
    }
