"""What each route answers, on SQLite and PostgreSQL: lists, details, creating events,
queued events, pausing, runs, explain, lineage, dead letters, health; and each 4xx."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import httpx
import pytest
from sqlalchemy import update

from tests.integration.api.conftest import EMITTER_TOKEN, OPERATOR_TOKEN, TOKEN, VIEWER_TOKEN
from triggerer.service.api import group_commit
from triggerer.service.dead_letters import Unstorable, record_dead_letters
from triggerer.service.events import NewEvent
from triggerer.service.scheduling.scheduler import Scheduler
from triggerer.service.store import models
from triggerer.service.store.types import utcnow

if TYPE_CHECKING:
    from tests.integration.api.conftest import Api

LISTS = (
    "/assets",
    "/assets/aliases",
    "/assets/events",
    "/pipelines",
    "/runs",
    "/watchers",
    "/dead-letters",
    "/importErrors",
)


async def emit(api: Api, uri: str, **fields: Any) -> dict[str, Any]:
    response = await api.client.post("/assets/events", json={"uri": uri, **fields})
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


async def schedule(api: Api, pipeline_id: str) -> int:
    """Create the runs the queued events of ``pipeline_id`` allow, as the daemon would."""
    scheduler = Scheduler(api.sessions, lambda: api.registry, lambda: None)
    return await scheduler.schedule(api.registry.pipelines[pipeline_id], api.registry)


async def test_empty_lists_are_200_and_empty(empty_api: Api) -> None:
    for path in LISTS:
        response = await empty_api.client.get(path)
        assert (response.status_code, response.json()) == (200, []), path
    assert (await empty_api.client.get("/lineage")).json() == {"nodes": [], "edges": []}


async def test_assets_with_consumers_producers_and_watchers(api: Api) -> None:
    listed = (await api.client.get("/assets")).json()
    by_name = {asset["name"]: asset for asset in listed}
    orders = by_name["orders"]
    assert (orders["consumers"], orders["watchers"]) == (
        ["count_orders", "matched"],
        ["orders_files"],
    )
    assert by_name["s3://lake/report"]["producers"] == ["matched"]
    assert (await api.client.get(f"/assets/{orders['id']}")).json() == orders
    assert [a["name"] for a in (await api.client.get("/assets?name_prefix=cust")).json()] == [
        "customers"
    ]
    assert len((await api.client.get("/assets?limit=2&offset=1")).json()) == 2
    [alias] = (await api.client.get("/assets/aliases")).json()
    assert (alias["name"], alias["consumers"], alias["producers"]) == (
        "found",
        ["via_alias"],
        ["via_alias"],
    )


async def test_created_event_is_marked_queued_and_wakes_the_scheduler(api: Api) -> None:
    created = await emit(api, "orders", extra={"rows": 3})
    assert (created["source"], created["extra"]) == ("rest_api", {"rows": 3, "from_rest_api": True})
    assert created["queued_for"] == ["count_orders", "matched"]
    [recorded] = api.calls.recorded
    assert recorded.queued_pipelines == {"count_orders", "matched"}
    assert [e.id for e in recorded.events] == [created["id"]]
    [listed] = (await api.client.get(f"/assets/events?asset_id={created['asset_id']}")).json()
    assert listed == {k: v for k, v in created.items() if k != "queued_for"}
    by_id = (await api.client.post("/assets/events", json={"asset_id": created["asset_id"]})).json()
    assert by_id["uri"] == "orders"
    assert (await api.client.get("/assets/events?source=cli")).json() == []


async def test_event_on_a_normalised_uri_and_with_a_partition_key(api: Api) -> None:
    assert (await emit(api, "S3://lake/report/"))["uri"] == "s3://lake/report"
    keyed = await emit(api, "daily", partition_key="2026-03-16T09:37:51")
    assert (keyed["partition_key"], keyed["queued_for"]) == ("2026-03-16T09:37:51", ["by_day"])


async def test_a_post_answered_ahead_of_the_route_answers_as_the_route(api: Api) -> None:
    # application/json is answered ahead of FastAPI's routing (event_posts.py); another JSON
    # type goes to the route. The answers are the same bytes but for the event's id and time.
    body = json.dumps({"uri": "orders", "extra": {"note": "é", "n": 1.5e20}, "partition_key": None})

    async def post(content: str, content_type: str, token: str = TOKEN) -> httpx.Response:
        headers = {"Content-Type": content_type, "Authorization": f"Bearer {token}"}
        return await api.client.post("/assets/events", content=content, headers=headers)

    def anonymous(response: httpx.Response) -> tuple[int, str, bytes]:
        created = response.json()
        content = response.content.replace(f'"id":{created["id"]},'.encode(), b'"id":0,')
        content = content.replace(created["timestamp"].encode(), b"T")
        return response.status_code, response.headers["content-type"], content

    hot = await post(body, "application/json; charset=utf-8")
    routed = await post(body, "application/merge-patch+json")
    assert anonymous(hot) == anonymous(routed)
    assert hot.status_code == 201
    # Errors: the group commit's (404) through the app's handlers; the body's from the route.
    for content, status in (
        ('{"uri": "nowhere"}', 404),
        ('{"uri": "orders", "extra": []}', 422),
        ("[" * 100_000, 422),
        ('{"uri": ', 422),
    ):
        hot = await post(content, "application/json")
        routed = await post(content, "application/merge-patch+json")
        assert (hot.status_code, hot.json()) == (status, routed.json())
    # Roles: a caller that may not emit goes on to the route (403 naming it and the permission);
    # an emitter's post outside its globs ("orders*") is refused by the group commit, which
    # reads the asset's name and URI (403 naming the asset and the globs); inside them, 201.
    customers = (await api.client.get("/assets?name_prefix=customers")).json()[0]["id"]
    for token, content, status, said in (
        (
            VIEWER_TOKEN,
            '{"uri": "orders"}',
            403,
            "'dashboard' (viewer) lacks the permission 'emit'",
        ),
        (EMITTER_TOKEN, '{"uri": "customers"}', 403, "'emit' on asset 'customers': it may"),
        (EMITTER_TOKEN, f'{{"asset_id": {customers}}}', 403, "on asset 'customers'"),
        (EMITTER_TOKEN, '{"uri": "s3://lake/report"}', 403, "matches 'orders*'"),
        (EMITTER_TOKEN, '{"uri": "nowhere"}', 404, "no asset with URI 'nowhere'"),
        ("not-a-token", '{"uri": "orders"}', 401, "missing or invalid bearer token"),
    ):
        hot = await post(content, "application/json", token)
        routed = await post(content, "application/merge-patch+json", token)
        assert (hot.status_code, hot.headers, hot.content) == (
            status,
            routed.headers,
            routed.content,
        )
        assert said in hot.json()["detail"]
    for token in (EMITTER_TOKEN, OPERATOR_TOKEN):
        hot = await post(body, "application/json", token)
        routed = await post(body, "application/merge-patch+json", token)
        assert anonymous(hot) == anonymous(routed)
        assert hot.status_code == 201


async def test_concurrent_posts_share_transactions_and_each_gets_its_own_answer(
    api: Api,
) -> None:
    bodies = [
        {"uri": "orders", "extra": {"i": i}}
        if i % 3
        else {"uri": "daily", "partition_key": "yesterday"}  # by_day cannot map it: 422
        for i in range(60)
    ] + [{"uri": "nowhere"}, {"asset_id": 999_999}]  # 404 each
    responses = []

    async def post(body: dict[str, Any]) -> None:
        responses.append((body, await api.client.post("/assets/events", json=body)))

    async with anyio.create_task_group() as clients:
        for body in bodies:
            clients.start_soon(post, body)

    answers = {(r.status_code, str(body.get("extra"))) for body, r in responses}
    assert answers == {
        *((201, str({"i": i})) for i in range(60) if i % 3),
        (422, "None"),
        (404, "None"),
    }
    created = [r.json() for _, r in responses if r.status_code == 201]
    assert sorted(c["extra"]["i"] for c in created) == [i for i in range(60) if i % 3]
    assert all(c["queued_for"] == ["count_orders", "matched"] for c in created)
    # Every event answered 201 is committed, with the id it was answered with, and only those.
    stored = (await api.client.get("/assets/events?limit=1000")).json()
    assert sorted(e["id"] for e in stored) == sorted(c["id"] for c in created)
    # Fewer transactions than requests: the posts waiting while one commits go in the next.
    assert len(api.calls.recorded) < len(created)
    assert sum(len(r.events) for r in api.calls.recorded) == len(created)


async def test_clients_posting_one_after_another_share_each_transaction(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Waited for longer than the daemon does: a loaded machine may take more than 2 ms to
    # bring a client's next post, and what is tested is whom a batch waits for.
    monkeypatch.setattr(group_commit, "LINGER_S", 0.25)
    clients, rounds = 8, 10

    async def post_in_turn(client: int) -> None:
        for index in range(rounds):
            await emit(api, "orders", extra={"client": client, "i": index})
            await anyio.sleep(0.0005)  # the answer's way back and the next request's way in

    async with anyio.create_task_group() as group:
        for client in range(clients):
            group.start_soon(post_in_turn, client)

    sizes = [len(recorded.events) for recorded in api.calls.recorded]
    assert sum(sizes) == clients * rounds
    # A batch waits for the clients it answered: not full batches alternating with near-empty
    # ones (those answered post again while the others' batch commits).
    assert statistics.median(sizes) == clients


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        ({"uri": "orders", "colour": "red"}, "body.colour: unknown field"),
        ({"uri": "orders", "extra": [1]}, "body.extra: Input should be a valid dictionary"),
        ({"uri": "orders", "asset_id": 1}, "not both"),
        ({}, "not both and not neither"),
        ({"uri": "orders", "extra": {"text": "a\u0000b"}}, "$.text holds a NUL character"),
        ({"uri": "daily", "partition_key": "yesterday"}, "partition_key 'yesterday' does not suit"),
        ({"uri": "triggerer://x"}, "'triggerer://x' is not an asset URI"),
    ],
)
async def test_unusable_event_is_422_naming_the_value(
    api: Api, body: dict[str, Any], detail: str
) -> None:
    response = await api.client.post("/assets/events", json=body)
    assert response.status_code == 422, response.text
    assert detail in response.json()["detail"]
    assert (await api.client.get("/assets/events")).json() == []  # nothing stored


async def test_bad_json_is_422(api: Api) -> None:
    response = await api.client.post(
        "/assets/events", content=b'{"uri": ', headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 422
    assert "not valid JSON" in response.json()["detail"]


@pytest.mark.parametrize(
    ("method", "path", "detail"),
    [
        ("GET", "/assets/999", "asset 999 does not exist"),
        ("GET", "/assets/999/queuedEvents", "asset 999 does not exist"),
        ("DELETE", "/assets/999/queuedEvents", "asset 999 does not exist"),
        ("GET", "/pipelines/nope", "pipeline 'nope' does not exist"),
        ("PATCH", "/pipelines/nope", "pipeline 'nope' does not exist"),
        ("GET", "/pipelines/nope/explain", "pipeline 'nope' does not exist"),
        ("GET", "/pipelines/nope/runs", "pipeline 'nope' does not exist"),
        ("POST", "/pipelines/nope/runs", "pipeline 'nope' does not exist"),
        ("GET", "/pipelines/nope/assets/queuedEvents", "pipeline 'nope' does not exist"),
        ("DELETE", "/pipelines/matched/assets/999/queuedEvents", "asset 999 does not exist"),
        ("GET", "/runs/nope", "run 'nope' does not exist"),
        ("GET", "/runs/nope/logs", "run 'nope' does not exist"),
        ("POST", "/runs/nope/cancel", "run 'nope' does not exist"),
        ("POST", "/runs/nope/rerun", "run 'nope' does not exist"),
        ("GET", "/events/999", "event 999 does not exist"),
    ],
)
async def test_unknown_names_are_404_naming_them(
    api: Api, method: str, path: str, detail: str
) -> None:
    body = {"paused": True} if method == "PATCH" else None
    response = await api.client.request(method, path, json=body)
    assert response.status_code == 404, response.text
    assert detail in response.json()["detail"]


async def test_unknown_uri_is_404(api: Api) -> None:
    response = await api.client.post("/assets/events", json={"uri": "s3://missing/x"})
    assert response.status_code == 404
    assert response.json()["detail"].startswith("no asset with URI 's3://missing/x'")


@pytest.mark.parametrize(
    "path",
    [
        "/assets?limit=0",
        "/assets?limit=1001",
        "/runs?state=sleeping",
        "/assets/abc",
        "/runs?since=x",
    ],
)
async def test_bad_parameters_are_422_naming_them(api: Api, path: str) -> None:
    response = await api.client.get(path)
    assert response.status_code == 422, response.text
    assert "got" in response.json()["detail"]


async def test_queued_events_listed_and_deleted_by_asset_pipeline_and_pair(api: Api) -> None:
    orders = await emit(api, "orders")
    customers = await emit(api, "customers")
    pair = f"/pipelines/matched/assets/{orders['asset_id']}/queuedEvents"
    assert [q["event_id"] for q in (await api.client.get(pair)).json()] == [orders["id"]]
    queued = (await api.client.get("/pipelines/matched/assets/queuedEvents")).json()
    assert [(q["uri"], q["event_id"]) for q in queued] == [
        ("orders", orders["id"]),
        ("customers", customers["id"]),
    ]
    by_asset = (await api.client.get(f"/assets/{orders['asset_id']}/queuedEvents")).json()
    assert sorted(q["pipeline_id"] for q in by_asset) == ["count_orders", "matched"]

    assert (await api.client.delete(pair)).json() == {"deleted": 1}
    assert (await api.client.get(pair)).json() == []
    explained = (await api.client.get("/pipelines/matched/explain")).json()
    assert explained["condition_met"] is False
    assert "waiting: no queued event of orders" in explained["reasons"]
    assert await schedule(api, "matched") == 0  # customers alone is not enough

    before = await api.client.delete("/pipelines/matched/assets/queuedEvents?before=2000-01-01")
    assert before.json() == {"deleted": 0}
    assert (await api.client.delete("/pipelines/matched/assets/queuedEvents")).json() == {
        "deleted": 1
    }
    path = f"/assets/{orders['asset_id']}/queuedEvents"
    assert (await api.client.delete(path)).json() == {"deleted": 1}  # count_orders' row


async def test_pipelines_count_their_queued_events_by_asset(api: Api) -> None:
    orders = await emit(api, "orders")
    await emit(api, "orders")
    customers = await emit(api, "customers")
    listed = {
        p["pipeline_id"]: p["queued_by_asset"] for p in (await api.client.get("/pipelines")).json()
    }
    assert listed["matched"] == {str(orders["asset_id"]): 2, str(customers["asset_id"]): 1}
    assert listed["count_orders"] == {str(orders["asset_id"]): 2}
    assert listed["nightly"] == {}
    one = (await api.client.get("/pipelines/matched")).json()
    assert one["queued_by_asset"] == listed["matched"]


async def test_pause_holds_queued_events_and_unpause_wakes_the_scheduler(api: Api) -> None:
    paused = await api.client.patch("/pipelines/count_orders", json={"paused": True})
    assert (paused.status_code, paused.json()["paused"]) == (200, True)
    assert sorted((await emit(api, "orders"))["queued_for"]) == ["count_orders", "matched"]
    assert (
        "paused: no runs start; events are still queued (1 now) and wait for "
        "'triggerer pipelines unpause count_orders'"
        in (await api.client.get("/pipelines/count_orders/explain")).json()["reasons"]
    )
    assert [p["pipeline_id"] for p in (await api.client.get("/pipelines?paused=true")).json()] == [
        "count_orders"
    ]
    unpaused = await api.client.patch("/pipelines/count_orders", json={"paused": False})
    assert unpaused.json()["paused"] is False
    assert api.calls.woken == [{"count_orders"}]
    for body in ({"paused": "maybe"}, {"paused": True, "x": 1}, {}):
        assert (await api.client.patch("/pipelines/count_orders", json=body)).status_code == 422


async def test_pipelines_show_schedule_and_progress(api: Api) -> None:
    await emit(api, "customers")
    rows = {p["pipeline_id"]: p for p in (await api.client.get("/pipelines")).json()}
    assert (rows["matched"]["schedule"], rows["matched"]["progress"]) == (
        "orders & customers",
        "1 of 2 assets updated",
    )
    assert rows["count_orders"]["progress"] == "0 of 1 asset updated"
    assert (rows["nightly"]["progress"], rows["nightly"]["next_cron_at"] is not None) == (
        None,
        True,
    )
    assert (await api.client.get("/pipelines/matched")).json() == rows["matched"]
    assert [
        p["pipeline_id"] for p in (await api.client.get("/pipelines?name_prefix=n")).json()
    ] == ["nightly"]


async def test_runs_with_the_events_they_consumed_and_an_event_with_its_runs(api: Api) -> None:
    orders = await emit(api, "orders")
    customers = await emit(api, "customers")
    assert await schedule(api, "matched") == 1
    [run] = (await api.client.get("/pipelines/matched/runs")).json()
    assert (run["state"], run["run_type"], run["events"]) == ("queued", "asset", 2)
    detail = (await api.client.get(f"/runs/{run['run_id']}")).json()
    assert [e["id"] for e in detail["consumed"]] == [orders["id"], customers["id"]]
    story = (await api.client.get(f"/events/{orders['id']}")).json()
    assert [r["run_id"] for r in story["consumed_by"]] == [run["run_id"]]
    assert (story["produced_by"], story["queued_for"]) == (None, ["count_orders"])
    assert (await api.client.get("/runs?state=queued&pipeline_id=matched")).json() == [run]
    assert (await api.client.get("/runs?since=2999-01-01T00:00:00")).json() == []
    explained = (await api.client.get("/pipelines/matched/explain")).json()
    assert (explained["active_runs"], explained["last_run"]["run_id"]) == (1, run["run_id"])


async def test_manual_run_is_created_and_wakes_the_launcher(api: Api) -> None:
    response = await api.client.post("/pipelines/nightly/runs", json={"params": {"day": 1}})
    assert response.status_code == 201
    created = response.json()
    assert (created["run_type"], created["params"], created["consumed"]) == (
        "manual",
        {"day": 1},
        [],
    )
    assert api.calls.launcher_woken == 1
    assert (await api.client.post("/pipelines/nightly/runs")).status_code == 201
    bad = await api.client.post("/pipelines/nightly/runs", json={"params": {}, "when": "now"})
    assert bad.status_code == 422


async def test_runs_are_cancelled_and_finished_ones_rerun_on_the_same_events(api: Api) -> None:
    orders = await emit(api, "orders")
    customers = await emit(api, "customers")
    await schedule(api, "matched")
    [queued] = (await api.client.get("/pipelines/matched/runs")).json()
    running = (await api.client.post("/pipelines/nightly/runs")).json()
    async with api.sessions.begin() as session:
        await session.execute(
            update(models.Run)
            .where(models.Run.run_id == running["run_id"])
            .values(state="running", owner="elsewhere")
        )

    not_finished = await api.client.post(f"/runs/{queued['run_id']}/rerun")
    cancelled = await api.client.post(f"/runs/{queued['run_id']}/cancel")
    cancelling = await api.client.post(f"/runs/{running['run_id']}/cancel")
    again = await api.client.post(f"/runs/{queued['run_id']}/cancel")
    rerun = await api.client.post(f"/runs/{queued['run_id']}/rerun")

    assert (not_finished.status_code, not_finished.json()["detail"]) == (
        409,
        f"run {queued['run_id']!r} is queued: only a finished run (success, failed, cancelled) "
        "can be re-run",
    )
    assert cancelled.status_code == 200, cancelled.text
    assert (cancelled.json()["state"], cancelled.json()["end_date"] is not None) == (
        "cancelled",
        True,
    )
    assert cancelling.json()["state"] == "cancelling"
    assert api.calls.cancels == 1  # only a running run needs its launcher
    assert (again.status_code, again.json()["detail"]) == (
        409,
        f"run {queued['run_id']!r} is cancelled: only a queued, running or up_for_retry run "
        "can be cancelled",
    )
    assert rerun.status_code == 201, rerun.text
    created = rerun.json()
    assert (created["state"], created["run_type"], created["rerun_of"]) == (
        "queued",
        "asset",
        queued["run_id"],
    )
    assert [e["id"] for e in created["consumed"]] == [orders["id"], customers["id"]]
    assert api.calls.launcher_woken == 2  # the manual run, the re-run
    listed = (await api.client.get("/pipelines/matched/runs")).json()
    assert [(r["run_id"], r["rerun_of"]) for r in listed] == [
        (created["run_id"], queued["run_id"]),
        (queued["run_id"], None),
    ]
    story = (await api.client.get(f"/events/{orders['id']}")).json()
    assert [r["run_id"] for r in story["consumed_by"]] == [queued["run_id"], created["run_id"]]


async def test_a_run_log_is_text_from_the_store_and_an_empty_one_says_why(
    api: Api, tmp_path: Path
) -> None:
    run_id = (await api.client.post("/pipelines/nightly/runs")).json()["run_id"]
    response = await api.client.get(f"/runs/{run_id}/logs")
    assert (response.status_code, response.text) == (200, "")
    assert response.headers["Triggerer-Log-Empty"] == "not_started"
    assert response.headers["Triggerer-Log-Empty-Reason"] == (
        "the run has not started yet: it is queued"
    )

    # A run from before the store kept logs: its file, where this daemon has it.
    log = tmp_path / "run.log"
    log.write_text("spark says hello\n")
    async with api.sessions.begin() as session:
        run_pk = await session.scalar(
            update(models.Run)
            .where(models.Run.run_id == run_id)
            .values(log_path=str(log), state="success", try_number=1)
            .returning(models.Run.id)
        )
    response = await api.client.get(f"/runs/{run_id}/logs")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    assert response.text == "spark says hello\n"
    assert "Triggerer-Log-Empty" not in response.headers

    # The store holds the truth once it has the run's log.
    async with api.sessions.begin() as session:
        session.add_all(
            models.RunLogChunk(run_pk=run_pk, try_number=1, seq=seq, position=at, data=data)
            for seq, (at, data) in enumerate([(0, b"from the store, "), (16, "café\n".encode())])
        )
    response = await api.client.get(f"/runs/{run_id}/logs")
    assert response.text == "from the store, café\n"


async def test_watchers_lineage_and_dead_letters(api: Api) -> None:
    [watcher] = (await api.client.get("/watchers")).json()
    assert (watcher["watcher"], watcher["asset"], watcher["trigger"]) == (
        "orders_files",
        "orders",
        "FileTrigger",
    )
    assert watcher["state"] == "starting"
    graph = (await api.client.get("/lineage")).json()
    kinds = {node["id"]: node["kind"] for node in graph["nodes"]}
    assert kinds["pipeline:matched"] == "pipeline"
    edges = {(e["source"], e["target"], e["kind"]) for e in graph["edges"]}
    orders_id = next(n["id"] for n in graph["nodes"] if n["name"] == "orders")
    report_id = next(n["id"] for n in graph["nodes"] if n["name"] == "s3://lake/report")
    assert (f"watcher:{orders_id.split(':')[1]}:orders_files", orders_id, "feeds") in edges
    assert (orders_id, "pipeline:matched", "schedules") in edges
    assert ("pipeline:matched", report_id, "produces") in edges
    matched = next(n for n in graph["nodes"] if n["id"] == "pipeline:matched")
    assert matched["condition"] == {
        "all": [
            {"asset": {"name": "orders", "uri": "orders"}},
            {"asset": {"name": "customers", "uri": "customers"}},
        ]
    }
    async with api.sessions.begin() as session:
        letter = Unstorable(NewEvent(1, {"v": 1}, "trigger", "q/1"), "too big")
        await record_dead_letters(session, [letter])
    [dead] = (await api.client.get("/dead-letters")).json()
    assert (dead["reason"], dead["dedup_key"], dead["payload"]) == ("too big", "q/1", '{"v":1}')


async def test_health_ready_and_metrics(api: Api) -> None:
    anonymous = api.client_with({})
    assert (await anonymous.get("/healthz")).json() == {
        "status": "ok",
        "heartbeat_at": None,
        "token_required": True,
    }
    stale = await api.client.get("/readyz")
    assert stale.status_code == 503
    assert "heartbeat is stale" in stale.json()["detail"]
    async with api.sessions.begin() as session:
        session.add(
            models.Instance(id=api.context.instance_id, hostname="h", pid=1, heartbeat_at=utcnow())
        )
    ready = await api.client.get("/readyz")
    assert (ready.status_code, ready.json()["status"]) == (200, "ready")
    metrics = await api.client.get("/metrics")
    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain")
    assert "# HELP" in metrics.text
