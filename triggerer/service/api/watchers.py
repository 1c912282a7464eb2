"""``/watchers`` and ``/lineage``: what feeds the assets, and the graph of it all."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from triggerer.service.api.context import Context, requires
from triggerer.service.api.responses import PROTECTED
from triggerer.service.api.schemas import Limit, Offset
from triggerer.service.principals import Permission
from triggerer.service.reads import watcher_states
from triggerer.service.reads.lineage import Lineage, lineage
from triggerer.service.reads.views import WatcherRow

router = APIRouter(
    tags=["watchers"], dependencies=[Depends(requires(Permission.READ))], responses=PROTECTED
)


@router.get("/watchers")
async def list_watchers(
    context: Context, limit: Limit = 100, offset: Offset = 0
) -> list[WatcherRow]:
    """Each watcher: state, last poll, last error, restarts, lag, consumer group."""
    async with context.transaction() as session:
        return await watcher_states.watchers(session, limit=limit, offset=offset)


@router.get("/lineage")
async def get_lineage(context: Context) -> Lineage:
    """Nodes (watchers, assets, aliases, pipelines with their condition trees) and edges."""
    async with context.transaction() as session:
        return await lineage(session)
