"""Retention, through ``triggerer run --config`` under a steady Kafka flow, and by hand with
``triggerer db clean``: old runs (with their logs in the store and their log folders), events,
dead letters and audit rows go; what is recent, still queued for a pipeline or consumed by a
run that has not ended stays; every message produced meanwhile is exactly one event (and no
audit row: a watcher's events are nobody's change); ``db clean`` is itself an audit row."""

from __future__ import annotations

import datetime as dt
import json
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from tests.e2e.daemon import ORDERS, Deployment, triggerer_cli
from triggerer.service import actions, audit
from triggerer.service.loader import load_pipelines
from triggerer.service.principals import cli_principal
from triggerer.service.scheduling.registry import sync_definitions
from triggerer.service.store import create_engine, models, session_factory
from triggerer.service.store.states import AuditAction, RunState

PIPELINES = """
    never = Asset("never")

    @pipeline(schedule=orders)
    def paused_report(spark, context): ...

    @pipeline(schedule=never)
    def busy(spark, context): ...
"""
NO_SPARK = "sc://127.0.0.1:9"
"""No run starts in these tests: the seeded running run is another instance's."""
OTHER_INSTANCE = "other-host:1:retention-test"
RETENTION_DAYS = 10
OLD_EVENTS = 3_000
"""Plain old events: many batches of :data:`BATCH_SIZE`."""
BATCH_SIZE = 100
MIN_MESSAGES = 300
LOG_CHUNKS = 150
"""Chunks of each seeded run's log in the store: an old run's take two batches."""
SEEDED_ACTOR = "seed"
"""The actor of the seeded audit rows."""
DELETED = {
    "runs": 3,
    "log_chunks": 3 * LOG_CHUNKS,
    "log_folders": 3,
    "events": OLD_EVENTS + 3,
    "dead_letters": 3,
    "audit": 3,
}
"""What retention deletes of the seed, by kind."""


@dataclass
class Seeded:
    """The ids of what :func:`seed` wrote that the tests look for afterwards."""

    kept_event_ids: set[int]
    """Events that stay: recent, still queued, consumed by the running run, made by an old run."""
    made_by_old_run: int
    old_runs: set[str]
    kept_runs: set[str]
    old_folders: list[Path]
    kept_folders: list[Path]
    kept_dead_letter: int
    kept_run_pks: set[int]
    kept_audit: int


