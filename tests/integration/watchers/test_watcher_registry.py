"""How the daemon's sync turns watchers into trigger instances (SQLite and PostgreSQL).

Assets watching one identical Kafka trigger share its instance and the consumer group of the
first of their watchers; two different triggers on one exclusive source (a Kafka group named
explicitly twice here) leave the second refused, with the reason on its row.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import anyio
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from triggerer.service.loader import LoadedPipelines, load_pipelines
from triggerer.service.scheduling.registry import Registry, sync_definitions
from triggerer.service.store import models, session_factory

HEAD = """
from triggerer import Asset, AssetWatcher
from watchers import KafkaTrigger

def sales(**options):
    return KafkaTrigger(bootstrap_servers="b:9092", topics=["sales"], **options)
"""


async def sync(engine: AsyncEngine, folder: Path, source: str) -> Registry:
    """Sync the definitions of HEAD + ``source``, as the daemon does on (re)load."""
    loaded = await anyio.to_thread.run_sync(load, folder, source)
    async with session_factory(engine).begin() as session:
        return await sync_definitions(session, loaded)


def load(folder: Path, source: str) -> LoadedPipelines:
    folder.mkdir(exist_ok=True)
    (folder / "pipelines.py").write_text(HEAD + textwrap.dedent(source))
    loaded = load_pipelines(folder)
    assert loaded.errors == []
    return loaded


async def test_assets_sharing_a_trigger_get_the_group_of_the_first_watcher(
    migrated_engine: AsyncEngine, tmp_path: Path
) -> None:
    first = await sync(
        migrated_engine,
        tmp_path,
        """
        orders = Asset("orders", watchers=[AssetWatcher("sales", sales())])
        """,
    )
    [(trigger_id, watched)] = first.triggers.items()
    group = watched.trigger.serialize()[1]["group_id"]
    assert group.startswith("triggerer-sales-")

    # "archive" sorts first, but "orders" was registered first: the group stays.
    second = await sync(
        migrated_engine,
        tmp_path,
        """
        orders = Asset("orders", watchers=[AssetWatcher("sales", sales())])
        archive = Asset("archive", watchers=[AssetWatcher("all_sales", sales())])
        mine = Asset("mine", watchers=[AssetWatcher("sales", sales(group_id="mine"))])
        """,
    )
    by_group = {w.trigger.serialize()[1]["group_id"]: w for w in second.triggers.values()}
    assert set(by_group) == {group, "mine"}
    assert by_group[group].trigger_id == trigger_id
    assert len(by_group[group].asset_ids) == 2


async def test_a_second_trigger_on_a_topic_in_one_consumer_group_is_refused(
    migrated_engine: AsyncEngine, tmp_path: Path
) -> None:
    registry = await sync(
        migrated_engine,
        tmp_path,
        """
        orders = Asset("orders", watchers=[AssetWatcher("sales", sales(group_id="g"))])
        refunds = Asset("refunds", watchers=[AssetWatcher("sales", sales(
            group_id="g", filter={"path": "$.value.type", "equals": "refund"}))])
        stock = Asset("stock", watchers=[AssetWatcher("stock", KafkaTrigger(
            bootstrap_servers="b:9092", topics=["stock"], group_id="g"))])
        """,
    )

    # One group may read several topics; two triggers may not split one topic.
    running = sorted(
        registry.assets[i].name for w in registry.triggers.values() for i in w.asset_ids
    )
    assert running == ["orders", "stock"]
    async with session_factory(migrated_engine)() as session:
        rows = (await session.scalars(select(models.Trigger))).all()
    [refused] = [row for row in rows if row.id not in registry.triggers]
    assert refused.state == "failed"
    assert refused.last_error == (
        "watcher 'sales' of asset 'refunds' is refused: it reads Kafka topic 'sales' in consumer "
        "group 'g' at b:9092 like watcher 'sales' of asset 'orders' with different options, and "
        "each would take messages the other needs; give both assets one trigger with equal "
        "options, or read separate sources"
    )
