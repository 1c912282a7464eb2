"""The store as a verb opens it: one of this version's schema, or a one-line error; and the
errors a verb ends with."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

    from triggerer.service.config import Settings

_T = TypeVar("_T")


class CliError(Exception):
    """A user error: printed to stderr, exit code 1."""


class StoreUnavailable(CliError):
    """The metadata database does not answer."""


async def with_session(settings: Settings, work: Callable[[AsyncSession], Awaitable[_T]]) -> _T:
    """``work`` in one transaction on a store of this version's schema; a store that does not
    answer or is not migrated is a one-line error."""

    async def in_one(sessions: async_sessionmaker[AsyncSession]) -> _T:
        async with sessions.begin() as session:
            return await work(session)

    return await with_store(settings, in_one)


async def with_store(
    settings: Settings, work: Callable[[async_sessionmaker[AsyncSession]], Awaitable[_T]]
) -> _T:
    """``work`` with sessions on a store of this version's schema, as :func:`with_session`."""
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
