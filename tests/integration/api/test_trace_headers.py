"""``POST /assets/events`` keeps the W3C trace context of the request's ``traceparent`` (and
``tracestate``) headers with the event, answered ahead of the route or by it; an invalid one
is ignored, never an error."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.integration.api.conftest import Api

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


# application/json is answered ahead of FastAPI's routing (event_posts.py); another JSON type
# goes to the route.
@pytest.mark.parametrize("content_type", ["application/json", "application/merge-patch+json"])
@pytest.mark.parametrize(
    ("headers", "stored"),
    [
        ({"traceparent": PARENT, "tracestate": "rojo=1"}, (PARENT, "rojo=1")),
        ({"Traceparent": f" {PARENT} "}, (PARENT, None)),
        ({"traceparent": PARENT, "tracestate": "Not Valid"}, (PARENT, None)),
        ({"traceparent": "00-not-a-context", "tracestate": "rojo=1"}, (None, None)),
        ({}, (None, None)),
    ],
)
async def test_a_posted_event_keeps_its_requests_trace_context(
    api: Api, content_type: str, headers: dict[str, str], stored: tuple[str | None, str | None]
) -> None:
    response = await api.client.post(
        "/assets/events",
        content='{"uri": "orders"}',
        headers={"Content-Type": content_type, **headers},
    )
    assert response.status_code == 201, response.text
    assert await api.trace_context(response.json()["id"]) == stored
