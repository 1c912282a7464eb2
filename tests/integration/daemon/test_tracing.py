"""Trace context through ingest on the real store, and the spans ``[tracing]`` exports to an
OTLP/HTTP receiver: each event keeps the context its message carried (tracing on or off), or
its CloudEvent's tracing extension, a batch's span links each message's context, a run's span
links each event it consumed."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.fixtures.ingest import ingest_all, watched_inbox
from triggerer.cloudevents import of_json
from triggerer.service.config import TracingSettings
from triggerer.service.daemon.ingest import Delivery, Ingest
from triggerer.service.store import models, session_factory
from triggerer.service.trace_context import TraceContext
from triggerer.service.tracing import Consumed, Tracing, now_ns, start
from triggerer.triggers import TriggerEvent

if TYPE_CHECKING:
    from tests.fixtures.otlp import OtlpReceiver

T1 = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
T2 = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
XRAY = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
FROM_XRAY = "00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-01"

PAYLOADS: dict[str, Any] = {
    "kafka-like": {"value": 1, "headers": {"traceparent": T1, "tracestate": "rojo=1"}},
    "sqs-like": {"body": 2, "message_attributes": {}, "attributes": {"AWSTraceHeader": XRAY}},
    "mqtt-like": {"body": 3, "user_properties": {"traceparent": T2}},
    "invalid": {"value": 4, "headers": {"traceparent": "00-not-a-context"}},
    "none": {"value": 5, "headers": {}},
    # CloudEvents (below): their tracing extension when the transport carried no context.
    "cloudevent": {"value": 6, "headers": {"ce_traceparent": T2, "ce_tracestate": "congo=2"}},
    "cloudevent-and-transport": {"value": 7, "headers": {"traceparent": T1}},
}
CLOUDEVENTS = {
    key: of_json({"specversion": "1.0", "id": key, "source": "/s", "type": "t", **extensions})
    for key, extensions in {
        "cloudevent": {"traceparent": T2, "tracestate": "congo=2"},
        "cloudevent-and-transport": {"traceparent": T2},
    }.items()
}
STORED = {
    "kafka-like": (T1, "rojo=1"),
    "sqs-like": (FROM_XRAY, None),
    "mqtt-like": (T2, None),
    "invalid": (None, None),
    "none": (None, None),
    "cloudevent": (T2, "congo=2"),
    "cloudevent-and-transport": (T1, None),
}


def _tracing(receiver: OtlpReceiver) -> Tracing:
    settings = TracingSettings(exporter="otlp", endpoint=receiver.endpoint, export_delay_s=0.1)
    tracing = start(settings, "test-instance")
    assert tracing is not None
    return tracing


async def _ingest(
    engine: AsyncEngine, tmp_path: Path, tracing: Tracing | None
) -> dict[str, tuple[str | None, str | None]]:
    """Ingest one message of each of ``PAYLOADS``; the trace context stored by dedup key."""
    sessions = session_factory(engine)
    watched = await watched_inbox(sessions, tmp_path)
    deliveries: list[Delivery] = [
        (watched, TriggerEvent(payload, dedup_key=key, cloudevent=CLOUDEVENTS.get(key)))
        for key, payload in PAYLOADS.items()
    ]
    ingest = Ingest(sessions, lambda recorded: None, batch_size=100, tracing=tracing)
    await ingest_all(ingest, deliveries)
    async with sessions() as session:
        rows = await session.execute(
            select(
                models.AssetEvent.dedup_key,
                models.AssetEvent.traceparent,
                models.AssetEvent.tracestate,
            )
        )
        return {key: (parent, state) for key, parent, state in rows.all()}


async def test_each_event_keeps_the_trace_context_its_message_carried_tracing_off(
    migrated_engine: AsyncEngine, tmp_path: Path
) -> None:
    assert await _ingest(migrated_engine, tmp_path, tracing=None) == STORED


@pytest.mark.parametrize("db_backend", ["sqlite"])
async def test_a_batch_is_a_consumer_span_linking_each_messages_context(
    migrated_engine: AsyncEngine, tmp_path: Path, otlp_receiver: OtlpReceiver
) -> None:
    tracing = _tracing(otlp_receiver)
    assert await _ingest(migrated_engine, tmp_path, tracing) == STORED
    await tracing.shutdown()

    [span] = otlp_receiver.received_spans()
    assert (span.name, span.kind) == (f"process {tmp_path / 'inbox'}", "consumer")
    assert span.attributes == {
        "messaging.operation.type": "process",
        "messaging.operation.name": "ingest",
        "messaging.batch.message_count": 7,
        "messaging.system": "file",
        "messaging.destination.name": str(tmp_path / "inbox"),
    }
    # A link per message that carried a valid context, in the batch's order, remote, with
    # its sampled flag and its tracestate.
    links = [(link.span, link.trace_state, link.attributes, link.flags) for link in span.links]
    assert links == [
        (_ids(T1), "rojo=1", {}, 0x301),
        (_ids(FROM_XRAY), "", {}, 0x301),
        (_ids(T2), "", {}, 0x300),
        (_ids(T2), "congo=2", {}, 0x300),
        (_ids(T1), "", {}, 0x301),
    ]
    assert span.dropped_links == 0
    assert span.resource["service.name"] == "triggerer"
    assert span.resource["service.instance.id"] == "test-instance"
    assert span.start_ns < span.end_ns


async def test_a_runs_span_links_every_event_it_consumed_and_hands_on_its_own_context(
    otlp_receiver: OtlpReceiver,
) -> None:
    tracing = _tracing(otlp_receiver)
    consumed = [
        Consumed(1, "orders", TraceContext(T1, "rojo=1")),
        Consumed(2, "orders", None),  # an event that came with no context: nothing to link
        Consumed(3, "stock", TraceContext(T2)),
        Consumed(4, "stock", TraceContext(T2)),  # the same context again: a link of its own
    ]
    run = tracing.run_started(
        run_id="r-1", pipeline_id="report", try_number=2, consumed=consumed, started_ns=now_ns()
    )
    run.end("failed", "ValueError: bad row")
    await tracing.shutdown()

    [span] = otlp_receiver.received_spans()
    assert run.context is not None
    assert (run.context.trace_id, run.context.span_id, run.context.sampled) == (*span.context, True)
    assert (span.name, span.kind, span.parent_span_id) == ("run report", "consumer", "")
    assert span.attributes == {
        "triggerer.run.id": "r-1",
        "triggerer.pipeline.id": "report",
        "triggerer.run.try_number": 2,
        "triggerer.run.events": 4,
        "triggerer.run.state": "failed",
    }
    assert (span.status, span.status_message) == ("error", "ValueError: bad row")
    linked = [(link.span, link.attributes) for link in span.links]
    assert linked == [
        (_ids(T1), {"triggerer.event.id": 1, "triggerer.asset": "orders"}),
        (_ids(T2), {"triggerer.event.id": 3, "triggerer.asset": "stock"}),
        (_ids(T2), {"triggerer.event.id": 4, "triggerer.asset": "stock"}),
    ]


def _ids(traceparent: str) -> tuple[str, str]:
    context = TraceContext(traceparent)
    return context.trace_id, context.span_id


def test_tracing_is_off_by_default() -> None:
    assert start(TracingSettings(), "test-instance") is None


def test_with_tracing_off_the_daemon_imports_nothing_of_opentelemetry() -> None:
    # What a daemon imports as it starts (its modules, every installed provider), in a new
    # interpreter: with exporter = "none", not one module of OpenTelemetry.
    script = textwrap.dedent(
        """
        import sys
        from triggerer.service.config import TracingSettings
        from triggerer.service.daemon import service
        from triggerer.service.tracing import start
        from watchers import providers

        providers.installed()
        assert start(TracingSettings(), "test-instance") is None
        print(sorted(name for name in sys.modules if name.startswith("opentelemetry")))
        """
    )
    command = [sys.executable, "-c", script]
    done = subprocess.run(command, capture_output=True, text=True, check=True)  # noqa: S603
    assert done.stdout.strip() == "[]"
