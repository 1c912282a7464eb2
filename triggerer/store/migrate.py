"""Schema migrations, run programmatically (no ``alembic.ini`` needed).

``triggerer db upgrade`` calls :func:`upgrade`. Developers add a revision with::

    from alembic import command
    from triggerer.store.migrate import alembic_config
    command.revision(alembic_config("sqlite:///dev.db"), autogenerate=True, message="...")

against a database already upgraded to the current head.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection

from triggerer.store.engine import create_engine

MIGRATIONS_DIR = Path(__file__).with_name("migrations")


def alembic_config(url: str | None = None) -> Config:
    """An Alembic configuration for the store's migrations, on ``url`` when given."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url is not None:
        # The option value goes through ConfigParser interpolation, where "%" is special.
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def head_revision() -> str:
    """The newest revision of the migrations shipped with this version."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:
        raise RuntimeError(f"no migration revisions found in {MIGRATIONS_DIR}")
    return head


async def upgrade(url: str, revision: str = "head") -> None:
    """Migrate the database at ``url`` to ``revision``; nothing to do is a no-op.

    On PostgreSQL, concurrent upgrades from several processes are serialised by an advisory
    lock, so every instance may upgrade at startup. Within one process, do not run two at once:
    Alembic keeps its migration context in module globals.
    """
    engine = create_engine(url)
    try:
        async with engine.connect() as connection:
            await connection.run_sync(_upgrade, revision)
    finally:
        await engine.dispose()


def _upgrade(connection: Connection, revision: str) -> None:
    config = alembic_config()
    config.attributes["connection"] = connection
    command.upgrade(config, revision)


async def current_revision(url: str) -> str | None:
    """The revision the database at ``url`` is at; ``None`` when it was never migrated."""
    engine = create_engine(url)
    try:
        async with engine.connect() as connection:
            return await connection.run_sync(_current_revision)
    finally:
        await engine.dispose()


def _current_revision(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()
