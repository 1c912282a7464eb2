"""Schema upgrades of a populated store, on SQLite and PostgreSQL.

From every revision before the head, a database holding some of everything the daemon stores
(seeded with SQL for the schema of the day, as the build of that revision wrote it) is migrated
to the head: every row is kept with its values, Kafka dedup keys take their new form, and the
daemon's read and write paths work on the result. The revisions come from Alembic's script
directory, so a new one is covered without touching this file; seed its new tables here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import itertools
import json
import os
import sqlite3
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import sqlalchemy as sa
from alembic.script import Script, ScriptDirectory
from sqlalchemy import URL, Connection, select
from sqlalchemy.dialects import postgresql
from sqlalchemy.sql.expression import ColumnClause

from tests.fixtures.database import _create_database, _drop_database, _new_database_name
from triggerer.service.events import NewEvent, record_events
from triggerer.service.reads import queries, watcher_states
from triggerer.service.runs import stored_logs as run_logs
from triggerer.service.store import create_engine, head_revision, session_factory, upgrade
from triggerer.service.store.keys import asset_identity_key, trigger_key
from triggerer.service.store.migrate import MIGRATIONS_DIR, VERSION_TABLE, alembic_config
from triggerer.service.store.models import AssetEvent, Trigger
from triggerer.triggers import load_trigger

pytestmark = pytest.mark.slow  # every migration, both stores: minutes (make test-slow)


def _chain() -> list[Script]:
    """The revisions, oldest first, as Alembic walks them from the head."""
    script = ScriptDirectory.from_config(alembic_config())
    return list(reversed(list(script.walk_revisions())))


REVISIONS = tuple(revision.revision for revision in _chain())
TRIGGERER_BIN = Path(sys.executable).with_name("triggerer")
T0 = dt.datetime(2026, 11, 20, 8, 0, tzinfo=dt.UTC)
KAFKA = "watchers.kafka.KafkaTrigger"
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
SQS = "watchers.sqs.SqsTrigger"
REDIS_MOVED = {
    "watchers.redis_streams.RedisStreamTrigger": "watchers.redis.RedisStreamTrigger",
    "watchers.redis_pubsub.RedisPubSubTrigger": "watchers.redis.RedisPubSubTrigger",
}
"""0017: the Redis triggers' classpaths before the package, and after."""
REDIS_KWARGS = {
    old: load_trigger(
        new, {"host": "cache", "stream" if "Stream" in new else "channel": "o"}
    ).serialize()[1]
    for old, new in REDIS_MOVED.items()
}
"""What their ``serialize()`` wrote (the same kwargs then as now)."""
INSTANCE = "host-1:4242"


def _at(minutes: int) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minutes)


def _kafka_extra(partition: int, offset: int, timestamp_ms: int) -> dict[str, Any]:
    """What the daemon stores of a KafkaTrigger's message (its payload, as KafkaTrigger makes
    it, under ``payload``)."""
    return {
        "from_trigger": True,
        "payload": {
            "topic": "orders",
            "partition": partition,
            "offset": offset,
            "key": "o-1",
            "value": {"order": offset, "note": "café"},
            "timestamp": timestamp_ms,
            "headers": {"origin": "shop"},
        },
    }


@dataclasses.dataclass(frozen=True)
class Event:
    """A seeded asset event, and the dedup key it has at the head."""

    asset: str
    source: str
    extra: dict[str, Any]
    dedup_key: str | None = None
    upgraded_key: str | None = None
    trigger: str | None = None
    run: str | None = None
    partition_key: str | None = None

    @property
    def key_at_head(self) -> str | None:
        return self.upgraded_key or self.dedup_key


