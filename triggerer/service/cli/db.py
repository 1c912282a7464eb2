"""``triggerer db``: migrate the metadata database, and clean old rows out of it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from triggerer.service.cli.output import say
from triggerer.service.cli.store import CliError, with_store
from triggerer.service.cli.verbs import verb

if TYPE_CHECKING:
    import argparse
    from datetime import datetime

    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

    from triggerer.service.config import Settings


def add_verbs(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    db = verbs.add_parser("db", help="the metadata database").add_subparsers(metavar="VERB")
    verb(db, "upgrade", _db_upgrade, "migrate the database to this version's schema")
    clean = verb(
        db, "clean", _db_clean, "delete runs, events, dead letters and audit rows from before DATE"
    )
    clean.add_argument("--before", required=True, metavar="DATE", help="ISO date or datetime")
    clean.add_argument("--dry-run", action="store_true", help="say what would go; delete nothing")


async def _db_upgrade(settings: Settings, _: argparse.Namespace) -> int:
    from triggerer.service.store import upgrade
    from triggerer.service.store.engine import masked_url

    await upgrade(settings.database.url)
    say(f"database at {masked_url(settings.database.url)} is up to date")
    return 0


async def _db_clean(settings: Settings, arguments: argparse.Namespace) -> int:
    """Delete what is from before ``--before``, as the daemon's retention does (in small
    batches, what is still needed kept), then record it in the audit log; ``--dry-run`` only
    counts it."""
    from pathlib import Path

    from triggerer.service import audit
    from triggerer.service.daemon import retention
    from triggerer.service.principals import cli_principal
    from triggerer.service.store.states import AuditAction

    before = _moment("--before", arguments.before)
    actor = cli_principal()  # before anything is deleted
    cutoffs = retention.Cutoffs.before(before)
    logs_dir = Path(settings.spark.logs_dir)

    async def work(sessions: async_sessionmaker[AsyncSession]) -> retention.Preview:
        if arguments.dry_run:
            async with sessions() as session:
                return await retention.preview(session, cutoffs, logs_dir)
        counts = await retention.clean(
            sessions, cutoffs, logs_dir, batch_size=settings.retention.batch_size
        )
        # Once done: the clean is many transactions, and this row says what they deleted.
        details = {"before": before.isoformat(), "deleted": counts}
        async with sessions.begin() as session:
            await audit.record(session, actor, AuditAction.DB_CLEAN, audit.DATABASE, details)
            return retention.Preview(counts, await retention.kept_events(session, before))

    done = await with_store(settings, work)
    counts = done.counts
    say(
        f"from before {before.isoformat()}, "
        + ("would delete (dry run: nothing deleted):" if arguments.dry_run else "deleted:")
    )
    say(f"  {counts['runs']} runs")
    say(f"  {counts['log_chunks']} log chunks (their logs in the store)")
    say(f"  {counts['log_folders']} log folders")
    kept = (
        f" ({done.kept_events} more kept: queued for a pipeline, or consumed by a run that has "
        "not ended)"
        if done.kept_events
        else ""
    )
    say(f"  {counts['events']} events{kept}")
    say(f"  {counts['dead_letters']} dead letters")
    say(f"  {counts['audit']} audit rows")
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
