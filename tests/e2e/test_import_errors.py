"""Pipeline files that fail to load, through ``triggerer run --config FILE``: each is named
with its line and the traceback's last frames, whether the pipelines folder is relative (as
in the demo's config) or absolute, in ``triggerer pipelines list`` (a row per broken file, in
the table and in ``--json``), in ``GET /api/v1/importErrors`` and as a banner in the UI
(Debian's Chromium); fixing a file clears its error. The UI's pipeline panel lists its runs
with their id, state, start and duration.

Screenshots go to ``var/screenshots/`` as in ``test_ui.py``."""

from __future__ import annotations

import json
import re
import shutil
import textwrap
from typing import TYPE_CHECKING, Any

import anyio
import httpx
import pytest
from playwright.async_api import ConsoleMessage, async_playwright, expect

from tests.e2e.daemon import Deployment, sqlite_url, triggerer_cli, without_triggerer_variables
from tests.e2e.test_api import api_url
from tests.e2e.test_ui import CHROMIUM, RUN_TIMEOUT_MS, VENDOR, shoot

if TYPE_CHECKING:
    from pathlib import Path

NO_SPARK = "sc://127.0.0.1:1"  # no pipeline runs in the listing test
WAIT_S = 30.0
"""How long a reload of the folder may take to show (it is checked every 0.2 s)."""

GOOD = """
    from triggerer import Asset, pipeline

    @pipeline(schedule=Asset("orders"))
    def count_orders(spark, context):
        pass
"""
BROKEN = """\
from triggerer import Asset, pipeline

def settings():
    return dict(master=spark_master)

conf = settings()

@pipeline(schedule=Asset("orders"))
def daily(spark, context):
    pass
"""
FIXED = "spark_master = 'local[1]'\n" + BROKEN
ALSO_BROKEN = "import json\n\nlimits = json.loads('{')\n"
NAME_ERROR = "NameError: name 'spark_master' is not defined"


async def listed(config: Path, *arguments: str) -> str:
    """The output of ``triggerer --config CONFIG pipelines list ARGUMENTS``."""
    done = await triggerer_cli(
        without_triggerer_variables(), "--config", str(config), "pipelines", "list", *arguments
    )
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode()


async def import_errors_when(
    client: httpx.AsyncClient, api: str, files: list[str]
) -> list[dict[str, Any]]:
    """``GET /importErrors`` once it names ``files`` (in order)."""
    with anyio.fail_after(WAIT_S):
        while True:
            response = await client.get(f"{api}/importErrors")
            assert response.status_code == 200, response.text
            rows: list[dict[str, Any]] = response.json()
            if [row["fileloc"] for row in rows] == files:
                return rows
            await anyio.sleep(0.2)


