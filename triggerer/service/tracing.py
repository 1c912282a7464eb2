"""OpenTelemetry spans of ingest and runs, exported over OTLP/HTTP (``[tracing] exporter =
"otlp"``; docs/tracing.md).

With ``exporter = "none"`` (the default) :func:`start` returns None and nothing of OpenTelemetry
is imported: ingest and the launcher skip every step of tracing on that None. Otherwise the
spans are made with the OpenTelemetry SDK and handed to its ``BatchSpanProcessor``, whose own
thread serializes and sends them, so the event loop only creates and ends spans.

- A span per ingested batch (kind consumer, ``process <destination>``), linked to the trace
  context each of its messages carried (:mod:`triggerer.service.trace_context`); its links
  are written into the exported request as bytes (:mod:`triggerer.service.span_links`), a
  fraction of what the SDK's own encoding of a link costs.
- A span per try of a run (kind consumer, ``run <pipeline id>``), from its claim to its end
  recorded, linked to the context of each event it consumed; its own context is handed to the
  run's process and carried by the outlet events it emits.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio

from triggerer.service.trace_context import TraceContext

if TYPE_CHECKING:
    from opentelemetry.trace import Link, Span, Tracer

    from triggerer.service.config import TracingSettings
    from triggerer.triggers import BaseEventTrigger

SHUTDOWN_S = 15.0
"""How long the daemon waits, as it stops, for the last spans to be sent."""
# The semantic conventions' names of the providers' systems; others go by their package name.
_SYSTEMS = {"sqs": "aws_sqs", "kinesis": "aws_kinesis", "pubsub": "gcp_pubsub"}
# A trigger's argument that names what it reads, the first of these it has.
_DESTINATIONS = (
    "topics",
    "queue",
    "subscription",
    "subject",
    "stream",
    "channel",
    "uri",
    "directory",
)


@dataclasses.dataclass(frozen=True, slots=True)
class Consumed:
    """One event a run consumed, as its span links it."""

    event_id: int
    asset: str
    context: TraceContext | None


def start(settings: TracingSettings, instance_id: str) -> Tracing | None:
    """The daemon's tracing as ``settings`` configure it; None when off."""
    if settings.exporter == "none":
        return None
    return Tracing(settings, instance_id)


def now_ns() -> int:
    """The time a span starts, as OpenTelemetry takes it."""
    return time.time_ns()


