"""Every scheduling feature through the running daemon, on SQLite and PostgreSQL.

Each test is one daemon with several pipeline files, fed the way users feed it (Kafka messages,
``triggerer events emit``, ``triggerer pipelines pause``), with real Spark runs. A first round
shows each feature; then the files change while the daemon runs and a second round shows that
the new definitions apply. A round sends all its events at once and waits once, for its final
state: the features' runs overlap, which keeps the daemon starts few and the tests short.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import anyio
from sqlalchemy import select
from sqlalchemy.orm import aliased

from tests.e2e.daemon import triggerer_cli, write_pipelines
from triggerer.crons import next_tick
from triggerer.service.store import models

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

    from tests.e2e.conftest import MakeDeployment
    from tests.e2e.daemon import Deployment

ROUND_TIMEOUT_S = 60.0


# -- What the daemon stored, read in one go ---------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Event:
    id: int
    asset: str
    extra: dict[str, Any]
    partition_key: str | None
    source_run: str | None
    aliases: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Run:
    run_id: str
    pipeline_id: str
    run_type: str
    state: str
    partition_key: str | None
    consumed: tuple[Event, ...]

    @property
    def tick(self) -> datetime:
        """The cron tick of a cron run, which its run id ends with."""
        prefix = f"{self.pipeline_id}__cron__"
        assert self.run_id.startswith(prefix), self.run_id
        return datetime.fromisoformat(self.run_id.removeprefix(prefix))


@dataclasses.dataclass(frozen=True)
class History:
    runs: list[Run]
    events: list[Event]
    pipelines: dict[str, models.Pipeline]
    queued: dict[str, list[int]]

    def of(self, pipeline_id: str) -> list[Run]:
        return [run for run in self.runs if run.pipeline_id == pipeline_id]

    def on(self, asset: str) -> list[Event]:
        return [event for event in self.events if event.asset == asset]

    def states(self) -> dict[str, list[str]]:
        """Run states per pipeline, oldest run first."""
        result: dict[str, list[str]] = {}
        for run in self.runs:
            result.setdefault(run.pipeline_id, []).append(run.state)
        return result

    def settled(self) -> bool:
        return all(run.state in ("success", "failed") for run in self.runs)

    def summary(self) -> str:
        errors = {p: row.error for p, row in self.pipelines.items() if row.error}
        return f"runs {self.states()}, queued {self.queued}, pipeline errors {errors}"


async def history(session: AsyncSession) -> History:
    """What the store holds, read so that each statement sees what an earlier one refers to
    (each sees the store as it is then, while the daemon goes on): the runs first, so a run
    read as ended has its outlet events in the events read after it, and what was consumed
    before the events, so every event it names is among them."""
    run_rows = list(await session.scalars(select(models.Run).order_by(models.Run.id)))
    consumed_ids: dict[int, list[int]] = {}
    for run_pk, event_id in await session.execute(
        select(models.RunEvent.run_pk, models.RunEvent.event_id).order_by(models.RunEvent.event_id)
    ):
        consumed_ids.setdefault(run_pk, []).append(event_id)
    producer = aliased(models.Run)
    event_rows = (
        await session.execute(
            select(models.AssetEvent, models.Asset.uri, producer.run_id)
            .join(models.Asset, models.Asset.id == models.AssetEvent.asset_id)
            .outerjoin(producer, producer.id == models.AssetEvent.source_run_pk)
            .order_by(models.AssetEvent.id)
        )
    ).all()
    aliases: dict[int, list[str]] = {}  # written with their events: read after them
    for event_id, name in await session.execute(
        select(models.AssetEventAlias.event_id, models.AssetAlias.name)
        .join(models.AssetAlias, models.AssetAlias.id == models.AssetEventAlias.alias_id)
        .order_by(models.AssetAlias.name)
    ):
        aliases.setdefault(event_id, []).append(name)
    events = [
        Event(e.id, uri, e.extra, e.partition_key, run_id, tuple(aliases.get(e.id, ())))
        for e, uri, run_id in event_rows
    ]
    by_id = {event.id: event for event in events}
    runs = [
        Run(
            r.run_id,
            r.pipeline_id,
            r.run_type,
            r.state,
            r.partition_key,
            tuple(by_id[event_id] for event_id in consumed_ids.get(r.id, ())),
        )
        for r in run_rows
    ]
    queued: dict[str, list[int]] = {}
    for pipeline_id, event_id in await session.execute(
        select(models.QueuedEvent.pipeline_id, models.QueuedEvent.event_id).order_by(
            models.QueuedEvent.event_id
        )
    ):
        queued.setdefault(pipeline_id, []).append(event_id)
    pipelines = {p.pipeline_id: p for p in await session.scalars(select(models.Pipeline))}
    return History(runs, events, pipelines, queued)


async def wait_until(
    deployment: Deployment, done: Callable[[History], bool], *, timeout_s: float = ROUND_TIMEOUT_S
) -> History:
    """The history once ``done`` holds; on timeout, an error showing the last one."""
    last: History | None = None
    with anyio.move_on_after(timeout_s):
        while True:
            last = await deployment.query(history)
            if done(last):
                return last
            await anyio.sleep(0.2)
    raise AssertionError(f"not done after {timeout_s}s: {last.summary() if last else 'no history'}")


# -- Feeding the daemon as users do ----------------------------------------------------------


async def cli(deployment: Deployment, *arguments: str) -> str:
    """``triggerer ARGUMENTS``; its output."""
    done = await triggerer_cli(deployment.env(), *arguments)
    assert done.returncode == 0, (arguments, done.stderr.decode())
    return done.stdout.decode()


def emit(uri: str, extra: dict[str, Any] | None = None, key: str | None = None) -> list[str]:
    """The arguments of ``triggerer events emit``."""
    arguments = ["events", "emit", uri, "--extra", json.dumps(extra or {})]
    return [*arguments, "--partition-key", key] if key is not None else arguments


# -- Aliases, partitions, max_events_per_run, params, pauses ------------------------------------


def fed(deployment: Deployment, name: str, variable: str | None = None) -> str:
    """Source defining the asset ``name`` (as ``variable``, default ``name``), fed by the
    messages of the test's topic whose ``asset`` is its name; a message's ``key``, if any, is
    the partition key of its event."""
    variable = variable or name
    return f"""
{variable} = Asset("{name}", watchers=[AssetWatcher("{variable}_feed", KafkaTrigger(
    bootstrap_servers="{deployment.bootstrap}", topics=["{deployment.topic}"],
    group_id="{deployment.topic}-{variable}", partition_key_path="$.value.key",
    filter={{"path": "$.value.asset", "equals": "{name}"}},
    session_timeout_ms=6000, heartbeat_interval_ms=1000))])
