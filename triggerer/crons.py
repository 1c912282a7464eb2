"""Cron expressions: checked once when a pipeline is defined, and their next tick."""

from __future__ import annotations

from datetime import UTC, datetime

from croniter import CroniterError, croniter


def validate_cron(cron: str) -> str:
    """``cron`` if it is a valid expression or preset, else a ``ValueError`` naming it."""
    if not isinstance(cron, str) or not croniter.is_valid(cron):
        raise ValueError(
            f"invalid cron expression {cron!r}: use five fields like '*/5 * * * *' "
            "or a preset (@hourly, @daily, @weekly, @monthly, @yearly)"
        )
    try:
        next_tick(cron, datetime.now(UTC))
    except CroniterError as error:
        # Valid fields can name a day that never comes ('0 0 31 2 *'): no tick to wait for.
        raise ValueError(f"cron expression {cron!r} never fires: {error}") from error
    return cron


def next_tick(cron: str, after: datetime) -> datetime:
    """The first tick of ``cron`` strictly after ``after`` (same timezone)."""
    tick: datetime = croniter(cron, after).get_next(datetime)
    return tick
