"""Trace context through ``triggerer run --config`` with ``[tracing]`` pointed at an OTLP/HTTP
receiver: a Kafka message carrying trace T is an event keeping T, its ingest span and its run's
span link T; the run sees its own span's context (``context.trace_context`` and
``TRACEPARENT``) and its outlet event carries it, so the downstream run's span links the first
run's; three events posted to the REST API with three traceparent headers keep them, and the
one run over them links all three."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import httpx

from tests.e2e.daemon import ORDERS, Deployment, events_of, runs
from triggerer.service.trace_context import TraceContext
from watchers.kafka import send

if TYPE_CHECKING:
    from tests.fixtures.otlp import OtlpReceiver, Span

PIPELINES = """
    import os

    from triggerer import Batch

    report = Asset("report")
    posted = Asset("posted")

    @pipeline(schedule=orders, outlets=[report])
    def traced(spark, context):
        assert spark.range(3).count() == 3
        seen = {{"trace_context": context.trace_context, "env": os.environ.get("TRACEPARENT")}}
        yield Metadata(report, seen)

    @pipeline(schedule=report)
    def downstream(spark, context):
        assert spark.range(1).count() == 1

    @pipeline(schedule=posted, batch=Batch(max_events=3, max_wait_s=3600))
    def batched(spark, context):
        assert len(context.triggering_asset_events[posted]) == 3
"""

MESSAGE = TraceContext("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "rojo=1")
POSTED = [
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-00",
    "00-c0ffee00c0ffee00c0ffee00c0ffee00-1234567890abcdef-01",
]
RUNS_TIMEOUT_S = 300.0
"""How long the three runs may take: a run's first Spark job took 110 s on a loaded machine."""


def ids(traceparent: str) -> tuple[str, str]:
    context = TraceContext(traceparent)
    return context.trace_id, context.span_id


def one_run_span(spans: list[Span], pipeline_id: str) -> Span:
    [span] = [span for span in spans if span.name == f"run {pipeline_id}"]
    return span


def have_every_span(spans: list[Span]) -> bool:
    names = {span.name for span in spans}
    return {"run traced", "run downstream", "run batched"} <= names and any(
        name.startswith("process ") for name in names
    )


async def test_a_messages_trace_reaches_its_run_the_runs_outlet_and_the_downstream_run(
    deployment: Deployment, otlp_receiver: OtlpReceiver
) -> None:
    deployment.write_pipelines(ORDERS + PIPELINES)
    config = deployment.config_file(
        api={"enabled": True, "port": 0},
        # Sent every 0.2 s, so the test need not wait for the default 5 s.
        tracing={"exporter": "otlp", "endpoint": otlp_receiver.endpoint, "export_delay_s": 0.2},
    )
    with deployment.process_with_config(config) as daemon:
        daemon.start()
        [listening] = await daemon.wait_logged("api_listening")
        await daemon.wait_logged("pipelines_loaded")
        await send(
            f"kafka://{deployment.bootstrap}/{deployment.topic}",
            [json.dumps({"n": 1})],
            headers={"traceparent": MESSAGE.traceparent, "tracestate": "rojo=1"},
        )
        async with httpx.AsyncClient(base_url=str(listening["url"])) as client:
            for traceparent in POSTED:
                response = await client.post(
                    "/assets/events", json={"uri": "posted"}, headers={"traceparent": traceparent}
                )
                assert response.status_code == 201, response.text
        finished = await deployment.wait_for(
            runs,
            lambda rs: (
                sorted(r.pipeline_id for r in rs if r.state == "success")
                == ["batched", "downstream", "traced"]
            ),
            timeout_s=RUNS_TIMEOUT_S,
        )
        spans = await otlp_receiver.wait_for(have_every_span)

    # The message's event keeps its context; its ingest span links it.
    [order] = await deployment.query(lambda s: events_of(s, "orders"))
    assert (order.traceparent, order.tracestate) == (MESSAGE.traceparent, "rojo=1")
    [ingested] = [s for s in spans if s.name.startswith("process ")]
    assert (ingested.name, ingested.kind) == (f"process {deployment.topic}", "consumer")
    assert ingested.attributes["messaging.system"] == "kafka"
    assert ingested.attributes["messaging.destination.name"] == deployment.topic
    [link] = ingested.links
    assert (link.span, link.trace_state) == (ids(MESSAGE.traceparent), "rojo=1")

    # The run's span links the message's context, and the run saw the span's own.
    traced = one_run_span(spans, "traced")
    assert [link.span for link in traced.links] == [ids(MESSAGE.traceparent)]
    assert traced.attributes["triggerer.pipeline.id"] == "traced"
    assert traced.attributes["triggerer.run.state"] == "success"
    assert traced.attributes["triggerer.run.try_number"] == 1
    [report] = await deployment.query(lambda s: events_of(s, "report"))
    seen = report.extra
    assert seen["trace_context"] == seen["env"] == report.traceparent
    assert ids(seen["trace_context"]) == traced.context
    assert traced.attributes["triggerer.run.id"] == next(
        run.run_id for run in finished if run.pipeline_id == "traced"
    )

    # The downstream run's span links the first run's, through the outlet event.
    downstream = one_run_span(spans, "downstream")
    assert [link.span for link in downstream.links] == [traced.context]

    # Posted events keep their requests' contexts; the one run over the three links them all.
    posted = await deployment.query(lambda s: events_of(s, "posted"))
    assert [event.traceparent for event in posted] == POSTED
    batched = one_run_span(spans, "batched")
    assert [link.span for link in batched.links] == [ids(parent) for parent in POSTED]
    assert [link.attributes["triggerer.event.id"] for link in batched.links] == [
        event.id for event in posted
    ]
    assert batched.attributes["triggerer.run.events"] == 3