EVENTS = (
    # Kafka messages: 0004 appends the payload's timestamp to their keys.
    Event(
        "orders",
        "trigger",
        _kafka_extra(0, 41, 1_764_000_000_000),
        "orders/0/41",
        "orders/0/41@1764000000000",
        trigger=KAFKA,
    ),
    Event(
        "orders",
        "trigger",
        _kafka_extra(1, 7, 1_764_000_000_123),
        "orders/1/7",
        "orders/1/7@1764000000123",
        trigger=KAFKA,
    ),
    Event(
        "orders",
        "trigger",
        _kafka_extra(2, 0, 1_764_000_000_456),
        "orders/2/0",
        "orders/2/0@1764000000456",
        trigger=KAFKA,
    ),
    # A Kafka message whose payload an apply_function replaced: no timestamp, key kept.
    Event(
        "orders",
        "trigger",
        {"from_trigger": True, "payload": {"n": 42}},
        "orders/0/42",
        trigger=KAFKA,
    ),
    # Another provider's message, with a timestamp in its payload: not Kafka, key kept.
    Event(
        "inbox",
        "trigger",
        {"from_trigger": True, "payload": {"body": "hi", "timestamp": 1_764_000_000_000}},
        "5f1c-message-id",
        trigger=SQS,
    ),
    Event("lake", "run", {"rows": 120}, run="r-success", partition_key="2026-11-19"),
    Event("lake", "rest_api", {"note": "backfill"}, "client-7"),
    Event("orders", "cli", {}),
)


@dataclasses.dataclass(frozen=True)
class RunSeed:
    run_id: str
    pipeline_id: str
    run_type: str
    state: str
    consumed: tuple[int, ...]
    """Indexes in :data:`EVENTS` of the events it consumed."""
    columns: dict[str, Any] = dataclasses.field(default_factory=dict)


RUNS = (
    RunSeed(
        "r-success",
        "count_orders",
        "asset",
        "success",
        (0,),
        {"start_date": _at(1), "end_date": _at(2), "log_path": "/var/log/r-success"},
    ),
    RunSeed(
        "r-failed",
        "count_orders",
        "asset",
        "failed",
        (3,),
        {"try_number": 2, "max_tries": 2, "end_date": _at(3), "error": "ValueError: bad row"},
    ),
    RunSeed(
        "r-running",
        "count_orders",
        "asset",
        "running",
        (1,),
        {"start_date": _at(4), "heartbeat_at": _at(5), "owner": INSTANCE},
    ),
    RunSeed(
        "r-retry",
        "load_lake",
        "cron",
        "up_for_retry",
        (4,),
        {"logical_date": T0, "next_try_at": _at(9), "partition_key": "2026-11-19"},
    ),
    RunSeed("r-queued", "load_lake", "manual", "queued", (), {"params": {"full": True}}),
)
QUEUED = (("count_orders", 2), ("count_orders", 7))
"""(pipeline, index in :data:`EVENTS`) of the events waiting in the queue."""

BASE_COUNTS = {
    "asset": 3,
    "asset_alias": 1,
    "asset_alias_asset": 1,
    "instance": 1,
    "lease": 1,
    "pipeline": 2,
    "trigger": 2 + len(REDIS_MOVED),
    "asset_watcher": 2,
    "pipeline_asset_ref": 4,
    "pipeline_alias_ref": 1,
    "run": len(RUNS),
    "asset_event": len(EVENTS),
    "asset_event_alias": 1,
    "queued_event": len(QUEUED),
    "run_event": sum(len(run.consumed) for run in RUNS),
}


JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def _column(name: str, value: Any) -> ColumnClause[Any]:
    """A column for ``value`` as the revisions declare such values: a timestamp with its zone,
    a JSON document (JSONB on PostgreSQL), or what the driver makes of it."""
    if isinstance(value, dt.datetime):
        return sa.column(name, sa.DateTime(timezone=True))
    if isinstance(value, dict | list):
        return sa.column(name, JSON)
    return sa.column(name)


