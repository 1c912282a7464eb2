"""The web UI at ``/`` in Debian's Chromium (Playwright, headless), through ``triggerer run``:
the lineage graph of the demo-like pipelines, the explain text of the AND pipeline, the event
trace of a Kafka message down to the downstream run, an event created in the dialog starting a
run that shows up without a reload, the watchers and dead-letters pages; the token prompt (only
with tokens, a bad token refused in words); with the API open, the graph at once, every node as
text (keyboard navigable, filtered, selecting its node), the charts and the Runs page showing
the numbers the API gives; missing libraries said in words; no console errors.

Each page's screenshot is written to ``var/screenshots/`` (the README shows the graph's)."""

from __future__ import annotations

import re
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import ConsoleMessage, Page, async_playwright, expect

from tests.e2e.daemon import ORDERS, Deployment, runs, sqlite_url
from tests.e2e.test_api import api_url
from tests.e2e.test_watcher_recovery import RECOVERY_TIMEOUT_S, recovery_deployment
from triggerer.service.api.app import STATIC

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
VENDOR = STATIC / "vendor" / "cytoscape.js"
SCREENSHOTS = Path(__file__).parents[2] / "var" / "screenshots"
TOKEN = "ui-token"  # noqa: S105 - the token this test configures
UNAUTHORIZED = "status of 401"
"""The console's error for the answer to a bad token, the one error a test expects."""
PIPELINES = """
    customers = Asset("customers")
    report = Asset("report", group="reports")

    @pipeline(schedule=orders, outlets=[report])
    def count_orders(spark, context):
        yield Metadata(report, {{"orders": spark.range(2).count()}})

    @pipeline(schedule=orders & customers)
    def matched(spark, context):
        pass

    @pipeline(schedule=report)
    def publish(spark, context):
        pass
"""
RUN_TIMEOUT_MS = 90_000
"""A Spark run and the poll that shows it."""
LIVE_MS = 2_000
"""How soon an open page shows a change made elsewhere."""
CHART_MS = 10_000
"""How soon a chart shows it: its aggregate is read again every 5 s, at a poll."""
FLOW = {("count_orders", "success"), ("publish", "success"), ("matched", "success")}
"""The runs of :func:`run_the_flow`."""

pytestmark = [
    pytest.mark.slow,  # a daemon and Chromium per test, minutes in all: make test-slow
    pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium"),
]


async def graph(page: Page) -> tuple[set[tuple[str, str]], set[tuple[str, str, str]]]:
    """The drawn graph: (kind, name) of each node, (source name, kind, target name) of each
    edge, gates named after their pipeline."""
    elements: dict[str, list[dict[str, Any]]] = await page.evaluate(
        """() => ({
            nodes: window.triggerer.cy.nodes().map((n) => n.data()),
            edges: window.triggerer.cy.edges().map((e) => e.data()),
        })"""
    )
    names = {node["id"]: node["name"] for node in elements["nodes"]}
    for node in elements["nodes"]:
        if node["kind"] == "gate":
            names[node["id"]] = f"{node['name']}({node['pipeline']})"
    nodes = {(node["kind"], names[node["id"]]) for node in elements["nodes"]}
    edges = {(names[e["source"]], e["kind"], names[e["target"]]) for e in elements["edges"]}
    return nodes, edges


async def asset_id(page: Page, name: str) -> str:
    """The id of the asset ``name`` in the graph."""
    found: str = await page.evaluate(
        "(name) => window.triggerer.cy.nodes(`[kind = 'asset'][name = '${name}']`).id()", name
    )
    return found.removeprefix("asset:")


async def tap(page: Page, node: str) -> None:
    """A tap on the graph's node of id ``node``. Nothing is returned from the page: Playwright
    would serialise the collection ``emit`` returns, the whole graph with it (half a minute)."""
    await page.evaluate("(id) => { window.triggerer.cy.$id(id).emit('tap'); }", node)


async def shoot(page: Page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=SCREENSHOTS / f"{name}.png")


