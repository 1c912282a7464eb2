"""``POST /assets/events`` of a CloudEvent, in-process on SQLite and PostgreSQL: structured and
binary mode, one event per ``source`` and ``id`` (200 with the stored event for a copy, also
among concurrent posts), 422 naming the attribute, the roles, an audit row per event created
and none for a copy, the trace context (the request's, else the CloudEvent's extension), the
fast path passing it on, and the OpenAPI document describing it."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

from tests.integration.api.conftest import EMITTER_TOKEN, TOKEN, VIEWER_TOKEN, Api
from tests.integration.api.test_audit import ACTOR, audit, summary
from triggerer.cloudevents import dedup_key

STRUCTURED = "application/cloudevents+json"
CLOUDEVENT = {
    "specversion": "1.0",
    "id": "order-7",
    "source": "https://shop.example/orders",
    "type": "com.example.order.created",
    "time": "2026-03-16T09:37:51Z",
    "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    "data": {"order": 7},
}
BINARY_HEADERS = {
    **{f"ce-{name}": CLOUDEVENT[name] for name in ("specversion", "id", "source", "type", "time")},
    "Content-Type": "application/json",
}
"""The same CloudEvent in binary mode (but its traceparent), its data JSON."""


async def post(
    api: Api,
    body: str | bytes,
    headers: dict[str, str],
    *,
    query: str = "?uri=orders",
    token: str = TOKEN,
) -> httpx.Response:
    headers = {**headers, "Authorization": f"Bearer {token}"}
    return await api.client.post(f"/assets/events{query}", content=body, headers=headers)


async def post_structured(api: Api, document: Any, **options: Any) -> httpx.Response:
    return await post(api, json.dumps(document), {"Content-Type": STRUCTURED}, **options)


async def test_a_cloudevent_posted_in_either_mode_is_one_event(api: Api) -> None:
    created = await post_structured(api, CLOUDEVENT)
    assert created.status_code == 201, created.text
    event = created.json()
    assert event["extra"] == {
        "cloudevent": {
            "specversion": "1.0",
            "id": "order-7",
            "source": "https://shop.example/orders",
            "type": "com.example.order.created",
            "subject": None,
            "time": "2026-03-16T09:37:51Z",
            "data": {"order": 7},
            "extensions": {"traceparent": CLOUDEVENT["traceparent"]},
        },
        "from_rest_api": True,
    }
    assert (event["source"], event["queued_for"]) == ("rest_api", ["count_orders", "matched"])

    # The same CloudEvent again, in structured mode, then in binary mode by the asset's id:
    # the event stored before, queued for nothing more.
    again = await post_structured(api, CLOUDEVENT)
    binary = await post(
        api, b'{"order": 7}', BINARY_HEADERS, query=f"?asset_id={event['asset_id']}"
    )
    for response in (again, binary):
        assert response.status_code == 200, response.text
        assert response.json() == {**event, "queued_for": []}
    listed = (await api.client.get(f"/assets/events?asset_id={event['asset_id']}")).json()
    assert [e["id"] for e in listed] == [event["id"]]
    assert sum(recorded.duplicates for recorded in api.calls.recorded) == 2

    # Another id of the source is another event; so is the same one on another asset.
    other = await post_structured(api, {**CLOUDEVENT, "id": "order-8"})
    elsewhere = await post_structured(api, CLOUDEVENT, query="?uri=customers")
    assert (other.status_code, elsewhere.status_code) == (201, 201)


async def test_binary_mode_data_follows_the_content_type(api: Api) -> None:
    headers = {**BINARY_HEADERS, "ce-id": "%E2%82%AC%201", "Content-Type": "text/csv"}
    created = await post(api, b"a,b\n1,2\n", headers)
    assert created.status_code == 201, created.text
    cloudevent = created.json()["extra"]["cloudevent"]
    assert (cloudevent["id"], cloudevent["datacontenttype"], cloudevent["data"]) == (
        "€ 1",
        "text/csv",
        "a,b\n1,2\n",
    )
    # A binary CloudEvent whose data is JSON is not taken for a plain post on the fast path.
    body = json.dumps({"uri": "customers", "extra": {"not": "an event"}})
    as_data = await post(api, body, {**BINARY_HEADERS, "ce-id": "2"})
    assert as_data.status_code == 201, as_data.text
    assert as_data.json()["uri"] == "orders"
    assert as_data.json()["extra"]["cloudevent"]["data"] == json.loads(body)


async def test_concurrent_copies_of_one_cloudevent_are_one_event(api: Api) -> None:
    answers = await asyncio.gather(*(post_structured(api, CLOUDEVENT) for _ in range(20)))
    statuses = sorted(answer.status_code for answer in answers)
    assert statuses == [200] * 19 + [201]
    assert len({answer.json()["id"] for answer in answers}) == 1
    assert len(await audit(api.client)) == 1  # the copies, answered 200, wrote none


async def test_each_event_created_is_an_audit_row_naming_its_caller(api: Api) -> None:
    created = await post_structured(api, CLOUDEVENT)
    copies = [
        await post_structured(api, CLOUDEVENT, token=EMITTER_TOKEN),
        await post(api, b'{"order": 7}', BINARY_HEADERS),
    ]
    assert [copy.status_code for copy in copies] == [200, 200]
    other = await post(api, b'{"order": 8}', {**BINARY_HEADERS, "ce-id": "8"}, token=EMITTER_TOKEN)
    refused = await post_structured(api, CLOUDEVENT, query="?uri=customers", token=EMITTER_TOKEN)
    assert (created.status_code, other.status_code, refused.status_code) == (201, 201, 403)
    rows = await audit(api.client)
    assert summary(rows) == [
        (ACTOR, "emit", "asset:orders"),
        ("orders-feed", "emit", "asset:orders"),
    ]
    assert [row["details"]["event_id"] for row in reversed(rows)] == [
        created.json()["id"],
        other.json()["id"],
    ]
    assert rows[-1]["details"]["extra"] == {"cloudevent": created.json()["extra"]["cloudevent"]}


async def test_the_trace_context_is_the_requests_else_the_cloudevents(api: Api) -> None:
    extension = CLOUDEVENT["traceparent"]
    header = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    # The CloudEvent's traceparent extension, structured or binary, with its tracestate.
    structured = await post_structured(api, {**CLOUDEVENT, "tracestate": "rojo=1"})
    binary = await post(api, b"{}", {**BINARY_HEADERS, "ce-id": "2", "ce-traceparent": extension})
    # The request's own traceparent header wins, as on a plain post; an invalid extension is
    # ignored; none at all, none stored.
    with_header = await post(
        api,
        json.dumps({**CLOUDEVENT, "id": "4"}),
        {"Content-Type": STRUCTURED, "traceparent": header},
    )
    invalid = await post_structured(api, {**CLOUDEVENT, "id": "5", "traceparent": "00-x"})
    without = await post(api, b"{}", {**BINARY_HEADERS, "ce-id": "6"})
    expected = [
        (structured, (extension, "rojo=1")),
        (binary, (extension, None)),
        (with_header, (header, None)),
        (invalid, (None, None)),
        (without, (None, None)),
    ]
    for response, stored in expected:
        assert response.status_code == 201, response.text
        assert await api.trace_context(response.json()["id"]) == stored


async def test_a_malformed_cloudevent_is_422_naming_the_attribute(api: Api) -> None:
    without_id = {k: v for k, v in CLOUDEVENT.items() if k != "id"}
    cases: list[tuple[str | bytes, dict[str, str], str, str]] = [
        (json.dumps(without_id), {"Content-Type": STRUCTURED}, "?uri=orders", "'id' is missing"),
        (
            json.dumps({**CLOUDEVENT, "specversion": "0.3"}),
            {"Content-Type": STRUCTURED},
            "?uri=orders",
            "'specversion' is '0.3'",
        ),
        (
            json.dumps({**CLOUDEVENT, "time": "yesterday"}),
            {"Content-Type": STRUCTURED},
            "?uri=orders",
            "'time' is not an RFC 3339 timestamp",
        ),
        ("{", {"Content-Type": STRUCTURED}, "?uri=orders", "not JSON"),
        (
            b"{}",
            {**BINARY_HEADERS, "ce-type": ""},
            "?uri=orders",
            "'type' must not be empty",
        ),
        (b"{}", {"ce-id": "1"}, "?uri=orders", "'source', 'specversion', 'type' are missing"),
        (b"{", BINARY_HEADERS, "?uri=orders", "data is not JSON"),
        # JSON nested deeper than the decoder goes (a RecursionError, not a DecodeError)
        (
            json.dumps(CLOUDEVENT)[:-1] + ', "x": ' + "[" * 5000 + "]" * 5000 + "}",
            {"Content-Type": STRUCTURED},
            "?uri=orders",
            "nested too deeply",
        ),
        (b"[" * 5000 + b"]" * 5000, BINARY_HEADERS, "?uri=orders", "data is JSON nested too"),
        (json.dumps(CLOUDEVENT), {"Content-Type": STRUCTURED}, "", "query parameter asset_id"),
        (
            json.dumps(CLOUDEVENT),
            {"Content-Type": STRUCTURED},
            "?uri=orders&asset_id=1",
            "not both",
        ),
        ("[]", {"Content-Type": "application/cloudevents-batch+json"}, "?uri=o", "batched"),
        ("x", {"Content-Type": "application/cloudevents+xml"}, "?uri=orders", "JSON format"),
    ]
    for body, headers, query, said in cases:
        response = await post(api, body, headers, query=query)
        assert response.status_code == 422, (body, response.text)
        assert said in response.json()["detail"], (body, response.text)
    missing = await post_structured(api, CLOUDEVENT, query="?uri=nowhere")
    assert missing.status_code == 404
    assert (await api.client.get("/assets/events")).json() == []


async def test_roles_hold_for_cloudevents(api: Api) -> None:
    viewer = await post_structured(api, CLOUDEVENT, token=VIEWER_TOKEN)
    assert viewer.status_code == 403
    assert "lacks the permission 'emit'" in viewer.json()["detail"]
    # The emitter "orders-feed" emits to "orders*" only.
    outside = await post_structured(api, CLOUDEVENT, query="?uri=customers", token=EMITTER_TOKEN)
    assert outside.status_code == 403
    assert "'emit' on asset 'customers'" in outside.json()["detail"]
    inside = await post_structured(api, CLOUDEVENT, token=EMITTER_TOKEN)
    assert inside.status_code == 201, inside.text
    anonymous = await api.client_with({"Content-Type": STRUCTURED}).post(
        "/assets/events?uri=orders", content=json.dumps(CLOUDEVENT)
    )
    assert anonymous.status_code == 401


async def test_the_event_of_a_cloudevent_is_keyed_by_its_source_and_id(api: Api) -> None:
    await post_structured(api, CLOUDEVENT)
    [recorded] = api.calls.recorded
    [stored] = recorded.events
    assert stored.dedup_key == dedup_key(CLOUDEVENT["source"], CLOUDEVENT["id"])


async def test_openapi_describes_the_cloudevent_post(api: Api) -> None:
    document = (await api.client.get("/openapi.json")).json()
    operation = document["paths"]["/api/v1/assets/events"]["post"]
    content = operation["requestBody"]["content"]
    assert set(content) == {"application/json", STRUCTURED}
    assert content[STRUCTURED]["schema"]["required"] == ["specversion", "id", "source", "type"]
    parameters = {(p["in"], p["name"]) for p in operation["parameters"]}
    assert {("query", "uri"), ("query", "asset_id"), ("header", "ce-id")} <= parameters
    assert set(operation["responses"]) >= {"200", "201", "403", "404", "422"}
    assert "CloudEvent" in operation["description"]
