"""Alembic environment of the metadata store.

Normally run by :func:`triggerer.service.store.migrate.upgrade`, which hands over a connection in
``config.attributes["connection"]``. Without one (``alembic`` commands run with
:func:`triggerer.service.store.migrate.alembic_config`), it connects to ``sqlalchemy.url`` itself.
"""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy import Connection, text

from triggerer.service.store.engine import create_engine
from triggerer.service.store.models import Base

MIGRATION_LOCK_ID = 0x7472_6967_6765_72
"""Key of the PostgreSQL advisory lock that serialises concurrent upgrades ("trigger")."""


def run_migrations(connection: Connection) -> None:
    """Run the pending migrations on ``connection``, which must not be in a transaction."""
    sqlite = connection.dialect.name == "sqlite"
    if sqlite:
        # SQLite batch migrations rebuild a table (copy, drop, rename); with foreign keys on,
        # the drop would cascade-delete the rows referencing it. The pragma is ignored inside a
        # transaction, so it is switched off before one begins.
        connection.exec_driver_sql("PRAGMA foreign_keys=OFF")
        connection.commit()
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        render_as_batch=True,
        compare_type=True,
    )
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            connection.execute(
                text("SELECT pg_advisory_xact_lock(:lock_id)"), {"lock_id": MIGRATION_LOCK_ID}
            )
        context.run_migrations()
    if sqlite:
        violations = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
        connection.exec_driver_sql("PRAGMA foreign_keys=ON")
        connection.commit()
        if violations:
            raise RuntimeError(f"migration left rows breaking foreign keys: {violations[:10]}")


async def _run_online(url: str) -> None:
    engine = create_engine(url)
    try:
        async with engine.connect() as connection:
            await connection.run_sync(run_migrations)
    finally:
        await engine.dispose()


def _main() -> None:
    config = context.config
    connection = config.attributes.get("connection")
    if connection is not None:
        run_migrations(connection)
        return
    url = config.get_main_option("sqlalchemy.url")
    if url is None:
        raise RuntimeError("no database: set sqlalchemy.url, e.g. alembic_config(url)")
    if context.is_offline_mode():
        context.configure(url=url, target_metadata=Base.metadata, literal_binds=True)
        with context.begin_transaction():
            context.run_migrations()
    else:
        asyncio.run(_run_online(url))


_main()