class Store:
    """Writes to the tables of the schema a database is at, in SQL of that schema."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection

    def insert(self, name: str, /, **values: Any) -> None:
        """Insert one row into the table ``name``."""
        table = sa.table(name, *(_column(column, value) for column, value in values.items()))
        self.connection.execute(table.insert().values(**values))

    def add(self, name: str, /, **values: Any) -> int:
        """Insert one row into the table ``name``; its new ``id``."""
        table = sa.table(
            name, sa.column("id"), *(_column(column, value) for column, value in values.items())
        )
        returned: int = self.connection.execute(
            table.insert().values(**values).returning(table.c.id)
        ).scalar_one()
        return returned

    def update(self, name: str, where: dict[str, Any], /, **values: Any) -> None:
        """Set ``values`` in the rows of ``name`` whose columns have the values of ``where``."""
        columns = {**where, **values}
        table = sa.table(name, *(_column(column, value) for column, value in columns.items()))
        matching = [table.c[column] == value for column, value in where.items()]
        self.connection.execute(table.update().where(*matching).values(**values))

    def id_of(self, name: str, /, **where: Any) -> int:
        """The ``id`` of the one row of ``name`` whose columns have these values."""
        table = sa.table(name, sa.column("id"), *(sa.column(column) for column in where))
        matching = [table.c[column] == value for column, value in where.items()]
        found: int = self.connection.execute(select(table.c.id).where(*matching)).scalar_one()
        return found


def _seed_initial(store: Store) -> None:
    """Rows for every table of the first revision, as its build wrote them."""
    assets = {
        name: store.add(
            "asset",
            name=name,
            uri=uri,
            identity_key=asset_identity_key(name, uri),
            group="asset",
            extra={"owner": "data"},
            created_at=T0,
            updated_at=T0,
        )
        for name, uri in (
            ("orders", "kafka://broker:9092/orders"),
            ("inbox", "sqs://inbox?region=eu-west-1"),
            ("lake", "s3://lake/daily"),
        )
    }
    alias = store.add("asset_alias", name="lake-outputs", group="asset", created_at=T0)
    store.insert("asset_alias_asset", alias_id=alias, asset_id=assets["lake"])
    store.insert(
        "instance",
        id=INSTANCE,
        hostname="host-1",
        pid=4242,
        started_at=T0,
        heartbeat_at=_at(5),
    )
    for pipeline_id, policy in (("count_orders", "coalesce"), ("load_lake", "per_event")):
        store.insert(
            "pipeline",
            pipeline_id=pipeline_id,
            fileloc=f"/pipelines/{pipeline_id}.py",
            schedule={"kind": "asset"},
            schedule_text=pipeline_id,
            paused=False,
            is_active=True,
            partitioned=False,
            max_active_runs=16,
            run_policy=policy,
            max_events_per_run=None if policy == "coalesce" else 10,
            retries=1,
            next_cron_at=None,
            created_at=T0,
            updated_at=T0,
        )
    kwargs: dict[str, dict[str, Any]] = {
        KAFKA: {"topics": ["orders"], "bootstrap_servers": "broker:9092"},
        SQS: {"queue": "inbox", "region_name": "eu-west-1"},
    }
    triggers = {
        classpath: store.add(
            "trigger",
            classpath=classpath,
            kwargs=kwargs[classpath],
            key=trigger_key(classpath, kwargs[classpath]),
            state="running" if classpath == KAFKA else "failed",
            last_poll_at=_at(5) if classpath == KAFKA else None,
            last_error=None if classpath == KAFKA else "AccessDenied: sqs:ReceiveMessage",
            restart_count=0 if classpath == KAFKA else 3,
            lag=12 if classpath == KAFKA else None,
            instance_id=INSTANCE,
            created_at=T0,
            updated_at=_at(5),
        )
        for classpath in (KAFKA, SQS)
    }
    for classpath, redis_kwargs in REDIS_KWARGS.items():
        store.insert(
            "trigger",
            classpath=classpath,
            kwargs=redis_kwargs,
            key=trigger_key(classpath, redis_kwargs),
            state="running",
            restart_count=1,
            created_at=T0,
            updated_at=_at(5),
        )
    store.insert(
        "lease",
        name=f"trigger:{triggers[KAFKA]}",
        owner=INSTANCE,
        acquired_at=T0,
        expires_at=_at(6),
    )
    store.insert(
        "asset_watcher",
        asset_id=assets["orders"],
        name="orders_kafka",
        trigger_id=triggers[KAFKA],
    )
    store.insert(
        "asset_watcher",
        asset_id=assets["inbox"],
        name="inbox_sqs",
        trigger_id=triggers[SQS],
    )
    for pipeline_id, asset, role in (
        ("count_orders", "orders", "schedule"),
        ("count_orders", "lake", "outlet"),
        ("load_lake", "inbox", "schedule"),
        ("load_lake", "orders", "inlet"),
    ):
        store.insert(
            "pipeline_asset_ref",
            pipeline_id=pipeline_id,
            asset_id=assets[asset],
            role=role,
        )
    store.insert("pipeline_alias_ref", pipeline_id="count_orders", alias_id=alias, role="outlet")
    runs = {
        run.run_id: store.add(
            "run",
            run_id=run.run_id,
            pipeline_id=run.pipeline_id,
            run_type=run.run_type,
            state=run.state,
            created_at=T0,
            **{"try_number": 1, "max_tries": 2, "params": {}} | run.columns,
        )
        for run in RUNS
    }
    events = [
        store.add(
            "asset_event",
            asset_id=assets[event.asset],
            extra=event.extra,
            source=event.source,
            source_trigger_id=None if event.trigger is None else triggers[event.trigger],
            source_run_pk=None if event.run is None else runs[event.run],
            dedup_key=event.dedup_key,
            partition_key=event.partition_key,
            timestamp=_at(number),
        )
        for number, event in enumerate(EVENTS)
    ]
    store.insert("asset_event_alias", event_id=events[5], alias_id=alias)
    for pipeline_id, number in QUEUED:
        store.insert(
            "queued_event",
            pipeline_id=pipeline_id,
            asset_id=assets[EVENTS[number].asset],
            event_id=events[number],
            created_at=_at(8),
        )
    for run in RUNS:
        for number in run.consumed:
            store.insert(
                "run_event",
                run_pk=runs[run.run_id],
                event_id=events[number],
                pipeline_id=run.pipeline_id,
            )


def _seed_dead_letters(store: Store) -> None:
    """0003: dead letters (one of a Kafka message, one posted) and a pipeline's error."""
    store.insert(
        "dead_letter",
        asset_id=store.id_of("asset", name="orders"),
        trigger_id=store.id_of("trigger", classpath=KAFKA),
        source="trigger",
        dedup_key="orders/0/40",
        partition_key=None,
        payload=json.dumps(_kafka_extra(0, 40, 1_763_999_999_000)),
        reason="partition key too long",
        created_at=_at(1),
    )
    store.insert(
        "dead_letter",
        asset_id=None,
        trigger_id=None,
        source="rest_api",
        dedup_key=None,
        partition_key="p\\x00",
        payload="'not json'",
        reason="asset deleted",
        created_at=_at(2),
    )
    store.update(
        "pipeline",
        {"pipeline_id": "load_lake"},
        error="ImportError: no module named 'lake'",
        error_at=_at(3),
    )


