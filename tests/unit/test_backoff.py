"""The backoff between retries: doubling, capped, jittered, for as long as failures go on."""

from __future__ import annotations

import pytest

from triggerer.backoff import backoff_s


@pytest.mark.parametrize(("attempt", "ceiling"), [(1, 0.1), (2, 0.2), (4, 0.8), (10, 10.0)])
def test_doubling_up_to_the_cap_with_jitter_in_the_upper_half(attempt: int, ceiling: float) -> None:
    delays = [backoff_s(attempt, 10.0) for _ in range(50)]
    assert all(ceiling / 2 <= delay <= ceiling for delay in delays)


def test_any_number_of_attempts_waits_the_cap() -> None:
    """Was: the 1,025th attempt raised OverflowError (2.0 ** 1024), ending the daemon after a
    watcher had failed fast for hours, or the store had been away for two."""
    for attempt in (1_025, 10**9):
        assert 30.0 <= backoff_s(attempt, 60.0) <= 60.0