"""


def message(asset: str, n: int, key: str | None = None) -> dict[str, Any]:
    """The message that becomes the ``n``-th event of ``asset`` (with partition key ``key``)."""
    return {"asset": asset, "n": n} | ({"key": key} if key is not None else {})


def brief(events: Sequence[Event]) -> list[tuple[str, str | None, int]]:
    """(asset, partition key, message number) of each event from a message, in a stable order."""
    return sorted((e.asset, e.partition_key, e.extra["payload"]["value"]["n"]) for e in events)


IMPORTS = """
from triggerer import (
    Asset, AssetAlias, AssetWatcher, Metadata, PartitionedAssetTimetable, ToDaily, ToMonthly,
    pipeline,
)
from watchers import KafkaTrigger
"""

ALIASES = """
shipped = AssetAlias("shipped")
audited = AssetAlias("audited")
eu = Asset("s3://lake/eu")
report = Asset("report")
audit = Asset("audit")


def seen(context):
    return [
        [asset.uri, event.source, event.source_run_id]
        for asset, events in sorted(
            context.triggering_asset_events.items(), key=lambda item: item[0].uri
        )
        for event in events
    ]
"""

ALIASES_V1 = """
@pipeline(schedule=orders, outlets=[shipped, audited])
def ship(spark, context):
    rows = spark.range(3).count()
    context.outlet_events[shipped].add(eu, extra={"rows": rows})
    # The same asset with the same extra through a second alias: still one event.
    context.outlet_events[audited].add(eu, extra={"rows": rows})
    # An asset no pipeline file names: created by the run (through the alias given by name,
    # as Airflow takes it).
    yield Metadata(Asset("s3://lake/us"), {"rows": 5}, alias="shipped")


@pipeline(schedule=shipped, outlets=[report], params={"audience": "eu"})
def on_shipped(spark, context):
    yield Metadata(report, {"seen": seen(context), "params": context.params})