def _seed_import_errors(store: Store) -> None:
    """0005: a pipeline file that failed to load."""
    store.insert(
        "import_error",
        key="b" * 64,
        fileloc="/pipelines/broken.py",
        line=3,
        error="SyntaxError: invalid syntax",
        traceback='  File "/pipelines/broken.py", line 3\n    def (:\n',
        error_at=_at(4),
        updated_at=_at(4),
    )


def _seed_reads_as(store: Store) -> None:
    """0007: the consumer group the Kafka watcher reported."""
    store.update("trigger", {"classpath": KAFKA}, reads_as="triggerer-orders")


SEEDS: dict[str, tuple[Callable[[Store], None], dict[str, int]]] = {
    REVISIONS[0]: (_seed_initial, BASE_COUNTS),
    "0003": (_seed_dead_letters, {"dead_letter": 2}),
    "0005": (_seed_import_errors, {"import_error": 1}),
    "0007": (_seed_reads_as, {}),
}
"""By revision: what to seed once the database is at it, and the rows that adds per table."""


def _seeded_by(start: str) -> list[str]:
    """The revisions whose seeds a database upgraded to ``start`` holds."""
    reached = REVISIONS[: REVISIONS.index(start) + 1]
    return [revision for revision in reached if revision in SEEDS]


