"""The ``triggerer`` command line: run the daemon, inspect and poke it."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any, TypeVar

import anyio
from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from triggerer.config import ConfigError, Settings, load_settings
from triggerer.events import NewEvent, record_events
from triggerer.logs import configure_logging
from triggerer.store import create_engine, models, session_factory, upgrade
from triggerer.store.models import EventSource
from triggerer.store.notices import notify_queued
from triggerer.store.types import utcnow

_T = TypeVar("_T")
Rows = list[dict[str, Any]]
Handler = Callable[[Settings, argparse.Namespace], Awaitable[int]]


class CliError(Exception):
    """A user error: printed to stderr, exit code 1."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    arguments = parser.parse_args(argv)
    if not hasattr(arguments, "handler"):
        parser.print_help(sys.stderr)
        return 2
    try:
        settings = load_settings(arguments.config)
        configure_logging(settings.logging)
        code: int = anyio.run(arguments.handler, settings, arguments)
    except (ConfigError, CliError, LookupError, ValueError) as error:
        print(f"triggerer: {error}", file=sys.stderr)  # noqa: T201 - CLI output
        return 1
    return code


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="triggerer", description=__doc__)
    parser.add_argument("--config", help="config file (default: $TRIGGERER_CONFIG)")
    verbs = parser.add_subparsers(metavar="COMMAND")

    def verb(
        group: Any, name: str, handler: Handler, help_text: str, *, listing: bool = False
    ) -> argparse.ArgumentParser:
        command: argparse.ArgumentParser = group.add_parser(name, help=help_text)
        command.set_defaults(handler=handler)
        if listing:
            command.add_argument("--json", action="store_true", help="one JSON array on stdout")
            command.add_argument("--limit", type=int, default=50)
        return command

    verb(verbs, "run", _run, "run the daemon until SIGTERM/SIGINT")
    verb(verbs, "check", _check, "exit 0 when a daemon heartbeat is fresh")
    db = verbs.add_parser("db", help="the metadata database").add_subparsers(metavar="VERB")
    verb(db, "upgrade", _db_upgrade, "migrate the database to this version's schema")

    pipelines = verbs.add_parser("pipelines", help="pipelines").add_subparsers(metavar="VERB")
    verb(pipelines, "list", _listing(_pipelines_rows), "list pipelines", listing=True)
    for name, handler in (("pause", _pause), ("unpause", _unpause)):
        verb(pipelines, name, handler, f"{name} a pipeline").add_argument("pipeline_id")
    trigger = verb(pipelines, "trigger", _trigger, "queue a manual run")
    trigger.add_argument("pipeline_id")
    trigger.add_argument("--params", type=json.loads, default={}, help="JSON object")

    assets = verbs.add_parser("assets", help="assets").add_subparsers(metavar="VERB")
    verb(assets, "list", _listing(_assets_rows), "list assets", listing=True)

    watchers = verbs.add_parser("watchers", help="watchers").add_subparsers(metavar="VERB")
    verb(watchers, "list", _listing(_watchers_rows), "state, last poll and errors", listing=True)

    events = verbs.add_parser("events", help="asset events").add_subparsers(metavar="VERB")
    verb(events, "list", _listing(_events_rows), "list recent events", listing=True).add_argument(
        "--uri"
    )
    emit = verb(events, "emit", _emit, "create an event on an asset")
    emit.add_argument("uri")
    emit.add_argument("--extra", type=json.loads, default={}, help="JSON object")
    emit.add_argument("--partition-key")

    runs = verbs.add_parser("runs", help="runs").add_subparsers(metavar="VERB")
    verb(runs, "list", _listing(_runs_rows), "list recent runs", listing=True).add_argument(
        "--pipeline"
    )
    verb(runs, "logs", _runs_logs, "print a run's log").add_argument("run_id")

    post = verbs.add_parser("post", help="send messages to fire pipelines")
    targets = post.add_subparsers(metavar="BROKER")
    kafka = verb(targets, "kafka", _post_kafka, "produce to a Kafka topic")
    kafka.add_argument("topic")
    kafka.add_argument("messages", nargs="+", help="JSON values or text")
    kafka.add_argument("--bootstrap-servers", default="127.0.0.1:9092")
    kafka.add_argument("--key")
    sqs = verb(targets, "sqs", _post_sqs, "send to an SQS queue")
    sqs.add_argument("queue", help="queue URL or name")
    sqs.add_argument("messages", nargs="+", help="JSON values or text")
    sqs.add_argument("--endpoint-url")
    sqs.add_argument("--region", default="us-east-1")

    verb(verbs, "explain", _explain, "why a pipeline has or has not run").add_argument(
        "pipeline_id"
    )
    return parser


