"""Jittered exponential backoff: the waits between retries, for the daemon and for triggers.

One rule everywhere: the wait doubles from ``base_s`` up to ``max_s``, and each is drawn from
the upper half of that ceiling, so processes that failed together do not retry together.
"""

from __future__ import annotations

import asyncio
import random

BASE_S = 0.1


def backoff_s(attempt: int, max_s: float, base_s: float = BASE_S) -> float:
    """Seconds to wait before retry ``attempt`` (1-based): doubling, capped, with full jitter
    in the upper half so instances that failed together do not retry together."""
    doublings = min(max(0, attempt - 1), 64)  # past any cap long before; 2.0**1024 overflows
    ceiling = min(max_s, base_s * 2.0**doublings)
    return ceiling * random.uniform(0.5, 1.0)  # noqa: S311 - jitter, not cryptography


class Backoff:
    """The waits of one retry loop: ``await backoff.wait()`` after each failure."""

    def __init__(self, *, max_s: float, base_s: float = BASE_S) -> None:
        self.max_s = max_s
        self.base_s = base_s
        self.attempt = 0

    def next_s(self) -> float:
        """The wait before the next retry (counting this failure)."""
        self.attempt += 1
        return backoff_s(self.attempt, self.max_s, self.base_s)

    async def wait(self) -> None:
        await asyncio.sleep(self.next_s())