@pipeline(schedule=audited, outlets=[audit])
def on_audited(spark, context):
    yield Metadata(audit, {"seen": seen(context)})
"""

# ship is gone, on_shipped has new params, on_audited is scheduled on the other alias. The
# asset ship created through 'shipped' gets a watcher.
ALIASES_V2 = """
@pipeline(schedule=shipped, outlets=[report], params={"audience": "all"})
def on_shipped(spark, context):
    yield Metadata(report, {"seen": seen(context), "params": context.params})


@pipeline(schedule=shipped, outlets=[audit])
def on_audited(spark, context):
    yield Metadata(audit, {"seen": seen(context)})
"""

PARTITIONS = """
rollup = Asset("rollup")


def seen(context):
    return sorted(
        [asset.name, event.partition_key]
        for asset, events in context.triggering_asset_events.items()
        for event in events
    )


@pipeline(schedule=clicks)
def all_clicks(spark, context):
    pass
"""

PARTITIONS_V1 = """
@pipeline(
    schedule=PartitionedAssetTimetable(assets=clicks & views, partition_key_mapper=ToDaily()),
    outlets=[rollup],
)
def rolled(spark, context):
    yield Metadata(rollup, {"key": context.partition_key, "seen": seen(context)})
"""

# rolled maps to months now.
PARTITIONS_V2 = """
@pipeline(
    schedule=PartitionedAssetTimetable(assets=clicks & views, partition_key_mapper=ToMonthly()),
    outlets=[rollup],
)
def rolled(spark, context):
    yield Metadata(rollup, {"key": context.partition_key, "seen": seen(context)})
"""

LIMITS = """
capped_out = Asset("capped_out")


def seen(context):
    return [
        [asset.name, event.extra["payload"]["value"]["n"]]
        for asset, events in sorted(
            context.triggering_asset_events.items(), key=lambda item: item[0].name
        )
        for event in events
    ]
"""

LIMITS_V1 = """
@pipeline(
    schedule=[parts, labels], max_events_per_run=2, params={"batch": "small"},
    outlets=[capped_out],
)
def capped(spark, context):
    yield Metadata(capped_out, {"seen": seen(context), "params": context.params})


@pipeline(schedule=parts)
def gated(spark, context):
    pass
"""

# capped takes up to three events and has other params; gated is scheduled on either asset.
LIMITS_V2 = """
@pipeline(
    schedule=[parts, labels], max_events_per_run=3, params={"batch": "large"},
    outlets=[capped_out],
)
def capped(spark, context):
    yield Metadata(capped_out, {"seen": seen(context), "params": context.params})


@pipeline(schedule=parts | labels)
def gated(spark, context):
    pass
