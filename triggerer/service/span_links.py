"""The links of ingest spans, written as protobuf bytes into the request that exports them.

OpenTelemetry's OTLP encoder builds each link of a span as Python objects, about 4 µs a link
in all (the SDK's ``Link``, its limits, the protobuf message), several times what the rest of
a message costs ingest when the store is PostgreSQL. An ingest span links every message of its
batch, so its links are kept aside instead (:class:`PendingLinks`, by span id, as the span
ends), and :class:`LinkingSession`, the HTTP session the OTLP exporter sends through (its
``session`` argument), writes them into the encoded request: a link is 35 bytes or so of
``Span.links`` made from the ``traceparent``'s hex digits, merged into its span by the
protobuf runtime. About 0.6 µs a link, in the exporter's thread. Only the links move: the span, its
attributes and everything the exporter does (retries, compression, headers) stay the SDK's.
"""

from __future__ import annotations

import gzip
import threading
import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import requests
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

if TYPE_CHECKING:
    from triggerer.service.trace_context import TraceContext

# Span.links is field 13, a Link's trace_id 1, span_id 2, trace_state 3, flags 6 (fixed32);
# Span.dropped_links_count is field 14 (opentelemetry/proto/trace/v1/trace.proto). A link's
# flags beside the W3C trace flags (the low byte): its remoteness is known (0x100) and it is
# remote (0x200), as the SDK's encoder sets them for a context read from a message.
_LINKS_TAG = b"\x6a"
_TRACE_ID_TAG = b"\x0a\x10"
_SPAN_ID_TAG = b"\x12\x08"
_TRACE_STATE_TAG = b"\x1a"
_FLAGS_TAG = b"\x35"
_REMOTE = b"\x03\x00\x00"
"""The flags' three high bytes (little-endian): 0x300."""


def encoded_links(contexts: Sequence[TraceContext]) -> bytes:
    """``contexts`` as the bytes of a span's ``links`` field, one link each."""
    # A link without a tracestate is 35 bytes: the field's tag and length (0x21), the trace
    # id's tag and 16 bytes, the span id's tag and 8 bytes, the flags' tag and 4 bytes. Written
    # as hex from the traceparent's own hex digits, and turned into bytes once for them all.
    hexes = []
    for context in contexts:
        parent = context.traceparent
        if context.tracestate:
            hexes.append(_link_with_state(parent, context.tracestate).hex())
        else:
            hexes.append(f"6a210a10{parent[3:35]}1208{parent[36:52]}35{parent[53:55]}030000")
    return bytes.fromhex("".join(hexes))


def _link_with_state(parent: str, state: str) -> bytes:
    link = b"".join(
        (
            _TRACE_ID_TAG,
            bytes.fromhex(parent[3:35]),
            _SPAN_ID_TAG,
            bytes.fromhex(parent[36:52]),
            _field(_TRACE_STATE_TAG, state.encode()),
            _FLAGS_TAG,
            bytes.fromhex(parent[53:55]),
            _REMOTE,
        )
    )
    return _field(_LINKS_TAG, link)


def _field(tag: bytes, value: bytes) -> bytes:
    """A length-delimited field: its tag, the length as a varint, the bytes."""
    length = len(value)
    varint = bytearray()
    while length > 0x7F:
        varint.append(length & 0x7F | 0x80)
        length >>= 7
    varint.append(length)
    return tag + bytes(varint) + value


class PendingLinks:
    """The links of spans that have ended but are not sent yet, by span id.

    At most ``max_spans`` spans' links are kept: a span the SDK drops unsent (its queue full)
    would otherwise leave its links here for ever; the oldest go first. A span keeps at most
    ``max_links`` links; the rest are counted in its ``dropped_links_count``.
    """

    def __init__(self, *, max_spans: int, max_links: int) -> None:
        self._max_spans = max_spans
        self._max_links = max_links
        self._lock = threading.Lock()
        self._by_span: dict[int, Sequence[TraceContext]] = {}

    def put(self, span_id: int, contexts: Sequence[TraceContext]) -> None:
        with self._lock:
            self._by_span[span_id] = contexts
            if len(self._by_span) > self._max_spans:
                del self._by_span[next(iter(self._by_span))]

    def __bool__(self) -> bool:
        return bool(self._by_span)

    def add_to(self, request: ExportTraceServiceRequest) -> bool:
        """Write into the spans of ``request`` the links kept for them; whether it has any."""
        added = False
        for resource_spans in request.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    with self._lock:
                        contexts = self._by_span.pop(int.from_bytes(span.span_id, "big"), None)
                    if contexts:
                        span.MergeFromString(encoded_links(contexts[: self._max_links]))
                        span.dropped_links_count = max(0, len(contexts) - self._max_links)
                        added = True
        return added


class LinkingSession(requests.Session):
    """The OTLP exporter's HTTP session: each traces request it sends gains the links
    :class:`PendingLinks` keeps for its spans (a retry of a request sends the same bytes)."""

    def __init__(self, pending: PendingLinks) -> None:
        super().__init__()
        self._pending = pending
        self._last: tuple[bytes, bytes] | None = None

    def request(self, method: str, url: Any, *args: Any, **kwargs: Any) -> requests.Response:
        data = kwargs.get("data")
        if isinstance(data, bytes):
            kwargs["data"] = self._linked(data, kwargs.get("headers") or {})
        return super().request(method, url, *args, **kwargs)

    def _linked(self, data: bytes, headers: dict[str, str]) -> bytes:
        if self._last is not None and self._last[0] is data:
            return self._last[1]
        if not self._pending:
            return data
        encoding = headers.get("Content-Encoding") or self.headers.get("Content-Encoding")
        body = gzip.decompress(data) if encoding == "gzip" else data
        body = zlib.decompress(body) if encoding == "deflate" else body
        request = ExportTraceServiceRequest.FromString(body)
        if not self._pending.add_to(request):
            return data
        linked: bytes = request.SerializeToString()
        if encoding == "gzip":
            linked = gzip.compress(linked)
        elif encoding == "deflate":
            linked = zlib.compress(linked)
        self._last = (data, linked)
        return linked