def _listing(rows_of: Callable[[AsyncSession, argparse.Namespace], Awaitable[Rows]]) -> Handler:
    """A ``list`` verb: the rows ``rows_of`` reads, as a table or (``--json``) one JSON array."""

    async def handler(settings: Settings, arguments: argparse.Namespace) -> int:
        rows = await _with_session(settings, lambda session: rows_of(session, arguments))
        _table(rows, arguments.json)
        return 0

    return handler


async def _run(settings: Settings, _: argparse.Namespace) -> int:
    from triggerer.daemon.service import serve

    await serve(settings)
    return 0


async def _db_upgrade(settings: Settings, _: argparse.Namespace) -> int:
    await upgrade(settings.database.url)
    _say(f"database at {settings.database.url} is up to date")
    return 0


async def _with_session(settings: Settings, work: Callable[[AsyncSession], Awaitable[_T]]) -> _T:
    engine = create_engine(settings.database.url)
    try:
        async with session_factory(engine).begin() as session:
            return await work(session)
    finally:
        await engine.dispose()


async def _check(settings: Settings, _: argparse.Namespace) -> int:
    async def work(session: AsyncSession) -> int:
        stale = utcnow() - timedelta(seconds=settings.daemon.dead_after_s)
        latest = await session.scalar(select(func.max(models.Instance.heartbeat_at)))
        fresh = latest is not None and latest >= stale
        _say(f"heartbeat {'fresh' if fresh else 'stale'}: last at {latest}")
        return 0 if fresh else 1

    return await _with_session(settings, work)


async def _pipelines_rows(session: AsyncSession, arguments: argparse.Namespace) -> Rows:
    rows = await session.scalars(
        select(models.Pipeline).order_by(models.Pipeline.pipeline_id).limit(arguments.limit)
    )
    return [
        {
            "pipeline_id": p.pipeline_id,
            "schedule": p.schedule_text,
            "paused": p.paused,
            "active": p.is_active,
            "fileloc": p.fileloc,
        }
        for p in rows.all()
    ]


async def _set_paused(settings: Settings, pipeline_id: str, paused: bool) -> int:
    async def work(session: AsyncSession) -> int:
        changed = await session.execute(
            update(models.Pipeline)
            .where(models.Pipeline.pipeline_id == pipeline_id)
            .values(paused=paused)
        )
        if changed.rowcount != 1:  # type: ignore[attr-defined]  # CursorResult
            raise CliError(f"pipeline {pipeline_id!r} does not exist (see 'pipelines list')")
        _say(f"pipeline {pipeline_id} {'paused' if paused else 'unpaused'}")
        return 0

    return await _with_session(settings, work)


async def _pause(settings: Settings, arguments: argparse.Namespace) -> int:
    return await _set_paused(settings, arguments.pipeline_id, True)


async def _unpause(settings: Settings, arguments: argparse.Namespace) -> int:
    return await _set_paused(settings, arguments.pipeline_id, False)


async def _trigger(settings: Settings, arguments: argparse.Namespace) -> int:
    from triggerer.daemon.scheduler import create_manual_run

    async def work(session: AsyncSession) -> int:
        _say(await create_manual_run(session, arguments.pipeline_id, arguments.params))
        return 0

    return await _with_session(settings, work)