@pytest.mark.parametrize("relative", [True, False], ids=["relative_folder", "absolute_folder"])
async def test_broken_pipeline_files_are_listed_with_their_line_until_fixed(
    tmp_path: Path, relative: bool
) -> None:
    """Was: line None with a relative folder, and the error only in the daemon's log."""
    deployment = Deployment(tmp_path, sqlite_url(tmp_path), NO_SPARK, bootstrap="", topic="")
    folder = tmp_path / "pipelines"
    deployment.write_pipelines(GOOD, name="good.py")
    broken = folder / "broken.py"
    broken.write_text(BROKEN)
    (folder / "also_broken.py").write_text(ALSO_BROKEN)
    # The daemon runs in tmp_path: "pipelines" is the folder there, as the demo's
    # "config/pipelines" is in the checkout.
    shown = "pipelines" if relative else str(folder)
    config = deployment.config_file(
        pipelines={"dir": shown}, api={"enabled": True, "port": 0, "tokens": []}
    )

    with deployment.process_with_config(config, cwd=tmp_path) as daemon:
        daemon.start()
        (loaded,) = await daemon.wait_logged("pipelines_loaded")
        await daemon.wait_logged("api_listening")
        failed = await daemon.wait_logged("pipeline_file_failed", times=2)
        assert loaded["errors"] == 2
        assert {(f["path"], f["line"]) for f in failed} == {
            (f"{shown}/also_broken.py", 3),
            (f"{shown}/broken.py", 4),
        }

        # The table: a row per broken file, its file at its line, after the pipelines.
        table = (await listed(config)).splitlines()
        assert table[0].split()[0] == "PIPELINE_ID"
        assert table[1].split()[0] == "count_orders"
        assert [line.split()[:2] for line in table[2:]] == [
            ["-", "-"],
            ["-", "-"],
        ]
        assert f"{shown}/also_broken.py:3" in table[2]
        assert "JSONDecodeError: Expecting property name" in table[2]
        assert f"{shown}/broken.py:4" in table[3]
        assert table[3].rstrip().endswith(NAME_ERROR)

        # --json: the pipelines' rows, then the broken files' as the API gives them.
        rows = json.loads(await listed(config, "--json"))
        assert [row.get("pipeline_id") for row in rows] == ["count_orders", None, None]
        also, bad = rows[1:]
        assert (bad["fileloc"], bad["line"], bad["error"]) == (f"{shown}/broken.py", 4, NAME_ERROR)
        assert (also["fileloc"], also["line"]) == (f"{shown}/also_broken.py", 3)
        # The traceback's last frames, from the file on, as Python prints them: the frames
        # name the file as Python does, by its absolute path.
        assert bad["traceback"] == (
            "Traceback (most recent call last):\n"
            f'  File "{broken}", line 6, in <module>\n'
            "    conf = settings()\n"
            "           ^^^^^^^^^^\n"
            f'  File "{broken}", line 4, in settings\n'
            "    return dict(master=spark_master)\n"
            "                       ^^^^^^^^^^^^\n"
            f"{NAME_ERROR}\n"
        )

        api = api_url(daemon)
        async with httpx.AsyncClient() as client:
            assert (await client.get(f"{api}/importErrors")).json() == [also, bad]
            pipelines = (await client.get(f"{api}/pipelines")).json()
            assert [p["pipeline_id"] for p in pipelines] == ["count_orders"]

            # Fixing a file clears its error, and its pipeline loads.
            broken.write_text(FIXED)
            assert await import_errors_when(client, api, [also["fileloc"]]) == [also]
            (folder / "also_broken.py").write_text("limits = {}\n")
            await import_errors_when(client, api, [])
        table = (await listed(config)).splitlines()
        assert [line.split()[0] for line in table[1:]] == ["count_orders", "daily"]
        assert [row["pipeline_id"] for row in json.loads(await listed(config, "--json"))] == [
            "count_orders",
            "daily",
        ]


NIGHTLY = """
    from triggerer import pipeline

    @pipeline(schedule=None)
    def nightly(spark, context):
        if context.params.get("fail"):
            raise ValueError("asked to fail")
        spark.range(3).count()
"""
TOKEN = "ui-token"  # noqa: S105 - the token this test configures