class Tracing:
    """Makes the daemon's spans and exports them in the background."""

    def __init__(self, settings: TracingSettings, instance_id: str) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import SpanLimits, TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        from triggerer.service.span_links import LinkingSession, PendingLinks

        version = _version()
        service = {"service.name": settings.service_name, "service.instance.id": instance_id}
        resource = Resource.create(service | ({"service.version": version} if version else {}))
        # Not the global provider: a library's own instrumentation is not sent here.
        self._provider = TracerProvider(
            resource=resource, span_limits=SpanLimits(max_links=settings.max_links)
        )
        # Ingest spans' links, written into the requests as they are sent.
        self._links = PendingLinks(
            max_spans=settings.max_queued_spans, max_links=settings.max_links
        )
        exporter = OTLPSpanExporter(
            endpoint=settings.endpoint,
            headers=dict(settings.headers) or None,
            timeout=settings.timeout_s,
            session=LinkingSession(self._links),
        )
        self._provider.add_span_processor(
            BatchSpanProcessor(
                exporter,
                max_queue_size=settings.max_queued_spans,
                schedule_delay_millis=settings.export_delay_s * 1000,
            )
        )
        self._tracer: Tracer = self._provider.get_tracer("triggerer", version)
        # By trigger id (one serialized trigger, so one source): messaging.system and
        # messaging.destination.name.
        self._sources: dict[int, tuple[str, str | None]] = {}

    def batch_ingested(
        self,
        triggers: Mapping[int, BaseEventTrigger],
        messages: int,
        contexts: Sequence[TraceContext],
        started_ns: int,
    ) -> None:
        """A span from ``started_ns`` to now for a batch ingest committed and acked: its
        ``messages``, read by ``triggers`` (by trigger id), linked to ``contexts``, those its
        messages carried."""
        from opentelemetry.trace import SpanKind

        sources = {self._source(trigger_id, trigger) for trigger_id, trigger in triggers.items()}
        attributes: dict[str, Any] = {
            "messaging.operation.type": "process",
            "messaging.operation.name": "ingest",
            "messaging.batch.message_count": messages,
        }
        name = "process"
        if len(sources) == 1:
            [(system, destination)] = sources
            attributes["messaging.system"] = system
            if destination is not None:
                attributes["messaging.destination.name"] = destination
                name = f"process {destination}"
        span = self._tracer.start_span(
            name, kind=SpanKind.CONSUMER, attributes=attributes, start_time=started_ns
        )
        if contexts and span.is_recording():
            self._links.put(span.get_span_context().span_id, contexts)
        span.end()

    def run_started(
        self,
        *,
        run_id: str,
        pipeline_id: str,
        try_number: int,
        consumed: Sequence[Consumed],
        started_ns: int,
    ) -> RunSpan:
        """The span of a try of a run that started at ``started_ns``, linked to the context of
        each event it consumed (one link per event, equal contexts too)."""
        from opentelemetry.trace import SpanKind

        links = [
            _link(
                event.context,
                {"triggerer.event.id": event.event_id, "triggerer.asset": event.asset},
            )
            for event in consumed
            if event.context is not None
        ]
        span = self._tracer.start_span(
            f"run {pipeline_id}",
            kind=SpanKind.CONSUMER,
            attributes={
                "triggerer.run.id": run_id,
                "triggerer.pipeline.id": pipeline_id,
                "triggerer.run.try_number": try_number,
                "triggerer.run.events": len(consumed),
            },
            links=links,
            start_time=started_ns,
        )
        return RunSpan(span)

    async def shutdown(self) -> None:
        """Send the spans still waiting (for :data:`SHUTDOWN_S` at most), then stop."""
        with anyio.move_on_after(SHUTDOWN_S):
            await anyio.to_thread.run_sync(self._provider.shutdown, abandon_on_cancel=True)

    def _source(self, trigger_id: int, trigger: BaseEventTrigger) -> tuple[str, str | None]:
        source = self._sources.get(trigger_id)
        if source is None:
            source = self._sources[trigger_id] = _source(trigger)
        return source


class RunSpan:
    """The span of a try of a run, ended by :meth:`end`."""

    def __init__(self, span: Span) -> None:
        self._span = span
        context = span.get_span_context()
        #: What the run's process and its outlet events carry: None when the SDK is disabled
        #: (``OTEL_SDK_DISABLED``) and makes no valid span.
        self.context: TraceContext | None = (
            TraceContext(
                f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
            )
            if context.is_valid
            else None
        )

    def end(self, state: str | None, error: str | None) -> None:
        """End the span with the state the try left the run in (None: not recorded here, the
        run was taken over), and its error."""
        from opentelemetry.trace import Status, StatusCode

        if state is not None:
            self._span.set_attribute("triggerer.run.state", state)
        if error is not None:
            self._span.set_status(Status(StatusCode.ERROR, error))
        self._span.end()


def _version() -> str | None:
    try:
        return importlib.metadata.version("triggerer")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree not installed
        return None


def _link(context: TraceContext, attributes: dict[str, Any]) -> Link:
    """A link to the remote span of ``context``."""
    from opentelemetry.trace import Link, SpanContext, TraceFlags, TraceState

    parent = context.traceparent
    state = TraceState.from_header([context.tracestate]) if context.tracestate else None
    span_context = SpanContext(
        trace_id=int(parent[3:35], 16),
        span_id=int(parent[36:52], 16),
        is_remote=True,
        trace_flags=TraceFlags(int(parent[53:55], 16)),
        trace_state=state,
    )
    return Link(span_context, attributes)


def _source(trigger: BaseEventTrigger) -> tuple[str, str | None]:
    """The messaging system of ``trigger`` (its provider's, e.g. ``kafka``, ``aws_sqs``; a
    trigger of another package: its classpath) and what it reads (its topics, queue,
    subscription ...), when one of its arguments names it."""
    classpath, kwargs = trigger.serialize()
    package, _, rest = classpath.partition(".")
    provider = rest.partition(".")[0]
    system = _SYSTEMS.get(provider, provider) if package == "watchers" and rest else classpath
    for key in _DESTINATIONS:
        value = kwargs.get(key)
        if isinstance(value, list) and value:
            return system, ",".join(map(str, value))
        if isinstance(value, str) and value:
            return system, value
    return system, None
