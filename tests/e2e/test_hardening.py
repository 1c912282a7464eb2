"""Inputs that used to stop the daemon (and stop it again on every restart) now fail alone."""

from __future__ import annotations

import itertools
import json
from typing import TYPE_CHECKING

from sqlalchemy import select

from tests.e2e.daemon import (
    ORDERS,
    events_of,
    pipeline_row,
    runs,
    trigger_rows,
    triggerer_cli,
)
from triggerer.service.store import models

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

    from tests.e2e.daemon import Deployment


def finished(all_runs: list[models.Run], count: int) -> bool:
    return len(all_runs) == count and all(r.state in ("success", "failed") for r in all_runs)


ALIASED = """
    from triggerer import AssetAlias

    shipped = AssetAlias("shipped")
    eu = Asset("s3://lake/eu", group="gold", extra={{"owner": "eu-team"}})

    @pipeline(schedule=orders, outlets=[shipped])
    def ship(spark, context):
        context.outlet_events[shipped].add(eu)
        context.outlet_events[shipped].add(Asset("s3://lake/us"))

    @pipeline(schedule=shipped, outlets=[Asset("report")])
    def on_shipped(spark, context):
        sources = sorted(
            (asset.uri, event.source_run_id)
            for asset, events in context.triggering_asset_events.items()
            for event in events
        )
        yield Metadata(Asset("report"), {{"sources": sources}})
"""


async def aliased_events(session: AsyncSession) -> list[tuple[str, str]]:
    rows = await session.execute(
        select(models.Asset.uri, models.AssetAlias.name)
        .join(models.AssetEvent, models.AssetEvent.asset_id == models.Asset.id)
        .join(models.AssetEventAlias, models.AssetEventAlias.event_id == models.AssetEvent.id)
        .join(models.AssetAlias, models.AssetAlias.id == models.AssetEventAlias.alias_id)
        .order_by(models.Asset.uri)
    )
    return [(uri, alias) for uri, alias in rows.all()]


async def test_two_assets_added_through_one_alias_with_equal_extra(
    deployment: Deployment,
) -> None:
    """Was: the daemon exited when the run ended, and again on every restart. Also: the
    downstream run sees which run produced its events, and the outlet keeps its definition."""
    deployment.write_pipelines(ORDERS + ALIASED)

    async with deployment.running():
        await deployment.produce([{"n": 1}])
        done = await deployment.wait_for(runs, lambda rs: finished(rs, 2))

    ship, on_shipped = done
    assert [(r.pipeline_id, r.state) for r in done] == [
        ("ship", "success"),
        ("on_shipped", "success"),
    ]
    assert await deployment.query(aliased_events) == [
        ("s3://lake/eu", "shipped"),
        ("s3://lake/us", "shipped"),
    ]
    (report,) = await deployment.query(lambda s: events_of(s, "report"))
    assert report.extra == {
        "sources": [["s3://lake/eu", ship.run_id], ["s3://lake/us", ship.run_id]]
    }
    assert {e.source_run_pk for e in await deployment.query(lambda s: events_of(s, "report"))} == {
        on_shipped.id
    }

    async def eu_row(session: AsyncSession) -> models.Asset:
        return (
            await session.scalars(select(models.Asset).where(models.Asset.uri == "s3://lake/eu"))
        ).one()

    eu = await deployment.query(eu_row)
    assert (eu.group, eu.extra) == ("gold", {"owner": "eu-team"})


UNSERIALIZABLE = """
    class SecretiveTrigger(BaseEventTrigger):
        def __init__(self, label):
            self.label = label

        def serialize(self):
            raise RuntimeError(f"secretive trigger {{self.label}} will not say")

        async def run(self):
            yield

    hidden = Asset("hidden", watchers=[AssetWatcher("secretive", SecretiveTrigger("s1"))])

    @pipeline(schedule=orders)
    def counts(spark, context):
        assert spark.range(1).count() == 1
"""


