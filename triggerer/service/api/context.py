"""What routes get from the daemon serving them, and the bearer-token check."""

from __future__ import annotations

import dataclasses
import functools
import hmac
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from triggerer.service.api.group_commit import GroupCommit
from triggerer.service.principals import ANONYMOUS, Principal, token_principal

if TYPE_CHECKING:
    from triggerer.service.config import Settings
    from triggerer.service.events import Recorded
    from triggerer.service.scheduling.registry import Registry


@dataclasses.dataclass(frozen=True)
class ApiContext:
    """The daemon's parts a route may use."""

    settings: Settings
    sessions: async_sessionmaker[AsyncSession]
    instance_id: str
    """This instance, whose heartbeat ``/readyz`` checks."""
    registry: Callable[[], Registry]
    """The pipelines as loaded now (partition mappers live there, not in the store)."""
    events_recorded: Callable[[Recorded], None]
    """Called after committing new events: wakes the scheduler (and listeners, metrics)."""
    wake_scheduler: Callable[[set[str]], None]
    wake_launcher: Callable[[], None]
    run_cancelled: Callable[[], None]
    """Called after committing a running run's cancel: the launcher running it stops it."""

    @functools.cached_property
    def new_events(self) -> GroupCommit:
        """Creates the events POSTed, concurrent ones in one transaction."""
        return GroupCommit(self.sessions, self.registry, self.events_recorded)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncSession]:
        """A session in a transaction, committed when the block ends without an error."""
        async with self.sessions.begin() as session:
            yield session


async def _context(request: Request) -> ApiContext:
    context: ApiContext = request.app.state.context
    return context


Context = Annotated[ApiContext, Depends(_context)]

_bearer = HTTPBearer(auto_error=False, description="a token of [api] tokens")


async def authorized(
    context: Context,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    """The caller: anyone when no tokens are configured, else the bearer of one of them."""
    tokens = context.settings.api.tokens
    if not tokens:
        return ANONYMOUS
    index = _match(tokens, credentials.credentials if credentials else "")
    if index is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "missing or invalid bearer token: send 'Authorization: Bearer <token>' with a "
            "token of [api] tokens",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return token_principal(index)


Caller = Annotated[Principal, Depends(authorized)]
"""The principal making the request (a route's parameter), after the token check."""


def bearer(tokens: tuple[str, ...], authorization: str | None) -> Principal | None:
    """The caller an ``Authorization`` header of ``authorization`` names, read as
    :func:`authorized` reads it (FastAPI's ``HTTPBearer``): anyone when no ``tokens`` are
    configured, else the bearer of one of them; None for a missing or wrong token."""
    if not tokens:
        return ANONYMOUS
    scheme, credentials = get_authorization_scheme_param(authorization)
    if not (scheme and credentials) or scheme.lower() != "bearer":
        return None
    index = _match(tokens, credentials)
    return None if index is None else token_principal(index)


def _match(tokens: tuple[str, ...], credentials: str) -> int | None:
    """The index of the token ``credentials`` is, if one."""
    given = credentials.encode()
    # Every token is compared, each in constant time, so timing tells nothing about them.
    matches = [hmac.compare_digest(given, token.encode()) for token in tokens]
    return matches.index(True) if any(matches) else None