@pytest.mark.timeout(300)
async def test_lineage_graph_panels_trace_and_live_runs_in_chromium(
    deployment: Deployment,
) -> None:
    assert VENDOR.exists(), "the UI's graph libraries are missing: run `make ui`"
    deployment.write_pipelines(ORDERS + PIPELINES)
    config = deployment.config_file(api={"enabled": True, "port": 0, "tokens": [TOKEN]})
    errors: list[str] = []

    def console(message: ConsoleMessage) -> None:
        if message.type == "error":
            errors.append(f"{message.text} at {message.location}")

    with deployment.process_with_config(config) as daemon:
        daemon.start()
        await daemon.wait_logged("pipelines_loaded")
        await daemon.wait_logged("api_listening")
        home = api_url(daemon).removesuffix("/api/v1") + "/"
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
            page = await browser.new_page(viewport={"width": 1400, "height": 800})
            page.on("console", console)
            page.on("pageerror", lambda error: errors.append(f"uncaught: {error}"))
            await page.goto(home)

            # The token prompt comes first (the API says it wants one); a bad token is refused
            # in words, the token opens the graph.
            await expect(page.locator("#token-dialog")).to_contain_text("[api]")
            await page.fill("#token-input", "not-the-token")
            await page.click("#token-save")
            await expect(page.locator("#token-error")).to_contain_text("refused")
            await expect(page.locator("#token-dialog")).to_be_visible()
            await shoot(page, "token-refused")
            await page.fill("#token-input", TOKEN)
            await page.click("#token-save")
            await page.wait_for_function("window.triggerer.cy?.nodes().length >= 7")
            nodes, edges = await graph(page)
            assert nodes == {
                ("watcher", "orders_topic"),
                ("asset", "orders"),
                ("asset", "customers"),
                ("asset", "report"),
                ("pipeline", "count_orders"),
                ("pipeline", "matched"),
                ("pipeline", "publish"),
                ("gate", "AND(matched)"),
            }
            assert edges == {
                ("orders_topic", "feeds", "orders"),
                ("orders", "schedules", "count_orders"),
                ("count_orders", "produces", "report"),
                ("report", "schedules", "publish"),
                ("orders", "input", "AND(matched)"),
                ("customers", "input", "AND(matched)"),
                ("AND(matched)", "schedules", "matched"),
            }
            await shoot(page, "lineage")

            # A Kafka message runs count_orders, whose outlet runs publish: the open panel of
            # publish shows the run without a reload; matched still waits for customers.
            await page.evaluate("location.hash = '#/pipeline/publish'")
            await expect(page.locator("#panel h1")).to_have_text("publish")
            await deployment.produce([{"n": 1}])
            await expect(page.locator("tr[data-run-state=success]")).to_have_count(
                1, timeout=RUN_TIMEOUT_MS
            )
            await page.click("tr[data-run-state=success] button[data-log]")
            await expect(page.locator("#panel pre.log")).to_be_visible()
            await page.evaluate("location.hash = '#/pipeline/matched'")
            await expect(page.locator("#panel h1")).to_have_text("matched")
            await expect(page.locator("#explain")).to_contain_text(
                "waiting: no queued event of customers"
            )
            await page.wait_for_function(
                "window.triggerer.cy.edges('.lit').map((e) => e.source().data('name'))"
                ".join() === 'orders'"
            )
            await shoot(page, "pipeline")

            # The trace of the Kafka message's event reaches the downstream run.
            orders = await asset_id(page, "orders")
            await page.evaluate(f"location.hash = '#/asset/{orders}'")
            await page.locator("tr[data-event-id] a").first.click()
            await expect(page.locator("[data-trace-run][data-pipeline=publish]")).to_have_count(1)
            await expect(page.locator("[data-trace-event] pre").first).to_contain_text('"offset"')
            await shoot(page, "trace")

            # An event created in the dialog on customers starts matched.
            customers = await asset_id(page, "customers")
            await page.evaluate(f"location.hash = '#/asset/{customers}'")
            await page.click("#create-event")
            await page.fill("#event-extra", '{"source": "ui"}')
            await page.click("#event-create")
            await expect(page.locator("#event-dialog")).not_to_be_visible()
            await shoot(page, "asset")
            await page.evaluate("location.hash = '#/pipeline/matched'")
            await expect(page.locator("#panel h1")).to_have_text("matched")
            await expect(page.locator("tr[data-run-state=success]")).to_have_count(
                1, timeout=RUN_TIMEOUT_MS
            )

            # An event from elsewhere shows in the open panel and on the graph within 2 s.
            await page.evaluate(f"location.hash = '#/asset/{customers}'")
            await expect(page.locator("tr[data-event-id]")).to_have_count(1)
            async with httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}) as client:
                posted = await client.post(
                    f"{api_url(daemon)}/assets/events", json={"uri": "customers"}
                )
                assert posted.status_code == 201, posted.text
            await expect(page.locator("tr[data-event-id]")).to_have_count(2, timeout=LIVE_MS)
            await page.wait_for_function(
                f"window.triggerer.cy.$id('asset:{customers}').data('label').endsWith('1 queued')",
                timeout=LIVE_MS,
            )

            await page.evaluate("location.hash = '#/watchers'")
            await expect(page.locator("tr[data-watcher=orders_topic]")).to_contain_text("running")
            await shoot(page, "watchers")
            await page.evaluate("location.hash = '#/dead-letters'")
            await expect(page.locator("#page h1")).to_have_text("Dead letters")
            await shoot(page, "dead-letters")
            await page.evaluate("location.hash = '#/'")
            await page.wait_for_function(
                "window.triggerer.cy.elements().renderedBoundingBox().w > 700"
            )
            await shoot(page, "lineage-after-runs")

            # The group of report collapses into one node; opening it draws report again.
            await page.check("#collapse")
            await page.wait_for_function("window.triggerer.cy.$id('group:reports').length === 1")
            nodes, edges = await graph(page)
            assert ("asset", "report") not in nodes
            assert {
                ("count_orders", "produces", "reports"),
                ("reports", "schedules", "publish"),
            } < edges
            await shoot(page, "lineage-groups")
            await tap(page, "group:reports")
            await page.wait_for_function(
                "window.triggerer.cy.nodes(\"[kind = 'asset'][name = 'report']\").length === 1"
            )
            assert await page.input_value("#search") == "reports"
            await browser.close()
    assert [error for error in errors if UNAUTHORIZED not in error] == []


HELD = """
    import time
    from pathlib import Path

    @pipeline()
    def held(spark, context):
        while Path(HOLD).exists():
            time.sleep(0.05)
"""


