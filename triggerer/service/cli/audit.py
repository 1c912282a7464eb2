"""``triggerer audit list``: who changed what, through the REST API or the CLI."""

from __future__ import annotations

from typing import TYPE_CHECKING

from triggerer.service.cli.output import listing
from triggerer.service.cli.store import CliError
from triggerer.service.cli.verbs import time_arg, verb

if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence

    from sqlalchemy.ext.asyncio import AsyncSession

    from triggerer.service.reads.views import View

AUDIT_COLUMNS = ("id", "time", "actor", "action", "target", "details")


def add_verbs(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    audit = verbs.add_parser("audit", help="the audit log: who changed what").add_subparsers(
        metavar="VERB"
    )
    listed = verb(
        audit,
        "list",
        listing(_audit_rows, AUDIT_COLUMNS, cut=("details",)),
        "the changes made through the API and the CLI, newest first",
        listing=True,
    )
    listed.add_argument("--actor", metavar="PRINCIPAL", help="e.g. api-token-1 or cli:alice")
    listed.add_argument("--action", help="emit, pause, unpause, trigger, cancel, rerun, ...")
    listed.add_argument("--target", help="pipeline:ID, run:RUN_ID, asset:URI or database")
    listed.add_argument(
        "--pipeline",
        metavar="PIPELINE_ID",
        help="a pipeline's changes and those of its runs (cancel, rerun, replay)",
    )
    listed.add_argument(
        "--since", type=time_arg, metavar="TIME", help="ISO date or time, UTC unless it says"
    )


async def _audit_rows(session: AsyncSession, arguments: argparse.Namespace) -> Sequence[View]:
    from triggerer.service import audit
    from triggerer.service.store.states import AuditAction

    action = None
    if arguments.action is not None:
        try:
            action = AuditAction(arguments.action)
        except ValueError:
            allowed = ", ".join(AuditAction)
            raise CliError(f"--action {arguments.action!r} is not one of {allowed}") from None
    return await audit.entries(
        session,
        actor=arguments.actor,
        action=action,
        target=arguments.target,
        pipeline_id=arguments.pipeline,
        since=arguments.since,
        limit=arguments.limit,
    )
