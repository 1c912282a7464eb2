"""``triggerer watchers list``: state, lag, group and errors of each watcher."""

from __future__ import annotations

from typing import TYPE_CHECKING

from triggerer.service.cli.output import listing
from triggerer.service.cli.verbs import verb

if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence

    from sqlalchemy.ext.asyncio import AsyncSession

    from triggerer.service.reads.views import View, WatcherRow


def add_verbs(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    watchers = verbs.add_parser("watchers", help="watchers").add_subparsers(metavar="VERB")
    verb(
        watchers,
        "list",
        listing(_watchers_rows, WATCHER_COLUMNS),
        "state, lag, group, errors",
        listing=True,
    )


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
    "held_by",
    "last_error_at",
    "last_error",
)


async def _watchers_rows(session: AsyncSession, arguments: argparse.Namespace) -> Sequence[View]:
    """The watchers (as ``GET /watchers``); in the table, an error the watcher is not failing
    of now says it is history: ``recovered from: ...`` once it has polled since, else
    ``earlier: ...``."""
    from triggerer.service.reads import watcher_states

    watchers = await watcher_states.watchers(session, limit=arguments.limit)
    if arguments.json:
        return watchers
    return [
        _error_as_history(row) if row.last_error and not row.failing else row for row in watchers
    ]


def _error_as_history(row: WatcherRow) -> WatcherRow:
    said = "recovered from" if row.recovered else "earlier"
    return row.model_copy(update={"last_error": f"{said}: {row.last_error}"})
