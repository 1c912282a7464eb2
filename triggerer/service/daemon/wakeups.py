"""Wake-ups from other processes: the daemon listens for the store's notices (PostgreSQL) or
reads them (SQLite); see :mod:`triggerer.service.store.notices`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from triggerer.backoff import backoff_s
from triggerer.service.store.engine import session_factory
from triggerer.service.store.notices import (
    CHANNEL,
    KEPT_S,
    QUEUED,
    notices_after,
    prune_notices,
)

log = structlog.get_logger(__name__)

RECONNECT_BACKOFF_MAX_S = 10.0
READ_INTERVAL_S = 0.2
"""How often the notice rows are read on SQLite: the delay a change by the CLI may wait."""


async def listen(engine: AsyncEngine, on_notice: Callable[[str], None]) -> None:
    """Call ``on_notice`` with each notice's payload until cancelled.

    PostgreSQL: a lost connection (a database restart) is opened again, with backoff while that
    fails. Notices sent meanwhile are lost, so once listening again it reports a ``queued``
    notice for every pipeline: the scheduler looks at everything once.
    """
    if engine.dialect.name != "postgresql":
        await _read(engine, on_notice)
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


async def _read(engine: AsyncEngine, on_notice: Callable[[str], None]) -> None:
    """Read the notice rows (SQLite) until cancelled: at first those of the last
    :data:`~triggerer.service.store.notices.KEPT_S` (what came while the daemon started is not
    missed; the rest are wakes of no consequence), then each new one once. A store that fails
    is read again with backoff, and then every pipeline is looked at once: rows may have aged
    out meanwhile."""
    sessions = session_factory(engine)
    after, failures, pruned_at = 0, 0, -KEPT_S
    while True:
        try:
            async with sessions.begin() as session:
                rows = await notices_after(session, after)
                if anyio.current_time() - pruned_at >= KEPT_S:
                    await prune_notices(session)
                    pruned_at = anyio.current_time()
        # The notices are a best-effort channel, as NOTIFY is: a failure is logged, and the
        # reads go on; the scheduler's sweep covers what was missed meanwhile.
        except Exception as error:  # noqa: BLE001
            failures += 1
            delay = backoff_s(failures, RECONNECT_BACKOFF_MAX_S)
            log.warning("notices_read_failed", error=str(error), retry_in_s=round(delay, 2))
            await anyio.sleep(delay)
            continue
        if failures:
            failures = 0
            on_notice(QUEUED)
        for notice_id, payload in rows:
            on_notice(payload)
            after = notice_id
        await anyio.sleep(READ_INTERVAL_S)
