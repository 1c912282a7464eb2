"""What routes get from the daemon serving them, the bearer-token check that finds the caller,
and the permission each route requires of it."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from triggerer.service.api.group_commit import GroupCommit
from triggerer.service.principals import (
    ANONYMOUS,
    Keyring,
    Permission,
    Principal,
    token_digest,
    token_principal,
)

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
    def keyring(self) -> Keyring:
        """The callers the API knows by their tokens: ``[api] tokens`` (admins) and
        ``[[api.principals]]``."""
        api = self.settings.api
        tokens = [(token_digest(token), token_principal(i)) for i, token in enumerate(api.tokens)]
        return Keyring([*tokens, *((entry.digest, entry.principal()) for entry in api.principals)])

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

_bearer = HTTPBearer(
    auto_error=False, description="a token of [api] tokens or of an [[api.principals]] entry"
)


async def authorized(
    context: Context,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    """The caller: anyone when no tokens are configured, else the bearer of one of them."""
    keyring = context.keyring
    if keyring.open:
        return ANONYMOUS
    principal = keyring.bearer(credentials.credentials) if credentials else None
    if principal is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "missing or invalid bearer token: send 'Authorization: Bearer <token>' with a "
            "token of [api] tokens or of an [[api.principals]] entry",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return principal


Caller = Annotated[Principal, Depends(authorized)]
"""The principal making the request (a route's parameter), after the token check."""


@functools.cache
def requires(permission: Permission) -> Callable[[Principal], Awaitable[Principal]]:
    """The dependency of a route that needs ``permission``: the caller, or a 403 naming it and
    the permission it lacks (:class:`~triggerer.service.errors.Forbidden`)."""

    async def permitted(caller: Caller) -> Principal:
        caller.check(permission)
        return caller

    return permitted


def bearer_of(keyring: Keyring, authorization: str | None) -> Principal | None:
    """The caller whose ``Authorization`` header is ``authorization``, read as
    :func:`authorized` reads it (FastAPI's ``HTTPBearer``); None where it answers 401."""
    if keyring.open:
        return ANONYMOUS
    scheme, credentials = get_authorization_scheme_param(authorization)
    if not (scheme and credentials) or scheme.lower() != "bearer":
        return None
    return keyring.bearer(credentials)
