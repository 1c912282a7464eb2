"""The demo pipelines: orders arrive on Kafka, customers on SQS.

`make demo` sets TRIGGERER_DEMO_KAFKA (bootstrap servers) and TRIGGERER_DEMO_SQS (queue URL).
"""

import os

from triggerer import Asset, AssetWatcher, Metadata, pipeline
from watchers import MessageQueueTrigger

KAFKA = os.environ.get("TRIGGERER_DEMO_KAFKA", "127.0.0.1:9092")
SQS = os.environ.get("TRIGGERER_DEMO_SQS", "sqs://customers?region=us-east-1")

orders = Asset(
    "orders",
    watchers=[AssetWatcher("orders_topic", MessageQueueTrigger(f"kafka://{KAFKA}/orders"))],
)
customers = Asset("customers", watchers=[AssetWatcher("customers_queue", MessageQueueTrigger(SQS))])
order_totals = Asset("order_totals")


def order_of(event):
    """The order of a Kafka message, or of an event emitted by hand (its extra)."""
    return event.extra["payload"]["value"] if "payload" in event.extra else event.extra


@pipeline(schedule=orders, outlets=[order_totals])
def total_orders(spark, context):
    """Sum the amounts of the orders that triggered this run."""
    orders_seen = [order_of(event) for event in context.triggering_asset_events[orders]]
    rows = [(order["id"], float(order["amount"])) for order in orders_seen]
    frame = spark.createDataFrame(rows, ["id", "amount"])
    total = frame.groupBy().sum("amount").first()[0]
    print(f"{len(rows)} order(s), total {total}")  # noqa: T201 - goes to the run log
    yield Metadata(order_totals, {"orders": len(rows), "total": total})


@pipeline(schedule=orders & customers)
def match_orders_to_customers(spark, context):
    """Runs once both an order and a customer update have arrived."""
    names = [e.extra["payload"]["body"]["name"] for e in context.triggering_asset_events[customers]]
    print(f"customers updated: {names}")  # noqa: T201 - goes to the run log
    spark.createDataFrame([(n,) for n in names], ["name"]).show()


@pipeline(schedule=order_totals)
def publish_report(spark, context):
    """Downstream of total_orders: reads the extra its upstream run attached."""
    for event in context.triggering_asset_events[order_totals]:
        print(f"report: {event.extra}")  # noqa: T201 - goes to the run log
    spark.range(1).count()
