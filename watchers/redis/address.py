"""Where a Redis stream or channel lives (``redis+stream://``, ``redis+pubsub://`` URIs), and the
client that reaches it with a named connection's credentials."""

from __future__ import annotations

import dataclasses
import urllib.parse
from typing import TYPE_CHECKING, Any

from triggerer.connections import get_connection
from watchers.clients import check_settings, require
from watchers.uris import split_uri

if TYPE_CHECKING:
    from collections.abc import Callable

    import redis.asyncio
    from redis.asyncio.client import Pipeline

DEFAULT_REDIS_PORT = 6379

#: Settings a named connection may hold: credentials and TLS, passed to redis-py as they are.
CONNECTION_KEYS = frozenset(
    {
        "username",
        "password",
        "ssl",
        "ssl_ca_certs",
        "ssl_certfile",
        "ssl_keyfile",
        "ssl_cert_reqs",
        "ssl_check_hostname",
        "client_name",
    }
)
_CONNECT_TIMEOUT_S = 5.0


@dataclasses.dataclass(frozen=True)
class RedisAddress:
    """A key (a stream or a channel) in database ``db`` of the Redis server at ``host:port``."""

    host: str
    port: int
    db: int
    key: str

    def __str__(self) -> str:
        return f"{self.host}:{self.port}/{self.db}"


def parse_redis_uri(uri: str, scheme: str, what: str) -> RedisAddress:
    """The address of ``scheme://HOST[:6379]/DB/KEY`` (``what`` names the key: STREAM,
    CHANNEL); a ``ValueError`` naming the URI and the expected form when it is not one.

    ``KEY`` is the rest of the path, percent-decoded (``%2F`` for a ``/`` within it).
    """
    form = f"{scheme}://HOST[:{DEFAULT_REDIS_PORT}]/DB/{what}"
    parts, _ = split_uri(uri, kind="Redis", form=form, schemes=(scheme,))
    try:
        port = parts.port or DEFAULT_REDIS_PORT
    except ValueError:
        raise ValueError(f"Redis URI {uri!r}: the port must be a number; form: {form}") from None
    db, _, key = parts.path.removeprefix("/").partition("/")
    if not parts.hostname or not db or not key:
        raise ValueError(f"Redis URI {uri!r} must have the form {form}")
    if not db.isdigit():
        raise ValueError(f"Redis URI {uri!r}: database {db!r} must be a number, as in {form}")
    return RedisAddress(parts.hostname, port, int(db), urllib.parse.unquote(key))


def check_address(host: str, port: int, db: int, key: str, what: str) -> None:
    """A ``ValueError`` naming the bad value among a trigger's address fields."""
    if not host or "/" in host:
        raise ValueError(f"Redis host {host!r} must be a host name or address")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"Redis port {port!r} must be a number from 1 to 65535")
    if isinstance(db, bool) or not isinstance(db, int) or db < 0:
        raise ValueError(f"Redis database {db!r} must be a number from 0")
    if not isinstance(key, str) or not key:
        raise ValueError(f"Redis {what} {key!r} must be a non-empty name")


def connection_options(connection: str | None) -> dict[str, Any]:
    """The redis-py keyword arguments of the named connection (read now), none without one."""
    if connection is None:
        return {}
    settings = get_connection(connection)
    check_settings(connection, settings, CONNECTION_KEYS, "the Redis provider")
    return settings


def client(
    address: RedisAddress, connection: str | None, *, socket_timeout_s: float | None = None
) -> redis.asyncio.Redis:
    """A client of the server of ``address`` (connecting on first use), bytes in and out."""
    redis_asyncio = require("redis.asyncio", "redis")
    redis_client: redis.asyncio.Redis = redis_asyncio.Redis(
        host=address.host,
        port=address.port,
        db=address.db,
        socket_connect_timeout=_CONNECT_TIMEOUT_S,
        socket_timeout=socket_timeout_s,
        **connection_options(connection),
    )
    return redis_client


def transient_errors() -> tuple[type[Exception], ...]:
    """The errors of a server unreachable, restarting or not answering in time: retried."""
    exceptions = require("redis.exceptions", "redis")
    return (
        exceptions.ConnectionError,
        exceptions.TimeoutError,
        exceptions.BusyLoadingError,
        OSError,
    )


async def pipelined(
    address: RedisAddress, connection: str | None, commands: Callable[[Pipeline], object]
) -> list[Any]:
    """Send the commands ``commands`` queues on a pipeline to the server of ``address``, in one
    round trip; their replies. A ``ConnectionError`` naming the server when it cannot be
    reached (what ``triggerer post`` prints)."""
    redis_client = client(address, connection)
    try:
        async with redis_client.pipeline(transaction=False) as pipe:
            commands(pipe)
            replies: list[Any] = await pipe.execute()
    except transient_errors() as error:
        raise ConnectionError(f"cannot reach Redis at {address}: {error}") from None
    finally:
        await redis_client.aclose()
    return replies