async def seed(database_url: str, logs_dir: Path) -> Seeded:
    """Rows from 20 days ago and from 5 days ago, written straight into the store in one
    transaction: events (one linked to an alias), finished runs with log folders, dead letters,
    audit rows;
    an old event queued for the paused pipeline ``paused_report``, and one consumed by a run of
    ``busy`` that another live instance is running."""
    now = dt.datetime.now(dt.UTC)
    old, recent = now - dt.timedelta(days=20), now - dt.timedelta(days=5)
    engine = create_engine(database_url)
    try:
        async with session_factory(engine).begin() as session:
            orders = await actions.find_asset(session, asset_id=None, uri="orders")
            never = await actions.find_asset(session, asset_id=None, uri="never")
            alias = models.AssetAlias(name="old_alias")
            session.add(alias)
            # Alive throughout: a heartbeat in the future cannot go stale, however busy the
            # machine (a stale one would have the daemon run the run again).
            heartbeat = now + dt.timedelta(days=1)
            session.add(
                models.Instance(
                    id=OTHER_INSTANCE, hostname="other-host", pid=1, heartbeat_at=heartbeat
                )
            )

            def event(asset_id: int, at: dt.datetime, **columns: Any) -> models.AssetEvent:
                return models.AssetEvent(
                    asset_id=asset_id, extra={"seeded": True}, source="cli", timestamp=at, **columns
                )

            plain = [event(orders, old) for _ in range(OLD_EVENTS)]
            queued, consumed_running = event(orders, old), event(never, old)
            consumed_finished = [event(never, old) for _ in range(3)]
            recent_event = event(orders, recent)
            session.add_all([*plain, queued, consumed_running, *consumed_finished, recent_event])

            def run(name: str, state: str, ended: dt.datetime | None) -> models.Run:
                run_id = f"busy__manual__{name}"
                return models.Run(
                    run_id=run_id,
                    pipeline_id="busy",
                    run_type="manual",
                    state=state,
                    try_number=1,
                    created_at=old,
                    start_date=old,
                    end_date=ended,
                    owner=OTHER_INSTANCE if ended is None else None,
                    log_path=str(logs_dir / "busy" / run_id / "try-1.log"),
                )

            old_runs = [
                run("old_success", RunState.SUCCESS, old),
                run("old_failed", RunState.FAILED, old),
                run("old_cancelled", RunState.CANCELLED, old),
            ]
            recent_run = run("recent", RunState.SUCCESS, recent)
            running = run("running", RunState.RUNNING, None)
            session.add_all([*old_runs, recent_run, running])
            letters = [
                models.DeadLetter(source="trigger", payload="{}", reason="seeded", created_at=at)
                for at in (old, old, old, recent)
            ]
            session.add_all(letters)
            audit_rows = [
                models.AuditEntry(
                    time=at, actor=SEEDED_ACTOR, action="pause", target="pipeline:busy", details={}
                )
                for at in (old, old, old, recent)
            ]
            session.add_all(audit_rows)
            await session.flush()

            session.add_all(
                models.RunLogChunk(
                    run_pk=r.id, try_number=1, seq=seq, position=seq * 12, data=b"a log line\n"
                )
                for r in [*old_runs, recent_run, running]
                for seq in range(LOG_CHUNKS)
            )
            made_by_old_run = event(orders, recent, source_run_pk=old_runs[0].id)
            session.add(made_by_old_run)
            session.add(models.AssetEventAlias(event_id=plain[0].id, alias_id=alias.id))
            session.add(
                models.QueuedEvent(pipeline_id="paused_report", asset_id=orders, event_id=queued.id)
            )
            links = [(running, consumed_running), *zip(old_runs, consumed_finished, strict=True)]
            session.add_all(
                models.RunEvent(run_pk=r.id, event_id=e.id, pipeline_id="busy") for r, e in links
            )
            await session.flush()
            seeded = Seeded(
                kept_event_ids={
                    queued.id,
                    consumed_running.id,
                    recent_event.id,
                    made_by_old_run.id,
                },
                made_by_old_run=made_by_old_run.id,
                old_runs={r.run_id for r in old_runs},
                kept_runs={recent_run.run_id, running.run_id},
                old_folders=[Path(r.log_path or "").parent for r in old_runs],
                kept_folders=[Path(r.log_path or "").parent for r in (recent_run, running)],
                kept_dead_letter=letters[-1].id,
                kept_run_pks={recent_run.id, running.id},
                kept_audit=audit_rows[-1].id,
            )
    finally:
        await engine.dispose()
    for folder in [*seeded.old_folders, *seeded.kept_folders]:
        folder.mkdir(parents=True)
        (folder / "try-1.log").write_text("a run's log\n")
    return seeded


async def prepare(deployment: Deployment) -> None:
    """The pipelines folder and the store as a daemon would have left them, ``paused_report``
    paused."""
    deployment.write_pipelines(ORDERS + PIPELINES)
    engine = create_engine(deployment.database_url)
    try:
        async with session_factory(engine).begin() as session:
            await sync_definitions(session, load_pipelines(deployment.tmp_path / "pipelines"))
            await actions.set_paused(session, "paused_report", True, actor=cli_principal())
    finally:
        await engine.dispose()


@dataclass(frozen=True)
class Store:
    """What the tests compare before and after."""

    seeded_event_ids: set[int]
    """Events written by the seed (and the one an old run made) that are still there."""
    old_events_left: int
    runs: set[str]
    run_links: int
    alias_links: int
    dead_letters: set[int]
    source_run_of_made_by_old_run: int | None
    log_chunks: dict[int, int]
    """Chunks of runs' logs in the store, by run."""
    seeded_audit: set[int]
    """The seed's audit rows still there."""


async def store(session: AsyncSession, seeded: Seeded) -> Store:
    seeded_events = await session.scalars(
        select(models.AssetEvent.id).where(models.AssetEvent.source != "trigger")
    )
    cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(days=RETENTION_DAYS)
    return Store(
        seeded_event_ids=set(seeded_events.all()),
        old_events_left=await _count(session, models.AssetEvent.timestamp < cutoff),
        runs=set((await session.scalars(select(models.Run.run_id))).all()),
        run_links=await _count_rows(session, models.RunEvent),
        alias_links=await _count_rows(session, models.AssetEventAlias),
        dead_letters=set((await session.scalars(select(models.DeadLetter.id))).all()),
        source_run_of_made_by_old_run=await session.scalar(
            select(models.AssetEvent.source_run_pk).where(
                models.AssetEvent.id == seeded.made_by_old_run
            )
        ),
        log_chunks=await _chunks_by_run(session),
        seeded_audit=set(
            (
                await session.scalars(
                    select(models.AuditEntry.id).where(models.AuditEntry.actor == SEEDED_ACTOR)
                )
            ).all()
        ),
    )


