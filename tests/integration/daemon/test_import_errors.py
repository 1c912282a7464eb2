"""Files of the pipelines folder that fail to load, as the sync stores them (SQLite and
PostgreSQL): a row per file with its line and traceback, kept since it first failed so, gone
once the file loads again."""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
from sqlalchemy import func, select

from triggerer.service.loader import LoadError, load_pipelines
from triggerer.service.reads import queries
from triggerer.service.scheduling.registry import sync_definitions, sync_import_errors
from triggerer.service.store import models, session_factory

if TYPE_CHECKING:
    from pathlib import Path

    from sqlalchemy.ext.asyncio import AsyncEngine

    from triggerer.service.reads.views import ImportErrorRow

GOOD = """\
from triggerer import Asset, pipeline

@pipeline(schedule=Asset("orders"))
def count_orders(spark, context):
    pass
"""


async def sync_folder(engine: AsyncEngine, folder: Path) -> None:
    loaded = await anyio.to_thread.run_sync(load_pipelines, folder)
    async with session_factory(engine).begin() as session:
        await sync_definitions(session, loaded)


async def sync_errors(engine: AsyncEngine, *errors: LoadError) -> list[ImportErrorRow]:
    async with session_factory(engine).begin() as session:
        await sync_import_errors(session, list(errors))
    return await listed(engine)


async def listed(engine: AsyncEngine) -> list[ImportErrorRow]:
    async with session_factory(engine)() as session:
        return await queries.import_errors(session)


async def test_a_broken_file_is_listed_until_it_loads_again(
    migrated_engine: AsyncEngine, tmp_path: Path
) -> None:
    (tmp_path / "good.py").write_text(GOOD)
    broken = tmp_path / "broken.py"
    broken.write_text("x = 1\nspark_conf.get('x')\n")
    await sync_folder(migrated_engine, tmp_path)

    (row,) = await listed(migrated_engine)
    assert (row.fileloc, row.line, row.error) == (
        str(broken),
        2,
        "NameError: name 'spark_conf' is not defined",
    )
    assert row.traceback is not None
    assert row.traceback.startswith("Traceback (most recent call last):\n")
    assert f'File "{broken}", line 2, in <module>' in row.traceback
    async with session_factory(migrated_engine)() as session:
        assert [p.pipeline_id for p in await queries.pipelines(session)] == ["count_orders"]

    broken.write_text(GOOD.replace("count_orders", "fixed"))
    await sync_folder(migrated_engine, tmp_path)
    assert await listed(migrated_engine) == []


async def test_an_error_keeps_its_time_until_it_changes(migrated_engine: AsyncEngine) -> None:
    (first,) = await sync_errors(migrated_engine, LoadError("/p/a.py", 3, "NameError: x"))
    (again,) = await sync_errors(migrated_engine, LoadError("/p/a.py", 3, "NameError: x"))
    assert again.error_at == first.error_at
    (moved,) = await sync_errors(migrated_engine, LoadError("/p/a.py", 4, "NameError: x"))
    assert moved.error_at > first.error_at
    (other,) = await sync_errors(migrated_engine, LoadError("/p/a.py", 4, "KeyError: 'y'"))
    assert other.error_at > moved.error_at


async def test_several_errors_of_one_file_are_one_row(migrated_engine: AsyncEngine) -> None:
    rows = await sync_errors(
        migrated_engine,
        LoadError("/p/b.py", None, "pipeline id 'x' is already defined in /p/a.py"),
        LoadError("/p/b.py", None, "pipeline id 'y' is already defined in /p/a.py"),
        LoadError("/p/missing", None, "cannot list the folder: [Errno 13] Permission denied"),
    )
    assert [(row.fileloc, row.line, row.error) for row in rows] == [
        (
            "/p/b.py",
            None,
            "pipeline id 'x' is already defined in /p/a.py; "
            "pipeline id 'y' is already defined in /p/a.py",
        ),
        ("/p/missing", None, "cannot list the folder: [Errno 13] Permission denied"),
    ]


async def test_text_no_store_holds_is_stored_escaped(migrated_engine: AsyncEngine) -> None:
    """A message (or a file name) may hold a NUL character or a lone surrogate, which
    PostgreSQL refuses: a refusal would end the daemon at every load."""
    path = "/p/report-\udce9.py"
    (row,) = await sync_errors(
        migrated_engine,
        LoadError(path, 1, "ValueError: bad \x00 byte", "Traceback ...\nValueError: \x00"),
    )
    assert (row.fileloc, row.error, row.traceback) == (
        "/p/report-\\udce9.py",
        "ValueError: bad \\x00 byte",
        "Traceback ...\nValueError: \\x00",
    )
    async with session_factory(migrated_engine)() as session:
        count = await session.scalar(select(func.count()).select_from(models.PipelineImportError))
    assert count == 1
