"""``triggerer events``: list them and the dead letters, emit one (into the store or through a
daemon's REST API), replay an asset's stored events."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from triggerer.service.cli import api_client
from triggerer.service.cli.output import listing, quiet_client_logs, say
from triggerer.service.cli.store import CliError, with_session
from triggerer.service.cli.verbs import verb

if TYPE_CHECKING:
    import argparse
    from collections.abc import Iterable, Sequence

    import httpx
    from sqlalchemy.ext.asyncio import AsyncSession

    from triggerer.service.api.schemas import CreatedEvent
    from triggerer.service.config import Settings
    from triggerer.service.events import Recorded
    from triggerer.service.reads.views import View

TOKEN_ENV = "TRIGGERER_API_TOKEN"  # noqa: S105 - the variable's name, not a token
"""Where ``events emit --api`` finds the token when ``--token`` is not given."""

EVENT_COLUMNS = ("id", "uri", "source", "timestamp", "partition_key", "extra")
DEAD_LETTER_COLUMNS = ("id", "created_at", "asset", "trigger_id", "dedup_key", "reason", "payload")


def add_verbs(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    events = verbs.add_parser("events", help="asset events").add_subparsers(metavar="VERB")
    verb(
        events,
        "list",
        listing(_events_rows, EVENT_COLUMNS, cut=("extra",)),
        "list recent events",
        listing=True,
    ).add_argument("--uri")
    emit = verb(events, "emit", _emit, "create an event on an asset")
    emit.add_argument("uri")
    emit.add_argument("--extra", type=json.loads, default={}, help="JSON object")
    emit.add_argument("--partition-key")
    emit.add_argument("--api", metavar="URL", help="post to the REST API at URL instead")
    emit.add_argument("--token", help=f"bearer token for --api (default: ${TOKEN_ENV})")
    api_client.add_tls_options(emit)
    verb(
        events,
        "dead-letters",
        listing(_dead_letters_rows, DEAD_LETTER_COLUMNS, cut=("payload",)),
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


async def _events_rows(session: AsyncSession, arguments: argparse.Namespace) -> Sequence[View]:
    from triggerer.service.reads import queries

    return await queries.events(session, uri=arguments.uri, limit=arguments.limit)


async def _dead_letters_rows(
    session: AsyncSession, arguments: argparse.Namespace
) -> Sequence[View]:
    from triggerer.service.reads import queries

    return await queries.dead_letters(session, limit=arguments.limit)


async def _emit(settings: Settings, arguments: argparse.Namespace) -> int:
    if not isinstance(arguments.extra, dict):
        raise CliError(f"--extra must be a JSON object, got {arguments.extra!r}")
    if arguments.api is not None:
        return await _emit_over_api(arguments)
    api_client.refuse_without_api(arguments)
    from triggerer.listeners import listener_manager
    from triggerer.service import actions
    from triggerer.service.events import notify_recorded
    from triggerer.service.reads import queries
    from triggerer.service.store.states import EventSource

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
        say(f"event {recorded.events[0].id} on {uri}; queued for {queued}")
        return recorded

    recorded = await with_session(settings, work)
    await with_session(settings, lambda session: notify_recorded(listeners, session, recorded))
    return 0


async def _emit_over_api(arguments: argparse.Namespace) -> int:
    """Post the event to the REST API of a (remote) daemon."""
    import httpx

    quiet_client_logs()
    base = _api_base(arguments.api)
    verify = api_client.verify(arguments, base)
    token = arguments.token or os.environ.get(TOKEN_ENV)
    body = {
        "uri": arguments.uri,
        "extra": arguments.extra,
        "partition_key": arguments.partition_key,
    }
    try:
        async with httpx.AsyncClient(timeout=30, verify=verify) as client:
            response = await client.post(
                f"{base}/api/v1/assets/events",
                json=body,
                headers={"Authorization": f"Bearer {token}"} if token else {},
            )
    except httpx.HTTPError as error:
        raise api_client.unreachable(error, base, arguments) from None
    if response.status_code != httpx.codes.CREATED:
        raise CliError(
            f"the API at {base} refused the event ({response.status_code}): {_detail(response)}"
        )
    created = _created_event(response, base)
    say(f"event {created.id} on {created.uri}; queued for {_queued(created.queued_for)}")
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

    result = await with_session(settings, work)
    if arguments.json:
        say(result.model_dump_json())
    else:
        say("\n".join(replay.summary(result)))
    return 0
