"""Roles through ``triggerer run --config FILE``: one daemon with a principal of each role (and
an ``[api] tokens`` admin), and a route by role matrix over every route of the OpenAPI document
(the contract's REST table): every GET answers every role; each change answers 403 to a role
without its permission, naming the principal and the permission, and what it would anyway (2xx,
or the 409 of a run's state) to a role with it. An emitter whose glob is ``orders*`` posts to
``orders`` and ``orders_eu`` and gets 403 for ``customers``, on the REST fast path and through
the FastAPI route alike, byte for byte. In Debian's Chromium, the UI shows who you are and only
the buttons your role may use.

Screenshots go to ``var/screenshots/`` as in ``test_ui.py``."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from playwright.async_api import async_playwright, expect

from tests.e2e.daemon import Deployment, sqlite_url
from tests.e2e.test_api import api_url
from tests.e2e.test_ui import CHROMIUM, LAYOUT_CHECKS, collect_errors, shoot
from triggerer.service.principals import Principal, Role

if TYPE_CHECKING:
    from pathlib import Path

NO_SPARK = "sc://127.0.0.1:1"  # runs fail to start: their states do not matter here
READ, EMIT, OPERATE = "read", "emit", "operate"
HOLDS = {
    "viewer": {READ},
    "emitter": {READ, EMIT},
    "operator": {READ, EMIT, OPERATE},
    "admin": {READ, EMIT, OPERATE},
}
"""The role table of docs/api.md."""
HOLDERS = {EMIT: "emitter, operator and admin", OPERATE: "operator and admin"}
WHAT = {
    EMIT: "create asset events",
    OPERATE: (
        "pause and unpause pipelines, trigger, cancel and re-run runs, replay events and "
        "delete queued events"
    ),
}
"""How a 403 says what the permission it lacks allows."""


@dataclass(frozen=True)
class Caller:
    name: str
    role: str
    token: str
    config: str
    """Its ``[[api.principals]]`` entry ('' for the ``[api] tokens`` admin)."""


def _entry(name: str, role: str, key: str, assets: str = "") -> str:
    return f'[[api.principals]]\nname = "{name}"\nrole = "{role}"\n{key}\n{assets}\n'


def _sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


CALLERS = [
    Caller("dashboard", "viewer", "t-view", _entry("dashboard", "viewer", 'token = "t-view"')),
    Caller(
        "orders-feed",
        "emitter",
        "t-emit",
        _entry(
            "orders-feed",
            "emitter",
            f'token_sha256 = "{_sha256("t-emit")}"',
            'assets = ["orders*"]',
        ),
    ),
    Caller("on-call", "operator", "t-op", _entry("on-call", "operator", 'token = "t-op"')),
    Caller("platform", "admin", "t-admin", _entry("platform", "admin", 'token = "t-admin"')),
    Caller("api-token-1", "admin", "t-tokens", ""),
]
PIPELINES = """
    from triggerer import Asset, pipeline

    orders, orders_eu, customers = Asset("orders"), Asset("orders_eu"), Asset("customers")

    @pipeline(schedule=orders | orders_eu)
    def count_orders(spark, context):
        pass

    @pipeline(schedule=customers)
    def by_customer(spark, context):
        pass

    @pipeline(schedule=None)
    def manual(spark, context):
        pass
