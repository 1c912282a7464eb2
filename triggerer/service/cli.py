"""The ``triggerer`` command line: run the daemon, inspect and poke it.

Importing this module builds nothing but the parser: each verb's handler imports what it
needs when it runs, so ``triggerer --help`` starts at once and a list verb imports the store,
but not the daemon, Spark, the brokers' clients or the API server
(``tests/integration/test_cli_imports.py`` checks it).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable, Sequence
    from datetime import datetime

    import httpx
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

    from triggerer.service.api.schemas import CreatedEvent
    from triggerer.service.config import Settings
    from triggerer.service.events import Recorded
    from triggerer.service.explain import Explanation
    from triggerer.service.views import View, WatcherRow

    Handler = Callable[[Settings, argparse.Namespace], Awaitable[int]]
    ReadRows = Callable[[AsyncSession, argparse.Namespace], Awaitable[Sequence[View]]]

_T = TypeVar("_T")
Rows = list[dict[str, Any]]
TOKEN_ENV = "TRIGGERER_API_TOKEN"  # noqa: S105 - the variable's name, not a token
"""Where ``events emit --api`` finds the token when ``--token`` is not given."""


class CliError(Exception):
    """A user error: printed to stderr, exit code 1."""


class StoreUnavailable(CliError):
    """The metadata database does not answer."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    arguments = parser.parse_args(argv)
    if not hasattr(arguments, "handler"):
        parser.print_help(sys.stderr)
        return 2
    try:
        import asyncio

        from triggerer.service.config import load_settings

        settings = load_settings(arguments.config)
        if arguments.logs:
            from triggerer.service.logs import configure_logging

            configure_logging(settings.logging)
        # asyncio's runner rather than anyio's, whose backend (~25 ms to import) then comes with
        # the first call to anyio, which a verb reading the store never makes. The daemon runs
        # on either, as the end-to-end tests run it on pytest's loop.
        code: int = asyncio.run(arguments.handler(settings, arguments))
        sys.stdout.flush()  # a reader gone shows here rather than in the interpreter's exit
    except (CliError, LookupError, ValueError) as error:  # a ConfigError is a ValueError
        print(f"triggerer: {error}", file=sys.stderr)  # noqa: T201 - CLI output
        return 1
    except BrokenPipeError:
        # The reader of stdout is gone (`| head`): end quietly with the status of a tool that
        # SIGPIPE ended, as cat and ls do, so scripts tell it from a failure. Unwritten output
        # goes to devnull, or the interpreter's last flush would fail again and say so.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except KeyboardInterrupt:
        # Ctrl-C is not an error to explain. `run` never gets here: the daemon takes SIGINT
        # itself, as a graceful stop.
        return 128 + signal.SIGINT
    return code


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="triggerer", description="Run the triggerer daemon, inspect it and drive it."
    )
    parser.add_argument("--config", help="config file (default: $TRIGGERER_CONFIG)")
    verbs = parser.add_subparsers(metavar="COMMAND")

    def verb(
        group: Any,
        name: str,
        handler: Handler,
        help_text: str,
        *,
        listing: bool = False,
        reads: bool = False,
    ) -> argparse.ArgumentParser:
        """A verb running ``handler``; one that only ``reads`` and prints (every ``listing``)
        logs nothing, so it does not set logging up (structlog's import would be a tenth of
        its run)."""
        command: argparse.ArgumentParser = group.add_parser(name, help=help_text)
        command.set_defaults(handler=handler, logs=not (reads or listing))
        # Also after the verb (`triggerer run --config FILE`); SUPPRESS keeps one given before.
        command.add_argument("--config", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        if listing:
            command.add_argument("--json", action="store_true", help="one JSON array on stdout")
            command.add_argument("--limit", type=_limit, default=50)
        return command

    verb(verbs, "run", _run, "run the daemon until SIGTERM/SIGINT")
    verb(verbs, "check", _check, "exit 0 when a daemon heartbeat is fresh", reads=True)
    db = verbs.add_parser("db", help="the metadata database").add_subparsers(metavar="VERB")
    verb(db, "upgrade", _db_upgrade, "migrate the database to this version's schema")
    clean = verb(db, "clean", _db_clean, "delete runs, events and dead letters from before DATE")
    clean.add_argument("--before", required=True, metavar="DATE", help="ISO date or datetime")
    clean.add_argument("--dry-run", action="store_true", help="say what would go; delete nothing")

    pipelines = verbs.add_parser("pipelines", help="pipelines").add_subparsers(metavar="VERB")
    verb(
        pipelines,
        "list",
        _listing(_pipelines_rows, PIPELINE_COLUMNS),
        "list pipelines",
        listing=True,
    )
    for name, handler in (("pause", _pause), ("unpause", _unpause)):
        verb(pipelines, name, handler, f"{name} a pipeline").add_argument("pipeline_id")
    trigger = verb(pipelines, "trigger", _trigger, "queue a manual run")
    trigger.add_argument("pipeline_id")
    trigger.add_argument("--params", type=json.loads, default={}, help="JSON object")

    assets = verbs.add_parser("assets", help="assets").add_subparsers(metavar="VERB")
    verb(assets, "list", _listing(_assets_rows, ASSET_COLUMNS), "list assets", listing=True)

    watchers = verbs.add_parser("watchers", help="watchers").add_subparsers(metavar="VERB")
    verb(
        watchers,
        "list",
        _listing(_watchers_rows, WATCHER_COLUMNS),
        "state, lag, group, errors",
        listing=True,
    )

    events = verbs.add_parser("events", help="asset events").add_subparsers(metavar="VERB")
    verb(
        events,
        "list",
        _listing(_events_rows, EVENT_COLUMNS, cut=("extra",)),
        "list recent events",
        listing=True,
    ).add_argument("--uri")
    emit = verb(events, "emit", _emit, "create an event on an asset")
    emit.add_argument("uri")
    emit.add_argument("--extra", type=json.loads, default={}, help="JSON object")
    emit.add_argument("--partition-key")
    emit.add_argument("--api", metavar="URL", help="post to the REST API at URL instead")
    emit.add_argument("--token", help=f"bearer token for --api (default: ${TOKEN_ENV})")
    verb(
        events,
        "dead-letters",
        _listing(_dead_letters_rows, DEAD_LETTER_COLUMNS, cut=("payload",)),
        "events the store could not hold, with the reason",
        listing=True,
    )
    replay = verb(events, "replay", _replay, "queue an asset's stored events again", reads=True)
    replay.add_argument("--asset", required=True, metavar="NAME", help="asset name or URI")
    replay.add_argument("--pipeline", metavar="ID", help="only for this consumer")
    replay.add_argument("--since", required=True, metavar="TIME", help="ISO date or time, from")
    replay.add_argument("--until", metavar="TIME", help="ISO date or time, before (default: now)")
    replay.add_argument("--dry-run", action="store_true", help="say what would happen; change none")
    replay.add_argument("--json", action="store_true", help="one JSON object on stdout")

    runs = verbs.add_parser("runs", help="runs").add_subparsers(metavar="VERB")
    verb(
        runs, "list", _listing(_runs_rows, RUN_COLUMNS), "list recent runs", listing=True
    ).add_argument("--pipeline")
    verb(runs, "logs", _runs_logs, "print a run's log", reads=True).add_argument("run_id")
    verb(runs, "cancel", _runs_cancel, "cancel a queued or running run").add_argument("run_id")
    verb(runs, "rerun", _runs_rerun, "run a finished run again, on the same events").add_argument(
        "run_id"
    )

    post = verbs.add_parser("post", help="send messages to fire pipelines")
    targets = post.add_subparsers(metavar="BROKER")
    kafka = verb(targets, "kafka", _post, "produce to a Kafka topic")
    kafka.set_defaults(provider="kafka", address=_kafka_address, connection=None)
    kafka.add_argument("topic")
    kafka.add_argument("messages", nargs="+", help="JSON values or text")
    kafka.add_argument("--bootstrap-servers", default="127.0.0.1:9092")
    kafka.add_argument("--key")
    sqs = verb(targets, "sqs", _post, "send to an SQS queue")
    sqs.set_defaults(provider="sqs", address=_sqs_address, connection=None)
    sqs.add_argument("queue", help="queue URL or name")
    sqs.add_argument("messages", nargs="+", help="JSON values or text")
    sqs.add_argument("--endpoint-url")
    sqs.add_argument("--region", default="us-east-1")
    for name, where in POST_TARGETS.items():
        target = verb(targets, name, _post, f"send to {where}")
        target.set_defaults(provider=name, address=_uri_address)
        target.add_argument("uri", help="the queue's URI, as MessageQueueTrigger takes it")
        target.add_argument("messages", nargs="+", help="message bodies: JSON or text, as given")
        target.add_argument("--connection", help="the [connections.NAME] holding credentials")

    verb(verbs, "explain", _explain, "why a pipeline has or has not run", reads=True).add_argument(
        "pipeline_id"
    )
    return parser


MAX_LIMIT = 2**63 - 1

POST_TARGETS = {
    "nats": "a NATS JetStream subject",
    "redis-streams": "a Redis stream",
    "redis-pubsub": "a Redis pub/sub channel",
    "rabbitmq": "a RabbitMQ queue",
    "pubsub": "the topic of a Google Pub/Sub subscription",
    "kinesis": "an Amazon Kinesis stream",
    "mqtt": "an MQTT topic",
}
"""``triggerer post NAME``: the providers (by name) whose ``send`` it calls, and what to."""
"""The largest ``LIMIT`` SQLite and PostgreSQL take (a signed 64-bit integer)."""


def _limit(text: str) -> int:
    try:
        limit: int | None = int(text)
    except ValueError:
        limit = None
    if limit is None or not 1 <= limit <= MAX_LIMIT:
        raise argparse.ArgumentTypeError(
            f"must be a whole number from 1 to {MAX_LIMIT}, got {text!r}"
        )
    return limit


def _listing(rows_of: ReadRows, columns: tuple[str, ...], *, cut: tuple[str, ...] = ()) -> Handler:
    """A ``list`` verb: the rows ``rows_of`` reads, as a table of ``columns`` or (``--json``)
    one JSON array of whole rows, as the REST API returns them. In the table, the cells of the
    columns ``cut`` (payloads) show their first :data:`CUT_CHARS` characters."""

    async def handler(settings: Settings, arguments: argparse.Namespace) -> int:
        views = await _with_session(settings, lambda session: rows_of(session, arguments))
        rows = [view.model_dump(mode="json") for view in views]
        if arguments.json:
            _say(json.dumps(rows))
        else:
            # A row of another kind among them (a broken file among pipelines) has a dash.
            _table([{column: row.get(column, "-") for column in columns} for row in rows], cut)
        return 0

    return handler


async def _run(settings: Settings, _: argparse.Namespace) -> int:
    import structlog

    from triggerer.service.daemon.service import Server, Service, serve
    from triggerer.service.runs.processes import hide_environment

    hide_environment()  # its credentials stay out of reach of the runs it starts
    api: Callable[[Service], Server] | None = None
    if settings.api.enabled:  # the web stack is imported only when the API is served
        from triggerer.service.api.server import api_server as api

    try:
        await serve(settings, api=api)
    except (CliError, LookupError, ValueError):  # a ConfigError is a ValueError
        raise  # a setting to change: main() says which, in one line
    except Exception:  # noqa: BLE001
        # A bug past every fault boundary. The daemon ends at once, with the traceback, as
        # after kill -9 (its runs die with it; what was not committed was not acknowledged):
        # waiting for what libraries left running could hang it instead (aiosqlite's close of
        # a connection cancelled mid-statement never returns), and nothing restarts a daemon
        # that hangs.
        structlog.get_logger(__name__).critical("daemon_crashed", exc_info=True)
        logging.shutdown()
        os._exit(1)
    await _end_stray_tasks()
    return 0


async def _end_stray_tasks(timeout_s: float = 5.0) -> None:
    """Cancel what libraries left running once the daemon has stopped, as often as it takes.

    ``asyncio.run`` cancels such a task once and waits for it without end. A signal during the
    start that cancels a SQLite statement leaves one that a single cancel does not end:
    SQLAlchemy closes the aiosqlite connection gracefully and stops its thread at once, and the
    close then waits on that ended thread. Past ``timeout_s`` the process exits anyway: the
    daemon's work is done, and a daemon that hangs is restarted by nothing.
    """
    import asyncio

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while stray := asyncio.all_tasks() - {asyncio.current_task()}:
        if loop.time() >= deadline:
            import structlog

            structlog.get_logger(__name__).warning(
                "exit_forced", tasks=sorted(task.get_name() for task in stray)
            )
            logging.shutdown()
            os._exit(0)
        for task in stray:
            task.cancel()
        await asyncio.wait(stray, timeout=0.1)


async def _db_upgrade(settings: Settings, _: argparse.Namespace) -> int:
    from triggerer.service.store import upgrade
    from triggerer.service.store.engine import masked_url

    await upgrade(settings.database.url)
    _say(f"database at {masked_url(settings.database.url)} is up to date")
    return 0


async def _db_clean(settings: Settings, arguments: argparse.Namespace) -> int:
    """Delete what is from before ``--before``, as the daemon's retention does (in small
    batches, what is still needed kept); ``--dry-run`` only counts it."""
    from pathlib import Path

    from triggerer.service.daemon import retention

    before = _moment("--before", arguments.before)
    cutoffs = retention.Cutoffs.before(before)
    logs_dir = Path(settings.spark.logs_dir)

    async def work(sessions: async_sessionmaker[AsyncSession]) -> retention.Preview:
        if arguments.dry_run:
            async with sessions() as session:
                return await retention.preview(session, cutoffs, logs_dir)
        counts = await retention.clean(
            sessions, cutoffs, logs_dir, batch_size=settings.retention.batch_size
        )
        async with sessions() as session:
            return retention.Preview(counts, await retention.kept_events(session, before))

    done = await _with_store(settings, work)
    counts = done.counts
    _say(
        f"from before {before.isoformat()}, "
        + ("would delete (dry run: nothing deleted):" if arguments.dry_run else "deleted:")
    )
    _say(f"  {counts['runs']} runs")
    _say(f"  {counts['log_chunks']} log chunks (their logs in the store)")
    _say(f"  {counts['log_folders']} log folders")
    kept = (
        f" ({done.kept_events} more kept: queued for a pipeline, or consumed by a run that has "
        "not ended)"
        if done.kept_events
        else ""
    )
    _say(f"  {counts['events']} events{kept}")
    _say(f"  {counts['dead_letters']} dead letters")
    return 0


def _moment(option: str, text: str) -> datetime:
    """An ISO date (midnight) or date and time, UTC unless it names its offset, not in the
    future; else a one-line error naming it."""
    from datetime import UTC, datetime

    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise CliError(
            f"{option} {text!r} is not an ISO date or date and time, e.g. 2026-01-31 or "
            "2026-01-31T12:00:00+02:00"
        ) from None
    moment = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    if moment > datetime.now(UTC):
        raise CliError(f"{option} {text!r} is in the future: nothing is from before it yet")
    return moment


async def _with_session(settings: Settings, work: Callable[[AsyncSession], Awaitable[_T]]) -> _T:
    """``work`` in one transaction on a store of this version's schema; a store that does not
    answer or is not migrated is a one-line error."""

    async def in_one(sessions: async_sessionmaker[AsyncSession]) -> _T:
        async with sessions.begin() as session:
            return await work(session)

    return await _with_store(settings, in_one)


async def _with_store(
    settings: Settings, work: Callable[[async_sessionmaker[AsyncSession]], Awaitable[_T]]
) -> _T:
    """``work`` with sessions on a store of this version's schema, as :func:`_with_session`."""
    from triggerer.service.store import (
        create_engine,
        current_revision,
        head_revision,
        session_factory,
    )
    from triggerer.service.store.engine import masked_url, sqlite_file
    from triggerer.service.store.failures import STORE_ERRORS, is_outage

    url = masked_url(settings.database.url)
    file = sqlite_file(settings.database.url)
    if file is not None and not file.exists():
        # Opening it would leave an empty file behind, for a command that only reads.
        raise CliError(
            f"no database at {file}: 'triggerer run' creates it (or 'triggerer db upgrade')"
        )
    try:
        revision = await current_revision(settings.database.url)
        if revision != head_revision():
            raise CliError(
                f"the database at {url} is at schema revision {revision}, this version needs "
                f"{head_revision()}: run 'triggerer db upgrade' (the daemon does it at start)"
            )
        engine = create_engine(settings.database.url)
        try:
            return await work(session_factory(engine))
        finally:
            await engine.dispose()
    except STORE_ERRORS as error:
        if not is_outage(error):
            raise
        reason = f"{type(error).__name__}: {error}".splitlines()[0]
        raise StoreUnavailable(f"the store at {url} does not answer ({reason})") from None


async def _check(settings: Settings, _: argparse.Namespace) -> int:
    """Exit 0 when the store answers and a daemon's heartbeat is fresh; else 1, saying why."""
    from datetime import timedelta

    from triggerer.service import queries
    from triggerer.service.store.types import utcnow

    async def work(session: AsyncSession) -> int:
        stale = utcnow() - timedelta(seconds=settings.daemon.dead_after_s)
        latest = await queries.latest_heartbeat(session)
        fresh = latest is not None and latest >= stale
        _say(
            f"healthy: heartbeat fresh, last at {latest}"
            if fresh
            else f"unhealthy: heartbeat stale, last at {latest}"
        )
        return 0 if fresh else 1

    try:
        return await _with_session(settings, work)
    except StoreUnavailable as error:
        _say(f"degraded: {error}")
        return 1


PIPELINE_COLUMNS = ("pipeline_id", "schedule", "progress", "paused", "active", "fileloc", "error")
ASSET_COLUMNS = ("id", "name", "uri", "group")
WATCHER_COLUMNS = (
    "watcher",
    "asset",
    "trigger",
    "state",
    "last_poll_at",
    "last_event_at",
    "restarts",
    "lag",
    "consumer_group",
    "last_error_at",
    "last_error",
)
EVENT_COLUMNS = ("id", "uri", "source", "timestamp", "partition_key", "extra")
RUN_COLUMNS = (
    "run_id",
    "pipeline_id",
    "state",
    "run_type",
    "try_number",
    "events",
    "created_at",
    "end_date",
)
DEAD_LETTER_COLUMNS = ("id", "created_at", "asset", "trigger_id", "dedup_key", "reason", "payload")


async def _pipelines_rows(session: AsyncSession, arguments: argparse.Namespace) -> Sequence[View]:
    """The pipelines, then a row per file of the folder that failed to load (as
    ``GET /importErrors``: no pipeline id; in the table its file is ``path:line``)."""
    from triggerer.service import queries

    pipelines = await queries.pipelines(session, limit=arguments.limit)
    broken = await queries.import_errors(session, limit=arguments.limit)
    if not arguments.json:
        broken = [
            row.model_copy(update={"fileloc": f"{row.fileloc}:{row.line}"}) if row.line else row
            for row in broken
        ]
    return [*pipelines, *broken]


async def _set_paused(settings: Settings, pipeline_id: str, paused: bool) -> int:
    from triggerer.service import actions

    async def work(session: AsyncSession) -> int:
        await actions.set_paused(session, pipeline_id, paused)
        _say(f"pipeline {pipeline_id} {'paused' if paused else 'unpaused'}")
        return 0

    return await _with_session(settings, work)


async def _pause(settings: Settings, arguments: argparse.Namespace) -> int:
    return await _set_paused(settings, arguments.pipeline_id, True)


async def _unpause(settings: Settings, arguments: argparse.Namespace) -> int:
    return await _set_paused(settings, arguments.pipeline_id, False)


async def _trigger(settings: Settings, arguments: argparse.Namespace) -> int:
    if not isinstance(arguments.params, dict):
        raise CliError(f"--params must be a JSON object, got {arguments.params!r}")
    from triggerer.service import actions

    async def work(session: AsyncSession) -> int:
        _say(await actions.trigger_run(session, arguments.pipeline_id, arguments.params))
        return 0

    return await _with_session(settings, work)


async def _assets_rows(session: AsyncSession, arguments: argparse.Namespace) -> Sequence[View]:
    from triggerer.service import queries

    return await queries.assets(session, limit=arguments.limit)


async def _watchers_rows(session: AsyncSession, arguments: argparse.Namespace) -> Sequence[View]:
    """The watchers (as ``GET /watchers``); in the table, an error the watcher is not failing
    of now says it is history: ``recovered from: ...`` once it has polled since, else
    ``earlier: ...``."""
    from triggerer.service import queries

    watchers = await queries.watchers(session, limit=arguments.limit)
    if arguments.json:
        return watchers
    return [
        _error_as_history(row) if row.last_error and not row.failing else row for row in watchers
    ]


def _error_as_history(row: WatcherRow) -> WatcherRow:
    said = "recovered from" if row.recovered else "earlier"
    return row.model_copy(update={"last_error": f"{said}: {row.last_error}"})


async def _events_rows(session: AsyncSession, arguments: argparse.Namespace) -> Sequence[View]:
    from triggerer.service import queries

    return await queries.events(session, uri=arguments.uri, limit=arguments.limit)


async def _dead_letters_rows(
    session: AsyncSession, arguments: argparse.Namespace
) -> Sequence[View]:
    from triggerer.service import queries

    return await queries.dead_letters(session, limit=arguments.limit)


async def _emit(settings: Settings, arguments: argparse.Namespace) -> int:
    if not isinstance(arguments.extra, dict):
        raise CliError(f"--extra must be a JSON object, got {arguments.extra!r}")
    if arguments.api is not None:
        return await _emit_over_api(arguments)
    from triggerer.listeners import listener_manager
    from triggerer.service import actions, queries
    from triggerer.service.events import notify_recorded
    from triggerer.service.store.models import EventSource

    listeners = listener_manager(settings.listeners.plugins)  # a bad plugin fails before writing

    async def work(session: AsyncSession) -> Recorded:
        asset_id = await actions.find_asset(session, asset_id=None, uri=arguments.uri)
        recorded = await actions.emit_event(
            session,
            asset_id,
            arguments.extra,
            source=EventSource.CLI,
            partition_key=arguments.partition_key,
        )
        uri = (await queries.asset(session, asset_id)).uri
        queued = _queued(recorded.queued_pipelines)
        _say(f"event {recorded.events[0].id} on {uri}; queued for {queued}")
        return recorded

    recorded = await _with_session(settings, work)
    await _with_session(settings, lambda session: notify_recorded(listeners, session, recorded))
    return 0


async def _emit_over_api(arguments: argparse.Namespace) -> int:
    """Post the event to the REST API of a (remote) daemon."""
    import httpx

    _quiet_client_logs()
    base = _api_base(arguments.api)
    token = arguments.token or os.environ.get(TOKEN_ENV)
    body = {
        "uri": arguments.uri,
        "extra": arguments.extra,
        "partition_key": arguments.partition_key,
    }
    try:
        async with httpx.AsyncClient(timeout=30) as client:
            response = await client.post(
                f"{base}/api/v1/assets/events",
                json=body,
                headers={"Authorization": f"Bearer {token}"} if token else {},
            )
    except httpx.HTTPError as error:
        raise CliError(
            f"cannot reach the API at {base}: {str(error) or type(error).__name__}"
        ) from None
    if response.status_code != httpx.codes.CREATED:
        raise CliError(
            f"the API at {base} refused the event ({response.status_code}): {_detail(response)}"
        )
    created = _created_event(response, base)
    _say(f"event {created.id} on {created.uri}; queued for {_queued(created.queued_for)}")
    return 0


def _api_base(url: str) -> str:
    """The root of the API at ``url`` (given with or without ``/api/v1``), checked up front:
    httpx would take a port out of range and fail with a traceback when connecting."""
    if not _is_http_url(url):
        raise CliError(
            f"--api must be an http:// or https:// URL with a host and a port from 1 to 65535, "
            f"got {url!r}"
        )
    return url.rstrip("/").removesuffix("/api/v1")


def _is_http_url(url: str) -> bool:
    import httpx

    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL:
        return False
    port_fits = parsed.port is None or 1 <= parsed.port <= 65535
    return parsed.scheme in ("http", "https") and bool(parsed.host) and port_fits


API_BODY_CHARS = 80
"""How much of an unexpected API answer an error message quotes."""


def _created_event(response: httpx.Response, base: str) -> CreatedEvent:
    from pydantic import ValidationError

    from triggerer.service.api.schemas import CreatedEvent

    try:
        return CreatedEvent.model_validate_json(response.content)
    except ValidationError as error:
        problem = error.errors()[0]
        where = ".".join(str(part) for part in problem["loc"]) or "body"
        body = response.text
        if len(body) > API_BODY_CHARS:
            body = body[: API_BODY_CHARS - 1] + "…"
        raise CliError(
            f"the API at {base} answered {response.status_code} with {body!r}, which is not a "
            f"triggerer event ({where}: {problem['msg']})"
        ) from None


def _detail(response: Any) -> str:
    try:
        return str(response.json()["detail"])
    except (ValueError, KeyError, TypeError):
        return response.text.strip().splitlines()[0] if response.text.strip() else "no detail"


def _queued(pipeline_ids: Iterable[str]) -> str:
    return ", ".join(sorted(pipeline_ids)) or "no pipeline"


async def _replay(settings: Settings, arguments: argparse.Namespace) -> int:
    """Queue stored events of an asset again for its consumers (see
    :mod:`triggerer.service.replay`); daemons hear of it as of ``events emit``. It logs
    nothing, so logging is not set up."""
    from triggerer.service import replay

    since = replay.parse_time("--since", arguments.since)
    until = None if arguments.until is None else replay.parse_time("--until", arguments.until)

    async def work(session: AsyncSession) -> replay.ReplayResult:
        return await replay.replay(
            session,
            await replay.find_asset(session, arguments.asset),
            since=since,
            until=until,
            pipeline_id=arguments.pipeline,
            dry_run=arguments.dry_run,
        )

    result = await _with_session(settings, work)
    if arguments.json:
        _say(result.model_dump_json())
    else:
        _say("\n".join(replay.summary(result)))
    return 0


async def _runs_rows(session: AsyncSession, arguments: argparse.Namespace) -> Sequence[View]:
    from triggerer.service import queries

    return await queries.runs(session, pipeline_id=arguments.pipeline, limit=arguments.limit)


async def _runs_logs(settings: Settings, arguments: argparse.Namespace) -> int:
    """The run's log from the store, whichever daemon ran it; an empty one says why on
    stderr (exit 0: the run exists)."""
    from triggerer.service.runs import stored_logs as run_logs

    async def work(session: AsyncSession) -> run_logs.RunLog:
        return await run_logs.read(session, arguments.run_id)

    found = await _with_session(settings, work)
    sys.stdout.write(found.text)
    if found.reason is not None:
        sys.stderr.write(f"run {arguments.run_id} has no log: {found.reason}\n")
    return 0


async def _runs_cancel(settings: Settings, arguments: argparse.Namespace) -> int:
    from triggerer.service import actions

    async def work(session: AsyncSession) -> int:
        state = await actions.cancel_run(session, arguments.run_id)
        stopping = " (the daemon running it stops its process)" if state == "cancelling" else ""
        _say(f"run {arguments.run_id} {state}{stopping}")
        return 0

    return await _with_session(settings, work)


async def _runs_rerun(settings: Settings, arguments: argparse.Namespace) -> int:
    from triggerer.service import actions

    async def work(session: AsyncSession) -> int:
        _say(await actions.rerun(session, arguments.run_id))
        return 0

    return await _with_session(settings, work)


async def _post(_: Settings, arguments: argparse.Namespace) -> int:
    """Send the messages through the named provider's ``send``, to the queue ``address``
    makes of the verb's arguments."""
    from watchers import providers

    uri, shown, options = arguments.address(arguments)
    scheme = uri.partition(":")[0].lower()
    try:
        provider = providers.for_scheme(scheme)
    except ValueError as error:
        raise CliError(str(error)) from None
    if provider is None or provider.name != arguments.provider or provider.send is None:
        raise CliError(
            f"{uri!r} is not a {arguments.provider} URI: see docs/architecture.md "
            "for each provider's URI form"
        )
    _quiet_client_logs()
    try:
        sent = await provider.send(uri, arguments.messages, arguments.connection, **options)
    except (LookupError, ValueError, ConnectionError) as error:
        raise CliError(str(error)) from None
    _say(f"sent {len(sent)} message(s) to {shown}")
    return 0


Address = tuple[str, str, dict[str, Any]]
"""What ``post`` sends to: the queue's URI, the name it prints, the provider's ``send`` options."""


def _uri_address(arguments: argparse.Namespace) -> Address:
    return arguments.uri, arguments.uri, {}


def _kafka_address(arguments: argparse.Namespace) -> Address:
    """``post kafka TOPIC --bootstrap-servers HOST:PORT,...``: a ``kafka://`` URI."""
    servers = arguments.bootstrap_servers
    for server in servers.split(","):
        host, colon, port = server.rpartition(":") if ":" in server else (server, "", "")
        if not host or (colon and not (port.isdigit() and 1 <= int(port) <= 65_535)):
            raise CliError(
                "--bootstrap-servers must be HOST:PORT[,HOST:PORT...] with ports from 1 to "
                f"65535, got {servers!r}"
            )
    return f"kafka://{servers}/{arguments.topic}", arguments.topic, {"key": arguments.key}


def _sqs_address(arguments: argparse.Namespace) -> Address:
    """``post sqs QUEUE``: a queue URL as it is, a name as an ``sqs://`` URI."""
    queue = arguments.queue
    uri = queue if "://" in queue else f"sqs://{queue}"
    options = {"endpoint_url": arguments.endpoint_url, "region_name": arguments.region}
    return uri, queue, options


async def _explain(settings: Settings, arguments: argparse.Namespace) -> int:
    from triggerer.service.explain import explain

    explained = await _with_session(
        settings, lambda session: explain(session, arguments.pipeline_id)
    )
    _say(_explanation_text(explained))
    return 0


def _explanation_text(explained: Explanation) -> str:
    lines = [f"{explained.pipeline_id}: schedule {explained.schedule}"]
    for state in explained.assets:
        what = f"alias {state.name}" if state.alias else state.uri
        queued = (
            f"{state.queued_events} queued event(s) since {state.queued_since}"
            if state.queued_events
            else "no queued event: waiting"
        )
        lines.append(f"  {what}: {queued}")
    lines.append(f"  active runs: {explained.active_runs} of max {explained.max_active_runs}")
    if explained.last_run is not None:
        last = explained.last_run
        lines.append(f"  last run: {last.run_id} ({last.state}, created {last.created_at})")
    lines.extend(f"  {reason}" for reason in explained.reasons)
    return "\n".join(lines)


def _quiet_client_logs() -> None:
    """A failed send is one line naming the address; the clients' own logs of each failed
    connection attempt would only repeat it."""
    for name in ("aiokafka", "botocore", "aiobotocore", "httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


CUT_CHARS = 60
"""How much of a payload's cell the table shows (``--json`` gives all of it)."""


def _table(rows: Rows, cut: Iterable[str] = ()) -> None:
    """``rows`` in aligned columns; nothing is padded after the last one."""
    if not rows:
        _say("(none)")
        return
    columns = list(rows[0])
    cells = [[_cell(row[c], cut=c in cut) for c in columns] for row in rows]
    widths = [max(len(c), *(len(line[i]) for line in cells)) for i, c in enumerate(columns)]
    for line in [[c.upper() for c in columns], *cells]:
        _say("  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip())


def _cell(value: Any, *, cut: bool) -> str:
    """A value as the table shows it: JSON for a list or a mapping, nothing for ``None``, and
    (``cut``) its first :data:`CUT_CHARS` characters, ``…`` the last of them when cut."""
    text = (
        "" if value is None else json.dumps(value) if isinstance(value, dict | list) else str(value)
    )
    return text[: CUT_CHARS - 1] + "…" if cut and len(text) > CUT_CHARS else text


def _say(text: str) -> None:
    sys.stdout.write(text + "\n")