@pytest.mark.timeout(300)
async def test_a_run_is_cancelled_and_rerun_with_its_buttons(
    deployment: Deployment, tmp_path: Path
) -> None:
    assert VENDOR.exists(), "the UI's graph libraries are missing: run `make ui`"
    hold = tmp_path / "hold"
    hold.touch()
    deployment.write_pipelines(ORDERS + HELD.replace("HOLD", repr(str(hold))))
    config = deployment.config_file(api={"enabled": True, "port": 0, "tokens": [TOKEN]})
    errors: list[str] = []
    with deployment.process_with_config(config) as daemon:
        daemon.start()
        await daemon.wait_logged("pipelines_loaded")
        await daemon.wait_logged("api_listening")
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
            page = await browser.new_page(viewport={"width": 1400, "height": 800})
            page.on("pageerror", lambda error: errors.append(f"uncaught: {error}"))
            await page.goto(api_url(daemon).removesuffix("/api/v1") + "/#/pipeline/held")
            await page.fill("#token-input", TOKEN)
            await page.click("#token-save")
            await expect(page.locator("#panel h1")).to_have_text("held")
            await page.click("#trigger")
            await page.click("#trigger-run")

            # A running run has a Cancel button, which stops it.
            running = page.locator("tr[data-run-state=running]")
            await running.locator("button[data-cancel-run]").click(timeout=RUN_TIMEOUT_MS)
            cancelled = page.locator("tr[data-run-state=cancelled]")
            await expect(cancelled).to_have_count(1, timeout=RUN_TIMEOUT_MS)
            await expect(cancelled.locator("button[data-cancel-run]")).to_have_count(0)
            await shoot(page, "run-cancelled")

            # A finished run has a Re-run button: the re-run says what it runs again.
            hold.unlink()
            await cancelled.locator("button[data-rerun-run]").click()
            rerun = page.locator("tr[data-run-state=success]")
            await expect(rerun).to_have_count(1, timeout=RUN_TIMEOUT_MS)
            await expect(rerun.locator("[data-rerun-of]")).to_contain_text("re-run of manual__")
            await expect(rerun.locator("button[data-rerun-run]")).to_have_count(1)
            await browser.close()
    assert errors == []


def collect_errors(page: Page) -> list[str]:
    """The page's console errors and uncaught exceptions, as they come."""
    errors: list[str] = []

    def console(message: ConsoleMessage) -> None:
        if message.type == "error":
            errors.append(f"{message.text} at {message.location}")

    page.on("console", console)
    page.on("pageerror", lambda error: errors.append(f"uncaught: {error}"))
    return errors


@asynccontextmanager
async def open_ui(
    deployment: Deployment,
    route: str = "",
    *,
    more_pipelines: str = "",
    pipelines: str = PIPELINES,
) -> AsyncIterator[OpenUI]:
    """The daemon of ``pipelines`` (and ``more_pipelines``) under ``ORDERS`` with the API open
    (no tokens), and a page of its UI at ``route`` once the graph is drawn; the page's console
    errors must be none at the end."""
    deployment.write_pipelines(ORDERS + pipelines + more_pipelines)
    config = deployment.config_file(api={"enabled": True, "port": 0})
    with deployment.process_with_config(config) as daemon:
        daemon.start()
        await daemon.wait_logged("pipelines_loaded")
        await daemon.wait_logged("api_listening")
        url = api_url(daemon)
        async with httpx.AsyncClient(base_url=url) as client, async_playwright() as playwright:
            browser = await playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
            page = await browser.new_page(viewport={"width": 1400, "height": 800})
            errors = collect_errors(page)
            await page.goto(url.removesuffix("/api/v1") + "/" + route)
            await page.wait_for_function("window.triggerer.cy?.nodes().length >= 8")
            yield OpenUI(page, client)
            await browser.close()
    assert errors == []


@dataclass
class OpenUI:
    page: Page
    client: httpx.AsyncClient
    """The open API's client, at ``/api/v1``."""


async def run_the_flow(deployment: Deployment, client: httpx.AsyncClient) -> None:
    """A Kafka message runs count_orders, whose outlet runs publish; two events on customers
    run matched (with the message's event). Returns once the three runs have succeeded."""
    await deployment.produce([{"n": 1}])
    for _ in range(2):
        posted = await client.post("/assets/events", json={"uri": "customers"})
        assert posted.status_code == 201, posted.text
    await deployment.wait_for(
        runs,
        lambda rows: {(run.pipeline_id, run.state) for run in rows} == FLOW,
        timeout_s=RUN_TIMEOUT_MS / 1000,
    )


@pytest.mark.timeout(180)
async def test_an_open_api_opens_on_the_graph_with_every_node_as_text(
    deployment: Deployment,
) -> None:
    async with open_ui(deployment) as ui:
        await expect(ui.page.locator("#token-dialog")).not_to_be_visible()
        lineage = (await ui.client.get("/lineage")).json()
        text = await ui.page.inner_text("body")
        assert [node["name"] for node in lineage["nodes"] if node["name"] not in text] == []
        tree = ui.page.locator("#nodes [role=treeitem][data-node]")
        await expect(tree).to_have_count(8)  # with the gate of matched
        await expect(ui.page.locator("#nodes")).to_contain_text("AND of matched")
        await shoot(ui.page, "lineage-open")


