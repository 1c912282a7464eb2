"""What the daemon does when pipelines, triggers or pipeline files fail, and when they change."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import anyio
from structlog.testing import capture_logs

from tests.e2e.daemon import (
    ORDERS,
    WAIT_TIMEOUT_S,
    consumed,
    events_of,
    pipeline_row,
    queued_events,
    runs,
    trigger_rows,
    triggerer_cli,
)

if TYPE_CHECKING:
    from tests.e2e.daemon import Deployment
    from triggerer.service.store import models


def by_pipeline(all_runs: list) -> dict[str, list[str]]:
    """Run states per pipeline, oldest run first."""
    result: dict[str, list[str]] = {}
    for run in all_runs:
        result.setdefault(run.pipeline_id, []).append(run.state)
    return result


async def wait_for_runs(
    deployment: Deployment, expected: dict[str, list[str]], *, timeout_s: float = WAIT_TIMEOUT_S
) -> list[models.Run]:
    """All runs, once their states per pipeline (see :func:`by_pipeline`) are ``expected``."""
    return await deployment.wait_for(
        runs, lambda rs: by_pipeline(rs) == expected, timeout_s=timeout_s
    )


FAILING = """
    boom_out = Asset("boom_out")

    @pipeline(schedule=orders, outlets=[boom_out])
    def boom(spark, context):
        assert spark.range(2).count() == 2
        raise RuntimeError("boom: the pipeline failed on purpose")

    @pipeline(schedule=boom_out)
    def after_boom(spark, context):
        pass

    @pipeline(schedule=orders)
    def witness(spark, context):
        pass
"""


async def test_failing_pipeline_emits_no_outlet_event_and_starts_no_downstream(
    deployment: Deployment,
) -> None:
    deployment.write_pipelines(ORDERS + FAILING)

    async with deployment.running():
        await deployment.produce([{"n": 1}])
        finished = await wait_for_runs(
            deployment, {"boom": ["failed"], "witness": ["success"]}, timeout_s=90
        )
        # A second message: the scheduler has looked at the pipelines again since the failure.
        await deployment.produce([{"n": 2}])
        finished = await wait_for_runs(
            deployment,
            {"boom": ["failed", "failed"], "witness": ["success", "success"]},
            timeout_s=90,
        )

    failed = [r for r in finished if r.pipeline_id == "boom"]
    assert all(r.try_number == 1 for r in failed)
    assert all(r.error and "exit code" in r.error for r in failed)
    assert failed[0].log_path is not None
    log_text = await anyio.Path(failed[0].log_path).read_text()
    assert "boom: the pipeline failed on purpose" in log_text
    assert await deployment.query(lambda s: events_of(s, "boom_out")) == []
    assert await deployment.query(lambda s: queued_events(s, "after_boom")) == []


FLAKY = """
    flaky_out = Asset("flaky_out")

    @pipeline(schedule=orders, outlets=[flaky_out], retries=1, retry_delay_s=0.1)
    def flaky(spark, context):
        if context.try_number == 1:
            raise RuntimeError("flaky: try 1 fails on purpose")
        yield Metadata(flaky_out, {{"try_number": context.try_number,
                                    "rows": spark.range(4).count()}})

    @pipeline(schedule=flaky_out)
    def after_flaky(spark, context):
        pass
"""


async def test_pipeline_retry_succeeds_with_exactly_one_outlet_event(
    deployment: Deployment,
) -> None:
    deployment.write_pipelines(ORDERS + FLAKY)

    async with deployment.running():
        await deployment.produce([{"n": 1}])
        finished = await wait_for_runs(
            deployment, {"flaky": ["success"], "after_flaky": ["success"]}, timeout_s=90
        )

    flaky, after = finished
    assert flaky.try_number == 2
    assert flaky.max_tries == 2
    first_try = anyio.Path(flaky.log_path).with_name("try-1.log")
    assert "flaky: try 1 fails on purpose" in await first_try.read_text()
    outlet = await deployment.query(lambda s: events_of(s, "flaky_out"))
    assert [e.extra for e in outlet] == [{"try_number": 2, "rows": 4}]
    orders = await deployment.query(lambda s: events_of(s, "orders"))
    assert await deployment.query(consumed) == {
        flaky.run_id: [orders[0].id],
        after.run_id: [outlet[0].id],
    }


EXPLODING = """
    class ExplodingTrigger(BaseEventTrigger):
        def __init__(self, label):
            self.label = label

        def serialize(self):
            return self.classpath(), {{"label": self.label}}

        async def run(self):
            raise RuntimeError(f"exploding trigger {{self.label}} failed on purpose")
            yield

    flaky_source = Asset("flaky_source", watchers=[
        AssetWatcher("exploding", ExplodingTrigger("x1"))])

    @pipeline(schedule=orders)
    def count_orders(spark, context):
        assert spark.range(1).count() == 1

    @pipeline(schedule=flaky_source)
    def never(spark, context):
        pass
