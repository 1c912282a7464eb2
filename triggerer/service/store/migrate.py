"""Schema migrations, run programmatically (no ``alembic.ini`` needed).

``triggerer db upgrade`` calls :func:`upgrade`. Developers add a revision with::

    from alembic import command
    from triggerer.service.store.migrate import alembic_config
    command.revision(alembic_config("sqlite:///dev.db"), autogenerate=True, message="...")

against a database already upgraded to the current head.

Alembic is imported only to migrate: the commands that read the store check its revision
against the head without it (Alembic and the revision files cost a command ~0.15 s to import).
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, String, column, inspect, select, table

from triggerer.service.store.engine import create_engine

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
VERSION_TABLE = "alembic_version"
"""Where Alembic keeps the revision a database is at (its default)."""


def alembic_config(url: str | None = None) -> Config:
    """An Alembic configuration for the store's migrations, on ``url`` when given."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url is not None:
        # The option value goes through ConfigParser interpolation, where "%" is special.
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


class NewerSchema(ValueError):
    """The database was migrated by a newer version of triggerer than this one."""


@functools.cache
def _revisions() -> dict[str, str | None]:
    """Each revision shipped with this version, and the one it revises.

    Read from the revision files' ``revision`` and ``down_revision`` lines, without importing
    them or Alembic.
    """
    return dict(_revision(path) for path in (MIGRATIONS_DIR / "versions").glob("[!_]*.py"))


@functools.cache
def head_revision() -> str:
    """The newest revision of the migrations shipped with this version: the one that no other
    revision revises (``tests/integration/test_cli_imports.py`` checks that it is Alembic's)."""
    revises = _revisions()
    heads = revises.keys() - set(revises.values())
    if len(heads) != 1:
        raise RuntimeError(f"expected one head revision in {MIGRATIONS_DIR}, found {heads}")
    return heads.pop()


_REVISION_LINE = re.compile(r"^(revision|down_revision)\b[^=\n]*=(.*)$", re.MULTILINE)
"""``revision: str = "0003"`` and ``down_revision: str | None = "0002"``, as the template writes
them: the value is a Python literal."""


def _revision(path: Path) -> tuple[str, str | None]:
    """``revision`` and ``down_revision`` as the revision file at ``path`` assigns them."""
    found = {
        name: ast.literal_eval(value.strip())
        for name, value in _REVISION_LINE.findall(path.read_text())
    }
    return found["revision"], found["down_revision"]


async def upgrade(url: str, revision: str = "head") -> None:
    """Migrate the database at ``url`` to ``revision``; nothing to do is a no-op; a database
    migrated past this version's revisions is :class:`NewerSchema`.

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
    from alembic import command

    stored = _current_revision(connection)
    connection.rollback()  # the migrations begin their own transaction
    if stored is not None and stored not in _revisions():
        # Alembic would only say it cannot locate the revision, in a traceback.
        raise NewerSchema(
            f"the database is at schema revision {stored}, newer than this triggerer's newest "
            f"({head_revision()}): a newer triggerer migrated it; run that version (or a later "
            "one), or restore the backup taken before that upgrade"
        )
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
    if not inspect(connection).has_table(VERSION_TABLE):
        return None
    query = select(column("version_num", String)).select_from(table(VERSION_TABLE))
    return ", ".join(sorted(connection.scalars(query))) or None