"""


def write_event_pipelines(deployment: Deployment, version: int) -> None:
    folder = deployment.tmp_path / "pipelines"
    us = fed(deployment, "s3://lake/us", "us") if version == 2 else ""
    files = {
        "aliases.py": (fed(deployment, "orders") + us, ALIASES, (ALIASES_V1, ALIASES_V2)),
        "partitions.py": (
            fed(deployment, "clicks") + fed(deployment, "views"),
            PARTITIONS,
            (PARTITIONS_V1, PARTITIONS_V2),
        ),
        "limits.py": (
            fed(deployment, "parts") + fed(deployment, "labels"),
            LIMITS,
            (LIMITS_V1, LIMITS_V2),
        ),
    }
    for name, (assets, common, versions) in files.items():
        write_pipelines(folder, IMPORTS + assets + common + versions[version - 1], name)


ROUND_1 = [
    *(message("parts", n) for n in (1, 2, 3)),
    message("labels", 1),
    message("orders", 1),
    message("views", 1, "eu-west"),
    message("views", 2, "2026-03-16T17:40:00"),
    message("clicks", 1, "2026-03-16T09:15:00"),
    message("clicks", 2, "2026-03-17T08:00:00"),
    message("clicks", 3),
]
ROUND_2 = [
    message("s3://lake/us", 1),
    message("labels", 2),
    message("views", 3, "2026-03-20T10:00:00"),
    message("clicks", 4, "2026-04-01T00:00:00"),
    message("orders", 2),
]


def reloaded(h: History) -> bool:
    """Whether the daemon has synced the second version of the pipelines files."""
    p = h.pipelines
    return (
        not p["ship"].is_active
        and "ToMonthly()" in p["rolled"].schedule_text
        and p["capped"].max_events_per_run == 3
        and "|" in p["gated"].schedule_text
        and p["on_audited"].schedule_text == p["on_shipped"].schedule_text
    )


async def test_aliases_partitions_limits_params_and_pauses_follow_the_pipeline_files(
    database_url: str, make_deployment: MakeDeployment
) -> None:
    deployment = await make_deployment(database_url)
    write_event_pipelines(deployment, 1)

    async with deployment.running():
        await cli(deployment, "pipelines", "pause", "gated")
        await deployment.produce(ROUND_1)
        first = await wait_until(
            deployment,
            lambda h: (
                h.states()
                == {
                    "ship": ["success"],
                    "on_shipped": ["success"],
                    "on_audited": ["success"],
                    "rolled": ["success"],
                    "all_clicks": ["success"],
                    "capped": ["success"],
                }
                and h.pipelines["rolled"].error is not None
            ),
        )

        write_event_pipelines(deployment, 2)
        synced = await wait_until(deployment, reloaded, timeout_s=30)
        assert synced.pipelines["gated"].paused, "a reload must not unpause a pipeline"
        await cli(deployment, "pipelines", "unpause", "gated")
        # The events queued while it was paused start a run at once, before round 2 comes.
        await wait_until(deployment, lambda h: len(h.of("gated")) == 1)
        await deployment.produce(ROUND_2)
        final = await wait_until(
            deployment,
            lambda h: (
                h.states()
                == {
                    "ship": ["success"],
                    "on_shipped": ["success", "success"],
                    "on_audited": ["success", "success"],
                    "rolled": ["success", "success"],
                    "all_clicks": ["success"],
                    "capped": ["success", "success"],
                    "gated": ["success", "success"],
                }
                and "ToMonthly()" in (h.pipelines["rolled"].error or "")
            ),
        )

    check_aliases(final)
    check_partitions(first, final)
    check_limits(final)
    listed = json.loads(await cli(deployment, "pipelines", "list", "--json"))
    assert {p["pipeline_id"]: p["error"] for p in listed if p["error"]} == {
        "rolled": final.pipelines["rolled"].error
    }


def check_aliases(h: History) -> None:
    (ship,) = h.of("ship")
    assert brief(ship.consumed) == [("orders", None, 1)]
    assert not h.pipelines["ship"].is_active
    # The second orders event came after ship's file lost it: stored, queued for no one.
    assert brief(h.on("orders")) == [("orders", None, 1), ("orders", None, 2)]
    assert "ship" not in h.queued

    (eu,) = h.on("s3://lake/eu")  # one event, though added through two aliases
    assert (eu.extra, eu.source_run, eu.aliases) == (
        {"rows": 3},
        ship.run_id,
        ("audited", "shipped"),
    )
    from_run, fed_us = h.on("s3://lake/us")
    assert (from_run.extra, from_run.source_run, from_run.aliases) == (
        {"rows": 5},
        ship.run_id,
        ("shipped",),
    )
    assert brief([fed_us]) == [("s3://lake/us", None, 1)]
    assert (fed_us.source_run, fed_us.aliases) == (None, ())

    # Scheduled on an alias: events of every asset added through it, also ones emitted later.
    shipped_1, shipped_2 = h.of("on_shipped")
    assert [e.id for e in shipped_1.consumed] == [eu.id, from_run.id]
    assert [e.id for e in shipped_2.consumed] == [fed_us.id]
    assert [(e.extra, e.source_run) for e in h.on("report")] == [
        (
            {
                "seen": [
                    ["s3://lake/eu", "run", ship.run_id],
                    ["s3://lake/us", "run", ship.run_id],
                ],
                "params": {"audience": "eu"},
            },
            shipped_1.run_id,
        ),
        (
            {"seen": [["s3://lake/us", "trigger", None]], "params": {"audience": "all"}},
            shipped_2.run_id,
        ),
    ]
    # on_audited saw eu through 'audited'; rescheduled on 'shipped', the next us event.
    audited_1, audited_2 = h.of("on_audited")
    assert [e.id for e in audited_1.consumed] == [eu.id]
    assert [e.id for e in audited_2.consumed] == [fed_us.id]
    assert [e.extra for e in h.on("audit")] == [
        {"seen": [["s3://lake/eu", "run", ship.run_id]]},
        {"seen": [["s3://lake/us", "trigger", None]]},
    ]


def check_partitions(first: History, h: History) -> None:
    # A key the mapper cannot map: the pipeline says why; its other keys and the other
    # pipelines go on.
    first_error = first.pipelines["rolled"].error or ""
    assert "'eu-west'" in first_error, first_error
    assert "ToDaily()" in first_error, first_error
    error = h.pipelines["rolled"].error or ""
    assert "'eu-west'" in error, error
    assert "ToMonthly()" in error, error
    assert h.pipelines["rolled"].error_at is not None
    # An AND over partitions needs the same mapped key: 03-17 waited for a view of its month,
    # 04-01 still waits.
    assert [(r.partition_key, brief(r.consumed)) for r in h.of("rolled")] == [
        ("2026-03-16", [("clicks", "2026-03-16T09:15:00", 1), ("views", "2026-03-16T17:40:00", 2)]),
        ("2026-03", [("clicks", "2026-03-17T08:00:00", 2), ("views", "2026-03-20T10:00:00", 3)]),
    ]
    assert brief([e for e in h.events if e.id in h.queued["rolled"]]) == [
        ("clicks", "2026-04-01T00:00:00", 4),
        ("views", "eu-west", 1),
    ]
    rolled_1, rolled_2 = h.of("rolled")
    assert [(e.partition_key, e.extra, e.source_run) for e in h.on("rollup")] == [
        (
            "2026-03-16",
            {
                "key": "2026-03-16",
                "seen": [["clicks", "2026-03-16T09:15:00"], ["views", "2026-03-16T17:40:00"]],
            },
            rolled_1.run_id,
        ),
        (
            "2026-03",
            {
                "key": "2026-03",
                "seen": [["clicks", "2026-03-17T08:00:00"], ["views", "2026-03-20T10:00:00"]],
            },
            rolled_2.run_id,
        ),
    ]
    # Plain events go to plain pipelines only, partitioned ones to partitioned ones only.
    assert [(r.partition_key, brief(r.consumed)) for r in h.of("all_clicks")] == [
        (None, [("clicks", None, 3)])
    ]
    assert "all_clicks" not in h.queued


def check_limits(h: History) -> None:
    # max_events_per_run=2 under an AND: the oldest part and the label; the rest wait. After
    # the reload (3, new params) the next label takes the two parts that waited.
    capped_1, capped_2 = h.of("capped")
    assert [brief(r.consumed) for r in (capped_1, capped_2)] == [
        [("labels", None, 1), ("parts", None, 1)],
        [("labels", None, 2), ("parts", None, 2), ("parts", None, 3)],
    ]
    assert [e.extra for e in h.on("capped_out")] == [
        {"seen": [["labels", 1], ["parts", 1]], "params": {"batch": "small"}},
        {"seen": [["labels", 2], ["parts", 2], ["parts", 3]], "params": {"batch": "large"}},
    ]
    assert "capped" not in h.queued
    # Paused in the first round: its events waited in its queue. Unpaused after the reload
    # (which kept it paused): it ran on them, then on the one event that came after.
    held, after = h.of("gated")
    assert brief(held.consumed) == [("parts", None, 1), ("parts", None, 2), ("parts", None, 3)]
    assert brief(after.consumed) == [("labels", None, 2)]
    assert not h.pipelines["gated"].paused
    assert "gated" not in h.queued


# -- Cron, time or assets, cron partitions ------------------------------------------------------

TIME = """
from triggerer import (
    Asset, AssetOrTimeSchedule, CronPartitionTimetable, Metadata, PartitionedAssetTimetable,
    pipeline,
)

