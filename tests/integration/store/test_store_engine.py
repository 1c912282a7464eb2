"""Engine creation: driver selection and SQLite connection settings."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text

from triggerer.service.store import async_url, create_engine
from triggerer.service.store import engine as engine_module
from triggerer.service.store.engine import deployment_id
from triggerer.service.store.keys import trigger_key


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("sqlite:///data/t.db", "sqlite+aiosqlite:///data/t.db"),
        ("sqlite+aiosqlite:////abs/t.db", "sqlite+aiosqlite:////abs/t.db"),
        ("postgresql://u@db:5432/t", "postgresql+asyncpg://u@db:5432/t"),
        ("postgres://u@db/t", "postgresql+asyncpg://u@db/t"),
        ("postgresql+asyncpg://u@db/t", "postgresql+asyncpg://u@db/t"),
        ("postgresql+psycopg://u@db/t", "postgresql+psycopg://u@db/t"),
    ],
)
def test_async_url_picks_the_async_driver(url: str, expected: str) -> None:
    assert async_url(url).render_as_string(hide_password=False) == expected


@pytest.mark.parametrize(
    "url",
    [
        "mysql://u:s3cret@db/t",
        "postgresql+psycopg2://u:s3cret@db/t",
        "sqlite+pysqlite:///t.db",
        "not a url s3cret",
    ],
)
def test_async_url_rejects_unsupported_urls_without_leaking_passwords(url: str) -> None:
    with pytest.raises(ValueError, match="unsupported database URL") as error:
        async_url(url)
    assert "postgresql://" in str(error.value)
    if "@" in url:
        assert "s3cret" not in str(error.value)


async def test_sqlite_engine_creates_the_folder_and_sets_pragmas(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'new' / 'dir' / 't.db'}")
    try:
        async with engine.connect() as conn:
            pragmas = {
                name: (await conn.exec_driver_sql(f"PRAGMA {name}")).scalar()
                for name in ("journal_mode", "foreign_keys", "busy_timeout", "synchronous")
            }
    finally:
        await engine.dispose()
    assert pragmas == {
        "journal_mode": "wal",
        "foreign_keys": 1,
        "busy_timeout": 30000,
        "synchronous": 1,
    }
    assert (tmp_path / "new" / "dir" / "t.db").exists()


async def test_in_memory_sqlite_keeps_one_database(tmp_path: Path) -> None:
    engine = create_engine("sqlite://")
    try:
        async with engine.begin() as conn:
            await conn.execute(text("CREATE TABLE t (x INTEGER)"))
        async with engine.connect() as conn:
            assert (await conn.execute(text("SELECT count(*) FROM t"))).scalar() == 0
    finally:
        await engine.dispose()


def test_trigger_key_ignores_kwarg_order() -> None:
    first = trigger_key("watchers.KafkaTrigger", {"topics": ["a"], "group": "g"})
    second = trigger_key("watchers.KafkaTrigger", {"group": "g", "topics": ["a"]})
    assert first == second
    assert len(first) == 64
    assert trigger_key("watchers.SqsTrigger", {"group": "g", "topics": ["a"]}) != first


def test_the_deployment_is_the_database_however_its_url_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    sqlite = deployment_id("sqlite:///var/triggerer.db")
    assert deployment_id(f"sqlite:///{tmp_path}/var/triggerer.db") == sqlite
    assert deployment_id(f"sqlite+aiosqlite:///{tmp_path}/var/./triggerer.db") == sqlite
    assert deployment_id("sqlite:///var/other.db") != sqlite
    postgres = deployment_id("postgresql://app:secret@db:5432/triggerer")
    assert deployment_id("postgresql+psycopg://app:other@db:5432/triggerer") == postgres
    assert deployment_id("postgresql://app@db:5432/staging") != postgres


@pytest.mark.parametrize("db_backend", ["postgresql"])
async def test_a_pooled_connection_the_server_dropped_while_idle_is_replaced(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a database restart or failover does to the pool, to one connection.
    monkeypatch.setattr(engine_module, "PG_IDLE_PING_S", 0.0)
    engine, admin = create_engine(database_url), create_engine(database_url)
    try:
        async with engine.connect() as conn:
            dropped = (await conn.execute(text("SELECT pg_backend_pid()"))).scalar()
        async with admin.connect() as conn:
            await conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": dropped})
        async with engine.connect() as conn:
            replaced = (await conn.execute(text("SELECT pg_backend_pid()"))).scalar()
    finally:
        await engine.dispose()
        await admin.dispose()
    assert replaced != dropped


@pytest.mark.parametrize("db_backend", ["postgresql"])
async def test_a_connection_in_use_a_moment_ago_is_not_pinged(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = create_engine(database_url)
    pings = []
    monkeypatch.setattr(engine.dialect, "do_ping", pings.append)
    try:
        for _ in range(3):
            async with engine.connect() as conn:
                await conn.execute(text("SELECT 1"))
        monkeypatch.setattr(engine_module, "PG_IDLE_PING_S", 0.0)
        async with engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
    finally:
        await engine.dispose()
    assert len(pings) == 1  # only once idle longer than PG_IDLE_PING_S