@pytest.mark.timeout(180)
async def test_the_nodes_tree_moves_by_keyboard_follows_the_search_and_selects_its_node(
    deployment: Deployment,
) -> None:
    async with open_ui(deployment) as ui:
        page = ui.page
        # The keyboard moves through the tree; Enter opens the node, selected on the graph.
        await page.locator("#nodes [tabindex='0']").focus()
        await page.keyboard.press("End")
        await expect(page.locator("#nodes :focus")).to_contain_text("publish")
        await page.keyboard.press("Enter")
        await expect(page.locator("#panel h1")).to_have_text("publish")
        selected = page.locator("#nodes [aria-selected=true]")
        await expect(selected).to_contain_text("publish")
        assert await page.evaluate("window.triggerer.cy.$id('pipeline:publish').selected()")
        # A tap on the graph selects the entry.
        await tap(page, "pipeline:matched")
        await expect(selected).to_contain_text("matched")
        # The search filters the text as the graph: a name and its neighbours.
        await page.fill("#search", "report")
        await expect(page.locator("#nodes [data-node]:visible")).to_have_count(3)
        await shoot(page, "nodes-filtered")


@pytest.mark.timeout(180)
async def test_the_users_zoom_stays_across_polls(deployment: Deployment) -> None:
    async with open_ui(deployment) as ui:
        page = ui.page
        await page.mouse.move(900, 400)
        await page.mouse.wheel(0, -300)
        zoom = await page.evaluate("window.triggerer.cy.zoom()")
        polls = await page.evaluate("window.triggerer.polls")
        await page.wait_for_function(f"window.triggerer.polls >= {polls + 2}")
        assert await page.evaluate("window.triggerer.cy.zoom()") == zoom


@pytest.mark.timeout(300)  # two Spark runs, on a machine shared with other tests
async def test_pipelines_are_coloured_by_their_last_run_and_draw_its_durations(
    deployment: Deployment,
) -> None:
    async with open_ui(deployment, "#/pipeline/count_orders") as ui:
        page = ui.page
        await run_the_flow(deployment, ui.client)
        await page.wait_for_function(
            "window.triggerer.cy.$id('pipeline:publish').hasClass('last-success')"
        )
        assert await page.evaluate(
            "window.triggerer.cy.$id('pipeline:count_orders').hasClass('last-success')"
        )
        timeline = (await ui.client.get("/activity/runs?pipeline_id=count_orders")).json()
        [run] = timeline["runs"]
        await expect(
            page.locator("[data-chart='durations-count_orders'] figcaption")
        ).to_contain_text(
            f"Durations of its last 1 run(s): median {run['duration_s']:.1f}s", timeout=CHART_MS
        )
        await shoot(page, "pipeline-durations")


@pytest.mark.timeout(300)  # two Spark runs, on a machine shared with other tests
async def test_the_charts_show_the_events_and_runs_the_api_counts_with_numbers_on_hover(
    deployment: Deployment,
) -> None:
    async with open_ui(deployment, "#/activity") as ui:
        page, client = ui.page, ui.client
        await run_the_flow(deployment, client)
        events = (await client.get("/activity/events")).json()
        assert events["events"] >= 4  # the message, report's event, two on customers
        caption = page.locator("[data-chart=activity-events] figcaption")
        await expect(caption).to_contain_text(
            f"{events['events']} events in the last hour", timeout=CHART_MS
        )
        timeline = (await client.get("/activity/runs")).json()
        assert timeline["states"] == {"success": 3}
        await expect(page.locator("[data-chart=activity-runs] figcaption")).to_contain_text(
            "3 runs since", timeout=CHART_MS
        )
        # The numbers on hover: the busiest minute's count, as the API has it. Hovered by the
        # minute's time, not its index: the chart redraws each minute, and across a minute
        # boundary the index points at the next minute (which said 0 events).
        busiest = max(range(len(events["counts"])), key=lambda i: events["counts"][i])
        point = await page.evaluate(
            """(minute) => {
                const u = window.triggerer.charts.get('activity-events');
                const box = u.over.getBoundingClientRect();
                // The current minute is the plot's right edge: one pixel inside it.
                const x = Math.min(box.left + u.valToPos(minute, 'x'), box.right - 1);
                return { x, y: box.top + 10 };
            }""",
            events["buckets"][busiest],
        )
        await page.mouse.move(point["x"], point["y"])
        hover = page.locator("[data-chart=activity-events] .chart-hover")
        await expect(hover).to_contain_text(f": {events['counts'][busiest]} event(s)")
        await shoot(page, "activity")
        await page.evaluate("location.hash = '#/watchers'")
        await expect(page.locator("[data-chart=watchers-lag] figcaption")).to_be_visible()


@pytest.mark.timeout(300)  # two Spark runs, on a machine shared with other tests
async def test_the_runs_page_lists_and_filters_runs_each_linking_to_its_log_and_trace(
    deployment: Deployment,
) -> None:
    async with open_ui(deployment, "#/runs") as ui:
        page, client = ui.page, ui.client
        await run_the_flow(deployment, client)
        listed = (await client.get("/runs")).json()
        rows = page.locator("tr[data-run-id]")
        await expect(rows).to_have_count(len(listed), timeout=CHART_MS)
        assert await rows.evaluate_all("(rows) => rows.map((r) => r.dataset.runId)") == [
            run["run_id"] for run in listed
        ]
        await expect(page.locator("[data-chart=runs-timeline] figcaption")).to_contain_text(
            f"{len(listed)} runs since", timeout=CHART_MS
        )
        await page.select_option("#runs-filters select[name=pipeline]", "publish")
        await expect(rows).to_have_count(1)
        await shoot(page, "runs")
        await rows.first.locator("a[data-run-log]").click()
        await expect(page.locator("#page h1")).to_contain_text("Run publish__")
        await expect(page.locator("#page pre.log")).to_be_visible()
        await shoot(page, "run")
        await page.locator("a[href^='#/event/']").first.click()
        await expect(page.locator("[data-trace-event]").first).to_be_visible()
        # publish's event came from a run: said once ("run produced by run ..." said it twice).
        await expect(page.locator("[data-trace-event] > p").first).to_have_text(
            re.compile(r"^produced by run \S+ · ")
        )
        await shoot(page, "run-trace")


