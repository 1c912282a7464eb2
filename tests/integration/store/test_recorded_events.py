"""What the store reports after a commit, for listeners: each recorded event with what it stored
(without reading it back), and the assets and aliases a definitions sync created or changed."""

from __future__ import annotations

import textwrap
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from triggerer import Asset, AssetAlias
from triggerer.service.events import NewEvent, asset_events, origins, record_events
from triggerer.service.loader import load_pipelines
from triggerer.service.scheduling.registry import DefinitionChanges, sync_definitions
from triggerer.service.store import models, session_factory

PIPELINES = """
    from triggerer import Asset, AssetAlias, AssetWatcher, pipeline
    from watchers import FileTrigger

    orders = Asset("orders", extra={{"owner": {owner!r}}}, watchers=[
        AssetWatcher("inbox", FileTrigger({inbox!r}))])
    stock = Asset("stock")
    made = AssetAlias("made")

    @pipeline(schedule=orders | stock, outlets=[made])
    def report(spark, context): ...
"""


def _write(folder: Path, inbox: str, owner: str = "sales") -> Path:
    folder.mkdir(exist_ok=True)
    (folder / "pipelines.py").write_text(
        textwrap.dedent(PIPELINES.format(owner=owner, inbox=inbox))
    )
    return folder


async def test_recorded_events_carry_what_was_stored_with_duplicates_skipped(
    migrated_engine: AsyncEngine,
) -> None:
    sessions = session_factory(migrated_engine)
    async with sessions.begin() as session:
        ids = []
        for name in ("a", "b"):
            row = models.Asset(name=name, uri=name, group="asset", extra={})
            session.add(row)
            await session.flush()
            ids.append(row.id)
    a, b = ids

    def event(asset_id: int, n: int, key: str | None) -> NewEvent:
        return NewEvent(asset_id=asset_id, extra={"n": n}, source="cli", dedup_key=key)

    async with sessions.begin() as session:
        await record_events(session, [event(a, 0, "k0")])
    batch = [
        event(a, 1, "k0"),  # stored before: a duplicate
        event(b, 2, "k0"),  # the same key on another asset is another event
        event(a, 3, None),
        event(a, 4, "k4"),
        event(a, 5, "k4"),  # the same key twice in one batch: the first is stored
        event(a, 6, None),
        event(b, 7, "k7"),
    ]
    async with sessions.begin() as session:
        recorded = await record_events(session, batch)

    assert recorded.duplicates == 2
    assert [e.extra["n"] for e in recorded.events] == [2, 3, 4, 6, 7]
    async with sessions() as session:
        stored = {
            row.id: row
            for row in (
                await session.scalars(
                    select(models.AssetEvent).where(
                        models.AssetEvent.id.in_([e.id for e in recorded.events])
                    )
                )
            ).all()
        }
    for reported in recorded.events:
        row = stored[reported.id]
        assert (reported.asset_id, reported.dedup_key, reported.extra, reported.source) == (
            row.asset_id,
            row.dedup_key,
            row.extra,
            row.source,
        )
        assert reported.timestamp == row.timestamp

    async with sessions() as session:
        known = await origins(session, [recorded], {a: Asset("a")})
    assert [(e.asset.name, e.extra["n"]) for e in asset_events(recorded, known)] == [
        ("b", 2),
        ("a", 3),
        ("a", 4),
        ("a", 6),
        ("b", 7),
    ]


async def test_sync_reports_assets_and_aliases_created_then_changed(
    migrated_engine: AsyncEngine, tmp_path: Path
) -> None:
    sessions = session_factory(migrated_engine)
    folder = _write(tmp_path / "pipelines", str(tmp_path / "inbox"))

    async def sync() -> DefinitionChanges:
        changes = DefinitionChanges()
        async with sessions.begin() as session:
            await sync_definitions(session, load_pipelines(folder), changes)
        return changes

    first = await sync()
    assert sorted(a.name for a in first.created_assets) == ["orders", "stock"]
    assert first.created_aliases == [AssetAlias("made")]
    assert first.changed_assets == []

    assert not await sync()  # nothing changed: nothing to report

    _write(folder, str(tmp_path / "inbox"), owner="finance")
    extra_changed = await sync()
    assert (extra_changed.created_assets, extra_changed.created_aliases) == ([], [])
    assert [(a.name, a.extra) for a in extra_changed.changed_assets] == [
        ("orders", {"owner": "finance"})
    ]

    _write(folder, str(tmp_path / "other-inbox"), owner="finance")
    watcher_changed = await sync()
    assert [a.name for a in watcher_changed.changed_assets] == ["orders"]
