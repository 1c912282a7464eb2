"""``/whoami``: the caller's principal and what its role may do, for the UI and for scripts."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from pydantic import BaseModel

from triggerer.service.api.context import Caller, requires
from triggerer.service.api.responses import UNAUTHORIZED
from triggerer.service.principals import Permission, Role

router = APIRouter(
    tags=["principals"], dependencies=[Depends(requires(Permission.READ))], responses=UNAUTHORIZED
)


class Whoami(BaseModel):
    name: str
    """The principal: an ``[[api.principals]]`` entry's name, ``api-token-N`` for the N-th of
    ``[api] tokens``, ``anonymous`` on an open API."""
    role: Role
    permissions: list[Permission]
    """What its role holds, in the order of :class:`Permission`."""
    assets: list[str] | None
    """An emitter's globs: the assets (by name or URI) it may emit to; None for other roles,
    whose ``emit``, if they hold it, is on every asset."""


@router.get("/whoami")
async def whoami(caller: Caller) -> Whoami:
    """Who the bearer of this request's token is, and what its role may do."""
    return Whoami(
        name=caller.name,
        role=caller.role,
        permissions=[permission for permission in Permission if caller.may(permission)],
        assets=list(caller.assets) if caller.role == Role.EMITTER else None,
    )