async def test_trigger_whose_serialize_raises_fails_its_watcher_alone(
    deployment: Deployment,
) -> None:
    """Was: the daemon died at start and on reload. Started as users do, with a config file."""
    deployment.write_pipelines(ORDERS + UNSERIALIZABLE)
    config = deployment.config_file()

    with deployment.process_with_config(config) as daemon:
        daemon.start()
        await daemon.wait_logged("pipelines_loaded")
        await deployment.produce([{"n": 1}])
        await deployment.wait_for(runs, lambda rs: finished(rs, 1))
        # On reload too: a second file with the same kind of watcher.
        deployment.write_pipelines(
            ORDERS.replace('"orders"', '"orders2"')
            + UNSERIALIZABLE.replace('"hidden"', '"hidden2"').replace("def counts", "def counts2"),
            name="more.py",
        )
        await deployment.wait_for(lambda s: pipeline_row(s, "counts2"), lambda r: r is not None)
        listed = await triggerer_cli(
            deployment.env(), "--config", str(config), "watchers", "list", "--json"
        )
        assert daemon.process is not None
        assert daemon.process.poll() is None, daemon.tail()

    assert listed.returncode == 0, listed.stderr
    watchers = {w["watcher"]: w for w in json.loads(listed.stdout)}
    secretive = watchers["secretive"]
    assert secretive["state"] == "failed"
    assert "secretive trigger s1 will not say" in secretive["last_error"]
    assert [r.state for r in await deployment.query(runs)] == ["success"]
    failed = [t for t in await deployment.query(trigger_rows) if t.state == "failed"]
    assert len(failed) == 2


SLOW = """
    import time

    @pipeline(schedule=orders, run_policy="per_event")
    def slow(spark, context):
        time.sleep(1)
"""


async def test_runs_beyond_parallelism_wait_and_start_in_creation_order(
    deployment: Deployment,
) -> None:
    """Was: every run started at once (50 per-event runs, 50 JVMs on two cores)."""
    deployment.write_pipelines(ORDERS + SLOW)
    config = deployment.config_file(runs={"parallelism": 1})

    with deployment.process_with_config(config) as daemon:
        daemon.start()
        await daemon.wait_logged("pipelines_loaded")
        await deployment.produce([{"n": n} for n in range(3)])
        done = await deployment.wait_for(runs, lambda rs: finished(rs, 3))

    assert [r.state for r in done] == ["success"] * 3
    started = sorted(done, key=lambda r: r.start_date)
    assert [r.id for r in started] == [r.id for r in done]  # creation order
    for earlier, later in itertools.pairwise(started):
        assert earlier.end_date <= later.start_date, "two runs were in progress at once"


PARAMETRISED = """
    echo_out = Asset("echo_out")

    @pipeline(schedule=None, outlets=[echo_out], params={{"limit": 10, "mode": "full"}})
    def echo(spark, context):
        yield Metadata(echo_out, {{"params": context.params}})
"""


async def test_manual_run_gets_the_pipeline_default_params_under_the_given_ones(
    deployment: Deployment,
) -> None:
    """Was: a manual run saw only the params given on the command line."""
    deployment.write_pipelines(ORDERS + PARAMETRISED)

    async with deployment.running():
        await deployment.wait_for(lambda s: pipeline_row(s, "echo"), lambda r: r is not None)
        triggered = await triggerer_cli(
            deployment.env(), "pipelines", "trigger", "echo", "--params", '{"mode": "delta"}'
        )
        assert triggered.returncode == 0, triggered.stderr
        await deployment.wait_for(runs, lambda rs: finished(rs, 1))

    (event,) = await deployment.query(lambda s: events_of(s, "echo_out"))
    assert event.extra == {"params": {"limit": 10, "mode": "delta"}}


INGEST = """
    @pipeline(schedule=orders, run_policy="per_event")
    def ingest(spark, context):
        pass
"""


async def test_a_run_whose_log_folder_cannot_be_made_fails_alone(deployment: Deployment) -> None:
    """Was: the OSError of making the run's folder under [spark] logs_dir stopped the daemon,
    and again on every restart, as the run was claimed anew."""
    deployment.write_pipelines(ORDERS + INGEST)
    config = deployment.config_file()
    blocking = deployment.tmp_path / "logs" / "ingest"  # a file where the runs' folders go
    blocking.parent.mkdir(parents=True)
    blocking.write_text("")

    with deployment.process_with_config(config) as daemon:
        daemon.start()
        await daemon.wait_logged("pipelines_loaded")
        await deployment.produce([{"n": 1}])
        (failed,) = await deployment.wait_for(runs, lambda rs: finished(rs, 1))
        blocking.unlink()
        await deployment.produce([{"n": 2}])
        done = await deployment.wait_for(runs, lambda rs: finished(rs, 2))
        assert daemon.process is not None
        assert daemon.process.poll() is None, daemon.tail()

    assert failed.state == "failed"
    assert failed.error == (
        f"the run could not start: [Errno 20] Not a directory: '{blocking / failed.run_id}'"
    )
    assert done[1].state == "success"


