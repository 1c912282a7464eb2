"""Ingest spans' links written as protobuf bytes into the exported request
(:mod:`triggerer.service.span_links`): what the protocol's own parser reads back is each
context, its tracestate and flags; at most ``max_links`` a span, the rest counted; a request
compressed by the exporter is compressed again, and a retry sends the same bytes."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Callable

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

from triggerer.service.span_links import LinkingSession, PendingLinks, encoded_links
from triggerer.service.trace_context import TraceContext

SAMPLED = TraceContext("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "rojo=1")
UNSAMPLED = TraceContext("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")
LONG_STATE = TraceContext(SAMPLED.traceparent, ",".join(f"k{n}=" + "v" * 40 for n in range(10)))


def _links(contexts: list[TraceContext]) -> list[tuple[str, str, str, int]]:
    span = Span.FromString(encoded_links(contexts))
    return [
        (link.trace_id.hex(), link.span_id.hex(), link.trace_state, link.flags)
        for link in span.links
    ]


def test_each_context_is_a_remote_link_with_its_state_and_flags() -> None:
    assert _links([SAMPLED, UNSAMPLED, LONG_STATE]) == [
        (SAMPLED.trace_id, SAMPLED.span_id, "rojo=1", 0x301),
        (UNSAMPLED.trace_id, UNSAMPLED.span_id, "", 0x300),
        # A tracestate of over 127 bytes: a length of two bytes.
        (SAMPLED.trace_id, SAMPLED.span_id, LONG_STATE.tracestate, 0x301),
    ]
    assert encoded_links([]) == b""


def _request(*span_ids: int) -> ExportTraceServiceRequest:
    spans = [Span(name=f"s{span_id}", span_id=span_id.to_bytes(8, "big")) for span_id in span_ids]
    return ExportTraceServiceRequest(
        resource_spans=[ResourceSpans(scope_spans=[ScopeSpans(spans=spans)])]
    )


def _sent(request: ExportTraceServiceRequest) -> dict[str, tuple[int, int]]:
    """By span name: its links and dropped links."""
    return {
        span.name: (len(span.links), span.dropped_links_count)
        for resource_spans in request.resource_spans
        for scope_spans in resource_spans.scope_spans
        for span in scope_spans.spans
    }


def test_a_span_gets_its_links_at_most_max_links_and_the_rest_counted() -> None:
    pending = PendingLinks(max_spans=10, max_links=2)
    pending.put(1, [SAMPLED, UNSAMPLED, SAMPLED])
    pending.put(2, [UNSAMPLED])
    request = _request(1, 2, 3)
    assert pending.add_to(request)
    assert _sent(request) == {"s1": (2, 1), "s2": (1, 0), "s3": (0, 0)}
    assert not pending  # sent once
    assert not pending.add_to(_request(1, 2))


def test_the_links_of_spans_never_sent_go_oldest_first() -> None:
    pending = PendingLinks(max_spans=2, max_links=10)
    for span_id in (1, 2, 3):
        pending.put(span_id, [SAMPLED])
    request = _request(1, 2, 3)
    pending.add_to(request)
    assert _sent(request) == {"s1": (0, 0), "s2": (1, 0), "s3": (1, 0)}


@pytest.mark.parametrize(
    ("encoding", "compress", "decompress"),
    [
        (None, lambda data: data, lambda data: data),
        ("gzip", gzip.compress, gzip.decompress),
        ("deflate", zlib.compress, zlib.decompress),
    ],
)
def test_the_session_adds_the_links_to_the_request_as_sent_and_resends_a_retry_alike(
    encoding: str | None,
    compress: Callable[[bytes], bytes],
    decompress: Callable[[bytes], bytes],
) -> None:
    pending = PendingLinks(max_spans=10, max_links=10)
    pending.put(7, [SAMPLED])
    session = LinkingSession(pending)
    data = compress(_request(7).SerializeToString())
    headers = {"Content-Encoding": encoding} if encoding else {}

    linked = session._linked(data, headers)
    assert _sent(ExportTraceServiceRequest.FromString(decompress(linked))) == {"s7": (1, 0)}
    assert session._linked(data, headers) is linked  # the exporter's retry of the same request
    other = compress(_request(8).SerializeToString())
    assert session._linked(other, headers) is other  # nothing to add: sent as it was