async def _on(url: str, work: Callable[[Connection], Any]) -> Any:
    """``work`` on a connection to ``url``, committed."""
    engine = create_engine(url)
    try:
        async with engine.begin() as connection:
            return await connection.run_sync(work)
    finally:
        await engine.dispose()


Rows = dict[str, list[dict[str, Any]]]


def _every_row(connection: Connection) -> Rows:
    """Every row of every table but Alembic's, by table, as the driver reads them (JSON and
    timestamps too: equal readings are equal values)."""
    columns = sa.inspect(connection).get_multi_columns()
    rows: Rows = {}
    for (_, name), described in sorted(columns.items()):
        if name != VERSION_TABLE:
            table = sa.table(name, *(sa.column(column["name"]) for column in described))
            rows[name] = [dict(row) for row in connection.execute(select(table)).mappings()]
    return rows


def _seeding(seed: Callable[[Store], None]) -> Callable[[Connection], None]:
    return lambda connection: seed(Store(connection))


@dataclasses.dataclass
class Ladder:
    """Populated databases of one kind, one at each revision before the head, built once by
    migrating a single database one revision at a time (seeding each revision's rows once it
    is at it) and copying it at every step: what a deployment of that revision would hold."""

    folder: Path
    pg_server: URL | None
    copies: dict[str, tuple[str, Rows]] = dataclasses.field(default_factory=dict)
    """By revision, the copy (SQLite file or PostgreSQL database) and its rows."""

    def url(self, name: str) -> str:
        if self.pg_server is None:
            return f"sqlite:///{self.folder / name}"
        return self.pg_server.set(database=name).render_as_string(hide_password=False)

    async def build(self) -> None:
        climbing = _new_database_name()
        if self.pg_server is not None:
            await asyncio.to_thread(_create_database, self.pg_server, climbing, "template0")
        url = self.url(climbing)
        try:
            for revision in REVISIONS[:-1]:
                await upgrade(url, revision)
                if revision in SEEDS:
                    await _on(url, _seeding(SEEDS[revision][0]))
                copy = f"{climbing}_{revision}"
                await self.copy(climbing, copy)
                self.copies[revision] = (copy, await _on(url, _every_row))
        finally:
            await self.drop(climbing)

    async def copy(self, source: str, target: str) -> None:
        if self.pg_server is not None:
            await asyncio.to_thread(_create_database, self.pg_server, target, source)
            return
        # The backup API copies a consistent snapshot whatever state the WAL files are in.
        with (
            closing(sqlite3.connect(self.folder / source)) as original,
            closing(sqlite3.connect(self.folder / target)) as copied,
        ):
            original.backup(copied)

    async def drop(self, name: str) -> None:
        if self.pg_server is not None:
            await asyncio.to_thread(_drop_database, self.pg_server, name)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def ladders(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[dict[str, Ladder]]:
    """The :class:`Ladder` of each database kind, built when first asked for."""
    built: dict[str, Ladder] = {}
    yield built
    for ladder in built.values():
        for name, _ in ladder.copies.values():
            await ladder.drop(name)


@pytest.fixture
def start() -> str:
    """The revision a test's database is at before it is upgraded: the first, unless the test
    is parametrised over them."""
    return REVISIONS[0]


@pytest_asyncio.fixture
async def populated(
    db_backend: str,
    start: str,
    ladders: dict[str, Ladder],
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[tuple[str, Rows]]:
    """A new populated database at revision ``start`` (its URL), and its rows."""
    if db_backend not in ladders:
        server = None if db_backend == "sqlite" else request.getfixturevalue("pg_server_url")
        ladders[db_backend] = Ladder(tmp_path_factory.mktemp("ladder"), server)
        await ladders[db_backend].build()  # kept before it is built, for its copies' teardown
    ladder = ladders[db_backend]
    template, rows = ladder.copies[start]
    name = _new_database_name()
    await ladder.copy(template, name)
    try:
        yield ladder.url(name), rows
    finally:
        await ladder.drop(name)


def _expected_at_head(before: Rows) -> Rows:
    """``before`` as the head should hold it: Kafka keys in their new form (0004), Redis
    triggers under their package's classpath with its key (0017)."""
    upgraded = {event.dedup_key: event.key_at_head for event in EVENTS}

    def at_head(name: str, row: dict[str, Any]) -> dict[str, Any]:
        if name == "asset_event":
            return {**row, "dedup_key": upgraded.get(row["dedup_key"], row["dedup_key"])}
        if name == "trigger" and row["classpath"] in REDIS_MOVED:
            classpath = REDIS_MOVED[row["classpath"]]
            kwargs = row["kwargs"]  # as the driver reads it: text on SQLite
            kwargs = json.loads(kwargs) if isinstance(kwargs, str) else kwargs
            return {**row, "classpath": classpath, "key": trigger_key(classpath, kwargs)}
        return row

    return {name: [at_head(name, row) for row in rows] for name, rows in before.items()}


def _assert_every_row_kept(before: Rows, after: Rows, start: str) -> None:
    counts = dict.fromkeys(after, 0)
    for revision in _seeded_by(start):
        for name, count in SEEDS[revision][1].items():
            counts[name] += count
    assert {name: len(rows) for name, rows in after.items()} == counts
    for name, rows in _expected_at_head(before).items():
        # The columns the table had at `start`, with their values; columns added since aside.
        kept = [column for row in rows[:1] for column in row]
        projected = [{column: row[column] for column in kept} for row in after[name]]
        assert sorted(projected, key=repr) == sorted(rows, key=repr), name


def _stored_keys(connection: Connection) -> list[str | None]:
    events = sa.table("asset_event", sa.column("id"), sa.column("dedup_key"))
    return list(connection.scalars(select(events.c.dedup_key).order_by(events.c.id)))


async def _assert_the_daemon_reads_and_records(url: str, start: str) -> None:
    """The store's queries and event recording, as the CLI, the API and the daemon call them."""
    assert await _on(url, _stored_keys) == [event.key_at_head for event in EVENTS]
    engine = create_engine(url)
    try:
        async with session_factory(engine).begin() as session:
            runs = {run.run_id: run for run in await queries.runs(session)}
            assert {run_id: run.state for run_id, run in runs.items()} == {
                run.run_id: run.state for run in RUNS
            }
            assert {run_id: run.events for run_id, run in runs.items()} == {
                run.run_id: len(run.consumed) for run in RUNS
            }
            assert runs["r-failed"].error == "ValueError: bad row"
            # 0015: a run from before the store kept logs says so, naming its file.
            old_log = await run_logs.read(session, "r-success")
            assert (old_log.text, old_log.empty) == ("", run_logs.Empty.NOT_KEPT)
            assert "(/var/log/r-success)" in (old_log.reason or "")
            assert (await run_logs.read(session, "r-queued")).empty == run_logs.Empty.NOT_STARTED
            consumed = (await queries.run(session, "r-success")).consumed
            assert [event.extra for event in consumed] == [EVENTS[0].extra]

            listed = list(reversed(await queries.events(session)))  # oldest first
            assert [event.extra for event in listed] == [event.extra for event in EVENTS]
            assert [event.source for event in listed] == [event.source for event in EVENTS]
            watchers = {row.watcher: row for row in await watcher_states.watchers(session)}
            assert watchers.keys() == {"orders_kafka", "inbox_sqs"}
            assert watchers["inbox_sqs"].last_error == "AccessDenied: sqs:ReceiveMessage"
            assert {row.pipeline_id for row in await queries.pipelines(session)} >= {
                "count_orders",
                "load_lake",
            }
            dead_letters = await queries.dead_letters(session)
            assert len(dead_letters) == (2 if "0003" in _seeded_by(start) else 0)
            import_errors = await queries.import_errors(session)
            assert len(import_errors) == (1 if "0005" in _seeded_by(start) else 0)

            # 0017: a stored Redis trigger loads from its new classpath under its new key.
            for redis in await session.scalars(
                select(Trigger).where(Trigger.classpath.in_(REDIS_MOVED.values()))
            ):
                loaded = load_trigger(redis.classpath, redis.kwargs)
                assert trigger_key(*loaded.serialize()) == redis.key
            kafka = await session.scalar(select(Trigger).where(Trigger.classpath == KAFKA))
            assert kafka is not None
            # 0006: the last event of a watcher is its last poll as stored before.
            assert kafka.last_event_at == kafka.last_poll_at == _at(5)
            assert kafka.reads_as == ("triggerer-orders" if "0007" in _seeded_by(start) else None)

        async with session_factory(engine).begin() as session:
            redelivered = NewEvent(
                asset_id=listed[0].asset_id,
                extra=EVENTS[0].extra,
                source="trigger",
                dedup_key=EVENTS[0].key_at_head,
                source_trigger_id=kafka.id,
            )
            new = dataclasses.replace(
                redelivered,
                extra=_kafka_extra(0, 44, 1_764_000_100_000),
                dedup_key="orders/0/44@1764000100000",
                traceparent=TRACEPARENT,
                tracestate="rojo=1",
            )
            recorded = await record_events(session, [redelivered, new])
            # A message stored before the upgrade, delivered again after it, is absorbed.
            assert recorded.duplicates == 1
            assert [event.dedup_key for event in recorded.events] == [new.dedup_key]
            assert recorded.queued_pipelines == {"count_orders"}

        # 0021: the events from before have no trace context; a new one keeps its own.
        async with session_factory(engine)() as session:
            contexts = await session.execute(
                select(AssetEvent.traceparent, AssetEvent.tracestate).order_by(AssetEvent.id)
            )
            assert contexts.all() == [(None, None)] * len(EVENTS) + [(TRACEPARENT, "rojo=1")]
    finally:
        await engine.dispose()


def test_the_revisions_form_one_line_from_a_single_base_to_a_single_head() -> None:
    script = ScriptDirectory.from_config(alembic_config())
    assert script.get_heads() == [head_revision()]  # what `alembic heads` prints
    assert script.get_bases() == [REVISIONS[0]]
    chain = _chain()
    assert chain[0].down_revision is None
    for earlier, later in itertools.pairwise(chain):
        assert later.down_revision == earlier.revision, later.path
    assert not any(revision.branch_labels or revision.dependencies for revision in chain)
    files = {path.name for path in (MIGRATIONS_DIR / "versions").glob("[!_]*.py")}
    assert {Path(revision.path).name for revision in chain} == files


@pytest.mark.parametrize("start", REVISIONS[:-1])
async def test_a_populated_database_upgrades_to_head_keeping_every_row(
    populated: tuple[str, Rows], start: str
) -> None:
    url, before = populated

    await upgrade(url)

    _assert_every_row_kept(before, await _on(url, _every_row), start)
    await _assert_the_daemon_reads_and_records(url, start)


async def _triggerer(url: str, tmp_path: Path, *argv: str) -> str:
    """Run the ``triggerer`` command on the database at ``url``; its stdout."""
    environment = {
        name: value for name, value in os.environ.items() if not name.startswith("TRIGGERER_")
    }
    environment |= {
        "TRIGGERER_DATABASE__URL": url,
        "TRIGGERER_PIPELINES__DIR": str(tmp_path / "pipelines"),
    }
    process = await asyncio.create_subprocess_exec(
        TRIGGERER_BIN,
        *argv,
        env=environment,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    return out.decode()


async def test_triggerer_db_upgrade_migrates_a_populated_database_the_listings_then_read(
    populated: tuple[str, Rows], start: str, tmp_path: Path
) -> None:
    url, before = populated

    assert "is up to date" in await _triggerer(url, tmp_path, "db", "upgrade")

    _assert_every_row_kept(before, await _on(url, _every_row), start)
    runs = json.loads(await _triggerer(url, tmp_path, "runs", "list", "--json"))
    assert sorted((run["run_id"], run["state"]) for run in runs) == sorted(
        (run.run_id, run.state) for run in RUNS
    )
    events = json.loads(await _triggerer(url, tmp_path, "events", "list", "--json"))
    assert [event["extra"] for event in reversed(events)] == [event.extra for event in EVENTS]
    await _assert_the_daemon_reads_and_records(url, start)
