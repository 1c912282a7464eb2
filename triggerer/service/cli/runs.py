"""``triggerer runs``: list them, print a run's log, cancel one, run a finished one again."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from triggerer.service.cli.output import listing, say
from triggerer.service.cli.store import with_session
from triggerer.service.cli.verbs import verb

if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence

    from sqlalchemy.ext.asyncio import AsyncSession

    from triggerer.service.config import Settings
    from triggerer.service.reads.views import View


def add_verbs(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    runs = verbs.add_parser("runs", help="runs").add_subparsers(metavar="VERB")
    verb(
        runs, "list", listing(_runs_rows, RUN_COLUMNS), "list recent runs", listing=True
    ).add_argument("--pipeline")
    verb(runs, "logs", _runs_logs, "print a run's log", reads=True).add_argument("run_id")
    verb(runs, "cancel", _runs_cancel, "cancel a queued or running run").add_argument("run_id")
    verb(runs, "rerun", _runs_rerun, "run a finished run again, on the same events").add_argument(
        "run_id"
    )


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


async def _runs_rows(session: AsyncSession, arguments: argparse.Namespace) -> Sequence[View]:
    from triggerer.service.reads import queries

    return await queries.runs(session, pipeline_id=arguments.pipeline, limit=arguments.limit)


async def _runs_logs(settings: Settings, arguments: argparse.Namespace) -> int:
    """The run's log from the store, whichever daemon ran it; an empty one says why on
    stderr (exit 0: the run exists)."""
    from triggerer.service.runs import stored_logs as run_logs

    async def work(session: AsyncSession) -> run_logs.RunLog:
        return await run_logs.read(session, arguments.run_id)

    found = await with_session(settings, work)
    sys.stdout.write(found.text)
    if found.reason is not None:
        sys.stderr.write(f"run {arguments.run_id} has no log: {found.reason}\n")
    return 0


async def _runs_cancel(settings: Settings, arguments: argparse.Namespace) -> int:
    from triggerer.service import actions
    from triggerer.service.principals import cli_principal

    async def work(session: AsyncSession) -> int:
        state = await actions.cancel_run(session, arguments.run_id, actor=cli_principal())
        stopping = " (the daemon running it stops its process)" if state == "cancelling" else ""
        say(f"run {arguments.run_id} {state}{stopping}")
        return 0

    return await with_session(settings, work)


async def _runs_rerun(settings: Settings, arguments: argparse.Namespace) -> int:
    from triggerer.service import actions
    from triggerer.service.principals import cli_principal

    async def work(session: AsyncSession) -> int:
        say(await actions.rerun(session, arguments.run_id, actor=cli_principal()))
        return 0

    return await with_session(settings, work)
