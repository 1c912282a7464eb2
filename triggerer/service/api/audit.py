"""``/audit``: the audit log, who changed what, for the roles that may read it."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from triggerer.service import audit
from triggerer.service.api.context import Context, requires
from triggerer.service.api.responses import FORBIDDEN, PROTECTED
from triggerer.service.api.schemas import NO_NUL, Limit, Offset, Since
from triggerer.service.principals import Permission
from triggerer.service.store.models import ID_LENGTH, NAME_LENGTH
from triggerer.service.store.states import AuditAction

router = APIRouter(
    prefix="/audit",
    tags=["audit"],
    dependencies=[Depends(requires(Permission.AUDIT))],
    responses={**PROTECTED, **FORBIDDEN},
)


@router.get("")
async def list_audit(
    context: Context,
    actor: Annotated[
        str | None, Query(max_length=ID_LENGTH, pattern=NO_NUL, description="the principal")
    ] = None,
    action: AuditAction | None = None,
    target: Annotated[
        str | None,
        Query(
            max_length=NAME_LENGTH + 16,
            pattern=NO_NUL,
            description="pipeline:<id>, run:<run_id>, asset:<uri> or database",
        ),
    ] = None,
    pipeline_id: Annotated[
        str | None,
        Query(
            max_length=ID_LENGTH,
            pattern=NO_NUL,
            description="a pipeline's changes and those of its runs (cancel, rerun, replay)",
        ),
    ] = None,
    since: Since = None,
    limit: Limit = 100,
    offset: Offset = 0,
) -> list[audit.AuditRow]:
    """The changes made through the API and the CLI, newest first: when, by which principal
    (``actor``), what (``action``), on what (``target``) and the request's ``details``;
    ``pipeline_id`` gives a pipeline's changes with those of its runs. A
    change that failed is not listed: it changed nothing. Operators and admins only."""
    async with context.transaction() as session:
        return await audit.entries(
            session,
            actor=actor,
            action=action,
            target=target,
            pipeline_id=pipeline_id,
            since=since,
            limit=limit,
            offset=offset,
        )
