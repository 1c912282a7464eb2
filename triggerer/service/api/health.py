"""Health and metrics: ``/healthz`` (open), ``/readyz`` and ``/metrics`` (behind the token)."""

from __future__ import annotations

from datetime import timedelta

from fastapi import APIRouter, Depends, HTTPException, Response, status
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from triggerer.service.api.context import Context, requires
from triggerer.service.api.responses import UNAUTHORIZED, UNAVAILABLE, as_json
from triggerer.service.api.schemas import Health
from triggerer.service.principals import Permission
from triggerer.service.reads import queries
from triggerer.service.store.types import utcnow

open_router = APIRouter(tags=["health"])
router = APIRouter(
    tags=["health"], dependencies=[Depends(requires(Permission.READ))], responses=UNAUTHORIZED
)


@open_router.get("/healthz")
async def healthz(context: Context) -> Health:
    """Liveness: the daemon's event loop answers. Needs no token; says whether the other
    routes do (the web UI asks for one only then)."""
    return Health(status="ok", token_required=not context.settings.api.is_open)


@router.get("/readyz", responses=UNAVAILABLE)
async def readyz(context: Context) -> Health:
    """Readiness: the store answers and this instance's heartbeat is fresh (503 otherwise)."""
    async with context.transaction() as session:
        beat = await queries.latest_heartbeat(session, context.instance_id)
    stale = utcnow() - timedelta(seconds=context.settings.daemon.dead_after_s)
    if beat is None or beat < stale:
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            f"this instance's heartbeat is stale: last at {beat}",
        )
    return Health(status="ready", heartbeat_at=beat)


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        **as_json(UNAUTHORIZED),
        200: {"content": {"text/plain": {"schema": {"type": "string"}}}},
    },
)
async def metrics() -> Response:
    """Prometheus metrics, names prefixed ``triggerer_``."""
    return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)
