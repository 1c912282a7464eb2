"""docs/deploy.md, "PostgreSQL: version, database and role", done as it says: a role that owns
its database and holds nothing more (no superuser, CREATEDB or CREATEROLE) migrates the schema
with ``triggerer db upgrade`` and runs the daemon, LISTEN included; in a database another role
owns, ``db upgrade`` is refused without CREATE on the schema ``public``, naming it, and works
once that one privilege is granted."""

from __future__ import annotations

import json
import secrets
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import anyio
import psycopg
import pytest
from psycopg import sql
from sqlalchemy import URL

from tests.e2e.daemon import TRIGGERER_BIN, DaemonProcess, daemon_env
from triggerer.service.store.notices import CHANNEL


def _admin(server: URL, database: str | None = None) -> psycopg.Connection[tuple[object, ...]]:
    url = server.set(drivername="postgresql")
    if database is not None:
        url = url.set(database=database)
    return psycopg.connect(url.render_as_string(hide_password=False), autocommit=True)


class Role:
    """A login role of its own, with the database the test gives it, dropped afterwards."""

    def __init__(self, server: URL) -> None:
        self.server = server
        self.name = f"t_role_{secrets.token_hex(6)}"
        self.password = secrets.token_hex(12)
        self.databases: list[str] = []

    def url(self, database: str) -> str:
        return self.server.set(
            drivername="postgresql", username=self.name, password=self.password, database=database
        ).render_as_string(hide_password=False)

    def run(self, *statements: sql.Composable, database: str | None = None) -> None:
        """``statements`` as the server's own user."""
        with _admin(self.server, database) as connection:
            for statement in statements:
                connection.execute(statement)


@pytest.fixture
def role(pg_server_url: URL) -> Iterator[Role]:
    role = Role(pg_server_url)
    try:
        role.run(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(role.name), sql.Literal(role.password)
            )
        )
    except psycopg.errors.InsufficientPrivilege:
        pytest.skip(f"{pg_server_url.username} may not CREATE ROLE on this server")
    try:
        yield role
    finally:
        for database in role.databases:
            role.run(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database))
            )
        role.run(sql.SQL("DROP ROLE {}").format(sql.Identifier(role.name)))


def env_of_daemon(tmp_path: Path, url: str) -> dict[str, str]:
    """The end-to-end tests' daemon on ``url``, its runs in classic mode (none are run here)."""
    env = daemon_env(tmp_path, url, "", TRIGGERER_SPARK__MODE="classic")
    del env["TRIGGERER_SPARK__REMOTE"]
    return env


def db_upgrade(url: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603 - our own binary, a fixed argv
        [str(TRIGGERER_BIN), "db", "upgrade"],
        env=env_of_daemon(tmp_path, url),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def test_a_role_owning_its_database_migrates_and_runs_the_daemon(
    role: Role, tmp_path: Path
) -> None:
    database = f"{role.name}_db"
    role.databases.append(database)
    # The docs' statement: the database owned by the role, in UTF-8.
    role.run(
        sql.SQL("CREATE DATABASE {} OWNER {} ENCODING 'UTF8' TEMPLATE template0").format(
            sql.Identifier(database), sql.Identifier(role.name)
        )
    )
    url = role.url(database)
    upgraded = db_upgrade(url, tmp_path)
    assert upgraded.returncode == 0, upgraded.stderr

    (tmp_path / "pipelines").mkdir()
    with DaemonProcess(env_of_daemon(tmp_path, url), tmp_path / "daemon.log") as daemon:
        daemon.start()
        await daemon.wait_logged("pipelines_loaded")
        # The wake-ups between daemons: a session of the role listening on the channel.
        with anyio.fail_after(60):
            while not _listening(role, database):  # noqa: ASYNC110 - another process's session
                await anyio.sleep(0.2)
        daemon.signal(signal.SIGTERM)
        assert await daemon.wait(60) == 0, daemon.tail()
    lines = (tmp_path / "daemon.log").read_text().splitlines()
    failed = [line for line in lines if json.loads(line)["level"] in {"error", "critical"}]
    assert not failed, failed


def _listening(role: Role, database: str) -> bool:
    with _admin(role.server) as connection:
        found = connection.execute(
            "SELECT 1 FROM pg_stat_activity WHERE usename = %s AND datname = %s AND query ILIKE %s",
            (role.name, database, f"LISTEN %{CHANNEL}%"),
        ).fetchone()
    return found is not None


def test_another_owners_database_needs_create_on_its_schema(role: Role, tmp_path: Path) -> None:
    database = f"{role.name}_shared"
    role.databases.append(database)
    role.run(sql.SQL("CREATE DATABASE {} TEMPLATE template0").format(sql.Identifier(database)))
    url = role.url(database)

    refused = db_upgrade(url, tmp_path)
    assert refused.returncode != 0
    assert "permission denied for schema public" in refused.stderr

    role.run(
        sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(sql.Identifier(role.name)),
        database=database,
    )
    upgraded = db_upgrade(url, tmp_path)
    assert upgraded.returncode == 0, upgraded.stderr
