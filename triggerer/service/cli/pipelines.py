"""``triggerer pipelines``: list them, pause and unpause one, queue a manual run."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from triggerer.service.cli.output import listing, say
from triggerer.service.cli.store import CliError, with_session
from triggerer.service.cli.verbs import verb

if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence

    from sqlalchemy.ext.asyncio import AsyncSession

    from triggerer.service.config import Settings
    from triggerer.service.reads.views import View


def add_verbs(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    pipelines = verbs.add_parser("pipelines", help="pipelines").add_subparsers(metavar="VERB")
    verb(
        pipelines,
        "list",
        listing(_pipelines_rows, PIPELINE_COLUMNS),
        "list pipelines",
        listing=True,
    )
    for name, handler in (("pause", _pause), ("unpause", _unpause)):
        verb(pipelines, name, handler, f"{name} a pipeline").add_argument("pipeline_id")
    trigger = verb(pipelines, "trigger", _trigger, "queue a manual run")
    trigger.add_argument("pipeline_id")
    trigger.add_argument("--params", type=json.loads, default={}, help="JSON object")


PIPELINE_COLUMNS = ("pipeline_id", "schedule", "progress", "paused", "active", "fileloc", "error")


async def _pipelines_rows(session: AsyncSession, arguments: argparse.Namespace) -> Sequence[View]:
    """The pipelines, then a row per file of the folder that failed to load (as
    ``GET /importErrors``: no pipeline id; in the table its file is ``path:line``)."""
    from triggerer.service.reads import queries

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
        say(f"pipeline {pipeline_id} {'paused' if paused else 'unpaused'}")
        return 0

    return await with_session(settings, work)


async def _pause(settings: Settings, arguments: argparse.Namespace) -> int:
    return await _set_paused(settings, arguments.pipeline_id, True)


async def _unpause(settings: Settings, arguments: argparse.Namespace) -> int:
    return await _set_paused(settings, arguments.pipeline_id, False)


async def _trigger(settings: Settings, arguments: argparse.Namespace) -> int:
    if not isinstance(arguments.params, dict):
        raise CliError(f"--params must be a JSON object, got {arguments.params!r}")
    from triggerer.service import actions

    async def work(session: AsyncSession) -> int:
        say(await actions.trigger_run(session, arguments.pipeline_id, arguments.params))
        return 0

    return await with_session(settings, work)
