"""Wake-ups from other processes: the daemon listens for the store's notices (PostgreSQL)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from triggerer.backoff import backoff_s
from triggerer.service.store.notices import CHANNEL, QUEUED

log = structlog.get_logger(__name__)

RECONNECT_BACKOFF_MAX_S = 10.0


async def listen(engine: AsyncEngine, on_notice: Callable[[str], None]) -> None:
    """Call ``on_notice`` with each notice's payload until cancelled; returns at once on SQLite.

    A lost connection (a database restart) is opened again, with backoff while that fails.
    Notices sent meanwhile are lost, so once listening again it reports a ``queued`` notice for
    every pipeline: the scheduler looks at everything once.
    """
    if engine.dialect.name != "postgresql":
        return
    reconnected = False
    failures = 0
    while True:
        try:
            async with engine.connect() as connection:
                driver = (await connection.get_raw_connection()).driver_connection
                try:
                    await _listen(engine.dialect.driver, driver, on_notice, reconnected)
                finally:
                    # A connection that listened never goes back to the pool.
                    with anyio.CancelScope(shield=True):
                        await connection.invalidate()
            reconnected, failures = True, 0
            log.warning("notices_connection_lost")
        # The connection is the driver's own, and asyncpg and psycopg errors share no base:
        # whatever breaks this best-effort channel is logged and the channel opened again.
        except Exception as error:  # noqa: BLE001
            reconnected, failures = True, failures + 1
            delay = backoff_s(failures, RECONNECT_BACKOFF_MAX_S)
            log.warning("notices_connect_failed", error=str(error), retry_in_s=round(delay, 2))
            await anyio.sleep(delay)


async def _listen(
    driver: str, connection: Any, on_notice: Callable[[str], None], reconnected: bool
) -> None:
    """Listen on one driver connection until it is lost (returns) or cancelled."""
    if driver == "asyncpg":
        lost = anyio.Event()
        connection.add_termination_listener(lambda _connection: lost.set())
        await connection.add_listener(CHANNEL, lambda _c, _pid, _channel, text: on_notice(text))
        if reconnected:
            on_notice(QUEUED)
        await lost.wait()
    else:  # psycopg, the other driver create_engine accepts
        await connection.set_autocommit(True)
        await connection.execute(f"LISTEN {CHANNEL}")
        if reconnected:
            on_notice(QUEUED)
        async for notice in connection.notifies():
            on_notice(notice.payload)