NOT_JSON_PARAMS = """
    import datetime

    @pipeline(schedule=None, params={{"since": datetime.date(2024, 1, 1)}})
    def since(spark, context):
        pass
"""
TIMEDELTA_RETRY_DELAY = """
    import datetime

    @pipeline(schedule=None, retries=2, retry_delay_s=datetime.timedelta(minutes=5))
    def retried(spark, context):
        pass
"""
SURROGATE_IN_EXTRA = """
    import os

    sales = Asset("s3://lake/sales", extra={{"file": os.fsdecode(b"sales-\\xe9.csv")}})

    @pipeline(schedule=sales)
    def on_sales(spark, context):
        pass
"""
UNSTORABLE_DEFINITIONS = {
    "params.py": (NOT_JSON_PARAMS, "pipeline 'since' params must be JSON-serialisable"),
    "retry.py": (
        TIMEDELTA_RETRY_DELAY,
        "pipeline 'retried': retry_delay_s=datetime.timedelta(seconds=300); must be a number",
    ),
    "extra.py": (SURROGATE_IN_EXTRA, "Asset('s3://lake/sales') extra cannot be stored"),
}


async def test_definitions_the_store_cannot_hold_fail_their_file_alone(
    deployment: Deployment,
) -> None:
    """Was: non-JSON params stopped the daemon at the run's start, a timedelta retry delay at
    a failed try's end, an asset extra msgspec cannot encode at start; each on every restart."""
    deployment.write_pipelines(ORDERS + INGEST)
    for name, (source, _) in UNSTORABLE_DEFINITIONS.items():
        deployment.write_pipelines(ORDERS + source, name=name)

    with deployment.process_with_config(deployment.config_file()) as daemon:
        daemon.start()
        (loaded,) = await daemon.wait_logged("pipelines_loaded")
        failures = await daemon.wait_logged("pipeline_file_failed", times=3)
        await deployment.produce([{"n": 1}])
        (run,) = await deployment.wait_for(runs, lambda rs: finished(rs, 1))

    assert (loaded["pipelines"], loaded["errors"]) == (1, 3)
    for name, (_, reason) in UNSTORABLE_DEFINITIONS.items():
        assert any(name in f["error"] and reason in f["error"] for f in failures), failures
    assert (run.pipeline_id, run.state) == ("ingest", "success")


UNSTORABLE_OUTLET = """
    import os

    report = Asset("report")

    @pipeline(schedule=orders, run_policy="per_event", outlets=[report])
    def report_inputs(spark, context):
        context.outlet_events[report].extra = {{"inputs": [os.fsdecode(b"sales-\\xe9.csv")]}}
"""


async def test_a_run_whose_outlet_extra_the_store_cannot_hold_fails_alone(
    deployment: Deployment,
) -> None:
    """Was: a lone surrogate in an outlet's extra (a file name decoded by os.fsdecode) stopped
    the daemon on SQLite when it recorded the run's end, and again on every restart."""
    deployment.write_pipelines(ORDERS + UNSTORABLE_OUTLET)

    with deployment.process_with_config(deployment.config_file()) as daemon:
        daemon.start()
        await daemon.wait_logged("pipelines_loaded")
        await deployment.produce([{"n": 1}, {"n": 2}])
        done = await deployment.wait_for(runs, lambda rs: finished(rs, 2))
        assert daemon.process is not None
        assert daemon.process.poll() is None, daemon.tail()

    assert [r.state for r in done] == ["failed", "failed"]
    assert all(
        r.error is not None
        and r.error.startswith("its outlet events could not be recorded: the event of 'report'")
        and "surrogates not allowed" in r.error
        for r in done
    ), [r.error for r in done]
    assert await deployment.query(lambda s: events_of(s, "report")) == []
