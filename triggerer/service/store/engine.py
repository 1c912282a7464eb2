"""Async engines for the metadata database: SQLite (the embedded default) or PostgreSQL."""

from __future__ import annotations

import hashlib
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
from sqlalchemy import URL, event, make_url
from sqlalchemy.exc import ArgumentError, InvalidatePoolError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.ext.asyncio import create_async_engine as _create_async_engine
from sqlalchemy.pool import StaticPool

if TYPE_CHECKING:
    from sqlalchemy.engine import Dialect, Engine
    from sqlalchemy.pool import ConnectionPoolEntry

SUPPORTED_URLS = (
    "sqlite:///PATH, sqlite+aiosqlite:///PATH, "
    "postgresql://USER@HOST/DB (also postgres://), postgresql+asyncpg://..., "
    "postgresql+psycopg://..."
)
"""The URL forms :func:`async_url` accepts, for error messages."""

_DEFAULT_DRIVERS = {"sqlite": "aiosqlite", "postgresql": "asyncpg"}
_ASYNC_DRIVERS = {"sqlite": {"aiosqlite"}, "postgresql": {"asyncpg", "psycopg"}}

SQLITE_BUSY_TIMEOUT_MS = 30_000
"""How long a SQLite writer waits for the lock held by another before failing."""

_SQLITE_PRAGMAS = (
    # Set first so that switching the journal mode also waits for a concurrent opener.
    f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}",
    # Readers do not block the writer and vice versa.
    "PRAGMA journal_mode=WAL",
    # With WAL, NORMAL is still crash-safe (a power loss may lose the last commits, never
    # corrupt); FULL would fsync every commit.
    "PRAGMA synchronous=NORMAL",
    # SQLite ignores foreign keys unless asked, per connection.
    "PRAGMA foreign_keys=ON",
)

_JSON = msgspec.json.Encoder()


def json_text(value: Any) -> str:
    """``value`` as the text a JSON column stores."""
    return _JSON.encode(value).decode()


# JSON columns go through msgspec, ten times faster than the json module on the event extras
# every ingested message writes. Payloads and extras are checked as strict JSON before they get
# here; msgspec would write a NaN as null, never as the invalid literal the json module writes.
_JSON_CODEC: dict[str, Any] = {
    "json_serializer": json_text,
    "json_deserializer": msgspec.json.decode,
}

PG_POOL_SIZE = 10
PG_MAX_OVERFLOW = 10
PG_POOL_TIMEOUT_S = 30
PG_POOL_RECYCLE_S = 1800
"""Connections are replaced after this long, before server or proxy idle limits close them."""
PG_IDLE_PING_S = 1.0
"""A pooled PostgreSQL connection idle longer than this is pinged before it is used again."""
_RETURNED_AT = "returned_at"