async def _assets_rows(session: AsyncSession, arguments: argparse.Namespace) -> Rows:
    rows = await session.scalars(
        select(models.Asset).order_by(models.Asset.id).limit(arguments.limit)
    )
    return [{"id": a.id, "name": a.name, "uri": a.uri, "group": a.group} for a in rows.all()]


async def _watchers_rows(session: AsyncSession, arguments: argparse.Namespace) -> Rows:
    rows = await session.execute(
        select(models.AssetWatcher.name, models.Asset.uri, models.Trigger)
        .join(models.Asset, models.Asset.id == models.AssetWatcher.asset_id)
        .join(models.Trigger, models.Trigger.id == models.AssetWatcher.trigger_id)
        .order_by(models.AssetWatcher.name)
        .limit(arguments.limit)
    )
    return [
        {
            "watcher": name,
            "asset": uri,
            "trigger": trigger.classpath.rpartition(".")[2],
            "state": trigger.state,
            "last_poll_at": trigger.last_poll_at.isoformat() if trigger.last_poll_at else None,
            "restarts": trigger.restart_count,
            "last_error": trigger.last_error,
        }
        for name, uri, trigger in rows.all()
    ]


async def _events_rows(session: AsyncSession, arguments: argparse.Namespace) -> Rows:
    query = (
        select(models.AssetEvent, models.Asset.uri)
        .join(models.Asset, models.Asset.id == models.AssetEvent.asset_id)
        .order_by(models.AssetEvent.id.desc())
        .limit(arguments.limit)
    )
    if arguments.uri:
        query = query.where(models.Asset.uri == arguments.uri)
    rows = (await session.execute(query)).all()
    return [
        {
            "id": e.id,
            "uri": uri,
            "source": e.source,
            "timestamp": e.timestamp.isoformat(),
            "partition_key": e.partition_key,
            "extra": e.extra,
        }
        for e, uri in rows
    ]


async def _emit(settings: Settings, arguments: argparse.Namespace) -> int:
    async def work(session: AsyncSession) -> int:
        asset_id = await session.scalar(
            select(models.Asset.id).where(models.Asset.uri == arguments.uri)
        )
        if asset_id is None:
            raise CliError(f"no asset with URI {arguments.uri!r} (see 'assets list')")
        if not isinstance(arguments.extra, dict):
            raise CliError(f"--extra must be a JSON object, got {arguments.extra!r}")
        recorded = await record_events(
            session,
            [
                NewEvent(
                    asset_id=asset_id,
                    extra=arguments.extra,
                    source=EventSource.CLI,
                    partition_key=arguments.partition_key,
                )
            ],
        )
        await notify_queued(session, recorded.queued_pipelines)  # wakes a running daemon
        queued = ", ".join(sorted(recorded.queued_pipelines)) or "no pipeline"
        _say(f"event {recorded.events[0].id} on {arguments.uri}; queued for {queued}")
        return 0

    return await _with_session(settings, work)


async def _runs_rows(session: AsyncSession, arguments: argparse.Namespace) -> Rows:
    query = select(models.Run).order_by(models.Run.id.desc()).limit(arguments.limit)
    if arguments.pipeline:
        query = query.where(models.Run.pipeline_id == arguments.pipeline)
    runs = (await session.scalars(query)).all()
    consumed = await _consumed(session, [run.id for run in runs])
    return [
        {
            "run_id": r.run_id,
            "pipeline_id": r.pipeline_id,
            "state": r.state,
            "type": r.run_type,
            "try": r.try_number,
            "events": consumed.get(r.id, 0),
            "created_at": r.created_at.isoformat(),
            "end_date": r.end_date.isoformat() if r.end_date else None,
        }
        for r in runs
    ]


async def _consumed(session: AsyncSession, run_pks: list[int]) -> dict[int, int]:
    rows = await session.execute(
        select(models.RunEvent.run_pk, func.count())
        .where(models.RunEvent.run_pk.in_(run_pks))
        .group_by(models.RunEvent.run_pk)
    )
    return {run_pk: count for run_pk, count in rows.all()}  # noqa: C416 - rows are Row objects


