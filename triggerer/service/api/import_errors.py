"""``/importErrors``: files of the pipelines folder that failed to load."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from triggerer.service.api.context import Context, requires
from triggerer.service.api.responses import PROTECTED
from triggerer.service.api.schemas import Limit, Offset
from triggerer.service.principals import Permission
from triggerer.service.reads import queries
from triggerer.service.reads.views import ImportErrorRow

router = APIRouter(
    tags=["pipelines"], dependencies=[Depends(requires(Permission.READ))], responses=PROTECTED
)


@router.get("/importErrors")
async def list_import_errors(
    context: Context, limit: Limit = 100, offset: Offset = 0
) -> list[ImportErrorRow]:
    """Files of the pipelines folder that failed to load at the daemon's last load, by path:
    the line where each failed, the error and the traceback's last frames. A file that loads
    again is no longer listed."""
    async with context.transaction() as session:
        return await queries.import_errors(session, limit=limit, offset=offset)