@pytest.mark.timeout(300)
@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium")
async def test_ui_shows_broken_files_in_a_banner_and_runs_with_id_state_start_duration(
    tmp_path: Path, spark_remote: str
) -> None:
    assert VENDOR.exists(), "the UI's graph libraries are missing: run `make ui`"
    deployment = Deployment(tmp_path, sqlite_url(tmp_path), spark_remote, bootstrap="", topic="")
    deployment.write_pipelines(NIGHTLY, name="nightly.py")
    broken = tmp_path / "pipelines" / "broken.py"
    broken.write_text(BROKEN)
    config = deployment.config_file(
        pipelines={"dir": "pipelines"}, api={"enabled": True, "port": 0, "tokens": [TOKEN]}
    )
    errors: list[str] = []

    def console(message: ConsoleMessage) -> None:
        if message.type == "error":
            errors.append(f"{message.text} at {message.location}")

    with deployment.process_with_config(config, cwd=tmp_path) as daemon:
        daemon.start()
        await daemon.wait_logged("pipelines_loaded")
        await daemon.wait_logged("api_listening")
        api = api_url(daemon)
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}) as client:
            run_ids = []
            for params in ({}, {"fail": True}):
                created = await client.post(
                    f"{api}/pipelines/nightly/runs", json={"params": params}
                )
                assert created.status_code == 201, created.text
                run_ids.append(created.json()["run_id"])

        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
            page = await browser.new_page(viewport={"width": 1400, "height": 800})
            page.on("console", console)
            page.on("pageerror", lambda error: errors.append(f"uncaught: {error}"))
            await page.goto(api.removesuffix("/api/v1") + "/")
            await page.fill("#token-input", TOKEN)
            await page.click("#token-save")

            # The banner: the file at its line, the error; the traceback under it.
            banner = page.locator("#import-errors")
            await expect(banner).to_be_visible()
            await expect(banner.locator("strong")).to_have_text("1 pipeline file failed to load")
            item = banner.locator('[data-import-error="pipelines/broken.py"]')
            await expect(item.locator("summary")).to_contain_text(
                f"pipelines/broken.py:4 {NAME_ERROR}"
            )
            await item.locator("summary").click()
            await expect(item.locator("pre")).to_contain_text(f'"{broken}", line 4, in settings')
            await expect(item.locator("pre")).to_contain_text(f'"{broken}", line 6, in <module>')

            # The runs of the pipeline's panel: id (without the pipeline's), state, start,
            # duration.
            await page.evaluate("location.hash = '#/pipeline/nightly'")
            await expect(page.locator("#panel h1")).to_have_text("nightly")
            runs = page.locator("#panel table.runs tr[data-run-id]")
            for run_id, run_state in zip(run_ids, ("success", "failed"), strict=True):
                await expect(page.locator(f'tr[data-run-id="{run_id}"]')).to_have_attribute(
                    "data-run-state", run_state, timeout=RUN_TIMEOUT_MS
                )
            await expect(runs).to_have_count(2)
            headers = await page.locator("#panel table.runs th").all_inner_texts()
            assert headers == ["run (log), start", "state", "duration", "events"]
            for run_id in run_ids:
                row = page.locator(f'tr[data-run-id="{run_id}"]')
                cells = await row.locator("td").all_inner_texts()
                short_id, start = cells[0].replace("\u200b", "").splitlines()
                assert short_id == run_id.removeprefix("nightly__")
                assert short_id.startswith("manual__")
                assert await row.locator("td").first.get_attribute("title") == run_id
                assert re.fullmatch(r"\d{1,2}:\d{2}:\d{2}(\s[AP]M)?", start), cells
                assert re.fullmatch(r"\d+\.\ds", cells[2]), cells
                assert await row.locator("td").first.locator("span[title]").get_attribute("title")
            assert [
                await page.locator(f'tr[data-run-id="{run_id}"] td span.state').inner_text()
                for run_id in run_ids
            ] == ["success", "failed"]
            # A run's id opens its log.
            await page.click(f'tr[data-run-id="{run_ids[0]}"] button[data-log]')
            await expect(page.locator("#panel h3")).to_have_text(f"Log of {run_ids[0]}")
            await expect(page.locator("#panel pre.log")).to_be_visible()
            # The open traceback stays open while the page polls.
            await page.wait_for_function("window.triggerer.polls >= 3")
            assert await item.get_attribute("open") == ""
            await shoot(page, "import-errors")

            # Fixed: the banner goes.
            broken.write_text(textwrap.dedent(FIXED))
            await expect(banner).to_be_hidden(timeout=WAIT_S * 1000)
            await page.evaluate("location.hash = '#/pipeline/daily'")
            await expect(page.locator("#panel h1")).to_have_text("daily")
            await page.evaluate("location.hash = '#/pipeline/nightly'")
            await expect(runs).to_have_count(2)
            await shoot(page, "pipeline-runs")
            await browser.close()
    assert errors == []