@pytest.mark.timeout(180)
async def test_missing_libraries_are_said_in_words_naming_the_fix(
    deployment: Deployment,
) -> None:
    deployment.write_pipelines(ORDERS + PIPELINES)
    config = deployment.config_file(api={"enabled": True, "port": 0})
    with deployment.process_with_config(config) as daemon:
        daemon.start()
        await daemon.wait_logged("pipelines_loaded")
        await daemon.wait_logged("api_listening")
        home = api_url(daemon).removesuffix("/api/v1") + "/"
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
            page = await browser.new_page(viewport={"width": 1400, "height": 800})
            # An install without the graph's library: the page says so, the nodes are text.
            await page.route("**/ui/vendor/cytoscape.js", lambda route: route.fulfill(status=404))
            await page.goto(home)
            message = page.locator("#load-error")
            await expect(message).to_be_visible()
            await expect(message).to_contain_text("/ui/vendor/cytoscape.js")
            await expect(message).to_contain_text("make ui")
            await expect(page.locator("#nodes")).to_contain_text("count_orders")
            await shoot(page, "missing-library")
            # Without the page's script at all, the same message.
            page = await browser.new_page(viewport={"width": 1400, "height": 800})
            await page.route("**/ui/app.js", lambda route: route.fulfill(status=404))
            await page.goto(home)
            await expect(page.locator("#load-error")).to_be_visible()
            await expect(page.locator("#load-error")).to_contain_text("pip install")
            await browser.close()


TIMED = """
    import time

    @pipeline()
    def timed(spark, context):
        time.sleep(context.params["sleep_s"])
"""
VIEWPORTS = {"1400x900": (1400, 900), "1024x768": (1024, 768)}
"""The window sizes every page is checked at."""
READABLE_LABEL_PX = 12
"""The least a node's label is drawn at, in screen pixels."""

LAYOUT_CHECKS = Path(__file__).with_name("layout_checks.js")
"""The page's own checks of what does not fit (``window.layoutChecks``)."""


async def check_layout(page: Page, container: str) -> list[str]:
    """What does not fit on the page: the document, the header, the page, panel or sidebar
    wider than they are, a table cell in ``container`` past its edge, the header on two lines,
    chart axis labels on top of each other."""
    problems: list[str] = await page.evaluate(
        "(selectors) => layoutChecks.overflowing(selectors)",
        ["html", "body", "header", "main", "#page", "#panel", "#sidebar"],
    )
    problems += await page.evaluate("(c) => layoutChecks.cutOff(c)", container)
    problems += await page.evaluate("layoutChecks.wrappedHeader()")
    problems += await page.evaluate("layoutChecks.axisOverlaps()")
    return problems


async def visit(page: Page, route: str) -> None:
    """Open ``route`` and wait for the poll after it: the charts take their width then."""
    polls = await page.evaluate("window.triggerer.polls")
    await page.evaluate("(route) => { location.hash = route; }", route)
    await page.wait_for_function(f"window.triggerer.polls >= {polls + 2}")


async def shoot_page(page: Page, name: str) -> None:
    """A screenshot in ``var/screenshots/pages/`` (Playwright makes the folder), its path
    printed in the test's output."""
    path = SCREENSHOTS / "pages" / f"{name}.png"
    await page.screenshot(path=path)
    print(f"screenshot: {path}")  # noqa: T201 - where to look, in the test's output