async def _chunks_by_run(session: AsyncSession) -> dict[int, int]:
    chunk = models.RunLogChunk
    rows = await session.execute(select(chunk.run_pk, func.count()).group_by(chunk.run_pk))
    return dict(rows.all())


async def _count(session: AsyncSession, where: Any) -> int:
    query = select(func.count()).select_from(models.AssetEvent).where(where)
    return int(await session.scalar(query) or 0)


async def _count_rows(session: AsyncSession, table: type[models.Base]) -> int:
    return int(await session.scalar(select(func.count()).select_from(table)) or 0)


def cleaned(seeded: Seeded) -> Store:
    """The store once retention is done with the seed."""
    return Store(
        seeded_event_ids=seeded.kept_event_ids,
        old_events_left=2,  # the queued one, and the one the running run consumed
        runs=seeded.kept_runs,
        run_links=1,  # the running run's
        alias_links=0,
        dead_letters={seeded.kept_dead_letter},
        source_run_of_made_by_old_run=None,
        log_chunks=dict.fromkeys(seeded.kept_run_pks, LOG_CHUNKS),
        seeded_audit={seeded.kept_audit},
    )


@pytest.fixture
def deployment(
    tmp_path: Path, migrated_database_url: str, kafka_broker: str, kafka_topic: str
) -> Deployment:
    return Deployment(tmp_path, migrated_database_url, NO_SPARK, kafka_broker, kafka_topic)


@pytest.fixture
def offline(tmp_path: Path, migrated_database_url: str) -> Deployment:
    """A deployment whose Kafka is never reached: for the CLI alone."""
    return Deployment(tmp_path, migrated_database_url, NO_SPARK, "127.0.0.1:9", "none")


@pytest.mark.timeout(300)
async def test_the_daemon_deletes_what_is_old_and_keeps_what_is_needed_under_ingest(
    deployment: Deployment,
) -> None:
    await prepare(deployment)
    config = deployment.config_file(
        retention={
            "events_days": RETENTION_DAYS,
            "runs_days": RETENTION_DAYS,
            "dead_letters_days": RETENTION_DAYS,
            "audit_days": RETENTION_DAYS,
            "interval_s": 0.5,
            "batch_size": BATCH_SIZE,
        },
        api={"enabled": True, "port": 0},
    )
    retention_done, produced = anyio.Event(), anyio.Event()
    sent: list[int] = []

    def messages() -> Iterator[dict[str, int]]:
        """A steady flow from before the daemon starts until retention has done its work."""
        n = 0
        while n < MIN_MESSAGES or not retention_done.is_set():
            sent.append(n)
            yield {"n": n}
            n += 1

    async def flow() -> None:
        await deployment.produce(messages(), batch=10, pause_s=0.02)
        produced.set()

    with deployment.process_with_config(config) as daemon:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(flow)
            daemon.start()
            # The old rows arrive while ingest is busy: the passes that delete them run beside it.
            await deployment.wait_for(trigger_events, lambda found: len(found) >= 50)
            seeded = await seed(deployment.database_url, deployment.tmp_path / "logs")
            after = await deployment.wait_for(
                lambda session: store(session, seeded),
                lambda found: found == cleaned(seeded),
                timeout_s=120,
            )
            retention_done.set()
            lease = await deployment.query(lambda s: s.get(models.Lease, "retention"))
            await produced.wait()
            await deployment.wait_for(
                trigger_events, lambda found: len(found) >= len(sent), timeout_s=120
            )
            await retention_passes_done(daemon.log_path)
            [listening] = await daemon.wait_logged("api_listening")
            deleted = await retention_metric(listening["url"])
            tasks.cancel_scope.cancel()
        daemon.signal(signal.SIGTERM)
        assert await daemon.wait(60) == 0, daemon.tail()
        passes = await daemon.wait_logged("retention_pass")

    assert after == cleaned(seeded)
    # Every message is one event, none lost, none doubled.
    assert await deployment.query(trigger_events) == [{"n": n} for n in sent]
    assert len(sent) >= MIN_MESSAGES
    assert not any(folder.exists() for folder in seeded.old_folders)
    assert all(folder.exists() for folder in seeded.kept_folders)
    assert {kind: sum(p[kind] for p in passes) for kind in DELETED} == DELETED
    assert all(p["duration_s"] >= 0 for p in passes)
    assert deleted == DELETED
    assert lease is not None
    assert lease.owner not in (OTHER_INSTANCE, None)
    # The pause of prepare() is the one change made by a principal.
    assert await deployment.query(audit_rows) == [(cli_principal().name, "pause")]


