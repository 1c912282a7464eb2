"""``triggerer run``, the daemon until SIGTERM/SIGINT, and ``triggerer check``, its health."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from triggerer.service.cli.output import say
from triggerer.service.cli.store import CliError, StoreUnavailable, with_session
from triggerer.service.cli.verbs import verb

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable

    from sqlalchemy.ext.asyncio import AsyncSession

    from triggerer.service.config import Settings


def add_verbs(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    verb(verbs, "run", _run, "run the daemon until SIGTERM/SIGINT")
    verb(verbs, "check", _check, "exit 0 when a daemon heartbeat is fresh", reads=True)


async def _run(settings: Settings, _: argparse.Namespace) -> int:
    import structlog

    from triggerer.service.daemon.service import Server, Service, serve
    from triggerer.service.runs.processes import hide_environment

    hide_environment()  # its credentials stay out of reach of the runs it starts
    api: Callable[[Service], Server] | None = None
    if settings.api.enabled:  # the web stack is imported only when the API is served
        from triggerer.service.api.server import api_server as api

    try:
        await serve(settings, api=api)
    except (CliError, LookupError, ValueError):  # a ConfigError is a ValueError
        raise  # a setting to change: main() says which, in one line
    except Exception:  # noqa: BLE001
        # A bug past every fault boundary. The daemon ends at once, with the traceback, as
        # after kill -9 (its runs die with it; what was not committed was not acknowledged):
        # waiting for what libraries left running could hang it instead (aiosqlite's close of
        # a connection cancelled mid-statement never returns), and nothing restarts a daemon
        # that hangs.
        structlog.get_logger(__name__).critical("daemon_crashed", exc_info=True)
        logging.shutdown()
        os._exit(1)
    await _end_stray_tasks()
    return 0


async def _end_stray_tasks(timeout_s: float = 5.0) -> None:
    """Cancel what libraries left running once the daemon has stopped, as often as it takes.

    ``asyncio.run`` cancels such a task once and waits for it without end. A signal during the
    start that cancels a SQLite statement leaves one that a single cancel does not end:
    SQLAlchemy closes the aiosqlite connection gracefully and stops its thread at once, and the
    close then waits on that ended thread. Past ``timeout_s`` the process exits anyway: the
    daemon's work is done, and a daemon that hangs is restarted by nothing.
    """
    import asyncio

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while stray := asyncio.all_tasks() - {asyncio.current_task()}:
        if loop.time() >= deadline:
            import structlog

            structlog.get_logger(__name__).warning(
                "exit_forced", tasks=sorted(task.get_name() for task in stray)
            )
            logging.shutdown()
            os._exit(0)
        for task in stray:
            task.cancel()
        await asyncio.wait(stray, timeout=0.1)


async def _check(settings: Settings, _: argparse.Namespace) -> int:
    """Exit 0 when the store answers and a daemon's heartbeat is fresh; else 1, saying why."""
    from datetime import timedelta

    from triggerer.service.reads import queries
    from triggerer.service.store.types import utcnow

    async def work(session: AsyncSession) -> int:
        stale = utcnow() - timedelta(seconds=settings.daemon.dead_after_s)
        latest = await queries.latest_heartbeat(session)
        fresh = latest is not None and latest >= stale
        say(
            f"healthy: heartbeat fresh, last at {latest}"
            if fresh
            else f"unhealthy: heartbeat stale, last at {latest}"
        )
        return 0 if fresh else 1

    try:
        return await with_session(settings, work)
    except StoreUnavailable as error:
        say(f"degraded: {error}")
        return 1
