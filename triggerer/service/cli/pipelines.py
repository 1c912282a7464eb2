"""``triggerer pipelines``: list them, pause and unpause one, queue a manual run, try a schedule
on events given in a file, check pipeline files before they are deployed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from triggerer.service.cli import pipeline_test
from triggerer.service.cli.output import listing, loading, say, table
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
    simulate = verb(
        pipelines,
        "simulate",
        _simulate,
        "the runs a pipeline's schedule starts for the events of a JSON-lines file",
        reads=True,
    )
    simulate.add_argument("pipeline_id")
    simulate.add_argument(
        "file", help='one event per line: {"asset": NAME_OR_URI, "at": ISO_TIME, "extra": {...}}'
    )
    simulate.add_argument("--json", action="store_true", help="the runs as one JSON array")
    check = verb(
        pipelines,
        "check",
        _check,
        "load pipeline files as the daemon would (no daemon, store or Spark): exit 1 on an error",
        reads=True,
    )
    check.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        type=Path,
        help="pipeline files or folders (default: the configured pipelines folder)",
    )
    check.add_argument("--json", action="store_true", help="pipelines and errors as JSON")
    pipeline_test.add_verb(pipelines)


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
    from triggerer.service.principals import cli_principal

    async def work(session: AsyncSession) -> int:
        await actions.set_paused(session, pipeline_id, paused, actor=cli_principal())
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
    from triggerer.service.principals import cli_principal

    async def work(session: AsyncSession) -> int:
        run_id = await actions.trigger_run(
            session, arguments.pipeline_id, arguments.params, actor=cli_principal()
        )
        say(run_id)
        return 0

    return await with_session(settings, work)


async def _simulate(settings: Settings, arguments: argparse.Namespace) -> int:
    """Load the pipelines folder (no daemon, no store), feed the file's events through the
    pipeline's schedule with the scheduler's picking, and print the runs it starts."""
    import anyio

    from triggerer.service.loader import load_pipelines
    from triggerer.service.scheduling.simulation import (
        BadSimulation,
        SimulatedEvent,
        simulate,
    )

    try:
        lines = (await anyio.Path(arguments.file).read_text(encoding="utf-8")).splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise CliError(f"cannot read {arguments.file}: {error}") from None
    events = []
    line_of = []  # each event's line, 0-based: what the output numbers
    for number, line in enumerate(lines):
        if not line.strip():
            continue
        line_of.append(number)
        where = f"{arguments.file}:{number + 1}"
        try:
            value = json.loads(line)
        except json.JSONDecodeError as error:
            raise CliError(f"{where}: not JSON: {error}") from None
        try:
            events.append(SimulatedEvent.of_json(value, where))
        except BadSimulation as error:
            raise CliError(str(error)) from None
    loaded = await loading(lambda: load_pipelines(settings.pipelines.dir))
    pipeline = loaded.pipelines.get(arguments.pipeline_id)
    if pipeline is None:
        failed = "".join(f"; {error.path} failed to load" for error in loaded.errors)
        raise CliError(f"no pipeline {arguments.pipeline_id!r} in {settings.pipelines.dir}{failed}")
    try:
        result = simulate(pipeline, events)
    except BadSimulation as error:
        raise CliError(str(error)) from None

    def lines_of(numbers: list[int]) -> list[int]:
        return [line_of[number] for number in numbers]

    if arguments.json:
        runs = [{"at": run.at.isoformat(), "events": lines_of(run.events)} for run in result.runs]
        say(json.dumps(runs))
        return 0
    for run in result.runs:
        key = f" (partition {run.partition_key})" if run.partition_key is not None else ""
        say(f"{run.at.isoformat()}  run of lines {_numbers(lines_of(run.events))}{key}")
    say(
        f"{len(result.runs)} run(s); expired: {_numbers(lines_of(result.expired))}; "
        f"not in the schedule: {_numbers(lines_of(result.unused))}; "
        f"still queued: {_numbers(lines_of(result.waiting))} (lines counted from 0)"
    )
    return 0


async def _check(settings: Settings, arguments: argparse.Namespace) -> int:
    """Load the files as the daemon loads its folder, with the same checks, and print what
    they define and every error, with its file and line."""
    from triggerer.service.loader import load_paths

    folder = settings.pipelines.dir
    loaded = await loading(lambda: load_paths(arguments.paths or [folder], folder))
    pipelines = [
        {
            "pipeline_id": pipeline.pipeline_id,
            "file": pipeline.fileloc,
            "schedule": str(pipeline.schedule) if pipeline.schedule is not None else "manual",
        }
        for pipeline in loaded.pipelines.values()
    ]
    errors = [
        {"file": error.path, "line": error.line, "message": error.message}
        for error in loaded.errors
    ]
    if arguments.json:
        say(json.dumps({"pipelines": pipelines, "errors": errors}))
    else:
        if pipelines:
            table(pipelines)
        for error in loaded.errors:
            say(f"error: {error}")
        say(f"{len(pipelines)} pipeline(s), {len(errors)} error(s)")
    return 1 if errors else 0


def _numbers(numbers: list[int]) -> str:
    return ", ".join(map(str, numbers)) or "none"