"""


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    """As the OpenAPI document names it, under ``/api/v1``."""
    needs: str
    allowed: frozenset[int] = frozenset({200})
    """What it answers a role that may (a run's state decides between two)."""
    body: Any = None
    pipeline_id: str = "count_orders"


SINCE = "2000-01-01T00:00:00Z"
ROUTES = [
    Route("GET", "/assets", READ),
    Route("GET", "/assets/aliases", READ),
    Route("GET", "/assets/events", READ),
    Route("POST", "/assets/events", EMIT, frozenset({201}), {"uri": "orders"}),
    Route("GET", "/assets/{asset_id}", READ),
    Route("GET", "/assets/{asset_id}/queuedEvents", READ),
    Route("DELETE", "/assets/{asset_id}/queuedEvents", OPERATE),
    Route("POST", "/assets/{asset_id}/replay", OPERATE, body={"since": SINCE, "dry_run": True}),
    Route("GET", "/pipelines", READ),
    Route("GET", "/pipelines/{pipeline_id}", READ),
    Route("PATCH", "/pipelines/{pipeline_id}", OPERATE, body={"paused": False}),
    Route("GET", "/pipelines/{pipeline_id}/explain", READ),
    Route(
        "POST",
        "/pipelines/{pipeline_id}/simulate",
        READ,
        body=[{"asset": "orders", "at": "2026-01-01T00:00:00Z"}],
    ),
    Route("GET", "/pipelines/{pipeline_id}/assets/queuedEvents", READ),
    Route("DELETE", "/pipelines/{pipeline_id}/assets/queuedEvents", OPERATE),
    Route("GET", "/pipelines/{pipeline_id}/assets/{asset_id}/queuedEvents", READ),
    Route("DELETE", "/pipelines/{pipeline_id}/assets/{asset_id}/queuedEvents", OPERATE),
    Route("GET", "/pipelines/{pipeline_id}/runs", READ, pipeline_id="manual"),
    Route(
        "POST",
        "/pipelines/{pipeline_id}/runs",
        OPERATE,
        frozenset({201}),
        {"params": {"by": "test"}},
        pipeline_id="manual",
    ),
    Route("GET", "/importErrors", READ),
    Route("GET", "/runs", READ),
    Route("GET", "/runs/{run_id}", READ),
    Route("GET", "/runs/{run_id}/logs", READ),
    Route("POST", "/runs/{run_id}/cancel", OPERATE, frozenset({200, 409})),
    Route("POST", "/runs/{run_id}/rerun", OPERATE, frozenset({201, 409})),
    Route("GET", "/events/{event_id}", READ),
    Route("GET", "/dead-letters", READ),
    Route("GET", "/watchers", READ),
    Route("GET", "/lineage", READ),
    Route("GET", "/activity/events", READ),
    Route("GET", "/activity/runs", READ),
    Route("GET", "/activity/watcherLag", READ),
    Route("GET", "/healthz", READ),
    Route("GET", "/readyz", READ),
    Route("GET", "/metrics", READ),
    Route("GET", "/whoami", READ),
]


def write_config(deployment: Deployment) -> Path:
    """The daemon's config: the API on a free port with an ``[api] tokens`` admin and a
    principal of each role, as ``[[api.principals]]`` tables."""
    tokens = [caller.token for caller in CALLERS if not caller.config]
    config = deployment.config_file(api={"enabled": True, "port": 0, "tokens": tokens})
    with config.open("a") as file:
        file.writelines(caller.config for caller in CALLERS)
    return config


@asynccontextmanager
async def roles_daemon(tmp_path: Path) -> AsyncIterator[str]:
    """``triggerer run --config`` of :data:`PIPELINES` with the :data:`CALLERS`, for the body
    of ``async with``: its API's URL."""
    deployment = Deployment(tmp_path, sqlite_url(tmp_path), NO_SPARK, bootstrap="", topic="")
    deployment.write_pipelines(PIPELINES)
    with deployment.process_with_config(write_config(deployment)) as daemon:
        daemon.start()
        await daemon.wait_logged("pipelines_loaded")
        await daemon.wait_logged("api_listening")
        yield api_url(daemon)


def same_answer(one: httpx.Response, other: httpx.Response) -> bool:
    """Whether two answers are the same bytes, but for their ``Date`` (whole seconds)."""

    def answer(response: httpx.Response) -> tuple[int, list[tuple[str, str]], bytes]:
        headers = [(k, v) for k, v in response.headers.items() if k != "date"]
        return response.status_code, headers, response.content

    return answer(one) == answer(other)


def client(url: str, caller: Caller) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {caller.token}"})


async def test_each_route_answers_each_role_as_its_permissions_say(tmp_path: Path) -> None:
    async with roles_daemon(tmp_path) as url:
        admin = CALLERS[-1]
        async with client(url, admin) as api:
            document = (await api.get("/openapi.json")).json()
            assets = {row["name"]: row["id"] for row in (await api.get("/assets")).json()}
            event = (await api.post("/assets/events", json={"uri": "orders"})).json()
            run = (await api.post("/pipelines/manual/runs", json={})).json()
        # The table covers the contract: every operation of the OpenAPI document, no other.
        documented = {
            (method.upper(), path.removeprefix("/api/v1"))
            for path, operations in document["paths"].items()
            for method in operations
        }
        assert {(route.method, route.path) for route in ROUTES} == documented

        for route in ROUTES:
            path = route.path.format(
                asset_id=assets["orders"],
                pipeline_id=route.pipeline_id,
                run_id=run["run_id"],
                event_id=event["id"],
            )
            for caller in CALLERS:
                async with client(url, caller) as api:
                    response = await api.request(route.method, path, json=route.body)
                said = (caller.name, route.method, path, response.text)
                if route.needs in HOLDS[caller.role]:
                    assert response.status_code in route.allowed, said
                else:
                    assert response.status_code == 403, said
                    assert response.json() == {
                        "detail": f"principal {caller.name!r} ({caller.role}) lacks the "
                        f"permission {route.needs!r} ({WHAT[route.needs]}), which "
                        f"{HOLDERS[route.needs]} hold"
                    }, said

        # The emitter's glob: orders* lets orders and orders_eu through, not customers; by URI
        # or by id, on the fast path (application/json) and through the route (another JSON
        # type), the same answers.
        emitter = CALLERS[1]
        refusal = (
            "principal 'orders-feed' (emitter) lacks the permission 'emit' on asset 'customers': "
            "it may emit only to the assets whose name or URI matches 'orders*'"
        )
        async with client(url, emitter) as api:
            for named, status in (
                ({"uri": "orders"}, 201),
                ({"uri": "orders_eu"}, 201),
                ({"asset_id": assets["orders_eu"]}, 201),
                ({"uri": "customers"}, 403),
                ({"asset_id": assets["customers"]}, 403),
            ):
                answers = []
                for content_type in ("application/json", "application/merge-patch+json"):
                    response = await api.post(
                        "/assets/events",
                        content=json.dumps(named),
                        headers={"Content-Type": content_type},
                    )
                    assert response.status_code == status, (named, response.text)
                    answers.append(response)
                hot, routed = answers
                if status == 403:
                    assert hot.json() == {"detail": refusal}
                    assert same_answer(hot, routed)
        async with client(url, CALLERS[0]) as api:
            hot = await api.post("/assets/events", json={"uri": "orders"})
            routed = await api.post(
                "/assets/events",
                content=json.dumps({"uri": "orders"}),
                headers={"Content-Type": "application/merge-patch+json"},
            )
        assert hot.status_code == 403
        assert same_answer(hot, routed)
        async with httpx.AsyncClient(base_url=url) as anyone:
            for token in ("", "t-wrong"):
                headers = {"Authorization": f"Bearer {token}"} if token else {}
                for method, path in (("GET", "/pipelines"), ("POST", "/assets/events")):
                    response = await anyone.request(
                        method, path, json={"uri": "orders"}, headers=headers
                    )
                    assert response.status_code == 401, (token, method, path)

        # Who each caller is, for the UI and for scripts.
        for caller in CALLERS:
            async with client(url, caller) as api:
                me = (await api.get("/whoami")).json()
            assert (me["name"], me["role"]) == (caller.name, caller.role)
            assert set(me["permissions"]) == HOLDS[caller.role]
            assert me["assets"] == (["orders*"] if caller.role == "emitter" else None)


GLOBS = [
    ("orders*", "orders_eu"),
    ("orders*", "Orders"),
    ("o?ders", "orders"),
    ("[a-c]x", "bx"),
    ("[!a-c]x", "bx"),
    ("[]]x", "]x"),
    ("a[", "a["),
    ("s3://lake/*", "s3://lake/a/b"),
    ("a.b+(c)", "a.b+(c)"),
    ("a.b", "axb"),
]
"""Globs and texts the UI's matching must answer as the API's does."""


@pytest.mark.slow  # a daemon and Chromium: make test-slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium")
async def test_the_ui_shows_who_you_are_and_only_what_your_role_may_do(tmp_path: Path) -> None:
    async with roles_daemon(tmp_path) as url:
        # Events queued for a paused pipeline (each with its delete button) and a manual run
        # (with its cancel or re-run button), made by the admin.
        async with client(url, CALLERS[-1]) as api:
            assets = {row["name"]: row["id"] for row in (await api.get("/assets")).json()}
            await api.patch("/pipelines/count_orders", json={"paused": True})
            for _ in range(2):
                await api.post("/assets/events", json={"uri": "orders"})
            await api.post("/pipelines/manual/runs", json={})
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
            for caller, operate, emits_to in (
                (CALLERS[0], False, set()),
                (CALLERS[1], False, {"orders", "orders_eu"}),
                (CALLERS[2], True, {"orders", "orders_eu", "customers"}),
            ):
                context = await browser.new_context(viewport={"width": 1024, "height": 768})
                page = await context.new_page()
                errors = collect_errors(page)
                await page.goto(url.removesuffix("/api/v1") + "/")
                await page.fill("#token-input", caller.token)
                await page.click("#token-save")
                await expect(page.locator("#whoami")).to_have_text(f"{caller.name} · {caller.role}")
                await page.wait_for_function("window.triggerer.cy?.nodes().length >= 7")
                # Who you are fits the header at 1024 px, each part of it on one line.
                await page.add_script_tag(content=LAYOUT_CHECKS.read_text())
                assert await page.evaluate("layoutChecks.wrappedHeader()") == []
                assert (
                    await page.evaluate("layoutChecks.overflowing(['html', 'body', 'header'])")
                    == []
                )

                # A pipeline: pause and trigger, and a run's cancel or re-run, for an operator.
                await page.evaluate("location.hash = '#/pipeline/manual'")
                await expect(page.locator("tr[data-run-id]")).to_have_count(1)
                shown = 1 if operate else 0
                for button in ("#toggle-pause", "#trigger", "[data-cancel-run], [data-rerun-run]"):
                    await expect(page.locator(f"#panel {button}")).to_have_count(shown)
                await shoot(page, f"roles-{caller.role}-pipeline")

                # Each asset: creating an event where the role may emit to it, and the queued
                # events' delete buttons for an operator.
                for name, asset in assets.items():
                    await page.evaluate(f"location.hash = '#/asset/{asset}'")
                    await expect(page.locator("#panel h1")).to_have_text(name)
                    allowed = 1 if name in emits_to else 0
                    await expect(page.locator("#create-event")).to_have_count(allowed)
                    if name == "orders":
                        await expect(
                            page.locator("#panel td", has_text="count_orders")
                        ).to_be_visible()
                        await expect(page.locator("[data-delete-queued]")).to_have_count(shown)
                        await shoot(page, f"roles-{caller.role}-asset")

                if caller.role == "emitter":
                    # Its one button works: the event is created (and the API's matching and
                    # the page's agree on every glob).
                    await page.evaluate(f"location.hash = '#/asset/{assets['orders_eu']}'")
                    await page.click("#create-event")
                    await page.click("#event-create")
                    await expect(page.locator("tr[data-event-id]")).to_have_count(1)
                    matched = await page.evaluate(
                        "(cases) => cases.map(([g, t]) => window.triggerer.globMatches(g, t))",
                        GLOBS,
                    )
                    assert matched == [
                        Principal("p", Role.EMITTER, (glob,)).may_emit_to(text, text)
                        for glob, text in GLOBS
                    ]
                await context.close()
                assert errors == [], caller
            await browser.close()