orders = Asset("orders")
tick_out = Asset("tick_out")


@pipeline(schedule="{ticker}")
def ticker(spark, context):
    assert spark.range(1).count() == 1


@pipeline(schedule=AssetOrTimeSchedule(cron="{either}", assets=orders))
def either(spark, context):
    pass


@pipeline(schedule=CronPartitionTimetable(cron="{per_tick}"), outlets=[tick_out])
def per_tick(spark, context):
    yield Metadata(tick_out, {{"key": context.partition_key}})


@pipeline(schedule=PartitionedAssetTimetable(assets=tick_out))
def after_tick(spark, context):
    assert context.partition_key is not None
"""

EVERY_5_S = "* * * * * */5"  # croniter's sixth field is the second
YEARLY = "0 0 1 1 *"
PER_TICK_V1 = "* * * * * 2-59/5"
PER_TICK_V2 = "* * * * * 4-59/5"


def only_at(moment: datetime) -> str:
    """A cron expression whose only tick this year is ``moment`` (to the second)."""
    return f"{moment.minute} {moment.hour} {moment.day} {moment.month} * {moment.second}"


def now() -> datetime:
    return datetime.now(UTC)


async def test_cron_time_or_assets_and_cron_partitions_follow_the_pipeline_files(
    database_url: str, make_deployment: MakeDeployment
) -> None:
    deployment = await make_deployment(database_url)
    folder = deployment.tmp_path / "pipelines"
    write_pipelines(folder, TIME.format(ticker=EVERY_5_S, either=YEARLY, per_tick=PER_TICK_V1))

    with deployment.process_with_config(deployment.config_file()) as daemon:
        daemon.start()
        await daemon.wait_logged("pipelines_loaded")
        await cli(deployment, *emit("orders", {"n": 1}))
        await wait_until(
            deployment,
            lambda h: (
                h.states().get("ticker", []).count("success") >= 2
                and h.states().get("either") == ["success"]
                and "success" in h.states().get("after_tick", [])
            ),
        )
        await cli(deployment, "pipelines", "pause", "per_tick")
        paused_at = now()
        once = (paused_at + timedelta(seconds=5)).replace(microsecond=0)
        write_pipelines(
            folder, TIME.format(ticker=YEARLY, either=only_at(once), per_tick=PER_TICK_V2)
        )
        synced = await wait_until(
            deployment, lambda h: h.pipelines["ticker"].schedule_text == YEARLY, timeout_s=30
        )
        synced_at = now()
        assert synced.pipelines["either"].next_cron_at == once
        final = await wait_until(
            deployment,
            lambda h: (
                len(h.of("either")) == 2
                and h.settled()
                # A tick of per_tick's new cron has passed while it was paused.
                and (h.pipelines["per_tick"].next_cron_at or synced_at)
                > next_tick(PER_TICK_V2, synced_at)
            ),
        )
        daemon.signal(15)
        assert await daemon.wait(60) == 0, daemon.tail()

    # A cron string: a run on every tick until the reload gave it another expression.
    ticks = [run.tick for run in final.of("ticker")]
    assert len(ticks) >= 2
    assert all(t.second % 5 == 0 and t.microsecond == 0 for t in ticks), ticks
    assert all(b - a == timedelta(seconds=5) for a, b in itertools.pairwise(ticks)), ticks
    assert ticks[-1] <= synced_at
    assert final.pipelines["ticker"].next_cron_at == next_tick(YEARLY, synced_at)
    for run in final.of("ticker"):
        assert (run.run_type, run.state, run.partition_key, run.consumed) == (
            "cron",
            "success",
            None,
            (),
        )

    # Time or assets: the asset event ran it under the first cron (which never fired), the
    # one tick of the second cron ran it once more.
    asset_run, cron_run = final.of("either")
    assert (asset_run.run_type, asset_run.state) == ("asset", "success")
    assert [(e.asset, e.extra) for e in asset_run.consumed] == [("orders", {"n": 1})]
    assert (cron_run.run_type, cron_run.state, cron_run.tick, cron_run.consumed) == (
        "cron",
        "success",
        once,
        (),
    )

    # Cron partitions: each run is keyed by its tick and so is its outlet event, which runs
    # a partitioned pipeline with that key. Paused, then given another cron: its ticks pass
    # without runs, on the new cron.
    per_tick = final.of("per_tick")
    assert per_tick
    for run in per_tick:
        assert (run.run_type, run.state, run.partition_key) == (
            "cron",
            "success",
            run.tick.isoformat(),
        )
        assert run.tick.second % 5 == 2
        assert run.tick <= paused_at
    assert [(e.partition_key, e.extra, e.source_run) for e in final.on("tick_out")] == [
        (run.partition_key, {"key": run.partition_key}, run.run_id) for run in per_tick
    ]
    assert final.pipelines["per_tick"].paused
    next_cron_at = final.pipelines["per_tick"].next_cron_at
    assert next_cron_at is not None
    assert next_cron_at.second % 5 == 4, next_cron_at
    after = final.of("after_tick")
    assert [(r.state, r.partition_key, r.consumed) for r in after] == [
        ("success", event.partition_key, (event,)) for event in final.on("tick_out")
    ]