def masked_url(url: str) -> str:
    """``url`` with its password shown as ``***``, to print or log."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", url)


def async_url(url: str) -> URL:
    """Parse a database URL and pick its asyncio driver.

    ``sqlite:///path`` becomes ``sqlite+aiosqlite``; ``postgresql://`` and ``postgres://`` become
    ``postgresql+asyncpg``; an explicit async driver is kept; a SQLite path starting with ``~``
    is in the home folder. Anything else is a ``ValueError`` naming the URL (password masked)
    and the supported forms.
    """
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise ValueError(
            f"unsupported database URL {masked_url(url)!r}: expected one of {SUPPORTED_URLS}"
        ) from exc
    backend, _, driver = parsed.drivername.partition("+")
    if backend == "postgres":
        backend = "postgresql"
    driver = driver or _DEFAULT_DRIVERS.get(backend, "")
    if driver not in _ASYNC_DRIVERS.get(backend, set()):
        raise ValueError(
            f"unsupported database URL {masked_url(url)!r}: expected one of {SUPPORTED_URLS}"
        )
    parsed = parsed.set(drivername=f"{backend}+{driver}")
    if backend == "sqlite" and (parsed.database or "").startswith("~"):
        # As a shell would: the driver would open a folder named "~" in the working directory.
        parsed = parsed.set(database=str(Path(parsed.database or "").expanduser()))
    return parsed


def sqlite_file(url: str | URL) -> Path | None:
    """The file of a SQLite database ``url``; ``None`` for PostgreSQL, in-memory SQLite and a
    URI filename (``file:...``, SQLite's to read)."""
    target = async_url(url) if isinstance(url, str) else url
    database = target.database
    if target.get_backend_name() != "sqlite" or not database:
        return None
    if database.startswith((":memory:", "file:")):
        return None
    return Path(database)


def deployment_id(url: str | URL) -> str:
    """A short name for the metadata database at ``url`` (whatever its driver or password):
    the processes that share one database are one deployment."""
    parsed = async_url(url) if isinstance(url, str) else url
    file = sqlite_file(parsed)
    # However the path was written.
    database = str(file.expanduser().resolve()) if file is not None else parsed.database or ""
    place = f"{parsed.get_backend_name()}://{parsed.host or ''}:{parsed.port or ''}/"
    return hashlib.sha256((place + database).encode()).hexdigest()[:12]


def create_engine(url: str) -> AsyncEngine:
    """Create the async engine for ``url`` (any form :func:`async_url` accepts).

    SQLite: the file's folder is created and every connection gets WAL, a busy timeout,
    ``synchronous=NORMAL`` and foreign keys on. PostgreSQL: a bounded pool whose connections are
    checked before use after an idle moment, and recycled. Dispose the engine when done.
    """
    target = async_url(url)
    if target.get_backend_name() == "sqlite":
        return _sqlite_engine(target)
    engine = _create_async_engine(
        target,
        **_JSON_CODEC,
        pool_size=PG_POOL_SIZE,
        max_overflow=PG_MAX_OVERFLOW,
        pool_timeout=PG_POOL_TIMEOUT_S,
        pool_recycle=PG_POOL_RECYCLE_S,
    )
    _ping_when_idle(engine.sync_engine)
    return engine


def _ping_when_idle(engine: Engine) -> None:
    """Ping a pooled connection before use when it has been idle, so one the server dropped
    (a restart, a failover) is replaced instead of failing its first statement.

    SQLAlchemy's ``pool_pre_ping`` pings on every use, which on asyncpg is a BEGIN, an empty
    statement and a ROLLBACK: three round trips that cost as much CPU as the short transaction
    they guard. A connection that was in use less than :data:`PG_IDLE_PING_S` ago is taken to be
    good; if the server dropped it in that moment, its transaction fails as an outage, which the
    daemon's loops retry and the API answers with a 503, as when the server goes away during a
    transaction. A failed ping invalidates the whole pool, as ``pool_pre_ping`` does.
    """
    dialect: Dialect = engine.dialect

    def returned(_dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
        record.info[_RETURNED_AT] = time.monotonic()

    def taken(dbapi_connection: Any, record: ConnectionPoolEntry, _proxy: Any) -> None:
        returned_at = record.info.get(_RETURNED_AT)  # None: new, just connected
        if returned_at is None or time.monotonic() - returned_at < PG_IDLE_PING_S:
            return
        try:
            dialect.do_ping(dbapi_connection)
        except dialect.loaded_dbapi.Error as error:
            if dialect.is_disconnect(error, dbapi_connection, None):
                raise InvalidatePoolError(str(error)) from error
            raise

    event.listen(engine, "checkin", returned)
    event.listen(engine, "checkout", taken)


def _sqlite_engine(target: URL) -> AsyncEngine:
    database = target.database or ":memory:"
    if database == ":memory:":
        # Each connection would otherwise open its own, empty, in-memory database.
        engine = _create_async_engine(target, poolclass=StaticPool, **_JSON_CODEC)
    else:
        file = sqlite_file(target)
        if file is not None:
            file.parent.mkdir(parents=True, exist_ok=True)
        engine = _create_async_engine(target, **_JSON_CODEC)
    event.listen(engine.sync_engine, "connect", _set_sqlite_pragmas)
    return engine


def _set_sqlite_pragmas(dbapi_connection: Any, _connection_record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        for pragma in _SQLITE_PRAGMAS:
            cursor.execute(pragma)
    finally:
        cursor.close()


def session_factory(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    """Sessions on ``engine`` whose objects stay readable after commit (no implicit reloads,
    which would be blocking I/O under asyncio)."""
    return async_sessionmaker(engine, expire_on_commit=False)
