"""Request bodies, error and status bodies, and the parameters routes share.

Rows the API returns are the views of :mod:`triggerer.service.reads.queries` (and
:mod:`triggerer.service.reads.explain`, :mod:`triggerer.service.reads.lineage`), the same the CLI
prints.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

from fastapi import Path, Query
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from triggerer.service.reads.views import EventRow
from triggerer.service.store.models import ID_LENGTH, NAME_LENGTH

INT4_MAX = 2**31 - 1
"""Largest id of an asset (a 32-bit key on PostgreSQL)."""
INT8_MAX = 2**63 - 1
"""Largest id of an event (a 64-bit key)."""
NO_NUL = r"^[^\x00]*$"
"""Text the store can compare: PostgreSQL refuses NUL characters in any text."""
PIPELINE_ID = r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,249}$"
"""What :class:`triggerer.Pipeline` accepts as an id."""


class Body(BaseModel):
    """A request body: an unknown field is refused (422), never ignored."""

    model_config = ConfigDict(extra="forbid")


class Problem(BaseModel):
    """What every error answers: ``detail`` names the value at fault."""

    detail: str


class NewAssetEvent(Body):
    """An event to create, on the asset named by ``asset_id`` or ``uri`` (one of them)."""

    asset_id: int | None = Field(default=None, ge=1, le=INT4_MAX)
    uri: str | None = Field(default=None, min_length=1, max_length=NAME_LENGTH, pattern=NO_NUL)
    extra: dict[str, Any] = {}
    partition_key: str | None = Field(default=None, max_length=ID_LENGTH)

    @model_validator(mode="after")
    def _one_asset(self) -> NewAssetEvent:
        if (self.asset_id is None) == (self.uri is None):
            raise ValueError("name the asset by asset_id or by uri, not both and not neither")
        return self


class CreatedEvent(EventRow):
    queued_for: list[str]
    """The pipelines it was queued for."""


class PipelinePatch(Body):
    paused: bool


class NewRun(Body):
    params: dict[str, Any] = {}


class ReplayRequest(Body):
    """A replay of the asset's events stored from ``since`` (included) to ``until``
    (excluded; default: now), for ``pipeline_id`` or every consumer not paused."""

    since: UtcTime
    until: UtcTime | None = None
    pipeline_id: str | None = Field(default=None, pattern=PIPELINE_ID)
    dry_run: bool = False


class Deleted(BaseModel):
    deleted: int
    """How many queued events were removed."""


class Health(BaseModel):
    status: str
    heartbeat_at: dt.datetime | None = None
    token_required: bool | None = None
    """On ``/healthz``: whether the other routes need a bearer token (``[api] tokens``)."""


def _as_utc(value: dt.datetime) -> dt.datetime:
    """A time without an offset is UTC."""
    if value.utcoffset() is None:
        return value.replace(tzinfo=dt.UTC)
    try:
        return value.astimezone(dt.UTC)
    except OverflowError:
        raise ValueError(f"{value.isoformat()} is out of range in UTC") from None


UtcTime = Annotated[dt.datetime, AfterValidator(_as_utc)]
Limit = Annotated[int, Query(ge=1, le=1000, description="most rows to return")]
Offset = Annotated[int, Query(ge=0, le=INT4_MAX, description="rows to skip")]
Since = Annotated[
    UtcTime | None, Query(description="only rows at or after this time (ISO 8601; UTC if naive)")
]
NamePrefix = Annotated[
    str | None, Query(max_length=NAME_LENGTH, pattern=NO_NUL, description="names starting so")
]
AssetId = Annotated[int, Path(ge=1, le=INT4_MAX)]
EventId = Annotated[int, Path(ge=1, le=INT8_MAX)]
PipelineId = Annotated[str, Path(pattern=PIPELINE_ID)]
RunId = Annotated[str, Path(min_length=1, max_length=ID_LENGTH, pattern=NO_NUL)]