"""


async def test_crashing_trigger_is_restarted_with_backoff_while_others_deliver(
    deployment: Deployment,
) -> None:
    deployment.write_pipelines(ORDERS + EXPLODING)

    def exploding(rows: list) -> object:
        (row,) = [r for r in rows if r.classpath.endswith(".ExplodingTrigger")]
        return row

    started = anyio.current_time()
    async with deployment.running():
        await deployment.produce([{"n": 1}])
        first = exploding(
            await deployment.wait_for(trigger_rows, lambda rs: exploding(rs).restart_count >= 1)
        )
        await wait_for_runs(deployment, {"count_orders": ["success"]})
        later = exploding(
            await deployment.wait_for(
                trigger_rows,
                lambda rs: exploding(rs).restart_count >= first.restart_count + 2,
                timeout_s=60,
            )
        )
        # The Kafka watcher still delivers while the other trigger keeps failing.
        await deployment.produce([{"n": 2}])
        await wait_for_runs(deployment, {"count_orders": ["success", "success"]})
        last = exploding(await deployment.query(trigger_rows))
    elapsed_s = anyio.current_time() - started

    assert later.state in ("backoff", "running")
    assert later.last_error == "RuntimeError: exploding trigger x1 failed on purpose"
    # Backoff doubles from 0.5-1 s: n failures need at least 0.5 * (2**(n-1) - 1) seconds.
    # Restarting without backoff would fail thousands of times in the same time.
    assert last.restart_count <= 1 + math.log2(2 * elapsed_s + 1) + 1
    kafka = [r for r in await deployment.query(trigger_rows) if "Kafka" in r.classpath]
    assert [(r.restart_count, r.last_error) for r in kafka] == [(0, None)]
    assert len(await deployment.query(lambda s: events_of(s, "orders"))) == 2
    assert await deployment.query(lambda s: events_of(s, "flaky_source")) == []


GOOD = """
    @pipeline(schedule=orders)
    def good(spark, context):
        assert spark.range(1).count() == 1
"""

BROKEN = """\
from triggerer import pipeline


@pipeline(schedule=None)
def broken(spark, context)
    pass
"""


async def test_broken_pipeline_file_is_reported_and_the_good_one_runs(
    deployment: Deployment,
) -> None:
    deployment.write_pipelines(ORDERS + GOOD)
    broken = deployment.write_pipelines(BROKEN, name="broken.py")

    with capture_logs() as logs:
        async with deployment.running():
            await deployment.produce([{"n": 1}])
            finished = await wait_for_runs(deployment, {"good": ["success"]})

    assert finished[0].pipeline_id == "good"
    assert await deployment.query(lambda s: pipeline_row(s, "broken")) is None
    failures = [e for e in logs if e["event"] == "pipeline_file_failed"]
    assert failures, logs
    assert all(e["log_level"] == "error" for e in failures)
    assert any(f"{broken}:5" in e["error"] and "SyntaxError" in e["error"] for e in failures)


LATE = """
    from triggerer import Asset, pipeline

    orders = Asset("orders")

    @pipeline(schedule=orders)
    def late(spark, context):
        assert spark.range(1).count() == 1
"""

BASE = """
    @pipeline(schedule=orders)
    def base(spark, context):
        pass
"""


async def test_pipeline_files_added_and_removed_while_running_are_picked_up(
    deployment: Deployment,
) -> None:
    deployment.write_pipelines(ORDERS + BASE)

    async with deployment.running():
        assert await deployment.query(lambda s: pipeline_row(s, "late")) is None
        late_file = deployment.write_pipelines(LATE, name="late.py")
        row = await deployment.wait_for(
            lambda s: pipeline_row(s, "late"), lambda r: r is not None, timeout_s=30
        )
        assert row.is_active
        await deployment.produce([{"n": 1}])
        await wait_for_runs(deployment, {"base": ["success"], "late": ["success"]})

        late_file.unlink()
        await deployment.wait_for(
            lambda s: pipeline_row(s, "late"),
            lambda r: r is not None and not r.is_active,
            timeout_s=30,
        )
        await deployment.produce([{"n": 2}])
        finished = await deployment.wait_for(
            runs,
            lambda rs: by_pipeline(rs).get("base") == ["success", "success"],
        )

    assert by_pipeline(finished) == {"base": ["success", "success"], "late": ["success"]}
    assert await deployment.query(lambda s: queued_events(s, "late")) == []


GATED = """
    @pipeline(schedule=orders)
    def gated(spark, context):
        pass

    @pipeline(schedule=orders)
    def ungated(spark, context):
        pass
"""


async def test_a_paused_pipeline_holds_the_events_that_arrive_and_runs_them_once_unpaused(
    deployment: Deployment,
) -> None:
    deployment.write_pipelines(ORDERS + GATED)
    env = deployment.env()

    async with deployment.running():
        paused = await triggerer_cli(env, "pipelines", "pause", "gated")
        assert paused.returncode == 0, paused.stderr
        assert (await deployment.query(lambda s: pipeline_row(s, "gated"))).paused
        await deployment.produce([{"n": 1}])
        await wait_for_runs(deployment, {"ungated": ["success"]})
        [held] = await deployment.query(lambda s: queued_events(s, "gated"))
        explained = await triggerer_cli(env, "explain", "gated")
        assert "paused: no runs start; events are still queued (1 now)" in explained.stdout.decode()

        unpaused = await triggerer_cli(env, "pipelines", "unpause", "gated")
        assert unpaused.returncode == 0, unpaused.stderr
        await wait_for_runs(deployment, {"ungated": ["success"], "gated": ["success"]})
        await deployment.produce([{"n": 2}])
        finished = await wait_for_runs(
            deployment, {"ungated": ["success", "success"], "gated": ["success", "success"]}
        )

    orders = await deployment.query(lambda s: events_of(s, "orders"))
    assert [e.extra["payload"]["value"] for e in orders] == [{"n": 1}, {"n": 2}]
    assert held == orders[0].id
    # The run at the unpause consumed the event held meanwhile; the next, the one after.
    runs = [r for r in finished if r.pipeline_id == "gated"]
    by_run = await deployment.query(consumed)
    assert [by_run[r.run_id] for r in runs] == [[orders[0].id], [orders[1].id]]
