"""The web UI at ``/`` in Debian's Chromium (Playwright, headless), through ``triggerer run``:
the lineage graph of the demo-like pipelines, the explain text of the AND pipeline, the event
trace of a Kafka message down to the downstream run, an event created in the dialog starting a
run that shows up without a reload, the watchers and dead-letters pages; no console errors.

Each page's screenshot is written to ``var/screenshots/`` (the README shows the graph's)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from playwright.async_api import ConsoleMessage, Page, async_playwright, expect

from tests.e2e.daemon import ORDERS
from tests.e2e.test_api import api_url
from triggerer.service.api.app import STATIC

if TYPE_CHECKING:
    from tests.e2e.daemon import Deployment

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
VENDOR = STATIC / "vendor" / ".built"
SCREENSHOTS = Path(__file__).parents[2] / "var" / "screenshots"
TOKEN = "ui-token"  # noqa: S105 - the token this test configures
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

pytestmark = pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium")


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

            # The token prompt comes first; the token opens the graph.
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
            await page.evaluate("window.triggerer.cy.$id('group:reports').emit('tap')")
            await page.wait_for_function(
                "window.triggerer.cy.nodes(\"[kind = 'asset'][name = 'report']\").length === 1"
            )
            assert await page.input_value("#search") == "reports"
            await browser.close()
    assert errors == []


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