@pytest.mark.timeout(600)  # five Spark runs, two window sizes, on a machine shared with others
async def test_every_page_fits_at_two_window_sizes_with_readable_labels_and_true_captions(
    deployment: Deployment,
) -> None:
    """Issue 29: the pipeline panel's runs table cut its events column off, the durations
    chart's time labels ran into each other, the graph stayed half hidden beside the open
    panel, the median of two runs was the longer one, the Runs timeline spanned a day whatever
    its runs, node labels were 9-10 px. Each page at two window sizes, in screenshots."""
    async with open_ui(deployment, more_pipelines=TIMED) as ui:
        page, client = ui.page, ui.client
        await page.add_script_tag(content=LAYOUT_CHECKS.read_text())
        await run_the_flow(deployment, client)
        for sleep_s in (1.2, 8.0):
            posted = await client.post(
                "/pipelines/timed/runs", json={"params": {"sleep_s": sleep_s}}
            )
            assert posted.status_code == 201, posted.text
            await deployment.wait_for(
                runs,
                lambda rows: not any(r.state in ("queued", "running") for r in rows),
                timeout_s=RUN_TIMEOUT_MS / 1000,
            )
        timed = (await client.get("/activity/runs?pipeline_id=timed")).json()["runs"]
        assert [run["state"] for run in timed] == ["success", "success"]
        shorter, longer = sorted(run["duration_s"] for run in timed)
        listed = (await client.get("/runs")).json()
        first_start = min(datetime.fromisoformat(r["start_date"]).timestamp() for r in listed)
        problems: dict[str, list[str]] = {}

        for size, (width, height) in VIEWPORTS.items():
            await page.set_viewport_size({"width": width, "height": height})

            await visit(page, "#/")
            await expect(page.locator("#panel")).to_be_hidden()
            problems[f"{size} lineage"] = await check_layout(page, "#sidebar")
            problems[f"{size} lineage labels"] = await page.evaluate(
                "(px) => layoutChecks.smallLabels(px)", READABLE_LABEL_PX
            )
            if width >= 1400:  # room enough for this small graph at a readable zoom
                problems[f"{size} lineage in view"] = await page.evaluate(
                    "layoutChecks.outOfView()"
                )
            await shoot_page(page, f"{size}-lineage")

            # The panel of timed: its runs table and chart fit, the caption's median is the
            # mean of the middle two, the graph beside the panel shows the selected node.
            await visit(page, "#/pipeline/timed")
            caption = page.locator("[data-chart='durations-timed'] figcaption")
            await expect(caption).to_contain_text(
                f"median {(shorter + longer) / 2:.1f}s, longest {longer:.1f}s", timeout=CHART_MS
            )
            await expect(page.locator("#panel tr[data-run-id]")).to_have_count(2)
            problems[f"{size} pipeline panel"] = await check_layout(page, "#panel")
            problems[f"{size} durations chart's windows"] = await page.evaluate(
                "layoutChecks.axisOverlapsOverWindows('durations-timed')"
            )
            problems[f"{size} graph beside the panel"] = await page.evaluate(
                "[...layoutChecks.graphUnderPanel(), ...layoutChecks.outOfView('pipeline:timed')]"
            )
            problems[f"{size} panel labels"] = await page.evaluate(
                "(px) => layoutChecks.smallLabels(px)", READABLE_LABEL_PX
            )
            await shoot_page(page, f"{size}-pipeline-panel")
            # The panel of the graph's last node: the graph moves to show it beside the panel.
            await visit(page, "#/pipeline/publish")
            await expect(page.locator("#panel h1")).to_have_text("publish")
            problems[f"{size} publish beside its panel"] = await page.evaluate(
                "layoutChecks.outOfView('pipeline:publish')"
            )
            await shoot_page(page, f"{size}-pipeline-panel-publish")

            # The Runs page: its timeline spans its runs (from a little before the first, 5
            # minutes at least) to now, not the day they sit at the end of.
            await visit(page, "#/runs")
            await expect(page.locator("tr[data-run-id]")).to_have_count(len(listed))
            shown = await page.evaluate(
                """() => ({
                    ...window.triggerer.charts.get("runs-timeline").scales.x,
                    now: Date.now() / 1000,
                })"""
            )
            margin = max(shown["now"] - first_start, 300)
            if not (
                first_start - margin <= shown["min"] <= first_start
                and abs(shown["max"] - shown["now"]) < 60
            ):
                problems[f"{size} runs timeline"] = [f"{shown} for a first run at {first_start}"]
            problems[f"{size} runs"] = await check_layout(page, "#page")
            await shoot_page(page, f"{size}-runs")

            await visit(page, f"#/run/{listed[0]['run_id']}")
            await expect(page.locator("#page h1")).to_contain_text("Run ")
            problems[f"{size} run"] = await check_layout(page, "#page")
            await shoot_page(page, f"{size}-run")

            await visit(page, "#/watchers")
            await expect(page.locator("tr[data-watcher=orders_topic]")).to_be_visible()
            problems[f"{size} watchers"] = await check_layout(page, "#page")
            await shoot_page(page, f"{size}-watchers")

            await visit(page, "#/dead-letters")
            await expect(page.locator("#page h1")).to_have_text("Dead letters")
            problems[f"{size} dead letters"] = await check_layout(page, "#page")
            await shoot_page(page, f"{size}-dead-letters")
        found = [f"{where}: {problem}" for where, some in problems.items() for problem in some]
        assert found == [], "\n".join(found)


RED = "rgb(179, 38, 30)"
"""The red of a failing watcher's state in the Nodes list (#b3261e)."""
RED_FILL = "rgb(248,215,212)"
"""A failing watcher's fill on the graph (#f8d7d4), as cytoscape gives it."""
GREEN_FILL = "rgb(230,244,234)"
"""A watcher's fill otherwise (#e6f4ea)."""


@pytest.mark.timeout(180)
async def test_a_recovered_watcher_is_drawn_running_with_its_error_as_history(
    tmp_path: Path,
) -> None:
    """Issue 29: a watcher that failed on a missing source and ran once the source was made
    stayed red on the graph, in the Nodes list and on the Watchers page."""
    deployment, config, folder = recovery_deployment(tmp_path, sqlite_url(tmp_path))
    with deployment.process_with_config(config) as daemon:
        daemon.start()
        await daemon.wait_logged("api_listening")
        url = api_url(daemon)
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
            page = await browser.new_page(viewport={"width": 1400, "height": 900})
            errors = collect_errors(page)
            await page.goto(url.removesuffix("/api/v1") + "/")
            node = "window.triggerer.cy?.nodes(\"[kind = 'watcher']\")"
            await page.wait_for_function(f"{node}?.hasClass('failing')")
            assert await page.evaluate(f"{node}.style('background-color')") == RED_FILL
            entry = page.locator("#nodes [data-node^='watcher:'] .node-state")
            await expect(entry).to_have_css("color", RED)
            await shoot(page, "watcher-failing")

            folder.mkdir()
            await page.wait_for_function(
                f"{node}.hasClass('running')", timeout=RECOVERY_TIMEOUT_S * 1000
            )
            assert await page.evaluate(f"{node}.style('background-color')") == GREEN_FILL
            await expect(entry).to_contain_text("running · recovered")
            await expect(entry).not_to_have_css("color", RED)
            await shoot(page, "watcher-recovered")

            await page.evaluate("location.hash = '#/watchers'")
            row = page.locator("tr[data-watcher=invoices_files]")
            await expect(row.locator("[data-error=recovered]")).to_contain_text(
                "Recovered (it has polled since). Last error at"
            )
            await expect(row.locator("[data-error=recovered]")).to_contain_text("invoices")
            await expect(row.locator(".error")).to_have_count(0)
            await shoot(page, "watchers-recovered")
            await browser.close()
    assert errors == []


