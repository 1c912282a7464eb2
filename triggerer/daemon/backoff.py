"""Jittered exponential backoff, shared by every retry loop of the daemon."""

from __future__ import annotations

import random

BASE_S = 0.1


def backoff_s(attempt: int, max_s: float, base_s: float = BASE_S) -> float:
    """Seconds to wait before retry ``attempt`` (1-based): doubling, capped, with full jitter
    in the upper half so instances that failed together do not retry together."""
    ceiling = min(max_s, base_s * 2.0 ** max(0, attempt - 1))
    return ceiling * random.uniform(0.5, 1.0)  # noqa: S311 - jitter, not cryptography