async def _runs_logs(settings: Settings, arguments: argparse.Namespace) -> int:
    async def work(session: AsyncSession) -> str | None:
        run = await session.scalar(select(models.Run).where(models.Run.run_id == arguments.run_id))
        if run is None:
            raise CliError(f"run {arguments.run_id!r} does not exist (see 'runs list')")
        return run.log_path

    log_path = await _with_session(settings, work)
    if log_path is None or not await anyio.Path(log_path).is_file():
        raise CliError(f"run {arguments.run_id!r} has no log yet")
    sys.stdout.write(await anyio.Path(log_path).read_text(errors="replace"))
    return 0


async def _post_kafka(_: Settings, arguments: argparse.Namespace) -> int:
    from watchers.producers import send_kafka

    sent = await send_kafka(
        arguments.bootstrap_servers,
        arguments.topic,
        _messages(arguments.messages),
        key=arguments.key,
    )
    _say(f"sent {len(sent)} message(s) to {arguments.topic}")
    return 0


async def _post_sqs(_: Settings, arguments: argparse.Namespace) -> int:
    from watchers.producers import send_sqs

    sent = await send_sqs(
        arguments.queue,
        _messages(arguments.messages),
        endpoint_url=arguments.endpoint_url,
        region_name=arguments.region,
    )
    _say(f"sent {len(sent)} message(s) to {arguments.queue}")
    return 0


async def _explain(settings: Settings, arguments: argparse.Namespace) -> int:
    async def work(session: AsyncSession) -> int:
        pipeline = await session.get(models.Pipeline, arguments.pipeline_id)
        if pipeline is None:
            raise CliError(f"pipeline {arguments.pipeline_id!r} does not exist")
        lines = [f"{pipeline.pipeline_id}: schedule {pipeline.schedule_text}"]
        if pipeline.paused:
            lines.append("  paused: no events are queued and no runs start")
        if not pipeline.is_active:
            lines.append(f"  inactive: its file {pipeline.fileloc} no longer defines it")
        scheduled = await session.execute(
            select(
                models.Asset.uri,
                func.count(models.QueuedEvent.id),
                func.min(models.QueuedEvent.created_at),
            )
            .join(models.PipelineAssetRef, models.PipelineAssetRef.asset_id == models.Asset.id)
            .outerjoin(
                models.QueuedEvent,
                (models.QueuedEvent.asset_id == models.Asset.id)
                & (models.QueuedEvent.pipeline_id == pipeline.pipeline_id),
            )
            .where(
                models.PipelineAssetRef.pipeline_id == pipeline.pipeline_id,
                models.PipelineAssetRef.role == "schedule",
            )
            .group_by(models.Asset.uri)
        )
        for uri, count, since in scheduled.all():
            state = (
                f"{count} queued event(s) since {since}" if count else "no queued event: waiting"
            )
            lines.append(f"  {uri}: {state}")
        active = await session.scalar(
            select(func.count())
            .select_from(models.Run)
            .where(
                models.Run.pipeline_id == pipeline.pipeline_id,
                models.Run.state.in_(("queued", "running", "up_for_retry")),
            )
        )
        lines.append(f"  active runs: {active} of max {pipeline.max_active_runs}")
        _say("\n".join(lines))
        return 0

    return await _with_session(settings, work)


def _messages(texts: list[str]) -> list[Any]:
    messages: list[Any] = []
    for text in texts:
        try:
            messages.append(json.loads(text))
        except ValueError:
            messages.append(text)
    return messages


def _table(rows: Rows, as_json: bool) -> None:
    if as_json:
        _say(json.dumps(rows, default=str))
        return
    if not rows:
        _say("(none)")
        return
    columns = list(rows[0])
    cells = [[_cell(row[c]) for c in columns] for row in rows]
    widths = [max(len(c), *(len(line[i]) for line in cells)) for i, c in enumerate(columns)]
    _say("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)))
    for line in cells:
        _say("  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)))


def _cell(value: Any) -> str:
    return json.dumps(value) if isinstance(value, (dict, list)) else str(value)


def _say(text: str) -> None:
    sys.stdout.write(text + "\n")