async def audit_rows(session: AsyncSession) -> list[tuple[str, str]]:
    """(actor, action) of the audit rows not seeded, oldest first."""
    rows = await session.execute(
        select(models.AuditEntry.actor, models.AuditEntry.action)
        .where(models.AuditEntry.actor != SEEDED_ACTOR)
        .order_by(models.AuditEntry.id)
    )
    return [(actor, action) for actor, action in rows.all()]


async def trigger_events(session: AsyncSession) -> list[Any]:
    rows = await session.scalars(
        select(models.AssetEvent.extra)
        .where(models.AssetEvent.source == "trigger")
        .order_by(models.AssetEvent.id)
    )
    return sorted((extra["payload"]["value"] for extra in rows.all()), key=lambda v: v["n"])


async def retention_metric(api_url: str) -> dict[str, float]:
    """``triggerer_retention_deleted_total`` by kind, from the daemon's ``/metrics``."""
    async with httpx.AsyncClient() as client:
        text = (await client.get(f"{api_url}/metrics")).text
    found = {}
    for line in text.splitlines():
        if line.startswith("triggerer_retention_deleted_total{"):
            labels, value = line.rsplit(" ", 1)
            found[labels.split('kind="')[1].split('"')[0]] = float(value)
    return found


async def retention_passes_done(log_path: Path) -> None:
    """Until the daemon has logged a pass that deleted nothing, after the first ones."""
    with anyio.fail_after(30):
        while True:
            text = await anyio.Path(log_path).read_text()
            passes = [json.loads(line) for line in text.splitlines() if "retention_pass" in line]
            if passes and not any(passes[-1][kind] for kind in ("runs", "events")):
                return
            await anyio.sleep(0.2)


@pytest.mark.timeout(240)
async def test_db_clean_says_what_it_would_delete_then_deletes_it(offline: Deployment) -> None:
    await prepare(offline)
    seeded = await seed(offline.database_url, offline.tmp_path / "logs")
    before = await offline.query(lambda session: store(session, seeded))
    day = (dt.datetime.now(dt.UTC) - dt.timedelta(days=RETENTION_DAYS)).date().isoformat()

    dry = await triggerer_cli(offline.env(), "db", "clean", "--before", day, "--dry-run")

    assert dry.returncode == 0, dry.stderr.decode()
    assert dry.stdout.decode().splitlines() == [
        f"from before {day}T00:00:00+00:00, would delete (dry run: nothing deleted):",
        "  3 runs",
        f"  {3 * LOG_CHUNKS} log chunks (their logs in the store)",
        "  3 log folders",
        f"  {OLD_EVENTS + 3} events (2 more kept: queued for a pipeline, or consumed by a run "
        "that has not ended)",
        "  3 dead letters",
        "  3 audit rows",
    ]
    assert await offline.query(lambda session: store(session, seeded)) == before
    assert all(folder.exists() for folder in seeded.old_folders)

    real = await triggerer_cli(offline.env(), "db", "clean", "--before", day)

    assert real.returncode == 0, real.stderr.decode()
    assert real.stdout.decode().splitlines()[0] == f"from before {day}T00:00:00+00:00, deleted:"
    assert real.stdout.decode().splitlines()[1:] == dry.stdout.decode().splitlines()[1:]
    assert await offline.query(lambda session: store(session, seeded)) == cleaned(seeded)
    assert not any(folder.exists() for folder in seeded.old_folders)
    assert all(folder.exists() for folder in seeded.kept_folders)
    # The clean is a change: one row, once it is done, with what it deleted (the dry run none).
    cli = cli_principal().name
    assert await offline.query(audit_rows) == [(cli, "pause"), (cli, "db_clean")]
    [clean] = await offline.query(
        lambda session: audit.entries(session, action=AuditAction.DB_CLEAN)
    )
    assert (clean.target, clean.details["before"]) == ("database", f"{day}T00:00:00+00:00")
    assert clean.details["deleted"] == DELETED


@pytest.mark.parametrize(
    ("date", "error"),
    [
        ("last tuesday", "'last tuesday' is not an ISO date or date and time"),
        ("2026-02-30", "'2026-02-30' is not an ISO date or date and time"),
        ("2999-01-01", "'2999-01-01' is in the future"),
    ],
)
async def test_db_clean_names_a_bad_date(tmp_path: Path, date: str, error: str) -> None:
    env = Deployment(tmp_path, f"sqlite:///{tmp_path / 'none.db'}", NO_SPARK, "", "").env()

    done = await triggerer_cli(env, "db", "clean", "--before", date)

    assert done.returncode == 1
    [line] = done.stderr.decode().splitlines()
    assert line.startswith(f"triggerer: --before {error}"), line
