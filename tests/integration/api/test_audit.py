"""The audit log through the API, on SQLite and PostgreSQL: each change a route makes is one
row naming the caller, read back from ``GET /audit`` with its filters; a change that fails
(404, 409, 422) leaves none; posts committed together are a row each, in their transaction;
only operators and admins may read it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import anyio
import pytest
from sqlalchemy import update

from tests.integration.api.conftest import EMITTER_TOKEN, OPERATOR_TOKEN, VIEWER_TOKEN
from triggerer.service.store import models

if TYPE_CHECKING:
    import httpx

    from tests.integration.api.conftest import Api

ACTOR = "api-token-1"
OPERATOR = "on-call"
"""The operator of the API's ``[[api.principals]]`` (conftest.py)."""


async def audit(client: httpx.AsyncClient, query: str = "") -> list[dict[str, Any]]:
    response = await client.get(f"/audit{query}")
    assert response.status_code == 200, response.text
    rows: list[dict[str, Any]] = response.json()
    return rows


def summary(rows: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(actor, action, target) of each row, oldest first."""
    return [(row["actor"], row["action"], row["target"]) for row in reversed(rows)]


async def test_each_change_through_the_api_is_one_row_naming_its_caller(api: Api) -> None:
    client = api.client
    created = await client.post("/assets/events", json={"uri": "orders", "extra": {"n": 1}})
    orders = created.json()["asset_id"]
    await client.post(
        "/assets/events", json={"uri": "daily", "partition_key": "2026-01-02T03:00:00"}
    )
    await client.patch("/pipelines/count_orders", json={"paused": True})
    await client.patch("/pipelines/count_orders", json={"paused": False})
    triggered = (await client.post("/pipelines/nightly/runs", json={"params": {"day": 2}})).json()
    await client.post(f"/runs/{triggered['run_id']}/cancel")
    rerun = (await client.post(f"/runs/{triggered['run_id']}/rerun")).json()
    running = (await client.post("/pipelines/nightly/runs")).json()
    async with api.sessions.begin() as session:
        await session.execute(
            update(models.Run)
            .where(models.Run.run_id == running["run_id"])
            .values(state="running", owner="elsewhere")
        )
    await client.post(f"/runs/{running['run_id']}/cancel")
    replayed = await client.post(
        f"/assets/{orders}/replay", json={"since": "2000-01-01", "pipeline_id": "count_orders"}
    )
    dry = await client.post(
        f"/assets/{orders}/replay", json={"since": "2000-01-01", "dry_run": True}
    )
    await client.delete(f"/pipelines/matched/assets/{orders}/queuedEvents")
    await client.delete("/pipelines/matched/assets/queuedEvents?before=2000-01-01")
    await client.delete(f"/assets/{orders}/queuedEvents")

    assert (replayed.status_code, dry.status_code) == (200, 200)
    rows = await audit(client)
    assert summary(rows) == [
        (ACTOR, "emit", "asset:orders"),
        (ACTOR, "emit", "asset:daily"),
        (ACTOR, "pause", "pipeline:count_orders"),
        (ACTOR, "unpause", "pipeline:count_orders"),
        (ACTOR, "trigger", "pipeline:nightly"),
        (ACTOR, "cancel", f"run:{triggered['run_id']}"),
        (ACTOR, "rerun", f"run:{triggered['run_id']}"),
        (ACTOR, "trigger", "pipeline:nightly"),
        (ACTOR, "cancel", f"run:{running['run_id']}"),
        (ACTOR, "replay", "asset:orders"),  # the dry run changed nothing: no row
        (ACTOR, "delete_queued", "pipeline:matched"),
        (ACTOR, "delete_queued", "pipeline:matched"),
        (ACTOR, "delete_queued", "asset:orders"),
    ]
    assert [row["id"] for row in rows] == sorted((row["id"] for row in rows), reverse=True)
    details = [row["details"] for row in reversed(rows)]
    assert details[0] == {
        "event_id": created.json()["id"],
        "extra": {"n": 1},
        "partition_key": None,
    }
    assert details[1]["partition_key"] == "2026-01-02T03:00:00"
    assert details[2:4] == [{}, {}]
    assert details[4] == {"run_id": triggered["run_id"], "params": {"day": 2}}
    assert details[5] == {"pipeline_id": "nightly", "state": "cancelled"}
    assert details[6] == {"pipeline_id": "nightly", "new_run_id": rerun["run_id"]}
    assert details[7] == {"run_id": running["run_id"], "params": {}}
    assert details[8] == {"pipeline_id": "nightly", "state": "cancelling"}
    assert details[9] == {
        "since": "2000-01-01T00:00:00+00:00",
        "until": replayed.json()["until"].replace("Z", "+00:00"),
        "pipeline_id": "count_orders",
        "queued": {"count_orders": 0},  # still queued: consumed once
    }
    assert details[10:] == [
        {"asset": "orders", "deleted": 1},
        {"before": "2000-01-01T00:00:00+00:00", "deleted": 0},
        {"asset": "orders", "deleted": 1},
    ]


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("POST", "/assets/events", {"uri": "nowhere"}, 404),
        ("POST", "/assets/events", {"asset_id": 999}, 404),
        ("POST", "/assets/events", {"uri": "orders", "extra": []}, 422),
        ("POST", "/assets/events", {"uri": "orders", "extra": {"text": "a\u0000b"}}, 422),
        ("POST", "/assets/events", {"uri": "daily", "partition_key": "yesterday"}, 422),
        ("PATCH", "/pipelines/nope", {"paused": True}, 404),
        ("PATCH", "/pipelines/count_orders", {"paused": "maybe"}, 422),
        ("POST", "/pipelines/nope/runs", {}, 404),
        ("POST", "/pipelines/nightly/runs", {"params": 3}, 422),
        ("POST", "/runs/nope/cancel", None, 404),
        ("POST", "/runs/nope/rerun", None, 404),
        ("DELETE", "/assets/999/queuedEvents", None, 404),
        ("DELETE", "/pipelines/nope/assets/queuedEvents", None, 404),
        ("DELETE", "/pipelines/matched/assets/999/queuedEvents", None, 404),
        ("POST", "/assets/999/replay", {"since": "2000-01-01"}, 404),
        ("POST", "/assets/{orders}/replay", {"since": "2999-01-01"}, 422),
        ("POST", "/assets/{orders}/replay", {"since": "2000-01-01", "pipeline_id": "nightly"}, 422),
    ],
)
async def test_a_change_that_fails_leaves_no_row(
    api: Api, method: str, path: str, body: Any, status: int
) -> None:
    [orders] = [a["id"] for a in (await api.client.get("/assets")).json() if a["name"] == "orders"]
    response = await api.client.request(method, path.format(orders=orders), json=body)

    assert response.status_code == status, response.text
    assert await audit(api.client) == []


async def test_runs_in_a_state_that_refuses_the_change_leave_no_row(api: Api) -> None:
    """409s: cancelling a finished run, re-running one that is not finished, replaying for a
    paused pipeline."""
    client = api.client
    run = (await client.post("/pipelines/nightly/runs")).json()
    await client.post(f"/runs/{run['run_id']}/cancel")
    await client.patch("/pipelines/count_orders", json={"paused": True})
    [orders] = [a["id"] for a in (await client.get("/assets")).json() if a["name"] == "orders"]
    before = await audit(client)

    refused = [
        await client.post(f"/runs/{run['run_id']}/cancel"),
        await client.post(
            f"/assets/{orders}/replay", json={"since": "2000-01-01", "pipeline_id": "count_orders"}
        ),
    ]
    rerun = (await client.post(f"/runs/{run['run_id']}/rerun")).json()
    refused.append(await client.post(f"/runs/{rerun['run_id']}/rerun"))  # queued

    assert [response.status_code for response in refused] == [409, 409, 409]
    after = await audit(client)
    assert summary(after) == [*summary(before), (ACTOR, "rerun", f"run:{run['run_id']}")]


def as_principal(api: Api, token: str) -> httpx.AsyncClient:
    return api.client_with({"Authorization": f"Bearer {token}"})


async def test_posts_committed_together_are_a_row_each_naming_each_caller(api: Api) -> None:
    second = as_principal(api, EMITTER_TOKEN)
    bodies = [
        {"uri": "orders", "extra": {"i": i}} if i % 5 else {"uri": "nowhere", "extra": {"i": i}}
        for i in range(60)
    ]
    answers: dict[int, tuple[str, httpx.Response]] = {}

    async def post(i: int, body: dict[str, Any]) -> None:
        actor, client = ("orders-feed", second) if i % 2 else (ACTOR, api.client)
        answers[i] = (actor, await client.post("/assets/events", json=body))

    async with second, anyio.create_task_group() as clients:
        for i, body in enumerate(bodies):
            clients.start_soon(post, i, body)

    created = {
        response.json()["id"]: (actor, i)
        for i, (actor, response) in answers.items()
        if response.status_code == 201
    }
    assert len(created) == 48  # the others are 404s
    assert len(api.calls.recorded) < len(created)  # committed together
    rows = await audit(api.client, "?limit=1000")
    assert {
        row["details"]["event_id"]: (row["actor"], row["details"]["extra"]["i"]) for row in rows
    } == created
    assert {(row["action"], row["target"]) for row in rows} == {("emit", "asset:orders")}
    # In the events' order: ids of the rows ascend with the ids of their events.
    ordered = sorted(rows, key=lambda row: row["id"])
    events = [row["details"]["event_id"] for row in ordered]
    assert events == sorted(events)


async def test_the_audit_is_filtered_and_paged_newest_first(api: Api) -> None:
    client = api.client
    await client.patch("/pipelines/count_orders", json={"paused": True})
    async with as_principal(api, OPERATOR_TOKEN) as second:
        await second.patch("/pipelines/matched", json={"paused": True})
        await second.post("/assets/events", json={"uri": "orders"})
    await client.patch("/pipelines/count_orders", json={"paused": False})
    everything = await audit(client)
    assert summary(everything) == [
        (ACTOR, "pause", "pipeline:count_orders"),
        (OPERATOR, "pause", "pipeline:matched"),
        (OPERATOR, "emit", "asset:orders"),
        (ACTOR, "unpause", "pipeline:count_orders"),
    ]

    assert summary(await audit(client, f"?actor={OPERATOR}")) == summary(everything)[1:3]
    assert summary(await audit(client, "?action=pause")) == summary(everything)[:2]
    assert summary(await audit(client, "?target=pipeline:count_orders")) == [
        summary(everything)[0],
        summary(everything)[3],
    ]
    assert await audit(client, f"?actor={OPERATOR}&action=unpause") == []
    assert await audit(client, f"?since={everything[0]['time'].replace('+', '%2B')}") == [
        row for row in everything if row["time"] >= everything[0]["time"]
    ]
    assert await audit(client, "?since=2999-01-01") == []
    assert await audit(client, "?limit=2") == everything[:2]
    assert await audit(client, "?limit=2&offset=2") == everything[2:]
    bad = await client.get("/audit?action=delete_everything")
    assert bad.status_code == 422
    assert "action" in bad.json()["detail"]


@pytest.mark.parametrize(
    ("token", "name", "role", "status"),
    [
        (VIEWER_TOKEN, "dashboard", "viewer", 403),
        (EMITTER_TOKEN, "orders-feed", "emitter", 403),
        (OPERATOR_TOKEN, OPERATOR, "operator", 200),
    ],
)
async def test_only_operators_and_admins_read_the_audit(
    api: Api, token: str, name: str, role: str, status: int
) -> None:
    async with as_principal(api, token) as client:
        response = await client.get("/audit")

    assert response.status_code == status, response.text
    if status == 403:
        assert response.json()["detail"] == (
            f"principal {name!r} ({role}) lacks the permission 'audit' (read the audit log), "
            "which operator and admin hold"
        )


async def test_changes_refused_to_a_role_leave_no_row(api: Api) -> None:
    async with as_principal(api, VIEWER_TOKEN) as viewer, as_principal(api, EMITTER_TOKEN) as feed:
        refused = [
            await viewer.patch("/pipelines/count_orders", json={"paused": True}),
            await viewer.post("/assets/events", json={"uri": "orders"}),
            await feed.post("/assets/events", json={"uri": "customers"}),  # not its glob
            await feed.post("/pipelines/nightly/runs", json={}),
        ]
        allowed = await feed.post("/assets/events", json={"uri": "orders"})

    assert [response.status_code for response in refused] == [403] * 4
    assert allowed.status_code == 201
    assert summary(await audit(api.client)) == [("orders-feed", "emit", "asset:orders")]


async def test_without_tokens_the_actor_is_anonymous(open_api: Api) -> None:
    await open_api.client.post("/assets/events", json={"uri": "orders"})
    await open_api.client.patch("/pipelines/nightly", json={"paused": True})

    assert summary(await audit(open_api.client)) == [
        ("anonymous", "emit", "asset:orders"),
        ("anonymous", "pause", "pipeline:nightly"),
    ]
