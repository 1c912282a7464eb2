"""The lineage graph: watchers feed assets, assets and aliases schedule pipelines, pipelines
produce assets (directly or through aliases), aliases resolve to the assets added through them.

Node ids are ``watcher:<asset id>:<name>``, ``asset:<id>``, ``alias:<id>`` and
``pipeline:<pipeline id>``.
"""

from __future__ import annotations

from typing import Any, Literal

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from triggerer.service.reads.explain import condition_of
from triggerer.service.reads.views import View
from triggerer.service.reads.watcher_states import watcher_failing, watcher_recovered
from triggerer.service.store import models
from triggerer.service.store.states import RefRole


class Node(View):
    id: str
    kind: Literal["watcher", "asset", "alias", "pipeline"]
    name: str
    uri: str | None = None
    """Of an asset."""
    state: str | None = None
    """Of a watcher: its trigger's state."""
    failing: bool | None = None
    """Of a watcher: its current state is an error (see ``GET /watchers``)."""
    recovered: bool | None = None
    """Of a watcher: it has run since its last error (see ``GET /watchers``)."""
    schedule: str | None = None
    """Of a pipeline, as text."""
    condition: Any = None
    """Of a pipeline: its asset condition as a tree (see ``/pipelines/{id}/explain``)."""
    paused: bool | None = None
    active: bool | None = None


class Edge(View):
    source: str
    target: str
    kind: Literal["feeds", "schedules", "produces", "resolves"]
    """watcher feeds asset; asset or alias schedules pipeline; pipeline produces asset or
    alias; alias resolves to asset."""


class Lineage(View):
    nodes: list[Node]
    edges: list[Edge]


async def lineage(session: AsyncSession) -> Lineage:
    """The whole graph of the definitions the daemon synced. Columns, not ORM objects, are
    read: with 10,000 pipelines the objects alone cost the request most of a second."""
    asset = models.Asset
    assets = await session.execute(select(asset.id, asset.name, asset.uri).order_by(asset.id))
    nodes = [
        Node(id=f"asset:{asset_id}", kind="asset", name=name, uri=uri)
        for asset_id, name, uri in assets.all()
    ]
    alias = models.AssetAlias
    aliases = await session.execute(select(alias.id, alias.name).order_by(alias.id))
    nodes.extend(
        Node(id=f"alias:{alias_id}", kind="alias", name=name) for alias_id, name in aliases.all()
    )
    edges: list[Edge] = []
    watchers = await session.execute(
        select(models.AssetWatcher.asset_id, models.AssetWatcher.name, models.Trigger)
        .join(models.Trigger, models.Trigger.id == models.AssetWatcher.trigger_id)
        .order_by(models.AssetWatcher.asset_id, models.AssetWatcher.name)
    )
    for asset_id, name, trigger in watchers.all():
        watcher = f"watcher:{asset_id}:{name}"
        nodes.append(
            Node(
                id=watcher,
                kind="watcher",
                name=name,
                state=trigger.state,
                failing=watcher_failing(trigger.state),
                recovered=watcher_recovered(trigger),
            )
        )
        edges.append(Edge(source=watcher, target=f"asset:{asset_id}", kind="feeds"))
    pipeline = models.Pipeline
    pipelines = await session.execute(
        select(
            pipeline.pipeline_id,
            pipeline.schedule_text,
            pipeline.schedule,
            pipeline.paused,
            pipeline.is_active,
        ).order_by(pipeline.pipeline_id)
    )
    nodes.extend(
        Node(
            id=f"pipeline:{pipeline_id}",
            kind="pipeline",
            name=pipeline_id,
            schedule=schedule_text,
            condition=condition_of(schedule.get("schedule")),
            paused=paused,
            active=active,
        )
        for pipeline_id, schedule_text, schedule, paused, active in pipelines.all()
    )
    asset_ref, alias_ref = models.PipelineAssetRef, models.PipelineAliasRef
    for pipeline_column, ref_column, role_column, kind in (
        (asset_ref.pipeline_id, asset_ref.asset_id, asset_ref.role, "asset"),
        (alias_ref.pipeline_id, alias_ref.alias_id, alias_ref.role, "alias"),
    ):
        refs = await session.execute(
            select(pipeline_column, ref_column, role_column)
            .where(role_column.in_((RefRole.SCHEDULE, RefRole.OUTLET)))
            .order_by(pipeline_column, ref_column)
        )
        for pipeline_id, ref_id, role in refs.all():
            node, other = f"pipeline:{pipeline_id}", f"{kind}:{ref_id}"
            if role == RefRole.SCHEDULE:
                edges.append(Edge(source=other, target=node, kind="schedules"))
            else:
                edges.append(Edge(source=node, target=other, kind="produces"))
    members = await session.execute(
        select(models.AssetAliasAsset.alias_id, models.AssetAliasAsset.asset_id).order_by(
            models.AssetAliasAsset.alias_id, models.AssetAliasAsset.asset_id
        )
    )
    for alias_id, asset_id in members.all():
        edges.append(Edge(source=f"alias:{alias_id}", target=f"asset:{asset_id}", kind="resolves"))
    return Lineage(nodes=nodes, edges=edges)
