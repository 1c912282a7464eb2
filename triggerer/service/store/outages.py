"""The loops that ride out a store outage, waiting with the project's backoff between tries."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
import structlog

from triggerer.backoff import backoff_s
from triggerer.service.store.failures import STORE_ERRORS, is_outage

log = structlog.get_logger(__name__)

T = TypeVar("T")

STORE_RETRY_MAX_S = 10.0
HEALTHY_AFTER_S = 60.0
"""A loop that ran this long before failing starts its backoff from the beginning again."""


async def until_stored(action: Callable[[], Awaitable[T]], *, during: str) -> T:
    """``action()``, retried with backoff for as long as the store is unavailable."""
    attempt = 0
    while True:
        try:
            return await action()
        except STORE_ERRORS as error:
            if not is_outage(error):
                raise
            attempt += 1
            await _wait_for_store(during, error, attempt)


async def keep_running(work: Callable[[], Awaitable[None]], *, during: str) -> None:
    """Run the loop ``work``; when a store outage ends it, start it again after a backoff."""
    attempt = 0
    while True:
        started = anyio.current_time()
        try:
            await work()
            return
        except STORE_ERRORS as error:
            if not is_outage(error):
                raise
            healthy = anyio.current_time() - started > HEALTHY_AFTER_S
            attempt = 1 if healthy else attempt + 1
            await _wait_for_store(during, error, attempt)


async def _wait_for_store(during: str, error: BaseException, attempt: int) -> None:
    delay = backoff_s(attempt, STORE_RETRY_MAX_S)
    log.warning(
        "store_unavailable",
        during=during,
        error=f"{type(error).__name__}: {error}".splitlines()[0],
        attempt=attempt,
        retry_in_s=round(delay, 2),
    )
    await anyio.sleep(delay)
