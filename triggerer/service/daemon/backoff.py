"""Jittered exponential backoff, and the loops that ride out a store outage with it."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
import structlog

from triggerer.service.store.failures import STORE_ERRORS, is_outage

log = structlog.get_logger(__name__)

T = TypeVar("T")

BASE_S = 0.1
STORE_RETRY_MAX_S = 10.0
HEALTHY_AFTER_S = 60.0
"""A loop that ran this long before failing starts its backoff from the beginning again."""


def backoff_s(attempt: int, max_s: float, base_s: float = BASE_S) -> float:
    """Seconds to wait before retry ``attempt`` (1-based): doubling, capped, with full jitter
    in the upper half so instances that failed together do not retry together."""
    doublings = min(max(0, attempt - 1), 64)  # past any cap long before; 2.0**1024 overflows
    ceiling = min(max_s, base_s * 2.0**doublings)
    return ceiling * random.uniform(0.5, 1.0)  # noqa: S311 - jitter, not cryptography


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