SILENT = """
    import time
    from pathlib import Path

    @pipeline()
    def silent(spark, context):
        while Path(HOLD).exists():
            time.sleep(0.05)
"""


@pytest.mark.timeout(300)
async def test_an_empty_log_box_says_why_the_log_is_empty(
    deployment: Deployment, tmp_path: Path
) -> None:
    hold = tmp_path / "hold"
    hold.touch()
    silent = SILENT.replace("HOLD", repr(str(hold)))
    async with open_ui(deployment, "#/pipeline/silent", more_pipelines=silent) as ui:
        page = ui.page
        await expect(page.locator("#panel h1")).to_have_text("silent")
        run_id = (await ui.client.post("/pipelines/silent/runs")).json()["run_id"]
        running = page.locator("tr[data-run-state=running] button[data-log]")
        await running.click(timeout=RUN_TIMEOUT_MS)
        box = page.locator("#panel pre.log")
        await expect(box).to_have_text("no log: the run has printed nothing yet")
        await expect(box).to_have_attribute("data-log-empty", "no_output_yet")

        # Cancelled having printed nothing: the box says so, not an empty grey box.
        assert (await ui.client.post(f"/runs/{run_id}/cancel")).status_code == 200
        cancelled = page.locator("tr[data-run-state=cancelled] button[data-log]")
        await cancelled.click(timeout=RUN_TIMEOUT_MS)
        await expect(box).to_have_text("no log: the run printed nothing")
        await expect(box).to_have_attribute("data-log-empty", "no_output")
        await shoot(page, "log-empty")
        await page.evaluate(f"location.hash = '#/run/{run_id}'")
        await expect(page.locator("#page pre.log")).to_have_text("no log: the run printed nothing")


WAITING = """
    from datetime import timedelta

    from triggerer import Batch

    invoices, payments = Asset("invoices"), Asset("payments")
    clicks, edits = Asset("clicks"), Asset("edits")

    @pipeline(schedule=(invoices & payments).within(timedelta(hours=1)))
    def paired(spark, context):
        pass

    @pipeline(schedule=clicks, batch=Batch(max_events=5, max_wait_s=3600))
    def batched(spark, context):
        pass

    @pipeline(schedule=edits, debounce_s=3600)
    def debounced(spark, context):
        pass

    @pipeline(schedule=orders, max_backlog=1)
    def throttled(spark, context):
        pass
"""
"""A windowed AND, a batch and a debounce, each an hour: nothing runs while the test looks;
and the only pipeline fed by the topic, whose backlog of one holds the watcher back."""
BY = r"by \d\d:\d\d:\d\d \(in 5\dm \d+s\)"
"""A countdown of the hour, a few seconds in: ``by 13:04:05 (in 59m 58s)``."""


async def seconds_left(page: Page, selector: str) -> int:
    """The seconds of the countdown ``in 59m 58s`` in ``selector``."""
    text = await page.locator(selector).inner_text()
    found = re.search(r"in (\d+)m (\d+)s", text)
    assert found, text
    return int(found[1]) * 60 + int(found[2])


