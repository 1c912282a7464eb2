"""Every route but /healthz needs a token (enumerated from the app, so none can skip it), and
every route but a GET (or the simulation, which changes nothing) a role above viewer; no
response holds a secret, and no log line a token."""

from __future__ import annotations

import re

import pytest
import structlog
from fastapi.routing import iter_route_contexts

from tests.integration.api.conftest import (
    EMITTER_TOKEN,
    OPERATOR_TOKEN,
    SECRET,
    TOKEN,
    VIEWER_TOKEN,
    Api,
)
from triggerer.service.api.app import PREFIX

SAMPLE_PARAMETERS = {"asset_id": "1", "pipeline_id": "matched", "run_id": "r1", "event_id": "1"}
OPEN = {("GET", "/healthz")}
READ_ONLY_POSTS = {("POST", "/pipelines/matched/simulate")}
"""A POST that changes nothing: any role may."""
EMITS = {("POST", "/assets/events")}
UI = {"/", "/ui"}
"""The web UI's page and static files: open (no data; the page asks for the token)."""


def routes(api: Api) -> list[tuple[str, str]]:
    """(method, path under /api/v1 with sample parameters) of every route of the app."""
    found = []
    for route in iter_route_contexts(api.app.routes):
        assert route.path is not None
        if route.path in UI:
            continue
        assert route.path.startswith(PREFIX), route.path
        path = re.sub(r"\{(\w+)\}", lambda m: SAMPLE_PARAMETERS[m[1]], route.path)
        found.extend((method, path.removeprefix(PREFIX)) for method in sorted(route.methods or ()))
    # Once each: the CloudEvents route shares POST /assets/events with the plain one.
    return list(dict.fromkeys(found))


async def test_every_route_but_healthz_answers_401_without_a_valid_token(api: Api) -> None:
    listed = routes(api)
    assert len(listed) > 25  # the enumeration sees the routers' routes
    assert set(listed) >= OPEN
    with structlog.testing.capture_logs() as logged:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            async with api.client_with(headers) as client:
                for method, path in listed:
                    response = await client.request(method, path)
                    if (method, path) in OPEN:
                        assert response.status_code == 200, (method, path)
                        continue
                    assert response.status_code == 401, (method, path, response.text)
                    assert response.headers["www-authenticate"] == "Bearer"
                    assert "bearer token" in response.json()["detail"]
    assert TOKEN not in repr(logged)


async def test_the_web_ui_page_is_open_and_holds_no_data(api: Api) -> None:
    async with api.client_with({}) as client:
        page = await client.get("http://api/")
    assert page.status_code == 200
    assert 'id="token-dialog"' in page.text
    assert SECRET not in page.text


async def test_with_the_token_no_route_answers_401_or_shows_a_secret(api: Api) -> None:
    for method, path in routes(api):
        response = await api.client.request(method, path)
        assert response.status_code not in (401, 500), (method, path, response.text)
        assert SECRET not in response.text
        assert TOKEN not in response.text


async def test_without_tokens_the_api_is_open(open_api: Api) -> None:
    assert "authorization" not in open_api.client.headers
    assert (await open_api.client.get("/pipelines")).status_code == 200


@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
async def test_the_docs_page_and_the_openapi_document_are_served(api: Api) -> None:
    document = (await api.client.get("/openapi.json")).json()
    assert f"{PREFIX}/assets/events" in document["paths"]
    page = await api.client.get("/docs")
    assert page.status_code == 200
    assert f"{PREFIX}/openapi.json" in page.text


async def test_a_viewer_reads_every_route_and_changes_none_and_an_emitter_only_emits(
    api: Api,
) -> None:
    # Through the routes with sample parameters (404s and 422s are fine): a GET is never a 403
    # but the audit log's, a change is one for the roles without its permission, naming the
    # principal and it.
    listed = routes(api)
    changes = [(m, p) for m, p in listed if m != "GET" and (m, p) not in READ_ONLY_POSTS]
    assert len(changes) == 9
    guarded = {change: "emit" if change in EMITS else "operate" for change in changes}
    guarded["GET", "/audit"] = "audit"
    for token, name, may in (
        (VIEWER_TOKEN, "'dashboard' (viewer)", set()),
        (EMITTER_TOKEN, "'orders-feed' (emitter)", EMITS),
        (OPERATOR_TOKEN, "'on-call' (operator)", set(guarded)),
        (TOKEN, "'api-token-1' (admin)", set(guarded)),
    ):
        async with api.client_with({"Authorization": f"Bearer {token}"}) as client:
            for method, path in listed:
                response = await client.request(method, path)
                if (method, path) in guarded and (method, path) not in may:
                    assert response.status_code == 403, (token, method, path, response.text)
                    detail = response.json()["detail"]
                    needed = guarded[method, path]
                    assert f"principal {name} lacks the permission {needed!r}" in detail
                else:
                    assert response.status_code not in (401, 403, 500), (token, method, path)


async def test_whoami_says_who_the_caller_is_and_what_it_may_do(api: Api, open_api: Api) -> None:
    answers = {}
    for token in (VIEWER_TOKEN, EMITTER_TOKEN, OPERATOR_TOKEN, TOKEN):
        async with api.client_with({"Authorization": f"Bearer {token}"}) as client:
            answers[token] = (await client.get("/whoami")).json()
    assert answers == {
        VIEWER_TOKEN: {
            "name": "dashboard",
            "role": "viewer",
            "permissions": ["read"],
            "assets": None,
        },
        EMITTER_TOKEN: {
            "name": "orders-feed",
            "role": "emitter",
            "permissions": ["read", "emit"],
            "assets": ["orders*"],
        },
        OPERATOR_TOKEN: {
            "name": "on-call",
            "role": "operator",
            "permissions": ["read", "emit", "operate", "audit"],
            "assets": None,
        },
        TOKEN: {
            "name": "api-token-1",
            "role": "admin",
            "permissions": ["read", "emit", "operate", "audit"],
            "assets": None,
        },
    }
    assert (await open_api.client.get("/whoami")).json()["name"] == "anonymous"