@pytest.mark.timeout(180)
async def test_windows_batches_debounce_and_a_held_watcher_show_their_times(
    deployment: Deployment,
) -> None:
    """Issue 31: an AND's window says when each waiting asset's oldest event expires, a batch
    its count and a debounce the time left before the run, counting down on the panel and on
    the graph; a watcher held back by a full backlog names the pipeline, not in red."""
    async with open_ui(deployment, pipelines=WAITING) as ui:
        page, client = ui.page, ui.client
        paused = await client.patch("/pipelines/throttled", json={"paused": True})
        assert paused.status_code == 200, paused.text
        await deployment.produce([{"n": n} for n in range(3)])
        for uri in ("invoices", "clicks", "clicks", "edits"):
            posted = await client.post("/assets/events", json={"uri": uri})
            assert posted.status_code == 201, posted.text

        # The window: the panel says when invoices' event expires, the gate too.
        await visit(page, "#/pipeline/paired")
        await expect(page.locator("[data-operand=invoices]")).to_have_text(
            re.compile(rf"invoices: 1 queued since .* its oldest expires {BY} \(window 1h\)")
        )
        await expect(page.locator("[data-operand=payments]")).to_have_text(
            "payments: missing · window 1h"
        )
        await page.wait_for_function(
            "/^AND\\nwithin 1h\\ninvoices 5\\dm \\d+s left$/"
            ".test(window.triggerer.cy.$id('gate:paired').data('label'))"
        )
        gate = page.locator("#nodes [data-node='gate:paired'] .node-state")
        await expect(gate).to_contain_text("within 1h · invoices 5")
        await shoot(page, "window")

        # The batch: its count, and the time left before the run, counting down.
        await visit(page, "#/pipeline/batched")
        await expect(page.locator("[data-hold=batch]")).to_have_text(
            "Batch: 2 of 5 events queued (clicks 2); a run takes them at 5, or 1h after the"
            " oldest was queued."
        )
        until = page.locator("[data-hold=until]")
        await expect(until).to_have_text(re.compile(rf"The run starts {BY} at the latest\."))
        before = await seconds_left(page, "[data-hold=until]")
        await visit(page, "#/pipeline/batched")
        assert await seconds_left(page, "[data-hold=until]") < before
        await page.wait_for_function(
            "window.triggerer.cy.$id('pipeline:batched').data('label')"
            ".includes('batch 2/5 · runs in 5')"
        )
        await shoot(page, "batch")

        # The debounce: the quiet time left.
        await visit(page, "#/pipeline/debounced")
        await expect(page.locator("[data-hold=debounce]")).to_have_text(
            "Debounce: a run starts once no event has come for 1h (1 queued: edits 1)."
        )
        await expect(until).to_have_text(
            re.compile(rf"The run starts {BY} if no event comes before\.")
        )
        await page.wait_for_function(
            "window.triggerer.cy.$id('pipeline:debounced').data('label')"
            ".includes('quiet · runs in 5')"
        )

        # The watcher held back by the paused pipeline's full backlog: named, amber, not red.
        node = "window.triggerer.cy.nodes(\"[kind = 'watcher']\")"
        await page.wait_for_function(f"{node}.hasClass('held')", timeout=RUN_TIMEOUT_MS)
        assert "held by throttled" in await page.evaluate(f"{node}.data('label')")
        assert await page.evaluate(f"{node}.style('background-color')") == GREEN_FILL
        entry = page.locator("#nodes [data-node^='watcher:'] .node-state")
        await expect(entry).to_contain_text("held by throttled")
        await expect(entry).not_to_have_css("color", RED)
        await tap(page, await page.evaluate(f"{node}.id()"))
        await expect(page.locator("#panel [data-held-by=throttled]")).to_contain_text(
            "Held back by throttled: its backlog is full (max_backlog)"
        )
        await shoot(page, "watcher-held")
        await visit(page, "#/watchers")
        await expect(page.locator("tr[data-watcher=orders_topic] [data-held-by]")).to_have_text(
            "held by throttled"
        )


AUDITED = """
    from triggerer import Asset, pipeline

    @pipeline(schedule=Asset("orders"))
    def count_orders(spark, context):
        pass
"""
AUDIT_PRINCIPALS = """
[[api.principals]]
name = "on-call"
role = "operator"
token = "t-on-call"

[[api.principals]]
name = "dashboard"
role = "viewer"
token = "t-dashboard"
"""


@pytest.mark.timeout(180)
async def test_a_pipelines_panel_shows_its_last_changes_to_a_role_that_may_read_them(
    tmp_path: Path,
) -> None:
    deployment = Deployment(tmp_path, sqlite_url(tmp_path), "sc://127.0.0.1:1", "", "")
    deployment.write_pipelines(AUDITED)
    config = deployment.config_file(api={"enabled": True, "port": 0, "tokens": [TOKEN]})
    with config.open("a") as file:
        file.write(AUDIT_PRINCIPALS)
    with deployment.process_with_config(config) as daemon:
        daemon.start()
        await daemon.wait_logged("pipelines_loaded")
        await daemon.wait_logged("api_listening")
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
            page = await browser.new_page(viewport={"width": 1400, "height": 800})
            errors = collect_errors(page)
            await page.goto(api_url(daemon).removesuffix("/api/v1") + "/#/pipeline/count_orders")
            await page.fill("#token-input", "t-on-call")
            await page.click("#token-save")
            await expect(page.locator("#panel h1")).to_have_text("count_orders")
            await expect(page.locator("#panel")).to_contain_text("none recorded")

            # Each change is a row, newest first, naming who made it.
            changes = page.locator("#panel table.changes tr[data-action]")
            await page.click("#toggle-pause")
            await expect(changes).to_have_count(1)
            await page.click("#toggle-pause")
            await expect(changes).to_have_count(2)
            await expect(changes.nth(0)).to_contain_text("on-call")
            await expect(changes.nth(0)).to_contain_text("unpause")
            await expect(changes.nth(1)).to_have_attribute("data-action", "pause")

            # Cancelling one of its runs is its change too, though the run is the target. (The
            # run cannot end before: it waits for a Spark that is not there.)
            headers = {"Authorization": "Bearer t-on-call"}
            async with httpx.AsyncClient(base_url=api_url(daemon), headers=headers) as client:
                run_id = (await client.post("/pipelines/count_orders/runs")).json()["run_id"]
                assert (await client.post(f"/runs/{run_id}/cancel")).status_code == 200
            await expect(changes).to_have_count(4)
            await expect(changes.nth(0)).to_have_attribute("data-action", "cancel")
            await expect(changes.nth(0)).to_contain_text(f"cancel {run_id}")
            await expect(changes.nth(1)).to_have_attribute("data-action", "trigger")
            await shoot(page, "pipeline-changes")

            # A viewer may not read the audit log: no such section, and no error.
            await page.evaluate("sessionStorage.setItem('triggerer.token', 't-dashboard')")
            await page.reload()
            await expect(page.locator("#whoami")).to_have_text("dashboard · viewer")
            await expect(page.locator("#panel h1")).to_have_text("count_orders")
            polls = await page.evaluate("window.triggerer.polls")
            await page.wait_for_function(f"window.triggerer.polls >= {polls + 2}")
            await expect(page.locator("#panel h2", has_text="Last changes")).to_have_count(0)
            await expect(page.locator("#panel .error")).to_have_count(0)
            await browser.close()
    assert errors == []
